"""How a run is launched, read from its command line: `accelerate launch`, `torchrun` (or `python -m
torch.distributed.run`), `deepspeed`, or a plain `python train.py`, as a CI step or a job script passes it
(`check --launch "..."`).

The line is split like a shell would (``shlex``), never run. The launcher's own options give the shape of the run
(processes, machines, FSDP or DeepSpeed and their settings); a config file it names (`--config_file`, TRL's
`--config`) is read as `--training-config` reads one; the training script's `--key value` arguments are
TrainingArguments / TRL names, read through the same key table. Later sources override earlier ones, as the
launchers do: the config file, then the launcher's flags, then the script's arguments.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
from typing import Any, Mapping

from gemma_doctor import trainers
from gemma_doctor.readers import training_config as tc_reader
from gemma_doctor.readers.training_config import Setting, TrainingConfig

WHERE = "launch command"

# The launchers' options that take no value (every other option takes one), spelled with underscores (a dash
# spelling matches too): accelerate 1.15.0's launch_command_parser, torch 2.13.0's torch.distributed.run
# get_args_parser (both read from the parsers' store_true actions), DeepSpeed 0.19.8's launcher/runner.py.
_ACCELERATE_SWITCHES = frozenset({
    "--cpu", "--debug", "--downcast_bf16", "--dynamo_use_dynamic", "--dynamo_use_fullgraph",
    "--dynamo_use_regional_compilation", "--enable_cpu_affinity", "--fp8_use_autocast_during_eval", "--module",
    "--multi_gpu", "--no_python", "--no_tpu_cluster", "--quiet", "--same_network", "--tpu", "--tpu_cluster",
    "--tpu_use_sudo", "--use_deepspeed", "--use_fsdp", "--use_megatron_lm", "--use_parallelism_config", "-m", "-q",
})
_TORCHRUN_SWITCHES = frozenset({"--module", "--no_python", "--run_path", "--standalone", "--virtual_local_rank", "-m"})
# python -m torch.distributed.launch (deprecated, still in torch 2.13.0): torchrun's parser plus --use-env.
_TORCH_LAUNCH_SWITCHES = _TORCHRUN_SWITCHES | {"--use_env"}
_DEEPSPEED_SWITCHES = frozenset({"--bind_cores_to_rank", "--force_multi", "--module", "--no_local_rank", "--no_python",
                                 "--no_ssh", "--no_ssh_check", "--quiet", "--save_pid", "-q"})
# The interpreter's options that take the next word (CPython 3.11's `python --help`).
_PYTHON_VALUED = frozenset({"-W", "-X", "--check-hash-based-pycs"})
# accelerate launch flag -> the key an accelerate config file holds it under (readers/training_config.py's KEYS).
_ACCELERATE_KEYS = {
    "num_processes": "num_processes", "num_machines": "num_machines", "mixed_precision": "mixed_precision",
    "fsdp_version": "fsdp_config.fsdp_version", "fsdp_sharding_strategy": "fsdp_config.fsdp_sharding_strategy",
    "fsdp_auto_wrap_policy": "fsdp_config.fsdp_auto_wrap_policy",
    "fsdp_transformer_layer_cls_to_wrap": "fsdp_config.fsdp_transformer_layer_cls_to_wrap",
    "fsdp_min_num_params": "fsdp_config.fsdp_min_num_params", "fsdp_offload_params": "fsdp_config.fsdp_offload_params",
    "fsdp_reshard_after_forward": "fsdp_config.fsdp_reshard_after_forward",
    "zero_stage": "deepspeed_config.zero_stage",
    "offload_optimizer_device": "deepspeed_config.offload_optimizer_device",
    "offload_param_device": "deepspeed_config.offload_param_device",
    "deepspeed_config_file": "deepspeed_config.deepspeed_config_file",
    "gradient_accumulation_steps": "gradient_accumulation_steps",
}

# accelerate launch's options that its parser reads with type=int (accelerate 1.15.0's launch_command_parser).
_ACCELERATE_INTS = frozenset({"num_processes", "num_machines", "zero_stage", "gradient_accumulation_steps",
                              "fsdp_min_num_params"})

# The deepest dotted script argument a setting of the key table needs (`--fsdp_config.fsdp_version`), with room.
_MAX_DOTS = 8


class _Bad(ValueError):
    """The line cannot be read as a launch command; the message says why."""


def parse(line: str, cwd: str | None = None, visible: int | None = None,
          environ: Mapping[str, str] | None = None) -> TrainingConfig:
    """The run a launch command line describes, as a training config (``error`` set when the line cannot be read).
    ``visible``: the GPUs this machine shows (the probe's), where known: DeepSpeed's pool without a hostfile.
    ``environ``: the environment the line runs in (this process's unless given): where accelerate finds its default
    config."""
    return _read(line, cwd, visible, os.environ if environ is None else environ, True)


def launcher_reading(line: str, cwd: str | None = None, environ: Mapping[str, str] | None = None) -> TrainingConfig:
    """``parse`` of the launcher's own part of ``line``: its options and the config it reads, without the script's
    arguments (the script's to read as it runs). What stops the launcher before the script starts (``error``), and how
    many processes it starts."""
    return _read(line, cwd, None, os.environ if environ is None else environ, False)


def _read(line: str, cwd: str | None, visible: int | None, environ: Mapping[str, str], script: bool) -> TrainingConfig:
    try:
        return _parse(line, cwd, visible, environ, script)
    except _Bad as e:
        return TrainingConfig(WHERE, error=str(e))
    except RecursionError:
        return TrainingConfig(WHERE, error="nested too deeply to be a launch command")


def combine(base: TrainingConfig | None, launch: TrainingConfig) -> TrainingConfig | None:
    """``--training-config`` and ``--launch`` together: the launch line's settings override the file's, as a
    launcher's flags override its config file. A serving line (`vllm serve`) starts no training run: the file
    alone (or nothing) is the run."""
    if launch.ok and launch.kind in tc_reader.NOT_TRAINING:
        return base
    if not launch.ok or base is None:
        return launch
    if not base.ok:
        return base
    # The trainer: the one the line names (`trl sft`) or its own config decides, else the file's.
    trainer = launch.trainer if launch.trainer is not None and not launch.trainer.default else base.trainer
    return TrainingConfig(base.path, base.kind, {**base.settings, **launch.settings}, trainer=trainer,
                          problems=(*base.problems, *launch.problems))


def local_processes(line: str, cwd: str | None = None, environ: Mapping[str, str] | None = None) -> int | str | None:
    """How many processes ``line`` starts on the machine it runs on, from the one reading of the line (its launcher's
    part, ``launcher_reading``): its
    process count over its machines, split as the launchers split it (`num_processes // num_machines`); 1 for a plain
    `python train.py`; "auto" where the launcher counts them as it starts (torchrun's auto, accelerate with no count
    in its line or config, DeepSpeed's every GPU visible: the GPUs visible), or where the line runs a console script
    that starts its own (`llamafactory-cli`, `trl`); None where the line cannot be read (``parse``'s error says why)."""
    tc = launcher_reading(line, cwd, environ)
    if not tc.ok:
        return None
    setting = tc.get("num_processes")
    if setting is None:
        words, _ = _words(line)
        plain = _launcher(words)[0] is None and os.path.basename(words[0]).startswith("python")
        return 1 if plain else "auto"
    if tc_reader.is_auto(setting.value):
        return "auto"
    machines = tc.get("num_machines")
    over = machines.value if machines is not None and isinstance(machines.value, int) and machines.value > 0 else 1
    count = setting.value // over if isinstance(setting.value, int) and not isinstance(setting.value, bool) else 0
    return count if count > 0 else None


def _words(line: str) -> tuple[list[str], dict[str, str]]:
    """The words of a launch line as a shell splits them, and the VAR=value words before its command."""
    # A line continued with backslash-newline (a CI step, a job script): the shell drops both; shlex would keep the
    # newline as a word of its own, which ends the launcher's options there.
    line = line.replace("\\\r\n", " ").replace("\\\n", " ")
    try:
        words = shlex.split(line, comments=True)
    except ValueError as e:
        raise _Bad(f"not a command line: {e}") from None
    env: dict[str, str] = {}
    while words and "=" in words[0] and not words[0].startswith(("-", "/", ".")):
        name, _, value = words[0].partition("=")  # VAR=value before the command: that command's environment
        env[name] = value
        words = words[1:]
    if not words:
        raise _Bad("an empty command line")
    return words, env


def _parse(line: str, cwd: str | None, visible: int | None, environ: Mapping[str, str],
           with_script: bool) -> TrainingConfig:
    words, env = _words(line)
    serving = _serving(words)
    if serving is not None:
        return TrainingConfig(WHERE, kind=serving)
    launcher, rest = _launcher(words)
    layers: list[TrainingConfig] = []
    flags: dict[str, Any] = {}
    processes: Any = None
    note = ""  # what the launcher makes of a process count it does not run as written
    counted: tuple[int, str] | None = None  # an accelerate config's num_processes as accelerate runs it, with a note
    if launcher == "accelerate":
        options, script = _split(rest, _ACCELERATE_SWITCHES)
        config_file = options.pop("config_file", None) or options.pop("config-file", None)
        if isinstance(config_file, str):
            layers.append(_file(config_file, cwd, "--config_file"))
        elif options.get("cpu") is not True:
            default = _accelerate_default_config(environ)
            if default is not None:
                layers.append(default)
        flagged = {name.replace("-", "_") for name, value in options.items() if value is True}
        for name, value in options.items():
            key = name.replace("-", "_")
            if key == "use_fsdp" and value is True:
                flags["distributed_type"] = "FSDP"
            elif key == "use_deepspeed" and value is True:
                flags["distributed_type"] = "DEEPSPEED"
            elif key == "multi_gpu" and value is True:
                flags.setdefault("distributed_type", "MULTI_GPU")
            elif key == "num_processes":
                processes = value
            elif key in _ACCELERATE_INTS and value is not True and _integer(value) is None:
                # accelerate's parser reads these with type=int: anything int() refuses stops the launch there.
                raise _Bad(f"--{_shown(name)} {_shown(str(value))} is not an integer (accelerate launch refuses it)")
            elif key in _ACCELERATE_KEYS:
                _put(flags, _ACCELERATE_KEYS[key], value)
        written = next((layer.get("distributed_type").value for layer in layers if layer.get("distributed_type")),
                       None)
        # accelerate reads one config (--config_file, else its default): its num_machines where the line names none.
        machines = flags["num_machines"] if "num_machines" in flags else _accelerate_machines(layers[0] if layers
                                                                                              else None)
        if processes is not None:
            flags["num_processes"], note = _accelerate_processes(processes, flags.get("distributed_type") or written,
                                                                 bool(layers), "multi_gpu" in flagged)
        else:
            configured = next((layer for layer in layers if layer.get("num_processes")), None)
            if configured is not None:
                # The config's own count, as accelerate runs it (its key and line stay the file's).
                counted = _accelerate_config_processes(configured.get("num_processes"),  # type: ignore[arg-type]
                                                       flags.get("distributed_type") or written, configured.path,
                                                       machines)
    elif launcher in ("torchrun", "torch.distributed.launch"):
        options, script = _split(rest, _TORCHRUN_SWITCHES if launcher == "torchrun" else _TORCH_LAUNCH_SWITCHES)
        nodes = _nodes(options.get("nnodes", "1"))
        per_node = options.get("nproc-per-node", options.get("nproc_per_node"))
        if per_node is None:
            # torch 2.13.0's get_args_parser: --nproc-per-node defaults to "1" (`torchrun train.py` is one process a
            # node, whatever GPUs the machine has).
            flags["num_processes"], note = nodes, " (torchrun's default --nproc-per-node 1)"
        else:
            flags["num_processes"] = _torchrun_processes(per_node, nodes)
        flags["num_machines"] = nodes
    elif launcher == "deepspeed":
        options, script = _split(rest, _DEEPSPEED_SWITCHES)
        processes, nodes, note = _deepspeed_counts(options, cwd, visible, env.get("CUDA_VISIBLE_DEVICES"))
        if processes is not None:
            flags["num_processes"] = processes
        flags["num_machines"] = nodes
    else:
        script = rest
    args = _script_args(script) if with_script else {}
    config = args.pop("config", None)  # TRL's CLI (`trl sft --config sft.yaml`) and scripts built on TrlParser
    if isinstance(config, str):
        layers.append(_file(config, cwd, "--config"))
    kind = next((layer.kind for layer in reversed(layers)), "accelerate" if launcher == "accelerate" else "transformers")
    settings: dict[str, Setting] = {}
    for layer in layers:  # a file's settings keep its name: the line numbers are that file's
        name = os.path.basename(layer.path)
        settings.update({k: Setting(f"{name}: {s.key}", s.value) for k, s in layer.settings.items()})
    if counted is not None and "num_processes" in settings:
        settings["num_processes"] = Setting(settings["num_processes"].key + counted[1], counted[0])
    script_trainer = None
    for label, data in ((f"{launcher} line: ", flags), ("script --", _nest(args))):
        own = tc_reader.parse(json.dumps(data), WHERE, yaml_first=False) if data else None
        if own is not None and not own.ok:
            raise _Bad(own.error or "unreadable")
        if own is not None:
            settings.update({k: Setting(label + s.key + (note if k == "num_processes" and label != "script --" else ""),
                                        s.value) for k, s in own.settings.items()})
            if label == "script --":
                script_trainer = own.trainer
    # A DeepSpeed JSON named on the line (`--deepspeed ds.json`) is read relative to the folder the line runs in.
    # One naming a folder, a FIFO, a dangling link or a file that is not JSON is a problem of the line (GD601) beside
    # its settings, which are planned.
    followed = tc_reader._with_deepspeed_file(TrainingConfig(os.path.join(cwd or ".", WHERE), kind, settings))
    return TrainingConfig(WHERE, kind, followed.settings, problems=followed.problems,
                          trainer=_trainer(words, layers, script_trainer, kind, settings))


def _trainer(words: list[str], layers: list[TrainingConfig], script: trainers.Chosen | None, kind: str,
             settings: dict[str, Setting]) -> trainers.Chosen | None:
    """The trainer a launch line runs: the one it names (`trl sft`, `axolotl train`), else the one the script's own
    flags or its config file decide (the flags override the file, as they do its settings), else its kind's default."""
    named = trainers.named_by_launch(words)
    if named is not None:
        return named
    for chosen in (script, *(layer.trainer for layer in reversed(layers))):
        if chosen is not None and not chosen.default:
            return dataclasses.replace(chosen, source=f"--launch: {chosen.source}")
    rl = settings.get("rl")
    return trainers.decide(trainers.kind_named(kind), {}, rl.value if rl is not None else None)


# The serving engines' command lines: they serve a model, they train nothing (vllm 0.x's CLI and its OpenAI server
# module; SGLang's server module).
_SERVING_MODULES = {"vllm.entrypoints.openai.api_server": "vllm", "vllm.entrypoints.api_server": "vllm",
                    "sglang.launch_server": "sglang"}


def _serving(words: list[str]) -> str | None:
    """"vllm" / "sglang" for a serving engine's command line (`vllm serve MODEL`, `python -m sglang.launch_server`)."""
    head = os.path.basename(words[0])
    if head == "vllm" and len(words) > 1 and words[1] == "serve":
        return "vllm"
    if head.startswith("python") and "-m" in words[1:]:
        i = words.index("-m", 1)
        return _SERVING_MODULES.get(words[i + 1]) if i + 1 < len(words) else None
    return None


def _launcher(words: list[str]) -> tuple[str | None, list[str]]:
    """(launcher, the words after it): accelerate, torchrun, deepspeed, or None for a plain python/script line."""
    head = os.path.basename(words[0])
    if head == "accelerate":
        if len(words) < 2 or words[1] != "launch":
            raise _Bad("an accelerate command other than `accelerate launch`")
        return "accelerate", words[2:]
    if head == "torchrun":
        return "torchrun", words[1:]
    if head == "deepspeed":
        return "deepspeed", words[1:]
    if head.startswith("python"):
        i = 1  # the interpreter's own options (-u, -B, -X opt, -W arg) come before -m or the script
        while i < len(words) and words[i].startswith("-") and words[i] not in ("-m", "-", "--"):
            i += 2 if words[i] in _PYTHON_VALUED else 1
        words = [words[0], *words[i:]]
    if head.startswith("python") and len(words) >= 3 and words[1] == "-m":
        module = words[2]
        if module == "torch.distributed.run":
            return "torchrun", words[3:]
        if module == "torch.distributed.launch":
            return module, words[3:]
        if module in ("accelerate.commands.launch",):
            return "accelerate", words[3:]
        return None, words[3:]
    if head.startswith("python"):
        return None, words[2:] if len(words) > 1 else []
    if head in ("trl", "axolotl", "llamafactory-cli"):
        return None, words[2:] if len(words) > 1 else []  # `trl sft --config ...`, `axolotl train cfg.yaml`
    raise _Bad(f"{_shown(words[0])} is not a launcher gemma-doctor reads (accelerate launch, torchrun, deepspeed, "
               "python)")


def _split(words: list[str], switches: frozenset[str]) -> tuple[dict[str, Any], list[str]]:
    """The launcher's options (name without dashes -> value, True for a switch) and the words from the script on."""
    options: dict[str, Any] = {}
    i = 0
    while i < len(words):
        word = words[i]
        if not word.startswith("-") or word == "--":
            return options, words[i + (word == "--"):]
        name, eq, value = word.partition("=")
        if eq:
            options[name.lstrip("-")] = value
        elif _spelled(name) in switches:
            options[name.lstrip("-")] = True
            if name in ("-m", "--module"):  # the script is a module: its name is the next word
                return options, words[i + 1:]
        elif i + 1 < len(words):
            options[name.lstrip("-")] = words[i + 1]
            i += 1
        else:
            raise _Bad(f"{_shown(name)} has no value")
        i += 1
    return options, []


def _spelled(option: str) -> str:
    """``--use-fsdp`` as ``--use_fsdp``: the launchers accept both."""
    dashes = len(option) - len(option.lstrip("-"))
    return option[:dashes] + option[dashes:].replace("-", "_")


def _script_args(words: list[str]) -> dict[str, Any]:
    """The training script's `--key value` / `--key=value` / `--switch` arguments (the script path and any
    positional words skipped)."""
    args: dict[str, Any] = {}
    i = 0
    while i < len(words):
        word = words[i]
        if word.startswith("--") and len(word) > 2:
            name, eq, value = word[2:].partition("=")
            name = name.replace("-", "_")
            if name.count(".") > _MAX_DOTS:
                raise _Bad(f"--{_shown(name)} is nested deeper than any setting gemma-doctor reads")
            if eq:
                args[name] = _value(value)
            elif i + 1 < len(words) and not words[i + 1].startswith("--"):
                args[name] = _value(words[i + 1])
                i += 1
            else:
                args[name] = True
        i += 1
    return args


def _value(text: str) -> Any:
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def _nest(args: dict[str, Any]) -> dict[str, Any]:
    """Dotted argument names (`--fsdp_config.version 2`) as the nested mappings the key table reads."""
    out: dict[str, Any] = {}
    for name, value in args.items():
        _put(out, name, value)
    return out


def _put(data: dict[str, Any], dotted: str, value: Any) -> None:
    node = data
    *parents, last = dotted.split(".")
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[last] = _value(value) if isinstance(value, str) else value


def _accelerate_processes(value: Any, distributed: Any, config_file: bool, multi_gpu: bool) -> tuple[int, str]:
    """(processes, a note on the count) for `accelerate launch --num_processes VALUE`, as accelerate 1.15.0's launch
    does with it (commands/launch.py, run here on a CPU): its parser takes only an integer (`1e9`, `auto`: "invalid
    int value", exit 2); 0 or less stops it where it starts several processes (`--multi_gpu`: "You need to use at least
    2 processes"; FSDP / DeepSpeed / a config's MULTI_GPU: torchrun's agent refuses a local world size under 1; -1 with
    a config file: "You need to manually pass in `--num_processes`"), and otherwise its simple launcher runs the script
    as one process, which is what the plan then counts, saying so."""
    text = str(value).strip()
    count = _integer(value)
    if count is None or isinstance(value, bool):
        raise _Bad(f"--num_processes {_shown(text)} is not an integer: accelerate launch refuses it "
                   "(\"invalid int value\")")
    if count == 1 and multi_gpu:
        raise _Bad("--multi_gpu with --num_processes 1 stops accelerate launch (\"You need to use at least 2 processes "
                   "to use `--multi_gpu`\"): name the number of processes")
    if count >= 1:
        return count, ""
    several = str(distributed or "NO").strip().upper() not in ("NO", "")
    if several or (count == -1 and config_file):
        raise _Bad(f"--num_processes {count} stops accelerate launch before the script starts (it needs a process "
                   "count of at least 1, 2 with --multi_gpu): name the number of processes")
    return 1, f" {count} (accelerate's single-process launcher: one process)"


def as_launched(tc: TrainingConfig) -> TrainingConfig:
    """An accelerate config given on its own (`check --training-config accelerate.yaml`), read as `accelerate launch
    --config_file FILE` reads it, with the rules a launch line's config meets: its num_processes as accelerate runs it
    (with a note where that differs from what is written), or the error that stops accelerate there. Any other config,
    or one that could not be read, comes back as it is."""
    if not tc.ok or not isinstance(tc.format, trainers.Accelerate):
        return tc
    try:
        machines = _accelerate_machines(tc)
        setting = tc.get("num_processes")
        if setting is None:
            return tc
        distributed = tc.get("distributed_type")
        count, note = _accelerate_config_processes(setting, distributed.value if distributed else None, tc.path,
                                                   machines)
    except _Bad as e:
        return TrainingConfig(tc.path, tc.kind, error=str(e))
    return dataclasses.replace(tc, settings={**tc.settings, "num_processes": Setting(setting.key + note, count)})


def _accelerate_machines(config: TrainingConfig | None) -> int | None:
    """The num_machines an accelerate config gives where the line names none (1 without one), as accelerate 1.15.0
    uses it: copied from the YAML unconverted and compared with 1 by every launcher (utils/launch.py: `num_machines >
    1`), which a string cannot be ("TypeError: '>' not supported between instances of 'str' and 'int'", run here on
    `num_machines: '2'`, also `'1'`). None: a value no count is read from (a float), left to the plan."""
    setting = config.get("num_machines") if config is not None else None
    if config is None or setting is None:
        return 1
    value = setting.value
    if isinstance(value, str):
        raise _Bad(f"num_machines: {value!r} in {_shown(config.path)} stops accelerate launch, which compares it "
                   "with 1 (TypeError: '>' not supported between 'str' and 'int'): write a number")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _accelerate_config_processes(setting: Setting, distributed: Any, path: str,
                                 machines: int | None = 1) -> tuple[int, str]:
    """(processes, a note on the count) for an accelerate config's `num_processes` where the line names none, as
    accelerate 1.15.0 runs it on one machine (commands/launch.py _validate_launch_command, utils/launch.py, torch
    2.13.0's torchrun; run here on each value): the value is copied from the YAML unconverted. -1 stops the launch ("You
    need to manually pass in `--num_processes` using this config yaml"). A run of several processes (MULTI_GPU, FSDP,
    DeepSpeed) hands str(value) to torchrun's --nproc_per_node, which int() reads: `'3'` and `'٣'` run 3; 0 or less
    stops its agent; `2.5`, `true`, `null` stop it ("Unsupported nproc_per_node value"). The single-process launcher
    (`distributed_type: 'NO'`) compares the value with 1, which a string cannot be ("TypeError: '>' not supported"),
    and otherwise runs one process whatever the number. Over ``machines`` > 1 a run of several processes divides the
    value by them (`num_processes // num_machines`, utils/launch.py prepare_multi_gpu_env and the DeepSpeed
    launcher's): a string stops it there ("TypeError: unsupported operand type(s) for //: 'str' and 'int'", run
    here on `num_processes: '4'` with `num_machines: 2`)."""
    value = setting.value
    where = f"num_processes: {_shown(str(value)) if not isinstance(value, str) else repr(value)} in {_shown(path)}"
    if isinstance(value, int) and not isinstance(value, bool) and value == -1:
        raise _Bad(f"{where} stops accelerate launch (\"You need to manually pass in `--num_processes` using this "
                   "config yaml\"): name the number of processes")
    several = str(distributed or "NO").strip().upper() not in ("NO", "")
    if not several:
        if isinstance(value, str):
            raise _Bad(f"{where} stops accelerate launch's single-process launcher, which compares it with 1 "
                       "(TypeError: '>' not supported between 'str' and 'int'): write a number")
        if value == 1 and isinstance(value, int) and not isinstance(value, bool):
            return 1, ""
        return 1, f" {_shown(str(value))} (accelerate's single-process launcher: one process)"
    if isinstance(value, str) and machines is not None and machines > 1:
        raise _Bad(f"{where} with num_machines: {machines} stops accelerate launch, which divides it by the machines "
                   "(TypeError: unsupported operand type(s) for //: 'str' and 'int'): write a number")
    count = _integer(value) if isinstance(value, (int, str)) and not isinstance(value, bool) else None
    if count is None:
        raise _Bad(f"{where} stops accelerate launch: torchrun refuses it as a process count (\"Unsupported "
                   f"nproc_per_node value: {_shown(str(value))}\"): write a number")
    if count < 1:
        raise _Bad(f"{where} stops accelerate launch before the script starts (torchrun's agent needs at least one "
                   "process): name the number of processes")
    return count, "" if isinstance(value, int) else f" {value!r} (torchrun reads it as {count})"


# torchrun's named process counts (torch 2.13.0 torch/distributed/run.py determine_local_world_size): each is the
# count of that kind of device visible when the run starts ("auto": the accelerators, else the CPU cores).
_TORCHRUN_NAMED = frozenset({"auto", "gpu", "xpu"})


def _torchrun_processes(value: Any, nodes: int) -> int | str:
    """The processes `torchrun --nproc-per-node VALUE` starts over ``nodes`` nodes, as torch 2.13.0's torchrun reads
    it (run here on a CPU): an integer per node (0 or less: its elastic agent stops, "AssertionError"); "auto" / "gpu"
    / "xpu": one per GPU visible, unknown until the run starts, kept as "auto" (the plan counts the GPUs visible and
    says so); "cpu": one per CPU core, no count of GPUs; anything else: "Unsupported nproc_per_node value"."""
    text = str(value).strip()
    if text.lower() in _TORCHRUN_NAMED:
        return "auto"
    if text == "cpu":
        raise _Bad("--nproc-per-node cpu starts one process per CPU core (torchrun), not one per GPU: name the "
                   "number of processes")
    count = _integer(value)
    if count is None:
        raise _Bad(f"--nproc-per-node {_shown(text)} is not a count torchrun reads (an integer, auto, gpu or cpu)")
    if count < 1:
        raise _Bad(f"--nproc-per-node {count} stops torchrun before the script starts (its agent needs at least one "
                   "process a node): name the number of processes")
    return count * nodes


def _deepspeed_counts(options: dict[str, Any], cwd: str | None = None, visible: int | None = None,
                      cuda_visible: str | None = None) -> tuple[int | str | None, int, str]:
    """(processes, nodes, a note on the count) for a `deepspeed` line, as DeepSpeed 0.19.8's launcher/runner.py reads
    it (parse_args, main, fetch_hostfile, parse_inclusion_exclusion, apply_num_nodes_and_gpus; run here): --num_nodes
    and --num_gpus (alias --num_accelerators) are argparse type=int, default -1 (`1:4`, `abc`, `2.5` stop it: "invalid
    int value"). The resource pool is the hostfile's (`--hostfile`/`-H`, else /job/hostfile where it is a file:
    ``_deepspeed_pool``), else this machine's GPUs (``visible``, where known) on localhost. --include/-i
    `host:slot,slot@host` runs the slots it lists of the pool (a host alone: all its slots), --exclude/-e the pool less
    those it lists, each host and slot checked against the pool ("not found in hostfile", "No slot"); --num_nodes N > 0
    keeps the first N hosts, --num_gpus N > 0 runs N on each (0 or less: every GPU visible, kept as "auto", as
    torchrun's auto is); --include or --exclude beside --num_nodes/--num_gpus, both together, or a slot int() refuses
    stop it. Without a pool read here (no hostfile on this machine, the training machine may hold one) a host other
    than localhost is not judged, --num_nodes is taken as written, and an --exclude whose GPUs visible are not known
    leaves the GPUs visible (no count). ``cuda_visible``: CUDA_VISIBLE_DEVICES as the line sets it; without a hostfile
    and with none of --include/--exclude/--num_gpus N > 0/--num_nodes N > 1, runner.main turns it into
    `--include localhost:<it>` (and unsets it, so the slots are the machine's own GPUs), which then meets every check an
    --include does (a --num_gpus 0 or --num_nodes 1 beside it stops it). None: the line names no count."""
    numbers = {}
    for flag, names in (("--num_nodes", ("num_nodes",)), ("--num_gpus", ("num_gpus", "num_accelerators"))):
        value = next((options[name] for name in names if name in options), None)
        if value is None:
            numbers[flag] = -1
            continue
        number = _integer(value) if not isinstance(value, bool) else None
        if number is None:
            raise _Bad(f"{flag} {_shown(str(value))} is not an integer: the deepspeed launcher refuses it "
                       "(\"invalid int value\")")
        numbers[flag] = number
    nodes, gpus = numbers["--num_nodes"], numbers["--num_gpus"]
    pool, note = _deepspeed_pool(options, cwd)
    include = options.get("include", options.get("i", ""))
    exclude = options.get("exclude", options.get("e", ""))
    include = "" if include is True else str(include)
    exclude = "" if exclude is True else str(exclude)
    from_env = ""
    if pool is None and cuda_visible and not (include or exclude or nodes > 1 or gpus > 0):
        include, from_env = f"localhost:{cuda_visible}", f" (CUDA_VISIBLE_DEVICES={_shown(cuda_visible)}, which the " \
                                                         "deepspeed launcher turns into --include)"
        note = f" (--include localhost:{_shown(cuda_visible)}, from CUDA_VISIBLE_DEVICES)"
    if (include or exclude) and (nodes >= 0 or gpus >= 0):
        raise _Bad(f"--{'include' if include else 'exclude'}{from_env} with --num_nodes/--num_gpus stops the deepspeed "
                   "launcher (\"Cannot specify num_nodes/gpus with include/exclude\"): name the GPUs one way")
    if include and exclude:
        raise _Bad("--include with --exclude stops the deepspeed launcher (\"include_str and exclude_str are mutually "
                   "exclusive\")")
    hosts = _deepspeed_hosts(include or exclude, ("--include" + from_env) if include else "--exclude") \
        if include or exclude else {}
    local = pool is None and visible is not None and bool(hosts) and set(hosts) <= {"localhost"}
    if local:  # DeepSpeed's own pool without a hostfile: {"localhost": the GPUs it sees}
        pool = {"localhost": visible}
        note = f" (the {visible} GPUs visible on localhost)"
    if pool is not None:
        active = _deepspeed_filter(pool, hosts, bool(include), "hostfile" if not local else "GPUs visible",
                                   ("--include" + from_env) if from_env else "")
        if nodes > 0:
            active = dict(list(active.items())[:nodes])
        if gpus > 0:
            active = {host: gpus for host in active}
        processes = sum(active.values())
        if processes == 0:
            # Every host dropped: its launch.py stops (IndexError); hosts of 0 slots: it starts no process on them.
            raise _Bad(f"the deepspeed launcher's resource pool{note} is left with no GPU slot: it starts no training "
                       "process")
        return processes, len(active), note
    if include or exclude:
        if exclude:
            return None, 1, ""
        if any(not slots for slots in hosts.values()):
            return "auto", len(hosts), ""  # a host named alone: its every GPU
        return sum(len(slots) for slots in hosts.values()), len(hosts), note
    nodes_run = nodes if nodes > 0 else 1
    if gpus > 0:
        return gpus * nodes_run, nodes_run, ""
    if "num_gpus" in options or "num_accelerators" in options:
        return "auto", nodes_run, f" {gpus} (deepspeed: every GPU visible)"
    return None, nodes_run, ""


def _deepspeed_filter(pool: dict[str, int], hosts: dict[str, set[int]], include: bool, named: str,
                      flag: str = "") -> dict[str, int]:
    """DeepSpeed 0.19.8's parse_inclusion_exclusion / parse_resource_filter: how many of each host's slots (the pool:
    {host: count}) an --include keeps or an --exclude leaves (``hosts``: ``_deepspeed_hosts``' reading of it; empty:
    the pool whole), in the pool's order, hosts left with no slot dropped; a host or slot the pool lacks stops the
    launcher. Counted, never listed: a hostfile's `slots=` may be any number of digits."""
    if not hosts:
        return dict(pool)
    flag = flag or ("--include" if include else "--exclude")  # how the line named it (CUDA_VISIBLE_DEVICES, a flag)
    kept: dict[str, int] = {} if include else dict(pool)
    for host, slots in hosts.items():
        if host not in pool:
            raise _Bad(f"{flag} names {_shown(host)}, which the {named} lacks (the "
                       f"deepspeed launcher: \"Hostname '{_shown(host)}' not found in hostfile\")")
        missing = sorted(slot for slot in slots if not 0 <= slot < pool[host])
        if missing:
            raise _Bad(f"{flag} names GPU slot {missing[0]} of {_shown(host)}, which "
                       f"has {pool[host]} in the {named} (the deepspeed launcher: \"No slot '{missing[0]}' "
                       f"specified on host '{_shown(host)}'\")")
        if include:
            kept[host] = len(slots) if slots else pool[host]
        else:
            kept[host] = pool[host] - len(slots) if slots else 0
    return {host: kept[host] for host in pool if kept.get(host)}


# DeepSpeed 0.19.8's runner.py: the hostfile read where the line names none (DLTS_HOSTFILE), a line of it
# (_parse_hostfile's pattern, matched at the start of the stripped line), and the most of one read here (a hostfile of
# a thousand hosts is some 30 kB).
DEEPSPEED_HOSTFILE = "/job/hostfile"
_HOSTFILE_LINE = re.compile(r"^(\S+)\s+slots=(\d+)")
MAX_HOSTFILE_BYTES = 1 << 20


def _deepspeed_pool(options: dict[str, Any], cwd: str | None) -> tuple[dict[str, int] | None, str]:
    """({host: slots}, a note naming the hostfile) as DeepSpeed 0.19.8's fetch_hostfile reads `--hostfile`/`-H`
    (default /job/hostfile): a path that is no regular file (missing, a folder, a FIFO, a device, a dangling link) is no
    pool ("Unable to find hostfile, will proceed with training with local resources only": None); a file is read line
    by line, comments and blank lines skipped, each other line `host slots=N` (_parse_hostfile), and a line that is not,
    a host named twice, no host at all or text that is not UTF-8 stop it (GD601). A file this user cannot read is not
    judged (the training machine's user may read it: None). Read without blocking, at most MAX_HOSTFILE_BYTES."""
    from gemma_doctor import fsafe

    named = next((options[name] for name in ("hostfile", "H") if name in options), None)
    path = str(named) if named is not None and named is not True else DEEPSPEED_HOSTFILE
    flag = f"--hostfile {_shown(path)}" if named is not None else f"the deepspeed launcher's default hostfile {path}"
    full = path if os.path.isabs(path) or cwd is None else os.path.join(cwd, path)
    try:
        raw = fsafe.read_user_file(full, MAX_HOSTFILE_BYTES)
    except (fsafe.Refused, OSError, ValueError):
        return None, ""  # os.path.isfile() is False there (or this user cannot read it): no hostfile is read
    if len(raw) > MAX_HOSTFILE_BYTES:
        raise _Bad(f"{flag} is larger than {MAX_HOSTFILE_BYTES >> 20} MiB, which no hostfile is (not read whole): name "
                   "the hostfile of the run")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _Bad(f"{flag} is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}): the deepspeed "
                   "launcher stops reading it (UnicodeDecodeError)") from None
    pool: dict[str, int] = {}
    # readlines() in text mode: universal newlines, each line then stripped (str.strip, as DeepSpeed's).
    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        line = line.strip()
        if line.startswith("#") or line == "":
            continue
        match = _HOSTFILE_LINE.search(line)
        slots = _integer(match.group(2)) if match else None
        if match is not None and slots is None:
            raise _Bad(f"{flag} gives {_shown(match.group(1))} slots={_shown(match.group(2)[:40])}, past any machine's "
                       "GPUs")
        if match is None or slots is None:
            raise _Bad(f"{flag} has a line that is not `host slots=N`: {_shown(line[:80])} (the deepspeed launcher: "
                       "\"Hostfile contains a bad entry\")")
        if match.group(1) in pool:
            raise _Bad(f"{flag} names {_shown(match.group(1))} twice (the deepspeed launcher: \"Hostfile contains "
                       "multiple entries\")")
        pool[match.group(1)] = slots
    if not pool:
        raise _Bad(f"{flag} names no host (the deepspeed launcher: \"Hostfile is empty or not formatted correctly\")")
    return pool, f" (hostfile {_shown(path)}: {len(pool)} host{'s' if len(pool) > 1 else ''}, " \
                 f"{sum(pool.values())} slots)"


def _deepspeed_hosts(text: str, flag: str) -> dict[str, set[int]]:
    """DeepSpeed 0.19.8's parse_node_config_list: `host[:slot,slot][@host...]` -> {host: its slots, empty for all (a
    host named alone and with slots elsewhere in the list runs those slots, as DeepSpeed merges them)}; a
    spec with two colons, a slot int() refuses or below 0 (no GPU has it: "No slot") or an empty host name stops the
    launcher."""
    hosts: dict[str, set[int]] = {}
    for spec in text.split("@"):
        name, colon, slots = spec.partition(":")
        numbers = [_integer(slot) for slot in slots.split(",")] if colon else []
        if ":" in slots or None in numbers or not name:
            raise _Bad(f"{flag} {_shown(text)} is not host[:slot,...][@host...] as the deepspeed launcher reads it")
        if any(n < 0 for n in numbers):  # type: ignore[operator]
            raise _Bad(f"{flag} {_shown(text)} names a GPU slot below 0 (the deepspeed launcher: \"No slot\")")
        hosts[name] = hosts.get(name, set()) | set(numbers)  # type: ignore[arg-type]
    return hosts


def _integer(value: Any) -> int | None:
    """The launchers' own reading of a number: Python's ``int()`` on the word (spaces, a sign, ``1_000`` and other
    scripts' digits such as ``٣`` allowed, ``1e9`` / ``2.5`` / ``''`` not), or None where int() refuses it or it is
    over 18 digits (no machine runs that many; past 4,300 digits int() itself refuses)."""
    text = str(value)
    if len(text) > 40:
        return None
    try:
        number = int(text)
    except ValueError:
        return None
    return number if abs(number) < 10**18 else None


def _nodes(value: Any) -> int:
    """torchrun's --nnodes as torch 2.13's parse_min_max_nnodes and config_from_args read it: N or MIN:MAX with
    0 < MIN <= MAX, else the launch stops (`4:1`, `0:4`, `1:2:3`, `0`); the most it may run."""
    parts = str(value).split(":")
    bounds = [_integer(part) for part in parts]
    if len(parts) > 2 or None in bounds or not 0 < bounds[0] <= bounds[-1]:  # type: ignore[operator]
        raise _Bad(f"--nnodes {_shown(str(value))} is not a count or MIN:MAX with 0 < MIN <= MAX (torchrun refuses "
                   "it)")
    return bounds[-1]  # type: ignore[return-value]


def _accelerate_default_config(environ: Mapping[str, str]) -> TrainingConfig | None:
    """The config `accelerate launch` reads where the line names none and has no --cpu: accelerate 1.15.0's
    default_config_file (commands/config/config_args.py: $HF_HOME, else $XDG_CACHE_HOME/huggingface, else
    ~/.cache/huggingface; then accelerate/default_config.yaml), where it is a file (os.path.isfile; else none is read
    and the flags and accelerate's defaults stand: no mixed precision, one process). Read as --config_file is (never
    blocking, bounded); one accelerate cannot read stops it (GD601)."""
    home = os.path.expanduser(environ.get("HF_HOME", os.path.join(environ.get("XDG_CACHE_HOME", "~/.cache"),
                                                                   "huggingface")))
    path = os.path.join(home, "accelerate", "default_config.yaml")
    try:
        if not os.path.isfile(path):
            return None
    except (OSError, ValueError):
        return None
    read = tc_reader.read(path)
    if not read.ok:
        raise _Bad(f"accelerate's default config {_shown(path)} (read where the line names no --config_file): "
                   f"{read.error}")
    return read


def _file(path: str, cwd: str | None, flag: str) -> TrainingConfig:
    """A config file the line names, read as --training-config reads one (relative to the working folder)."""
    full = path if os.path.isabs(path) or cwd is None else os.path.join(cwd, path)
    if not os.path.lexists(full):
        raise _Bad(f"{flag} {_shown(path)} does not exist")
    read = tc_reader.read(full)
    if not read.ok:
        raise _Bad(f"{flag} {_shown(path)}: {read.error}")
    return read


def _shown(text: str) -> str:
    return text if text and text.isprintable() and len(text) <= 200 else repr(text[:200])

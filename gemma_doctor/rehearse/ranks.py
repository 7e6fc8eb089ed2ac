"""Distributed runs on 2 CPU (gloo) ranks (docs/rehearsal.md, "Distributed runs on 2 CPU ranks").

`rehearse TARGET --training-config T.yaml --accelerate-config fsdp.yaml`: the twin is trained on two ranks started by
torch's own launcher (`python -m torch.distributed.run --nproc_per_node 2`), with CUDA hidden and the gloo backend.
accelerate 1.15 turns FSDP on only for accelerator devices (a CPU world is MULTI_CPU, where its FSDP plugin is
ignored), so the ranks are driven by this module's loop: the model is sharded by torch's FSDP (FSDP1 or FSDP2, as
the config says) configured through accelerate's own FullyShardedDataParallelPlugin (its reading of the config keys,
its wrap policy, its state-dict types and its save_fsdp_model); what a CPU cannot do is replaced and said.

The ranks run as a launched command (launch.run_script: the twin built or copied, one deadline, every process of
the run killed past it). Each rank writes its records, tagged with its rank, to the rehearsal's events file; the
parent judges them together (judge()). The parent side imports nothing heavy; the rank side (Rank, main) runs in the
ranks only. `cpu_launch` readies a user's `accelerate launch --config_file fsdp.yaml` line for CPU ranks.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Mapping

from gemma_doctor.report import Finding, Severity

WORLD = 2
# accelerate 1.15 FullyShardedDataParallelPlugin.set_auto_wrap_policy's error for a class the model lacks.
_WRAP_CLASS = "Could not find the transformer layer class"
RANK_STAGES = ("load", "wrap", "train", "agree", "save", "reload")
# Settings of an accelerate config whose work needs an accelerator device: replaced on the CPU ranks (said).
_REPLACED = {
    "fsdp_sync_module_states": "sync_module_states needs an accelerator device (accelerate 1.15 raises 'no available "
                               "devices' on a CPU): off, every rank loads the twin itself",
    "fsdp_cpu_ram_efficient_loading": "cpu_ram_efficient_loading needs sync_module_states: off, every rank loads the "
                                      "twin itself",
}


def replacements(accelerate_config: Mapping[str, Any]) -> list[str]:
    """What of an accelerate FSDP config the CPU ranks replace, each said as the report says it."""
    fsdp = accelerate_config.get("fsdp_config")
    fsdp = fsdp if isinstance(fsdp, Mapping) else {}
    out = [why for key, why in _REPLACED.items() if str(fsdp.get(key)).lower() == "true"]
    processes = accelerate_config.get("num_processes")
    if processes not in (None, WORLD):
        out.append(f"num_processes {processes}: {WORLD} CPU ranks")
    if accelerate_config.get("num_machines") not in (None, 1):
        out.append(f"num_machines {accelerate_config['num_machines']}: one machine")
    precision = str(accelerate_config.get("mixed_precision") or "no").lower()
    if precision not in ("no", "bf16"):
        out.append(f"mixed_precision {precision}: bf16 on the CPU ranks (fp16 and fp8 need a GPU)")
    out.append("CUDA hidden, the gloo backend: torch's FSDP on 2 CPU ranks, set up by accelerate's own launcher and "
               "FSDP plugin and driven by the rehearsal's loop (accelerate 1.15 runs an FSDP config on CPU ranks as "
               "MULTI_CPU, without FSDP)")
    return out


def _plugin_env(config_file: str) -> dict[str, str]:
    """The FSDP_* / ACCELERATE_* variables accelerate's own launcher sets for ``config_file`` on 2 processes, with
    the CPU's replacements (runs in a rank: imports accelerate)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    args = launch_command_parser().parse_args(["--config_file", config_file, "--num_processes", str(WORLD),
                                               "--num_machines", "1", "rehearsal.py"])
    args, _, _ = _validate_launch_command(args)
    env = {k: v for k, v in prepare_multi_gpu_env(args).items() if k.startswith(("FSDP_", "ACCELERATE_"))}
    env.update(FSDP_SYNC_MODULE_STATES="false", FSDP_CPU_RAM_EFFICIENT_LOADING="false")
    if env.get("ACCELERATE_MIXED_PRECISION", "no") not in ("no", "bf16"):
        env["ACCELERATE_MIXED_PRECISION"] = "bf16"
    return env


def kind(accelerate_config: Mapping[str, Any]) -> str | None:
    """The sharding an accelerate config asks for: "fsdp", "deepspeed", or None."""
    distributed = str(accelerate_config.get("distributed_type") or "").upper()
    if distributed == "FSDP" or accelerate_config.get("fsdp_config"):
        return "fsdp"
    if distributed == "DEEPSPEED" or accelerate_config.get("deepspeed_config"):
        return "deepspeed"
    return None


# -- the parent: judge the ranks' records -----------------------------------------------------------------------------
def judge(by_rank: Mapping[int, list[Mapping[str, Any]]], ended: str | None, rtol: float) -> list[Finding]:
    """Findings GD990-GD994 from every rank's records (``ended``: why the ranks ended early, or None)."""
    out: list[Finding] = []
    reached = {r: [x.get("stage") for x in recs if x.get("status") == "ok"] for r, recs in by_rank.items()}
    crashed = {r: next(x for x in recs if x.get("status") == "error") for r, recs in by_rank.items()
               if any(x.get("status") == "error" for x in recs)}
    for rank in range(WORLD):
        records = list(by_rank.get(rank, []))
        e = crashed.get(rank)
        if e is not None and _WRAP_CLASS in str(e.get("line")):
            if rank == min(crashed):  # every rank meets it; said once
                out.append(Finding("GD994", Severity.ERROR, "the FSDP wrap classes "
                                   f"{', '.join(e.get('classes') or []) or '(none)'} match no module of the twin: "
                                   f"accelerate stops before sharding ({e.get('line')})",
                                   key="fsdp_transformer_layer_cls_to_wrap",
                                   fix=f"name the model's decoder layer class: {e.get('suggest') or 'see the model'}",
                                   details={"rank": rank, **dict(e)}))
        elif e is not None:
            out.append(Finding("GD990", Severity.ERROR, f"rank {rank} crashed at {e.get('stage')}: {e.get('line')}",
                               key=f"rank{rank}", fix="the line is that rank's own; the other rank was stopped with "
                               "the process group", details={"rank": rank, **dict(e)}))
        elif not crashed and not any(x.get("stage") == "done" for x in records):
            # A rank that ended without a record of its own, while none crashed: it hung or died.
            last = reached.get(rank, [])[-1:] or ["start"]
            out.append(Finding("GD990", Severity.ERROR, f"rank {rank} did not finish its stages "
                               f"({ended or 'it ended without finishing'}); last stage reached: {last[0]}",
                               key=f"rank{rank}", fix="a rank that stops answering holds the others at their next "
                               "collective; the deadline killed the whole process group",
                               details={"rank": rank, "last": last[0]}))
        for x in records:
            if x.get("stage") == "train" and x.get("status") == "ok":
                losses = x.get("losses") or []
                if any(not (isinstance(v, (int, float)) and math.isfinite(v)) for v in losses):
                    out.append(Finding("GD991", Severity.ERROR, f"the loss is not finite on rank {rank}: {losses}",
                                       key=f"rank{rank}", fix="bf16 instead of fp16; check that rank's data shard",
                                       details={"rank": rank, "losses": losses}))
            if x.get("stage") == "wrap" and x.get("status") == "ok" and x.get("policy") == "transformer_based_wrap" \
                    and rank == 0 and not x.get("wrapped"):
                out.append(Finding("GD994", Severity.ERROR, "the FSDP wrap classes "
                                   f"{', '.join(x.get('classes') or []) or '(none)'} match no module of the twin: the "
                                   "run would not shard by layer (one flat unit holds the whole model)",
                                   key="fsdp_transformer_layer_cls_to_wrap",
                                   fix=f"name the decoder layer class: {x.get('suggest') or 'see the model'}",
                                   details=dict(x)))
    digests = {r: x.get("digest") for r, recs in by_rank.items() for x in recs
               if x.get("stage") == "agree" and x.get("status") == "ok"}
    if len(digests) == WORLD and len(set(digests.values())) > 1:
        out.append(Finding("GD992", Severity.ERROR, "after the steps the ranks hold different parameters (the full "
                           f"state gathered on each differs: {digests})", key="ranks",
                           fix="report it upstream (torch FSDP / accelerate) with the versions in `stack`",
                           details={"digests": digests}))
    for x in by_rank.get(0, []):
        if x.get("stage") == "reload" and x.get("status") == "ok":
            diff, scale = x.get("max_abs_diff"), x.get("scale")
            if x.get("adapter_tensors") == 0 or diff is None or not math.isfinite(diff) \
                    or diff > rtol * max(scale or 0.0, 1e-6):
                out.append(Finding("GD993", Severity.ERROR, f"the {x.get('state_dict_type')} checkpoint the run saves "
                                   "does not reload on one process as the trained model: "
                                   f"{x.get('why') or f'logits differ by {diff:.4g} (largest {scale:.4g})'}",
                                   key="fsdp_state_dict_type",
                                   fix=(x.get("fix") or "report it upstream with `stack`")
                                   + (f"; {x['cure']}" if x.get("cure") else ""),
                                   details=dict(x)))
    return out


def read_config(path: Path) -> dict[str, Any]:
    """The accelerate config's mapping, through the reader check uses (a file it cannot read is one line)."""
    from gemma_doctor.errors import UsageError
    from gemma_doctor.readers import training_config as tc_reader

    tc = tc_reader.load(str(path))
    if not tc.ok:
        raise UsageError(f"accelerate config {path}: {tc.error}")
    try:
        return tc_reader.raw_mapping(str(path))
    except ValueError as e:
        raise UsageError(f"accelerate config {path}: {e}") from None


def rehearse_ranks(result: Any, plan: dict[str, Any], path: Path, timeout: float) -> Any:
    """Rehearse ``plan`` on 2 CPU ranks with the sharding of the accelerate config at ``path``; fill ``result`` (a
    Rehearsal)."""
    import importlib.util

    from gemma_doctor import catalogue
    from gemma_doctor.rehearse import invariants
    from gemma_doctor.rehearse.launch import run_script

    config = read_config(path)
    sharding = kind(config)
    if sharding == "deepspeed":
        if importlib.util.find_spec("deepspeed") is None:
            result.findings.append(Finding("GD950", Severity.ERROR, "not rehearsable: DeepSpeed is not installed in "
                                           f"this environment ({sys.executable}); the accelerate config shards with "
                                           "DeepSpeed", key="deepspeed_config",
                                           fix="run the rehearsal in the environment that trains (nothing is "
                                               "installed for you)"))
        else:
            # DeepSpeed runs on CPU ranks through the user's own Trainer (its integration builds the engine from
            # the JSON): the launch line rehearses that; this module's own loop drives FSDP only.
            result.findings.append(Finding("GD951", Severity.INFO, "not rehearsed with --accelerate-config: a "
                                           "DeepSpeed config is rehearsed through your script's Trainer on 2 CPU "
                                           "ranks, with the launch line", key="deepspeed_config",
                                           fix="rehearse --launch \"accelerate launch --config_file FILE train.py\" "
                                               "(or \"deepspeed train.py --deepspeed ds.json\", \"torchrun "
                                               "--nproc-per-node 2 train.py ...\")"))
        return result
    if sharding is None:
        result.findings.append(Finding("GD951", Severity.INFO, "the accelerate config asks for neither FSDP nor "
                                       "DeepSpeed: nothing to rehearse on ranks", key="distributed_type",
                                       fix="rehearse without --accelerate-config"))
        return result
    result.notes += [f"on 2 CPU ranks: {why}" for why in replacements(config)]
    fsdp = config.get("fsdp_config") if isinstance(config.get("fsdp_config"), Mapping) else {}
    result.trainer = f"fsdp{fsdp.get('fsdp_version') or 1} on {WORLD} CPU ranks"
    plan = {**plan, "accelerate_config": str(Path(path).absolute()), "rank_stages": list(RANK_STAGES), "stages": []}
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={WORLD}",
            "-m", "gemma_doctor.rehearse.ranks"]
    records, ended, _ = run_script(plan, argv, timeout)
    result.stack = next((dict((k, v) for k, v in r.items() if k not in ("stage", "status", "elapsed"))
                         for r in records if r.get("stage") == "stack"), {})
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for r in records:
        if isinstance(r.get("rank"), int):
            by_rank.setdefault(r["rank"], []).append(r)
    result.stages = [r for r in records if r.get("stage") not in ("stack", "done")]
    found = invariants.judge([r for r in records if "rank" not in r and r.get("stage") != "stack"],
                             catalogue.entries(), plan.get("model_type"))
    if ended is not None and ended.startswith("timeout"):
        found.append(Finding("GD952", Severity.ERROR, f"the rehearsal did not finish ({ended}): the process group "
                             "of both ranks was killed", key="ranks",
                             fix="raise --timeout on a slow machine; otherwise see which rank stopped (GD990)"))
    found += judge(by_rank, ended, invariants.LOGITS_RTOL) if any(r.get("stage") == "twin" and r.get("status") == "ok"
                                                                   for r in records) else []
    result.findings += found
    return result


def cpu_launch(argv: list[str], folder: Path) -> tuple[list[str], list[str]]:
    """An `accelerate launch --config_file fsdp.yaml ...` command for CPU ranks: the config copied into ``folder``
    with what a CPU cannot do replaced (a device-only setting makes accelerate stop before the script's first line
    would on a GPU), at most 2 processes (a DeepSpeed config: only those); a `deepspeed train.py` line under torch's
    launcher; (the command, the notes saying it). Another command comes back as it is."""
    if argv and Path(argv[0]).name == "deepspeed":
        return _deepspeed_on_cpu(argv)
    if not argv or Path(argv[0]).name != "accelerate":
        return argv, []
    at = next((i for i, w in enumerate(argv) if w == "--config_file" or w.startswith("--config_file=")), None)
    if at is None:
        return argv, []
    path = argv[at].split("=", 1)[1] if "=" in argv[at] else (argv[at + 1] if at + 1 < len(argv) else "")
    config = read_config(Path(path))
    sharding = kind(config)
    if sharding is None:
        return argv, []
    import yaml

    copy = folder / "accelerate-cpu.yaml"
    if sharding == "deepspeed":
        # DeepSpeed runs on CPU ranks as it is (its CPU accelerator, gloo): only the rank count is the CPU's.
        copy.write_text(yaml.safe_dump({**config, "num_processes": WORLD, "num_machines": 1}))
    else:
        fsdp = dict(config["fsdp_config"]) if isinstance(config.get("fsdp_config"), Mapping) else {}
        fsdp.update(fsdp_sync_module_states=False, fsdp_cpu_ram_efficient_loading=False)
        copy.write_text(yaml.safe_dump({**config, "fsdp_config": fsdp, "num_processes": WORLD, "num_machines": 1}))
    out = list(argv)
    if "=" in out[at]:
        out[at] = f"--config_file={copy}"
    else:
        out[at + 1] = str(copy)
    for i, w in enumerate(out):
        if w in ("--num_processes", "--num-processes") and i + 1 < len(out):
            out[i + 1] = str(WORLD)
        elif w.startswith(("--num_processes=", "--num-processes=")):
            out[i] = f"{w.split('=', 1)[0]}={WORLD}"
    notes = [f"on CPU ranks: {why}" for why in replacements(config)[:-1]]
    if sharding == "deepspeed":
        return out, [n for n in notes if "num_processes" in n or "num_machines" in n]
    notes.append("on CPU ranks accelerate 1.15 runs an FSDP config as MULTI_CPU (DDP, no sharding): the launched "
                 "script is rehearsed on 2 CPU ranks without FSDP; its sharding is rehearsed by `rehearse "
                 "--training-config T --accelerate-config FILE`")
    return out, notes


def deepspeed_missing(argv: list[str]) -> Finding | None:
    """GD950 for a launch line that runs DeepSpeed (`deepspeed train.py`, `--deepspeed ds.json`, `accelerate launch
    --use_deepspeed` or a DeepSpeed accelerate config) where DeepSpeed is not installed: named, nothing rehearsed."""
    import importlib.util

    from gemma_doctor.errors import UsageError

    def config_is_deepspeed(i: int, w: str) -> bool:
        path = w.split("=", 1)[1] if "=" in w else (argv[i + 1] if i + 1 < len(argv) else "")
        try:
            return kind(read_config(Path(path))) == "deepspeed"
        except (UsageError, OSError):
            return False

    asks = bool(argv) and Path(argv[0]).name == "deepspeed" or any(
        w in ("--use_deepspeed", "--use-deepspeed") or w == "--deepspeed" or w.startswith("--deepspeed=")
        or (w == "--config_file" or w.startswith("--config_file=")) and config_is_deepspeed(i, w)
        for i, w in enumerate(argv))
    if not asks or importlib.util.find_spec("deepspeed") is not None:
        return None
    return Finding("GD950", Severity.ERROR, f"not rehearsable: DeepSpeed is not installed in this environment "
                   f"({sys.executable}); the launch line runs DeepSpeed", key="deepspeed",
                   fix="run the rehearsal in the environment that trains (nothing is installed for you)")


def _deepspeed_on_cpu(argv: list[str]) -> tuple[list[str], list[str]]:
    """A `deepspeed [options] train.py ...` line for 2 CPU ranks: the script and its arguments under torch's own
    launcher (what DeepSpeed's launcher runs on one node, without its GPU discovery, hostfile and ssh), with the notes
    saying so."""
    from gemma_doctor.rehearse.launch import script_of

    at = script_of(argv)
    if at is None:
        return argv, []
    out = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={WORLD}", *argv[at:]]
    return out, [f"on CPU ranks: `deepspeed` launches the script on {WORLD} processes of torch's launcher "
                 "(torch.distributed.run, LOCAL_RANK in the environment, no --local_rank argument); its own options "
                 f"({' '.join(argv[1:at]) or 'none'}) and GPU discovery are not rehearsed"]


# -- the ranks: run under torch.distributed.run, one process per rank -------------------------------------------------
class Rank:
    """One rank's stages, each a collective step both ranks take in order."""

    def __init__(self, plan: dict[str, Any], events: Any, rank: int) -> None:
        self.plan, self.events, self.rank = plan, events, rank
        self.work = Path(plan["workdir"])
        self.model: Any = None
        self.plugin: Any = None
        self.tokenizer: Any = None

    def _load(self, where: str) -> Any:
        import torch
        import transformers

        cls = getattr(transformers, self.plan["architecture"])
        dtype = (self.plan.get("settings") or {}).get("dtype")
        # float32 unless the training config loads another dtype: FSDP's mixed precision casts for compute, as the
        # Trainer's models load in float32 by default.
        return cls.from_pretrained(where, dtype=getattr(torch, dtype) if dtype else torch.float32)

    def load(self) -> None:
        """Tokenizer and model from the twin's repo id, on every rank."""
        import transformers

        self.tokenizer = transformers.AutoTokenizer.from_pretrained(self.plan["repo_id"])
        self.model = self._adapted(self._load(self.plan["repo_id"]))
        self.events.write("load", "ok", cls=type(self.model).__name__, dtype=str(self.model.dtype),
                          trainable=sum(p.numel() for p in self.model.parameters() if p.requires_grad))

    def _adapted(self, model: Any) -> Any:
        """``model`` with the training config's LoRA adapter (PEFT), as the run trains it; as it is without one."""
        from gemma_doctor.rehearse.driver import lora_config

        config = lora_config((self.plan.get("settings") or {}).get("lora"))
        if config is None:
            return model
        from peft import get_peft_model

        return get_peft_model(model, config)

    def wrap(self) -> None:
        """accelerate's FSDP plugin from the config (its wrap policy included), then torch's FSDP1 or FSDP2."""
        import functools

        import torch
        from accelerate.utils import FullyShardedDataParallelPlugin

        # accelerate's launcher's reading of the config, then the plugin from those variables, as in a launched run
        env = _plugin_env(self.plan["accelerate_config"])
        os.environ.update(env)
        plugin = FullyShardedDataParallelPlugin()
        precision = env.get("ACCELERATE_MIXED_PRECISION", "no")
        if precision != "no":
            plugin.set_mixed_precision(precision)  # as AcceleratorState does for an FSDP plugin
        policy = plugin.auto_wrap_policy
        classes = list(plugin.transformer_cls_names_to_wrap or [])
        layers = sorted({type(m).__name__ for m in self.model.modules() if type(m).__name__.endswith("DecoderLayer")})
        try:
            if hasattr(self.model, "peft_config"):
                # as the Trainer does for a PEFT model (transformers 5.23 distributed/fsdp.py update_fsdp_plugin_peft):
                # PEFT's policy wraps the LoRA layers apart, so no flat parameter mixes frozen and trained tensors
                from peft.utils.other import fsdp_auto_wrap_policy

                plugin.auto_wrap_policy = fsdp_auto_wrap_policy(self.model)
            plugin.set_auto_wrap_policy(self.model)
        except ValueError as e:
            from gemma_doctor.rehearse.driver import _error

            self.events.write("wrap", "error", **_error(e), classes=classes, suggest=", ".join(layers))
            raise _Recorded() from e
        named = set(plugin.transformer_cls_names_to_wrap or classes)
        wrapped = sum(1 for m in self.model.modules() if type(m).__name__ in named)
        if plugin.activation_checkpointing:
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
                CheckpointImpl, apply_activation_checkpointing, checkpoint_wrapper)

            # as accelerate's prepare_model does for FSDP
            apply_activation_checkpointing(self.model, checkpoint_wrapper_fn=functools.partial(
                checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
                auto_wrap_policy=plugin.auto_wrap_policy)
        if plugin.fsdp_version == 2:
            from torch.distributed.fsdp import fully_shard

            shard = dict(reshard_after_forward=plugin.reshard_after_forward, offload_policy=plugin.cpu_offload)
            if plugin.mixed_precision_policy is not None:
                shard["mp_policy"] = plugin.mixed_precision_policy
            for m in list(self.model.modules()):
                if type(m).__name__ in named:
                    fully_shard(m, **shard)
            fully_shard(self.model, **shard)
        else:
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

            self.model = FSDP(self.model, sharding_strategy=plugin.sharding_strategy, cpu_offload=plugin.cpu_offload,
                              auto_wrap_policy=plugin.auto_wrap_policy, mixed_precision=plugin.mixed_precision_policy,
                              sync_module_states=False, backward_prefetch=plugin.backward_prefetch,
                              forward_prefetch=plugin.forward_prefetch, use_orig_params=plugin.use_orig_params,
                              limit_all_gathers=plugin.limit_all_gathers, device_id=torch.device("cpu"))
        self.plugin = plugin
        self.events.write("wrap", "ok", version=plugin.fsdp_version, policy=_policy_name(policy), classes=sorted(named),
                          wrapped=wrapped, suggest=", ".join(layers),
                          sharding=str(plugin.sharding_strategy).split(".")[-1] if plugin.fsdp_version == 1 else
                          f"reshard_after_forward {plugin.reshard_after_forward}",
                          state_dict_type=str(plugin.state_dict_type), offload=str(plugin.cpu_offload),
                          activation_checkpointing=bool(plugin.activation_checkpointing))

    def train(self) -> None:
        """A few AdamW steps, each rank on its own rows (its data shard)."""
        import torch

        from gemma_doctor.rehearse.rows import ROWS

        texts = [f"{q} {a}" for q, a in ROWS][self.rank::WORLD]
        optimizer = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad], lr=1e-3)
        losses = []
        # accelerate's prepare_model wraps the forward in autocast for mixed_precision bf16, FSDP or not
        bf16 = os.environ.get("ACCELERATE_MIXED_PRECISION") == "bf16"
        self.model.train()
        for step in range(int(self.plan["steps"])):
            batch = self.tokenizer(texts[step % len(texts)], return_tensors="pt")
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                out = self.model(**batch, labels=batch["input_ids"], use_cache=False)
            out.loss.float().backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(float(out.loss.detach()))
        self.events.write("train", "ok", losses=losses)

    def _full(self) -> dict[str, Any]:
        """The full state gathered on this rank (a collective: every rank calls it)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=False))

    def agree(self) -> None:
        """The gathered full state, digested on each rank: equal on both after the steps."""
        import hashlib

        full = self._full()
        h = hashlib.sha256()
        for name in sorted(full):
            h.update(name.encode())
            h.update(full[name].detach().float().contiguous().numpy().tobytes())
        self.events.write("agree", "ok", digest=h.hexdigest()[:16], tensors=len(full))

    def save(self) -> None:
        """The checkpoint as the Trainer writes it under FSDP (transformers 5.23 Trainer.save_model and
        _save_checkpoint): the full state as model.safetensors for FULL_STATE_DICT, nothing for the other types;
        then accelerate's save_fsdp_model (pytorch_model_fsdp.bin, or pytorch_model_fsdp_0/ for SHARDED)."""
        from accelerate import PartialState
        from accelerate.utils import save_fsdp_model

        folder = self.work / "checkpoint"
        full_type = "FULL_STATE_DICT" in str(self.plugin.state_dict_type)
        full = self._full() if full_type else None
        if full_type and self.rank == 0:
            _unwrapped(self.model).save_pretrained(str(folder), state_dict=full)
        save_fsdp_model(self.plugin, PartialState(), self.model, str(folder))
        import torch.distributed as dist

        dist.barrier()
        self.events.write("save", "ok", files=sorted(p.name for p in folder.iterdir()) if folder.exists() else [])

    def reload(self) -> None:
        """Rank 0 reloads the checkpoint folder on one process as a script's from_pretrained does; same logits as the
        trained model (its gathered full state in a fresh model)."""
        import torch
        import torch.distributed as dist

        full = self._full()
        if self.rank == 0:
            folder = self.work / "checkpoint"
            reference = self._adapted(self._load(self.plan["repo_id"]))
            reference.load_state_dict(full, strict=True)
            batch = self.tokenizer("a probe", return_tensors="pt")
            with torch.no_grad():
                ref = reference(**batch, use_cache=False).logits.float()
            kind_ = str(self.plugin.state_dict_type).split(".")[-1]
            try:
                if (folder / "adapter_config.json").is_file():
                    from peft import PeftModel

                    reloaded = PeftModel.from_pretrained(self._load(self.plan["repo_id"]), str(folder))
                else:
                    reloaded = self._load(str(folder))
            except Exception as e:  # noqa: BLE001 - the reload's failure is the invariant's finding
                from gemma_doctor.rehearse.driver import _error

                self.events.write("reload", "ok", state_dict_type=kind_, max_abs_diff=None, scale=None,
                                  why=f"from_pretrained of the checkpoint folder fails: {_error(e)['line']}",
                                  cure=self._merged(folder, ref, batch),
                                  fix="save the model with FULL_STATE_DICT (fsdp_state_dict_type, or "
                                      "trainer.accelerator.state.fsdp_plugin.set_state_dict_type('FULL_STATE_DICT') "
                                      "before save_model), or merge the shards: accelerate merge-weights "
                                      "CHECKPOINT/pytorch_model_fsdp_0 OUT")
            else:
                with torch.no_grad():
                    got = reloaded(**batch, use_cache=False).logits.float()
                adapter = _adapter_tensors(folder)
                diff = float((ref - got).abs().max())
                why = None
                if adapter == 0:
                    # PEFT 0.21.2 names the adapter's keys from the model's module names, which under FSDP1 or
                    # activation checkpointing hold a wrapper's segment inside them; the full state's keys do not
                    inside = sorted({w for n, _ in _unwrapped(self.model).named_modules() if "lora_" in n
                                     for w in _WRAPPERS if f".{w}." in n})
                    why = (f"the adapter saved holds no tensor (adapter_model.safetensors is empty; its module names "
                           f"hold {', '.join(inside) or 'a wrapper'}): PeftModel.from_pretrained loads a fresh "
                           f"adapter, logits {diff:.4g} away from the trained model's")
                self.events.write("reload", "ok", state_dict_type=kind_, max_abs_diff=diff,
                                  scale=float(ref.abs().max()),
                                  adapter_tensors=adapter, why=why,
                                  fix="FSDP2 (fsdp_version: 2) without fsdp_activation_checkpointing saves the "
                                      "adapter's tensors (rehearsed on this stack); otherwise save the adapter "
                                      "yourself from the gathered full state, keyed as the model's own names"
                                  if adapter == 0 else None)
        dist.barrier()


    def _merged(self, folder: Path, ref: Any, batch: Any) -> str | None:
        """The cure rehearsed: accelerate's merge of the sharded checkpoint (`accelerate merge-weights`) loaded into
        the model; its verdict, or None where there is no sharded checkpoint to merge."""
        import torch
        from accelerate.utils import merge_fsdp_weights
        from safetensors.torch import load_file

        shards = folder / "pytorch_model_fsdp_0"
        if not shards.is_dir():
            return None
        merged = self.work / "merged"
        try:
            merge_fsdp_weights(str(shards), str(merged), safe_serialization=True)
            model = self._load(self.plan["repo_id"])
            model.load_state_dict(load_file(str(merged / "model.safetensors")), strict=True)
            with torch.no_grad():
                got = model(**batch, use_cache=False).logits.float()
        except Exception as e:  # noqa: BLE001 - a cure that fails is said, not raised
            from gemma_doctor.rehearse.driver import _error

            return ("the cure did not help in this stack: accelerate merge-weights then loading fails: "
                    f"{_error(e)['line']}")
        diff, scale = float((ref - got).abs().max()), float(ref.abs().max())
        if diff > 0.05 * max(scale, 1e-6):
            return f"the cure did not help in this stack: the merged weights give logits {diff:.4g} away"
        return (f"cure verified in this stack: accelerate merge-weights of pytorch_model_fsdp_0 loads with the trained "
                f"model's logits (within {diff:.2g})")


# Module-name segments of torch's wrappers: FSDP1's units and activation checkpointing's.
_WRAPPERS = ("_fsdp_wrapped_module", "_checkpoint_wrapped_module")


def _adapter_tensors(folder: Path) -> int | None:
    """How many tensors the adapter file of ``folder`` holds; None where the folder holds no adapter."""
    path = folder / "adapter_model.safetensors"
    if not path.is_file():
        return None
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return len(list(f.keys()))


class _Recorded(Exception):
    """A stage's failure already written to the events (with more than the line)."""


def _unwrapped(model: Any) -> Any:
    inner = getattr(model, "module", None)  # FSDP1 wraps; FSDP2 shards in place
    return inner if inner is not None else model


def _policy_name(policy: Any) -> str:
    name = getattr(getattr(policy, "func", policy), "__name__", str(policy))
    return {"transformer_auto_wrap_policy": "transformer_based_wrap",
            "size_based_auto_wrap_policy": "size_based_wrap"}.get(name, str(name) if policy is not None else "no_wrap")


class _RankEvents:
    """The rehearsal's events file, each record tagged with the rank that wrote it (one line, one write)."""

    def __init__(self, events: Any, rank: int) -> None:
        self.inner, self.rank, self.file = events, rank, events.file

    def write(self, stage: str, status: str, **data: Any) -> None:
        """Record one stage's outcome on this rank."""
        self.inner.write(stage, status, rank=self.rank, **data)


def main(argv: list[str]) -> int:
    """One rank, started by ``python -m torch.distributed.run --nproc_per_node 2 -m gemma_doctor.rehearse.ranks``
    in the launch's child (launch.run_script), which names the plan in GEMMA_DOCTOR_LAUNCH_PLAN."""
    from datetime import timedelta

    import torch.distributed as dist

    from gemma_doctor.rehearse.driver import Events, _error

    plan = json.loads(Path(argv[0] if argv else os.environ["GEMMA_DOCTOR_LAUNCH_PLAN"]).read_text())
    rank = int(os.environ.get("RANK", "0"))
    events = _RankEvents(Events(Path(plan["events"])), rank)
    dist.init_process_group("gloo", timeout=timedelta(seconds=float(plan.get("collective_timeout", 600))))
    r = Rank(plan, events, rank)
    for name in plan["rank_stages"]:
        try:
            getattr(r, name)()
        except _Recorded:
            events.file.flush()
            os._exit(1)  # the other rank waits in a collective: torchrun's agent stops it when this one exits
        except Exception as e:  # noqa: BLE001 - a stage's failure is the rehearsal's result, judged by the parent
            events.write(name, "error", **_error(e))
            events.file.flush()
            os._exit(1)
    events.write("done", "ok")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


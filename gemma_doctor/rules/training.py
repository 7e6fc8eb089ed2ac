"""Training-config lint (GD6xx): the precision settings a run will use, judged against the model and the GPU."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

from gemma_doctor.codes import emits
from gemma_doctor.errors import UsageError
from gemma_doctor.facts import CheckOptions, Environment, ModelFacts
from gemma_doctor.readers import gpu as gpu_reader
from gemma_doctor.readers.gpu import GpuFacts
from gemma_doctor.readers.training_config import axolotl_on_mps, truthy
from gemma_doctor.report import Finding, Severity
from gemma_doctor.rules.common import LIBRARIES, RUN, checkpoints, run_trainer, written_of
from gemma_doctor.rules.dtypes import embedding_note
from gemma_doctor.stack import Exposure
from gemma_doctor.trainers import Trainer
from gemma_doctor.run import Engine, trl_peft_off, trl_unused_lora_keys
from gemma_doctor.versioning import HYBRIDCACHE, HYBRIDCACHE_FIRST_FIXED

HYBRID_CRASH = "AttributeError: 'HybridCache' object has no attribute 'float'"

@dataclass(frozen=True)
class GpuView:
    """What the lint needs to know about the GPU: native bf16 (None = unknown) and the emulation trap."""

    native_bf16: bool | None
    emulated_trap: bool
    label: str


def view_of(gpu: GpuFacts) -> GpuView:
    """The lint's view of readers/gpu.py's GPU value (the one view check, recommend and the Python API judge by)."""
    # CPU runs (no GPU) use CPU autocast, where bf16 is fine: nothing to judge.
    native = None if gpu.backend == "none" else gpu.native_bf16
    return GpuView(native, gpu.emulated_bf16_trap, gpu.label)


def fallback_gpu(spec: str) -> GpuView:
    """The view of a --gpu spec (8.0, sm_75, T4, none) for when no GPU fact is in the environment: readers/gpu.py's
    reading of it, never raising (a spec it refuses is an unknown GPU)."""
    try:
        return view_of(gpu_reader.planned(spec))
    except UsageError:
        return GpuView(None, False, spec)


def gpu_view(env: Environment, options: CheckOptions) -> GpuView:
    """The GPU the run will use: the environment's GPU fact when present, else the --gpu spec, else unknown."""
    if env.gpu is not None:
        return view_of(env.gpu)
    if options.gpu:
        return fallback_gpu(options.gpu)
    return GpuView(None, False, "unknown GPU")


def _dtype_name(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    v = value.strip().lower().removeprefix("torch.")
    return {"bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "fp16": "fp16", "half": "fp16",
            "float32": "fp32", "fp32": "fp32", "float": "fp32"}.get(v)


def _at(tc: Any, key: str | None, **details: Any) -> dict[str, Any]:
    setting = tc.get(key) if key else None
    where = {"file": tc.path, "key": setting.key if setting else key}
    line = setting.line if setting else None
    return {**where, "details": {"line": line, **details} if line else dict(details)}


def _finding(code: str, sev: Severity, msg: str, fix: str, tc: Any, name: str | None) -> Finding:
    a = _at(tc, name)
    return Finding(code, sev, msg, file=a["file"], key=a["key"], fix=fix, details=a["details"])


def setting_finding(code: str, sev: Severity, msg: str, fix: str, tc: Any, name: str | None, **details: Any) -> Finding:
    """A finding about one setting of the training config: its file, its key as written, its line."""
    a = _at(tc, name, **details)
    return Finding(code, sev, msg, file=a["file"], key=a["key"], fix=fix, details=a["details"])


def _key_problems(tc: Any) -> Iterator[Finding]:
    """GD680 / GD681: keys and values a TRL / TrainingArguments config has that its trainer refuses (GD680 also a
    LLaMA-Factory key, GD681 an axolotl boolean its schema refuses); GD986: a key of an axolotl config that its schema
    drops."""
    from gemma_doctor.readers.training_config import key_table

    for p in tc.problems:
        if p.kind == "deepspeed-unplanned":
            # The run reads the file and starts; only this plan lacks what it says.
            yield Finding("GD601", Severity.WARNING, f"the DeepSpeed config it names is not read here: {p.key}: {p.value} "
                          f"{p.why}", file=tc.path, key=p.key,
                          fix=f"check that {p.key} names the DeepSpeed JSON you meant (a few KiB of settings)",
                          details={"line": p.line} if p.line else {})
        if p.kind == "deepspeed-file":
            # The rest of the config was read and is planned; the run itself stops at start-up on this path.
            yield Finding("GD601", Severity.ERROR, f"the DeepSpeed config it names cannot be read: {p.key}: {p.value} "
                          f"{p.why}", file=tc.path, key=p.key,
                          fix=f"point {p.key} at the DeepSpeed JSON file (or write its JSON inline)",
                          details={"line": p.line} if p.line else {})
    table = tc.format.key_table or "trainer_keys"
    read = key_table(table)["read_from"]
    for p in (p for p in tc.problems if not p.kind.startswith("deepspeed-")):
        details = {"line": p.line, **p.to_json(), "read_from": dict(read)} if p.line else {**p.to_json(),
                                                                                            "read_from": dict(read)}
        if table == "axolotl_keys" and p.kind == "not-boolean":
            meant = f" (did you mean {p.suggestion}?)" if p.suggestion else ""
            literal = key_table(table).get("literal_booleans", {}).get(p.key, ())
            also = f", and {' or '.join(literal)} as written" if literal else ""
            yield Finding(
                "GD681", Severity.ERROR,
                f"{p.key}: {p.value!r} is not a boolean{meant}: axolotl {read['axolotl']}'s schema refuses the config "
                f"before training starts (a pydantic ValidationError; it reads true/false, yes/no, on/off, t/f, y/n "
                f"and 1/0 in any case{also}), and a reader that takes any non-empty string for true turns it on",
                file=tc.path, key=p.key, fix=f"{p.key}: {p.suggestion or 'true or false'}", details=details)
            continue
        if table == "axolotl_keys":
            yield Finding(
                "GD986", Severity.WARNING,
                f"{p.key} is not a setting of axolotl {read['axolotl']}'s config; did you mean {p.suggestion}? "
                f"axolotl's schema drops a key it does not know without a word, so the run trains with the default "
                f"{p.suggestion}", file=tc.path, key=p.key, fix=f"rename {p.key} to {p.suggestion}", details=details)
            continue
        if table == "llamafactory_keys" and p.kind == "not-boolean":
            yield Finding(
                "GD681", Severity.ERROR,
                f"{p.key}: {p.value!r} is not a boolean: LLaMA-Factory {read['llamafactory']} hands it to its arguments "
                "unconverted (HfArgumentParser.parse_dict), where any non-empty string is true"
                + (f", so the run has {p.key} on" if p.value else f" and the empty one false, so the run has {p.key} off"),
                file=tc.path, key=p.key, fix=f"{p.key}: true or false (unquoted)", details=details)
            continue
        if table == "llamafactory_keys":
            yield Finding(
                "GD680", Severity.ERROR,
                f"{p.key} is not a setting of LLaMA-Factory {read['llamafactory']}'s arguments; did you mean "
                f"{p.suggestion}? `llamafactory-cli train` stops with \"Some keys are not used by the HfArgumentParser\" "
                "(it parses the file with allow_extra_keys=False unless ALLOW_EXTRA_ARGS is set)", file=tc.path,
                key=p.key, fix=f"rename {p.key} to {p.suggestion}", details=details)
            continue
        source = f"TRL {read['trl']} / transformers {read['transformers']}"
        if p.kind == "unknown-key":
            yield Finding(
                "GD680", Severity.ERROR,
                f"{p.key} is not a setting of TRL's trainers or TrainingArguments ({source}); did you mean "
                f"{p.suggestion}? `trl sft --config` stops with \"Unknown arguments from config file\", "
                "TrainingArguments(**config) with a TypeError, and a script that drops unknown keys trains with the "
                f"default {p.suggestion}", file=tc.path, key=p.key, fix=f"rename {p.key} to {p.suggestion}",
                details=details)
        else:
            meant = f" (did you mean {p.suggestion}?)" if p.suggestion else ""
            yield Finding(
                "GD681", Severity.ERROR,
                f"{p.key}: {p.value!r} is not a boolean{meant}: TRL's parser stops with \"Truthy value expected: got "
                f"{p.value}\" (transformers' string_to_bool reads yes/no, true/false, t/f, y/n, 1/0), and a "
                "reader that takes any non-empty string for true turns it on",
                file=tc.path, key=p.key, fix=f"{p.key}: {p.suggestion or 'true or false'}", details=details)


@emits("GD601", "GD602", "GD603", "GD604", "GD605", "GD606", "GD607", "GD608", "GD609", "GD610", "GD611", "GD612",
       "GD664", "GD680", "GD681", "GD986",
       reads=("model.family", "model.census", *RUN, *LIBRARIES, "env.gpu", "env.training_config", "options.gpu",
              "options.task", "options.launch"))
def check(model: ModelFacts, env: Environment, options: CheckOptions) -> Iterator[Finding]:
    """Lint the --training-config file (read once by the env probe) against this model and the GPU."""
    tc = env.training_config
    if tc is None or not model.family.is_gemma:
        return
    if not tc.ok:
        yield Finding("GD601", Severity.ERROR, f"training config cannot be read: {tc.error}", file=tc.path,
                      fix="fix the file (JSON or YAML mapping of settings) and run the check again")
        return
    yield from _key_problems(tc)
    s = tc.settings
    fam = model.family
    name = fam.label  # never None here: every Gemma model has a family label
    fp16_unsafe = fam.fp16_unsafe
    # The switches as written (the Run's): which setting turns fp16 / bf16 on (GD602-GD604 point at it), `bf16: auto`.
    switches = written_of(model, env).switches
    fp16_key, bf16_key = switches.setting("fp16"), switches.setting("bf16")
    bf16_auto = switches.is_auto("bf16") \
        and not tc.format.auto_copies_training_arguments  # DeepSpeed's "auto" copies TrainingArguments
    on_cpu = "use_cpu" in s and truthy(s["use_cpu"].value)
    gpu = GpuView(None, False, "CPU") if on_cpu else gpu_view(env, options)

    # A switch whose value the trainer refuses (GD681) does not make the run train in fp32: it does not start.
    refused = {p.key for p in tc.problems if p.kind == "not-boolean"}
    # TRL's configs set `bf16 = not fp16` where bf16 is unset (versioning.TRL_BF16_DEFAULT): such a config trains in
    # bf16 by the trainer's default, not in fp32 (the Run's precision, whose source names that default). The switches
    # themselves (fp16_key, bf16_key) stay the file's: GD604's two switches on is a run that does not start, which the
    # Run does not model.
    run = model.run
    by_default = run is not None and run.precision.value == "bf16" and run.precision.source.startswith("default of ")
    if by_default and run.trainer.value.runs_trl:
        bf16_default = f"bf16 (unset: TRL's config turns it on where fp16 is off, {env.libraries.get('trl').describe()})"
    else:
        bf16_default = None
    # LLaMA-Factory's pure_bf16 trains the weights themselves in bfloat16, with or without `bf16` (0.9.5
    # runplan._own_precision): a bf16 run (GD603 where the GPU has none), never GD609's fp32.
    pure = s.get("pure_bf16")
    if bf16_default is None and not bf16_key and pure is not None and truthy(pure.value) \
            and run_trainer(model, env).value is Trainer.LLAMA_FACTORY:
        bf16_default = f"{pure.key}: true (LLaMA-Factory trains the weights in bfloat16)"
    # axolotl's schema defaults bf16 to `auto` (0.19.0; runplan._own_precision): an unset bf16 asks the machine as a
    # written `auto` does (GD605, not GD609's fp32).
    axolotl_auto = by_default and run.trainer.value is Trainer.AXOLOTL and not bf16_auto
    # axolotl on Apple MPS runs no bf16: its resolve_dtype turns bf16 (written or auto) into fp16 there
    # (readers.training_config.axolotl_on_mps): GD602 where that fp16 meets this model, and no bf16 finding, nor GD609's
    # fp32 where it runs fp16.
    on_mps = getattr(env.gpu, "backend", None) == "mps" and not on_cpu \
        and run_trainer(model, env).value is Trainer.AXOLOTL
    # Whether TRL's default applies where the stack's TRL version is unknown (GD609 then says both).
    trl_bf16 = tc.bf16_by_trainer(env.libraries)
    if fp16_key is None and bf16_key is None and not bf16_auto and not refused & {"fp16", "bf16"} \
            and bf16_default is None and not axolotl_auto and not (on_mps and axolotl_on_mps(s)[0] != "fp32"):
        # A launch line read (--launch) states what its launcher adds: its flags, its config file or accelerate's
        # default config (readers/launch.py); only where none was read may a launcher still add autocast.
        launcher = "unless the launcher adds it" if getattr(options, "launch", None) is None else \
            "(the launch line and the config files its launcher reads add none)"
        unless = (f"{launcher}, or TRL >= 0.19 turns bf16 on (its configs set bf16 = not fp16; the "
                  "stack's TRL version is not known)" if trl_bf16 is Exposure.UNKNOWN else launcher)
        yield _finding("GD609", Severity.INFO,
                       f"{tc.path} ({tc.kind}) sets no mixed precision (fp16/bf16/mixed_precision): the run trains in fp32 "
                       + unless, "nothing to do if fp32 is intended" + (
                           "; set bf16: false to be sure of fp32, or bf16: true for bf16" if trl_bf16 is Exposure.UNKNOWN
                           else ""), tc, None)
    if fp16_key and bf16_key:
        yield _finding("GD604", Severity.ERROR, "both fp16 and bf16 are enabled: transformers refuses to start "
                       "(or one silently wins, depending on the launcher)",
                       "enable one of them: bf16 on a GPU with native bf16, otherwise neither (fp32)", tc, fp16_key)
    mps_fp16 = on_mps and axolotl_on_mps(s)[0] == "fp16"
    if mps_fp16 and fp16_unsafe and not fp16_key:
        yield _finding("GD602", Severity.ERROR,
                       f"fp16 on {name}: axolotl runs this config in fp16 on Apple MPS (its resolve_dtype turns bf16, "
                       "written or its default auto, into fp16 there, with float16 weights), and the model's "
                       "activations exceed fp16's maximum (65504), giving inf/NaN losses (transformers #36822)"
                       + embedding_note(model),
                       "set bf16: false and fp16: false (fp32) for axolotl on MPS, or train on a GPU with native bf16",
                       tc, "bf16")
    if fp16_key and fp16_unsafe:
        yield _finding("GD602", Severity.ERROR,
                       f"fp16 on {name}: the model was pretrained in bf16 and its activations exceed fp16's maximum "
                       "(65504), giving inf/NaN losses (transformers #36822; DPO gives loss=0, reward=nan, TRL #3236)"
                       + embedding_note(model),
                       "use bf16 where the GPU has native bf16 (compute capability >= 8.0), otherwise train in fp32",
                       tc, fp16_key)
    # (axolotl turns bf16 off on MPS: no bf16 runs there for GD603 / GD605 to judge)
    if (bf16_key or bf16_default) and gpu.native_bf16 is False and not on_mps:
        yield _finding("GD603", Severity.ERROR,
                       f"{'bf16 is enabled' if bf16_key else bf16_default} but {gpu.label} has no native bf16 (needs "
                       "compute capability >= 8.0): torch emulates it, slowly, or the run fails",
                       "set bf16 to false and train in fp32" + (" (never fp16 for this model)" if fp16_unsafe else "")
                       + ", or use an A100/L4/H100-class GPU", tc, bf16_key)
    if (bf16_auto or axolotl_auto) and (gpu.emulated_trap or gpu.native_bf16 is False) and not on_mps:
        yield _finding("GD605", Severity.WARNING,
                       ("bf16 unset is bf16: auto under axolotl (its schema's default), which " if axolotl_auto
                        else "bf16: auto ")
                       + f"resolves through torch.cuda.is_bf16_supported(), which counts emulation, so on "
                       f"{gpu.label} it picks slow emulated bf16",
                       "set bf16: false (fp32) explicitly on this GPU", tc, "bf16")
    four_bit = _four_bit(model, env)
    yield from _load_dtype(tc, fp16_unsafe, name, four_bit)
    yield from _fp16_grads(model, tc, fp16_key)
    yield from _use_cache(model, env, tc, fp16_key or bf16_key)
    yield from _dpo(model, options, tc, fp16_key, name)
    yield from _qlora(tc, gpu, fp16_unsafe, name, four_bit)
    yield from _peft_off(model, env, tc, name)
    yield from _grpo_batch(model, tc)


def _use_cache(model: ModelFacts, env: Environment, tc: Any, mixed: str | None) -> Iterator[Finding]:
    uc = tc.get("use_cache")
    if uc is None or not truthy(uc.value):
        return
    reasons = []
    if checkpoints(model):  # the Run's: the config's key, or its trainer's default (TRL's configs: on)
        gc = model.run.checkpointing
        said = f"{gc.config_key}: true" if gc.config_key else f"gradient checkpointing (on by the {gc.source})"
        reasons.append(f"it conflicts with {said}, and transformers turns it off with a warning")
    buggy = env.libraries.exposure(HYBRIDCACHE) is Exposure.AFFECTED
    if model.family.builds_hybrid_cache and mixed:
        precision = tc.get(mixed)
        shown = str(precision.value).lower() if isinstance(precision.value, bool) else precision.value
        reasons.append(f"with {precision.key}: {shown} the evaluation loop builds a HybridCache, on which "
                       f"transformers 4.50.0-4.50.3 crash ({HYBRID_CRASH}), whatever `gemma-doctor fix` wrote on disk")
    if not reasons:
        return
    sev = Severity.ERROR if buggy and model.family.builds_hybrid_cache and mixed else Severity.WARNING
    yield _finding("GD606", sev, "use_cache is true in the training config: " + "; ".join(reasons),
                   f"remove {uc.key} or set it to false (training needs no KV cache)"
                   + (f"; or pip install \"transformers>={HYBRIDCACHE_FIRST_FIXED}\"" if buggy else ""), tc, "use_cache")


def _dpo(model: ModelFacts, options: CheckOptions, tc: Any, fp16_key: str | None, name: str | None) -> Iterator[Finding]:
    rl = tc.get("rl")
    task = (str(rl.value).lower() if rl is not None else "") or (options.task or "").lower()
    if task not in ("dpo", "ipo", "simpo", "orpo") or not model.family.fp16_unsafe:
        return
    mgn = tc.get("max_grad_norm")
    value = mgn.value if mgn is not None else None
    clipping = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
    if clipping:
        return
    stable = "bf16=True, gradient_checkpointing=True, optim=adamw_torch_fused, max_grad_norm=1.0"
    if mgn is None and not fp16_key:
        yield _finding("GD607", Severity.INFO,
                       f"{task.upper()} on {name} without max_grad_norm: relies on the trainer's default (1.0 in "
                       "transformers/TRL); state it so a launcher or an older recipe cannot drop clipping",
                       f"set max_grad_norm: 1.0 (stable DPO setting for Gemma: {stable})", tc, None)
        return
    why = "is missing" if mgn is None else f"is {value!r}, which turns gradient clipping off"
    yield _finding("GD607", Severity.WARNING,
                   f"{task.upper()} on {name}: max_grad_norm {why}" + (" (and the recipe trains in fp16)" if fp16_key else "")
                   + ": DPO on Gemma without gradient clipping diverges (TRL #3236 reports loss=0, grad_norm=0, "
                   "reward=nan)",
                   f"set max_grad_norm: 1.0 (stable DPO setting for Gemma: {stable})", tc, "max_grad_norm" if mgn else None)


def _four_bit(model: ModelFacts, env: Environment) -> bool:
    """The training config loads the model in 4 bits (load_in_4bit, quantization_bit 4, axolotl's adapter: qlora):
    the Run's loading as written, whatever an option or the checkpoint makes the run's method."""
    bits = written_of(model, env).lora.quant_bits
    return bits is not None and bits.value == 4


def _load_dtype(tc: Any, fp16_unsafe: bool, name: str | None, four_bit: bool) -> Iterator[Finding]:
    """torch_dtype/dtype (top level or model_init_kwargs) loading a Gemma 2/3 model in float16."""
    setting = tc.get("torch_dtype")
    # With 4-bit QLoRA, TRL's ModelConfig makes torch_dtype the compute dtype: GD608 judges it there.
    if setting is None or not fp16_unsafe or four_bit or _dtype_name(setting.value) != "fp16":
        return
    yield _finding("GD610", Severity.ERROR,
                   f"{setting.key}: {setting.value} loads {name} in float16: the model was pretrained in bf16 and its "
                   "activations exceed fp16's maximum (65504), giving inf/NaN losses whatever bf16/fp16 says "
                   "(transformers #36822)",
                   f"set {setting.key}: bfloat16 where the GPU has native bf16 (compute capability >= 8.0), "
                   "otherwise float32", tc, "torch_dtype")


def _fp16_grads(model: ModelFacts, tc: Any, fp16_key: str | None) -> Iterator[Finding]:
    """GD611: full fine-tuning in fp16 mixed precision of weights loaded in float16 (the Run's load dtype: a config's
    torch_dtype, or axolotl's normalize_config, which loads float16 wherever fp16 is on). The trainable weights' grads
    are then float16, and torch's GradScaler, which transformers' Trainer uses for fp16 (through accelerate),
    refuses them at the first clip or step: "ValueError: Attempting to unscale FP16 gradients." (torch 2.13's
    grad_scaler.py _unscale_grads_, reproduced on the CPU; axolotl #1031). DeepSpeed's own loss scaler and FSDP's
    ShardedGradScaler keep fp32 copies or accept fp16 grads: not judged there. LoRA trains fp32 adapters (PEFT >= 0.12;
    GD4xx judges older PEFT)."""
    run = model.run
    if run is None or run.precision.value != "fp16" or run.load_dtype.value != "float16" \
            or run.method.value.value != "full" or run.distributed.engine.value is Engine.DEEPSPEED \
            or run.distributed.engine.value.fsdp:
        return
    where = run.load_dtype.source
    key = "torch_dtype" if tc.get("torch_dtype") is not None else fp16_key
    yield setting_finding(
        "GD611", Severity.ERROR,
        f"full fine-tuning in fp16 mixed precision of weights loaded in float16 ({where}): the gradients are float16, "
        "and the GradScaler of the Trainer's fp16 refuses them at the first step (\"ValueError: Attempting to unscale "
        "FP16 gradients.\")",
        "train LoRA (the float16 base stays frozen, the adapters train in fp32), or keep fp32 master weights: load in "
        "float32 with fp16 mixed precision (not possible under axolotl, whose fp16 always loads float16), or train in "
        "bf16 / fp32", tc, key, load_dtype=run.load_dtype.value)


def _qlora(tc: Any, gpu: GpuView, fp16_unsafe: bool, name: str | None, four_bit: bool) -> Iterator[Finding]:
    if not four_bit:
        return
    key = "compute_dtype" if tc.get("compute_dtype") is not None else ("torch_dtype" if tc.get("torch_dtype") is not None else None)
    if key is None:
        return
    dtype = _dtype_name(tc.get(key).value)
    if dtype == "bf16" and gpu.native_bf16 is False:
        yield _finding("GD608", Severity.ERROR,
                       f"4-bit QLoRA compute dtype is bfloat16 but {gpu.label} has no native bf16: every matmul runs emulated",
                       "use bnb_4bit_compute_dtype float32 on this GPU (bfloat16 only where bf16 is native)", tc, key)
    elif dtype == "fp16" and fp16_unsafe:
        yield _finding("GD608", Severity.ERROR,
                       f"4-bit QLoRA compute dtype is float16 on {name}: activations exceed fp16's range (inf/NaN)",
                       "use bnb_4bit_compute_dtype bfloat16 where bf16 is native, float32 otherwise", tc, key)


def _grpo_batch(model: ModelFacts, tc: Any) -> Iterator[Finding]:
    """GD664: a GRPO run whose generation batch TRL 1.16's GRPOConfig.__post_init__ refuses with a ValueError
    (run.Generation.indivisible): by default per-device batch x processes x gradient accumulation, which must hold
    whole groups of num_generations (8) completions. Reproduced with TRL 1.16.0's own GRPOConfig
    (tests/test_memory_generation.py)."""
    run = model.run
    gen = run.settings.generation if run is not None else None
    if gen is None:
        return
    s = run.settings
    why = gen.indivisible(s.batch_size, s.gradient_accumulation_steps, max(1, s.num_gpus))
    if why is None:
        return
    key = next((k for k in ("generation_batch_size", "steps_per_generation", "num_generations") if k in tc.settings),
               None)
    whole = gen.whole_batch(s.batch_size, s.gradient_accumulation_steps, max(1, s.num_gpus))
    yield setting_finding(
        "GD664", Severity.ERROR,
        f"GRPO's generation batch: {why}: TRL's GRPOConfig stops with this ValueError before the first step (every "
        "prompt's group of num_generations completions must be whole in one generation batch)",
        f"make per-device batch x processes x gradient_accumulation_steps (or generation_batch_size) a multiple of "
        f"num_generations ({gen.groups}), or lower num_generations to a divisor of it",
        # the option that cures it, where the batch alone decides: the way out asks the search for that run
        tc, key, **({"way_out": {"batch_size": whole}} if whole is not None else {}))


def _peft_off(model: ModelFacts, env: Environment, tc: Any, name: str | None) -> Iterator[Finding]:
    """GD612: a config run by TRL's scripts that writes LoRA keys or 4-bit / 8-bit loading without use_peft: true.
    TRL 1.16.0's get_peft_config returns None unless use_peft is true, so the lora_* keys are unused and every weight
    trains (warning: the run is not the one the file reads like); get_quantization_config reads load_in_4bit / 8bit
    alone, so the model loads quantized with no adapter, which transformers' Trainer refuses (error:
    trainer_utils.validate_quantization_for_training, "You cannot perform fine-tuning on purely quantized models")."""
    trainer = run_trainer(model, env).value
    if not trl_peft_off(trainer, tc.settings):
        return
    said = "without use_peft: true"
    bits = written_of(model, env).lora.quant_bits
    if bits is not None and bits.config_key is not None:
        yield setting_finding(
            "GD612", Severity.ERROR,
            f"{bits.config_key}: true {said}: TRL loads {name} in {bits.value} bits (get_quantization_config "
            "reads the key alone) but attaches no LoRA (get_peft_config gives no peft_config), and transformers' "
            "Trainer refuses to train a purely quantized model (\"You cannot perform fine-tuning on purely quantized "
            "models\"): the run stops before its first step",
            "add use_peft: true to train QLoRA adapters, or remove the quantized loading to train every weight",
            tc, "load_in_8bit" if bits.config_key == "load_in_8bit" else "load_in_4bit",
            use_peft=False)
        return
    unused = trl_unused_lora_keys(trainer, tc.settings)
    if not unused:
        return
    keys = ", ".join(tc.settings[n].key for n in unused)
    yield setting_finding(
        "GD612", Severity.WARNING,
        f"{keys} written {said}: TRL reads LoRA from use_peft alone (get_peft_config gives no peft_config), so "
        f"these keys are unused and the run trains every weight of {name}: planned here as full fine-tuning, not LoRA",
        "add use_peft: true to train the LoRA these keys describe, or remove them to keep full fine-tuning",
        tc, unused[0], use_peft=False, unused=[tc.settings[n].key for n in unused])

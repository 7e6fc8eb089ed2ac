"""The Python API for training scripts: `prepare(model, training_args)` makes a loaded model safe to train and
evaluate under mixed precision. torch/transformers are never imported here; the model brings them along."""

from __future__ import annotations

import inspect
import os
import sys
import warnings
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from gemma_doctor import family as family_mod
from gemma_doctor import guards, pipeline
from gemma_doctor.errors import DoctorError, InvalidArgument, UsageError
from gemma_doctor.facts import CheckOptions
from gemma_doctor.readers.gpu import planned as planned_gpu
from gemma_doctor.readers.gpu import resolve as resolve_gpu
from gemma_doctor.readers.versions import installed
from gemma_doctor.report import FailOn
from gemma_doctor.rules.crashes import RequiredInput, kv_shared_layers, required_input
from gemma_doctor.rules.training import GpuView, fallback_gpu, view_of
from gemma_doctor.versioning import GEMMA4_KV_SHARE_NO_CACHE

ON_MISMATCH = ("raise", "warn", "ignore")


class PrecisionMismatch(DoctorError):
    """The training arguments ask for a precision the model or the GPU cannot train in."""


class PrecisionWarning(UserWarning):
    """Issued instead of PrecisionMismatch with ``on_mismatch="warn"``."""


class KvSharingWarning(UserWarning):
    """Gemma 4 KV sharing is skipped under gradient checkpointing on transformers 5.5.0-5.5.1 (GD107)."""


@dataclass(frozen=True)
class Prepared:
    """What prepare() did: where it switched use_cache off, and the precision problems it found."""

    disabled: tuple[str, ...]
    problems: tuple[str, ...]
    family: str | None
    # Inputs supplied to text-only batches on releases that require them ("Gemma3Model.token_type_ids=0", GD105/GD106).
    supplied: tuple[str, ...] = ()
    # use_cache switched back on where switching it off breaks the model (Gemma 4 KV sharing on 5.5.0-5.5.1, GD107).
    enabled: tuple[str, ...] = ()
    # Training guards for the family's traps (gemma_doctor/guards.py): non-reentrant checkpointing on KV-shared Gemma 4.
    guarded: tuple[str, ...] = ()
    # The run gemma-doctor prescribes for this model on this GPU and stack (the object `recommend` renders, found by
    # gemma_doctor.plan.search.prescribe), or None with the way out; None/() when the model's config cannot be read.
    prescription: dict[str, Any] | None = None
    way_out: tuple[str, ...] = ()


def _configs(model: Any) -> Iterator[tuple[str, Any, str]]:
    """(where, object, kind) for every config and generation config a forward pass or generate() may read."""
    yield "config", getattr(model, "config", None), "config"
    yield "generation_config", getattr(model, "generation_config", None), "generation"
    named = getattr(model, "named_modules", None)
    if callable(named):
        for name, module in named():
            prefix = f"{name}." if name else ""
            yield prefix + "config", getattr(module, "config", None), "config"
            yield prefix + "generation_config", getattr(module, "generation_config", None), "generation"


def disable_use_cache(model: Any) -> tuple[str, ...]:
    """Set use_cache=False on every distinct config (and nested text_config) and generation config of ``model``.

    On transformers 4.50.x the multimodal language model holds its own copy of the text config
    (facts.md section 1), so every sub-module's config is visited, each object once.
    """
    seen: set[int] = set()
    changed: list[str] = []

    def visit(where: str, obj: Any, kind: str) -> None:
        if obj is None or id(obj) in seen:
            return
        seen.add(id(obj))
        # Only objects that already have the attribute: a vision or top-level multimodal config without
        # use_cache is not read for it, and adding one would only mislead.
        if hasattr(obj, "use_cache"):
            if obj.use_cache is not False:
                obj.use_cache = False
                changed.append(f"{where}.use_cache")
        if kind == "config":
            text = getattr(obj, "text_config", None)
            if text is not None and text is not obj:
                visit(f"{where}.text_config", text, "config")

    for where, obj, kind in _configs(model):
        visit(where, obj, kind)
    return tuple(changed)


# The text-config values the family traits and the runtime cures read from a loaded model.
_TEXT_KEYS = ("model_type", "num_kv_shared_layers", "use_bidirectional_attention")


def _text_values(cfg: Any) -> dict[str, Any]:
    return {k: getattr(cfg, k) for k in _TEXT_KEYS if getattr(cfg, k, None) is not None}


def model_family(model: Any) -> family_mod.FamilyInfo:
    """The family of a loaded model, from its config's model_type (and text_config's), as for files on disk."""
    cfg = getattr(model, "config", None)
    if cfg is None:
        return family_mod.NOT_GEMMA
    data: dict[str, Any] = {"architectures": getattr(cfg, "architectures", None), **_text_values(cfg)}
    data["model_type"] = getattr(cfg, "model_type", None)
    text = getattr(cfg, "text_config", None)
    if text is not None and getattr(text, "model_type", None):
        data["text_config"] = _text_values(text)
    return family_mod.detect(data)


def running_transformers() -> str | None:
    """The transformers version this process runs: the imported module's, else the installed distribution's."""
    module = sys.modules.get("transformers")
    version = getattr(module, "__version__", None)
    return version if isinstance(version, str) else installed().get("transformers")


def _text_config_values(model: Any) -> dict[str, Any]:
    cfg = getattr(model, "config", None)
    text = getattr(cfg, "text_config", None) if cfg is not None else None
    return _text_values(text if text is not None else cfg) if cfg is not None else {}


# Modules already given an input hook, so prepare() called again (DoctorCallback: init and train begin) adds none.
_HOOKED: weakref.WeakKeyDictionary[Any, RequiredInput] = weakref.WeakKeyDictionary()
# Inputs that carry images, video or audio: a batch with any of them needs the processor's real type ids.
_MEDIA = ("pixel_values", "pixel_values_videos", "input_features", "image_position_ids")


def _supply_hook(req: RequiredInput) -> Any:
    def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        if not module.training or kwargs.get(req.name) is not None or any(kwargs.get(m) is not None for m in _MEDIA):
            return None
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None or not hasattr(ids, "new_full"):
            return None
        return args, {**kwargs, req.name: ids.new_full(tuple(ids.shape), req.value)}

    return hook


def supply_text_inputs(model: Any, version: str | None = None) -> tuple[str, ...]:
    """On releases that require it, give text-only training batches the type ids they lack (GD105/GD106).

    A forward pre-hook on every sub-module of the multimodal model whose forward takes the input (the
    ...ForConditionalGeneration and its inner ...Model): PEFT calls the outer model's ``forward`` directly,
    bypassing its hooks, but the inner model is always called as a module. A hook rather than a collator
    wrapper because prepare() is handed the model, not the data pipeline, and the same hook serves Trainer,
    TRL and hand-written loops. It adds the constant only in train mode, only when the batch has no images or
    audio (those need the processor's real ids), and only when the running transformers is in the window.
    """
    fam = model_family(model)
    req = required_input(fam.model_type, _text_config_values(model))
    version = version if version is not None else running_transformers()
    if req is None or version is None or not req.window.contains(version):
        return ()
    supplied: list[str] = []
    named = getattr(model, "named_modules", None)
    for _name, module in (named() if callable(named) else ()):
        cfg = getattr(module, "config", None)
        if getattr(cfg, "model_type", None) != req.model_type or module in _HOOKED:
            continue
        try:
            params = inspect.signature(module.forward).parameters
        except (TypeError, ValueError):
            continue
        if req.name not in params:
            continue
        module.register_forward_pre_hook(_supply_hook(req), with_kwargs=True)
        _HOOKED[module] = req
        supplied.append(f"{type(module).__name__}.{req.name}={req.value}")
    return tuple(supplied)


def enable_use_cache(model: Any) -> tuple[str, ...]:
    """Set use_cache=True on every config (and text_config) of ``model`` that says False: Trainer writes False."""
    changed: list[str] = []
    seen: set[int] = set()
    for where, obj, kind in _configs(model):
        for at, conf in ((where, obj), (f"{where}.text_config", getattr(obj, "text_config", None) if kind == "config" else None)):
            if conf is None or id(conf) in seen:
                continue
            seen.add(id(conf))
            if getattr(conf, "use_cache", None) is False:
                conf.use_cache = True
                changed.append(f"{at}.use_cache")
    return tuple(changed)


def _kv_sharing_breaks_without_cache(model: Any, version: str | None) -> bool:
    """True for a KV-shared Gemma 4 on a release that skips the sharing without a cache (or an unknown release)."""
    if not kv_shared_layers(model_family(model)):
        return False
    return version is None or GEMMA4_KV_SHARE_NO_CACHE.contains(version)


def check_gpu(gpu: str | None) -> None:
    """Refuse a ``gpu`` that `--gpu` refuses, with the CLI's message (InvalidArgument: a UsageError and a ValueError).

    Without this an unknown name read as "unknown GPU", which silently skipped the bf16 guard.
    """
    if gpu is None:
        return
    try:
        planned_gpu(gpu)
    except UsageError as e:
        raise InvalidArgument(str(e)) from None


def _gpu(gpu: str | None) -> GpuView:
    """The GPU this process trains on: the --gpu-style spec when given, else gemma-doctor's GPU reader, else torch."""
    if gpu:
        return fallback_gpu(gpu)
    try:
        facts = resolve_gpu(None)
    except Exception:  # a failing probe must not stop training; fall through to torch  # noqa: BLE001
        facts = None
    if facts is not None:
        view = view_of(facts)
        return view if facts.devices else GpuView(view.native_bf16, view.emulated_trap, "this GPU")
    import torch  # the model is a torch model: torch is already imported

    if not torch.cuda.is_available() or getattr(torch.version, "hip", None):
        return GpuView(None, False, "no CUDA GPU")
    cc = torch.cuda.get_device_capability()
    native = cc >= (8, 0)
    return GpuView(native, not native, f"{torch.cuda.get_device_name()} (sm_{cc[0]}{cc[1]})")


def precision_problems(model: Any, training_args: Any = None, gpu: str | None = None) -> list[str]:
    """What is wrong with training ``model`` under ``training_args`` (TrainingArguments or any object/dict alike)."""
    check_gpu(gpu)
    fam = model_family(model)
    name = fam.label or "this model"
    fp16_unsafe = fam.fp16_unsafe
    problems: list[str] = []
    dtype = str(getattr(model, "dtype", ""))
    if fp16_unsafe and dtype == "torch.float16":
        problems.append(f"{name} is loaded in float16: its activations exceed fp16's range (load it in bfloat16 or float32)")
    if training_args is None:
        return problems

    def arg(key: str) -> Any:
        return training_args.get(key) if isinstance(training_args, dict) else getattr(training_args, key, None)

    if arg("fp16") is True and fp16_unsafe:
        problems.append(f"fp16=True on {name}: activations exceed fp16's range (inf/NaN); use bf16 on a GPU with native "
                        "bf16, fp32 otherwise")
    if arg("bf16") is True and not (arg("use_cpu") or arg("no_cuda")):
        view = _gpu(gpu)
        if view.native_bf16 is False:
            problems.append(f"bf16=True but {view.label} has no native bf16 (compute capability < 8.0): set bf16=False "
                            "and train in fp32" + (" (never fp16 for this model)" if fp16_unsafe else ""))
    return problems


def diagnose(targets: str | Iterable[str] | None = None, cache_dir: str | os.PathLike[str] | None = None,
             revision: str = "main", all_revisions: bool = False, options: Any = None, **option_fields: Any) -> Any:
    """`gemma-doctor check` as a function: returns the Report the CLI renders (report.to_json(), report.failed()).

    ``option_fields`` are CheckOptions fields: gpu="T4", training_config="train.yaml", task="dpo", weights=True,
    fail_on="warning". Raises gemma_doctor.errors.UsageError for targets or files that cannot be found.
    """
    if options is None:
        if "fail_on" in option_fields:
            option_fields["fail_on"] = FailOn(option_fields["fail_on"])
        if option_fields.get("training_config") is not None:
            option_fields["training_config"] = str(option_fields["training_config"])
        options = CheckOptions(**option_fields)
    elif option_fields:
        raise TypeError("pass either options= or option keywords, not both")
    names = [targets] if isinstance(targets, str) else list(targets or [])
    cache = Path(cache_dir) if cache_dir is not None else None
    return pipeline.diagnose(names, cache, revision, all_revisions, options)


def prepare(model: Any, training_args: Any = None, on_mismatch: str = "raise", gpu: str | None = None,
            text_only: bool = False) -> Prepared:
    """Make ``model`` safe to train and evaluate: use_cache off everywhere, inputs text-only batches need, precision,
    and gradient checkpointing non-reentrant on a KV-shared Gemma 4 (reentrant corrupts its gradients silently).

    use_cache is switched off first (except for a KV-shared Gemma 4 on transformers 5.5.0-5.5.1, where it is
    switched on: without a cache those releases skip the sharing, GD107); on releases that require them,
    text-only training batches get the type ids they lack (GD105/GD106). Both happen whatever ``on_mismatch``
    says; then a precision problem raises PrecisionMismatch ("raise"), issues a PrecisionWarning ("warn"), or is
    only returned ("ignore").
    Call it before Trainer.evaluate() or Trainer.train(), or pass DoctorCallback() to the Trainer.
    ``text_only=True`` (text-only training data) also freezes a Gemma 4's vision/audio towers, which such batches
    leave without gradients (DDP would stop on them).
    """
    if on_mismatch not in ON_MISMATCH:
        raise ValueError(f"on_mismatch must be one of {', '.join(ON_MISMATCH)}, not {on_mismatch!r}")
    check_gpu(gpu)  # before the model is touched
    version = running_transformers()
    disabled: tuple[str, ...] = ()
    enabled: tuple[str, ...] = ()
    if _kv_sharing_breaks_without_cache(model, version):
        # Gemma 4 KV sharing works only through the cache on 5.5.0-5.5.1 (GD107): never switch it off there;
        # switch back on what Trainer wrote (TrainingArguments.use_cache defaults to False).
        enabled = enable_use_cache(model)
        # 5.5.x names it is_gradient_checkpointing (is_activation_checkpointing from later releases).
        checkpointing = getattr(model, "is_activation_checkpointing", None)
        if checkpointing is None:
            checkpointing = getattr(model, "is_gradient_checkpointing", False)
        if checkpointing:
            warnings.warn(f"transformers {version}: gradient checkpointing drops the cache, so this model's shared layers "
                          f"compute their own K/V and the loss is wrong (GD107); turn gradient checkpointing off or "
                          f'pip install "transformers>={GEMMA4_KV_SHARE_NO_CACHE.first_fixed}"', KvSharingWarning,
                          stacklevel=2)
    else:
        disabled = disable_use_cache(model)
    supplied = supply_text_inputs(model, version)
    guarded = guards.non_reentrant_checkpointing(model, training_args)
    if text_only and model_family(model).family == "gemma4":
        guarded += guards.freeze_towers(model)
    problems = tuple(precision_problems(model, training_args, gpu))
    if problems and on_mismatch == "raise":
        raise PrecisionMismatch("; ".join(problems))
    if problems and on_mismatch == "warn":
        for p in problems:
            warnings.warn(p, PrecisionWarning, stacklevel=2)
    decision = prescription_for(model, gpu)
    return Prepared(disabled=disabled, problems=problems, family=model_family(model).label, supplied=supplied,
                    enabled=enabled, guarded=guarded,
                    prescription=decision.prescription() if decision is not None else None,
                    way_out=decision.way_out if decision is not None else ())


def prescription_for(model: Any, gpu: str | None = None, task: str | None = None) -> Any:
    """The decision `recommend` makes for this in-memory model (its config), on ``gpu`` (a --gpu value; the probe when
    None) and the installed libraries: gemma_doctor.plan.search.Decision, or None when the model has no readable config.
    The same entry point as `check` and `recommend`: the prescribed run passes check's rules, or there is none."""
    config = getattr(model, "config", None)
    to_dict = getattr(config, "to_dict", None)
    if not callable(to_dict):
        return None
    data = to_dict()
    if not isinstance(data, dict):
        return None
    from gemma_doctor import pipeline
    from gemma_doctor.plan import advice, runplan

    options = CheckOptions(gpu=gpu, task=task)
    env = pipeline.environment(options)
    facts = advice.config_facts(data, "the model in memory", str(data.get("_name_or_path") or "the model"))
    if not facts.family.is_gemma:
        return None
    gpu_facts = env.gpu if env.gpu is not None else None
    if gpu_facts is None:
        from gemma_doctor.readers import gpu as gpu_reader

        gpu_facts = gpu_reader.for_options(options)
    shape = runplan.shape_for(facts.config.data, None)
    return pipeline.named(pipeline.with_decision(facts, options, env, gpu_facts, shape)).decision

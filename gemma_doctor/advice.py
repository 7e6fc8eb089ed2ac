"""Glue between the facts and the pure decision: ModelFacts + GPU facts -> recommend.Inputs, and the gatherer
that puts a Recommendation on every Gemma model (`check`'s JSON "recommendation", its one-line text summary).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from gemma_doctor import recommend
from gemma_doctor.facts import CheckOptions, ModelFacts
from gemma_doctor.readers import gpu as gpu_reader
from gemma_doctor.readers.gpu import GpuFacts
from gemma_doctor.readers.versions import Versions, installed

_SAFETENSORS = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}
_DTYPE_NAMES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16", "half": "float16",
                "float32": "float32", "fp32": "float32", "float": "float32"}
# Google publishes every Gemma checkpoint in bf16 (facts.md section 2): what --family plans assume.
ASSUMED_SAVED_DTYPE = "bfloat16"


def _dtype_name(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    return _DTYPE_NAMES.get(value.lower().replace("torch.", ""))


def saved_dtype(facts: ModelFacts) -> tuple[str | None, str | None]:
    """(dtype, source): the safetensors census's dominant float dtype, else what config.json declares."""
    census = facts.extra.get("dtypes")
    dominant = getattr(census, "dominant", None)
    if dominant in _SAFETENSORS:
        return _SAFETENSORS[dominant], "safetensors"
    declared = _dtype_name(getattr(census, "declared", None))
    if declared:
        return declared, "config.json"
    if facts.config.ok:
        cfg = facts.config.data
        for key in ("torch_dtype", "dtype"):
            d = _dtype_name(cfg.get(key))
            if d:
                return d, "config.json"
    return None, None


def checkpoint_quantization(facts: ModelFacts) -> tuple[str | None, str | None, str | None]:
    """(4bit|8bit|None, method, compute dtype) from the census, else config.json's quantization_config."""
    q: Mapping[str, Any] | None = getattr(facts.extra.get("dtypes"), "quantization", None)
    if not isinstance(q, Mapping) and facts.config.ok and isinstance(facts.config.data.get("quantization_config"), Mapping):
        qc = facts.config.data["quantization_config"]
        method = str(qc.get("quant_method") or "").lower() or None
        bits = 4 if qc.get("load_in_4bit") else 8 if qc.get("load_in_8bit") else qc.get("bits")
        if method is None and bits in (4, 8):
            method = "bitsandbytes"
        q = {"method": method, "bits": bits, "compute_dtype": qc.get("bnb_4bit_compute_dtype")}
    if not isinstance(q, Mapping):
        return None, None, None
    bits = q.get("bits")
    mode = "4bit" if bits == 4 else "8bit" if bits == 8 else ("4bit" if q.get("method") else None)
    return mode, (str(q["method"]) if q.get("method") else None), _dtype_name(q.get("compute_dtype"))


def inputs_for(facts: ModelFacts | None, gpu: GpuFacts, task: str | None = None, quantization: str | None = None,
               versions: Versions | Mapping[str, str | None] | None = None, family: str | None = None) -> recommend.Inputs:
    """The decision's inputs for a cached model (facts) or, with facts None, a --family plan."""
    pkgs = dict(versions.packages) if isinstance(versions, Versions) else dict(versions or {})
    task_name = recommend.normalise_task(task)
    quant_opt = recommend.normalise_quantization(quantization) if quantization is not None else None
    common = dict(gpu_native_bf16=gpu.native_bf16, gpu_backend=gpu.backend, gpu_label=gpu.label,
                  gpu_trap=gpu.emulated_bf16_trap, task=task_name, versions=pkgs)
    if facts is None:
        fam = family or "gemma3"
        model_id = {"gemma": "google/gemma-7b", "gemma2": "google/gemma-2-2b-it", "gemma3": "google/gemma-3-1b-it",
                    "gemma3n": "google/gemma-3n-E2B-it", "paligemma": "google/paligemma-3b-pt-224",
                    "paligemma2": "google/paligemma2-3b-pt-224"}[fam]
        return recommend.Inputs(family=fam, saved_dtype=ASSUMED_SAVED_DTYPE, saved_dtype_source="assumed: Google publishes bf16",
                                quantization=quant_opt, model_id=model_id,
                                nested=fam in ("gemma3n", "paligemma", "paligemma2"), **common)
    dtype, source = saved_dtype(facts)
    q_mode, q_method, q_compute = checkpoint_quantization(facts)
    # A quantized checkpoint stays quantized whatever the options say; --quantization adds on-the-fly quantization.
    quant = q_mode or quant_opt
    snap = facts.snapshot
    return recommend.Inputs(family=facts.family.label, saved_dtype=dtype, saved_dtype_source=source, quantization=quant,
                            quant_method=q_method if q_mode else None, checkpoint_compute_dtype=q_compute,
                            model_id=snap.repo_id or str(snap.path), nested=facts.family.nested, **common)


def gather(facts: ModelFacts, options: CheckOptions) -> dict[str, Any]:
    """GATHERERS entry: {"recommendation": Recommendation}; reads the census when an earlier gatherer put it there."""
    gpu = gpu_reader.for_options(options)  # probed once per run, shared with environment.gpu
    inputs = inputs_for(facts, gpu, options.task, None, installed())
    return {"recommendation": recommend.decide(inputs)}


# --- the `recommend` command ---------------------------------------------------------------------

@dataclass(frozen=True)
class Item:
    """One recommendation of the `recommend` command: a cached model, or a --family plan (planned=True)."""

    target: str
    repo_id: str | None
    revision: str | None
    commit: str | None
    path: str | None
    family: str | None
    planned: bool
    model_id: str
    recommendation: recommend.Recommendation

    def to_json(self) -> dict[str, Any]:
        """One entry of recommend's JSON `models` list."""
        return {"target": self.target, "repo_id": self.repo_id, "revision": self.revision, "commit": self.commit,
                "path": self.path, "family": self.family, "planned": self.planned,
                "recommendation": self.recommendation.to_json(),
                "snippets": {"python": recommend.python_snippets(self.recommendation, self.model_id),
                             "yaml": recommend.yaml_documents(self.recommendation)}}


_PLAN_HINT = "or plan without a download: gemma-doctor recommend --family gemma3"


def recommend_items(targets: list[str], cache_dir: Any, revision: str, family: str | None, gpu_spec: str | None,
                    task: str | None, quantization: str | None) -> tuple[GpuFacts, list[Item], list[str]]:
    """(GPU facts, recommendations, skipped-target messages) for `gemma-doctor recommend`. Raises UsageError."""
    from gemma_doctor import locate
    from gemma_doctor.pipeline import gather, select
    from gemma_doctor.errors import UsageError

    # Check every option before touching the cache: a typo fails fast with a usage line.
    options = CheckOptions(gpu=gpu_spec, task=recommend.normalise_task(task))
    quant = recommend.normalise_quantization(quantization) if quantization is not None else None
    fam = recommend.normalise_family(family) if family is not None else None
    if fam is not None and targets:
        raise UsageError("--family plans for a model that is not downloaded; drop it or the TARGET (a cached model's family is read from its config.json)")
    gpu = gpu_reader.for_options(options)
    versions = installed()
    if fam is not None:
        inputs = inputs_for(None, gpu, options.task, quantization, versions, family=fam)
        rec = recommend.decide(inputs)
        return gpu, [Item(f"{fam} (planned)", None, None, None, None, fam, True, inputs.model_id, rec)], []
    cache = cache_dir if cache_dir is not None else locate.default_cache_dir()
    try:
        snapshots = locate.resolve(targets, cache, revision, False)
    except UsageError as e:
        raise UsageError(f"{e}; {_PLAN_HINT}" if not targets else str(e)) from None
    models, _ = select(snapshots, explicit=bool(targets))
    items: list[Item] = []
    skipped: list[str] = []
    for facts in models:
        if not facts.family.is_gemma:
            skipped.append(f"{facts.snapshot.target}: not a Gemma-family model (or config.json unreadable); skipped")
            continue
        facts = gather(facts, options)  # the census first: the saved dtype and quantization come from it
        inputs = inputs_for(facts, gpu, options.task, quantization, versions)
        rec = recommend.decide(inputs)
        s = facts.snapshot
        items.append(Item(s.target, s.repo_id, s.revision, s.commit, str(s.path), facts.family.label, False,
                          inputs.model_id, rec))
    if not items:
        where = f"in {cache}" if not targets else "among the targets"
        raise UsageError(f"no Gemma-family model {where}; name one (gemma-doctor recommend google/gemma-3-1b-it) {_PLAN_HINT}")
    return gpu, items, skipped

"""Glue between the facts and the pure decision: ModelFacts + GPU facts -> recommend.Inputs -> Recommendation
(`check`'s JSON "recommendation" and its one-line text summary; the `recommend` command's items).
"""

from __future__ import annotations

from collections.abc import Mapping  # isinstance in C (typing.Mapping's checks through Python per call)
from dataclasses import dataclass
from typing import Any

from gemma_doctor.plan import recommend
from gemma_doctor.facts import ModelFacts
from gemma_doctor.readers.gpu import GpuFacts
from gemma_doctor.run import Settings
from gemma_doctor.rules import crashes
from gemma_doctor.plan.runplan import MemoryFacts
from gemma_doctor.family import FAMILY_TEXT_TYPE, HYBRID_CACHE_TEXT_TYPES
from gemma_doctor.stack import Exposure, Stack
from gemma_doctor.versioning import HYBRIDCACHE, transformers_has_hybridcache_bug

_SAFETENSORS = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}
_DTYPE_NAMES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16", "half": "float16",
                "float32": "float32", "fp32": "float32", "float": "float32"}
# Google publishes every Gemma checkpoint in bf16 (facts.md section 2): what --family plans assume.
ASSUMED_SAVED_DTYPE = "bfloat16"
# The checkpoint a --family plan names in its snippets.
PLAN_MODEL_IDS = {"gemma": "google/gemma-7b", "gemma2": "google/gemma-2-2b-it", "gemma3": "google/gemma-3-1b-it",
                  "gemma3n": "google/gemma-3n-E2B-it", "gemma4": "google/gemma-4-E2B-it",
                  "paligemma": "google/paligemma-3b-pt-224", "paligemma2": "google/paligemma2-3b-pt-224",
                  "recurrent_gemma": "google/recurrentgemma-2b", "shieldgemma2": "google/shieldgemma-2-4b-it",
                  # repo ids as public training scripts name them (docs/families.md)
                  "t5gemma": "google/t5gemma-2b-2b-prefixlm-it", "t5gemma2": "google/t5gemma-2-270m-270m",
                  "vaultgemma": "google/vaultgemma-1b", "embedding_gemma2": "google/embeddinggemma-2",
                  "diffusion_gemma": "google/diffusiongemma-26B-A4B-it"}
# Plans whose assumed checkpoint keeps its text config in text_config (the snippets switch use_cache off there).
PLAN_NESTED = frozenset({"gemma3n", "paligemma", "paligemma2", "gemma4", "shieldgemma2", "embedding_gemma2",
                         "diffusion_gemma"})


def _dtype_name(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    return _DTYPE_NAMES.get(value.lower().replace("torch.", ""))


# The model_type a --family plan's config names where no published size is known (the checkpoint PLAN_MODEL_IDS names).
_PLAN_MODEL_TYPES = {"paligemma2": "paligemma"}
_PLANNED_DIR = "<planned: not downloaded>"


def planned_facts(family: str, size: str | None, model_id: str) -> ModelFacts:
    """A --family plan as a model whose config.json is the published one (or the bare model_type where gemma-doctor
    has no published config): the same decision and the same rules as for a downloaded snapshot."""
    from gemma_doctor.plan import memory

    config = memory.published_config(family, size) or {"model_type": _PLAN_MODEL_TYPES.get(family, family)}
    if family == "paligemma2":
        config["text_config"] = {"model_type": "gemma2", **config.get("text_config", {})}
    config.setdefault("torch_dtype", ASSUMED_SAVED_DTYPE)
    return config_facts(config, f"{family} (planned)", model_id)


def config_facts(config: Mapping[str, Any], target: str, model_id: str) -> ModelFacts:
    """A model known only by its config (a --family plan, or a model already in memory for prepare()): facts with
    that config.json and nothing else, judged by the same rules."""
    import json as _json
    from pathlib import Path

    from gemma_doctor import family as family_mod
    from gemma_doctor.locate import Snapshot
    from gemma_doctor.readers.jsonfile import JsonFile

    config = dict(config)
    folder = Path(_PLANNED_DIR)
    raw = _json.dumps(config, default=str).encode()
    snapshot = Snapshot(target, folder, model_id, None, None)
    return ModelFacts(snapshot=snapshot, config=JsonFile(folder / "config.json", True, raw=raw, data=config),
                      generation_config=JsonFile(folder / "generation_config.json", False),
                      family=family_mod.detect(config))


def is_planned(facts: ModelFacts) -> bool:
    """True for a --family plan (planned_facts)."""
    return str(facts.snapshot.path) == _PLANNED_DIR


def saved_dtype(facts: ModelFacts) -> tuple[str | None, str | None]:
    """(dtype, source): the safetensors census's dominant float dtype, else what config.json declares."""
    census = facts.census
    dominant = census.dominant if census is not None else None
    if dominant in _SAFETENSORS:
        return _SAFETENSORS[dominant], "safetensors"
    declared = _dtype_name(census.declared if census is not None else None)
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
    q: Mapping[str, Any] | None = facts.census.quantization if facts.census is not None else None
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
               stack: Stack | Mapping[str, str | None] | None = None, family: str | None = None,
               settings: Settings | None = None) -> recommend.Inputs:
    """The decision's inputs for a cached model (facts) or, with facts None, a --family plan."""
    if isinstance(stack, Stack):
        pkgs = {key: p.version for key, p in stack.packages.items()}  # normalised names: transformers, peft, trl
        hybridcache = stack.exposure(HYBRIDCACHE).value
    else:
        pkgs = dict(stack or {})
        version = pkgs.get("transformers")
        hybridcache = "unknown" if version is None else (
            "affected" if transformers_has_hybridcache_bug(version) else "safe")
    task_name = recommend.normalise_task(task)
    quant_opt = recommend.normalise_quantization(quantization) if quantization is not None else None
    common = dict(gpu_native_bf16=gpu.native_bf16, gpu_backend=gpu.backend, gpu_label=gpu.label,
                  gpu_trap=gpu.emulated_bf16_trap, task=task_name, versions=pkgs, settings=settings,
                  hybridcache=hybridcache)
    if facts is None:
        fam = family or "gemma3"
        model_id = PLAN_MODEL_IDS[fam]
        return recommend.Inputs(family=fam, saved_dtype=ASSUMED_SAVED_DTYPE, saved_dtype_source="assumed: Google publishes bf16",
                                quantization=quant_opt, model_id=model_id,
                                nested=fam in PLAN_NESTED,
                                builds_hybrid_cache=FAMILY_TEXT_TYPE.get(fam) in HYBRID_CACHE_TEXT_TYPES, **common)
    dtype, source = saved_dtype(facts)
    if is_planned(facts):
        source = "assumed: Google publishes bf16"
    q_mode, q_method, q_compute = checkpoint_quantization(facts)
    # A quantized checkpoint stays quantized whatever the options say; --quantization adds on-the-fly quantization.
    quant = q_mode or quant_opt
    snap = facts.snapshot
    keep_cache = crashes.use_cache_off_breaks(facts.family, stack) if isinstance(stack, Stack) else \
        (Exposure.UNKNOWN if crashes.kv_shared_layers(facts.family) else Exposure.SAFE)
    return recommend.Inputs(family=facts.family.label, keep_use_cache=keep_cache is not Exposure.SAFE, fp16_unsafe=facts.family.fp16_unsafe, saved_dtype=dtype,
                            saved_dtype_source=source, quantization=quant,
                            quant_method=q_method if q_mode else None, checkpoint_compute_dtype=q_compute,
                            model_id=snap.repo_id or str(snap.path), nested=facts.family.nested,
                            builds_hybrid_cache=facts.family.builds_hybrid_cache, **common)


def recommendation_for(facts: ModelFacts, gpu: GpuFacts, task: str | None, stack: Stack,
                       settings: Settings | None = None) -> recommend.Recommendation:
    """The precision decision for one model (its census, when taken, gives the saved dtype and quantization), for the
    run of ``settings`` where a memory plan states one."""
    return recommend.decide(inputs_for(facts, gpu, task, None, stack, settings=settings))


def planned_settings(mem: MemoryFacts) -> Settings | None:
    """The settings of the run the memory plan planned (method, batch, checkpointing ... as the plan chose or the user
    fixed them), which the recommendation renders; None when the GPU's memory is unknown and the user fixed none of
    them: nothing to choose against, nothing to state."""
    if not mem.plan.gpu_bytes and not mem.fixed:
        return None
    return mem.plan.settings


# --- the `recommend` command ---------------------------------------------------------------------

# No __eq__/__hash__/__repr__ made: never compared, hashed or shown (each made method costs start-up time).
@dataclass(frozen=True, eq=False, repr=False)
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
    recommendation: recommend.Recommendation | None
    memory: MemoryFacts | None = None
    decision: Any = None  # plan.search.Decision: the prescription or none and the way out

    @property
    def prescribed(self) -> bool:
        """True when a run passes check (exit 1 from recommend otherwise)."""
        return self.decision is None or self.decision.ok

    def to_json(self) -> dict[str, Any]:
        """One entry of recommend's JSON `models` list: the prescription (null when none) and everything it renders."""
        out = {"target": self.target, "repo_id": self.repo_id, "revision": self.revision, "commit": self.commit,
               "path": self.path, "family": self.family, "planned": self.planned}
        if self.decision is not None:
            out.update(self.decision.to_json())
        ok = self.prescribed
        out.update({"recommendation": self.recommendation.to_json() if ok and self.recommendation else None,
                    "memory": self.memory.to_json() if self.memory is not None else None,
                    "snippets": {"python": recommend.python_snippets(self.recommendation, self.model_id),
                                 "yaml": self.decision.training_config if self.decision is not None else
                                 recommend.training_config_yaml(self.recommendation),
                                 "command": recommend.run_command(self.recommendation)}
                    if ok and self.recommendation else None})
        if not ok and self.recommendation is not None:
            out["nearest"] = self.recommendation.to_json()
        return out

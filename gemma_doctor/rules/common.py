"""Small readings shared by the pitfall rules: the text config, the settings as the training config writes them
(the Run's ``written``), the exposure of a stack to a union of version windows, the Run's trainer and where a run setting came
from. Pure."""

from __future__ import annotations

from typing import Any, Iterable

from gemma_doctor.run import (FROM_CONFIG, Distributed, Sourced, Written, config_sharding, distributed, trainer_of,
                              written)
from gemma_doctor.stack import Exposure, Stack, Window
from gemma_doctor.trainers import Trainer
from gemma_doctor.traits import text_config, text_key  # noqa: F401 (the rules' names for them)
from gemma_doctor.versioning import PEFT_WEIGHT_TYING

# What the rules that read the run declare they read of it (codes.emits ``reads``): every field of the Run but its
# memory plan's figures, what it counted of the model and its stack's sources (which differ between models of one scan
# whose settings are the same), and the libraries that will run (Environment.libraries: the stack, else installed).
RUN = ("model.run.trainer", "model.run.settings", "model.run.distributed", "model.run.written",
       "model.run.quantization")
LIBRARIES = ("env.stack", "env.versions")

# Backends that keep packed sequences apart by themselves (varlen kernels, or flex's document mask).
PACKING_SAFE = frozenset({"flash_attention_2", "flash_attention_3", "flex_attention"})


def train_tied_embedding(stack: Stack) -> str:
    """How to train Gemma's tied embed_tokens/lm_head with PEFT, for the PEFT that will run (GD505, GD422)."""
    cure = ('modules_to_save=["embed_tokens"] with ensure_weight_tying=True in LoraConfig (the tied lm_head follows; '
            'listing "lm_head" too unties them on PEFT 0.18.0)')
    vllm = "; serve the merged model with vLLM, which refuses adapters with modules_to_save (vllm #9280)"
    exposure = stack.exposure(PEFT_WEIGHT_TYING)
    if exposure is Exposure.SAFE:
        return cure + vllm
    why = ("modules_to_save unties Gemma's tied embed_tokens/lm_head, and the merged model reloads with another head "
           "(logits differ after reload: PEFT 0.17.1, transformers 4.57.6)")
    if exposure is Exposure.AFFECTED:
        return (f'pip install "peft>={PEFT_WEIGHT_TYING.first_fixed}", then {cure}: {stack.get("peft").describe()} has '
                f"no ensure_weight_tying, and without it {why}{vllm}")
    return f"with PEFT >= {PEFT_WEIGHT_TYING.first_fixed}, {cure}: older PEFT has no ensure_weight_tying, and {why}{vllm}"


def exposure_any(stack: Stack, windows: Iterable[Window]) -> Exposure:
    """AFFECTED when the stack is in any of ``windows``, SAFE when in none, else UNKNOWN."""
    seen = [stack.exposure(w) for w in windows]
    if Exposure.AFFECTED in seen:
        return Exposure.AFFECTED
    return Exposure.SAFE if all(e is Exposure.SAFE for e in seen) else Exposure.UNKNOWN


def written_of(model: Any, env: Any) -> Written:
    """The run's settings as its training config writes them: the Run's (``model.run.written``), else, where no Run was
    resolved (no plan), the Run's own reading of the same training config (run.written): one reading either way."""
    return model.run.written if model.run is not None else written(env.training_config)


def run_trainer(model: Any, env: Any) -> Sourced[Trainer]:
    """The trainer that executes the run: the Run's (``model.run.trainer``), else, where no Run was resolved (no plan),
    the Run's own resolver on the same training config (run.trainer_of): one decision either way."""
    return model.run.trainer if model.run is not None else trainer_of(env.training_config)


def run_distributed(model: Any, env: Any) -> Distributed:
    """How the run's processes run together: the Run's (``model.run.distributed``), else, where no Run was resolved (no
    plan), the Run's own resolver on the same training config, its count from the config (num_processes /
    num_machines) or the GPU: one reading either way."""
    if model.run is not None:
        return model.run.distributed
    from gemma_doctor.units import positive_int

    tc = env.training_config
    settings = tc.settings if tc is not None and getattr(tc, "ok", False) else {}

    def count(name: str, fallback: int) -> Sourced[int]:
        s = settings.get(name)
        value = positive_int(s.value) if s is not None else None
        return Sourced(value, FROM_CONFIG + s.key) if value else Sourced(fallback, "default")

    gpus = getattr(getattr(env, "gpu", None), "num_gpus", None) or 1
    return distributed(config_sharding(tc, env.libraries), processes=count("num_processes", gpus),
                       nodes=count("num_machines", 1), model_type=model.family.model_type)


def located(setting: Sourced[Any], tc: Any, **details: Any) -> dict[str, Any]:
    """Where a finding about a run setting points, from the setting's source: the training config's file and the key
    the source names as the file writes it (with its line where the reader knows it); the file alone where the config
    leaves the setting to its trainer's default or another input; nothing where no training config is read. As
    ``Finding`` keywords: file, key, details (``details`` and the line)."""
    if tc is None or not getattr(tc, "ok", False):
        return {"file": None, "key": None, "details": dict(details)}
    key = setting.config_key
    # The source names the key as written (axolotl's micro_batch_size, a dotted nested key): its setting has the line.
    line = next((s.line for s in tc.settings.values() if s.key == key), None) if key is not None else None
    return {"file": tc.path, "key": key, "details": {"line": line, **details} if line else dict(details)}


def executed(setting: Sourced[Any]) -> bool:
    """Whether the run executes this value of the Run whatever the memory plan chooses: set by a key of the training
    config, by its trainer's own default ("default of TRL SFTConfig ..."), or by an option (which overrides the config:
    docs/memory.md); not a value the plan or the search filled in where the inputs leave the setting open."""
    return setting.config_key is not None or setting.source.startswith(("default of ", "option"))


def checkpoints(model: Any) -> bool:
    """The run checkpoints gradients: the Run's setting as the config, its trainer's default (TRL's configs and
    LLaMA-Factory: on) or an option sets it (``executed``), not a choice the memory plan made where they leave it open."""
    run = model.run
    return run is not None and bool(run.checkpointing.value) and executed(run.checkpointing)

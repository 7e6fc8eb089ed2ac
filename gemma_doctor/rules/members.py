"""Member-specific training traps (GD13x, GD44x): what the --training-config asks of a Gemma 4 (or another member
whose traits it touches) that the model cannot do. Pure: reads the family's data and traits, never a file."""

from __future__ import annotations

import re
from typing import Any, Iterator

from gemma_doctor.codes import emits
from gemma_doctor.facts import CheckOptions, Environment, ModelFacts
from gemma_doctor.family import LANGUAGE_MODEL_REGEX
from gemma_doctor.readers.training_config import TrainingConfig
from gemma_doctor.readers.training_config import truthy
from gemma_doctor.rules.common import LIBRARIES, RUN, checkpoints, run_distributed, written_of
from gemma_doctor.report import Finding, Severity
from gemma_doctor.run import FROM_CONFIG, GPUS_VISIBLE, Engine, LoraWritten, Written, target_regex
from gemma_doctor.stack import Exposure
from gemma_doctor.versioning import GEMMA4_KV_SHARE_NO_CACHE

# flash-attn's mha_fwd: TORCH_CHECK(head_size_og <= 256, "FlashAttention forward only supports head dimension at most 256")
FLASH_MAX_HEAD_DIM = 256
_FLASH = {"flash_attention_2", "flash_attention_3", "fa2", "fa3", "kernels-community/flash-attn",
          "kernels-community/flash-attn3"}
_LINEAR_NAMES = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


def _finding(code: str, sev: Severity, msg: str, fix: str, tc: TrainingConfig, name: str | None,
             **details: Any) -> Finding:
    setting = tc.get(name) if name else None
    extra = {"line": setting.line} if setting is not None and setting.line else {}
    return Finding(code, sev, msg, file=tc.path, key=setting.key if setting is not None else name, fix=fix,
                   details={**extra, **details})


def _targets(value: str | tuple[str, ...]) -> list[str]:
    """LoRA target modules as names: the written list (LLaMA-Factory's comma-separated names are one), or the one
    string (a regex, all-linear)."""
    return list(value) if isinstance(value, tuple) else [value]


def _has_towers(model: ModelFacts) -> bool:
    """True when the checkpoint's config declares a vision or audio tower (Gemma 4 declares them optional)."""
    data = model.config.data if model.config.ok else {}
    return any(isinstance(data.get(k), dict) for k in ("vision_config", "audio_config"))


@emits("GD130", "GD131", "GD132", "GD133", "GD440", "GD441", "GD442", "GD443",
       reads=("model.family", "model.census", "model.config.exists", "model.config.error",
              "model.config.data[vision_config]", "model.config.data[audio_config]", *RUN, *LIBRARIES, "env.gpu",
              "env.training_config"))
def check(model: ModelFacts, env: Environment, options: CheckOptions) -> Iterator[Finding]:
    """Findings for the training config against the member's data (attention limits, towers) and traits."""
    tc = env.training_config
    m = model.family.member
    if tc is None or not tc.ok or m is None:
        return
    yield from _reentrant(model, tc)
    written = written_of(model, env)  # the backend and LoRA targets as the file names them (the Run's written)
    yield from _attention(model, tc, written)
    yield from _ddp_towers(model, env, tc)
    # transformers 5.5.0-5.5.1 still build the shared layers' k_proj/v_proj (GD443 says what their adapters do there).
    kv_built = env.libraries.exposure(GEMMA4_KV_SHARE_NO_CACHE) is Exposure.AFFECTED
    yield from _peft(model, tc, written.lora, kv_built)


def _reentrant(model: ModelFacts, tc: TrainingConfig) -> Iterator[Finding]:
    shared = model.family.trait("kv_shared_layers")
    if not shared:
        return
    ur = tc.get("use_reentrant")
    # Whether the run checkpoints is the Run's (the config's key, or its trainer's default: TRL's configs and
    # LLaMA-Factory checkpoint unless told not to); how it checkpoints (use_reentrant) is the file's own key.
    if not checkpoints(model):
        return
    if ur is not None and truthy(ur.value):
        where, name = f"{ur.key} is true", "use_reentrant"
    elif ur is None and tc.format.checkpoints_by_default:
        where, name = "LLaMA-Factory checkpoints with use_reentrant_gc: true unless told otherwise", None
    else:
        return
    yield _finding(
        "GD130", Severity.ERROR,
        f"{where}: on {model.family.display_name} with {shared} KV-shared layers, reentrant gradient checkpointing "
        "silently corrupts the gradients: the shared layers' K/V come from producer layers through a side channel, "
        "which reentrant checkpointing detaches, so the producers' k_proj/v_proj and every layer below them get wrong "
        "gradients while the loss stays identical (cosine 0.84-0.88 to the true gradient on a tiny model, transformers "
        "5.5.2-5.23.0; 0.14-0.55 on gemma-4-E2B-it, unsloth-zoo #813)",
        "use non-reentrant checkpointing: activation_checkpointing_kwargs / gradient_checkpointing_kwargs "
        "{use_reentrant: false} (use_reentrant_gc: false in LLaMA-Factory); gemma_doctor.prepare(model, args) or "
        "DoctorCallback does it in memory", tc, name, kv_shared_layers=shared)


def _attention(model: ModelFacts, tc: TrainingConfig, written: Written) -> Iterator[Finding]:
    attn = written.attention  # the word as written (fa2, a kernels-hub name), or axolotl's flash_attention: true
    if attn is None or written.attention_setting not in ("attn_implementation", "flash_attention"):
        return
    impl = attn.value
    m = model.family.member
    if m is None:
        return
    widest = model.family.trait("max_head_dim")
    if impl in _FLASH and isinstance(widest, int) and widest > FLASH_MAX_HEAD_DIM:
        yield _finding(
            "GD131", Severity.ERROR,
            f"{attn.config_key} asks for FlashAttention, but {model.family.display_name}'s global attention layers have "
            f"{widest}-wide heads and FlashAttention's kernels stop at {FLASH_MAX_HEAD_DIM}: the first forward fails "
            "with \"FlashAttention forward only supports head dimension at most 256\" (flash-attn flash_api.cpp; "
            "flash-attention #2427). Packing / padding-free training, which needs FlashAttention, is out too",
            "use attn_implementation: sdpa (or eager); but on H100/H200 (sm_90) in bf16 with a per-device batch >= 2, "
            "Gemma 4 under sdpa is reported to get NaN gradients within 10-20 steps (PyTorch's cuDNN attention backward "
            "on the 256-wide sliding-window layers; NeMo-Automodel #1883, #2208, #3232): there use eager, or sdpa with "
            "torch.backends.cuda.enable_cudnn_sdp(False)", tc, "attn_implementation", max_head_dim=widest)
    # Gemma 2's missing SDPA belongs to the Gemma 2/3 attention findings; here the members new to gemma-doctor.
    backend = written.backend  # in transformers' words (fa2 -> flash_attention_2), run.BACKENDS
    if m.family not in ("gemma2", "gemma3") and backend in m.unsupported_attention:
        yield _finding(
            "GD132", Severity.ERROR,
            f"{attn.config_key} asks for {impl}, which {model.family.display_name} does not support: transformers refuses to "
            f"load it (\"does not support an attention implementation through ...\" / \"does not support Flash "
            "Attention 2 yet\", reproduced with transformers 5.23.0)",
            "use " + ("eager (or flash_attention_2 on a GPU)" if backend == "sdpa" else "sdpa or eager"),
            tc, "attn_implementation")


def _ddp_towers(model: ModelFacts, env: Environment, tc: TrainingConfig) -> Iterator[Finding]:
    if model.family.family != "gemma4" or not _has_towers(model):
        return
    # A multi-GPU DDP run, as the Run resolves it (accelerate's MULTI_GPU, a launcher's or the config's process count
    # with no FSDP / DeepSpeed turned on); GPUs the probe merely sees are not a launch (python train.py: DataParallel).
    engine = run_distributed(model, env).engine
    if engine.value is not Engine.DDP or engine.source == GPUS_VISIBLE:
        return
    unused = tc.get("ddp_find_unused_parameters")
    freeze = tc.get("freeze_vision_tower")
    if (unused is not None and truthy(unused.value)) or (freeze is not None and truthy(freeze.value)):
        return
    where = "--num-gpus" if engine.source == "option" else engine.source.removeprefix(FROM_CONFIG)
    yield _finding(
        "GD133", Severity.WARNING,
        f"multi-GPU DDP ({where}) on {model.family.display_name} with vision/audio towers: a text-only "
        "batch leaves every tower parameter without a gradient (all of them, transformers 5.5.0-5.23.0), and DDP "
        "stops with \"Expected to have finished reduction in the prior iteration\" unless they are frozen or "
        "ddp_find_unused_parameters is on (TRL #6617)",
        "freeze the towers for text-only training (gemma_doctor.prepare(model, args, text_only=True) does it), or set "
        "ddp_find_unused_parameters: true (slower)", tc, engine.config_key and _setting_name(tc, engine.config_key))


def _setting_name(tc: TrainingConfig, key: str) -> str | None:
    """The setting (KEYS' name) the training config wrote at ``key``, for the finding's place."""
    return next((name for name, setting in tc.settings.items() if setting.key == key), None)


def _clippable(model: ModelFacts) -> list[str]:
    """The module names of the checkpoint's Gemma4ClippableLinear projections (a tower's ``..._proj`` module whose
    ``nn.Linear`` is saved as ``..._proj.linear.weight`` beside its clip bounds), from its safetensors headers; empty
    where no header was read."""
    census = model.census
    if census is None:
        return []
    suffix = ".linear.weight"
    return sorted({t.name[: -len(suffix)] for h in census.headers for t in h.tensors
                   if t.name.endswith("_proj" + suffix) and ("vision_tower" in t.name or "audio_tower" in t.name)})


def _peft(model: ModelFacts, tc: TrainingConfig, lora: LoraWritten, kv_built: bool = False) -> Iterator[Finding]:
    fam = model.family
    setting, linear = lora.targets, lora.all_linear  # as the file writes them
    targets = _targets(setting.value) if setting is not None else []
    all_linear = (linear is not None and linear.value) or targets in (["all-linear"], ["all_linear"])
    # LLaMA-Factory builds its own regex that leaves the vision tower out (freeze_vision_tower): not judged here.
    judged = not tc.format.own_lora_targets
    # The checkpoint's own Gemma4ClippableLinear projections where its headers were read (Gemma 4, and the members
    # built on its towers: DiffusionGemma, EmbeddingGemma 2, whose twins PEFT refused alike); else Gemma 4's towers by
    # its config. Read only where targets are given: the search judges every candidate run with this rule.
    clippable = _clippable(model) if judged and (setting is not None or linear is not None) else []
    towers = bool(clippable) or (fam.model_type == "gemma4" and _has_towers(model))
    plain = [t for t in targets if t in _LINEAR_NAMES]
    cause = ("which are Gemma4ClippableLinear, not nn.Linear: PEFT stops with \"Target module "
             "Gemma4ClippableLinear(...) is not supported\" (PEFT #3129; reproduced with PEFT 0.18.1 and 0.21.2 on every "
             "transformers 5.5.0-5.23.0)")
    cure = f"target the language model only: target_modules: '{LANGUAGE_MODEL_REGEX}' (a regex string)"
    if towers and judged and plain and len(plain) == len(targets):
        yield _finding("GD440", Severity.ERROR,
                       f"LoRA target_modules {plain} also match the vision/audio towers' projections, {cause}", cure, tc,
                       "lora_target_modules")
    elif towers and judged and setting is not None and isinstance(setting.value, str) and not all_linear:
        # A regex string: PEFT wraps every module whose whole name it matches (re.fullmatch), a tower's
        # Gemma4ClippableLinear included. Judged on the checkpoint's own module names (found by a rehearsal of
        # '.*(q|k|v|o)_proj' on the Gemma 4 twin, which PEFT refused while this rule passed it).
        pattern = target_regex(setting.value)  # a string: why no regex is run (GD425 says it)
        hit = [m for m in clippable if not isinstance(pattern, str) and pattern.fullmatch(m)]
        if hit:
            yield _finding("GD440", Severity.ERROR,
                           f"LoRA target_modules '{setting.value}' (a regex) matches {len(hit)} of the vision/audio "
                           f"towers' projections (e.g. {hit[0]}), {cause}", cure, tc, "lora_target_modules",
                           matched=hit[:5])
    if towers and judged and all_linear:
        key = "lora_target_linear" if linear is not None and linear.value else "lora_target_modules"
        yield _finding(
            "GD441", Severity.WARNING,
            f"all-linear LoRA on {fam.display_name} also puts adapters inside the vision and audio towers (on the inner "
            ".linear of "
            "every Gemma4ClippableLinear): adapters a text-only run never trains, which also leave DDP with unused "
            "parameters",
            f"for text-only training target the language model only: target_modules: '{LANGUAGE_MODEL_REGEX}'", tc, key)
    experts = fam.trait("moe_experts")
    tp = tc.get("lora_target_parameters")
    if experts and (targets or all_linear) and (tp is None or not tp.value):
        yield _finding(
            "GD442", Severity.WARNING,
            f"{fam.display_name} is a mixture of experts ({experts} experts): the experts' weights are 3-D parameters "
            "(experts.gate_up_proj, experts.down_proj), which no target_modules reaches, so the bulk of the model gets "
            "no adapter; bitsandbytes does not quantize them either (axolotl #3395)",
            "add target_parameters: [experts.gate_up_proj, experts.down_proj] (PEFT >= 0.18; works with 0.18.1 and "
            "0.21.2) if the experts should be adapted", tc, "lora_target_modules" if setting is not None else None,
            moe_experts=experts)
    shared = fam.trait("kv_shared_layers")
    kv = [t for t in targets if re.search(r"(^|[^a-z])[kv]_proj", t)]
    if shared and kv:
        if kv_built:  # the stack's transformers is 5.5.0-5.5.1: the projections exist and a cached run skips them
            what = (f"{fam.display_name}'s last {shared} layers share the K/V of earlier layers; transformers "
                    "5.5.0-5.5.1 still build their k_proj/v_proj, which a run with the cache never uses, so those "
                    "adapters train nothing (from 5.5.2 the layers have none)")
        else:
            what = (f"{fam.display_name}'s last {shared} layers share the K/V of earlier layers and have no "
                    "k_proj/v_proj (transformers >= 5.5.2): the k_proj/v_proj adapters go to the other layers only")
        yield _finding(
            "GD443", Severity.INFO, what,
            "nothing to fix; count on fewer adapters than layers x targets", tc, "lora_target_modules",
            kv_shared_layers=shared)

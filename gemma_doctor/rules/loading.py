"""Loading and PEFT pitfalls (GD42x): LoRA targets on multimodal checkpoints, PEFT's ignored embed_scale,
EmbeddingGemma's bidirectional attention and its halving sliding window. Measured in docs/findings.md."""

from __future__ import annotations

import re
from typing import Any, Iterator

from gemma_doctor.codes import emits
from gemma_doctor.facts import CheckOptions, Environment, ModelFacts
from gemma_doctor.readers.training_config import truthy
from gemma_doctor.report import Finding, Severity
from gemma_doctor.run import LoraWritten, target_regex
from gemma_doctor.rules.common import LIBRARIES, RUN, text_config, text_key, train_tied_embedding, written_of
from gemma_doctor.rules.training import setting_finding
from gemma_doctor.stack import Exposure, Window
from gemma_doctor.versioning import BIDIRECTIONAL_IGNORED, PEFT_EMBED_SCALE, SLIDING_WINDOW_HALVED

# Multimodal model types PEFT has no default LoRA targets for (constants.py, every release up to 0.21.2).
NO_DEFAULT_TARGETS = frozenset({"gemma3", "gemma3n", "paligemma"})
# SigLIP (the Gemma 3 / PaliGemma vision tower) names its linear layers like these: bare names hit it too.
SIGLIP_LINEAR = frozenset({"q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"})
# The language model's linear layers, and a PEFT regex (re.fullmatch) that reaches them and nothing else.
LM_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LM_ONLY_REGEX = r".*language_model.*\.(" + "|".join(LM_TARGETS) + ")"
TOWERS_EXCLUDE_REGEX = r".*(vision_tower|audio_tower|multi_modal_projector|embed_vision|embed_audio).*"
# Text models whose input embedding multiplies by embed_scale inside the module (Gemma3TextScaledWordEmbedding):
# Gemma 3 and 3n in every release, Gemma 1/2 from transformers 5.4.0.
SCALED_EMBEDDING_TYPES = frozenset({"gemma3_text", "gemma3n_text"})
SCALED_EMBEDDING_GEMMA12 = Window("transformers", ">=5.4.0")


def _severity(exposure: Exposure, affected: Severity, unknown: Severity) -> Severity | None:
    return {Exposure.AFFECTED: affected, Exposure.UNKNOWN: unknown}.get(exposure)


@emits("GD420", "GD421", "GD422", "GD423", "GD424", "GD425",
       reads=("model.family", "model.config.exists", "model.config.error",
              "model.config.data[text_config][use_bidirectional_attention]",
              "model.config.data[use_bidirectional_attention]", *RUN, "model.run.shape", *LIBRARIES,
              "env.training_config"))
def check(model: ModelFacts, env: Environment, options: CheckOptions) -> Iterator[Finding]:
    """GD420-GD425 for a Gemma model: from config.json, the training config and the libraries that will run."""
    if not model.family.is_gemma or not model.config.ok:
        return
    yield from _bidirectional(model, env)
    tc = env.training_config
    if tc is None or not tc.ok:
        return
    lora = written_of(model, env).lora  # LoRA as the file writes it (the Run's written targets, beside the resolved)
    yield from _lora_targets(model, tc, lora)
    yield from _targets_match_nothing(model, tc, lora)
    yield from _embed_scale(model, env, tc, lora)


def _lora_targets(model: ModelFacts, tc: Any, lora: LoraWritten) -> Iterator[Finding]:
    mt = model.family.model_type
    if mt not in NO_DEFAULT_TARGETS or not lora.enabled:
        return
    name = model.family.display_name
    fix = (f"target the language model only: target_modules=r\"{LM_ONLY_REGEX}\" (PEFT matches a string with "
           f"re.fullmatch), or target_modules=\"all-linear\" with exclude_modules=r\"{TOWERS_EXCLUDE_REGEX}\"")
    setting = lora.targets
    if not lora.given:
        if tc.format.lora_targets_peft_default:  # TRL's use_peft passes target_modules=None to LoraConfig: PEFT's default
            yield setting_finding(
                "GD420", Severity.ERROR,
                f"LoRA on a multimodal {name} checkpoint ({mt}) without target_modules: PEFT has no default targets for "
                f"{mt}, so get_peft_model raises \"ValueError: Please specify `target_modules` in `peft_config`\"",
                fix, tc, "adapter", model_type=mt)
        return
    if tc.get("lora_exclude_modules") is not None:
        return
    freeze = tc.get("freeze_vision_tower")
    if tc.format.own_lora_targets and (freeze is None or truthy(freeze.value)):
        # LLaMA-Factory 0.9.5 leaves every tower of a Gemma composite out of its targets while freeze_vision_tower is
        # on, its default (model/model_utils/visual.py patch_target_modules; find_all_linear_modules for `all`).
        return
    targets = (list(setting.value) if isinstance(setting.value, tuple) else setting.value) if setting is not None \
        else "all-linear"
    towers = "/".join(m for m in ("vision", "audio") if m in (model.family.member.towers if model.family.member else ()))
    hit: list[str] = []
    if isinstance(targets, str) and targets.lower() in ("all-linear", "all"):
        hit = ["every linear layer"]
    elif isinstance(targets, list) and mt in ("gemma3", "paligemma"):
        hit = sorted(SIGLIP_LINEAR.intersection(targets))
    if not hit:
        return
    what = "all-linear" if hit == ["every linear layer"] else ", ".join(hit)
    yield setting_finding(
        "GD421", Severity.WARNING,
        f"LoRA targets {what} on a multimodal {name} checkpoint also wrap its {towers or 'vision'} tower "
        f"({'every linear layer' if what == 'all-linear' else 'SigLIP names its attention/MLP layers the same'}): "
        "adapters, optimizer state and memory for towers a text-only run never trains",
        fix, tc, "lora_target_modules" if setting is not None else "lora_target_linear",
        model_type=mt, targets=hit)


def _targets_match_nothing(model: ModelFacts, tc: Any, lora_written: LoraWritten) -> Iterator[Finding]:
    """GD425: the training config's LoRA targets wrap no linear layer of a text-only Gemma: PEFT refuses the model.

    Read from the Run, whose LoRA block the memory plan counted by matching the targets as PEFT does against the
    model's module names. A multimodal checkpoint is left out: its tensor names are the saved layout, not always the
    one transformers builds (GD730 and GD731 judge a regex written for the other layout), so "no match" there is not
    certain."""
    run = model.run
    if run is None or model.family.nested or not lora_written.enabled:
        return
    lora = run.lora.value if run.lora is not None else None
    if lora is None or lora.trainable or not lora.targets_source.startswith("training config"):
        return
    if not run.shape.linear_names:
        # No linear layer known at all (safetensors headers that list only some tensors, a config the counts could
        # not be derived from): "no match" would then be a statement about the facts, not about the targets.
        return
    targets = lora.targets
    shown = targets if isinstance(targets, str) else list(targets)
    pattern = target_regex(targets) if isinstance(targets, str) and targets != "all-linear" else None
    what = (pattern if isinstance(pattern, str) else
            "match no linear layer of this model: get_peft_model raises \"ValueError: Target modules ... not found in "
            "the base model\" (PEFT's NoMatchingPeftModuleError)")
    names = list(run.shape.linear_names)
    # A regex declined for what it may do (backtracking, length) is a warning: PEFT may well run it; one that does not
    # compile, or that matches nothing, is an error: PEFT raises.
    declined = isinstance(pattern, str) and not getattr(pattern, "crashes", True)
    yield setting_finding(
        "GD425", Severity.WARNING if declined else Severity.ERROR, f"LoRA targets {shown!r} {what}",
        f"name the model's own linear layers, e.g. target_modules={names!r}, or \"all-linear\"", tc,
        "lora_target_modules", targets=shown, linear_names=names)


def _targets_embeddings(tc: Any, lora: LoraWritten) -> str | None:
    """The setting that makes embed_tokens trainable through PEFT (a LoRA target or trainable tokens), if any."""
    tti = tc.get("trainable_token_indices")
    if tti is not None and tti.value not in (None, [], {}, ""):
        return "trainable_token_indices"
    targets = lora.targets.value if lora.targets is not None else None
    if isinstance(targets, tuple) and any(t == "embed_tokens" or t.endswith(".embed_tokens") for t in targets):
        return "lora_target_modules"
    if isinstance(targets, str) and targets.lower() != "all-linear" and re.search(r"embed_tokens", targets):
        return "lora_target_modules"
    return None


def _embed_scale(model: ModelFacts, env: Environment, tc: Any, lora: LoraWritten) -> Iterator[Finding]:
    text_type = model.family.text_model_type
    stack = env.libraries
    scaled = text_type in SCALED_EMBEDDING_TYPES or (
        text_type in ("gemma", "gemma2") and stack.exposure(SCALED_EMBEDDING_GEMMA12) is Exposure.AFFECTED)
    which = _targets_embeddings(tc, lora)
    if not scaled or which is None:
        return
    peft = stack.get("peft")
    sev = _severity(stack.exposure(PEFT_EMBED_SCALE), Severity.ERROR, Severity.WARNING)
    if sev is None:
        return
    yield setting_finding(
        "GD422", sev,
        f"{which} makes embed_tokens a PEFT target, and {peft.describe()} "
        + ("ignores" if sev is Severity.ERROR else "may be older than 0.18.0, which ignores")
        + f" the embed_scale (sqrt(hidden_size)) that {text_type}'s embedding applies: the adapter's rows train "
        "unscaled (trainable tokens: every token's embedding comes out 1/sqrt(hidden_size) too small), so the model "
        "trained and evaluated unmerged differs from the merged one you export (peft #2809)",
        f'pip install "peft>={PEFT_EMBED_SCALE.first_fixed}" (PR #2825); to train the whole embedding instead, '
        + train_tied_embedding(stack).removeprefix(f'pip install "peft>={PEFT_EMBED_SCALE.first_fixed}", then '),
        tc, which, peft=peft.to_json())


def _bidirectional(model: ModelFacts, env: Environment) -> Iterator[Finding]:
    text = text_config(model)
    # EmbeddingGemma's flag sits on its gemma3_text config. PaliGemma's config in transformers 5.x sets
    # text_config.use_bidirectional_attention true on its Gemma / Gemma 2 text model (configuration_paligemma.py,
    # "Both PaliGemmas want to default to True") and saves it: the prefix-LM attention every transformers builds for
    # PaliGemma itself, neither an embedding model nor a sliding window the Gemma 3 text config halves.
    if text.get("use_bidirectional_attention") is not True or model.family.text_model_type != "gemma3_text":
        return
    stack = env.libraries
    tf = stack.get("transformers")
    key = text_key(model, "use_bidirectional_attention")
    sev = _severity(stack.exposure(BIDIRECTIONAL_IGNORED), Severity.ERROR, Severity.WARNING)
    if sev is not None:
        yield Finding(
            "GD423", sev,
            f"{key} is true (EmbeddingGemma), but {tf.describe()} "
            + ("does not read it" if sev is Severity.ERROR else "may be older than 4.57.0, which does not read it")
            + ": the model runs causal, silently, and its embeddings are wrong",
            file="config.json", key=key, fix=f'pip install "transformers>={BIDIRECTIONAL_IGNORED.first_fixed}"',
            # the window and its exposure: where the version is unknown, a prescription pins past it (search._pin)
            details={"transformers": tf.to_json(), "exposure": stack.exposure(BIDIRECTIONAL_IGNORED).value,
                     "window": BIDIRECTIONAL_IGNORED.spec})
        return
    window = text.get("sliding_window")
    sev = _severity(stack.exposure(SLIDING_WINDOW_HALVED), Severity.WARNING, Severity.INFO)
    if sev is None:
        return
    yield Finding(
        "GD424", sev,
        f"bidirectional {model.family.text_model_type} config: {tf.describe()} "
        + ("halves" if sev is Severity.WARNING else "halves (4.57.0-5.15.x)")
        + f" sliding_window on every load (w // 2 + 1) and saves the halved value, so each load + save of a "
        f"fine-tuned checkpoint halves it again (sliding_window is {window!r} here; EmbeddingGemma-300m ships 512)",
        file="config.json", key=text_key(model, "sliding_window"),
        fix=f'pip install "transformers>={SLIDING_WINDOW_HALVED.first_fixed}" before saving; in a checkpoint already '
            "saved, write back the sliding_window the base model was published with",
        details={"sliding_window": window, "transformers": tf.to_json()})

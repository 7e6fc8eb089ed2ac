"""Runtime crashes and silent breakage that depend on the transformers that will run (GD105-GD110, GD620): inputs a
text-only batch lacks on some 5.x releases, Gemma 4's KV sharing without a cache, and version skew between the
checkpoint and the library (a model_type the release does not know, RoPE settings it does not read, Gemma 3n's
vision tower without timm). Pure: facts in, findings out; the windows are in versioning.py, bisected on PyPI wheels.
"""

from __future__ import annotations

from collections.abc import Mapping  # isinstance in C (typing.Mapping's checks through Python per call)
from dataclasses import dataclass
from typing import Any, Iterator

from packaging.version import Version

from gemma_doctor.codes import emits
from gemma_doctor import family as family_mod
from gemma_doctor.facts import CheckOptions, Environment, ModelFacts
from gemma_doctor.readers.training_config import truthy
from gemma_doctor.report import Finding, Severity
from gemma_doctor.rules.common import checkpoints, located, run_trainer
from gemma_doctor.stack import Exposure, Stack, Window
from gemma_doctor.trainers import Trainer
from gemma_doctor.traits import kv_shared_layers, use_cache_off_breaks  # noqa: F401
from gemma_doctor.versioning import (
    GEMMA4_KV_SHARE_NO_CACHE, GEMMA4_MM_TOKEN_TYPE_IDS, ROPE_PARAMETERS_READER, TOKEN_TYPE_IDS_GEMMA3,
    TOKEN_TYPE_IDS_PALIGEMMA, older_than)

TOKEN_TYPE_IDS_ERROR = "ValueError: `token_type_ids` is required as a model input when training"
MM_TOKEN_TYPE_IDS_ERROR = "ValueError: `mm_token_type_ids` is required as a model input when training"


@dataclass(frozen=True)
class RequiredInput:
    """An input a text-only training batch must carry on some releases, and the constant that is right for text."""

    model_type: str
    name: str  # the forward() keyword
    value: int  # the constant a text-only batch needs (0 or 1)
    window: Window
    error: str
    why: str  # what the constant means to the model


# Gemma 3: token_type_ids 1 marks image tokens (bidirectional among themselves); 0 = text, causal.
# PaliGemma: 0 marks the prefix (bidirectional), 1 the suffix (causal). All zeros would let every text token see
# the future (measured: logits of earlier positions move when the last token changes), so text is all ones.
# Gemma 4 ("vision" bidirectional configs): mm_token_type_ids 0 = text; token_type_ids does not help there.
REQUIRED_INPUTS: tuple[RequiredInput, ...] = (
    RequiredInput("gemma3", "token_type_ids", 0, TOKEN_TYPE_IDS_GEMMA3, TOKEN_TYPE_IDS_ERROR,
                  "0 marks text tokens, attended causally"),
    RequiredInput("paligemma", "token_type_ids", 1, TOKEN_TYPE_IDS_PALIGEMMA, TOKEN_TYPE_IDS_ERROR,
                  "1 marks the causal suffix; zeros would make the whole sequence a bidirectional prefix that sees "
                  "its own labels"),
    RequiredInput("gemma4", "mm_token_type_ids", 0, GEMMA4_MM_TOKEN_TYPE_IDS, MM_TOKEN_TYPE_IDS_ERROR,
                  "0 marks text tokens"),
)


def required_input(model_type: str | None, text_config: Mapping[str, Any]) -> RequiredInput | None:
    """The input a text-only batch of this multimodal model needs on the releases of its window, or None."""
    for req in REQUIRED_INPUTS:
        if req.model_type != model_type:
            continue
        # Gemma 4 checks mm_token_type_ids only where the text model attends bidirectionally to images (31B,
        # 26B-A4B); E2B/E4B configs (None) never raise (research/gemma4 table b).
        if model_type == "gemma4" and text_config.get("use_bidirectional_attention") != "vision":
            return None
        return req
    return None


def _severity(exposure: Exposure) -> Severity:
    return Severity.ERROR if exposure is Exposure.AFFECTED else Severity.WARNING


def _text_config(model: ModelFacts) -> Mapping[str, Any]:
    node: Any = model.config.data
    for key in model.family.text_path:
        node = node.get(key) if isinstance(node, Mapping) else None
    return node if isinstance(node, Mapping) else {}


def _where(tf: Any, exposure: Exposure, window: Window) -> str:
    if exposure is Exposure.AFFECTED:
        return f"{tf.describe()} is affected ({window.describe()}; fixed in {window.first_fixed})"
    return (f"whether it happens depends on the transformers that will run ({tf.describe()}): {window.describe()} "
            f"is affected; name it with --with transformers==VERSION")


def model_part(model: ModelFacts, env: Environment,
               options: CheckOptions) -> tuple[tuple[Finding, ...], tuple[Finding, ...]]:
    """The findings of check() that read the model and its stack alone (codes.emits): those it reports before the K/V
    sharing (GD108/GD109, GD105/GD106) and after it (RoPE, timm), the same for every run of the model."""
    if not model.config.ok or not model.family.is_gemma:
        return (), ()
    stack = env.libraries
    unknown = tuple(_unknown_model_type(model, stack))
    before = unknown + tuple(_required_input(model, stack))
    after: tuple[Finding, ...] = ()
    if not any(f.severity is Severity.ERROR for f in unknown):  # a release that cannot load it reads no RoPE either
        after = tuple(_rope_parameters(model, stack))
    return before, after + tuple(_timm(model, stack))


@emits("GD105", "GD106", "GD107", "GD108", "GD109", "GD110", "GD620", costly=True, model_part=model_part)
def check(model: ModelFacts, env: Environment, options: CheckOptions,
          part: tuple[tuple[Finding, ...], tuple[Finding, ...]] | None = None) -> Iterator[Finding]:
    """GD105-GD110 and GD620 for one model, each only where the libraries that will run can show it (``part``:
    model_part's findings, judged before for this model and stack)."""
    if not model.config.ok or not model.family.is_gemma:
        return
    before, after = part if part is not None else model_part(model, env, options)
    yield from before
    yield from _kv_sharing(model, env, env.libraries)
    yield from _kv_sharing_checkpointing(model, env, env.libraries)
    yield from after


def _required_input(model: ModelFacts, stack: Stack) -> Iterator[Finding]:
    fam = model.family
    text = _text_config(model)
    req = required_input(fam.model_type, text)
    if req is None:
        return
    exposure = stack.exposure(req.window)
    if exposure is Exposure.SAFE:
        return
    tf = stack.get("transformers")
    code = "GD106" if req.name == "mm_token_type_ids" else "GD105"
    scope = ' (text_config.use_bidirectional_attention is "vision")' if req.model_type == "gemma4" else ""
    yield Finding(
        code, _severity(exposure),
        f"training this {fam.display_name} checkpoint{scope} on text-only batches (no images, so no {req.name}) "
        f"raises {req.error}: {_where(tf, exposure, req.window)}",
        file="config.json",
        key=".".join((*fam.text_path, "use_bidirectional_attention")) if req.model_type == "gemma4" else "model_type",
        fix=(f"gemma_doctor.prepare(model) or Trainer(callbacks=[DoctorCallback()]) supplies {req.name} = "
             f"{req.value} for text-only batches ({req.why}); or pip install \"transformers>={req.window.first_fixed}\""),
        details={"exposure": exposure.value, "input": req.name, "value": req.value,
                 "window": req.window.spec, "transformers": tf.to_json()})


def _kv_sharing(model: ModelFacts, env: Environment, stack: Stack) -> Iterator[Finding]:
    shared = kv_shared_layers(model.family)
    exposure = use_cache_off_breaks(model.family, stack)
    if not shared or exposure is Exposure.SAFE:
        return
    tf = stack.get("transformers")
    w = GEMMA4_KV_SHARE_NO_CACHE
    tc = env.training_config
    # axolotl keeps no cache whatever its config says: check_model_config (loaders/utils.py, 0.19.0) sets use_cache
    # False on the model config and its text config after overrides_of_model_config, and its schema has no use_cache.
    axolotl = run_trainer(model, env).value is Trainer.AXOLOTL
    if tc is not None and tc.ok and tc.get("use_cache") is not None and truthy(tc.get("use_cache").value) and not (
            checkpoints(model)) and not axolotl:
        # The run keeps the cache on and checkpointing off (what recommend prescribes here): the sharing works.
        yield Finding(
            "GD107", Severity.INFO,
            f"{shared} layers of this {model.family.display_name} model reuse other layers' K/V only through the cache "
            f"on these releases; the training config keeps use_cache on ({tc.get('use_cache').key}) and gradient "
            f"checkpointing off, so the loss is right: {_where(tf, exposure, w)}",
            file=tc.path, key=tc.get("use_cache").key,
            fix=f'keep it so (Trainer writes TrainingArguments.use_cache onto the model config), or pip install '
                f'"transformers>={w.first_fixed}"',
            details={"exposure": exposure.value, "kv_shared_layers": shared, "window": w.spec, "transformers": tf.to_json()})
        return
    yield Finding(
        "GD107", _severity(exposure),
        f"{shared} layers of this {model.family.display_name} model reuse other layers' K/V, which these releases do "
        f"only through the cache: with use_cache=False (Trainer's default, every QLoRA recipe) or gradient "
        f"checkpointing the shared layers compute their own K/V and the loss is wrong without any error "
        f"(transformers #45242): {_where(tf, exposure, w)}"
        + ("; axolotl switches use_cache off on the model and its text config whatever its config says "
           "(check_model_config, 0.19.0), so under axolotl only a transformers outside the window trains it right"
           if axolotl else ""),
        file="config.json", key=".".join((*model.family.text_path, "num_kv_shared_layers")),
        fix=f'pip install "transformers>={w.first_fixed}" (PR #45312); or train through gemma_doctor.prepare(model) / '
            "DoctorCallback, which keep use_cache on for this model on these releases (undoing Trainer's use_cache=False), "
            "with gradient checkpointing off; gemma-doctor fix never writes use_cache: false for it",
        details={"exposure": exposure.value, "kv_shared_layers": shared, "window": w.spec, "transformers": tf.to_json()})


def _kv_sharing_checkpointing(model: ModelFacts, env: Environment, stack: Stack) -> Iterator[Finding]:
    """GD620: the training config turns gradient checkpointing on, which drops the cache; prepare() cannot help."""
    tc = env.training_config
    shared = kv_shared_layers(model.family)
    if tc is None or not tc.ok or not shared or not checkpoints(model):
        return
    exposure = use_cache_off_breaks(model.family, stack)
    if exposure is Exposure.SAFE:
        return
    w = GEMMA4_KV_SHARE_NO_CACHE
    gc = model.run.checkpointing
    at = located(gc, tc)
    # Where the config leaves it to its trainer (TRL's configs and LLaMA-Factory checkpoint by default), the source
    # says so, and the fix names the key that turns it off.
    key = at["key"] or ("disable_gradient_checkpointing" if tc.format.checkpoints_by_default  # LLaMA-Factory's
                        else "gradient_checkpointing")
    why = at["key"] or ("--gradient-checkpointing" if gc.source == "option" else f"on by the {gc.source}")
    if key == "disable_gradient_checkpointing":  # LLaMA-Factory checkpoints unless this is true
        why, off = why if not at["key"] else f"{key}: false", f"set {key} to true"
    else:
        off = f"set {key} to false"
    yield Finding(
        "GD620", _severity(exposure),
        f"gradient checkpointing ({why}) drops the cache in every layer, so on these releases the {shared} KV-shared "
        f"layers compute their own K/V and the loss is wrong, even with use_cache on (GD107): "
        f"{_where(stack.get('transformers'), exposure, w)}",
        file=at["file"], key=at["key"],
        fix=f'pip install "transformers>={w.first_fixed}", or {off} for this model',
        details={"exposure": exposure.value, **at["details"]})


def _minimum(model: ModelFacts) -> tuple[str, str] | None:
    """(model_type, minimum) of the newest-introduced model_type this config needs (its own or its text model's)."""
    needs: list[tuple[str, str]] = []
    root = family_mod.member(model.family.model_type)
    # T5Gemma's decoder (t5_gemma_module, registered from 5.6.0) is built by T5GemmaConfig itself from 4.53.0
    # (configuration_t5gemma.py in the 4.53.3 wheel: `decoder = T5GemmaModuleConfig(**decoder)`; T5Gemma 2 likewise
    # in 5.0.0): only the root's first release counts.
    types = (model.family.model_type,) if root is not None and root.builds_text_config else \
        (model.family.model_type, model.family.text_model_type)
    for mt in types:
        m = family_mod.member(mt)
        if m is not None and m.min_transformers:
            needs.append((m.model_type, m.min_transformers))
    return max(needs, key=lambda n: Version(n[1])) if needs else None


def _unknown_model_type(model: ModelFacts, stack: Stack) -> Iterator[Finding]:
    need = _minimum(model)
    if need is None:
        return
    model_type, minimum = need
    tf = stack.get("transformers")
    window = older_than(minimum)
    exposure = stack.exposure(window)
    # Nothing known about transformers at all: every version-dependent finding already says so, and a warning that
    # any release might be too old would be noise on every model.
    if exposure is Exposure.SAFE or tf.absent:
        return
    if exposure is Exposure.AFFECTED:
        message = (f"transformers {tf.version} cannot load model_type {model_type} (needs >= {minimum}): loading "
                   f"raises \"The checkpoint you are trying to load has model type `{model_type}` but Transformers "
                   "does not recognize this architecture\"")
    else:
        message = (f"model_type {model_type} needs transformers >= {minimum}; whether the transformers that will run "
                   f"({tf.describe()}) knows it cannot be told: name it with --with transformers==VERSION")
    key = "model_type" if model_type == model.family.model_type else ".".join((*model.family.text_path, "model_type"))
    yield Finding("GD108", _severity(exposure), message, file="config.json", key=key,
                  fix=f'pip install "transformers>={minimum}"',
                  details={"exposure": exposure.value, "model_type": model_type, "min_transformers": minimum,
                           "transformers": tf.to_json()})


def _scaled_rope(rope_parameters: Any) -> dict[str, Any]:
    """The RoPE entries whose rope_type is not "default" (scaling), by layer type ("" for a flat dict)."""
    if not isinstance(rope_parameters, Mapping):
        return {}
    entries = rope_parameters.items() if all(isinstance(v, Mapping) for v in rope_parameters.values()) and \
        rope_parameters else [("", rope_parameters)]
    return {k: dict(v) for k, v in entries
            if isinstance(v, Mapping) and v.get("rope_type") not in (None, "default")}


# The RoPE types transformers 4.50.0-4.57.6 know (modeling_rope_utils.ROPE_INIT_FUNCTIONS of both wheels): a
# rope_scaling of another type (5.x's "proportional", Gemma 4's) is no equivalent on 4.x.
_ROPE_TYPES_4X = frozenset({"linear", "dynamic", "yarn", "longrope", "llama3"})


def _rope_kind(entry: Mapping[str, Any]) -> str:
    """"linear x8.0", "proportional (partial_rotary_factor 0.25)": the type, its factor when it has one, other knobs."""
    factor = f" x{entry['factor']}" if entry.get("factor") is not None else ""
    rest = ", ".join(f"{k} {v}" for k, v in entry.items() if k not in ("rope_type", "rope_theta", "factor"))
    return f"{entry.get('rope_type')}{factor}" + (f" ({rest})" if rest else "")


def _rope_parameters(model: ModelFacts, stack: Stack) -> Iterator[Finding]:
    text = _text_config(model)
    if "rope_parameters" not in text or text.get("rope_scaling") is not None:
        return
    scaled = _scaled_rope(text.get("rope_parameters"))
    if not scaled:
        return  # unscaled RoPE: 4.x falls back to the same defaults for every Gemma config measured
    exposure = stack.exposure(ROPE_PARAMETERS_READER)
    if exposure is Exposure.SAFE:
        return
    tf = stack.get("transformers")
    key = ".".join((*model.family.text_path, "rope_parameters"))
    kinds = ", ".join(f"{k or 'all layers'}: {_rope_kind(v)}" for k, v in scaled.items())
    unknown_4x = sorted({str(v.get("rope_type")) for v in scaled.values()} - _ROPE_TYPES_4X)
    upgrade = f'pip install "transformers>={ROPE_PARAMETERS_READER.first_fixed}"'
    fix = (f"{upgrade} (transformers 4.x has no {', '.join(unknown_4x)} RoPE)" if unknown_4x else
           f"{upgrade}, or add the equivalent \"rope_scaling\" ({next(iter(scaled.values()))!r}) to "
           f"{'.'.join((*model.family.text_path, 'rope_scaling'))} for 4.x")
    where = (f"{tf.describe()} reads only rope_scaling/rope_theta" if exposure is Exposure.AFFECTED else
             f"transformers < 5.0 reads only rope_scaling/rope_theta; whether {tf.describe()} is one cannot be told")
    yield Finding(
        "GD109", _severity(exposure),
        f"{key} ({kinds}) was written by transformers 5.x and {where}: the model silently loads with unscaled RoPE "
        "(no warning; logits differ from the saved model's)",
        file="config.json", key=key,
        fix=fix,
        # The window in the details, as GD105's and GD107's: a prescription for a stack that names no transformers
        # pins past it (transformers>=5.0.0) instead of answering "none" (plan/search.py's _pin reads it).
        details={"exposure": exposure.value, "scaled": scaled, "window": ROPE_PARAMETERS_READER.spec,
                 "transformers": tf.to_json()})


def _timm(model: ModelFacts, stack: Stack) -> Iterator[Finding]:
    if model.family.model_type != "gemma3n":
        return
    missing = [p.name for p in (stack.get("timm"), stack.get("pillow")) if p.absent]
    if not missing:
        return
    # Installed packages are known: absent means absent. A requirements file that does not list them only
    # says they are not pinned there.
    sev = Severity.WARNING if stack.planned and stack.origin != "installed + --with" else Severity.ERROR
    where = "is not installed" if sev is Severity.ERROR else f"is not in {stack.origin}"
    yield Finding(
        "GD110", sev,
        f"{' and '.join(missing)} {where}: Gemma 3n's vision tower is a timm model, so "
        "Gemma3nForConditionalGeneration and AutoModelForCausalLM fail to build it (ImportError: TimmWrapperModel "
        "requires the timm library / the PIL library)",
        file="config.json", key="vision_config",
        fix="pip install timm pillow; or, for text-only training, load Gemma3nForCausalLM (no vision tower)",
        details={"missing": missing})

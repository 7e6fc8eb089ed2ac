"""After training (GD7xx): PEFT adapters and their base, Trainer checkpoints, merged models whose saved head a reload
discards, and adapter key layouts the transformers that will run does not read. Pure; measured in docs/findings.md."""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from gemma_doctor.codes import emits
from gemma_doctor.facts import CheckOptions, Environment, ModelFacts
from gemma_doctor.readers.adapter import LAYOUT_NEW, LAYOUT_OLD, AdapterFacts
from gemma_doctor.report import MODEL_ARGS, Finding, Severity
from gemma_doctor.rules import serving
from gemma_doctor.stack import Exposure, Window
from gemma_doctor.traits import config_ties, head_saved_apart, ties_embeddings  # noqa: F401

# The adapter's trained copies of these modules are the tied pair (Gemma ties lm_head to embed_tokens).
TIED_MODULES = frozenset({"embed_tokens", "lm_head"})
# transformers 4.52 moved the multimodal classes' language model from language_model.model.* to
# model.language_model.* (transformers #38927): an adapter saved in the new layout names modules older releases lack.
NEW_LAYOUT_UNREAD = Window("transformers", "<4.52.0", "4.52.0")
# The other way round, PEFT maps the old keys onto the new modules from 0.16.0 (PR #2574): an adapter saved before 4.52
# loads as nothing on transformers >= 4.52 with PEFT 0.15.2 (measured on 4.52.4; 0.16.0 and 0.17.0 load it).
OLD_LAYOUT_TRANSFORMERS = Window("transformers", ">=4.52.0")
OLD_LAYOUT_PEFT = Window("peft", "<0.16.0", "0.16.0")
# A merge of untied copies keeps config.json tied, so the reload discards the trained head, on PEFT 0.17.1, 0.18.0 and
# 0.18.1; from 0.19.0 merge_and_unload sets tie_word_embeddings=false (bisected on 0.17.1-0.21.2 with transformers
# 4.57.6; tests/test_after_training_repro.py).
MERGE_KEEPS_TIE = Window("peft", "<0.19.0", "0.19.0")
# Loading such a folder ties lm_head to embed_tokens again, discarding the saved head, in transformers 4.x (measured
# 4.51.3 and 4.57.6); 5.0.0, 5.5.1 and 5.23.0 load the saved head (tests/test_after_training_repro.py).
RELOAD_TIES = Window("transformers", "<5.0.0", "5.0.0")


@emits("GD741", "GD742", "GD743", "GD750", "GD751", "GD752", "GD760", "GD761", "GD770", "GD771", "GD772", "GD773",
       "GD774", "GD775", model_only=True)
def check(model: ModelFacts, env: Environment, options: CheckOptions) -> Iterator[Finding]:
    """GD70x for adapters and checkpoints, GD750 for a model folder that saves an untied head under a tied config."""
    if model.adapter is not None:
        yield from _adapter(model, model.adapter, env)
    elif model.family.is_gemma and model.config.ok:
        yield from _untied_head(model, env)
        yield from _saved_folder(model)
        yield from serving.model_folder(model, env)


def _untied_head(model: ModelFacts, env: Environment) -> Iterator[Finding]:
    apart = head_saved_apart(model)
    if apart is None:
        return
    head_name, embed_name, key = apart
    said = f"config.json says {key}: true" if key else "config.json leaves tie_word_embeddings unset (true by default)"
    cmp = model.head_differs
    details: dict[str, Any] = {"head": head_name, "embed": embed_name}
    if cmp is not None and cmp.identical:
        yield Finding("GD750", Severity.INFO,
                      f"{head_name} is saved although {said}; it equals {embed_name} value for value (--weights), "
                      "so tying it again at load loses nothing", file="config.json", key=key or "tie_word_embeddings",
                      details=details)
        return
    measured = ""
    if cmp is not None and cmp.max_abs_diff is not None:
        measured = f" (--weights: they differ by up to {cmp.max_abs_diff:.4g})"
        details["max_abs_diff"] = cmp.max_abs_diff
    exposure = env.libraries.exposure(RELOAD_TIES)
    tf = env.libraries.get("transformers")
    if exposure is Exposure.AFFECTED:
        what = f"{tf.describe()} ties lm_head to embed_tokens again at load and the trained head is discarded"
    elif exposure is Exposure.SAFE:
        what = (f"{tf.describe()} loads the saved head, but transformers 4.x discards it at load, and vLLM ignores it "
                "or refuses the folder (vllm #21755, #14212)")
    else:
        what = "transformers 4.x ties lm_head to embed_tokens again at load and the trained head is discarded (5.x keeps it)"
    yield Finding(
        "GD750", Severity.ERROR if exposure is Exposure.AFFECTED else Severity.WARNING,
        f"{head_name} is saved apart from {embed_name}{measured}, but {said}: {what} (a PEFT < 0.19 merge of an "
        "adapter that trained both copies apart)", file="config.json", key=key or "tie_word_embeddings",
        fix=f"if the head was trained: gemma-doctor fix {MODEL_ARGS} --inplace (it compares the two "
            "tensors, then sets \"tie_word_embeddings\": false in config.json, so the saved head is used; restore "
            "undoes it); if it should stay tied, retrain with PEFT >= 0.18 and LoraConfig(ensure_weight_tying=True)",
        details=details)


# llama.cpp's convert_hf_to_gguf.py reads these members' vocabulary from tokenizer.model (llama.cpp #19152, Gemma 2).
SENTENCEPIECE_GGUF = frozenset({"gemma", "gemma2"})


def _saved_folder(model: ModelFacts) -> Iterator[Finding]:
    """A folder a training run (or a merge) saved, not a published snapshot: files that loaders of it need."""
    source = model.source
    if source is None or source.kind != "folder":
        return  # a cached or Hub repo is what its publisher uploaded
    files = model.files
    trained = model.kind == "checkpoint" or "training_args.bin" in files
    member = model.family.member
    if member is not None and "vision" in member.towers and (trained or "tokenizer_config.json" in files) \
            and not files & {"preprocessor_config.json", "processor_config.json"}:
        yield Finding(
            "GD770", Severity.WARNING,
            f"a saved {model.family.display_name} folder without preprocessor_config.json: "
            "AutoProcessor.from_pretrained on it raises OSError, so vLLM and evaluation harnesses cannot load it "
            "(trl #3110: SFTTrainer saves the tokenizer, not the processor)", file="preprocessor_config.json",
            fix="save the base model's processor beside the weights: AutoProcessor.from_pretrained(BASE)"
                ".save_pretrained(FOLDER)")
    if model.family.family in SENTENCEPIECE_GGUF and "tokenizer.json" in files and "tokenizer.model" not in files:
        yield Finding(
            "GD771", Severity.INFO,
            "the folder has tokenizer.json but no tokenizer.model: llama.cpp's convert_hf_to_gguf.py reads a Gemma "
            "vocabulary from tokenizer.model and stops with FileNotFoundError (llama.cpp #19152)",
            file="tokenizer.model", fix="copy tokenizer.model from the base model's repo before converting to GGUF")


def _adapter(model: ModelFacts, ad: AdapterFacts, env: Environment) -> Iterator[Finding]:
    if not ad.ok:
        yield Finding("GD741", Severity.ERROR, f"the adapter cannot be loaded: {ad.error}",
                      file=ad.weights_file or "adapter_config.json",
                      fix="save the adapter again with model.save_pretrained(DIR) (adapter_config.json and "
                          "adapter_model.safetensors)")
        return
    base = model.base
    name = _shown(base.name) if base is not None else ""
    if base is not None and base.found == "not found":
        why = f" ({base.note})" if base.note else ""
        yield Finding("GD742", Severity.INFO,
                      f"the base model {base.name!r} (adapter_config.json base_model_name_or_path) is neither a folder "
                      f"here nor in the hub cache, and the Hub did not give its config.json{why}: the checks that need "
                      "the base's config were skipped",
                      file="adapter_config.json", key="base_model_name_or_path",
                      fix=f"download it (hf download {name} --include '*.json') or check the base by name")
    elif base is not None and base.found == "unnamed":
        yield Finding("GD742", Severity.WARNING, "adapter_config.json names no base model (base_model_name_or_path): "
                      "nothing says which model it was trained on", file="adapter_config.json",
                      key="base_model_name_or_path", fix="set base_model_name_or_path to the repo id the adapter was "
                                                         "trained on")
    fam = base.family if base is not None else None
    if base is not None and base.config is not None and not base.config.ok:
        yield Finding("GD742", Severity.INFO,
                      f"the base model {base.name!r} is {_shown(base.path or '')}, whose config.json is "
                      f"{'missing' if not base.config.exists else 'unreadable'}: the checks that need it were skipped",
                      file="adapter_config.json", key="base_model_name_or_path",
                      fix="point base_model_name_or_path at the model folder (or repo id) the adapter was trained on")
    elif base is not None and base.config is not None and fam is not None and not fam.is_gemma:
        mt = fam.model_type or "unknown"
        yield Finding("GD743", Severity.INFO, f"the base model is not a Gemma-family model (model_type {mt!r}); "
                      "its adapter is left alone", file="adapter_config.json", key="base_model_name_or_path")
        return
    yield from _tied_copies(model, ad, env)
    yield from _layout(ad, env)
    yield from serving.adapter(model, ad, env)


def _shown(text: str | None) -> str:
    """A name or path as typed when printable, else its repr (a value read from a file never drives the terminal)."""
    text = text or ""
    return text if text.isprintable() else repr(text)


def _base_ties(model: ModelFacts) -> tuple[bool | None, str]:
    base = model.base
    if base is None or base.config is None or not base.config.ok or base.family is None:
        return None, "the base's config.json was not read"
    cfg = base.config.data
    node: Any = cfg
    for k in base.family.text_path:
        node = node.get(k) if isinstance(node, Mapping) else None
    tied, key = ties_embeddings(cfg, node if isinstance(node, Mapping) else {}, ".".join((*base.family.text_path, "")))
    return tied, (f"the base's {key} is {str(tied).lower()}" if key else "the base ties them by default")


def _tied_copies(model: ModelFacts, ad: AdapterFacts, env: Environment) -> Iterator[Finding]:
    saved = sorted({m.rsplit(".", 1)[-1] for m in ad.modules_to_save} & TIED_MODULES)
    if saved:
        stack = env.libraries
        vllm = stack.get("vllm")
        yield Finding(
            "GD752", Severity.WARNING if not vllm.absent else Severity.INFO,
            f"modules_to_save saves full copies of {', '.join(saved)}: vLLM refuses such an adapter (\"vLLM only "
            "supports modules_to_save being None\", vllm #9280)" + (f"; {vllm.describe()} will serve it" if not vllm.absent else ""),
            file="adapter_config.json", key="modules_to_save",
            fix="merge the adapter (merge_and_unload + save_pretrained) and serve the merged model, or retrain without "
                "modules_to_save")
    if not saved or ad.ensure_weight_tying is True:
        return
    tied, why = _base_ties(model)
    if tied is False:
        return
    merge, reload = env.libraries.exposure(MERGE_KEEPS_TIE), env.libraries.exposure(RELOAD_TIES)
    if Exposure.SAFE in (merge, reload):  # PEFT >= 0.19 unties the merged config; transformers 5.x loads the head
        return
    sev = Severity.ERROR if merge is reload is Exposure.AFFECTED else Severity.WARNING
    peft = env.libraries.get("peft")
    yield Finding(
        "GD751", sev,
        f"modules_to_save trains {' and '.join(saved)} as copies apart from the tied pair ({why}) without "
        f"ensure_weight_tying: merging it with PEFT < 0.19 saves a head that config.json still ties, and transformers 4.x "
        f"discards it when it loads the merged model ({peft.describe()} will merge, "
        f"{env.libraries.get('transformers').describe()} will load)",
        file="adapter_config.json", key="modules_to_save",
        fix="merge with PEFT >= 0.19 (it sets tie_word_embeddings=false), or set \"tie_word_embeddings\": false in the "
            "merged config.json; to keep the pair tied, retrain with LoraConfig(ensure_weight_tying=True)",
        details={"modules": saved, "peft_version": ad.peft_version})


def _layout(ad: AdapterFacts, env: Environment) -> Iterator[Finding]:
    if ad.layout == LAYOUT_OLD:
        yield from _old_layout(ad, env)
    if ad.layout != LAYOUT_NEW:
        return
    exposure = env.libraries.exposure(NEW_LAYOUT_UNREAD)
    if exposure is Exposure.SAFE:
        return
    tf = env.libraries.get("transformers")
    yield Finding(
        "GD760", Severity.ERROR if exposure is Exposure.AFFECTED else Severity.WARNING,
        f"the adapter's keys use transformers >= 4.52's layout (base_model.model.{LAYOUT_NEW}.layers...) and "
        f"{tf.describe()} names those modules {LAYOUT_OLD}.layers: the LoRA weights are not loaded (\"missing adapter "
        "keys\"), the base model runs unchanged (transformers #38927)",
        file=ad.weights_file, key=None,
        fix="load it with transformers >= 4.52 (the release the adapter was trained with), or rename the keys "
            f"{LAYOUT_NEW}. -> {LAYOUT_OLD}. in adapter_model.safetensors")


def _old_layout(ad: AdapterFacts, env: Environment) -> Iterator[Finding]:
    tf, peft = env.libraries.exposure(OLD_LAYOUT_TRANSFORMERS), env.libraries.exposure(OLD_LAYOUT_PEFT)
    if Exposure.SAFE in (tf, peft):
        return
    yield Finding(
        "GD761", Severity.ERROR if tf is peft is Exposure.AFFECTED else Severity.WARNING,
        f"the adapter's keys use the layout of transformers < 4.52 (base_model.model.{LAYOUT_OLD}.layers...): "
        f"{env.libraries.get('transformers').describe()} names those modules {LAYOUT_NEW}.layers and "
        f"{env.libraries.get('peft').describe()} does not map the old keys (PEFT 0.16.0 does, PR #2574), so the LoRA "
        "weights are not loaded and the base runs unchanged", file=ad.weights_file, key=None,
        fix="pip install \"peft>=0.16.0\" on the machine that loads it")

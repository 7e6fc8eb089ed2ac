"""Serving what was trained in vLLM (GD772-GD775): LoRA support per Gemma architecture, the adapter modules vLLM's
LoRA loader accepts, and a model folder whose architecture and weight keys disagree. Pure.

vLLM is not installed here and needs a GPU, so every window is read from the released sources (the PyPI sdists of
vLLM 0.8.0 to 0.33.0, docs/findings.md#gd772-vllm-gemma4-lora-unsupported lists the files and lines read).
"""

from __future__ import annotations

import re
from typing import Iterator, Mapping

from gemma_doctor.facts import Environment, ModelFacts
from gemma_doctor.readers.adapter import AdapterFacts
from gemma_doctor.report import Finding, Severity
from gemma_doctor.stack import Exposure, Package, Window
from gemma_doctor.traits import architecture, language_model_keys

# The newest vLLM release whose source was read; a later one may have changed what the windows below say.
NEWEST_READ = "0.33.0"
# Gemma4ForConditionalGeneration (vllm/model_executor/models/gemma4_mm.py) declares SupportsLoRA from 0.20.0; 0.19.0
# and 0.19.1 serve it without, and the LoRA runner raises "... does not support LoRA yet"
# (vllm/v1/worker/lora_model_runner_mixin.py). Gemma4ForCausalLM (gemma4.py) has it in 0.19.0, its first release.
GEMMA4_LORA = Window("vllm", "<0.20.0", "0.20.0")
# Gemma3nForConditionalGeneration (gemma3n_mm.py) and Gemma3nForCausalLM (gemma3n.py) declare no SupportsLoRA in any
# release read (0.9.2, the first with Gemma 3n, to 0.33.0; 0.15.0 and 0.15.1 have no sdist).
GEMMA3N_LORA = Window("vllm", f"<={NEWEST_READ}")
# vLLM runs Gemma 4's towers as transformers modules (AutoModel.from_config in gemma4_mm.py), and its LoRA loader
# accepts a module only when its last name is one vLLM has a LoRA layer for (lora_model.py check_unexpected_modules):
# every release that serves Gemma 4 LoRA (0.20.0-0.33.0) rejects keys in the towers.
TOWER_KEYS = Window("vllm", f"<={NEWEST_READ}")
# Gemma3ForCausalLM.load_weights (gemma3.py) maps no `language_model.` prefix in any release read (0.8.0-0.33.0):
# AutoWeightsLoader (utils.py) raises "There is no module or parameter named 'language_model'".
CAUSAL_PREFIX = Window("vllm", f"<={NEWEST_READ}")

# The module names vLLM's Gemma 4 exposes to LoRA in 0.20.0-0.33.0: the last name of every LinearBase / FusedMoE
# module of Gemma4ForConditionalGeneration (lora/utils.py get_supported_lora_modules), with qkv_proj and gate_up_proj
# replaced by what they pack (lora/worker_manager.py _load_adapter). The towers hold plain torch Linear modules.
GEMMA4_LORA_MODULES = frozenset({
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "per_layer_input_gate",
    "per_layer_projection", "per_layer_model_projection", "embedding_projection", "proj", "experts"})
TOWERS = ("vision_tower", "audio_tower")
_LORA_KEY = re.compile(r"\.lora_(?:A|B)(?:\.[^.]+)?\.weight$|\.lora_embedding_(?:A|B)(?:\.[^.]+)?$")
GEMMA4_MM, GEMMA3N = "Gemma4ForConditionalGeneration", ("Gemma3nForConditionalGeneration", "Gemma3nForCausalLM")


def _vllm(env: Environment, window: Window) -> tuple[Package, Exposure | None, Severity]:
    """The vLLM that will serve, where it falls in ``window`` (None: not named), and the severity that follows: error
    inside it, warning otherwise (for the windows that end at the newest release read, a later release is not known to
    be safe), information when vLLM is not named."""
    pkg = env.libraries.get("vllm")
    if pkg.absent:
        return pkg, None, Severity.INFO
    exposure = env.libraries.exposure(window)
    return pkg, exposure, Severity.ERROR if exposure is Exposure.AFFECTED else Severity.WARNING


def _named(pkg: Package, exposure: Exposure | None) -> str:
    """Where the named vLLM stands against a window that no release read has closed."""
    if exposure is Exposure.AFFECTED:
        return f"; {pkg.describe()} is one of them"
    if exposure is Exposure.SAFE:
        return f"; {pkg.describe()} is newer than the releases read"
    if exposure is Exposure.UNKNOWN:
        return f"; {pkg.describe()} may be one of them"
    return ""


def adapter(model: ModelFacts, ad: AdapterFacts, env: Environment) -> Iterator[Finding]:
    """GD772-GD774 for a LoRA adapter whose base is known."""
    base = model.base
    if base is None or base.family is None or base.config is None or not base.config.ok:
        return
    if (ad.peft_type or "LORA").upper() != "LORA":
        return  # vLLM serves LoRA adapters only; other PEFT types fail before any of this
    arch = architecture(base.config.data, base.family.model_type)
    if arch == GEMMA4_MM:
        yield from _gemma4(ad, env)
    elif arch in GEMMA3N:
        pkg, exposure, sev = _vllm(env, GEMMA3N_LORA)
        yield Finding(
            "GD773", sev,
            f"the base is {arch}, and vLLM cannot serve a LoRA adapter on Gemma 3n: no release from 0.9.2 to "
            f"{NEWEST_READ} declares LoRA support for it (\"{arch} does not support LoRA yet\"){_named(pkg, exposure)}",
            file="adapter_config.json", key="base_model_name_or_path",
            fix="merge the adapter (merge_and_unload + save_pretrained) and serve the merged model, or serve the "
                "adapter with transformers + PEFT")


def _gemma4(ad: AdapterFacts, env: Environment) -> Iterator[Finding]:
    pkg, exposure, sev = _vllm(env, GEMMA4_LORA)
    if exposure is not Exposure.SAFE:
        said = (f"{pkg.describe()} has no LoRA support for it" if exposure is Exposure.AFFECTED else
                f"{pkg.describe()} may predate it" if exposure is Exposure.UNKNOWN else
                "serving it needs vLLM 0.20.0 or later")
        yield Finding(
            "GD772", sev,
            f"the base is {GEMMA4_MM}, which vLLM serves with LoRA from 0.20.0 on; 0.19.x raises \"{GEMMA4_MM} does "
            f"not support LoRA yet\" (vllm #40693, #39246; PR #39291): {said}",
            file="adapter_config.json", key="base_model_name_or_path",
            fix="pip install \"vllm>=0.20.0\" on the serving machine, or merge the adapter and serve the merged model")
    tower = tower_modules(ad)
    if not tower:
        return
    pkg, exposure, sev = _vllm(env, TOWER_KEYS)
    shown = ", ".join(tower[:2]) + (f" and {len(tower) - 2} more" if len(tower) > 2 else "")
    yield Finding(
        "GD774", sev,
        f"the adapter trains {len(tower)} module(s) in the vision/audio towers ({shown}); vLLM runs Gemma 4's "
        "towers without LoRA and its loader rejects the adapter: \"expected target modules in {...} but received "
        f"[...]\" (vllm #41702; every release from 0.20.0 to {NEWEST_READ}{_named(pkg, exposure)})",
        file=ad.weights_file, key=None,
        fix="retrain with language-model-only targets (target_modules=r\".*language_model.*\\.(q_proj|k_proj|v_proj|"
            "o_proj|gate_proj|up_proj|down_proj)\", see GD441), or merge the adapter and serve the merged model",
        details={"modules": tower[:20], "count": len(tower)})


def tower_modules(ad: AdapterFacts) -> list[str]:
    """The adapter's LoRA modules inside a tower whose last name vLLM's Gemma 4 has no LoRA layer for."""
    if ad.header is None:
        return []
    out: set[str] = set()
    for t in ad.header.tensors:
        m = _LORA_KEY.search(t.name)
        if m is None:
            continue
        module = t.name[:m.start()].removeprefix("base_model.model.")
        parts = module.split(".")
        if any(p in TOWERS for p in parts) and parts[-1] not in GEMMA4_LORA_MODULES and "base_layer" not in parts:
            out.add(module)
    return sorted(out)


def model_folder(model: ModelFacts, env: Environment) -> Iterator[Finding]:
    """GD775: config.json names Gemma3ForCausalLM while the weights keep the multimodal class's keys."""
    if architecture(model.config.data, None) != "Gemma3ForCausalLM":
        return
    keys = language_model_keys(model)
    if not keys:
        return
    pkg, exposure, sev = _vllm(env, CAUSAL_PREFIX)
    prefix = keys[0].split(".language_model.")[0] + ".language_model" if keys[0].startswith("model.") \
        else "language_model"
    cfg = model.config.data
    if cfg.get("model_type") == "gemma3" and isinstance(cfg.get("vision_config"), Mapping):
        fix = ("set \"architectures\": [\"Gemma3ForConditionalGeneration\"] in config.json: the config and the "
               "weights are that class's, which vLLM loads in both key layouts")
    else:
        fix = ("rename the weight keys to Gemma3ForCausalLM's layout (language_model.model.layers... or "
               "model.language_model.layers... -> model.layers...), or set architectures to the class that saved them")
    yield Finding(
        "GD775", sev,
        f"config.json names Gemma3ForCausalLM but {len(keys)} weight(s) sit under {prefix}., "
        "the keys of Gemma3ForConditionalGeneration: vLLM builds Gemma3ForCausalLM from architectures and stops "
        f"with \"There is no module or parameter named '{prefix}' in Gemma3ForCausalLM\" (vllm #15031; every release "
        f"from 0.8.0 to {NEWEST_READ}{_named(pkg, exposure)}); transformers 5.23 builds that class with "
        "its layers missing (random weights)",
        file="config.json", key="architectures",
        fix=fix,
        details={"keys": len(keys), "prefix": prefix})

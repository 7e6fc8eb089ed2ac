"""A stand-in twin behind build_twin's contract (gemma_doctor/rehearse/twin.py), used only while twin.py has not
landed on this branch: the target's config with every size cut to tiny_family-like figures (hidden 64, one period of
the layer pattern, towers of one layer), the real vocabulary, random weights saved in the checkpoint's dtype by the
installed transformers, laid out as a hub cache under the target's repo id. Runs in the rehearsal's child only."""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Sizes of a twin's text model; the vocabulary, the layer pattern's kinds and the flags stay the target's.
TEXT = dict(hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
            max_position_embeddings=512)
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
              patch_size=14)
# Tokenizer files copied from the target when it has them (the real template and special tokens).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "chat_template.jinja", "chat_template.json", "processor_config.json", "preprocessor_config.json")
GEMMA_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{% set role = 'model' if message['role'] == 'assistant' "
                  "else message['role'] %}<start_of_turn>{{ role }}\n{{ message['content'] | trim }}<end_of_turn>\n"
                  "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


@dataclass(frozen=True)
class Twin:
    """A twin laid out in a hub cache (the contract of twin.py)."""

    repo_id: str
    cache_dir: Path
    snapshot: Path
    revision: str
    commit: str
    config: dict
    shrunk: dict


def _period(layer_types: list[str]) -> int:
    """The length of the shortest prefix whose repetition gives ``layer_types``."""
    for n in range(1, len(layer_types) + 1):
        if all(layer_types[i] == layer_types[i % n] for i in range(len(layer_types))):
            return n
    return len(layer_types)


def _shrink_text(text: dict[str, Any], shrunk: dict[str, Any], where: str) -> None:
    for key, value in TEXT.items():
        if key in text or key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                                  "head_dim"):
            shrunk[f"{where}{key}"] = (text.get(key), value)
            text[key] = value
    layers = int(text.get("num_hidden_layers") or 2)
    types = text.get("layer_types")
    pattern = int(text.get("sliding_window_pattern") or 0)
    keep = _period(types) if isinstance(types, list) and types else (pattern or 2)
    keep = max(2, min(layers, keep))
    shared = int(text.get("num_kv_shared_layers") or 0)
    if shared:
        # KV-shared layers reuse the cache of an earlier layer of their kind: one period that produces, one that shares.
        period = keep
        keep = min(layers, 2 * period)
    shrunk[f"{where}num_hidden_layers"] = (layers, keep)
    text["num_hidden_layers"] = keep
    if isinstance(types, list) and types:
        text["layer_types"] = (types * 2)[:keep]
    if text.get("sliding_window"):
        text["sliding_window"] = min(int(text["sliding_window"]), 16)
    for key in ("global_head_dim",):
        if key in text:
            text[key] = 64
    if shared:
        text["num_kv_shared_layers"] = min(shared, keep - period)
    if text.get("hidden_size_per_layer_input"):
        text["hidden_size_per_layer_input"] = 8
    if text.get("num_experts"):
        text.update(num_experts=2, top_k_experts=1, moe_intermediate_size=32)


def shrink(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The twin's config.json and what was reduced."""
    out = copy.deepcopy(config)
    shrunk: dict[str, Any] = {}
    if isinstance(out.get("text_config"), dict):
        _shrink_text(out["text_config"], shrunk, "text_config.")
    else:
        _shrink_text(out, shrunk, "")
    if isinstance(out.get("vision_config"), dict):
        vision = out["vision_config"]
        if vision.get("model_type") == "siglip_vision_model":
            vision.update(VISION)
            out["mm_tokens_per_image"] = 4
        else:
            vision.update(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                          num_key_value_heads=2, head_dim=16)
        shrunk["vision_config"] = "one layer, hidden 32"
    if isinstance(out.get("audio_config"), dict):
        out["audio_config"].update(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, output_proj_dims=32)
        shrunk["audio_config"] = "one layer, hidden 32"
    return out, shrunk


def _tokenizer(text_config: dict[str, Any], folder: Path) -> None:
    """A character-level Gemma-style tokenizer with Gemma 3's special ids, for targets that ship none."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = {0: "<pad>", 1: "<eos>", 2: "<bos>", 3: "<unk>", 105: "<start_of_turn>", 106: "<end_of_turn>"}
    vocab = {specials.get(i, f"<unused{i}>"): i for i in range(107)}
    for ch in [chr(c) for c in range(32, 127)] + ["\n", "\t"]:
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), "isolated")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                                   unk_token="<unk>", additional_special_tokens=["<start_of_turn>", "<end_of_turn>"])
    fast.chat_template = GEMMA_TEMPLATE
    fast.save_pretrained(folder)


def build_twin(model_dir: Path, repo_id: str, cache_dir: Path, *, revision: str = "main",
               adapter_dir: Path | None = None, seed: int = 0) -> Twin:
    """Build the stand-in twin of the checkpoint in ``model_dir`` into the hub cache ``cache_dir``."""
    import torch
    import transformers

    config = json.loads((Path(model_dir) / "config.json").read_text())
    twin_config, shrunk = shrink(config)
    arch = (twin_config.get("architectures") or [None])[0]
    cls = getattr(transformers, arch, None) if arch else None
    if cls is None:
        raise RuntimeError(f"transformers {transformers.__version__} has no class {arch}")
    cfg = transformers.AutoConfig.for_model(**twin_config)
    dtype = getattr(torch, str(config.get("dtype") or config.get("torch_dtype") or "bfloat16"))
    torch.manual_seed(seed)
    model = cls(cfg).to(dtype)
    commit = hashlib.sha1(json.dumps(twin_config, sort_keys=True).encode() + str(seed).encode()).hexdigest()
    repo = Path(cache_dir) / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    model.save_pretrained(snapshot)
    for name in ("generation_config.json", *TOKENIZER_FILES):
        src = Path(model_dir) / name
        if src.is_file():
            shutil.copyfile(src, snapshot / name)
    if not (snapshot / "tokenizer_config.json").exists():
        _tokenizer(twin_config.get("text_config", twin_config), snapshot)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / revision).write_text(commit)
    saved = json.loads((snapshot / "config.json").read_text())
    return Twin(repo_id, Path(cache_dir), snapshot, revision, commit, saved, shrunk)

"""The twin: a shrunken random model of a target checkpoint, laid out as a hub cache under the target's repo id.

Built from the target's own config.json (every size reduced, the layer pattern, towers, tie flags, softcaps, RoPE and
the real vocabulary kept), its tokenizer, chat template, processor and generation files (copied as they are), and
its safetensors headers (each tensor saved in the checkpoint's own dtype and under the checkpoint's own key name, so
that loading follows the real path: key renames, casts and ties). Code that loads ``google/gemma-3-12b-it`` with
``HF_HUB_CACHE`` set to the twin's cache and ``HF_HUB_OFFLINE=1`` loads the twin.

torch and transformers are imported only inside :func:`build_twin`: this module is never on ``check``'s start-up path.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from gemma_doctor import family, fsafe
from gemma_doctor.errors import DoctorError
from gemma_doctor.readers.jsonfile import read_json_file
from gemma_doctor.readers.safetensors_header import read_header

# Files copied from the target as they are (the tokenizer, chat template, processor and generation settings).
COPIED = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
          "chat_template.jinja", "chat_template.json", "processor_config.json", "preprocessor_config.json",
          "video_preprocessor_config.json", "generation_config.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")
MAX_COPIED_BYTES = 64 * 1024 * 1024  # Gemma 3's tokenizer.json is 33 MB
# Sizes the twin keeps from the original, bounded so a hostile config cannot make the build allocate without end.
MAX_VOCAB = 4 * 1024 * 1024
MAX_LAYERS = 10_000
MAX_PATCHES = 65_536
MAX_TWIN_PARAMETERS = 400_000_000
HEX40 = re.compile(r"^[0-9a-f]{40}$")
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf", ".model")

# Sizes of the twin. Text: hidden 64, 4 query heads of 16; towers: hidden 32, 2 heads.
TEXT = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "head_dim": 16}
TOWER = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2, "head_dim": 16}
TEXT_KEYS = ("text_config", "encoder", "decoder")
VISION_KEYS = ("vision_config",)
AUDIO_KEYS = ("audio_config",)

# Gemma's special tokens (every Gemma tokenizer since Gemma 1 has them at these ids).
SPECIALS = {0: "<pad>", 1: "<eos>", 2: "<bos>", 3: "<unk>", 4: "<mask>", 105: "<start_of_turn>", 106: "<end_of_turn>"}
# The multimodal tokens, named by the config key that holds their id.
MM_TOKENS = {"boi_token_index": "<start_of_image>", "boi_token_id": "<start_of_image>",
             "eoi_token_index": "<end_of_image>", "eoi_token_id": "<end_of_image>",
             "image_token_index": "<image_soft_token>", "image_token_id": "<image_soft_token>",
             "boa_token_id": "<start_of_audio>", "eoa_token_index": "<end_of_audio>", "eoa_token_id": "<end_of_audio>",
             "audio_token_id": "<audio_soft_token>", "video_token_id": "<video_soft_token>"}
# Gemma's chat template (the Gemma 3 one, without the image branches): turns as <start_of_turn>role ... <end_of_turn>.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set first = messages[0]['content'] + '\n\n' %}"
    "{% set loop_messages = messages[1:] %}{% else %}{% set first = '' %}{% set loop_messages = messages %}{% endif %}"
    "{% for message in loop_messages %}{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + (first if loop.first else '') }}"
    "{% if message['content'] is string %}{{ message['content'] | trim }}{% else %}"
    "{% for item in message['content'] %}{% if item['type'] == 'text' %}{{ item['text'] | trim }}{% endif %}"
    "{% endfor %}{% endif %}{{ '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")
_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64", "float32": "float32",
           "float16": "float16", "bfloat16": "bfloat16", "float64": "float64", "fp32": "float32", "fp16": "float16",
           "bf16": "bfloat16", "half": "float16", "float": "float32"}


class TwinError(DoctorError):
    """The target cannot have a twin; ``str()`` is the one-line reason."""


@dataclass(frozen=True)
class Twin:
    """A built twin: where its hub cache is, the snapshot and commit it answers with, and what was reduced."""

    repo_id: str
    cache_dir: Path
    snapshot: Path
    revision: str
    commit: str
    config: dict  # the twin's config.json
    shrunk: dict  # what was reduced: {"text_config.num_hidden_layers": (48, 6), ...}
    notes: tuple[str, ...] = ()  # what the twin could not keep or had to make up (a synthetic tokenizer, ...)
    adapter: Path | None = None  # the adapter twin's folder (a snapshot of the adapter's repo id, when it had one)
    architecture: str = ""  # the class built
    layout: str = "installed"  # "checkpoint": keys named as the original's headers; "installed": as transformers saves
    parameters: int = 0
    files: dict = field(default_factory=dict)  # file name -> size in bytes


# --- reading the target ---------------------------------------------------------------------------------------------

def _cache_root(model_dir: Path) -> Path:
    """The folder links of ``model_dir`` may lead into: the whole cache for a hub snapshot, else the folder itself."""
    if model_dir.parent.name == "snapshots" and model_dir.parent.parent.name.startswith(("models--", "datasets--")):
        return model_dir.parent.parent.parent
    return model_dir


def _read_json(path: Path, area: fsafe.Area, *, required: bool) -> dict | None:
    got = read_json_file(path, area=area)
    if not got.exists:
        if required:
            raise TwinError(f"{path.name} missing in {path.parent}: a twin is built from the target's own config")
        return None
    if got.escapes:
        raise TwinError(f"{path} is a link out of the cache ({got.link_target}); not read")
    if got.error is not None or not isinstance(got.data, dict):
        raise TwinError(f"{path} cannot be used: {got.error or 'not a JSON object'}")
    return got.data


def _read_bytes(path: Path, area: fsafe.Area) -> bytes | None:
    got = fsafe.read_file(path, MAX_COPIED_BYTES, area)
    if not got.exists:
        return None
    if got.escapes:
        raise TwinError(f"{path} is a link out of the cache ({got.link_target}); not read")
    if got.error is not None or got.data is None:
        raise TwinError(f"{path} cannot be read: {got.error}")
    if len(got.data) > MAX_COPIED_BYTES:
        raise TwinError(f"{path} is larger than {MAX_COPIED_BYTES >> 20} MiB; not a tokenizer or config file")
    return got.data


def _headers(model_dir: Path, area: fsafe.Area) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Every tensor of the checkpoint: name -> (safetensors dtype, shape); {} when it has no safetensors."""
    index = _read_json(model_dir / "model.safetensors.index.json", area, required=False)
    if index is not None:
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise TwinError(f"{model_dir / 'model.safetensors.index.json'} has no weight_map of file names")
        shards = sorted(set(weight_map.values()))
    else:
        shards = ["model.safetensors"] if fsafe.read_file(model_dir / "model.safetensors", 0, area).exists else []
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for shard in shards:
        if "/" in shard or "\\" in shard or shard in ("", ".", ".."):
            raise TwinError(f"the weight map names {shard!r}, not a file of the snapshot")
        header = read_header(model_dir / shard, area=area)
        if not header.ok:
            raise TwinError(f"{model_dir / shard}: {header.error}")
        for t in header.tensors:
            out[t.name] = (t.dtype, t.shape)
    return out


# --- shrinking the config -------------------------------------------------------------------------------------------

def _int(value: Any, where: str, limit: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TwinError(f"{where} is {value!r}, not a count")
    if value > limit:
        raise TwinError(f"{where} is {value:,}, beyond any Gemma checkpoint (at most {limit:,})")
    return value


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _period(types: list[Any]) -> int:
    """The shortest p with types[i] == types[i % p] for every i (the layer pattern's period)."""
    for p in range(1, len(types) + 1):
        if all(types[i] == types[i % p] for i in range(len(types))):
            return p
    return len(types)


def _config_class(model_type: str) -> Any:
    from transformers import CONFIG_MAPPING

    try:
        return CONFIG_MAPPING[model_type]
    except KeyError:
        import transformers

        raise TwinError(f"the installed transformers {transformers.__version__} does not know model_type "
                        f"{model_type!r}; a twin is built with the library that will train") from None


def _as_read(section: Mapping[str, Any], model_type: str | None) -> Any:
    """The section as the installed transformers reads it (its defaults filled in), or None when it refuses it."""
    if model_type is None:
        return None
    cls = _config_class(model_type)
    try:
        return cls(**{k: v for k, v in section.items() if k != "model_type"})
    except Exception:  # noqa: BLE001 - a config the library refuses has no defaults to read; the build will say why
        return None


def _attr(read: Any, name: str) -> Any:
    """An attribute of a library config, None where it has none or refuses to answer (Gemma 4's per-layer ones)."""
    try:
        return getattr(read, name, None)
    except Exception:  # noqa: BLE001 - AmbiguousGlobalPerLayerAttributeError and the like
        return None


def _layer_types(section: Mapping[str, Any], read: Any) -> list[Any] | None:
    """The text model's layer pattern: the section's own list, else the one the library derives from it."""
    for key in ("layer_types", "block_types"):
        if isinstance(section.get(key), list):
            return list(section[key])
    types = _attr(read, "layer_types") or _attr(read, "block_types")
    return list(types) if types else None


class _Shrinker:
    """Reduces every size of a config dict in place and records each change."""

    def __init__(self) -> None:
        self.shrunk: dict[str, tuple[Any, Any]] = {}

    read: Any = None  # the section being shrunk as the library reads it: the defaults of the keys it leaves out

    def old(self, section: Mapping[str, Any], key: str) -> Any:
        """The section's value of ``key``, else the class default the library would use."""
        return section[key] if key in section else _attr(self.read, key)

    def set(self, section: dict, key: str, new: Any, where: str) -> None:
        """Set ``key`` to ``new`` (written out even where the section left it to a default), never growing a size."""
        old = self.old(section, key)
        if _count(old) and _count(new) and new > old:
            return  # a twin never grows a size (a target smaller than the twin's sizes keeps its own)
        if old is not None and old != new:
            section[key] = new
            self.shrunk[f"{where}{key}"] = (old, new)

    def put(self, section: dict, key: str, old: Any, new: Any, where: str) -> None:
        """Set ``key`` even where the section left it to the class default ``old``."""
        if old != new and not (_count(old) and _count(new) and new > old):
            section[key] = new
            self.shrunk[f"{where}{key}"] = (old, new)

    def per_layer(self, section: dict, where: str, heads: int, new_heads: int, target: Mapping[str, int]) -> None:
        """Gemma 4 as re-saved by transformers 5.23: per-layer overrides ({"3": {"head_dim": 512}}) scaled like the
        globals they override, and kept for the twin's layers only."""
        overrides = section.get("per_layer_config")
        if not isinstance(overrides, dict):
            return
        layers = section.get("num_hidden_layers")
        base_head = section.get("head_dim") if _count(section.get("head_dim")) else None
        base_inter = section.get("intermediate_size") if _count(section.get("intermediate_size")) else None
        out: dict[str, Any] = {}
        for index, values in overrides.items():
            if not isinstance(values, dict) or not str(index).isdigit():
                out[index] = values
                continue
            new: dict[str, Any] = {}
            for key, v in values.items():
                if key in ("head_dim", "global_head_dim") and _count(v) and base_head:
                    v = min(v, target["head_dim"] * max(1, v // base_head))
                elif key == "intermediate_size" and _count(v) and base_inter:
                    v = min(v, TEXT["intermediate_size"] * max(1, v // base_inter))
                elif key in ("num_key_value_heads", "num_attention_heads") and _count(v) and heads:
                    v = max(1, new_heads * v // heads)
                new[key] = v
            out[index] = new
        self.pending_per_layer = (section, where, out, layers)

    pending_per_layer: tuple | None = None

    def heads(self, section: dict, where: str, target: Mapping[str, int], read: Any = None) -> None:
        heads = self.old(section, "num_attention_heads")
        if heads is None:
            return
        heads = _int(heads, f"{where}num_attention_heads", 100_000) or 1
        new_heads = min(heads, target["num_attention_heads"])
        kv = self.old(section, "num_key_value_heads")
        self.set(section, "num_attention_heads", new_heads, where)
        self.per_layer(section, where, heads, new_heads, target)
        if kv is not None:
            kv = _int(kv, f"{where}num_key_value_heads", 100_000) or 1
            # keep the grouping: MHA stays MHA, MQA stays MQA, GQA keeps a group of several query heads per KV head
            self.set(section, "num_key_value_heads", max(1, new_heads * kv // heads), where)
        for key in ("num_global_key_value_heads",):
            if _count(self.old(section, key)):
                self.set(section, key, max(1, new_heads * self.old(section, key) // heads), where)
        # A text config without head_dim gets the class default (256 for Gemma), not hidden / heads: say it outright
        old_head_dim = self.old(section, "head_dim")
        if isinstance(old_head_dim, int) and old_head_dim > 0:
            new_head_dim = target["head_dim"]
            self.put(section, "head_dim", old_head_dim, new_head_dim, where)
            # Gemma 4's global layers have wider heads (512 vs 256): keep the ratio
            old_global = self.old(section, "global_head_dim")
            if isinstance(old_global, int) and old_global > 0:
                self.put(section, "global_head_dim", old_global, new_head_dim * max(1, old_global // old_head_dim),
                         where)
            if self.old(section, "query_pre_attn_scalar") == old_head_dim:
                self.set(section, "query_pre_attn_scalar", new_head_dim, where)
        elif _count(self.old(section, "query_pre_attn_scalar")):
            self.set(section, "query_pre_attn_scalar", target["hidden_size"] // new_heads, where)

    def text(self, section: dict, where: str, model_type: str | None) -> None:
        """A text model's section: sizes down, layers to whole periods of the pattern, vocabulary kept."""
        if "vocab_size" in section:
            _int(section["vocab_size"], f"{where}vocab_size", MAX_VOCAB)
        if "vocab_size_per_layer_input" in section and section["vocab_size_per_layer_input"] is not None:
            _int(section["vocab_size_per_layer_input"], f"{where}vocab_size_per_layer_input", MAX_VOCAB)
        # bounded before the library sees them: it builds per-layer lists from these counts
        if section.get("num_hidden_layers") is not None:
            _int(section["num_hidden_layers"], f"{where}num_hidden_layers", MAX_LAYERS)
        read = self.read = _as_read(section, model_type)
        old_hidden = self.old(section, "hidden_size")
        self.set(section, "hidden_size", TEXT["hidden_size"], where)
        self.heads(section, where, TEXT, read)
        layers = self.old(section, "num_hidden_layers")
        n = None
        if layers is not None:
            layers = _int(layers, f"{where}num_hidden_layers", MAX_LAYERS)
            types = _layer_types(section, read)
            period = _period(types[:layers]) if types else 1
            shared = self.old(section, "num_kv_shared_layers") or 0
            shared = _int(shared, f"{where}num_kv_shared_layers", layers)
            if shared and shared >= layers:
                # a drafter (Gemma 4 assistants) shares every layer with the model it drafts for
                n = min(layers, max(period, 2))
                self.set(section, "num_kv_shared_layers", n, where)
            elif shared:
                # one period computes KV, one period reuses it: every layer type keeps a producer and a sharer
                n = min(layers, 2 * period)
                self.set(section, "num_kv_shared_layers", min(shared, period), where)
            else:
                n = min(layers, max(period, 2))
            self.set(section, "num_hidden_layers", n, where)
            if self.pending_per_layer is not None and self.pending_per_layer[0] is section:
                _, _, out, _ = self.pending_per_layer
                kept = {k: v for k, v in out.items() if not str(k).isdigit() or int(k) < n}
                if kept != section["per_layer_config"]:
                    self.put(section, "per_layer_config", section["per_layer_config"], kept, where)
                self.pending_per_layer = None
            for key in ("layer_types", "block_types", "activation_sparsity_pattern"):
                if isinstance(section.get(key), list) and len(section[key]) > n:
                    self.set(section, key, section[key][:n], where)
        inter = self.old(section, "intermediate_size")
        if isinstance(inter, list):
            self.set(section, "intermediate_size", [TEXT["intermediate_size"]] * (n or len(inter)), where)
        elif inter is not None:
            self.set(section, "intermediate_size", TEXT["intermediate_size"], where)
        if self.old(section, "enable_moe_block") or self.old(section, "num_experts"):
            experts = _int(self.old(section, "num_experts") or 0, f"{where}num_experts", 100_000)
            self.set(section, "num_experts", min(experts, 4), where)
            if self.old(section, "top_k_experts") is not None:
                self.set(section, "top_k_experts", min(_int(self.old(section, "top_k_experts"), f"{where}top_k_experts",
                                                             experts), 2), where)
            if self.old(section, "moe_intermediate_size") is not None:
                self.set(section, "moe_intermediate_size", 32, where)
        for key, value in (("hidden_size_per_layer_input", 8), ("laurel_rank", 4), ("lru_width", TEXT["hidden_size"]),
                           ("embedding_dim", 32), ("moe_intermediate_size", 32)):
            if isinstance(self.old(section, key), int) and self.old(section, key) > 0:
                self.set(section, key, value, where)
        if isinstance(old_hidden, int) and isinstance(self.old(section, "projection_dim"), int):
            self.set(section, "projection_dim", TEXT["hidden_size"], where)

    def tower(self, section: dict, where: str) -> None:
        """A vision or audio tower: sizes down, one or two layers, the input geometry (image size, patch) kept."""
        for key in ("num_hidden_layers", "conf_num_hidden_layers"):
            if section.get(key) is not None:
                _int(section[key], f"{where}{key}", MAX_LAYERS)
        tower_type = section.get("model_type")
        self.read = _as_read(section, tower_type) if isinstance(tower_type, str) else None
        self.set(section, "hidden_size", TOWER["hidden_size"], where)
        self.heads(section, where, TOWER)
        for key in ("num_hidden_layers", "conf_num_hidden_layers"):
            if self.old(section, key) is not None:
                self.set(section, key, min(_int(self.old(section, key), f"{where}{key}", MAX_LAYERS), 2), where)
        if self.old(section, "conf_num_attention_heads") is not None:
            self.set(section, "conf_num_attention_heads", TOWER["num_attention_heads"], where)
        if self.old(section, "intermediate_size") is not None:
            self.set(section, "intermediate_size", TOWER["intermediate_size"], where)
        for key in ("subsampling_conv_channels", "sscp_conv_channel_size"):
            if isinstance(self.old(section, key), list):
                self.set(section, key, [8, 4][: len(self.old(section, key))], where)
        for key in ("output_proj_dims", "mm_embed_dim", "audio_embed_dim", "projection_dim"):
            if isinstance(self.old(section, key), int):
                self.set(section, key, TOWER["hidden_size"], where)
        if isinstance(self.old(section, "mm_posemb_size"), int):
            self.set(section, "mm_posemb_size", 16, where)
        image, patch = self.old(section, "image_size"), self.old(section, "patch_size")
        if isinstance(image, int) and isinstance(patch, int) and patch > 0 and (image // patch) ** 2 > MAX_PATCHES:
            raise TwinError(f"{where}image_size {image} / patch_size {patch} gives {(image // patch) ** 2:,} patches")


def shrink_config(config: dict) -> tuple[dict, dict]:
    """(the twin's config.json, what was reduced): every size down, pattern, towers, vocabulary and flags kept."""
    twin = json.loads(json.dumps(config))
    s = _Shrinker()
    root_type = twin.get("model_type")
    member = family.member(root_type)
    if member is not None and len(member.text_path) == 1 and member.text_path[0] not in twin:
        # a nested member whose text config is left wholly to the defaults (Gemma 3's: 2304 wide, 26 layers): written
        # out so that it is shrunk like any other
        twin[member.text_path[0]] = {"model_type": member.text_type} if member.text_type else {}
    sections = [(k, twin[k]) for k in TEXT_KEYS if isinstance(twin.get(k), dict)]
    if member is not None and member.text_path == () and not sections:
        s.text(twin, "", root_type)
    for key, section in sections:
        inner = section.get("text_config")
        if isinstance(inner, dict):  # T5Gemma 2's encoder: a text config and a vision tower of its own
            s.text(inner, f"{key}.text_config.", inner.get("model_type"))
            for tkey in VISION_KEYS + AUDIO_KEYS:
                if isinstance(section.get(tkey), dict):
                    s.tower(section[tkey], f"{key}.{tkey}.")
            continue
        text_type = section.get("model_type") or (member.text_type if member else None)
        if key in ("encoder", "decoder") and text_type is None:
            text_type = member.text_type if member else None
        s.text(section, f"{key}.", text_type)
    for key in VISION_KEYS + AUDIO_KEYS:
        if isinstance(twin.get(key), dict):
            s.tower(twin[key], f"{key}.")
    # Root copies of text sizes (PaliGemma's hidden_size and projection_dim, Gemma 4 assistants' backbone size).
    for key in ("hidden_size", "projection_dim", "backbone_hidden_size"):
        if isinstance(twin.get(key), int) and sections:
            s.set(twin, key, TEXT["hidden_size"], "")
    if isinstance(twin.get("num_centroids"), int):
        s.set(twin, "num_centroids", 16, "")
    if isinstance(twin.get("centroid_intermediate_top_k"), int):
        s.set(twin, "centroid_intermediate_top_k", 4, "")
    return twin, s.shrunk


# --- the tokenizer --------------------------------------------------------------------------------------------------

def synthetic_tokenizer(config: Mapping[str, Any], size: int) -> dict[str, bytes]:
    """Tokenizer files of ``size`` tokens (the model's vocabulary) with Gemma's special ids and chat template: a
    byte-level BPE without merges, so any text tokenizes (one token per byte)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    names: dict[int, str] = {i: t for i, t in SPECIALS.items() if i < size}
    # the multimodal tokens, also as the tokenizer attributes the processors read (tokenizer.boi_token, image_token, ...)
    extra: dict[str, str] = {}
    for key, token in MM_TOKENS.items():
        idx = config.get(key)
        if isinstance(idx, int) and 0 <= idx < size and idx not in names:
            names[idx] = token
            extra[key.rsplit("_", 1)[0]] = token
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    free = [i for i in range(107, size) if i not in names]
    # the byte alphabet where the vocabulary has room for it (a toy vocabulary of 256 keeps what fits; the rest is unk)
    for i, ch in zip(free, sorted(alphabet)):
        names[i] = ch
    # The library builds the file from the named tokens only; the filler (<unusedN>, all but a few hundred of 262k) is
    # written into its vocabulary as JSON: building a 262k-entry BPE in the library took seconds, this takes a tenth
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in names.items()}, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    specials = [names[i] for i in sorted(names) if names[i].startswith("<") and len(names[i]) > 1]
    tok.add_special_tokens(specials)
    data = json.loads(tok.to_str())
    data["model"]["vocab"] = "@VOCAB@"
    vocab = ",".join(f"{json.dumps(names[i])}:{i}" if i in names else f'"<unused{i}>":{i}' for i in range(size))
    text = json.dumps(data, ensure_ascii=False).replace('"@VOCAB@"', "{" + vocab + "}", 1)
    tokenizer_config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
                        "pad_token": "<pad>", "unk_token": "<unk>", "add_bos_token": False, "padding_side": "left",
                        "model_max_length": 1_000_000, "chat_template": CHAT_TEMPLATE,
                        "extra_special_tokens": extra}
    return {"tokenizer.json": text.encode(),
            "tokenizer_config.json": _dumps(tokenizer_config),
            "special_tokens_map.json": _dumps({"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
                                               "unk_token": "<unk>"})}


# --- the weights ----------------------------------------------------------------------------------------------------

def _architecture(config: Mapping[str, Any]) -> str:
    archs = config.get("architectures")
    if isinstance(archs, list) and archs and isinstance(archs[0], str):
        return archs[0]
    m = family.member(config.get("model_type"))
    if m is not None and m.architectures:
        return m.architectures[0]
    raise TwinError(f"config.json names no architecture class for model_type {config.get('model_type')!r}")


def _config_dtype(config: Mapping[str, Any]) -> str:
    for section in (config, *(config.get(k) for k in TEXT_KEYS)):
        if isinstance(section, Mapping):
            for key in ("dtype", "torch_dtype"):
                if isinstance(section.get(key), str) and section[key] in _DTYPES:
                    return _DTYPES[section[key]]
    return "float32"


def _key_map(model: Any, original: Mapping[str, Any], state: Mapping[str, Any]) -> dict[str, str] | None:
    """Twin parameter name -> the original checkpoint's name for it (loading's own renames, applied forwards), or
    None when the original's layout needs a converter (fused experts, split tensors) rather than renames."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

    transforms = get_model_conversion_mapping(model)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    out: dict[str, str] = {}
    meta = dict.fromkeys(state, True)
    for name in original:
        internal, converter = rename_source_key(name, renamings, converters, model.base_model_prefix, meta)
        if internal not in state:
            continue
        if converter is not None:
            return None
        out[internal] = name
    return out


def _build_weights(twin_config: dict, original: Mapping[str, tuple[str, tuple[int, ...]]], seed: int,
                   notes: list[str]) -> tuple[dict[str, Any], str, str, int, Any]:
    """(tensors to save by name, architecture, layout, parameter count, the model) for the twin config."""
    import torch
    import transformers

    arch = _architecture(twin_config)
    cls = getattr(transformers, arch, None)
    if cls is None:
        raise TwinError(f"the installed transformers {transformers.__version__} has no class {arch}")
    config_cls = _config_class(twin_config["model_type"])
    try:
        config = config_cls.from_dict({k: v for k, v in twin_config.items() if k != "transformers_version"})
    except Exception as e:  # noqa: BLE001 - the library's refusal of the shrunk config, shown in one line
        raise TwinError(f"transformers refuses the twin's config: {type(e).__name__}: {_line(e)}") from None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # counted on the meta device first: a size left absurd must not allocate before it is refused
            with torch.device("meta"):
                planned = sum(p.numel() for p in _from_config(cls, config, torch.float32).parameters())
            if planned > MAX_TWIN_PARAMETERS:
                raise TwinError(f"the twin would have {planned:,} parameters; the kept sizes (vocabulary, positions) "
                                "are absurd")
            torch.manual_seed(seed)
            model = _from_config(cls, config, torch.float32)
    except TwinError:
        raise
    except ImportError as e:
        raise TwinError(f"{arch} cannot be built here: {_line(e)}") from None
    except Exception as e:  # noqa: BLE001
        raise TwinError(f"{arch} cannot be built from the twin's config: {type(e).__name__}: {_line(e)}") from None
    params = sum(p.numel() for p in model.parameters())
    model.eval()
    state = model.state_dict()
    default = getattr(torch, _config_dtype(twin_config))
    if not _has_core_model_loading():
        tensors, layout = _tensors_4x(model, original, default, notes)
        return tensors, arch, layout, params, model
    tensors: dict[str, Any] = {}
    mapping = _key_map(model, original, state) if original else None
    if mapping:
        layout = "checkpoint"
        for internal, name in mapping.items():
            st_dtype = original[name][0]
            dtype = getattr(torch, _DTYPES.get(st_dtype, "")) if st_dtype in _DTYPES else default
            tensors[name] = state[internal].detach().to(dtype).contiguous()
    else:
        if original:
            notes.append("the checkpoint's key layout needs weight converters; the twin is saved in the installed "
                         "transformers' layout")
        layout = "installed"
        from transformers.core_model_loading import revert_weight_conversion

        # a tied parameter is saved once, under its source's name, as save_pretrained does
        own = dict(state)
        for target, source in _tied_pairs(model).items():
            if target in own and source in own and own[target].data_ptr() == own[source].data_ptr():
                del own[target]
        for name, t in revert_weight_conversion(model, own).items():
            tensors[name] = t.detach().to(default if t.is_floating_point() else t.dtype).contiguous()
    return tensors, arch, layout, params, model


def _from_config(cls: Any, config: Any, dtype: Any) -> Any:
    """``cls._from_config(config)`` in ``dtype``: ``dtype=`` since transformers 4.56, ``torch_dtype=`` before."""
    try:
        return cls._from_config(config, dtype=dtype)
    except TypeError as e:
        # 4.50-4.55 have no dtype= there and hand it on to the model's __init__, which refuses it by name
        if "'dtype'" not in str(e):
            raise
        return cls._from_config(config, torch_dtype=dtype)


def _has_core_model_loading() -> bool:
    """Whether the installed transformers loads through core_model_loading (5.x: key renames, weight converters)."""
    try:
        import transformers.core_model_loading  # noqa: F401
    except ImportError:
        return False
    return True


def _tensors_4x(model: Any, original: Mapping[str, tuple[str, tuple[int, ...]]], default: Any,
                notes: list[str]) -> tuple[dict[str, Any], str]:
    """transformers 4.x: the tensors its own save_pretrained writes (tie dedup, key-mapping reversal), under the
    checkpoint's dtypes where the checkpoint names the same keys ("checkpoint" layout), else as saved ("installed")."""
    import tempfile

    import torch
    from safetensors.torch import load_file

    saved: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(tmp, safe_serialization=True)
        for shard in sorted(Path(tmp).glob("*.safetensors")):
            saved.update(load_file(shard))
    if original and any(name in saved for name in original):
        tensors: dict[str, Any] = {}
        for name, (st_dtype, _shape) in original.items():
            if name in saved:
                dtype = getattr(torch, _DTYPES[st_dtype]) if st_dtype in _DTYPES else default
                tensors[name] = saved[name].to(dtype).contiguous()
        return tensors, "checkpoint"
    if original:
        notes.append("the checkpoint's key names are not those the installed transformers saves; the twin is saved "
                     "in the installed transformers' layout")
    return {name: t.to(default if t.is_floating_point() else t.dtype).contiguous() for name, t in saved.items()}, \
        "installed"


def _tied_pairs(model: Any) -> dict[str, str]:
    """Tied parameter -> the parameter it shares (transformers 5.x: ``all_tied_weights_keys``)."""
    tied = getattr(model, "all_tied_weights_keys", None) or {}
    return {str(k): str(v) for k, v in tied.items()} if isinstance(tied, dict) else {}


def _line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[-1][:300] if text else type(e).__name__


# --- the hub cache --------------------------------------------------------------------------------------------------

def _dumps(data: Any) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


def _git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _blob_name(filename: str, data: bytes) -> str:
    """How the hub names a blob: sha256 of the content for LFS files, the git blob id for the rest."""
    if filename.endswith(LFS_SUFFIXES):
        return hashlib.sha256(data).hexdigest()
    return _git_blob_sha1(data)


def write_cache(cache_dir: Path, repo_id: str, commit: str, revision: str, files: Mapping[str, bytes]) -> Path:
    """Lay ``files`` out as huggingface_hub does: blobs by hash, snapshot links into ../../blobs, refs/<revision>."""
    repo = Path(cache_dir) / ("models--" + repo_id.replace("/", "--"))
    blobs = repo / "blobs"
    snap = repo / "snapshots" / commit
    blobs.mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        blob = blobs / _blob_name(name, data)
        if not blob.exists():
            tmp = blob.with_name(blob.name + ".incomplete")  # huggingface_hub's own suffix for a partial blob
            tmp.write_bytes(data)
            os.replace(tmp, blob)
        dest = snap / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.is_symlink() or dest.exists():
            dest.unlink()
        os.symlink(os.path.relpath(blob, dest.parent), dest)
    if not HEX40.match(revision):
        ref = repo / "refs" / revision
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(commit)
    return snap


def _commit_of(model_dir: Path, files: Mapping[str, bytes]) -> str:
    """The target's own commit when it is a hub snapshot (pinned revisions then resolve), else one from the files."""
    if model_dir.parent.name == "snapshots" and HEX40.match(model_dir.name):
        return model_dir.name
    h = hashlib.sha1()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + hashlib.sha1(files[name]).digest())
    return h.hexdigest()


# --- the adapter ----------------------------------------------------------------------------------------------------

def _adapter_twin(model: Any, adapter_dir: Path, seed: int, cache_dir: Path, revision: str,
                  notes: list[str]) -> Path:
    """The adapter's own adapter_config.json with random LoRA weights of its rank and targets on the twin base."""
    import torch
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import save

    adapter_dir = Path(adapter_dir)
    area = fsafe.Area(_cache_root(adapter_dir), user_named=_cache_root(adapter_dir) == adapter_dir)
    raw = _read_bytes(adapter_dir / "adapter_config.json", area)
    if raw is None:
        raise TwinError(f"adapter_config.json missing in {adapter_dir}")
    try:
        adapter_config = json.loads(raw)
    except ValueError as e:
        raise TwinError(f"{adapter_dir / 'adapter_config.json'} is not JSON: {e}") from None
    if not isinstance(adapter_config, dict):
        raise TwinError(f"{adapter_dir / 'adapter_config.json'} is not a JSON object")
    if adapter_config.get("peft_type", "LORA") != "LORA":
        raise TwinError(f"adapter type {adapter_config.get('peft_type')!r}: the twin builds LoRA adapters only")
    known = set(LoraConfig.__dataclass_fields__)
    kwargs = {k: v for k, v in adapter_config.items() if k in known and k not in ("peft_type", "task_type")}
    dropped = sorted(set(adapter_config) - known - {"peft_type", "task_type"})
    if dropped:
        notes.append(f"adapter_config keys the installed PEFT does not know, ignored for the twin's weights: {dropped}")
    try:
        lora = LoraConfig(**kwargs)
        torch.manual_seed(seed + 1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            peft_model = get_peft_model(model, lora)
    except Exception as e:  # noqa: BLE001 - PEFT's refusal (targets that match nothing, ...) in one line
        raise TwinError(f"PEFT cannot put the adapter on the twin: {type(e).__name__}: {_line(e)}") from None
    header = _headers_of_adapter(adapter_dir, area)
    from peft.utils import get_peft_model_state_dict

    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:  # B starts at zero in PEFT: a twin adapter whose deltas show must have B random
                p.normal_(0.0, 0.02)
        state = get_peft_model_state_dict(peft_model)
    dtype = getattr(torch, _DTYPES.get(next(iter(header.values()), ("F32",))[0], "float32")) if header else torch.float32
    tensors = {k: v.detach().to(dtype).contiguous() for k, v in state.items()}
    files = {"adapter_config.json": raw, "adapter_model.safetensors": save(tensors, metadata={"format": "pt"})}
    root = _cache_root(adapter_dir)
    if root != adapter_dir:
        repo_id = adapter_dir.parent.parent.name.removeprefix("models--").replace("--", "/")
        return write_cache(cache_dir, repo_id, adapter_dir.name, revision, files)
    # a plain adapter folder: a repo of its own in the twin's cache ("local/<folder>"), so the cache stays one that
    # huggingface_hub scans without a warning; the caller points the run at the returned snapshot
    name = re.sub(r"[^\w.-]", "-", adapter_dir.resolve().name or "adapter")
    return write_cache(cache_dir, f"local/{name}", _commit_of(adapter_dir, files), revision, files)


def _headers_of_adapter(adapter_dir: Path, area: fsafe.Area) -> dict[str, tuple[str, tuple[int, ...]]]:
    path = adapter_dir / "adapter_model.safetensors"
    if not fsafe.read_file(path, 0, area).exists:
        return {}
    header = read_header(path, area=area)
    return {t.name: (t.dtype, t.shape) for t in header.tensors} if header.ok else {}


# --- the build ------------------------------------------------------------------------------------------------------

def build_twin(model_dir: Path, repo_id: str, cache_dir: Path, *, revision: str = "main",
               adapter_dir: Path | None = None, seed: int = 0) -> Twin:
    """Build the twin of the checkpoint in ``model_dir`` as ``repo_id`` in the hub cache ``cache_dir``."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise TwinError(f"{model_dir} is not a folder")
    if not re.match(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$", repo_id) or ".." in repo_id:
        raise TwinError(f"{repo_id!r} is not a repo id")
    root = _cache_root(model_dir)
    area = fsafe.Area(root, user_named=root == model_dir)
    config = _read_json(model_dir / "config.json", area, required=True)
    assert config is not None
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or family.member(model_type) is None:
        raise TwinError(f"model_type {model_type!r} is not a Gemma-family member gemma-doctor knows "
                        f"(docs/families.md); no twin is built")
    twin_config, shrunk = shrink_config(config)
    notes: list[str] = []
    original = _headers(model_dir, area)
    if not original:
        notes.append(f"no safetensors in the target: dtypes from the config ({_config_dtype(config)}), keys as the "
                     "installed transformers saves them")
    files: dict[str, bytes] = {}
    for name in COPIED:
        data = _read_bytes(model_dir / name, area)
        if data is not None:
            files[name] = data
    tensors, arch, layout, params, model = _build_weights(twin_config, original, seed, notes)
    if not any(name in files for name in TOKENIZER_FILES):
        # a tokenizer_config.json of the target (without its tokenizer) is kept only for its chat template
        kept = files.get("tokenizer_config.json")
        files.update(synthetic_tokenizer(twin_config, model.get_input_embeddings().weight.shape[0]))
        if kept is not None:
            notes.append("the target's tokenizer_config.json has no tokenizer beside it; replaced by the synthetic one")
        notes.append("the target has no tokenizer files: the twin's tokenizer is synthetic (byte-level, the real "
                     "vocabulary size, Gemma's special ids and chat template)")
        shrunk = {**shrunk, "tokenizer": ("real", "synthetic")}
    from safetensors.torch import save

    files["config.json"] = _dumps(twin_config)
    files["model.safetensors"] = save(tensors, metadata={"format": "pt"})
    files.pop("model.safetensors.index.json", None)
    commit = _commit_of(model_dir, files)
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    snapshot = write_cache(cache_dir, repo_id, commit, revision, files)
    adapter = None
    if adapter_dir is not None:
        adapter = _adapter_twin(model, Path(adapter_dir), seed, cache_dir, revision, notes)
    return Twin(repo_id=repo_id, cache_dir=cache_dir, snapshot=snapshot, revision=revision, commit=commit,
                config=twin_config, shrunk=shrunk, notes=tuple(notes), adapter=adapter, architecture=arch,
                layout=layout, parameters=params, files={k: len(v) for k, v in files.items()})


__all__ = ["Twin", "TwinError", "build_twin", "shrink_config", "synthetic_tokenizer", "write_cache"]

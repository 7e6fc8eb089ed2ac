"""What a folder *is* (a model, a PEFT adapter, a Trainer checkpoint) and what an adapter's files say, as frozen facts.

Reads adapter_config.json (bounded strict JSON) and the header of adapter_model.safetensors through the ModelSource,
never tensor data: rank, targets, modules_to_save, the PEFT version that saved it where recorded, and the layout of
its tensor keys (which transformers class layout it was trained against).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gemma_doctor.readers.jsonfile import JsonFile
from gemma_doctor.readers.safetensors_header import SafetensorsHeader

if TYPE_CHECKING:
    from gemma_doctor.family import FamilyInfo
    from gemma_doctor.source import ModelSource

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
WEIGHTS_BIN = "adapter_model.bin"
TRAINER_STATE = "trainer_state.json"

class Kind(str, enum.Enum):
    """The kinds of folder `check` tells apart ("kind" in the JSON report). A merged or fully fine-tuned model is a
    model: nothing in a saved folder records that it was merged."""

    MODEL = "model"
    ADAPTER = "adapter"
    CHECKPOINT = "checkpoint"


MODEL, ADAPTER, CHECKPOINT = Kind.MODEL, Kind.ADAPTER, Kind.CHECKPOINT

# Where the language model's layers sit in an adapter's keys (PEFT prefixes base_model.model.):
#   "model.language_model": multimodal classes of transformers >= 4.52 (Gemma3ForConditionalGeneration.model.language_model)
#   "language_model.model": the same classes before 4.52 (transformers #38927)
#   "model": text-only classes (Gemma3ForCausalLM.model.layers), the same in every release
LAYOUT_NEW, LAYOUT_OLD, LAYOUT_TEXT = "model.language_model", "language_model.model", "model"
# Patterns as text, compiled by re (and kept in its cache) at their first use: only an adapter or --weights needs them.
_LAYERS = r"^base_model\.model\.(.*?)\.layers\.\d+\."
_LORA = r"\.lora_(A|B|embedding_A|embedding_B|magnitude_vector)(\.[^.]+)?\.weight$|\.lora_magnitude_vector$"


@dataclass(frozen=True)
class AdapterFacts:
    """A PEFT adapter's config and tensor layout; ``error`` says why it cannot be used."""

    config: JsonFile
    weights_file: str | None = None
    header: SafetensorsHeader | None = None
    error: str | None = None
    peft_type: str | None = None
    base_model: str | None = None
    base_revision: str | None = None
    rank: int | None = None
    alpha: float | None = None
    target_modules: list[str] | str | None = None
    modules_to_save: tuple[str, ...] = ()
    peft_version: str | None = None
    ensure_weight_tying: bool | None = None
    # Where the language model's layers are in the keys (LAYOUT_*), or None when the keys name no layers.
    layout: str | None = None
    # The distinct prefixes in front of ``.layers.N.`` (``model.language_model``, ``model.vision_tower...``).
    prefixes: tuple[str, ...] = ()
    # Full tensors saved beside the LoRA matrices (modules_to_save copies, trainable tokens): key -> shape.
    full_tensors: dict[str, tuple[int, ...]] = field(default_factory=dict)
    lora_tensors: int = 0

    @property
    def ok(self) -> bool:
        """True when the adapter's config and weights were read."""
        return self.error is None

    def to_json(self) -> dict[str, Any]:
        """The `adapter` block of the JSON report."""
        return {"peft_type": self.peft_type, "base_model": self.base_model, "base_revision": self.base_revision,
                "rank": self.rank, "alpha": self.alpha, "target_modules": self.target_modules,
                "modules_to_save": list(self.modules_to_save), "peft_version": self.peft_version,
                "ensure_weight_tying": self.ensure_weight_tying, "weights_file": self.weights_file,
                "layout": self.layout, "prefixes": list(self.prefixes), "lora_tensors": self.lora_tensors,
                "full_tensors": {k: list(v) for k, v in sorted(self.full_tensors.items())}, "error": self.error}


@dataclass(frozen=True)
class BaseFacts:
    """The base model an adapter names, and whether (and where) it was found on this machine."""

    name: str | None
    # "cache" | "folder" | "hub" when found (hub: its config.json read from the Hub, nothing downloaded); "not found"
    # (neither a folder nor a cached repo here, and the Hub could not say); "unnamed".
    found: str
    path: str | None = None
    config: JsonFile | None = None
    family: FamilyInfo | None = None
    # Why the Hub could not be asked or did not have it (offline, unreachable, no such repo, gated), when it was tried.
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The `base` block of the JSON report."""
        return {"name": self.name, "found": self.found, "path": self.path,
                "model_type": self.family.model_type if self.family is not None else None,
                "family": self.family.label if self.family is not None else None, "note": self.note}


# Files whose presence (not content) the after-training rules read: processors for serving, the SentencePiece model
# for GGUF export, and the marks a training run leaves in the folders it saves.
NOTED_FILES = ("preprocessor_config.json", "processor_config.json", "tokenizer_config.json", "tokenizer.json",
               "tokenizer.model", "training_args.bin", TRAINER_STATE)


def present(source: ModelSource) -> frozenset[str]:
    """Which of NOTED_FILES the folder has."""
    return frozenset(n for n in NOTED_FILES if source.has(n))


def kind_of(source: ModelSource) -> Kind:
    """MODEL, ADAPTER or CHECKPOINT (a Trainer checkpoint-N folder: trainer_state.json beside the model or adapter)."""
    if source.has(TRAINER_STATE) and (source.has("config.json") or source.has(CONFIG)):
        return CHECKPOINT
    if source.has(CONFIG) and not source.has("config.json"):
        return ADAPTER
    return MODEL


def is_adapter(source: ModelSource) -> bool:
    """True when the folder holds a PEFT adapter (adapter_config.json), a checkpoint's included."""
    return source.has(CONFIG)


def layout_of(keys: list[str]) -> tuple[str | None, tuple[str, ...]]:
    """The layout of the language model's layers in an adapter's keys, and every prefix in front of ``.layers.N``."""
    prefixes = sorted({m.group(1) for k in keys if (m := re.match(_LAYERS, k))})
    layout = None
    for candidate in (LAYOUT_NEW, LAYOUT_OLD, LAYOUT_TEXT):
        if candidate in prefixes:
            layout = candidate
            break
    return layout, tuple(prefixes)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value.strip() else None


def read(source: ModelSource) -> AdapterFacts:
    """The adapter in ``source``: adapter_config.json and the header of its weights (never the tensors)."""
    cfg = source.read_json(CONFIG)
    if not cfg.ok:
        return AdapterFacts(cfg, error=f"{CONFIG}: {cfg.error or 'missing'}")
    data = cfg.data
    if not isinstance(data, dict):
        return AdapterFacts(cfg, error=f"{CONFIG} is not a JSON object")
    rank = data.get("r")
    alpha = data.get("lora_alpha")
    mts = data.get("modules_to_save")
    targets = data.get("target_modules")
    ewt = data.get("ensure_weight_tying")
    facts = dict(
        peft_type=_text(data.get("peft_type")), base_model=_text(data.get("base_model_name_or_path")),
        base_revision=_text(data.get("revision")),
        rank=rank if isinstance(rank, int) and not isinstance(rank, bool) else None,
        alpha=alpha if isinstance(alpha, (int, float)) and not isinstance(alpha, bool) else None,
        target_modules=[str(t) for t in targets] if isinstance(targets, list) else _text(targets),
        modules_to_save=tuple(str(m) for m in mts) if isinstance(mts, list) else (),
        peft_version=_text(data.get("peft_version")),
        ensure_weight_tying=ewt if isinstance(ewt, bool) else None,
    )
    if not source.has(WEIGHTS):
        if source.has(WEIGHTS_BIN):  # a pickle: its keys are not read (unpickling runs code)
            return AdapterFacts(cfg, WEIGHTS_BIN, **facts)
        return AdapterFacts(cfg, error=f"{WEIGHTS} is missing: the folder has a config and no weights", **facts)
    header = source.read_header(WEIGHTS)
    if not header.ok:
        return AdapterFacts(cfg, WEIGHTS, header, error=f"{WEIGHTS}: {header.error}", **facts)
    keys = [t.name for t in header.tensors]
    layout, prefixes = layout_of(keys)
    lora = re.compile(_LORA)  # re's cache: compiled once per process
    full = {t.name: t.shape for t in header.tensors if not lora.search(t.name)}
    return AdapterFacts(cfg, WEIGHTS, header, None, layout=layout, prefixes=prefixes, full_tensors=full,
                        lora_tensors=len(keys) - len(full), **facts)


# --- a saved lm_head beside a tied embedding (merged models) ------------------------------------------------

def head_pair(headers: tuple[SafetensorsHeader, ...]) -> tuple[tuple[SafetensorsHeader, Any] | None,
                                                                tuple[SafetensorsHeader, Any] | None]:
    """(header, tensor) of the saved ``lm_head.weight`` and of the language model's ``embed_tokens.weight`` (a
    tensor named so, or whose module path ends so)."""
    # String tests, not regexes: the prescription search asks this of every tensor for each candidate run it judges.
    head = embed = None
    for h in headers:
        for t in h.tensors:
            name = t.name
            if not name.endswith("weight"):
                continue
            if head is None and (name == "lm_head.weight" or name.endswith(".lm_head.weight")):
                head = (h, t)
            elif (embed is None and (name == "embed_tokens.weight" or name.endswith(".embed_tokens.weight"))
                  and "vision" not in name and "audio" not in name):
                embed = (h, t)
    return head, embed


@dataclass(frozen=True)
class HeadComparison:
    """Whether a saved ``lm_head.weight`` holds the same values as ``embed_tokens.weight`` (check --weights)."""

    head: str
    embed: str
    identical: bool | None = None
    max_abs_diff: float | None = None
    error: str | None = None


_CHUNK_ELEMENTS = 1 << 23  # 8 M elements per read: bounded memory whatever the vocabulary


def _open(h: SafetensorsHeader) -> int:
    from gemma_doctor import fsafe

    # Opened the way the header was read (confined to the repo folder) and checked to be the same file.
    try:
        opened = fsafe.open_file(h.path, fsafe.Area(h.root) if h.root is not None else None)
    except fsafe.Refused as e:
        raise ValueError(str(e)) from None
    if h.ident is not None and opened.ident != h.ident:
        import os

        os.close(opened.fd)
        raise ValueError("file was replaced since its header was read; not compared")
    return opened.fd


def _chunk(fd: int, h: SafetensorsHeader, t: Any, first: int, count: int) -> Any:
    import os

    import numpy as np

    kinds = {"F32": (np.float32, 4), "F16": (np.float16, 2), "BF16": (np.uint16, 2)}
    kind, size = kinds[t.dtype]
    raw = os.pread(fd, count * size, 8 + h.header_len + t.begin + first * size)
    if len(raw) != count * size:
        raise ValueError(f"{t.name}: the file ends inside the tensor")
    arr = np.frombuffer(raw, dtype=kind)
    if t.dtype == "BF16":
        return (arr.astype(np.uint32) << 16).view(np.float32)
    return arr.astype(np.float32)


def compare_head(headers: tuple[SafetensorsHeader, ...]) -> HeadComparison | None:
    """Compare a saved lm_head with embed_tokens value by value, a bounded chunk at a time; None when the folder
    saves no head beside an embedding."""
    import os

    import numpy as np

    head, embed = head_pair(headers)
    if head is None or embed is None:
        return None
    names = (head[1].name, embed[1].name)
    if head[1].shape != embed[1].shape:
        return HeadComparison(*names, identical=False, error=f"shapes differ: {head[1].shape} vs {embed[1].shape}")
    if any(t.dtype not in ("F32", "F16", "BF16") for _, t in (head, embed)):
        return HeadComparison(*names, error="not compared: only F32, F16 and BF16 tensors are read")
    fds: list[int] = []
    try:
        for h, _ in (head, embed):
            fds.append(_open(h))
        diff, total = 0.0, head[1].numel
        for first in range(0, total, _CHUNK_ELEMENTS):
            count = min(_CHUNK_ELEMENTS, total - first)
            a = _chunk(fds[0], *head, first, count)
            b = _chunk(fds[1], *embed, first, count)
            delta = np.abs(a - b)
            if np.isnan(delta).any():  # NaN in either (a broken head) is a difference, never equality
                diff = float("inf")
                break
            diff = max(diff, float(delta.max()))
    except (OSError, ValueError) as e:
        return HeadComparison(*names, error=str(e))
    finally:
        for fd in fds:
            os.close(fd)
    return HeadComparison(*names, identical=diff == 0.0, max_abs_diff=diff)

"""The dtype census of a model folder: what config.json declares and what the safetensors headers hold.

Reads headers only (never tensor data) and imports nothing heavy: it runs on every `check`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping  # isinstance in C (typing.Mapping's checks through Python per call)
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

from gemma_doctor.readers.safetensors_header import FLOAT_DTYPES, SafetensorsHeader

if TYPE_CHECKING:
    from gemma_doctor.source import ModelSource

# Per model, over all its shards: header bytes read, and distinct tensors kept for the weights scan. Far above any
# real checkpoint (the largest sharded models total ~10 MB of headers and ~100k tensors), far below what a crafted
# cache could otherwise make one `check` spend (each shard header may be 100 MB; links may repeat one shard).
MAX_HEADER_BYTES_PER_MODEL = 128 * 1024 * 1024
MAX_TENSORS_PER_MODEL = 300_000

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

# Spellings seen in config files (and torch's own aliases) -> the normalised torch name.
_ALIASES = {
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float16": "float16", "half": "float16", "fp16": "float16",
    "float32": "float32", "float": "float32", "fp32": "float32",
    "float64": "float64", "double": "float64", "fp64": "float64",
    "auto": "auto",
}
# Tensor-name suffixes that give a quantized layout away even without a quantization_config.
_BNB4_SUFFIXES = (".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map", ".quant_state.bitsandbytes__nf4",
                  ".quant_state.bitsandbytes__fp4")
_BNB8_SUFFIXES = (".SCB", ".weight_format")
_PACKED_SUFFIXES = (".qweight", ".qzeros", ".scales")


def normalise_dtype(value: Any) -> str | None:
    """A config's dtype value ("torch.bfloat16", "bf16", "half"...) -> "bfloat16"; None when absent or not text."""
    if not isinstance(value, str) or not value.strip():
        return None
    v = value.strip().lower()
    if v.startswith("torch."):
        v = v[len("torch."):]
    return _ALIASES.get(v, v)


def declared_dtype(config: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(normalised dtype, key it came from): `dtype` (transformers >= 4.56) or `torch_dtype`, top level first."""
    scopes: list[tuple[str, Mapping[str, Any]]] = [("", config)]
    text = config.get("text_config")
    if isinstance(text, Mapping):
        scopes.append(("text_config.", text))
    for prefix, scope in scopes:
        for key in ("dtype", "torch_dtype"):
            value = normalise_dtype(scope.get(key))
            if value is not None:
                return value, prefix + key
    return None, None


@dataclass(frozen=True)
class ShardCensus:
    """Parameters and bytes per dtype of one safetensors file, or why it could not be read."""

    file: str
    exists: bool
    error: str | None = None
    size: int = 0
    tensors: int = 0
    params: dict[str, int] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """JSON view of the shard."""
        return {"file": self.file, "exists": self.exists, "error": self.error, "size": self.size,
                "tensors": self.tensors, "params": dict(self.params), "bytes": dict(self.bytes)}


@dataclass(frozen=True)
class DtypeCensus:
    """Declared dtype vs the dtypes the weights are saved in, per shard and in total."""

    declared: str | None
    declared_key: str | None = None
    weights: dict[str, int] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=dict)
    dominant: str | None = None
    # "model.safetensors", "model.safetensors.index.json", or None when the folder has no safetensors weights.
    source: str | None = None
    shards: tuple[ShardCensus, ...] = ()
    index_error: str | None = None
    # Inconsistencies between the index's weight_map and the shards' headers.
    index_problems: tuple[str, ...] = ()
    quantization: dict[str, Any] | None = None
    # The validated headers, kept for the weights scan (not part of the JSON view).
    headers: tuple[SafetensorsHeader, ...] = field(default=(), repr=False, compare=False)

    @property
    def total_params(self) -> int:
        """Parameters over every dtype."""
        return sum(self.weights.values())

    @property
    def total_bytes(self) -> int:
        """Tensor bytes over every dtype."""
        return sum(self.bytes.values())

    def to_json(self) -> dict[str, Any]:
        """The `dtypes` block of a model in `check --format json`."""
        return {
            "declared": self.declared, "declared_key": self.declared_key, "weights": dict(self.weights),
            "bytes": dict(self.bytes), "dominant": self.dominant, "total_params": self.total_params,
            "total_bytes": self.total_bytes, "source": self.source, "shards": [s.to_json() for s in self.shards],
            "index_error": self.index_error, "index_problems": list(self.index_problems),
            "quantization": self.quantization,
        }


def _safe_name(name: str) -> bool:
    """Shard names from an index must stay inside the snapshot folder."""
    p = PurePosixPath(name)
    return bool(name) and "\\" not in name and not p.is_absolute() and ".." not in p.parts


def _shard(source: ModelSource, name: str, seen: dict[tuple[int, int], SafetensorsHeader] | None = None,
           ) -> tuple[ShardCensus, SafetensorsHeader | None]:
    h = source.read_header(name)
    if seen is not None and h.ok and h.ident is not None:
        # Several names for one file (links to one blob): one parsed header, shared, whatever the number of names.
        first = seen.setdefault(h.ident, h)
        if first is not h:
            h = dataclasses.replace(first, path=h.path)
    if not h.ok:
        return ShardCensus(name, exists=h.exists, error=h.error, size=h.file_size), h
    params: dict[str, int] = {}
    nbytes: dict[str, int] = {}
    for t in h.tensors:
        params[t.dtype] = params.get(t.dtype, 0) + t.numel
        nbytes[t.dtype] = nbytes.get(t.dtype, 0) + t.nbytes
    return ShardCensus(name, exists=True, size=h.file_size, tensors=len(h.tensors), params=params, bytes=nbytes), h


def quantization(config: Mapping[str, Any], names: list[str], declared: str | None) -> dict[str, Any] | None:
    """Quantization method, bits and compute dtype from quantization_config, else from the tensor layout."""
    qc = config.get("quantization_config")
    if isinstance(qc, Mapping):
        method = str(qc.get("quant_method") or "").lower() or None
        if method in (None, "bitsandbytes") and (qc.get("load_in_4bit") or qc.get("load_in_8bit")):
            method = "bitsandbytes"
        out: dict[str, Any] = {"method": method, "bits": None, "compute_dtype": None, "source": "config.json"}
        if method == "bitsandbytes":
            if qc.get("load_in_4bit"):
                out["bits"] = 4
                out["quant_type"] = qc.get("bnb_4bit_quant_type")
                # transformers' BitsAndBytesConfig defaults the 4-bit compute dtype to float32.
                out["compute_dtype"] = normalise_dtype(qc.get("bnb_4bit_compute_dtype")) or "float32"
            elif qc.get("load_in_8bit"):
                out["bits"] = 8
                # LLM.int8 computes in the dtype the rest of the model is loaded in.
                out["compute_dtype"] = declared
        else:
            bits = qc.get("bits")
            out["bits"] = bits if isinstance(bits, int) and not isinstance(bits, bool) else None
            # GPTQ/AWQ kernels compute in the loaded dtype, which their configs declare (usually float16).
            out["compute_dtype"] = declared
        return out
    if any(n.endswith(_BNB4_SUFFIXES) for n in names):
        return {"method": "bitsandbytes", "bits": 4, "compute_dtype": None, "source": "tensor layout (.absmax/.quant_map)"}
    if any(n.endswith(_BNB8_SUFFIXES) for n in names):
        return {"method": "bitsandbytes", "bits": 8, "compute_dtype": declared, "source": "tensor layout (.SCB)"}
    if any(n.endswith(".qweight") for n in names) and any(n.endswith(_PACKED_SUFFIXES[1:]) for n in names):
        method = "gptq" if any(n.endswith(".g_idx") for n in names) else "gptq/awq"
        return {"method": method, "bits": None, "compute_dtype": declared, "source": "tensor layout (qweight/qzeros/scales)"}
    return None


def census(source: ModelSource, config: Mapping[str, Any] | None) -> DtypeCensus:
    """The census of one model's safetensors files, read through ``source`` (headers only)."""
    config = config or {}
    declared, key = declared_dtype(config)
    index_error: str | None = None
    problems: list[str] = []
    expected: dict[str, list[str]] = {}
    if source.has(SINGLE_FILE):
        # transformers loads model.safetensors before looking for an index.
        origin, names = SINGLE_FILE, [SINGLE_FILE]
    elif source.has(INDEX_FILE):
        origin, names = INDEX_FILE, []
        jf = source.read_json(INDEX_FILE)
        wm = jf.data.get("weight_map") if jf.ok else None
        if not jf.ok:
            index_error = jf.error
        elif not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
            index_error = "weight_map is missing or not a map of tensor names to file names"
        else:
            for tensor, shard in wm.items():
                expected.setdefault(shard, []).append(tensor)
            names = sorted(expected)
            bad = [n for n in names if not _safe_name(n)]
            if bad:
                index_error = f"weight_map names files outside the model folder: {', '.join(bad)}"
                names = [n for n in names if _safe_name(n)]
    else:
        return DtypeCensus(declared, key, quantization=quantization(config, [], declared))
    shards: list[ShardCensus] = []
    headers: list[SafetensorsHeader] = []
    weights: dict[str, int] = {}
    nbytes: dict[str, int] = {}
    tensor_names: list[str] = []
    if source.kind == "hub":
        # A Hub source fetches every header at once, in parallel (one range request each), and keeps them;
        # a local one reads each below only while the budget lasts.
        source.read_headers(names)
    seen: dict[tuple[int, int], SafetensorsHeader] = {}
    spent = kept = 0
    for name in names:
        if spent > MAX_HEADER_BYTES_PER_MODEL or kept > MAX_TENSORS_PER_MODEL:
            shards.append(ShardCensus(name, exists=source.has(name), error=(
                f"not read: this model's headers already hold over {MAX_TENSORS_PER_MODEL} tensors or "
                f"{MAX_HEADER_BYTES_PER_MODEL // 2**20} MB, more than any real checkpoint")))
            continue
        before = len(seen)
        sc, h = _shard(source, name, seen)
        shards.append(sc)
        if h is None or not h.ok:
            continue
        spent += h.header_len
        kept += len(h.tensors) if len(seen) > before else 0
        headers.append(h)
        present = {t.name for t in h.tensors}
        tensor_names.extend(present)
        missing = [t for t in expected.get(name, []) if t not in present]
        if missing:
            problems.append(f"{name} lacks {len(missing)} tensor(s) the index maps to it (first: {sorted(missing)[0]})")
        for d, v in sc.params.items():
            weights[d] = weights.get(d, 0) + v
        for d, v in sc.bytes.items():
            nbytes[d] = nbytes.get(d, 0) + v
    floats = {d: n for d, n in weights.items() if d in FLOAT_DTYPES}
    dominant = max(sorted(floats), key=lambda d: floats[d]) if floats else None
    return DtypeCensus(declared, key, dict(sorted(weights.items())), dict(sorted(nbytes.items())), dominant, origin,
                       tuple(shards), index_error, tuple(problems), quantization(config, tensor_names, declared),
                       tuple(headers))

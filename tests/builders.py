"""Builders for tests: hub caches laid out exactly as huggingface_hub lays them out, and model configs.

Blobs are named as the hub names them (git blob sha1 for small files, sha256 for LFS files),
snapshot files are relative symlinks into ../../blobs, refs hold the commit hash without a newline.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from pathlib import Path
from typing import Any

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf", ".model")


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a blob, as the hub names non-LFS files."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def blob_name(filename: str, data: bytes) -> str:
    """How huggingface_hub names the blob of ``filename``."""
    if filename.endswith(LFS_SUFFIXES):
        return hashlib.sha256(data).hexdigest()
    return git_blob_sha1(data)


def dumps(config: dict[str, Any]) -> bytes:
    """A config serialised as transformers writes it (2-space indent, sorted keys, trailing newline)."""
    return (json.dumps(config, indent=2, sort_keys=True) + "\n").encode()


class HubCache:
    """A hub cache folder under construction."""

    def __init__(self, root: Path, symlinks: bool = True) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.symlinks = symlinks

    def repo_dir(self, repo_id: str) -> Path:
        """models--org--name."""
        return self.root / ("models--" + repo_id.replace("/", "--"))

    def add(self, repo_id: str, files: dict[str, bytes | dict], commit: str | None = None,
            refs: tuple[str, ...] = ("main",)) -> Path:
        """Add one revision of ``repo_id`` holding ``files``; returns its snapshot folder."""
        raw = {name: dumps(v) if isinstance(v, dict) else v for name, v in files.items()}
        if commit is None:
            h = hashlib.sha1()
            for name in sorted(raw):
                h.update(name.encode() + b"\0" + raw[name])
            commit = h.hexdigest()
        repo = self.repo_dir(repo_id)
        (repo / "blobs").mkdir(parents=True, exist_ok=True)
        snap = repo / "snapshots" / commit
        for name, data in raw.items():
            blob = repo / "blobs" / blob_name(name, data)
            if not blob.exists():
                blob.write_bytes(data)
            dest = snap / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            if self.symlinks:
                os.symlink(os.path.relpath(blob, dest.parent), dest)
            else:
                dest.write_bytes(data)
        for ref in refs:
            ref_path = repo / "refs" / ref
            ref_path.parent.mkdir(parents=True, exist_ok=True)
            ref_path.write_text(commit)
        return snap

    def blob_digests(self) -> dict[str, str]:
        """sha256 of every blob in the cache, by path: what must never change."""
        return {str(p.relative_to(self.root)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(self.root.glob("models--*/blobs/*"))}


def tree_state(root: Path) -> dict[str, tuple[str, str]]:
    """Every file under ``root``: (link target or 'file', sha256 of content) — for byte-identical checks."""
    out: dict[str, tuple[str, str]] = {}
    for p in sorted(root.rglob("*")):
        if p.is_dir() and not p.is_symlink():
            continue
        kind = "link:" + os.readlink(p) if p.is_symlink() else "file"
        try:
            digest = hashlib.sha256(p.read_bytes()).hexdigest()
        except OSError:
            digest = "unreadable"
        out[str(p.relative_to(root))] = (kind, digest)
    return out


# --- configs -----------------------------------------------------------------------------------

def build_example_cache(cache: Path) -> Path:
    """The bundled example cache (examples/build_example_cache.py, run as a user runs it) built at ``cache``."""
    import subprocess
    import sys

    subprocess.run([sys.executable, str(EXAMPLES / "build_example_cache.py"), str(cache)], check=True,
                   capture_output=True)
    return cache


def example_file(name: str) -> bytes:
    """A file of the bundled google/gemma-3-12b-it snapshot (as on the Hub)."""
    return (EXAMPLES / "google--gemma-3-12b-it" / name).read_bytes()


def gemma3_12b_config() -> dict[str, Any]:
    """gemma-3-12b-it's config.json: nested, sparse text_config without use_cache."""
    return json.loads(example_file("config.json"))


def gemma3_1b_config() -> dict[str, Any]:
    """gemma-3-1b-it: flat gemma3_text config with use_cache true."""
    return {
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 1152,
        "num_hidden_layers": 26, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
        "intermediate_size": 6912, "vocab_size": 262144, "torch_dtype": "bfloat16", "use_cache": True,
        "cache_implementation": "hybrid", "sliding_window": 512, "eos_token_id": [1, 106], "bos_token_id": 2,
        "pad_token_id": 0, "transformers_version": "4.50.0.dev0",
    }


def gemma2_config() -> dict[str, Any]:
    """gemma-2-2b-it: flat Gemma 2 config."""
    return {
        "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_size": 2304, "num_hidden_layers": 26,
        "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "cache_implementation": "hybrid",
        "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 256000, "transformers_version": "4.42.4",
    }


def paligemma2_config() -> dict[str, Any]:
    """PaliGemma 2: nested, Gemma 2 text model."""
    return {
        "architectures": ["PaliGemmaForConditionalGeneration"], "model_type": "paligemma", "torch_dtype": "bfloat16",
        "text_config": {"model_type": "gemma2", "hidden_size": 2304, "num_hidden_layers": 26, "vocab_size": 257216},
        "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152},
        "projection_dim": 2304, "image_token_index": 257152, "transformers_version": "4.47.0.dev0",
    }


def gemma3n_config() -> dict[str, Any]:
    """Gemma 3n: nested, no HybridCache crash on any release."""
    return {"architectures": ["Gemma3nForConditionalGeneration"], "model_type": "gemma3n", "torch_dtype": "bfloat16",
            "text_config": {"model_type": "gemma3n_text", "hidden_size": 2048}}


def llama_config() -> dict[str, Any]:
    """A non-Gemma model."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048, "use_cache": True,
            "torch_dtype": "bfloat16"}


def generation_config() -> dict[str, Any]:
    """Gemma 3's generation_config.json (no use_cache key, as on the Hub)."""
    return json.loads(example_file("generation_config.json"))


def variant(config: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A deep copy of ``config`` with top-level changes."""
    out = copy.deepcopy(config)
    out.update(changes)
    return out


# `python -c PEAK_SCRIPT ARGS...` runs gemma-doctor ARGS and writes its peak RSS (VmHWM, KiB) to $GD_PEAK_FILE at exit:
# the memory bound of a run on hostile input, measured in its own process (tests/test_attacker.py, test_hub_hostile.py).
PEAK_SCRIPT = """
import atexit, os, sys
def _peak():
    for line in open('/proc/self/status'):
        if line.startswith('VmHWM:'):
            open(os.environ['GD_PEAK_FILE'], 'w').write(line.split()[1])
atexit.register(_peak)
from gemma_doctor.cli import main
main(sys.argv[1:])
"""

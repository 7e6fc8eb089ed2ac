"""Build a Hugging Face hub cache holding realistic google/gemma-3-12b-it and google/gemma-4-E2B-it snapshots,
offline, in about a second.

    python examples/build_example_cache.py DEST
    gemma-doctor check --cache-dir DEST

Each snapshot has its config.json and generation_config.json, a model.safetensors.index.json with the real
tensor names, shapes and dtypes (BF16) of the model, and shards with valid headers whose data sections are
file holes (zeros): ~24 GB and ~10 GB apparent size, almost no disk use. gemma-3-12b-it's configs are the
Hub's, its tensors those transformers 4.50.0 saves; where gemma-4-E2B-it's files come from is in its
SOURCE.md. Blobs are named as the hub names them: git blob sha1 for small files, sha256 of
the content for LFS files. Those sha256 digests were computed once (the content is deterministic) and
are stored in tensors.json beside the configs, so the build never hashes 24 GB.

Regenerate a manifest (tensors.json) from a list of [name, shape] pairs (see --help):
    python examples/build_example_cache.py --manifest-from tensors-4.50.json [--snapshot google--gemma-4-E2B-it]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import struct
import sys
from pathlib import Path
from typing import Any, Iterable

EXAMPLES = Path(__file__).resolve().parent
HERE = EXAMPLES / "google--gemma-3-12b-it"
REPO_ID = "google/gemma-3-12b-it"
MANIFEST = HERE / "tensors.json"
# Every bundled snapshot: a folder with config.json, generation_config.json and tensors.json.
SNAPSHOTS = (HERE, EXAMPLES / "google--gemma-4-E2B-it")
DTYPE = "BF16"
DTYPE_BYTES = 2
# transformers' default max_shard_size when gemma-3-12b-it was saved: 5 GB (decimal) per shard.
MAX_SHARD_BYTES = 5_000_000_000
ZEROS = bytes(16 * 1024 * 1024)


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a blob, as the hub names non-LFS files."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def shard_header(tensors: Iterable[tuple[str, list[int]]], metadata: dict[str, str] | None = None) -> tuple[bytes, int]:
    """(8-byte length + JSON header, data section length) of a shard, laid out as the safetensors library does."""
    entries: dict[str, Any] = {"__metadata__": metadata or {"format": "pt"}}
    offset = 0
    for name, shape in sorted(tensors):
        n = DTYPE_BYTES
        for d in shape:
            n *= d
        entries[name] = {"dtype": DTYPE, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(entries, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the library pads the header to 8 bytes with spaces
    return struct.pack("<Q", len(raw)) + raw, offset


def content_sha256(header: bytes, data_len: int) -> str:
    """sha256 of header + data_len zero bytes (what a written shard holds), without writing it."""
    h = hashlib.sha256(header)
    left = data_len
    while left:
        n = min(left, len(ZEROS))
        h.update(memoryview(ZEROS)[:n])
        left -= n
    return h.hexdigest()


def write_sparse(path: Path, header: bytes, data_len: int) -> None:
    """Write the header and extend the file with a hole: the data section reads as zeros and takes no disk."""
    with open(path, "wb") as f:
        f.write(header)
        f.truncate(len(header) + data_len)


def split(tensors: list[tuple[str, list[int]]], max_bytes: int = MAX_SHARD_BYTES) -> list[list[tuple[str, list[int]]]]:
    """Shards in state-dict order, a new one when the next tensor would pass max_bytes (huggingface_hub's rule)."""
    shards: list[list[tuple[str, list[int]]]] = [[]]
    size = 0
    for name, shape in tensors:
        n = DTYPE_BYTES
        for d in shape:
            n *= d
        if shards[-1] and size + n > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += n
    return shards


def make_manifest(tensors: list[tuple[str, list[int]]], transformers_version: str, repo_id: str = REPO_ID,
                  architecture: str = "Gemma3ForConditionalGeneration") -> dict[str, Any]:
    """The manifest: shards with their tensors and precomputed content digests (hashes ~24 GB of zeros once)."""
    parts = split(tensors)
    shards = []
    for i, part in enumerate(parts, start=1):
        header, data_len = shard_header(part)
        shards.append({"file": f"model-{i:05d}-of-{len(parts):05d}.safetensors", "size": len(header) + data_len,
                       "sha256": content_sha256(header, data_len), "header_sha256": hashlib.sha256(header).hexdigest(),
                       "tensors": [[n, s] for n, s in part]})
    commit = hashlib.sha1(json.dumps([repo_id, [s["sha256"] for s in shards]]).encode()).hexdigest()
    return {"repo_id": repo_id, "commit": commit, "dtype": DTYPE, "transformers": transformers_version,
            "note": f"tensor names/shapes of {architecture} on the meta device, tied lm_head omitted",
            "shards": shards}


def load_manifest(path: Path = MANIFEST) -> dict[str, Any]:
    """The checked-in manifest."""
    return json.loads(path.read_text(encoding="utf-8"))


def index_json(manifest: dict[str, Any]) -> bytes:
    """model.safetensors.index.json as transformers writes it."""
    weight_map = {n: s["file"] for s in manifest["shards"] for n, _ in s["tensors"]}
    total = sum(s["size"] - len(shard_header(s["tensors"])[0]) for s in manifest["shards"])
    doc = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


def _link(repo: Path, commit: str, name: str, blob: str) -> None:
    dest = repo / "snapshots" / commit / name
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.is_symlink() or dest.exists():
        dest.unlink()
    os.symlink(os.path.relpath(repo / "blobs" / blob, dest.parent), dest)


def build(dest: Path, manifest: dict[str, Any] | None = None, folder: Path = HERE) -> Path:
    """Build (or refresh) the snapshot of ``folder`` in the cache at ``dest``; returns the snapshot folder."""
    manifest = manifest or load_manifest(folder / "tensors.json")
    repo = Path(dest) / ("models--" + manifest["repo_id"].replace("/", "--"))
    commit = manifest["commit"]
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    small = {"config.json": (folder / "config.json").read_bytes(),
             "generation_config.json": (folder / "generation_config.json").read_bytes(),
             "model.safetensors.index.json": index_json(manifest)}
    for name, data in small.items():
        blob = git_blob_sha1(data)
        (repo / "blobs" / blob).write_bytes(data)
        _link(repo, commit, name, blob)
    for shard in manifest["shards"]:
        header, data_len = shard_header(shard["tensors"])
        if hashlib.sha256(header).hexdigest() != shard["header_sha256"] or len(header) + data_len != shard["size"]:
            raise SystemExit(f"{shard['file']}: the manifest's digests are stale; regenerate with --manifest-from")
        blob = repo / "blobs" / shard["sha256"]
        if not (blob.is_file() and blob.stat().st_size == shard["size"]):
            write_sparse(blob, header, data_len)
        _link(repo, commit, shard["file"], shard["sha256"])
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return repo / "snapshots" / commit


def main(argv: list[str] | None = None) -> int:
    """Command line: build DEST, or regenerate the manifest."""
    ap = argparse.ArgumentParser(description="Build a hub cache with realistic gemma-3-12b-it and gemma-4-E2B-it snapshots.")
    ap.add_argument("dest", nargs="?", type=Path, help="the cache folder to build (like ~/.cache/huggingface/hub)")
    ap.add_argument("--manifest-from", type=Path, metavar="JSON",
                    help='regenerate tensors.json from {"transformers": VERSION, "tensors": [[name, shape], ...]}')
    ap.add_argument("--snapshot", default=HERE.name, choices=[f.name for f in SNAPSHOTS],
                    help="the bundled snapshot whose manifest --manifest-from regenerates")
    args = ap.parse_args(argv)
    if args.manifest_from:
        folder = EXAMPLES / args.snapshot
        config = json.loads((folder / "config.json").read_text())
        repo_id = "/".join(folder.name.split("--", 1))
        src = json.loads(args.manifest_from.read_text())
        manifest = make_manifest([(n, list(s)) for n, s in src["tensors"]], src["transformers"], repo_id,
                                 config["architectures"][0])
        (folder / "tensors.json").write_text(json.dumps(manifest, separators=(",", ":")) + "\n", encoding="utf-8")
        print(f"wrote {folder / 'tensors.json'} ({len(manifest['shards'])} shards)")
        return 0
    if args.dest is None:
        ap.error("DEST is required")
    for folder in SNAPSHOTS:
        print(f"built {build(args.dest, folder=folder)}")
    print(f"next: gemma-doctor check --cache-dir {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

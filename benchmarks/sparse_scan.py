"""Benchmark `check --weights` on a sparse shard against the same bytes written densely, in one run.

A sparse shard (the bundled example cache's 33 GB of zero shards are one: a header and holes) reads as zeros; the
scan asks the file system where the holes are (SEEK_DATA) and does not read them. Builds, in a temporary folder
(deleted afterwards), one bf16 safetensors file of --gib GiB whose tensors are zeros but for one 4 KiB block of values
every --every MiB, twice: written densely (every byte on disk) and sparsely (only the blocks holding a non-zero byte).
Checks both scans are equal, then times gemma_doctor.readers.weights.scan on each, alternated, on a warm page cache
(the dense file read once first), and prints the medians and the ratio sparse / dense.
Run: .venv/bin/python benchmarks/sparse_scan.py [--gib 1] [--every 64] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gemma_doctor.readers.safetensors_header import read_header  # noqa: E402
from gemma_doctor.readers.weights import scan  # noqa: E402

ROW = 2048
BLOCK = 4096


def build(folder: Path, gib: float, every_mib: int) -> tuple[Path, Path]:
    """(dense, sparse): the same bytes; the sparse file holds only its blocks with a non-zero byte."""
    rows_per_tensor = 16384  # 64 MiB of bf16 per tensor
    n = max(1, int(gib * 2**30 // (rows_per_tensor * ROW * 2)))
    header, off = {}, 0
    for i in range(n):
        size = rows_per_tensor * ROW * 2
        name = "model.embed_tokens.weight" if i == 0 else f"model.layers.{i}.mlp.down_proj.weight"
        header[name] = {"dtype": "BF16", "shape": [rows_per_tensor, ROW], "data_offsets": [off, off + size]}
        off += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    head = struct.pack("<Q", len(raw)) + raw
    total = len(head) + off
    # One block of small bf16 values (0x3C00: 0.0078125) every `every_mib` MiB, block-aligned.
    values = struct.pack("<H", 0x3C00) * (BLOCK // 2)
    data_at = [at for at in range(BLOCK, total - BLOCK, every_mib * 2**20)]
    dense, sparse = folder / "dense.safetensors", folder / "sparse.safetensors"
    zeros = bytes(64 * 2**20)
    with open(dense, "wb") as f:
        f.write(head)
        left = total - len(head)
        while left:
            f.write(zeros[:min(left, len(zeros))])
            left -= min(left, len(zeros))
    fd_dense = os.open(dense, os.O_WRONLY)
    fd_sparse = os.open(sparse, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd_sparse, total)
        os.pwrite(fd_sparse, head, 0)
        for at in data_at:
            os.pwrite(fd_dense, values, at)
            os.pwrite(fd_sparse, values, at)
        os.fsync(fd_dense)
        os.fsync(fd_sparse)
    finally:
        os.close(fd_dense)
        os.close(fd_sparse)
    return dense, sparse


def timed(path: Path) -> tuple[float, object]:
    started = time.perf_counter()
    result = scan([("model.safetensors", read_header(path))])
    return time.perf_counter() - started, result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--every", type=int, default=64, help="MiB between the blocks of values")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gemma-doctor-sparse-bench-") as tmp:
        dense, sparse = build(Path(tmp), args.gib, args.every)
        on_disk = {p.name: os.stat(p).st_blocks * 512 for p in (dense, sparse)}
        _, want = timed(dense)  # warms the page cache with the dense file's bytes
        _, got = timed(sparse)
        assert got == want, "the sparse file's scan differs from the dense file's"
        times: dict[str, list[float]] = {"dense": [], "sparse": []}
        for _ in range(args.runs):
            for name, path in (("dense", dense), ("sparse", sparse)):
                times[name].append(timed(path)[0])
        d, s = statistics.median(times["dense"]), statistics.median(times["sparse"])
        size = os.path.getsize(dense)
        print(f"file {size / 2**30:.2f} GiB; on disk: dense {on_disk['dense.safetensors'] / 2**20:.0f} MiB, "
              f"sparse {on_disk['sparse.safetensors'] / 2**20:.1f} MiB; {args.runs} runs each, alternated, medians")
        print(f"dense  {d:.3f} s ({size / d / 2**30:.2f} GiB/s)")
        print(f"sparse {s:.3f} s")
        print(f"ratio sparse / dense: {s / d:.4f} (the scans are equal)")


if __name__ == "__main__":
    main()

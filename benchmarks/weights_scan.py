"""Benchmark `check --weights` against the read floor and the naive torch loop a user would write.

Builds a >= 2 GiB bf16 safetensors file in a temporary folder (deleted afterwards) with planted NaN,
Inf, fp16 overflow and zero embedding rows, checks the scan finds them all, then times on a warm page
cache (median of --runs):
  read floor  reading the bytes into a reused buffer, nothing else;
  doctor      gemma_doctor.readers.weights.scan (in a subprocess, which also reports its peak RSS, VmHWM);
  naive       safetensors.safe_open(path, "pt"), then per tensor torch.isfinite(t).all() and t.abs().max().
Run: .venv/bin/python benchmarks/weights_scan.py [--gib 2] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROW = 2048
EMB_ROWS = 262144  # 1 GiB of bf16 at ROW=2048
ZERO_ROWS = range(262100, 262144)


def build(path: Path, gib: float) -> dict:
    """Write the file; returns what was planted where."""
    block_rows = 16384  # 64 MiB blocks of realistic bf16 values
    rng = np.random.default_rng(0)
    block = (rng.standard_normal((block_rows, ROW), dtype=np.float32) * 0.02).view(np.uint32) >> 16
    block = block.astype("<u2")
    layer_rows = 16384
    n_layers = max(1, int(round((gib * 2**30 - EMB_ROWS * ROW * 2) / (layer_rows * ROW * 2))))
    tensors = [("model.embed_tokens.weight", EMB_ROWS)] + [
        (f"model.layers.{i}.mlp.down_proj.weight", layer_rows) for i in range(n_layers)]
    header, off = {}, 0
    for name, rows in tensors:
        n = rows * ROW * 2
        header[name] = {"dtype": "BF16", "shape": [rows, ROW], "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    start = 8 + len(raw)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for _name, rows in tensors:
            for _ in range(rows // block_rows):
                f.write(block.tobytes())
    # Plant: (tensor, flat index, bf16 bits)
    plants = {"nan": ("model.layers.1.mlp.down_proj.weight", 12345, 0x7FC1),
              "inf": ("model.layers.2.mlp.down_proj.weight", 777, 0xFF80),
              "beyond_fp16": (f"model.layers.{n_layers - 1}.mlp.down_proj.weight", layer_rows * ROW - 1, 0x47C3)}  # 99840
    with open(path, "r+b") as f:
        for name, idx, bits in plants.values():
            f.seek(start + header[name]["data_offsets"][0] + 2 * idx)
            f.write(struct.pack("<H", bits))
        zero = bytes(ROW * 2)
        for r in ZERO_ROWS:
            f.seek(start + r * ROW * 2)
            f.write(zero)
    return {"plants": plants, "size": os.path.getsize(path), "tensors": len(tensors)}


def read_floor(path: Path, chunk: int = 8 * 2**20) -> float:
    buf = bytearray(chunk)
    mv = memoryview(buf)
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.readinto(mv):
            pass
    return time.perf_counter() - t0


_DOCTOR = """
import json, resource, sys, time
def hwm():
    # Peak resident set of this process (VmHWM); ru_maxrss would carry the parent's peak across exec.
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmHWM"))

from pathlib import Path
from gemma_doctor.readers.safetensors_header import read_header
from gemma_doctor.readers.weights import scan
p = Path(sys.argv[1]); copies = int(sys.argv[2]); jobs = int(sys.argv[3])
import numpy  # imported before timing, as the naive loop imports torch before its clock starts
h = read_header(p)
t0 = time.perf_counter()
r = scan([(f"shard{i}", h) for i in range(copies)], jobs=jobs)
dt = time.perf_counter() - t0
emb = next(t for t in r.tensors if t.name == "model.embed_tokens.weight")
print(json.dumps({"seconds": dt, "maxrss_kib": hwm(),
                  "total": r.total, "zero_row_ranges": [list(x) for x in emb.zero_row_ranges]}))
"""

_NAIVE = """
import json, resource, sys, time
def hwm():
    # Peak resident set of this process (VmHWM); ru_maxrss would carry the parent's peak across exec.
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmHWM"))

import torch
from safetensors import safe_open
p = sys.argv[1]
t0 = time.perf_counter()
bad, maxabs = [], 0.0
with safe_open(p, "pt") as f:
    for name in f.keys():
        t = f.get_tensor(name)
        if not torch.isfinite(t).all():
            bad.append(name)
        maxabs = max(maxabs, float(t.abs().max()))
dt = time.perf_counter() - t0
print(json.dumps({"seconds": dt, "maxrss_kib": hwm(), "bad": bad}))
"""


def _sub(code: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], check=True, capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parent.parent)
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where to build the file (default: a temporary folder)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "model.safetensors"
        t0 = time.perf_counter()
        info = build(path, args.gib)
        print(f"built {path.name}: {info['size'] / 2**30:.2f} GiB, {info['tensors']} tensors in {time.perf_counter() - t0:.1f} s")
        read_floor(path)  # warm the page cache

        floor = [read_floor(path) for _ in range(args.runs)]
        doctor = [_sub(_DOCTOR, str(path), "1", "1") for _ in range(args.runs)]
        naive = [_sub(_NAIVE, str(path)) for _ in range(args.runs)]
        par1 = [_sub(_DOCTOR, str(path), "2", "1") for _ in range(args.runs)]
        par2 = [_sub(_DOCTOR, str(path), "2", "2") for _ in range(args.runs)]

        tot = doctor[0]["total"]
        found = {"nan": tot["nan"] == 1, "inf": tot["inf"] == 1, "beyond_fp16": tot["beyond_fp16"] == 1,
                 "zero_rows": doctor[0]["zero_row_ranges"] == [[ZERO_ROWS[0], ZERO_ROWS[-1]]]}
        print("planted values found:", found)
        assert all(found.values()), doctor[0]
        assert sorted(naive[0]["bad"]) == ["model.layers.1.mlp.down_proj.weight", "model.layers.2.mlp.down_proj.weight"]

        size = info["size"]
        med = lambda xs: statistics.median(xs)  # noqa: E731
        f_s, d_s, n_s = med(floor), med([d["seconds"] for d in doctor]), med([n["seconds"] for n in naive])
        p1, p2 = med([d["seconds"] for d in par1]), med([d["seconds"] for d in par2])
        gbps = lambda s, n=size: n / s / 1e9  # noqa: E731
        print(f"\nfile {size / 2**30:.2f} GiB, warm page cache, median of {args.runs} runs")
        print(f"{'':28}{'seconds':>10}{'GB/s':>8}{'x floor':>9}{'peak RSS':>12}")
        print(f"{'read floor (readinto)':28}{f_s:10.3f}{gbps(f_s):8.2f}{1.0:9.2f}{'-':>12}")
        print(f"{'gemma-doctor scan':28}{d_s:10.3f}{gbps(d_s):8.2f}{d_s / f_s:9.2f}"
              f"{max(d['maxrss_kib'] for d in doctor) / 1024:10.0f} MiB")
        print(f"{'naive safe_open + torch':28}{n_s:10.3f}{gbps(n_s):8.2f}{n_s / f_s:9.2f}"
              f"{max(n['maxrss_kib'] for n in naive) / 1024:10.0f} MiB")
        print(f"\ndoctor vs naive: {n_s / d_s:.1f}x faster; doctor vs read floor: {d_s / f_s:.2f}x")
        print(f"two shards (the file twice): --jobs 1 {p1:.3f} s, --jobs 2 {p2:.3f} s ({p1 / p2:.2f}x); "
              f"same totals: {par1[0]['total'] == par2[0]['total']}")


if __name__ == "__main__":
    main()

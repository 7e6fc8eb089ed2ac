"""Benchmark `check --weights` against the read floor and the naive torch loop a user would write.

Builds a >= 2 GiB bf16 safetensors file in a temporary folder (deleted afterwards) with planted NaN,
Inf, fp16 overflow and zero embedding rows, checks the scan finds them all, then times on a warm page
cache (median of --runs):
  read floor  reading the bytes into a reused buffer, nothing else;
  doctor      gemma_doctor.readers.weights.scan (in a subprocess, which also reports its peak RSS, VmHWM);
  naive       safetensors.safe_open(path, "pt"), then per tensor torch.isfinite(t).all() and t.abs().max().
Whole process (--parts whole): the file is the model.safetensors of a hub cache laid out as huggingface_hub lays it
out (tests/builders.HubCache, a Gemma 3 config.json), and `gemma-doctor check <repo> --weights --cache-dir C` is
timed against the read floor, in this process and as a whole `python -c` process, alternated, medians; its findings
are checked; then where its time goes (interpreter, imports, header reads, scan, the rest of check). With
--baseline TREE, another checkout's check --weights in the same run.
Run: .venv/bin/python benchmarks/weights_scan.py [--gib 2] [--runs 3] [--parts scan naive jobs whole]
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


ROOT = Path(__file__).resolve().parent.parent
REPO = "google/gemma-3-1b-it"


def build_hub(root: Path, gib: float) -> tuple[Path, dict]:
    """A hub cache holding REPO: a Gemma 3 config.json and the planted file as model.safetensors (an LFS blob named by
    its sha256, linked from the snapshot as huggingface_hub does). Returns the blob's path and what build() planted."""
    import hashlib

    sys.path.insert(0, str(ROOT))
    from tests.builders import HubCache, gemma3_1b_config

    hub = HubCache(root)
    snap = hub.add(REPO, {"config.json": gemma3_1b_config()})
    blob = hub.repo_dir(REPO) / "blobs" / "incoming"
    info = build(blob, gib)
    digest = hashlib.sha256()
    with open(blob, "rb", buffering=0) as f:
        buf = memoryview(bytearray(8 * 2**20))
        while n := f.readinto(buf):
            digest.update(buf[:n])
    final = blob.with_name(digest.hexdigest())
    blob.rename(final)
    os.symlink(os.path.relpath(final, snap), snap / "model.safetensors")
    return final, info


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

import os
from pathlib import Path
from gemma_doctor.readers.safetensors_header import read_header
from gemma_doctor.readers.weights import scan
p = Path(sys.argv[1]); copies = int(sys.argv[2]); jobs = int(sys.argv[3])
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as check --weights loads numpy (no spinning BLAS threads)
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


_FLOOR = """
import sys
buf = memoryview(bytearray(8 * 2**20))
with open(sys.argv[1], "rb", buffering=0) as f:
    while f.readinto(buf):
        pass
"""

# Where check --weights spends its time, one process: stage clocks around the pipeline's own functions (no profiler).
_STAGES = """
import time
T0 = time.perf_counter()
import json, sys
spent = {}
def clock(mod, name, label):
    f = getattr(mod, name)
    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            spent[label] = spent.get(label, 0.0) + time.perf_counter() - t
    setattr(mod, name, timed)
t = time.perf_counter()
from gemma_doctor.cli import main
spent["import gemma_doctor.cli (click)"] = time.perf_counter() - t
t = time.perf_counter()
import gemma_doctor.pipeline as pipeline
spent["import gemma_doctor.pipeline (rules, plans)"] = time.perf_counter() - t
import os
from pathlib import Path
_cli = Path(sys.modules["gemma_doctor.cli"].__file__)  # cli.py, or the cli/ package of one module per command
if any("OPENBLAS_NUM_THREADS" in f.read_text() for f in ([_cli] if _cli.name == "cli.py" else _cli.parent.glob("*.py"))):
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as this tree's check --weights does before numpy is imported
t = time.perf_counter()
import numpy
spent["import numpy"] = time.perf_counter() - t
from gemma_doctor.readers import weights
clock(pipeline.dtypes_census, "census", "header reads (dtype census)")
clock(weights, "scan_model", "weights scan")
clock(pipeline, "decide", "decision (recommendation, memory, prescription)")
t = time.perf_counter()
try:
    main(sys.argv[1:])
except SystemExit:
    pass
spent["rest of check (locate, configs, rules, rendering)"] = time.perf_counter() - t - sum(
    v for k, v in spent.items() if not k.startswith("import"))
spent["total since the interpreter ran this script"] = time.perf_counter() - T0
print(json.dumps(spent), file=sys.stderr)
"""


def whole_process(path: Path, cache: Path, runs: int, baseline: list[str] | None) -> None:
    """check --weights as a whole process against the read floor (in this process and as a process), alternated."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from startup import CPU, ENV, NEUTRAL, timed

    py = sys.executable
    check = ["check", REPO, "--weights", "--cache-dir", str(cache)]
    cmds = {"python -c pass (interpreter start-up)": [py, "-c", "pass"],
            "read floor, whole `python -c` process": [py, "-c", _FLOOR, str(path)]}
    if baseline:
        # Both trees run the same way (env(1) sets PYTHONPATH for each alike), from a neutral folder.
        cmds["check --weights (this tree)"] = ["env", f"PYTHONPATH={ROOT}", py, "-m", "gemma_doctor", *check]
        for tree in baseline:
            cmds[f"check --weights ({Path(tree).name})"] = ["env", f"PYTHONPATH={Path(tree).resolve()}", py, "-m",
                                                            "gemma_doctor", *check]
    else:
        cmds["check --weights (this tree)"] = [str(Path(py).parent / "gemma-doctor"), *check]
    # The findings first: the planted values, found by the whole command.
    out = subprocess.run([*cmds["check --weights (this tree)"], "--format", "json"], capture_output=True, text=True,
                         cwd=NEUTRAL, env=ENV)
    model = json.loads(out.stdout)["models"][0]
    tot = model["weights_scan"]["total"]
    got = sorted(f["code"] for f in model["findings"] if f["code"] in ("GD501", "GD502", "GD503"))
    print(f"check --weights (exit {out.returncode}): NaN {tot['nan']}, Inf {tot['inf']}, beyond fp16 {tot['beyond_fp16']}, "
          f"zero rows {tot['zero_rows']}; findings {got}")
    assert (tot["nan"], tot["inf"], tot["beyond_fp16"], tot["zero_rows"]) == (1, 1, 1, len(ZERO_ROWS)), tot
    assert got == ["GD501", "GD501", "GD502", "GD503"], got  # NaN and Inf (two tensors), beyond fp16, zero rows
    assert out.returncode == 1
    for cmd in cmds.values():
        timed(cmd)  # warm the page cache and .pyc files
    CPU.clear()
    times: dict[str, list[float]] = {k: [] for k in ["read floor, in this process", *cmds]}
    for _ in range(runs):
        times["read floor, in this process"].append(read_floor(path))
        for k, cmd in cmds.items():
            times[k].append(timed(cmd))
    med = {k: statistics.median(v) for k, v in times.items()}
    cpu = {k: statistics.median(CPU[tuple(cmd)]) for k, cmd in cmds.items()}
    size = os.path.getsize(path)
    f_in, f_proc = med["read floor, in this process"], med["read floor, whole `python -c` process"]
    print(f"\nwhole process, {size / 2**30:.2f} GiB page-cached, commands alternated, median of {runs} runs")
    best = {k: min(v) for k, v in times.items()}  # interference only adds time: the fastest run, beside the median
    b_proc = best["read floor, whole `python -c` process"]
    print(f"{'':44}{'seconds':>9}{'GB/s':>7}{'x floor (process)':>19}{'x floor (in-process)':>22}{'CPU s':>8}"
          f"{'fastest':>9}{'x floor':>8}")
    for k, v in med.items():
        rate = "" if k.startswith("python -c pass") else f"{size / v / 1e9:.2f}"
        print(f"{k:44}{v:9.3f}{rate:>7}{v / f_proc:19.2f}{v / f_in:22.2f}{f'{cpu[k]:.3f}' if k in cpu else '-':>8}"
              f"{best[k]:9.3f}{best[k] / b_proc:8.2f}")
    for tree in baseline or []:
        name = f"check --weights ({Path(tree).name})"
        t, b = med["check --weights (this tree)"], med[name]
        # Run by run (the two ran back to back): steadier than the ratio of medians while the load changes.
        paired = statistics.median(x / y for x, y in zip(times["check --weights (this tree)"], times[name]))
        print(f"this tree / {Path(tree).name}: {t / b:.2f} (median of the run-by-run ratios {paired:.2f}; "
              f"CPU {cpu['check --weights (this tree)'] / cpu[name]:.2f})")
    paired = statistics.median(x / y for x, y in zip(times["check --weights (this tree)"],
                                                     times["read floor, whole `python -c` process"]))
    print(f"check --weights / read floor (whole processes): {med['check --weights (this tree)'] / f_proc:.2f} "
          f"(median of the run-by-run ratios {paired:.2f})")
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")

    stages = []
    for _ in range(runs):
        res = subprocess.run([py, "-c", _STAGES, *check], capture_output=True, text=True, cwd=NEUTRAL,
                             env={**ENV, "PYTHONPATH": str(ROOT)})
        stages.append(json.loads(res.stderr.strip().splitlines()[-1]))
    print(f"\nwhere check --weights spends its time (this tree, stage clocks, median of {runs}):")
    print(f"  {'interpreter start-up (python -c pass, whole process)':60}{med['python -c pass (interpreter start-up)'] * 1000:7.0f} ms")
    for k in stages[0]:
        print(f"  {k:60}{statistics.median(s[k] for s in stages) * 1000:7.0f} ms")


def _sub(code: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], check=True, capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parent.parent)
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where to build the file (default: a temporary folder)")
    ap.add_argument("--parts", nargs="+", choices=("scan", "naive", "jobs", "whole"), default=["scan", "naive", "jobs", "whole"],
                    help="what to time: the in-process scan, the naive torch loop, --jobs on two shards, the whole process")
    ap.add_argument("--baseline", metavar="TREE", action="append", help="with whole: also time another checkout's check "
                    "--weights (an export of an older commit; repeat for several), all run as `python -m gemma_doctor`, "
                    "alternated in one run")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        t0 = time.perf_counter()
        path, info = build_hub(Path(tmp) / "hub", args.gib)
        print(f"built {path.name}: {info['size'] / 2**30:.2f} GiB, {info['tensors']} tensors in {time.perf_counter() - t0:.1f} s")
        read_floor(path)  # warm the page cache
        if "whole" in args.parts:
            whole_process(path, Path(tmp) / "hub", args.runs, args.baseline)
        if not {"scan", "naive", "jobs"} & set(args.parts):
            return

        parts = set(args.parts)
        floor = [read_floor(path) for _ in range(args.runs)]
        doctor = [_sub(_DOCTOR, str(path), "1", "1") for _ in range(args.runs)] if parts & {"scan", "naive"} else []
        naive = [_sub(_NAIVE, str(path)) for _ in range(args.runs)] if "naive" in parts else []
        par1 = [_sub(_DOCTOR, str(path), "2", "1") for _ in range(args.runs)] if "jobs" in parts else []
        par2 = [_sub(_DOCTOR, str(path), "2", "2") for _ in range(args.runs)] if "jobs" in parts else []

        med = lambda xs: statistics.median(xs)  # noqa: E731
        size = info["size"]
        gbps = lambda s, n=size: n / s / 1e9  # noqa: E731
        f_s = med(floor)
        if doctor:
            tot = doctor[0]["total"]
            found = {"nan": tot["nan"] == 1, "inf": tot["inf"] == 1, "beyond_fp16": tot["beyond_fp16"] == 1,
                     "zero_rows": doctor[0]["zero_row_ranges"] == [[ZERO_ROWS[0], ZERO_ROWS[-1]]]}
            print("planted values found:", found)
            assert all(found.values()), doctor[0]
            d_s = med([d["seconds"] for d in doctor])
            print(f"\nfile {size / 2**30:.2f} GiB, warm page cache, median of {args.runs} runs")
            print(f"{'':28}{'seconds':>10}{'GB/s':>8}{'x floor':>9}{'peak RSS':>12}")
            print(f"{'read floor (readinto)':28}{f_s:10.3f}{gbps(f_s):8.2f}{1.0:9.2f}{'-':>12}")
            print(f"{'gemma-doctor scan':28}{d_s:10.3f}{gbps(d_s):8.2f}{d_s / f_s:9.2f}"
                  f"{max(d['maxrss_kib'] for d in doctor) / 1024:10.0f} MiB")
        if naive:
            assert sorted(naive[0]["bad"]) == ["model.layers.1.mlp.down_proj.weight", "model.layers.2.mlp.down_proj.weight"]
            n_s = med([n["seconds"] for n in naive])
            print(f"{'naive safe_open + torch':28}{n_s:10.3f}{gbps(n_s):8.2f}{n_s / f_s:9.2f}"
                  f"{max(n['maxrss_kib'] for n in naive) / 1024:10.0f} MiB")
            print(f"\ndoctor vs naive: {n_s / d_s:.1f}x faster; doctor vs read floor: {d_s / f_s:.2f}x")
        if par1:
            p1, p2 = med([d["seconds"] for d in par1]), med([d["seconds"] for d in par2])
            print(f"two shards (the file twice): --jobs 1 {p1:.3f} s, --jobs 2 {p2:.3f} s ({p1 / p2:.2f}x); "
                  f"same totals: {par1[0]['total'] == par2[0]['total']}")


if __name__ == "__main__":
    main()

"""One shard scanned by several threads (`check --weights` on a multi-core machine): the same result as one thread,
whatever the thread count, unit and chunk sizes, including the partial result of a shard that fails mid-scan."""

from __future__ import annotations

import os

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from gemma_doctor.readers import weights
from gemma_doctor.readers.safetensors_header import read_header
from gemma_doctor.readers.weights import MAX_ZERO_RANGES, scan
from tests.test_weights_scan import TORCH_DTYPES, as_reference, planted, reference, sharded_repo


def _units_of(path, chunk_bytes: int, unit_bytes: int) -> int:
    h = read_header(path)
    floats = [t for t in h.tensors if t.dtype in weights.SPECS]
    return len(weights._units(h, floats, [weights._walk(t, chunk_bytes) for t in floats], unit_bytes))


@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16"])
@pytest.mark.parametrize("threads", [1, 2, 3, 8])
@pytest.mark.parametrize("chunk_bytes, unit_bytes", [(96, 96), (96, 1000), (1000, 2000), (8, 8)])
def test_threads_and_units_do_not_change_the_result(tmp_path, dtype, threads, chunk_bytes, unit_bytes):
    path = tmp_path / "model.safetensors"
    save_file(planted(TORCH_DTYPES[dtype]), str(path))
    one = scan([("m", read_header(path))], chunk_bytes=chunk_bytes, threads=1, unit_bytes=2**40)
    many = scan([("m", read_header(path))], chunk_bytes=chunk_bytes, threads=threads, unit_bytes=unit_bytes)
    assert _units_of(path, chunk_bytes, unit_bytes) > 3  # the work really is cut, so threads share it
    assert many == one
    assert {t.name: as_reference(t.to_json()) for t in many.tensors} == reference(path)


def test_zero_row_runs_beyond_the_kept_ranges_split_over_units(tmp_path):
    """An embedding of alternating zero rows (more runs than are kept) cut into many units: the same first
    MAX_ZERO_RANGES runs and the same count of zero rows as one pass."""
    rows = 2 * MAX_ZERO_RANGES + 301
    emb = torch.ones(rows, 3, dtype=torch.bfloat16)
    emb[::2] = 0.0
    emb[1001:1100] = 0.0  # a long run across several units
    path = tmp_path / "model.safetensors"
    save_file({"model.embed_tokens.weight": emb}, str(path))
    one = scan([("m", read_header(path))], threads=1, unit_bytes=2**40)
    [t] = one.tensors
    assert t.zero_rows == int((emb == 0).all(dim=1).sum()) and len(t.zero_row_ranges) == MAX_ZERO_RANGES
    for unit_bytes in (6, 60, 600, 6006):
        for threads in (2, 5):
            assert scan([("m", read_header(path))], chunk_bytes=60, threads=threads, unit_bytes=unit_bytes) == one


def test_rows_larger_than_a_chunk_split_over_units(tmp_path):
    """A crafted embedding whose rows are larger than a chunk is walked row by row; its rows are shared out too."""
    emb = torch.randn(40, 50).to(torch.bfloat16)
    emb[7] = 0.0
    emb[8] = 0.0
    emb[39] = 0.0
    emb[20, 49] = float("nan")
    path = tmp_path / "model.safetensors"
    save_file({"model.embed_tokens.weight": emb}, str(path))
    one = scan([("m", read_header(path))], chunk_bytes=16, threads=1, unit_bytes=2**40)
    assert one.tensors[0].zero_row_ranges == ((7, 8), (39, 39)) and one.tensors[0].nan == 1
    for unit_bytes in (1, 100, 1000):
        assert scan([("m", read_header(path))], chunk_bytes=16, threads=3, unit_bytes=unit_bytes) == one


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(dtype=st.sampled_from(["F32", "F16", "BF16"]), shapes=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 9)),
                                                                      min_size=1, max_size=5),
       seed=st.integers(0, 2**32 - 1), zero_every=st.integers(1, 4), chunk=st.sampled_from([4, 36, 100]),
       unit=st.integers(1, 400), threads=st.integers(2, 4))
def test_random_shards_any_threads(tmp_path, dtype, shapes, seed, zero_every, chunk, unit, threads):
    rng = np.random.default_rng(seed)
    width = 4 if dtype == "F32" else 2
    tensors = {}
    for k, (rows, cols) in enumerate(shapes):
        bits = rng.integers(0, 2 ** (8 * width), size=(rows, cols), dtype=np.uint64).astype(f"<u{width}")
        bits[::zero_every] = 0
        name = f"model.embed_tokens.{k}.weight" if k % 2 == 0 else f"model.layers.{k}.weight"
        tensors[name] = torch.from_numpy(bits.view(f"<i{width}").copy()).view(TORCH_DTYPES[dtype])
    path = tmp_path / f"r-{dtype}.safetensors"
    save_file(tensors, str(path))
    one = scan([("r", read_header(path))], chunk_bytes=chunk, threads=1, unit_bytes=2**40)
    assert scan([("r", read_header(path))], chunk_bytes=chunk, threads=threads, unit_bytes=unit) == one


def test_reads_without_preadv_from_several_threads(tmp_path, monkeypatch):
    """Where there is no preadv the threads share the file through one lock, each with its own buffer."""
    path = tmp_path / "model.safetensors"
    save_file(planted(torch.bfloat16), str(path))
    positional = scan([("m", read_header(path))], chunk_bytes=96, threads=1)
    monkeypatch.delattr(os, "preadv")
    assert scan([("m", read_header(path))], chunk_bytes=96, threads=4, unit_bytes=200) == positional


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_a_read_failing_mid_scan_gives_the_same_partial_result(tmp_path, monkeypatch, threads):
    """The tensors before the one that could not be read are reported, that one and the rest are not, and the shard is
    named unreadable with the error: the same for any thread count."""
    path = tmp_path / "model.safetensors"
    save_file(planted(torch.float32), str(path))
    h = read_header(path)
    floats = [t for t in h.tensors if t.dtype in weights.SPECS]
    k = next(i for i, t in enumerate(floats) if t.name == "model.layers.0.mlp.down_proj.weight")
    assert k >= 2 and any(t.nbytes for t in floats[k + 1:])  # tensors before it and after it
    broken = floats[k]  # cannot be read
    bad_from = h.data_start + broken.begin
    real = weights._read_at

    def failing(fd, view, offset):  # noqa: ANN001, ANN202
        if bad_from <= offset < h.data_start + broken.end:
            raise OSError(5, "Input/output error")
        return real(fd, view, offset)

    monkeypatch.setattr(weights, "_read_at", failing)
    got = scan([("m", h)], chunk_bytes=96, threads=threads, unit_bytes=100)
    assert [t.name for t in got.tensors] == [t.name for t in floats[:k]]
    assert got.unreadable == (("m", "Input/output error"),)
    assert got.bytes_scanned == sum(t.nbytes for t in floats[:k])


# --- the CLI process: numpy's BLAS threads do not compete with the scan's ---------------------------------------

THREADS_PROBE = """
import json, os, sys
from gemma_doctor.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps({"threads": len(os.listdir("/proc/self/task")), "env": os.environ.get("OPENBLAS_NUM_THREADS"),
                  "numpy": "numpy" in sys.modules}), file=sys.stderr)
"""


def _threads_after_check(hub, repo: str, *extra_env: tuple[str, str]) -> dict:
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("GEMMA_DOCTOR_PROGRESS", "OPENBLAS_NUM_THREADS")}
    env.update(extra_env)
    res = subprocess.run([sys.executable, "-c", THREADS_PROBE, "check", repo, "--cache-dir", str(hub.root), "--weights"],
                         capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent, env=env, timeout=120)
    return json.loads(res.stderr.strip().splitlines()[-1])


@pytest.mark.skipif(not Path("/proc/self/task").is_dir() or weights.usable_cores() < 2,
                    reason="needs /proc and two cores (one core starts no extra BLAS thread)")
def test_check_weights_loads_numpy_with_one_blas_thread_and_leaves_the_environment(hub):
    repo = sharded_repo(hub, "BF16")
    after = _threads_after_check(hub, repo)
    # Only the main thread is left: the scan's threads are joined and OpenBLAS started none of its own.
    assert after == {"threads": 1, "env": None, "numpy": True}
    # A value the user set is theirs: OpenBLAS then runs its own threads.
    assert _threads_after_check(hub, repo, ("OPENBLAS_NUM_THREADS", "2")) == {"threads": 2, "env": "2", "numpy": True}

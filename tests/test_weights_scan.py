"""`check --weights`: NaN/Inf, values beyond fp16 and zero embedding rows, against a plain torch reference."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import save_file

from gemma_doctor.readers.safetensors_header import read_header
from gemma_doctor.readers.weights import EMBEDDING_MARKERS, scan
from tests.builders import HubCache, gemma3_1b_config

TORCH_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def planted(dtype: torch.dtype, seed: int = 0) -> dict[str, torch.Tensor]:
    """Tensors with NaN, +-Inf, values beyond fp16 and zero embedding rows planted at known places."""
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(64, 48, generator=g)
    emb[3:6] = 0.0
    emb[60] = -0.0
    emb[61, 7] = 0.0  # one zero value is not a zero row
    mlp = torch.randn(37, 53, generator=g) * 100
    mlp[0, 0] = float("nan")
    mlp[5, 9] = float("inf")
    mlp[36, 52] = float("-inf")
    mlp[10, 10] = 70000.0  # beyond fp16 (becomes inf when saved in fp16)
    mlp[11, 11] = -1.0e6
    mlp[12, 12] = 65504.0  # exactly fp16's max: not beyond
    head = torch.randn(64, 48, generator=g)
    head[63] = 0.0
    return {
        "model.embed_tokens.weight": emb.to(dtype),
        "model.layers.0.mlp.down_proj.weight": mlp.to(dtype),
        "lm_head.weight": head.to(dtype),
        "model.norm.weight": torch.ones(48, dtype=dtype),
        "model.scalar": torch.tensor(3.5, dtype=dtype),
        "model.empty": torch.zeros(0, 4, dtype=dtype),
        "model.layers.0.counts": torch.arange(10, dtype=torch.int32),
    }


def reference(path: Path) -> dict[str, dict]:
    """What a straightforward torch reader finds, per float tensor."""
    out: dict[str, dict] = {}
    with safe_open(str(path), "pt") as f:
        for name in f.keys():
            t = f.get_tensor(name)
            if t.dtype not in TORCH_DTYPES.values():
                continue
            x = t.float()
            finite = x[torch.isfinite(x)].abs()
            entry = {"nan": int(torch.isnan(x).sum()), "inf": int(torch.isinf(x).sum()),
                     "max_abs": float(finite.max()) if finite.numel() else None,
                     "beyond_fp16": int((finite > 65504).sum())}
            if t.dim() == 2 and any(m in name for m in EMBEDDING_MARKERS):
                rows = (x == 0).all(dim=1).nonzero().flatten().tolist()
                entry["zero_rows"] = len(rows)
                entry["rows"] = rows
            out[name] = entry
    return out


def expand(ranges: list[list[int]]) -> list[int]:
    return [r for a, b in ranges for r in range(a, b + 1)]


def as_reference(tensor_json: dict) -> dict:
    out = {k: tensor_json[k] for k in ("nan", "inf", "max_abs", "beyond_fp16")}
    if "zero_rows" in tensor_json:
        out["zero_rows"] = tensor_json["zero_rows"]
        out["rows"] = expand(tensor_json["zero_row_ranges"])
    return out


@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16"])
@pytest.mark.parametrize("chunk_bytes", [96, 1000, 8 * 1024 * 1024])
def test_scan_matches_torch_reference(tmp_path, dtype, chunk_bytes):
    path = tmp_path / "model.safetensors"
    save_file(planted(TORCH_DTYPES[dtype]), str(path))
    result = scan([("model.safetensors", read_header(path))], chunk_bytes=chunk_bytes)
    got = {t.name: as_reference(t.to_json()) for t in result.tensors}
    assert got == reference(path)
    assert result.skipped == {"I32": 1}
    emb = got["model.embed_tokens.weight"]
    assert emb["rows"] == [3, 4, 5, 60]
    assert got["lm_head.weight"]["rows"] == [63]
    mlp = got["model.layers.0.mlp.down_proj.weight"]
    assert mlp["nan"] == 1
    if dtype == "F16":
        assert mlp["inf"] == 4 and mlp["beyond_fp16"] == 0  # 70000 and -1e6 overflowed when saved in fp16
    else:
        # 65504 itself rounds up to 65536 in bf16, so it is beyond fp16 there.
        assert mlp["inf"] == 2 and mlp["beyond_fp16"] == (3 if dtype == "BF16" else 2)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(dtype=st.sampled_from(["F32", "F16", "BF16"]), rows=st.integers(1, 9), cols=st.integers(1, 9),
       seed=st.integers(0, 2**32 - 1), zero_rows=st.lists(st.integers(0, 8), max_size=4),
       chunk=st.sampled_from([4, 36, 4096]))
def test_random_bit_patterns(tmp_path, dtype, rows, cols, seed, zero_rows, chunk):
    """Arbitrary bit patterns (every NaN payload, subnormals, -0) give what torch finds."""
    rng = np.random.default_rng(seed)
    width = 4 if dtype == "F32" else 2
    bits = rng.integers(0, 2 ** (8 * width), size=(rows, cols), dtype=np.uint64).astype(f"<u{width}")
    for r in zero_rows:
        if r < rows:
            bits[r] = 0x8000 if width == 2 else 0
    t = torch.from_numpy(bits.view(f"<i{width}").copy()).view(TORCH_DTYPES[dtype])
    path = tmp_path / f"r-{dtype}.safetensors"
    save_file({"wte.weight": t, "x.weight": t.clone()}, str(path))
    result = scan([("r.safetensors", read_header(path))], chunk_bytes=chunk)
    assert {t.name: as_reference(t.to_json()) for t in result.tensors} == reference(path)


# --- CLI ------------------------------------------------------------------------------------------

def sharded_repo(hub: HubCache, dtype: str) -> str:
    tensors = planted(TORCH_DTYPES[dtype])
    names = list(tensors)
    files: dict[str, bytes | dict] = {"config.json": gemma3_1b_config()}
    weight_map: dict[str, str] = {}
    tmp = hub.root.parent / "st-build"
    tmp.mkdir(exist_ok=True)
    for i, part in enumerate([names[:2], names[2:4], names[4:]], start=1):
        fname = f"model-0000{i}-of-00003.safetensors"
        save_file({n: tensors[n] for n in part}, str(tmp / fname))
        files[fname] = (tmp / fname).read_bytes()
        weight_map.update({n: fname for n in part})
    files["model.safetensors.index.json"] = {"metadata": {}, "weight_map": weight_map}
    repo = f"me/planted-{dtype.lower()}"
    hub.add(repo, files)
    return repo


def run_json(cli, hub: HubCache, repo: str, *extra: str) -> dict:
    # An H100 plans bf16, so GD502 stays info for bf16 weights whatever GPU this machine has.
    r = cli("check", repo, "--cache-dir", hub.root, "--format", "json", "--weights", "--gpu", "H100", *extra)
    assert r.code == 1, r  # NaN/Inf are errors
    return r.json()["models"][0]


@pytest.mark.parametrize("dtype", ["BF16", "F16"])
def test_cli_weights_json_and_findings(cli, hub, dtype):
    repo = sharded_repo(hub, dtype)
    m = run_json(cli, hub, repo)
    ws = m["weights_scan"]
    snap = next(hub.repo_dir(repo).glob("snapshots/*"))
    ref: dict[str, dict] = {}
    for f in sorted(snap.glob("*.safetensors")):
        ref.update(reference(f))
    assert {t["name"]: as_reference(t) for t in ws["tensors"]} == ref
    assert ws["total"]["nan"] == 1 and ws["total"]["zero_rows"] == 5
    assert ws["skipped"] == {"I32": 1}
    by_code: dict[str, list[dict]] = {}
    for f in m["findings"]:
        by_code.setdefault(f["code"], []).append(f)
    assert [f["key"] for f in by_code["GD501"]] == ["model.layers.0.mlp.down_proj.weight"]
    assert by_code["GD501"][0]["severity"] == "error" and by_code["GD501"][0]["file"] == "model-00001-of-00003.safetensors"
    assert sorted(f["key"] for f in by_code["GD503"]) == ["lm_head.weight", "model.embed_tokens.weight"]
    emb = next(f for f in by_code["GD503"] if f["key"] == "model.embed_tokens.weight")
    assert "3-5, 60" in emb["message"] and "mean" in emb["fix"] and emb["severity"] == "warning"
    assert [f["severity"] for f in by_code["GD504"]] == ["info"]
    if dtype == "BF16":
        assert [f["severity"] for f in by_code["GD502"]] == ["info"]  # not fp16 weights, no fp16 plan
    else:
        assert "GD502" not in by_code  # fp16 files cannot hold finite values beyond fp16


def test_gd502_follows_the_precision_the_run_trains_in(cli, hub, tmp_path):
    """The precision of the run check judges is the training config's where it sets one: bf16 weights with values
    beyond fp16, on an H100 (bf16 recommended), trained with `fp16: true` overflow; before, GD502 read the recommended
    precision and said "only if cast to fp16" beside a run in fp16."""
    repo = sharded_repo(hub, "BF16")
    config = tmp_path / "args.yaml"
    config.write_text("fp16: true\nper_device_train_batch_size: 1\n", encoding="utf-8")
    m = run_json(cli, hub, repo, "--training-config", str(config))
    assert m["run"]["precision"] == {"value": "fp16", "source": "training config fp16"}
    [gd502] = [f for f in m["findings"] if f["code"] == "GD502"]
    assert gd502["severity"] == "warning" and "(fp16 is planned)" in gd502["message"]


def test_results_do_not_depend_on_jobs(cli, hub):
    repo = sharded_repo(hub, "BF16")
    one = run_json(cli, hub, repo, "--jobs", "1")
    two = run_json(cli, hub, repo, "--jobs", "2")
    assert one["weights_scan"] == two["weights_scan"] and one["findings"] == two["findings"]


def test_no_scan_without_flag(cli, hub):
    repo = sharded_repo(hub, "BF16")
    r = cli("check", repo, "--cache-dir", hub.root, "--format", "json")
    m = r.json()["models"][0]
    assert "weights_scan" not in m and not [f for f in m["findings"] if f["code"].startswith("GD5")]


def test_progress_only_on_stderr(cli, hub, monkeypatch):
    monkeypatch.setenv("GEMMA_DOCTOR_PROGRESS", "1")
    repo = sharded_repo(hub, "BF16")
    r = cli("check", repo, "--cache-dir", hub.root, "--format", "json", "--weights")
    json.loads(r.out)  # stdout is exactly the JSON document
    assert "scanning" in r.err and "scanning" not in r.out
    monkeypatch.setenv("GEMMA_DOCTOR_PROGRESS", "0")
    assert "scanning" not in cli("check", repo, "--cache-dir", hub.root, "--weights").err


def test_corrupt_shard_is_reported_not_scanned(cli, hub):
    good = hub.root.parent / "g.safetensors"
    save_file({"model.embed_tokens.weight": torch.zeros(4, 4, dtype=torch.bfloat16)}, str(good))
    hub.add("me/half-broken", {"config.json": gemma3_1b_config(),
                               "model.safetensors.index.json": {"weight_map": {"model.embed_tokens.weight": "a.safetensors",
                                                                               "b": "b.safetensors"}},
                               "a.safetensors": good.read_bytes(), "b.safetensors": good.read_bytes()[:-3]})
    r = cli("check", "me/half-broken", "--cache-dir", hub.root, "--format", "json", "--weights")
    m = r.json()["models"][0]
    codes = [f["code"] for f in m["findings"]]
    assert "GD204" in codes and "GD504" in codes and "GD503" in codes
    assert [u["file"] for u in m["weights_scan"]["unreadable"]] == ["b.safetensors"]


# --- the GD502 severity follows the precision plan (pure rule) ------------------------------------

def _weights_findings(tmp_path: Path, tensors, precision: str | None = None, dominant: str | None = "BF16") -> list:
    """The weights rule alone on a scan of ``tensors`` (census None when ``dominant`` is None)."""
    from gemma_doctor.facts import CheckOptions, Environment, ModelFacts
    from gemma_doctor.family import detect
    from gemma_doctor.locate import Snapshot
    from gemma_doctor.readers.dtypes import DtypeCensus
    from gemma_doctor.readers.jsonfile import JsonFile
    from gemma_doctor.readers.versions import installed
    from gemma_doctor.readers.weights import WeightsScan
    from gemma_doctor.rules import weights

    cfg = gemma3_1b_config()
    facts = ModelFacts(Snapshot("x", tmp_path), JsonFile(tmp_path / "config.json", True, data=cfg),
                       JsonFile(tmp_path / "generation_config.json", False), detect(cfg),
                       weights_scan=WeightsScan(tuple(tensors), 16),
                       census=DtypeCensus(declared=None, dominant=dominant) if dominant else None)
    env = Environment(installed())
    if precision is not None:  # the Run the pipeline puts on the facts: this model planned in ``precision``
        from gemma_doctor import run
        from gemma_doctor.plan import runplan
        from gemma_doctor.readers.gpu import resolve

        mem = runplan.plan_memory(runplan.shape_for(cfg, None), precision=precision, gpu=resolve(None),
                                  request=runplan.MemoryRequest(), training_config=None, task="sft")
        facts = facts.with_(run=run.resolve(mem, model=facts.family.model_type, stack=env.libraries,
                                            trainer=run.trainer_of(None)))
        assert facts.run.precision.value == precision
    return list(weights.check(facts, env, CheckOptions(weights=True)))


@pytest.mark.parametrize("precision, dominant, severity, why", [
    ("fp16", "BF16", "warning", "fp16 is planned"), ("fp16", "F16", "warning", "fp16 is planned"),
    ("bf16", "BF16", "info", "only if cast to fp16"), (None, "F16", "warning", "the weights are saved in fp16"),
    (None, "BF16", "info", "only if cast to fp16"), (None, None, "info", "only if cast to fp16"),
])
def test_beyond_fp16_severity(tmp_path, precision, dominant, severity, why):
    from gemma_doctor.readers.weights import TensorScan

    found = _weights_findings(tmp_path, [TensorScan("a.weight", "model.safetensors", "F32", (4,), beyond_fp16=3, max_abs=1e6)],
                              precision, dominant)
    assert [(f.code, f.severity.value, f.key) for f in found] == [("GD502", severity, "a.weight")]
    assert f"3 value(s) beyond fp16's range (|x| > 65504) in 1 tensor(s) ({why}): a.weight" == found[0].message


@pytest.mark.parametrize("count, names", [
    (10, ", ".join(f"t{i}.weight" for i in range(10))),
    (11, ", ".join(f"t{i}.weight" for i in range(10)) + " and 1 more"),
])
def test_long_lists_of_tensors_are_cut_after_ten_names(tmp_path, count, names):
    from gemma_doctor.readers.weights import TensorScan

    over = [TensorScan(f"t{i}.weight", "model.safetensors", "F32", (4,), beyond_fp16=1, max_abs=1e5) for i in range(count)]
    [gd502] = _weights_findings(tmp_path, over)
    assert gd502.message.endswith(f"(only if cast to fp16): {names}")


def test_nan_findings_beyond_ten_tensors_are_summed_up_with_their_names(tmp_path):
    from gemma_doctor.readers.weights import TensorScan

    bad = [TensorScan(f"t{i}.weight", "model.safetensors", "F32", (4,), nan=1) for i in range(22)]
    found = _weights_findings(tmp_path, bad)
    assert [f.code for f in found] == ["GD501"] * 11
    assert found[-1].message == ("12 more tensors hold NaN/Inf: " + ", ".join(f"t{i}.weight" for i in range(10, 20))
                                 + " and 2 more")


@pytest.mark.parametrize("ranges, shown", [
    # Odd rows: row 0 is the pad row, zero by design and never counted (tested on its own).
    (tuple((2 * i + 1, 2 * i + 1) for i in range(8)), "1, 3, 5, 7, 9, 11, 13, 15"),
    (tuple((2 * i + 1, 2 * i + 1) for i in range(9)), "1, 3, 5, 7, 9, 11, 13, 15 (+1 more ranges)"),
    (((3, 5), (60, 60)), "3-5, 60"),
])
def test_zero_rows_name_the_row_count_and_at_most_eight_ranges(tmp_path, ranges, shown):
    from gemma_doctor.readers.weights import TensorScan

    rows = sum(b - a + 1 for a, b in ranges)
    emb = TensorScan("model.embed_tokens.weight", "model.safetensors", "BF16", (64, 48), embedding=True,
                     zero_rows=rows, zero_row_ranges=ranges)
    [gd503] = _weights_findings(tmp_path, [emb])
    assert gd503.message.startswith(f"model.embed_tokens.weight has {rows} all-zero row(s) of 64: {shown} (zero-initialised")


def test_read_fallback_without_preadv(tmp_path, monkeypatch):
    """Where there is no preadv the scan seeks and reads into the same reused buffer and finds the same."""
    path = tmp_path / "model.safetensors"
    save_file(planted(torch.bfloat16), str(path))
    positional = scan([("m", read_header(path))], chunk_bytes=1000)
    monkeypatch.delattr(os, "preadv")
    assert scan([("m", read_header(path))], chunk_bytes=1000) == positional


def test_file_changed_after_header_read(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file(planted(torch.float32), str(path))
    h = read_header(path)
    with open(path, "ab") as f:
        f.write(b"\0" * 16)
    result = scan([("model.safetensors", h)])
    assert result.tensors == () and [f for f, _ in result.unreadable] == ["model.safetensors"]


# --- sparse files: a hole is known to read as zeros, and is not read -------------------------------------------------
BLOCK = 4096  # holes come in file system blocks


def sparse_pair(tmp_path: Path, dtype: torch.dtype) -> tuple[Path, Path]:
    """The same safetensors bytes twice: written densely, and written sparsely (only the blocks holding a non-zero
    byte; the rest left as holes), with zero stretches inside tensors, across tensors and at the end of the file."""
    g = torch.Generator().manual_seed(1)
    emb = torch.zeros(1024, 64, dtype=dtype)  # 64-128 KiB: zero rows in holes around a few rows of data
    emb[100:104] = torch.randn(4, 64, generator=g).to(dtype)
    emb[700, 3] = float("nan")
    mlp = torch.zeros(64, 1024, dtype=dtype)
    mlp[40] = torch.randn(1024, generator=g).to(dtype) * 1e5  # beyond fp16 where the dtype can hold it
    mlp[41, 9] = float("inf")
    tensors = {"model.embed_tokens.weight": emb, "model.layers.0.mlp.down_proj.weight": mlp,
               # safetensors lays tensors out by name: this one is last, a hole up to the end of the file
               "transformer.wte.weight": torch.zeros(512, 64, dtype=dtype)}
    dense = tmp_path / "dense.safetensors"
    save_file(tensors, str(dense))
    data = dense.read_bytes()
    sparse = tmp_path / "sparse.safetensors"
    fd = os.open(sparse, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, len(data))
        for at in range(0, len(data), BLOCK):
            block = data[at:at + BLOCK]
            if block.count(0) != len(block):
                os.pwrite(fd, block, at)
    finally:
        os.close(fd)
    assert sparse.read_bytes() == data
    return dense, sparse


def _holes(path: Path) -> int:
    """Bytes of ``path`` in holes, as the file system reports them."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size, at, held = os.fstat(fd).st_size, 0, 0
        while at < size:
            hole = os.lseek(fd, at, os.SEEK_HOLE)
            try:
                at = os.lseek(fd, hole, os.SEEK_DATA)
            except OSError:  # ENXIO: a hole up to the end
                at = size
            held += at - hole
        return held
    finally:
        os.close(fd)


@pytest.mark.parametrize("dtype", ["F32", "BF16"])
@pytest.mark.parametrize("chunk_bytes, threads", [(1000, 1), (BLOCK, 2), (3 * BLOCK + 8, 3), (2 * 1024 * 1024, 1)])
def test_a_sparse_file_scans_as_the_same_bytes_written_densely(tmp_path, dtype, chunk_bytes, threads):
    dense, sparse = sparse_pair(tmp_path, TORCH_DTYPES[dtype])
    assert _holes(sparse) > 0 == _holes(dense)  # the file system keeps the holes
    got = scan([("m", read_header(sparse))], chunk_bytes=chunk_bytes, threads=threads, unit_bytes=8 * BLOCK)
    want = scan([("m", read_header(dense))], chunk_bytes=chunk_bytes, threads=threads, unit_bytes=8 * BLOCK)
    assert got == want
    assert {t.name: as_reference(t.to_json()) for t in got.tensors} == reference(dense)
    last = {t.name: t for t in got.tensors}["transformer.wte.weight"]
    assert last.zero_rows == 512 and last.zero_row_ranges == ((0, 511),)


def test_the_holes_are_not_read_and_past_the_end_is_no_hole(tmp_path):
    """What the scan asks of the file system: a chunk in a hole is all zeros (not read), a chunk holding data is
    read, and once the file is cut short a chunk past its new end is no hole (the read then says the file ended)."""
    from gemma_doctor.readers.weights import _Source

    _, sparse = sparse_pair(tmp_path, torch.float32)
    h = read_header(sparse)
    last = h.tensors[-1]
    assert last.name == "transformer.wte.weight" and h.data_start + last.end == h.file_size
    start = h.data_start + last.begin + BLOCK  # a block inside the trailing hole
    src = _Source(h)
    try:
        assert src.hole(start, BLOCK) and src.hole(start, h.file_size - start)
        assert not src.hole(0, BLOCK)  # the header is data
        assert not src.hole(start, h.file_size - start + 1)  # one byte past the end
        os.truncate(sparse, start)
        assert not src.hole(start, BLOCK)
    finally:
        src.close()


def test_a_sparse_file_cut_short_under_the_scan_is_unreadable_not_zeros(tmp_path):
    """Its owner truncates the shard while it is scanned: the holes past the new end are not taken for zeros."""
    from gemma_doctor.readers.weights import scan_shard

    _, sparse = sparse_pair(tmp_path, torch.float32)
    h = read_header(sparse)
    cut = []

    def advance(n: int) -> None:
        if not cut:
            cut.append(n)
            os.truncate(sparse, h.data_start + BLOCK)

    tensors, _, _, error = scan_shard(h, "m", advance, chunk_bytes=BLOCK)
    assert error is not None and "file ended early" in error, error
    assert [t.name for t in tensors] == []  # the first tensor is not whole: nothing of the rest is reported


@pytest.mark.parametrize("missing", ["SEEK_DATA", "preadv"])
def test_a_sparse_file_without_seek_data_or_preadv_is_read_and_scans_the_same(tmp_path, monkeypatch, missing):
    """Where the system cannot say where the holes are, every chunk is read; without preadv the lseek that asks is
    taken under the lock of the seek-and-read fallback. The same result either way."""
    dense, sparse = sparse_pair(tmp_path, torch.bfloat16)
    want = scan([("m", read_header(dense))], chunk_bytes=1000)
    monkeypatch.delattr(os, missing)
    assert scan([("m", read_header(sparse))], chunk_bytes=1000) == want

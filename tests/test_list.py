"""`gemma-doctor list`: cached Gemma models with family, revision, size, dtype and status; hf-style filters."""

from __future__ import annotations

import pytest

from gemma_doctor.listing import parse_size
from tests.builders import gemma2_config, gemma3_1b_config, gemma3_12b_config, generation_config, llama_config, variant


# These tests exercise the on-disk fix, planned only where transformers 4.50.x will run (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("plan_450")

def _safetensors(dtype: str, count: int) -> bytes:
    """A valid one-tensor safetensors file of ``count`` elements (2 or 4 bytes each), all zero."""
    import json

    width = {"BF16": 2, "F32": 4}[dtype]
    header = json.dumps({"w": {"dtype": dtype, "shape": [count], "data_offsets": [0, width * count]}}).encode()
    header += b" " * (-len(header) % 8)
    return len(header).to_bytes(8, "little") + header + b"\0" * (width * count)


WEIGHTS = _safetensors("BF16", 2500)


@pytest.fixture
def cache(hub):
    """Four Gemma repos (one needing a fix, one fixed by hand, one broken, one shared-blob pair) and a Llama."""
    hub.add("google/gemma-3-12b-it", {"config.json": gemma3_12b_config(), "generation_config.json": generation_config(),
                                      "model.safetensors": WEIGHTS})
    # the same weights in a second revision: its blob is counted once per snapshot, never twice in one
    hub.add("google/gemma-3-12b-it", {"config.json": gemma3_12b_config(), "model.safetensors": WEIGHTS,
                                      "copy.safetensors": WEIGHTS}, refs=("pr/1",))
    fixed = variant(gemma3_1b_config(), use_cache=False)
    hub.add("google/gemma-3-1b-it", {"config.json": fixed, "generation_config.json": {**generation_config(), "use_cache": False}})
    hub.add("google/gemma-2-2b-it", {"config.json": variant(gemma2_config(), torch_dtype="float32"), "model.safetensors": _safetensors("F32", 25)})
    hub.add("acme/broken", {"config.json": b'{"model_type": "gemma3_text", '})
    hub.add("meta/llama", {"config.json": llama_config()})
    return hub


def test_json_lists_every_gemma_model_with_status_size_and_dtype(cache, cli):
    r = cli("list", "--cache-dir", cache.root, "--format", "json")
    assert r.code == 0, r
    doc = r.json()
    rows = {m["repo_id"]: m for m in doc["models"]}
    assert doc["skipped"] == 1  # the Llama
    assert sorted(rows) == ["acme/broken", "google/gemma-2-2b-it", "google/gemma-3-12b-it", "google/gemma-3-1b-it"]
    g12 = rows["google/gemma-3-12b-it"]
    assert (g12["family"], g12["dtype"], g12["status"], g12["revision"]) == ("gemma3", "bfloat16", "needs-fix", "main")
    assert g12["next_command"] == f"gemma-doctor fix google/gemma-3-12b-it --cache-dir {cache.root} --with transformers==4.50.3 --inplace"
    config_bytes = len((cache.repo_dir("google/gemma-3-12b-it") / "snapshots" / g12["commit"] / "config.json").read_bytes())
    gen_bytes = len((cache.repo_dir("google/gemma-3-12b-it") / "snapshots" / g12["commit"] / "generation_config.json").read_bytes())
    assert g12["size"] == config_bytes + gen_bytes + len(WEIGHTS)
    assert (rows["google/gemma-3-1b-it"]["status"], rows["google/gemma-2-2b-it"]["status"]) == ("ok", "needs-fix")
    assert rows["google/gemma-2-2b-it"]["dtype"] == "float32"
    assert (rows["acme/broken"]["status"], rows["acme/broken"]["family"]) == ("error", None)


def test_shared_blobs_are_counted_once(cache, cli):
    r = cli("list", "--cache-dir", cache.root, "--all-revisions", "--filter", "name=google/gemma-3-12b-it", "--format", "json")
    rows = {m["revision"]: m for m in r.json()["models"]}
    snap = cache.repo_dir("google/gemma-3-12b-it") / "snapshots" / rows["pr/1"]["commit"]
    # model.safetensors and copy.safetensors link to one blob: WEIGHTS once, plus config.json
    assert rows["pr/1"]["size"] == len((snap / "config.json").read_bytes()) + len(WEIGHTS)


def test_fixed_by_doctor_shows_fixed(cache, cli):
    assert cli("fix", "google/gemma-3-12b-it", "--inplace", "--cache-dir", cache.root).code == 0
    r = cli("list", "--cache-dir", cache.root, "--filter", "name=google/gemma-3-12b-it", "--format", "json")
    [row] = r.json()["models"]
    assert (row["status"], row["next_command"]) == ("fixed", None)


@pytest.mark.parametrize("args, expected", [
    (["--filter", "family=gemma3"], ["google/gemma-3-12b-it", "google/gemma-3-1b-it"]),
    (["--filter", "status=needs-fix", "--sort", "name:desc"], ["google/gemma-3-12b-it", "google/gemma-2-2b-it"]),
    (["--filter", "size>4KB"], ["google/gemma-3-12b-it"]),
    (["--filter", "size<=4KB", "--filter", "dtype!=float32"], ["acme/broken", "google/gemma-3-1b-it"]),
    (["--sort", "size", "--limit", "2"], ["google/gemma-3-12b-it", "google/gemma-3-1b-it"]),
    (["--sort", "status"], ["google/gemma-3-1b-it", "google/gemma-2-2b-it", "google/gemma-3-12b-it", "acme/broken"]),
    (["--filter", "name=google/*", "--sort", "name"], ["google/gemma-2-2b-it", "google/gemma-3-12b-it", "google/gemma-3-1b-it"]),
])
def test_filters_sort_and_limit_like_hf_cache_ls(cache, cli, args, expected):
    r = cli("list", "--cache-dir", cache.root, "-q", *args)
    assert r.code == 0, r
    assert r.out.splitlines() == expected


@pytest.mark.parametrize("args, message", [
    (["--filter", "colour=red"], "KEY=VALUE"),
    (["--filter", "size>lots"], "not a size"),
    (["--filter", "status=rotten"], "status is one of ok, needs-fix, fixed, broken, error"),
    (["--filter", "family>gemma"], "family takes = or !="),
    (["--sort", "age"], "--sort 'age'"),
])
def test_bad_filters_are_one_line_usage_errors(cache, cli, args, message):
    r = cli("list", "--cache-dir", cache.root, *args)
    assert r.code == 2
    assert message in r.err and r.err.count("\n") == 1 and r.out == ""


def test_text_table_has_no_colour_or_box_art_off_a_terminal_and_names_the_next_command(cache, cli):
    r = cli("list", "--cache-dir", cache.root)
    lines = r.out.splitlines()
    assert lines[0].split() == ["REPO", "REVISION", "FAMILY", "DTYPE", "SIZE", "STATUS"]
    row = next(line for line in lines if line.startswith("google/gemma-3-12b-it"))
    assert row.split()[1:4] == ["main", "gemma3", "bfloat16"] and row.split()[-1] == "needs-fix"
    assert "\x1b[" not in r.out and not any(ch in r.out for ch in "│─┃━┏┌")
    assert f"gemma-doctor fix google/gemma-2-2b-it --cache-dir {cache.root} --with transformers==4.50.3 --inplace" in r.err


def test_empty_cache_suggests_a_download(hub, cli):
    r = cli("list", "--cache-dir", hub.root, "--format", "json")
    assert r.json()["models"] == [] and "hf download" in r.err


def test_parse_size_units():
    assert (parse_size("1GB"), parse_size("1.5M"), parse_size("2GiB"), parse_size("10")) == (10**9, 1_500_000, 2 * 2**30, 10)


def test_see_why_names_the_cache_and_the_stack_the_listing_read(cache, cli):
    """The hint's `check` dropped --cache-dir and --with: copied, it checked another cache with another stack."""
    r = cli("list", "--cache-dir", cache.root, "--with", "transformers==4.50.3", "--with", "peft==0.11.0")
    why = r.err.split("see why with: ", 1)[1].split(", then:")[0]
    assert why.startswith("gemma-doctor check google/gemma-")
    assert f"--cache-dir {cache.root}" in why and "--with transformers==4.50.3 --with peft==0.11.0" in why


def test_status_follows_what_each_code_is():
    from gemma_doctor.listing import RowStatus, status_of

    assert status_of({"GD001", "GD203"}, False, False) is RowStatus.ERROR
    assert status_of({"GD204", "GD101"}, False, False) is RowStatus.BROKEN
    assert status_of({"GD104"}, False, False) is RowStatus.NEEDS_FIX
    assert status_of({"GD640", "GD999"}, True, False) is RowStatus.FIXED

"""Issue 9: gemma-doctor as a new user finds it. Each test names the point of the issue it keeps fixed."""

from __future__ import annotations

import json

import pytest

from tests.builders import gemma3_12b_config, generation_config

SHARD_1, SHARD_2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"


def _safetensors(names: list[str]) -> bytes:
    """A valid safetensors file holding one BF16 scalar-ish tensor per name."""
    header = {n: {"dtype": "BF16", "shape": [1], "data_offsets": [2 * i, 2 * i + 2]} for i, n in enumerate(names)}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw + b"\0" * (2 * len(names))


def _sharded(hub, repo: str, second: bytes | None):  # noqa: ANN001, ANN202
    files = {"config.json": gemma3_12b_config(), "generation_config.json": generation_config(),
             "model.safetensors.index.json": {"metadata": {}, "weight_map": {"a": SHARD_1, "b": SHARD_2}},
             SHARD_1: _safetensors(["a"])}
    if second is not None:
        files[SHARD_2] = second
    return hub.add(repo, files)


# --- point 2: list tells a broken download from a missing fix ------------------------------------------------

@pytest.mark.parametrize("plan", [[], ["--with", "transformers==4.50.3"]], ids=["installed", "planned-4.50"])
@pytest.mark.parametrize("second, code", [(None, "GD203"), (_safetensors(["b"])[:-1], "GD204")],
                         ids=["missing-shard", "truncated-shard"])
def test_list_calls_a_model_with_a_missing_or_truncated_shard_broken_and_says_download_it_again(hub, cli, plan, second, code):
    _sharded(hub, "google/gemma-3-4b-it", second)
    check = cli("check", "google/gemma-3-4b-it", "--cache-dir", hub.root, "--format", "json", *plan)
    assert code in {f["code"] for f in check.json()["models"][0]["findings"]}
    row = cli("list", "--cache-dir", hub.root, "--format", "json", *plan).json()["models"][0]
    assert row["status"] == "broken"
    assert row["next_command"] == f"hf download google/gemma-3-4b-it {SHARD_2} --cache-dir {hub.root} --force-download"
    text = cli("list", "--cache-dir", hub.root, *plan)
    assert text.out.split("\n")[1].split()[-1] == "broken"
    assert "gemma-doctor fix" not in text.err and "--inplace" not in text.err and "need a fix" not in text.err
    assert f"hf download google/gemma-3-4b-it {SHARD_2}" in text.err and "--force-download" in text.err
    assert cli("list", "--cache-dir", hub.root, "--filter", "status=broken", "--quiet", *plan).out == "google/gemma-3-4b-it\n"


def test_list_keeps_calling_a_complete_model_ok(hub, cli):
    _sharded(hub, "google/gemma-3-4b-it", _safetensors(["b"]))
    row = cli("list", "--cache-dir", hub.root, "--format", "json").json()["models"][0]
    assert (row["status"], row["next_command"]) == ("ok", None)


# --- point 4: a CI gate that checked nothing does not pass ---------------------------------------------------

@pytest.mark.parametrize("fmt", ["text", "json", "github"])
@pytest.mark.parametrize("content", ["empty", "llama-only"])
def test_check_on_a_cache_without_gemma_models_is_a_usage_error_not_a_pass(hub, cli, fmt, content):
    from tests.builders import llama_config

    if content == "llama-only":
        hub.add("meta/llama", {"config.json": llama_config()})
    r = cli("check", "--cache-dir", hub.root, "--format", fmt)
    assert r.code == 2, r
    assert r.out == "" and "OK" not in r.err
    assert r.err.startswith(f"gemma-doctor: error: nothing to check: no Gemma-family model in {hub.root}")
    assert r.err.count("\n") == 1 and "hf download google/gemma-3-1b-it" in r.err
    assert ("1 other repo(s) skipped" in r.err) is (content == "llama-only")


def test_check_on_a_cache_with_a_gemma_model_still_passes(hub, cli):
    hub.add("google/gemma-3-4b-it", {"config.json": gemma3_12b_config(), "generation_config.json": generation_config()})
    r = cli("check", "--cache-dir", hub.root)
    assert r.code == 0 and r.out.rstrip().splitlines()[-1].startswith("OK 1 model(s)"), r

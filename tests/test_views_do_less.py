"""A view of check makes only what it shows (render.formats.Renderer.shows_prescription): the text and github views
show check's own run, its memory line and findings, never the prescription's block, its Run or its way out, so none is
made for them; the JSON view, which shows them, gets them as before. The outputs themselves are held byte-equal to the
tree before by benchmarks/output_ab.py; here, what is computed."""

from __future__ import annotations

from pathlib import Path

import pytest

from gemma_doctor.plan import search
from gemma_doctor.render.formats import formats, renderer
from tests.builders import build_example_cache

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("google/gemma-3-12b-it", "google/gemma-4-E2B-it")
TRAIN = str(ROOT / "examples" / "gemma-4-E2B-it.train.yaml")


@pytest.fixture(scope="module")
def examples(tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp("views") / "hub"
    build_example_cache(cache)
    return cache


@pytest.fixture
def calls(monkeypatch) -> dict[str, int]:
    """How often the search, its way out and the prescription's Run are made (the real functions, counted)."""
    counted = {"prescribe": 0, "way_out": 0, "_run_of": 0}
    for name in counted:
        real = getattr(search, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            counted[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(search, name, spy)
    return counted


def test_only_check_json_shows_the_prescription() -> None:
    assert {f: renderer("check", f).shows_prescription for f in formats("check")} == \
        {"text": False, "json": True, "github": False}


@pytest.mark.parametrize("fmt", ["text", "github"])
@pytest.mark.parametrize("gpu", ["T4", "none"])
def test_a_view_without_the_prescription_gets_no_way_out_and_no_prescribed_run(cli, examples, calls, fmt, gpu) -> None:
    """On a T4 neither model has a prescription: its way out (each line a search of its own) is JSON's alone; with no
    GPU both have one, whose typed Run is JSON's alone."""
    r = cli("check", *MODELS, "--cache-dir", examples, "--gpu", gpu, "--fail-on", "never", "--format", fmt)
    assert r.code == 0, r
    assert calls["prescribe"] == 2  # check's own run is the prescribed one where the user described none
    assert calls["way_out"] == 0 and calls["_run_of"] == 0


@pytest.mark.parametrize("gpu", ["T4", "none"])
def test_the_json_view_gets_the_way_out_and_the_prescribed_run(cli, examples, calls, gpu) -> None:
    r = cli("check", *MODELS, "--cache-dir", examples, "--gpu", gpu, "--fail-on", "never", "--format", "json")
    assert r.code == 0, r
    models = r.json()["models"]
    if gpu == "T4":
        assert all(m["prescription"] is None and m["way_out"] for m in models)
        assert calls["way_out"] == 2
    else:
        assert all(m["prescription"]["run"] is not None for m in models)
        assert calls["_run_of"] == 2


@pytest.mark.parametrize("fmt", ["text", "github"])
def test_a_described_run_gets_no_search_in_a_view_without_the_prescription(cli, examples, calls, fmt) -> None:
    """With a training config check plans and judges the user's own run: the search would be shown by no line."""
    r = cli("check", MODELS[1], "--cache-dir", examples, "--gpu", "T4", "--training-config", TRAIN, "--fail-on",
            "never", "--format", fmt)
    assert r.code == 0, r
    assert calls["prescribe"] == 0
    r = cli("check", MODELS[1], "--cache-dir", examples, "--gpu", "T4", "--training-config", TRAIN, "--fail-on",
            "never", "--format", "json")
    assert calls["prescribe"] >= 1 and r.json()["models"][0]["way_out"]  # the search, and the way out's own

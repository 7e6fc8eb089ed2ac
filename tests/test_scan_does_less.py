"""check plans its own run only where it is shown (issue 32): where the user described no run (no training config,
nothing fixed by an option or by a checkpoint saved quantized), check's run is the prescribed one wherever the search
finds one (pipeline.with_decision), so check's own memory plan of the default run (pipeline.with_memory) is made only
where the search finds none. What is computed is counted here; that the output is the same is held here (against the
plan made eagerly, as before) and by benchmarks/output_ab.py (against main's tree, byte for byte)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from itertools import product
from pathlib import Path

import pytest

from gemma_doctor import pipeline
from gemma_doctor.facts import MemoryRequest
from gemma_doctor.plan import memory, runplan

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("google/gemma-3-12b-it", "google/gemma-4-E2B-it")


@pytest.fixture(scope="module")
def examples(tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp("scan-less") / "hub"
    subprocess.run([sys.executable, str(ROOT / "examples" / "build_example_cache.py"), str(cache)], check=True,
                   capture_output=True)
    return cache


@pytest.fixture
def own_plans(monkeypatch) -> list[int]:
    """How often check plans its own run (the real pipeline.with_memory, counted)."""
    counted = [0]
    real = pipeline.with_memory

    def spy(*args, **kwargs):
        counted[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "with_memory", spy)
    return counted


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_no_own_plan_where_the_prescription_is_checks_run(cli, examples, own_plans, fmt) -> None:
    """With no GPU both models have a prescription, and check's run is it: check's own plan is never made."""
    r = cli("check", *MODELS, "--cache-dir", examples, "--gpu", "none", "--fail-on", "never", "--format", fmt)
    assert r.code == 0, r
    assert own_plans[0] == 0


@pytest.mark.parametrize("args", [("--gpu", "T4"), ("--gpu", "none", "--method", "lora"),
                                  ("--gpu", "none", "--batch-size", "2")])
def test_an_own_plan_where_it_is_shown(cli, examples, own_plans, args) -> None:
    """On a T4 neither model has a prescription (check's memory line is its own plan); a setting fixed by an option
    makes check's run the user's own: one plan per model in both."""
    r = cli("check", *MODELS, "--cache-dir", examples, *args, "--fail-on", "never", "--format", "json")
    assert r.code == 0, r
    assert own_plans[0] == len(MODELS)


@pytest.mark.parametrize("args", [("--gpu", "none"), ("--gpu", "T4"), ("--gpu", "A100"), ("--gpu", "L4", "--task", "dpo"),
                                  ("--gpu", "none", "--method", "qlora"), ("--gpu", "A100", "--no-gradient-checkpointing"),
                                  ("--gpu", "T4", "--seq-len", "512"), ("--gpu", "A100", "--num-gpus", "2")])
@pytest.mark.parametrize("fmt", ["text", "json", "github"])
def test_the_plan_not_made_changes_no_output(cli, examples, monkeypatch, args, fmt) -> None:
    """Every view is the same as with check's own plan made first, as it was before (fixed_settings made to say
    something is fixed takes the eager path, whose plan then says, truly, that nothing is)."""
    argv = ("check", *MODELS, "--cache-dir", examples, *args, "--fail-on", "never", "--format", fmt)
    lazy = cli(*argv)
    monkeypatch.setattr(runplan, "fixed_settings", lambda *a, **k: ("eager",))
    eager = cli(*argv)
    assert lazy.code == eager.code == 0
    assert lazy.out == eager.out and lazy.err == eager.err


REQUESTS = [MemoryRequest(method=m, batch_size=b, gradient_checkpointing=c, seq_len=s)
            for m, b, c, s in product((None, "full", "lora", "qlora"), (None, 4), (None, True, False), (None, 2048))]


@pytest.mark.parametrize("quantized", [None, ("awq", 4, 128)])
@pytest.mark.parametrize("task", ["sft", "dpo", "grpo", "lora", "full"])
def test_fixed_settings_is_the_plans_own(quantized, task) -> None:
    """runplan.fixed_settings is plan_memory's ``fixed`` without the plan, for every setting an option fixes, the
    tasks (a task that names a method fixes it; the stable RL setting is no choice of the user's) and a checkpoint
    saved quantized (its method is fixed)."""
    shape = memory.published_shape("gemma3", "12b")
    assert shape is not None
    if quantized is not None:
        shape = dataclasses.replace(shape, saved_quantization=quantized)
    for request in REQUESTS:
        kw = dict(precision="bf16", gpu=None, request=request, training_config=None, task=task)
        assert runplan.fixed_settings(shape, **kw) == runplan.plan_memory(shape, **kw).fixed, (request, task)

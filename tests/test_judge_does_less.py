"""A whole-cache check of models that are not alike does each model's work once (issue 32 item 5): what is computed
is counted here (calls of real functions, never time); that the output is the same is held by the tests of each part
named below and by benchmarks/output_ab.py (against main's tree, byte for byte)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gemma_doctor.plan import advice, memory, runplan, search
from tests.builders import HubCache, gemma3_12b_config, generation_config, variant
from tests.test_scan_does_less import counting

MODELS = 4  # Gemma 3 repos, no two alike (startup.py's "distinct" shape: the layer count differs)


_BUILT = [0]


@pytest.fixture
def unalike(tmp_path) -> Path:
    """A cache of MODELS Gemma 3 repos whose shapes no earlier test of this process planned (plans are remembered per
    process, as a fresh process starts without them)."""
    root, gem = tmp_path / "hub", gemma3_12b_config()
    hub = HubCache(root)
    _BUILT[0] += 1
    for j in range(MODELS):
        text = dict(gem["text_config"], num_hidden_layers=8 + j, intermediate_size=15360 + 256 * _BUILT[0])
        hub.add(f"org/model-{j}", {"config.json": variant(gem, text_config=text),
                                   "generation_config.json": generation_config()})
    return root


@pytest.fixture(autouse=True)
def one_process(monkeypatch) -> None:
    """The scan in this process (no forked workers), so that every call is counted here."""
    monkeypatch.setenv("GEMMA_DOCTOR_WORKERS", "1")


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_one_run_is_counted_once(cli, unalike, monkeypatch, fmt) -> None:
    """With no GPU the search's first candidate is each model's prescription and check's run: the candidate, check's
    plan of the candidate's training config read back and the prescription's memory block are one run under three
    sets of sources. Its bytes are counted once (memory.plan's body, whose one call of layer_activation_bytes is
    counted); on main three times a model, and plan() asked three times."""
    counted = counting(monkeypatch, memory, "layer_activation_bytes")
    asked = counting(monkeypatch, memory, "plan")
    lines = counting(monkeypatch, memory, "_assumptions")
    r = cli("check", "--cache-dir", unalike, "--gpu", "none", "--fail-on", "never", "--format", fmt)
    assert r.code == 0, r
    assert counted[0] == MODELS
    # plan() is asked for the candidate and for check's plan of its config; the prescription's memory block is check's
    # plan relabelled (Judged.memory: memory.with_sources of a plan marked as plan()'s own, its GPU note kept apart by
    # memory.with_notes), never asked for again
    assert asked[0] == 2 * MODELS
    # the lines naming the run's settings and their sources: the candidate's, its config's read back, the
    # prescription's (on main four times a model: three plans and a relabelling)
    assert lines[0] == 3 * MODELS


def _runs(shape: memory.ModelShape) -> list[memory.MemoryPlan]:
    """Candidates of the search for several requests (methods, QLoRA, ZeRO, an RL task)."""
    out: list[memory.MemoryPlan] = []
    for task in ("sft", "dpo"):
        for n in (1, 4):
            req = runplan.request_spec(precision="bf16", gpu=None, request=runplan.MemoryRequest(num_gpus=n),
                                       training_config=None, task=task)
            out += list(search._candidates(replace(shape), replace(req, gpu_bytes=24 * 2**30),
                                           ("fits", "tight", "does-not-fit")))
    return out


@pytest.mark.parametrize("family,size", [("gemma3", "12b"), ("gemma4", "e2b")])
def test_a_plan_remembered_is_the_plan_made(family, size) -> None:
    """memory.plan of a run is memory._plan's (the body, not remembered) for every candidate run under any sources,
    an evaluation batch among them (whose notes read the evaluation's sources), however often and in whatever order
    it is asked; memory.with_sources of a remembered plan is the plan made again, marked as plan()'s own."""
    shape = memory.published_shape(family, size)
    checked = 0
    for p in _runs(shape):
        for extra in ({}, {"eval_batch": 4}, {"eval_batch": 2, "keeps_predictions": True, "eval_accumulation": 3}):
            run = replace(p.settings, **extra)
            for sources in (run.sources, (("method", "chosen by the search"),),
                            tuple(sorted({**dict(run.sources), "eval_batch": "training config x",
                                          "keeps_predictions": "training config y"}.items()))):
                relabelled = replace(run, sources=sources)
                want = memory._plan(shape, relabelled, 24 * 2**30, "L4")
                for _ in range(2):
                    got = memory.plan(shape, relabelled, 24 * 2**30, "L4")
                    assert got == want and got.phases == want.phases
                    assert "_source_lines" in vars(got)
                other = tuple(sorted({**dict(sources), "batch_size": "chosen by the search",
                                      "eval_batch": "--eval-batch"}.items()))
                again = memory.with_sources(got, shape, other, 24 * 2**30, "L4")
                assert again == memory._plan(shape, replace(relabelled, sources=other), 24 * 2**30, "L4")
                checked += 1
    assert checked > 100


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_no_own_recommendation_where_the_prescription_is_checks_run(cli, unalike, monkeypatch, fmt) -> None:
    """Where the user described no run, check's run and its precision line are the prescription's (with no GPU, every
    model has one): check's own recommendation, which on main was made for every model and then dropped, is not made.
    That the views are the same as with it made first: test_scan_does_less.test_the_plan_not_made_changes_no_output."""
    made = counting(monkeypatch, advice, "recommendation_for")
    r = cli("check", "--cache-dir", unalike, "--gpu", "none", "--fail-on", "never", "--format", fmt)
    assert r.code == 0, r
    assert made[0] == 0


def test_an_own_recommendation_where_the_user_fixed_a_setting(cli, unalike, monkeypatch) -> None:
    """A setting fixed by an option makes check's run the user's own: its recommendation is made for each model."""
    made = counting(monkeypatch, advice, "recommendation_for")
    r = cli("check", "--cache-dir", unalike, "--gpu", "none", "--method", "lora", "--fail-on", "never")
    assert r.code == 0, r
    assert made[0] >= MODELS


@pytest.mark.parametrize("quantized", [None, ("awq", 4, 128)])
@pytest.mark.parametrize("task", ["sft", "dpo", "full"])
def test_what_is_fixed_reads_no_value_of_the_run(quantized, task) -> None:
    """runplan.fixed_settings asked without the run's precision, LoRA targets and chunking (as check asks before it
    has its recommendation) is plan_memory's ``fixed`` for each of them."""
    from tests.test_scan_does_less import REQUESTS

    shape = memory.published_shape("gemma3", "12b")
    if quantized is not None:
        shape = replace(shape, saved_quantization=quantized)
    for request in REQUESTS:
        asked = runplan.fixed_settings(shape, gpu=None, request=request, training_config=None, task=task)
        for precision, targets, chunks in (("bf16", None, False), ("fp32", "all-linear", True),
                                           ("fp16", ("q_proj", "v_proj"), False)):
            kw = dict(precision=precision, gpu=None, request=request, training_config=None, task=task,
                      lora_targets=targets, trl_chunks=chunks)
            assert asked == runplan.plan_memory(shape, **kw).fixed, (request, task, precision)


def test_the_catalogue_asks_a_run_only_the_entries_its_model_can_meet(cli, unalike, monkeypatch) -> None:
    """A catalogue entry whose condition names a training setting is evaluated per run, unless a clause of it that
    reads no run (the model type, config.json, the tokenizer, the GPU) fails for the model: no run of it then meets
    the entry (rules/catalogue._never). A Gemma 3 is not asked the Gemma 4 entries' training settings: the search's
    candidate evaluates none of the catalogue's run entries on these models (on main, each candidate evaluated 6, as
    many as check's run without a training config skips: 4 models x 9 evaluations, now 4 x 3, the model part's)."""
    from gemma_doctor.rules import catalogue

    evaluated = counting(monkeypatch, catalogue, "evaluate")
    r = cli("check", "--cache-dir", unalike, "--gpu", "none", "--fail-on", "never")
    assert r.code == 0, r
    assert evaluated[0] == 3 * MODELS


def test_the_search_copies_without_running_init(cli, unalike, monkeypatch) -> None:
    """The search's per-model and per-candidate copies (its request and settings, the options and environment its
    candidates are judged under, the model part's key: rules.Shared) are frozen.replace's field copies, not
    dataclasses.replace's new __init__ calls: the environment and the options are made once for the scan (on main
    the environment copied through __init__ twice a model: 9 Environment __init__ calls for 4 models)."""
    from gemma_doctor.facts import CheckOptions, Environment

    made = {cls: counting(monkeypatch, cls, "__init__") for cls in (Environment, CheckOptions)}
    r = cli("check", "--cache-dir", unalike, "--gpu", "none", "--fail-on", "never")
    assert r.code == 0, r
    assert made[Environment][0] == 1
    assert made[CheckOptions][0] == 1


def test_a_copy_of_settings_answers_its_own_sources() -> None:
    """Settings.source reads a mapping made on the first question (run.Settings._sources); a copy with other sources,
    by frozen.replace or dataclasses.replace, answers from its own, never from the mapping of the one it was copied
    from."""
    import dataclasses

    from gemma_doctor import frozen
    from gemma_doctor.run import Settings

    s = Settings(sources=(("batch_size", "option"),))
    assert s.source("batch_size") == "option" and s.source("method") == "default"
    for copy in (frozen.replace, dataclasses.replace):
        t = copy(s, sources=(("method", "chosen by the search"),))
        assert t.source("batch_size") == "default" and t.source("method") == "chosen by the search"
        assert t == Settings(sources=(("method", "chosen by the search"),)) and hash(t) == hash(copy(t))
    assert s.source("batch_size") == "option"


def test_a_rule_is_judged_once_for_fields_it_reads_equal(cli, unalike, monkeypatch) -> None:
    """A rule that declares what it reads of the run (codes.emits ``reads``) is judged once for each value of those
    fields: these models differ in their layers, so in their runs' memory figures, but not in the settings, the
    training config, the stack or the GPU those rules read, so each is run twice for the scan (check's own run without
    a training config, the search's candidate with one), where main ran it twice a model (8 for 4 models)."""
    import functools

    from gemma_doctor import rules

    monkeypatch.setattr(rules, "_JUDGED", {}, raising=False)  # as a fresh process starts
    counted: dict[str, int] = {}

    def spy(rule):
        @functools.wraps(rule)  # the declarations too (codes.emits sets them on the function)
        def counted_rule(*args, **kwargs):
            counted[rule.__module__] = counted.get(rule.__module__, 0) + 1
            return rule(*args, **kwargs)
        return counted_rule

    declared = ("training", "members", "precision", "loading")
    monkeypatch.setattr(rules, "RULES", tuple(spy(r) if r.__module__.rsplit(".", 1)[-1] in declared else r
                                              for r in rules.RULES))
    r = cli("check", "--cache-dir", unalike, "--gpu", "none", "--fail-on", "never")
    assert r.code == 0, r
    assert counted == {f"gemma_doctor.rules.{name}": 2 for name in declared}

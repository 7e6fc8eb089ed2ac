"""What a rule declares it reads of its arguments (codes.emits ``reads``) is all it reads, so a judgement may take its
findings from an earlier judgement whose declared fields are equal (rules.judge), whichever model, candidate or
command that was.

Proved, not trusted: for two random runs A and X (tests/test_rules_model_part.py's: a model of the example cache or the
family table, a stack in or out of the rules' windows or without transformers, a GPU or none, the memory options, a
task, no training config or a random TRL JSON or axolotl YAML, resolved into check's own Run), B is X given A's values
at exactly the fields the rule declares (a field, a key of config.json, or None where A's read stops); the rule must
find on B exactly what it finds on A, details included. A read the rule does not declare, in which A and X differ,
shows as a difference. Hypothesis in the derandomised CI profile (tests/conftest.py)."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gemma_doctor import rules
from gemma_doctor.plan import runplan
from tests.test_rules_model_part import EXAMPLES, PLANNED, STACKS, _judged, world  # noqa: F401 (world: fixture)
from tests.test_rules_model_part import runs as model_part_runs

DECLARED = tuple(i for i, r in enumerate(rules.RULES) if getattr(r, "reads", None) is not None)


# How the run's processes run together, for the rules that read the Run's ``distributed`` (FSDP's version and wrap
# classes, DeepSpeed's stage, tied weights under FSDP2), on a TRL config.
DISTRIBUTED = {
    "fsdp": st.sampled_from(("full_shard auto_wrap", "full_shard offload", "")),
    "fsdp_config": st.fixed_dictionaries({}, optional={
        "fsdp_version": st.sampled_from((1, 2)),
        "transformer_layer_cls_to_wrap": st.sampled_from((["Gemma3DecoderLayer"], ["GemmaDecoderLayer"]))}),
    "deepspeed": st.just({"zero_optimization": {"stage": 3}}),
}


@st.composite
def runs(draw: st.DrawFn) -> dict:
    """test_rules_model_part's random run, a TRL config's with FSDP or DeepSpeed keys too."""
    run = draw(model_part_runs())
    if run["kind"] == "trl":
        run["config"] = {**run["config"], **draw(st.fixed_dictionaries({}, optional=DISTRIBUTED))}
    return run


def splice(b: Any, a: Any, names: tuple[str, ...]) -> Any:
    """``b`` with ``a``'s value at ``names`` (dataclass fields, or keys below a mapping): rules.read of the result there
    is ``a``'s, and everything else is ``b``'s where the two have the same shape on the way down."""
    if not names or a is None:
        return a
    name, rest = names[0], names[1:]
    if isinstance(a, Mapping):
        if not isinstance(b, Mapping):
            return a
        if name not in a:
            return {k: v for k, v in b.items() if k != name}
        return {**b, name: splice(b.get(name), a[name], rest)}
    if not dataclasses.is_dataclass(a) or type(b) is not type(a) or not hasattr(a, name):
        return a
    return dataclasses.replace(b, **{name: splice(getattr(b, name), getattr(a, name), rest)})


def given_reads(rule: Any, a: tuple, x: tuple) -> tuple:
    """X's (model, env, options) with A's values at every field ``rule`` declares it reads."""
    roots = list(x)
    for root, fields, keys in rule.reads:
        roots[root] = splice(roots[root], a[root], (*fields.split("."), *keys))
    return tuple(roots)


def found(rule: Any, args: tuple) -> list[dict]:
    """The rule's findings, details included (Finding's equality leaves them out)."""
    return [f.to_json() | {"details": f.details} for f in rule(*args)]


def test_the_rules_that_read_the_run_declare_what_they_read() -> None:
    """The rules judged per run whose findings are shared by their declared fields: those that cost more than reading
    their fields does (measured on startup.py's unalike cache: docs/benchmarks.md). The rest always run again: the
    two-part rules, whose model part rules.Shared shares, those reading the run's memory figures (which differ from
    model to model), and the rules cheaper than the look-up."""
    names = {f"{rules.RULES[i].__module__.rsplit('.', 1)[-1]}.{rules.RULES[i].__name__}" for i in DECLARED}
    assert names == {"training.check", "members.check", "precision.check", "loading.check"}
    for i in DECLARED:
        rule = rules.RULES[i]
        assert not getattr(rule, "model_only", False) and getattr(rule, "model_part", None) is None


@settings(max_examples=25, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@example(a={"gpu": "T4", "task": "dpo", "kind": "trl", "memory": None,
            "config": {"fp16": True, "use_cache": True, "gradient_checkpointing": True, "num_processes": 2}},
         x={"gpu": "A100", "task": None, "kind": "axolotl", "memory": None,
            "config": {"adapter": "qlora", "load_in_4bit": True, "bf16": True, "flash_attention": True}},
         ma=0, mx=1, sa=2, sx=0)
@example(a={"gpu": None, "task": None, "kind": None, "memory": runplan.MemoryRequest(method="lora", batch_size=2),
            "config": None},
         x={"gpu": "V100", "task": "sft", "kind": "trl", "memory": None,
            "config": {"bf16": True, "attn_implementation": "flash_attention_2", "packing": True}},
         ma=1, mx=3, sa=4, sx=1)
@given(a=runs(), x=runs(), ma=st.integers(0, len(EXAMPLES) + len(PLANNED)),
       mx=st.integers(0, len(EXAMPLES) + len(PLANNED)), sa=st.integers(0, len(STACKS) - 1),
       sx=st.integers(0, len(STACKS) - 1))
def test_a_rule_finds_the_same_on_runs_equal_in_what_it_declares(world: dict, a: dict, x: dict, ma: int, mx: int,
                                                                  sa: int, sx: int) -> None:
    """For every rule that declares its reads: run X given run A's values at the declared fields finds what A finds."""
    world["n"] = world.get("n", 0) + 2
    one = _judged(world, a, world["n"], ma, STACKS[sa])
    other = _judged(world, x, world["n"] + 1, mx, STACKS[sx])
    for i in DECLARED:
        rule = rules.RULES[i]
        spliced = given_reads(rule, one, other)
        assert rules.read(i, *spliced) == rules.read(i, *one), rule.__module__
        assert found(rule, spliced) == found(rule, one), rule.__module__


def test_checks_own_run_never_answers_for_the_candidates_config(world: dict, cli, monkeypatch) -> None:
    """Last round's counterexample, right by construction: Gemma 4 E2B, no GPU. check's own run (full fine-tuning,
    batch 8, no training config) passes check's rules; the search's first candidate, the same run written as a YAML,
    is rejected by GD718 (the catalogue's Gemma 4 SDPA batch entry, whose condition has a `training` clause). With
    every rule's findings for check's own run already judged, the candidate is still rejected by GD718 (the catalogue
    declares no reads and runs again; every rule that declares its reads declares the training config), and check
    prescribes the run the search finds without them: batch 1, x8 accumulation."""
    monkeypatch.setattr(rules, "_JUDGED", {})
    facts, env, options = _judged(world, {"gpu": None, "task": None, "kind": None, "memory": None, "config": None},
                                  -1, EXAMPLES.index("google/gemma-4-E2B-it"), ())
    assert facts.run is not None and facts.run.batch.value == 8
    own = rules.run(facts, env, options)
    assert not [f for f in own if f.severity.value == "error"] and "GD718" not in {f.code for f in own}
    assert all(rules.RULES[i].reads and rules.read(i, facts, env, options) in [k for k, _ in rules._JUDGED[i]]
               for i in DECLARED)
    candidates: list[set[str]] = []
    real = rules.judge

    def judge(i, model, env, options, part=None):
        found = real(i, model, env, options, part)
        if env.training_config is not None:
            candidates.append({f.code for f in found})
        return found

    monkeypatch.setattr(rules, "judge", judge)
    args = ("check", "google/gemma-4-E2B-it", "--cache-dir", world["root"] / "hub", "--gpu", "none", "--format", "json")
    r = cli(*args)
    assert r.code == 0, r
    assert any("GD718" in codes for codes in candidates)
    monkeypatch.setattr(rules, "_JUDGED", {})
    assert cli(*args).out == r.out  # the same answer with nothing judged before
    assert '"gradient_accumulation_steps": 8' in r.out or "x8 accumulation" in r.out

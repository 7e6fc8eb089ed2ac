"""Judgements free of names (issue 32): the rules and the search judge a model without reading its name, so two models
whose files are equal get equal findings and decisions; the engine fills each model's name in (pipeline.named) before
any view, decision or caller meets them."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tests.builders import HubCache, gemma3_12b_config, generation_config

NAMES = ("org-a/tune-one", "org-b/tune-two")
# A T4 (fp32 advice: GD302, GD303) and a transformers with the HybridCache crash (use_cache fix: GD001).
OPTIONS = {"gpu": "T4", "with_packages": ("transformers==4.50.3",)}


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    """Two cached repos with the same files under two names (a broken shard among them)."""
    root = tmp_path_factory.mktemp("names") / "hub"
    cache = HubCache(root)
    for name in NAMES:
        cache.add(name, {"config.json": gemma3_12b_config(), "generation_config.json": generation_config(),
                         "model.safetensors": b"not a safetensors file"})  # GD204: download it again
    return root


def _judged(root, name):
    """One model decided and judged by the rules, as the engine does before naming it."""
    from gemma_doctor import locate, pipeline, rules
    from gemma_doctor.facts import CheckOptions

    options = CheckOptions(**OPTIONS)
    env = pipeline.environment(options)
    models, _ = pipeline.select(locate.resolve([name], root, "main", False), explicit=True)
    j = pipeline.decide(pipeline.read_more(models[0], options), options, env)
    return j, tuple(rules.run(j.facts, env, options))


def test_equal_files_get_equal_findings_whatever_the_names(twins):
    (a, found_a), (b, found_b) = (_judged(twins, n) for n in NAMES)
    assert found_a and [f.to_json() for f in found_a] == [f.to_json() for f in found_b]
    assert a.decision.way_out == b.decision.way_out and a.decision.findings == b.decision.findings
    text = json.dumps([f.to_json() for f in found_a], ensure_ascii=False)
    assert not any(part in text for n in NAMES for part in n.split("/"))  # no name, whole or in part

    from gemma_doctor import pipeline
    from gemma_doctor.report import MODEL, MODEL_ARGS, MODEL_REPO, MODEL_WHERE

    assert all(mark in text for mark in (MODEL, MODEL_ARGS, MODEL_REPO, MODEL_WHERE))  # left for the engine
    for facts, found, name in ((a, found_a, NAMES[0]), (b, found_b, NAMES[1])):
        named = pipeline.named(dataclasses.replace(facts, findings=found)).findings
        fixes = " ".join(f.fix or "" for f in named)
        assert f"gemma-doctor recommend {name} --gpu T4" in fixes
        assert f"gemma-doctor fix {name} --cache-dir {twins} --with transformers==4.50.3 --inplace" in fixes
        assert f"hf download {name} model.safetensors --cache-dir {twins} --force-download" in fixes
        assert MODEL not in json.dumps([f.to_json() for f in named], ensure_ascii=False)


@pytest.mark.parametrize("command", [
    ("check", "--format", "json", "--fail-on", "never"),
    ("check", "--format", "github", "--fail-on", "never"),
    ("list", "--format", "json"),
    ("recommend", "--format", "json"),
    ("recommend", "--format", "yaml"),
])
def test_every_view_names_the_model(cli, twins, command):
    """What a user reads names each model as its own, and never holds a place left for a name."""
    from gemma_doctor.report import MODEL

    args = [*command, "--cache-dir", str(twins), "--with", "transformers==4.50.3"]
    if command[0] != "list":
        args += ["--gpu", "T4"]
    targets = list(NAMES) if command[0] == "recommend" else []
    got = cli(command[0], *targets, *args[1:])
    assert got.out.strip(), got.err
    assert MODEL.split("model")[0] not in got.out + got.err
    if command[0] == "check":
        for name in NAMES:
            assert f"gemma-doctor fix {name} " in got.out

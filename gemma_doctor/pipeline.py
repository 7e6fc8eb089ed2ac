"""The pipeline behind check: locate -> read -> diagnose: build the facts of each snapshot and run the rules over them."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable

from gemma_doctor import family as family_mod
from gemma_doctor import locate, rules, undo
from gemma_doctor.facts import CheckOptions, Environment, ModelFacts
from gemma_doctor.locate import Snapshot
from gemma_doctor.readers import dtypes as dtypes_census
from gemma_doctor.readers import weights as weights_scan
from gemma_doctor.readers.jsonfile import JsonFile, forget_roots, read_json_file
from gemma_doctor.readers import training_config
from gemma_doctor.readers import gpu as gpu_reader
from gemma_doctor import advice
from gemma_doctor.readers.versions import installed
from gemma_doctor.report import ModelReport, Report

# Feature gatherers add facts to ModelFacts.extra: (facts, options) -> {name: fact}.
Gatherer = Callable[[ModelFacts, CheckOptions], dict]
GATHERERS: list[Gatherer] = []
# The dtype census (safetensors headers only) runs first: later gatherers read extra["dtypes"].
GATHERERS.append(dtypes_census.gather)
# --weights: reads every tensor (numpy imported only then); a no-op otherwise.
GATHERERS.append(weights_scan.gather)
# The precision recommendation reads the census (extra["dtypes"]), so it runs after it.
GATHERERS.append(advice.gather)
# Environment probes add facts to Environment.extra: (options) -> {name: fact}.
EnvProbe = Callable[[CheckOptions], dict]
ENV_PROBES: list[EnvProbe] = []
ENV_PROBES.append(training_config.probe)  # reads --training-config once, for the GD6xx rules
ENV_PROBES.append(gpu_reader.env_probe)  # probes the GPU (or reads --gpu) once per run: env.extra["gpu"]


def read_model(snapshot: Snapshot, config: JsonFile | None = None) -> ModelFacts:
    """Read one snapshot's config files and undo record (header reads only); ``config`` if already read."""
    root = snapshot.read_root
    if config is None:
        config = read_json_file(snapshot.path / "config.json", root)
    generation = read_json_file(snapshot.path / "generation_config.json", root)
    fam = family_mod.detect(config.data) if config.ok else family_mod.NOT_GEMMA
    return ModelFacts(snapshot=snapshot, config=config, generation_config=generation, family=fam,
                      undo=undo.facts_for(snapshot))


def environment(options: CheckOptions) -> Environment:
    """The environment facts every model is judged against."""
    extra: dict = {}
    for probe in ENV_PROBES:
        extra.update(probe(options))
    return Environment(versions=installed(), extra=extra)


def gather(facts: ModelFacts, options: CheckOptions) -> ModelFacts:
    """Run the feature gatherers over a Gemma model's facts."""
    if not GATHERERS or not facts.family.is_gemma:
        return facts
    extra = dict(facts.extra)
    for g in GATHERERS:
        # Each gatherer sees what the earlier ones found (the recommendation reads extra["dtypes"]).
        current = ModelFacts(facts.snapshot, facts.config, facts.generation_config, facts.family, facts.undo, dict(extra))
        extra.update(g(current, options))
    return ModelFacts(facts.snapshot, facts.config, facts.generation_config, facts.family, facts.undo, extra)


def model_report(facts: ModelFacts, env: Environment, options: CheckOptions) -> ModelReport:
    """Findings and JSON extras of one model."""
    findings = rules.run(facts, env, options)
    extra: dict = {"model_type": facts.family.model_type}
    for name, value in facts.extra.items():
        extra[name] = value.to_json() if hasattr(value, "to_json") else value
    snap = facts.snapshot
    return ModelReport(target=snap.target, path=str(snap.path), repo_id=snap.repo_id, revision=snap.revision,
                       commit=snap.commit, family=facts.family.label, findings=findings, extra=extra)


def select(snapshots: Iterable[Snapshot], explicit: bool) -> tuple[list[ModelFacts], list[dict[str, str]]]:
    """Read every snapshot; in a whole-cache scan, non-Gemma repos are skipped, not reported."""
    models: list[ModelFacts] = []
    skipped: list[dict[str, str]] = []
    forget_roots()
    for snap in snapshots:
        # config.json alone decides whether a whole-cache scan skips a repo: the rest is read only when kept.
        config = read_json_file(snap.path / "config.json", snap.read_root)
        if not explicit and config.ok and not family_mod.detect(config.data).is_gemma:
            skipped.append({"target": snap.target, "path": str(snap.path), "reason": "not a Gemma-family model"})
            continue
        if not explicit and not config.ok and not config.exists:
            skipped.append({"target": snap.target, "path": str(snap.path), "reason": "no config.json"})
            continue
        models.append(read_model(snap, config))
    return models, skipped


def diagnose(targets: list[str], cache_dir: Path | None = None, revision: str = "main",
             all_revisions: bool = False, options: CheckOptions | None = None) -> Report:
    """The whole `check`: targets -> report. Raises UsageError for targets that cannot be found."""
    options = options or CheckOptions()
    cache = cache_dir if cache_dir is not None else locate.default_cache_dir()
    snapshots = locate.resolve(targets, cache, revision, all_revisions)
    models, skipped = select(snapshots, explicit=bool(targets))
    env = environment(options)
    reports = tuple(model_report(gather(m, options), env, options) for m in models)
    return Report(models=reports, environment=env.to_json(), skipped=tuple(skipped), cache_dir=str(cache))

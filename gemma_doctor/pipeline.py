"""The engines behind check and recommend: locate -> read -> gather -> diagnose.

The order in which a model's facts are filled in is this module's code (gather), not a registry.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from gemma_doctor import advice, fsafe, locate, recommend, rules
from gemma_doctor import family as family_mod
from gemma_doctor import stack as stack_mod
from gemma_doctor.errors import UsageError
from gemma_doctor.facts import CheckOptions, Environment, ModelFacts
from gemma_doctor.locate import Snapshot
from gemma_doctor.model import read_model, source_of
from gemma_doctor.readers import dtypes as dtypes_census
from gemma_doctor.readers import gpu as gpu_reader
from gemma_doctor.readers import training_config
from gemma_doctor.readers import weights as weights_scan
from gemma_doctor.readers.gpu import GpuFacts
from gemma_doctor.readers.versions import installed
from gemma_doctor.report import ModelReport, Report


def environment(options: CheckOptions) -> Environment:
    """The machine and libraries every model is judged against, read once per run."""
    versions = installed()
    stack = stack_mod.resolve(versions, options.with_packages, options.requirements)
    tc = training_config.load(options.training_config) if options.training_config else None
    return Environment(versions=versions, stack=stack, gpu=gpu_reader.for_options(options), training_config=tc)


def gather(facts: ModelFacts, options: CheckOptions, env: Environment) -> ModelFacts:
    """Fill in a Gemma model's facts, in order: dtype census (headers only), weights scan (--weights), recommendation."""
    if not facts.family.is_gemma:
        return facts
    source = facts.source if facts.source is not None else source_of(facts.snapshot)
    census = dtypes_census.census(source, facts.config.data if facts.config.ok else None)
    facts = facts.with_(census=census)
    if options.weights:
        facts = facts.with_(weights_scan=weights_scan.scan_model(census, source, options.jobs, facts.snapshot.target))
    gpu = env.gpu if env.gpu is not None else gpu_reader.for_options(options)
    return facts.with_(recommendation=advice.recommendation_for(facts, gpu, options.task, env.libraries))


def model_report(facts: ModelFacts, env: Environment, options: CheckOptions) -> ModelReport:
    """Findings and JSON blocks of one model."""
    findings = rules.run(facts, env, options)
    extra: dict = {"model_type": facts.family.model_type}
    if facts.census is not None:
        extra["dtypes"] = facts.census.to_json()
    if facts.weights_scan is not None:
        extra["weights_scan"] = facts.weights_scan.to_json()
    if facts.recommendation is not None:
        extra["recommendation"] = facts.recommendation.to_json()
    snap = facts.snapshot
    return ModelReport(target=snap.target, path=str(snap.path), repo_id=snap.repo_id, revision=snap.revision,
                       commit=snap.commit, family=facts.family.label, findings=findings, extra=extra)


def select(snapshots: Iterable[Snapshot], explicit: bool) -> tuple[list[ModelFacts], list[dict[str, str]]]:
    """Read every snapshot; in a whole-cache scan, non-Gemma repos are skipped, not reported."""
    models: list[ModelFacts] = []
    skipped: list[dict[str, str]] = []
    fsafe.forget_roots()
    for snap in snapshots:
        if snap.problem is not None:  # never skipped: the finding says why the repo was not read
            models.append(read_model(snap))
            continue
        source = source_of(snap)
        # config.json alone decides whether a whole-cache scan skips a repo: the rest is read only when kept.
        config = source.read_json("config.json")
        if not explicit and config.ok and not family_mod.detect(config.data).is_gemma:
            skipped.append({"target": snap.target, "path": str(snap.path), "reason": "not a Gemma-family model"})
            continue
        if not explicit and not config.ok and not config.exists:
            skipped.append({"target": snap.target, "path": str(snap.path), "reason": "no config.json"})
            continue
        models.append(read_model(snap, config, source))
    return models, skipped


def diagnose(targets: list[str], cache_dir: Path | None = None, revision: str = "main",
             all_revisions: bool = False, options: CheckOptions | None = None) -> Report:
    """The whole `check`: targets -> report. Raises UsageError for targets that cannot be found."""
    options = options or CheckOptions()
    cache = cache_dir if cache_dir is not None else locate.default_cache_dir()
    snapshots = locate.resolve(targets, cache, revision, all_revisions)
    models, skipped = select(snapshots, explicit=bool(targets))
    env = environment(options)
    reports = tuple(model_report(gather(m, options, env), env, options) for m in models)
    return Report(models=reports, environment=env.to_json(), skipped=tuple(skipped), cache_dir=str(cache))


# --- recommend -----------------------------------------------------------------------------------

_PLAN_HINT = "or plan without a download: gemma-doctor recommend --family gemma3"


def recommend_items(targets: list[str], cache_dir: Path | None, revision: str, family: str | None,
                    gpu_spec: str | None, task: str | None, quantization: str | None,
                    with_packages: tuple[str, ...] = (), requirements: str | None = None,
                    ) -> tuple[GpuFacts, list[advice.Item], list[str]]:
    """(GPU facts, recommendations, skipped-target messages) for `gemma-doctor recommend`. Raises UsageError."""
    # Check every option before touching the cache: a typo fails fast with a usage line.
    options = CheckOptions(gpu=gpu_spec, task=recommend.normalise_task(task), with_packages=with_packages,
                           requirements=requirements)
    if quantization is not None:
        recommend.normalise_quantization(quantization)
    fam = recommend.normalise_family(family) if family is not None else None
    if fam is not None and targets:
        raise UsageError("--family plans for a model that is not downloaded; drop it or the TARGET "
                         "(a cached model's family is read from its config.json)")
    env = environment(options)
    gpu = env.gpu if env.gpu is not None else gpu_reader.for_options(options)
    if fam is not None:
        inputs = advice.inputs_for(None, gpu, options.task, quantization, env.libraries, family=fam)
        rec = recommend.decide(inputs)
        return gpu, [advice.Item(f"{fam} (planned)", None, None, None, None, fam, True, inputs.model_id, rec)], []
    cache = cache_dir if cache_dir is not None else locate.default_cache_dir()
    try:
        snapshots = locate.resolve(targets, cache, revision, False)
    except UsageError as e:
        raise UsageError(f"{e}; {_PLAN_HINT}" if not targets else str(e)) from None
    models, _ = select(snapshots, explicit=bool(targets))
    items: list[advice.Item] = []
    skipped: list[str] = []
    for facts in models:
        if not facts.family.is_gemma:
            skipped.append(f"{facts.snapshot.target}: not a Gemma-family model (or config.json unreadable); skipped")
            continue
        facts = gather(facts, options, env)  # the census first: the saved dtype and quantization come from it
        inputs = advice.inputs_for(facts, gpu, options.task, quantization, env.libraries)
        rec = recommend.decide(inputs)
        s = facts.snapshot
        items.append(advice.Item(s.target, s.repo_id, s.revision, s.commit, str(s.path), facts.family.label, False,
                                 inputs.model_id, rec))
    if not items:
        where = f"in {cache}" if not targets else "among the targets"
        raise UsageError(f"no Gemma-family model {where}; name one (gemma-doctor recommend google/gemma-3-1b-it) {_PLAN_HINT}")
    return gpu, items, skipped

"""The engines behind check and recommend: locate -> read -> gather -> diagnose.

The order in which a model's facts are filled in is this module's code (gather), not a registry.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence, TypeVar

from gemma_doctor import adapters, fsafe, frozen, locate, parallel, rules
from gemma_doctor import run as run_mod
from gemma_doctor.plan import advice, memory, recommend, runplan
from gemma_doctor import family as family_mod
from gemma_doctor import stack as stack_mod
from gemma_doctor.errors import DoctorError, HubOffline, UsageError
from gemma_doctor.facts import CheckOptions, Environment, ModelFacts
from gemma_doctor.locate import Snapshot
from gemma_doctor.model import read_model, source_of
from gemma_doctor.readers import dtypes as dtypes_census
from gemma_doctor.readers import parsed
from gemma_doctor.readers import gpu as gpu_reader
from gemma_doctor.readers import tokenizer as tokenizer_reader
from gemma_doctor.readers import training_config
from gemma_doctor.readers.gpu import GpuFacts
from gemma_doctor.readers.versions import installed
from gemma_doctor.report import Finding, ModelReport, Naming, Report
from gemma_doctor.source import LocalSource, ModelSource

if TYPE_CHECKING:  # imported by a scan only (one model's check needs none of it); the search by a Gemma's decision
    from gemma_doctor.memo import Memo
    from gemma_doctor.plan.recommend import Recommendation
    from gemma_doctor.plan.runplan import MemoryFacts
    from gemma_doctor.plan.search import Decision

# A snapshot and where its files are read from (the cache or a folder through LocalSource, or the Hub).
Located = tuple[Snapshot, ModelSource]
R = TypeVar("R")


@dataclasses.dataclass(frozen=True)
class Judgement:
    """One model as the engine hands it on: its facts (with check's Run, ``facts.run``, which the rules read), and
    beside them what the plan made (the facts sit below the plan, so they never hold it): the prescription
    (plan.search.Decision), check's precision decision and the memory plan its Run was resolved from, and check's
    findings."""

    facts: ModelFacts
    decision: Decision | None = None
    findings: tuple[Finding, ...] = ()
    recommendation: Recommendation | None = None  # the precision line's decision
    memory: MemoryFacts | None = None  # the memory plan of check's run (its JSON `memory` block)


def environment(options: CheckOptions) -> Environment:
    """The machine and libraries every model is judged against, read once per run."""
    versions = installed()
    stack = stack_mod.resolve(versions, options.with_packages, options.requirements)
    tc = training_config.load(options.training_config) if options.training_config else None
    gpu = gpu_reader.resolve(getattr(options, "gpu", None))
    if tc is not None:
        from gemma_doctor.readers import launch

        # An accelerate config on its own is read as `accelerate launch --config_file` reads it (one reading).
        tc = launch.as_launched(tc)
    if options.launch is not None:
        from gemma_doctor.readers import launch

        # DeepSpeed's launcher without a hostfile pools the GPUs it sees: the probe's, where this machine was probed.
        visible = len(gpu.devices) if gpu.source == "probe" and gpu.devices else None
        tc = launch.combine(tc, launch.parse(options.launch, visible=visible))
    return Environment(versions=versions, stack=stack, gpu=gpu_reader.for_options(options, tc, gpu),
                       training_config=tc)


def with_config_task(options: CheckOptions, env: Environment, default: str | None = None) -> CheckOptions:
    """The options with the task the training config names (TrainingConfig.task: an axolotl `rl: dpo`, a `trl dpo`
    config's own keys) where --task names none, else ``default``: check plans the run that config executes, as the
    prescription that wrote it was planned (a DPO run pairs its sequences)."""
    if options.task is not None:
        return options
    task = getattr(env.training_config, "task", None) or default
    return dataclasses.replace(options, task=task) if task is not None else options


def gather(facts: ModelFacts, options: CheckOptions, env: Environment) -> Judgement:
    """Fill in a Gemma model's facts, in order: dtype census (headers only) and tokenizer_config.json, weights scan
    (--weights), recommendation."""
    return decide(read_more(facts, options), options, env)


def read_more(facts: ModelFacts, options: CheckOptions) -> ModelFacts:
    """The files a Gemma model is judged by beyond its configs: the dtype census (headers only), tokenizer_config.json,
    and with --weights the weights scan."""
    if not facts.family.is_gemma:
        return facts
    source = facts.source if facts.source is not None else source_of(facts.snapshot)
    census = dtypes_census.census(source, facts.config.data if facts.config.ok else None)
    facts = facts.with_(census=census, tokenizer=tokenizer_reader.read(source))
    if options.weights:
        # The weights scan (mmap, thread pool) is imported only when asked for: `check` starts without it.
        from gemma_doctor.readers import weights as weights_scan

        facts = facts.with_(weights_scan=weights_scan.scan_model(census, source, options.jobs, facts.snapshot.target))
        from gemma_doctor.readers.adapter import compare_head

        facts = facts.with_(head_differs=compare_head(census.headers))
    return facts


def decide(facts: ModelFacts, options: CheckOptions, env: Environment,
           shared: rules.Shared | None = None, prescription: bool = True) -> Judgement:
    """A read Gemma model's recommendation, memory plan and prescription (facts only: no file is read). ``shared``: the
    model part of the model's judgement (rules.Shared), for check's rules to share with the search's candidates.
    Without ``prescription`` (a view that shows none: check's text and github), the search is run only where check's
    own run is the prescribed one, and without what only the prescription's views show (its way out, Run and YAML)."""
    if not facts.family.is_gemma:
        return Judgement(facts)
    gpu = env.gpu if env.gpu is not None else gpu_reader.for_options(options)
    # One shape for the memory plan and the search: both plan the same model (its headers counted once, not twice).
    shape = runplan.shape_for(facts.config.data if facts.config.ok else None, facts.census)
    if shape is not None and env.training_config is None and not runplan.fixed_settings(
            shape, gpu=gpu, request=options.memory or runplan.MemoryRequest(), training_config=None,
            task=recommend.normalise_task(options.task)):
        # The user described no run: check's run is the prescribed one wherever the search finds one (with_decision),
        # so check's own recommendation and plan of it are made only where the search finds none.
        return with_decision(facts, options, env, gpu, shape, shared=shared, explain=prescription,
                             own_plan=lambda: with_memory(facts, advice.recommendation_for(
                                 facts, gpu, options.task, env.libraries), options, env, gpu, shape))
    rec = advice.recommendation_for(facts, gpu, options.task, env.libraries)
    rec, mem = with_memory(facts, rec, options, env, gpu, shape)
    if not prescription and _users_run(mem, env):
        # check's run is the user's own (with_decision keeps it): the prescription would be shown by no view asked for.
        return Judgement(with_run(facts, env, rec, mem), None, recommendation=rec, memory=mem)
    return with_decision(facts, options, env, gpu, shape, recommendation=rec, memory=mem, shared=shared,
                         explain=prescription)


def _users_run(mem: runplan.MemoryFacts | None, env: Environment) -> bool:
    """Whether check's run is the one the user described (a training config, or a setting fixed by an option), which
    check plans and judges whatever the prescription is (with_decision)."""
    return mem is not None and (mem.fixed or env.training_config is not None)


def judged(facts: ModelFacts, options: CheckOptions, env: Environment, remembered: Memo | None = None,
           prescription: bool = True) -> Judgement:
    """A model read (read_more), decided and judged by check's rules: its facts, its decision and its findings. With
    ``remembered`` (the memo of a scan of several models, made with ``env`` and ``options``), the decision and the
    findings are shared across models whose name-free facts are equal (gemma_doctor/memo.py). ``prescription``: see
    decide (the same for every model of a scan, as the memo's environment and options are)."""

    def judge(f: ModelFacts) -> tuple[ModelFacts, tuple[Any, ...]]:
        # The model part of the judgement (what the rules declared model-only find) is judged once, by the search's
        # first candidate, and check's own rules take it from there (rules.Shared).
        shared = rules.Shared()
        j = decide(f, options, env, shared, prescription)
        return j.facts, (j.decision, rules.run(j.facts, env, options, shared), j.recommendation, j.memory)

    facts = read_more(facts, options)
    if remembered is None or not facts.family.is_gemma:
        facts, (decision, findings, rec, mem) = judge(facts)
    else:
        facts, (decision, findings, rec, mem) = remembered.judged(facts, judge)
    return named(Judgement(facts, decision, findings, rec, mem), snippets=prescription)


def named(judgement: Judgement, snippets: bool = True) -> Judgement:
    """A judged model's findings and decision with its names filled in where they name it (report.MODEL,
    report.MODEL_ARGS): the rules and the search judge without reading the model's name, and every caller of the
    engine (views, recommend, the rehearsal, the Python API) meets the named texts only. Without ``snippets`` (a view
    that shows no prescription: check's text and github, whose precision line is the decision's summary), the
    recommendations' framework snippets (``frameworks``: the loading code, the TrainingArguments, TRL, axolotl and PEFT
    settings, which only JSON shows) are left out, not named: a scan named each model's ~100 settings for no line."""
    facts = judgement.facts
    snap = facts.snapshot
    naming = Naming(snap.target, functools.partial(locate.command_args, snap),
                    functools.partial(_quoted, snap.repo_id or ""), functools.partial(locate.download_where, snap),
                    functools.partial(_model_id, snap))
    findings = tuple(naming.finding(f) for f in judgement.findings)
    rec = judgement.recommendation
    d = decision = judgement.decision
    if d is not None:
        d2 = frozen.replace(
            d, findings=tuple(naming.finding(f) for f in d.findings),
            blocking=tuple(naming.finding(f) for f in d.blocking),
            way_out=tuple(naming.text(w) for w in d.way_out),
            recommendation=_named_recommendation(d.recommendation, naming, snippets),
            nearest=_named_recommendation(d.nearest, naming, snippets), training_config=naming.yaml(d.training_config))
        if any(getattr(d2, k) != getattr(d, k) for k in ("findings", "blocking", "way_out", "training_config")) \
                or d2.recommendation is not d.recommendation or d2.nearest is not d.nearest:
            decision = d2
            if rec is d.recommendation:
                return frozen.replace(judgement, decision=d2, findings=findings, recommendation=d2.recommendation)
    if rec is not None:
        rec = _named_recommendation(rec, naming, snippets)
    return frozen.replace(judgement, decision=decision, findings=findings, recommendation=rec)


def _quoted(text: str) -> str:
    import shlex

    return shlex.quote(text)


def _model_id(snap: Snapshot) -> str:
    """The recommendation's model id for ``snap`` (advice.inputs_for writes it so for a model judged as it is)."""
    return snap.repo_id or str(snap.path)


def _named_recommendation(rec: recommend.Recommendation | None, naming: Naming,
                          snippets: bool = True) -> recommend.Recommendation | None:
    if rec is None:
        return rec
    notes = tuple(naming.text(n) for n in rec.notes)
    # axolotl's base_model: the model id (report.MODEL_ID when shared); none at all where no view asked for shows them
    frameworks = naming.value(rec.frameworks) if snippets else {}
    # the model id each trainer format renders from the decision's inputs (recommend.FORMATS)
    given = rec.given
    if given is not None and naming.text(given.model_id) != given.model_id:
        given = frozen.replace(given, model_id=naming.text(given.model_id))
    if frameworks is rec.frameworks and given is rec.given and all(a is b for a, b in zip(notes, rec.notes)):
        return rec
    return frozen.replace(rec, notes=notes, frameworks=frameworks, given=given)


def with_decision(facts: ModelFacts, options: CheckOptions, env: Environment, gpu: GpuFacts,
                  shape: memory.ModelShape | None = None, quantization: str | None = None, *,
                  recommendation: recommend.Recommendation | None = None,
                  memory: runplan.MemoryFacts | None = None, shared: rules.Shared | None = None,
                  explain: bool = True,
                  own_plan: Callable[[], tuple[recommend.Recommendation, runplan.MemoryFacts | None]] | None = None,
                  ) -> Judgement:
    """The prescription (plan.search.prescribe: the run that passes check's own rules, or none and the way out) beside
    check's ``recommendation`` and ``memory`` plan (with_memory); where the user described no run, check's run becomes
    the prescription's. The facts get the Run of the memory plan kept (run.resolve), which the rules read.
    ``own_plan``: instead of ``recommendation`` and ``memory``, what makes them (with_memory, of a run in which the
    user fixed nothing): made only where the prescription does not become check's run."""
    from gemma_doctor.plan import search

    if shape is None:
        shape = runplan.shape_for(facts.config.data if facts.config.ok else None, facts.census)
    decision = search.prescribe(facts, env, options, gpu, shape, quantization, shared=shared, explain=explain)
    rec, mem = recommendation, memory
    # Where the user wrote no training config, check's run may be the prescription's (below).
    prescribed = decision.ok and decision.memory is not None and env.training_config is None
    if own_plan is not None and not prescribed:
        rec, mem = own_plan()
    if prescribed and (mem is None or not mem.fixed):
        # The user described no run (no training config, nothing fixed by an option): the run check plans and judges
        # is the prescribed one, so the precision line, the memory line and the prescription state one run.
        rec, mem = decision.recommendation, decision.memory
    elif not _users_run(mem, env) and decision.ok:
        # Otherwise the user's own run stays (the precision line states the run the memory line plans; the
        # prescription is its own block, never the prescription's batch beside the user's memory figure); with
        # nothing of it planned, the precision line is the prescription's.
        rec = decision.recommendation
    return Judgement(with_run(facts, env, rec, mem), decision, recommendation=rec, memory=mem)


def with_run(facts: ModelFacts, env: Environment, rec: recommend.Recommendation | None,
             mem: runplan.MemoryFacts | None) -> ModelFacts:
    """The facts with check's Run: the memory plan ``mem`` made of it (whose settings the options, the training config,
    the launch line and the search filled in, each with its source), the GPU it was judged against, its verdict and
    figures, the stack, the trainer the readers decided and the quantization ``rec`` loads with. None where nothing was
    planned (not a Gemma, no shape, no precision)."""
    if mem is None:
        return facts.with_(run=None) if facts.run is not None else facts
    quantization = rec.inputs.get("quantization") if rec is not None else None
    return facts.with_(run=run_mod.resolve(mem, model=facts.family.model_type, stack=env.libraries,
                                           trainer=run_mod.trainer_of(env.training_config),
                                           quantization=quantization, training_config=env.training_config))


def with_memory(facts: ModelFacts, rec: recommend.Recommendation, options: CheckOptions, env: Environment,
                gpu: GpuFacts, shape: memory.ModelShape | None = None,
                ) -> tuple[recommend.Recommendation, runplan.MemoryFacts | None]:
    """The memory plan of check's run (after the recommendation ``rec``, whose precision it plans for), and the
    recommendation again with the method and batch the plan chose."""
    if shape is None:
        shape = runplan.shape_for(facts.config.data if facts.config.ok else None, facts.census)
    if shape is None:
        return rec, None
    mem = runplan.plan_memory(shape, **_plan_args(facts, rec, options, env, gpu))
    chosen = advice.planned_settings(mem)
    if chosen is not None:
        rec = advice.recommendation_for(facts, gpu, options.task, env.libraries, chosen)
    return rec, mem


def _plan_args(facts: ModelFacts, rec: recommend.Recommendation, options: CheckOptions, env: Environment,
               gpu: GpuFacts) -> dict[str, Any]:
    """The arguments of check's memory plan of its run (runplan.plan_memory, runplan.fixed_settings) after ``rec``."""
    targets = rec.frameworks.get("peft", {}).get("target_modules")
    return dict(precision=rec.precision, gpu=gpu, request=options.memory or runplan.MemoryRequest(),
                training_config=env.training_config, task=str(rec.inputs.get("task") or "sft"),
                lora_targets=tuple(targets) if isinstance(targets, list) else targets,
                trl_chunks=runplan.trl_chunks(env.libraries),
                defaults=runplan.trainer_defaults(env.training_config, env.libraries,
                                                   runplan.checkpoint_dtype(facts.census), gpu.backend))


def model_report(judgement: Judgement, env: Environment, prescription: bool = True) -> ModelReport:
    """Findings and JSON blocks of one judged (and named) model; without ``prescription`` (a view that shows neither:
    check's text and github), no `prescription` / `way_out` / `blocking` and no `run` block (the Run itself stays on
    the report, where the text view reads it)."""
    facts, findings = judgement.facts, judgement.findings
    extra: dict = {"model_type": facts.family.model_type, "kind": facts.kind.value}
    family = facts.family.label
    if facts.adapter is not None:
        extra["adapter"] = facts.adapter.to_json()
        extra["base"] = facts.base.to_json() if facts.base is not None else None
        if facts.base is not None and facts.base.family is not None and facts.base.family.is_gemma:
            family = facts.base.family.label  # an adapter is of its base's family
    if facts.census is not None:
        extra["dtypes"] = facts.census.to_json()
    if facts.weights_scan is not None:
        extra["weights_scan"] = facts.weights_scan.to_json()
    rec = judgement.recommendation
    if rec is not None:
        extra["recommendation"] = rec.to_json()
    source = facts.source if facts.source is not None else source_of(facts.snapshot)
    extra["source"] = source.kind
    extra["remote"] = remote_block(facts, env) if source.kind == "hub" else None
    run = facts.run
    if judgement.memory is not None:
        extra["memory"] = judgement.memory.to_json()
    if run is not None and prescription:
        extra["run"] = run.to_json()
    if judgement.decision is not None and prescription:
        extra.update(judgement.decision.to_json())
    snap = facts.snapshot
    return ModelReport(target=snap.target, path=source.location, repo_id=snap.repo_id, revision=snap.revision,
                       commit=snap.commit, family=family, findings=findings, extra=extra, run=run,
                       precision=rec.head if rec is not None else None)


def remote_block(facts: ModelFacts, env: Environment) -> dict:
    """The `remote` block of a model read from the Hub: what was read, and what `fix --inplace` would change
    once it is downloaded (the same plan `fix` makes for a cached snapshot, from the same bytes)."""
    from gemma_doctor import fixes, hub  # a model read from the Hub: huggingface_hub is already imported
    from gemma_doctor.rules.use_cache import fix_command

    assert isinstance(facts.source, hub.HubSource)
    block = facts.source.to_json()
    snap = facts.snapshot
    rev = f" --revision {snap.revision}" if snap.revision and snap.revision != "main" else ""
    block["download"] = f"hf download {snap.repo_id}{rev} --include '*.json' '*.safetensors'"
    plan = fixes.plan_model(facts, env.libraries)
    block["fix_after_download"] = {
        "status": plan.status.value,
        "command": fix_command(facts, env.libraries) if plan.changes else None,
        "changes": [{"file": c.name, "keys": list(c.keys), "diff": c.diff()} for c in plan.changes],
        "notes": plan.messages,
    }
    return block


def select(snapshots: Iterable[Snapshot], explicit: bool) -> tuple[list[ModelFacts], list[dict[str, str]]]:
    """Read every snapshot; in a whole-cache scan, non-Gemma repos are skipped, not reported."""
    return select_sources(((s, source_of(s)) for s in snapshots), explicit)


def select_sources(located: Iterable[Located], explicit: bool) -> tuple[list[ModelFacts], list[dict[str, str]]]:
    """select() for snapshots whose source is already known (some may be read from the Hub)."""
    models: list[ModelFacts] = []
    skipped: list[dict[str, str]] = []
    for model, skip in select_each(located, explicit):
        if model is not None:
            models.append(model)
        else:
            skipped.append(skip)
    return models, skipped


def select_each(located: Iterable[Located], explicit: bool) -> Iterator[tuple[ModelFacts | None, dict[str, str]]]:
    """Each snapshot read as it is reached: (its facts, {}) or (None, why it is skipped). A whole-cache scan judges
    each model before it reads the next, so it holds one repo's files at a time, however many the cache has (issue
    33: 300 configs of 15 MiB read before any was judged took `list` to 4.66 GB)."""
    fsafe.forget_roots()
    for snap, source in located:
        if snap.problem is not None:  # never skipped: the finding says why the repo was not read
            yield read_model(snap), {}
            continue
        # One model's reads walk from its folders held open for them (LocalSource.holding), let go before it is judged.
        with source.holding() if isinstance(source, LocalSource) else contextlib.nullcontext():
            got = _selected(snap, source, explicit)
        yield got


def _selected(snap: Snapshot, source: ModelSource, explicit: bool) -> tuple[ModelFacts | None, dict[str, str]]:
    """select_each's answer for one snapshot whose repo could be read."""
    # config.json alone decides whether a whole-cache scan skips a repo: the rest is read only when kept.
    config = source.read_json("config.json")
    fam = family_mod.detect(config.data) if config.ok else None  # detected once: read_model takes it
    # An unknown type that names a Gemma is kept, so that GD007 says it is unknown instead of a silent skip.
    if not explicit and fam is not None and not fam.is_gemma and not fam.unknown_gemma:
        return None, {"target": snap.target, "path": source.location, "reason": "not a Gemma-family model"}
    if not explicit and not config.ok and not config.exists:
        # An adapter's family is its base's, found only by reading further: named, it is checked (issue 21).
        adapter = source.has("adapter_config.json")
        return None, {"target": snap.target, "path": source.location,
                      "reason": "a PEFT adapter; name it to check it" if adapter else "no config.json"}
    return read_model(snap, config, source, fam), {}


def diagnose(targets: list[str], cache_dir: Path | None = None, revision: str = "main",
             all_revisions: bool = False, options: CheckOptions | None = None,
             finish: Callable[[ModelReport], ModelReport] | None = None, prescription: bool = True,
             share: bool = True) -> Report:
    """The whole `check`: targets -> report. Raises UsageError for targets that cannot be found. ``finish``: applied
    to each model's report of a whole-cache scan where it is made (in the scan's worker), e.g. the text view's lines.
    ``prescription``: whether the view shows the prescription (render.formats.Renderer.shows_prescription); a view
    that does not gets none made beyond what check's own run is (decide, model_report). ``share``: models of equal
    name-free facts share one judgement (memo.Memo; False: each judged directly, the same report by
    tests/test_memo_props.py)."""
    options = options or CheckOptions()
    cache = cache_dir if cache_dir is not None else locate.default_cache_dir()
    if not targets:
        return _scan(cache, revision, all_revisions, options, finish, prescription, share)
    located, notes = locate_targets(targets, cache, revision, all_revisions, options.remote)
    models, skipped = select_sources(located, explicit=bool(targets))
    models = [adapters.with_base(m, cache, hub=bool(targets)) for m in models]
    env = environment(options)
    options = with_config_task(options, env)
    remembered = None
    if len(models) > 1:
        from gemma_doctor.memo import Memo  # a scan's only: one model's check imports none of it

        remembered = Memo(env, options, share)
    reports = []
    for m in models:
        reports.append(model_report(judged(m, options, env, remembered, prescription), env, prescription))
    return Report(models=tuple(reports), environment=env.to_json(), skipped=tuple(skipped), cache_dir=str(cache),
                  notes=tuple(notes))


def _scan(cache: Path, revision: str, all_revisions: bool, options: CheckOptions,
          finish: Callable[[ModelReport], ModelReport] | None = None, prescription: bool = True,
          share: bool = True) -> Report:
    """check with no target: every model repo of the cache, its repos spread over processes (gemma_doctor/parallel.py;
    the report is the same for any number of them)."""
    env, names = scan_start(cache, revision, options)
    options = with_config_task(options, env)
    from gemma_doctor.memo import Memo

    remembered = Memo(env, options, share)  # the scan's: forked workers each take it as the lead repos left it

    def run(part: Sequence[str]) -> tuple[list[ModelReport], list[dict[str, str]]]:
        located = [(s, source_of(s)) for s in locate.snapshots_in(cache, part, revision, all_revisions)]
        reports, skipped = [], []
        for m, skip in select_each(located, explicit=False):  # one repo read, judged and let go at a time
            if m is None:
                skipped.append(skip)
                continue
            report = model_report(judged(adapters.with_base(m, cache, hub=False), options, env,
                                         remembered if len(located) > 1 else None, prescription), env, prescription)
            reports.append(finish(report) if finish is not None else report)
        return reports, skipped

    runs = scan_runs(run, names, one_process=options.weights)
    return Report(models=tuple(r for reports, _ in runs for r in reports), environment=env.to_json(),
                  skipped=tuple(s for _, skipped in runs for s in skipped), cache_dir=str(cache), notes=())


def scan_runs(run: Callable[[Sequence[str]], R], names: list[str], one_process: bool = False) -> list[R]:
    """``run`` over the cache's folder names as a whole-cache scan does it: parses shared for the scan's length
    (readers/parsed.py), the repos spread over processes (gemma_doctor/parallel.py; ``one_process`` for --weights,
    whose threads do the parallel part), the results in order."""
    with parsed.sharing():
        return parallel.map_runs(run, names, 1 if one_process else None, lead=parallel.LEAD)


def scan_start(cache: Path, revision: str, options: CheckOptions) -> tuple[Environment, list[str]]:
    """What every repo of a whole-cache scan is judged with, made once before the repos are spread over processes:
    the environment, and the cache's folder names (UsageError for a missing cache, a bad revision, --remote)."""
    if options.remote:
        raise UsageError("--remote reads named repos from the Hub; name one, e.g. "
                         "gemma-doctor check google/gemma-3-12b-it --remote")
    locate.validate_revision(revision)
    names = locate.cache_folders(cache)
    return environment(options), names


# --- where each target is read from: the cache, a folder, or the Hub ------------------------------------

def locate_targets(targets: list[str], cache: Path, revision: str = "main", all_revisions: bool = False,
                   remote: bool = False) -> tuple[list[Located], list[str]]:
    """Each target's snapshots with the source to read them from, and hints for stderr.

    A repo id or Hub URL that is not in the cache is read from the Hub (headers and small files only, never
    downloaded); ``remote`` reads named repos from the Hub even when they are cached.
    """
    if not targets:
        if remote:
            raise UsageError("--remote reads named repos from the Hub; name one, e.g. "
                             "gemma-doctor check google/gemma-3-12b-it --remote")
        return [(s, source_of(s)) for s in locate.resolve([], cache, revision, all_revisions)], []
    located: list[Located] = []
    notes: list[str] = []
    for target in targets:
        repo = locate.repo_target(target, revision)
        if remote:
            if repo is None:
                raise UsageError(f"--remote reads repos from the Hub; {target} is a folder, not a repo id")
            located.append(_from_hub(repo[0], repo[1], cache, all_revisions, notes))
            continue
        note = locate.shadow_note(target, cache)
        if note:
            notes.append(note)
        try:
            snapshots = locate.resolve([target], cache, revision, all_revisions)
        except locate.NotCached as e:
            if repo is None:  # a repo folder given by path whose revision is missing: not the Hub's business
                raise
            located.append(_from_hub(e.repo_id, e.revision or repo[1], cache, all_revisions, notes, e))
            continue
        located.extend((s, source_of(s)) for s in snapshots)
    return located, notes


def _from_hub(repo_id: str, revision: str, cache: Path, all_revisions: bool, notes: list[str],
              not_cached: locate.NotCached | None = None) -> Located:
    """A repo read from the Hub: pinned to a commit, files listed, nothing downloaded."""
    if all_revisions:
        raise UsageError(f"--all-revisions checks cached snapshots, and {repo_id} is read from the Hub one revision "
                         f"at a time; name it with --revision")
    from gemma_doctor import hub  # huggingface_hub: imported only when a model is read from the Hub

    try:
        source = hub.open_model(repo_id, revision, cached=locate.cached_repo_ids(cache),
                                cached_commit=locate.cached_commit(cache, repo_id, revision),
                                not_cached=not_cached is not None)
    except HubOffline:
        if not_cached is None:
            raise
        # Offline by choice: the cache is all there is, so a name it lacks is a usage error, as it always was.
        raise UsageError(f"{not_cached}; HF_HUB_OFFLINE is set, so it was not read from the Hub") from None
    if source.repo_id != repo_id:
        notes.append(f"{repo_id}: the Hub calls it {source.repo_id}; use that name (the cache is case-sensitive)")
    notes.extend(hub.iter_remote_notes(source))
    path = cache / locate.repo_folder_name(source.repo_id) / "snapshots" / source.commit
    snapshot = Snapshot(source.repo_id, path, source.repo_id, revision, source.commit, None, cache, remote=True)
    return snapshot, source


# --- recommend -----------------------------------------------------------------------------------

_PLAN_HINT = "or plan without a download: gemma-doctor recommend --family gemma3"


def _published_id(family: str, size: str) -> str:
    """google/gemma-4-E4B-it for (gemma4, e4b): the checkpoint a --family --size plan names in its snippets, from the
    table of published ids (family.PUBLISHED_IDS; a test holds that it has every size plan/memory.py knows)."""
    known = family_mod.published_id(family, size)
    if known is None:  # never for a size memory.published_shape knows (tests/test_family.py)
        raise UsageError(f"--size {size!r}: no published {family} checkpoint of that size is known")
    return known


def recommend_items(targets: list[str], cache_dir: Path | None, revision: str, family: str | None,
                    gpu_spec: str | None, task: str | None, quantization: str | None,
                    with_packages: tuple[str, ...] = (), requirements: str | None = None, remote: bool = False,
                    request: runplan.MemoryRequest | None = None, training_config_path: str | None = None,
                    trainer: str | None = None) -> tuple[GpuFacts, list[advice.Item], list[str]]:
    """(GPU facts, recommendations, hints for stderr) for `gemma-doctor recommend`. Raises UsageError."""
    # Check every option before touching the cache: a typo fails fast with a usage line.
    options = CheckOptions(gpu=gpu_spec, task=recommend.normalise_task(task) if task is not None else None,
                           with_packages=with_packages,
                           requirements=requirements, remote=remote, memory=request,
                           training_config=training_config_path, trainer=recommend.normalise_trainer(trainer))
    if quantization is not None:
        recommend.normalise_quantization(quantization)
    fam = recommend.normalise_family(family) if family is not None else None
    if fam is not None and targets:
        raise UsageError("--family plans for a model that is not downloaded; drop it or the TARGET "
                         "(a cached model's family is read from its config.json)")
    env = environment(options)
    options = with_config_task(options, env, "sft")  # the training config's task, as check plans it
    gpu = env.gpu if env.gpu is not None else gpu_reader.for_options(options)
    if request is not None and request.size is not None and fam is None:
        raise UsageError("--size names a published size of --family; a cached model's size is read from its files")
    if fam is not None:
        size = request.size if request is not None else None
        shape = memory.published_shape(fam, size)
        if shape is None and size is not None:
            known = family_mod.published_id(fam, size)
            if known is not None:  # Gemma 3n, PaliGemma: a published checkpoint without a published config here
                raise UsageError(f"--size {size!r}: {known} is the published {fam} of that size, but gemma-doctor has "
                                 f"no published config to size it without a download; plan it once downloaded "
                                 f"(gemma-doctor recommend {known})")
            sizes = tuple(dict.fromkeys(memory.published_sizes(fam) + family_mod.published_sizes(fam)))
            raise UsageError(f"--size {size!r}: gemma-doctor knows the published sizes of {fam} as "
                             + (", ".join(sizes) if sizes else "none (plan a downloaded model instead)"))
        if shape is None:
            # No published config of this family here (Gemma 3n, PaliGemma, T5Gemma...): its plan would be of a
            # shape made up of memory.shape_from_config's defaults (2048 x 18 layers), not of the checkpoint it names.
            sizes = family_mod.published_sizes(fam)
            raise UsageError(f"--family {fam}: gemma-doctor has no published config of {fam} to size it without a "
                             "download (its shape would be a guess, unverified"
                             + (f"; the published sizes are {', '.join(sizes)}" if sizes else "")
                             + f"); plan it once downloaded (gemma-doctor recommend {advice.PLAN_MODEL_IDS[fam]})")
        model_id = advice.PLAN_MODEL_IDS[fam] if size is None else _published_id(fam, size)
        facts = advice.planned_facts(fam, size, model_id)
        j = named(with_decision(facts, options, env, gpu, shape, quantization))
        return gpu, [_item(j, f"{fam} (planned)", True, model_id)], []
    cache = cache_dir if cache_dir is not None else locate.default_cache_dir()
    try:
        located, notes = locate_targets(targets, cache, revision, False, remote)
    except UsageError as e:
        raise UsageError(f"{e}; {_PLAN_HINT}" if not targets else str(e)) from None
    models, _ = select_sources(located, explicit=bool(targets))
    items: list[advice.Item] = []
    skipped: list[str] = list(notes)
    planned: list[tuple[ModelFacts, CheckOptions]] = []
    unplanned: list[str] = []  # adapters whose base cannot be planned on, and why
    for facts in models:
        if facts.adapter is None:
            planned.append((facts, options))
            continue
        # An adapter is trained further on its base: the plan is the base's, as a LoRA run unless --method says.
        base, target = facts.adapter.base_model, facts.snapshot.target
        if not base:
            unplanned.append(f"{target}: a PEFT adapter that names no base model (base_model_name_or_path); "
                             "recommend the model it was trained on")
            continue
        try:
            base_located, base_notes = locate_targets([base], cache, facts.adapter.base_revision or revision)
        except DoctorError as e:
            unplanned.append(f"{target}: a PEFT adapter of {adapters.one_line(base, 200)!r}, which could not be read "
                             f"({adapters.one_line(str(e))}); recommend the base once it is here")
            continue
        skipped.extend(base_notes)
        want = request or runplan.MemoryRequest()
        lora = want if want.method is not None else dataclasses.replace(want, method="lora")
        ad = facts.adapter
        targets_said = ad.target_modules if isinstance(ad.target_modules, str) else ", ".join(ad.target_modules or [])
        skipped.append(f"{target}: a PEFT adapter; planned on its base {adapters.one_line(base, 200)}"
                       + (" as a LoRA run (--method to plan another)" if want.method is None else "")
                       + f"; the rank and targets below are a new adapter's: continuing this one keeps its own "
                         f"(r={ad.rank}, targets {targets_said or 'none'})")
        base_options = dataclasses.replace(options, memory=lora)
        planned.extend((m, base_options) for m in select_sources(base_located, explicit=True)[0])
    for facts, opts in planned:
        if not facts.family.is_gemma:
            skipped.append(f"{facts.snapshot.target}: not a Gemma-family model (or config.json unreadable); skipped")
            continue
        j = gather(facts, opts, env)  # the census first: the saved dtype and quantization come from it
        if quantization is not None:  # --quantization is recommend's own: decide again with it
            j = with_decision(j.facts, opts, env, gpu, None, quantization, recommendation=j.recommendation,
                              memory=j.memory)
        j = named(j)
        s = j.facts.snapshot
        items.append(_item(j, s.target, False, s.repo_id or str(s.path)))
    if not items:
        where = f"in {cache}" if not targets else "among the targets"
        raise UsageError("; ".join(unplanned) if unplanned else
                         f"no Gemma-family model {where}; name one (gemma-doctor recommend google/gemma-3-1b-it) {_PLAN_HINT}")
    return gpu, items, skipped + unplanned


def _item(judgement: Judgement, target: str, planned: bool, model_id: str) -> advice.Item:
    """One entry of `recommend`: the model and its decision (the prescription, or the nearest run and the way out)."""
    facts, d = judgement.facts, judgement.decision
    assert d is not None  # recommend plans Gemma models only: each has its decision
    s = facts.snapshot
    rec = d.recommendation if d.ok else d.nearest
    mem = d.memory if d.ok else d.nearest_memory
    where = None if planned else (facts.source.location if facts.source is not None else str(s.path))
    model = (facts.family.label if planned else facts.family.label)
    return advice.Item(target, None if planned else s.repo_id, None if planned else s.revision,
                       None if planned else s.commit, where, model, planned, model_id, rec, mem, d)

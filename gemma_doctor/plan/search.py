"""prescribe(): the one decision. What run to prescribe for a model, found by searching the options against the very
rules and memory plan that `check` runs (docs/decision.md).

Candidates come in the order a user would prefer them: the user's own fixed choices (method, batch, sequence length,
GPUs, training-config keys) first; then a run that fits with margin; the largest per-device batch (gradient
accumulation keeps the effective batch); checkpointing before a smaller batch; sharding over the GPUs the user has
(ZeRO-2, ZeRO-3) before changing the method; full fine-tuning, then LoRA, then QLoRA; the default attention backend,
then eager. Each candidate that fits the GPU's memory is handed to `check`'s own rules, with the same GPU and stack,
as the very training config `check --training-config` reads from the YAML `recommend --format yaml` prints (built
from the run, never printed and parsed back: ``as_read``; the YAML is rendered for the prescription alone), in the
format of the one trainer the run is written for (``trainer_format``: --trainer, the training config's, else axolotl)
and planned as that trainer runs it (TRL's SFTTrainer: chunked log-probs, ``_for_trainer``):
whatever `check` would flag (an error or a warning, other than what `gemma-doctor fix` cures in the model files) rejects
it. The first that passes is the prescription; when none does, there is none, and the way out says what would make one.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from gemma_doctor import frozen, rules, trainers
from gemma_doctor.codes import CODES, Cure, codes_of
# dataclasses.replace's copy, without __init__ where it would only assign the fields (frozen.py): the search copies
# its request, settings, options and environments per model and per candidate
from gemma_doctor.frozen import replace
from gemma_doctor.facts import CheckOptions, Environment, ModelFacts
from gemma_doctor.plan import advice, memory, recommend, runplan
from gemma_doctor.plan.memory import METHODS, MemoryPlan, ModelShape
from gemma_doctor.readers import training_config as tc_reader
from gemma_doctor.readers.gpu import GpuFacts
from gemma_doctor.rules import crashes
from gemma_doctor.report import Finding, Severity
from gemma_doctor.run import PRESCRIBED_TRAINER, Run, Sourced, trainer_of
from gemma_doctor.run import libraries as run_libraries
from gemma_doctor.run import resolve as resolve_run
from gemma_doctor.trainers import Trainer

# The path a prescription's training config is judged under (it exists only in memory).
PRESCRIPTION = "<prescription>"
# At most this many candidates are judged by check's rules (each costs one rules.run): enough for every order above.
MAX_JUDGED = 96
_RL_TASKS = recommend.RL_TASKS


@dataclass(frozen=True)
class Decision:
    """The prescription for one model (None when no run passes check), what check says of it, and the way out."""

    recommendation: recommend.Recommendation | None
    memory: runplan.MemoryFacts | None
    training_config: str | None  # the YAML `recommend --format yaml` prints: check --training-config reads it
    findings: tuple[Finding, ...] = ()  # check's findings on the prescription (infos, and what `fix` cures)
    way_out: tuple[str, ...] = ()
    judged: int = 0  # candidates judged by check's rules
    versions: tuple[tuple[str, str], ...] = ()  # the libraries the prescription assumes (the stack it was judged on)
    # When there is no prescription: the nearest run tried and what check said of it.
    nearest: recommend.Recommendation | None = None
    nearest_memory: runplan.MemoryFacts | None = None
    blocking: tuple[Finding, ...] = ()
    # Version ranges the prescription needs and the stack did not say (transformers unknown or not installed here):
    # each resolves a finding's window, e.g. ("transformers>=5.6.0", "GD105"). Part of the prescribed run.
    pins: tuple[tuple[str, str], ...] = ()
    run: Run | None = None  # the prescribed run, typed, each field with its source (gemma_doctor/run.py)
    trainer: str = "axolotl"  # the trainer whose config the run is written in and judged as (recommend.TRAINER_FORMATS)
    # Why the run is not written for the trainer of the user's --training-config (its format cannot state the run),
    # naming that trainer; None where it is (or none was named, or --trainer chose).
    trainer_fallback: str | None = None

    @property
    def ok(self) -> bool:
        """True when there is a prescription."""
        return self.recommendation is not None

    def prescription(self) -> dict[str, Any] | None:
        """The prescription as one flat object (JSON `prescription`), or None."""
        rec, mem = self.recommendation, self.memory
        if rec is None:
            return None
        run = mem.plan.settings if mem is not None else None
        if run is not None:  # the prescribed run's own settings (every format renders them: test_run_roundtrip)
            batch, accumulation, ckpt, attention = (run.batch_size, run.gradient_accumulation_steps,
                                                    run.gradient_checkpointing, run.attention)
        else:  # no memory plan (no shape): what the recommendation's arguments write
            args = rec.training_arguments
            batch, accumulation = args.get("per_device_train_batch_size"), args.get("gradient_accumulation_steps", 1)
            ckpt = bool(args.get("gradient_checkpointing") or args.get("activation_checkpointing"))
            attention = rec.frameworks["transformers"]["from_pretrained"].get("attn_implementation", "sdpa")
        out: dict[str, Any] = {
            "precision": rec.precision, "load_dtype": rec.load_dtype, "method": rec.method,
            "quantization": rec.inputs.get("quantization"),
            "batch_size": batch, "gradient_accumulation_steps": accumulation,
            "seq_len": run.seq_len if run else None,
            "gradient_checkpointing": ckpt, "checkpointing": "non-reentrant" if ckpt else None,
            "attention": attention,
            "use_cache": bool(rec.frameworks["transformers"]["use_cache"]),
            "lora": ({"r": rec.frameworks["peft"]["r"], "alpha": rec.frameworks["peft"]["lora_alpha"],
                      "target_modules": rec.frameworks["peft"]["target_modules"]} if rec.method != "full" else None),
            "num_gpus": run.num_gpus if run else 1, "zero_stage": run.zero_stage if run and run.num_gpus > 1 else 0,
            "memory": mem.plan.summary() if mem is not None else None,
            "serving": rec.frameworks.get("serving"),
            "versions": dict(self.versions),
            "pins": [{"requirement": req, "resolves": code} for req, code in self.pins],
            "fix_first": sorted({f.code for f in self.findings if cured_by_fix(f)}),
            "run": self.run.to_json() if self.run is not None else None,
            "trainer_fallback": self.trainer_fallback,
        }
        return out

    def to_json(self) -> dict[str, Any]:
        """The `prescription` / `way_out` pair of check's and recommend's JSON."""
        return {"prescription": self.prescription(), "way_out": list(self.way_out),
                "blocking": [f"{f.code}: {f.message}" for f in self.blocking] if not self.ok else []}


def cured_by_fix(f: Finding) -> bool:
    """A finding `gemma-doctor fix` cures in the model files (its code's cure, codes.py): not the run's business.
    Read from the code's entry, as `list` reads it, never from the wording of the finding's fix."""
    code = CODES.get(f.code)
    return code is not None and code.cure is Cure.FIX


def _on_memory(f: Finding) -> bool:
    """A verdict of the memory plan (its code's entry): another method, sequence, GPU count or GPU answers it."""
    code = CODES.get(f.code)
    return code is not None and code.memory


def blocking(findings: tuple[Finding, ...]) -> tuple[Finding, ...]:
    """What makes `check` fail or warn on a run, other than what `fix` cures on disk and what is about the command
    line's own input (GD480: a misspelt --with name changes no run; codes.Code.blocks_prescription)."""
    return tuple(f for f in findings if f.severity in (Severity.ERROR, Severity.WARNING)
                 and (f.code not in CODES or CODES[f.code].blocks_prescription))


# --- candidates ----------------------------------------------------------------------------------------------------

_CANDIDATES: dict[tuple[Any, ...], tuple[list[MemoryPlan], Iterator[MemoryPlan]]] = {}
_CANDIDATES_LOCK = threading.Lock()


def candidates(shape: ModelShape, req: runplan.RunRequest, accept: tuple[str, ...] = ("fits",),
               relax_batch: bool = False, accumulate: bool = True) -> Iterator[MemoryPlan]:
    """Runs in the order of preference whose memory verdict is in ``accept`` (every run when the GPU is unknown).

    The plans are pure functions of the arguments: the models of one architecture in a cache get the same ones, so
    they are made once per process, as far as a search has asked for them."""
    try:
        key = (shape, req, accept, relax_batch, accumulate)
        made = _CANDIDATES.get(key)
    except TypeError:  # an unhashable part: made as they are
        yield from _candidates(shape, req, accept, relax_batch, accumulate)
        return
    if made is None:
        if len(_CANDIDATES) >= 256:
            _CANDIDATES.clear()
        made = _CANDIDATES[key] = ([], _candidates(shape, req, accept, relax_batch, accumulate))
    plans, more = made
    i = 0
    while True:
        if i == len(plans):
            with _CANDIDATES_LOCK:  # one maker per key, whichever search (or thread) asks first
                if i == len(plans):
                    nxt = next(more, None)
                    if nxt is None:
                        return
                    plans.append(nxt)
        yield plans[i]
        i += 1


def _candidates(shape: ModelShape, req: runplan.RunRequest, accept: tuple[str, ...] = ("fits",),
                relax_batch: bool = False, accumulate: bool = True) -> Iterator[MemoryPlan]:
    base, fixed = req.base, set(req.fixed)
    methods = (base.method,) if "method" in fixed else METHODS
    n = base.num_gpus
    stages = (base.zero_stage,) if "zero_stage" in fixed or n <= 1 else tuple(dict.fromkeys((base.zero_stage, 2, 3)))
    target = base.batch_size * base.gradient_accumulation_steps
    batch_fixed = "batch_size" in fixed and not relax_batch
    batches = [base.batch_size] if batch_fixed else memory.batch_sizes(target)
    if "gradient_checkpointing" in fixed:
        ckpts: tuple[bool, ...] = (base.gradient_checkpointing,)
    elif base.task in _RL_TASKS:
        ckpts = (True, False)  # the stable RL setting first (TRL #3236)
    else:
        ckpts = (False, True)
    attentions = (base.attention,) if "attention" in fixed else tuple(dict.fromkeys((base.attention, "eager")))
    seen: set[tuple[Any, ...]] = set()
    for method in methods:
        load = memory.load_dtype_for(base.precision, method) if base.source("precision") != "option" else base.load_dtype
        run0 = replace(base, method=method, quant_bits=(base.quant_bits or 4) if method == "qlora" else None,
                       load_dtype=load)
        for stage in stages:
            for attention in attentions:
                # The largest batch first; at each batch the preferred checkpointing first, so checkpointing comes
                # before a smaller batch (and a model that must not checkpoint still gets every batch).
                for b in batches:
                    for ck in ckpts:
                        acc = (base.gradient_accumulation_steps if batch_fixed else max(1, -(-target // b))) \
                            if accumulate else 1
                        key = (method, stage, attention, ck, b, acc)
                        if key in seen:
                            continue
                        seen.add(key)
                        run = frozen.replace(run0, zero_stage=stage, attention=attention, gradient_checkpointing=ck,
                                             batch_size=b, gradient_accumulation_steps=acc)
                        p = memory.plan(shape, run, req.gpu_bytes, req.gpu_name)
                        if not req.gpu_bytes or p.verdict in accept:
                            yield p


# --- judging a candidate by check's own rules ----------------------------------------------------------------------

# No __eq__/__hash__/__repr__ made: never compared, hashed or shown (each made method costs start-up time).
@dataclass(frozen=True, eq=False, repr=False)
class Judged:
    """A candidate run, its views, and what check's rules say of it."""

    plan: MemoryPlan
    recommendation: recommend.Recommendation
    checked: runplan.MemoryFacts  # the memory plan check made of the candidate's training config
    findings: tuple[Finding, ...]
    shape: ModelShape
    request: runplan.RunRequest

    @functools.cached_property
    def yaml(self) -> str:
        """The training config `recommend --format yaml` prints for this run: rendered only for the run that is
        prescribed (or the nearest), never to judge a candidate (the rules read ``as_read`` of the same run)."""
        return recommend.training_config_yaml(self.recommendation)

    @property
    def blocking(self) -> tuple[Finding, ...]:
        """What check would flag."""
        return blocking(self.findings)

    @functools.cached_property
    def memory(self) -> runplan.MemoryFacts:
        """The memory block of the prescription: check's plan, each setting's source as the user reads it. Made only
        for the run that is prescribed (or the nearest), not for every candidate the rules reject."""
        mem, req = self.checked, self.request
        src = dict(mem.plan.settings.sources)
        for k, v in src.items():
            if v.startswith("training config"):
                # The search never changes the LoRA targets or rank the user named: they keep the user's source.
                kept = k in req.fixed or k in ("seq_len", "optimizer") or (
                    k in _USERS_LORA and req.base.source(k).startswith("training config"))
                src[k] = req.base.source(k) if kept else "chosen by the search"
        # check's plan relabelled, never planned again (runplan.memory_facts: memory.with_sources)
        return runplan.memory_facts(self.shape, mem.plan, req, _prescribed, sources=tuple(sorted(src.items())))


def _prescribed(plan: MemoryPlan) -> str:
    """The choice's reason for the prescribed run ``plan``."""
    return f"the prescribed run: {plan.summary()}"


# The LoRA settings a user's training config names (their sources in run.Settings).
_USERS_LORA = ("lora", "lora_r", "lora_targets")


def judge(facts: ModelFacts, env: Environment, options: CheckOptions, gpu: GpuFacts, shape: ModelShape,
          plan: MemoryPlan, req: runplan.RunRequest, inputs: recommend.Inputs,
          shared: rules.Shared | None = None) -> Judged:
    """Render ``plan`` as the prescription would, then run `check` on it: the training config it prints, read back,
    the memory plan check makes of that config, and every rule, with the same GPU and stack."""
    return _judge(facts, env, options, gpu, shape, plan, req, inputs, shared=shared)()


# Which rules run last when a candidate is only being tried, and which a pin can answer, are data on the rules and
# their codes (codes.emits; codes.Code.pins), never lists of rule names here:
# - the rules that cost the most per call (measured on a whole-cache scan: the catalogue's ~50 conditions, the
#   horizon's version comparisons, the crash windows) are declared costly: most candidates are rejected by a cheaper
#   rule first (GD650 at a batch too large), and the rest are never run for them;
# - the rules that declare a code whose findings name a transformers window or minimum (Code.pins), the only findings
#   _pin reads: a rejected candidate is asked for these, not for every rule, when the search decides a pin
#   (tests/test_run_props.py holds the answer independent of the order rules are tried in).


@functools.lru_cache(maxsize=1)
def _pinning_rules() -> tuple[int, ...]:
    pins = frozenset(c.code for c in CODES.values() if c.pins)
    return tuple(i for i, r in enumerate(rules.RULES) if codes_of(r) & pins)


@functools.lru_cache(maxsize=1)
def _quick_order() -> tuple[int, ...]:
    costly = [bool(getattr(r, "costly", False)) for r in rules.RULES]
    return tuple(i for i, c in enumerate(costly) if not c) + tuple(i for i, c in enumerate(costly) if c)


_PLANS: dict[tuple[Any, ...], Any] = {}


def _checked_plan(shape: ModelShape, precision: str, gpu: GpuFacts,
                  request: runplan.MemoryRequest, key: str, tc: tc_reader.TrainingConfig, task: str,
                  trl_chunks: bool = False, defaults: tuple[runplan.Default, ...] = ()) -> runplan.MemoryFacts:
    """runplan.plan_memory (a pure function of its arguments) of a candidate's training config, remembered per process
    by the text the config is made from (``key``, _config_key): models of one architecture in a cache get the same
    candidates. ``defaults``: what the candidate's trainer fixes where its config leaves a setting open
    (runplan.trainer_defaults: axolotl's load dtype of its switches), as check plans the YAML read back."""
    return runplan.remembered(_PLANS, (shape, precision, gpu, request, task, trl_chunks, key, defaults),
                              lambda: runplan.plan_memory(shape, precision=precision, gpu=gpu,
                                                          request=request, training_config=tc, task=task,
                                                          trl_chunks=trl_chunks, config_key=key, defaults=defaults,
                                                          # the candidate's config writes ``precision``, the
                                                          # prescription's: its Run says so (its switches as
                                                          # written are the Run's too: run.Written)
                                                          config_precision=False, precision_source=PRESCRIBED))


def _judge(facts: ModelFacts, env: Environment, options: CheckOptions, gpu: GpuFacts, shape: ModelShape,
           plan: MemoryPlan, req: runplan.RunRequest, inputs: recommend.Inputs,
           quick: bool = False, under: _Under | None = None,
           made: tuple[recommend.Recommendation, str, tc_reader.TrainingConfig] | None = None,
           shared: rules.Shared | None = None) -> Callable[[], Judged]:
    """judge(), in two steps when ``quick``: the rules run (cheapest first) only until one flags the candidate; what
    is returned finishes the rest on demand. Its findings, in the rules' own order, are exactly rules.run's (rules
    are pure functions of the facts), so a candidate that passes is judged by every rule; a rejected one is finished
    only when no candidate passes and the nearest must be told by all its findings. ``under``: the search's own
    environment and options to judge under (made here when not given, or given for another environment). ``made``:
    the candidate's recommendation, config key and training config, where it was judged before under another stack
    (a pin): none of them reads the stack (``inputs`` are the search's own), so they are not made again. ``shared``:
    the model part of the model's judgement (rules.Shared), shared with check's rules and the other candidates."""
    if made is None:
        rec = recommend.decide(frozen.replace(inputs, settings=plan.settings))
        made = (rec, _config_key(rec), as_read(rec))
    rec, key, tc = made
    if under is None or under.env is not env:
        under = _Under(env, options)
    env2, opts = under.env_for(key, tc), under.options
    told = recommend.told_seq_len(rec)
    if told is not None:
        # The format states no sequence (TrainingArguments): judged as `check --training-config FILE --seq-len N`
        # reads it, the command its YAML's head names; without it the plan read back was of the default 1024 tokens
        # while the head said N (recommend --seq-len 2048 --trainer transformers planned 1024).
        opts = replace(opts, memory=replace(opts.memory or runplan.MemoryRequest(), seq_len=told))
    mem = _checked_plan(shape, rec.precision, gpu, opts.memory or runplan.MemoryRequest(), key, tc,
                        str(rec.inputs.get("task") or "sft"), under.trl_chunks,
                        runplan.trainer_defaults(tc, env2.libraries, runplan.checkpoint_dtype(facts.census)))
    # The candidate as check reads its YAML back: the rules read its Run (precision, shape, memory verdict).
    run = resolve_run(mem, model=facts.family.model_type, stack=env2.libraries, trainer=trainer_of(env2.training_config),
                      quantization=rec.inputs.get("quantization"), stated=under.libraries,
                      training_config=env2.training_config)
    judged_facts = facts.with_(run=run)
    part = (shared if shared is not None else rules.Shared()).of(judged_facts, env2, opts)
    done: dict[int, tuple[Finding, ...]] = {}

    def finish() -> Judged:
        findings = tuple(f for i, rule in enumerate(rules.RULES)
                         for f in (done[i] if i in done else rules.judge(i, judged_facts, env2, opts, part)))
        if tc.error is not None:  # never: the reader must read what we print (a test holds it); judged all the same
            findings += (Finding("GD601", Severity.ERROR, f"the prescription's own training config: {tc.error}"),)
        # check read every setting from the prescription's training config; Judged.memory says where each came from.
        return Judged(plan, rec, mem, findings, shape, req)

    def pinnable() -> tuple[Finding, ...]:
        for i in _pinning_rules():
            if i not in done:
                done[i] = rules.judge(i, judged_facts, env2, opts, part)
        return tuple(f for i in _pinning_rules() for f in done[i])

    if quick and tc.error is None:
        order = _LAST_REJECTED + tuple(i for i in _quick_order() if i not in _LAST_REJECTED)
        for i in order:
            done[i] = rules.judge(i, judged_facts, env2, opts, part)
            if blocking(done[i]):
                _remember_rejection(i)
                return _Rejected(plan, rec, mem, done[i], shape, req, finish, pinnable, made)
    return finish


# The rule that rejected the last candidate is tried first on the next (the candidates of one model, and the models
# of one cache, tend to be rejected by the same rule). Only the order of trying changes, never the findings.
_LAST_REJECTED: tuple[int, ...] = ()


def _remember_rejection(i: int) -> None:
    global _LAST_REJECTED
    if _LAST_REJECTED != (i,):
        _LAST_REJECTED = (i,)


# No __eq__/__hash__/__repr__ made: never compared, hashed or shown (each made method costs start-up time).
@dataclass(frozen=True, eq=False, repr=False)
class _Rejected(Judged):
    """A candidate a rule flagged, judged no further (yet): ``findings`` holds that rule's alone."""

    finish: Callable[[], Judged] = lambda: None  # type: ignore[assignment, return-value]
    # The findings of the rules whose findings a pin can resolve (_pinning_rules: Code.pins), run on demand.
    pinnable: Callable[[], tuple[Finding, ...]] = lambda: ()
    # The candidate's recommendation, config key and training config (_judge's ``made``): judged again under a pin,
    # the candidate is the same run.
    made: tuple[Any, ...] = ()

    def __call__(self) -> Judged:
        return self.finish()


class _Under:
    """The environment and options candidates are judged under, made once per search for its environment and options
    (owned by the prescribe() call, dropped with it): the search asks for the same ones for every candidate."""

    def __init__(self, env: Environment, options: CheckOptions) -> None:
        self.env = env
        self.options = replace(options, training_config=PRESCRIPTION, memory=runplan.MemoryRequest(
            gpu_memory=options.memory.gpu_memory) if options.memory else None)
        self._envs: dict[str, Environment] = {}  # by the candidate's training-config key (_config_key): by value
        # The stack's libraries as each candidate's Run states them, and whether its TRL computes log-probs in chunks:
        # one stack for every candidate judged under it.
        self.libraries = run_libraries(env.libraries)
        self.trl_chunks = runplan.trl_chunks(env.libraries)

    def env_for(self, key: str, tc: tc_reader.TrainingConfig) -> Environment:
        """The environment with the candidate's training config (``tc``, as_read's for ``key``)."""
        env2 = self._envs.get(key)
        if env2 is None:
            env2 = self._envs[key] = replace(self.env, training_config=tc)
        return env2


def as_read(rec: recommend.Recommendation) -> tc_reader.TrainingConfig:
    """The training config `check --training-config` reads from the prescription's YAML (in its trainer's format,
    rec.trainer, recognised as that format's kind), built directly from the run's own mapping and lines (recommend.training_config_data -> training_config.of_rendering), never by printing that
    YAML and parsing it back: the rules judge the candidate directly. tests/test_run_roundtrip.py proves it equal to
    the YAML read back, for random runs and for every candidate the search judges at points of the example grid."""
    data, lines = recommend.training_config_data(rec)
    return tc_reader.of_rendering(data, PRESCRIPTION, trainers.kind_named(recommend.FORMAT_KINDS[rec.trainer]), lines)


def _config_key(rec: recommend.Recommendation) -> str:
    """A text a candidate's training config is a function of, for the per-process memos of what is planned from it
    (_PLANS, runplan._REQUESTS) and the search's environments (_Under): its axolotl mapping's repr, the repo id
    blanked (a scan makes the same few candidates for every model of one architecture; the reader keeps only that
    ``base_model`` is there; repr tells True from 1 and "1" from 1)."""
    data = recommend.format_mapping(rec)
    blank = {k: "" for k in ("base_model", "model_name_or_path") if k in data}
    return rec.trainer + repr({**data, **blank})


# --- the decision --------------------------------------------------------------------------------------------------

def prescribe(facts: ModelFacts, env: Environment, options: CheckOptions, gpu: GpuFacts, shape: ModelShape | None,
              quantization: str | None = None, *, limit: int = 0, explain: bool = True,
              shared: rules.Shared | None = None) -> Decision:
    """The one decision for ``facts`` (a cached model, or a --family plan's published config): a run that passes
    check, or none and the way out (``explain``: each way out is itself the prescription of the changed options).
    Without ``explain``, what only a view of the prescription shows is not made: the way out, the prescription's typed
    Run and its YAML (``run`` and ``training_config`` None); the prescribed run and its memory plan are the same.
    At most ``limit`` candidates are judged (MAX_JUDGED when 0). ``shared``: the model part of the model's judgement
    (rules.Shared), which check's own rules share; every candidate of the search shares it in any case."""
    limit = limit or MAX_JUDGED
    shared = shared if shared is not None else rules.Shared()
    given = env  # the stack as the command line gives it: the way out's lines are that command with one change
    fmt = trainer_format(options, env)
    inputs = replace(advice.inputs_for(facts, gpu, options.task, quantization, env.libraries), trainer=fmt)
    first = recommend.decide(inputs)
    if shape is None:  # no shape to plan memory for: the precision decision alone
        return Decision(first, None, recommend.training_config_yaml(first), versions=_versions(inputs), trainer=fmt)
    under = _Under(env, options)  # this search's: what every candidate is judged under
    req = runplan.request_spec(precision=first.precision, gpu=gpu,
                               request=options.memory or runplan.MemoryRequest(), training_config=env.training_config,
                               task=str(first.inputs.get("task") or "sft"), trl_chunks=under.trl_chunks,
                               config_precision=False,  # each candidate writes the precision it is planned in
                               precision_source=PRESCRIBED)
    req = _with_targets(_with_quantization(req, first), first)
    if fmt != recommend.TRAINING_CONFIG_KIND and options.trainer is None and _unwritten(req, fmt) is not None:
        # The user's training config is TRL's, TrainingArguments' or LLaMA-Factory's, but the run is one it cannot
        # state: axolotl's, and the prescription says so (trainer_fallback).
        fmt = recommend.TRAINING_CONFIG_KIND
        inputs = replace(inputs, trainer=fmt)
    fallback = trainer_fallback(options, env, fmt, req)
    req = _for_trainer(req, fmt, env, options)
    judged = 0
    # The pins the model's facts require whatever the run, before any candidate: its first is then judged pinned.
    env, pins = _model_pins(facts, env, under.options, shared)
    if pins:
        under = _Under(env, options)
    strict: list[_Rejected] = []  # candidates that kept every choice the user made, rejected
    nearest: Judged | None = None
    rejected: list[_Rejected] = []
    full: list[Judged] = []  # the rejected, finished by every rule (for the nearest), in the order tried
    passes: list[tuple[tuple[str, ...], bool, bool]] = [
        (("fits",), False, True), (("tight",), False, True), (("fits",), True, True), (("tight",), True, True)]
    while passes:
        for accept, relax, accumulate in passes:
            if relax and ("batch_size" not in req.fixed or not req.gpu_bytes):
                continue  # a batch the user chose is relaxed only to fit a GPU whose memory is known
            for plan in candidates(shape, req, accept, relax_batch=relax, accumulate=accumulate):
                if judged >= limit:
                    break
                tried = _judge(facts, env, options, gpu, shape, plan, req, inputs, quick=True, under=under,
                               shared=shared)
                judged += 1
                while isinstance(tried, _Rejected) and len(pins) < MAX_PINS and judged < limit:
                    pinned = _pin(env, tried.findings)
                    if pinned is None and _may_pin(env):
                        # A quick rejection holds the findings of the first rule that flagged the run, and which rule
                        # runs first depends on the runs judged before in this process (_LAST_REJECTED): a pin read
                        # from them came at a different run, so the prescription too. Decided on the findings of every
                        # rule a pin can answer, the answer is the same whatever ran before.
                        pinned = _pin(env, tried.pinnable())
                    if pinned is None:
                        break
                    env, pin = pinned
                    pins.append(pin)
                    under = _Under(env, options)
                    tried = _judge(facts, env, options, gpu, shape, plan, req, inputs, quick=True, under=under,
                                   made=tried.made, shared=shared)
                    judged += 1
                if not isinstance(tried, _Rejected):  # no rule flagged it: every rule ran
                    j = tried()
                    rec = j.recommendation if accumulate else _without_accumulation(j.recommendation, full)
                    mem = j.memory
                    if relax:
                        rec, mem = _relaxed(j, rec, req, strict, shape)
                    return Decision(rec, mem, j.yaml if explain else None, j.findings, (), judged,
                                    versions=_versions(inputs), pins=tuple(pins),
                                    run=_run_of(mem, facts, env, rec) if explain else None, trainer=fmt,
                                    trainer_fallback=fallback)
                rejected.append(tried)
                if not relax:
                    strict.append(tried)
        # None passes: each rejected run is told by all its findings (the nearest is chosen by them).
        full.extend(t() for t in rejected[len(full):])
        # Every run that accumulates refused for accumulating (GD739: the Trainer scales Gemma 3's loss by the steps
        # on transformers 4.50-4.56): the same runs without accumulation, a smaller effective batch, once.
        again = passes[0][2] and any(_on_accumulation(j.blocking) for j in full)
        passes = [(("fits",), False, False), (("tight",), False, False)] if again else []
    # The nearest is the first with the fewest blocking findings.
    for j in full:
        if nearest is None or len(j.blocking) < len(nearest.blocking):
            nearest = j
    if nearest is None:  # nothing fits the GPU at all: judge the smallest run so the way out names everything
        # on the stack as given, unpinned: no candidate took the model's pins, so each window's cure is a way out
        plan = _smallest(shape, req)
        nearest, pins = judge(facts, given, options, gpu, shape, plan, req, inputs, shared), []
        judged += 1
        if not nearest.blocking:  # check accepts it after all (a plan the search's own verdicts did not offer)
            return Decision(nearest.recommendation, nearest.memory, nearest.yaml if explain else None, nearest.findings,
                            (), judged, versions=_versions(inputs), pins=tuple(pins),
                            run=_run_of(nearest.memory, facts, given, nearest.recommendation) if explain else None,
                            trainer=fmt, trainer_fallback=fallback)
    # Each way-out line is the prescription of the command with its change, so it is searched from the stack that
    # command gives, not from the one this search pinned: a line found with this search's pin (transformers>=5.5.2
    # for GD107, which also rules out GD109) did not hold when followed, where no run of the changed command meets
    # GD107 and nothing pins past GD109.
    ways = tuple(way_out(shape, req, nearest, _Ask(facts, given, options, quantization))) if explain else ()
    return Decision(None, None, None, (), ways, judged,
                    nearest=nearest.recommendation, nearest_memory=nearest.memory, blocking=nearest.blocking,
                    pins=tuple(pins), trainer=fmt, trainer_fallback=fallback)


def _run_of(mem: runplan.MemoryFacts, facts: ModelFacts, env: Environment, rec: recommend.Recommendation) -> Run:
    """The prescribed run as a typed Run: the plan check made of the prescription's config (read by its trainer's
    reader), on the stack it was judged with (pins included)."""
    tc = as_read(rec)
    # The model by its type, never its repo name: judgements are shared between models whose facts are equal.
    return resolve_run(mem, model=facts.family.model_type, stack=env.libraries,
                       trainer=Sourced(trainer_of(tc).value, PRESCRIBED_TRAINER),
                       quantization=rec.inputs.get("quantization"), training_config=tc)


def trainer_format(options: CheckOptions, env: Environment) -> str:
    """The trainer the prescription is written for (recommend.TRAINER_FORMATS): --trainer, else the user's training
    config's trainer where recommend writes its format, else axolotl."""
    return (options.trainer or recommend.trainer_format(getattr(env.training_config, "trainer", None))
            or recommend.TRAINING_CONFIG_KIND)


# Each written format's trainer (trainers.Trainer's value) and its name in a fallback's words.
_FORMAT_TRAINER = {"axolotl": "axolotl", "trl": "trl-sft", "transformers": "transformers",
                   "llama-factory": "llama-factory"}


def format_trainer(fmt: str, task: str) -> str:
    """The trainer (trainers.Trainer's value) that executes a run of ``task`` written in the format ``fmt``: TRL's
    DPOTrainer for the `trl` format's DPO (`trl dpo --config`), else the format's own."""
    return "trl-dpo" if fmt == "trl" and recommend.TRL_TASKS.get(task) == "dpo" else _FORMAT_TRAINER[fmt]
_FORMAT_OWNER = {"trl": "TRL's", "transformers": "TrainingArguments'", "llama-factory": "LLaMA-Factory's"}


def trainer_fallback(options: CheckOptions, env: Environment, fmt: str, req: runplan.RunRequest) -> str | None:
    """Why the run is written for ``fmt`` and not for the trainer the user's --training-config names, naming it (e.g.
    "TRL's format holds one process, the run is on 2 GPUs; your config's trainer was trl-sft"); None where the
    prescription is that trainer's, where none is named (a launcher's own config) or where --trainer chose."""
    if options.trainer is not None:
        return None
    chosen = getattr(env.training_config, "trainer", None)
    named = getattr(getattr(chosen, "value", None), "value", None)
    if named is None or named == "script" or named == format_trainer(fmt, req.base.task):
        return None
    wanted = recommend.trainer_format(chosen)
    if wanted is None:
        why = "recommend writes no config for that trainer"
    elif req.base.task not in recommend.FORMAT_TASKS[wanted]:
        holds = "SFT, LoRA, QLoRA and DPO" if wanted == "trl" else "SFT, LoRA and QLoRA"
        why = f"{_FORMAT_OWNER[wanted]} format holds {holds}, not {req.base.task}"
    elif req.base.num_gpus > 1:
        why = f"{_FORMAT_OWNER[wanted]} format holds one process, the run is on {req.base.num_gpus} GPUs"
    else:
        return None
    return f"{why}; your config's trainer was {named}"


def trainer_fixed(options: CheckOptions, env: Environment) -> bool:
    """The user chose the trainer (--trainer, or a training config of a trainer recommend writes)."""
    return options.trainer is not None or recommend.trainer_format(getattr(env.training_config, "trainer", None)) \
        is not None


# TRL's SFTTrainer runs a `trl sft` config: its memory plan holds no logits where the stack's TRL chunks them.
_CHUNKED_SOURCE = "TRL >= 1.15 {} (the prescription's trainer and the stack's TRL)"


def _unwritten(req: runplan.RunRequest, fmt: str = "trl") -> str | None:
    """Why a run cannot be written in the format ``fmt`` (TRL's, TrainingArguments' or LLaMA-Factory's: one SFT
    process) here, or None."""
    if req.base.task not in recommend.FORMAT_TASKS.get(fmt, frozenset(recommend.TASKS)):
        return (f"recommend writes {_FORMAT_NAMES[fmt]} for SFT, LoRA and QLoRA"
                + (" (and `trl dpo` configs for DPO)" if fmt == "trl" else "")
                + f"; --task {req.base.task} is prescribed as axolotl's YAML (--trainer axolotl)")
    if req.base.num_gpus > 1:
        return (f"recommend writes {_FORMAT_NAMES[fmt]} for one process; a run on {req.base.num_gpus} GPUs is "
                "prescribed as axolotl's YAML with its DeepSpeed file (--trainer axolotl)")
    return None


# The formats a run of one SFT process is written in, as the refusals name them.
_FORMAT_NAMES = {"trl": "`trl sft` configs", "transformers": "TrainingArguments configs",
                 "llama-factory": "LLaMA-Factory's YAML"}


def _for_trainer(req: runplan.RunRequest, fmt: str, env: Environment, options: CheckOptions) -> runplan.RunRequest:
    """The request as the trainer ``fmt`` executes it: TRL's SFTTrainer holds no b x s x V logits where the stack's
    TRL computes chunked log-probs (as check plans its `trl sft` config read back: runplan.request_spec), so every
    candidate is planned, and filtered by the GPU's memory, as that trainer runs it. UsageError for what the TRL and
    TrainingArguments formats cannot state: several processes (the launch and its DeepSpeed file are axolotl's YAML's
    alone here) and TRL's preference / RL trainers."""
    from gemma_doctor.errors import UsageError

    if fmt == recommend.TRAINING_CONFIG_KIND:
        return req
    why = _unwritten(req, fmt)
    if why is not None:
        raise UsageError(f"--trainer {fmt}: {why}")
    targets = req.base.lora_targets
    if fmt == "llama-factory" and isinstance(targets, str) and targets not in recommend.LF_ALL_TARGETS:
        # lora_target holds module names (comma-separated) or `all`: a regex is no setting of LLaMA-Factory's
        raise UsageError(f"--trainer {fmt}: LLaMA-Factory's lora_target takes module names or `all`, not the "
                         f"pattern {targets[:80]!r}: list the module names in your training config")
    if fmt == "trl" and runplan.trl_chunks(env.libraries) and not req.base.chunked_loss:
        # TRL's SFTTrainer and DPOTrainer (trainers.CHUNKING_TRAINERS), the two the `trl` format writes
        who = "DPOTrainer" if format_trainer(fmt, req.base.task) == "trl-dpo" else "SFTTrainer"
        src = tuple(sorted({**dict(req.base.sources), "chunked_loss": _CHUNKED_SOURCE.format(who)}.items()))
        return replace(req, base=replace(req.base, chunked_loss=True, sources=src))
    return req


# The most version pins one prescription adds: each resolves one window of a model's findings (a handful at most).
MAX_PINS = 4
_PINNED = "prescription"  # the source of a pinned package
# The source of a candidate's precision: the prescription writes it (its YAML's bf16 / fp16 switches).
PRESCRIBED = "prescription"


def _may_pin(env: Environment) -> bool:
    """The stack leaves transformers to the prescription (none named, or only a pin of its own): _pin may add one."""
    current = env.libraries.get("transformers")
    return current.absent or current.source == _PINNED


def _model_pins(facts: ModelFacts, env: Environment, options: CheckOptions,
                shared: rules.Shared) -> tuple[Environment, list[tuple[str, str]]]:
    """The stack pinned as the model's facts require whatever the run, and those pins, decided before any candidate
    is judged (without transformers, each candidate of a multimodal Gemma 3 was judged twice: rejected by GD105 and
    again with its pin). They are the pins the search pinned on its first candidate, in the same order: _pin reads a
    rejected candidate's pinnable findings in its rules' order, and the pinning rule reports the findings of the model
    alone (crashes.model_part's first half: the model_type's minimum, GD108, and the input a text-only batch lacks,
    GD105/GD106) ahead of any of the run's (GD107); a pin after one of the run's (GD109, which GD107's own pin may
    make safe) stays the search's. The model parts are the candidates' own (rules.Shared, the search's options)."""
    pins: list[tuple[str, str]] = []
    if not _may_pin(env):  # the stack says which transformers (installed or named): nothing to pin, nothing judged
        return env, pins
    i = rules.RULES.index(crashes.check)
    while len(pins) < MAX_PINS:
        pinned = _pin(env, shared.of(facts, env, options).value(i, facts, env, options)[0])
        if pinned is None:
            break
        env, pin = pinned
        pins.append(pin)
    return env, pins


def _pin(env: Environment, findings: tuple[Finding, ...]) -> tuple[Environment, tuple[str, str]] | None:
    """The stack with transformers pinned out of the window of a blocking finding whose exposure is unknown because
    the stack does not say which transformers will run (none installed here, none named): ``transformers>=5.6.0``
    for GD105's ``>=5.0.0,<5.6.0``. None when no such finding, or its window has no end to pin past."""
    from gemma_doctor.stack import Package, Stack, Window, exposure_of, normalise, upper_bound

    stack = env.libraries
    current = stack.get("transformers")
    if not (current.absent or current.source == _PINNED):
        return None  # the user's own version or range: theirs to change (the way out says how)
    for f in blocking(findings):
        code = CODES.get(f.code)
        if code is None or not code.pins:  # which findings a pin answers is their code's entry, not their details
            continue
        d = f.details or {}
        if d.get("exposure") != "unknown":
            continue
        floor = upper_bound(d.get("window")) if d.get("window") else d.get("min_transformers")
        if not isinstance(floor, str):
            continue
        spec = ",".join(x for x in (current.specifier, f">={floor}") if x)
        pkg = Package("transformers", None, spec, _PINNED)
        if d.get("window") and exposure_of(pkg, Window("transformers", d["window"])).value != "safe":
            continue
        packages = {**stack.packages, normalise("transformers"): pkg}
        pinned = Stack(packages, planned=stack.planned, origin=stack.origin, cli_args=stack.cli_args)
        return replace(env, stack=pinned), (f"transformers{spec}", f.code)
    return None


def _relaxed(j: Judged, rec: recommend.Recommendation, req: runplan.RunRequest, strict: list[_Rejected],
             shape: ModelShape) -> tuple[recommend.Recommendation, runplan.MemoryFacts]:
    """A prescription found only with a smaller batch than the user chose: which choice was relaxed, why, and the
    relaxation as the batch's source (the effective batch is kept through accumulation)."""
    base = req.base
    src = base.source("batch_size")
    what = f"--batch-size {base.batch_size}" if src == "option" else \
        f"{src.removeprefix('training config ')} {base.batch_size}"
    why = next((f"{f.code}: {f.message}" for t in strict for f in t.blocking), None)
    if why is None:  # no run at that batch even fitted the GPU's memory, so none was judged by the rules
        at = _smallest(shape, req)
        why = f"even the smallest run at that batch does not fit: {at.summary()}"
    plan = j.memory.plan
    sources = dict(plan.settings.sources)
    sources["batch_size"] = f"relaxed from {what}"
    mem = runplan.memory_facts(shape, plan, req, _prescribed, sources=tuple(sorted(sources.items())))
    run = plan.settings
    note = (f"{what} (your choice) cannot pass check here ({why}); relaxed to batch {run.batch_size} x "
            f"{run.gradient_accumulation_steps} accumulation, which keeps the effective batch of "
            f"{base.batch_size * base.gradient_accumulation_steps}")
    return replace(rec, notes=rec.notes + (note,)), mem


def _about_accumulation(f: Finding) -> bool:
    """Whether ``f`` is about the run's gradient accumulation, as its code's entry says (codes.Code.accumulation)."""
    code = CODES.get(f.code)
    return code is not None and code.accumulation


def _on_accumulation(findings: tuple[Finding, ...]) -> bool:
    """A finding on the run's gradient accumulation is among ``findings``."""
    return any(_about_accumulation(f) for f in findings)


def _without_accumulation(rec: recommend.Recommendation, full: list[Judged]) -> recommend.Recommendation:
    """The prescription found without accumulation, saying why the effective batch is smaller."""
    why = next(f for j in full for f in j.blocking if _about_accumulation(f))
    return replace(rec, notes=rec.notes + (f"no gradient accumulation, so a smaller effective batch: every run that "
                                           f"accumulates was refused ({why.code}: {why.fix or why.message})",))


# The libraries whose versions a prescription depends on (its snippets' argument names, the windows it was judged by).
_ASSUMED = ("transformers", "peft", "trl", "accelerate", "torch", "bitsandbytes", "unsloth", "deepspeed")


def _versions(inputs: recommend.Inputs) -> tuple[tuple[str, str], ...]:
    """The versions of the stack the prescription was judged on (installed, --with or --requirements)."""
    return tuple((k, str(v)) for k, v in sorted(inputs.versions.items()) if v and k in _ASSUMED)


def _with_quantization(req: runplan.RunRequest, rec: recommend.Recommendation) -> runplan.RunRequest:
    """--quantization 4bit/8bit or a quantized checkpoint fixes QLoRA."""
    quant = rec.inputs.get("quantization")
    if quant in ("4bit", "8bit") and "method" not in req.fixed:
        base = replace(req.base, method="qlora", quant_bits=4 if quant == "4bit" else 8)
        return replace(req, base=base, fixed=req.fixed + ("method",))
    return req


def _with_targets(req: runplan.RunRequest, rec: recommend.Recommendation) -> runplan.RunRequest:
    """The LoRA targets the prescription will write (unless the user named theirs): each candidate's memory plan then
    counts the adapters of the very modules check will count (a multimodal checkpoint's language model only)."""
    if "lora" in dict(req.base.sources):
        return req
    targets = rec.frameworks.get("peft", {}).get("target_modules")
    if isinstance(targets, list):
        targets = tuple(targets)
    if not isinstance(targets, (str, tuple)) or targets == req.base.lora_targets:
        return req
    return replace(req, base=replace(req.base, lora_targets=targets))


def _smallest(shape: ModelShape, req: runplan.RunRequest) -> MemoryPlan:
    """The least memory-hungry run the user's fixed choices allow (QLoRA, batch 1, checkpointing, ZeRO-3)."""
    base, fixed = req.base, set(req.fixed)
    method = base.method if "method" in fixed else "qlora"
    run = replace(base, method=method, quant_bits=(base.quant_bits or 4) if method == "qlora" else None,
                  load_dtype=memory.load_dtype_for(base.precision, method),
                  batch_size=base.batch_size if "batch_size" in fixed else 1,
                  gradient_accumulation_steps=base.batch_size * base.gradient_accumulation_steps
                  if "batch_size" not in fixed else base.gradient_accumulation_steps,
                  gradient_checkpointing=base.gradient_checkpointing if "gradient_checkpointing" in fixed else True,
                  zero_stage=base.zero_stage if "zero_stage" in fixed or base.num_gpus <= 1 else 3)
    return memory.plan(shape, run, req.gpu_bytes, req.gpu_name)


# --- the way out ---------------------------------------------------------------------------------------------------

# Candidates judged for one way out (each is a prescription of changed options, found by the same search).
WAY_OUT_JUDGED = 12


# No __eq__/__hash__/__repr__ made: never compared, hashed or shown (each made method costs start-up time).
@dataclass(frozen=True, eq=False, repr=False)
class _Ask:
    """What a way out is asked of: the model, environment and options whose prescription failed."""

    facts: ModelFacts
    env: Environment
    options: CheckOptions
    quantization: str | None

    def plan(self, shape: ModelShape, gpu_name: str | None = None, trainer: str | None = None,
             **memory_options: Any) -> MemoryPlan | None:
        """The memory plan of the prescription with ``memory_options`` (--method, --seq-len, --num-gpus) or another GPU
        (--gpu), None when there is none: what the command line with that change prescribes, so the line passes check
        when followed. Remembered per process by the search's inputs (_WAY_OUTS)."""
        args = self._inputs(shape, gpu_name, memory_options, trainer)

        def find() -> tuple[MemoryPlan | None]:
            from gemma_doctor.errors import UsageError

            try:
                d = prescribe(*args, limit=WAY_OUT_JUDGED, explain=False)
            except UsageError:  # a change this trainer cannot state (several processes): no way out through it
                return (None,)
            return (d.memory.plan if d.ok and d.memory is not None else None,)  # a tuple: None is an answer too

        try:
            key = (self._facts_key, _digest((args[1:], WAY_OUT_JUDGED)))
        except Exception:  # a fact that does not pickle: searched as it is, every time
            return find()[0]
        return runplan.remembered(_WAY_OUTS, key, find)[0]

    @functools.cached_property
    def _facts_key(self) -> bytes:
        """A digest of the model's facts as every search of this way out reads them (_inputs), made once per way out:
        each safetensors header by the digest of its bytes where the read took one (its tensors, a function of those
        bytes, are most of the pickle: 185 KB of Gemma 4 E2B's 201 KB)."""
        import dataclasses

        facts = self._facts
        census = facts.census
        if census is not None and census.headers:
            # A header's pickle holds every field (its digest too): equal digests are equal bytes, so equal tensors.
            headers = tuple(dataclasses.replace(h, tensors=()) if h.digest is not None else h for h in census.headers)
            facts = facts.with_(census=dataclasses.replace(census, headers=headers))
        return _digest(facts)

    @functools.cached_property
    def _facts(self) -> ModelFacts:
        """The model's facts without check's judgement of the run asked about (its Run, with the memory plan's verdict,
        made for the original GPU and options): a search reads none of it, each candidate is judged with its own."""
        return self.facts.with_(run=None)

    def _inputs(self, shape: ModelShape, gpu_name: str | None, memory_options: dict[str, Any],
                trainer: str | None = None) -> tuple[Any, ...]:
        """prescribe()'s arguments for the command line with the change."""
        from gemma_doctor.readers import gpu as gpu_reader

        mem = replace(self.options.memory or runplan.MemoryRequest(), **memory_options)
        options = replace(self.options, memory=mem, gpu=gpu_name or self.options.gpu, trainer=trainer or
                          self.options.trainer)
        gpu = gpu_reader.resolve(options.gpu) if gpu_name else (self.env.gpu or gpu_reader.for_options(self.options))
        env = replace(self.env, gpu=gpu)
        return self._facts, env, options, gpu, shape, self.quantization


def _digest(value: Any) -> bytes:
    """A digest of ``value``'s pickle written without pickle's memo (Pickler.fast): equal values give equal bytes
    whatever objects they share. With the memo, a string or tuple met twice is written once if it is one object and
    twice if it is two equal ones, so equal facts read by two commands (a T4's and a V100's) gave two keys and the way
    out's searches were never shared (tests/test_prescription.py). A value that refers to itself raises: not kept."""
    import hashlib
    import io
    import pickle

    buf = io.BytesIO()
    pickler = pickle.Pickler(buf, protocol=5)
    pickler.fast = True
    pickler.dump(value)
    return hashlib.blake2b(buf.getvalue()).digest()


# The way out's searches (their memory plans, or None), remembered per process: the one process-wide cache of the way
# out, bounded (runplan.remembered: cleared when full). Keyed by digests of every input the search reads, pickled (the
# facts' once per way out, _Ask._facts_key; types included: 1, 1.0 and True differ), so an entry is that search's own
# answer: prescribe is a pure function of its inputs (the rule tried first changes only the order of trying; a pin is
# decided on every rule a pin can answer).
# Points that ask the same change share it: a larger GPU asked from a T4 and from a V100 is one search (548 of the
# prescription grid's 970 way-out searches, tests/test_prescription.py).
_WAY_OUTS: dict[tuple[bytes, bytes], tuple[MemoryPlan | None]] = {}


# The options a finding's way_out may name (MemoryRequest fields) and the command line's spelling of each.
_WAY_OUT_OPTIONS = {"batch_size": "--batch-size", "seq_len": "--seq-len", "num_gpus": "--num-gpus", "method": "--method"}


def way_out(shape: ModelShape, req: runplan.RunRequest, nearest: Judged, ask: _Ask) -> list[str]:
    """The nearest changes that would make a prescription, one line each: what check flagged on the nearest run (each
    finding's own cure), and for memory another method, a shorter sequence, more GPUs or a larger GPU, each line the
    prescription that change gives (so it passes check when followed, at the figure that command prints)."""
    out: list[str] = []
    for f in nearest.blocking:
        if _on_memory(f):
            continue
        line = f"{f.code}: {f.fix}" if f.fix else f"{f.code}: {f.message}"
        if line not in out:
            out.append(line)
        # A finding that names the options curing it (its details' way_out: MemoryRequest fields, e.g. GD664's whole
        # batch of GRPO groups): the run the command line with them prescribes, so the line holds when followed.
        asked = (f.details or {}).get("way_out")
        if isinstance(asked, dict) and asked and all(k in _WAY_OUT_OPTIONS for k in asked):
            p = ask.plan(shape, **asked)
            if p is not None:
                flags = " ".join(f"{_WAY_OUT_OPTIONS[k]} {v}" for k, v in asked.items())
                out.append(f"{flags} ({f.code}): {p.summary()}")
    memory_blocks = bool(req.gpu_bytes) and (nearest.plan.verdict != "fits" or any(_on_memory(f) for f in nearest.blocking))
    trainer = _trainer_way_out(shape, req, ask) if memory_blocks else []
    if trainer:
        out[:0] = trainer
    else:
        out.extend(_blocker_trainer_way_out(shape, req, nearest, ask))
    if memory_blocks:
        out.extend(_memory_way_out(shape, req, ask))
    return out


def _trainer_way_out(shape: ModelShape, req: runplan.RunRequest, ask: _Ask) -> list[str]:
    """Where the user left the trainer open and memory is what blocks: TRL's SFTTrainer (or, for DPO, its DPOTrainer),
    which holds no full logits under a TRL that chunks them, when a chunked run fits at all (a cheap test before its
    search), as the command line with --trainer trl prescribes it. The TrainingArguments format holds what axolotl's
    run holds: never asked here."""
    task = req.base.task
    if trainer_fixed(ask.options, ask.env) or task not in recommend.TRL_TASKS or req.base.num_gpus > 1:
        return []
    if trainer_format(ask.options, ask.env) == "trl" or not runplan.trl_chunks(ask.env.libraries):
        return []
    if _fits_with(shape, req, chunked_loss=True) is None:
        return []
    p = ask.plan(shape, trainer="trl")
    words = "TRL's DPOTrainer, `trl dpo --config`" if recommend.TRL_TASKS[task] == "dpo" else _TRAINER_WORDS["trl"]
    return [f"--trainer trl (its run: {words}): {p.summary()}"] if p is not None else []


# The trainers a way out may name where a blocker of the run itself (not its memory) stops every candidate, in the order
# tried (TRAINER_FORMATS' order): the first whose run passes check is named.
_OTHER_TRAINERS = ("trl", "transformers", "llama-factory")


def _blocker_trainer_way_out(shape: ModelShape, req: runplan.RunRequest, nearest: Judged, ask: _Ask) -> list[str]:
    """Where the user left the trainer open and a finding on the run itself (not its memory) stops every candidate of
    the trainer prescribed: the first other trainer whose run passes check, as the command line with --trainer NAME
    prescribes it. A real case: a KV-shared Gemma 4 on transformers 5.5.0-5.5.1 (GD107): axolotl switches use_cache
    off whatever its YAML says (check_model_config, 0.19.0), while TRL's and TrainingArguments' configs keep it on.
    Cheap test first: the nearest run, written in that trainer's format, is judged once (the rules cheapest first,
    until one flags it); a trainer whose run meets one of the same blockers is not searched."""
    from gemma_doctor.errors import UsageError
    from gemma_doctor.readers import gpu as gpu_reader

    blockers = {f.code for f in nearest.blocking if not _on_memory(f)}
    if not blockers or trainer_fixed(ask.options, ask.env) or ask.options.task in _RL_TASKS:
        return []
    current = trainer_format(ask.options, ask.env)
    gpu = ask.env.gpu or gpu_reader.for_options(ask.options)
    for fmt in _OTHER_TRAINERS:
        if fmt == current or _unwritten(req, fmt) is not None:
            continue
        try:
            as_fmt = _for_trainer(req, fmt, ask.env, ask.options)
        except UsageError:  # a setting this trainer's format cannot state (a user's pattern for LLaMA-Factory)
            continue
        inputs = replace(advice.inputs_for(ask.facts, gpu, ask.options.task, ask.quantization, ask.env.libraries),
                         trainer=fmt)
        tried = _judge(ask._facts, ask.env, ask.options, gpu, shape, nearest.plan, as_fmt, inputs,
                       quick=True)
        if isinstance(tried, _Rejected) and blockers & {f.code for f in tried.findings}:
            continue
        p = ask.plan(shape, trainer=fmt)
        if p is not None:
            return [f"--trainer {fmt} (its run: {_TRAINER_WORDS[fmt]}): {p.summary()}"]
    return []


_TRAINER_WORDS = {"axolotl": "axolotl's YAML", "trl": "TRL's SFTTrainer, `trl sft --config`",
                  "transformers": "a transformers Trainer script", "llama-factory": "`llamafactory-cli train`"}


def _fits_with(shape: ModelShape, req: runplan.RunRequest, **changes: Any) -> MemoryPlan | None:
    """The first candidate (by the same preference) that fits with margin once ``changes`` apply to the request: a
    cheap test before the way out asks the search for that change."""
    base = replace(req.base, **{k: v for k, v in changes.items() if k != "fixed" and k != "gpu_bytes"})
    r = replace(req, base=base, gpu_bytes=changes.get("gpu_bytes", req.gpu_bytes),
                fixed=tuple(changes.get("fixed", req.fixed)))
    for p in candidates(shape, r, ("fits",), relax_batch=True):
        return p
    return None


def _memory_way_out(shape: ModelShape, req: runplan.RunRequest, ask: _Ask) -> list[str]:
    out: list[str] = []
    base, fixed = req.base, req.fixed
    if "method" in fixed:
        for method in METHODS:
            if method != base.method and _fits_with(shape, req, method=method) is not None:
                p = ask.plan(shape, method=method)
                if p is not None:
                    out.append(f"--method {method}: {p.summary()}")
                    break
    seq = base.seq_len // 2
    for _ in range(3):  # at most three halvings: a way out, not a search of every length
        if seq < 128:
            break
        if _fits_with(shape, req, seq_len=seq) is not None:
            p = ask.plan(shape, seq_len=seq)
            if p is not None:
                out.append(f"a shorter sequence, --seq-len {seq}: {p.summary()}")
                break
        seq //= 2
    for n in (2, 4, 8):
        if n > base.num_gpus and _fits_with(shape, req, num_gpus=n, fixed=tuple(k for k in fixed if k != "zero_stage")):
            p = ask.plan(shape, num_gpus=n)
            if p is not None:
                out.append(f"{n} GPUs with ZeRO-{p.settings.zero_stage} (--num-gpus {n}): {p.summary()}")
                break
    from gemma_doctor import gpus as gpu_table

    for g in gpu_table.common_training_gpus():
        size = gpu_table.usable_bytes(g)
        if size is None or size <= (req.gpu_bytes or 0):
            continue
        # The precision that GPU gets (bf16 where native, else fp32: never bf16 on a V100, GD603).
        precision = "bf16" if g.native_bf16 else "fp32"
        if _fits_with(shape, replace(req, gpu_name=g.name), gpu_bytes=size, precision=precision,
                      load_dtype=memory.load_dtype_for(precision, base.method)) is None:
            continue
        p = ask.plan(shape, g.name)
        if p is not None:
            out.append(f"a GPU with {size / memory.GIB:.1f} GiB usable, e.g. {g.name} (--gpu \"{g.name}\"): {p.summary()}")
            break
    if not out:
        out.append("nothing fits even sharded over 8 GPUs or on the largest common GPU: a smaller model "
                   "(--size) or a shorter sequence")
    return out

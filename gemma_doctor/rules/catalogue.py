"""Findings from the field catalogue (GD7xx): one generic evaluation of each entry's condition against the facts.

A condition (``when``) is an AND of clauses: the model type, package windows, config.json keys, tokenizer facts,
training-config settings and the GPU; ``any`` holds alternatives. A clause about a file or setting that was not
given (no --training-config, no tokenizer_config.json, an unknown GPU) leaves the entry out: the doctor does not
guess. Package windows follow stack.py: every window AFFECTED -> the entry's severity; a window UNKNOWN -> one step
lower (error -> warning); a window SAFE, or a package the run does not use, -> nothing.
"""

from __future__ import annotations

import functools
from typing import Any, Iterator, Mapping

from gemma_doctor.codes import emits
from gemma_doctor.catalogue import MISSING as _MISSING, match  # noqa: F401 (the matcher language is the catalogue's)
from gemma_doctor.facts import CheckOptions, Environment, ModelFacts
from gemma_doctor.report import Finding, Severity
from gemma_doctor.stack import Exposure, Package, Window, exposure_of

# Every run has these; an absent one is UNKNOWN (not installed here and not named), not "unused".
CORE = frozenset({"transformers", "torch"})
_LOWER = {Severity.ERROR: Severity.WARNING, Severity.WARNING: Severity.INFO, Severity.INFO: Severity.INFO}


def _catalogue_codes() -> tuple[str, ...]:
    """The codes of the catalogue's entries (read from field.json only when asked: the search asks once)."""
    from gemma_doctor import catalogue

    return tuple(e["code"] for e in catalogue.coded())


def model_part(model: ModelFacts, env: Environment,
               options: CheckOptions) -> tuple[tuple[Mapping[str, Any], Finding | None], ...]:
    """The part of check() that is the same for every run of the model (codes.emits): the entries that can fire on the
    stack, in the catalogue's order, each whose condition names no training-config setting with its finding (the
    model, its files, the stack and the GPU decide it), each that names one with None (the run decides it)."""
    if not model.family.is_gemma:
        return ()
    from gemma_doctor import catalogue

    run = _run_codes()
    out = []
    for entry in _live(catalogue.coded(), env.libraries):
        if entry["code"] in run:
            if not _never(entry["when"], model, env):
                out.append((entry, None))
        else:
            finding = evaluate(entry, model, env)
            if finding is not None:
                out.append((entry, finding))
    return tuple(out)


@emits(more=_catalogue_codes, costly=True, model_part=model_part)
def check(model: ModelFacts, env: Environment, options: CheckOptions,
          part: tuple[tuple[Mapping[str, Any], Finding | None], ...] | None = None) -> Iterator[Finding]:
    """A finding for every catalogue entry whose condition the model, its stack and its training config meet, in the
    catalogue's order (``part``: model_part's, judged before for this model and stack)."""
    if not model.family.is_gemma:
        return
    if part is None:
        part = model_part(model, env, options)
    tc = env.training_config
    told = tc is not None and tc.ok
    for entry, finding in part:
        if finding is None:
            # A condition with a training clause at its top is never met without a training config to read (the
            # clause cannot be told): evaluate() would say None.
            if not told and "training" in entry["when"]:
                continue
            finding = evaluate(entry, model, env)
        if finding is not None:
            yield finding


# The clauses a model part can tell: the model's type, config.json, tokenizer_config.json and the GPU, read from what
# the model part is keyed by (rules.Shared: the facts without their Run, the environment without its training config).
_MODEL_CLAUSES = ("model_type", "config", "tokenizer", "gpu")


def _never(when: Mapping[str, Any], model: ModelFacts, env: Environment) -> bool:
    """Whether a clause at the top of ``when`` that reads no run fails for this model: _clauses is then False for every
    run of it (a failed clause decides the AND whatever the training clause says), so the entry is not evaluated per
    run (a Gemma 3 is never asked a Gemma 4 entry's training settings)."""
    return any(_clause(kind, value, model, env) is False for kind, value in when.items() if kind in _MODEL_CLAUSES)


@functools.lru_cache(maxsize=1)
def _run_codes() -> frozenset[str]:
    """The codes of the entries whose condition names a training-config setting (a ``training`` clause, at any depth
    of ``any``): the only entries whose findings depend on the run (field.json, read once)."""
    from gemma_doctor import catalogue

    def names_training(when: Mapping[str, Any]) -> bool:
        return "training" in when or any(names_training(sub) for sub in when.get("any") or ())

    return frozenset(e["code"] for e in catalogue.coded() if names_training(e["when"]))


def _live(entries: list[Mapping[str, Any]], stack: Any) -> list[Mapping[str, Any]]:
    """The entries evaluate() can report on ``stack``: it returns None for every model when one of an entry's packages
    is not used by the run or its window is SAFE, whatever the other clauses say (they are pure), so those are left out
    once per stack instead of per model. Only the work changes: an entry kept here is still evaluated in full."""
    names = _package_names()
    dead = _dead(tuple(stack.get(name) for name in names))
    return [e for e in entries if e.get("code") not in dead]


@functools.lru_cache(maxsize=1)
def _package_names() -> tuple[str, ...]:
    """Every package a catalogue entry's condition names (field.json, read once)."""
    from gemma_doctor import catalogue

    return tuple(sorted({n for e in catalogue.coded() for n in (e["when"].get("packages") or {})}))


@functools.lru_cache(maxsize=16)
def _dead(packages: tuple[Package, ...]) -> frozenset[str]:
    """The codes of the entries that cannot fire with ``packages`` (those of _package_names(), in its order): keyed by
    the packages themselves, so every stack that holds them shares the answer (a pure function of them)."""
    from gemma_doctor import catalogue

    by_name = dict(zip(_package_names(), packages))
    dead = set()
    for entry in catalogue.coded():
        for name, spec in (entry["when"].get("packages") or {}).items():
            pkg = by_name[name]
            if (pkg.absent and name not in CORE) or exposure_of(pkg, Window(name, spec)) is Exposure.SAFE:
                dead.add(entry["code"])
                break
    return frozenset(dead)


def evaluate(entry: Mapping[str, Any], model: ModelFacts, env: Environment) -> Finding | None:
    """The entry's finding for these facts, or None when its condition is not met (or cannot be told)."""
    when = entry["when"]
    if _clauses(when, model, env) is not True:
        return None
    severity = Severity(entry["severity"])
    hits: list[str] = []
    unknown: list[str] = []
    for name, spec in (when.get("packages") or {}).items():
        pkg = env.libraries.get(name)
        if pkg.absent and name not in CORE:
            return None  # the run does not use it
        exposure = env.libraries.exposure(Window(name, spec))
        if exposure is Exposure.SAFE:
            return None
        if exposure is Exposure.AFFECTED:
            hits.append(pkg.describe())
        else:
            unknown.append(f"{pkg.describe()} may or may not be in {name}{spec}")
    if unknown:
        severity = _LOWER[severity]
    versions = "; ".join(hits + unknown)
    message = f"{entry['title']}: `{entry['symptom']}`"
    if versions:
        message += f" ({versions})"
    refs = ", ".join(s["ref"] for s in entry["sources"][:3])
    file, key, line = _where(when, env)
    # The line of the training config's setting, as every other training-config finding carries it (render/github
    # annotates it there).
    return Finding(entry["code"], severity, message, file=file, key=key, fix=f"{entry['cure']} (reported: {refs})",
                   details={**({"line": line} if line else {}), "catalogue_id": entry["id"], "stage": entry["stage"],
                            "triage": entry["triage"], "windows": dict(entry.get("windows") or {}),
                            "unknown": bool(unknown)})


def _where(when: Mapping[str, Any], env: Environment) -> tuple[str | None, str | None, int | None]:
    """The file, key and line a finding points at: the first config.json key, else tokenizer_config.json, else the
    training config's first setting that the condition names and the file sets (with its line where the reader knows
    it)."""
    if when.get("config"):
        return "config.json", next(iter(when["config"])), None
    if when.get("tokenizer"):
        return "tokenizer_config.json", next(iter(when["tokenizer"])), None
    tc = env.training_config
    if when.get("training") and tc is not None:
        for name in when["training"]:
            setting = tc.get(name)
            if setting is not None:
                return tc.path, setting.key, setting.line or None
        return tc.path, None, None
    return None, None, None


def _clauses(when: Mapping[str, Any], model: ModelFacts, env: Environment) -> bool | None:
    """True when every clause holds, False when one fails, None when one cannot be told (and none fails)."""
    results = [_clause(kind, value, model, env) for kind, value in when.items() if kind != "packages"]
    if False in results:
        return False
    return None if None in results else True


def _clause(kind: str, value: Any, model: ModelFacts, env: Environment) -> bool | None:
    fam = model.family
    if kind == "model_type":
        return fam.model_type in value  # the top-level type: list a text-only type (gemma3_text) where it counts too
    if kind == "any":
        results = [_clauses(sub, model, env) for sub in value]
        return True if True in results else (None if None in results else False)
    if kind == "config":
        if not model.config.ok or not isinstance(model.config.data, Mapping):
            return None
        return all(match(m, _lookup(model.config.data, key)) for key, m in value.items())
    if kind == "tokenizer":
        tok = model.tokenizer
        if tok is None or not tok.ok:
            return None
        return all(match(m, getattr(tok, key)) for key, m in value.items())
    if kind == "training":
        tc = env.training_config
        if tc is None or not tc.ok:
            return None
        return all(match(m, tc.get(key).value if tc.get(key) is not None else _MISSING) for key, m in value.items())
    if kind == "gpu":
        gpu = env.gpu
        if gpu is None:
            return None
        got = {key: getattr(gpu, key, None) for key in value}
        if any(v is None for v in got.values()):
            return None
        return all(match(m, got[key]) for key, m in value.items())
    raise ValueError(f"unknown clause {kind!r}")  # the catalogue's own test keeps this unreachable


def _lookup(data: Mapping[str, Any], dotted: str) -> Any:
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return node

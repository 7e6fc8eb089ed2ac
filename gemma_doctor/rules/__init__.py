"""Rules: pure functions from facts to findings. Nothing here touches the file system or imports torch."""

from __future__ import annotations

import functools
import operator
from collections.abc import Mapping
from typing import Any, Callable, Iterable

from gemma_doctor import frozen
from gemma_doctor.facts import CheckOptions, Environment, ModelFacts
from gemma_doctor.report import Finding
from gemma_doctor.rules import (after, attention, catalogue, crashes, distributed, dtypes, files, libraries, loading,
                                 members, memory, precision, tokens, training, use_cache, weights)

Rule = Callable[[ModelFacts, Environment, CheckOptions], Iterable[Finding]]

# Order is the order findings are reported in.
RULES: tuple[Rule, ...] = (
    files.check,
    after.check,
    use_cache.check,
    crashes.check,
    dtypes.check,
    weights.check,
    training.check,
    members.check,
    distributed.check,
    precision.check,
    libraries.check,
    libraries.beyond_horizon,
    libraries.unknown_names,
    loading.check,
    attention.check,
    tokens.check,
    memory.check,
    catalogue.check,
)


def run(model: ModelFacts, env: Environment, options: CheckOptions, shared: Shared | None = None) -> tuple[Finding, ...]:
    """Every finding for one model; a non-Gemma model gets only the file and family findings. With ``shared``, what
    the rules declared model-only find (and the model parts of the rules judged in two parts) is taken from it, judged
    once for the model (the same findings, in the same order)."""
    part = shared.of(model, env, options) if shared is not None else None
    out: list[Finding] = []
    for i in range(len(RULES)):
        out.extend(judge(i, model, env, options, part))
    return tuple(out)


def judge(i: int, model: ModelFacts, env: Environment, options: CheckOptions,
          part: ModelPart | None = None) -> tuple[Finding, ...]:
    """The findings of ``RULES[i]``: exactly the rule's own, its model part taken from ``part`` where it has one."""
    rule = RULES[i]
    if part is not None:
        if getattr(rule, "model_only", False):
            return part.value(i, model, env, options)
        if getattr(rule, "model_part", None) is not None:
            return tuple(rule(model, env, options, part=part.value(i, model, env, options)))  # type: ignore[call-arg]
    if getattr(rule, "reads", None) is None:
        return tuple(rule(model, env, options))
    key = read(i, model, env, options)
    judged = _JUDGED.setdefault(i, [])
    for k, found in judged:
        if k == key:
            return found
    found = tuple(rule(model, env, options))
    judged.insert(0, (key, found))
    del judged[_KEPT:]
    return found


class _Stopped:
    """A declared read that ended before its last name: ``at`` the field or key it did not read, ``found`` what was
    there instead of a dataclass or a mapping (None, a list...) or _ABSENT where the mapping lacks the key."""

    __slots__ = ("at", "found")

    def __init__(self, at: str, found: object) -> None:
        self.at, self.found = at, found

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Stopped) and other.at == self.at and other.found == self.found

    def __hash__(self) -> int:
        return hash(self.at)


_ABSENT = object()


def read(i: int, model: ModelFacts, env: Environment, options: CheckOptions) -> tuple:
    """The values of the fields ``RULES[i]`` declared it reads (codes.emits ``reads``) in these arguments, root by root:
    each root's fields by one attrgetter (field by field where None is on the way), then the mapping keys below a
    field (config.json's ``data``)."""
    roots = (model, env, options)
    out: list[Any] = []
    for root, get, paths in _readers(i)[0]:
        obj = roots[root]
        try:
            got = get(obj)
        except AttributeError:  # None on the way: read field by field, stopping there
            got = tuple(_fields(obj, p) for p in paths)
        out.extend(got if len(paths) > 1 else (got,))
    for at, keys in _readers(i)[1]:
        value = out[at]
        for key in keys:
            if type(value) is not dict and not isinstance(value, Mapping) or key not in value:
                value = _Stopped(key, _ABSENT if isinstance(value, Mapping) else value)
                break
            value = value[key]
        out[at] = value
    return tuple(out)


def _fields(obj: Any, dotted: str) -> Any:
    for name in dotted.split("."):
        if obj is None:
            return _Stopped(name, None)
        obj = getattr(obj, name)
    return obj


@functools.lru_cache(maxsize=None)
def _readers(i: int) -> tuple[tuple[tuple[int, Callable[[Any], Any], tuple[str, ...]], ...],
                              tuple[tuple[int, tuple[str, ...]], ...]]:
    """How ``RULES[i]``'s declared reads are read: per root (its index, one attrgetter of its fields, the fields), and
    where mapping keys follow a field (its place in the values, the keys). Made from the declaration once."""
    reads = RULES[i].reads  # type: ignore[attr-defined]
    order = sorted(range(len(reads)), key=lambda n: reads[n][0])
    groups: dict[int, list[int]] = {}
    for n in order:
        groups.setdefault(reads[n][0], []).append(n)
    getters = tuple((root, operator.attrgetter(*(reads[n][1] for n in ns)), tuple(reads[n][1] for n in ns))
                    for root, ns in groups.items())
    placed = [n for ns in groups.values() for n in ns]  # the value of declaration n is at placed.index(n)
    keyed = tuple((placed.index(n), reads[n][2]) for n in range(len(reads)) if reads[n][2])
    return getters, keyed


# The findings of each rule that declares what it reads (codes.emits ``reads``), by the rule's index in RULES: the last
# _KEPT keys (the values of its declared fields) and the findings judged for them, newest first. Process-wide, as the
# search's plans (search._PLANS): a judgement of equal fields has equal findings, whichever model, candidate or command
# asked first (tests/test_rules_reads.py holds each declaration), so a scan's unalike models, whose candidates differ
# in their layers and memory figures but not in the fields most rules read, judge such a rule once.
_JUDGED: dict[int, list[tuple[tuple, tuple[Finding, ...]]]] = {}
_KEPT = 8


class ModelPart:
    """The model part of one model's judgement under one stack, GPU and options: each model-only rule's findings and
    each two-part rule's model part (codes.emits), judged when first asked for."""

    def __init__(self) -> None:
        self._values: dict[int, Any] = {}  # by the rule's index in RULES

    def value(self, i: int, model: ModelFacts, env: Environment, options: CheckOptions) -> Any:
        """``RULES[i]``'s findings (a model-only rule) or its model part's value, judged on the first call."""
        if i not in self._values:
            rule = RULES[i]
            made = getattr(rule, "model_part", None)
            self._values[i] = made(model, env, options) if made is not None else tuple(rule(model, env, options))
        return self._values[i]


class Shared:
    """The model part of a model's judgement, shared: what its model-only rules find (and the model parts of the rules
    judged in two parts) is a function of the facts, the stack, the GPU and the options but the run's, so check's rules
    and every candidate of its search (plan/search.py) take it from here instead of judging it again. An ordinary cache
    keyed by those inputs, compared by equality: the facts without their Run, the environment without its training
    config, the options without theirs and without the memory options. Made for one model's judgement and dropped with
    it (pipeline.judged; a search makes its own where none is given); a pin (another stack) is another key."""

    def __init__(self) -> None:
        self._parts: list[tuple[tuple[Any, ...], ModelPart]] = []

    def of(self, model: ModelFacts, env: Environment, options: CheckOptions) -> ModelPart:
        """The model part for these inputs (the facts, environment and options the rules are handed)."""
        key = (model.with_(run=None) if model.run is not None else model,
               frozen.replace(env, training_config=None) if env.training_config is not None else env,
               frozen.replace(options, training_config=None, memory=None)
               if options.training_config is not None or options.memory is not None else options)
        for k, part in self._parts:
            if k == key:
                return part
        if len(self._parts) >= 8:  # a search pins a handful of stacks at most (search.MAX_PINS)
            self._parts.clear()
        part = ModelPart()
        self._parts.append((key, part))
        return part

"""Rules: pure functions from facts to findings. Nothing here touches the file system or imports torch."""

from __future__ import annotations

from typing import Callable, Iterable

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


def run(model: ModelFacts, env: Environment, options: CheckOptions) -> tuple[Finding, ...]:
    """Every finding for one model; a non-Gemma model gets only the file and family findings."""
    out: list[Finding] = []
    for rule in RULES:
        out.extend(rule(model, env, options))
    return tuple(out)

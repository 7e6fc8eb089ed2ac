"""The base model of a PEFT adapter: found by the name adapter_config.json records, in a folder or the cache.

An adapter enters `check` through the same source interface as a model (readers/adapter.py reads its files); this
module looks its base up the way `check BASE` would (a folder first, then the cache), reads the base's config.json
and family, and never reaches the Hub: a base that is not here is reported (GD742), not downloaded.
"""

from __future__ import annotations

from pathlib import Path

from gemma_doctor import family as family_mod
from gemma_doctor import locate
from gemma_doctor.errors import UsageError
from gemma_doctor.facts import ModelFacts
from gemma_doctor.readers.adapter import BaseFacts
from gemma_doctor.source import local


def find_base(name: str | None, cache: Path, revision: str | None = None) -> BaseFacts:
    """The base named ``name``: an existing folder, else a cached repo at ``revision`` (main when unrecorded)."""
    if not name:
        return BaseFacts(None, "unnamed")
    try:
        snapshots = locate.resolve([name], cache, revision or "main")
    except UsageError:
        return BaseFacts(name, "not found")
    snap = next((s for s in snapshots if s.problem is None), None)
    if snap is None:
        return BaseFacts(name, "not found")
    config = local(snap.path, snap.read_root).read_json("config.json")
    fam = family_mod.detect(config.data) if config.ok else family_mod.NOT_GEMMA
    return BaseFacts(name, "cache" if snap.in_cache else "folder", str(snap.path), config, fam)


def with_base(facts: ModelFacts, cache: Path) -> ModelFacts:
    """An adapter's facts with its base looked up; any other model's facts unchanged."""
    if facts.adapter is None or facts.base is not None:
        return facts
    return facts.with_(base=find_base(facts.adapter.base_model, cache, facts.adapter.base_revision))

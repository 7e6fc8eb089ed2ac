"""A snapshot -> the facts of its small files: config, generation config, family and undo record.

Both the check pipeline and the fixer (which re-reads under its lock) start here; the heavier facts
(census, recommendation, ...) are added by pipeline.gather in a fixed order.
"""

from __future__ import annotations

from gemma_doctor import family as family_mod
from gemma_doctor import source as sources
from gemma_doctor import undo
from gemma_doctor.facts import ModelFacts
from gemma_doctor.locate import Snapshot
from gemma_doctor.readers import adapter as adapter_reader
from gemma_doctor.readers.jsonfile import JsonFile
from gemma_doctor.source import ModelSource


def source_of(snapshot: Snapshot) -> ModelSource:
    """Where this snapshot's files are read from."""
    return sources.local(snapshot.path, snapshot.read_root)


def read_model(snapshot: Snapshot, config: JsonFile | None = None, source: ModelSource | None = None,
               family: family_mod.FamilyInfo | None = None) -> ModelFacts:
    """Read one snapshot's config files and undo record (``config`` when already read; ``family``: its family, when
    already detected from it).

    A snapshot whose repo could not be read safely (``snapshot.problem``) is not read at all: its facts say so.
    """
    if snapshot.problem is not None:
        return unreadable_model(snapshot)
    src = source if source is not None else source_of(snapshot)
    if config is None:
        config = src.read_json("config.json")
    generation = src.read_json("generation_config.json")
    if not config.ok:
        fam = family_mod.NOT_GEMMA
    else:
        fam = family if family is not None else family_mod.detect(config.data)
    undo_facts = undo.facts_for(snapshot) if src.kind != "hub" else None
    facts = ModelFacts(snapshot=snapshot, config=config, generation_config=generation, family=fam, source=src)
    # An adapter (or a checkpoint of one) enters through the same source: its own files, its base looked up later.
    kind = adapter_reader.kind_of(src)
    facts = facts.with_(files=adapter_reader.present(src))
    if kind != adapter_reader.MODEL:
        facts = facts.with_(kind=kind, adapter=adapter_reader.read(src) if adapter_reader.is_adapter(src) else None)
    return facts if undo_facts is None else facts.with_(undo=undo_facts)


def unreadable_model(snapshot: Snapshot) -> ModelFacts:
    """The facts of a snapshot that is not read (its repo folder, ref or snapshot entry is unsafe or unreadable)."""
    return ModelFacts(snapshot=snapshot, config=JsonFile(snapshot.path / "config.json", exists=False),
                      generation_config=JsonFile(snapshot.path / "generation_config.json", exists=False),
                      family=family_mod.NOT_GEMMA)

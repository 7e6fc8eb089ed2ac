"""The base model of a PEFT adapter: found by the name adapter_config.json records, in a folder or the cache.

An adapter enters `check` through the same source interface as a model (readers/adapter.py reads its files); this
module looks its base up the way `check BASE` would (a folder first, then the cache, then the Hub: its config.json
alone, at the adapter's recorded revision, under the same deadline and limits as a remote check; nothing is
downloaded), and reads the base's config.json and family. A base found nowhere, or on a Hub that cannot be asked
(HF_HUB_OFFLINE, no network, gated), is reported (GD742) with the reason.
"""

from __future__ import annotations

from pathlib import Path

from gemma_doctor import family as family_mod
from gemma_doctor import locate
from gemma_doctor.errors import DoctorError, UsageError
from gemma_doctor.facts import ModelFacts
from gemma_doctor.readers.adapter import BaseFacts
from gemma_doctor.source import local


# Why the base an adapter of the cache names as a folder is not read (issue 33).
NOT_A_FOLDER = ("not read: an adapter in the cache names its base by a folder, and anyone who can write the cache could "
                "point it at any folder of yours; check that folder yourself (gemma-doctor check FOLDER)")


def find_base(name: str | None, cache: Path, revision: str | None = None, hub: bool = True,
              in_cache: bool = False) -> BaseFacts:
    """The base named ``name``: an existing folder, else a cached repo at ``revision`` (main when unrecorded), else
    (when ``hub``) the Hub's config.json for that repo. For an adapter ``in_cache`` (a shared cache's co-users can
    write its adapter_config.json) the name is only ever a repo id: a folder it names is not read, and said so."""
    if not name:
        return BaseFacts(None, "unnamed")
    try:
        if in_cache:
            repo = locate.repo_target(name, revision or "main")
            if repo is None:
                return BaseFacts(name, "not found", note=NOT_A_FOLDER)
            snapshots = locate.cached_snapshots(repo[0], cache, repo[1])  # never a folder of that name
        else:
            snapshots = locate.resolve([name], cache, revision or "main")
    except locate.NotCached as e:
        if not hub:
            return BaseFacts(name, "not found", note="not asked: a scan of the whole cache never reaches the Hub")
        return _from_hub(name, e.repo_id, e.revision or revision or "main", cache)
    except UsageError:
        return BaseFacts(name, "not found")
    snap = next((s for s in snapshots if s.problem is None), None)
    if snap is None:
        return BaseFacts(name, "not found")
    config = local(snap.path, snap.read_root).read_json("config.json")
    fam = family_mod.detect(config.data) if config.ok else family_mod.NOT_GEMMA
    return BaseFacts(name, "cache" if snap.in_cache else "folder", str(snap.path), config, fam)


def _from_hub(name: str, repo_id: str, revision: str, cache: Path) -> BaseFacts:
    """The base's config.json read from the Hub (huggingface_hub imported only here), or why it could not be."""
    from gemma_doctor import hub

    try:
        source = hub.open_model(repo_id, revision, cached=locate.cached_repo_ids(cache), not_cached=True)
        config = source.read_json("config.json")
    except DoctorError as e:
        return BaseFacts(name, "not found", note=one_line(str(e)))
    fam = family_mod.detect(config.data) if config.ok else family_mod.NOT_GEMMA
    return BaseFacts(name, "hub", source.location, config, fam)


def one_line(text: str, most: int = 300) -> str:
    """A Hub error or a name read from a file as one printable line of at most ``most`` characters (the text may
    quote what a server sent, or be planted): never echoed whole."""
    line = "".join(c if c.isprintable() else "?" for c in " ".join(text.split()))
    return line if len(line) <= most else line[:most - 3] + "..."


def with_base(facts: ModelFacts, cache: Path, hub: bool = True) -> ModelFacts:
    """An adapter's facts with its base looked up (the Hub asked only when ``hub``: an adapter named on the command
    line); any other model's facts unchanged."""
    if facts.adapter is None or facts.base is not None:
        return facts
    return facts.with_(base=find_base(facts.adapter.base_model, cache, facts.adapter.base_revision, hub,
                                      in_cache=facts.snapshot.in_cache))

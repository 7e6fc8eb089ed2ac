"""A whole-cache scan locates and reads each repo with the components of its paths known (issue 32 item 5): each
path below a repo folder is worked out once per model, not once per file, and every read is the same read (fsafe's
walk from the repo folder, one component at a time, links followed only inside it). No test asserts on time; the
figures are in docs/benchmarks.md."""

from __future__ import annotations

import json
import os

import pytest

from gemma_doctor import fsafe, locate, pipeline
from gemma_doctor.model import source_of
from tests.builders import gemma3_12b_config, generation_config, llama_config, variant


def _scan(cache):
    located = [(s, source_of(s)) for s in locate.snapshots_in(cache, locate.cache_folders(cache))]
    return list(pipeline.select_each(located, explicit=False))


def test_a_scan_works_out_each_models_paths_once(hub, monkeypatch):
    gemma, other, gen = gemma3_12b_config(), llama_config(), generation_config()
    for i in range(6):
        cfg = gemma if i % 2 == 0 else other
        hub.add(f"org/model-{i}", {"config.json": variant(cfg, _name_or_path=f"m{i}"), "generation_config.json": gen})
    cut: list[str] = []
    real = fsafe.Area.parts
    monkeypatch.setattr(fsafe.Area, "parts", lambda self, path: cut.append(os.fspath(path)) or real(self, path))
    got = _scan(hub.root)
    assert sum(m is not None for m, _ in got) == 3 and len(got) == 6
    assert all(m.config.ok and m.generation_config.ok for m, _ in got if m is not None)
    # One per model read (its snapshot folder), where each ref, snapshot entry and file was one (21 here).
    assert len(cut) == 6 and all(os.path.basename(os.path.dirname(p)) == "snapshots" for p in cut)


def _planted(hub, tmp_path):
    """A repo whose snapshot holds what an attacker may plant: links out (relative and absolute), a dangling link, a
    FIFO, a folder, a link to a folder, a link through a linked folder, and a hub link that stays inside."""
    snap = hub.add("org/planted", {"config.json": gemma3_12b_config(), "generation_config.json": generation_config()})
    outside = tmp_path / "secret.json"
    outside.write_text('{"x": 1}')
    os.symlink(outside, snap / "absolute_out.json")
    os.symlink("../../../../secret.json", snap / "relative_out.json")
    os.symlink("../../blobs/missing", snap / "dangling.json")
    os.mkfifo(snap / "fifo.json")
    (snap / "folder.json").mkdir()
    os.symlink(str(tmp_path), snap / "linked_dir")
    os.symlink("linked_dir/secret.json", snap / "through_link.json")
    os.symlink("config.json", snap / "to_config.json")
    return snap


NAMES = ["config.json", "generation_config.json", "absolute_out.json", "relative_out.json", "dangling.json",
         "fifo.json", "folder.json", "through_link.json", "to_config.json", "missing.json"]


@pytest.mark.parametrize("follow", [True, False])
def test_a_read_with_its_components_given_is_the_read_from_its_path(hub, tmp_path, follow):
    snap = _planted(hub, tmp_path)
    area = fsafe.Area(hub.repo_dir("org/planted"))
    for name in NAMES:
        path = snap / name
        plain = fsafe.read_file(path, 1 << 20, area, follow=follow)
        given = fsafe.read_file(os.fspath(path), 1 << 20, area, follow=follow, parts=area.parts(path))
        assert vars(given) == vars(plain), name
    out = snap / "absolute_out.json"
    assert fsafe.read_file(out, 1 << 20, area, parts=area.parts(out)).escapes


def test_a_ref_and_snapshot_entry_read_with_their_components_are_what_they_were(hub, tmp_path):
    """locate's ref read and snapshot look, given their components, against the paths read whole."""
    snap = _planted(hub, tmp_path)
    repo = hub.repo_dir("org/planted")
    area = fsafe.Area(repo)
    os.symlink("main", repo / "refs" / "linked")
    (repo / "refs" / "pr").mkdir()
    (repo / "refs" / "pr" / "1").write_text(snap.name)
    for rev in ("main", "linked", "pr", "pr/1", "nothing", "pr/2"):
        assert locate._read_ref(repo, rev, area) == locate._read_ref(repo, rev) == _ref_by_path(repo, rev), rev
    for entry in (snap.name, "0" * 40):
        path = repo / "snapshots" / entry
        assert fsafe.kind(path, area, parts=["snapshots", entry]) == fsafe.kind(path, area)


def _ref_by_path(repo, rev):
    got = fsafe.read_file(repo / "refs" / rev, locate._MAX_REF_BYTES, fsafe.Area(repo), follow=False)
    if not got.exists or got.error == "is a folder, not a file":
        return None
    if got.error:
        return locate.RepoProblem("GD021", f"refs/{rev}: {got.error}")
    return got.data.decode().strip()


def _fine_tunes(hub, n: int) -> None:
    for i in range(n):
        hub.add(f"team/tune-{i}", {"config.json": variant(gemma3_12b_config(), _name_or_path=f"team/tune-{i}"),
                                   "generation_config.json": generation_config()})
        hub.add(f"team/other-{i}", {"config.json": variant(llama_config(), _name_or_path=f"o{i}")})


def test_a_scan_detects_each_models_family_once(hub, monkeypatch):
    """config.json's family decides whether a scan reads a repo further, and read_model takes it from there: one
    detection per repo read (main: a second one for every Gemma repo, from the same parsed config)."""
    from gemma_doctor import family

    _fine_tunes(hub, 3)
    calls = [0]
    real = family.detect
    monkeypatch.setattr(family, "detect", lambda config: calls.__setitem__(0, calls[0] + 1) or real(config))
    got = _scan(hub.root)
    assert sum(m is not None and m.family.is_gemma for m, _ in got) == 3 and len(got) == 6
    assert calls[0] == 6


def test_a_scan_checks_mappings_without_typing(tmp_path, monkeypatch):
    """The readers and traits a scan runs per model test a value for a mapping against collections.abc.Mapping
    (isinstance in C), not typing.Mapping (each test a Python call through typing): the checks through typing do
    not grow with the models read and served (main: 12 more per alike Gemma model)."""
    import typing

    from gemma_doctor.facts import CheckOptions
    from gemma_doctor.render.text import with_block
    from tests.builders import HubCache

    monkeypatch.setenv("GEMMA_DOCTOR_WORKERS", "1")
    cls = type(typing.Mapping)
    real = cls.__instancecheck__
    calls = [0]
    monkeypatch.setattr(cls, "__instancecheck__",
                        lambda self, obj: calls.__setitem__(0, calls[0] + 1) or real(self, obj))
    counts = {}
    for n in (2, 3, 6):  # the first scan judges what every later one serves
        cache = tmp_path / f"c{n}"
        _fine_tunes(HubCache(cache), n)
        calls[0] = 0
        report = pipeline.diagnose([], cache, options=CheckOptions(), finish=with_block, prescription=False)
        assert len(report.models) == n
        counts[n] = calls[0]
    assert counts[6] == counts[3]


def test_a_judgement_checks_mappings_without_typing(tmp_path, monkeypatch):
    """Where each model is judged (no two alike), the readers, the precision advice, the catalogue and the crash and
    library rules test for a mapping with collections.abc.Mapping too: none of their checks goes through typing's
    (main: 26 per judged model, 20 of them theirs; plan/runplan.py's and plan/memory.py's are their owners' to change)."""
    import sys
    import typing

    from gemma_doctor.facts import CheckOptions
    from gemma_doctor.render.text import with_block
    from tests.builders import HubCache

    hub = HubCache(tmp_path / "hub")
    for i in range(3):
        text = dict(gemma3_12b_config()["text_config"], num_hidden_layers=8 + i)
        hub.add(f"team/tune-{i}", {"config.json": variant(gemma3_12b_config(), text_config=text),
                                   "generation_config.json": generation_config()})
    monkeypatch.setenv("GEMMA_DOCTOR_WORKERS", "1")
    cls = type(typing.Mapping)
    real = cls.__instancecheck__
    callers: list[str] = []
    monkeypatch.setattr(cls, "__instancecheck__",
                        lambda self, obj: callers.append(sys._getframe(1).f_globals["__name__"]) or real(self, obj))
    report = pipeline.diagnose([], hub.root, options=CheckOptions(), finish=with_block, prescription=False)
    assert len(report.models) == 3
    mine = {"gemma_doctor.family", "gemma_doctor.traits", "gemma_doctor.readers.dtypes", "gemma_doctor.readers.tokenizer",
            "gemma_doctor.plan.advice", "gemma_doctor.catalogue", "gemma_doctor.rules.libraries",
            "gemma_doctor.rules.crashes"}
    assert not [c for c in callers if c in mine]


@pytest.mark.parametrize("follow", [True, False])
def test_a_read_through_held_folders_is_the_read_from_the_path(hub, tmp_path, follow):
    """fsafe.Area.holding: every planted name (links out, relative and absolute, dangling, a FIFO, a folder, a link
    through a linked folder, a hub link inside) reads through held folders exactly as it reads walked from the root,
    read first, again, and after a plain read of another name."""
    snap = _planted(hub, tmp_path)
    area = fsafe.Area(hub.repo_dir("org/planted"))
    with area.holding() as held:
        for _ in range(2):
            for name in NAMES:
                path = snap / name
                plain = fsafe.read_file(path, 1 << 20, area, follow=follow)
                for parts in (None, area.parts(path)):
                    got = fsafe.read_file(os.fspath(path), 1 << 20, held, follow=follow, parts=parts)
                    assert vars(got) == vars(plain), name
    assert held.folders.fds is None  # every held descriptor closed with the block


def test_a_held_folder_swapped_for_a_link_out_is_never_followed(hub, tmp_path):
    """A snapshot folder swapped for a link leading out after it was held: the held read reads the folder it held
    (its hub links resolved in the repo's own blobs/), never the place the new link names; the next holding walks
    again and refuses the link."""
    snap = hub.add("org/swap", {"config.json": gemma3_12b_config(), "generation_config.json": generation_config()})
    repo = hub.repo_dir("org/swap")
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "generation_config.json").write_text('{"secret": 1}')
    area = fsafe.Area(repo)
    parts = area.parts(snap / "config.json")
    with area.holding() as held:
        assert fsafe.read_file(snap / "config.json", 1 << 20, held, parts=parts).data is not None
        os.rename(snap, tmp_path / "moved")
        os.symlink(secret, snap)
        gen = [*parts[:2], "generation_config.json"]
        got = fsafe.read_file(snap / "generation_config.json", 1 << 20, held, parts=gen)
        assert got.data is not None and b"secret" not in got.data and json.loads(got.data) == generation_config()
    again = fsafe.read_file(snap / "generation_config.json", 1 << 20, area)
    assert again.data is None and again.error


def _counting(monkeypatch, calls):
    for name in ("open", "read"):
        real = getattr(os, name)

        def wrapped(*a, _real=real, _name=name, **k):
            try:
                got = _real(*a, **k)
            except OSError as e:
                calls.append(("failed " + _name, e.errno))
                raise
            calls.append((_name, a[0] if _name == "open" else None))
            return got

        monkeypatch.setattr(os, name, wrapped)


def test_a_scan_walks_to_each_repo_once_and_reads_each_file_once(hub, monkeypatch):
    """A whole-cache scan's reads of one repo walk from its folders held open once (the repo folder opened by its
    path once per repo, not once per file), a hub link read before any open (no open failing on it first), and a
    file whose first read got its whole size is not read again to meet its end. Counted over 4 alike Gemma repos
    (config.json and generation_config.json read) and 4 others (config.json alone). main: the repo folder opened by
    path 12 times, 72 opens (12 failing), 24 reads; here 8, 44 (none failing) and 12."""
    for i in range(4):
        hub.add(f"team/tune-{i}", {"config.json": variant(gemma3_12b_config(), _name_or_path=f"team/tune-{i}"),
                                   "generation_config.json": generation_config()})
        hub.add(f"team/other-{i}", {"config.json": variant(llama_config(), _name_or_path=f"o{i}")})
    located = [(s, source_of(s)) for s in locate.snapshots_in(hub.root, locate.cache_folders(hub.root))]
    calls: list[tuple[str, object]] = []
    _counting(monkeypatch, calls)
    got = list(pipeline.select_each(located, explicit=False))
    monkeypatch.undo()
    assert sum(m is not None for m, _ in got) == 4 and all(m.generation_config.ok for m, _ in got if m is not None)
    by_path = [p for n, p in calls if n == "open" and os.path.isabs(os.fspath(p))]
    assert len(by_path) == 8  # each repo folder once
    assert sum(n == "open" for n, _ in calls) == 44  # per repo its folder, snapshots/, the snapshot, blobs/; each blob
    assert sum(n == "read" for n, _ in calls) == 12  # one per file read
    assert not [c for c in calls if c[0].startswith("failed")]  # no open failing on a hub link (main: 12, ELOOP)

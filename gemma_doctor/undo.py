"""The undo record behind `fix --inplace` and `restore`: entries, backups, the lock, and tidying up.

Layout (see docs/architecture.md), everything inside the repo folder (or the plain folder):
- cache snapshot: ``models--org--name/.gemma-doctor/undo.json`` (+ ``backups/<sha256>``, ``kept/``, ``lock``);
  huggingface_hub's scanner only looks at ``refs/`` and ``snapshots/``, so this is invisible to it and deleted
  with the repo.
- plain folder: ``<folder>/.gemma-doctor/``.
Entry keys are paths relative to the repo folder (or the plain folder), and may only name the files `fix`
writes: ``snapshots/<commit>/config.json`` and ``generation_config.json`` (plain: the bare names). Every file
operation goes through fsafe with the snapshot's Area: nothing below the repo folder is reached through a link.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
from pathlib import Path
from typing import Any, Iterator

from gemma_doctor import fsafe
from gemma_doctor.errors import ReadError, WriteError
from gemma_doctor.facts import UndoFacts
from gemma_doctor.locate import Snapshot
from gemma_doctor.readers.jsonfile import MAX_JSON_BYTES, parse_json_object

UNDO_FILE = "undo.json"
LOCK_FILE = "lock"
SCHEMA_VERSION = 1
DEFAULT_LOCK_TIMEOUT = 60.0
# The only files `fix` writes, hence the only files `restore` may ever touch.
WRITABLE = ("config.json", "generation_config.json")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_NAMES = "|".join(re.escape(n) for n in WRITABLE)
_KEY_CACHE = re.compile(rf"^snapshots/[0-9a-f]{{40}}/(?:{_NAMES})$")
_KEY_PLAIN = re.compile(rf"^(?:{_NAMES})$")
_MAX_LINK_TARGET = 4096


def sha256(data: bytes) -> str:
    """Hex sha256 of ``data``."""
    import hashlib  # a fix or restore hashes; check's start-up (reading the record) does without

    return hashlib.sha256(data).hexdigest()


def base_dir(snapshot: Snapshot) -> Path:
    """The folder entry keys are relative to."""
    return snapshot.repo_dir if snapshot.repo_dir is not None else snapshot.path


def area(snapshot: Snapshot) -> fsafe.Area:
    """The folder a run may touch for this snapshot: its repo folder, or the plain folder the user named."""
    return fsafe.Area(base_dir(snapshot), user_named=snapshot.repo_dir is None)


def entry_key(snapshot: Snapshot, name: str) -> str:
    """The undo-record key of file ``name`` of ``snapshot``."""
    return (snapshot.path / name).relative_to(base_dir(snapshot)).as_posix()


def lock_path(snapshot: Snapshot) -> Path:
    """The lock serialising every gemma-doctor write to this repo (or folder): inside its own state folder."""
    return snapshot.state_dir / LOCK_FILE


@contextlib.contextmanager
def locked(snapshot: Snapshot, timeout: float = DEFAULT_LOCK_TIMEOUT) -> Iterator[fsafe.Held]:
    """Hold the repo's lock (its folder and file are reached without following any link)."""
    if not fsafe.SUPPORTED:
        raise WriteError("this platform lacks the descriptor-relative file operations (openat, O_NOFOLLOW) that keep "
                         "writes inside the repo folder; fix --inplace and restore are not available here")
    with fsafe.locked(lock_path(snapshot), timeout, area(snapshot)) as held:
        yield held


def load(snapshot: Snapshot) -> dict[str, dict[str, Any]]:
    """All entries of the record that covers ``snapshot`` (empty when there is none); ReadError when unusable."""
    state = snapshot.state_dir
    if _no_state_folder(state, area(snapshot)):
        return {}
    path = state / UNDO_FILE
    got = fsafe.read_file(path, MAX_JSON_BYTES, area(snapshot), follow=False)
    if not got.exists:
        return {}
    if got.error:
        raise ReadError(f"{path}: {got.error}")
    raw = got.data or b""
    if len(raw) > MAX_JSON_BYTES:
        raise ReadError(f"{path}: larger than {MAX_JSON_BYTES // (1024 * 1024)} MiB, not an undo record")
    data, error, _ = parse_json_object(raw)
    if error:
        raise ReadError(f"{path}: {error}")
    entries = data.get("entries")
    key_ok = _KEY_CACHE.match if snapshot.repo_dir is not None else _KEY_PLAIN.match
    if data.get("schema_version") != SCHEMA_VERSION or not isinstance(entries, dict) or not all(
        isinstance(k, str) and key_ok(k) and _valid_entry(v) for k, v in entries.items()
    ):
        raise ReadError(f"{path}: not an undo record this version of gemma-doctor understands "
                        f"(or it names files gemma-doctor never writes)")
    return entries


def _no_state_folder(state: Path, where: fsafe.Area) -> bool:
    """True when the state folder is certainly absent (most repos: `fix` never touched them), known by two lookups
    instead of the read's walk to a missing file and its look for a dangling link after it: nothing by that name in a
    root that is a real folder (a cache repo folder that is a link is refused by the read, as before). Anything else
    (something there, a root that is a link, an error) leaves the answer to the read."""
    try:
        os.lstat(state)
        return False
    except FileNotFoundError:
        pass
    except (OSError, ValueError):
        return False
    if where.user_named:
        return True
    try:
        return stat.S_ISDIR(os.lstat(where.root).st_mode)
    except (OSError, ValueError):
        return False


def mtime_of(entry: dict[str, Any]) -> int | None:
    """The original's modification time an entry recorded (ns), or None (an entry from before it was recorded)."""
    t = entry.get("mtime_ns")
    return t if isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 1 << 63 else None


def _valid_entry(entry: Any) -> bool:
    """An entry restore may act on: hex digests (they name backup files), a sane kind, mode and link target."""
    if not isinstance(entry, dict):
        return False
    digests_ok = all(isinstance(entry.get(k), str) and _SHA256.match(entry[k]) for k in ("original_sha256", "fixed_sha256"))
    mode = entry.get("mode")
    target = entry.get("link_target")
    link_ok = (isinstance(target, str) and 0 < len(target) <= _MAX_LINK_TARGET and "\0" not in target)
    return bool(digests_ok and entry.get("kind") in ("link", "file") and isinstance(mode, int)
                and not isinstance(mode, bool) and 0 <= mode <= 0o7777
                and (entry.get("kind") == "file" or link_ok))


def facts_for(snapshot: Snapshot) -> UndoFacts:
    """The entries that concern this snapshot's own files, keyed by file name."""
    try:
        entries = load(snapshot)
    except ReadError as e:
        return UndoFacts(error=str(e))
    if not entries:  # no record (every repo `fix` never touched): no key of this snapshot's to work out
        return UndoFacts()
    prefix = entry_key(snapshot, "x")[:-1]
    mine = {k[len(prefix):]: v for k, v in entries.items() if k.startswith(prefix) and "/" not in k[len(prefix):]}
    return UndoFacts(entries=mine)


def save(snapshot: Snapshot, entries: dict[str, dict[str, Any]]) -> None:
    """Write the record atomically; an empty record removes the file."""
    path = snapshot.state_dir / UNDO_FILE
    if not entries:
        fsafe.remove(path, area(snapshot))
        return
    doc = {"schema_version": SCHEMA_VERSION, "tool": "gemma-doctor",
           "note": "originals of files rewritten by `gemma-doctor fix`; `gemma-doctor restore` puts them back",
           "entries": dict(sorted(entries.items()))}
    fsafe.write_file(path, (json.dumps(doc, indent=2) + "\n").encode("utf-8"), 0o644, area(snapshot), make_folders=True)


def backup_path(snapshot: Snapshot, digest: str) -> Path:
    """Where the original bytes with this sha256 are kept."""
    if not _SHA256.match(digest):
        # A digest names a file: anything but 64 hex digits could name one outside backups/.
        raise WriteError(f"{digest!r} is not a sha256; the undo record is damaged")
    return snapshot.state_dir / "backups" / digest


def read_backup(snapshot: Snapshot, digest: str) -> bytes:
    """The original bytes with this sha256; WriteError when the backup is missing, a link, or does not match."""
    path = backup_path(snapshot, digest)
    got = fsafe.read_file(path, MAX_JSON_BYTES, area(snapshot), follow=False)
    if not got.exists or got.error or got.data is None:
        why = "missing" if not got.exists else got.error
        raise WriteError(f"the backup {path} is unusable ({why}); nothing restored")
    if sha256(got.data) != digest:
        raise WriteError(f"the backup {path} does not match its checksum; nothing restored")
    return got.data


def save_backup(snapshot: Snapshot, data: bytes, mode: int = 0o644) -> str:
    """Keep a copy of original bytes (content-addressed, written once); return its digest.

    The copy is never more readable than the original was (``mode``): a file hard-linked into the cache from
    somewhere private stays private.
    """
    digest = sha256(data)
    path = backup_path(snapshot, digest)
    have = fsafe.read_file(path, MAX_JSON_BYTES, area(snapshot), follow=False)
    if not (have.data is not None and sha256(have.data) == digest):
        fsafe.write_file(path, data, (mode & 0o666) | 0o600, area(snapshot), make_folders=True)
    return digest


def keep_path(snapshot: Snapshot, name: str, digest: str) -> Path:
    """Where `restore --force` keeps a user's edited version of ``name`` before putting the original back."""
    prefix = f"{snapshot.commit[:12]}-" if snapshot.repo_dir is not None and snapshot.commit else ""
    return snapshot.state_dir / "kept" / f"{prefix}{name}-{digest[:12]}"


def keep(snapshot: Snapshot, name: str, data: bytes, mode: int) -> Path:
    """Keep ``data`` (a user's version of ``name``) where the user can find it; returns the path."""
    path = keep_path(snapshot, name, sha256(data))
    fsafe.write_file(path, data, (mode & 0o666) | 0o600, area(snapshot), make_folders=True)
    return path


def _listing(path: Path, where: fsafe.Area) -> list[fsafe.Entry]:
    try:
        return fsafe.list_dir(path, where)
    except (fsafe.Refused, OSError):
        return []


def _temp_files(snapshot: Snapshot) -> list[Path]:
    """Temp files of ours in the snapshot folders and our state folders (regular files or links, never followed)."""
    where = area(snapshot)
    folders = [snapshot.state_dir, snapshot.state_dir / "backups", snapshot.state_dir / "kept"]
    if snapshot.repo_dir is not None:
        snaps = snapshot.repo_dir / "snapshots"
        folders += [snaps / e.name for e in _listing(snaps, where) if e.kind == "folder"]
    else:
        folders.append(snapshot.path)
    return [f / e.name for f in folders for e in _listing(f, where)
            if e.kind in ("file", "link") and fsafe.TEMP_NAME.match(e.name)]


def _orphan_backups(snapshot: Snapshot, entries: dict[str, dict[str, Any]]) -> list[Path]:
    referenced = {str(e.get("original_sha256")) for e in entries.values()}
    backups = snapshot.state_dir / "backups"
    return [backups / e.name for e in _listing(backups, area(snapshot))
            if e.kind in ("file", "link") and _SHA256.match(e.name) and e.name not in referenced]


def needs_sweep(snapshot: Snapshot) -> bool:
    """True when a killed or failed run left temp files or unreferenced backups (cheap: listings, no lock)."""
    if _temp_files(snapshot):
        return True
    try:
        entries = load(snapshot)
    except ReadError:
        return False
    return bool(_orphan_backups(snapshot, entries))


def sweep(snapshot: Snapshot, entries: dict[str, dict[str, Any]]) -> list[Path]:
    """Remove what a killed run left behind: temp files and backups no entry refers to. Call with the lock held.

    Under the lock no other gemma-doctor is writing this repo, so every temp file of ours is stale. Names are
    unlinked relative to their real folder: a link is removed itself, never what it points at.
    """
    removed: list[Path] = []
    for p in _temp_files(snapshot) + _orphan_backups(snapshot, entries):
        with contextlib.suppress(WriteError):
            if fsafe.remove(p, area(snapshot)):
                removed.append(p)
    return removed


def tidy(snapshot: Snapshot, held: fsafe.Held) -> None:
    """After the last entry is gone: remove the empty state folder and the lock (while holding it), so a fully
    restored folder is exactly as it was (nothing for an upload to push). Kept user files stay, with the folder."""
    where = area(snapshot)
    with contextlib.suppress(WriteError):
        fsafe.remove(snapshot.state_dir / UNDO_FILE, where)
        fsafe.remove(snapshot.state_dir / "backups", where, folder=True)
        if [e.name for e in _listing(snapshot.state_dir, where)] == [LOCK_FILE]:
            # Still holding it: a waiter wakes on a nameless file and starts again (fsafe.locked).
            fsafe.remove(lock_path(snapshot), where)
            fsafe.remove(snapshot.state_dir, where, folder=True)

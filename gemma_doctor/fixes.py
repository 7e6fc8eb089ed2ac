"""Plan, then apply: the exact edits `fix` makes, and the careful applier behind --inplace and restore."""

from __future__ import annotations

import datetime as _dt
import difflib
import enum
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gemma_doctor import undo
from gemma_doctor.errors import ReadError, WriteError
from gemma_doctor.facts import ModelFacts
from gemma_doctor.jsonedit import EditError, set_member
from gemma_doctor.readers.jsonfile import JsonFile
from gemma_doctor.rules.use_cache import text_use_cache


class Status(str, enum.Enum):
    """What happened (or would happen) to one model."""

    WOULD_CHANGE = "would-change"
    CHANGED = "changed"
    UP_TO_DATE = "up-to-date"
    NOT_APPLICABLE = "not-applicable"
    REFUSED = "refused"
    FAILED = "failed"
    RESTORED = "restored"
    NOTHING_TO_RESTORE = "nothing-to-restore"


@dataclass(frozen=True)
class FileChange:
    """One file's planned rewrite."""

    name: str
    path: Path
    keys: tuple[str, ...]
    before: bytes
    after: bytes
    link_target: str | None

    def diff(self) -> str:
        """Unified diff of the change, labelled with the file's path."""
        a = self.before.decode("utf-8").splitlines(keepends=True)
        b = self.after.decode("utf-8").splitlines(keepends=True)
        label = str(self.path)
        lines = list(difflib.unified_diff(a, b, label, label, n=2))
        return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


@dataclass(frozen=True)
class ModelPlan:
    """What `fix` will do to one snapshot."""

    facts: ModelFacts
    changes: tuple[FileChange, ...] = ()
    refused: tuple[str, ...] = ()
    note: str | None = None

    @property
    def status(self) -> Status:
        """The planned outcome."""
        if self.changes:
            return Status.WOULD_CHANGE
        if self.refused:
            return Status.REFUSED
        if self.note:
            return Status.NOT_APPLICABLE
        return Status.UP_TO_DATE


@dataclass
class Outcome:
    """What a command did (or would do) to one snapshot, for the renderers."""

    facts: ModelFacts
    status: Status
    changes: list[FileChange] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)


def _edit(jf: JsonFile, path: tuple[str, ...]) -> bytes:
    text = jf.raw.decode("utf-8")  # type: ignore[union-attr]
    return set_member(text, path, False).encode("utf-8")


def plan_model(facts: ModelFacts) -> ModelPlan:
    """The edits that make the text model (and generate()) run without a cache. Pure."""
    cfg = facts.config
    if not cfg.ok:
        reason = "config.json is missing" if not cfg.exists else f"config.json: {cfg.error}"
        return ModelPlan(facts, refused=(f"{reason}; not rewritten",))
    fam = facts.family
    if not fam.is_gemma:
        return ModelPlan(facts, note=f"not a Gemma-family model (model_type {fam.model_type!r}); left alone")
    if not fam.builds_hybrid_cache:
        return ModelPlan(facts, note=f"its {fam.text_model_type} text model builds no HybridCache; nothing to fix")
    changes: list[FileChange] = []
    refused: list[str] = []
    if fam.nested and cfg.data.get("text_config") is not None and not isinstance(cfg.data.get("text_config"), dict):
        refused.append("config.json: text_config is not an object; not rewritten")
    elif text_use_cache(cfg.data, fam.nested) is not False:
        path = ("text_config", "use_cache") if fam.nested else ("use_cache",)
        try:
            changes.append(FileChange("config.json", cfg.path, (".".join(path),), cfg.raw, _edit(cfg, path), cfg.link_target))  # type: ignore[arg-type]
        except EditError as e:
            refused.append(f"config.json: cannot edit safely ({e}); not rewritten")
    gen = facts.generation_config
    if gen.exists and not gen.ok:
        refused.append(f"generation_config.json: {gen.error}; not rewritten")
    elif gen.ok and gen.data.get("use_cache") is not False:
        try:
            changes.append(FileChange("generation_config.json", gen.path, ("use_cache",), gen.raw, _edit(gen, ("use_cache",)), gen.link_target))  # type: ignore[arg-type]
        except EditError as e:
            refused.append(f"generation_config.json: cannot edit safely ({e}); not rewritten")
    return ModelPlan(facts, tuple(changes), tuple(refused))


def _current(path: Path) -> tuple[str | None, bytes | None]:
    """(link target or None, bytes) of a file as it is now; bytes None when unreadable."""
    target = os.readlink(path) if path.is_symlink() else None
    try:
        return target, path.read_bytes()
    except OSError:
        return target, None


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def apply_plan(plan: ModelPlan, lock_timeout: float = undo.DEFAULT_LOCK_TIMEOUT) -> list[FileChange]:
    """Write the plan: originals recorded first, then each file atomically replaced. Returns what changed."""
    snap = plan.facts.snapshot
    written: list[FileChange] = []
    with undo.locked(snap, lock_timeout):
        try:
            entries = undo.load(snap)
        except ReadError as e:
            raise WriteError(f"{e}; refusing to write without a way to undo") from None
        for change in plan.changes:
            link_target, data = _current(change.path)
            if data != change.before or link_target != change.link_target:
                raise WriteError(f"{change.path} changed while gemma-doctor was planning; run the command again")
            key = undo.entry_key(snap, change.name)
            after_digest = undo.sha256(change.after)
            entry = entries.get(key)
            if entry is None or entry.get("fixed_sha256") != undo.sha256(change.before) or link_target is not None:
                # The file as it is now is the original that restore must bring back.
                mode = change.path.stat().st_mode & 0o777
                entry = {
                    "kind": "link" if link_target is not None else "file",
                    "link_target": link_target,
                    "original_sha256": undo.save_backup(snap, change.before),
                    "mode": mode,
                }
            entry = {**entry, "fixed_sha256": after_digest, "keys": list(change.keys), "fixed_at": _now()}
            entries[key] = entry
            undo.save(snap, entries)
            undo.write_file(change.path, change.after, int(entry["mode"]))
            written.append(change)
    return written


@dataclass(frozen=True)
class RestoreAction:
    """One file to put back (or a stale entry to drop)."""

    name: str
    path: Path
    entry: dict[str, Any]
    drop_only: bool


def plan_restore(facts: ModelFacts) -> tuple[list[RestoreAction], list[str]]:
    """Which files restore will put back, and which it must leave alone (with why)."""
    actions: list[RestoreAction] = []
    conflicts: list[str] = []
    snap = facts.snapshot
    for name, entry in sorted(facts.undo.entries.items()):
        path = snap.path / name
        link_target, data = _current(path)
        original_is_link = entry.get("kind") == "link"
        if original_is_link and link_target == entry.get("link_target"):
            actions.append(RestoreAction(name, path, entry, drop_only=True))
        elif data is not None and link_target is None and undo.sha256(data) == entry.get("original_sha256") and not original_is_link:
            actions.append(RestoreAction(name, path, entry, drop_only=True))
        elif data is not None and link_target is None and undo.sha256(data) == entry.get("fixed_sha256"):
            actions.append(RestoreAction(name, path, entry, drop_only=False))
        else:
            backup = undo.backup_path(snap, str(entry.get("original_sha256")))
            conflicts.append(f"{name} changed since gemma-doctor fixed it; left as it is (its original is kept in {backup})")
    return actions, conflicts


def apply_restore(facts: ModelFacts, actions: list[RestoreAction],
                  lock_timeout: float = undo.DEFAULT_LOCK_TIMEOUT) -> list[str]:
    """Put originals back, byte-identical (links as links), then drop their entries. Returns names restored."""
    snap = facts.snapshot
    done: list[str] = []
    with undo.locked(snap, lock_timeout):
        try:
            entries = undo.load(snap)
        except ReadError as e:
            raise WriteError(str(e)) from None
        for action in actions:
            key = undo.entry_key(snap, action.name)
            entry = entries.get(key)
            if entry is None:
                continue  # another process restored it meanwhile
            if not action.drop_only:
                link_target, data = _current(action.path)
                if link_target is not None or data is None or undo.sha256(data) != entry.get("fixed_sha256"):
                    raise WriteError(f"{action.path} changed while gemma-doctor was planning; run restore again")
                if entry.get("kind") == "link":
                    target = str(entry.get("link_target"))
                    if not (action.path.parent / target).exists():
                        raise WriteError(f"{action.path}: its original link target {target} is gone from the cache; "
                                         f"the original bytes are in {undo.backup_path(snap, str(entry.get('original_sha256')))}")
                    undo.write_link(action.path, target)
                else:
                    original = _read_backup(snap, entry)
                    undo.write_file(action.path, original, int(entry.get("mode", 0o644)))
                done.append(action.name)
            del entries[key]
            undo.save(snap, entries)
            _drop_unreferenced_backup(snap, entries, str(entry.get("original_sha256")))
    return done


def _read_backup(snap: Any, entry: dict[str, Any]) -> bytes:
    digest = str(entry.get("original_sha256"))
    path = undo.backup_path(snap, digest)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise WriteError(f"the backup {path} is unreadable ({e.strerror}); nothing restored") from None
    if undo.sha256(data) != digest:
        raise WriteError(f"the backup {path} does not match its checksum; nothing restored")
    return data


def _drop_unreferenced_backup(snap: Any, entries: dict[str, dict[str, Any]], digest: str) -> None:
    if any(e.get("original_sha256") == digest for e in entries.values()):
        return
    try:
        undo.backup_path(snap, digest).unlink()
    except OSError:
        pass  # a leftover backup costs a few KiB and loses nothing

"""Plan, then apply: the exact edits `fix` makes, and the careful applier behind --inplace and restore."""

from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import difflib
import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gemma_doctor import fsafe, undo
from gemma_doctor.errors import ReadError, WriteError
from gemma_doctor.facts import ModelFacts
from gemma_doctor.jsonedit import EditError, set_member
from gemma_doctor.model import read_model
from gemma_doctor.locate import command_args
from gemma_doctor.readers.jsonfile import MAX_JSON_BYTES, JsonFile
from gemma_doctor.rules.crashes import kv_shared_layers, use_cache_off_breaks
from gemma_doctor.rules.use_cache import text_use_cache
from gemma_doctor.stack import Exposure, Stack
from gemma_doctor.versioning import GEMMA4_KV_SHARE_NO_CACHE, HYBRIDCACHE


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
    stack: Stack | None = field(default=None, compare=False)

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


def plan_model(facts: ModelFacts, stack: Stack | None = None) -> ModelPlan:
    """The edits that make the text model (and generate()) run without a cache. Pure.

    Only where the HybridCache crash can happen with the transformers that will run (``stack``; None = any):
    on a release without the bug, use_cache on disk is left as published.
    """
    if facts.snapshot.problem is not None:
        return ModelPlan(facts, refused=(facts.snapshot.problem.message,), stack=stack)
    cfg = facts.config
    if facts.adapter is not None and not cfg.exists:
        return ModelPlan(facts, note="a PEFT adapter (adapter_config.json) has no config.json for fix to rewrite; "
                                     "`gemma-doctor check` lists its findings", stack=stack)
    if not cfg.ok:
        reason = "config.json is missing" if not cfg.exists else f"config.json: {cfg.error}"
        return ModelPlan(facts, refused=(f"{reason}; not rewritten",), stack=stack)
    fam = facts.family
    if not fam.is_gemma:
        return ModelPlan(facts, note=f"not a Gemma-family model (model_type {fam.model_type!r}); left alone", stack=stack)
    kv_breaks = use_cache_off_breaks(fam, stack) if stack is not None else \
        (Exposure.UNKNOWN if kv_shared_layers(fam) else Exposure.SAFE)
    if kv_breaks is not Exposure.SAFE:
        # Writing use_cache: false here would switch off Gemma 4's KV sharing on 5.5.0-5.5.1 (GD107): refuse, whatever
        # other family knowledge may one day say about its cache.
        tf = stack.get("transformers").describe() if stack is not None else "transformers"
        return ModelPlan(facts, note=f"{kv_shared_layers(fam)} layers share K/V, which {tf} skips without a cache "
                                     f"({GEMMA4_KV_SHARE_NO_CACHE.describe()}, GD107): use_cache is never written false "
                                     "for it; nothing to fix on disk", stack=stack)
    if not fam.builds_hybrid_cache:
        return ModelPlan(facts, note=f"its {fam.text_model_type} text model builds no HybridCache; nothing to fix", stack=stack)
    if stack is not None and stack.exposure(HYBRIDCACHE) is Exposure.SAFE:
        tf = stack.get("transformers").describe()
        return ModelPlan(facts, note=f"{tf} has no HybridCache crash, so use_cache stays as published; nothing to fix "
                                     f"(to prepare it for a machine with 4.50.x: --with transformers==4.50.3)", stack=stack)
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
    return ModelPlan(facts, tuple(changes), tuple(refused), stack=stack)


def _current(snap: Any, path: Path) -> fsafe.Current:
    """A file of ``snap`` as it is now, in one consistent look (links inside the repo followed for its bytes)."""
    try:
        return fsafe.current(path, undo.area(snap), MAX_JSON_BYTES)
    except (fsafe.Refused, OSError, ValueError) as e:
        return fsafe.Current(True, kind="special", why=str(e))


def _unchanged(snap: Any, change: FileChange) -> bool:
    """True when the file is still exactly what the plan was made from."""
    now = _current(snap, change.path)
    return now.data == change.before and now.link_target == change.link_target


def needs_tidy(snapshot: Any) -> bool:
    """True when a killed or failed run left temp files or unreferenced backups behind (cheap: listings, no lock)."""
    return undo.needs_sweep(snapshot)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def apply_plan(plan: ModelPlan, lock_timeout: float = undo.DEFAULT_LOCK_TIMEOUT) -> list[FileChange]:
    """Write the plan: originals recorded first, then each file atomically replaced. Returns what changed.

    Under the lock the files are compared with what the plan was made from; when another process (a
    concurrent `fix`, a `restore`) changed them meanwhile, the plan is made again from the files as they
    are now, so concurrent runs converge on the state one run gives. A write that fails is rolled back.
    """
    snap = plan.facts.snapshot
    if snap.problem is not None:
        raise WriteError(snap.problem.message)
    with undo.locked(snap, lock_timeout) as held:
        try:
            return _apply_locked(plan, snap)
        finally:
            # A run that leaves no entry (nothing to write, or all rolled back) leaves no state folder either.
            with contextlib.suppress(ReadError, WriteError):
                if not undo.load(snap):
                    undo.tidy(snap, held)


def _apply_locked(plan: ModelPlan, snap: Any) -> list[FileChange]:
    try:
        entries = undo.load(snap)
    except ReadError as e:
        raise WriteError(f"{e}; refusing to write without a way to undo") from None
    undo.sweep(snap, entries)
    if plan.changes and not all(_unchanged(snap, c) for c in plan.changes):
        plan = plan_model(read_model(snap), plan.stack)
        if plan.refused:
            raise WriteError(f"a file changed while gemma-doctor was planning and cannot be fixed safely now: "
                             f"{'; '.join(plan.refused)}")
    where = undo.area(snap)
    for change in plan.changes:
        if change.name not in undo.WRITABLE or change.path != snap.path / change.name:
            raise WriteError(f"{change.path}: gemma-doctor only ever writes {' and '.join(undo.WRITABLE)}")
        # Root passes any permission check, so this only bites for ordinary users: their read-only
        # file is a "do not touch", not an invitation to replace it. (A link is replaced, its blob untouched.)
        if change.link_target is None and not fsafe.writable(change.path, where):
            raise WriteError(f"{change.path} is read-only; not rewritten (make it writable to fix it)")
    before_entries = copy.deepcopy(entries)
    written: list[FileChange] = []
    try:
        _write_changes(plan, entries, written)
    except WriteError as e:
        kept = _roll_back(snap, written, before_entries, entries)
        if kept:
            raise WriteError(f"{e}; {', '.join(kept)} could not be put back and stay fixed "
                             f"(recorded: restore undoes them)") from None
        if written:
            raise WriteError(f"{e}; what was written before it ({', '.join(c.name for c in written)}) was put back") from None
        raise
    return written


def _write_changes(plan: ModelPlan, entries: dict[str, dict[str, Any]], written: list[FileChange]) -> None:
    """Record each original, then replace the file; ``written`` grows as files are replaced."""
    snap = plan.facts.snapshot
    where = undo.area(snap)
    for change in plan.changes:
        link_target = change.link_target
        key = undo.entry_key(snap, change.name)
        after_digest = undo.sha256(change.after)
        entry = entries.get(key)
        # A second fix of a file the user edited after the first: the edit is the original restore must bring back.
        if entry is None or entry.get("fixed_sha256") != undo.sha256(change.before) or link_target is not None:
            # The file as it is now (read under the lock, in one look) is the original that restore must bring back.
            mode = _current(snap, change.path).mode & 0o777
            entry = {
                "kind": "link" if link_target is not None else "file",
                "link_target": link_target,
                "original_sha256": undo.save_backup(snap, change.before, mode),
                "mode": mode,
            }
        entry = {**entry, "fixed_sha256": after_digest, "keys": list(change.keys), "fixed_at": _now()}
        entries[key] = entry
        undo.save(snap, entries)
        fsafe.write_file(change.path, change.after, int(entry["mode"]), area=where)
        written.append(change)


def _roll_back(snap: Any, written: list[FileChange], before: dict[str, dict[str, Any]],
               entries: dict[str, dict[str, Any]]) -> list[str]:
    """Best effort after a failed write (disk full...): put back what this run replaced, then its record.

    A file that cannot be put back keeps its new entry, so the record still covers it: never worse than
    a kill at the same moment. Returns the names that stay fixed.
    """
    keep = copy.deepcopy(before)
    where = undo.area(snap)
    stuck: list[str] = []
    for change in reversed(written):
        key = undo.entry_key(snap, change.name)
        try:
            if change.link_target is not None:
                fsafe.write_link(change.path, change.link_target, area=where)
            else:
                fsafe.write_file(change.path, change.before, int(entries[key].get("mode", 0o644)), area=where)
        except WriteError:
            keep[key] = entries[key]
            stuck.append(change.name)
    with contextlib.suppress(WriteError):
        undo.save(snap, keep)
        undo.sweep(snap, keep)
    return stuck


@dataclass(frozen=True)
class RestoreAction:
    """One file to put back (or a stale entry to drop); ``force`` keeps the user's edited version aside first."""

    name: str
    path: Path
    entry: dict[str, Any]
    drop_only: bool
    force: bool = False


@dataclass
class RestoreResult:
    """What one restore did: files put back, user versions kept aside (name -> where), files left as they are."""

    restored: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)
    conflicts: list[str] = field(default_factory=list)


def plan_restore(facts: ModelFacts, force: bool = False) -> tuple[list[RestoreAction], list[str]]:
    """Which files restore will put back, and which it must leave alone (with why)."""
    actions: list[RestoreAction] = []
    conflicts: list[str] = []
    for name, entry in sorted(facts.undo.entries.items()):
        action = _classify(facts.snapshot, name, entry, force)
        if isinstance(action, RestoreAction):
            actions.append(action)
        else:
            conflicts.append(action)
    return actions, conflicts


def _classify(snap: Any, name: str, entry: dict[str, Any], force: bool = False) -> RestoreAction | str:
    """What restore does to one recorded file as it is now: put it back, drop a stale entry, or a conflict."""
    path = snap.path / name
    now = _current(snap, path)
    original_is_link = entry.get("kind") == "link"
    if original_is_link and now.link_target == entry.get("link_target"):
        # Already the original link (a fix killed before it replaced the file, or a restore before it dropped the entry).
        return RestoreAction(name, path, entry, drop_only=True)
    plain = now.data is not None and now.link_target is None
    if plain and not original_is_link and undo.sha256(now.data) == entry.get("original_sha256"):  # type: ignore[arg-type]
        return RestoreAction(name, path, entry, drop_only=True)
    if plain and undo.sha256(now.data) == entry.get("fixed_sha256"):  # type: ignore[arg-type]
        return RestoreAction(name, path, entry, drop_only=False)
    backup = undo.backup_path(snap, str(entry.get("original_sha256")))
    if force and (now.kind in ("file", "link", "missing") and (now.kind != "file" or now.data is not None)):
        return RestoreAction(name, path, entry, drop_only=False, force=True)
    why = {"folder": "is now a folder", "special": "is now a pipe, socket or device, or unreadable"}.get(now.kind)
    if now.why:  # e.g. its folder was swapped for a link: say so rather than guess
        why = f"cannot be read now ({now.why})"
    if why:
        return f"{name} {why}; left as it is (its original is kept in {backup})"
    return (f"{name} changed since gemma-doctor fixed it; left as it is (its original is kept in {backup}; "
            f"to put the original back and keep your version aside: gemma-doctor restore "
            f"{command_args(snap)} --force)")


def apply_restore(facts: ModelFacts, actions: list[RestoreAction], lock_timeout: float = undo.DEFAULT_LOCK_TIMEOUT,
                  result: RestoreResult | None = None) -> list[str]:
    """Put originals back, byte-identical (links as links), then drop their entries. Returns names restored.

    Each file is judged again under the lock from the record and the file as they are now: a concurrent
    `fix` or `restore` may have acted since ``actions`` were planned; a file that changed meanwhile is left
    as it is (a conflict in ``result``). ``result`` fills in as files are put back, so a caller that gets a
    WriteError still knows what was done before it. When the record ends empty, the state folder goes too.
    """
    snap = facts.snapshot
    result = result if result is not None else RestoreResult()
    where = undo.area(snap)
    with undo.locked(snap, lock_timeout) as held:
        try:
            entries = undo.load(snap)
        except ReadError as e:
            raise WriteError(str(e)) from None
        undo.sweep(snap, entries)
        for planned in actions:
            key = undo.entry_key(snap, planned.name)
            entry = entries.get(key)
            if entry is None:
                continue  # another process restored it meanwhile
            action = _classify(snap, planned.name, entry, planned.force)
            if not isinstance(action, RestoreAction):
                result.conflicts.append(action)
                continue
            if not action.drop_only:
                if action.force:
                    now = _current(snap, action.path)
                    if now.kind == "file" and now.data is not None:
                        # Keep first, then replace: a kill in between leaves the edit in two places, never in none.
                        result.kept[action.name] = str(undo.keep(snap, action.name, now.data, now.mode))
                    elif now.kind == "link":
                        result.kept[action.name] = f"a link to {now.link_target} (nothing to keep: links hold no data)"
                if entry.get("kind") == "link":
                    target = str(entry.get("link_target"))
                    if snap.in_cache and not fsafe.link_stays_inside(action.path, target, where.root):
                        raise WriteError(f"{action.path}: the recorded link target {target} leads outside the repo folder; "
                                         f"refusing to restore it (the undo record may have been tampered with)")
                    if not fsafe.leads_to_file(action.path, target, where):
                        raise WriteError(f"{action.path}: its original link target {target} is gone from the cache; "
                                         f"the original bytes are in {undo.backup_path(snap, str(entry.get('original_sha256')))}")
                    fsafe.write_link(action.path, target, area=where)
                else:
                    original = undo.read_backup(snap, str(entry.get("original_sha256")))
                    fsafe.write_file(action.path, original, int(entry.get("mode", 0o644)), area=where)
                result.restored.append(action.name)
            del entries[key]
            undo.save(snap, entries)
            _drop_unreferenced_backup(snap, entries, str(entry.get("original_sha256")))
        if not entries:
            undo.tidy(snap, held)
    return result.restored


def _drop_unreferenced_backup(snap: Any, entries: dict[str, dict[str, Any]], digest: str) -> None:
    if any(e.get("original_sha256") == digest for e in entries.values()):
        return
    with contextlib.suppress(WriteError):
        fsafe.remove(undo.backup_path(snap, digest), undo.area(snap))  # a leftover backup costs a few KiB, loses nothing


def restore_model(facts: ModelFacts, dry_run: bool = False, force: bool = False,
                  lock_timeout: float = undo.DEFAULT_LOCK_TIMEOUT) -> tuple[Outcome, bool, bool]:
    """`restore` of one snapshot: (outcome whose messages say what was done to each file, conflicted, failed).

    Messages come from what the run did, not from its plan: a lock timeout or a failed write says so and lists
    only the files that were really put back before it.
    """
    if facts.snapshot.problem is not None:
        return Outcome(facts, Status.REFUSED, [], [facts.snapshot.problem.message]), True, False
    actions, conflicts = plan_restore(facts, force)
    messages = list(conflicts)
    conflicted = bool(conflicts)
    if facts.undo.error:
        messages.append(f"undo record unreadable: {facts.undo.error}")
        conflicted = True
    to_restore = [a for a in actions if not a.drop_only]
    if dry_run:
        for a in to_restore:
            aside = " (your edited version would be kept aside)" if a.force else ""
            messages.append(f"would restore {a.name}{aside}")
        status = Status.WOULD_CHANGE if to_restore else (Status.REFUSED if conflicted else Status.NOTHING_TO_RESTORE)
        return Outcome(facts, status, [], messages), conflicted, False
    result = RestoreResult()
    failed = False
    error: str | None = None
    if actions:
        try:
            apply_restore(facts, actions, lock_timeout, result)
        except WriteError as e:
            failed, error = True, str(e)
    for name in result.restored:
        where = result.kept.get(name)
        if where is None:
            messages.append(f"restored {name}")
        elif where.startswith("a link to "):
            messages.append(f"restored {name}; it was {where}")
        else:
            messages.append(f"restored {name}; your edited version is kept in {where}")
    messages.extend(result.conflicts)
    conflicted |= bool(result.conflicts)
    if error is not None:
        messages.append(error if result.restored or "nothing restored" in error else f"{error}; nothing was restored")
        status = Status.FAILED
    elif result.restored:
        status = Status.RESTORED
    else:
        status = Status.REFUSED if conflicted else Status.NOTHING_TO_RESTORE
    return Outcome(facts, status, [], messages), conflicted, failed

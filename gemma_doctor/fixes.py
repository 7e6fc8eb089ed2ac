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
from gemma_doctor.stack import Exposure, Stack
from gemma_doctor.traits import (architecture, config_ties, head_saved_apart, kv_shared_layers, language_model_keys,
                                 text_use_cache, use_cache_off_breaks)
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
    also: tuple[str, ...] = ()  # further notes, one message each (the tie flag's beside use_cache's)

    @property
    def messages(self) -> list[str]:
        """What to tell the user besides the diffs: refusals, then notes."""
        return [*self.refused, *([self.note] if self.note else []), *self.also]

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
    """The edits `fix` makes to one snapshot's small files. Pure.

    use_cache: false where the text model (and generate()) would otherwise crash for want of it, only where the
    HybridCache crash can happen with the transformers that will run (``stack``; None = any): on a release without
    the bug, use_cache on disk is left as published. tie_word_embeddings: false where the safetensors save a trained
    lm_head apart from embed_tokens under a tied config (GD750), once ``facts.head_differs`` (weigh_head) says the two
    differ; whatever the stack, since every loader of the folder reads the flag.
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
    config_paths: list[tuple[str, ...]] = []
    refused: list[str] = []
    gen_change: FileChange | None = None
    cache_note = _use_cache_note(facts, stack)
    if cache_note is None:
        if fam.nested and cfg.data.get("text_config") is not None and not isinstance(cfg.data.get("text_config"), dict):
            refused.append("config.json: text_config is not an object; not rewritten")
        elif text_use_cache(cfg.data, fam.nested) is not False:
            config_paths.append(("text_config", "use_cache") if fam.nested else ("use_cache",))
        gen = facts.generation_config
        if gen.exists and not gen.ok:
            refused.append(f"generation_config.json: {gen.error}; not rewritten")
        elif gen.ok and gen.data.get("use_cache") is not False:
            try:
                gen_change = FileChange("generation_config.json", gen.path, ("use_cache",), gen.raw,  # type: ignore[arg-type]
                                        _edit(gen, ("use_cache",)), gen.link_target)
            except EditError as e:
                refused.append(f"generation_config.json: cannot edit safely ({e}); not rewritten")
    untie, tie_note = _untie(facts)
    if untie is None:
        if tie_note not in refused:  # a text_config that is no object is said once, not once per key
            refused.append(str(tie_note))
        tie_note = None
    else:
        config_paths.extend(untie)
    values: dict[tuple[str, ...], Any] = {}
    arch_note = None
    if _architecture_disagrees(facts):  # GD775: the class the weights belong to
        config_paths.append(ARCH_KEY)
        values[ARCH_KEY] = [ARCH_FIX]
        arch_note = (f"config.json names Gemma3ForCausalLM but the weights keep {ARCH_FIX}'s language_model.* keys "
                     f"(GD775): `gemma-doctor fix` sets architectures to [\"{ARCH_FIX}\"], which vLLM and transformers "
                     "load whole")
    changes: list[FileChange] = []
    if config_paths:
        text = cfg.raw.decode("utf-8")  # type: ignore[union-attr]
        try:
            for path in config_paths:  # one file, one change: every key set in turn on the same text
                text = set_member(text, path, values.get(path, False))
            changes.append(FileChange("config.json", cfg.path, tuple(".".join(p) for p in config_paths), cfg.raw,  # type: ignore[arg-type]
                                      text.encode("utf-8"), cfg.link_target))
        except EditError as e:
            refused.insert(0, f"config.json: cannot edit safely ({e}); not rewritten")
    if gen_change is not None:
        changes.append(gen_change)
    # A use_cache note says "nothing to fix": beside a tie change it would read as a contradiction.
    notes = [n for n in (None if (untie or arch_note) else cache_note, tie_note, arch_note) if n]
    return ModelPlan(facts, tuple(changes), tuple(refused), notes[0] if notes else None, stack=stack,
                     also=tuple(notes[1:]))


def _use_cache_note(facts: ModelFacts, stack: Stack | None) -> str | None:
    """Why use_cache is left as it is on disk for this Gemma model (None: it is fixed where needed)."""
    fam = facts.family
    kv_breaks = use_cache_off_breaks(fam, stack) if stack is not None else \
        (Exposure.UNKNOWN if kv_shared_layers(fam) else Exposure.SAFE)
    if kv_breaks is not Exposure.SAFE:
        # Writing use_cache: false here would switch off Gemma 4's KV sharing on 5.5.0-5.5.1 (GD107): refuse, whatever
        # other family knowledge may one day say about its cache.
        tf = stack.get("transformers").describe() if stack is not None else "transformers"
        return (f"{kv_shared_layers(fam)} layers share K/V, which {tf} skips without a cache "
                f"({GEMMA4_KV_SHARE_NO_CACHE.describe()}, GD107): use_cache is never written false for it; nothing to "
                "fix on disk")
    if not fam.builds_hybrid_cache:
        return f"its {fam.text_model_type} text model builds no HybridCache; nothing to fix"
    if stack is not None and stack.exposure(HYBRIDCACHE) is Exposure.SAFE:
        tf = stack.get("transformers").describe()
        return (f"{tf} has no HybridCache crash, so use_cache stays as published; nothing to fix "
                f"(to prepare it for a machine with 4.50.x: --with transformers==4.50.3)")
    return None


# Where transformers reads the tie flag. Flat configs (Gemma3ForCausalLM, Gemma 2...): the top level. A multimodal
# config: its top level for Gemma3ForConditionalGeneration on 5.x (modeling_utils.get_expanded_tied_weights_keys reads
# self.config.tie_word_embeddings, Gemma3Config declares its own), text_config for it on 4.x
# (tie_embeddings_and_encoder_decoder reads config.get_text_config(decoder=True)) and for Gemma3ForCausalLM loaded
# from the folder (its config is the text_config) on both: `fix` writes both levels (docs/after-training.md).
TIE_KEY = "tie_word_embeddings"


def _untie(facts: ModelFacts) -> tuple[list[tuple[str, ...]] | None, str | None]:
    """(config.json paths to set false, a note) for GD750's cure; (None, why) when it must be refused.

    Only a head known to differ from the embedding is untied: one equal to it value for value loses nothing when
    tied again (and untying it would double its memory and let training pull the pair apart); one that could not be
    compared (a dtype the comparison does not read, an unreadable shard) is refused, not guessed at.
    """
    apart = head_saved_apart(facts)
    if apart is None:
        return [], None
    head, embed, _ = apart
    cmp = facts.head_differs
    if cmp is not None and cmp.identical:
        return [], (f"{head} equals {embed} value for value, so tying them again at load loses nothing: config.json "
                    "stays tied (the duplicate tensor stays too: fix never rewrites a safetensors file)")
    if cmp is None:
        return [], (f"{head} is saved apart from {embed} under a tied config.json (GD750): `gemma-doctor fix` unties "
                    "it once it has compared the two tensors, which were not read here")
    if cmp.identical is None:
        # Writing the flag on a guess would change which weights the model computes with: refused, said how to do it.
        return None, (f"{head} is saved apart from {embed} under a tied config.json (GD750), but the two could not "
                      f"be compared ({cmp.error or 'unreadable'}): config.json is not rewritten; if the head was "
                      f"trained, set \"{TIE_KEY}\": false in it by hand")
    data = facts.config.data
    paths: list[tuple[str, ...]] = []
    if data.get(TIE_KEY) is not False:
        paths.append((TIE_KEY,))
    if facts.family.text_path:
        node: Any = data
        for k in facts.family.text_path:
            node = node.get(k) if isinstance(node, dict) else None
        if not isinstance(node, dict):  # absent too: transformers 4.x would build a tied text config by default
            return None, f"config.json: {'.'.join(facts.family.text_path)} is not an object; not rewritten"
        if node.get(TIE_KEY) is not False:
            paths.append((*facts.family.text_path, TIE_KEY))
    return paths, None


ARCH_KEY = ("architectures",)
ARCH_FIX = "Gemma3ForConditionalGeneration"


def _architecture_disagrees(facts: ModelFacts) -> bool:
    """GD775's case that a config edit cures: a Gemma 3 multimodal config (model_type gemma3 with a vision_config)
    whose architectures name Gemma3ForCausalLM while the weights keep the multimodal class's language_model.* keys."""
    data = facts.config.data
    return (isinstance(data, dict) and data.get("model_type") == "gemma3" and isinstance(data.get("vision_config"), dict)
            and architecture(data, None) == "Gemma3ForCausalLM" and bool(language_model_keys(facts)))


def _needs_headers(facts: ModelFacts) -> bool:
    """The config ties the head (GD750's cure compares it) or names Gemma3ForCausalLM (GD775's reads the keys)."""
    data = facts.config.data
    archs = data.get("architectures") if isinstance(data, dict) else None
    return config_ties(facts)[0] or (isinstance(archs, list) and archs[:1] == ["Gemma3ForCausalLM"])


def weigh_head(facts: ModelFacts) -> ModelFacts:
    """The facts GD750's cure needs: the safetensors headers, and where they save lm_head.weight apart from
    embed_tokens.weight under a tied config, the two compared value by value (bounded chunks). Other models: as is."""
    if (facts.snapshot.problem is not None or facts.adapter is not None or not facts.config.ok
            or not facts.family.is_gemma or not _needs_headers(facts)):
        return facts  # nothing tied to untie, no class to correct: no header is read
    if facts.census is None:
        from gemma_doctor.model import source_of
        from gemma_doctor.readers import dtypes

        source = facts.source if facts.source is not None else source_of(facts.snapshot)
        if source.kind == "hub":
            return facts
        facts = facts.with_(census=dtypes.census(source, facts.config.data))
    if facts.head_differs is None and head_saved_apart(facts) is not None:
        from gemma_doctor.readers.adapter import compare_head

        facts = facts.with_(head_differs=compare_head(facts.census.headers))  # type: ignore[union-attr]
    return facts


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
        # The weights are never written by fix: the head verdict made before the lock stands.
        again = read_model(snap).with_(census=plan.facts.census, head_differs=plan.facts.head_differs)
        plan = plan_model(again, plan.stack)
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
            now = _current(snap, change.path)
            mode = now.mode & 0o777
            entry = {
                "kind": "link" if link_target is not None else "file",
                "link_target": link_target,
                "original_sha256": undo.save_backup(snap, change.before, mode),
                "mode": mode,
                "mtime_ns": now.mtime_ns,  # restore brings it back too (issue 33)
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
                fsafe.write_link(change.path, change.link_target, area=where, mtime_ns=undo.mtime_of(entries[key]))
            else:
                fsafe.write_file(change.path, change.before, int(entries[key].get("mode", 0o644)), area=where,
                                 mtime_ns=undo.mtime_of(entries[key]))
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
                    fsafe.write_link(action.path, target, area=where, mtime_ns=undo.mtime_of(entry))
                else:
                    original = undo.read_backup(snap, str(entry.get("original_sha256")))
                    fsafe.write_file(action.path, original, int(entry.get("mode", 0o644)), area=where,
                                     mtime_ns=undo.mtime_of(entry))
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

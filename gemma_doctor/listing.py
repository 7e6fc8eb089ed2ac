"""`gemma-doctor list`: every cached Gemma-family model with family, revision, size, declared dtype and status.

Rows come from the same read -> rules path as `check` (status) and `fix` (whether a fix would change
anything); filtering and sorting follow `hf cache ls` (--filter 'size>1GB', --sort size:desc, --limit).
"""

from __future__ import annotations

import enum
import fnmatch
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from gemma_doctor import locate, pipeline
from gemma_doctor.codes import CODES, Code, Cure
from gemma_doctor.errors import UsageError
from gemma_doctor.facts import CheckOptions
from gemma_doctor.fixes import Status, plan_model
from gemma_doctor.model import source_of
from gemma_doctor.rules.use_cache import fix_command

if TYPE_CHECKING:
    from gemma_doctor.memo import Memo


class ListFormat(str, enum.Enum):
    """--format choices of `list`: text table, JSON, or ids only (like `hf cache ls -q`)."""

    TEXT = "text"
    JSON = "json"
    QUIET = "quiet"


class RowStatus(str, enum.Enum):
    """The verdict of one snapshot, from check's findings and fix's plan."""

    OK = "ok"
    NEEDS_FIX = "needs-fix"
    FIXED = "fixed"
    BROKEN = "broken"
    ERROR = "error"


@dataclass(frozen=True)
class Row:
    """One cached snapshot of a Gemma-family model."""

    repo_id: str | None
    revision: str | None
    commit: str | None
    path: str
    family: str | None
    dtype: str | None
    size: int
    status: RowStatus
    findings: dict[str, int]
    next_command: str | None
    # `gemma-doctor check` of this snapshot as this listing read it (--cache-dir, --revision, --with kept): "see why";
    # made for the rows a hint names (needs-fix, error), None for the others.
    check_command: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON view of a row (list --format json)."""
        return {"repo_id": self.repo_id, "revision": self.revision, "commit": self.commit, "path": self.path,
                "family": self.family, "dtype": self.dtype, "size": self.size, "status": self.status.value,
                "findings": dict(self.findings), "next_command": self.next_command}


def snapshot_size(folder: Path) -> int:
    """Bytes of a snapshot's files, each blob counted once (links to the same blob share it: a file is known by its
    device and inode, which the one stat of each entry gives, instead of resolving every link's path component by
    component). Links to folders are not followed, as os.walk follows none."""
    seen: set[tuple[int, int]] = set()
    total = 0
    todo = [os.fspath(folder)]
    while todo:
        try:
            entries = list(os.scandir(todo.pop()))
        except OSError:  # an unreadable folder holds no bytes we can count
            continue
        for entry in entries:
            try:
                is_dir = entry.is_dir()
            except OSError:
                is_dir = False
            if is_dir:
                if not entry.is_symlink():
                    todo.append(entry.path)
                continue
            try:
                st = entry.stat()
            except OSError:  # a dangling link holds no bytes
                continue
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def declared_dtype(config: Any) -> str | None:
    """torch_dtype / dtype from config.json (top level, else text_config), as written."""
    if not isinstance(config, dict):
        return None
    for scope in (config, config.get("text_config")):
        if isinstance(scope, dict):
            for key in ("torch_dtype", "dtype"):
                if isinstance(scope.get(key), str):
                    return scope[key]
    return None


def _has(codes: set[str], trait: Callable[[Code], bool]) -> bool:
    return any(trait(CODES[c]) for c in codes if c in CODES)


def status_of(codes: set[str], fixed_before: bool, would_change: bool) -> RowStatus:
    """Pure verdict, from what each code is (codes.py): unreadable -> error; a download to redo -> broken; a pending
    `fix` -> needs-fix; fixed earlier -> fixed; else ok."""
    if _has(codes, lambda c: c.unreadable):
        return RowStatus.ERROR
    if _has(codes, lambda c: c.cure is Cure.REDOWNLOAD):
        return RowStatus.BROKEN
    if would_change or _has(codes, lambda c: c.cure is Cure.FIX):
        return RowStatus.NEEDS_FIX
    if fixed_before:
        return RowStatus.FIXED
    return RowStatus.OK


def collect(cache: Path, revision: str = "main", all_revisions: bool = False,
            options: CheckOptions | None = None) -> tuple[list[Row], int]:
    """Rows for every Gemma-family snapshot in ``cache`` and the number of other repos skipped (the repos spread over
    processes as check's whole-cache scan spreads them: pipeline.scan_start and scan_runs)."""
    options = options or CheckOptions()
    env, names = pipeline.scan_start(cache, revision, options)
    from gemma_doctor.memo import Memo

    remembered = Memo(env, options)  # the scan's: forked workers each take it as the lead repos left it

    def run(part: Sequence[str]) -> tuple[list[Row], int]:
        snaps = list(locate.snapshots_in(cache, part, revision, all_revisions))
        rows, skipped = [], 0
        # One repo read, judged and let go at a time: a scan holds one repo's files, whatever the cache holds.
        for facts, _why in pipeline.select_each(((s, source_of(s)) for s in snaps), explicit=False):
            if facts is None:
                skipped += 1
            else:
                rows.append(_row(facts, options, env, remembered if len(snaps) > 1 else None))
        return rows, skipped

    runs = pipeline.scan_runs(run, names)
    return [row for rows, _ in runs for row in rows], sum(n for _, n in runs)


def _row(facts: Any, options: CheckOptions, env: Any, remembered: Memo | None) -> Row:
    """One snapshot's row: check's findings (pipeline.model_report's own, without the JSON blocks a row does not
    show) and fix's plan. A row shows no prescription: judged as check's text view judges (``prescription=False``: no
    way out, prescribed Run, YAML or framework snippets made; no search where check's run is the user's own), whose
    findings are the same."""
    j = pipeline.judged(facts, options, env, remembered, prescription=False)
    facts, findings = j.facts, j.findings
    counts = {"error": 0, "warning": 0, "info": 0}
    for f in findings:
        counts[f.severity.value] += 1
    would_change = plan_model(facts, env.libraries).status is Status.WOULD_CHANGE
    status = status_of({f.code for f in findings}, bool(facts.undo.entries), would_change)
    snap = facts.snapshot
    # "see why with" is named for a row that needs a fix or cannot be read (the only rows a hint or next step names)
    check = f"gemma-doctor check {locate.command_args(snap)}" + "".join(f" {shlex.quote(a)}" for a in env.libraries.cli_args) \
        if status in (RowStatus.NEEDS_FIX, RowStatus.ERROR) else None
    nxt = fix_command(facts, env.libraries) if status is RowStatus.NEEDS_FIX else (
        locate.redownload_command(snap, [f.file for f in findings
                                         if f.code in CODES and CODES[f.code].cure is Cure.REDOWNLOAD])
        if status is RowStatus.BROKEN else check if status is RowStatus.ERROR else None)
    return Row(snap.repo_id, snap.revision, snap.commit, str(snap.path), facts.family.label,
               declared_dtype(facts.config.data if facts.config.ok else None),
               snapshot_size(snap.path) if snap.problem is None else 0,  # a problem repo is not walked
               status, counts, nxt, check)


# --- filters and sorting, as `hf cache ls` spells them -------------------------------------------

_FILTER = re.compile(r"^\s*(\w+)\s*(>=|<=|!=|=|>|<)\s*(.*?)\s*$")
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMGT]?i?B?)$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 10**3, "KB": 10**3, "M": 10**6, "MB": 10**6, "G": 10**9, "GB": 10**9, "T": 10**12, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
FILTER_KEYS = ("name", "revision", "family", "dtype", "status", "size")
SORT_KEYS = ("name", "size", "family", "status")


def parse_size(text: str) -> int:
    """'1GB' -> 10**9, '512MiB' -> 512 * 2**20 (decimal units, as hf prints sizes)."""
    m = _SIZE.match(text.strip())
    unit = m.group(2).upper() if m else None
    if m is None or unit not in _UNITS:
        raise UsageError(f"--filter: {text!r} is not a size (use 500MB, 1.5GB, 2GiB)")
    return int(float(m.group(1)) * _UNITS[unit])


def parse_filter(text: str) -> Callable[[Row], bool]:
    """One --filter expression (key op value) -> a predicate; name/revision/family/dtype/status take = and != with globs."""
    m = _FILTER.match(text)
    if m is None or m.group(1).lower() not in FILTER_KEYS:
        raise UsageError(f"--filter {text!r}: use KEY=VALUE or size>1GB, with KEY one of {', '.join(FILTER_KEYS)}")
    key, op, value = m.group(1).lower(), m.group(2), m.group(3)
    if key == "size":
        limit = parse_size(value)
        ops = {">": int.__gt__, "<": int.__lt__, ">=": int.__ge__, "<=": int.__le__, "=": int.__eq__, "!=": int.__ne__}
        return lambda row: ops[op](row.size, limit)
    if op not in ("=", "!="):
        raise UsageError(f"--filter {text!r}: {key} takes = or != (sizes take > < >= <=)")
    if key == "status":
        allowed = [s.value for s in RowStatus]
        if value.replace(" ", "-") not in allowed and not any(ch in value for ch in "*?["):
            raise UsageError(f"--filter {text!r}: status is one of {', '.join(allowed)}")
        value = value.replace(" ", "-")

    def field(row: Row) -> str:
        got = {"name": row.repo_id or row.path, "revision": row.revision or "", "family": row.family or "",
               "dtype": row.dtype or "", "status": row.status.value}[key]
        return got.lower()

    want = value.lower()
    return (lambda row: fnmatch.fnmatchcase(field(row), want)) if op == "=" else (
        lambda row: not fnmatch.fnmatchcase(field(row), want))


def select_rows(rows: list[Row], filters: list[str], sort: str | None, limit: int | None) -> list[Row]:
    """Filter (all must hold), sort (name asc by default; size desc), then keep the first ``limit``."""
    preds = [parse_filter(f) for f in filters]
    out = [r for r in rows if all(p(r) for p in preds)]
    key, _, order = (sort or "name").partition(":")
    if key not in SORT_KEYS or order not in ("", "asc", "desc"):
        raise UsageError(f"--sort {sort!r}: use one of {', '.join(SORT_KEYS)}, optionally with :asc or :desc")
    desc = order == "desc" or (order == "" and key == "size")
    sort_key: dict[str, Callable[[Row], Any]] = {
        "name": lambda r: ((r.repo_id or r.path).lower(), r.revision or ""),
        "size": lambda r: r.size,
        "family": lambda r: (r.family or "", (r.repo_id or r.path).lower()),
        "status": lambda r: (list(RowStatus).index(r.status), (r.repo_id or r.path).lower()),
    }
    out.sort(key=sort_key[key], reverse=desc)
    return out[:limit] if limit is not None else out

"""A model's judgement (recommendation, memory plan, prescription and check's findings) shared across the models of one
scan whose name-free facts are equal: most of a shared cache is fine-tunes of a few bases (issue 32).

- **The judgement is free of names.** ``name_free`` gives the model's facts with every per-repo name (the snapshot's
  target, repo id, commit and folders; the source; each file's path under the folder; the config's blob link and its own
  ``_name_or_path``; each safetensors header's path, repo folder and file identity) replaced by a neutral reference to
  "this model": report.MODEL and report.MODEL_ID for the target and the repo id, which ``pipeline.named`` fills in with
  the model's own as it does for what the rules write, and the fixed paths below. Judged on those facts, a model's
  findings and decision hold references, never its names (docs/architecture.md lists where names enter).
- **An ordinary cache keyed by those facts.** The key is a digest of the name-free facts pickled (every field, compared
  or not, with its type: ``1``, ``1.0`` and ``True`` differ; dicts in their order); a header's tensors enter it by the
  digest of the bytes they were parsed from (readers/safetensors_header.py), a JSON file's parse by the text it is the
  parse of (``_file_key``). ``key_parts`` makes it from the facts' fields, without the name-free facts, which only a
  model whose key is new is judged on (``neutral_facts``). Equal keys are equal judged inputs, so one judgement serves
  every model of that key; the environment and options are the scan's own (fixed for it).
- **Shared only where that is exact by construction**, else the model is judged directly on its own facts: a snapshot
  read from a hub cache; name-free facts that hold none of its folder or commit names (a name left in them) and no
  place for a name (report's marks: named() would fill a value of the model's files); a judgement that reads nothing
  through the source (the neutral source refuses every read) and leaves no neutral path, commit, blob or
  ``_name_or_path`` in what it gives (looked for once per entry). ``GEMMA_DOCTOR_NO_MEMO=1``, or the scan's
  ``share=False`` (``pipeline.diagnose``), judges every model directly: the same output (tests/test_memo_props.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import operator
import os
import pickle
from pathlib import Path
from typing import Any, Callable, TypeVar

from gemma_doctor import frozen
from gemma_doctor.facts import ModelFacts
from gemma_doctor.locate import Snapshot
from gemma_doctor.readers.jsonfile import JsonFile
from gemma_doctor.readers.jsonfile import parsed_text as _parsed_text
from gemma_doctor.report import MODEL, MODEL_ID, PLACE
from gemma_doctor.source import LocalSource

T = TypeVar("T")

# "This model"'s folders and names, the same for every model judged name-free (none of them is ever shown: a result
# holding one is not shared).
REPO_DIR = Path("\u27e8repo\u27e9")
SNAPSHOT = REPO_DIR / "snapshots" / "\u27e8commit\u27e9"
COMMIT = "\u27e8commit\u27e9"
BLOB = "../../blobs/\u27e8blob\u27e9"
NAME = "\u27e8name-or-path\u27e9"
# What a shared result may not hold: a neutral name that nothing fills in, as it is or as JSON escapes it (in a YAML).
_NEUTRAL = tuple(t.encode() for s in ("\u27e8repo\u27e9", COMMIT, "\u27e8blob\u27e9", NAME)
                 for t in (s, json.dumps(s)[1:-1]))
MAX_ENTRIES = 1024
# A config.json larger than this is judged directly: its text is in the key's digest, and a megabyte's pickle and
# digest cost more than the judgement they would save (issue 33).
MAX_RAW = 1 << 20
_DIRECT = object()  # an entry whose judgement is not shared (it read the source, or left a neutral name)


class Unmemoisable(Exception):
    """The model is judged directly: its facts cannot be made name-free exactly, or the judgement read its source."""


def enabled() -> bool:
    """False when GEMMA_DOCTOR_NO_MEMO is set (the tests' switch: every model judged directly)."""
    return not os.environ.get("GEMMA_DOCTOR_NO_MEMO")


@dataclasses.dataclass(frozen=True)
class NeutralSource:
    """The source of name-free facts: its kind only; every read refuses (the model is then judged directly)."""

    kind: str

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)  # copy and pickle ask for optional protocols: not a read
        raise Unmemoisable(f"the judgement used the model's source ({name})")


def shareable(facts: Any) -> bool:
    """Whether a model may share a judgement: a snapshot of a hub cache, read from the cache, with a small config."""
    snap = facts.snapshot
    if (snap.problem is not None or snap.remote or snap.repo_dir is None or snap.repo_id is None or snap.commit is None
            or os.path.dirname(os.path.dirname(os.fspath(snap.path))) != os.fspath(snap.repo_dir)):
        return False
    if type(facts.source) is not LocalSource or facts.source.kind != "cache":
        return False
    return facts.config.raw is None or len(facts.config.raw) <= MAX_RAW


def _own_name(facts: Any) -> str | None:
    """The config's own ``_name_or_path`` (a name: the run or repo it was saved from), when it is a string."""
    cfg = facts.config
    name = cfg.data.get("_name_or_path") if cfg.ok and isinstance(cfg.data, dict) else None
    return name if isinstance(name, str) else None


def _neutral_raw(raw: bytes | None, name: str | None) -> bytes | None:
    """config.json's text with its own ``_name_or_path`` neutral where JSON wrote it once as it is (else left: the
    text, in the key, then keeps the model's name, and only a model of the same name shares its key)."""
    if raw is None or name is None:
        return raw
    old = json.dumps(name).encode()
    return raw.replace(old, json.dumps(NAME).encode()) if raw.count(old) == 1 else raw


def gate(facts: Any) -> bytes | None:
    """A cheap function of the name-free facts (the digest of config.json's name-free text): models whose gates differ
    cannot have equal keys, so a model whose gate is new is judged without making its key. A digest, not the text:
    the gates of a whole cache are kept, and must not grow with its configs' sizes."""
    raw = _neutral_raw(facts.config.raw, _own_name(facts))
    return None if raw is None else hashlib.sha256(raw).digest()


def _under(path: Path, snap: Snapshot) -> Path:
    """``path`` as the same file of "this model" (a file of the snapshot, or of its repo folder)."""
    folder, name = os.path.split(os.fspath(path))  # a file of the folder itself (every one a scan reads): no Path made
    if folder == os.fspath(snap.path):
        return SNAPSHOT / name
    try:
        return SNAPSHOT / path.relative_to(snap.path)
    except ValueError:
        pass
    try:
        return REPO_DIR / path.relative_to(snap.repo_dir)
    except ValueError:
        raise Unmemoisable("a file outside the model's folder") from None


def _neutral_config(facts: Any) -> tuple[bytes | None, Any]:
    """config.json's text and parse with the model's own ``_name_or_path`` neutral (NAME), or as read where the config
    names no name of the model's own."""
    cfg = facts.config
    name = _own_name(facts)
    if name is None:
        return cfg.raw, cfg.data
    data = dict(cfg.data)
    data["_name_or_path"] = NAME
    return _neutral_raw(cfg.raw, name), data


def _json_file(jf: Any, snap: Snapshot, raw: bytes | None = None, data: Any = None) -> Any:
    changes: dict[str, Any] = {"path": _under(jf.path, snap)}
    if jf.link_target is not None:
        changes["link_target"] = BLOB  # names the blob, a hash of the file's bytes (which hold the model's name)
    if raw is not None:
        changes["raw"], changes["data"] = raw, data
    return frozen.replace(jf, **changes)


# A JSON file's fields in the key, in their order; its parse stands there as this mark where the parse is a function of
# the text beside it (_file_key), never a value a parse gives (a dict, or None).
_FILE_FIELDS = tuple(f.name for f in dataclasses.fields(JsonFile))
_FILE_VALUES = operator.attrgetter(*_FILE_FIELDS)
_PATH, _LINK, _RAW, _DATA = (_FILE_FIELDS.index(k) for k in ("path", "link_target", "raw", "data"))
# The facts' fields in the key: all but the snapshot (its fields a judgement may read enter apart) and the source (its
# kind enters apart: the source names the folder).
_KEYED_FIELDS = tuple(f.name for f in dataclasses.fields(ModelFacts) if f.name not in ("snapshot", "source"))
_KEYED_VALUES = operator.attrgetter(*_KEYED_FIELDS)
_CONFIG, _GENERATION, _CENSUS = (_KEYED_FIELDS.index(k) for k in ("config", "generation_config", "census"))
_OF_TEXT = "\u27e8the parse of raw\u27e9"
_SNAPSHOT_TEXT = os.fspath(SNAPSHOT)


def _under_text(path: Path, snap: Snapshot) -> str:
    """_under(path, snap) as text (a file of the folder itself, every one a scan reads: no Path made)."""
    folder, name = os.path.split(os.fspath(path))
    if folder == os.fspath(snap.path):
        return os.path.join(_SNAPSHOT_TEXT, name)
    return os.fspath(_under(path, snap))


def _file_key(jf: Any, snap: Snapshot, raw: bytes | None, data: Any) -> tuple[Any, ...]:
    """A JSON file of the name-free facts (its path as "this model"'s, its blob link neutral, ``raw`` and ``data``
    its name-free text and parse) as the key holds it: every field in order, as pickling the file held them, but the
    parse, which is the mark _OF_TEXT where it is exactly the parse of ``raw`` (the reader parsed it from those bytes,
    or, with the config's own name made neutral, the parse of the neutral text is equal to it: the name was that
    key's value, so every other value was parsed from the same text) and the file's own text holds no escape (every
    name the parse holds is then written in the text as it is, where key_of looks for the model's names; the neutral
    name is the only escape the neutral text adds). Equal keys are then equal
    files, parse included; a walk of the parse is not pickled for every model."""
    values = list(_FILE_VALUES(jf))
    values[_PATH] = _under_text(jf.path, snap)
    if jf.link_target is not None:
        values[_LINK] = BLOB
    values[_RAW] = raw
    if (jf.parsed and raw is not None and jf.raw is not None and b"\\" not in jf.raw
            and (data is jf.data or data == _parsed_text(raw))):
        data = _OF_TEXT
    values[_DATA] = data
    return tuple(values)


def key_parts(facts: Any) -> tuple[Any, ...]:
    """The parts of the key of a model's name-free facts (key_of digests them), made without the name-free facts
    themselves, which only a model whose key is new is judged on (name_free): the snapshot's fields a judgement may
    read but its names, the source's kind, every other field of the facts in _KEYED_FIELDS' order (its JSON files by
    _file_key, the census without its headers) and the headers, each by the digest of its bytes. Raises Unmemoisable."""
    snap = facts.snapshot
    cfg = facts.config
    config = _file_key(cfg, snap, *_neutral_config(facts))
    gen = facts.generation_config
    keyed = list(_KEYED_VALUES(facts))
    keyed[_CONFIG] = config
    keyed[_GENERATION] = _file_key(gen, snap, gen.raw, gen.data)
    headers: tuple[Any, ...] = ()
    census = keyed[_CENSUS]
    if census is not None and census.headers:
        # A file's identity as its order of meeting: the same file met twice is still seen as one.
        idents: dict[Any, tuple[int, int]] = {}
        headers = tuple((_under_text(h.path, snap), h.exists, h.file_size, h.header_len, h.digest or h.tensors,
                         h.metadata, h.error, None if h.ident is None else idents.setdefault(h.ident, (-1, len(idents))),
                         None if h.root is None else REPO_DIR) for h in census.headers)
        keyed[_CENSUS] = frozen.replace(census, headers=())
    return (snap.revision, snap.cache_dir, snap.remote, snap.problem), facts.source.kind, tuple(keyed), headers


def name_free(facts: Any) -> tuple[Any, tuple[Any, ...]]:
    """(the facts without the model's names, the parts of its key: key_parts): see the module doc. Raises
    Unmemoisable."""
    return neutral_facts(facts), key_parts(facts)


def neutral_facts(facts: Any) -> Any:
    """The facts without the model's names, which a model whose key is new is judged on. Raises Unmemoisable."""
    snap = facts.snapshot
    neutral_snap = Snapshot(MODEL, SNAPSHOT, MODEL_ID, snap.revision, COMMIT, REPO_DIR, snap.cache_dir, snap.remote,
                            snap.problem)
    cfg = facts.config
    config = _json_file(cfg, snap, *_neutral_config(facts))
    changes: dict[str, Any] = {"snapshot": neutral_snap, "config": config,
                               "generation_config": _json_file(facts.generation_config, snap),
                               "source": NeutralSource(facts.source.kind)}
    census = facts.census
    if census is not None and census.headers:
        # A file's identity as its order of meeting: the same file met twice is still seen as one.
        idents: dict[Any, tuple[int, int]] = {}
        made = []
        for h in census.headers:
            ident = None if h.ident is None else idents.setdefault(h.ident, (-1, len(idents)))
            made.append(frozen.replace(h, path=_under(h.path, snap), ident=ident,
                                            root=None if h.root is None else REPO_DIR))
        changes["census"] = frozen.replace(census, headers=tuple(made))
    return facts.with_(**changes)


def key_of(parts: tuple[Any, ...], facts: Any) -> bytes:
    """The digest of a model's name-free facts; Unmemoisable when a name or a place for one is left in them."""
    try:
        blob = pickle.dumps(parts, protocol=5)
    except Exception as e:  # a fact that does not pickle: judged directly
        raise Unmemoisable(f"a fact that does not pickle ({type(e).__name__})") from None
    snap = facts.snapshot
    if snap.repo_dir.name.encode() in blob or snap.commit.encode() in blob:
        raise Unmemoisable("a per-repo name is left in the facts")
    if PLACE.encode() in blob:
        raise Unmemoisable("a place for a name is written in the model's files")
    return hashlib.sha256(blob).digest()


class Memo:
    """The judgements of one scan, under its one environment and options (both fixed for the scan, so neither is in a
    key): shared across its models whose name-free facts are equal. Made by the scan and dropped with it, never kept
    by the module; a whole-cache scan's forked workers each get the scan's memo as the lead repos left it."""

    def __init__(self, env: Any, options: Any, share: bool = True) -> None:
        self.env, self.options = env, options
        self.on = share and enabled()  # share=False: every model judged directly (the caller's switch, no state)
        self.gates: set[bytes | None] = set()  # the gates seen (gate()): a new one is judged without a key
        # key -> (the fields its judgement filled in, what else it gives) or _DIRECT (judged directly: module doc)
        self.entries: dict[bytes, Any] = {}
        self.judgements = 0  # judgements made name-free (each shared by every later model of its key)
        self.served = 0  # models served a judgement made for another

    def judged(self, facts: T, judge: Callable[[T], tuple[T, Any]]) -> tuple[T, Any]:
        """``judge(facts)`` -> (facts judged, what else the judgement gives: the decision and check's findings), shared
        across models whose name-free facts are equal."""
        if not self.on or not shareable(facts):
            return judge(facts)
        g = gate(facts)
        if g not in self.gates:
            if len(self.gates) >= 65536:
                self.gates.clear()
            self.gates.add(g)
            return judge(facts)  # the first model of a config text: most caches of unalike models stop here
        try:
            key = key_of(key_parts(facts), facts)
        except Unmemoisable:
            return judge(facts)
        hit = self.entries.get(key)
        if hit is _DIRECT:
            return judge(facts)
        if hit is None:
            if len(self.entries) >= MAX_ENTRIES:
                self.entries.clear()
            # Only a new key's model is made name-free and judged so; the rest are served by their key alone.
            hit = self.entries[key] = self._entry(neutral_facts(facts), judge)
            if hit is _DIRECT:
                return judge(facts)
        else:
            self.served += 1
        # The fields the judgement filled in (the recommendation, the memory plan) are the shared ones, found once per
        # entry; the others are the model's own facts as read.
        made, beside = hit
        return facts.with_(**made), beside

    def _entry(self, neutral: Any, judge: Callable[[Any], tuple[Any, Any]]) -> Any:
        """The judgement of name-free facts as (the fields it filled in, what else it gives), or _DIRECT when it read
        the source or left a neutral name in its result."""
        try:
            out, beside = judge(neutral)
        except Unmemoisable:
            return _DIRECT
        made = {f.name: getattr(out, f.name) for f in dataclasses.fields(out)
                if getattr(out, f.name) is not getattr(neutral, f.name)}
        try:
            blob = pickle.dumps((made, beside), protocol=5)
        except Exception:
            return _DIRECT
        if any(n in blob for n in _NEUTRAL):
            return _DIRECT
        self.judgements += 1
        return made, beside

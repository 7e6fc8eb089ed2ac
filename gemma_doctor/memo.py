"""A model's judgement (recommendation, memory plan, prescription and check's findings) remembered across the models of
one run whose facts are equal but for their names: most of a shared cache is fine-tunes of a few bases.

How it stays exact, by construction rather than by a list of the facts that matter:

- The facts are *renamed*: every per-repo name in them (the repo id, its cache folder, the snapshot's commit, the
  config's own ``_name_or_path``) is replaced by a fixed stand-in, wherever it occurs as a whole value or as a path
  component. What is left is the canonical facts.
- The judgement is always computed on the canonical facts (hit or miss), never on the real ones, so the memo key can be
  the canonical facts themselves: every field of every object in them (including fields left out of their ``==``),
  frozen with its type (``1``, ``1.0`` and ``True`` are different keys), dicts in their order. Whatever the judgement
  reads is in the key because the key is all of its input; the environment and options are the same objects.
- The result is renamed back: every stand-in in every string and path of it becomes the model's own name again, so the
  messages, commands and snippets naming the repo are the model's own (``GEMMA_DOCTOR_NO_MEMO=1`` turns all of this off;
  tests compare the two).
- A model is memoised only when renaming is a bijection that the judgement cannot tell from the real names: a cache
  snapshot whose names are plain (letters, digits, ``._-``, one ``/``), none of the stand-ins already in its facts, and
  its source read by nothing in the judgement (the stand-in source refuses every read: the model is then judged
  directly). Anything of a type the walk does not know makes the model judged directly too.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import itertools
import json
import os
import re
from pathlib import PurePath
from typing import Any, Callable, TypeVar

from gemma_doctor.readers.jsonfile import JsonFile
from gemma_doctor.readers.safetensors_header import SafetensorsHeader, TensorInfo
from gemma_doctor.source import LocalSource

T = TypeVar("T")

# The stand-ins: plain names of the same shape as the real ones (a repo id, its cache folder, a 40-hex commit).
REPO = "gdmemo-org/gdmemo-model"
FOLDER = "models--gdmemo-org--gdmemo-model"
NAME = "gdmemo-name-or-path"
COMMIT = "9d6e0b1c5a7f4e2d8c3b6a5f4e3d2c1b0a9f8e7d"
# A blob's stand-in: this prefix, then its number, as long as the real hash (hub caches link snapshots to blobs/<hash>).
BLOB = "9d6e0b1c5a7f4e2d"
_BLOB_LINK = re.compile(r"^((?:\.\./)*blobs/)([0-9a-f]{40}|[0-9a-f]{64})$")
_PLAIN_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_PLAIN = re.compile(r"^/?[A-Za-z0-9][A-Za-z0-9._/-]*$")
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
MAX_ENTRIES = 1024
# A config.json larger than this is judged directly: the memo's keys and gates hold a digest of its text, never the
# text, but renaming and looking through megabytes costs more than the judgement it would save (issue 33).
MAX_RAW = 1 << 20
# The key of a JSON file's data when its text stands for it (_Renaming._keyed_by_text).
_FROM_RAW = ("data parsed from raw",)


class Tensors:
    """A header's tensors (the bulk of a census) keyed by a token per distinct content, for one scan (its Memo owns
    it): the same tuple object (a header parsed once and met again in every fine-tune of a base:
    safetensors_header._parsed) is looked up by identity, a new object by value, so equal tensors always get the same
    token and unequal ones never do (tokens are never reused within the scan, whose keys alone they appear in)."""

    def __init__(self) -> None:
        self.tokens = itertools.count()
        self.by_value: dict[tuple, tuple[str, int]] = {}
        self.by_id: dict[int, tuple[tuple, tuple[str, int]]] = {}  # the tuple kept with its entry: its id stays its own

    def key(self, v: tuple) -> tuple[str, int] | None:
        """The key of a tuple of TensorInfo (None: not all of them are), Unmemoisable when a name holds a stand-in."""
        hit = self.by_id.get(id(v))
        if hit is not None and hit[0] is v:
            return hit[1]
        if not all(type(x) is TensorInfo for x in v):
            return None
        if any("gdmemo" in x.name or BLOB in x.name for x in v):
            raise Unmemoisable("a stand-in is a tensor name")
        if len(self.by_id) >= 4096:
            self.by_id.clear()  # objects forgotten: met again, they are looked up by value
        if len(self.by_value) >= 4096:
            self.by_value.clear()  # contents forgotten: met again, they get a new token (a miss, never a wrong hit)
        key = self.by_value.get(v)
        if key is None:
            key = self.by_value[v] = ("tensors", next(self.tokens))
        self.by_id[id(v)] = (v, key)
        return key


# Canonical paths by their type and text: the same few for every model of a cache (snapshots/<COMMIT>/config.json...).
_PATHS: dict[tuple[type, str], PurePath] = {}


class Unmemoisable(Exception):
    """The model is judged directly: its facts cannot be renamed safely, or the judgement read its source."""


def enabled() -> bool:
    """False when GEMMA_DOCTOR_NO_MEMO is set (the tests' switch: every model judged directly)."""
    return not os.environ.get("GEMMA_DOCTOR_NO_MEMO")


@dataclasses.dataclass(frozen=True)
class StandInSource:
    """The source of canonical facts: its kind and where it is (renamed); every read refuses (see module doc)."""

    kind: str
    folder: PurePath
    root: PurePath | None

    @property
    def location(self) -> str:
        """The renamed folder."""
        return str(self.folder)

    def __getattr__(self, name: str) -> Any:
        raise Unmemoisable(f"the judgement used the model's source ({name})")


_FIELDS: dict[type, tuple[str, ...]] = {}


def _fields(cls: type) -> tuple[str, ...]:
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def _rebuilt(obj: Any, values: dict[str, Any]) -> Any:
    """A copy of a (frozen, maybe slotted) dataclass with some fields changed; derived caches are not copied."""
    new = object.__new__(type(obj))
    for name in _fields(type(obj)):
        object.__setattr__(new, name, values[name] if name in values else getattr(obj, name))
    return new


class _Renaming:
    """One model's names and their stand-ins; ``forward`` makes canonical facts and their key, ``back`` undoes it."""

    def __init__(self, repo_id: str, folder: str, commit: str, name: str | None, tensors: Tensors) -> None:
        self.tensors = tensors
        self.whole = {repo_id: REPO, commit: COMMIT}
        self.parts = {folder: FOLDER, commit: COMMIT}
        self.folder, self.commit = folder, commit
        self.name = name
        self.name_placed = False
        self.renamed_raw: bytes | None = None  # the config's text with its name renamed (checked before)
        self.idents: dict[Any, tuple[int, int]] = {}
        self.idents_back: dict[tuple[int, int], Any] = {}
        back = {REPO: repo_id, FOLDER: folder, COMMIT: commit}
        if name is not None:
            back[NAME] = name
        self.back_map = back
        self.blobs: dict[str, str] = {}
        self._back_re: re.Pattern[str] | None = None
        self.quoted = [(json.dumps(a).encode(), json.dumps(b).encode()) for a, b in self.whole.items()]
        self.in_file = False  # walking a file's contents (a JsonFile), where a name is a value, not the model's name

    @property
    def back_re(self) -> re.Pattern[str]:
        if self._back_re is None:
            self._back_re = re.compile("|".join(re.escape(k) for k in sorted(self.back_map, key=len, reverse=True)))
        return self._back_re

    # --- forward: real facts -> (canonical facts, key) ---

    def _str(self, s: str) -> str:
        hit = self.whole.get(s)
        if hit is not None:
            if self.in_file:
                # The repo id or commit as a value of the model's own files (a RoPE type, say): judged on the stand-in,
                # the judgement would differ from the model's (issue 33). Such a model is judged directly.
                raise Unmemoisable("the model's name is a value in its files")
            return hit
        if s == NAME and self.name is not None and not self.name_placed:
            self.name_placed = True  # the config's own name, renamed by _canonical (any other NAME is a collision)
            return s
        if "gdmemo" in s or BLOB in s:
            m = _BLOB_LINK.match(s)
            if m is None or BLOB in m.group(1):
                raise Unmemoisable("a stand-in is already in the facts")
        m = _BLOB_LINK.match(s)
        if m is not None:  # a snapshot file's link into blobs/: the blob renamed, one stand-in per blob
            return m.group(1) + self._blob(m.group(2))
        return s

    def _blob(self, digest: str) -> str:
        hit = self.blobs.get(digest)
        if hit is None:
            n = str(len(self.blobs))
            hit = self.blobs[digest] = BLOB + "0" * (len(digest) - len(BLOB) - len(n)) + n
            self.back_map[hit] = digest
            self._back_re = None
        return hit

    def _path(self, p: PurePath) -> tuple[PurePath, Any]:
        text = str(p)
        if "gdmemo" not in text and BLOB not in text and (self.folder in text or self.commit in text) and "/" in text:
            # The common case, as strings: the components (a normalised path's text split at "/") renamed whole, and
            # the canonical path object made once per process for all the models it stands for (below: the same
            # components, rebuilt through pathlib).
            new_text = "/".join([self.parts.get(x, x) for x in text.split("/")])
            t = type(p)
            made = _PATHS.get((t, new_text))
            if made is None:
                if len(_PATHS) >= 4096:
                    _PATHS.clear()
                made = _PATHS[(t, new_text)] = t(new_text)
            return made, (t, new_text)
        if self.folder in text or self.commit in text or "gdmemo" in text or BLOB in text:
            parts = p.parts
            new = tuple(self.parts.get(x, x) for x in parts)
            for x in new:
                if x not in (FOLDER, COMMIT) and ("gdmemo" in x or BLOB in x):
                    raise Unmemoisable("a stand-in is already in a path")
            if new != parts:
                p = type(p)(*new)
                text = str(p)
        return p, (type(p), text)

    def forward(self, v: Any) -> tuple[Any, Any]:
        """(canonical value, its key)."""
        t = type(v)
        if t is str:
            if v in self.whole or "gdmemo" in v or BLOB in v or "blobs/" in v:
                s = self._str(v)
                return s, s
            return v, v
        if v is None or t is bool or t is int:
            return v, (t, v)
        if t is float:
            return v, (t, repr(v))
        if t is dict:
            fwd = self.forward
            out: dict[Any, Any] = {}
            keys = []
            same = True
            for k, x in v.items():
                ck, kk = fwd(k)
                tx = type(x)
                if tx is int or tx is bool or x is None:
                    cx, kx = x, (tx, x)
                else:
                    cx, kx = fwd(x)
                    if cx is not x:
                        same = False
                if ck is not k:
                    same = False
                out[ck] = cx
                keys.append((kk, kx))
            return (v if same else out), (dict, tuple(keys))
        if t is tuple and v and type(v[0]) is TensorInfo:
            key = self.tensors.key(v)
            if key is not None:
                return v, key
        if t is tuple or t is list:
            fwd = self.forward
            items = [fwd(x) for x in v]
            canon = tuple(c for c, _ in items)
            if all(c is x for c, x in zip(canon, v)):
                out2: Any = v
            else:
                out2 = canon if t is tuple else list(canon)
            return out2, (t, tuple(k for _, k in items))
        if t is bytes:
            if v is not self.renamed_raw and (b"gdmemo" in v or BLOB.encode() in v):
                raise Unmemoisable("a stand-in is already in the bytes")
            # A file's JSON text: the model's name written in it (quoted as JSON writes it) is a value of the file, and
            # the model is judged directly (see _str); written otherwise, the bytes keep it, and the key with them.
            if any(real in v for real, _ in self.quoted):
                raise Unmemoisable("the model's name is a value in its files")
            return v, (t, len(v), hashlib.sha256(v).digest())  # a digest: a key never holds a file's text
        if t is frozenset or t is set:
            items = [self.forward(x) for x in v]  # in iteration order: what the judgement would iterate
            canon = [c for c, _ in items]
            out3 = v if all(c is x for c, x in zip(canon, v)) else t(canon)
            return out3, (t, tuple(k for _, k in items))
        if t is TensorInfo:  # slotted leaf of str and int fields, all compared: itself is its key
            if "gdmemo" in v.name or BLOB in v.name:
                raise Unmemoisable("a stand-in is a tensor name")
            return v, v
        if isinstance(v, PurePath):
            return self._path(v)
        if isinstance(v, enum.Enum):
            return v, v
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return self._dataclass(v)
        raise Unmemoisable(f"a fact of type {t.__name__}")

    def _dataclass(self, v: Any) -> tuple[Any, Any]:
        cls = type(v)
        if cls is LocalSource:
            folder, kf = self._path(v.folder)
            root, kr = self._path(v.root) if v.root is not None else (None, None)
            return StandInSource(v.kind, folder, root), (cls, v.kind, kf, kr)
        if cls is JsonFile:
            outer, self.in_file = self.in_file, True
            try:
                return self._fields_of(v, cls)
            finally:
                self.in_file = outer
        return self._fields_of(v, cls)

    def _fields_of(self, v: Any, cls: type) -> tuple[Any, Any]:
        changed: dict[str, Any] = {}
        keys = []
        from_raw = cls is JsonFile and self._keyed_by_text(v)
        whole = self.whole
        for name in _fields(cls):
            x = getattr(v, name)
            tx = type(x)
            # forward()'s answers for plain scalars, without the call (most fields of most facts are these)
            if x is None or tx is bool or tx is int:
                keys.append((tx, x))
                continue
            if tx is str and x not in whole and "gdmemo" not in x and BLOB not in x and "blobs/" not in x:
                keys.append(x)
                continue
            if from_raw and name == "data":
                keys.append(_FROM_RAW)  # a function of ``raw``, which is in the key (see _keyed_by_text)
                continue
            if name == "ident" and cls is SafetensorsHeader and x is not None:
                # (device, inode) of a shard file: renamed like a name, one stand-in per file in order of meeting
                # (two repos never share a file), so that equal shards of two repos are equal facts.
                c = self.idents.setdefault(x, (-1, len(self.idents)))
                self.idents_back[c] = x
                k = (tuple, c)
            else:
                c, k = self.forward(x)
            if c is not x:
                changed[name] = c
            keys.append(k)
        return (_rebuilt(v, changed) if changed else v), (cls, tuple(keys))

    def _keyed_by_text(self, v: JsonFile) -> bool:
        """True when a JSON file's parsed data needs neither renaming nor a walk: it was parsed from ``raw`` as read
        (``parsed``), and ``raw`` has no escape (so every string in the data is written in it as it is), no link into
        blobs/, no stand-in (but the config's own name, which _canonical put there), and none of this model's names
        quoted as a whole string: then no string of the data is a name the walk would rename, the data is the
        canonical data as it is, and it is a function of ``raw``, whose (renamed) bytes are in the key."""
        raw = v.raw
        if not v.parsed or raw is None or b"\\" in raw or b"blobs/" in raw:
            return False
        if raw is not self.renamed_raw and (b"gdmemo" in raw or BLOB.encode() in raw):
            return False
        if any(real in raw for real, _ in self.quoted):
            raise Unmemoisable("the model's name is a value in its files")
        if self.name is not None and json.dumps(self.name).encode() in raw:
            return False
        if raw is self.renamed_raw:  # the config's own name, placed once as _str places it when walked
            if self.name_placed:
                raise Unmemoisable("a stand-in is already in the facts")
            self.name_placed = True
        return True

    # --- back: canonical result -> the model's own ---

    def back(self, v: Any, clean: set[int]) -> Any:
        """``v`` with every stand-in replaced by the model's own name. What holds none is returned as it is (the
        judgement's objects are shared the way its memory plans and read-back configs already are); ``clean`` holds
        the ids of such objects, found once per memo entry, which keeps them alive."""
        t = type(v)
        if t is str:
            return self.back_re.sub(self._name_of, v) if ("gdmemo" in v or BLOB in v) else v
        if v is None or t is bool or t is int or t is float or t is TensorInfo or id(v) in clean:
            return v
        if t is bytes:
            if b"gdmemo" in v or BLOB.encode() in v:
                raise Unmemoisable("renamed bytes in the result")
            return v
        out: Any = v
        if t is tuple or t is list:
            new = [self.back(x, clean) for x in v]
            if any(a is not b for a, b in zip(new, v)):
                out = t(new)
        elif t is dict:
            pairs = [(self.back(k, clean), self.back(x, clean)) for k, x in v.items()]
            if any(a is not k or b is not x for (a, b), (k, x) in zip(pairs, v.items())):
                out = dict(pairs)
        elif t is frozenset or t is set:
            new = [self.back(x, clean) for x in v]
            if any(a is not b for a, b in zip(new, v)):
                out = t(new)
        elif isinstance(v, PurePath):
            s = str(v)
            out = type(v)(self.back(s, clean)) if ("gdmemo" in s or BLOB in s) else v
        elif isinstance(v, enum.Enum):
            return v
        elif t is StandInSource:
            raise Unmemoisable("the source is part of the result")
        elif dataclasses.is_dataclass(v) and not isinstance(v, type):
            changed = {}
            for name in _fields(t):
                x = getattr(v, name)
                if t is SafetensorsHeader and name == "ident" and x is not None:
                    y = self.idents_back[x]
                else:
                    y = self.back(x, clean)
                if y is not x:
                    changed[name] = y
            if changed:
                out = _rebuilt(v, changed)
        else:
            raise Unmemoisable(f"a result of type {t.__name__}")
        if out is v:
            clean.add(id(v))
        return out

    def _name_of(self, m: re.Match[str]) -> str:
        return self.back_map[m.group(0)]


def renaming_for(facts: Any, tensors: Tensors) -> _Renaming | None:
    """The renaming of a cache snapshot's facts, or None when the model is judged directly."""
    snap = facts.snapshot
    if (snap.problem is not None or snap.remote or snap.repo_dir is None or snap.repo_id is None
            or snap.target != snap.repo_id or not _PLAIN_REPO.match(snap.repo_id) or snap.commit is None
            or not _HEX40.match(snap.commit) or snap.path.name != snap.commit or snap.path.parent.parent != snap.repo_dir
            or snap.repo_dir.name != "models--" + snap.repo_id.replace("/", "--")):
        return None
    if type(facts.source) is not LocalSource or facts.source.kind != "cache":
        return None
    if facts.config.raw is not None and len(facts.config.raw) > MAX_RAW:
        return None
    if snap.revision in (snap.repo_id, snap.commit) or snap.commit == snap.repo_id:
        return None  # two names in one: the renaming would not be one-to-one
    name = facts.config.data.get("_name_or_path") if facts.config.ok else None
    # The config's own _name_or_path has a stand-in of its own (the repo id included: hub configs often name their repo
    # there); the repo id anywhere else in the model's files makes it judged directly (_Renaming._str).
    if not (isinstance(name, str) and _PLAIN.match(name) and name != snap.commit and name != snap.revision):
        name = None
    return _Renaming(snap.repo_id, snap.repo_dir.name, snap.commit, name, tensors)


def _renamed_text(raw: bytes, r: _Renaming) -> bytes:
    """config.json's text with its own ``_name_or_path`` renamed (when written once, as JSON writes it)."""
    if b"gdmemo" in raw or BLOB.encode() in raw:
        raise Unmemoisable("a stand-in is already in the config")
    if r.name is not None:
        old = json.dumps(r.name).encode()
        if raw.count(old) == 1:
            raw = raw.replace(old, json.dumps(NAME).encode())
    return raw


def _canonical(facts: Any, r: _Renaming) -> tuple[Any, Any]:
    """(canonical facts, key): the config's own ``_name_or_path`` renamed first, then the whole walk."""
    if r.name is not None:
        cfg = facts.config
        data = dict(cfg.data)
        data["_name_or_path"] = NAME
        raw = cfg.raw
        if raw is not None:
            raw = r.renamed_raw = _renamed_text(raw, r)
        facts = facts.with_(config=dataclasses.replace(cfg, data=data, raw=raw))
    return r.forward(facts)


def _gate(facts: Any, r: _Renaming) -> bytes | None:
    """A cheap function of the canonical facts (the digest of config.json's text renamed as the walk renames it):
    models whose gates differ cannot have equal canonical facts, so a model whose gate is new is judged without the
    walk. A digest, not the text: the gates of a whole cache are kept, and must not grow with its configs' sizes."""
    raw = facts.config.raw
    if raw is None:
        return None
    raw = _renamed_text(raw, r)
    for real, stand_in in r.quoted:
        if real in raw:
            raw = raw.replace(real, stand_in)
    return hashlib.sha256(raw).digest()


class Memo:
    """The judgements of one scan, under its one environment and options (both fixed for the scan, so neither is in a
    key): shared across its models whose canonical facts are equal. Made by the scan and dropped with it, never kept
    by the module; a whole-cache scan's forked workers each get the scan's memo as the lead repos left it."""

    def __init__(self, env: Any, options: Any) -> None:
        self.env, self.options = env, options
        self.on = enabled()
        self.tensors = Tensors()  # tokens for the tensors of this scan's headers
        self._outside: bool | None = None  # whether env and options hold no stand-in (made on first use)
        self.gates: set[bytes | None] = set()  # the gates seen (_gate): a new one is judged without the walk
        # canonical key -> None (its first model was judged as it is) or (canonical facts, their judgement, clean ids)
        self.entries: dict[Any, tuple[Any, Any, set[int]] | None] = {}

    def outside_clean(self) -> bool:
        """Whether the environment and options hold no stand-in (a training config's value, say): the result is
        renamed back everywhere, so a stand-in they hold would come back as the model's name."""
        if self._outside is None:
            try:
                _Renaming("-/-", "-", "-", None, Tensors()).forward((self.env, self.options))  # raises on a stand-in or an
                self._outside = True  # unknown type
            except Unmemoisable:
                self._outside = False
        return self._outside

    def judged(self, facts: T, judge: Callable[[T], tuple[T, Any]]) -> tuple[T, Any]:
        """``judge(facts)`` -> (facts judged, what else the judgement gives: the decision and check's findings),
        remembered across models whose canonical facts are equal."""
        r = renaming_for(facts, self.tensors) if self.on else None
        if r is None or not self.outside_clean():
            return judge(facts)
        try:
            gate = _gate(facts, r)
            if gate not in self.gates:
                if len(self.gates) >= 65536:
                    self.gates.clear()
                self.gates.add(gate)
                return judge(facts)
            canon, key = _canonical(facts, r)
            if key not in self.entries:
                if len(self.entries) >= MAX_ENTRIES:
                    self.entries.clear()
                # The first model of these facts is judged as it is, and only its key is kept: a cache of models all
                # unalike pays for the key, not for judging on the stand-ins and renaming back.
                self.entries[key] = None
            else:
                hit = self.entries[key]
                if hit is None:
                    hit = self.entries[key] = (canon, judge(canon), set())
                judged_canon, (out_canon, beside), clean = hit
                # The fields the judgement filled in are renamed back; the others are the model's own objects.
                changed = {}
                for name in _fields(type(out_canon)):
                    x = getattr(out_canon, name)
                    if x is not getattr(judged_canon, name):
                        changed[name] = r.back(x, clean)
                return facts.with_(**changed), r.back(beside, clean)
        except Unmemoisable:
            pass
        return judge(facts)

"""The libraries the training run will use: installed here, or named for the training machine, and whether a
known-bad version window can be hit with them.

A CI runner that plans for a GPU box names that box's packages (``--with transformers==4.50.3``,
``--requirements requirements.txt``); otherwise the installed versions count. When the version that
will run cannot be known (not installed and not named, or a range that straddles the window) the
answer is UNKNOWN, and rules warn instead of failing.
"""

from __future__ import annotations

import enum
import functools
import os
import re
import stat
from dataclasses import dataclass, field
import operator
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from packaging.version import InvalidVersion, Version

if TYPE_CHECKING:
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

# packaging.specifiers and packaging.requirements cost ~35 ms to import (their grammars are compiled regexes), a
# sixth of a `check` of one cached repo. They are imported where a range or a requirement line is read; the
# common question, "is this installed release in that window?", is answered by _plain_contains without them.

from gemma_doctor.errors import UsageError

# Requirements and lock files are small; anything larger is not read whole.
MAX_REQUIREMENTS_BYTES = 4 * 1024 * 1024


class Exposure(str, enum.Enum):
    """Whether the libraries that will run fall in a known-bad window."""

    AFFECTED = "affected"
    SAFE = "safe"
    UNKNOWN = "unknown"


def normalise(name: str) -> str:
    """PEP 503 name normalisation (``Huggingface_Hub`` -> ``huggingface-hub``)."""
    if name.islower() and "_" not in name and "." not in name and "--" not in name:
        return name  # already normal (every name the rules ask for): no pattern run, a rule asks per model
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Package:
    """One library as the training machine will have it: an exact version, a range, or absent."""

    name: str
    version: str | None = None
    specifier: str | None = None
    source: str = "installed"

    @property
    def absent(self) -> bool:
        """Neither a version nor a range is known."""
        return self.version is None and self.specifier is None

    def describe(self) -> str:
        """``transformers 4.50.3 (installed)``, ``transformers>=4.50 (requirements.txt:3)``, ``transformers (not installed)``."""
        if self.version is not None:
            return f"{self.name} {self.version} ({self.source})"
        if self.specifier is not None:
            return f"{self.name}{self.specifier} ({self.source})"
        return f"{self.name} ({'not installed' if self.source in ('installed', 'absent') else self.source})"

    def to_json(self) -> dict[str, Any]:
        """JSON view."""
        return {"version": self.version, "specifier": self.specifier, "source": self.source}


@dataclass(frozen=True)
class Window:
    """Released versions of one package that show a failure: a PEP 440 specifier set (pre-releases included)."""

    package: str
    spec: str
    first_fixed: str | None = None
    # Builds from a preview tag: the public version is in ``preview_spec`` and the local label names it.
    preview_spec: str | None = None
    preview_local: str | None = None

    def contains(self, version: str | Version) -> bool:
        """True when ``version`` is in the window."""
        try:
            v = version if isinstance(version, Version) else version_of(version)
        except InvalidVersion:
            return False
        if self.preview_spec and self.preview_local and v.local and self.preview_local in v.local.lower() \
                and _spec_contains(self.preview_spec, Version(v.public)):
            return True
        return _spec_contains(self.spec, v)

    def describe(self) -> str:
        """``transformers >=4.50.0.dev0,<4.51.0``."""
        return f"{self.package} {self.spec}"


@functools.lru_cache(maxsize=4096)
def version_of(text: str) -> Version:
    """``Version(text)``, parsed once per process (a scan asks the same few versions and bounds for every model and
    candidate; a Version is immutable). Raises InvalidVersion as Version does."""
    return Version(text)


_PLAIN_OPS = {">=": operator.ge, "<=": operator.le, "==": operator.eq, "!=": operator.ne, ">": operator.gt,
              "<": operator.lt}
_CLAUSE = re.compile(r"\s*(>=|<=|==|!=|>|<)\s*([0-9][0-9A-Za-z.]*)\s*")


def _plain_contains(spec: str, v: Version) -> bool | None:
    """``spec`` contains ``v`` by plain version comparison, or None when PEP 440's special rules could apply.

    For a final release (no pre-, post-, dev- or local part) and clauses of the six plain operators without
    wildcards, PEP 440's exclusions (pre-releases of V under ``<V``, post-releases of V under ``>V``, local
    versions) cannot arise, so the ordered comparison is the specifier's answer."""
    if v.pre is not None or v.post is not None or v.dev is not None or v.local is not None:
        return None
    for clause in spec.split(","):
        m = _CLAUSE.fullmatch(clause)
        if m is None:
            return None
        try:
            bound = version_of(m.group(2))
        except InvalidVersion:
            return None
        if not _PLAIN_OPS[m.group(1)](v, bound):
            return False
    return True


def _spec_contains(spec: str, v: Version) -> bool:
    """PEP 440 ``SpecifierSet(spec).contains(v, prereleases=True)``."""
    plain = _plain_contains(spec, v)
    if plain is not None:
        return plain
    from packaging.specifiers import SpecifierSet

    return SpecifierSet(spec).contains(v, prereleases=True)


def _probe_versions(bounds: Iterable[str]) -> list[Version]:
    """Versions around every boundary version in ``bounds``: enough to decide subset / disjoint for interval
    specifiers."""
    out: set[Version] = {Version("0.0.1"), Version("9999")}
    for text in bounds:
        text = text.replace(".*", "")
        try:
            v = version_of(text)
        except InvalidVersion:
            continue
        rel = list(v.release) + [0] * (3 - len(v.release))
        out.add(Version(".".join(map(str, v.release))))
        out.add(v)
        for i in range(3):
            up = rel[:i] + [rel[i] + 1] + [0] * (2 - i)
            out.add(Version(".".join(map(str, up))))
            if rel[i] > 0:
                down = rel[:i] + [rel[i] - 1] + [99] * (2 - i)
                out.add(Version(".".join(map(str, down))))
    return sorted(out)


def _plain_clauses(spec: str) -> list[tuple[str, str]] | None:
    """``spec``'s clauses as (operator, version) when each is one of the six plain operators without a wildcard."""
    out = []
    for clause in spec.split(","):
        m = _CLAUSE.fullmatch(clause)
        if m is None:
            return None
        out.append((m.group(1), m.group(2)))
    return out


def upper_bound(spec: str) -> str | None:
    """X of a window's one ``<X`` clause (the first release out of it), else None (no end, several, or ``<=X``)."""
    clauses = _plain_clauses(spec)
    if clauses is not None:
        bounds = [v for op, v in clauses if op == "<"]
    else:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet

        try:
            bounds = [s.version for s in SpecifierSet(spec) if s.operator == "<"]
        except InvalidSpecifier:
            return None
    return bounds[0] if len(bounds) == 1 else None


def exposure_of(package: Package, window: Window) -> Exposure:
    """AFFECTED when every version the package may be is in ``window``, SAFE when none is, else UNKNOWN."""
    if package.version is not None:
        return Exposure.AFFECTED if window.contains(package.version) else Exposure.SAFE
    if package.specifier is None:
        return Exposure.UNKNOWN
    return _range_exposure(package.specifier, window.spec)


# A search without transformers installed asks this for its pinned range against every window of every rule, for every
# candidate of every model (benchmarks/no_transformers.py): the same few pairs of strings, each answered once.
@functools.lru_cache(maxsize=4096)
def _range_exposure(specifier: str, window_spec: str) -> Exposure:
    """exposure_of for a package known only by a range ``specifier``, against the window ``window_spec``."""
    mine, window = _plain_clauses(specifier), _plain_clauses(window_spec)
    if mine is not None and window is not None:
        # Plain clauses (every range a pin or a window writes): decided by comparing final releases, without
        # importing packaging.specifiers (80 ms, most of a search's extra cost where transformers is not installed).
        candidates = _probe_versions(v for _, v in mine + window)
        # A pre-release is never one the range allows (packaging's contains(prereleases=False)).
        plain = [False if v.is_prerelease else _plain_contains(specifier, v) for v in candidates]
        if None not in plain:
            probes = [v for v, ok in zip(candidates, plain) if ok]
            hits = [_plain_contains(window_spec, v) for v in probes]
            if None not in hits:
                return _verdict(probes, hits)
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        allowed = SpecifierSet(specifier)
        bad = SpecifierSet(window_spec)
    except InvalidSpecifier:
        return Exposure.UNKNOWN
    probes = [v for v in _probe_versions(s.version for s in (*allowed, *bad)) if allowed.contains(v, prereleases=False)]
    return _verdict(probes, [bad.contains(v, prereleases=True) for v in probes])


def _verdict(probes: list[Version], hits: list[bool | None]) -> Exposure:
    """AFFECTED when every probe the range allows is in the window, SAFE when none is, else UNKNOWN."""
    if not probes:
        return Exposure.UNKNOWN
    if all(hits):
        return Exposure.AFFECTED
    if not any(hits):
        return Exposure.SAFE
    return Exposure.UNKNOWN


# Packages read from the serving side only, by the field catalogue (not Python distributions installed here).
SERVING_NAMES = ("ollama", "text-generation-inference")
# How close a name must be to a known one to be taken for its misspelling (difflib's ratio): "transfomers" is 0.96
# from transformers, "flash_atn" 0.95 from flash-attn; xformers (0.80) and unsloth-zoo (0.78) stay themselves.
MISSPELT_RATIO = 0.85


@functools.lru_cache(maxsize=1)
def known_names() -> frozenset[str]:
    """The normalised names of every package a rule or the catalogue reads a version of."""
    from gemma_doctor.readers.versions import PACKAGES, STACK_PACKAGES

    return frozenset(normalise(n) for n in (*PACKAGES, *STACK_PACKAGES, *SERVING_NAMES))


@dataclass(frozen=True)
class UnknownName:
    """A package named in --with or a requirements file that no rule reads: a misspelling when ``suggestion`` is set."""

    name: str
    source: str  # "--with" or "requirements.txt:3"
    text: str  # as written
    suggestion: str | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON view."""
        return {"name": self.name, "source": self.source, "text": self.text, "suggestion": self.suggestion}


def unknown_name(name: str, source: str, text: str) -> UnknownName | None:
    """``name`` as an UnknownName when no rule reads it (with the known name it misspells, if any); None if known."""
    import difflib

    key = normalise(name)
    known = known_names()
    if key in known:
        return None
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=MISSPELT_RATIO)
    return UnknownName(name, source, text, close[0] if close else None)


@dataclass(frozen=True)
class Stack:
    """The packages of the machine the training run will use."""

    packages: Mapping[str, Package] = field(default_factory=dict)
    planned: bool = False
    origin: str = "installed"
    # The options that name this stack, so a printed hint (fix ... --inplace) plans for the same machine.
    cli_args: tuple[str, ...] = ()
    # Names in --with (every unknown one) and the requirements file (misspellings only: a requirements file lists
    # many packages no rule reads) that name no package gemma-doctor knows: GD480.
    unknown: tuple[UnknownName, ...] = ()

    @classmethod
    def installed(cls, versions: Any) -> Stack:
        """The packages installed here (from package metadata, never imported)."""
        pkgs = {normalise(n): Package(n, v, None, "installed") for n, v in dict(versions.packages).items()}
        return cls(pkgs, planned=False, origin="installed")

    def get(self, name: str) -> Package:
        """The package ``name``; an absent Package when the stack does not have it."""
        return self.packages.get(normalise(name)) or Package(name, None, None, "absent" if self.planned else "installed")

    def version(self, name: str) -> str | None:
        """The exact version of ``name`` when known."""
        return self.get(name).version

    def exposure(self, window: Window) -> Exposure:
        """Whether the version of ``window.package`` that will run is in ``window``."""
        return exposure_of(self.get(window.package), window)

    def to_json(self) -> dict[str, Any]:
        """The `environment.stack` block: where the versions come from and each package's version or range."""
        out = {"planned": self.planned, "origin": self.origin,
               "packages": {p.name: p.to_json() for p in sorted(self.packages.values(), key=lambda p: p.name)}}
        if self.unknown:
            out["unknown"] = [u.to_json() for u in self.unknown]
        return out


def _package(req: Requirement, source: str) -> Package:
    pins = [s for s in req.specifier if s.operator in ("==", "===") and "*" not in s.version]
    if len(pins) == 1 and len(req.specifier) == 1:
        return Package(req.name, pins[0].version, None, source)
    return Package(req.name, None, str(req.specifier) or None, source)


# What no real requirement holds, refused before packaging parses it: a number of more digits than MAX_DIGITS (Python
# refuses to convert one of over 4,300: a ValueError, exit 70), parentheses nested deeper than MAX_NESTING (packaging's
# marker parser recurses once per level: a RecursionError at ~1,000, exit 70). Issue 33.
MAX_DIGITS = 64
MAX_NESTING = 32
_DIGIT_RUN = re.compile(r"[0-9]{%d}" % (MAX_DIGITS + 1))


def absurd(text: str) -> str | None:
    """Why ``text`` (a requirement, a version) is no real one, or None: a number too long, parentheses too deep."""
    if _DIGIT_RUN.search(text):
        return f"holds a number of over {MAX_DIGITS} digits, which no version has"
    depth = 0
    for c in text:
        if c == "(":
            depth += 1
            if depth > MAX_NESTING:
                return f"nests parentheses over {MAX_NESTING} deep, which no environment marker needs"
        elif c == ")":
            depth -= 1
    return None


def _shown(text: str) -> str:
    """A requirement as a message quotes it: at most 80 characters."""
    return repr(text if len(text) <= 80 else text[:77] + "...")


def parse_requirement(text: str, source: str) -> Package:
    """One pip requirement (``transformers==4.50.3``, ``peft>=0.12,<0.13``) -> Package; UsageError otherwise."""
    from packaging.requirements import InvalidRequirement, Requirement

    why = absurd(text)
    if why is not None:
        raise UsageError(f"{source} {_shown(text.strip())} is not a pip requirement: it {why}")
    try:
        req = Requirement(text.strip())
    except InvalidRequirement as e:
        reason = str(e).splitlines()[0] if str(e) else "not parseable"
        raise UsageError(f"{source} {text!r} is not a pip requirement (like transformers==4.50.3): {reason}") from None
    if req.url:
        return Package(req.name, None, None, f"{source} (from {req.url}: version unknown)")
    return _package(req, source)


# A lock file's lines, compiled by re at the first lock file read (never on check's start-up).
_LOCK_NAME = r'^\s*name\s*=\s*"([^"]+)"\s*$'
_LOCK_VERSION = r'^\s*version\s*=\s*"([^"]+)"\s*$'


def parse_requirements_text(text: str, label: str) -> tuple[dict[str, Package], list[str]]:
    """Packages of a requirements file, pip freeze output, or a uv/poetry/PEP 751 lock file; and the lines skipped."""
    from packaging.requirements import InvalidRequirement, Requirement

    packages: dict[str, Package] = {}
    skipped: list[str] = []
    lines = text.splitlines()
    if any(line.strip() in ("[[package]]", "[[packages]]") for line in lines):
        name: str | None = None
        for no, line in enumerate(lines, 1):
            if line.startswith("[["):
                name = None
            elif (m := re.match(_LOCK_NAME, line)) and name is None:
                name = m.group(1)
            elif (m := re.match(_LOCK_VERSION, line)) and name is not None:
                if (why := absurd(m.group(1))) is not None:
                    raise UsageError(f"{label}:{no}: the version of {name} {why}; not a lock file gemma-doctor can use")
                packages.setdefault(normalise(name), Package(name, m.group(1), None, f"{label}:{no}"))
                name = None
        return packages, skipped
    joined: list[tuple[int, str]] = []
    carry, start = "", 0
    for no, line in enumerate(lines, 1):
        line = re.sub(r"(^|\s)#.*$", "", line).rstrip()
        start = start or no  # a logical line is named by the physical line it starts on
        if line.endswith("\\"):
            carry += line[:-1] + " "
            continue
        joined.append((start, carry + line))
        carry, start = "", 0
    for no, line in joined:
        line = line.strip()
        if not line:
            continue
        if line.startswith("-"):  # -r, -c, -e, --index-url...: not a package of ours to judge
            skipped.append(f"{label}:{no}: {line[:80]}")
            continue
        line = re.split(r"\s+--", line, maxsplit=1)[0]  # --hash=... options after the requirement
        if (why := absurd(line)) is not None:
            raise UsageError(f"{label}:{no}: {_shown(line)} {why}; not a requirements file gemma-doctor can use")
        try:
            req = Requirement(line)
        except InvalidRequirement:
            skipped.append(f"{label}:{no}: {line[:80]}")
            continue
        pkg = Package(req.name, None, None, f"{label}:{no} (from {req.url}: version unknown)") if req.url else \
            _package(req, f"{label}:{no}")
        packages[normalise(req.name)] = pkg
    return packages, skipped


def read_requirements(path: str) -> tuple[dict[str, Package], list[str]]:
    """Read a requirements or lock file (a regular file, bounded); UsageError when it cannot be used."""
    label = os.path.basename(path) or path
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise UsageError(f"--requirements {path}: {e.strerror or e}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UsageError(f"--requirements {path}: not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(MAX_REQUIREMENTS_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > MAX_REQUIREMENTS_BYTES:
        raise UsageError(f"--requirements {path}: larger than {MAX_REQUIREMENTS_BYTES // 2**20} MiB, not a requirements file")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise UsageError(f"--requirements {path}: not UTF-8 text") from None
    return parse_requirements_text(text, label)


def resolve(versions: Any, with_packages: Iterable[str] = (), requirements: str | None = None) -> Stack:
    """The stack a run is judged against: the requirements file (else the installed packages), then --with on top."""
    withs = [w.strip() for w in with_packages if w.strip()]
    if requirements is None and not withs:
        return Stack.installed(versions)
    args: list[str] = []
    if requirements is not None:
        packages, _skipped = read_requirements(requirements)
        origin = os.path.basename(requirements)
        args += ["--requirements", requirements]
    else:
        packages = dict(Stack.installed(versions).packages)
        origin = "installed"
    unknown: list[UnknownName] = []
    if requirements is not None:
        unknown += [u for p in packages.values() if (u := unknown_name(p.name, p.source, p.name)) and u.suggestion]
    for w in withs:
        pkg = parse_requirement(w, "--with")
        packages[normalise(pkg.name)] = pkg
        args += ["--with", w]
        if (u := unknown_name(pkg.name, "--with", w)) is not None:
            unknown.append(u)
    return Stack(packages, planned=True, origin=origin + (" + --with" if withs else ""), cli_args=tuple(args),
                 unknown=tuple(unknown))

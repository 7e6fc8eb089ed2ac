"""The knowledge horizon: the newest release of each library whose version windows the findings were verified on.

Every finding that depends on a library's version is a window of releases (versioning.py). A window that is still
open ("from 5.21.0 on") or closed ("fixed in 5.6.0") was true up to the newest release that was checked; a release
after that may have fixed, reopened or introduced a failure the doctor does not know. ``VERIFIED`` names that release
per library; when the stack that will run is newer, ``check`` says so (GD120) and JSON carries the horizon.

How it is kept true: ``benchmarks/newest_releases.py`` builds a venv with the newest releases, runs every finding's
reproduction there and prints, per finding, whether its window still holds (docs/horizon.md has the last table).
Move a library's entry only after that run says its windows still hold, in a commit that says so.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from packaging.version import InvalidVersion, Version

from gemma_doctor.stack import Exposure, Package, Stack, Window, exposure_of

# The day of the last newest-release run (docs/horizon.md).
VERIFIED_ON = "2026-11-24"
# Library -> the newest release its windows were verified on. The libraries are those a finding's window names
# (versioning.py; a test keeps every Window's package here) plus accelerate (the HybridCache crash's other half)
# and torch (the precision and memory findings).
VERIFIED: dict[str, str] = {
    "transformers": "5.24.0",
    "peft": "0.21.2",
    "trl": "1.16.0",
    "accelerate": "1.15.0",
    "torch": "2.13.0",
}


@dataclass(frozen=True)
class Beyond:
    """One library of the stack that is (or can only be) newer than the newest release verified."""

    name: str
    package: Package
    verified: str

    def describe(self) -> str:
        """``transformers 5.24.0 (installed)``."""
        return self.package.describe()


def _public(version: str) -> str:
    """``2.13.0+cpu`` -> ``2.13.0``: a local build label is the same release."""
    try:
        return Version(version).public
    except InvalidVersion:
        return version


def beyond(stack: Stack) -> list[Beyond]:
    """The libraries of ``stack`` whose version that will run is newer than ``VERIFIED`` (every allowed version is,
    for a range); a range that also admits verified releases is not reported."""
    # Keyed by the packages themselves (the only part of the stack the answer reads), so equal stacks share it.
    return list(_beyond_of(_verified_packages(stack)))


def _verified_packages(stack: Stack) -> tuple[Package, ...]:
    return tuple(stack.get(name) for name in VERIFIED)


def _beyond(stack: Stack) -> list[Beyond]:
    """beyond(), computed afresh."""
    return list(_compare(_verified_packages(stack)))


def _compare(packages: tuple[Package, ...]) -> tuple[Beyond, ...]:
    """The ``Beyond`` of ``packages`` (one per ``VERIFIED`` library, in its order)."""
    out: list[Beyond] = []
    for (name, verified), package in zip(VERIFIED.items(), packages):
        pkg = package
        if pkg.version is not None:
            pkg = Package(pkg.name, _public(pkg.version), pkg.specifier, pkg.source)
        if exposure_of(pkg, Window(name, f">{verified}")) is Exposure.AFFECTED:
            out.append(Beyond(name, package, verified))
    return tuple(out)


@functools.lru_cache(maxsize=16)
def _beyond_of(packages: tuple[Package, ...]) -> tuple[Beyond, ...]:
    """_compare(), once per distinct set of packages: a scan asks about the run's one stack for every model and
    candidate (a pure function of the packages, which are frozen and compared by value)."""
    return _compare(packages)


def to_json(stack: Stack) -> dict[str, Any]:
    """The `environment.horizon` block: per library, the newest release verified and whether the stack is newer."""
    newer = {b.name for b in beyond(stack)}
    libs = {}
    for name, verified in VERIFIED.items():
        pkg = stack.get(name)
        libs[name] = {"verified": verified, "version": pkg.version, "specifier": pkg.specifier, "newer": name in newer}
    return {"verified_on": VERIFIED_ON, "libraries": libs}

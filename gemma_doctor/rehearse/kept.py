"""Twins kept between `rehearse --launch` runs, in the folder GEMMA_DOCTOR_TWIN_CACHE names (unset: none is kept).

A twin is made, with seed 0, from what build_twin reads of the target (config.json, the copied tokenizer and
settings files, the safetensors headers), the repo id, a cure's config change, gemma_doctor's code and the installed
libraries. Those inputs, hashed, name the kept twin: the same inputs find it, and it is copied into the
rehearsal's private cache instead of built again by a child that imports the whole stack (launch.py). Any change of
an input is another name, so a kept twin is never one the build would not give; a folder that cannot be read or
written is passed over and the twin built as before. Imports nothing heavy.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

ENV = "GEMMA_DOCTOR_TWIN_CACHE"
# The libraries a twin's bytes or its stack record come from (driver.stack records the last four).
_LIBRARIES = ("torch", "transformers", "tokenizers", "safetensors", "huggingface_hub", "numpy", "peft", "trl",
              "accelerate", "datasets")
# gemma_doctor's own code: the twin is built by twin.py, with the family tables and readers it uses; all of it is
# hashed (a few milliseconds), so no edit anywhere in the package can leave a kept twin the build would not give.
_PACKAGE = Path(__file__).resolve().parent.parent


def _version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def key(plan: dict[str, Any]) -> str | None:
    """The digest of everything the twin of ``plan`` is made from; None when the target cannot be read (the build
    then runs and says why)."""
    from gemma_doctor import fsafe
    from gemma_doctor.rehearse import twin

    model_dir = Path(plan["target_dir"])
    area = fsafe.Area(twin._cache_root(model_dir), user_named=twin._cache_root(model_dir) == model_dir)
    h = hashlib.sha256()
    h.update(json.dumps({"repo_id": plan["repo_id"], "patch": plan.get("config_patch") or {}, "seed": 0,
                         "python": sys.version, "libraries": {n: _version(n) for n in _LIBRARIES}},
                        sort_keys=True).encode())
    try:
        for source in sorted(_PACKAGE.rglob("*.py")):
            h.update(str(source.relative_to(_PACKAGE)).encode() + b"\0" + hashlib.sha256(source.read_bytes()).digest())
        for name in ("config.json", *twin.COPIED):
            data = twin._read_bytes(model_dir / name, area)
            h.update(name.encode() + b"\0" + (hashlib.sha256(data).digest() if data is not None else b"-"))
        h.update(json.dumps(sorted(twin._headers(model_dir, area).items())).encode())
    except (OSError, ValueError, twin.TwinError):
        return None
    return h.hexdigest()


def find(folder: Path, digest: str, hub: Path) -> list[dict[str, Any]] | None:
    """Copy the kept twin named ``digest`` into the empty private cache ``hub``; its build records (the stack, the
    twin, its snapshot path moved into ``hub``), or None when none is kept or it cannot be copied."""
    kept = folder / digest
    try:
        records = json.loads((kept / "records.json").read_text(encoding="utf-8"))
        shutil.copytree(kept / "hub", hub, symlinks=True, dirs_exist_ok=True)  # the snapshot's links stay relative
    except (OSError, ValueError):
        shutil.rmtree(hub, ignore_errors=True)
        hub.mkdir(exist_ok=True)
        return None
    for r in records:
        if r.get("stage") == "twin" and isinstance(r.get("snapshot"), str):
            r["snapshot"] = str(hub / r["snapshot"])
    return records


def find_patched(folder: Path, plan: dict[str, Any], hub: Path) -> list[dict[str, Any]] | None:
    """For a cure's rerun (``plan`` with a config_patch): the kept twin of the same inputs less the cure, copied into
    ``hub`` with the cure's change made to its config.json, as the build child makes it after building the twin
    (child.build); its records then name the change. None when no such twin is kept."""
    from gemma_doctor.rehearse.child import patch_config

    patch = plan.get("config_patch") or {}
    digest = key({**plan, "config_patch": None}) if patch else None
    found = find(folder, digest, hub) if digest else None
    twin = next((r for r in found or [] if r.get("stage") == "twin" and isinstance(r.get("snapshot"), str)), None)
    if twin is None:
        return None
    try:
        patch_config(Path(twin["snapshot"]) / "config.json", patch)  # the copy's own file (copytree copies blobs)
    except (OSError, ValueError):
        shutil.rmtree(hub, ignore_errors=True)
        hub.mkdir(exist_ok=True)
        return None
    twin["patched"] = patch
    return found


def keep(folder: Path, digest: str, hub: Path, records: list[dict[str, Any]]) -> None:
    """Keep the twin just built in ``hub`` under ``digest``: copied whole into a folder of its own, then renamed into
    place in one step (a rehearsal beside this one finds all of it or none). Never raises."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if (folder / digest).exists():
            return
        part = Path(tempfile.mkdtemp(prefix=".part-", dir=folder))
    except OSError:
        return
    try:
        shutil.copytree(hub, part / "hub", symlinks=True)
        kept = [dict(r) for r in records if r.get("stage") in ("stack", "twin")]
        for r in kept:
            if r.get("stage") == "twin" and isinstance(r.get("snapshot"), str):
                r["snapshot"] = os.path.relpath(r["snapshot"], hub)
        (part / "records.json").write_text(json.dumps(kept), encoding="utf-8")
        os.rename(part, folder / digest)  # fails when another rehearsal kept it first: that one is kept
    except OSError:
        pass
    finally:
        shutil.rmtree(part, ignore_errors=True)


# -- torch's JIT builds (DeepSpeed's CPU ops) --------------------------------------------------------------------------
# Every rehearsal child builds torch C++ extensions in its own folder (TORCH_EXTENSIONS_DIR under the rehearsal's
# temporary folder: process._environment), so no build of the user's, and no `lock` a killed build left, is ever met.
# DeepSpeed 0.19.8 on CPU ranks JIT-builds its CPU ops at their first use, minutes of g++ (its shared-memory all-reduce
# op, which its backend built at every start, is no longer started: hook/probe.py `_no_shm_op`); the finished build is
# kept here beside the twins and copied into the next rehearsal's folder, where torch's ninja finds it up to date
# (docs/rehearsal.md, "DeepSpeed on 2 CPU ranks").
_EXTENSIONS = "torch_extensions"
# Files of a build that belong to the build that made them: torch's FileBaton `lock` (a build killed while holding it
# leaves it, and every later build waits on it without end).
_NOT_KEPT = ("lock",)


def extensions_key() -> str:
    """The digest of what a JIT build depends on: Python, torch, and DeepSpeed's version and location (its sources are
    compiled from there); the machine is the one the kept folder is on."""
    import importlib.util
    import platform

    try:
        spec = importlib.util.find_spec("deepspeed")
    except (ImportError, ValueError):
        spec = None
    h = hashlib.sha256(json.dumps({"python": sys.version, "machine": platform.machine(), "torch": _version("torch"),
                                   "deepspeed": _version("deepspeed"), "at": spec.origin if spec else None},
                                  sort_keys=True).encode())
    return h.hexdigest()[:16]


def find_extensions(folder: Path, into: Path) -> bool:
    """Copy the kept JIT builds (if any) into the rehearsal's own extensions folder ``into``, every file's time kept
    (ninja then finds the build up to date) and no lock; whether any was found."""
    kept = folder / f"{_EXTENSIONS}-{extensions_key()}"
    if not kept.is_dir():
        return False
    try:
        shutil.copytree(kept, into, symlinks=True, dirs_exist_ok=True, ignore=shutil.ignore_patterns(*_NOT_KEPT))
    except OSError:
        return False
    return True


def keep_extensions(folder: Path, built: Path) -> None:
    """Keep the rehearsal's finished JIT builds (each build folder holding its library, no lock held) under
    ``folder``, renamed into place in one step as keep() does; never raises."""
    target = folder / f"{_EXTENSIONS}-{extensions_key()}"
    try:
        done = [d for d in built.iterdir() if d.is_dir() and any(d.glob("*.so")) and not (d / "lock").exists()]
        if target.exists() or not done:
            return
        part = Path(tempfile.mkdtemp(prefix=".part-", dir=folder))
    except OSError:
        return
    try:
        for d in done:
            shutil.copytree(d, part / d.name, symlinks=True, ignore=shutil.ignore_patterns(*_NOT_KEPT))
        os.rename(part, target)
    except OSError:
        pass
    finally:
        shutil.rmtree(part, ignore_errors=True)


def unfinished(built: Path) -> list[str]:
    """The JIT builds in the rehearsal's extensions folder ``built`` that hold no library yet (cut by the deadline)."""
    try:
        return sorted(d.name for d in built.iterdir() if d.is_dir() and not any(d.glob("*.so")))
    except OSError:
        return []

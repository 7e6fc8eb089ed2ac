"""Kill `gemma-doctor fix --inplace` and `restore` at random moments and check what they leave behind.

Shared by tests/test_crash_safety.py (a few dozen kills, in the normal suite) and
benchmarks/stress_crash.py (hundreds). The promise checked after every kill (docs/reliability.md):
- each snapshot file is either its original (link, or bytes) or the complete fixed file, valid JSON;
- every blob keeps its sha256;
- every fixed file is covered by the undo record, whose backup holds the original bytes;
- the next uninterrupted `fix` / `restore` exits 0 and ends in the state one uninterrupted run gives,
  with no temp file left and `huggingface_hub.scan_cache_dir` reporting no warning.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tests.builders import (HubCache, example_file, gemma2_config, gemma3_1b_config, llama_config,
                            paligemma2_config)

ROOT = Path(__file__).resolve().parent.parent
TEMP_MARK = ".gemma-doctor-"


def build_cache(root: Path, symlinks: bool = True, extra_repos: int = 6) -> HubCache:
    """A multi-repo cache: nested and flat Gemma configs, two revisions sharing blobs, a non-Gemma repo.

    ``extra_repos`` more Gemma 2 repos widen the window in which a run is writing.
    """
    hub = HubCache(root, symlinks=symlinks)
    files = {"config.json": example_file("config.json"), "generation_config.json": example_file("generation_config.json"),
             "model.safetensors": b"\x08\x00\x00\x00\x00\x00\x00\x00{}      "}
    hub.add("google/gemma-3-12b-it", {**files, "README.md": b"old\n"}, refs=("v1",))
    hub.add("google/gemma-3-12b-it", files, refs=("main",))
    hub.add("google/gemma-3-1b-it", {"config.json": gemma3_1b_config(), "generation_config.json": example_file("generation_config.json")})
    hub.add("google/paligemma2-3b-pt-224", {"config.json": paligemma2_config()})
    hub.add("meta-llama/Llama-3.2-1B", {"config.json": llama_config()})
    for i in range(extra_repos):
        cfg = gemma2_config()
        cfg["hidden_size"] = 2304 + i  # distinct blobs, as distinct repos have
        hub.add(f"org/gemma-2-ft-{i}", {"config.json": cfg})
    return hub


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot_state(root: Path) -> dict[str, tuple[str, str]]:
    """Every snapshot file but our temp files: (link target or 'file', sha256 of what it reads as)."""
    out: dict[str, tuple[str, str]] = {}
    for p in sorted(root.glob("models--*/snapshots/*/*")):
        if TEMP_MARK in p.name:
            continue
        kind = "link:" + os.readlink(p) if p.is_symlink() else "file"
        out[str(p.relative_to(root))] = (kind, _digest(p))
    return out


def temp_files(root: Path) -> list[Path]:
    """Temp files of ours anywhere in the cache (snapshots, .gemma-doctor, backups)."""
    return [p for p in root.rglob(f"*{TEMP_MARK}*.tmp")]


def blob_digests(root: Path) -> dict[str, str]:
    """sha256 of every blob: what must never change."""
    return {str(p.relative_to(root)): _digest(p) for p in sorted(root.glob("models--*/blobs/*"))}


def cli(root: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """One uninterrupted `python -m gemma_doctor` run on the cache at ``root``."""
    return subprocess.run(_argv(root, *args), env=_env(root), capture_output=True, text=True, timeout=timeout)


def _argv(root: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "gemma_doctor", *args, "--cache-dir", str(root)]


def _env(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    # The fix is planned only where the HybridCache crash can happen: plan for a transformers 4.50.x machine.
    env.update({"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(root), "NO_COLOR": "1", "GEMMA_DOCTOR_WITH": "transformers==4.50.3",
                "PYTHONPATH": str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")})
    env.pop("GEMMA_DOCTOR_DEBUG", None)
    return env


@dataclass(frozen=True)
class Expected:
    """The two states every file may be in, from uninterrupted runs on a copy of the cache."""

    original: dict[str, tuple[str, str]]
    fixed: dict[str, tuple[str, str]]
    blobs: dict[str, str]
    fix_seconds: float
    dry_run_seconds: float
    restore_seconds: float


def expected_states(root: Path, scratch: Path, repeats: int = 3) -> Expected:
    """Run fix and restore uninterrupted on a copy of ``root`` and time them (best of ``repeats``)."""
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(root, scratch, symlinks=True)
    original, blobs = snapshot_state(scratch), blob_digests(scratch)
    times: dict[str, float] = {"dry": 1e9, "fix": 1e9, "restore": 1e9}
    fixed: dict[str, tuple[str, str]] = {}
    for _ in range(repeats):
        for name, args in (("dry", ("fix",)), ("fix", ("fix", "--inplace")), ("restore", ("restore",))):
            t = time.perf_counter()
            r = cli(scratch, *args)
            times[name] = min(times[name], time.perf_counter() - t)
            if r.returncode != 0:
                raise AssertionError(f"uninterrupted {args} failed: {r.stderr or r.stdout}")
            if name == "fix":
                fixed = snapshot_state(scratch)
        if snapshot_state(scratch) != original:
            raise AssertionError("an uninterrupted fix + restore did not give the original cache back")
    shutil.rmtree(scratch, ignore_errors=True)
    return Expected(original, fixed, blobs, times["fix"], times["dry"], times["restore"])


def check_after_kill(root: Path, exp: Expected) -> str:
    """Assert the promise holds now; return 'original', 'fixed' or 'mixed' for the statistics."""
    state = snapshot_state(root)
    if set(state) != set(exp.original):
        raise AssertionError(f"snapshot files appeared or vanished: {sorted(set(state) ^ set(exp.original))}")
    fixed_keys = []
    for key, now in state.items():
        if now == exp.fixed[key] and now != exp.original[key]:
            json.loads((root / key).read_bytes())  # the complete fixed file, valid JSON
            fixed_keys.append(key)
        elif now != exp.original[key]:
            raise AssertionError(f"{key} is neither its original nor the fixed file: {now}")
    if blob_digests(root) != exp.blobs:
        raise AssertionError("a blob changed")
    _check_record_covers(root, fixed_keys, exp)
    changed = [k for k in exp.original if exp.original[k] != exp.fixed[k]]
    if not fixed_keys:
        return "original"
    return "fixed" if len(fixed_keys) == len(changed) else "mixed"


def _check_record_covers(root: Path, fixed_keys: list[str], exp: Expected) -> None:
    """Every fixed file has an entry whose backup holds exactly its original bytes."""
    for key in fixed_keys:
        repo, _, rel = key.partition("/")
        record = root / repo / ".gemma-doctor" / "undo.json"
        entries = json.loads(record.read_bytes())["entries"]  # parses: never torn
        entry = entries.get(rel)
        if entry is None:
            raise AssertionError(f"{key} is fixed but the undo record lost it")
        if entry["original_sha256"] != exp.original[key][1]:
            raise AssertionError(f"{key}: the record names the wrong original")
        backup = root / repo / ".gemma-doctor" / "backups" / entry["original_sha256"]
        if _digest(backup) != entry["original_sha256"]:
            raise AssertionError(f"{key}: the backup of the original is missing or damaged")


def check_complete(root: Path, exp: Expected, command: str) -> None:
    """After an uninterrupted run: exactly one run's end state, nothing left over, the scanner content."""
    from huggingface_hub import scan_cache_dir

    want = exp.fixed if command == "fix" else exp.original
    state = snapshot_state(root)
    if state != want:
        bad = sorted(k for k in want if state.get(k) != want[k])
        raise AssertionError(f"{command} did not end in the state of one uninterrupted run: {bad}")
    if blob_digests(root) != exp.blobs:
        raise AssertionError("a blob changed")
    left = [p for p in temp_files(root) if "snapshots" in p.parts or command == "fix"]
    if left:
        raise AssertionError(f"temp files left after a complete {command}: {left}")
    if command == "fix":
        _check_record_covers(root, [k for k in want if want[k] != exp.original[k]], exp)
    else:
        records = list(root.glob("models--*/.gemma-doctor/undo.json"))
        if records:
            raise AssertionError(f"restore left undo records: {records}")
    info = scan_cache_dir(root)
    if info.warnings:
        raise AssertionError(f"scan_cache_dir warns: {info.warnings}")


@dataclass
class Stats:
    """What a kill run did, for the test's assertions and docs/reliability.md's figures."""

    kills: int = 0
    sigints: int = 0
    by_command: dict[str, int] = field(default_factory=dict)
    landed: dict[str, int] = field(default_factory=dict)  # original / mixed / fixed right after the kill
    # SIGINT: one-line message (exit 130), finished before the signal (exit 0), or hit the interpreter
    # while it was still importing, before gemma-doctor's code ran (Python's own traceback; nothing touched)
    sigint_outcomes: dict[str, int] = field(default_factory=lambda: {"one-line message": 0, "finished first": 0,
                                                                     "during interpreter start": 0})
    completions: int = 0
    temp_files_seen: int = 0
    violations: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        """Plain data for printing as JSON."""
        return {"kills": self.kills, "sigkill": self.kills - self.sigints, "sigint": self.sigints,
                "by_command": self.by_command, "state_right_after_kill": self.landed,
                "sigint_outcomes": self.sigint_outcomes, "completions_checked": self.completions,
                "kills_that_left_temp_files": self.temp_files_seen, "violations": len(self.violations)}


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _sigint_outcome(code: int, err: str, delay: float, exp: Expected) -> str:
    """Classify a Ctrl-C'd run; raise when it broke the one-line promise."""
    lines = err.strip().splitlines()
    if "Traceback" in err:
        # Before gemma_doctor/__main__.py runs (runpy importing the package) only Python can answer;
        # once it runs, every Ctrl-C is caught.
        if "gemma_doctor/__main__.py" not in err and "gemma_doctor/cli" not in err and lines and lines[-1] == "KeyboardInterrupt":
            return "during interpreter start"
        raise AssertionError(f"Ctrl-C after {delay:.3f}s gave a traceback: {err[-500:]!r}")
    if code == -signal.SIGINT and not err:
        return "during interpreter start"  # before Python installed its handler: the default action, silent
    if code in (130, -signal.SIGINT) and "interrupted" not in err and lines and "error" not in err:
        # The signal landed after the run had finished and printed its result, while Python was exiting.
        return "finished first"
    if code in (130, -signal.SIGINT):  # -2: died of the re-raised signal after printing; a shell shows 130
        if not lines or "interrupted" not in lines[-1] or len([ln for ln in lines if "interrupted" in ln]) != 1:
            raise AssertionError(f"Ctrl-C did not give the one-line message: {err!r}")
        return "one-line message"
    if code == 0:
        return "finished first"
    raise AssertionError(f"Ctrl-C: exit {code}, stderr {err!r}")


def kill_loop(root: Path, exp: Expected, kills: int, seed: int = 0, sigint_share: float = 0.2,
              complete_every: int = 3, log: Callable[[str], None] | None = None) -> Stats:
    """Start fix/restore, kill it after a random delay, check; every few kills let one run complete and check.

    Delays are drawn over the measured duration of an uninterrupted run: mostly from the end of the dry
    run's duration (reading done, the writing about to start) to the end of the run, some from zero.
    """
    rng = random.Random(seed)
    stats = Stats()
    direction = "fix"
    for i in range(kills):
        command = direction if rng.random() < 0.7 else ("restore" if direction == "fix" else "fix")
        full = exp.fix_seconds if command == "fix" else exp.restore_seconds
        lo = 0.0 if rng.random() < 0.2 else 0.8 * exp.dry_run_seconds
        delay = rng.uniform(lo, 1.1 * full)
        sig = signal.SIGINT if rng.random() < sigint_share else signal.SIGKILL
        args = ("fix", "--inplace") if command == "fix" else ("restore",)
        # SIG_DFL first: a harness started in the background of a shell inherits SIGINT ignored, and Python
        # then installs no KeyboardInterrupt handler, so Ctrl-C would test nothing.
        proc = subprocess.Popen(_argv(root, *args), env=_env(root), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, preexec_fn=_default_sigint)
        time.sleep(delay)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
        stats.kills += 1
        stats.sigints += sig == signal.SIGINT
        stats.by_command[command] = stats.by_command.get(command, 0) + 1
        try:
            if sig == signal.SIGINT:
                stats.sigint_outcomes[_sigint_outcome(proc.returncode, err, delay, exp)] += 1
            landed = check_after_kill(root, exp)
            stats.landed[landed] = stats.landed.get(landed, 0) + 1
            stats.temp_files_seen += bool(temp_files(root))
            if (i + 1) % complete_every == 0 or i == kills - 1:
                r = cli(root, *args)
                if r.returncode != 0:
                    raise AssertionError(f"{command} after a kill exited {r.returncode}: {r.stderr or r.stdout}")
                check_complete(root, exp, command)
                stats.completions += 1
                direction = "restore" if command == "fix" else "fix"
        except AssertionError as e:
            stats.violations.append(f"kill {i} ({command}, {sig.name} after {delay:.3f}s): {e}")
            if log:
                log(stats.violations[-1])
            break  # the cache is no longer a known state; stop rather than pile up consequences
        if log and (i + 1) % 50 == 0:
            log(f"{i + 1} kills: {json.dumps(stats.summary())}")
    return stats

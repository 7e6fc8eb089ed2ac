"""The rehearsal's child process, shared by the runner (runner.py) and the launch of a user's script (launch.py):
its deadline with the whole process group killed, its private offline environment, and the records it leaves.

A module of its own so that the runner and the launch import it, not each other (tests/test_layers.py: no cycle).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

# Carried in the environment of the child and of every process it starts: torch's launcher (torchrun, accelerate
# launch) starts each rank in a session of its own (torch 2.13 elastic subprocess_handler: start_new_session), out of
# reach of a kill of the child's group, so the ranks are found by this mark instead.
_MARK = "GEMMA_DOCTOR_CHILD"


class Child:
    """The child process with its deadline: started in a session of its own, so a kill takes its whole group."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str], log: Path) -> None:
        self.log = log
        self.token = uuid.uuid4().hex
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(argv, cwd=cwd, env={**env, _MARK: self.token}, stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=out,
                                         start_new_session=True)

    def wait(self, timeout: float) -> int | None:
        """The exit status, or None when the deadline passed (the group is then killed)."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None
        except BaseException:
            self.kill()
            raise

    def kill(self) -> None:
        """SIGKILL to the child's process group, and to every process carrying its mark (a launcher's ranks, in
        sessions of their own), then reap it."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _kill(_marked(self.token))
        self.proc.wait()
        # SIGKILL is delivered when a process next runs (one in uninterruptible I/O on a loaded machine ends later),
        # and a rank the launcher was starting as it was killed appears after the first look: the rehearsal is over
        # only when none of its processes is left, each one seen killed (a clean-clone CI run met a rank started
        # after the first look, left sleeping).
        deadline = time.monotonic() + 10
        while (left := _marked(self.token)) and time.monotonic() < deadline:
            _kill(left)
            time.sleep(0.05)


def _kill(pids: list[int]) -> None:
    """SIGKILL to each of ``pids``."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:  # gone meanwhile, or not ours to kill
            pass


def _marked(token: str) -> list[int]:
    """The processes whose environment carries ``token`` under _MARK (read from /proc; none where there is no /proc,
    where the kill of the child's group is all there is)."""
    needle = f"{_MARK}={token}".encode()
    found = []
    try:
        entries = [e.name for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:
        return []
    for pid in entries:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(pid))
        except OSError:  # ended meanwhile, or another user's
            continue
    return found


def threads() -> int:
    """The compute threads of a rehearsal's one process where the caller sets none: min(4, cores) (a launched run's
    ranks share them: launch.rank_threads)."""
    return min(4, os.cpu_count() or 1)


def _environment(root: Path, device: str = "cpu") -> dict[str, str]:
    """The child's environment: the user's, with every cache private and the network off; the GPUs the user's own
    CUDA_VISIBLE_DEVICES shows stay visible unless the rehearsal runs on the CPU (``device``)."""
    env = dict(os.environ)
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
        # DeepSpeed picks its CPU accelerator where it sees no GPU, unless the user's environment names another one.
        env["DS_ACCELERATOR"] = "cpu"
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY"):
        env.pop(name, None)
    package_root = str(Path(__file__).resolve().parent.parent.parent)
    env.update({
        "HF_HOME": str(root / "hf"), "HF_HUB_CACHE": str(root / "hub"), "HF_DATASETS_CACHE": str(root / "datasets"),
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "disabled",
        "TMPDIR": str(root / "tmp"),
        # torch's JIT builds (DeepSpeed's ops) in the rehearsal's folder: never the user's ~/.cache/torch_extensions,
        # nor a `lock` a killed build left there, which every later build waits on without end (kept.py).
        "TORCH_EXTENSIONS_DIR": str(root / "torch_extensions"),
        "PYTHONPATH": os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p),
        "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", str(threads())),
    })
    return env


def _records(path: Path) -> list[dict[str, Any]]:
    out = []
    if path.exists():
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut by the kill
    return out


# torch's launcher ends a failed run with its own exception and a banner (torch 2.13 elastic ChildFailedError: "=====",
# "train.py FAILED", the root cause's rank and exit code): the line that says what failed is the rank's exception above.
_LAUNCHER_FAILED = "ChildFailedError"
_EXCEPTION = re.compile(r"^(?:\[rank\d+\]:\s*)?(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Interrupt|Exit)\b.*")
_ROOT_CAUSE = re.compile(r"^\s*(rank|exitcode)\s*:\s*(.*?)\s*$")


def _tail(path: Path) -> str:
    """The line of a child's output that says why it ended: its last line, or, where torch's launcher reports a failed
    rank, that rank's last exception line (else its exit code) instead of the launcher's banner."""
    lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()] if path.exists() else []
    if not lines:
        return "no output"
    at = next((i for i in range(len(lines) - 1, -1, -1) if _LAUNCHER_FAILED in lines[i]), None)
    if at is None:
        return lines[-1][:300]
    cause = dict(m.groups() for m in map(_ROOT_CAUSE.match, lines[at:]) if m)
    rank = f"rank {cause['rank'].split()[0]}" if "rank" in cause else "a rank"
    said = next((ln.strip() for ln in reversed(lines[:at]) if _EXCEPTION.match(ln.strip())), None)
    if said is not None:
        return f"{said[:300]} ({rank} failed)"
    return f"{rank} failed with exit code {cause.get('exitcode', '?').split()[0]}"

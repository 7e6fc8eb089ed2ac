"""`rehearse TARGET --launch "python train.py ..."`: the user's own script, run as it is, against the twin.

The twin is built by the usual child (`child build`) into a private offline hub cache; then the user's command runs
in the temporary folder with that cache in its environment (so `from_pretrained("google/gemma-3-12b-it")` loads the
twin) and with gemma_doctor/rehearse/hook/ first on its PYTHONPATH: that folder's sitecustomize arms the Trainer probe
(hook/probe.py) in every Python process the command starts. One deadline covers both; past it the process group is
killed, as for the driver's runs. With GEMMA_DOCTOR_TWIN_CACHE set, a twin built before from the same inputs is
copied in instead of built (kept.py). Imports nothing heavy.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

from gemma_doctor.errors import UsageError
from gemma_doctor.readers import launch as launch_reader
from gemma_doctor.report import Finding, Severity

HOOK = Path(__file__).resolve().parent / "hook"
# Launchers that run one Python script: the word, and the options of theirs that take a value (so the value is not
# taken for the script).
_LAUNCHERS = {
    "accelerate": {"--config_file", "--num_processes", "--num_machines", "--mixed_precision", "--main_process_port",
                   "--main_process_ip", "--machine_rank", "--gpu_ids", "--dynamo_backend", "--deepspeed_config_file",
                   "--fsdp_config", "--rdzv_backend", "--same_network"},
    "torchrun": {"--nproc-per-node", "--nproc_per_node", "--nnodes", "--node-rank", "--node_rank", "--master-addr",
                 "--master_addr", "--master-port", "--master_port", "--rdzv-backend", "--rdzv_backend",
                 "--rdzv-endpoint", "--rdzv_endpoint", "--rdzv-id", "--rdzv_id", "--max-restarts", "--max_restarts",
                 "--log-dir", "--log_dir", "--redirects", "--tee", "--local-addr", "--monitor-interval"},
}
_PYTHONS = ("python", "python3")
_DEEPSPEED_SWITCHES = frozenset({*launch_reader._DEEPSPEED_SWITCHES, *(w.replace("_", "-") for w in
                                                                      launch_reader._DEEPSPEED_SWITCHES)})


def script_of(words: list[str]) -> int | None:
    """The index of the script in ``words``, or None when they launch no Python script file."""
    if not words:
        return None
    head = Path(words[0]).name
    if head.startswith("python"):
        start, takes = 1, set()
    elif head == "accelerate" and words[1:2] == ["launch"]:
        start, takes = 2, _LAUNCHERS["accelerate"]
    elif head == "torchrun":
        start, takes = 1, _LAUNCHERS["torchrun"]
    elif head == "deepspeed":
        start, takes = 1, None  # DeepSpeed's launcher: every option but its switches takes a value
    else:
        return None
    i = start
    while i < len(words):
        w = words[i]
        if w in ("-m", "-c"):
            return None  # a module or inline code: no script of the user's to run as a file
        if w.startswith("-"):
            valued = (w not in _DEEPSPEED_SWITCHES and "=" not in w) if takes is None else w in takes
            i += 2 if valued else 1
            continue
        return i if w.endswith(".py") else None
    return None


def argv_of(launch: str, cwd: Path) -> tuple[list[str], Path]:
    """(the command to run, the script) for a launch line: python is this interpreter, accelerate and torchrun the
    ones beside it, and every word naming an existing file or folder relative to ``cwd`` made absolute (the command
    runs in the temporary folder)."""
    try:
        words = shlex.split(launch, comments=True)
    except ValueError as e:
        raise UsageError(f"--launch is not a command line: {e}") from None
    at = script_of(words)
    if at is None:
        raise UsageError("--launch: not a Python training script (python X.py, accelerate launch X.py, torchrun X.py, "
                         "deepspeed X.py) or `trl sft --config FILE`")
    script = (cwd / words[at]).absolute()
    if not _is_file(script):
        raise UsageError(f"--launch: the script {launch_reader._shown(words[at])} is not a file (looked in {cwd})")
    # The launcher's part of the line as check reads it (one reading): one its launcher stops on before the script (a
    # --config_file that is a FIFO, a folder, not UTF-8 or too large; a process count it refuses) is said here in one
    # line, never run into a hang or a crash. The script's own arguments are the script's to read as it runs.
    read = launch_reader.launcher_reading(launch, str(cwd))
    if not read.ok:
        raise UsageError(f"--launch: {read.error}")
    head = Path(words[0]).name
    here = Path(sys.executable).parent
    if head in _PYTHONS or head.startswith("python"):
        # The interpreter the doctor runs in is the environment that trains (nothing is installed for the run).
        words[0] = sys.executable
    elif _is_file(here / head):
        words[0] = str(here / head)
    return [words[0], *(_absolute(w, cwd) for w in words[1:])], script


def _is_file(path: Path) -> bool:
    """Whether ``path`` is a file; a word no file system can hold (a name too long, a NUL) names none."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def _exists(path: Path) -> bool:
    """Whether ``path`` exists; a word no file system can hold (a name too long, a NUL) names nothing."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def _absolute(word: str, cwd: Path) -> str:
    """``word`` (or the value of ``--flag=value``) made absolute when it names something that exists under ``cwd``."""
    flag, value = word.split("=", 1) if word.startswith("-") and "=" in word else ("", word)
    if value and not value.startswith("-") and _exists(cwd / value):
        value = str((cwd / value).absolute())
    return f"{flag}={value}" if flag else value


def ranks_of(argv: list[str], environ: Mapping[str, str] | None = None) -> int | None:
    """How many processes a launched command starts on this machine, as the launch reader reads its line
    (readers/launch.local_processes: torchrun's --nproc_per_node, 1 unless told; accelerate's --num_processes, else its
    config's, as accelerate runs it; DeepSpeed's); 1 for a plain Python script; None where the line does not say
    (torchrun's `auto`, accelerate without a count) or cannot be read, which the launcher then decides. ``environ``:
    the environment the command runs in (where accelerate finds its default config)."""
    if not argv:
        return None
    count = launch_reader.local_processes(shlex.join(argv), environ=environ)
    return count if isinstance(count, int) else None


def rank_threads(env: dict[str, str], argv: list[str]) -> dict[str, str]:
    """``env`` with each rank's compute threads for the launched command ``argv``: the caller's OMP_NUM_THREADS as it
    is; else, where the command starts N > 1 processes, the threads one rehearsal process gets (process.threads) shared
    among them, at least 1 each (torch 2.13's launcher gives each of its ranks 1 where OMP_NUM_THREADS is unset, but
    the child's environment sets it, which the launcher then passes to every rank as it is); where the line does not
    say how many, the variable is left unset for the launcher to decide, as it would in the user's run."""
    from gemma_doctor.rehearse.process import threads

    if "OMP_NUM_THREADS" in os.environ:
        return env
    ranks = ranks_of(argv, env)
    if ranks == 1:
        return env
    env = dict(env)
    if ranks is None:
        env.pop("OMP_NUM_THREADS", None)
    else:
        env["OMP_NUM_THREADS"] = str(max(1, threads() // ranks))
    return env


def run_script(plan: dict[str, Any], argv: list[str], timeout: float) -> tuple[list[dict[str, Any]], str | None,
                                                                                 float]:
    """Build the twin, then run the user's command against it; (records, why it ended early or None, seconds the
    script ran)."""
    from gemma_doctor.rehearse import kept
    from gemma_doctor.rehearse.process import Child, _environment, _records, _tail

    deadline = time.monotonic() + timeout
    root = Path(tempfile.mkdtemp(prefix="gemma-doctor-rehearse-"))
    try:
        for sub in ("hub", "hf", "work", "tmp", "datasets"):
            (root / sub).mkdir()
        plan = {**plan, "root": str(root), "workdir": str(root / "work"), "events": str(root / "events.jsonl")}
        (root / "plan.json").write_text(json.dumps(plan))
        env = _environment(root, plan.get("device") or "cpu")
        log = root / "child.log"
        twins = os.environ.get(kept.ENV)
        digest = kept.key(plan) if twins else None
        found = kept.find(Path(twins), digest, root / "hub") if twins and digest else None
        if found is None and twins and plan.get("config_patch"):
            # A cure's rerun: the first run's twin, kept, with the cure's change made to the copy's config.json.
            found = kept.find_patched(Path(twins), plan, root / "hub")
        if found is not None:
            # A twin of the same inputs was kept (kept.py): the same files, without a child importing the stack.
            with open(root / "events.jsonl", "a", encoding="utf-8") as events:
                events.writelines(json.dumps(r) + "\n" for r in found)
        else:
            build = Child([sys.executable, "-m", "gemma_doctor.rehearse.child", "build", str(root / "plan.json")],
                          root / "work", env, log)
            if build.wait(max(deadline - time.monotonic(), 0.1)) is None:
                return _records(root / "events.jsonl"), f"timeout after {timeout:g} s", 0.0
        records = _records(root / "events.jsonl")
        if not any(r.get("stage") == "twin" and r.get("status") == "ok" for r in records):
            return records, None if records else f"the twin was not built: {_tail(log)}", 0.0
        if twins and digest and found is None:
            kept.keep(Path(twins), digest, root / "hub", records)
        env = {**rank_threads(env, argv), "GEMMA_DOCTOR_LAUNCH_PLAN": str(root / "plan.json"),
               "PYTHONPATH": os.pathsep.join((str(HOOK), env["PYTHONPATH"]))}
        # DeepSpeed's JIT-built ops, kept from an earlier rehearsal, in this one's own extensions folder (kept.py).
        extensions = Path(env["TORCH_EXTENSIONS_DIR"])
        had_extensions = bool(twins) and kept.find_extensions(Path(twins), extensions)
        script_log = root / "script.log"
        started = time.monotonic()
        child = Child(argv, root / "work", env, script_log)
        status = child.wait(max(deadline - time.monotonic(), 0.1))
        seconds = time.monotonic() - started
        if twins and not had_extensions and status is not None and extensions.is_dir():
            kept.keep_extensions(Path(twins), extensions)
        records = _records(root / "events.jsonl")
        if status is None:
            cut = kept.unfinished(extensions)
            # DeepSpeed builds its CPU ops (the CPU optimizers) at their first use, for minutes: a deadline met there
            # says so.
            during = (f" while torch built {', '.join(cut)} (DeepSpeed's JIT op: minutes of g++ at its first use; "
                      f"with {kept.ENV} set the finished build is kept for the next rehearsal)") if cut else ""
            return records, f"timeout after {timeout:g} s{during}", seconds
        if status != 0 and not any(r.get("status") == "error" for r in records):
            return records, f"the script exited with status {status}: {_tail(script_log)}", seconds
        return records, None, seconds
    finally:
        shutil.rmtree(root, ignore_errors=True)


def first_failure(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A launched run's records with every rank's failure that follows one which ended its rank (``ends_rank``,
    hook/probe.py: a stage run in step failed there) folded into that one as ``then``: the ranks it left waiting fail
    in the same collective ("Connection closed by peer") or are stopped by the launcher, which is that failure's
    consequence, not a second one. The first failure is the run's, named by its rank and stage."""
    out: list[dict[str, Any]] = []
    cause: dict[str, Any] | None = None
    for r in records:
        if r.get("status") == "error" and isinstance(r.get("rank"), int):
            if cause is not None and r["rank"] != cause["rank"]:
                cause["then"].append({k: r.get(k) for k in ("rank", "stage", "line")})
                continue
            if cause is None and r.get("ends_rank"):
                cause = {**r, "then": []}
                out.append(cause)
                continue
        out.append(r)
    return out


def no_trainer(seconds: float) -> Finding:
    """The finding of a script that ran to its end and built no Trainer."""
    return Finding("GD979", Severity.WARNING, f"the script ran {seconds:.0f} s and built no Trainer: only load/exit "
                   "were rehearsed", key="script",
                   fix="the probes watch transformers.Trainer and its subclasses (TRL's trainers); a custom loop is "
                       "rehearsed as far as it runs without a crash, with no training invariant")

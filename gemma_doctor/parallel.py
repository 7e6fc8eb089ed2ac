"""Whole-cache scans spread over processes: the repos cut into contiguous runs, one per worker, the results put back
in order, so the output is the same for any number of workers (tests/test_parallel.py compares them byte for byte).

Workers are forked from the scan itself after everything every repo needs is made (imports, the environment, the
options), so a worker starts with no cost but the fork. Each one writes its results, pickled, into an anonymous
in-memory file (``memfd``; a private temporary file where there is none) that only this process and its child hold:
nothing outside the run can plant a result. The first run is the parent's own; a worker that fails in any way (killed,
out of memory, a result it cannot pickle) has its run done again in the parent, so a worker can cost time, never a
result. An error a worker meets (a ``DoctorError`` the sequential scan would raise) is raised in order, as the
sequential scan would.

No worker outlives its scan: each asks the kernel for SIGKILL when the process that forked it ends, however it ends
(SIGKILL, a crash: ``prctl(PR_SET_PDEATHSIG)`` on Linux, set in the worker only), and the parent stops and waits for
every worker when it is interrupted (Ctrl-C; SIGTERM and SIGHUP, which cli.main turns into the same interrupt). A
worker that has delivered nothing by its deadline (``deadline``: stopped, swapped out, stuck in a read) is killed and
its run done in the parent, so a stalled worker costs at most the deadline.

``GEMMA_DOCTOR_WORKERS``: a number of workers (1 = no fork); otherwise the usable CPUs, at most ``MAX_WORKERS``, and
one per ``PER_WORKER`` items (a small cache is not worth a fork). ``GEMMA_DOCTOR_WORKER_DEADLINE``: the seconds a worker
may take after the parent's own run is done (otherwise ``deadline``).
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import sys
import time
from typing import Callable, Sequence, TypeVar

T = TypeVar("T")
R = TypeVar("R")

MAX_WORKERS = 8
# Items per worker below which a fork does not pay for itself (a repo costs ~0.2-0.5 ms; a fork and the transfer of
# its results ~5 ms): measured in benchmarks/startup.py.
PER_WORKER = 64
# Repos a scan does before it forks (map_runs' ``lead``): enough to meet a few Gemma models in a cache of them, whose
# judgement imports the rules, the prescription search and PyYAML, and fills the memo, once for all workers.
LEAD = 8
# A worker's deadline, counted from the end of the parent's own run (a run as long as the worker's): at least
# DEADLINE_FLOOR seconds, or DEADLINE_FACTOR times what the parent's run took, whichever is longer. Far above any
# worker that is merely slow (runs are equal; a worker shares the CPUs with at most MAX_WORKERS - 1 others).
DEADLINE_FLOOR = 60.0
DEADLINE_FACTOR = 20.0


def workers(items: int) -> int:
    """How many processes a scan of ``items`` repos uses."""
    env = os.environ.get("GEMMA_DOCTOR_WORKERS", "").strip()
    if env:
        try:
            wanted = int(env)
        except ValueError:
            wanted = 1
        return max(1, min(wanted, items))
    if not hasattr(os, "fork"):
        return 1
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_WORKERS, items // PER_WORKER))


def deadline(own_run: float) -> float:
    """Seconds a worker may still take once the parent's own run, which took ``own_run`` seconds, is done."""
    env = os.environ.get("GEMMA_DOCTOR_WORKER_DEADLINE", "").strip()
    if env:
        try:
            wanted = float(env)
            if wanted == wanted and wanted >= 0:  # not NaN
                return wanted
        except ValueError:
            pass
    return max(DEADLINE_FLOOR, DEADLINE_FACTOR * own_run)


def chunks(items: Sequence[T], n: int) -> list[Sequence[T]]:
    """``items`` cut into ``n`` contiguous runs of nearly equal length (the first ones one longer)."""
    size, extra = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        out.append(items[start:end])
        start = end
    return out


def _scratch() -> int:
    """A descriptor of an anonymous file only this process (and its children) can reach."""
    if hasattr(os, "memfd_create"):
        try:
            return os.memfd_create("gemma-doctor-scan", getattr(os, "MFD_CLOEXEC", 0))
        except OSError:
            pass
    import tempfile  # only where there is no memfd (3 ms of start-up otherwise)

    f = tempfile.TemporaryFile()  # unlinked at once where the system allows it; mode 0600
    fd = os.dup(f.fileno())
    f.close()
    return fd


def map_runs(fn: Callable[[Sequence[T]], R], items: Sequence[T], n: int | None = None, lead: int = 0) -> list[R]:
    """``[fn(run) for run in runs]``, the runs after the first computed in forked workers. With ``lead``, the first
    ``lead`` items are a run of their own done here before any fork: what they make the process import and remember
    (the modules a judgement needs, the judgements of a base's first fine-tunes: gemma_doctor/memo.py) every worker
    then starts with, instead of making it again."""
    n = workers(len(items)) if n is None else max(1, min(n, len(items)))
    threading = sys.modules.get("threading")
    if n <= 1 or not hasattr(os, "fork") or (threading is not None and threading.active_count() > 1):
        return [fn(items)]  # a process with other threads is never forked (a lock one of them holds stays held)
    if 0 < lead < len(items) - n:
        first = fn(items[:lead])
        return [first, *map_runs(fn, items[lead:], n)]
    runs = chunks(items, n)
    sys.stdout.flush()
    sys.stderr.flush()
    started: list[tuple[int, int] | None] = []
    parent = os.getpid()
    try:
        for run in runs[1:]:
            fd = _scratch()
            try:
                pid = os.fork()
            except OSError:
                os.close(fd)
                started.append(None)
                continue
            if pid == 0:  # the worker: never returns
                _tie_to(parent)
                _work(fn, run, fd)
            started.append((pid, fd))
        began = time.monotonic()
        results: list[R] = [fn(runs[0])]
        until = time.monotonic() + deadline(time.monotonic() - began)
    except BaseException:  # also Ctrl-C between two forks
        for child in started:  # their runs come after the error: stopped, and waited for (no process left behind)
            if child is not None:
                _stop(*child)
        raise
    error: BaseException | None = None
    for run, child in zip(runs[1:], started):
        if error is not None:
            if child is not None:
                _stop(*child)
            continue
        try:
            results.append(_collect(fn, run, child, until))
        except BaseException as e:  # noqa: BLE001 - raised once every worker is waited for
            error = e
    if error is not None:
        raise error
    return results


def _stop(pid: int, fd: int) -> None:
    try:
        _kill(pid)
    finally:
        os.close(fd)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except OSError:
        pass


def _tie_to(parent: int) -> None:
    """In a just-forked worker: die with ``parent``, however it ends; a SIGTERM or SIGHUP to the worker alone ends it
    (the parent then does its run). Changes this process's own state only."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG = 1 (linux/prctl.h)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent ended before the request was made: nothing will send the signal
        os._exit(1)


def _work(fn: Callable[[Sequence[T]], R], run: Sequence[T], fd: int) -> None:
    code = 1
    try:
        try:
            result: tuple[str, object] = ("ok", fn(run))
        except BaseException as e:  # noqa: BLE001 - handed to the parent, which raises it in order
            result = ("raised", e)
        # A result (or error) pickle refuses ends the worker with 1: the parent does the run itself.
        view = memoryview(pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
        while view:
            view = view[os.write(fd, view):]
        code = 0
    except BaseException:  # noqa: BLE001 - the parent does this run itself
        code = 1
    finally:
        os._exit(code)  # no atexit handlers, no flush of the parent's buffers


def _wait(pid: int, until: float) -> int | None:
    """The worker's wait status once it ends, or None when it is still running at ``until`` (time.monotonic)."""
    pidfd = -1
    if hasattr(os, "pidfd_open"):
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:  # an older kernel: polled below
            pidfd = -1
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return status
            left = until - time.monotonic()
            if left <= 0:
                return None
            if pidfd >= 0:
                # Readable once it ends; at most an hour per wait, so a huge deadline never overflows select's timeout.
                select.select([pidfd], [], [], min(left, 3600.0))
            else:
                time.sleep(min(left, 0.01))
    finally:
        if pidfd >= 0:
            os.close(pidfd)


def _collect(fn: Callable[[Sequence[T]], R], run: Sequence[T], child: tuple[int, int] | None,
             until: float = float("inf")) -> R:
    """A worker's result, or the run done here when the worker did not deliver one by ``until``."""
    if child is None:
        return fn(run)
    pid, fd = child
    got: tuple[str, object] | None = None
    try:
        try:
            status = _wait(pid, until)
        except OSError:
            raise
        except BaseException:  # Ctrl-C while waiting: this worker too is stopped and waited for, not left running
            _kill(pid)
            raise
        if status is None:  # past its deadline: stopped, and its run done here
            _kill(pid)
        elif os.waitstatus_to_exitcode(status) == 0:
            size = os.fstat(fd).st_size
            data = os.pread(fd, size, 0) if size else b""
            if len(data) == size and size:
                got = pickle.loads(data)
    except Exception:  # noqa: BLE001 - whatever keeps a result from coming back whole: the run is done here
        # (pickle.loads runs an exception type's __init__ again, with its message: TypeError, KeyError, anything)
        got = None
    finally:
        os.close(fd)
    if got is not None and got[0] == "ok":
        return got[1]  # type: ignore[return-value]
    if got is not None and got[0] == "raised" and isinstance(got[1], BaseException):
        raise got[1]
    return fn(run)

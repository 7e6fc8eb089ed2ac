"""The weights scan (`check --weights`): NaN/Inf, fp16 overflow and zero embedding rows, from raw bit patterns.

Each shard is read with ``pread`` in bounded chunks into a reused buffer per thread (never memory-mapped: a file
truncated by its owner under a map is a SIGBUS for the whole process) and tested with vectorised integer operations
on the bits (facts.md section 5) into one reused scratch buffer, so memory stays bounded whatever the shard size and
no float copy is ever made. A chunk that lies in a hole of a sparse file is not read: a hole reads as zeros, so what
it holds is known (the file system is asked, chunk by chunk, with SEEK_DATA). numpy is imported here only, and only
when a scan runs.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import sys
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Callable

from gemma_doctor.readers.safetensors_header import SafetensorsHeader, TensorInfo

# Bytes read per chunk: large enough that Python overhead vanishes, small enough that the chunk is still in
# the CPU cache when numpy tests it right after the read (measured: 2 MiB beats 8 MiB; benchmarks/weights_scan.py).
CHUNK_BYTES = 2 * 1024 * 1024
# Scans shorter than this finish before a progress bar would tell anything.
PROGRESS_MIN_BYTES = 256 * 1024 * 1024
EMBEDDING_MARKERS = ("embed_tokens", "lm_head", "wte", "embedding")
# Zero-row ranges kept per tensor (every zero row is still counted): a crafted [1e8, 1] embedding of alternating
# rows would otherwise hold 5e7 ranges in memory.
MAX_ZERO_RANGES = 1000


@dataclass(frozen=True)
class _Spec:
    """Bit-pattern constants of one float dtype."""

    itemsize: int
    uint: str
    abs_mask: int
    # |bits| >= this: Inf (==) or NaN (>), exponent all ones.
    nonfinite: int
    # |bits| > this: |x| > 65504, fp16's maximum; None where no finite value can exceed it.
    fp16_limit: int | None


SPECS: dict[str, _Spec] = {
    "BF16": _Spec(2, "<u2", 0x7FFF, 0x7F80, 0x477F),
    "F16": _Spec(2, "<u2", 0x7FFF, 0x7C00, None),
    "F32": _Spec(4, "<u4", 0x7FFFFFFF, 0x7F800000, 0x477FE000),
}


def is_embedding(name: str, shape: tuple[int, ...]) -> bool:
    """Embedding / lm_head matrices, whose all-zero rows are worth reporting."""
    return len(shape) == 2 and any(m in name for m in EMBEDDING_MARKERS)


@dataclass(frozen=True)
class TensorScan:
    """What one tensor's values hold."""

    name: str
    file: str
    dtype: str
    shape: tuple[int, ...]
    nan: int = 0
    inf: int = 0
    # Largest finite |x| (None for an empty tensor or one without finite values).
    max_abs: float | None = None
    beyond_fp16: int = 0
    embedding: bool = False
    zero_rows: int = 0
    zero_row_ranges: tuple[tuple[int, int], ...] = ()

    def to_json(self) -> dict[str, Any]:
        """Per-tensor JSON entry (row ranges are inclusive [first, last])."""
        out: dict[str, Any] = {"name": self.name, "file": self.file, "dtype": self.dtype, "shape": list(self.shape),
                               "nan": self.nan, "inf": self.inf, "max_abs": self.max_abs, "beyond_fp16": self.beyond_fp16}
        if self.embedding:
            out["zero_rows"] = self.zero_rows
            out["zero_row_ranges"] = [list(r) for r in self.zero_row_ranges]
        return out


@dataclass(frozen=True)
class WeightsScan:
    """The scan of every shard of one model."""

    tensors: tuple[TensorScan, ...] = ()
    bytes_scanned: int = 0
    # dtype -> number of tensors not scanned (not F32/F16/BF16).
    skipped: dict[str, int] = field(default_factory=dict)
    # Shards that could not be scanned: (file, reason).
    unreadable: tuple[tuple[str, str], ...] = ()

    @property
    def total(self) -> dict[str, Any]:
        """Totals over every scanned tensor."""
        maxes = [t.max_abs for t in self.tensors if t.max_abs is not None]
        return {"tensors": len(self.tensors), "bytes": self.bytes_scanned,
                "nan": sum(t.nan for t in self.tensors), "inf": sum(t.inf for t in self.tensors),
                "max_abs": max(maxes) if maxes else None,
                "beyond_fp16": sum(t.beyond_fp16 for t in self.tensors),
                "zero_rows": sum(t.zero_rows for t in self.tensors)}

    def to_json(self) -> dict[str, Any]:
        """The `weights_scan` block of a model in `check --format json`."""
        return {"total": self.total, "tensors": [t.to_json() for t in self.tensors], "skipped": dict(self.skipped),
                "unreadable": [{"file": f, "error": e} for f, e in self.unreadable]}


def _decode(dtype: str, bits: int) -> float:
    import numpy as np

    if dtype == "BF16":
        return float(np.array([bits << 16], dtype="<u4").view("<f4")[0])
    if dtype == "F16":
        return float(np.array([bits], dtype="<u2").view("<f2")[0])
    return float(np.array([bits], dtype="<u4").view("<f4")[0])


def _read_at(fd: int, view: memoryview, offset: int) -> None:
    """Fill ``view`` with the file's bytes at ``offset``. A file that ends early was changed (truncated) while being
    scanned: an OSError, so a finding for this shard."""
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if not n:
            raise OSError(f"file ended early, at byte {offset + got} (truncated while being scanned?)")
        got += n


def _read_at_seeking(f: BinaryIO, lock: Any, view: memoryview, offset: int) -> None:
    """_read_at where the system has no preadv: one seek and read at a time on the shared file."""
    with lock:
        f.seek(offset)
        got = 0
        while got < len(view):
            n = f.readinto(view[got:])
            if not n:
                raise OSError(f"file ended early, at byte {offset + got} (truncated while being scanned?)")
            got += n


# One shard's work is cut into units of about this many bytes (whole chunks of one or more tensors), taken in file order
# by the scanning threads. Measured on 2 cores: 32 MiB beat 8 MiB.
UNIT_BYTES = 32 * 1024 * 1024
# Threads per shard at most: past a few, memory bandwidth, not cores, bounds the scan (and each holds a chunk buffer).
MAX_THREADS = 8


class _Source:
    """The shard's bytes, read into each thread's reused buffer (``pread``: no shared file position, no lock).

    Never memory-mapped: the owner of a file (a co-user of a shared cache) may truncate it while it is scanned, and a
    mapped page past the new end is a SIGBUS that ends the whole process, every other repo's report with it (issue
    33). A read past the end is a short read instead: an OSError, a finding for this shard, and the scan goes on."""

    def __init__(self, h: SafetensorsHeader) -> None:
        import threading

        import numpy as np

        from gemma_doctor import fsafe

        self.np = np
        # Opened again the way the header was (confined to the repo folder), and checked to be the same file:
        # a link swapped in between the census and the scan is never followed.
        try:
            opened = fsafe.open_file(h.path, fsafe.Area(h.root) if h.root is not None else None)
        except fsafe.Refused as e:
            raise OSError(str(e)) from None
        self.f = os.fdopen(opened.fd, "rb", buffering=0)
        size = opened.st.st_size
        if h.ident is not None and opened.ident != h.ident:
            self.f.close()
            raise OSError("file was replaced since its header was read; not scanned")
        if size != h.file_size:
            self.f.close()
            raise OSError(f"file is {size} bytes now, {h.file_size} when its header was read (changed meanwhile?)")
        self.size = size
        self.fd = self.f.fileno()
        self.lock = threading.Lock()  # only where there is no preadv
        self.positional = hasattr(os, "preadv")
        # Whether the file system is asked where the holes are; off where it cannot say (no SEEK_DATA, EINVAL).
        self.sparse = hasattr(os, "SEEK_DATA")

    def hole(self, offset: int, nbytes: int) -> bool:
        """Whether the ``nbytes`` at ``offset`` lie in a hole of the file now: all zeros, nothing to read.

        Asked of the open file at the moment the chunk would be read (never from a map taken earlier), so a file
        changed under the scan is seen as a read would see it: a region written since is data and read, a file cut
        short is read too, and that read says where it ended (an OSError, as for a file that is not sparse)."""
        if not self.sparse:
            return False
        try:
            if self.positional:  # pread ignores the file position that lseek moves
                data = os.lseek(self.fd, offset, os.SEEK_DATA)
            else:
                with self.lock:  # _read_at_seeking's seek-then-read must not be split by this lseek
                    data = os.lseek(self.fd, offset, os.SEEK_DATA)
        except OSError as e:
            if e.errno != errno.ENXIO:
                self.sparse = False  # the file system cannot say (EINVAL, EOPNOTSUPP): every chunk is read
                return False
            # No data at or after offset: a hole up to the end of the file, or offset is past the end (cut short).
            try:
                return offset + nbytes <= os.fstat(self.fd).st_size
            except OSError:
                return False
        return data >= offset + nbytes

    def view(self, offset: int, nbytes: int, buf: Any) -> Any:
        """uint8 array of the ``nbytes`` at absolute ``offset``, read into ``buf``; valid until the next call with the
        same ``buf``."""
        if nbytes > buf.size:
            raise ValueError("chunk larger than its buffer")
        view = memoryview(buf)[:nbytes]
        if self.positional:
            _read_at(self.fd, view, offset)
        else:
            _read_at_seeking(self.f, self.lock, view, offset)
        return buf[:nbytes]

    def close(self) -> None:
        """Close the file."""
        self.f.close()


# How a tensor is walked (_walk): row by row?, elements per chunk, items, bytes per item, row length (0 if not an
# embedding), embedding?
_Walk = tuple[bool, int, int, int, int, bool]


def _walk(t: TensorInfo, chunk_bytes: int) -> _Walk:
    """How a tensor is walked. Items are rows for an embedding whose rows are larger than a chunk (each row then in
    chunks), else elements (an embedding's chunks hold whole rows)."""
    spec = SPECS[t.dtype]
    emb = is_embedding(t.name, t.shape)
    row = t.shape[1] if emb else 0
    per_chunk = max(1, chunk_bytes // spec.itemsize)
    if row and row > per_chunk:
        return True, per_chunk, t.shape[0], row * spec.itemsize, row, emb
    if row:
        per_chunk = max(row, per_chunk // row * row)  # whole rows per chunk
    return False, per_chunk, t.numel, spec.itemsize, row, emb


# A piece: (tensor index, first item, items); a unit: (first byte, end byte, its pieces in file order).
_Unit = tuple[int, int, list[tuple[int, int, int]]]


def _units(h: SafetensorsHeader, tensors: list[TensorInfo], walks: list[_Walk], unit_bytes: int) -> list[_Unit]:
    """Cut the tensors into units of about ``unit_bytes`` (consecutive pieces, each whole chunks), in file order."""
    units: list[_Unit] = []
    pieces: list[tuple[int, int, int]] = []
    lo = size = 0
    for i, t in enumerate(tensors):
        by_row, per_chunk, items, item_bytes, _row, _emb = walks[i]
        step = max(1, unit_bytes // item_bytes) if by_row else max(per_chunk, unit_bytes // item_bytes // per_chunk * per_chunk)
        first = 0
        while first < items:
            n = min(step, items - first)
            if not pieces:
                lo = h.data_start + t.begin + first * item_bytes
            pieces.append((i, first, n))
            size += n * item_bytes
            first += n
            if size >= unit_bytes:
                units.append((lo, h.data_start + t.begin + first * item_bytes, pieces))
                pieces, size = [], 0
    if pieces:
        i, first, n = pieces[-1]
        units.append((lo, h.data_start + tensors[i].begin + (first + n) * walks[i][3], pieces))
    return units


class _Worker:
    """One scanning thread's reused buffer: each chunk is read into it and tested in place."""

    def __init__(self, chunk_bytes: int) -> None:
        import numpy as np

        self.np = np
        self.chunk_bytes = chunk_bytes
        self.raw: Any = None

    def unit(self, src: _Source, h: SafetensorsHeader, tensors: list[TensorInfo], walks: list[_Walk], unit: _Unit,
             advance: Callable[[int], None]) -> list[_Acc]:
        """Test one unit: what each of its pieces holds, in order."""
        _lo, _hi, pieces = unit
        return [self.piece(src, h, tensors[i], walks[i], first, n, advance) for i, first, n in pieces]

    def piece(self, src: _Source, h: SafetensorsHeader, t: TensorInfo, walk: _Walk, first: int, count: int,
              advance: Callable[[int], None]) -> _Acc:
        """Items ``first`` .. ``first + count`` of tensor ``t`` (rows or elements, as its walk says)."""
        spec = SPECS[t.dtype]
        acc = _Acc(spec)
        base = h.data_start + t.begin
        by_row, per_chunk, _items, item_bytes, row, _emb = walk
        if by_row:
            # A row larger than a chunk (a crafted [1, 1e9] "embedding"): each row in chunks, memory stays one chunk.
            for r in range(first, first + count):
                start = base + r * item_bytes
                zero = True
                done = 0
                while done < row:
                    n = min(per_chunk, row - done)
                    top = self._chunk(src, acc, start + done * spec.itemsize, n, advance)
                    zero = zero and top == 0
                    done += n
                if zero:
                    acc.add_zero_rows(r, r)
        else:
            done, end = first, first + count
            while done < end:
                n = min(per_chunk, end - done)
                self._chunk(src, acc, base + done * spec.itemsize, n, advance, row, done // row if row else 0)
                done += n
        return acc

    def _chunk(self, src: _Source, acc: _Acc, offset: int, n: int, advance: Callable[[int], None],
               row: int = 0, first_row: int = 0) -> int:
        """Test ``n`` elements at ``offset``; with ``row``, they are whole rows starting at ``first_row``. Returns max |bits|."""
        np = self.np
        spec = acc.spec
        nbytes = n * spec.itemsize
        if src.hole(offset, nbytes):
            # All bits zero: no NaN or Inf, a maximum of 0, nothing beyond fp16, and each row a zero row, in one run
            # (what the read and the tests below would find in a chunk of zeros, without them).
            if row:
                acc.add_zero_rows(first_row, first_row + n // row - 1)
            acc.best = max(acc.best, 0)
            advance(nbytes)
            return 0
        if self.raw is None or self.raw.size < nbytes:
            self.raw = np.empty(max(nbytes, self.chunk_bytes), dtype=np.uint8)
        bits = src.view(offset, nbytes, self.raw).view(spec.uint)
        # In place: the bytes were read into this thread's own buffer, and are not needed again.
        a = np.bitwise_and(bits, spec.abs_mask, out=bits)
        del bits
        if row:
            # One pass gives both the row maxima (zero rows) and the chunk's maximum.
            rmax = a.reshape(-1, row).max(axis=1)
            top = int(rmax.max())
            if int(rmax.min()) == 0:
                idx = np.flatnonzero(rmax == 0)
                # Runs of consecutive zero rows, found without a Python loop over rows.
                breaks = np.flatnonzero(np.diff(idx) != 1)
                starts = idx[np.concatenate(([0], breaks + 1))]
                ends = idx[np.concatenate((breaks, [idx.size - 1]))]
                for a0, b0 in zip(starts[:MAX_ZERO_RANGES + 1].tolist(), ends[:MAX_ZERO_RANGES + 1].tolist()):
                    acc.add_zero_rows(first_row + a0, first_row + b0)
                acc.zero_rows += int(idx.size) - int((ends[:MAX_ZERO_RANGES + 1] - starts[:MAX_ZERO_RANGES + 1] + 1).sum())
        else:
            top = int(a.max())
        if top >= spec.nonfinite:
            # Rare path: NaN/Inf present, so the finite maximum needs a mask.
            c_nan = int(np.count_nonzero(a > spec.nonfinite))
            c_inf = int(np.count_nonzero(a == spec.nonfinite))
            acc.nan += c_nan
            acc.inf += c_inf
            finite = a[a < spec.nonfinite]
            if finite.size:
                acc.best = max(acc.best, int(finite.max()))
        else:
            c_nan = c_inf = 0
            acc.best = max(acc.best, top)
        if spec.fp16_limit is not None and top > spec.fp16_limit:
            acc.beyond += int(np.count_nonzero(a > spec.fp16_limit)) - c_nan - c_inf
        advance(nbytes)
        return top


class _Acc:
    """What one tensor's chunks add up to; zero-row ranges merged as they come and kept up to MAX_ZERO_RANGES."""

    __slots__ = ("spec", "nan", "inf", "beyond", "zero_rows", "best", "ranges")

    def __init__(self, spec: _Spec) -> None:
        self.spec = spec
        self.nan = self.inf = self.beyond = self.zero_rows = 0
        self.best = -1
        self.ranges: list[tuple[int, int]] = []

    def add_zero_rows(self, first: int, last: int) -> None:
        self.zero_rows += last - first + 1
        self._add_range(first, last)

    def _add_range(self, first: int, last: int) -> None:
        if self.ranges and self.ranges[-1][1] == first - 1:
            self.ranges[-1] = (self.ranges[-1][0], last)
        elif len(self.ranges) < MAX_ZERO_RANGES:
            self.ranges.append((first, last))

    def merge(self, later: _Acc) -> None:
        """Add what the next piece of the same tensor holds: the same sums, maximum and first MAX_ZERO_RANGES runs of
        zero rows as one pass over both (a piece keeps its own first runs, and only its first can join ours)."""
        self.nan += later.nan
        self.inf += later.inf
        self.beyond += later.beyond
        self.zero_rows += later.zero_rows
        self.best = max(self.best, later.best)
        for first, last in later.ranges:
            self._add_range(first, last)


def scan_shard(h: SafetensorsHeader, file: str, advance: Callable[[int], None] = lambda n: None,
               chunk_bytes: int = CHUNK_BYTES, threads: int = 1,
               unit_bytes: int = UNIT_BYTES) -> tuple[list[TensorScan], dict[str, int], int, str | None]:
    """Scan one validated shard, its units ``threads`` at a time: (tensor results, skipped dtypes, bytes scanned,
    error). The result does not depend on ``threads`` or ``unit_bytes``: pieces are added up in file order."""
    out: list[TensorScan] = []
    skipped: dict[str, int] = {}
    scanned = 0
    todo: list[TensorInfo] = []
    for t in h.tensors:
        if t.dtype in SPECS:
            todo.append(t)
        else:
            skipped[t.dtype] = skipped.get(t.dtype, 0) + 1
    try:
        src = _Source(h)
    except OSError as e:
        return out, skipped, scanned, str(e.strerror or e)
    for t in h.tensors:
        if t.dtype not in SPECS:
            advance(t.nbytes)
    walks = [_walk(t, chunk_bytes) for t in todo]
    units = _units(h, todo, walks, unit_bytes)
    try:
        results = _run_units(units, lambda w, u: w.unit(src, h, todo, walks, u, advance), chunk_bytes, threads)
    finally:
        src.close()
    accs: list[_Acc | None] = [None] * len(todo)  # a tensor's first piece, the later ones added to it
    complete = len(todo)  # tensors before the first failed piece are whole; the rest are not reported
    error: str | None = None
    for (_lo, _hi, pieces), res in zip(units, results):
        if not isinstance(res, list):  # the OSError this unit met (units after it may not have run)
            complete = pieces[0][0]
            error = str(res.strerror or res) if isinstance(res, OSError) else "not scanned"
            break
        for (i, _first, _n), part in zip(pieces, res):
            whole = accs[i]
            if whole is None:
                accs[i] = part
            else:
                whole.merge(part)
    for t, walk, acc in zip(todo[:complete], walks, accs):
        if acc is None:  # no elements
            acc = _Acc(SPECS[t.dtype])
        best = acc.best
        out.append(TensorScan(t.name, file, t.dtype, t.shape, acc.nan, acc.inf,
                              _decode(t.dtype, best) if best >= 0 else None, acc.beyond,
                              walk[5], acc.zero_rows, tuple(acc.ranges)))
        scanned += t.nbytes
    return out, skipped, scanned, error


def _run_units(units: list[_Unit], work: Callable[[_Worker, _Unit], list[_Acc]], chunk_bytes: int,
               threads: int) -> list[Any]:
    """``work`` on each unit, taken in order by ``threads`` threads (this one among them), each with its own _Worker.
    One entry per unit, in order: its pieces' results, or the OSError it met (later units may then be missing, None).
    numpy's reductions and the reads release the GIL, so the threads scan in parallel."""
    results: list[Any] = [None] * len(units)
    if threads <= 1 or len(units) <= 1:
        worker = _Worker(chunk_bytes)
        for k, u in enumerate(units):
            try:
                results[k] = work(worker, u)
            except OSError as e:
                results[k] = e
                break
        return results
    import threading

    order = iter(range(len(units)))
    lock = threading.Lock()
    stop = threading.Event()
    crashed: list[BaseException] = []

    def loop() -> None:
        worker = _Worker(chunk_bytes)
        while not stop.is_set():
            with lock:
                k = next(order, None)
            if k is None:
                return
            try:
                results[k] = work(worker, units[k])
            except OSError as e:
                results[k] = e
                stop.set()
            except BaseException as e:  # a bug, or Ctrl-C in this thread: the others stop, the caller raises it
                crashed.append(e)
                stop.set()
                return

    helpers = [threading.Thread(target=loop, name=f"gemma-doctor-scan-{n}", daemon=True)
               for n in range(min(threads, len(units)) - 1)]
    for t in helpers:
        t.start()
    try:
        loop()
    finally:
        stop.set()
        for t in helpers:
            t.join()
    if crashed:
        raise crashed[0]
    return results


def _progress_wanted(total: int) -> bool:
    asked = os.environ.get("GEMMA_DOCTOR_PROGRESS", "").lower()
    if asked in ("0", "false", "no", "off"):
        return False
    if asked in ("1", "true", "yes", "on"):
        return True
    return total >= PROGRESS_MIN_BYTES and bool(getattr(sys.stderr, "isatty", lambda: False)())


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity where the system tells it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def scan(headers: list[tuple[str, SafetensorsHeader]], jobs: int = 1, label: str = "weights",
         chunk_bytes: int = CHUNK_BYTES, threads: int | None = None, unit_bytes: int = UNIT_BYTES) -> WeightsScan:
    """Scan shards (name, validated header), ``jobs`` at a time, each with ``threads`` threads (default: the usable
    cores shared among the shards scanned at once, at most MAX_THREADS each); the result depends on neither.

    Names for one file (links to one blob) are scanned once: time and memory follow the distinct bytes.
    """
    all_headers = headers
    first: dict[Any, int] = {}
    for i, (_n, h) in enumerate(all_headers):
        first.setdefault(h.ident if h.ident is not None else ("path", i), i)
    headers = [all_headers[i] for i in sorted(set(first.values()))]
    total = sum(h.file_size - h.data_start for _, h in headers)
    at_once = min(jobs, len(headers)) if jobs > 1 else 1
    if threads is None:
        threads = min(MAX_THREADS, max(1, usable_cores() // max(1, at_once)))
    progress = None
    advance: Callable[[int], None] = lambda n: None
    if _progress_wanted(total):
        from rich.console import Console
        from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                                   TransferSpeedColumn)

        progress = Progress(TextColumn("scanning {task.description}"), BarColumn(), DownloadColumn(),
                            TransferSpeedColumn(), TimeRemainingColumn(), console=Console(file=sys.stderr),
                            # On a terminal the bar disappears when done; asked for elsewhere, its last state stays.
                            transient=bool(getattr(sys.stderr, "isatty", lambda: False)()))
        import threading

        task = progress.add_task(label, total=total)
        lock = threading.Lock()

        def advance(n: int) -> None:
            with lock:
                progress.advance(task, n)

        progress.start()
    try:
        # numpy's reductions and file reads release the GIL, so threads scan shards in parallel.
        if jobs > 1 and len(headers) > 1:
            from concurrent.futures import ThreadPoolExecutor  # imported here: costly at CLI start-up

            with ThreadPoolExecutor(max_workers=jobs) as pool:
                results = list(pool.map(lambda nh: scan_shard(nh[1], nh[0], advance, chunk_bytes, threads, unit_bytes),
                                         headers))
        else:
            results = [scan_shard(h, name, advance, chunk_bytes, threads, unit_bytes) for name, h in headers]
    finally:
        if progress is not None:
            progress.stop()
    by_index = dict(zip(sorted(set(first.values())), results))
    tensors: list[TensorScan] = []
    skipped: dict[str, int] = {}
    unreadable: list[tuple[str, str]] = []
    scanned = 0
    for i, (name, h) in enumerate(all_headers):
        j = first[h.ident if h.ident is not None else ("path", i)]
        ts, sk, nb, err = by_index[j]
        if j != i:  # another name of a file already scanned: its results, under this name
            ts = [dataclasses.replace(t, file=name) for t in ts]
            nb = 0
        tensors.extend(ts)
        scanned += nb
        for d, c in sk.items():
            skipped[d] = skipped.get(d, 0) + c
        if err:
            unreadable.append((name, err))
    return WeightsScan(tuple(tensors), scanned, dict(sorted(skipped.items())), tuple(unreadable))


def scan_model(census: Any, source: Any, jobs: int = 1, label: str = "weights") -> WeightsScan:
    """Scan every readable shard of a model whose dtype census was taken; local files only."""
    pairs = []
    remote: list[tuple[str, str]] = []
    for s in census.shards:
        local = source.local_path(s.file)
        if local is None:
            # Read from the Hub: only the header was fetched, and the values are never downloaded for a check.
            if not s.error:
                remote.append((s.file, "not downloaded (read from the Hub); download the model to scan its values"))
            continue
        header = next((h for h in census.headers if h.path == local), None)
        if header is not None:
            pairs.append((s.file, header))
    result = scan(pairs, max(1, jobs), label=label)
    bad = tuple((s.file, s.error or "unreadable") for s in census.shards if s.error) + tuple(remote)
    if bad:
        result = WeightsScan(result.tensors, result.bytes_scanned, result.skipped, bad + result.unreadable)
    return result

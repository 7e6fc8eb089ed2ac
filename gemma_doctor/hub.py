"""A model repo on the Hub as a ModelSource: config files and safetensors headers read over HTTP, nothing stored.

Built on huggingface_hub (0.x with requests, >= 1.0 with httpx): the request ``HfApi.model_info`` makes pins the
revision to a commit and lists the files with their sizes; it and every file are read through the library's own session,
``hf_hub_url`` (so ``HF_ENDPOINT`` holds), ``build_hf_headers`` (its token resolution: ``HF_TOKEN``, the
token file, ``HF_HUB_DISABLE_IMPLICIT_TOKEN``), ``hf_raise_for_status`` (its error classes) and its timeouts
(``HF_HUB_ETAG_TIMEOUT`` for the API, ``HF_HUB_DOWNLOAD_TIMEOUT`` for files, each cut to what is left of the
deadline below); ``HF_HUB_OFFLINE`` is the
library's to enforce. Safetensors headers are read with the ranges ``get_safetensors_metadata`` uses
(``bytes=0-100000``, a second range only for a larger header), but kept as raw bytes with the file's size
from ``Content-Range``, so the strict reader of local files validates them and a truncated shard on the Hub
gets the same finding as in the cache. Small JSON files are read into memory, never into the hub cache:
a partial snapshot there would look like a broken download to ``check`` and ``hf cache`` alike.

Bounded against a broken or hostile endpoint (docs/reliability.md, tests/test_hub_hostile.py): every GET,
model info included, is gemma-doctor's own streamed GET through the library's session (huggingface_hub's
``model_info`` and ``list_models`` read whole bodies with ``response.json()``, so they are not called), reading
the wire bytes in chunks with ``Accept-Encoding: identity``, decoding gzip/deflate itself with a bound on the
decoded bytes, and stopping at a size limit that fits the body (model info, a small JSON file, a safetensors
header). One deadline covers the whole remote read of a repo (``GEMMA_DOCTOR_HUB_DEADLINE`` / ``--hub-deadline``):
each request's timeouts are cut to what is left of it, the clock is checked after every chunk, and the caller
waits for a request no longer than the deadline (a worker thread it then abandons), so a slow drip, a silent
server or a stuck name lookup ends in one line and exit code 5.

Imported only when a model is read from the Hub: ``check`` of a cached model never pays for huggingface_hub.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from urllib.parse import quote

import huggingface_hub
from huggingface_hub import constants, hf_hub_url
# huggingface_hub.utils exports the error classes from 0.24 (the oldest release gemma-doctor supports) on.
from huggingface_hub.utils import (
    DisabledRepoError,
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
    build_hf_headers,
    get_session,
    hf_raise_for_status,
    validate_repo_id,
)

from gemma_doctor import targets
from gemma_doctor.errors import HubAccessError, HubOffline, HubUnreachable, UsageError
from gemma_doctor.readers.jsonfile import MAX_JSON_BYTES, JsonFile, parse_json_object
from gemma_doctor.readers.safetensors_header import SafetensorsHeader, header_length, parse_header

# get_safetensors_metadata's first range: 97% of headers on the Hub fit (huggingface_hub PR #1855).
FIRST_RANGE = 100_001
# Shards read at once; the Hub's largest Gemma repos have a dozen.
MAX_PARALLEL = 8

LIBRARY_VERSION = huggingface_hub.__version__

# The whole remote read of one repo (model info, config files, every shard's header): a minute. A remote check
# is a handful of small requests, the headers in parallel (tests/test_hub.py: ~610 kB in all for a 24 GB model),
# a few round trips on a healthy link and seconds on a slow one; a CI step that waits longer than a minute for a
# pre-flight is better told the Hub did not answer (exit 5) than left hanging.
DEFAULT_DEADLINE = 60.0
DEADLINE_ENV = "GEMMA_DOCTOR_HUB_DEADLINE"
MAX_DEADLINE = 86400.0  # a day: more is no deadline (and past what a thread's join accepts)
# Model info with blobs=true costs ~250 bytes per file (rfilename, blobId, size, lfs {sha256, size, pointerSize});
# the Hub recommends fewer than 100k files per repo (huggingface.co/docs/hub/repositories-recommendations) and
# Gemma repos hold tens; the rest (card data, config, the ids of Spaces using the model) is tens to hundreds of kB.
# 16 MiB, the local reader's bound for a JSON file, is ~65k files.
MAX_INFO_BYTES = 16 * 1024 * 1024
# "Did you mean": 20 search results of a few hundred bytes each.
MAX_SEARCH_BYTES = 1024 * 1024
# An error answer: huggingface_hub reads its message for the error; the rest is not needed.
MAX_ERROR_BYTES = 64 * 1024
# Wire bytes read at a time (the clock is checked after each).
CHUNK = 64 * 1024


class Deadline:
    """The time left for a repo's remote read."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        """Seconds left (0 when passed)."""
        return max(0.0, self.end - time.monotonic())

    def passed(self) -> bool:
        return time.monotonic() >= self.end


def deadline_seconds() -> float:
    """The deadline of a remote read: GEMMA_DOCTOR_HUB_DEADLINE (set by --hub-deadline too), else 60 s."""
    raw = os.environ.get(DEADLINE_ENV, "").strip()
    if not raw:
        return DEFAULT_DEADLINE
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (0 < value <= MAX_DEADLINE):
        raise UsageError(f"{DEADLINE_ENV}={raw[:40]!r} is not a number of seconds above 0 and at most "
                         f"{MAX_DEADLINE:g} (e.g. 60)")
    return value


def endpoint() -> str:
    """The Hub this run talks to: HF_ENDPOINT as huggingface_hub read it."""
    return constants.ENDPOINT.rstrip("/")


def repo_url(repo_id: str) -> str:
    """The repo's web page (where a gated repo's licence is accepted)."""
    return f"{endpoint()}/{repo_id}"


def token_sent() -> bool:
    """True when huggingface_hub sends a token with its requests (HF_TOKEN, `hf auth login`, ...)."""
    return any(k.lower() == "authorization" for k in build_hf_headers())


_LOGIN = "log in with a token that can read it: hf auth login, or set HF_TOKEN"


def _download_hint(repo_id: str) -> str:
    return f"hf download {repo_id} --include '*.json' '*.safetensors'"


@dataclass
class HubSource:
    """One commit of a model repo on the Hub, read file by file over HTTP and never stored."""

    repo_id: str
    revision: str
    commit: str
    files: dict[str, int | None]
    gated: Any = False
    private: bool = False
    # The commit the local cache holds for the same revision (when known): tells whether it is behind.
    cached_commit: str | None = None
    kind: str = "hub"
    # What reading it cost: HTTP requests (model_info included) and the file bytes received.
    requests: int = 1
    bytes_read: int = 0
    files_read: set[str] = field(default_factory=set)
    headers_read: set[str] = field(default_factory=set)
    deadline: Deadline = field(default_factory=lambda: Deadline(deadline_seconds()), repr=False)
    _json: dict[str, JsonFile] = field(default_factory=dict, repr=False)
    _headers: dict[str, SafetensorsHeader] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    # --- ModelSource -----------------------------------------------------------------------------
    def has(self, name: str) -> bool:
        """True when the commit has ``name`` (from the file list model_info returned)."""
        return name in self.files

    def read_json(self, name: str) -> JsonFile:
        """A small JSON file, read whole into memory (bounded like a local read); memoised."""
        if name not in self._json:
            self._json[name] = self._read_json(name)
        return self._json[name]

    def read_header(self, name: str) -> SafetensorsHeader:
        """A safetensors header by HTTP range, validated as a local header is; memoised."""
        if name not in self._headers:
            self._headers[name] = self._read_header(name)
        return self._headers[name]

    def read_headers(self, names: Sequence[str]) -> list[SafetensorsHeader]:
        """Several headers, fetched in parallel (one or two range requests each)."""
        todo = [n for n in dict.fromkeys(names) if n not in self._headers]
        if len(todo) > 1:
            with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(todo))) as pool:
                for name, header in zip(todo, pool.map(self._read_header, todo)):
                    self._headers[name] = header
        return [self.read_header(n) for n in names]

    @property
    def location(self) -> str:
        """The Hub page of the commit read."""
        return f"{endpoint()}/{self.repo_id}/tree/{self.commit}"

    def local_path(self, name: str) -> Path | None:
        """None: the bytes are on the Hub."""
        return None

    # --- what the report says about it --------------------------------------------------------------
    @property
    def cache_behind(self) -> bool | None:
        """True when the cache holds another commit for this revision than the Hub (None: not cached)."""
        return None if self.cached_commit is None else self.cached_commit != self.commit

    def to_json(self) -> dict[str, Any]:
        """The `remote` block of a model read from the Hub."""
        return {
            "endpoint": endpoint(), "url": self.location, "gated": self.gated or False, "private": self.private,
            "cached_commit": self.cached_commit, "cache_behind": self.cache_behind,
            "files_read": sorted(self.files_read), "headers_read": sorted(self.headers_read),
            "requests": self.requests, "bytes": self.bytes_read,
            "huggingface_hub": LIBRARY_VERSION,
        }

    # --- HTTP ------------------------------------------------------------------------------------
    def _count(self, name: str, nbytes: int, header: bool) -> None:
        with self._lock:
            self.requests += 1
            self.bytes_read += nbytes
            (self.headers_read if header else self.files_read).add(name)

    def _get(self, name: str, first: int | None = None, last: int | None = None,
             limit: int = MAX_JSON_BYTES + 1) -> tuple[bytes, int | None]:
        """(body, total file size when the server said) of ``name`` at the pinned commit, at most ``limit`` bytes.

        Streamed, so a server that ignores Range (a mirror behind HF_ENDPOINT) never makes gemma-doctor
        download a whole shard: reading stops at ``limit``.
        """
        url = hf_hub_url(self.repo_id, name, revision=self.commit)
        headers = build_hf_headers()
        if first is not None:
            headers["Range"] = f"bytes={first}-{last}"
            limit = min(limit, (last or 0) - first + 1)
        with translate_errors(self.repo_id, self.revision):
            status, resp_headers, body, _more = bounded_get(url, headers, constants.HF_HUB_DOWNLOAD_TIMEOUT, limit,
                                                            self.deadline, name)
        self._count(name, len(body), header=first is not None)
        total = _total_size(status, resp_headers)
        return body, total

    def _read_json(self, name: str) -> JsonFile:
        path = Path(name)
        if name not in self.files:
            return JsonFile(path, exists=False)
        size = self.files[name]
        if size is not None and size > MAX_JSON_BYTES:
            return JsonFile(path, exists=True, error=f"larger than {MAX_JSON_BYTES // (1024 * 1024)} MiB, not a config (not read whole)")
        raw, _ = self._get(name)
        if len(raw) > MAX_JSON_BYTES:
            return JsonFile(path, exists=True, error=f"larger than {MAX_JSON_BYTES // (1024 * 1024)} MiB, not a config (not read whole)")
        data, error, shape_error = parse_json_object(raw)
        return JsonFile(path, exists=True, raw=raw, data=data, error=error, shape_error=shape_error)

    def _read_header(self, name: str) -> SafetensorsHeader:
        path = Path(name)
        if name not in self.files:
            return SafetensorsHeader(path, exists=False, error="missing")
        listed = self.files[name]
        if listed == 0:
            return SafetensorsHeader(path, exists=True, file_size=0, error="file is 0 bytes, shorter than the 8-byte header length")
        head, total = self._get(name, 0, FIRST_RANGE - 1)
        size = total if total is not None else listed if listed is not None else len(head)
        n, error = header_length(head, size)
        if error:
            return SafetensorsHeader(path, exists=True, file_size=size, error=error)
        if 8 + n <= len(head):
            raw = head[8:8 + n]
        else:  # a header larger than the first range: fetch only what is missing
            rest, _ = self._get(name, len(head), n + 7, limit=n + 8 - len(head))
            raw = head[8:] + rest
            if len(raw) != n:
                return SafetensorsHeader(path, exists=True, file_size=size, error="file shrank while being read")
        return parse_header(raw, size, path)


def _total_size(status: int, headers: Any) -> int | None:
    """The file's full size: Content-Range's total for a 206, Content-Length for a plain 200."""
    cr = headers.get("Content-Range") or headers.get("content-range")
    if status == 206 and cr and "/" in cr:
        total = cr.rsplit("/", 1)[1].strip()
        return int(total) if total.isascii() and total.isdigit() else None
    cl = headers.get("Content-Length") or headers.get("content-length")
    return int(cl) if status == 200 and cl and cl.isascii() and cl.isdigit() else None


class _Unreadable(Exception):
    """An answer gemma-doctor cannot read (an encoding not asked for, a broken gzip stream)."""


class _Decoder:
    """Content-Encoding undone with a bound on the decoded bytes (a gzip bomb costs what the limit allows)."""

    def __init__(self, encoding: str | None) -> None:
        enc = (encoding or "identity").strip().lower()
        if enc in ("", "identity"):
            self.z = None
        elif enc in ("gzip", "x-gzip"):
            self.z = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif enc == "deflate":
            self.z = zlib.decompressobj()
        else:  # br, zstd, several encodings stacked: asked for identity, so not read
            raise _Unreadable(f"Content-Encoding {enc[:40]!r}, though identity was asked for")

    def feed(self, data: bytes, room: int) -> Iterator[bytes]:
        """The decoded bytes of ``data`` in pieces of at most CHUNK; the caller stops once it has ``room``."""
        if self.z is None:
            yield data[:room]
            return
        while True:  # max_length: a bomb never inflates more than a piece at a time
            try:
                piece = self.z.decompress(data, CHUNK)
            except zlib.error as e:
                raise _Unreadable(f"a broken compressed body ({e})") from None
            yield piece
            data = self.z.unconsumed_tail
            if len(piece) < CHUNK and not data:  # input used up and nothing pending
                return


class _Progress:
    """What a request's worker thread has received so far (for the deadline's message)."""

    def __init__(self) -> None:
        self.bytes = 0


def _read_body(chunks: Iterator[bytes], encoding: str | None, limit: int, deadline: Deadline | None,
               progress: _Progress) -> tuple[bytearray, bool]:
    """(at most ``limit`` decoded bytes, whether the body went on): stops at the limit or the deadline."""
    decoder = _Decoder(encoding)
    body = bytearray()
    for chunk in chunks:
        for piece in decoder.feed(chunk, limit + 1 - len(body)):
            body += piece
            progress.bytes = len(body)
            if len(body) > limit:
                del body[limit:]
                return body, True
            if deadline is not None and deadline.passed():
                raise _DeadlinePassed
    return body, False


class _DeadlinePassed(Exception):
    """Raised in a worker thread when the deadline passed while it read."""


_NO_COPY = frozenset({"content-encoding", "content-length", "transfer-encoding"})


def _fetch(url: str, headers: dict[str, str], params: dict[str, Any] | None, timeout: float, limit: int,
           deadline: Deadline | None, progress: _Progress) -> tuple[int, Any, bytes, bool]:
    """One GET through huggingface_hub's session (httpx or requests), the body bounded; raises its errors."""
    session = get_session()
    headers = {**headers, "Accept-Encoding": "identity"}
    if callable(getattr(session, "stream", None)):  # httpx: huggingface_hub >= 1.0 (requests' .stream is a flag)
        with session.stream("GET", url, headers=headers, params=params, timeout=timeout) as r:
            encoding = r.headers.get("content-encoding")
            if r.status_code >= 400:
                body, _ = _read_body(r.iter_raw(), encoding, MAX_ERROR_BYTES, deadline, progress)
                # hf_raise_for_status reads the message from a body read already: a copy holding the bounded one
                copy = type(r)(r.status_code, headers=[(k, v) for k, v in r.headers.multi_items()
                                                       if k.lower() not in _NO_COPY],
                               content=bytes(body), request=r.request)
                hf_raise_for_status(copy)
            body, more = _read_body(r.iter_raw(), encoding, limit, deadline, progress)
            return r.status_code, r.headers, bytes(body), more
    r = session.get(url, headers=headers, params=params, timeout=timeout, stream=True)  # requests: 0.x
    try:
        encoding = r.headers.get("content-encoding")
        raw = r.raw.stream(CHUNK, decode_content=False)
        if r.status_code >= 400:
            body, _ = _read_body(raw, encoding, MAX_ERROR_BYTES, deadline, progress)
            r._content, r._content_consumed = bytes(body), True  # what r.json()/r.text read: the bounded body
            hf_raise_for_status(r)
        body, more = _read_body(raw, encoding, limit, deadline, progress)
        return r.status_code, r.headers, bytes(body), more
    finally:
        r.close()


def bounded_get(url: str, headers: dict[str, str], timeout: float | None, limit: int, deadline: Deadline,
                what: str, params: dict[str, Any] | None = None) -> tuple[int, Any, bytes, bool]:
    """(status, headers, at most ``limit`` body bytes, whether the body went on) of a GET, within the deadline.

    The request runs in a daemon thread with its timeouts cut to what is left of the deadline; the caller waits
    no longer than that, so a server that drips, stalls or never resolves ends the read with HubUnreachable
    (the thread, abandoned, stops at its next chunk or timeout, or with the process).
    """
    left = deadline.left()
    if left <= 0:
        raise _deadline_error(deadline, what, url, 0)
    per_read = min(timeout, left) if timeout else left
    progress = _Progress()
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["value"] = _fetch(url, headers, params, per_read, limit, deadline, progress)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            outcome["error"] = e

    worker = threading.Thread(target=work, name="gemma-doctor-hub-get", daemon=True)
    worker.start()
    worker.join(left + 0.05)
    if worker.is_alive() or isinstance(outcome.get("error"), _DeadlinePassed):
        raise _deadline_error(deadline, what, url, progress.bytes)
    if "error" in outcome:
        e = outcome["error"]
        if _is_timeout(e) and deadline.passed():
            raise _deadline_error(deadline, what, url, progress.bytes)
        if isinstance(e, _Unreadable):
            raise HubUnreachable(f"the Hub at {endpoint()} sent {what} as {e}; not read ({url})")
        raise e
    return outcome["value"]


def _deadline_error(deadline: Deadline, what: str, url: str, received: int) -> HubUnreachable:
    return HubUnreachable(f"the Hub at {endpoint()} did not finish sending {what} within the {deadline.seconds:g}-second "
                          f"deadline ({received} bytes received from {url}); nothing was reported. Try again, raise "
                          f"--hub-deadline / {DEADLINE_ENV}, or download the model first")


# --- errors ----------------------------------------------------------------------------------------

def _is_timeout(e: BaseException) -> bool:
    return any("Timeout" in c.__name__ for c in type(e).__mro__)


class translate_errors:  # noqa: N801 - used as a context manager, reads like one
    """Turn what huggingface_hub (or its HTTP library) raises into gemma-doctor's one-line errors."""

    def __init__(self, repo_id: str, revision: str, suggestions: Sequence[str] = (), cached: Sequence[str] = (),
                 not_cached: bool = False) -> None:
        self.repo_id, self.revision = repo_id, revision
        self.suggestions, self.cached, self.not_cached = list(suggestions), list(cached), not_cached

    def __enter__(self) -> translate_errors:
        return self

    def __exit__(self, exc_type: Any, e: BaseException | None, tb: Any) -> bool:
        if e is None or not isinstance(e, Exception) or isinstance(e, (UsageError, HubAccessError, HubUnreachable)):
            return False
        raise self.error(e) from None

    def error(self, e: Exception) -> Exception:
        """The gemma-doctor error for a library exception."""
        repo, host = self.repo_id, endpoint()
        if isinstance(e, OfflineModeIsEnabled):
            return HubOffline(f"{repo}: HF_HUB_OFFLINE is set, so the Hub is not asked; unset it to check the repo "
                              f"before download, or download it first: {_download_hint(repo)}")
        if isinstance(e, GatedRepoError):
            if token_sent():
                return HubAccessError(f"{repo} is gated and your token has no access to it yet: accept the licence at "
                                      f"{repo_url(repo)} with the account the token belongs to, then run again")
            return HubAccessError(f"{repo} is gated and no token was sent: accept the licence at {repo_url(repo)}, "
                                  f"then {_LOGIN}")
        if isinstance(e, HFValidationError):  # huggingface_hub's own stricter rule for names, before any request
            return UsageError(f"{repo!r} is not a valid repo id on the Hub: {str(e).splitlines()[0]}")
        if isinstance(e, RevisionNotFoundError):
            return UsageError(f"{repo} has no revision {self.revision!r} on the Hub ({host}); check --revision "
                              f"(a branch, tag or commit of {repo_url(repo)})")
        if isinstance(e, EntryNotFoundError):
            return HubUnreachable(f"{repo}: a file model_info listed is gone from the Hub ({e}); the repo changed "
                                  f"while it was read, run again")
        if isinstance(e, DisabledRepoError):
            return UsageError(f"{repo} is disabled on the Hub ({host}); it cannot be read or downloaded")
        if isinstance(e, RepositoryNotFoundError):
            hint = targets.did_you_mean(self.suggestions, self.cached)
            private = ("if it is private, your token cannot see it" if token_sent() else
                       f"if it is private, {_LOGIN}")
            where = "in the Hugging Face cache nor a model repo on the Hub" if self.not_cached else "a model repo on the Hub"
            return UsageError(f"{repo} is {'neither' if self.not_cached else 'not'} {where} ({host}){hint or '.'} "
                              f"Check the name; {private}")
        if isinstance(e, HfHubHTTPError):
            status = getattr(getattr(e, "response", None), "status_code", None)
            if status in (401, 403):
                return HubAccessError(f"{repo}: the Hub refused access ({status}); {_LOGIN}, and accept the licence at "
                                  f"{repo_url(repo)} if it is gated")
            return HubUnreachable(f"the Hub at {host} answered {status or 'an error'} for {repo}; try again later, "
                                  f"or download the model first: {_download_hint(repo)}")
        if any(c.__name__ == "TooManyRedirects" for c in type(e).__mro__):
            return HubUnreachable(f"the Hub at {host} redirected a request for {repo} too many times (a redirect "
                                  f"loop); check HF_ENDPOINT, or download first: {_download_hint(repo)}")
        if isinstance(e, RecursionError):
            return HubUnreachable(f"the Hub at {host} gave an answer nested too deep to read for {repo}")
        if _is_timeout(e):
            return HubUnreachable(f"the Hub at {host} did not answer in time for {repo}; try again, raise "
                                  f"HF_HUB_ETAG_TIMEOUT / HF_HUB_DOWNLOAD_TIMEOUT, or download first: {_download_hint(repo)}")
        if isinstance(e, (OSError, ConnectionError)) or type(e).__module__.split(".")[0] in ("requests", "httpx", "httpx2",
                                                                                               "httpcore", "urllib3"):
            return HubUnreachable(f"cannot reach the Hub at {host} ({type(e).__name__}) to read {repo}; check the "
                                  f"network, proxy or HF_ENDPOINT, or download first: {_download_hint(repo)}")
        return HubUnreachable(f"the Hub at {host} gave an answer gemma-doctor cannot read for {repo} "
                              f"({type(e).__name__}: {e})")


# --- opening a repo --------------------------------------------------------------------------------

def _bound_agent_registry(deadline: Deadline) -> None:
    """huggingface_hub >= 2 fetches ``{ENDPOINT}/api/agent-harnesses`` for its user agent with ``response.json()``
    (whole, on the first ``build_hf_headers`` of a process, unless a fresh copy is cached in HF_HOME): read it
    first, bounded like a search answer, and hand the library the result (its registry; empty on any failure,
    which is also what the library falls back to)."""
    try:
        from huggingface_hub.utils import _detect_agent
    except ImportError:  # huggingface_hub < 2: no registry
        return
    if getattr(_detect_agent, "_registry", 0) is not None or constants.HF_HUB_OFFLINE or constants.HF_HUB_DISABLE_TELEMETRY:
        return
    try:
        cached = _detect_agent._read_cached_registry(constants.AGENT_HARNESSES_PATH, max_age=_detect_agent._REGISTRY_TTL_SECONDS)
    except Exception:  # noqa: BLE001 - the library's own fallbacks apply
        cached = None
    if cached:
        return
    registry: Any = {"standardEnvVars": [], "harnesses": {}}
    try:
        # its own share of the deadline (the library waits 3 s for it): a drip here leaves time for the model
        _, _, body, more = bounded_get(f"{endpoint()}/api/agent-harnesses", {}, 3.0, MAX_SEARCH_BYTES,
                                       Deadline(min(3.0, deadline.left() / 4)), "huggingface_hub's agent registry")
        data = json.loads(body) if not more else None
        if isinstance(data, dict):
            registry = data
    except Exception:  # noqa: BLE001 - best effort, as in the library
        pass
    _detect_agent._registry = registry


def _hub_candidates(repo_id: str, deadline: Deadline) -> list[str]:
    """Model ids on the Hub whose name resembles ``repo_id`` (best effort: a failure means no suggestions).

    The request ``HfApi.list_models(search=, sort="downloads", limit=20)`` makes, read with a bound.
    """
    name = repo_id.split("/", 1)[-1]
    try:
        _, _, body, more = bounded_get(f"{endpoint()}/api/models", build_hf_headers(), constants.HF_HUB_ETAG_TIMEOUT,
                                       MAX_SEARCH_BYTES, deadline, "the search for similar names",
                                       params={"search": name, "sort": "downloads", "limit": 20})
        found = json.loads(body) if not more else []
        return [m["id"] for m in found[:20] if isinstance(m, dict) and isinstance(m.get("id"), str)]
    except Exception:  # noqa: BLE001 - suggestions are a courtesy: never turn a clear error into another one
        return []


_COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class _Info:
    """What model_info says that gemma-doctor uses."""

    id: str | None
    sha: str | None
    files: dict[str, int | None]
    gated: Any
    private: bool


def _model_info(repo_id: str, revision: str, deadline: Deadline) -> _Info:
    """``HfApi.model_info(repo_id, revision=, files_metadata=True)``'s request, read with a bound and parsed here."""
    validate_repo_id(repo_id)  # HFValidationError before any request, as model_info does
    url = f"{endpoint()}/api/models/{repo_id}/revision/{quote(revision, safe='')}"
    _, _, body, more = bounded_get(url, build_hf_headers(), constants.HF_HUB_ETAG_TIMEOUT, MAX_INFO_BYTES, deadline,
                                   "the model info", params={"blobs": True})
    if more:
        raise HubUnreachable(f"the Hub at {endpoint()} sent model info for {repo_id} larger than "
                             f"{MAX_INFO_BYTES // (1024 * 1024)} MiB (~65,000 files), not read ({url})")
    try:
        data = json.loads(body)
    except ValueError as e:
        raise HubUnreachable(f"the Hub at {endpoint()} sent model info for {repo_id} that is not JSON "
                             f"({str(e)[:80]}; {url})") from None
    siblings = data.get("siblings") if isinstance(data, dict) else None
    if not isinstance(data, dict) or not isinstance(siblings or [], list):
        raise HubUnreachable(f"the Hub at {endpoint()} sent model info for {repo_id} that is not a model's ({url})")
    files: dict[str, int | None] = {}
    for s in siblings or []:
        if isinstance(s, dict) and isinstance(s.get("rfilename"), str):
            size = s.get("size")
            files[s["rfilename"]] = size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else None
    sha, rid = data.get("sha"), data.get("id")
    return _Info(rid if isinstance(rid, str) else None, sha if isinstance(sha, str) else None, files,
                 data.get("gated", False), data.get("private") is True)


def open_model(repo_id: str, revision: str = "main", cached: Sequence[str] = (), cached_commit: str | None = None,
               not_cached: bool = False) -> HubSource:
    """Pin ``repo_id`` at ``revision`` to its commit and list its files; raises gemma-doctor's errors.

    ``cached``: the repo ids in the local cache, for "did you mean" when the Hub has no such repo;
    ``cached_commit``: the cache's commit for the same revision; ``not_cached``: the cache was looked in first.
    The deadline (``GEMMA_DOCTOR_HUB_DEADLINE``) starts here and covers every later read of the source.
    """
    deadline = Deadline(deadline_seconds())
    _bound_agent_registry(deadline)
    with translate_errors(repo_id, revision, cached=cached, not_cached=not_cached) as tr:
        try:
            info = _model_info(repo_id, revision, deadline)
        except RepositoryNotFoundError as e:
            if isinstance(e, GatedRepoError):
                raise
            tr.suggestions = targets.suggest(repo_id, [*cached, *_hub_candidates(repo_id, deadline)])
            raise
    if not info.sha:
        raise HubUnreachable(f"the Hub at {endpoint()} did not say which commit {repo_id}@{revision} is")
    if not _COMMIT.fullmatch(info.sha):  # a git commit id: it names a cache folder and is printed
        raise HubUnreachable(f"the Hub at {endpoint()} named a commit for {repo_id}@{revision} that is not a git "
                             f"commit id ({info.sha[:50]!r})")
    gated = info.gated if isinstance(info.gated, (bool, str)) else False
    # The Hub's spelling of the name (its case), never another repo's name.
    name = info.id if info.id and info.id.lower() == repo_id.lower() else repo_id
    return HubSource(name, revision, info.sha, info.files, gated or False, info.private, cached_commit,
                     deadline=deadline)


def iter_remote_notes(source: HubSource) -> Iterator[str]:
    """Hints for stderr about a model read from the Hub: the cached copy is behind."""
    if source.cache_behind:
        yield (f"{source.repo_id}: the cached {source.revision} is at {source.cached_commit[:12]}, behind the Hub's "  # type: ignore[index]
               f"{source.commit[:12]}; update it with: hf download {source.repo_id}"
               + (f" --revision {source.revision}" if source.revision != "main" else ""))

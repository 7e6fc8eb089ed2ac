"""A local stand-in for the Hugging Face Hub on 127.0.0.1, speaking the HTTP API the real huggingface_hub uses.

Two threaded servers, as on the real Hub: the Hub itself (API + ``resolve``) and a CDN on another origin that
``resolve`` redirects LFS files to (huggingface_hub >= 1.0 follows same-origin redirects on HEAD, and reads the
LFS metadata from the redirect response only when the CDN is elsewhere). What it serves is a hub cache folder
laid out as huggingface_hub lays it out (tests/builders.py HubCache, examples/build_example_cache.py): every
``models--org--name`` in it is a repo, its refs are branches, its snapshots are commits, and a blob named by a
64-hex sha256 is an LFS file. Every request is counted with the bytes of its body, for the tests and benchmarks.

Routes (facts.md section 9):
- ``GET /api/models/{repo}`` and ``/api/models/{repo}/revision/{rev}`` (``?blobs=true`` adds sizes and LFS info)
- ``GET /api/models/{repo}/auth-check``
- ``GET /api/models/{repo}/tree/{rev}[/{path}]`` (what ``snapshot_download`` lists in huggingface_hub >= 1.0)
- ``GET /api/models?search=&author=&sort=&limit=`` (``list_models``)
- ``HEAD|GET /{repo}/resolve/{rev}/{path}``: ``X-Repo-Commit``, ``ETag``; LFS files answer 302 to the CDN with
  ``X-Linked-Etag`` / ``X-Linked-Size``; ``Range`` gives 206 with ``Content-Range``
- errors with ``X-Error-Code``: ``GatedRepo`` (401 without a token, 403 with one that has no access),
  ``RepoNotFound`` (401 anonymous, 404 with a token, as the Hub hides private repos), ``RevisionNotFound``,
  ``EntryNotFound``

Hostile modes (``HubState.hostile``, route -> mode; tests/test_hub_hostile.py): a broken or hostile endpoint
behind ``HF_ENDPOINT``, per route the doctor reads: ``info`` (``/api/models/{repo}...``), ``json`` (``resolve`` of a
``.json`` file), ``header`` (``resolve`` of a ``.safetensors`` file, the header's range GETs) and ``search``
(``/api/models?search=``, asked for "did you mean" after a 404) and ``agent`` (``/api/agent-harnesses``, which
huggingface_hub >= 2 reads for its user agent). Modes: see ``HOSTILE_MODES``.
"""

from __future__ import annotations

import json
import os
import re
import struct
import threading
import time
import zlib
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

_SHA256 = re.compile(r"^[0-9a-f]{64}$")

HOSTILE_MODES = {
    "endless": "200, no length, a body that never ends (until the client hangs up)",
    "oversized": "200 with an honest Content-Length of 10 GB, and the bytes to match",
    "drip": "200, one body byte per second, for ever",
    "silent": "the connection is accepted and nothing is ever sent",
    "redirect-loop": "302 to the same URL, for ever",
    "cross-host": "302 to another host (localhost instead of 127.0.0.1, another port): the CDN, which records "
                  "whether a token came along",
    "gzip-bomb": "Content-Encoding: gzip over a stream of zeros that never ends (1000:1 on the wire)",
    "long-length": "Content-Length says 1 MB more than is sent, then the connection closes",
    "short-length": "Content-Length says 10 bytes, then a long body follows",
    "error-endless": "500 with an error message that never ends (huggingface_hub reads it for its error)",
    "injection": "a well-formed answer whose names and values carry terminal escapes and GitHub workflow commands",
    "bad-commit": "model info whose commit is not a git commit id (info only; elsewhere the honest answer)",
}
# What "injection" puts where a name or value is printed.
INJECTION = "\x1b[2J\x1b]8;;http://x\x07\n::error file=victim.py::pwned\r\n::add-mask::x"
HOSTILE_ROUTES = ("info", "json", "header", "search", "agent")
# What each route's body starts with: plausible enough that a client must read on to find out.
_PREFIX = {
    "info": b'{"id": "acme/x", "sha": "' + b"0" * 40 + b'", "siblings": [',
    "json": b'{"model_type": "gemma3_text", "x": "',
    # a header length just under the format's 100,000,000-byte limit: the client reads on to the limit
    "header": struct.pack("<Q", 99_999_000) + b'{"a": "',
    "search": b"[",
    "agent": b'{"standardEnvVars": ["AI_AGENT"], "harnesses": {',
}
_FILLER = {
    "info": b'{"rfilename": "model-00001-of-00002.safetensors", "size": 1},',
    "json": b"x" * 64,
    "header": b"x" * 64,
    "search": b'{"id": "acme/gemma-3-4b-it", "modelId": "acme/gemma-3-4b-it"},',
    "agent": b'"x": {"envVars": {"X": "1"}}, ' * 4,
}


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a blob (how the Hub names a file's ``oid``)."""
    import hashlib

    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The git-lfs pointer file the repo's git history holds for an LFS file."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


@dataclass(frozen=True)
class Entry:
    """One file of one commit: where its bytes are, its size, its git oid and (LFS files) its sha256."""

    name: str
    path: Path
    size: int
    oid: str
    sha256: str | None

    def read(self, start: int, end: int) -> bytes:
        """Bytes [start, end] inclusive (sparse example shards read as zeros without touching the disk)."""
        with open(self.path, "rb") as f:
            f.seek(start)
            return f.read(end - start + 1)


@dataclass
class Repo:
    """A model repo: commits (sha -> files), branches, and who may read it."""

    repo_id: str
    commits: dict[str, dict[str, Entry]]
    refs: dict[str, str]
    gated: Any = False  # False | "auto" | "manual"
    private: bool = False
    readers: frozenset[str] = frozenset()  # tokens with access (gated or private repos)
    downloads: int = 0

    def commit_of(self, rev: str) -> str | None:
        """The commit a branch, tag or (full or abbreviated) commit names."""
        if rev in self.refs:
            return self.refs[rev]
        if rev in self.commits:
            return rev
        hits = [c for c in self.commits if len(rev) >= 7 and c.startswith(rev)]
        return hits[0] if len(hits) == 1 else None


def repos_from_cache(root: Path) -> dict[str, Repo]:
    """Every ``models--*`` folder of a hub cache as a Repo (the cache is the Hub's storage)."""
    out: dict[str, Repo] = {}
    for repo_dir in sorted(Path(root).glob("models--*")):
        repo_id = repo_dir.name[len("models--"):].replace("--", "/")
        commits: dict[str, dict[str, Entry]] = {}
        for snap in sorted((repo_dir / "snapshots").iterdir()) if (repo_dir / "snapshots").is_dir() else []:
            files: dict[str, Entry] = {}
            for p in sorted(snap.rglob("*")):
                if p.is_dir():
                    continue
                name = p.relative_to(snap).as_posix()
                real = Path(os.path.realpath(p))
                size = real.stat().st_size
                blob = real.name
                if _SHA256.match(blob):
                    files[name] = Entry(name, real, size, git_blob_sha1(lfs_pointer(blob, size)), blob)
                else:
                    files[name] = Entry(name, real, size, git_blob_sha1(real.read_bytes()), None)
            commits[snap.name] = files
        refs = {}
        for ref in (repo_dir / "refs").rglob("*") if (repo_dir / "refs").is_dir() else []:
            if ref.is_file():
                refs[ref.relative_to(repo_dir / "refs").as_posix()] = ref.read_text().strip()
        out[repo_id] = Repo(repo_id, commits, refs)
    return out


@dataclass
class Hit:
    """One request as the server saw it."""

    method: str
    path: str
    status: int
    sent: int  # body bytes
    server: str  # "hub" | "cdn"
    range: str | None = None
    authorization: bool = False


@dataclass
class HubState:
    """What the servers serve and what they have seen; tests change it between runs."""

    repos: dict[str, Repo]
    hits: list[Hit] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    delay: float = 0.0  # seconds every answer waits (a network round trip; a stalled Hub for timeouts)
    fail_status: int | None = None  # every Hub answer is this error (a Hub outage)
    cdn_base: str = ""
    # route -> mode (HOSTILE_ROUTES, HOSTILE_MODES): the Hub turns hostile on that route
    hostile: dict[str, str] = field(default_factory=dict)

    def record(self, hit: Hit) -> None:
        with self.lock:
            self.hits.append(hit)

    def reset(self) -> None:
        """Forget the requests seen so far."""
        with self.lock:
            self.hits.clear()

    def requests(self) -> int:
        """Requests seen (Hub and CDN)."""
        return len(self.hits)

    def bytes_sent(self, suffix: str | None = None) -> int:
        """Body bytes sent, all or for paths ending with ``suffix``."""
        return sum(h.sent for h in self.hits if suffix is None or h.path.split("?")[0].endswith(suffix))


class _Error(Exception):
    def __init__(self, status: int, code: str | None, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _iso(t: float = 1741737600.0) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(t))


class _Handler(BaseHTTPRequestHandler):
    server_version = "hubserver/1"
    protocol_version = "HTTP/1.1"
    state: HubState
    role: str  # "hub" | "cdn"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass

    # --- plumbing ------------------------------------------------------------------------------
    def _token(self) -> str | None:
        auth = self.headers.get("Authorization") or ""
        return auth[len("Bearer "):] if auth.startswith("Bearer ") else None

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None, head: bool = False,
              length: int | None = None) -> None:
        self.send_response(status)
        hdrs = {"Content-Length": str(len(body) if length is None else length), **(headers or {})}
        for k, v in hdrs.items():
            self.send_header(k, v)
        self.end_headers()
        sent = 0
        if not head and body:
            self.wfile.write(body)
            sent = len(body)
        self.state.record(Hit(self.command, self.path, status, sent, self.role, self.headers.get("Range"),
                              self.headers.get("Authorization") is not None))

    def _json(self, status: int, doc: Any, headers: dict[str, str] | None = None, head: bool = False) -> None:
        self._send(status, json.dumps(doc).encode(), {"Content-Type": "application/json", **(headers or {})}, head)

    def _error(self, e: _Error, head: bool) -> None:
        headers = {"X-Error-Message": e.message}
        if e.code:
            headers["X-Error-Code"] = e.code
        self._json(e.status, {"error": e.message}, headers, head)

    def _serve_bytes(self, entry: Entry, headers: dict[str, str], head: bool) -> None:
        """200, or 206 for a ``Range: bytes=a-b`` request (clamped to the file, as HTTP says)."""
        rng = self.headers.get("Range")
        base = {"Accept-Ranges": "bytes", "Content-Type": "application/octet-stream", **headers}
        if rng:
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())
            if not m or int(m.group(1)) >= max(entry.size, 1):
                self._send(416, b"", {**base, "Content-Range": f"bytes */{entry.size}"}, head)
                return
            start = int(m.group(1))
            end = min(int(m.group(2)) if m.group(2) else entry.size - 1, entry.size - 1)
            body = b"" if head else entry.read(start, end)
            self._send(206, body, {**base, "Content-Range": f"bytes {start}-{end}/{entry.size}"}, head,
                       length=end - start + 1)
            return
        if head:
            self._send(200, b"", base, head=True, length=entry.size)
            return
        self._send(200, entry.read(0, entry.size - 1) if entry.size else b"", base)

    # --- access --------------------------------------------------------------------------------
    def _repo(self, repo_id: str) -> Repo:
        repo = self.state.repos.get(repo_id)
        token = self._token()
        if repo is None or (repo.private and token not in repo.readers):
            # The Hub does not tell a private repo from a missing one; anonymous callers get 401.
            raise _Error(401 if token is None else 404, "RepoNotFound", "Repository not found")
        return repo

    def _check_files_access(self, repo: Repo) -> None:
        token = self._token()
        if repo.gated and token not in repo.readers:
            if token is None:
                raise _Error(401, "GatedRepo", f"Access to model {repo.repo_id} is restricted. You must have access "
                                               "to it and be authenticated to access it. Please log in.")
            raise _Error(403, "GatedRepo", f"Access to model {repo.repo_id} is restricted and you are not in the "
                                           f"authorized list. Visit https://huggingface.co/{repo.repo_id} to ask for access.")

    def _commit(self, repo: Repo, rev: str) -> str:
        commit = repo.commit_of(rev)
        if commit is None:
            raise _Error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        return commit

    # --- routes --------------------------------------------------------------------------------
    def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
        self._dispatch(head=True)

    def do_GET(self) -> None:  # noqa: N802
        self._dispatch(head=False)

    def _dispatch(self, head: bool) -> None:
        try:
            if self.state.delay:  # a slow network or a stalled Hub: both the Hub and its CDN wait
                time.sleep(self.state.delay)
            if self.role == "cdn":
                self._cdn(head)
                return
            if self._hostile(head):
                return
            if self.state.fail_status:
                raise _Error(self.state.fail_status, None, "Internal Error - We're working hard to fix this as soon as possible!")
            url = urlsplit(self.path)
            path = unquote(url.path) if not url.path.startswith("/api/") else url.path
            query = parse_qs(url.query)
            if url.path == "/api/agent-harnesses":  # huggingface_hub >= 2 asks once a day for its user agent
                self._json(200, {"standardEnvVars": [], "harnesses": {}}, head=head)
            elif url.path == "/api/models":
                self._list_models(query, head)
            elif url.path.startswith("/api/models/"):
                self._api(url.path[len("/api/models/"):], query, head)
            elif "/resolve/" in url.path:
                self._resolve(url.path, head)
            else:
                raise _Error(404, None, f"no route for {path}")
        except _Error as e:
            self._error(e, head)
        except (BrokenPipeError, ConnectionResetError):
            pass

    # --- hostile modes -------------------------------------------------------------------------
    def _route(self) -> str | None:
        path = urlsplit(self.path).path
        if path == "/api/models":
            return "search"
        if path == "/api/agent-harnesses":
            return "agent"
        if path.startswith("/api/models/") and not path.endswith("/auth-check") and "/tree/" not in path:
            return "info"
        if "/resolve/" in path:
            return "header" if path.endswith(".safetensors") else "json" if path.endswith(".json") else None
        return None

    def _hostile(self, head: bool) -> bool:
        """Serve the hostile answer of this request's route, if the test asked for one."""
        route = self._route()
        mode = self.state.hostile.get(route) if route else None
        if mode is None or (mode == "bad-commit" and route != "info"):
            return False
        prefix, filler = _PREFIX[route], _FILLER[route]  # type: ignore[index]
        if mode in ("redirect-loop", "cross-host"):
            port = urlsplit(self.state.cdn_base).port
            location = self.path if mode == "redirect-loop" else f"http://localhost:{port}{self.path}"
            self._send(302, b"", {"Location": location}, head)
            return True
        self.close_connection = True
        sent = 0
        try:
            if mode == "silent":
                time.sleep(300)
                return True
            headers = {"Content-Type": "application/json" if route != "header" else "application/octet-stream",
                       "Connection": "close"}
            if mode == "oversized":
                headers["Content-Length"] = str(10 * 1024**3)
            elif mode == "drip":
                headers["Content-Length"] = str(1024**2)
            elif mode == "long-length":
                headers["Content-Length"] = str(len(prefix) + 1024**2)
            elif mode == "short-length":
                headers["Content-Length"] = "10"
            elif mode == "gzip-bomb":
                headers["Content-Encoding"] = "gzip"
            status = 500 if mode == "error-endless" else 200
            if mode in ("injection", "bad-commit"):
                self._injection(route, head, bad_commit=mode == "bad-commit")
                return True
            if mode == "error-endless":
                headers["X-Error-Message"] = "Internal Error"
                prefix, filler = b'{"error": "', b"Internal Error " * 4
            elif route == "header" and self.headers.get("Range"):  # a 206 for a 20 GB file: the client reads on
                m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers["Range"].strip())
                start = int(m.group(1)) if m else 0
                end = int(m.group(2)) if m and m.group(2) else 20 * 10**9 - 1
                headers["Content-Range"] = f"bytes {start}-{end}/{20 * 10**9}"
                status = 206
                if start > 0:
                    prefix = b""
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            if head:
                return True
            if mode == "drip":
                for i in range(1024**2):
                    self.wfile.write((prefix + filler * 1024)[i:i + 1])
                    self.wfile.flush()
                    sent += 1
                    time.sleep(1.0)
            elif mode == "long-length":
                self.wfile.write(prefix)
                sent = len(prefix)
            elif mode == "gzip-bomb":
                z = zlib.compressobj(9, zlib.DEFLATED, 31)
                self.wfile.write(z.compress(prefix) + z.flush(zlib.Z_FULL_FLUSH))
                # After a full flush the compressor starts afresh: the same input gives the same bytes, so one
                # block (~1 MiB decoded from ~1 kB) is sent for ever at no cost to the server.
                block = z.compress(filler * (1024**2 // len(filler))) + z.flush(zlib.Z_FULL_FLUSH)
                while True:
                    self.wfile.write(block)
                    sent += len(block)
            else:  # endless, oversized, short-length: the same bytes for ever
                self.wfile.write(prefix)
                block = filler * (64 * 1024 // len(filler))
                while True:
                    self.wfile.write(block)
                    sent += len(block)
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass
        finally:
            if mode not in ("injection", "bad-commit"):  # those recorded their answer already
                self.state.record(Hit(self.command, self.path, 200, sent, self.role, self.headers.get("Range"),
                                      self.headers.get("Authorization") is not None))
        return True

    def _injection(self, route: str, head: bool, bad_commit: bool = False) -> None:
        """The honest answer of the route, with INJECTION in what gets printed (and, asked, a commit that is not one)."""
        path = urlsplit(self.path).path
        if route == "info":  # another repo's name with escapes, one more file named with them
            repo = self.state.repos[next(iter(self.state.repos))]
            commit = repo.refs["main"]
            siblings = [{"rfilename": e.name, "size": e.size} for e in repo.commits[commit].values()]
            self._json(200, {"id": "victim/other" + INJECTION, "sha": commit[:-4] + INJECTION if bad_commit else commit,
                             "siblings": [*siblings, {"rfilename": "README.md" + INJECTION, "size": 1}]}, head=head)
        elif route == "json":
            name = unquote(path.split("/resolve/", 1)[1].split("/", 1)[1])
            doc: dict[str, Any] = {}
            if name == "config.json":  # a config whose values are printed in findings
                doc = {"architectures": ["Gemma3ForCausalLM" + INJECTION], "model_type": "gemma3_text",
                       "torch_dtype": "float16" + INJECTION, "use_cache": True, "hidden_size": 8,
                       "num_hidden_layers": 1, "num_attention_heads": 1, "num_key_value_heads": 1,
                       "head_dim": 8, "intermediate_size": 8, "vocab_size": 16, "transformers_version": INJECTION}
            self._json(200, doc, head=head)
        else:  # an error whose message (the JSON body's; a header cannot carry escapes) is printed
            self._send(404, json.dumps({"error": INJECTION}).encode(),
                       {"Content-Type": "application/json", "X-Error-Code": "EntryNotFound"}, head)

    def _list_models(self, query: dict[str, list[str]], head: bool) -> None:
        search = (query.get("search") or [""])[0].lower()
        author = (query.get("author") or [None])[0]
        limit = int((query.get("limit") or ["1000"])[0])
        repos = [r for r in self.state.repos.values() if not r.private and search in r.repo_id.lower()
                 and (author is None or r.repo_id.split("/")[0] == author)]
        repos.sort(key=lambda r: (-r.downloads, r.repo_id))
        self._json(200, [{"_id": r.repo_id, "id": r.repo_id, "modelId": r.repo_id, "downloads": r.downloads,
                          "likes": 0, "private": r.private, "gated": r.gated, "tags": [], "createdAt": _iso()}
                         for r in repos[:limit]], head=head)

    def _api(self, rest: str, query: dict[str, list[str]], head: bool) -> None:
        # rest: {repo}[/revision/{rev}|/auth-check|/tree/{rev}[/{path}]]
        m = re.fullmatch(r"(?P<repo>[^/]+(?:/(?!auth-check$|revision/|tree/)[^/]+)?)(?:/(?P<kind>revision|tree)/(?P<rev>[^/]+)(?:/(?P<sub>.*))?|/(?P<auth>auth-check))?", rest)
        if not m:
            raise _Error(404, None, "no such API route")
        repo = self._repo(unquote(m.group("repo")))
        if m.group("auth"):
            self._check_files_access(repo)
            self._json(200, {"access": "read"}, head=head)
            return
        rev = unquote(m.group("rev") or "main")
        commit = self._commit(repo, rev)
        files = repo.commits[commit]
        if m.group("kind") == "tree":
            self._check_files_access(repo)  # listing needs no access on the Hub either, but keep it simple
            sub = (m.group("sub") or "").strip("/")
            entries = [e for e in files.values() if not sub or e.name.startswith(sub + "/")]
            self._json(200, [self._tree_entry(e) for e in entries], head=head)
            return
        blobs = (query.get("blobs") or ["false"])[0].lower() == "true"
        siblings = []
        for e in files.values():
            s: dict[str, Any] = {"rfilename": e.name}
            if blobs:
                s.update({"blobId": e.oid, "size": e.size})
                if e.sha256:
                    s["lfs"] = {"sha256": e.sha256, "size": e.size, "pointerSize": len(lfs_pointer(e.sha256, e.size))}
            siblings.append(s)
        doc = {"_id": repo.repo_id, "id": repo.repo_id, "modelId": repo.repo_id, "author": repo.repo_id.split("/")[0],
               "sha": commit, "lastModified": _iso(), "createdAt": _iso(), "private": repo.private,
               "disabled": False, "gated": repo.gated, "downloads": repo.downloads, "likes": 0,
               "library_name": "transformers", "tags": ["transformers", "safetensors"], "siblings": siblings}
        if blobs:
            doc["usedStorage"] = sum(e.size for e in files.values())
        self._json(200, doc, head=head)

    def _tree_entry(self, e: Entry) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "file", "oid": e.oid, "size": e.size, "path": e.name}
        if e.sha256:
            out["lfs"] = {"oid": e.sha256, "size": e.size, "pointerSize": len(lfs_pointer(e.sha256, e.size))}
        return out

    def _resolve(self, raw_path: str, head: bool) -> None:
        parts = raw_path.lstrip("/").split("/")
        i = parts.index("resolve")
        repo = self._repo(unquote("/".join(parts[:i])))
        rev = unquote(parts[i + 1]) if len(parts) > i + 1 else "main"
        name = unquote("/".join(parts[i + 2:]))
        commit = self._commit(repo, rev)
        self._check_files_access(repo)
        entry = repo.commits[commit].get(name)
        if entry is None:
            raise _Error(404, "EntryNotFound", f"{name} does not exist on \"{rev}\"")
        headers = {"X-Repo-Commit": commit}
        if entry.sha256:
            location = f"{self.state.cdn_base}/lfs/{quote(repo.repo_id)}/{entry.sha256}?name={quote(name)}"
            headers.update({"ETag": f'"{entry.oid}"', "X-Linked-Etag": f'"{entry.sha256}"',
                            "X-Linked-Size": str(entry.size), "Location": location})
            self._send(302, b"", headers, head)
            return
        headers["ETag"] = f'"{entry.oid}"'
        self._serve_bytes(entry, headers, head)

    def _cdn(self, head: bool) -> None:
        url = urlsplit(self.path)
        m = re.fullmatch(r"/lfs/(?P<repo>.+)/(?P<sha>[0-9a-f]{64})", url.path)
        entry = None
        if m:
            repo = self.state.repos.get(unquote(m.group("repo")))
            for files in (repo.commits.values() if repo else ()):
                entry = next((e for e in files.values() if e.sha256 == m.group("sha")), None)
                if entry:
                    break
        if entry is None:
            self._send(404, b"NoSuchKey", {"Content-Type": "text/plain"}, head)
            return
        self._serve_bytes(entry, {"ETag": f'"{entry.sha256}"'}, head)


class HubServer:
    """The Hub and its CDN on 127.0.0.1, on ports the OS picks; ``endpoint`` is what HF_ENDPOINT gets."""

    def __init__(self, repos: dict[str, Repo]) -> None:
        self.state = HubState(repos)
        self._servers: list[ThreadingHTTPServer] = []
        self._threads: list[threading.Thread] = []

    @classmethod
    def from_cache(cls, root: Path) -> HubServer:
        """Serve every repo of a hub cache folder."""
        return cls(repos_from_cache(root))

    def _start_one(self, role: str) -> str:
        handler = type(f"{role}Handler", (_Handler,), {"state": self.state, "role": role})
        srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        srv.daemon_threads = True
        t = threading.Thread(target=srv.serve_forever, name=f"hubserver-{role}", daemon=True)
        t.start()
        self._servers.append(srv)
        self._threads.append(t)
        return f"http://127.0.0.1:{srv.server_address[1]}"

    def start(self) -> HubServer:
        """Start both servers."""
        self.state.cdn_base = self._start_one("cdn")
        self.endpoint = self._start_one("hub")
        return self

    def stop(self) -> None:
        """Stop both servers."""
        for srv in self._servers:
            srv.shutdown()
            srv.server_close()

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def hits(self) -> list[Hit]:
        """Every request seen since the last reset."""
        return list(self.state.hits)


# The token `python -m tests.hubserver` prints: it may read the gated repos it serves.
LOCAL_READER = "hf_local_reader"


def main() -> None:
    """Serve a hub cache folder until interrupted: python -m tests.hubserver CACHE [--open].

    Google's repos are served gated (manual approval) as on the Hub, readable with the printed HF_TOKEN, so both
    README examples reproduce: the check with the token, the gated exit 4 without it. ``--open`` gates nothing.
    """
    import sys

    args = sys.argv[1:]
    repos = repos_from_cache(Path(next(a for a in args if a != "--open")))
    gated = [] if "--open" in args else sorted(r for r in repos if r.startswith("google/"))
    for repo_id in gated:
        repos[repo_id].gated, repos[repo_id].readers = "manual", frozenset({LOCAL_READER})
    with HubServer(repos) as server:
        print(f"HF_ENDPOINT={server.endpoint}", flush=True)
        print(f"HF_TOKEN={LOCAL_READER}", flush=True)
        if gated:
            print(f"# gated (manual) as on the Hub: {', '.join(gated)}; HF_TOKEN above has access, no token gets "
                  "the Hub's 401 (--open: none gated)", file=sys.stderr, flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()

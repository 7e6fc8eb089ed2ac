"""Targets (repo id, model folder, or the whole cache) -> snapshot folders, laid out as huggingface_hub does."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Mapping

from gemma_doctor import fsafe, targets
from gemma_doctor.errors import UsageError

# The hub's own rule for repo names (huggingface_hub validate_repo_id), with ".." refused outright.
_REPO_ID = re.compile(r"^(?:[A-Za-z0-9][\w.\-]{0,95}/)?[A-Za-z0-9][\w.\-]{0,95}$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_HEX = re.compile(r"^[0-9a-f]{7,40}$")


@dataclass(frozen=True)
class RepoProblem:
    """Why a cached repo (or its ref or snapshot) cannot be read safely: reported as a finding for that repo."""

    code: str  # GD020 repo folder, GD021 ref, GD022 snapshot entry (docs/findings.md)
    message: str


@dataclass(frozen=True)
class Snapshot:
    """One folder holding a model's files: a hub-cache snapshot or a plain (save_pretrained) folder."""

    target: str
    path: Path
    repo_id: str | None = None
    revision: str | None = None
    commit: str | None = None
    repo_dir: Path | None = None
    cache_dir: Path | None = None
    # Read from the Hub, not downloaded: ``path`` is where `hf download` would put it in ``cache_dir``.
    remote: bool = False
    # Set when the repo could not be read safely: nothing of it is read or written, a finding says why.
    problem: RepoProblem | None = None

    @property
    def in_cache(self) -> bool:
        """True when the folder is a snapshot of a hub cache (its files may be links into blobs)."""
        return self.repo_dir is not None

    @property
    def state_dir(self) -> Path:
        """Where gemma-doctor keeps its undo record: beside the snapshots, or inside a plain folder."""
        if self.repo_dir is not None:
            return self.repo_dir / ".gemma-doctor"
        return self.path / ".gemma-doctor"

    @property
    def read_root(self) -> Path | None:
        """Links must resolve inside this folder to be read: the repo folder for cache snapshots."""
        return self.repo_dir


def command_args(snapshot: Snapshot) -> str:
    """How to name ``snapshot`` on a gemma-doctor command line so that a copied hint works: the target as typed,
    plus --revision / --cache-dir where they are not the defaults."""
    import shlex

    parts = [shlex.quote(snapshot.target)]
    rev = snapshot.revision
    # A model read from the Hub is named as it will be once downloaded into the same cache.
    if (snapshot.repo_dir is not None or snapshot.remote) and snapshot.target == snapshot.repo_id:
        if rev and rev != "main" and "," not in rev:
            parts.append(f"--revision {shlex.quote(rev)}")
        elif not rev and snapshot.commit:
            parts.append(f"--revision {snapshot.commit}")
        if snapshot.cache_dir is not None and os.path.abspath(snapshot.cache_dir) != os.path.abspath(default_cache_dir()):
            parts.append(f"--cache-dir {shlex.quote(str(snapshot.cache_dir))}")
    return " ".join(parts)


def redownload_command(snapshot: Snapshot, files: list[str | None]) -> str:
    """`hf download REPO FILE... --force-download` for the files a download must replace; a folder that is not a
    cached repo gets `gemma-doctor check` (only its author knows where its files came from)."""
    import shlex

    if snapshot.repo_id is None or (snapshot.repo_dir is None and not snapshot.remote):
        return f"gemma-doctor check {shlex.quote(snapshot.target)}"
    names = sorted({f for f in files if f})
    parts = ["hf download", shlex.quote(snapshot.repo_id), *map(shlex.quote, names)]
    return " ".join(parts) + download_where(snapshot) + " --force-download"


def download_where(snapshot: Snapshot) -> str:
    """The --revision / --cache-dir of redownload_command for ``snapshot`` (each with its leading space), or ""."""
    import shlex

    parts = []
    rev = snapshot.revision if snapshot.revision and snapshot.revision != "main" else None
    if rev is None and not snapshot.revision and snapshot.commit:
        rev = snapshot.commit
    if rev:
        parts.append(f" --revision {shlex.quote(rev)}")
    if snapshot.cache_dir is not None and os.path.abspath(snapshot.cache_dir) != os.path.abspath(default_cache_dir()):
        parts.append(f" --cache-dir {shlex.quote(str(snapshot.cache_dir))}")
    return "".join(parts)


def default_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """The hub cache as huggingface_hub resolves it: HF_HUB_CACHE, HF_HOME/hub, XDG_CACHE_HOME, ~/.cache."""
    env = os.environ if env is None else env

    def expand(p: str) -> str:
        return os.path.expandvars(os.path.expanduser(p))

    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface")
    hub = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or os.path.join(expand(home), "hub")
    return Path(expand(hub))


def repo_folder_name(repo_id: str) -> str:
    """``google/gemma-3-1b-it`` -> ``models--google--gemma-3-1b-it`` (huggingface_hub's naming)."""
    return "models--" + repo_id.replace("/", "--")


def repo_id_from_folder(name: str) -> str | None:
    """``models--google--gemma-3-1b-it`` -> ``google/gemma-3-1b-it``; None for other folders."""
    if not name.startswith("models--"):
        return None
    return name[len("models--"):].replace("--", "/")


class NotCached(UsageError):
    """A valid repo id (or one of its revisions) that is not in the cache: it can still be read from the Hub."""

    def __init__(self, message: str, repo_id: str, revision: str | None = None) -> None:
        super().__init__(message)
        self.repo_id, self.revision = repo_id, revision


def validate_repo_id(repo_id: str) -> None:
    """Refuse repo ids that could name a path outside the cache (``..``, absolute paths)."""
    if ".." in repo_id or "--" in repo_id or not _REPO_ID.fullmatch(repo_id):
        raise UsageError(f"{repo_id!r} is neither an existing folder nor a valid repo id (like google/gemma-3-12b-it)")


def validate_revision(revision: str) -> None:
    parts = revision.split("/")
    if not revision or revision.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\\" in revision:
        raise UsageError(f"--revision {revision!r} is not a valid branch, tag or commit")


def _repo_snapshots(target: str, repo_id: str, repo_dir: Path, cache_dir: Path, revision: str,
                    all_revisions: bool, strict: bool) -> list[Snapshot]:
    """Snapshots of one cached repo for ``revision`` (or all of them); what cannot be read safely is a problem
    snapshot (a finding for the repo), never a crash and never a silent skip."""
    def broken(code: str, message: str, path: Path = repo_dir) -> Snapshot:
        return Snapshot(target, path, repo_id, revision if not all_revisions else None, None, repo_dir, cache_dir,
                        problem=RepoProblem(code, message))

    # A ref read (a commit hash through a real repo folder and a real refs/ folder) says the repo folder is fine; else
    # the repo folder is looked at first, as it always was: a link, or a folder this user cannot enter, is the repo's
    # problem, whatever the ref says.
    area = fsafe.Area(repo_dir)  # one per repo: its root's absolute path worked out once for the ref and the snapshot
    ref = _read_ref(repo_dir, revision, area) if not all_revisions else None
    if not isinstance(ref, str):
        try:
            fsafe.kind(repo_dir / "refs", area)
        except fsafe.Refused as e:
            return [broken("GD020", f"{e}; not read")]
        except OSError as e:
            return [broken("GD020", f"cannot read {repo_dir}: {e.strerror or e}; not checked")]
    if not all_revisions:
        if isinstance(ref, RepoProblem):
            return [broken(ref.code, ref.message)]
        if ref is not None:
            # The ref names the snapshot: no listing needed (a folder this user may only traverse still works).
            path = repo_dir / "snapshots" / ref
            try:
                kind = fsafe.kind(path, area, parts=["snapshots", ref])
            except fsafe.Refused as e:
                return [broken("GD020", f"{e}; not read")]
            except OSError as e:
                return [broken("GD020", f"cannot read {path}: {e.strerror or e}; not checked")]
            if kind == "folder":
                return [Snapshot(target, path, repo_id, revision, ref, repo_dir, cache_dir)]
            if kind == "link":
                return [broken("GD022", f"snapshots/{ref} is a link, which huggingface_hub never makes; not read", path)]
            if strict:
                raise UsageError(f"{repo_id}: ref {revision!r} points to commit {ref[:12]}, which has no snapshot in {repo_dir}")
            return [broken("GD021", f"refs/{revision} points to commit {ref[:12]}, which has no snapshot; "
                                    f"the repo's other snapshots are not what {revision} means")]
    try:
        snaps, bad = _list_snapshots(repo_dir)
    except _Unreadable as e:
        return [broken("GD020", str(e))]
    problems = [broken("GD022", msg, path) for path, msg in bad]
    if all_revisions:
        by_commit = refs_of(repo_dir)
        return problems + [Snapshot(target, s, repo_id, ",".join(sorted(by_commit.get(s.name, []))) or None, s.name,
                                    repo_dir, cache_dir) for s in snaps]
    if _HEX.match(revision):
        hits = [s for s in snaps if s.name.startswith(revision)]
        if len(hits) == 1:
            return [Snapshot(target, hits[0], repo_id, revision, hits[0].name, repo_dir, cache_dir)]
    if not strict:
        # A whole-cache scan of a repo without this ref: every snapshot it has is a candidate.
        return problems + [Snapshot(target, s, repo_id, None, s.name, repo_dir, cache_dir) for s in snaps]
    if problems:
        return problems
    known = sorted(refs_of(repo_dir).items())
    listing = ", ".join(f"{'/'.join(refs)}={c[:12]}" for c, refs in known) or ", ".join(s.name[:12] for s in snaps) or "none"
    raise NotCached(f"{repo_id}: revision {revision!r} is not in the cache (cached: {listing}); "
                    f"download it with: hf download {repo_id} --revision {revision}", repo_id, revision)


def _snapshot_of_path(target: str, path: Path) -> Snapshot:
    """A folder given by path: a plain model folder, a cache snapshot, or a cache repo folder."""
    path = path.absolute()
    if path.parent.name == "snapshots" and path.parent.parent.name.startswith("models--"):
        repo_dir = path.parent.parent
        repo_id = repo_id_from_folder(repo_dir.name)
        refs = refs_of(repo_dir).get(path.name, [])
        return Snapshot(target, path, repo_id, ",".join(sorted(refs)) or None, path.name, repo_dir, repo_dir.parent)
    return Snapshot(target, path)


def resolve(targets: list[str], cache_dir: Path | None = None, revision: str = "main",
            all_revisions: bool = False) -> list[Snapshot]:
    """Turn the command line's targets into snapshot folders; no target means every repo in the cache."""
    validate_revision(revision)
    cache = cache_dir if cache_dir is not None else default_cache_dir()
    if not targets:
        return list(iter_cache(cache, revision, all_revisions))
    out: list[Snapshot] = []
    for target in targets:
        out.extend(_resolve_one(target, cache, revision, all_revisions))
    return out


def clean_path(path: Path) -> Path:
    """``path`` as the user should read it: without ``..`` parts (examples/../.cache -> .cache). Resolved through
    the file system, links included, as the OS resolves ``..`` (a text-only normpath would be wrong after a link)."""
    # Only a path that exists: realpath resolves `..` after a missing part by text (org/.. -> .), where the OS
    # says "no such folder"; such a path stays as typed and fails as typed.
    if ".." not in Path(path).parts or not os.path.exists(path):
        return Path(path)
    return Path(os.path.realpath(path))


def _resolve_one(target: str, cache: Path, revision: str, all_revisions: bool) -> list[Snapshot]:
    url = hub_url(target)
    if url is not None:
        target, revision = url.repo_id, url_revision(url, revision)
        validate_repo_id(target)
        return _cached_repo(target, cache, revision, all_revisions)
    path = clean_path(Path(target).expanduser())
    if _is_file(path):
        # A file of a model folder (config.json, model.safetensors...) names the folder it is in.
        path = path.parent
    if _is_dir(path):
        if path.name.startswith("models--") and _is_dir(path / "snapshots"):
            repo_id = repo_id_from_folder(path.name) or path.name
            return _repo_snapshots(target, repo_id, path.absolute(), path.absolute().parent, revision, all_revisions, strict=True)
        return [_snapshot_of_path(target, path)]
    if os.sep in target and (target.startswith((".", os.sep, "~")) or target.count("/") > 1):
        raise UsageError(f"{target}: no such folder")
    validate_repo_id(target)
    return _cached_repo(target, cache, revision, all_revisions)


def cached_snapshots(repo_id: str, cache: Path, revision: str = "main") -> list[Snapshot]:
    """The cached snapshot of ``repo_id`` at ``revision``, never a folder of that name (NotCached when absent)."""
    validate_repo_id(repo_id)
    return _cached_repo(repo_id, cache, revision, False)


def _cached_repo(repo_id: str, cache: Path, revision: str, all_revisions: bool) -> list[Snapshot]:
    repo_dir = cache / repo_folder_name(repo_id)
    if not _is_dir(repo_dir / "snapshots") and not os.path.lexists(repo_dir):
        raise NotCached(not_cached_message(repo_id, cache), repo_id)
    return _repo_snapshots(repo_id, repo_id, repo_dir, cache, revision, all_revisions, strict=True)


def iter_cache(cache: Path, revision: str = "main", all_revisions: bool = False) -> Iterator[Snapshot]:
    """Every model repo in the cache (datasets and spaces are not models), sorted by name."""
    return snapshots_in(cache, cache_folders(cache), revision, all_revisions)


def cache_folders(cache: Path) -> list[str]:
    """The names in the cache folder, sorted: iter_cache's order (a scan spread over processes cuts this list)."""
    if not _is_dir(cache):
        raise UsageError(f"no Hugging Face cache at {cache}; pass --cache-dir or set HF_HUB_CACHE")
    try:
        return sorted(os.listdir(cache))
    except OSError as e:
        raise UsageError(f"cannot list the cache at {cache}: {e.strerror}") from None


def snapshots_in(cache: Path, names: Iterable[str], revision: str = "main",
                 all_revisions: bool = False) -> Iterator[Snapshot]:
    """The snapshots of the model repos among ``names`` (cache_folders' entries), in their order."""
    for name in names:
        repo_id = repo_id_from_folder(name)
        if repo_id is None:
            continue
        repo_dir = cache / name
        if not _REPO_ID.fullmatch(repo_id):
            yield Snapshot(repo_id, repo_dir, None, None, None, repo_dir, cache,
                           problem=RepoProblem("GD020", f"{name!r} is not the folder of a valid repo name; not read"))
            continue
        yield from _repo_snapshots(repo_id, repo_id, repo_dir, cache, revision, all_revisions, strict=False)


# --- names that miss, and names that mean two things ---------------------------------------------------

def hub_url(target: str) -> targets.HubUrl | None:
    """A Hub web URL given as a target, understood as a repo id (None for anything else)."""
    try:
        return targets.parse_hub_url(target)
    except targets.NotAModelUrl as e:
        raise UsageError(str(e)) from None


def url_revision(url: targets.HubUrl, revision: str) -> str:
    """The revision a URL names (/tree/REV, /blob/REV/...), unless --revision names another one."""
    if url.revision is None or url.revision == revision:
        return revision
    if revision != "main":
        raise UsageError(f"the URL names revision {url.revision!r} but --revision says {revision!r}; drop one")
    return url.revision


def cached_repo_ids(cache: Path) -> list[str]:
    """Every model repo id in the cache (for "did you mean")."""
    try:
        names = os.listdir(cache)
    except OSError:
        return []
    return sorted(r for r in (repo_id_from_folder(n) for n in names) if r)


def cached_commit(cache: Path, repo_id: str, revision: str) -> str | None:
    """The commit the cache's ref ``revision`` of ``repo_id`` points to (None: not cached)."""
    if _COMMIT.match(revision):
        return revision if _is_dir(cache / repo_folder_name(repo_id) / "snapshots" / revision) else None
    commit = _read_ref(cache / repo_folder_name(repo_id), revision)
    return commit if isinstance(commit, str) else None


def not_cached_message(repo_id: str, cache: Path) -> str:
    """Why ``repo_id`` cannot be checked from the cache, with the cached repo it most likely means."""
    cached = cached_repo_ids(cache)
    guesses = targets.suggest(repo_id, cached)
    hint = targets.did_you_mean(guesses, cached)
    # A download hint keeps the org: for a name typed without one, the closest repo that has one.
    name = repo_id if "/" in repo_id else next((g for g in guesses if "/" in g), repo_id)
    return (f"{repo_id} is not in the Hugging Face cache at {cache} (looked for {repo_folder_name(repo_id)}){hint}; "
            f"download it with: hf download {name} --include '*.json' '*.safetensors', "
            f"or pass --cache-dir / a model folder")


def shadow_note(target: str, cache: Path, hub: bool = True) -> str | None:
    """A hint when ``target`` is a folder here and also the id of a cached repo: the folder wins, as in
    transformers' from_pretrained, but the user most likely meant the cached model (``hub``: the command can
    also read the Hub's copy with --remote)."""
    if os.path.isabs(target) or target.startswith((".", "~")) or not _REPO_ID.match(target) or "--" in target:
        return None
    if not _is_dir(target):
        return None
    repo_dir = cache / repo_folder_name(target)
    if not _is_dir(repo_dir / "snapshots"):
        return None
    return (f"{target} is a folder here ({os.path.abspath(target)}) and also a cached repo; using the folder. "
            f"For the cached model name it by path ({repo_dir}) or run from another folder"
            + ("; for the Hub's: --remote" if hub else ""))


def repo_target(target: str, revision: str) -> tuple[str, str] | None:
    """(repo id, revision) when ``target`` names a repo (an id or a Hub URL) rather than a folder; else None."""
    url = hub_url(target)
    if url is not None:
        validate_repo_id(url.repo_id)
        return url.repo_id, url_revision(url, revision)
    if os.path.isabs(target) or target.startswith((".", "~")) or "--" in target or ".." in target:
        return None
    return (target, revision) if _REPO_ID.match(target) else None


# --- reading refs and snapshot folders safely (every path below the repo folder opened without following links) ---

class _Unreadable(Exception):
    """The repo folder or its snapshots folder cannot be read safely; the message says why."""


_MAX_REF_BYTES = 256


def _is_file(path: Path) -> bool:
    """os.path.isfile that also says False for names the OS refuses (too long, NUL bytes)."""
    try:
        return os.path.isfile(path)
    except (OSError, ValueError):
        return False


def _is_dir(path: Path) -> bool:
    """os.path.isdir that also says False for names the OS refuses (too long, NUL bytes)."""
    try:
        return os.path.isdir(path)
    except (OSError, ValueError):
        return False


def _list_snapshots(repo_dir: Path) -> tuple[list[Path], list[tuple[Path, str]]]:
    """(snapshot folders named by a commit hash, [(entry, why it is refused)]) of a repo folder; _Unreadable when
    the repo folder or its snapshots folder is not a real, readable folder. A repo without snapshots has none."""
    area = fsafe.Area(repo_dir)
    try:
        entries = fsafe.list_dir(repo_dir / "snapshots", area)
    except fsafe.Refused as e:
        raise _Unreadable(f"{e}; not read") from None
    except OSError as e:
        raise _Unreadable(f"cannot read {repo_dir}: {e.strerror or e}; not checked") from None
    good: list[Path] = []
    bad: list[tuple[Path, str]] = []
    for e in entries:
        path = repo_dir / "snapshots" / e.name
        if e.kind == "folder" and _COMMIT.match(e.name):
            good.append(path)
        elif e.kind == "link":
            bad.append((path, f"snapshots/{e.name} is a link, which huggingface_hub never makes; not read"))
        elif e.kind == "folder":
            bad.append((path, f"snapshots/{e.name!r} is not named by a commit hash; not read"))
    return good, bad


def _read_ref(repo_dir: Path, revision: str, area: fsafe.Area | None = None) -> str | RepoProblem | None:
    """The commit hash ``refs/<revision>`` holds; None when there is no such ref; a problem when it is not a hash.
    ``revision``: a valid one (validate_revision) or a name listed below refs/; ``area``: the repo folder's, when the
    caller has it."""
    # The path as text and its components as known (no Path made and cut up again: a scan asks this once per repo).
    got = fsafe.read_file(os.path.join(repo_dir, "refs", revision), _MAX_REF_BYTES, area or fsafe.Area(repo_dir),
                          follow=False, parts=["refs", *revision.split("/")])
    if not got.exists or got.error == "is a folder, not a file":
        return None  # missing, or a folder of nested refs (pr/1)
    if got.error:
        return RepoProblem("GD021", f"refs/{revision}: {got.error}")
    commit = (got.data or b"").decode("utf-8", errors="replace").strip()
    if not _COMMIT.match(commit):
        shown = commit if len(commit) <= 60 else commit[:60] + "..."
        return RepoProblem("GD021", f"refs/{revision} holds {shown!r}, not a commit hash; the repo is not read")
    return commit


def refs_of(repo_dir: Path) -> dict[str, list[str]]:
    """commit -> ref names pointing at it (``main``, ``pr/1``...); refs that are links or not hashes are left out."""
    out: dict[str, list[str]] = {}
    area = fsafe.Area(repo_dir)

    def walk(folder: Path, prefix: str, depth: int) -> None:
        try:
            entries = fsafe.list_dir(folder, area)
        except (fsafe.Refused, OSError):
            return
        for e in entries[:1000]:
            if e.kind == "folder" and depth < 4:
                walk(folder / e.name, f"{prefix}{e.name}/", depth + 1)
            elif e.kind == "file":
                commit = _read_ref(repo_dir, f"{prefix}{e.name}")
                if isinstance(commit, str):
                    out.setdefault(commit, []).append(f"{prefix}{e.name}")

    walk(repo_dir / "refs", "", 0)
    return out

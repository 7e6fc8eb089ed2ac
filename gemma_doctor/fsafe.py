"""File-safety primitives: every path gemma-doctor reads or writes in a model folder, resolved at the moment of use.

The model (docs/reliability.md, "Threat model"): anyone who can write a repo folder of a shared cache may plant
links, FIFOs, hard links and odd names in it, and swap a folder for a link between two of our system calls. So
no path below a repo folder is ever handed to the kernel whole. Each operation starts from a descriptor of the
repo folder (an :class:`Area`) and opens one component at a time relative to its parent, with ``O_NOFOLLOW``:

- writes, renames, deletions and our own state (``.gemma-doctor/``) go through real folders only; a link
  anywhere on the way is refused, and the last component is replaced by rename, never written through;
- reads of snapshot files follow links only while every step stays inside the repo folder (``..`` cannot climb
  above it, an absolute target must name a place inside it), as the hub's ``../../blobs/<hash>`` links do;
- files are opened ``O_NONBLOCK`` and checked with ``fstat`` before a byte is read, so a FIFO or device is
  refused instead of hanging, and reads are bounded.

A folder the user named on the command line (the cache folder, a plain model folder) is trusted as a whole:
links in *its* path are the user's choice. The lock is taken the same way (``flock`` on a descriptor opened
relative to the state folder, no truncation), so neither a link nor a hard link at its path can redirect it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Iterator

from gemma_doctor.errors import LockTimeout, WriteError

# Temp files of write_file / write_link: ".<name>.gemma-doctor-<pid>-<hex>.tmp".
TEMP_GLOB = ".*.gemma-doctor-*.tmp"
TEMP_NAME = re.compile(r"^\..+\.gemma-doctor-\d+-[0-9a-f]{8}\.tmp$")

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_OPEN_DIR = os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC
# Folders only passed through are opened O_PATH where the OS has it: like a path lookup, it needs search (x)
# permission only, so a folder this user may traverse but not list (mode 711) reads as it always did.
_PASS_DIR = (getattr(os, "O_PATH", 0) or os.O_RDONLY) | _DIRECTORY | _NOFOLLOW | _CLOEXEC
_OPEN_READ = os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC
# The kernel's own limit on links followed while resolving one path.
MAX_LINKS = 40
# Every primitive below needs the *at() system calls; without them (Windows) gemma-doctor refuses to write.
SUPPORTED = bool(_NOFOLLOW and _DIRECTORY and {os.open, os.stat, os.mkdir, os.unlink, os.symlink,
                                                os.readlink, os.rename} <= os.supports_dir_fd)


class Refused(Exception):
    """A path gemma-doctor will not use: it leads out of the repo folder, runs through a link where none may be,
    or is not what it has to be (a regular file, a folder). ``str()`` is the one-line reason."""

    def __init__(self, reason: str, *, escapes: bool = False, link_target: str | None = None,
                 why: str | None = None) -> None:
        super().__init__(reason)
        self.escapes = escapes
        self.link_target = link_target
        self.why = why  # for a link that leads out: what was wrong with where it leads (the blob store's refusals)


@dataclass(frozen=True)
class Area:
    """The folder a run may touch for one model: a cache repo folder, or a plain model folder.

    ``user_named``: a folder the user named (a plain ``save_pretrained`` folder): the folder itself may be a link
    (``./latest -> checkpoint-500``) and links of its files are followed when reading (``local_dir`` downloads link
    into the cache). A cache repo folder (``models--org--name``) may not be a link, and its files are read only
    through links that stay inside it. Writes never go through a link in either.
    """

    root: Path
    user_named: bool = False
    # The folders passed through, held open while one model's files are read (Area.holding); None: none are held.
    folders: Folders | None = field(default=None, compare=False, repr=False)

    def holding(self) -> Holding:
        """This area, its folders held open for a block's reads (``with area.holding() as held:``, then read with
        ``held``): each folder on the way to a file (the repo folder, ``snapshots/<commit>``, ``blobs``) is opened once,
        as the walk opens it (a real folder, never through a link, reached from the one before), and every later walk
        through it starts from that descriptor instead of walking again from the root's path. A descriptor is the
        folder it was opened as, whatever is renamed or swapped for a link at its name afterwards, so a read through a
        held folder sees that folder as the walk found it; the file itself, and any link on the way, is still opened
        and followed at each read. Closed when the block ends (a read after that walks from the root again)."""
        return Holding(Area(self.root, self.user_named, Folders()))

    def _held(self) -> Folders | None:
        f = self.folders
        return f if f is not None and f.fds is not None else None

    def open_root(self, readable: bool = True) -> int:
        """A descriptor of the folder itself (the caller closes it); ``readable`` False: only to pass through."""
        flags = _OPEN_DIR if readable else _PASS_DIR
        if self.user_named:
            flags &= ~_NOFOLLOW
        try:
            return os.open(self.root, flags)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR) and not self.user_named and os.path.islink(self.root):
                raise Refused(f"{self.root} is a link", escapes=True) from None
            if e.errno == errno.ENOTDIR:
                raise Refused(f"{self.root} is not a folder") from None
            raise

    @cached_property
    def _absolute_root(self) -> str:
        """The root's absolute path, worked out once per Area."""
        return _absolute(self.root)

    def parts(self, path: Path | str) -> list[str]:
        """The components of ``path`` below the root (lexically); Refused when it is not below it."""
        # Strings, not pathlib: a whole-cache scan asks this a few times per repo.
        full, root = _absolute(path), self._absolute_root
        if full == root:
            return []
        prefix = root if root.endswith(os.sep) else root + os.sep
        if not full.startswith(prefix):
            raise Refused(f"{path} is not inside {self.root}")
        return full[len(prefix):].split(os.sep)


class Folders:
    """Descriptors of the real folders below an area's root held open for one model's reads, by their components
    below the root (``()`` the root itself): opened only to pass through (``O_PATH``, ``O_NOFOLLOW``)."""

    __slots__ = ("fds",)

    def __init__(self) -> None:
        self.fds: dict[tuple[str, ...], int] | None = {}

    def close(self) -> None:
        """Close every held descriptor; later walks hold none."""
        fds, self.fds = self.fds, None
        for fd in (fds or {}).values():
            try:
                os.close(fd)
            except OSError:
                pass


class Holding:
    """Area.holding's context: the held area on entry, its folders closed on exit."""

    __slots__ = ("area",)

    def __init__(self, area: Area) -> None:
        self.area = area

    def __enter__(self) -> Area:
        return self.area

    def __exit__(self, *exc: object) -> None:
        self.area.folders.close()  # type: ignore[union-attr]


# The most folders one holding keeps open. A hub read passes through four (the repo folder, snapshots/, the snapshot,
# blobs/); a walk beyond that opens and closes its folders as an unheld walk does, so a hostile link leading through
# thousands of nested folders (a target of 4,095 bytes down and up again, 40 links of them) holds no more descriptors
# than the walk itself would have: held all, they ran a scan out of descriptors (ulimit -n 1024) where the unheld walk
# read the file.
HELD_MAX = 8


def _pass_root(area: Area, held: Folders | None) -> tuple[int, bool]:
    """(descriptor of the area's root to pass through, whether the caller closes it)."""
    if held is None:
        return area.open_root(readable=False), True
    fd = held.fds.get(())  # type: ignore[union-attr]
    if fd is None:
        fd = held.fds[()] = area.open_root(readable=False)  # type: ignore[index]
    return fd, False


def _pass_at(held: Folders | None, dir_fd: int, names: list[str], name: str) -> tuple[int, bool]:
    """(descriptor of the real folder ``name`` in ``dir_fd``, the folder ``names`` below the root, opened only to pass
    through and never through a link; whether the caller closes it). OSError as os.open raises it."""
    if held is None:
        return os.open(name, _PASS_DIR, dir_fd=dir_fd), True
    fds = held.fds
    key = (*names, name)
    fd = fds.get(key)  # type: ignore[union-attr]
    if fd is None:
        fd = os.open(name, _PASS_DIR, dir_fd=dir_fd)
        if len(fds) >= HELD_MAX:  # type: ignore[arg-type]
            return fd, True  # held no more: this one is the walk's own, closed as it leaves it
        fds[key] = fd  # type: ignore[index]
    return fd, False


def _absolute(path: Path | str) -> str:
    """os.path.abspath(path); a text that is already absolute and normal (no empty, "." or ".." component, no
    trailing slash: what a cache path built by joining names is) is its own answer, without normpath's work."""
    text = os.fspath(path)
    if (text[:1] == "/" and text[1:2] != "/" and "//" not in text and "/." not in text and not text.endswith("/")):
        return text
    return os.path.abspath(text)


def area_of(path: Path) -> Area:
    """The area of a file the caller names directly: its own folder, trusted as named."""
    return Area(path.parent, user_named=True)


# --- walking below a root --------------------------------------------------------------------------

def _kind_at(dir_fd: int, name: str) -> str:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return "missing"
    if stat.S_ISLNK(st.st_mode):
        return "link"
    if stat.S_ISDIR(st.st_mode):
        return "folder"
    return "file" if stat.S_ISREG(st.st_mode) else "special"


def _open_dir_at(dir_fd: int, name: str, parts: list[str], area: Area, create: bool = False,
                 readable: bool = True) -> int:
    """Open the real folder ``name`` (``parts`` below the area's root) from ``dir_fd``, never through a link;
    create it when asked."""
    for _ in range(3):
        try:
            return os.open(name, _OPEN_DIR if readable else _PASS_DIR, dir_fd=dir_fd)
        except FileNotFoundError:
            if not create:
                raise
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o777, dir_fd=dir_fd)
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                raise
            shown = os.path.join(area.root, *parts)
            if _kind_at(dir_fd, name) == "link":
                raise Refused(f"{shown} is a link", escapes=True) from None
            raise Refused(f"{shown} is not a folder") from None
    raise OSError(errno.ENOENT, f"{os.path.join(area.root, *parts)} keeps vanishing")


def _walk(area: Area, parts: list[str], create: bool = False, readable: bool = True) -> int:
    """A new descriptor of the real folder ``parts`` below the area's root, no link followed on the way.

    ``readable``: the last folder is opened for listing and fsync; otherwise (and the folders on the way) only
    to pass through."""
    fd = area.open_root(readable=readable and not parts)
    try:
        for i, part in enumerate(parts):
            if part in ("", ".", ".."):
                raise Refused(f"{os.path.join(area.root, *parts[:i + 1])}: not a plain path")
            nxt = _open_dir_at(fd, part, parts[:i + 1], area, create, readable=readable and i == len(parts) - 1)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def _parent(path: Path | str, area: Area, create: bool = False, readable: bool = True) -> Iterator[tuple[int, str]]:
    """(descriptor of the real folder holding ``path``, its name): the place where ``path`` is written."""
    fd, name = _open_parent(path, area, create, readable)
    try:
        yield fd, name
    finally:
        os.close(fd)


def _open_parent(path: Path | str, area: Area, create: bool = False, readable: bool = True,
                 parts: list[str] | None = None) -> tuple[int, str]:
    """_parent's (descriptor, name) without the context manager: the caller closes the descriptor (``parts``: see
    open_file)."""
    if parts is None:
        parts = area.parts(path)
    if not parts:
        raise Refused(f"{path} is the area's root, not a file in it")
    return _walk(area, parts[:-1], create, readable), parts[-1]


def _split(target: str) -> list[str]:
    return [p for p in target.split("/") if p not in ("", ".")]


_REAL_ROOTS: dict[str, str] = {}


def forget_roots() -> None:
    """Drop memoised real paths of roots; called at the start of every run, as folders may have moved."""
    _REAL_ROOTS.clear()


def _inner_of_absolute(root: Path, target: str) -> list[str] | None:
    """The components of an absolute link target below ``root`` (as named, or its real path); None when it is
    elsewhere. huggingface_hub writes absolute links (rarely) from the cache path as named, not resolved."""
    key = os.fspath(root)
    real = _REAL_ROOTS.get(key)
    if real is None:
        real = _REAL_ROOTS[key] = os.path.realpath(root)
    norm = os.path.normpath(target)
    for base in {os.path.abspath(root), real}:
        base = base.rstrip(os.sep) or os.sep
        if norm == base:
            return []
        prefix = base if base.endswith(os.sep) else base + os.sep
        if norm.startswith(prefix) and target.startswith(prefix):
            # Walked from the root's descriptor, component by component: the string test only picks the start.
            return _split(target[len(prefix):])
    return None


def _resolve(area: Area, parts: list[str], open_last: int | None = None) -> tuple[int, str, str | None]:
    """Follow ``parts`` below the root, links included as long as every step stays inside it.

    Returns (new descriptor of the final folder, final name, the link target of ``parts``' own last component when
    it is a link). Raises Refused (escapes=True) when a link leads out, OSError when a component is missing.
    ``open_last`` (flags with O_NOFOLLOW): the final name is opened with them, and the descriptor returned is the
    opened file's (a link met there is read and followed as anywhere else): one open instead of a look and an open.
    The folders on the way are the area's held ones where it holds them (Area.holding).
    """
    held = area._held()
    root_fd, own_root = _pass_root(area, held)
    stack = [root_fd]
    owned = [own_root]  # whether each descriptor of the stack is this call's to close (a held one is not)
    names: list[str] = []  # the real folders of stack[1:], by name below the root
    todo = list(reversed(parts))
    own_target: str | None = None
    links = 0
    first = True  # the last component of the path as given (its link target is reported)
    # A hub snapshot's files are links (huggingface_hub makes every one a link into blobs/): the link is read first,
    # where an open with O_NOFOLLOW would only fail with ELOOP before it (a regular file there costs one readlink).
    hub_file = not area.user_named and len(parts) == 3 and parts[0] == "snapshots"
    try:
        while todo:
            name = todo.pop()
            if name in ("", "."):
                continue
            if name == "..":
                if len(stack) == 1:
                    raise Refused("a link leads out of the repo folder", escapes=True)
                fd = stack.pop()
                if owned.pop():
                    os.close(fd)
                names.pop()
                continue
            if todo:
                try:
                    fd, own = _pass_at(held, stack[-1], names, name)
                    stack.append(fd)
                    owned.append(own)
                    names.append(name)
                    continue
                except OSError as e:
                    if e.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK) or _kind_at(stack[-1], name) != "link":
                        raise
            elif open_last is not None and not (first and hub_file):
                try:
                    return os.open(name, open_last, dir_fd=stack[-1]), name, own_target
                except OSError as e:
                    if e.errno != errno.ELOOP:
                        raise
            elif open_last is None and _kind_at(stack[-1], name) != "link":
                return _own(stack, owned), name, own_target
            try:
                target = os.readlink(name, dir_fd=stack[-1])
            except OSError as e:
                if e.errno == errno.EINVAL:  # not a link (or no longer one: replaced meanwhile); look at it again
                    todo.append(name)
                    links += 1
                    if links > MAX_LINKS:
                        raise
                    hub_file = False
                    continue
                raise
            if first and not todo and own_target is None:
                own_target = target
            links += 1
            if links > MAX_LINKS:
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP))
            if not todo and names == ["blobs"] and not area.user_named:
                digest = shared_store_digest(target)
                if digest is not None:
                    # The repo's own blob is huggingface_hub's link into the cache-wide store (>= 1.32).
                    fd, last = _open_store_entry(area, digest, open_last)
                    return fd, last, own_target
            if target.startswith("/"):  # os.path.isabs on POSIX, the only system _resolve runs on (SUPPORTED)
                inner = _inner_of_absolute(area.root, target)
                if inner is None:
                    raise Refused(f"a link leads out of the repo folder ({target})", escapes=True, link_target=target)
                for fd, own in zip(stack[1:], owned[1:]):
                    if own:
                        os.close(fd)
                del stack[1:], owned[1:]
                names.clear()
                todo.extend(reversed(inner))
            else:
                todo.extend(reversed(_split(target)))
            first = False
        # the path was the root itself (or collapsed to it)
        return _own(stack, owned), ".", own_target
    finally:
        for fd, own in zip(stack, owned):
            if own:
                os.close(fd)


def _own(stack: list[int], owned: list[bool]) -> int:
    """The last folder of a walk's stack as a descriptor the caller closes (popped; a held one duplicated)."""
    fd = stack.pop()
    return fd if owned.pop() else os.dup(fd)


# --- huggingface_hub's cache-wide blob store (huggingface_hub >= 1.32, utils/_shared_blobs.py) ---------------------
# A file downloaded through hf_xet is moved to <cache>/blobs/<2 hex>/<64 hex xet hash> (a regular file; the store is
# marked by <cache>/blobs/.huggingface-shared-blobs holding "1\n") and the repo's blobs/<etag> becomes a relative link
# to it, always written as os.path.relpath from the repo's blobs folder: "../../blobs/<2 hex>/<64 hex>". That one
# link, from that one folder, is the only way out of a repo folder that a read follows.

SHARED_STORE = "blobs"
SHARED_STORE_MARKER = ".huggingface-shared-blobs"
SHARED_STORE_LAYOUT = b"1\n"
_STORE_LINK = re.compile(r"\.\./\.\./blobs/([0-9a-f]{2})/([0-9a-f]{64})")
_REPO_FOLDER = re.compile(r"(?:models|datasets|spaces)--.+")


def shared_store_digest(target: str) -> str | None:
    """The store entry's hash when ``target`` is exactly the link huggingface_hub writes from a repo's blobs folder
    into the cache-wide store; None for any other text."""
    m = _STORE_LINK.fullmatch(target)
    if m is None or m.group(2)[:2] != m.group(1):
        return None
    return m.group(2)


def _open_store_entry(area: Area, digest: str, open_last: int | None) -> tuple[int, str]:
    """(descriptor, name) of the store entry ``digest`` of the cache holding the area's repo folder: with
    ``open_last``, the entry opened with those flags (O_NOFOLLOW); else the entry's folder and its name.

    Each step is opened relative to the one before, never following a link: the store folder, its marker (a regular
    file holding the layout version), the prefix folder. The cache folder itself is the user's (named by an option or
    the environment), so a link in its path is their choice, as for the repo folder's own path."""
    root = area._absolute_root
    cache, repo = os.path.split(root.rstrip(os.sep))
    if not _REPO_FOLDER.fullmatch(repo):
        raise Refused("a link leads out of the repo folder", escapes=True)
    cache_fd = os.open(cache or os.sep, _PASS_DIR & ~_NOFOLLOW)
    try:
        store_fd = _store_folder(cache_fd, SHARED_STORE, "the blob store folder")
    finally:
        os.close(cache_fd)
    try:
        if not _store_marked(store_fd):
            raise _store_refusal("the blob store has no huggingface_hub marker")
        prefix_fd = _store_folder(store_fd, digest[:2], "a blob store folder")
    finally:
        os.close(store_fd)
    if open_last is None:
        return prefix_fd, digest
    try:
        return os.open(digest, open_last, dir_fd=prefix_fd), digest
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _store_refusal("the blob store entry is a link, not the file huggingface_hub stores") from None
        raise
    finally:
        os.close(prefix_fd)


def _store_folder(dir_fd: int, name: str, what: str) -> int:
    """A descriptor of the real folder ``name`` of the store (only to pass through); refused when it is a link."""
    try:
        return os.open(name, _PASS_DIR, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _store_refusal(f"{what} is a link or not a folder") from None
        raise


def _store_refusal(why: str) -> Refused:
    return Refused(f"a link leads out of the repo folder into the cache's blob store, but {why}", escapes=True, why=why)


def _store_marked(store_fd: int) -> bool:
    """True when the store folder holds huggingface_hub's marker: a regular file reading exactly "1\n"."""
    try:
        fd = os.open(SHARED_STORE_MARKER, _OPEN_READ, dir_fd=store_fd)
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.read(fd, 8) == SHARED_STORE_LAYOUT
    except OSError:
        return False
    finally:
        os.close(fd)


def _own_link_target(area: Area, parts: list[str]) -> str | None:
    """The target of ``parts``' last component when it is a link, read without following anything."""
    try:
        with _parent(os.path.join(area.root, *parts), area, readable=False) as (fd, name):
            return os.readlink(name, dir_fd=fd)
    except (OSError, Refused):
        return None


# --- reading -----------------------------------------------------------------------------------------

# No __eq__/__hash__/__repr__ made: never compared, hashed or shown (each made method costs start-up time).
@dataclass(frozen=True, eq=False, repr=False)
class Opened:
    """A regular file opened for reading: its descriptor (the caller closes it), fstat, and the link it came by."""

    fd: int
    st: os.stat_result
    link_target: str | None

    @property
    def ident(self) -> tuple[int, int]:
        """(device, inode): the same file, whatever name or link it was reached by."""
        return self.st.st_dev, self.st.st_ino


def _check_regular(fd: int, shown: Path) -> os.stat_result:
    st = os.fstat(fd)
    if stat.S_ISDIR(st.st_mode):
        raise Refused("is a folder, not a file")
    if not stat.S_ISREG(st.st_mode):
        # A FIFO would block every read without a writer, a device never ends: only regular files are read.
        raise Refused("not a regular file (a pipe, socket or device); not read")
    return st


def open_file(path: Path | str, area: Area | None = None, *, follow: bool = True, confine: bool = True,
              parts: list[str] | None = None) -> Opened:
    """Open the regular file ``path`` for reading, at the moment of use.

    With an ``area`` and ``confine``, links are followed only while they stay inside the area's root (with
    ``follow=False`` not at all: our own state files are never links). Without an area (or confine False, a
    plain folder the user named) the path is opened as the user gave it. Raises Refused with the reason,
    FileNotFoundError when there is nothing there, OSError for the rest. ``parts``: ``area.parts(path)`` where the
    caller already has them (a scan knows each repo's ``refs/main`` and ``snapshots/<commit>/<name>``): the same
    walk from the root, one component at a time, without working the components out of the path again (a
    whole-cache scan read 2,500 files per 1,000 repos, each path made into text and cut up again).
    """
    if area is not None and confine and not SUPPORTED:
        # No descriptor-relative calls here (Windows): a realpath check, then the open (writes are refused).
        if not _inside_by_realpath(path, area.root):
            raise Refused("link points outside the repo folder", escapes=True, link_target=_readlink(path))
        area = None
    if area is None or not confine:
        link_target = None
        with contextlib.suppress(OSError):
            link_target = os.readlink(path)
        flags = os.O_RDONLY | _NONBLOCK | _CLOEXEC | (0 if follow else _NOFOLLOW)
        try:
            fd = os.open(path, flags)
        except OSError as e:
            if not follow and e.errno == errno.ELOOP:
                raise Refused(f"{path} is a link; refusing to read through it", link_target=link_target) from None
            raise
        try:
            return Opened(fd, _check_regular(fd, path), link_target)
        except BaseException:
            os.close(fd)
            raise
    if parts is None:
        parts = area.parts(path)
    if follow:
        held = area._held()
        if (held is not None and len(parts) == 3 and parts[0] == "snapshots" and not area.user_named
                and _plain(parts[1]) and _plain(parts[2])):
            got = _hub_file(area, held, parts[1], parts[2])
            if got is not None:
                fd, link_target = got
                try:
                    return Opened(fd, _check_regular(fd, path), link_target)
                except BaseException:
                    os.close(fd)
                    raise
        try:
            # the file itself opened at the end of the walk (O_NOFOLLOW: a link there is followed by the walk)
            fd, _name, link_target = _resolve(area, parts, open_last=_OPEN_READ)
        except Refused as e:
            raise Refused(str(e), escapes=e.escapes, link_target=_own_link_target(area, parts), why=e.why) from None
    else:
        dir_fd = _walk(area, parts[:-1], readable=False)
        try:
            fd = os.open(parts[-1], _OPEN_READ, dir_fd=dir_fd)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise Refused(f"{path} is a link; refusing to read through it") from None
            raise
        finally:
            os.close(dir_fd)
        link_target = None
    try:
        return Opened(fd, _check_regular(fd, path), link_target)
    except BaseException:
        os.close(fd)
        raise


def _plain(name: str) -> bool:
    """A name of one folder entry: not "", "." or "..", no "/" (what _resolve would walk as several steps)."""
    return "/" not in name and name not in ("", ".", "..")


def _hub_file(area: Area, held: Folders, commit: str, name: str) -> tuple[int, str] | None:
    """(descriptor, link target) of a held area's ``snapshots/<commit>/<name>`` where it is what huggingface_hub makes,
    a link ``../../blobs/<blob>`` to a regular file of the repo's own blobs folder: the link read in the held snapshot
    folder, the blob opened (``O_NOFOLLOW``) in the held ``blobs`` folder, the two folders reached as _resolve reaches
    them. That is the walk _resolve makes for this link, step for step; None for anything else (any error included),
    which _resolve then walks and reports as it always did."""
    mine: list[int] = []  # folders opened past HELD_MAX: this read's own, closed as it returns
    try:
        root_fd = _kept(_pass_root(area, held), mine)
        snaps = _kept(_pass_at(held, root_fd, [], "snapshots"), mine)
        snap = _kept(_pass_at(held, snaps, ["snapshots"], commit), mine)
        target = os.readlink(name, dir_fd=snap)
        blob = target[12:] if target.startswith("../../blobs/") else ""
        if not blob or "/" in blob or blob == "." or blob == "..":
            return None
        blobs = _kept(_pass_at(held, root_fd, [], "blobs"), mine)
        return os.open(blob, _OPEN_READ, dir_fd=blobs), target
    except (OSError, ValueError):
        return None
    finally:
        for fd in mine:
            os.close(fd)


def _kept(got: tuple[int, bool], mine: list[int]) -> int:
    """The descriptor of a (descriptor, the caller closes it) pair, noted in ``mine`` where the caller closes it."""
    if got[1]:
        mine.append(got[0])
    return got[0]


def _readlink(path: Path) -> str | None:
    try:
        return os.readlink(path)
    except (OSError, ValueError):
        return None


def _inside_by_realpath(path: Path, root: Path) -> bool:
    try:
        real, real_root = os.path.realpath(path), os.path.realpath(root)
    except (OSError, ValueError):
        return False
    return os.path.commonpath([real, real_root]) == real_root


def read_fd(fd: int, limit: int, size: int | None = None) -> bytes:
    """Up to ``limit`` bytes from ``fd`` (fewer only at the end of the file). ``size``: the file's size by fstat, a
    hint for the first read (a file read whole then costs one read of its size and one more byte, instead of a 1 MiB
    buffer and a read that meets its end); the result is the same whatever the hint. A first read that asked for more
    than the size and got the size exactly has read the file to the end it had at that read (a regular file's read
    returns fewer bytes than asked only at its end): no further read is made to meet it."""
    chunks: list[bytes] = []
    left = limit
    step = min(size + 1, 1 << 20) if size is not None and size >= 0 else 1 << 20
    while left > 0:
        asked = min(left, step)
        b = os.read(fd, asked)
        if not b:
            break
        chunks.append(b)
        left -= len(b)
        if len(b) == size and len(b) < asked and len(chunks) == 1:
            break
        step = 1 << 16 if len(b) < step else 1 << 20  # short: most likely at the end, which a small read meets
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


# No __eq__/__hash__/__repr__ made: never compared, hashed or shown (each made method costs start-up time).
@dataclass(frozen=True, eq=False, repr=False)
class FileRead:
    """One small file as read: its bytes (at most ``limit`` + 1), or why it was not read."""

    exists: bool
    data: bytes | None = None
    link_target: str | None = None
    error: str | None = None
    escapes: bool = False
    mode: int = 0
    too_large: bool = False  # larger than the limit by its size: not read at all (read_file's ``unread_over``)

    @property
    def is_link(self) -> bool:
        """True when the name itself is a link."""
        return self.link_target is not None


def read_file(path: Path | str, limit: int, area: Area | None = None, *, follow: bool = True, confine: bool = True,
              unread_over: bool = False, parts: list[str] | None = None) -> FileRead:
    """Read at most ``limit`` + 1 bytes of the regular file ``path`` (see open_file for ``area`` and ``parts``). Never
    raises. With ``unread_over``, a file whose size is over ``limit`` is not read at all (``too_large``, no data)."""
    try:
        opened = open_file(path, area, follow=follow, confine=confine, parts=parts)
    except Refused as e:
        target = e.link_target
        if e.escapes:
            why = f"; {e.why}" if e.why else ""
            return FileRead(True, link_target=target, escapes=True,
                            error=f"link points outside the repo folder ({target}){why}" if target else f"{e}; not read")
        return FileRead(True, link_target=target, error=str(e))
    except FileNotFoundError:
        target = _dangling_target(path, area, confine)
        if target is not None:
            return FileRead(True, link_target=target, error=f"link to a missing file ({target})")
        return FileRead(False)
    except (OSError, ValueError) as e:
        # Permission denied on a folder on the way: something may well be there; say so rather than "missing".
        return FileRead(True, error=f"cannot read: {getattr(e, 'strerror', None) or e}")
    if unread_over and opened.st.st_size > limit:
        os.close(opened.fd)
        return FileRead(True, None, opened.link_target, error=f"larger than {limit} bytes; not read",
                        mode=stat.S_IMODE(opened.st.st_mode), too_large=True)
    try:
        data = read_fd(opened.fd, limit + 1, opened.st.st_size)
    except OSError as e:
        return FileRead(True, link_target=opened.link_target, error=f"cannot read: {e.strerror or e}")
    finally:
        os.close(opened.fd)
    return FileRead(True, data, opened.link_target, mode=stat.S_IMODE(opened.st.st_mode))


def _dangling_target(path: Path, area: Area | None, confine: bool) -> str | None:
    if area is None or not confine:
        try:
            return os.readlink(path)
        except (OSError, ValueError):
            return None
    try:
        return _own_link_target(area, area.parts(path))
    except Refused:
        return None


def read_user_file(path: str | Path, limit: int) -> bytes:
    """A file the user named (a training config, a requirements file): at most ``limit`` + 1 bytes, never blocking.

    Raises Refused (not a regular file) or OSError; the caller turns them into its own message.
    """
    opened = open_file(Path(path))
    try:
        return read_fd(opened.fd, limit + 1)
    finally:
        os.close(opened.fd)


def inside(path: Path, root: Path) -> bool:
    """True when ``path`` resolves inside ``root`` without a link leading out (links inside are followed)."""
    try:
        fd, _name, _target = _resolve(Area(root), Area(root).parts(path))
    except (Refused, OSError, ValueError):
        return False
    os.close(fd)
    return True


def _link_parts(area: Area, path: Path, target: str) -> list[str]:
    """The components below the root that a link at ``path`` to ``target`` names: an absolute target's own; a
    relative one's from ``path``'s folder, whose name its leading ``..`` steps leave as text.

    A link is read or written only in the real folder at ``path``'s place (reached without following a link), whose
    parent is the one named: so ``../../blobs/<hash>`` from ``snapshots/<commit>/`` is ``blobs/<hash>``, and a
    snapshot folder swapped for a link (or moved away) a moment after it was opened is not walked again to find
    where the link leads (restore blamed the record or the blob for such a swap). Refused when it leads out."""
    if os.path.isabs(target):
        inner = _inner_of_absolute(area.root, target)
        if inner is None:
            raise Refused(f"a link leads out of the repo folder ({target})", escapes=True, link_target=target)
        return inner
    folder, rest = area.parts(path)[:-1], _split(target)
    ups = 0
    while ups < len(rest) and rest[ups] == "..":
        ups += 1
    if ups > len(folder):
        raise Refused("a link leads out of the repo folder", escapes=True)
    return folder[:len(folder) - ups] + rest[ups:]


def link_stays_inside(path: Path, target: str, root: Path) -> bool:
    """True when a link at ``path`` to ``target`` would resolve inside ``root`` (checked before it exists)."""
    area = Area(root)
    try:
        fd, _name, _t = _resolve(area, _link_parts(area, path, target))
    except (Refused, OSError, ValueError):
        return False
    os.close(fd)
    return True


@dataclass(frozen=True)
class Current:
    """A file of a model folder as it is at one instant: a link (with the bytes it leads to) or a regular file."""

    exists: bool
    link_target: str | None = None
    data: bytes | None = None  # None: missing, unreadable, not a regular file, a link leading out, too large
    mode: int = 0o644
    kind: str = "missing"  # "file" | "link" | "folder" | "special" | "missing"
    why: str = ""  # why it could not be read (a link on the way, a missing folder), when that is known
    mtime_ns: int | None = None  # the file's own modification time (a link's own, not its target's)


def current(path: Path, area: Area, limit: int) -> Current:
    """The state of ``path`` in one consistent look, for comparing it with what a plan or the undo record expects.

    A link is judged by its target string: the bytes come from resolving that string (inside the area's root for
    a cache), never from re-resolving the name, which a concurrent run may have replaced meanwhile.
    """
    with _parent(path, area, readable=False) as (dir_fd, name):
        for _ in range(MAX_LINKS):
            try:
                fd = os.open(name, _OPEN_READ, dir_fd=dir_fd)
            except FileNotFoundError:
                return Current(False)
            except OSError as e:
                if e.errno != errno.ELOOP:
                    return Current(True, kind=_kind_at(dir_fd, name))
                try:
                    target = os.readlink(name, dir_fd=dir_fd)
                    mtime: int | None = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mtime_ns
                except OSError:
                    continue  # replaced by a file meanwhile: look again
                data, mode = _through_link(path, target, area, limit)
                return Current(True, target, data, mode, "link", mtime_ns=mtime)
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    return Current(True, mode=stat.S_IMODE(st.st_mode),
                                   kind="folder" if stat.S_ISDIR(st.st_mode) else "special")
                data = read_fd(fd, limit + 1)
                return Current(True, None, data if len(data) <= limit else None, stat.S_IMODE(st.st_mode), "file",
                               mtime_ns=st.st_mtime_ns)
            finally:
                os.close(fd)
    return Current(True, kind="special")


def _open_through(path: Path, target: str, area: Area) -> Opened:
    """Open the regular file a link at ``path`` to ``target`` leads to (inside the root, for a cache area)."""
    if area.user_named:
        return open_file(Path(target) if os.path.isabs(target) else path.parent / target)
    dir_fd, name, _t = _resolve(area, _link_parts(area, path, target))
    try:
        fd = os.open(name, _OPEN_READ, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    try:
        return Opened(fd, _check_regular(fd, path), target)
    except BaseException:
        os.close(fd)
        raise


def _through_link(path: Path, target: str, area: Area, limit: int) -> tuple[bytes | None, int]:
    """(bytes, mode) of the file a link at ``path`` to ``target`` leads to; (None, 0o644) when it cannot be read."""
    try:
        opened = _open_through(path, target, area)
    except (Refused, OSError, ValueError):
        return None, 0o644
    try:
        data = read_fd(opened.fd, limit + 1)
    except OSError:
        return None, 0o644
    finally:
        os.close(opened.fd)
    return (data if len(data) <= limit else None), stat.S_IMODE(opened.st.st_mode)


def leads_to_file(path: Path, target: str, area: Area) -> bool:
    """True when a link at ``path`` to ``target`` would lead to a regular file (inside the root, for a cache area)."""
    try:
        opened = _open_through(path, target, area)
    except (Refused, OSError, ValueError):
        return False
    os.close(opened.fd)
    return True


# --- writing ---------------------------------------------------------------------------------------

def tmp_name(path: Path) -> Path:
    """A temp file name beside ``path`` that the next run's sweep recognises as ours."""
    import secrets  # only a write needs it (hmac, hashlib, random): check's start-up does without

    return path.with_name(f".{path.name}.gemma-doctor-{os.getpid()}-{secrets.token_hex(4)}.tmp")


def fsync_dir(folder: Path | int) -> None:
    """Make a rename in ``folder`` (a path or a descriptor) durable (best effort: not every file system supports it)."""
    with contextlib.suppress(OSError):
        if isinstance(folder, int):
            os.fsync(folder)
            return
        fd = os.open(folder, os.O_RDONLY | _CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _refusal(e: Refused) -> WriteError:
    return WriteError(f"{e}; refusing to write through it")


def write_file(path: Path, data: bytes, mode: int, area: Area | None = None, make_folders: bool = False,
               mtime_ns: int | None = None) -> None:
    """Atomically make ``path`` a regular file holding ``data`` with permissions ``mode`` (umask does not apply).

    Temp file beside it (``O_EXCL | O_NOFOLLOW``), fsync, rename, all relative to the real folder holding it, which
    is reached from the area's root without following a link. A link at ``path`` is replaced, never written
    through, so the blob it pointed at is untouched; a hard link elsewhere keeps its bytes for the same reason.
    ``make_folders``: create missing folders on the way (our own state folder); otherwise a missing folder (a
    snapshot folder someone moved away) is an error, never made anew holding one file. ``mtime_ns``: the modification
    time the file gets (restore's original's), set on the temp file before it is renamed into place.
    """
    area = area or area_of(path)
    try:
        with _parent(path, area, create=make_folders) as (dir_fd, name):
            tmp = tmp_name(Path(name)).name
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, mode & 0o777, dir_fd=dir_fd)
                try:
                    view = memoryview(data)
                    while view:
                        n = os.write(fd, view)
                        view = view[n:]
                    # On the descriptor: the umask shaped the mode os.open gave, and a path could be swapped meanwhile.
                    os.fchmod(fd, mode & 0o777)
                    if mtime_ns is not None:
                        os.utime(fd, ns=(os.fstat(fd).st_atime_ns, mtime_ns))
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except BaseException:
                # Ctrl-C included: the temp file goes, the target was never touched (an OSError becomes the
                # WriteError below).
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=dir_fd)
                raise
            fsync_dir(dir_fd)
    except Refused as e:
        raise _refusal(e) from None
    except OSError as e:
        raise WriteError(f"cannot write {path}: {e.strerror or e}; it was left as it was") from None


def write_link(path: Path, target: str, area: Area | None = None, mtime_ns: int | None = None) -> None:
    """Atomically make ``path`` a symlink to ``target`` (a new link beside it, then rename); ``mtime_ns``: the link's
    own modification time, where the system can set a link's (Linux can)."""
    area = area or area_of(path)
    try:
        with _parent(path, area) as (dir_fd, name):
            tmp = tmp_name(Path(name)).name
            try:
                os.symlink(target, tmp, dir_fd=dir_fd)
                if mtime_ns is not None and os.utime in os.supports_follow_symlinks:
                    with contextlib.suppress(OSError):  # a link's time is not worth failing a restore for
                        os.utime(tmp, ns=(mtime_ns, mtime_ns), dir_fd=dir_fd, follow_symlinks=False)
                os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=dir_fd)
                raise
            fsync_dir(dir_fd)
    except Refused as e:
        raise _refusal(e) from None
    except OSError as e:
        raise WriteError(f"cannot restore the link {path}: {e.strerror or e}; it was left as it was") from None


def remove(path: Path, area: Area, folder: bool = False) -> bool:
    """Delete the file (or empty folder) ``path``, never through a link; False when it is not there (or not empty)."""
    try:
        with _parent(path, area) as (dir_fd, name):
            if folder:
                os.rmdir(name, dir_fd=dir_fd)
            else:
                os.unlink(name, dir_fd=dir_fd)
            fsync_dir(dir_fd)
            return True
    except FileNotFoundError:
        return False
    except OSError as e:
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
            return False
        raise WriteError(f"cannot remove {path}: {e.strerror or e}") from None
    except Refused as e:
        raise _refusal(e) from None


# No __eq__/__hash__/__repr__ made: never compared, hashed or shown (each made method costs start-up time).
@dataclass(frozen=True, eq=False, repr=False)
class Entry:
    """One name in a folder, as lstat sees it."""

    name: str
    kind: str  # "file" | "link" | "folder" | "special"


def list_dir(path: Path, area: Area) -> list[Entry]:
    """The entries of the real folder ``path`` (empty when it is missing); Refused when it is a link."""
    if not SUPPORTED:  # see open_file: by path, after a realpath check
        if os.path.islink(path):
            raise Refused(f"{path} is a link", escapes=True)
        if not _inside_by_realpath(path, area.root):
            raise Refused(f"{path} leads outside the repo folder", escapes=True)
        if not os.path.isdir(path):
            return []
        fd = None
    else:
        try:
            fd = _walk(area, area.parts(path))
        except FileNotFoundError:
            return []
    target = fd if fd is not None else path
    try:
        out = []
        with os.scandir(target) as it:
            for e in it:
                try:
                    kind = ("link" if e.is_symlink() else "folder" if e.is_dir(follow_symlinks=False)
                            else "file" if e.is_file(follow_symlinks=False) else "special")
                except OSError:
                    kind = "special"
                out.append(Entry(e.name, kind))
        return sorted(out, key=lambda e: e.name)
    finally:
        if fd is not None:
            os.close(fd)


def kind(path: Path | str, area: Area, parts: list[str] | None = None) -> str:
    """What ``path`` is, without following a link anywhere on the way or at the end: "file", "folder", "link",
    "special" or "missing"; Refused when a folder on the way is a link. Needs search permission only. ``parts``: see
    open_file."""
    try:  # without _parent's context manager: a whole-cache scan asks this once per repo
        dir_fd, name = _open_parent(path, area, readable=False, parts=parts)
    except FileNotFoundError:
        return "missing"
    try:
        return _kind_at(dir_fd, name)
    finally:
        os.close(dir_fd)


def writable(path: Path, area: Area) -> bool:
    """True when this user may write the file ``path`` itself (a link counts as writable: it is replaced)."""
    try:
        with _parent(path, area, readable=False) as (dir_fd, name):
            if _kind_at(dir_fd, name) != "file":
                return True
            return os.access(name, os.W_OK, dir_fd=dir_fd, follow_symlinks=False)
    except (OSError, Refused):
        return True  # the write itself will say why it cannot happen


# --- the lock ----------------------------------------------------------------------------------

# No __eq__/__hash__/__repr__ made: never compared, hashed or shown (each made method costs start-up time).
@dataclass(frozen=True, eq=False, repr=False)
class Held:
    """A held lock (its path and area): the holder may delete the lock file and its folder before releasing."""

    path: Path
    area: Area


@contextlib.contextmanager
def locked(path: Path, timeout: float, area: Area | None = None) -> Iterator[Held]:
    """Hold the lock file ``path`` (``flock``); a clear LockTimeout when another process keeps it too long.

    The lock file is opened relative to its folder's descriptor with ``O_NOFOLLOW`` and never truncated or
    written, so a link or hard link planted at its path changes nothing. Its folder is created (never through
    a link). A holder may delete the lock file before releasing (undo.tidy): a waiter that then gets the lock on
    the deleted file sees it has no name any more and starts again on the new one.
    """
    area = area or area_of(path)
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        got = _try_lock(path, area)
        if got is not None:
            break
        if time.monotonic() >= deadline:
            raise LockTimeout(f"another gemma-doctor has held {path} for over {timeout:g}s; try again when it is done "
                              f"(or raise --lock-timeout)")
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 0.1)
    fd, dir_fd, _name = got
    try:
        yield Held(path, area)
    finally:
        os.close(fd)  # releases the flock
        os.close(dir_fd)


def _try_lock(path: Path, area: Area) -> tuple[int, int, str] | None:
    """(lock fd, folder fd, name) when the lock was taken now; None when another process holds it."""
    import fcntl  # POSIX only; SUPPORTED is False elsewhere and writing is refused before this

    try:
        parts = area.parts(path)
        dir_fd = _walk(area, parts[:-1], create=True)
    except Refused as e:
        raise WriteError(f"{e}; refusing to write through it") from None
    except OSError as e:
        raise WriteError(f"cannot create the lock folder {path.parent}: {e.strerror or e}") from None
    name = parts[-1]
    try:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_CREAT | _NOFOLLOW | _NONBLOCK | _CLOEXEC, 0o644, dir_fd=dir_fd)
        except FileNotFoundError:
            os.close(dir_fd)
            return None  # its folder was just removed by the holder that finished: start again
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise WriteError(f"the lock {path} is a link; refusing to use it") from None
            raise WriteError(f"cannot take the lock {path}: {e.strerror or e}") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(dir_fd)
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise WriteError(f"the lock {path} is not a regular file; refusing to use it")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise WriteError(f"cannot take the lock {path}: {e.strerror or e}") from None
            os.close(fd)
            os.close(dir_fd)
            return None
        if not _still_named(fd, dir_fd, name):
            os.close(fd)
            os.close(dir_fd)
            return None
        return fd, dir_fd, name
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        with contextlib.suppress(OSError):
            os.close(dir_fd)
        raise


def _still_named(fd: int, dir_fd: int, name: str) -> bool:
    """True when the locked file is still the one named ``name`` in a folder that still exists."""
    try:
        mine = os.fstat(fd)
        there = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        return mine.st_nlink > 0 and os.fstat(dir_fd).st_nlink > 0 and (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino)
    except OSError:
        return False

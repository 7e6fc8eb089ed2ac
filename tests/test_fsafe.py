"""gemma_doctor.fsafe on its own: every answer of the descriptor-based file layer on real folders, links, FIFOs and
sockets, and no descriptor left open on any path through it (a whole-cache scan calls it thousands of times, and a
leak per call would end it with EMFILE). tests/test_attacker.py attacks the same layer through the CLI."""

from __future__ import annotations

import errno
import fcntl
import gc
import os
import socket
import threading
from pathlib import Path

import pytest

from gemma_doctor import fsafe
from gemma_doctor.errors import LockTimeout, WriteError
from gemma_doctor.fsafe import Area, Refused


def _fds() -> dict[str, str]:
    """This process's open descriptors and what each is open on."""
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            out[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor, closed by now
            pass
    return out


@pytest.fixture
def no_leak():
    """Fails the test when it leaves a descriptor open (one open now that was not before, or open on something
    else); descriptors that garbage collection closes meanwhile do not count."""
    gc.collect()
    before = _fds()
    yield
    left = {fd: what for fd, what in _fds().items() if before.get(fd) != what}
    assert not left, f"file descriptors left open: {left}"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repo folder with a snapshot holding a regular file, and a victim folder outside it."""
    root = tmp_path / "models--org--m"
    (root / "snapshots" / "abc").mkdir(parents=True)
    (root / "snapshots" / "abc" / "config.json").write_bytes(b'{"a": 1}')
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / "secret").write_bytes(b"secret")
    return root


# --- the area's root -------------------------------------------------------------------------------------------

def test_a_cache_area_whose_root_is_a_link_is_refused_as_an_escape(repo, tmp_path, no_leak):
    (tmp_path / "linked").symlink_to(repo)
    with pytest.raises(Refused, match="is a link") as e:
        Area(tmp_path / "linked").open_root()
    assert e.value.escapes is True
    # the folder a user names may be reached through a link (``./latest -> checkpoint-500``)
    os.close(Area(tmp_path / "linked", user_named=True).open_root())


def test_a_file_the_user_names_is_read_through_a_linked_folder(repo, tmp_path, no_leak):
    (tmp_path / "latest").symlink_to(repo / "snapshots" / "abc")
    path = tmp_path / "latest" / "config.json"
    assert fsafe.area_of(path).user_named is True
    assert fsafe.read_file(path, 100, fsafe.area_of(path)).data == b'{"a": 1}'
    assert fsafe.read_file(path, 100, Area(path.parent)).data is None  # as a cache folder it would be refused


# --- following links inside the root ----------------------------------------------------------------------------

def test_a_link_to_the_root_itself_by_absolute_path_stays_inside(repo, no_leak):
    (repo / "snapshots" / "home").symlink_to(repo)  # absolute: the root itself
    path = repo / "snapshots" / "home" / "snapshots" / "abc" / "config.json"
    assert fsafe.inside(path, repo) is True
    assert fsafe.read_file(path, 100, Area(repo)).data == b'{"a": 1}'


def test_a_path_that_collapses_to_the_root_is_inside(repo, no_leak):
    (repo / "dot").symlink_to(".")
    assert fsafe.inside(repo / "dot", repo) is True
    assert fsafe.link_stays_inside(repo / "up", ".", repo) is True


def test_inside_and_link_stays_inside_say_false_for_everything_that_leaves(repo, tmp_path, no_leak):
    (repo / "out").symlink_to(tmp_path / "victim")
    assert fsafe.inside(tmp_path / "victim" / "secret", repo) is False  # not below the root at all
    assert fsafe.inside(repo / "out" / "secret", repo) is False  # through a link that leads out
    assert fsafe.inside(repo / "missing" / "x", repo) is False  # a folder on the way is missing: not shown inside
    assert fsafe.inside(repo / "snapshots" / "new", repo) is True  # a name not there yet, in a real folder inside
    assert fsafe.link_stays_inside(tmp_path / "victim" / "l", "secret", repo) is False  # the link itself is outside
    assert fsafe.link_stays_inside(repo / "l", str(tmp_path / "victim"), repo) is False  # absolute, outside
    assert fsafe.link_stays_inside(repo / "l", str(repo / "snapshots"), repo) is True  # absolute, inside
    assert fsafe.link_stays_inside(repo / "l", "../victim", repo) is False


# --- reading ---------------------------------------------------------------------------------------------------

def test_read_file_reads_one_byte_past_the_limit_so_the_caller_sees_it_is_over(repo, no_leak):
    path = repo / "snapshots" / "abc" / "ten"
    path.write_bytes(b"0123456789")
    assert fsafe.read_file(path, 4, Area(repo)).data == b"01234"
    assert fsafe.read_file(path, 9, Area(repo)).data == b"0123456789"
    assert fsafe.read_file(path, 10, Area(repo)).data == b"0123456789"
    assert fsafe.read_user_file(path, 4) == b"01234"


def test_open_file_without_following_refuses_a_link_and_says_where_it_leads(repo, tmp_path, no_leak):
    link = tmp_path / "l"
    link.symlink_to(repo / "snapshots" / "abc" / "config.json")
    with pytest.raises(Refused, match="is a link; refusing to read through it") as e:
        fsafe.open_file(link, follow=False)
    assert e.value.link_target == str(repo / "snapshots" / "abc" / "config.json")
    with pytest.raises(FileNotFoundError):  # nothing there is not a link
        fsafe.open_file(tmp_path / "nothing", follow=False)
    opened = fsafe.open_file(link)  # followed when asked
    os.close(opened.fd)
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(OSError) as e2:  # a link loop followed is the system's error, not "is a link"
        fsafe.open_file(loop)
    assert not isinstance(e2.value, Refused) and e2.value.errno == errno.ELOOP


def test_special_files_are_refused_after_opening_without_a_leaked_descriptor(repo, tmp_path, no_leak):
    fifo = repo / "snapshots" / "abc" / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(Refused, match="not a regular file"):
        fsafe.open_file(fifo)
    with pytest.raises(Refused, match="not a regular file"):
        fsafe.open_file(fifo, Area(repo))
    assert fsafe.read_file(fifo, 10, Area(repo)).data is None
    (repo / "to-fifo").symlink_to("snapshots/abc/fifo")
    assert fsafe.leads_to_file(repo / "to-fifo", "snapshots/abc/fifo", Area(repo)) is False
    assert fsafe.leads_to_file(repo / "to-cfg", "snapshots/abc/config.json", Area(repo)) is True
    assert fsafe.leads_to_file(repo / "to-none", "snapshots/abc/none", Area(repo)) is False


def test_a_dangling_link_the_user_named_reports_its_target(tmp_path, no_leak):
    (tmp_path / "dangling").symlink_to("nowhere")
    got = fsafe.read_file(tmp_path / "dangling", 10)
    assert (got.exists, got.data, got.link_target, got.error) == (True, None, "nowhere", "link to a missing file (nowhere)")


# --- one consistent look at a file (fix/restore compare it with their plan) --------------------------------------

def test_current_tells_each_kind_of_file(repo, tmp_path, no_leak):
    snap = repo / "snapshots" / "abc"
    area = Area(repo)
    assert fsafe.current(snap / "none", area, 100) == fsafe.Current(False)
    got = fsafe.current(snap / "config.json", area, 100)
    assert (got.exists, got.kind, got.data, got.link_target) == (True, "file", b'{"a": 1}', None)
    assert fsafe.current(snap / "config.json", area, 3).data is None  # too large: no bytes, never a prefix
    os.mkfifo(snap / "fifo")
    assert (fsafe.current(snap / "fifo", area, 100).exists, fsafe.current(snap / "fifo", area, 100).kind) == (True, "special")
    (snap / "sub").mkdir()
    assert (fsafe.current(snap / "sub", area, 100).exists, fsafe.current(snap / "sub", area, 100).kind) == (True, "folder")
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(snap / "sock"))  # opening a socket fails (ENXIO): it is there, and special
        assert fsafe.current(snap / "sock", area, 100) == fsafe.Current(True, kind="special")
    finally:
        sock.close()
    (snap / "ln").symlink_to("config.json")
    got = fsafe.current(snap / "ln", area, 100)
    assert (got.exists, got.kind, got.link_target, got.data) == (True, "link", "config.json", b'{"a": 1}')


def test_current_follows_a_link_in_a_user_named_folder_wherever_it_leads(tmp_path, no_leak):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (tmp_path / "shared.json").write_bytes(b"{}")
    (folder / "rel.json").symlink_to("../shared.json")
    (folder / "abs.json").symlink_to(tmp_path / "shared.json")
    area = fsafe.area_of(folder / "rel.json")
    assert fsafe.current(folder / "rel.json", area, 100).data == b"{}"
    assert fsafe.current(folder / "abs.json", area, 100).data == b"{}"
    # in a cache folder the same links lead out and are not read
    assert fsafe.current(folder / "rel.json", Area(folder), 100).data is None


# --- folders ---------------------------------------------------------------------------------------------------

def test_kind_and_writable_answer_without_following_links(repo, no_leak):
    area = Area(repo)
    snap = repo / "snapshots" / "abc"
    (snap / "ln").symlink_to("config.json")
    assert [fsafe.kind(p, area) for p in (snap / "config.json", snap / "ln", snap, snap / "none", repo / "no" / "x")] \
        == ["file", "link", "folder", "missing", "missing"]
    assert fsafe.writable(snap / "ln", area) is True  # a link is replaced, not written through
    assert fsafe.writable(snap / "none", area) is True  # a new file: the write will tell
    assert fsafe.writable(repo / "no" / "x", area) is True


def test_remove_says_false_for_what_is_not_there_or_not_empty(repo, no_leak):
    area = Area(repo)
    assert fsafe.remove(repo / "snapshots", area, folder=True) is False
    assert (repo / "snapshots" / "abc" / "config.json").exists()
    assert fsafe.remove(repo / "none", area) is False
    assert fsafe.remove(repo / "snapshots" / "abc" / "config.json", area) is True


# --- writing ---------------------------------------------------------------------------------------------------

def test_a_write_that_fails_is_a_write_error_and_leaves_nothing_behind(repo, no_leak):
    area = Area(repo)
    snap = repo / "snapshots" / "abc"
    # the temp name beside a 250-byte name is too long for the file system
    with pytest.raises(WriteError, match="cannot write .*; it was left as it was"):
        fsafe.write_file(snap / ("x" * 250), b"{}", 0o644, area)
    with pytest.raises(WriteError, match="cannot restore the link .*; it was left as it was"):
        fsafe.write_link(snap / ("x" * 250), "config.json", area)
    # a folder holding a file cannot be replaced by a file or a link: the temp file and temp link are removed
    (snap / "folder").mkdir()
    (snap / "folder" / "kept").write_bytes(b"1")
    with pytest.raises(WriteError):
        fsafe.write_file(snap / "folder", b"{}", 0o644, area)
    with pytest.raises(WriteError):
        fsafe.write_link(snap / "folder", "config.json", area)
    assert sorted(os.listdir(snap)) == ["config.json", "folder"]
    assert (snap / "folder" / "kept").read_bytes() == b"1"


def test_fsync_dir_by_path_closes_what_it_opens(repo, no_leak):
    for _ in range(3):
        fsafe.fsync_dir(repo)


# --- the lock --------------------------------------------------------------------------------------------------

def _hold(path: Path) -> int:
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def test_a_held_lock_times_out_cleanly_and_a_released_one_is_taken(repo, no_leak):
    lock = repo / ".gemma-doctor" / "lock"
    with fsafe.locked(lock, 5.0, Area(repo)):
        pass  # creates the folder and the lock file
    held = _hold(lock)  # another open file description: flock excludes it as it would another process
    try:
        with pytest.raises(LockTimeout, match="another gemma-doctor has held"):
            with fsafe.locked(lock, 0.05, Area(repo)):
                pass
    finally:
        os.close(held)
    # held now, released by another thread a moment later: the waiter keeps trying until it gets it
    held = _hold(lock)
    release = threading.Timer(0.2, os.close, (held,))
    release.start()
    try:
        with fsafe.locked(lock, 60.0, Area(repo)) as got:
            assert got.path == lock
    finally:
        release.join()


def test_a_lock_path_that_is_not_a_regular_file_is_refused_without_a_leaked_descriptor(repo, tmp_path, no_leak):
    state = repo / ".gemma-doctor"
    state.mkdir()
    os.mkfifo(state / "lock")
    with pytest.raises(WriteError, match="is not a regular file; refusing to use it"):
        with fsafe.locked(state / "lock", 1.0, Area(repo)):
            pass
    os.unlink(state / "lock")
    (state / "lock").symlink_to(tmp_path / "victim" / "secret")
    with pytest.raises(WriteError, match="is a link; refusing to use it"):
        with fsafe.locked(state / "lock", 1.0, Area(repo)):
            pass
    assert (tmp_path / "victim" / "secret").read_bytes() == b"secret"


# --- platforms without descriptor-relative calls (Windows): the realpath fallback ----------------------------------

@pytest.fixture
def by_path(monkeypatch):
    """The path-based fallback fsafe uses where O_NOFOLLOW/O_DIRECTORY and *at() calls are missing. Its code is
    plain os.path and runs here as it would there; only the switch is set."""
    monkeypatch.setattr(fsafe, "SUPPORTED", False)


def test_the_fallback_refuses_a_link_that_leads_out_and_reads_one_that_stays(repo, tmp_path, by_path, no_leak):
    snap = repo / "snapshots" / "abc"
    (snap / "out").symlink_to(tmp_path / "victim" / "secret")
    (snap / "in").symlink_to("config.json")
    with pytest.raises(Refused, match="outside the repo folder") as e:
        fsafe.open_file(snap / "out", Area(repo))
    assert (e.value.escapes, e.value.link_target) == (True, str(tmp_path / "victim" / "secret"))
    assert fsafe.read_file(snap / "in", 100, Area(repo)).data == b'{"a": 1}'
    assert fsafe.read_file(snap / "config.json", 100, Area(repo)).data == b'{"a": 1}'


def test_the_fallback_lists_real_folders_only(repo, tmp_path, by_path, no_leak):
    (repo / "elsewhere").symlink_to(tmp_path / "victim")
    (repo / "inner").symlink_to("snapshots")
    assert [(e.name, e.kind) for e in fsafe.list_dir(repo / "snapshots" / "abc", Area(repo))] == [("config.json", "file")]
    assert fsafe.list_dir(repo / "none", Area(repo)) == []
    (repo / "plain").write_bytes(b"")
    assert fsafe.list_dir(repo / "plain", Area(repo)) == []  # not a folder
    for path, why in ((repo / "elsewhere", "is a link"), (repo / "inner", "is a link"),  # inside or out
                      (tmp_path / "victim", "leads outside the repo folder"),
                      (repo / "elsewhere" / "sub", "leads outside the repo folder")):
        with pytest.raises(Refused, match=why) as e:
            fsafe.list_dir(path, Area(repo))
        assert e.value.escapes is True


def test_the_fallback_treats_an_unresolvable_path_as_outside(repo):
    assert fsafe._inside_by_realpath(Path("bad\0name"), repo) is False
    assert fsafe._inside_by_realpath(repo / "snapshots", repo) is True
    assert fsafe._inside_by_realpath(repo.parent / "victim", repo) is False
    assert fsafe._readlink(repo / "snapshots") is None


def test_absolute_is_abspath():
    """fsafe._absolute (abspath without normpath's work for a text already absolute and normal) is os.path.abspath,
    on every path of a small alphabet that can spell every case (empty, '.', '..' and '...' components, '//', a
    leading '//', a trailing slash, dot files)."""
    import itertools
    import os

    from gemma_doctor.fsafe import _absolute

    for n in range(1, 8):
        for chars in itertools.product("a./", repeat=n):
            for text in ("/" + "".join(chars), "".join(chars)):
                assert _absolute(text) == os.path.abspath(text), text

"""Hostile and broken input: every byte sequence a checkpoint (or a tampered cache) can hold gets a clear
message and leaves the cache as it was; the readers never raise anything but the project's own errors.

Bad configs at `check` level are in test_check.py, malformed safetensors headers in test_safetensors.py,
hostile repo ids in test_locate.py; here they meet `fix --inplace` and `restore`, plus what those miss.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gemma_doctor import undo
from gemma_doctor.readers.jsonfile import MAX_JSON_BYTES, parse_json_object, read_json_file
from gemma_doctor.readers.safetensors_header import DTYPE_BITS, parse_header, read_header
from tests import as_nobody
from tests.builders import HubCache, example_file, gemma2_config, gemma3_12b_config, tree_state


# These tests exercise the on-disk fix, planned only where transformers 4.50.x will run (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("plan_450")

REPO = "google/gemma-3-12b-it"
ROOT = Path(__file__).resolve().parent.parent


def _state(root: Path) -> dict[str, tuple[str, str]]:
    """Every file but the lock files (taking the lock is allowed to leave one)."""
    return {k: v for k, v in tree_state(root).items() if not k.startswith(".locks")}


# --- config.json: every broken shape is refused by `fix --inplace`, nothing written --------------------

BROKEN_CONFIGS = {
    "empty": (b"", "empty file"),
    "whitespace only": (b"  \n\t ", "empty file"),
    "binary": (bytes(range(256)), "not UTF-8"),
    "latin-1 text": ('{"model_type": "gemma2", "name": "caf\u00e9"}'.encode("latin-1"), "not UTF-8 text (byte 0xe9"),
    "byte-order mark": (b"\xef\xbb\xbf" + json.dumps(gemma2_config()).encode(), "byte-order mark"),
    "deeply nested": (b'{"a": ' + b"[" * 200_000 + b"]" * 200_000 + b"}", "nested too deeply"),
    "array": (b"[1, 2, 3]", "top level is a JSON array"),
    "string": (b'"gemma"', "top level is a JSON string"),
    "null": (b"null", "top level is a JSON null"),
    "duplicate keys": (b'{"model_type": "gemma2", "use_cache": true, "use_cache": false}', "duplicate key 'use_cache'"),
    "NaN": (b'{"model_type": "gemma2", "rope_theta": NaN}', "non-standard JSON literal NaN"),
    "Infinity": (b'{"model_type": "gemma2", "rope_theta": -Infinity}', "non-standard JSON literal -Infinity"),
    # Python refuses to convert integers over 4300 digits with a bare ValueError: once an internal error.
    "5000-digit integer": (b'{"model_type": "gemma2", "vocab_size": ' + b"9" * 5000 + b"}", "Exceeds the limit"),
    "truncated": (json.dumps(gemma2_config()).encode()[:-7], "not valid JSON"),
}


@pytest.mark.parametrize("name", sorted(BROKEN_CONFIGS))
def test_fix_refuses_broken_configs_with_a_message_and_writes_nothing(hub, cli, name):
    raw, words = BROKEN_CONFIGS[name]
    hub.add("org/broken", {"config.json": raw, "generation_config.json": example_file("generation_config.json")})
    before = _state(hub.root)
    r = cli("fix", "org/broken", "--inplace", "--cache-dir", hub.root, "--format", "json")
    assert r.code == 1, r
    (model,) = r.json()["models"]
    assert model["status"] == "refused" and any(words in m for m in model["messages"]), model
    assert _state(hub.root) == before
    assert cli("restore", "org/broken", "--cache-dir", hub.root).code == 0
    assert _state(hub.root) == before


def test_huge_sparse_config_is_not_read_whole(hub, cli):
    """A 20 GB config (sparse: no disk used) is refused by its size, not a byte of it read (GD080)."""
    snap = hub.add("org/huge", {"config.json": b"{}"})
    target = snap / "config.json"
    blob = target.resolve()
    with open(blob, "r+b") as f:
        f.truncate(20 * 1024**3)
    jf = read_json_file(target, hub.repo_dir("org/huge"))
    assert not jf.ok and jf.raw is None and "larger than 16 MiB" in (jf.error or "")
    for args in (("check",), ("fix", "--inplace")):
        r = cli(*args, "org/huge", "--cache-dir", hub.root, "--format", "json")
        assert r.code == 1, r
        assert "larger than 16 MiB, not a config (not read whole)" in r.out
    assert target.is_symlink() and blob.stat().st_size == 20 * 1024**3


def test_a_fifo_in_place_of_config_is_not_opened(tmp_path, cli):
    """open() on a FIFO blocks forever without a writer: it must be refused unopened."""
    folder = tmp_path / "model"
    folder.mkdir()
    os.mkfifo(folder / "config.json")
    jf = read_json_file(folder / "config.json")
    assert not jf.ok and "not a regular file" in (jf.error or "")
    r = cli("fix", folder, "--inplace", "--format", "json")
    assert r.code == 1 and "not a regular file" in r.out
    os.mkfifo(tmp_path / "model.safetensors")
    assert "not a regular file" in (read_header(tmp_path / "model.safetensors").error or "")


# --- links out of the repo folder: never read as the model's file, never written, never restored to ----

@pytest.fixture
def outside(tmp_path) -> Path:
    """A Gemma config outside the cache, which a crafted snapshot link points at."""
    path = tmp_path / "elsewhere" / "config.json"
    path.parent.mkdir()
    path.write_bytes(json.dumps(gemma2_config()).encode())
    return path


def _outside_fingerprint(path: Path) -> tuple[bytes, int, bool]:
    st_ = path.stat()
    return path.read_bytes(), st_.st_mtime_ns, path.is_symlink()


def test_link_out_of_the_repo_is_refused_by_check_fix_and_restore(hub, cli, outside):
    snap = hub.add("org/evil", {"config.json": gemma2_config()})
    (snap / "config.json").unlink()
    os.symlink(os.path.relpath(outside, snap), snap / "config.json")
    before, fingerprint = _state(hub.root), _outside_fingerprint(outside)

    check = cli("check", "org/evil", "--cache-dir", hub.root, "--format", "json")
    finding = next(f for f in check.json()["models"][0]["findings"] if f["code"] == "GD005")
    assert "outside the repo folder" in finding["message"]
    fix = cli("fix", "org/evil", "--inplace", "--cache-dir", hub.root, "--format", "json")
    assert fix.code == 1 and fix.json()["models"][0]["status"] == "refused"
    assert "link points outside the repo folder" in fix.out
    assert cli("restore", "org/evil", "--cache-dir", hub.root).code == 0
    assert _state(hub.root) == before and _outside_fingerprint(outside) == fingerprint


def test_restore_does_not_follow_a_link_planted_after_the_fix(hub, cli, outside):
    """After a fix, config.json is swapped for a link out of the repo holding the fixed bytes."""
    snap = hub.add("org/m", {"config.json": gemma2_config()})
    assert cli("fix", "org/m", "--inplace", "--cache-dir", hub.root).code == 0
    outside.write_bytes((snap / "config.json").read_bytes())
    (snap / "config.json").unlink()
    os.symlink(outside, snap / "config.json")
    fingerprint = _outside_fingerprint(outside)
    r = cli("restore", "org/m", "--cache-dir", hub.root)
    assert r.code == 1 and "config.json changed since gemma-doctor fixed it; left as it is" in r.out, r
    assert os.readlink(snap / "config.json") == str(outside) and _outside_fingerprint(outside) == fingerprint


def test_restore_refuses_a_tampered_link_target(hub, cli, outside):
    snap = hub.add("org/m", {"config.json": gemma2_config()})
    assert cli("fix", "org/m", "--inplace", "--cache-dir", hub.root).code == 0
    record = hub.repo_dir("org/m") / ".gemma-doctor" / "undo.json"
    doc = json.loads(record.read_text())
    (entry,) = doc["entries"].values()
    entry["link_target"] = os.path.relpath(outside, snap)
    record.write_text(json.dumps(doc))
    fixed = (snap / "config.json").read_bytes()
    r = cli("restore", "org/m", "--cache-dir", hub.root)
    assert r.code == 3 and "leads outside the repo folder; refusing to restore it" in r.out, r
    assert not (snap / "config.json").is_symlink() and (snap / "config.json").read_bytes() == fixed


@pytest.mark.parametrize("digest", ["../../../victim", "/tmp/victim", "AB" * 32, "0" * 63])
def test_a_tampered_undo_record_cannot_name_files_to_delete(hub, cli, tmp_path, digest):
    """Backups are named by digest and deleted when unreferenced: a digest must never be a path."""
    victim = tmp_path / "victim"
    victim.write_text("precious")
    snap = hub.add("org/m", {"config.json": gemma2_config()})
    record = hub.repo_dir("org/m") / ".gemma-doctor" / "undo.json"
    record.parent.mkdir()
    key = f"snapshots/{snap.name}/config.json"
    record.write_text(json.dumps({"schema_version": 1, "entries": {key: {
        "kind": "link", "link_target": os.readlink(snap / "config.json"), "original_sha256": digest,
        "fixed_sha256": "0" * 64, "mode": 0o644}}}))
    r = cli("restore", "org/m", "--cache-dir", hub.root)
    assert r.code == 1 and "undo record unreadable" in r.out and "not an undo record" in r.out, r
    fix = cli("fix", "org/m", "--inplace", "--cache-dir", hub.root)
    assert fix.code == 3 and "refusing to write without a way to undo" in fix.out
    assert victim.read_text() == "precious" and (snap / "config.json").is_symlink()


@pytest.mark.parametrize("entry", [5, "config.json", ["file"], None])
def test_an_undo_record_whose_entry_is_not_an_object_is_unreadable(hub, cli, entry):
    snap = hub.add("org/m", {"config.json": gemma2_config()})
    record = hub.repo_dir("org/m") / ".gemma-doctor" / "undo.json"
    record.parent.mkdir()
    record.write_text(json.dumps({"schema_version": 1, "entries": {f"snapshots/{snap.name}/config.json": entry}}))
    before = tree_state(hub.root)
    r = cli("restore", "org/m", "--cache-dir", hub.root)
    assert r.code == 1 and "undo record unreadable" in r.out and "not an undo record" in r.out, r
    assert tree_state(hub.root) == before


def test_our_state_folder_as_a_link_is_refused(hub, cli, tmp_path):
    snap = hub.add("org/m", {"config.json": gemma2_config()})
    (tmp_path / "trap").mkdir()
    os.symlink(tmp_path / "trap", hub.repo_dir("org/m") / ".gemma-doctor")
    r = cli("fix", "org/m", "--inplace", "--cache-dir", hub.root)
    assert r.code == 3 and ".gemma-doctor is a link; refusing to write through it" in r.out
    assert list((tmp_path / "trap").iterdir()) == [] and (snap / "config.json").is_symlink()


@pytest.mark.parametrize("bad", ["../no-such-gd", "/no-such-gd/x", "org/../../x", "org/..", "./../../x"])
@pytest.mark.parametrize("command", [("fix", "--inplace"), ("restore",)])
def test_hostile_repo_ids_write_nothing_anywhere(tmp_path, cli, bad, command):
    hub = HubCache(tmp_path / "cache" / "hub")
    hub.add("org/m", {"config.json": gemma2_config()})
    before = tree_state(tmp_path)
    r = cli(*command, bad, "--cache-dir", hub.root)
    assert r.code == 2 and r.err.count("\n") == 1 and "error:" in r.err, r
    assert tree_state(tmp_path) == before


# --- read-only files and folders: run as an unprivileged user (root ignores permissions) -------------

def _as_nobody(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return as_nobody.run(*args, cwd=cwd, GEMMA_DOCTOR_WITH=os.environ.get("GEMMA_DOCTOR_WITH", ""))


@pytest.fixture
def world(tmp_path):
    """A folder every user can reach (pytest's tmp_path is private to root)."""
    if as_nobody.skip_reason():
        pytest.skip(as_nobody.skip_reason())
    folder = Path(tempfile.mkdtemp(prefix="gd-ro-"))
    os.chmod(folder, 0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _give_to_nobody(path: Path) -> None:
    os.chown(path, 65534, 65534)


@pytest.mark.parametrize("layout", ["read-only cache", "read-only snapshot folder", "read-only file"])
def test_read_only_places_give_a_clear_error_and_change_nothing(world, layout):
    if os.geteuid() != 0:
        pytest.skip("the test switches to user nobody, which needs root")
    symlinks = layout != "read-only file"  # a real file, as in a cache without symlinks
    hub = HubCache(world / "hub", symlinks=symlinks)
    snap = hub.add("org/m", {"config.json": gemma2_config()})
    if layout != "read-only cache":
        # nobody may write everywhere but in the snapshot folder (or the file itself)
        for p in [hub.root, *hub.root.rglob("*")]:
            if not p.is_symlink():
                _give_to_nobody(p)
        if layout == "read-only snapshot folder":
            os.chown(snap, 0, 0)
        else:
            os.chmod(snap / "config.json", 0o444)
    before = _state(hub.root)
    r = _as_nobody("fix", "org/m", "--inplace", "--cache-dir", str(hub.root), cwd=world)
    expected = {"read-only cache": "cannot create the lock folder",
                "read-only snapshot folder": "Permission denied; it was left as it was",
                "read-only file": "is read-only; not rewritten"}[layout]
    assert r.returncode == 3 and expected in r.stdout + r.stderr, r
    assert "Traceback" not in r.stderr
    assert _state(hub.root) == before
    assert not (hub.repo_dir("org/m") / ".gemma-doctor" / "undo.json").exists()


# --- disk full in the middle of a write ---------------------------------------------------------------

class _DiskFills:
    """os.write that accepts ``budget`` bytes in all, then fails with ENOSPC for good, as a full disk does."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.real = os.write

    def __call__(self, fd: int, data) -> int:  # noqa: ANN001 - os.write's own signature
        if self.budget <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = self.real(fd, bytes(data)[: self.budget])
        self.budget -= n
        return n


def _bytes_one_fix_writes(tmp_path: Path, symlinks: bool) -> int:
    hub = HubCache(tmp_path / "measure", symlinks=symlinks)
    hub.add(REPO, {"config.json": gemma3_12b_config(), "generation_config.json": example_file("generation_config.json")})
    total = 0
    real = os.write

    def counting(fd: int, data) -> int:  # noqa: ANN001
        nonlocal total
        n = real(fd, data)
        total += n
        return n

    from gemma_doctor.cli import main

    mp = pytest.MonkeyPatch()
    mp.setattr(os, "write", counting)
    try:
        with pytest.raises(SystemExit):
            main(["fix", REPO, "--inplace", "--cache-dir", str(hub.root), "--format", "json"])
    finally:
        mp.undo()
    return total


@pytest.mark.parametrize("symlinks", [True, False], ids=["links", "real-files"])
def test_disk_full_at_every_point_of_a_fix(tmp_path, cli, monkeypatch, capsys, symlinks):
    """ENOSPC after 0, 1, ... bytes: with links nothing changes (the run rolls back); with real files
    every file is original or fixed, the record covers each fixed file, and restore puts all back."""
    total = _bytes_one_fix_writes(tmp_path, symlinks)
    capsys.readouterr()
    assert total > 2000
    budgets = sorted({0, 1, total - 1, *range(97, total, max(1, total // 12))})
    for budget in budgets:
        hub = HubCache(tmp_path / f"hub-{budget}", symlinks=symlinks)
        snap = hub.add(REPO, {"config.json": gemma3_12b_config(), "generation_config.json": example_file("generation_config.json")})
        before = _state(hub.root)
        with monkeypatch.context() as m:
            m.setattr(os, "write", _DiskFills(budget))
            r = cli("fix", REPO, "--inplace", "--cache-dir", hub.root)
        assert r.code == 3 and "No space left on device" in r.out, (budget, r)
        assert not list(hub.root.rglob("*.tmp")), budget
        stay = re.search(r"; ([a-z_.json, ]+) could not be put back and stay fixed", r.out)
        if symlinks:
            assert _state(hub.root) == before, budget
            assert stay is None, (budget, r.out)
        else:
            originals = {k: v for k, v in before.items()}
            now = _state(hub.root)
            covered = undo.load(_snapshot(hub, snap))
            fixed = set()
            for name in ("config.json", "generation_config.json"):
                key = str((snap / name).relative_to(hub.root))
                if now[key] != originals[key]:
                    json.loads((snap / name).read_text())
                    assert f"snapshots/{snap.name}/{name}" in covered, (budget, name)
                    fixed.add(name)
            # The message names exactly the files that stay fixed (the disk is still full: no rollback write works).
            assert (set(stay.group(1).split(", ")) if stay else set()) == fixed, (budget, r.out)
            assert cli("restore", REPO, "--cache-dir", hub.root).code == 0
            assert {k: v for k, v in _state(hub.root).items() if ".gemma-doctor" not in k} == \
                   {k: v for k, v in before.items() if ".gemma-doctor" not in k}, budget


def _snapshot(hub: HubCache, snap: Path):  # noqa: ANN202
    from gemma_doctor.locate import resolve

    return resolve([REPO], hub.root)[0]


# --- property-based: no input makes a reader raise; garbage always yields an error --------------------

def _strict_json_object(raw: bytes) -> bool:
    """True when ``raw`` is a UTF-8 JSON object a strict reader must accept."""
    try:
        text = raw.decode("utf-8")
        seen_dup = False

        def hook(pairs):  # noqa: ANN001, ANN202
            nonlocal seen_dup
            keys = [k for k, _ in pairs]
            seen_dup |= len(keys) != len(set(keys))
            return dict(pairs)

        def no_constant(name):  # noqa: ANN001, ANN202
            raise ValueError(name)

        def finite(number: str) -> float:  # 1e309 parses to inf, which no JSON report can carry back
            value = float(number)
            if value in (float("inf"), float("-inf")):
                raise ValueError(number)
            return value

        data = json.loads(text, object_pairs_hook=hook, parse_constant=no_constant, parse_float=finite)
    except (ValueError, RecursionError):
        return False
    return isinstance(data, dict) and not seen_dup and not text.startswith("\ufeff")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


@st.composite
def json_like_bytes(draw) -> bytes:  # noqa: ANN001
    """Valid JSON objects, then cut, spliced with junk, or byte-flipped: the near-misses readers meet."""
    doc = json.dumps(draw(st.dictionaries(st.text(max_size=8), json_values, max_size=5))).encode()
    how = draw(st.sampled_from(["as-is", "cut", "splice", "flip", "nan", "dup", "bigint"]))
    if how == "cut" and doc:
        doc = doc[: draw(st.integers(0, len(doc) - 1))]
    elif how == "splice":
        at = draw(st.integers(0, len(doc)))
        doc = doc[:at] + draw(st.binary(max_size=16)) + doc[at:]
    elif how == "flip" and doc:
        at = draw(st.integers(0, len(doc) - 1))
        doc = doc[:at] + bytes([doc[at] ^ draw(st.integers(1, 255))]) + doc[at + 1:]
    elif how == "nan":
        doc = b'{"x": ' + draw(st.sampled_from([b"NaN", b"Infinity", b"-Infinity"])) + b"}"
    elif how == "dup":
        doc = b'{"a": 1, "a": 2}'
    elif how == "bigint":
        doc = b'{"a": ' + b"7" * draw(st.integers(4000, 6000)) + b"}"
    return doc


SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(raw=st.binary(max_size=512) | json_like_bytes())
def test_parse_json_object_never_raises_and_flags_garbage(raw):
    data, error, shape_error = parse_json_object(raw)
    if _strict_json_object(raw):
        assert error is None and isinstance(data, dict)
    else:
        assert data is None and isinstance(error, str) and error
    assert isinstance(shape_error, bool)


@SETTINGS
@given(raw=st.binary(max_size=512) | json_like_bytes())
def test_read_json_file_never_raises(tmp_path_factory, raw):
    path = tmp_path_factory.mktemp("j") / "config.json"
    path.write_bytes(raw)
    jf = read_json_file(path, path.parent)
    assert jf.exists and jf.raw == raw
    assert jf.ok == _strict_json_object(raw) and (jf.ok or jf.error)


shape_ints = st.one_of(st.integers(0, 8), st.integers(0, 2**70), st.integers(-3, -1))


@st.composite
def safetensors_headers(draw) -> tuple[bytes, int]:  # noqa: ANN001
    """Headers shaped like real ones with hostile numbers: huge shapes, offsets past the file, overlaps."""
    n = draw(st.integers(0, 4))
    header: dict = {}
    for i in range(n):
        header[f"t{i}"] = {
            "dtype": draw(st.sampled_from([*DTYPE_BITS, "F17", 3, None])),
            "shape": draw(st.lists(shape_ints, max_size=4) | st.just("x")),
            "data_offsets": draw(st.lists(st.integers(0, 2**66), min_size=0, max_size=3)),
        }
    if draw(st.booleans()):
        header["__metadata__"] = draw(st.dictionaries(st.text(max_size=4), st.text(max_size=4) | st.integers(), max_size=2))
    raw = json.dumps(header).encode()
    data_len = draw(st.integers(0, 64))
    return raw, data_len


@SETTINGS
@given(raw=st.binary(max_size=256), size=st.integers(0, 2**64))
def test_parse_header_never_raises_on_bytes(raw, size):
    h = parse_header(raw, size, Path("x.safetensors"))
    assert h.ok or h.error
    if not raw.lstrip(b" \t\r\n").startswith(b"{"):  # JSON whitespace may precede the object, as in safetensors
        assert h.error


@SETTINGS
@given(spec=safetensors_headers())
def test_parse_header_never_raises_on_hostile_numbers(tmp_path_factory, spec):
    """Hostile numbers almost never make a valid header: what they test is that nothing raises and that the
    verdict is safetensors' own. Valid multi-tensor headers and their near misses are generated in
    tests/test_safetensors.py (test_generated_headers_are_accepted_exactly_when_safetensors_accepts_them)."""
    raw, data_len = spec
    h = parse_header(raw, 8 + len(raw) + data_len, Path("x.safetensors"))
    assert h.ok or h.error
    path = tmp_path_factory.mktemp("n") / "model.safetensors"
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + bytes(data_len))
    assert h.ok == _safetensors_accepts(path), h.error
    if h.ok:  # an accepted header tiles exactly the data there is
        assert sum(t.nbytes for t in h.tensors) == data_len
        assert all(t.nbytes * 8 == t.numel * DTYPE_BITS[t.dtype] for t in h.tensors)


def _safetensors_accepts(path: Path) -> bool:
    from safetensors import safe_open

    try:
        with safe_open(str(path), "np"):
            return True
    except Exception:  # noqa: BLE001 - any refusal counts
        return False


@SETTINGS
@given(length=st.integers(0, 2**64 - 1) | st.sampled_from([2**63, 100_000_001, 2**64 - 1]), body=st.binary(max_size=128))
def test_read_header_never_raises_on_any_length_prefix(tmp_path_factory, length, body):
    path = tmp_path_factory.mktemp("s") / "model.safetensors"
    path.write_bytes(length.to_bytes(8, "little") + body)
    h = read_header(path)
    assert h.exists and (h.ok or h.error)
    if length > len(body):
        assert h.error



def test_has_and_read_json_say_what_a_lookup_of_the_name_says(tmp_path):
    """LocalSource answers has() from one listing of the folder (a whole-cache scan's shortcut): for every name an
    index can hand it (a shard name passes dtypes._safe_name when it is "." or a name of a folder, a dangling link,
    a FIFO), the answer is os.path.lexists', and read_json of a name the listing lacks is what reading it says."""
    from gemma_doctor.source import LocalSource

    folder = tmp_path / "snap"
    (folder / "sub").mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "dangling").symlink_to("nowhere")
    os.mkfifo(folder / "fifo")
    names = [".", "..", "", "config.json", "sub", "dangling", "fifo", "missing", "a\x00b", "sub/.", "sub/x"]
    source = LocalSource(folder, tmp_path)
    assert source.has("config.json")  # the listing is made
    for name in names:
        assert source.has(name) == os.path.lexists(os.path.join(folder, name)), name
    for name in [".", "sub", "dangling", "fifo", "missing"]:
        listed, fresh = source.read_json(name), read_json_file(folder / name, tmp_path)
        assert (listed.exists, listed.ok, listed.error) == (fresh.exists, fresh.ok, fresh.error), name


def test_has_in_a_folder_listed_but_not_entered_says_what_a_lookup_says(world):
    """A folder its user may list but not enter (r without x): the listing names its files, a lookup of each fails;
    has() says what the lookup (os.path.lexists) says, as it did before it answered from the listing."""
    folder = world / "snap"
    folder.mkdir()
    for name in ("config.json", "tokenizer_config.json"):
        (folder / name).write_text("{}")
    os.chmod(folder, 0o744)
    got = as_nobody.runtime()
    assert isinstance(got, tuple), got
    python, path = got
    code = ("import os, sys; from pathlib import Path; from gemma_doctor.source import LocalSource; "
            "f = Path(sys.argv[1]); s = LocalSource(f, f.parent); "
            "print([(n, s.has(n), os.path.lexists(f / n)) for n in ('config.json', 'tokenizer_config.json', 'x')])")
    r = subprocess.run(as_nobody.setpriv(python, "-c", code, str(folder)), capture_output=True, text=True, cwd="/",
                       env={"PATH": "/usr/bin:/bin", "PYTHONPATH": path, "PYTHONNOUSERSITE": "1",
                            "PYTHONDONTWRITEBYTECODE": "1"}, timeout=120)
    assert r.returncode == 0, r.stderr
    for name, has, lexists in eval(r.stdout):  # noqa: S307 - our own repr of tuples of str and bool
        assert has == lexists, (name, has, lexists)

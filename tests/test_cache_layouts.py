"""Every cache layout huggingface_hub writes, made by huggingface_hub itself, checked, fixed and restored alike.

The layouts (docs/reliability.md, "Cache layouts"), each produced here by the real client downloading a tiny real
checkpoint from the local Hub (tests/hubserver.py) through HF_ENDPOINT:
- classic: snapshots/<commit>/<file> -> ../../blobs/<etag>, a regular file (every huggingface_hub);
- shared store: the repo's blobs/<etag> is itself a link ../../blobs/<2 hex>/<xet hash> into the cache-wide store
  (huggingface_hub >= 1.32, on by default for files hf_xet downloads). The local Hub is no Xet server, so the
  store is filled by the very function the download path calls after an Xet download,
  ``huggingface_hub.utils._shared_blobs.publish_blob_to_shared_store`` (the hash stands for the Xet hash);
- no symlinks: files copied into the snapshot (what huggingface_hub falls back to where links are unsupported;
  ``HF_HUB_DISABLE_SYMLINKS=1`` makes it choose that here);
- local_dir: ``snapshot_download(local_dir=...)`` (``hf download --local-dir``), plain files with
  ``.cache/huggingface/`` metadata beside them.
The same checkpoint gives the same check in each; fix + restore leave the store byte-identical, and huggingface_hub's
own ``hf cache verify`` / ``hf cache rm`` still agree with the cache afterwards. The shared-cache attacks are rerun
against the store.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.builders import HubCache
from tests.hubserver import HubServer, repos_from_cache
from tests.test_hub import tiny_files  # noqa: F401 - the tiny Gemma 3 checkpoint fixture, shared
from tests.test_safetensors import st_file
from tests.venvs import subprocess_env

pytestmark = pytest.mark.slow  # builds a tiny model with transformers and downloads it with the real client

ROOT = Path(__file__).resolve().parent.parent
REPO = "google/gemma-3-4b-it"
COPY = "acme/gemma-3-4b-it-copy"  # the same files under another name: one store entry serves both
PLANNED = ("--with", "transformers==4.50.3")  # GD101/GD102: a fix to apply and restore
LAYOUTS = ("classic", "shared", "nosymlinks", "localdir")


def _folder(repo_id: str) -> str:
    return "models--" + repo_id.replace("/", "--")


@pytest.fixture(scope="module")
def hub(tmp_path_factory, tiny_files) -> Iterator[HubServer]:
    storage = HubCache(tmp_path_factory.mktemp("hub-storage"))
    storage.add(REPO, tiny_files)
    # Another commit (a git commit names its repo's whole tree; hf cache rm deletes revisions by commit hash).
    storage.add(COPY, {**tiny_files, "README.md": b"a copy\n"})
    with HubServer(repos_from_cache(storage.root)) as server:
        yield server




def _hf_env(home: Path, endpoint: str, **extra: str) -> dict[str, str]:
    env = subprocess_env(HF_HOME=str(home), HF_ENDPOINT=endpoint, HF_HUB_DISABLE_TELEMETRY="1", **extra)
    env.pop("HF_HUB_OFFLINE")
    return env


def _make(layout: str, where: Path, home: Path, endpoint: str) -> Path:
    extra = {"HF_HUB_DISABLE_SYMLINKS": "1", "HF_HUB_DISABLE_SYMLINKS_WARNING": "1"} if layout == "nosymlinks" else {}
    repos = [REPO] if layout == "localdir" else [REPO, COPY]
    subprocess.run([sys.executable, str(ROOT / "tests" / "scripts" / "hf_layout.py"), layout, str(where), *repos],
                   check=True, timeout=300, env=_hf_env(home, endpoint, **extra), capture_output=True)
    return where


@pytest.fixture(scope="module")
def made(tmp_path_factory, hub) -> dict[str, Path]:
    """One cache (a folder, for local_dir) per layout, downloaded by huggingface_hub from the local Hub."""
    base = tmp_path_factory.mktemp("layouts")
    return {layout: _make(layout, base / layout, base / "home", hub.endpoint) for layout in LAYOUTS}


@pytest.fixture
def fresh(made, tmp_path) -> Any:
    """A private copy of one layout's cache (links kept as links), for a test that writes or attacks it."""
    def copy(layout: str) -> Path:
        dest = tmp_path / layout
        shutil.copytree(made[layout], dest, symlinks=True)
        return dest
    return copy


def _target(layout: str, where: Path) -> list[str]:
    return [str(where)] if layout == "localdir" else [REPO, "--cache-dir", str(where)]


def _gd(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gemma_doctor", *args], capture_output=True, text=True, timeout=300,
                          env=subprocess_env())


def _same(doc: dict[str, Any], layout: str, where: Path) -> dict[str, Any]:
    """A check's JSON without what differs by design between layouts: where the files are (and so the target that
    the fix command names)."""
    out = {k: v for k, v in doc.items() if k != "cache_dir"}
    models = []
    named = str(where) if layout == "localdir" else f"{REPO} --cache-dir {where}"
    for m in doc["models"]:
        m = {k: v for k, v in m.items() if k not in ("path", "source", "repo_id", "revision", "commit", "refs", "target", "kind")}
        text = json.dumps(m).replace(named, "<target>")
        if layout != "localdir":  # the prescription's base model is the folder of a local_dir target, else the repo
            text = text.replace(f'"base_model": "{REPO}"', '"base_model": "<target>"')
        models.append(json.loads(text))
    out["models"] = models
    return out


def store_state(cache: Path) -> dict[str, tuple]:
    """Everything under the cache-wide store, as lstat and the bytes show it: what fix and restore must not change."""
    out: dict[str, tuple] = {}
    store = cache / "blobs"
    for dirpath, dirnames, filenames in os.walk(store):
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                what: tuple = ("link", os.readlink(p))
            elif stat.S_ISREG(st.st_mode):
                what = ("file", hashlib.sha256(p.read_bytes()).hexdigest())
            else:
                what = ("folder" if stat.S_ISDIR(st.st_mode) else "special",)
            out[str(p.relative_to(store))] = (*what, stat.S_IMODE(st.st_mode), st.st_mtime_ns, st.st_ino)
    return out


# --- what huggingface_hub laid out ---------------------------------------------------------------------------------

def test_the_shared_layout_is_huggingface_hubs_own(made):
    cache = made["shared"]
    assert (cache / "blobs" / ".huggingface-shared-blobs").read_text() == "1\n"
    repo_blobs = cache / _folder(REPO) / "blobs"
    shared = [b for b in repo_blobs.iterdir() if b.is_symlink()]
    assert shared, "no blob was moved into the store"
    from huggingface_hub.utils._shared_blobs import shared_blob_target

    for blob in shared:
        target = os.readlink(blob)
        assert target.startswith("../../blobs/") and shared_blob_target(blob, cache) is not None, target
    # The copy's identical shard shares the one store entry.
    copies = {os.readlink(b) for b in (cache / _folder(COPY) / "blobs").iterdir() if b.is_symlink()}
    assert copies == {os.readlink(b) for b in shared}
    # No-symlink and local_dir layouts hold plain files.
    snap = next((made["nosymlinks"] / _folder(REPO) / "snapshots").iterdir())
    assert all(not p.is_symlink() for p in snap.iterdir())
    assert (made["localdir"] / ".cache" / "huggingface").is_dir()


# --- read alike ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("weights", [False, True], ids=["headers", "weights"])
def test_every_layout_checks_like_the_classic_one(made, weights):
    extra = ("--weights",) if weights else ()
    docs = {}
    for layout in LAYOUTS:
        res = _gd("check", *_target(layout, made[layout]), *PLANNED, *extra, "--format", "json")
        assert res.returncode == 1, (layout, res.stdout[-2000:], res.stderr[-2000:])  # GD101 under 4.50.3
        docs[layout] = res.stdout
    classic = json.loads(docs["classic"])
    codes = sorted(f["code"] for f in classic["models"][0]["findings"])
    assert "GD101" in codes and not any(c.startswith(("GD0", "GD2")) for c in codes), codes
    assert classic["models"][0]["dtypes"]["total_params"] > 0
    for layout in LAYOUTS[1:]:
        assert _same(json.loads(docs[layout]), layout, made[layout]) == _same(classic, "classic", made["classic"]), layout


def test_list_reads_the_store_as_healthy_and_counts_each_repo_once(made):
    docs = {}
    for layout in ("classic", "shared", "nosymlinks"):
        res = _gd("list", "--cache-dir", str(made[layout]), "--format", "json")
        assert res.returncode == 0, (layout, res.stdout, res.stderr)
        docs[layout] = json.loads(res.stdout)
    assert json.dumps(docs["shared"]).count('"broken"') == 0, docs["shared"]
    strip = lambda d: json.loads(json.dumps({k: v for k, v in d.items() if k != "cache_dir"}).replace(
        str(made["shared"]), "<cache>").replace(str(made["classic"]), "<cache>").replace(str(made["nosymlinks"]), "<cache>"))
    assert strip(docs["shared"]) == strip(docs["classic"]) == strip(docs["nosymlinks"])


def test_recommend_and_whole_cache_check_read_the_store(made):
    res = _gd("recommend", REPO, "--cache-dir", str(made["shared"]), "--gpu", "L4", "--format", "json")
    classic = _gd("recommend", REPO, "--cache-dir", str(made["classic"]), "--gpu", "L4", "--format", "json")
    assert res.returncode == classic.returncode and res.stdout.replace(str(made["shared"]), "<c>") == \
        classic.stdout.replace(str(made["classic"]), "<c>")
    whole = _gd("check", "--cache-dir", str(made["shared"]), "--format", "json")
    assert whole.returncode == 0, whole.stdout[-2000:]
    assert len(json.loads(whole.stdout)["models"]) == 2


# --- write nothing there ---------------------------------------------------------------------------------------------

def test_fix_and_restore_leave_the_store_byte_identical_and_huggingface_hub_agrees(fresh, hub, tmp_path):
    cache = fresh("shared")
    before = store_state(cache)
    repo_blobs = {b.name: os.readlink(b) if b.is_symlink() else "file" for b in (cache / _folder(REPO) / "blobs").iterdir()}
    fixed = _gd("fix", REPO, "--cache-dir", str(cache), *PLANNED, "--inplace")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert _gd("check", REPO, "--cache-dir", str(cache), *PLANNED).returncode == 0
    assert store_state(cache) == before
    restored = _gd("restore", REPO, "--cache-dir", str(cache))
    assert restored.returncode == 0, restored.stdout + restored.stderr
    assert store_state(cache) == before
    assert {b.name: os.readlink(b) if b.is_symlink() else "file"
            for b in (cache / _folder(REPO) / "blobs").iterdir()} == repo_blobs
    env = _hf_env(tmp_path / "home", hub.endpoint)
    hf = str(Path(sys.executable).with_name("hf"))
    verify = subprocess.run([hf, "cache", "verify", REPO, "--cache-dir", str(cache)], env=env, capture_output=True,
                            text=True, timeout=120)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    # huggingface_hub's garbage collection: the store entry goes only with the last repo that links to it.
    entries = {k for k, v in before.items() if v[0] == "file" and len(Path(k).name) == 64}
    assert entries
    for repo, left in ((REPO, entries), (COPY, set())):
        rm = subprocess.run([hf, "cache", "rm", f"model/{repo}", "--cache-dir", str(cache), "-y"], env=env,
                            capture_output=True, text=True, timeout=120)
        assert rm.returncode == 0, rm.stdout + rm.stderr
        assert {k for k in entries if (cache / "blobs" / k).exists()} == left, (repo, rm.stdout, rm.stderr)


def test_a_fix_on_a_no_symlink_cache_and_a_local_dir_is_restored(fresh):
    for layout in ("nosymlinks", "localdir"):
        where = fresh(layout)
        target = _target(layout, where)
        config = (where / "config.json") if layout == "localdir" else next(
            (where / _folder(REPO) / "snapshots").iterdir()) / "config.json"
        original = config.read_bytes()
        assert _gd("fix", *target, *PLANNED, "--inplace").returncode == 0
        assert config.read_bytes() != original
        assert _gd("restore", *target).returncode == 0
        assert config.read_bytes() == original, layout


# --- the attacks, against the store ----------------------------------------------------------------------------------

def _shared_entries(cache: Path) -> list[Path]:
    return sorted(p for p in (cache / "blobs").glob("*/*") if len(p.name) == 64)


def _shard_entry(cache: Path) -> Path:
    link = next((cache / _folder(REPO) / "snapshots").iterdir()) / "model.safetensors"
    return (link.parent / os.readlink(link)).resolve()


def _attack_check(cache: Path) -> dict[str, Any]:
    before = store_state(cache)
    res = _gd("check", REPO, "--cache-dir", str(cache), "--format", "json")
    assert res.returncode in (0, 1), res.stderr  # a finding, never a crash
    fix = _gd("fix", REPO, "--cache-dir", str(cache), *PLANNED, "--inplace")
    assert fix.returncode in (0, 1, 3), fix.stderr
    after = store_state(cache)
    # Nothing in the store was written, renamed or deleted, whatever was planted there.
    assert {k: v[:2] for k, v in after.items()} == {k: v[:2] for k, v in before.items()}
    return json.loads(res.stdout)["models"][0]


def _evil_shard(tmp_path: Path) -> Path:
    evil = tmp_path / "outside.safetensors"
    evil.write_bytes(st_file({"evil.weight": ("I32", [4])}))
    return evil


def _not_read(model: dict[str, Any]) -> None:
    text = json.dumps(model)
    assert "I32" not in text and "evil" not in text
    assert any(f["code"] in ("GD204", "GD005", "GD203") for f in model["findings"]), model["findings"]


def test_a_store_entry_swapped_for_a_link_out_of_the_cache_is_never_read(fresh, tmp_path):
    cache = fresh("shared")
    entry = _shard_entry(cache)
    os.chmod(entry.parent, 0o755)
    entry.unlink()
    os.symlink(_evil_shard(tmp_path), entry)
    _not_read(_attack_check(cache))


def test_a_store_without_huggingface_hubs_marker_is_not_followed(fresh):
    cache = fresh("shared")
    (cache / "blobs" / ".huggingface-shared-blobs").unlink()
    model = _attack_check(cache)
    assert any(f["code"] == "GD204" and "marker" in f["message"] for f in model["findings"]), model["findings"]
    # A marker that is a link to a file reading "1\n", or says another layout version, is no marker either.
    for planted in ("link", "version"):
        marker = cache / "blobs" / ".huggingface-shared-blobs"
        marker.unlink(missing_ok=True)
        if planted == "link":
            (cache / "elsewhere").write_text("1\n")
            os.symlink(cache / "elsewhere", marker)
        else:
            marker.write_text("2\n")
        assert any(f["code"] == "GD204" for f in _attack_check(cache)["findings"])


def test_a_planted_store_folder_that_is_a_link_is_not_followed(fresh, tmp_path):
    cache = fresh("shared")
    entry = _shard_entry(cache)
    elsewhere = tmp_path / "planted-prefix"
    shutil.copytree(entry.parent, elsewhere)
    os.chmod(entry.parent, 0o755)
    shutil.rmtree(entry.parent)
    os.symlink(elsewhere, entry.parent)
    assert any(f["code"] == "GD204" for f in _attack_check(cache)["findings"])


def test_a_refs_manifest_naming_another_repos_blob_changes_nothing(fresh):
    cache = fresh("shared")
    for entry in _shared_entries(cache):
        manifest = entry.with_name(entry.name + ".refs")
        os.chmod(manifest, 0o666)
        manifest.write_text(f"{_folder(COPY)}/blobs/{'0' * 64}\n../../etc/passwd\n")
    model = _attack_check(cache)
    assert not [f for f in model["findings"] if f["code"].startswith(("GD0", "GD2"))], model["findings"]


@pytest.mark.parametrize("target", [
    "../../blobs/{wrong}/{digest}",       # prefix folder is not the hash's first two digits
    "../../blobs/{digest}",               # no prefix folder
    "../../blobs/{pre}/{digest}.refs",    # the manifest, not the entry
    "../../blobs/{pre}/../{pre}/{digest}",  # not the canonical text
    "../../../outside/blobs/{pre}/{digest}",
    "{cache}/blobs/{pre}/{digest}",       # absolute: huggingface_hub writes a relative link
])
def test_a_link_to_a_non_canonical_store_path_is_refused(fresh, target):
    cache = fresh("shared")
    entry = _shard_entry(cache)
    digest, pre = entry.name, entry.name[:2]
    wrong = "ff" if pre != "ff" else "00"
    (cache / "blobs" / wrong).mkdir(exist_ok=True)
    shutil.copy(entry, cache / "blobs" / wrong / digest)
    link = next(b for b in (cache / _folder(REPO) / "blobs").iterdir() if b.is_symlink() and b.resolve() == entry)
    link.unlink()
    os.symlink(target.format(wrong=wrong, digest=digest, pre=pre, cache=cache), link)
    model = _attack_check(cache)
    assert any(f["code"] == "GD204" and "outside the repo folder" in f["message"] for f in model["findings"]), \
        model["findings"]


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_store_entry_that_is_not_a_regular_file_is_refused_without_hanging(fresh, kind):
    cache = fresh("shared")
    entry = _shard_entry(cache)
    os.chmod(entry.parent, 0o755)
    entry.unlink()
    os.mkfifo(entry) if kind == "fifo" else entry.mkdir()
    model = _attack_check(cache)
    assert any(f["code"] == "GD204" for f in model["findings"]), model["findings"]

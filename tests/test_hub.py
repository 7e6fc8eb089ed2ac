"""Checking a repo on the Hub before downloading it, with the real huggingface_hub client (0.x and the newest)
talking to a local Hub on 127.0.0.1 (tests/hubserver.py) through HF_ENDPOINT. No test touches the internet.

The Hub serves the bundled gemma-3-12b-it example (5 shards, ~24 GB apparent, sparse on disk; gated, as on
the real Hub) and a tiny Gemma 3 checkpoint saved by transformers, under names that invite typos.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import jsonschema
import pytest

from tests.builders import EXAMPLES, HubCache
from tests.hubserver import HubServer, repos_from_cache
from tests.test_safetensors import st_file
from tests.venvs import LEGACY, ensure_venv, subprocess_env

pytestmark = pytest.mark.slow  # builds a tiny model with transformers, and uses the transformers 4.50 venv

ROOT = Path(__file__).resolve().parent.parent
READER = "hf_reader_has_accepted_the_licence"
STRANGER = "hf_token_without_access"
PLANNED = ("--with", "transformers==4.50.3")
# A release without the HybridCache crash, so the exit code does not depend on the client venv's transformers.
SAFE = ("--with", "transformers==4.51.3")
BIG = "google/gemma-3-12b-it"
TINY = "google/gemma-3-4b-it"
# Per shard, a remote check may read what huggingface_hub's own header read costs (a 100,001-byte range) and
# a little more, never the data.
PER_SHARD_BUDGET = 150_000


def _load_example_builder() -> Any:
    spec = importlib.util.spec_from_file_location("build_example_cache", EXAMPLES / "build_example_cache.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


@dataclass
class Hub:
    server: HubServer
    storage: HubCache  # the Hub's own storage, laid out as a hub cache: "the same model, downloaded"

    @property
    def endpoint(self) -> str:
        return self.server.endpoint


@pytest.fixture(scope="session")
def tiny_files(tmp_path_factory) -> dict[str, bytes]:
    """A tiny Gemma 3 multimodal checkpoint (bf16) saved by the installed transformers, sparse text_config."""
    out = tmp_path_factory.mktemp("tiny") / "ckpt"
    subprocess.run([sys.executable, str(ROOT / "tests" / "scripts" / "tiny_gemma3.py"), str(out)], check=True,
                   timeout=600, env=subprocess_env(), capture_output=True)
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def hub(tmp_path_factory, tiny_files) -> Iterator[Hub]:
    storage = HubCache(tmp_path_factory.mktemp("hub-storage"))
    _load_example_builder().build(storage.root)
    storage.add(TINY, tiny_files)
    storage.add("google/gemma-3-4b-pt", tiny_files)
    storage.add("acme/private-gemma", tiny_files)
    config = json.loads(tiny_files["config.json"])
    # A shard cut short on the Hub, and one whose header is larger than the 100,001 bytes of the first range.
    storage.add("acme/truncated-gemma", {**tiny_files, "model.safetensors": tiny_files["model.safetensors"][:-1000]})
    many = {f"model.layers.{i}.mlp.experts.{j}.a_rather_long_parameter_name.weight": ("BF16", [2])
            for i in range(40) for j in range(50)}
    storage.add("acme/big-header-gemma", {"config.json": config, "model.safetensors": st_file(many)})
    repos = repos_from_cache(storage.root)
    repos[BIG].gated, repos[BIG].readers = "manual", frozenset({READER})
    repos["acme/private-gemma"].private, repos["acme/private-gemma"].readers = True, frozenset({READER})
    repos[TINY].downloads = 1000
    with HubServer(repos) as server:
        yield Hub(server, storage)


@pytest.fixture(scope="module", params=["newest", "huggingface_hub<1.0"])
def client(request) -> str:
    """The python of an environment with the real client: this one (newest), or transformers 4.50's 0.x."""
    if request.param == "newest":
        return sys.executable
    return str(ensure_venv(LEGACY))


@pytest.fixture(autouse=True)
def _fresh_server_state(request) -> Iterator[None]:
    if "hub" not in request.fixturenames:
        yield
        return
    hub = request.getfixturevalue("hub")
    hub.server.state.reset()
    yield
    hub.server.state.delay, hub.server.state.fail_status = 0.0, None


def gd(python: str, *args: str, cache: Path, endpoint: str | None, home: Path, token: str | None = None,
       offline: bool = False, cwd: Path | None = None, **env: str) -> Result:
    """Run gemma-doctor as a user would, in a fresh process (huggingface_hub reads its settings at import)."""
    e = subprocess_env(HF_HUB_CACHE=str(cache), HF_HOME=str(home), HOME=str(home), **env)
    e.pop("HF_HUB_OFFLINE", None)
    e.pop("HF_TOKEN", None)
    if offline:
        e["HF_HUB_OFFLINE"] = "1"
    if endpoint is not None:
        e["HF_ENDPOINT"] = endpoint
    if token is not None:
        e["HF_TOKEN"] = token
    res = subprocess.run([python, "-m", "gemma_doctor", *args], capture_output=True, text=True, env=e,
                         cwd=str(cwd or home), timeout=300)
    return Result(res.returncode, res.stdout, res.stderr)


@pytest.fixture
def run(client, hub, tmp_path):
    """gemma-doctor with the chosen client against the local Hub, an empty cache and a clean HF_HOME."""
    cache = tmp_path / "cache"
    home = tmp_path / "home"
    home.mkdir()

    def go(*args: str, cache_dir: Path = cache, **kw: Any) -> Result:
        kw.setdefault("endpoint", hub.endpoint)
        return gd(client, *args, cache=cache_dir, home=home, **kw)

    go.cache, go.home = cache, home  # type: ignore[attr-defined]
    return go


def one_line_error(res: Result) -> str:
    """The error line: exactly one, no traceback."""
    assert "Traceback" not in res.err, res.err
    lines = [ln for ln in res.err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("gemma-doctor: error: "), res.err
    return lines[0]


def comparable(doc: dict[str, Any]) -> dict[str, Any]:
    """A check's JSON without what differs by design between a Hub read and a cached read."""
    out = {k: v for k, v in doc.items() if k != "cache_dir"}
    out["models"] = [{k: v for k, v in m.items() if k not in ("path", "source", "remote")} for m in doc["models"]]
    return out


def shard_hits(hub: Hub, sha256: str) -> list:
    return [h for h in hub.server.hits if h.path.split("?")[0].endswith("/" + sha256)]


# --- the multi-GB sharded model -------------------------------------------------------------------------

def test_remote_check_of_a_sharded_24gb_model_reads_headers_only_and_agrees_with_the_cached_check(run, hub):
    manifest = _load_example_builder().load_manifest()
    remote = run("check", BIG, *PLANNED, "--format", "json", token=READER)
    assert remote.code == 1, remote  # GD101: planned for transformers 4.50.3
    served = list(hub.server.hits)

    # What the Hub served: per shard about what huggingface_hub's header read costs, always by range.
    for shard in manifest["shards"]:
        hits = shard_hits(hub, shard["sha256"])
        assert hits and all(h.range for h in hits), hits
        assert sum(h.sent for h in hits) <= PER_SHARD_BUDGET
    small = sum(len((hub.storage.repo_dir(BIG) / "snapshots" / manifest["commit"] / n).read_bytes())
                for n in ("config.json", "generation_config.json", "model.safetensors.index.json"))
    file_bytes = sum(h.sent for h in served if "/resolve/" in h.path or h.server == "cdn")
    assert file_bytes <= len(manifest["shards"]) * PER_SHARD_BUDGET + small
    assert not [h for h in served if h.server == "cdn" and not h.range], "a shard was requested whole"

    doc = remote.json()
    schema = json.loads((ROOT / "docs" / "schema" / "check.schema.json").read_text())
    jsonschema.validate(doc, schema, cls=jsonschema.Draft202012Validator)  # the same schema as a cached check
    (m,) = doc["models"]
    assert m["source"] == "hub" and m["commit"] == manifest["commit"]
    assert m["path"] == f"{hub.endpoint}/{BIG}/tree/{manifest['commit']}"
    rb = m["remote"]
    assert rb["gated"] == "manual" and rb["bytes"] == file_bytes
    assert rb["headers_read"] == sorted(s["file"] for s in manifest["shards"])
    assert rb["files_read"] == ["config.json", "generation_config.json", "model.safetensors.index.json"]
    fad = rb["fix_after_download"]
    assert fad["command"] == f"gemma-doctor fix {BIG} --with transformers==4.50.3 --inplace"
    assert [(c["file"], c["keys"]) for c in fad["changes"]] == [("config.json", ["text_config.use_cache"]),
                                                              ("generation_config.json", ["use_cache"])]
    assert '+    "use_cache": false' in fad["changes"][0]["diff"]

    # The same model in the cache (the Hub's storage is a hub cache): same findings, same dtype census.
    cached = run("check", BIG, *PLANNED, "--format", "json", cache_dir=hub.storage.root, offline=True, endpoint=None)
    assert cached.code == 1, cached
    assert cached.json()["models"][0]["source"] == "cache"
    jsonschema.validate(cached.json(), schema, cls=jsonschema.Draft202012Validator)
    assert comparable(doc) == comparable(cached.json())
    assert [f["code"] for f in m["findings"]] == ["GD101", "GD102"]
    assert m["dtypes"]["weights"] == {"BF16": 12187325040}

    # Nothing was stored: no partial snapshot in the cache, nothing like one under HF_HOME.
    assert not run.cache.exists() or not any(run.cache.iterdir())
    assert not list(run.home.rglob("models--*"))


def test_the_text_report_says_where_it_was_read_and_what_fix_would_change_after_download(run):
    res = run("check", BIG, *PLANNED, token=READER)
    assert res.code == 1, res
    assert "read from the Hub, not downloaded: 3 small file(s) and 5 safetensors header(s)" in res.out
    assert ("after download (hf download google/gemma-3-12b-it --include '*.json' '*.safetensors'), gemma-doctor fix "
            "google/gemma-3-12b-it --with transformers==4.50.3 --inplace would set text_config.use_cache in config.json, "
            "use_cache in generation_config.json to false") in res.out
    assert "GD101" in res.out and res.err == ""


# --- a tiny real checkpoint, downloaded by the real client ---------------------------------------------------

def _download(python: str, repo_id: str, cache: Path, home: Path, endpoint: str) -> None:
    code = ("import sys; from huggingface_hub import snapshot_download; "
            "print(snapshot_download(sys.argv[1], cache_dir=sys.argv[2]))")
    e = subprocess_env(HF_HOME=str(home), HF_ENDPOINT=endpoint)
    e.pop("HF_HUB_OFFLINE")
    subprocess.run([python, "-c", code, repo_id, str(cache)], check=True, env=e, capture_output=True, timeout=300)


def test_remote_check_equals_the_check_after_a_real_download(run, client, hub):
    remote = run("check", TINY, *PLANNED, "--format", "json")
    assert remote.code == 1, remote
    _download(client, TINY, run.cache, run.home, hub.endpoint)
    cached = run("check", TINY, *PLANNED, "--format", "json", offline=True)
    assert cached.code == 1, cached
    assert comparable(remote.json()) == comparable(cached.json())
    assert remote.json()["models"][0]["dtypes"]["source"] == "model.safetensors"
    # Once downloaded, --remote compares the cached main with the Hub's: the same commit.
    again = run("check", TINY, "--remote", "--format", "json")
    assert again.json()["models"][0]["remote"]["cache_behind"] is False


def test_remote_says_when_the_cached_main_is_behind_the_hubs(run, hub, tiny_files):
    HubCache(run.cache).add(TINY, {**tiny_files, "README.md": b"an older commit\n"})
    res = run("check", TINY, "--remote", *SAFE, "--format", "json")
    assert res.code == 0, res
    rb = res.json()["models"][0]["remote"]
    assert rb["cache_behind"] is True and rb["cached_commit"] != res.json()["models"][0]["commit"]
    assert re.search(r"google/gemma-3-4b-it: the cached main is at [0-9a-f]{12}, behind the Hub's [0-9a-f]{12}; "
                     r"update it with: hf download google/gemma-3-4b-it", res.err), res.err
    # Without --remote the cached copy is checked and the Hub is not asked.
    hub.server.state.reset()
    local = run("check", TINY, "--format", "json")
    assert local.json()["models"][0]["source"] == "cache" and hub.server.hits == []


def test_recommend_reads_a_repo_that_is_not_downloaded(run):
    res = run("recommend", TINY, "--gpu", "T4", "--format", "json")
    assert res.code == 0, res
    doc = res.json()
    text = json.dumps(doc)
    assert "fp32" in text and TINY in text


def test_weights_scan_of_a_hub_model_says_the_values_are_not_downloaded(run):
    res = run("check", TINY, "--weights", "--format", "json")
    (m,) = res.json()["models"]
    gd504 = [f for f in m["findings"] if f["code"] == "GD504"]
    assert gd504 and "not downloaded (read from the Hub)" in gd504[0]["message"]


# --- names --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("url", [
    "{endpoint}/google/gemma-3-4b-it",
    "https://huggingface.co/google/gemma-3-4b-it",
    "https://huggingface.co/google/gemma-3-4b-it/tree/main",
    "https://huggingface.co/google/gemma-3-4b-it/blob/main/config.json",
])
def test_a_hub_url_is_taken_as_the_repo_id(run, hub, url):
    res = run("check", url.format(endpoint=hub.endpoint), *SAFE, "--format", "json")
    assert res.code == 0, res
    (m,) = res.json()["models"]
    assert (m["target"], m["repo_id"], m["revision"], m["source"]) == (TINY, TINY, "main", "hub")


def test_a_url_naming_a_commit_reads_that_commit(run, hub):
    commit = next(iter(hub.server.state.repos[TINY].commits))
    res = run("check", f"https://huggingface.co/{TINY}/tree/{commit}", *SAFE, "--format", "json")
    assert res.code == 0, res
    assert res.json()["models"][0]["commit"] == commit


@pytest.mark.parametrize("typed, meant", [
    ("google/gemma-3-4b", "google/gemma-3-4b-it"),  # the -it left out
    ("gemma-3-4b-it", "google/gemma-3-4b-it"),  # the org left out
    ("Google/Gemma-3-4B-IT", "google/gemma-3-4b-it"),  # case
])
def test_a_wrong_name_gets_the_closest_hub_repo(run, typed, meant):
    res = run("check", typed)
    assert res.code == 2, res
    line = one_line_error(res)
    assert f"{typed} is neither in the Hugging Face cache nor a model repo on the Hub" in line
    assert re.search(rf"did you mean {re.escape(meant)}\b", line), line


def test_a_wrong_name_offline_gets_the_cached_repo_and_a_download_hint_with_the_org(run, tiny_files):
    HubCache(run.cache).add(TINY, tiny_files)
    res = run("check", "gemma-3-4b-it", offline=True)
    assert res.code == 2, res
    line = one_line_error(res)
    assert "did you mean google/gemma-3-4b-it (cached)?" in line
    assert "hf download google/gemma-3-4b-it " in line
    assert "HF_HUB_OFFLINE is set, so it was not read from the Hub" in line


# --- failures: one line, what to do, a documented exit code ------------------------------------------------------

def test_gated_without_a_token(run, hub):
    res = run("check", BIG)
    assert res.code == 4, res
    assert one_line_error(res) == (
        f"gemma-doctor: error: {BIG} is gated and no token was sent: accept the licence at {hub.endpoint}/{BIG}, "
        "then log in with a token that can read it: hf auth login, or set HF_TOKEN")


def test_gated_with_a_token_that_has_no_access(run, hub):
    res = run("check", BIG, token=STRANGER)
    assert res.code == 4, res
    assert one_line_error(res) == (
        f"gemma-doctor: error: {BIG} is gated and your token has no access to it yet: accept the licence at "
        f"{hub.endpoint}/{BIG} with the account the token belongs to, then run again")


def test_private_repo_without_a_token_is_not_found_and_says_to_log_in(run):
    res = run("check", "acme/private-gemma")
    assert res.code == 2, res
    line = one_line_error(res)
    assert "acme/private-gemma is neither in the Hugging Face cache nor a model repo on the Hub" in line
    assert line.endswith("Check the name; if it is private, log in with a token that can read it: hf auth login, "
                         "or set HF_TOKEN")


def test_private_repo_with_a_reader_token(run):
    res = run("check", "acme/private-gemma", *SAFE, "--format", "json", token=READER)
    assert res.code == 0, res
    assert res.json()["models"][0]["remote"]["private"] is True


def test_missing_revision(run, hub):
    res = run("check", TINY, "--revision", "v9")
    assert res.code == 2, res
    assert one_line_error(res) == (f"gemma-doctor: error: {TINY} has no revision 'v9' on the Hub ({hub.endpoint}); "
                                   f"check --revision (a branch, tag or commit of {hub.endpoint}/{TINY})")


def test_offline_with_remote(run):
    res = run("check", TINY, "--remote", offline=True)
    assert res.code == 5, res
    assert one_line_error(res).startswith(f"gemma-doctor: error: {TINY}: HF_HUB_OFFLINE is set, so the Hub is not asked; "
                                          "unset it to check the repo before download, or download it first: hf download")


def test_offline_without_remote_keeps_the_not_cached_usage_error(run):
    res = run("check", TINY, offline=True)
    assert res.code == 2, res
    line = one_line_error(res)
    assert line.startswith(f"gemma-doctor: error: {TINY} is not in the Hugging Face cache at {run.cache}")
    assert line.endswith("HF_HUB_OFFLINE is set, so it was not read from the Hub")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_no_network(run):
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    res = run("check", TINY, endpoint=endpoint)
    assert res.code == 5, res
    assert one_line_error(res).startswith(f"gemma-doctor: error: cannot reach the Hub at {endpoint} (")
    assert "check the network, proxy or HF_ENDPOINT, or download first: hf download google/gemma-3-4b-it" in res.err


def test_timeout(run, hub):
    hub.server.state.delay = 4.0
    res = run("check", TINY, HF_HUB_ETAG_TIMEOUT="1", HF_HUB_DOWNLOAD_TIMEOUT="1")
    assert res.code == 5, res
    assert one_line_error(res).startswith(f"gemma-doctor: error: the Hub at {hub.endpoint} did not answer in time "
                                          f"for {TINY}; try again, raise HF_HUB_ETAG_TIMEOUT / HF_HUB_DOWNLOAD_TIMEOUT")


def test_hub_outage(run, hub):
    hub.server.state.fail_status = 503
    res = run("check", TINY)
    assert res.code == 5, res
    assert one_line_error(res).startswith(f"gemma-doctor: error: the Hub at {hub.endpoint} answered 503 for {TINY}")


def test_remote_needs_a_repo_id(run, tmp_path):
    res = run("check", "--remote")
    assert res.code == 2 and "--remote reads named repos from the Hub" in one_line_error(res)
    folder = tmp_path / "model"
    folder.mkdir()
    res = run("check", str(folder), "--remote")
    assert res.code == 2 and "is a folder, not a repo id" in one_line_error(res)


def test_a_hub_check_imports_huggingface_hub_but_never_torch(run, hub, client, tmp_path):
    probe = ("import json, sys\nfrom gemma_doctor.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n"
             "    pass\nprint(json.dumps(sorted({m.split('.')[0] for m in sys.modules})), file=sys.stderr)\n")
    e = subprocess_env(HF_HUB_CACHE=str(tmp_path / "c"), HF_HOME=str(tmp_path), HF_ENDPOINT=hub.endpoint)
    e.pop("HF_HUB_OFFLINE")
    res = subprocess.run([client, "-c", probe, "check", TINY], capture_output=True, text=True, env=e, timeout=300)
    mods = set(json.loads(res.stderr.strip().splitlines()[-1]))
    assert "huggingface_hub" in mods and not mods & {"torch", "transformers", "numpy"}


def test_the_hub_is_not_asked_for_a_cached_model(run, hub, tiny_files):
    HubCache(run.cache).add(TINY, tiny_files)
    res = run("check", TINY, *SAFE, "--format", "json")
    assert res.code == 0 and res.json()["models"][0]["source"] == "cache"
    assert hub.server.hits == []
    assert os.listdir(run.cache) == ["models--google--gemma-3-4b-it"]


@pytest.mark.parametrize("repo, code", [("acme/truncated-gemma", "GD204"), ("acme/big-header-gemma", None)])
def test_broken_and_unusual_shards_get_the_same_findings_from_the_hub_as_from_the_cache(run, hub, repo, code):
    remote = run("check", repo, *SAFE, "--format", "json")
    cached = run("check", repo, *SAFE, "--format", "json", cache_dir=hub.storage.root, offline=True, endpoint=None)
    assert comparable(remote.json()) == comparable(cached.json())
    codes = [f["code"] for f in remote.json()["models"][0]["findings"]]
    assert (code in codes) if code else not any(c.startswith("GD2") for c in codes), codes
    if repo == "acme/big-header-gemma":
        (m,) = remote.json()["models"]
        assert m["dtypes"]["shards"][0]["tensors"] == 2000
        ranges = [h.range for h in hub.server.hits if h.server == "cdn"]
        assert len(ranges) == 2 and ranges[0] == "bytes=0-100000" and ranges[1].startswith("bytes=100001-")


SPEAKS = """
import json, sys
import huggingface_hub as h
from huggingface_hub.errors import EntryNotFoundError, GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError
out = {"version": h.__version__}
api = h.HfApi()
def outcome(fn):
    try:
        fn()
        return "ok"
    except Exception as e:  # the class name is what the test compares
        return type(e).__name__
big, tiny, cache = sys.argv[1], sys.argv[2], sys.argv[3]
info = api.model_info(big, files_metadata=True)
out["sha"], out["gated"] = info.sha, info.gated
out["sizes"] = {s.rfilename: s.size for s in info.siblings}
out["auth_anonymous"] = outcome(lambda: api.auth_check(big, token=False))
out["auth_reader"] = outcome(lambda: api.auth_check(big, token=sys.argv[4]))
out["download"] = open(h.hf_hub_download(tiny, "config.json", cache_dir=cache)).read()[:1]
out["missing_file"] = outcome(lambda: h.hf_hub_download(tiny, "nope.json", cache_dir=cache))
out["missing_revision"] = outcome(lambda: api.model_info(tiny, revision="v9"))
out["missing_repo"] = outcome(lambda: api.model_info("acme/nope"))
meta = api.get_safetensors_metadata(big, token=sys.argv[4])
out["params"] = meta.parameter_count
out["listed"] = sorted(m.id for m in api.list_models(search="gemma-3-4b", limit=5))
print(json.dumps(out))
"""


def test_the_local_hub_speaks_the_real_clients_protocol(client, hub, tmp_path):
    """The test Hub is only worth its tests if the real client gets from it what it gets from the Hub."""
    e = subprocess_env(HF_HOME=str(tmp_path), HF_ENDPOINT=hub.endpoint)
    e.pop("HF_HUB_OFFLINE")
    res = subprocess.run([client, "-c", SPEAKS, BIG, TINY, str(tmp_path / "c"), READER], capture_output=True,
                         text=True, env=e, timeout=300)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    manifest = _load_example_builder().load_manifest()
    assert out["sha"] == manifest["commit"] and out["gated"] == "manual"
    assert out["sizes"]["model-00001-of-00005.safetensors"] == manifest["shards"][0]["size"]
    assert (out["auth_anonymous"], out["auth_reader"]) == ("GatedRepoError", "ok")
    assert out["download"] == "{"
    assert out["missing_file"] in ("EntryNotFoundError", "RemoteEntryNotFoundError")
    assert (out["missing_revision"], out["missing_repo"]) == ("RevisionNotFoundError", "RepositoryNotFoundError")
    assert out["params"] == {"BF16": 12187325040}
    assert out["listed"] == ["google/gemma-3-4b-it", "google/gemma-3-4b-pt"]


# --- an adapter whose base is not downloaded ----------------------------------------------------------------

def _adapter(folder: Path, base: str) -> Path:
    """A LoRA adapter of the tiny multimodal Gemma 3 (keys in transformers >= 4.52's layout), naming ``base``."""
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 4, "lora_alpha": 8, "base_model_name_or_path": base,
        "target_modules": ["q_proj", "v_proj"], "modules_to_save": None}))
    prefix = "base_model.model.model.language_model.layers.0.self_attn"
    (folder / "adapter_model.safetensors").write_bytes(st_file(
        {f"{prefix}.{m}.lora_{ab}.weight": ("F32", [4, 4]) for m in ("q_proj", "v_proj") for ab in "AB"}))
    return folder


def test_an_adapters_base_that_is_not_downloaded_is_read_from_the_hub(run, hub, tmp_path):
    adapter = _adapter(tmp_path / "adapter", TINY)
    # Offline, as before: reported, with the reason.
    res = run("check", str(adapter), "--gpu", "none", "--format", "json", "--fail-on", "never", offline=True)
    (m,) = res.json()["models"]
    assert m["kind"] == "adapter" and m["base"]["found"] == "not found"
    gd742 = next(f for f in m["findings"] if f["code"] == "GD742")
    assert "HF_HUB_OFFLINE is set" in gd742["message"] and "HF_HUB_OFFLINE is set" in m["base"]["note"]
    assert hub.server.hits == []
    # Online: the base's config.json alone, from the Hub; nothing is downloaded into the cache.
    res = run("check", str(adapter), "--gpu", "none", "--format", "json", "--fail-on", "never")
    doc = res.json()
    jsonschema.validate(doc, json.loads((ROOT / "docs" / "schema" / "check.schema.json").read_text()),
                        cls=jsonschema.Draft202012Validator)
    (m,) = doc["models"]
    assert m["base"]["found"] == "hub" and m["base"]["model_type"] == "gemma3" and m["base"]["note"] is None
    assert m["base"]["path"].startswith(f"{hub.endpoint}/{TINY}/tree/")
    assert "GD742" not in {f["code"] for f in m["findings"]}
    files = {h.path.split("?")[0].rsplit("/", 1)[-1] for h in hub.server.hits if "/resolve/" in h.path}
    assert files == {"config.json"}, hub.server.hits
    assert not run.cache.exists() or os.listdir(run.cache) == []
    text = run("check", str(adapter), "--gpu", "none")
    assert f"base: {TINY} (config.json from the Hub, {hub.endpoint}/{TINY}/tree/" in text.out


@pytest.mark.parametrize("base, said", [
    ("acme/no-such-gemma", "nor a model repo on the hub"),  # the Hub has no such repo
    (BIG, "gated"),                              # gated, and no token
])
def test_an_adapters_base_the_hub_will_not_give_is_reported_with_the_reason(run, hub, tmp_path, base, said):
    adapter = _adapter(tmp_path / "adapter", base)
    res = run("check", str(adapter), "--gpu", "none", "--format", "json", "--fail-on", "never")
    assert res.code == 0 and "Traceback" not in res.err, res
    (m,) = res.json()["models"]
    assert m["base"]["found"] == "not found" and said in m["base"]["note"].lower()
    gd742 = next(f for f in m["findings"] if f["code"] == "GD742")
    assert gd742["severity"] == "info" and m["base"]["note"] in gd742["message"]

"""`gemma-doctor check`: findings per family, JSON shape, exit codes, bad input as findings."""

from __future__ import annotations

import json

import pytest

from gemma_doctor.facts import CheckOptions, Environment
from gemma_doctor.model import read_model
from gemma_doctor.locate import Snapshot
from gemma_doctor.readers.versions import Versions
from gemma_doctor.rules import use_cache
from tests.builders import (gemma2_config, gemma3_1b_config, gemma3_12b_config, gemma3n_config, generation_config,
                            llama_config, paligemma2_config, variant)

# Findings about the HybridCache crash are judged against a transformers 4.50.x machine here; tests/test_stack.py
# covers the installed (5.x), planned and unknown cases.
pytestmark = pytest.mark.usefixtures("plan_450")

FAMILIES = {
    "gemma3-multimodal": (gemma3_12b_config, "gemma3", "text_config.use_cache"),
    "gemma3-text": (gemma3_1b_config, "gemma3", "use_cache"),
    "gemma2": (gemma2_config, "gemma2", "use_cache"),
    "paligemma2": (paligemma2_config, "paligemma2", "text_config.use_cache"),
}


def _codes(model: dict) -> dict[str, str]:
    return {f["code"]: f["severity"] for f in model["findings"]}


@pytest.mark.parametrize("name", FAMILIES)
def test_hybridcache_families_report_use_cache_where_the_text_model_reads_it(hub, cli, name):
    make, family, key = FAMILIES[name]
    hub.add("org/model", {"config.json": make(), "generation_config.json": generation_config()})
    r = cli("check", "org/model", "--cache-dir", hub.root, "--format", "json")
    assert r.code == 1, r
    doc = r.json()
    [model] = doc["models"]
    assert (doc["schema_version"], doc["status"], model["family"], model["repo_id"], model["revision"]) == (1, "fail", family, "org/model", "main")
    gd101 = next(f for f in model["findings"] if f["code"] == "GD101")
    assert gd101 == {**gd101, "severity": "error", "file": "config.json", "key": key,
                     "fix": f"gemma-doctor fix org/model --cache-dir {hub.root} --with transformers==4.50.3 --inplace"}
    assert "'HybridCache' object has no attribute 'float'" in gd101["message"]
    gd102 = next(f for f in model["findings"] if f["code"] == "GD102")
    assert (gd102["severity"], gd102["file"], gd102["key"]) == ("warning", "generation_config.json", "use_cache")


@pytest.mark.parametrize("fmt", ["text", "json"])
@pytest.mark.parametrize("make", [gemma3n_config, llama_config,
                                  lambda: {**paligemma2_config(), "text_config": {"model_type": "gemma"}}])
def test_models_without_a_hybridcache_get_no_use_cache_error(hub, cli, make, fmt):
    hub.add("org/model", {"config.json": make(), "generation_config.json": generation_config()})
    r = cli("check", "org/model", "--cache-dir", hub.root, "--format", fmt)
    # transformers 4.50.3 predates Gemma 3n (4.53.0): that, and its missing timm, are errors of their own (GD108, GD110).
    # A llama alone is no Gemma to check: a usage error (test_explicit_non_gemma_target_alone_checks_nothing...).
    assert r.code == {gemma3n_config: 1, llama_config: 2}.get(make, 0), r
    assert "GD101" not in r.out and "GD102" not in r.out


def test_fixed_configs_pass_and_the_top_level_key_alone_does_not(hub, cli):
    cfg = gemma3_12b_config()
    hub.add("org/top-only", {"config.json": variant(cfg, use_cache=False)})
    hub.add("org/fixed", {"config.json": variant(cfg, text_config={**cfg["text_config"], "use_cache": False}),
                          "generation_config.json": {**generation_config(), "use_cache": False}})
    r = cli("check", "org/top-only", "org/fixed", "--cache-dir", hub.root, "--format", "json")
    top, fixed = r.json()["models"]
    assert _codes(top) == {"GD101": "error", "GD104": "info"}
    assert _codes(fixed) == {"GD103": "info"}  # the crash is avoided by the on-disk fix: said, never failed
    assert r.code == 1


@pytest.mark.parametrize("value, expected", [(True, "is true"), (None, "is missing (defaults to true)"), (False, None)])
def test_generation_config_use_cache_is_judged_by_value_not_presence(hub, cli, value, expected):
    """generate() builds a HybridCache unless generation_config.json says use_cache false: an explicit true
    (what transformers >= 5 writes when saving) is as bad as a missing key, and fix turns it off."""
    cfg = gemma3_12b_config()
    gen = generation_config() if value is None else {**generation_config(), "use_cache": value}
    hub.add("org/model", {"config.json": variant(cfg, text_config={**cfg["text_config"], "use_cache": False}),
                          "generation_config.json": gen})
    r = cli("check", "org/model", "--cache-dir", hub.root, "--format", "json")
    gd102 = [f for f in r.json()["models"][0]["findings"] if f["code"] == "GD102"]
    if expected is None:
        assert gd102 == [] and r.code == 0 and _codes(r.json()["models"][0]) == {"GD103": "info"}
        return
    [f] = gd102
    assert (f["severity"], f["file"], f["key"]) == ("warning", "generation_config.json", "use_cache")
    assert f"generation_config.json use_cache {expected}" in f["message"]
    assert cli("fix", "org/model", "--cache-dir", hub.root, "--inplace").code == 0
    snap = next((hub.repo_dir("org/model") / "snapshots").iterdir())
    assert json.loads((snap / "generation_config.json").read_text())["use_cache"] is False
    again = cli("check", "org/model", "--cache-dir", hub.root, "--format", "json")
    assert "GD102" not in _codes(again.json()["models"][0])


def test_whole_cache_reports_gemma_models_and_skips_others(hub, cli):
    hub.add("google/gemma-2-2b-it", {"config.json": gemma2_config()})
    hub.add("meta-llama/Llama-3.2-1B", {"config.json": llama_config()})
    hub.add("someone/renamed-gemma", {"config.json": gemma3_1b_config()})
    r = cli("check", "--cache-dir", hub.root, "--format", "json")
    doc = r.json()
    assert [m["repo_id"] for m in doc["models"]] == ["google/gemma-2-2b-it", "someone/renamed-gemma"]
    assert [s["target"] for s in doc["skipped"]] == ["meta-llama/Llama-3.2-1B"]
    assert doc["summary"]["skipped"] == 1


@pytest.mark.parametrize("config, said", [(llama_config(), "model_type 'llama'"),
                                         ({"architectures": ["Gemma7ForCausalLM"]}, "model_type 'unknown'")])
def test_explicit_non_gemma_target_alone_checks_nothing_and_is_a_usage_error(hub, cli, config, said, tmp_path):
    """A CI gate that checked no Gemma model must not pass: it said "OK 1 model(s)", exit 0. The one-line error says
    which model_type was found (or that there was none), so a wrong target is obvious; cached repo or folder alike."""
    hub.add("meta-llama/Llama-3.2-1B", {"config.json": config})
    folder = tmp_path / "llama-folder"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    for target in ("meta-llama/Llama-3.2-1B", str(folder)):
        for fmt in ("text", "json", "github"):
            r = cli("check", target, "--cache-dir", hub.root, "--format", fmt)
            assert (r.code, r.out) == (2, ""), (target, fmt, r)
            assert r.err.count("\n") == 1 and "nothing to check" in r.err
            assert f"{target}: not a Gemma-family model ({said})" in r.err


def test_explicit_non_gemma_target_beside_a_gemma_is_reported_as_info_and_passes(hub, cli):
    hub.add("meta-llama/Llama-3.2-1B", {"config.json": llama_config()})
    hub.add("google/gemma-2-2b-it", {"config.json": gemma2_config(), "generation_config.json": generation_config()})
    r = cli("check", "meta-llama/Llama-3.2-1B", "google/gemma-2-2b-it", "--cache-dir", hub.root, "--format", "json",
            "--fail-on", "never")
    assert r.code == 0
    [f] = r.json()["models"][0]["findings"]
    assert (f["code"], f["severity"], f["key"]) == ("GD003", "info", "model_type")
    assert "not a Gemma-family model (model_type 'llama'); left alone" == f["message"]


BAD_CONFIGS = {
    "not json": (b"{not json", "GD001", "not valid JSON"),
    "empty": (b"", "GD001", "empty file"),
    "binary": (b"\xff\xfe\x00\x01", "GD001", "not UTF-8"),
    "array": (b"[1, 2]", "GD002", "not an object"),
    "duplicate key": (b'{"model_type": "gemma3", "model_type": "llama"}', "GD002", "duplicate key"),
    "NaN literal": (b'{"model_type": "gemma2", "x": NaN}', "GD002", "NaN"),
    "deep": (b"[" * 100000 + b"]" * 100000, "GD002", "nested too deeply"),
    "use_cache string": (json.dumps({**gemma2_config(), "use_cache": "false"}).encode(), "GD002", "not a boolean"),
    "text_config list": (json.dumps({**gemma3_12b_config(), "text_config": [1]}).encode(), "GD002", "not an object"),
}


@pytest.mark.parametrize("name", BAD_CONFIGS)
def test_bad_configs_are_findings_and_the_run_goes_on(hub, cli, name):
    raw, code, words = BAD_CONFIGS[name]
    hub.add("org/broken", {"config.json": raw})
    hub.add("org/good", {"config.json": gemma2_config()})
    r = cli("check", "org/broken", "org/good", "--cache-dir", hub.root, "--format", "json")
    assert r.code == 1 and r.err == "", r
    broken, good = r.json()["models"]
    finding = next(f for f in broken["findings"] if f["code"] == code)
    assert finding["severity"] == "error" and words in finding["message"], finding
    assert "GD101" in _codes(good)


def test_malformed_generation_config_is_reported(hub, cli):
    hub.add("org/m", {"config.json": gemma2_config(), "generation_config.json": b"{,}"})
    r = cli("check", "org/m", "--cache-dir", hub.root, "--format", "json")
    assert _codes(r.json()["models"][0])["GD004"] == "error"


def test_fail_on_thresholds_and_exit_codes(hub, cli):
    cfg = gemma2_config()
    hub.add("org/warn-only", {"config.json": variant(cfg, use_cache=False), "generation_config.json": generation_config()})
    args = ("check", "org/warn-only", "--cache-dir", hub.root)
    assert cli(*args).code == 0
    assert cli(*args, "--fail-on", "warning").code == 1
    assert cli(*args, "--fail-on", "never").code == 0
    assert cli(*args, "--fail-on", "bogus").code == 2
    assert cli("check", "org/absent", "--cache-dir", hub.root).code == 2


def test_text_report_names_the_problem_the_place_and_the_command(hub, cli):
    hub.add("google/gemma-3-12b-it", {"config.json": gemma3_12b_config()})
    r = cli("check", "google/gemma-3-12b-it", "--cache-dir", hub.root)
    assert r.code == 1
    assert "GD101 config.json:text_config.use_cache" in r.out
    assert f"fix: gemma-doctor fix google/gemma-3-12b-it --cache-dir {hub.root} --with transformers==4.50.3 --inplace" in r.out
    assert "\x1b[" not in r.out  # not a terminal: no colour codes
    assert "FAIL 1 model(s): 1 error(s)" in r.out


@pytest.mark.parametrize("version,affected", [("4.50.0", True), ("4.50.3", True), ("4.50.0.dev0", True),
                                              ("4.49.0+gemma3", True), ("4.49.0", False), ("4.51.0", False),
                                              ("5.23.0", False)])
def test_transformers_versions_with_the_hybridcache_bug(hub, version, affected):
    cfg = gemma3_12b_config()
    fixed = variant(cfg, text_config={**cfg["text_config"], "use_cache": False})
    for config, expected in ((cfg, "GD101"), (fixed, "GD103")):
        snap = hub.add("org/m", {"config.json": config})
        facts = read_model(Snapshot("org/m", snap, "org/m", "main", snap.name, hub.repo_dir("org/m"), hub.root))
        env = Environment(Versions({"transformers": version}))
        found = {f.code: f for f in use_cache.check(facts, env, CheckOptions())}
        if not affected:
            assert found == {}
        elif expected == "GD101":
            assert found["GD101"].severity.value == "error" and f"transformers {version} (installed) crashes" in found["GD101"].message
        else:  # the on-disk fix avoids it: an info naming the upgrade
            assert set(found) == {"GD103"} and found["GD103"].severity.value == "info" and "4.51.0" in found["GD103"].fix


def test_usage_errors_are_one_line(hub, cli):
    r = cli("check", "google/gemma-3-27b-it", "--cache-dir", hub.root)
    assert r.code == 2 and r.out == "" and r.err.count("\n") == 1 and "hf download" in r.err
    r = cli("check", "--no-such-option")
    assert r.code == 2 and r.err.count("\n") == 1


def test_the_suggested_fix_command_runs_as_printed(hub, cli, monkeypatch):
    """A hint names --cache-dir and --revision when they are not the defaults, so copying it works."""
    import shlex

    old = hub.add("google/gemma-2-2b-it", {"config.json": gemma2_config()}, refs=("v1",))
    hub.add("google/gemma-2-2b-it", {"config.json": variant(gemma2_config(), hidden_size=1)}, refs=("main",))
    r = cli("check", "google/gemma-2-2b-it", "--revision", "v1", "--cache-dir", hub.root, "--format", "json")
    fix = next(f["fix"] for f in r.json()["models"][0]["findings"] if f["code"] == "GD101")
    assert fix == f"gemma-doctor fix google/gemma-2-2b-it --revision v1 --cache-dir {hub.root} --with transformers==4.50.3 --inplace"
    assert cli(*shlex.split(fix)[1:]).code == 0
    assert json.loads((old / "config.json").read_text())["use_cache"] is False
    monkeypatch.setenv("HF_HUB_CACHE", str(hub.root))  # the default cache: no --cache-dir needed
    r = cli("check", "google/gemma-2-2b-it", "--format", "json")
    assert next(f["fix"] for f in r.json()["models"][0]["findings"] if f["code"] == "GD101") == \
        "gemma-doctor fix google/gemma-2-2b-it --with transformers==4.50.3 --inplace"


@pytest.mark.parametrize("planned", [True, False])
def test_a_non_boolean_use_cache_gets_our_fix_only_where_the_crash_can_happen(hub, cli, monkeypatch, planned):
    """With transformers 4.50.x planned, `fix` writes false; with a release without the crash it is the user's call."""
    if not planned:
        monkeypatch.delenv("GEMMA_DOCTOR_WITH")  # the main test venv's transformers 5.x: no HybridCache crash
    hub.add("org/m", {"config.json": {**gemma2_config(), "use_cache": "false"}})
    r = cli("check", "org/m", "--cache-dir", hub.root, "--format", "json", "--fail-on", "never")
    [gd002] = [f for f in r.json()["models"][0]["findings"] if f["code"] == "GD002"]
    if planned:
        assert gd002["fix"].startswith("gemma-doctor fix org/m") and gd002["fix"].endswith(" (writes false)")
    else:
        assert gd002["fix"] == "write a JSON boolean (true or false) for use_cache"


def test_a_null_text_config_reads_as_use_cache_missing(hub, cli):
    """transformers builds a default text config for text_config: null, whose use_cache is true."""
    hub.add("org/m", {"config.json": {**gemma3_12b_config(), "text_config": None}})
    r = cli("check", "org/m", "--cache-dir", hub.root, "--format", "json", "--fail-on", "never")
    found = [(f["code"], f["message"]) for f in r.json()["models"][0]["findings"] if f["key"] == "text_config.use_cache"]
    assert len(found) == 1 and found[0][1].startswith("text_config.use_cache is missing (defaults to true)"), found

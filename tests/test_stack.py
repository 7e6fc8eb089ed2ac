"""Findings follow the libraries that will run: installed here, or named for the training machine
(--with / --requirements / GEMMA_DOCTOR_WITH); unknown versions warn instead of failing."""

from __future__ import annotations

import json
import os

import pytest

from gemma_doctor.stack import Exposure, Package, Window, exposure_of, parse_requirements_text, resolve
from gemma_doctor.readers.versions import installed
from tests.builders import example_file

REPO = "google/gemma-3-12b-it"
STOCK = {"config.json": example_file("config.json"), "generation_config.json": example_file("generation_config.json")}
WINDOW = Window("transformers", ">=4.50.0.dev0,<4.51.0", "4.51.0")


def _findings(r) -> dict[str, str]:  # noqa: ANN001
    return {f["code"]: f["severity"] for f in r.json()["models"][0]["findings"]}


@pytest.fixture
def stock(hub):
    hub.add(REPO, STOCK)
    return hub


def test_the_test_venv_runs_a_transformers_without_the_hybridcache_crash():
    # What the tests below rely on: the main test environment has transformers 5.x installed.
    assert exposure_of(Package("transformers", installed().get("transformers")), WINDOW) is Exposure.SAFE


def test_stock_gemma3_passes_with_the_installed_transformers_and_fix_leaves_it_alone(stock, cli):
    r = cli("check", REPO, "--cache-dir", stock.root, "--gpu", "A100", "--format", "json")
    assert r.code == 0, r
    assert not {"GD101", "GD102", "GD103"} & set(_findings(r))
    assert r.json()["environment"]["stack"]["planned"] is False
    before = (stock.repo_dir(REPO) / "snapshots").stat().st_mtime_ns
    f = cli("fix", REPO, "--cache-dir", stock.root, "--inplace")
    assert f.code == 0 and "has no HybridCache crash" in f.out and "--with transformers==4.50.3" in f.out, f
    assert all(p.is_symlink() for p in (stock.repo_dir(REPO) / "snapshots").glob("*/*.json"))
    assert (stock.repo_dir(REPO) / "snapshots").stat().st_mtime_ns == before
    rows = cli("list", "--cache-dir", stock.root, "--format", "json").json()["models"]
    assert [r["status"] for r in rows] == ["ok"]


def test_the_same_snapshot_planned_for_450_fails_and_fix_then_writes(stock, cli):
    r = cli("check", REPO, "--cache-dir", stock.root, "--gpu", "A100", "--format", "json", "--with", "transformers==4.50.3")
    assert r.code == 1
    gd101 = next(f for f in r.json()["models"][0]["findings"] if f["code"] == "GD101")
    assert gd101["severity"] == "error" and "transformers 4.50.3 (--with) crashes" in gd101["message"]
    assert gd101["details"]["exposure"] == "affected"
    assert r.json()["environment"]["stack"]["packages"]["transformers"] == {"version": "4.50.3", "specifier": None,
                                                                            "source": "--with"}
    rows = cli("list", "--cache-dir", stock.root, "--format", "json", "--with", "transformers==4.50.3").json()["models"]
    assert [r["status"] for r in rows] == ["needs-fix"]
    assert cli("fix", REPO, "--cache-dir", stock.root, "--inplace", "--with", "transformers==4.50.3").code == 0
    snap = next((stock.repo_dir(REPO) / "snapshots").iterdir())
    assert json.loads((snap / "config.json").read_text())["text_config"]["use_cache"] is False


def test_the_environment_variable_plans_like_the_option(stock, cli, monkeypatch):
    monkeypatch.setenv("GEMMA_DOCTOR_WITH", "transformers==4.50.0")
    r = cli("check", REPO, "--cache-dir", stock.root, "--format", "json")
    assert r.code == 1 and _findings(r)["GD101"] == "error"


@pytest.mark.parametrize("content, name, expected", [
    ("transformers==4.50.3\naccelerate==1.5.2\n", "requirements.txt", "error"),
    ("# pip freeze\ntransformers==5.6.0\n", "freeze.txt", None),  # 5.0-5.5 would crash otherwise (GD105)
    ("transformers>=4.50,<4.51  # the window\n", "requirements.txt", "error"),
    ("transformers>=4.50\n", "requirements.txt", "warning"),
    ("torch==2.13.0\n", "requirements.txt", "warning"),  # transformers not on the training machine's list
    ('[[package]]\nname = "transformers"\nversion = "4.50.2"\n\n[[package]]\nname = "torch"\nversion = "2.6.0"\n',
     "uv.lock", "error"),
])
def test_requirements_files_name_the_training_machine(stock, cli, tmp_path, content, name, expected):
    path = tmp_path / name
    path.write_text(content)
    r = cli("check", REPO, "--cache-dir", stock.root, "--format", "json", "--requirements", path)
    assert _findings(r).get("GD101") == expected
    assert r.code == (1 if expected == "error" else 0), r
    if expected == "warning":
        gd101 = next(f for f in r.json()["models"][0]["findings"] if f["code"] == "GD101")
        assert "depends on the transformers that will run" in gd101["message"] and "--with transformers==" in gd101["message"]


def test_an_unknown_transformers_warns_and_fails_only_on_warning(stock, cli):
    args = ("check", REPO, "--cache-dir", stock.root, "--with", "transformers>=4.49")
    assert cli(*args).code == 0
    assert cli(*args, "--fail-on", "warning").code == 1


@pytest.mark.parametrize("bad", ["transformers==", "==4.50", "transformers 4.50.3 x"])
def test_a_bad_with_is_a_one_line_usage_error(stock, cli, bad):
    r = cli("check", REPO, "--cache-dir", stock.root, "--with", bad)
    assert r.code == 2 and r.err.count("\n") == 1 and "--with" in r.err, r


def test_requirements_that_are_not_a_regular_file_are_refused_without_hanging(stock, cli, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (fifo, tmp_path, tmp_path / "absent.txt"):
        r = cli("check", REPO, "--cache-dir", stock.root, "--requirements", path)
        assert r.code == 2 and r.err.count("\n") == 1 and "--requirements" in r.err, r


@pytest.mark.parametrize("spec, expected", [
    ("==4.50.3", Exposure.AFFECTED), ("==4.50.*", Exposure.AFFECTED), ("~=4.50.0", Exposure.AFFECTED),
    (">=4.50,<4.51", Exposure.AFFECTED), (">=5", Exposure.SAFE), ("<4.50", Exposure.SAFE), (">=4.51", Exposure.SAFE),
    (">=4.50", Exposure.UNKNOWN), (">=4.49,<4.52", Exposure.UNKNOWN), ("!=4.50.3", Exposure.UNKNOWN),
])
def test_exposure_of_a_range_is_decided_only_when_the_whole_range_agrees(spec, expected):
    assert exposure_of(Package("transformers", None, spec, "x"), WINDOW) is expected


def test_exact_versions_and_absent_packages():
    assert exposure_of(Package("transformers", "4.50.0.dev0"), WINDOW) is Exposure.AFFECTED
    assert exposure_of(Package("transformers", "4.51.0"), WINDOW) is Exposure.SAFE
    assert exposure_of(Package("transformers"), WINDOW) is Exposure.UNKNOWN


def test_requirement_lines_that_are_not_packages_are_skipped_not_fatal():
    packages, skipped = parse_requirements_text(
        "-r base.txt\n--index-url https://x\ntransformers==4.50.3 \\\n    --hash=sha256:ab\n"
        "peft[extra]>=0.12 ; python_version>'3'\ntorch @ https://example.org/torch.whl\nnot a requirement !!\n", "r.txt")
    assert packages["transformers"].version == "4.50.3" and packages["transformers"].source == "r.txt:3"
    assert packages["peft"].specifier == ">=0.12"
    assert packages["torch"].version is None and "version unknown" in packages["torch"].source
    assert [s.split(":")[1] for s in skipped] == ["1", "2", "7"]


def test_with_overrides_the_requirements_file(tmp_path):
    path = tmp_path / "requirements.txt"
    path.write_text("transformers==4.50.3\npeft==0.11.1\n")
    stack = resolve(installed(), ("transformers==5.1.0",), str(path))
    assert (stack.version("transformers"), stack.version("peft"), stack.planned) == ("5.1.0", "0.11.1", True)
    assert stack.cli_args == ("--requirements", str(path), "--with", "transformers==5.1.0")
    assert stack.get("accelerate").describe() == "accelerate (not installed)"


# --- the window test without packaging.specifiers (kept off check's start-up path) ----------------------------

from hypothesis import given
from hypothesis import strategies as st

_releases = st.tuples(st.integers(0, 6), st.integers(0, 30), st.integers(0, 9)).map(lambda t: "%d.%d.%d" % t)
_versions = _releases | st.tuples(_releases, st.sampled_from(["rc1", ".dev0", ".post1", "+local", "a2", ""])).map("".join)
_clause = st.tuples(st.sampled_from([">=", "<=", "==", "!=", ">", "<"]), _releases | _releases.map(lambda r: r + ".dev0"))


@given(version=_versions, clauses=st.lists(_clause, min_size=1, max_size=3))
def test_window_membership_is_pep440s_for_every_version_and_plain_specifier(version, clauses):
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    from gemma_doctor.stack import Window

    spec = ",".join(op + v for op, v in clauses)
    expected = SpecifierSet(spec).contains(Version(version), prereleases=True)
    window = Window("transformers", spec)
    # as a version string (the installed version) and as a Version (a planned one): both are PEP 440's answer
    assert window.contains(version) == window.contains(Version(version)) == expected


def test_a_misspelt_with_is_an_error_with_a_did_you_mean_and_the_ci_gate_fails(stock, cli):
    """`--with transfomers==4.50.3` was accepted silently: the installed transformers judged the run, and it passed."""
    r = cli("check", REPO, "--cache-dir", stock.root, "--with", "transfomers==4.50.3", "--format", "json")
    assert r.code == 1
    [gd480] = [f for f in r.json()["models"][0]["findings"] if f["code"] == "GD480"]
    assert gd480["severity"] == "error" and "did you mean transformers?" in gd480["message"]
    assert gd480["details"]["suggestion"] == "transformers" and gd480["details"]["source"] == "--with"


def test_an_unknown_with_warns_that_it_changes_nothing(stock, cli):
    r = cli("check", REPO, "--cache-dir", stock.root, "--with", "numpy==2.0", "--format", "json", "--fail-on", "never")
    [gd480] = [f for f in r.json()["models"][0]["findings"] if f["code"] == "GD480"]
    assert gd480["severity"] == "warning" and gd480["details"]["suggestion"] is None


def test_a_misspelling_in_requirements_is_named_by_its_line_and_other_packages_are_left_alone(stock, cli, tmp_path):
    req = tmp_path / "requirements.txt"
    req.write_text("numpy==2.0\ndatasets>=3\nflash_atn==2.6.3\ntransformers==5.23.0\nxformers==0.0.30\n")
    r = cli("check", REPO, "--cache-dir", stock.root, "--requirements", req, "--format", "json", "--fail-on", "never")
    found = [f for f in r.json()["models"][0]["findings"] if f["code"] == "GD480"]
    assert [(f["severity"], f["details"]["source"], f["details"]["suggestion"]) for f in found] == \
        [("error", "requirements.txt:3", "flash-attn")]


def test_every_package_a_window_or_the_catalogue_reads_is_a_known_name():
    """The did-you-mean's vocabulary cannot drift from the packages the findings read."""
    import importlib
    import pkgutil

    import gemma_doctor.rules as rules
    from gemma_doctor import catalogue
    from gemma_doctor.stack import known_names, normalise

    modules = ["gemma_doctor.versioning"] + [f"gemma_doctor.rules.{m.name}" for m in pkgutil.iter_modules(rules.__path__)]
    read = {normalise(v.package) for n in modules for v in vars(importlib.import_module(n)).values() if isinstance(v, Window)}
    read |= {normalise(p) for e in catalogue.coded() for p in (e["when"].get("packages") or {})}
    assert read - known_names() == set()


def _exposure_by_packaging(spec: str, window: str) -> Exposure:
    """The range's exposure as packaging's SpecifierSet decides it over the same probes (the answer before the plain
    path)."""
    from packaging.specifiers import SpecifierSet

    from gemma_doctor.stack import _probe_versions

    allowed, bad = SpecifierSet(spec), SpecifierSet(window)
    probes = [v for v in _probe_versions(s.version for s in (*allowed, *bad)) if allowed.contains(v, prereleases=False)]
    if not probes:
        return Exposure.UNKNOWN
    hits = [bad.contains(v, prereleases=True) for v in probes]
    return Exposure.AFFECTED if all(hits) else Exposure.SAFE if not any(hits) else Exposure.UNKNOWN


@given(mine=st.lists(_clause, min_size=1, max_size=2), window=st.lists(_clause, min_size=1, max_size=2))
def test_a_ranges_exposure_without_packaging_is_packagings(mine, window):
    """exposure_of decides plain ranges by comparing releases (no packaging.specifiers import): the same answer."""
    from gemma_doctor.stack import _range_exposure

    spec, bad = ",".join(op + v for op, v in mine), ",".join(op + v for op, v in window)
    assert _range_exposure(spec, bad) is _exposure_by_packaging(spec, bad)


@pytest.mark.parametrize("spec, bound", [("<5.6.0", "5.6.0"), (">=5.0.0,<5.6.0", "5.6.0"), (">=4.50.0.dev0,<4.51.0", "4.51.0"),
                                         (">=5.0.0", None), ("<=5.5.4", None), ("<5,<6", None), ("~=4.50", None)])
def test_the_first_release_out_of_a_window(spec, bound):
    from gemma_doctor.stack import upper_bound

    assert upper_bound(spec) == bound


@pytest.mark.parametrize("gpu", ["none", "L4"])
def test_a_misspelt_with_changes_no_planned_run(stock, cli, gpu):
    """GD480 rejected every candidate of the search: with `--with transfomers==4.50.3` check fell back to another run
    ("batch 8" where the same command without the typo planned "batch 1 x8 accumulation") and recommend had none. The
    typo is said, and the run is the one planned without it (judged with the installed transformers, as GD480 says)."""
    args = ["check", REPO, "--cache-dir", stock.root, "--gpu", gpu, "--format", "json", "--fail-on", "never"]
    plain = cli(*args).json()["models"][0]
    typo = cli(*args, "--with", "transfomers==4.50.3").json()["models"][0]
    assert "GD480" in {f["code"] for f in typo["findings"]}
    assert typo["prescription"] is not None

    def run(prescription: dict) -> dict:  # the Run's stack names the typo'd package among its unknowns: all else equal
        return {**prescription, "run": {k: v for k, v in prescription["run"].items() if k != "stack"}}

    assert run(typo["prescription"]) == run(plain["prescription"])
    assert typo["memory"]["summary"] == plain["memory"]["summary"]
    assert typo["recommendation"]["summary"] == plain["recommendation"]["summary"]

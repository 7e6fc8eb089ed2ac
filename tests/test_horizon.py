"""The knowledge horizon (GD120): a stack newer than what the findings were verified on is named, never silently OK."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from packaging.version import Version

from gemma_doctor import horizon, versioning
from gemma_doctor.stack import Package, Stack, Window
from tests.builders import gemma3_12b_config
from tests.venvs import pinned

SCHEMA = json.loads((Path(__file__).resolve().parent.parent / "docs" / "schema" / "check.schema.json").read_text())
REPO = "google/gemma-3-12b-it"


def _check(cli, hub, *args: str):
    hub.add(REPO, {"config.json": gemma3_12b_config()})
    r = cli("check", REPO, "--cache-dir", hub.root, "--format", "json", *args)
    doc = r.json()
    jsonschema.validate(doc, SCHEMA)
    return r, doc, {f["code"]: f for f in doc["models"][0]["findings"]}


def test_a_release_that_does_not_exist_yet_is_named_not_passed_silently(cli, hub):
    """The issue's case: --with transformers==9.0.0 answered 'no findings', OK."""
    r, doc, found = _check(cli, hub, "--with", "transformers==9.0.0")
    assert r.code == 0  # info: it never fails a run by itself
    gd120 = found["GD120"]
    assert gd120["severity"] == "info" and gd120["key"] == "transformers"
    assert f"transformers 9.0.0 (--with) is newer than transformers {horizon.VERIFIED['transformers']}" in gd120["message"]
    assert gd120["details"]["verified"] == horizon.VERIFIED["transformers"]
    assert doc["environment"]["horizon"]["libraries"]["transformers"] == {
        "verified": horizon.VERIFIED["transformers"], "version": "9.0.0", "specifier": None, "newer": True}
    assert doc["environment"]["horizon"]["verified_on"] == horizon.VERIFIED_ON


@pytest.mark.parametrize("planned", ["transformers==5.24.0", "transformers==5.23.0", "transformers==4.50.3", "transformers>=5.0"])
def test_a_verified_release_or_a_range_that_admits_one_is_not_reported(cli, hub, planned):
    _r, doc, found = _check(cli, hub, "--with", planned)
    assert "GD120" not in found
    assert doc["environment"]["horizon"]["libraries"]["transformers"]["newer"] is False


def test_a_range_of_only_newer_releases_is_reported(cli, hub):
    _r, _doc, found = _check(cli, hub, "--with", "transformers>=5.25")
    assert "transformers>=5.25 (--with) is newer" in found["GD120"]["message"]


def test_each_library_is_judged_on_its_own(cli, hub):
    _r, doc, found = _check(cli, hub, "--with", "peft==0.22.0", "--with", "transformers==5.23.0")
    assert found["GD120"]["key"] == "peft" and "peft 0.21.2" in found["GD120"]["message"]
    assert {name for name, v in doc["environment"]["horizon"]["libraries"].items() if v["newer"]} == {"peft"}


def test_the_pinned_test_stack_is_inside_the_horizon(cli, hub):
    """The suite runs on tests/constraints.txt: what it verifies must not be beyond what the doctor claims."""
    for name, verified in horizon.VERIFIED.items():
        assert Version(pinned(name)) <= Version(verified), name
    _r, _doc, found = _check(cli, hub)  # the installed stack (torch 2.13.0+cpu is release 2.13.0)
    assert "GD120" not in found


def test_a_build_label_is_the_same_release():
    stack = Stack({"torch": Package("torch", "2.13.0+cpu")})
    assert horizon.beyond(stack) == []
    assert [b.name for b in horizon.beyond(Stack({"torch": Package("torch", "2.14.0+cu128")}))] == ["torch"]


def test_every_library_a_window_names_has_a_horizon():
    windows = []
    for value in vars(versioning).values():
        windows += [value] if isinstance(value, Window) else [w for w in value if isinstance(w, Window)] \
            if isinstance(value, tuple) else []
    assert len(windows) >= 10
    assert {w.package for w in windows} <= set(horizon.VERIFIED)


def test_non_gemma_models_get_no_horizon_finding(cli, hub):
    hub.add("org/bert", {"config.json": {"model_type": "bert", "architectures": ["BertModel"]}})
    hub.add(REPO, {"config.json": gemma3_12b_config()})
    r = cli("check", "org/bert", REPO, "--cache-dir", hub.root, "--format", "json", "--with", "transformers==9.0.0")
    codes = {m["repo_id"]: {f["code"] for f in m["findings"]} for m in r.json()["models"]}
    assert "GD120" not in codes["org/bert"] and "GD120" in codes[REPO]

"""The docs cannot drift: finding catalogue == codes.py, reference == CLI help, JSON output validates against the schema."""

from __future__ import annotations

import json
import re
import runpy
from pathlib import Path

import jsonschema
import pytest
import yaml

from gemma_doctor.codes import CODES
from tests.builders import gemma2_config, gemma3_12b_config, generation_config, llama_config

DOCS = Path(__file__).resolve().parent.parent / "docs"
ROOT = DOCS.parent


def test_findings_md_documents_exactly_the_codes_in_codes_py():
    text = (DOCS / "findings.md").read_text()
    headings = re.findall(r"^### (GD\d{3}) (\S+)\s*$", text, flags=re.M)
    documented = [code for code, _ in headings]
    assert len(documented) == len(set(documented)), "a code is documented twice"
    assert sorted(documented) == sorted(CODES)
    assert {code: name for code, name in headings} == {c.code: c.name for c in CODES.values()}


def test_reference_md_is_generated_from_the_cli():
    gen = runpy.run_path(str(DOCS / "gen_reference.py"))
    assert (DOCS / "reference.md").read_text() == gen["render"](), "run: python docs/gen_reference.py"


def test_every_exit_code_of_the_cli_is_in_readme_usage_and_reference():
    """reference.md listed 0/1/2/3/130 only: 4 (gated), 5 (Hub unreachable) and 70 (internal) were missing."""
    import re

    from gemma_doctor.report import ExitCode

    readme = (DOCS.parent / "README.md").read_text()
    table = readme.split("### Exit codes", 1)[1].split("\n## ", 1)[0]
    in_readme = {int(c) for c in re.findall(r"^\| (\d+) \|", table, re.M)}
    assert in_readme == {int(c) for c in ExitCode}, "README's exit-code table and gemma_doctor.report.ExitCode differ"
    reference = (DOCS / "reference.md").read_text().split("## gemma-doctor", 1)[0]
    usage = (DOCS / "usage.md").read_text().split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    for code in ExitCode:
        assert re.search(rf"(^|[\s|(]){int(code)}\b", reference, re.M), f"reference.md lacks exit code {int(code)}"
        assert re.search(rf"(^|\s){int(code)}\b", usage), f"usage.md's exit codes lack {int(code)}"


def test_an_unexpected_error_exits_with_the_documented_internal_code(monkeypatch, capsys):
    from gemma_doctor import cli
    from gemma_doctor.report import ExitCode

    def boom(argv):  # noqa: ANN001, ANN202 - a bug anywhere under a command
        raise RuntimeError("a bug")

    monkeypatch.setattr(cli, "_invoke", boom)
    monkeypatch.delenv("GEMMA_DOCTOR_DEBUG", raising=False)
    with pytest.raises(SystemExit) as done:
        cli.main(["check"])
    assert done.value.code == ExitCode.INTERNAL == 70
    assert "internal error: RuntimeError: a bug" in capsys.readouterr().err


@pytest.fixture(scope="module")
def schema() -> dict:
    doc = json.loads((DOCS / "schema" / "check.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(doc)
    return doc


@pytest.mark.parametrize("extra", [[], ["--gpu", "T4", "--training-config", "{tc}"], ["--gpu", "none"]])
def test_real_check_json_validates_against_the_schema(hub, cli, tmp_path, schema, extra):
    hub.add("google/gemma-3-12b-it", {"config.json": gemma3_12b_config(), "generation_config.json": generation_config()})
    hub.add("google/gemma-2-2b-it", {"config.json": gemma2_config(), "model.safetensors": b"broken"})
    hub.add("acme/broken", {"config.json": b"{"})
    hub.add("meta/llama", {"config.json": llama_config()})
    tc = tmp_path / "train.yaml"
    tc.write_text("fp16: true\nbf16: true\nuse_cache: true\n")
    r = cli("check", "--cache-dir", hub.root, "--format", "json", *[a.format(tc=tc) for a in extra])
    doc = r.json()
    jsonschema.validate(doc, schema, cls=jsonschema.Draft202012Validator)
    assert len(doc["models"]) == 3 and len(doc["skipped"]) == 1


def test_schema_rejects_a_report_missing_a_stable_field(schema):
    finding = {"code": "GD101", "severity": "error", "message": "m", "file": None, "key": None}  # no "fix"
    doc = {"schema_version": 1, "status": "fail", "fail_on": "error", "summary": {"models": 1, "skipped": 0,
           "findings": {"error": 1, "warning": 0, "info": 0}}, "skipped": [], "environment": {"python": "3", "platform": "x", "packages": {}},
           "models": [{"target": "t", "repo_id": None, "revision": None, "commit": None, "path": "/p", "family": "gemma3",
                       "findings": [finding], "source": "folder", "remote": None}]}
    with pytest.raises(jsonschema.ValidationError, match="'fix' is a required property"):
        jsonschema.validate(doc, schema, cls=jsonschema.Draft202012Validator)


def test_action_and_pre_commit_hook_run_gemma_doctor_check():
    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    assert {h["id"] for h in hooks} >= {"gemma-doctor-training-config"}
    for hook in hooks:
        assert hook["entry"].startswith("gemma-doctor check") and hook["language"] == "python"
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    assert action["runs"]["using"] == "composite"
    script = "\n".join(step.get("run", "") for step in action["runs"]["steps"])
    assert "gemma-doctor check" in script and "--format github" in script
    assert set(action["inputs"]) >= {"targets", "training-configs", "gpu", "fail-on"}

"""The CI flow of docs/ci.md, end to end, as written there (issue 9, point 1).

The workflows and the pre-commit config are parsed from docs/ci.md, not copied: the GitHub Action's steps
are read from action.yml, its ``${{ inputs.* }}`` filled from the workflow's ``with:`` (and action.yml's
defaults), and each ``run:`` is executed by bash on a fresh "runner": an empty hub cache, a local Hub
(tests/hubserver.py) serving a stock google/gemma-3-12b-it snapshot (config.json + generation_config.json as
Google publishes them, gated), the token the workflow's ``env`` passes. The real ``hf`` CLI downloads the configs,
the real ``gemma-doctor`` checks them. Only the install step is not run (no network in tests): the test asserts
what it would install, this working tree, which is what runs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from tests.builders import HubCache, example_file
from tests.hubserver import HubServer, repos_from_cache

ROOT = Path(__file__).resolve().parent.parent
REPO = "google/gemma-3-12b-it"
TOKEN = "hf_ci_secret_with_access"
# A LoRA run of the 12B on the workflow's A100, as TRL reads one: use_peft: true (without it `trl sft` trains every
# weight), the text model's attention (GD420: a multimodal Gemma 3 has no PEFT default), weights loaded in bf16 (TRL
# loads float32 unless told). Before the thirteenth round check left a config without use_peft "open" and planned it
# as QLoRA to fit, which is not the run TRL starts.
SFT = "bf16: true\nfp16: false\nper_device_train_batch_size: 1\nmax_length: 512\ndtype: bfloat16\nuse_peft: true\n" \
      "lora_target_modules: \".*language_model.*\\\\.(q_proj|k_proj|v_proj|o_proj)\"\n"
DPO = '{"bf16": true, "beta": 0.1, "loss_type": "sigmoid", "max_prompt_length": 256, "max_length": 512, ' \
      '"per_device_train_batch_size": 1, "max_grad_norm": 1.0, "dtype": "bfloat16", "use_peft": true, ' \
      '"lora_target_modules": ".*language_model.*\\\\.(q_proj|k_proj|v_proj|o_proj)"}\n'  # LoRA, as SFT above


def doc_yaml_blocks() -> list[dict[str, Any]]:
    """Every ```yaml block of docs/ci.md, parsed."""
    text = (ROOT / "docs" / "ci.md").read_text()
    return [yaml.safe_load(b) for b in re.findall(r"^```yaml\n(.*?)^```", text, flags=re.M | re.S)]


def doc_workflows() -> list[dict[str, Any]]:
    """The step of each documented workflow that uses this action."""
    steps = []
    for doc in doc_yaml_blocks():
        for job in (doc.get("jobs") or {}).values():
            steps += [s for s in job["steps"] if str(s.get("uses", "")).startswith("gemma-doctor/gemma-doctor@")]
    return steps


def _expr(text: str, values: dict[str, str]) -> str:
    """Fill ``${{ inputs.x }}`` / ``${{ github.action_path }}`` / ``${{ secrets.X }}`` as the runner does."""
    def one(m: re.Match) -> str:
        return values[m.group(1).strip()]
    return re.sub(r"\$\{\{\s*([^}]+?)\s*\}\}", one, text)


def _condition(cond: str, inputs: dict[str, str]) -> bool:
    """The ``if:`` expressions action.yml uses: ``inputs.a == 'v'`` and ``inputs.b != ''`` joined by ``&&``."""
    result = True
    for part in cond.split("&&"):
        m = re.fullmatch(r"\s*inputs\.([\w-]+)\s*(==|!=)\s*'([^']*)'\s*", part)
        assert m, f"action.yml uses an if: this test does not understand: {cond!r}"
        equal = inputs[m.group(1)] == m.group(3)
        result &= equal if m.group(2) == "==" else not equal
    return result


@pytest.fixture(scope="module")
def hub(tmp_path_factory) -> Iterator[HubServer]:
    storage = HubCache(tmp_path_factory.mktemp("ci-hub"))
    storage.add(REPO, {"config.json": example_file("config.json"), "generation_config.json": example_file("generation_config.json")})
    repos = repos_from_cache(storage.root)
    repos[REPO].gated, repos[REPO].readers = "manual", frozenset({TOKEN})
    with HubServer(repos) as server:
        yield server


@pytest.fixture
def runner(tmp_path, hub):  # noqa: ANN201
    """A fresh runner: the user's repository checked out, an empty hub cache, this venv's gemma-doctor and hf."""
    checkout = tmp_path / "checkout"
    (checkout / "train").mkdir(parents=True)
    (checkout / "train" / "sft.yaml").write_text(SFT)
    (checkout / "train" / "dpo.json").write_text(DPO)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "GEMMA_DOCTOR_"))}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", PYTHONPATH=str(ROOT),
               HF_ENDPOINT=hub.endpoint, HF_HUB_CACHE=str(tmp_path / "runner-cache"), HF_HOME=str(tmp_path / "hf-home"),
               NO_COLOR="1", GITHUB_WORKSPACE=str(checkout))
    return checkout, env


def run_action(step: dict[str, Any], checkout: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """action.yml's steps with this workflow step's inputs; returns the last step's result (the check)."""
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    inputs = {name: str(spec.get("default", "")) for name, spec in action["inputs"].items()}
    unknown = set(step.get("with") or {}) - set(inputs)
    assert not unknown, f"docs/ci.md passes inputs action.yml does not declare: {unknown}"
    inputs.update({k: str(v) for k, v in (step.get("with") or {}).items()})
    values = {f"inputs.{k}": v for k, v in inputs.items()} | {"github.action_path": str(ROOT), "secrets.HF_TOKEN": TOKEN}
    step_env = {k: _expr(str(v), values) for k, v in (step.get("env") or {}).items()}
    result = None
    for s in action["runs"]["steps"]:
        if "if" in s and not _condition(s["if"], inputs):
            continue
        senv = {**env, **step_env, **{k: _expr(str(v), values) for k, v in (s.get("env") or {}).items()}}
        if s["name"].startswith("Install"):
            # What pip would install: this action's own folder, i.e. the working tree under test.
            target = subprocess.run(["bash", "-c", 'echo "${GD_INSTALL:-$GD_ACTION_PATH}"'], env=senv, text=True,
                                    capture_output=True, check=True).stdout.strip()
            assert Path(target) == ROOT and "pip install" in s["run"]
            continue
        result = subprocess.run(["bash", "-e", "-c", s["run"]], cwd=checkout, env=senv, text=True, capture_output=True,
                                timeout=300)
        if s is not action["runs"]["steps"][-1]:
            assert result.returncode == 0, (s["name"], result.stdout, result.stderr)
    assert result is not None
    return result


def annotations(out: str) -> dict[str, set[str]]:
    """GitHub workflow commands by level: {'error': {'GD101', ...}, ...}."""
    found: dict[str, set[str]] = {}
    for level, title in re.findall(r"^::(error|warning|notice) [^\n]*?title=(GD\d{3})", out, flags=re.M):
        found.setdefault(level, set()).add(title)
    return found


def test_the_doc_shows_a_plain_workflow_and_one_planned_for_the_training_machine():
    steps = doc_workflows()
    assert [("requirements" in (s.get("with") or {})) for s in steps] == [False, True]
    pre_commit = [d for d in doc_yaml_blocks() if "repos" in d]
    assert len(pre_commit) == 1


def test_the_plain_workflow_passes_on_a_stock_gemma3_snapshot(runner):
    checkout, env = runner
    r = run_action(doc_workflows()[0], checkout, env)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "error" not in annotations(r.stdout), r.stdout
    # the download step fetched the two small configs into the runner's cache, nothing else
    cached = sorted(p.name for p in Path(env["HF_HUB_CACHE"]).glob("models--google--gemma-3-12b-it/snapshots/*/*"))
    assert cached == ["config.json", "generation_config.json"]


@pytest.mark.parametrize("requirements, code, gd101", [
    ("transformers==4.50.3\ntrl==0.16.0\n", 1, "error"),
    ("transformers==5.23.0\n", 0, None),
])
def test_the_planned_workflow_follows_the_training_machines_transformers(runner, requirements, code, gd101):
    checkout, env = runner
    (checkout / "requirements.txt").write_text(requirements)
    r = run_action(doc_workflows()[1], checkout, env)
    assert r.returncode == code, (r.stdout, r.stderr)
    levels = {level for level, codes in annotations(r.stdout).items() if "GD101" in codes}
    assert levels == ({gd101} if gd101 else set()), r.stdout
    if gd101:
        assert "transformers 4.50.3 (requirements.txt:1) crashes" in r.stdout


@pytest.mark.parametrize("requirements, code", [("transformers==4.50.3\n", 1), ("transformers==5.23.0\n", 0)])
def test_the_pre_commit_hook_as_configured_in_the_doc(runner, requirements, code):
    checkout, env = runner
    (checkout / "requirements.txt").write_text(requirements)
    [config] = [d for d in doc_yaml_blocks() if "repos" in d]
    [hook] = config["repos"][0]["hooks"]
    defined = {h["id"]: h for h in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())}[hook["id"]]
    files = re.compile(hook.get("files", defined.get("files", "")))
    assert files.search("train/sft.yaml") and files.search("requirements.txt") and not files.search("README.md")
    # pre-commit reads the developer's cache: the model's configs were downloaded there before
    subprocess.run(["hf", "download", REPO, "config.json", "generation_config.json"], env={**env, "HF_TOKEN": TOKEN},
                   check=True, capture_output=True, timeout=120)
    argv = defined["entry"].split() + [str(a) for a in hook["args"]]
    r = subprocess.run(argv, cwd=checkout, env=env, text=True, capture_output=True, timeout=120)
    assert r.returncode == code, (r.stdout, r.stderr)
    assert ("GD101" in r.stdout) is (code == 1)

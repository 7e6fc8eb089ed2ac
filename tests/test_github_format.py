"""`check --format github`: workflow commands that GitHub turns into annotations, escaped like the Actions toolkit."""

from __future__ import annotations

import os

import pytest

from gemma_doctor.render.github import command, escape_data, escape_property
from tests.builders import gemma3_12b_config, generation_config, variant



# These tests exercise the on-disk fix, planned only where transformers 4.50.x will run (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("plan_450")

def test_escaping_matches_the_actions_toolkit():
    # toolkit command.ts: escapeData replaces % \r \n; escapeProperty also : and ,
    assert escape_data("100% a:b,c\r\nd") == "100%25 a:b,c%0D%0Ad"
    assert escape_property("100% a:b,c\r\nd") == "100%25 a%3Ab%2Cc%0D%0Ad"
    assert command("error", {"file": "a,b:c.yaml", "line": 3, "title": "GD602 x"}, "m%\n") == \
        "::error file=a%2Cb%3Ac.yaml,line=3,title=GD602 x::m%25%0A"
    assert command("notice", {"file": None, "line": None}, "hi") == "::notice::hi"


def test_check_prints_one_annotation_per_finding_and_exits_like_text(hub, cli, tmp_path, monkeypatch):
    hub.add("google/gemma-3-12b-it", {"config.json": gemma3_12b_config(), "generation_config.json": generation_config()})
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.yaml").write_text("output_dir: out\nfp16: true\n")
    r = cli("check", "google/gemma-3-12b-it", "--cache-dir", hub.root, "--training-config", "train.yaml", "--format", "github")
    assert r.code == 1
    lines = r.out.splitlines()
    assert lines[-1].startswith("gemma-doctor: FAIL 1 model(s): ")
    commands = lines[:-1]
    assert all(line.startswith(("::error ", "::warning ", "::notice ")) for line in commands), commands
    fp16 = [c for c in commands if "GD602" in c]
    assert fp16 == [fp16[0]] and fp16[0].startswith("::error file=train.yaml,line=2,title=GD602 fp16-on-gemma::")
    gd101 = next(c for c in commands if "title=GD101" in c)
    snapshot = next(hub.root.glob("models--google--gemma-3-12b-it/snapshots/*"))
    # model files are annotated by their path (relative to the workspace when inside it); ':' is escaped
    assert gd101.startswith("::error file=" + escape_property(os.path.relpath(snapshot / "config.json")) + ",title=GD101 use-cache-enabled::")
    # the message is one line: newlines (before "fix:") are escaped, never literal
    assert f"%0Afix: gemma-doctor fix google/gemma-3-12b-it --cache-dir {hub.root} --with transformers==4.50.3 --inplace" in gd101


@pytest.mark.parametrize("fail_on, code", [("error", 0), ("warning", 1)])
def test_exit_codes_follow_fail_on(hub, cli, fail_on, code):
    fixed = variant(gemma3_12b_config(), text_config={**gemma3_12b_config()["text_config"], "use_cache": False})
    hub.add("org/fixed", {"config.json": fixed, "generation_config.json": generation_config()})
    r = cli("check", "org/fixed", "--cache-dir", hub.root, "--format", "github", "--fail-on", fail_on)
    assert r.code == code, r
    assert any(line.startswith("::warning ") and "GD102" in line for line in r.out.splitlines())


def test_training_config_findings_repeat_once_across_models(hub, cli, tmp_path):
    hub.add("org/a", {"config.json": gemma3_12b_config()})
    hub.add("org/b", {"config.json": gemma3_12b_config()})
    path = tmp_path / "args.json"
    path.write_text('{"bf16": true, "fp16": true}')
    r = cli("check", "org/a", "org/b", "--cache-dir", hub.root, "--training-config", path, "--format", "github")
    assert sum("GD604" in line for line in r.out.splitlines()) == 1
    assert sum("GD101" in line for line in r.out.splitlines()) == 2


def test_every_training_config_finding_is_annotated_at_the_path_as_written(hub, cli, tmp_path, monkeypatch):
    """GD130/GD440/GD443 (rules outside GD6xx) and GD801 pointed at <snapshot>/train/sft.yaml for a relative
    --training-config, as docs/ci.md and action.yml pass it: GitHub then matched no file of the repository."""
    from tests.builders import EXAMPLES

    hub.add("google/gemma-4-E2B-it", {"config.json": (EXAMPLES / "google--gemma-4-E2B-it" / "config.json").read_bytes()})
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "sft.yaml").write_text(
        "bf16: true\ngradient_checkpointing: true\ngradient_checkpointing_kwargs:\n  use_reentrant: true\n"
        "lora_target_modules: [q_proj, k_proj, v_proj, o_proj]\nper_device_train_batch_size: 64\nmax_length: 8192\n")
    r = cli("check", "google/gemma-4-E2B-it", "--cache-dir", hub.root, "--gpu", "T4", "--training-config",
            os.path.join("train", "sft.yaml"), "--format", "github", "--fail-on", "never")
    titles = {c.split("title=")[1].split(" ")[0]: c for c in r.out.splitlines()[:-1] if "title=" in c}
    doc = cli("check", "google/gemma-4-E2B-it", "--cache-dir", hub.root, "--gpu", "T4", "--training-config",
              os.path.join("train", "sft.yaml"), "--format", "json", "--fail-on", "never").json()
    from_config = {f["code"] for f in doc["models"][0]["findings"] if f["file"] == os.path.join("train", "sft.yaml")}
    assert {"GD130", "GD440", "GD443", "GD801"} <= from_config and from_config <= set(titles)
    for code in from_config:
        assert f" file={escape_property(os.path.join('train', 'sft.yaml'))}," in titles[code], titles[code]


def test_a_model_file_finding_of_gd6xx_is_annotated_in_its_own_snapshot_for_each_model(hub, cli, tmp_path, monkeypatch):
    """GD640 without a training config points at the model's config.json: every GD6xx was taken for a training-config
    finding, annotated at a bare config.json of the workspace and merged across models."""
    from tests.builders import gemma2_config

    hub.add("org/a", {"config.json": gemma2_config()})
    hub.add("org/b", {"config.json": gemma2_config()})
    monkeypatch.chdir(tmp_path)
    r = cli("check", "org/a", "org/b", "--cache-dir", hub.root, "--format", "github", "--fail-on", "never")
    gd640 = [line for line in r.out.splitlines() if "title=GD640" in line]
    files = sorted(line.split("file=")[1].split(",")[0] for line in gd640)
    snapshots = sorted(escape_property(os.path.relpath(next(hub.root.glob(f"models--org--{n}/snapshots/*")) / "config.json"))
                       for n in ("a", "b"))
    assert files == snapshots, gd640
    assert not any(",line=" in line for line in gd640)


def test_every_finding_at_the_training_config_has_a_code_whose_site_is_the_run(hub, cli, tmp_path, monkeypatch):
    """codes.py's Site is what `--format github` follows: a rule that names the training config under a code marked
    otherwise would be annotated inside the snapshot."""
    from gemma_doctor.codes import CODES, Site
    from tests.builders import EXAMPLES, gemma2_config

    hub.add("org/g2", {"config.json": gemma2_config()})
    hub.add("org/g3", {"config.json": gemma3_12b_config()})
    hub.add("google/gemma-4-E2B-it", {"config.json": (EXAMPLES / "google--gemma-4-E2B-it" / "config.json").read_bytes()})
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sft.yaml").write_text(
        "fp16: true\nbf16: true\nuse_cache: true\ngradient_checkpointing: true\nattn_implementation: sdpa\n"
        "gradient_checkpointing_kwargs:\n  use_reentrant: true\nlora_target_modules: all-linear\npacking: true\n"
        "per_device_train_batch_size: 64\nmax_length: 8192\nfsdp: full_shard auto_wrap\nassistant_only_loss: true\n")
    doc = cli("check", "org/g2", "org/g3", "google/gemma-4-E2B-it", "--cache-dir", hub.root, "--gpu", "T4",
              "--training-config", "sft.yaml", "--format", "json", "--fail-on", "never").json()
    at_config = {f["code"] for m in doc["models"] for f in m["findings"] if f["file"] == "sft.yaml"}
    assert len(at_config) > 10
    assert {c for c in at_config if CODES[c].site is not Site.RUN} == set()


def test_a_catalogue_finding_at_a_training_config_setting_is_annotated_at_its_line(hub, cli, tmp_path, monkeypatch):
    """GD718 (a field-catalogue entry whose condition names per_device_train_batch_size) was annotated at the training
    config without a line, although the JSON names the key and the reader knows its line: every other finding at a
    setting of the file carries it."""
    from tests.builders import EXAMPLES

    hub.add("google/gemma-4-E2B-it", {"config.json": (EXAMPLES / "google--gemma-4-E2B-it" / "config.json").read_bytes()})
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sft.yaml").write_text("bf16: true\nmax_length: 512\nper_device_train_batch_size: 4\n")
    r = cli("check", "google/gemma-4-E2B-it", "--cache-dir", hub.root, "--gpu", "H100", "--training-config",
            "sft.yaml", "--format", "github", "--fail-on", "never")
    gd718 = [line for line in r.out.splitlines() if "title=GD718" in line]
    assert len(gd718) == 1 and gd718[0].startswith("::warning file=sft.yaml,line=3,title=GD718 "), gd718
    doc = cli("check", "google/gemma-4-E2B-it", "--cache-dir", hub.root, "--gpu", "H100", "--training-config",
              "sft.yaml", "--format", "json", "--fail-on", "never").json()
    found = next(f for f in doc["models"][0]["findings"] if f["code"] == "GD718")
    assert (found["file"], found["key"], found["details"]["line"]) == ("sft.yaml", "per_device_train_batch_size", 3)

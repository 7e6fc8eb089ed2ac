"""Issue 33: a hostile co-user of a shared cache and hostile files. Each test is the shape of one recipe of the
attacker's pass, run through real parts (a real `gemma-doctor` process, real safetensors files, a cache laid out as
huggingface_hub lays it out), and fails on the code before the issue's fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests.builders import HubCache, gemma3_1b_config

ROOT = Path(__file__).resolve().parent.parent


def _python(code: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("GEMMA_DOCTOR_WORKERS", "GEMMA_DOCTOR_PROGRESS")}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=timeout)


# --- a shard truncated by its owner while `check --weights` reads it -----------------------------------------------

# Runs `check --weights` over the whole cache; the victim shard (argv[2], a blob) is truncated to 1 MiB by its owner
# right after the scan has tested its first chunk (the hook: scan_shard's own progress callback), the moment a
# memory-mapped scan would touch pages past the new end.
_TRUNCATE_DURING_SCAN = """
import os, sys
from gemma_doctor.cli import main
from gemma_doctor.readers import weights
cache, victim = sys.argv[1], os.path.realpath(sys.argv[2])
real = weights.scan_shard
def scan_shard(h, file, advance=lambda n: None, *a, **k):
    if os.path.realpath(h.path) != victim:
        return real(h, file, advance, *a, **k)
    cut = []
    def advance_then_cut(n):
        advance(n)
        if not cut:
            cut.append(1)
            os.truncate(victim, 1 << 20)
    return real(h, file, advance_then_cut, *a, **k)
weights.scan_shard = scan_shard
main(["check", "--cache-dir", cache, "--weights", "--format", "json"] + sys.argv[3:])
"""


@pytest.fixture(scope="module")
def shards_cache(tmp_path_factory) -> tuple[Path, Path]:
    """Three Gemma repos, each with an 8 MiB bf16 model.safetensors (one NaN planted in team/a); team/b's shard is
    the one its owner will truncate."""
    root = tmp_path_factory.mktemp("cut") / "hub"
    hub = HubCache(root)
    gen = torch.Generator().manual_seed(0)
    tensors = {"model.embed_tokens.weight": (torch.randn(1024, 2048, generator=gen) * 0.02).to(torch.bfloat16),
               "model.layers.0.mlp.down_proj.weight": (torch.randn(1024, 2048, generator=gen) * 0.02).to(torch.bfloat16)}
    for name in ("team/a", "team/b", "team/c"):
        if name == "team/a":
            tensors["model.layers.0.mlp.down_proj.weight"][3, 5] = float("nan")
        else:
            tensors["model.layers.0.mlp.down_proj.weight"][3, 5] = 0.0
        shard = root.parent / "shard.safetensors"
        save_file(tensors, str(shard))
        hub.add(name, {"config.json": gemma3_1b_config(), "model.safetensors": shard.read_bytes()})
    victim = (hub.repo_dir("team/b") / "snapshots").glob("*/model.safetensors")
    return root, next(victim).resolve()


def test_a_shard_truncated_under_the_weights_scan_is_a_finding_and_the_scan_goes_on(shards_cache) -> None:
    cache, victim = shards_cache
    whole = _python("import sys; from gemma_doctor.cli import main; main(sys.argv[1:])", "check", "--cache-dir",
                    str(cache), "--weights", "--format", "json")
    assert whole.returncode == 1, whole.stderr
    before = {m["repo_id"]: m for m in json.loads(whole.stdout)["models"]}
    size = victim.stat().st_size
    try:
        got = _python(_TRUNCATE_DURING_SCAN, str(cache), str(victim))
    finally:
        with open(victim, "r+b") as f:  # the module's other tests see the shard whole again (its bytes are not needed)
            f.truncate(size)
    assert got.returncode == 1, (got.returncode, got.stderr[-2000:])  # was -7 (SIGBUS; 135 in a shell), no output
    after = {m["repo_id"]: m for m in json.loads(got.stdout)["models"]}
    assert set(after) == {"team/a", "team/b", "team/c"}
    for repo in ("team/a", "team/c"):
        assert after[repo] == before[repo]
    [gone] = after["team/b"]["weights_scan"]["unreadable"]
    assert gone["file"] == "model.safetensors" and "file ended early" in gone["error"], gone
    gd504 = [f for f in after["team/b"]["findings"] if f["code"] == "GD504"]
    assert gd504 and "model.safetensors (file ended early" in gd504[0]["message"], after["team/b"]["findings"]


# --- a config value of a megabyte of backslashes, echoed by a finding ----------------------------------------------

def test_a_megabyte_of_backslashes_echoed_by_a_finding_is_shown_whole(tmp_path) -> None:
    """GD109 quotes the RoPE type of rope_parameters; the text view took 61 s at 40,000 backslashes (quadratic)."""
    from tests.builders import gemma3_12b_config, variant

    config = gemma3_12b_config()
    text = {k: v for k, v in config["text_config"].items() if k != "rope_scaling"}
    run = "\\" * (1 << 20)
    text["rope_parameters"] = {"rope_type": run, "factor": 8.0}
    HubCache(tmp_path / "hub").add("evil/slashes", {"config.json": variant(config, text_config=text)})
    got = _python("import sys; from gemma_doctor.cli import main; main(sys.argv[1:])", "check", "--cache-dir",
                  str(tmp_path / "hub"), "--format", "text", "--with", "transformers==4.57.0", timeout=120)
    assert got.returncode == 1, got.stderr[-2000:]
    assert [line for line in got.stdout.splitlines() if "GD109" in line and f"rope_parameters (all layers: {run} x8.0)" in line]


# --- numbers beyond any real run: versions and training configs -----------------------------------------------------

HUGE = "7" * 5000  # past Python's 4,300-digit limit on int(): a ValueError, exit 70, before issue 33
DEEP = "(" * 1000 + 'python_version >= "3"' + ")" * 1000  # packaging's marker parser: RecursionError, exit 70


@pytest.fixture
def one_gemma(hub) -> HubCache:
    hub.add("team/gemma", {"config.json": gemma3_1b_config()})
    return hub


@pytest.mark.parametrize("name, text, why", [
    ("requirements.txt", f"transformers=={HUGE}\n", "holds a number of over 64 digits"),
    ("requirements.txt", f"peft>=0.12\ntransformers==4.57.0; python_version >= '{HUGE}'\n", "holds a number of over"),
    ("requirements.txt", f"transformers==4.57.0; {DEEP}\n", "nests parentheses over 32 deep"),
    ("uv.lock", f'version = 1\n\n[[package]]\nname = "transformers"\nversion = "{HUGE}"\n', "holds a number of over"),
])
def test_absurd_requirements_are_one_line_not_exit_70(cli, one_gemma, tmp_path, name, text, why):
    path = tmp_path / name
    path.write_text(text)
    got = cli("check", "--cache-dir", one_gemma.root, "--requirements", path)
    assert got.code == 2 and got.out == ""
    assert len(got.err.splitlines()) == 1 and why in got.err and len(got.err) < 400, got.err


@pytest.mark.parametrize("spec", [f"transformers=={HUGE}", f"transformers==4.57.0; {DEEP}"])
def test_absurd_with_is_one_line_not_exit_70(cli, one_gemma, spec):
    got = cli("check", "--cache-dir", one_gemma.root, "--with", spec)
    assert got.code == 2 and got.out == "" and len(got.err.splitlines()) == 1 and len(got.err) < 400, got.err


@pytest.mark.parametrize("name, text, why", [
    ("big.yaml", f"per_device_train_batch_size: 1{'0' * 60}\nmax_seq_length: 1{'0' * 76}\n",
     "per_device_train_batch_size is an integer of 200 bits, beyond any real run (at most 1,048,576)"),
    ("seq.yaml", f"per_device_train_batch_size: 8\nmax_seq_length: {1 << 28}\n",
     f"max_seq_length is {1 << 28:,}, beyond any real run (at most {1 << 27:,})"),
    ("digits.yaml", f'per_device_train_batch_size: "{HUGE}"\n', "a number of 5000 digits, beyond any real run"),
    ("gpus.json", '{"num_processes": 1' + "0" * 30 + "}", "num_processes is an integer of 100 bits"),
])
def test_numbers_beyond_any_real_run_in_a_training_config_are_a_finding(cli, one_gemma, tmp_path, name, text, why):
    path = tmp_path / name
    path.write_text(text)
    got = cli("check", "--cache-dir", one_gemma.root, "--training-config", path, "--gpu", "A100", "--format", "json")
    [model] = json.loads(got.out)["models"]
    gd601 = [f for f in model["findings"] if f["code"] == "GD601"]
    assert gd601 and why in gd601[0]["message"], [f["message"] for f in model["findings"]]


def test_a_launch_line_with_a_count_of_thousands_of_digits_is_a_finding(cli, one_gemma):
    got = cli("check", "--cache-dir", one_gemma.root, "--launch", f"deepspeed --num_gpus {HUGE} train.py",
              "--format", "json")
    [model] = json.loads(got.out)["models"]
    assert any(f["code"] == "GD601" and "--num_gpus" in f["message"] for f in model["findings"])


# --- an adapter's base named by a folder --------------------------------------------------------------------------------

def _victim_base(tmp_path: Path) -> Path:
    """A folder of another user's (mode 600 config): a Gemma base an attacker would like the victim to read."""
    folder = tmp_path / "victim" / "private-base"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(gemma3_1b_config()))
    os.chmod(folder / "config.json", 0o600)
    return folder


_ADAPTER = {"peft_type": "LORA", "r": 8, "target_modules": ["q_proj"]}


def _adapter_weights(tmp_path: Path) -> bytes:
    path = tmp_path / "adapter_model.safetensors"
    save_file({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(8, 16)}, str(path))
    return path.read_bytes()


def test_an_adapter_in_the_cache_never_reads_a_base_folder_it_names(cli, hub, tmp_path):
    base = _victim_base(tmp_path)
    hub.add("evil/adapter", {"adapter_config.json": {**_ADAPTER, "base_model_name_or_path": str(base)},
                             "adapter_model.safetensors": _adapter_weights(tmp_path)})
    got = cli("check", "evil/adapter", "--cache-dir", hub.root, "--format", "json")
    [model] = json.loads(got.out)["models"]
    assert model["base"]["found"] == "not found" and model["base"]["family"] is None, model["base"]
    assert "not read: an adapter in the cache names its base by a folder" in model["base"]["note"]
    assert any("not read: an adapter in the cache names its base by a folder" in f["message"]
               for f in model["findings"]), [f["message"] for f in model["findings"]]


def test_an_adapter_folder_the_user_names_reads_its_base_folder_and_says_where(cli, hub, tmp_path):
    base = _victim_base(tmp_path)
    mine = tmp_path / "my-adapter"
    mine.mkdir()
    (mine / "adapter_config.json").write_text(json.dumps({**_ADAPTER, "base_model_name_or_path": str(base)}))
    (mine / "adapter_model.safetensors").write_bytes(_adapter_weights(tmp_path))
    got = cli("check", mine, "--cache-dir", hub.root, "--format", "json")
    [model] = json.loads(got.out)["models"]
    assert (model["base"]["found"], model["base"]["path"]) == ("folder", str(base)), model["base"]
    assert model["base"]["family"] is not None

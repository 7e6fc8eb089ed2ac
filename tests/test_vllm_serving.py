"""Serving in vLLM (GD772-GD775): `check` of adapters and model folders against the vLLM named with --with.

vLLM is not installed (it needs a GPU); its windows come from the released sdists 0.8.0-0.33.0 (docs/findings.md,
GD772-GD775). The adapters are trained by the real PEFT of the main venv (0.21.2, transformers 5.23.0) on tiny Gemma 4
and Gemma 3n checkpoints (tests/tiny_family.py), the model folders saved by the real transformers; each window is
tested at both edges.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Path]:
    """Tiny bases, LoRA adapters trained 2 steps and saved by PEFT, and Gemma 3 folders saved by transformers."""
    import torch
    import transformers as T
    from peft import LoraConfig, get_peft_model

    from tests import tiny_family

    root = tmp_path_factory.mktemp("vllm")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    out: dict[str, Path] = {}
    for t in ("gemma4", "gemma4_text", "gemma3n", "gemma3"):
        out[t] = tiny_family.save(t, root / t)
    ids = torch.randint(3, 240, (1, 8))

    def train(name: str, base: Path, cls: type, targets: object) -> None:
        model = get_peft_model(cls.from_pretrained(base, dtype=torch.float32), LoraConfig(r=4, target_modules=targets))
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        for _ in range(2):
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
        model.save_pretrained(root / name)
        out[name] = root / name

    # "all-linear" (Unsloth's and many notebooks' choice) reaches the towers' Linear layers (vllm #41702).
    train("g4_all", out["gemma4"], T.Gemma4ForConditionalGeneration, "all-linear")
    train("g4_lm", out["gemma4"], T.Gemma4ForConditionalGeneration, r".*language_model.*\.(q_proj|v_proj|down_proj)")
    train("g4_text", out["gemma4_text"], T.Gemma4ForCausalLM, ["q_proj", "v_proj"])
    train("g3n", out["gemma3n"], T.Gemma3nForCausalLM, ["q_proj", "v_proj"])
    return out


def _check(cli, target: Path, *extra: str) -> dict[str, dict]:
    r = cli("check", str(target), "--format", "json", "--fail-on", "never", "--gpu", "none", *extra)
    assert r.code == 0, r
    return {f["code"]: f for f in r.json()["models"][0]["findings"]}


def _severity(findings: dict[str, dict], code: str) -> str | None:
    return findings[code]["severity"] if code in findings else None


@pytest.mark.parametrize(("vllm", "severity"), [
    ("==0.19.0", "error"), ("==0.19.1", "error"),  # Gemma 4's first releases: no LoRA for the multimodal class
    ("==0.20.0", None), ("==0.33.0", None),  # SupportsLoRA on Gemma4ForConditionalGeneration from 0.20.0
    (">=0.19,<0.21", "warning"),  # a range across 0.20.0: unknown
    (None, "info"),  # vLLM not named: what serving it would need
])
def test_gemma4_lora_needs_vllm_0_20(cli, made, tmp_path, vllm, severity):
    plan = ("--with", f"vllm{vllm}") if vllm else ()
    got = _check(cli, made["g4_lm"], *plan, "--cache-dir", str(tmp_path))
    assert _severity(got, "GD772") == severity
    if severity:
        assert "does not support LoRA yet" in got["GD772"]["message"] and "vllm>=0.20.0" in got["GD772"]["fix"]
    assert "GD774" not in got  # language-model targets only: nothing in the towers


def test_gemma4_text_model_has_lora_in_every_release_that_serves_it(cli, made, tmp_path):
    """Gemma4ForCausalLM declares SupportsLoRA in 0.19.0, the first release with Gemma 4."""
    for vllm in ("0.19.0", "0.33.0"):
        got = _check(cli, made["g4_text"], "--with", f"vllm=={vllm}", "--cache-dir", str(tmp_path))
        assert not {"GD772", "GD773", "GD774"} & set(got), got


@pytest.mark.parametrize(("vllm", "severity"), [
    ("==0.20.0", "error"), ("==0.33.0", "error"),  # every release that serves Gemma 4 LoRA rejects tower keys
    ("==0.19.1", "error"),  # refused earlier for want of LoRA (GD772), and the keys would be refused after it
    ("==0.34.0", "warning"),  # newer than the releases read
    (None, "info"),
])
def test_adapter_keys_in_the_towers(cli, made, tmp_path, vllm, severity):
    plan = ("--with", f"vllm{vllm}") if vllm else ()
    got = _check(cli, made["g4_all"], *plan, "--cache-dir", str(tmp_path))
    assert _severity(got, "GD774") == severity
    f = got["GD774"]
    # The modules as PEFT saved them: the towers' Linear layers of transformers' Gemma 4 (ClippableLinear's .linear).
    assert "model.vision_tower.encoder.layers.0.mlp.down_proj.linear" in f["details"]["modules"]
    assert "model.audio_tower.layers.0.self_attn.q_proj.linear" in f["details"]["modules"]
    assert not any("language_model" in m or "embed_vision" in m for m in f["details"]["modules"])
    assert "language_model" in f["fix"] and "vllm #41702" in f["message"]


def test_every_tower_module_of_the_header_is_counted(cli, made, tmp_path):
    """PEFT saves "all-linear" as last names (linear, input_proj, ...) that do not say where they are; the keys do."""
    from safetensors import safe_open

    with safe_open(str(made["g4_all"] / "adapter_model.safetensors"), "pt") as f:
        tower = {k for k in f.keys() if ".vision_tower." in k or ".audio_tower." in k}
    got = _check(cli, made["g4_all"], "--with", "vllm==0.20.0", "--cache-dir", str(tmp_path))
    assert got["GD774"]["details"]["count"] * 2 == len(tower)  # lora_A and lora_B per module


@pytest.mark.parametrize(("vllm", "severity"), [
    ("==0.9.2", "error"),  # the first release with Gemma 3n
    ("==0.20.0", "error"), ("==0.33.0", "error"),  # no release read declares LoRA for it
    ("==0.34.0", "warning"),  # newer than the releases read
    (None, "info"),
])
def test_gemma3n_lora_is_served_by_no_vllm_release(cli, made, tmp_path, vllm, severity):
    plan = ("--with", f"vllm{vllm}") if vllm else ()
    got = _check(cli, made["g3n"], *plan, "--cache-dir", str(tmp_path))
    assert _severity(got, "GD773") == severity
    assert "merge" in got["GD773"]["fix"]
    assert "GD772" not in got and "GD774" not in got


def test_other_bases_are_not_judged(cli, made, tmp_path):
    """A Gemma 4 adapter is not a Gemma 3n one, and the reverse."""
    assert "GD773" not in _check(cli, made["g4_lm"], "--with", "vllm==0.33.0", "--cache-dir", str(tmp_path))
    assert "GD772" not in _check(cli, made["g3n"], "--with", "vllm==0.19.1", "--cache-dir", str(tmp_path))


# --- GD775: Gemma3ForCausalLM over the multimodal keys (vllm #15031) -------------------------------------------


def _causal_over_mm(made: dict[str, Path], folder: Path, new_layout: bool = False) -> Path:
    """The saved multimodal Gemma 3 folder with config.json naming Gemma3ForCausalLM (optionally with the keys
    rewritten to transformers >= 4.52's model.language_model.* layout)."""
    shutil.copytree(made["gemma3"], folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "architectures": ["Gemma3ForCausalLM"]}))
    if new_layout:
        from safetensors.torch import load_file, save_file

        tensors = load_file(str(folder / "model.safetensors"))
        save_file({("model.language_model." + k[len("language_model.model."):]
                    if k.startswith("language_model.model.") else k): v for k, v in tensors.items()},
                  str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def test_the_folder_transformers_saved_and_what_transformers_does_with_it(made, tmp_path):
    """The failure shown with the real transformers (5.23.0): the class config.json names loads none of the language
    model's weights, while the class the keys belong to loads them all."""
    import transformers as T

    folder = _causal_over_mm(made, tmp_path / "causal")
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        assert any(k.startswith("language_model.model.layers.") for k in f.keys())
    _, info = T.Gemma3ForCausalLM.from_pretrained(folder, output_loading_info=True)
    assert any(k.startswith("model.layers.") for k in info["missing_keys"])  # random layers
    mm, info = T.AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
    assert type(mm).__name__ == "Gemma3ForConditionalGeneration" and not info["missing_keys"]


@pytest.mark.parametrize(("vllm", "severity"), [
    ("==0.8.0", "error"), ("==0.33.0", "error"),  # Gemma3ForCausalLM.load_weights maps no language_model. prefix
    ("==0.34.0", "warning"),
    (None, "info"),
])
def test_causal_architecture_over_multimodal_keys(cli, made, tmp_path, vllm, severity):
    plan = ("--with", f"vllm{vllm}") if vllm else ()
    got = _check(cli, _causal_over_mm(made, tmp_path / "causal"), *plan)
    assert _severity(got, "GD775") == severity
    f = got["GD775"]
    assert "named 'language_model' in Gemma3ForCausalLM" in f["message"] and f["key"] == "architectures"
    assert "Gemma3ForConditionalGeneration" in f["fix"]


def test_the_new_key_layout_fails_the_same_way(cli, made, tmp_path):
    got = _check(cli, _causal_over_mm(made, tmp_path / "causal", new_layout=True), "--with", "vllm==0.20.0")
    assert got["GD775"]["severity"] == "error" and "'model.language_model'" in got["GD775"]["message"]


def test_the_cure_and_the_consistent_folders_are_silent(cli, made, tmp_path):
    # As saved: Gemma3ForConditionalGeneration over its own keys.
    assert "GD775" not in _check(cli, made["gemma3"], "--with", "vllm==0.20.0")
    # The cure: architectures back to the class the keys belong to.
    folder = _causal_over_mm(made, tmp_path / "cured")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "architectures": ["Gemma3ForConditionalGeneration"]}))
    assert "GD775" not in _check(cli, folder, "--with", "vllm==0.20.0")
    # A text model saved by Gemma3ForCausalLM itself (model.* keys).
    from tests import tiny_family

    text = tiny_family.save("gemma3_text", tmp_path / "text")
    assert json.loads((text / "config.json").read_text())["architectures"] == ["Gemma3ForCausalLM"]
    assert "GD775" not in _check(cli, text, "--with", "vllm==0.20.0")


def test_fix_sets_the_class_the_keys_belong_to_and_restore_undoes_it(cli, made, tmp_path):
    """GD775's cure as a file change: `fix` shows the diff and writes nothing, `--inplace` sets architectures (the
    config.json edit alone: the weights are never touched), the folder then loads whole as the class it names, and
    `restore` brings the original back byte for byte."""
    import transformers as T

    folder = _causal_over_mm(made, tmp_path / "causal")
    before = (folder / "config.json").read_bytes()
    weights = (folder / "model.safetensors").read_bytes()
    dry = cli("fix", str(folder))
    assert '"Gemma3ForConditionalGeneration"' in dry.out and "GD775" in dry.out, dry
    assert (folder / "config.json").read_bytes() == before
    done = cli("fix", str(folder), "--inplace")
    assert done.code == 0, done
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["Gemma3ForConditionalGeneration"]
    assert (folder / "model.safetensors").read_bytes() == weights
    assert "GD775" not in _check(cli, folder, "--with", "vllm==0.20.0")
    cls = getattr(T, json.loads((folder / "config.json").read_text())["architectures"][0])
    _, info = cls.from_pretrained(folder, output_loading_info=True)
    assert not info["missing_keys"]
    assert cli("restore", str(folder)).code == 0
    assert (folder / "config.json").read_bytes() == before
    # A folder whose keys and class agree has nothing to fix.
    assert '"Gemma3ForConditionalGeneration"' not in cli("fix", str(made["gemma3"])).out

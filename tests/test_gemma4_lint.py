"""--training-config against a Gemma 4 (and the other new members): the traps each training config walks into.
The model is the bundled gemma-4-E2B-it config (KV-shared, per-layer embeddings, 512-wide global heads, towers)."""

from __future__ import annotations

import copy
import json

import pytest

from tests.builders import EXAMPLES

E2B = json.loads((EXAMPLES / "google--gemma-4-E2B-it" / "config.json").read_text())


def _moe_26b_a4b() -> dict:
    """gemma-4-26B-A4B's text traits (conversion script's _VARIANTS): 128 experts, no KV sharing, no PLE."""
    cfg = copy.deepcopy(E2B)
    cfg["text_config"].update(num_kv_shared_layers=0, hidden_size_per_layer_input=0, enable_moe_block=True,
                              num_experts=128, top_k_experts=8, moe_intermediate_size=704, attention_k_eq_v=True)
    return cfg


def _lint(hub, cli, tmp_path, training: str, config: dict | None = None, name: str = "train.yaml") -> dict[str, dict]:
    if not hub.repo_dir("google/gemma-4-E2B-it").exists():  # a second lint in one test reuses the model
        hub.add("google/gemma-4-E2B-it", {"config.json": config or E2B})
    (tmp_path / name).write_text(training)
    r = cli("check", "google/gemma-4-E2B-it", "--cache-dir", hub.root, "--gpu", "A100",
            "--training-config", tmp_path / name, "--format", "json")
    [model] = r.json()["models"]
    assert model["family"] == "gemma4"
    return {f["code"]: f for f in model["findings"]}


@pytest.mark.parametrize("training,key", [
    ("bf16: true\ngradient_checkpointing: true\ngradient_checkpointing_kwargs:\n  use_reentrant: true\n",
     "gradient_checkpointing_kwargs.use_reentrant"),
    ("bf16: true\ngradient_checkpointing: true\nactivation_checkpointing_kwargs:\n  use_reentrant: true\n",
     "activation_checkpointing_kwargs.use_reentrant"),
    # LLaMA-Factory checkpoints by default, and reentrantly (use_reentrant_gc defaults to true)
    ("stage: sft\nfinetuning_type: lora\nbf16: true\n", None),
    # TRL's SFTConfig (max_length) checkpoints by default (TRL 1.16.0 here: SFTConfig().gradient_checkpointing is
    # True), so a reentrant setting corrupts the gradients without gradient_checkpointing written (was not flagged)
    ("max_length: 1024\nbf16: true\ngradient_checkpointing_kwargs:\n  use_reentrant: true\n",
     "gradient_checkpointing_kwargs.use_reentrant"),
], ids=["trl", "transformers-5.23-name", "llama-factory-default", "trl-sft-default"])
def test_reentrant_checkpointing_on_a_kv_shared_gemma4_is_an_error(hub, cli, tmp_path, training, key):
    gd130 = _lint(hub, cli, tmp_path, training)["GD130"]
    assert (gd130["severity"], gd130["key"]) == ("error", key)
    assert "20 KV-shared layers" in gd130["message"] and "use_reentrant: false" in gd130["fix"]


@pytest.mark.parametrize("training", [
    "bf16: true\ngradient_checkpointing: true\ngradient_checkpointing_kwargs:\n  use_reentrant: false\n",
    "bf16: true\ngradient_checkpointing: true\n",  # transformers 5.x defaults to non-reentrant
    "bf16: true\ngradient_checkpointing: false\ngradient_checkpointing_kwargs:\n  use_reentrant: true\n",
    "stage: sft\nfinetuning_type: lora\nbf16: true\nuse_reentrant_gc: false\n",
], ids=["non-reentrant", "default", "no-checkpointing", "llama-factory-non-reentrant"])
def test_non_reentrant_or_no_checkpointing_is_fine(hub, cli, tmp_path, training):
    assert "GD130" not in _lint(hub, cli, tmp_path, training)


def test_reentrant_checkpointing_without_kv_sharing_is_fine(hub, cli, tmp_path):
    training = "bf16: true\ngradient_checkpointing: true\ngradient_checkpointing_kwargs:\n  use_reentrant: true\n"
    assert "GD130" not in _lint(hub, cli, tmp_path, training, _moe_26b_a4b())


@pytest.mark.parametrize("training", ["attn_implementation: flash_attention_2\n",
                                      "model_init_kwargs:\n  attn_implementation: flash_attention_2\n",
                                      "base_model: google/gemma-4-E2B-it\nflash_attention: true\n"],
                         ids=["trl", "trl-model-init", "axolotl"])
def test_flash_attention_with_512_wide_global_heads_is_an_error(hub, cli, tmp_path, training):
    gd131 = _lint(hub, cli, tmp_path, "bf16: true\n" + training)["GD131"]
    assert gd131["severity"] == "error" and gd131["details"]["max_head_dim"] == 512
    assert "FlashAttention forward only supports head dimension at most 256" in gd131["message"]
    # sdpa alone walked Hopper users into Gemma 4's NaN gradients (GPU-only: sourced, docs/findings.md GD131)
    assert gd131["fix"].startswith("use attn_implementation: sdpa (or eager)") and "enable_cudnn_sdp(False)" in gd131["fix"]


def test_sdpa_on_gemma4_is_fine(hub, cli, tmp_path):
    assert not {"GD131", "GD132"} & set(_lint(hub, cli, tmp_path, "bf16: true\nattn_implementation: sdpa\n"))


@pytest.mark.parametrize("model_type,attn,expected", [
    ("vaultgemma", "sdpa", True), ("t5gemma", "sdpa", True), ("t5gemma2", "flash_attention_2", True),
    ("t5gemma2", "sdpa", False), ("vaultgemma", "eager", False),
])
def test_an_attention_backend_the_member_lacks_is_an_error(hub, cli, tmp_path, model_type, attn, expected):
    hub.add("org/m", {"config.json": {"model_type": model_type}})
    (tmp_path / "t.yaml").write_text(f"bf16: true\nattn_implementation: {attn}\n")
    r = cli("check", "org/m", "--cache-dir", hub.root, "--gpu", "A100", "--training-config", tmp_path / "t.yaml",
            "--format", "json")
    codes = {f["code"]: f for f in r.json()["models"][0]["findings"]}
    assert ("GD132" in codes) is expected
    if expected:
        assert codes["GD132"]["severity"] == "error" and attn in codes["GD132"]["message"]


@pytest.mark.parametrize("training,expected", [
    ("distributed_type: MULTI_GPU\nnum_processes: 2\nmixed_precision: bf16\n", True),
    ("distributed_type: MULTI_GPU\nnum_processes: 2\nmixed_precision: bf16\nddp_find_unused_parameters: true\n", False),
    ("distributed_type: DEEPSPEED\nnum_processes: 2\nmixed_precision: bf16\n", False),
    ("num_processes: 1\nmixed_precision: bf16\n", False),
], ids=["ddp", "find-unused", "deepspeed", "one-gpu"])
def test_ddp_with_towers_that_get_no_gradient(hub, cli, tmp_path, training, expected):
    findings = _lint(hub, cli, tmp_path, training, name="accelerate.yaml")
    assert ("GD133" in findings) is expected
    if expected:
        assert findings["GD133"]["severity"] == "warning" and "TRL #6617" in findings["GD133"]["message"]


def test_plain_lora_targets_hit_the_towers_clippable_linears(hub, cli, tmp_path):
    f = _lint(hub, cli, tmp_path, "bf16: true\nlora_target_modules: [q_proj, k_proj, v_proj, o_proj]\n")
    assert f["GD440"]["severity"] == "error" and "Gemma4ClippableLinear" in f["GD440"]["message"]
    assert ".*language_model.*" in f["GD440"]["fix"]
    assert f["GD443"]["severity"] == "info"  # k_proj/v_proj: the 20 shared layers have none


@pytest.mark.parametrize("with_,says", [("5.5.1", "5.5.0-5.5.1 still build"), ("5.23.0", "have no k_proj/v_proj")])
def test_gd443_states_the_shared_layers_of_the_transformers_the_run_uses(hub, cli, tmp_path, with_, says):
    """On transformers 5.5.0-5.5.1 the shared layers still build k_proj/v_proj (unused with the cache): GD443 said they
    had none "(transformers >= 5.5.2)" on a 5.5.1 stack too."""
    hub.add("google/gemma-4-E2B-it", {"config.json": E2B})
    (tmp_path / "train.yaml").write_text("bf16: true\nlora_target_modules: '.*language_model.*\\.(q_proj|k_proj|v_proj)'\n")
    r = cli("check", "google/gemma-4-E2B-it", "--cache-dir", hub.root, "--gpu", "A100", "--with",
            f"transformers=={with_}", "--training-config", tmp_path / "train.yaml", "--format", "json")
    [model] = r.json()["models"]
    [f] = [f for f in model["findings"] if f["code"] == "GD443"]
    assert says in f["message"], f["message"]


def test_a_language_model_regex_is_fine_and_all_linear_warns(hub, cli, tmp_path):
    regex = "bf16: true\nlora_target_modules: '.*language_model.*\\.(q_proj|o_proj)'\n"
    assert not {"GD440", "GD441", "GD443"} & set(_lint(hub, cli, tmp_path, regex))
    f = _lint(hub, cli, tmp_path, "bf16: true\nlora_target_modules: all-linear\n")
    assert "GD440" not in f and f["GD441"]["severity"] == "warning"


def _with_tower_weights(hub, config: dict | None = None) -> None:
    """The E2B config (or ``config``) with a real safetensors file holding one language-model projection and one
    vision-tower Gemma4ClippableLinear projection under the checkpoint's own names (its .linear weight and clip
    bounds)."""
    import numpy as np
    from safetensors.numpy import save

    w, bound = np.zeros((4, 4), dtype=np.float32), np.zeros((), dtype=np.float32)
    tower = "model.vision_tower.encoder.layers.0.self_attn.q_proj"
    tensors = {"model.language_model.layers.0.self_attn.q_proj.weight": w, f"{tower}.linear.weight": w,
               **{f"{tower}.{b}": bound for b in ("input_min", "input_max", "output_min", "output_max")}}
    hub.add("google/gemma-4-E2B-it", {"config.json": config or E2B, "model.safetensors": save(tensors)})


@pytest.mark.parametrize("regex, hits", [("'.*(q|k|v|o)_proj'", True), ("'.*_proj'", True),
                                         ("'.*language_model.*\\.(q_proj|o_proj)'", False),
                                         ("'model\\.language_model\\..*q_proj'", False)])
def test_a_regex_lora_target_that_matches_a_tower_s_clippable_linear_is_an_error(hub, cli, tmp_path, regex, hits):
    """A rehearsal of '.*(q|k|v|o)_proj' on the Gemma 4 twin met PEFT's refusal while check passed it: PEFT wraps every
    module whose whole name a regex matches, a tower's Gemma4ClippableLinear included. Judged on the checkpoint's own
    module names (its safetensors headers)."""
    _with_tower_weights(hub)
    f = _lint(hub, cli, tmp_path, f"bf16: true\nlora_target_modules: {regex}\n")
    assert ("GD440" in f) is hits, f.get("GD440")
    if hits:
        assert f["GD440"]["severity"] == "error" and "(a regex) matches 1 of the vision/audio towers' projections" \
            in f["GD440"]["message"]
        assert f["GD440"]["details"]["matched"] == ["model.vision_tower.encoder.layers.0.self_attn.q_proj"]


def test_a_member_built_on_gemma4_s_towers_is_judged_by_its_checkpoint_s_projections(hub, cli, tmp_path):
    """DiffusionGemma (and EmbeddingGemma 2) carry Gemma 4's towers: their twins met PEFT's Gemma4ClippableLinear
    refusal under plain target names (benchmarks/rehearse_members.py) while GD440 looked at model_type gemma4 only."""
    diffusion = {"architectures": ["DiffusionGemmaForBlockDiffusion"], "model_type": "diffusion_gemma",
                 "text_config": {**E2B["text_config"], "model_type": "diffusion_gemma_text"},
                 "vision_config": {**E2B["vision_config"]}}
    _with_tower_weights(hub, diffusion)
    (tmp_path / "train.yaml").write_text("bf16: true\nlora_target_modules: [q_proj, v_proj]\n")
    r = cli("check", "google/gemma-4-E2B-it", "--cache-dir", hub.root, "--gpu", "A100", "--training-config",
            tmp_path / "train.yaml", "--format", "json")
    [model] = r.json()["models"]
    f = {x["code"]: x for x in model["findings"]}
    assert model["family"] == "diffusion_gemma" and f["GD440"]["severity"] == "error", model["findings"]


def test_gemma4_text_only_checkpoint_has_no_towers_to_hit(hub, cli, tmp_path):
    text_only = {**E2B["text_config"], "architectures": ["Gemma4ForCausalLM"]}
    f = _lint(hub, cli, tmp_path, "bf16: true\nlora_target_modules: [q_proj, v_proj]\n", text_only)
    assert not {"GD440", "GD441"} & set(f)


def test_moe_experts_need_target_parameters(hub, cli, tmp_path):
    f = _lint(hub, cli, tmp_path, "bf16: true\nlora_target_modules: all-linear\n", _moe_26b_a4b())
    assert f["GD442"]["severity"] == "warning" and f["GD442"]["details"]["moe_experts"] == 128
    with_params = "bf16: true\nlora_target_modules: all-linear\ntarget_parameters: [experts.gate_up_proj, experts.down_proj]\n"
    assert "GD442" not in _lint(hub, cli, tmp_path, with_params, _moe_26b_a4b())


def test_gemma4_on_a_t4_gets_fp32_never_fp16(hub, cli):
    """The real published layout (Gemma4ForConditionalGeneration) is Gemma 4, not Gemma 1 through its class name."""
    hub.add("google/gemma-4-E2B-it", {"config.json": E2B})
    doc = cli("check", "google/gemma-4-E2B-it", "--cache-dir", hub.root, "--gpu", "T4", "--format", "json").json()
    [model] = doc["models"]
    assert model["family"] == "gemma4"
    assert model["recommendation"]["precision"] == "fp32" and "fp16=True" not in json.dumps(model["recommendation"])
    assert {f["code"] for f in model["findings"]} >= {"GD302"}

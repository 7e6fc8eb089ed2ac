"""Runtime crashes by version (GD105-GD110): each finding appears only where the transformers that will run
(installed, or named with --with / --requirements) falls in the window bisected from released wheels, as an error
when it does, a warning when that cannot be known, and not at all otherwise. The real libraries showing each
failure, and prepare() curing it, are in tests/test_crashes_venvs.py."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.builders import blob_name, dumps, gemma3_12b_config, gemma3n_config, paligemma2_config


def gemma4_config(kv_shared: int = 0, bidirectional: str | None = None) -> dict[str, Any]:
    """A Gemma 4 config as published (E2B-style with KV sharing, or 31B/26B-A4B-style with vision bidirectional)."""
    return {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4", "dtype": "bfloat16",
            "text_config": {"model_type": "gemma4_text", "hidden_size": 1536, "num_hidden_layers": 35,
                            "num_kv_shared_layers": kv_shared, "use_bidirectional_attention": bidirectional,
                            "head_dim": 256, "global_head_dim": 512, "vocab_size": 262144},
            "vision_config": {"model_type": "gemma4_vision"}, "audio_config": {"model_type": "gemma4_audio"},
            "transformers_version": "5.5.0.dev0"}


def gemma3_text_saved_by_5(rope_type: str = "linear") -> dict[str, Any]:
    """A gemma3_text config as transformers 5.23 saves it: RoPE only as rope_parameters (research/loading 3b)."""
    return {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 1152,
            "num_hidden_layers": 26, "dtype": "bfloat16", "use_cache": False, "transformers_version": "5.23.0",
            "rope_parameters": {"full_attention": {"factor": 8.0, "rope_theta": 1e6, "rope_type": rope_type},
                                "sliding_attention": {"rope_theta": 1e4, "rope_type": "default"}}}


def _findings(cli, hub, config: dict, *extra: str) -> dict[str, dict]:
    """The findings of ``config`` (one snapshot per distinct config in ``hub``), by code."""
    repo = f"org/model-{blob_name('config.json', dumps(config))[:12]}"
    if not hub.repo_dir(repo).exists():
        hub.add(repo, {"config.json": config})
    r = cli("check", repo, "--cache-dir", hub.root, "--format", "json", "--fail-on", "never", *extra)
    assert r.code == 0, r
    [model] = r.json()["models"]
    return {f["code"]: f for f in model["findings"]}


def _with(version: str) -> tuple[str, str]:
    return ("--with", f"transformers=={version}")


# ---------------------------------------------------------------------------------------------- GD105 token_type_ids

@pytest.mark.parametrize("version", ["5.0.0", "5.1.0", "5.5.1", "5.5.4"])
def test_gemma3_multimodal_text_only_training_crash_is_an_error_on_5_0_to_5_5(hub, cli, version):
    gd105 = _findings(cli, hub, gemma3_12b_config(), *_with(version))["GD105"]
    assert (gd105["severity"], gd105["file"], gd105["key"]) == ("error", "config.json", "model_type")
    assert "`token_type_ids` is required as a model input when training" in gd105["message"]
    assert f"transformers {version} (--with) is affected" in gd105["message"]
    assert "prepare(model)" in gd105["fix"] and "DoctorCallback" in gd105["fix"] and "transformers>=5.6.0" in gd105["fix"]
    assert gd105["details"]["input"] == "token_type_ids" and gd105["details"]["value"] == 0


@pytest.mark.parametrize("version", ["4.50.0", "4.57.6", "5.6.0", "5.23.0"])
def test_gemma3_releases_outside_the_window_get_no_token_type_ids_finding(hub, cli, version):
    assert "GD105" not in _findings(cli, hub, gemma3_12b_config(), *_with(version))


def test_gemma3_text_only_checkpoint_needs_no_token_type_ids(hub, cli):
    """Gemma3ForCausalLM (gemma3_text) has no token_type_ids check on any release."""
    cfg = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 1152}
    assert "GD105" not in _findings(cli, hub, cfg, *_with("5.1.0"))


@pytest.mark.parametrize(("version", "expected"), [("5.0.0", "error"), ("5.6.0", "error"), ("5.8.1", "error"),
                                                   ("5.9.0", None), ("4.57.6", None)])
def test_paligemma_keeps_the_check_until_5_8_1_and_its_text_batch_needs_ones(hub, cli, version, expected):
    found = _findings(cli, hub, paligemma2_config(), *_with(version)).get("GD105")
    assert (found or {}).get("severity") == expected
    if found:
        assert found["details"]["value"] == 1 and "bidirectional" in found["fix"]


def test_a_range_that_straddles_the_window_warns(hub, cli):
    gd105 = _findings(cli, hub, gemma3_12b_config(), "--with", "transformers>=5.4,<5.7")["GD105"]
    assert gd105["severity"] == "warning" and gd105["details"]["exposure"] == "unknown"
    assert "--with transformers==VERSION" in gd105["message"]


def test_the_installed_transformers_5_23_flags_nothing(hub, cli):
    """The main test venv has transformers 5.23.0: none of the 5.x windows applies."""
    found = _findings(cli, hub, gemma3_12b_config())
    assert not {"GD105", "GD106", "GD107", "GD108", "GD109"} & set(found)


# ---------------------------------------------------------------------------------------------- GD106 Gemma 4 mm_token_type_ids

@pytest.mark.parametrize(("version", "expected"), [("5.5.0", "error"), ("5.5.4", "error"), ("5.6.0", None)])
def test_gemma4_vision_bidirectional_needs_mm_token_type_ids_on_5_5(hub, cli, version, expected):
    found = _findings(cli, hub, gemma4_config(bidirectional="vision"), *_with(version)).get("GD106")
    assert (found or {}).get("severity") == expected
    if found:
        assert "`mm_token_type_ids` is required" in found["message"] and found["details"]["input"] == "mm_token_type_ids"
        assert found["key"] == "text_config.use_bidirectional_attention"


def test_gemma4_e2b_style_config_never_needs_mm_token_type_ids(hub, cli):
    assert "GD106" not in _findings(cli, hub, gemma4_config(kv_shared=20), *_with("5.5.1"))


# ---------------------------------------------------------------------------------------------- GD107 KV sharing without a cache

@pytest.mark.parametrize(("version", "expected"), [("5.5.0", "error"), ("5.5.1", "error"), ("5.5.2", None),
                                                   ("5.23.0", None)])
def test_gemma4_kv_sharing_without_a_cache_is_flagged_on_5_5_0_and_5_5_1(hub, cli, version, expected):
    found = _findings(cli, hub, gemma4_config(kv_shared=20), *_with(version)).get("GD107")
    assert (found or {}).get("severity") == expected
    if found:
        assert found["key"] == "text_config.num_kv_shared_layers" and found["details"]["kv_shared_layers"] == 20
        assert "#45242" in found["message"] and "transformers>=5.5.2" in found["fix"]


@pytest.mark.parametrize(("text", "expected"), [
    ("bf16: true\nuse_cache: true\n", "info"),  # TrainingArguments: Trainer writes use_cache onto the model config
    # axolotl has no use_cache key and check_model_config (0.19.0) switches it off after overrides_of_model_config:
    # the sharing is off, the loss wrong (was info, "the training config keeps use_cache on")
    ("base_model: x\nbf16: true\nadapter: lora\nmicro_batch_size: 1\nuse_cache: true\n", "error"),
    ("base_model: x\nbf16: true\nadapter: lora\nmicro_batch_size: 1\n"
     "overrides_of_model_config: {use_cache: true}\n", "error"),
], ids=["training-arguments", "axolotl-use_cache", "axolotl-overrides"])
def test_no_axolotl_config_keeps_a_kv_shared_gemma4_s_cache_on(hub, cli, tmp_path, text, expected):
    args = tmp_path / "train.yaml"
    args.write_text(text)
    found = _findings(cli, hub, gemma4_config(kv_shared=20), *_with("5.5.1"), "--training-config", str(args),
                      "--gpu", "A100")["GD107"]
    assert found["severity"] == expected
    if expected == "error":
        assert "check_model_config" in found["message"]


def test_gemma4_without_kv_sharing_is_not_flagged(hub, cli):
    assert "GD107" not in _findings(cli, hub, gemma4_config(kv_shared=0), *_with("5.5.1"))


@pytest.mark.parametrize(("gc", "version", "expected"), [(True, "5.5.1", "error"), (True, ">=5.5", "warning"),
                                                         (True, "5.5.2", None), (False, "5.5.1", None)])
def test_gradient_checkpointing_on_a_kv_shared_gemma4_is_flagged_in_the_window(hub, cli, tmp_path, gc, version, expected):
    args = tmp_path / "args.yaml"
    args.write_text(f"bf16: true\ngradient_checkpointing: {str(gc).lower()}\n")
    spec = f"transformers=={version}" if version[0].isdigit() else f"transformers{version}"
    found = _findings(cli, hub, gemma4_config(kv_shared=20), "--with", spec, "--training-config", str(args),
                      "--gpu", "A100").get("GD620")
    assert (found or {}).get("severity") == expected
    if found:
        assert found["file"] == str(args) and found["key"] == "gradient_checkpointing"
        assert found["details"].get("line") == 2 and "transformers>=5.5.2" in found["fix"]


@pytest.mark.parametrize(("text", "trl", "expected"), [
    # TRL's SFTConfig checkpoints by default (True on TRL 1.16.0: SFTConfig(use_cpu=True).gradient_checkpointing)
    ("max_length: 2048\nuse_peft: true\nbf16: true\n", "==1.16.0", ("error", "on by the default of TRL SFTConfig",
                                                                   "set gradient_checkpointing to false")),
    ("max_length: 2048\nuse_peft: true\nbf16: true\n", ">=0.15", None),  # TRL's version unknown: its default too
    # LLaMA-Factory checkpoints unless disable_gradient_checkpointing is true (hparams/model_args.py)
    ("stage: sft\nfinetuning_type: lora\nbf16: true\n", None, ("error", "on by the default of LLaMA-Factory",
                                                                "set disable_gradient_checkpointing to true")),
    ("stage: sft\nfinetuning_type: lora\nbf16: true\ndisable_gradient_checkpointing: true\n", None, None),
    ("per_device_train_batch_size: 8\nbf16: true\n", "==1.16.0", None),  # TrainingArguments: off by default
], ids=["trl-sft-default", "trl-unknown", "llama-factory-default", "llama-factory-disabled", "training-arguments"])
def test_checkpointing_by_the_trainers_default_on_a_kv_shared_gemma4_is_flagged(hub, cli, tmp_path, text, trl,
                                                                                 expected):
    """GD620 judges the run that executes: a config that leaves gradient checkpointing to a trainer that turns it on
    drops the cache as much as `gradient_checkpointing: true` (before: judged only where the key was written)."""
    args = tmp_path / "args.yaml"
    args.write_text(text)
    found = _findings(cli, hub, gemma4_config(kv_shared=20), *_with("5.5.1"), *(("--with", f"trl{trl}") if trl
                                                                                 else ()),
                      "--training-config", str(args), "--gpu", "A100").get("GD620")
    if expected is None:
        assert found is None, found
        return
    severity, why, off = expected
    assert found["severity"] == severity and found["file"] == str(args) and found["key"] is None
    assert why in found["message"] and off in found["fix"], found


def test_fix_never_writes_use_cache_false_for_a_kv_shared_model_on_5_5_0_or_5_5_1(hub, cli):
    """The on-disk use_cache fix would switch KV sharing off on these releases: the plan refuses with a note."""
    hub.add("org/model", {"config.json": gemma4_config(kv_shared=20)})
    blobs = hub.blob_digests()
    for plan in (("--with", "transformers==5.5.1"), ("--with", "transformers>=5.5")):
        r = cli("fix", "org/model", "--cache-dir", hub.root, *plan, "--inplace")
        assert r.code == 0, r
        assert "20 layers share K/V" in r.out and "use_cache is never written false" in r.out, r.out
        assert hub.blob_digests() == blobs and not (hub.repo_dir("org/model") / ".gemma-doctor").exists()


# ---------------------------------------------------------------------------------------------- GD108 model_type unknown

@pytest.mark.parametrize(("config", "version", "model_type", "minimum"), [
    (gemma3n_config(), "4.50.0", "gemma3n", "4.53.0"),
    (gemma3_12b_config(), "4.49.0", "gemma3", "4.50.0"),
    (gemma4_config(), "4.57.6", "gemma4", "5.5.0"),
    (gemma4_config(), "5.4.0", "gemma4", "5.5.0"),
])
def test_a_model_type_older_transformers_do_not_know_is_an_error(hub, cli, config, version, model_type, minimum):
    gd108 = _findings(cli, hub, config, *_with(version))["GD108"]
    assert gd108["severity"] == "error" and gd108["key"] == "model_type"
    assert gd108["message"].startswith(f"transformers {version} cannot load model_type {model_type} (needs >= {minimum})")
    assert gd108["fix"] == f'pip install "transformers>={minimum}"'


def test_paligemma2_needs_the_release_that_knows_its_gemma2_text_model(hub, cli):
    """PaliGemma is known from 4.41.0, but PaliGemma 2's Gemma 2 text model only from 4.42.0."""
    gd108 = _findings(cli, hub, paligemma2_config(), *_with("4.41.2"))["GD108"]
    assert gd108["key"] == "text_config.model_type" and gd108["details"]["min_transformers"] == "4.42.0"


@pytest.mark.parametrize("version", ["4.53.0", "4.57.6", "5.23.0"])
def test_releases_that_know_the_model_type_get_no_gd108(hub, cli, version):
    assert "GD108" not in _findings(cli, hub, gemma3n_config(), *_with(version))


def test_the_gemma3_launch_build_counts_as_knowing_gemma3(hub, cli):
    assert "GD108" not in _findings(cli, hub, gemma3_12b_config(), *_with("4.50.0.dev0"))


# ---------------------------------------------------------------------------------------------- GD109 RoPE skew

@pytest.mark.parametrize("version", ["4.50.0", "4.57.6"])
def test_rope_scaling_saved_as_rope_parameters_is_lost_on_4x(hub, cli, version):
    gd109 = _findings(cli, hub, gemma3_text_saved_by_5(), *_with(version))["GD109"]
    assert (gd109["severity"], gd109["key"]) == ("error", "rope_parameters")
    assert "full_attention: linear x8.0" in gd109["message"] and "silently" in gd109["message"]
    assert gd109["details"]["scaled"] == {"full_attention": {"factor": 8.0, "rope_theta": 1e6, "rope_type": "linear"}}


def test_rope_without_a_factor_is_named_by_its_own_parameters(hub, cli):
    """A proportional RoPE (Gemma 4's full-attention layers) has partial_rotary_factor, no factor: GD109 said
    "proportional x?". transformers 4.50.0-4.57.6 has no proportional RoPE (ROPE_INIT_FUNCTIONS: default, linear,
    dynamic, yarn, longrope, llama3), so no rope_scaling is its equivalent there: only the upgrade is offered."""
    cfg = gemma3_text_saved_by_5()
    cfg["rope_parameters"]["full_attention"] = {"partial_rotary_factor": 0.25, "rope_theta": 1e6,
                                                "rope_type": "proportional"}
    gd109 = _findings(cli, hub, cfg, *_with("4.57.6"))["GD109"]
    assert "x?" not in gd109["message"] and "?" not in gd109["fix"]
    assert "full_attention: proportional (partial_rotary_factor 0.25)" in gd109["message"]
    assert gd109["fix"] == 'pip install "transformers>=5.0.0" (transformers 4.x has no proportional RoPE)'
    linear = gemma3_text_saved_by_5()
    linear["rope_parameters"]["full_attention"] = {"factor": 8.0, "rope_theta": 1e6, "rope_type": "yarn",
                                                   "beta_fast": 32.0}
    gd109 = _findings(cli, hub, linear, *_with("4.57.6"))["GD109"]
    assert "full_attention: yarn x8.0 (beta_fast 32.0)" in gd109["message"] and '"rope_scaling"' in gd109["fix"]


def test_rope_parameters_are_read_by_5x_and_unscaled_rope_loses_nothing(hub, cli):
    assert "GD109" not in _findings(cli, hub, gemma3_text_saved_by_5(), *_with("5.0.0"))
    assert "GD109" not in _findings(cli, hub, gemma3_text_saved_by_5("default"), *_with("4.57.6"))


def test_a_config_that_also_has_rope_scaling_is_read_by_4x(hub, cli):
    cfg = gemma3_text_saved_by_5()
    cfg["rope_scaling"] = {"rope_type": "linear", "factor": 8.0}
    assert "GD109" not in _findings(cli, hub, cfg, *_with("4.57.6"))


def test_rope_of_a_nested_text_config_is_named_where_it_is(hub, cli):
    cfg = gemma3_12b_config()
    cfg["text_config"] = {**cfg["text_config"], "rope_parameters": gemma3_text_saved_by_5()["rope_parameters"]}
    cfg["text_config"].pop("rope_scaling", None)
    assert _findings(cli, hub, cfg, *_with("4.57.6"))["GD109"]["key"] == "text_config.rope_parameters"


# ---------------------------------------------------------------------------------------------- GD110 timm

def test_gemma3n_without_timm_installed_is_an_error(hub, cli):
    """The main test venv has neither timm nor Pillow (read from package metadata, as check always does)."""
    from gemma_doctor.readers.versions import installed

    if installed().get("timm") and installed().get("pillow"):
        pytest.skip("timm and Pillow are installed here")
    gd110 = _findings(cli, hub, gemma3n_config())["GD110"]
    assert gd110["severity"] == "error" and "Gemma3nForCausalLM" in gd110["fix"]
    assert "timm" in gd110["details"]["missing"]


def test_gemma3n_with_timm_and_pillow_planned_is_not_flagged(hub, cli, tmp_path):
    req = tmp_path / "requirements.txt"
    req.write_text("transformers==5.23.0\ntimm==1.0.20\npillow==11.3.0\n")
    assert "GD110" not in _findings(cli, hub, gemma3n_config(), "--requirements", str(req))
    req.write_text("transformers==5.23.0\n")  # the same snapshot, planned for a machine whose list lacks them
    assert _findings(cli, hub, gemma3n_config(), "--requirements", str(req))["GD110"]["severity"] == "warning"


def test_other_families_never_need_timm(hub, cli):
    assert "GD110" not in _findings(cli, hub, copy.deepcopy(gemma3_12b_config()))


# ---------------------------------------------------------------------------------------------- prepare() on 5.23

def test_on_the_installed_5_23_prepare_supplies_nothing_and_switches_the_cache_off():
    """Outside every window (the main venv's transformers 5.23.0) prepare() adds no hook and guards use_cache as
    always, Gemma 4 included; inside them see tests/test_crashes_venvs.py (5.5.1)."""
    import sys
    from pathlib import Path

    import gemma_doctor
    from gemma_doctor.api import running_transformers

    sys.path.insert(0, str(Path(__file__).parent / "scripts"))
    try:
        import crash_cases
    finally:
        sys.path.pop(0)
    from tests.venvs import pinned

    # the pinned test stack (tests/constraints.txt): outside every window
    assert running_transformers() == pinned("transformers") == "5.23.0"
    g3 = crash_cases.gemma3()
    assert gemma_doctor.prepare(g3).supplied == () and not g3._forward_pre_hooks
    g4 = crash_cases.gemma4(kv_shared=2, bidirectional="vision")
    prepared = gemma_doctor.prepare(g4)
    assert prepared.supplied == () and prepared.enabled == ()
    assert "config.text_config.use_cache" in prepared.disabled and g4.config.text_config.use_cache is False


def test_recommend_keeps_the_cache_on_for_a_kv_shared_gemma4_in_the_window(hub, cli):
    """The loading snippet and TrainingArguments never switch use_cache off where that breaks KV sharing. In the
    window no run is prescribed: the prescription is an axolotl YAML, and axolotl switches the cache off whatever it
    says (check_model_config, 0.19.0): GD107 blocks it, its way out transformers>=5.5.2."""
    hub.add("google/gemma-4-E2B-it", {"config.json": gemma4_config(kv_shared=20)})
    r = cli("recommend", "google/gemma-4-E2B-it", "--cache-dir", hub.root, "--gpu", "A100", "--format", "json",
            "--with", "transformers==5.5.1")
    [model] = r.json()["models"]
    assert r.code == 1 and model["prescription"] is None
    assert [b.split(":")[0] for b in model["blocking"]] == ["GD107"]
    for version, keep in (("5.5.2", False),):
        r = cli("recommend", "google/gemma-4-E2B-it", "--cache-dir", hub.root, "--gpu", "A100", "--format", "json",
                "--with", f"transformers=={version}")
        assert r.code == 0, r
        [model] = r.json()["models"]
        tr = model["recommendation"]["frameworks"]["transformers"]
        loading = model["snippets"]["python"]["loading"]
        assert tr["use_cache"] is keep and tr["training_arguments"].get("use_cache") is (True if keep else None)
        assert ("sub_config.use_cache = False" in loading) is not keep
        assert any("GD107" in reason for reason in model["recommendation"]["reasons"]) is keep


def test_without_any_transformers_known_gd108_stays_quiet_and_a_straddling_range_warns(hub, cli, tmp_path):
    req = tmp_path / "requirements.txt"
    req.write_text("torch==2.13.0\n")  # transformers not on the training machine's list
    assert "GD108" not in _findings(cli, hub, gemma3n_config(), "--requirements", str(req))
    gd108 = _findings(cli, hub, gemma3n_config(), "--with", "transformers>=4.50,<4.60")["GD108"]
    assert gd108["severity"] == "warning" and "cannot be told" in gd108["message"]

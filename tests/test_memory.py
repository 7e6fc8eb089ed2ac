"""The memory plan: its parts pinned on exact small cases against the real libraries, and its verdicts."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest

from gemma_doctor import gpus
from gemma_doctor.plan import memory, runplan
from gemma_doctor.errors import UsageError
from gemma_doctor.readers import dtypes as dtypes_census
from gemma_doctor.readers.training_config import parse as parse_training_config
from gemma_doctor.run import Settings
from gemma_doctor.source import local
from tests.builders import EXAMPLES, gemma3_1b_config

TINY_TEXT = dict(vocab_size=256, hidden_size=32, intermediate_size=72, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, sliding_window=16, max_position_embeddings=64)
TINY_VISION = dict(hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=2, patch_size=8,
                   image_size=32)


def _tiny(kind: str):
    """A tiny random model of ``kind`` (gemma3_text, gemma2, gemma3 multimodal), built locally."""
    import torch
    from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3Config, Gemma3ForCausalLM,
                              Gemma3ForConditionalGeneration, Gemma3TextConfig)

    torch.manual_seed(0)
    if kind == "gemma3_text":
        return Gemma3ForCausalLM(Gemma3TextConfig(**TINY_TEXT))
    if kind == "gemma2":
        return Gemma2ForCausalLM(Gemma2Config(**TINY_TEXT))
    cfg = Gemma3Config(text_config=TINY_TEXT, vision_config=TINY_VISION, mm_tokens_per_image=4)
    return Gemma3ForConditionalGeneration(cfg)


@pytest.fixture(scope="module", params=["gemma3_text", "gemma2", "gemma3"])
def saved_tiny(request, tmp_path_factory):
    """(kind, folder, model) for a tiny model saved as safetensors with its config.json."""
    model = _tiny(request.param)
    path = tmp_path_factory.mktemp(f"tiny-{request.param}")
    model.save_pretrained(path)
    return request.param, path, model


def _shape(path) -> memory.ModelShape:
    config = json.loads((path / "config.json").read_text())
    census = dtypes_census.census(local(path, None), config)
    shape = runplan.shape_for(config, census)
    assert shape is not None
    return shape


# --- parameter counts ------------------------------------------------------------------------------

def test_parameter_counts_equal_the_safetensors_headers_and_the_model(saved_tiny):
    kind, path, model = saved_tiny
    config = json.loads((path / "config.json").read_text())
    census = dtypes_census.census(local(path, None), config)
    shape = _shape(path)
    assert shape.source == "safetensors headers"
    assert shape.params.total == census.total_params == sum(p.numel() for p in model.parameters())
    text_h = TINY_TEXT["hidden_size"]
    assert shape.params.embed == TINY_TEXT["vocab_size"] * text_h or kind == "gemma3"
    towers = sum(p.numel() for n, p in model.named_parameters() if "vision" in n or "multi_modal" in n)
    assert shape.params.towers == towers


def test_counts_derived_from_config_json_equal_the_real_model(saved_tiny):
    """What a --family plan (no download) derives from a config alone matches the model transformers builds."""
    kind, path, model = saved_tiny
    config = json.loads((path / "config.json").read_text())
    derived = memory.shape_from_config(config)
    exact = _shape(path)
    assert derived.params.total == exact.params.total == sum(p.numel() for p in model.parameters())
    assert derived.params.linear == exact.params.linear
    assert derived.params.towers == exact.params.towers


def test_gemma3_12b_counts_from_its_real_headers_match_the_published_config(tmp_path):
    spec = importlib.util.spec_from_file_location("build_example_cache", EXAMPLES / "build_example_cache.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    snap = mod.build(tmp_path / "hub")
    shape = _shape(snap)
    manifest = json.loads((EXAMPLES / "google--gemma-3-12b-it" / "tensors.json").read_text())
    assert shape.params.total == sum(math.prod(s) for sh in manifest["shards"] for _, s in sh["tensors"])
    published = memory.published_shape("gemma3", "12b")
    assert published is not None and published.params.total == shape.params.total
    assert published.params.towers == shape.params.towers > 400_000_000
    assert shape.params.embed == 262208 * 3840


# --- LoRA ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("targets,r", [("all-linear", 8), (("q_proj", "v_proj"), 4), (("gate_proj", "up_proj", "down_proj"), 16),
                                       (("q_proj", "k_proj", "v_proj", "o_proj"), 2), (("self_attn.q_proj",), 4),
                                       (r".*\.(q_proj|v_proj)", 8), (r".*layers\.0\..*(q_proj|down_proj)", 4)])
def test_lora_trainable_counts_equal_peft(saved_tiny, targets, r):
    """A list, a regex (PEFT matches it against whole module names) or all-linear: the plan counts what PEFT wraps,
    from the checkpoint's tensor names and from config.json alone (a --family plan)."""
    import peft

    kind, path, _ = saved_tiny
    model = _tiny(kind)
    config = peft.LoraConfig(r=r, target_modules=targets if isinstance(targets, str) else list(targets))
    trainable, _ = peft.get_peft_model(model, config).get_nb_trainable_parameters()
    assert trainable > 0
    assert memory.lora_trainable(_shape(path), r, targets) == trainable
    derived = memory.shape_from_config(json.loads((path / "config.json").read_text()))
    assert memory.lora_trainable(derived, r, targets) == trainable


def test_the_prescribed_language_model_regex_counts_what_peft_wraps(saved_tiny):
    """recommend's target_modules for a multimodal Gemma 3 (a regex) counted 0 trainable parameters in the plan."""
    import peft

    from gemma_doctor.plan.recommend import LM_ONLY_TARGETS

    kind, path, _ = saved_tiny
    if kind != "gemma3":
        pytest.skip("the language-model regex is prescribed for multimodal checkpoints")
    lora = peft.LoraConfig(r=8, target_modules=LM_ONLY_TARGETS)
    trainable, _ = peft.get_peft_model(_tiny(kind), lora).get_nb_trainable_parameters()
    assert memory.lora_trainable(_shape(path), 8, LM_ONLY_TARGETS) == trainable > 0
    tc = parse_training_config(f"adapter: lora\nlora_r: 8\nlora_target_modules: '{LM_ONLY_TARGETS}'\n", "t.yaml",
                               yaml_first=True)
    req = runplan.request_spec(precision="bf16", gpu=None, request=runplan.MemoryRequest(),
                               training_config=tc, task="sft")
    assert req.base.lora_targets == LM_ONLY_TARGETS
    assert memory.plan(_shape(path), req.base).trainable_params == trainable


# --- optimizer states --------------------------------------------------------------------------------

# Repeated shapes, as a model's layers repeat them.
SHAPES = [(64, 48), (48,), (3, 5, 7), (5000,), (64, 48), (48,), (64, 48)]


def _state_bytes(opt) -> int:
    """Bytes of the optimizer's per-parameter state tensors (scalar step counters excluded)."""
    return sum(v.numel() * v.element_size() for st in opt.state_dict()["state"].values() for v in st.values()
               if hasattr(v, "dim") and v.dim() > 0)


def _one_step(make, dtype):
    import torch

    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, dtype=dtype)) for s in SHAPES]
    opt = make(params)
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()
    return opt


@pytest.mark.parametrize("kind,make", [
    ("adamw", lambda ps: __import__("torch").optim.AdamW(ps, lr=1e-3)),
    ("adamw_fused", lambda ps: __import__("torch").optim.AdamW(ps, lr=1e-3, fused=True)),
    ("sgd_momentum", lambda ps: __import__("torch").optim.SGD(ps, lr=1e-3, momentum=0.9)),
    ("sgd", lambda ps: __import__("torch").optim.SGD(ps, lr=1e-3)),
    ("adafactor", lambda ps: __import__("transformers").optimization.Adafactor(ps)),
])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_optimizer_state_bytes_equal_a_real_optimizer_after_one_step(kind, make, dtype):
    import torch

    opt = _one_step(make, getattr(torch, dtype))
    assert memory.optimizer_state_bytes(kind, SHAPES, memory.DTYPE_BYTES[dtype]) == _state_bytes(opt)


@pytest.mark.parametrize("name,kind", [("adamw_torch_fused", "adamw_fused"), ("paged_adamw_8bit", "paged_adamw_8bit"),
                                       ("adamw_bnb_8bit", "adamw_8bit"), ("Adafactor", "adafactor"), ("sgd", "sgd")])
def test_transformers_optim_names(name, kind):
    assert memory.optimizer_kind(name) == (kind, True)
    assert memory.optimizer_kind("made_up_optimizer") == ("adamw", False)


# --- the plan's arithmetic ------------------------------------------------------------------------------

def test_components_add_up_and_full_fp32_adamw_is_16_bytes_per_parameter():
    shape = memory.published_shape("gemma3", "1b")
    run = Settings(method="full", precision="fp32", load_dtype="float32", optimizer="adamw_torch_fused",
                         batch_size=1, seq_len=8, device="cpu")
    p = memory.plan(shape, run)
    assert sum(p.components.values()) == p.per_gpu_bytes == p.total_bytes
    n = shape.params.total
    assert p.components["weights"] == 4 * n and p.components["optimizer_states"] == 8 * n
    assert p.peak in ("embedding-backward", "optimizer-step") and p.components["gradients"] == 4 * n


def test_zero3_over_four_gpus_shards_weights_gradients_and_states():
    shape = memory.published_shape("gemma3", "12b")
    # DeepSpeed on one GPU keeps the same fp32 states (and copies) whole: four ranks hold a quarter each.
    one = memory.plan(shape, Settings(method="full", batch_size=1, seq_len=512, zero_stage=3))
    four = memory.plan(shape, Settings(method="full", batch_size=1, seq_len=512, num_gpus=4, zero_stage=3))
    for part in ("optimizer_states", "fp32_master_copies"):
        assert four.components[part] * 4 == one.components[part]
    assert four.per_gpu_bytes < one.per_gpu_bytes / 3 and four.total_bytes == 4 * four.per_gpu_bytes


def test_logits_grow_with_batch_times_sequence_times_vocabulary():
    shape = memory.published_shape("gemma3", "1b")
    run = Settings(method="lora", batch_size=1, seq_len=4096, precision="bf16")
    p = memory.plan(shape, run)
    assert p.components["logits"] == 4096 * 262144 * 12  # fp32 log-probs, their gradient, the incoming gradient


# --- GPUs ------------------------------------------------------------------------------------------

# The totals as nvidia-smi reports them (MiB), not the marketed GB read as GiB (issue 20: a T4 is 15,360 MiB).
@pytest.mark.parametrize("spec,mib,ambiguous", [("T4", 15_360, False), ("A100", 40_960, True), ("A100-80GB", 81_920, False),
                                                ("A100 40GB", 40_960, False), ("NVIDIA A100-SXM4-80GB", 81_920, False),
                                                ("V100", 16_160, True), ("V100-32GB", 32_768, False), ("H100", 81_559, True),
                                                ("L4", 23_034, False), ("RTX 3060", 12_288, False), ("8.0", None, False)])
def test_gpu_memory_from_names(spec, mib, ambiguous):
    plan = gpus.parse_gpu_spec(spec)
    assert plan.assumed_memory_bytes == (mib * 2**20 if mib else None)
    if mib:
        assert f"{mib:,} MiB" in plan.memory_note
    # A bare name of a GPU sold in several sizes is no fact about the size: the plan assumes the smallest and says so.
    assert plan.memory_bytes == (None if ambiguous else plan.assumed_memory_bytes)
    assert ("ships with" in plan.memory_note) is ambiguous


def test_a_size_the_gpu_does_not_ship_with_is_a_usage_error():
    with pytest.raises(UsageError, match="40 GB or 80 GB"):
        gpus.parse_gpu_spec("A100-24GB")
    assert gpus.parse_memory("80") == 80 * gpus.GIB and gpus.parse_memory("15.5 GiB") == int(15.5 * gpus.GIB)
    with pytest.raises(UsageError):
        gpus.parse_memory("lots")


# --- choosing and the verdicts -----------------------------------------------------------------------

def test_gemma3_12b_on_a_t4_is_not_full_fp32_and_names_a_gpu_where_it_fits(cli, tmp_path):
    """No run fits a T4's 15,360 MiB at 1024 tokens: the smallest, QLoRA on the language model (the regex
    recommend prescribes, whose adapters the plan counts), needs more (GD801; it was "tight", GD802, while the regex
    counted no adapter); the way out names a shorter sequence and the smallest common GPU where a run fits."""
    r = cli("recommend", "--family", "gemma3", "--size", "12b", "--gpu", "T4", "--cache-dir", tmp_path, "--format", "json")
    assert r.code == 1, r
    (m,) = r.json()["models"]
    mem = m["memory"]
    assert m["prescription"] is None and m["nearest"]["precision"] == "fp32" and mem["method"] == "qlora"
    full = memory.plan(memory.published_shape("gemma3", "12b"),
                       Settings(method="full", precision="fp32", load_dtype="float32", batch_size=1, seq_len=1024,
                                      gradient_checkpointing=True), 15_360 * 2**20)
    assert full.verdict == "does-not-fit" and full.per_gpu_bytes > 150 * gpus.GIB
    assert mem["verdict"] == "does-not-fit" and any(b.startswith("GD801") for b in m["blocking"])
    assert mem["trainable_params"] > 0
    names = {g.name for g in gpus.common_training_gpus()}
    assert any(w.startswith("a GPU with") and any(f'--gpu "{n}"' in w for n in names) for w in m["way_out"])
    assert any(w.startswith("a shorter sequence, --seq-len 512") for w in m["way_out"])


def test_gemma3_1b_on_an_h100_trains_fully_and_on_a_t4_with_lora_or_less(cli, tmp_path):
    def method(gpu):
        r = cli("recommend", "--family", "gemma3", "--gpu", gpu, "--cache-dir", tmp_path, "--format", "json")
        assert r.code == 0, r
        m = r.json()["models"][0]
        assert m["memory"]["verdict"] == "fits"
        args = m["recommendation"]["frameworks"]["transformers"]["training_arguments"]
        assert args["per_device_train_batch_size"] == m["memory"]["run"]["batch_size"]
        return m["memory"]["method"]

    assert method("H100") == "full"
    assert method("T4") in ("lora", "qlora")


def test_check_json_carries_the_memory_contract(cli, hub):
    hub.add("google/gemma-3-1b-it", {"config.json": gemma3_1b_config()})
    r = cli("check", "--cache-dir", hub.root, "--gpu", "L4", "--format", "json", "--fail-on", "never")
    (m,) = r.json()["models"]
    mem = m["memory"]
    assert {"method", "total_bytes", "per_gpu_bytes", "gpu_bytes", "verdict", "components", "assumptions"} <= set(mem)
    assert mem["verdict"] in ("fits", "tight", "does-not-fit") and mem["gpu_bytes"] == 23_034 * 2**20
    assert sum(mem["components"].values()) == mem["per_gpu_bytes"]
    assert any("config.json" in a for a in mem["assumptions"])
    text = cli("check", "--cache-dir", hub.root, "--gpu", "L4", "--fail-on", "never")
    assert "memory " in text.out and "GiB" in text.out


def test_a_training_config_that_does_not_fit_is_gd801_and_options_override_it(cli, hub, tmp_path):
    hub.add("google/gemma-3-1b-it", {"config.json": gemma3_1b_config()})
    tc = tmp_path / "sft.json"
    tc.write_text(json.dumps({"bf16": False, "per_device_train_batch_size": 32, "max_length": 4096,
                              "gradient_checkpointing": False, "optim": "adamw_torch"}))
    r = cli("check", "--cache-dir", hub.root, "--gpu", "T4", "--training-config", tc, "--format", "json")
    (m,) = r.json()["models"]
    gd801 = [f for f in m["findings"] if f["code"] == "GD801"]
    assert r.code == 1 and gd801 and gd801[0]["severity"] == "error" and gd801[0]["file"] == str(tc)
    assert m["memory"]["run"]["batch_size"] == 32 and m["memory"]["run"]["seq_len"] == 4096
    assert m["memory"]["run"]["sources"]["batch_size"] == "training config per_device_train_batch_size"
    ok = cli("check", "--cache-dir", hub.root, "--gpu", "T4", "--training-config", tc, "--format", "json",
             "--batch-size", "1", "--seq-len", "256", "--method", "qlora", "--gradient-checkpointing")
    m = ok.json()["models"][0]
    assert m["memory"]["run"]["batch_size"] == 1 and m["memory"]["run"]["sources"]["batch_size"] == "option"
    assert "GD801" not in {f["code"] for f in m["findings"]}


@pytest.mark.parametrize("trl,chunked", [(None, True), ("trl==1.14.0", False)])
def test_the_logits_term_follows_the_trainer_the_stack_runs(cli, tmp_path, trl, chunked):
    """GD650 says TRL >= 1.15's SFTTrainer never holds the full logits; the plan counted 24 GiB of them all the same
    and failed GD801 (56.9 GiB of an A100's 40). The plan now counts one tile of TRL's fused LM head where GD650 says
    so, and the full logits where the TRL that runs holds them: the two never disagree."""
    from tests.builders import HubCache, gemma3_12b_config

    hub = HubCache(tmp_path / "hub")
    hub.add("google/gemma-3-12b-it", {"config.json": gemma3_12b_config()})
    tc = tmp_path / "sft.yaml"
    # dtype: TRL otherwise loads the 12B in float32 (44 GiB: more than the A100 has, whatever the logits)
    tc.write_text("per_device_train_batch_size: 8\nmax_length: 1024\nbf16: true\ngradient_checkpointing: true\n"
                  "use_peft: true\ndtype: bfloat16\n")
    args = ["check", "--cache-dir", hub.root, "--gpu", "A100", "--training-config", tc, "--format", "json"]
    m = cli(*args, *(("--with", trl) if trl else ())).json()["models"][0]
    gd650 = next(f for f in m["findings"] if f["code"] == "GD650")
    logits = m["memory"]["components"].get("logits", 0)
    assert gd650["details"]["chunked"] is chunked
    assert ("chunked_loss" in m["memory"]["run"]["sources"]) is chunked
    if chunked:
        assert logits == memory.chunked_logits_bytes(8 * 1024) < gd650["details"]["logits_bytes"] // 40
        assert m["memory"]["verdict"] == "fits" and "GD801" not in {f["code"] for f in m["findings"]}
    else:
        assert logits == gd650["details"]["logits_bytes"]


def test_every_search_is_bounded_whatever_the_numbers_in_the_config(cli, tmp_path, monkeypatch):
    """A training config's batch and max_length of 10**60 took 85 s (issue 33): the searches halved the batch two
    hundred times per method, checkpointing and stage (56,517 memory plans on one model). Counted, not timed: the
    plans made for 10**60 are no more than for a batch of 4096."""
    from tests.builders import HubCache, gemma3_12b_config

    from gemma_doctor.plan import search

    hub = HubCache(tmp_path / "hub")
    hub.add("google/gemma-3-12b-it", {"config.json": gemma3_12b_config()})
    # The count of a cold process: the process-wide plan caches start empty (under xdist, earlier tests filled them,
    # and a full cache is cleared mid-test: 7,172 plans cold, 10,624 in one clean-clone run's worker).
    monkeypatch.setattr(search, "_PLANS", {})
    monkeypatch.setattr(runplan, "_REQUESTS", {})
    monkeypatch.setattr(search, "_WAY_OUTS", {})  # a way out remembered from an earlier test would plan nothing
    monkeypatch.setattr(search, "_CANDIDATES", {})  # nor would candidates an earlier test's searches made
    made = []
    real = memory.plan
    monkeypatch.setattr(memory, "plan", lambda *a, **k: made.append(1) or real(*a, **k))
    counts = {}
    for n in (4096, 10**60):
        tc = tmp_path / f"sft-{len(counts)}.yaml"
        tc.write_text(f"per_device_train_batch_size: {n}\nmax_length: {n}\nbf16: true\n")
        made.clear()
        for command in ("check", "recommend"):
            r = cli(command, "--cache-dir", hub.root, "--gpu", "T4", "--training-config", tc, "--format", "json")
            assert r.code == 1, r
        counts[n] = len(made)
    assert counts[10**60] <= counts[4096] < 10_000, counts


def test_axolotl_dpo_with_liger_counts_one_pairs_logits(cli, tmp_path):
    """axolotl 0.19.0's `dpo_use_liger_kernel: true` hands use_liger_kernel to TRL 1.9.0's DPOConfig, whose
    DPOTrainer then computes the loss with liger-kernel's LigerFusedLinearDPOLoss: one chosen/rejected pair's logits
    at a time (chunk_size 1), never the 2b x s x V logits (run here on CPU, docs/memory.md: [126 x 262,144] for 2 pairs
    x 64 tokens, against [256 x 262,144] without). The plan's logits term counts one pair, GD650 the same bytes; on
    main the key was not read and the plan counted the whole batch's logits."""
    from tests.builders import HubCache, gemma3_12b_config

    hub = HubCache(tmp_path / "hub")
    hub.add("google/gemma-3-12b-it", {"config.json": gemma3_12b_config()})
    base = ("base_model: google/gemma-3-12b-it\nrl: dpo\nadapter: lora\nlora_r: 16\nlora_target_linear: true\n"
            "micro_batch_size: 4\nsequence_len: 1024\nbf16: true\ngradient_checkpointing: true\n")
    got = {}
    for liger in (False, True):
        tc = tmp_path / f"dpo-{liger}.yaml"
        tc.write_text(base + ("dpo_use_liger_kernel: true\n" if liger else ""))
        m = cli("check", "--cache-dir", hub.root, "--gpu", "H100", "--training-config", tc,
                "--format", "json").json()["models"][0]
        gd650 = next(f for f in m["findings"] if f["code"] == "GD650")
        got[liger] = (m["memory"]["components"]["logits"], gd650["details"]["logits_bytes"], m["memory"]["run"])
    (full, full650, run), (one, one650, liger_run) = got[False], got[True]
    assert full == full650 and one == one650
    assert one * 4 == full  # batch 4: one pair of the four
    assert "dpo_use_liger_kernel" in liger_run["sources"]["liger_dpo_loss"] and liger_run["liger_dpo_loss"]
    assert not run["liger_dpo_loss"]


def test_axolotl_qlora_and_deepspeed_settings_are_read():
    tc = parse_training_config("base_model: google/gemma-3-1b-it\nadapter: qlora\nload_in_4bit: true\nmicro_batch_size: 2\n"
                               "sequence_len: 2048\nlora_r: 32\nlora_target_linear: true\ndeepspeed: deepspeed_configs/zero3.json\n",
                               "ax.yaml", True)
    values, src = runplan.run_request(tc, runplan.MemoryRequest(), "sft")
    assert values["method"] == "qlora" and values["quant_bits"] == 4 and values["batch_size"] == 2
    assert values["seq_len"] == 2048 and values["lora_r"] == 32 and values["lora_targets"] == "all-linear"
    # axolotl's own deepspeed_configs/zero3.json, read by its name (not on disk here), not a stage guessed from a name
    assert values["zero_stage"] == 3 and src["zero_stage"] == ("training config deepspeed (axolotl's "
                                                               "deepspeed_configs/zero3.json: zero_optimization.stage)")


FSDP2_YAML = ("compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nnum_machines: 2\nnum_processes: 16\n"
              "fsdp_config:\n  fsdp_version: 2\n  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
              "  fsdp_transformer_layer_cls_to_wrap: Gemma3DecoderLayer\n{reshard}")


@pytest.mark.parametrize("reshard, stage", [("  fsdp_reshard_after_forward: true\n", 3),
                                            ("  fsdp_reshard_after_forward: false\n", 2),
                                            ("", 3),  # accelerate's default: true
                                            ("  fsdp_reshard_after_forward: SHARD_GRAD_OP\n", 2)])
def test_an_accelerate_fsdp2_config_shards_by_reshard_after_forward(reshard, stage):
    """FSDP2 has no sharding strategy key: reshard_after_forward true is FULL_SHARD (ZeRO-3), false SHARD_GRAD_OP.
    It was read as ZeRO-0 (DDP: everything replicated on each of the 16 GPUs)."""
    tc = parse_training_config(FSDP2_YAML.format(reshard=reshard), "accelerate.yaml", True)
    values, src = runplan.run_request(tc, runplan.MemoryRequest(), "sft")
    assert values["zero_stage"] == stage and values["fsdp"] is True and "fsdp" in src["zero_stage"]
    assert values["num_gpus"] == 16 and values["num_nodes"] == 2
    # What the plan says each rank holds.
    run = Settings(method="full", batch_size=1, seq_len=512, num_gpus=16, zero_stage=stage, fsdp=True, num_nodes=2)
    line = [a for a in memory.plan(memory.published_shape("gemma3", "1b"), run).assumptions if "16 GPUs" in a]
    assert len(line) == 1 and "on 2 nodes (8 per node)" in line[0] and "1/16 of the weights" in line[0]
    assert ("FULL_SHARD" if stage == 3 else "SHARD_GRAD_OP") in line[0] and "tied embedding / lm_head unit" in line[0]


def test_fsdp2_elsewhere_than_an_fsdp_run_is_not_read_as_sharding():
    tc = parse_training_config("distributed_type: MULTI_GPU\nnum_processes: 2\nfsdp_config:\n  fsdp_version: 2\n",
                               "accelerate.yaml", True)
    values, _ = runplan.run_request(tc, runplan.MemoryRequest(), "sft")
    assert "zero_stage" not in values and "fsdp" not in values


def test_a_deepspeed_json_named_by_the_config_gives_the_stage_from_its_contents(tmp_path):
    """The file name says nothing (ds.json): the stage is the file's zero_optimization.stage, not a guess."""
    from gemma_doctor.readers import training_config

    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    (tmp_path / "accelerate.yaml").write_text("distributed_type: DEEPSPEED\nnum_processes: 4\ndeepspeed_config:\n"
                                              "  deepspeed_config_file: ds.json\n")
    values, src = runplan.run_request(training_config.read(str(tmp_path / "accelerate.yaml")), runplan.MemoryRequest(), "sft")
    assert values["zero_stage"] == 2 and "ds.json: zero_optimization.stage" in src["zero_stage"] and "fsdp" not in values


def test_sharded_plan_holds_the_root_unit_whole_and_leaves_unsharded_runs_alone():
    """At the embedding's backward a rank holds the gathered embedding unit and its whole gradient (3 copies for a tied
    one) on top of its shards: benchmarks/sharded_memory.py measured this on FSDP2 (docs/benchmarks.md)."""
    shape = memory.published_shape("gemma3", "1b")
    e = shape.params.embed * 4
    w = shape.params.text * 4
    base = dict(method="full", precision="fp32", load_dtype="float32", optimizer="adamw_torch", batch_size=1,
                seq_len=128, device="cpu")
    one = memory.plan(shape, Settings(**base))
    assert one.components["weights"] == w and one.components["embedding_gradient_copies"] == 2 * e
    four = memory.plan(shape, Settings(**base, num_gpus=4, zero_stage=3, fsdp=True))
    assert four.peak == "embedding-backward"
    c = four.components
    assert c["gathered_root_unit"] == e and c["unsharded_root_gradient"] == e and c["embedding_gradient_copies"] == 2 * e
    assert c["gradients"] == (w - e) // 4 and c["optimizer_states"] == 2 * w // 4
    # ZeRO-2 (DeepSpeed): weights replicated, nothing gathered; the embedding's gradient still whole.
    z2 = memory.plan(shape, Settings(**base, num_gpus=4, zero_stage=2)).components
    assert z2["weights"] == w and "gathered_root_unit" not in z2 and z2.get("unsharded_root_gradient") == e


def test_memory_modules_are_pure():
    import ast
    import inspect

    for module in (memory, runplan):
        tree = ast.parse(inspect.getsource(module))
        names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                 for a in getattr(n, "names", [])} | {(n.module or "").split(".")[0] for n in ast.walk(tree)
                                                      if isinstance(n, ast.ImportFrom)}
        assert not names & {"torch", "transformers", "rich", "huggingface_hub", "os", "pathlib", "peft"}


def test_nothing_fits_is_gd803_naming_a_larger_gpu_and_no_gpu_gives_no_verdict(cli, hub):
    from tests.builders import gemma3_12b_config

    hub.add("google/gemma-3-12b-it", {"config.json": gemma3_12b_config()})
    r = cli("check", "--cache-dir", hub.root, "--gpu", "T4", "--seq-len", "4096", "--format", "json", "--fail-on", "never")
    (m,) = r.json()["models"]
    (gd803,) = [f for f in m["findings"] if f["code"] == "GD803"]
    # a GPU was named (--gpu T4): a run that fits nowhere on it cannot start, so it gates (issue 20)
    assert gd803["severity"] == "error" and gd803["details"]["smallest_gpu"] in gd803["fix"]
    assert m["memory"]["model"]["source"].startswith("config.json")
    cpu = cli("check", "--cache-dir", hub.root, "--gpu", "none", "--format", "json", "--fail-on", "never")
    (m,) = cpu.json()["models"]
    assert m["memory"]["verdict"] == "unknown" and m["memory"]["gpu_bytes"] is None
    assert not [f for f in m["findings"] if f["code"].startswith("GD8")]


@pytest.mark.parametrize("model, extra, fix_words", [
    ("google--gemma-3-12b-it", "", "Gemma3ForCausalLM"),
    ("google--gemma-4-E2B-it", "", "freeze the towers"),  # no text-only class loads a Gemma 4 checkpoint
    ("google--gemma-3-12b-it", "dataset_kwargs:\n  skip_prepare_dataset: true\n", None),  # TRL's VLM recipe
    ("google--gemma-3-12b-it", "processor_type: AutoProcessor\n", None),  # axolotl's multimodal config
])
def test_gd804_names_a_class_that_loads_the_member_and_spares_a_run_on_images(cli, tmp_path, model, extra, fix_words):
    """GD804 advised Gemma3ForCausalLM for Gemma 4 and called an image-dataset run text-only."""
    from tests.builders import EXAMPLES

    (tmp_path / "t.yaml").write_text("bf16: true\nper_device_train_batch_size: 1\nmax_length: 512\n"
                                     "gradient_checkpointing: true\n" + extra)
    r = cli("check", EXAMPLES / model, "--training-config", tmp_path / "t.yaml", "--gpu", "H200", "--method", "full",
            "--format", "json", "--fail-on", "never")
    found = [f for f in r.json()["models"][0]["findings"] if f["code"] == "GD804"]
    if fix_words is None:
        assert found == []
    else:
        assert len(found) == 1 and fix_words in found[0]["fix"]
        assert "Gemma3ForCausalLM" not in found[0]["fix"] or "gemma-3" in model


@pytest.mark.parametrize("text, gpu, precision, source", [
    ("bf16: false\nfp16: false\n", "L4", "fp32", "training config bf16"),
    ("bf16: true\n", "T4", "bf16", "training config bf16"),  # GD603: emulated bf16 still holds bf16 tensors
    ("fp16: true\n", "A100", "fp16", "training config fp16"),
    ("bf16: auto\n", "T4", "fp32", "recommended"),  # the launcher's machine decides: the recommendation stands
    ("bf16: ture\n", "L4", "bf16", "recommended"),  # GD681: the trainer refuses it, the run does not start
    # TRL's configs set bf16 = not fp16 where bf16 is unset (the pinned TRL 1.16): bf16 by the trainer's default
    ("", "L4", "bf16", "default of TRL SFTConfig (trl >=0.19.0: bf16 = not fp16)"),
    ("fp16: false\n", "L4", "bf16", "default of TRL SFTConfig (trl >=0.19.0: bf16 = not fp16)"),
])
def test_the_memory_plan_trains_in_the_precision_the_training_config_sets(cli, hub, tmp_path, text, gpu, precision,
                                                                           source):
    """`bf16: false` on an L4 trains in fp32 (GD609 says so), yet check planned the memory, the precision line and the
    Run in the recommended bf16 (LoRA on Gemma 4 E2B: "16.4 GiB of 22.5: fits" for an fp32 run that needs more): the
    config's own precision is the run's, with its key as the source, in every view."""
    hub.add("google/gemma-3-1b-it", {"config.json": gemma3_1b_config()})
    tc = tmp_path / "sft.yaml"
    tc.write_text(text + "per_device_train_batch_size: 1\nmax_length: 1024\nuse_peft: true\n")
    args = ["check", "--cache-dir", hub.root, "--gpu", gpu, "--training-config", tc, "--fail-on", "never"]
    m = cli(*args, "--format", "json").json()["models"][0]
    assert m["run"]["precision"] == {"value": precision, "source": source}
    # TRL loads the weights in float32 (no dtype in the config): the summary says so beside the precision
    assert m["memory"]["run"]["precision"] == precision and (f", {precision}, " in m["memory"]["summary"] or
                                                             f", {precision} with float32 weights, " in m["memory"]["summary"])
    line = next(ln for ln in cli(*args).out.splitlines() if ln.startswith("  precision "))
    assert line.startswith(f"  precision {precision}"), line


def test_the_larger_gpu_gd801_names_trains_as_check_would_judge_it_there(cli, hub, tmp_path):
    """A bf16 run that fits nowhere here was told "use a larger GPU: T4 (LoRA r=16, bf16, ...: fits)": bf16 on a T4 is
    the doctor's own GD603. On a GPU without native bf16 the run it names trains in fp32, as `--gpu T4` would plan it;
    and a tight run is said to be tight, not to need "more than" the GPU has."""
    hub.add("google/gemma-3-1b-it", {"config.json": gemma3_1b_config()})
    tc = tmp_path / "sft.yaml"
    tc.write_text("bf16: true\nper_device_train_batch_size: 1\nmax_length: 1024\nuse_peft: true\n")
    args = ["check", "--cache-dir", hub.root, "--gpu", "L4", "--training-config", tc, "--format", "json"]
    m = cli(*args, "--gpu-memory", "1").json()["models"][0]
    gd801 = next(f for f in m["findings"] if f["code"] == "GD801")
    assert "use a larger GPU: T4 " in gd801["fix"] and ", fp32, " in gd801["fix"] and "bf16" not in gd801["fix"]
    # Tight even with the checkpointing the plan may choose (the config leaves it open): GD801, as nothing fits.
    needs = cli(*args, "--gradient-checkpointing", "--gpu-memory", "100").json()["models"][0]["memory"]["per_gpu_bytes"]
    tight = cli(*args, "--gpu-memory", f"{needs / memory.GIB / 0.95:.2f}").json()["models"][0]
    assert tight["memory"]["verdict"] == "tight", tight["memory"]["summary"]
    (f,) = [f for f in tight["findings"] if f["code"] in ("GD801", "GD802")]
    assert "more than" not in f["message"] and "above 90%" in f["message"], f["message"]


@pytest.mark.parametrize("text, load, source", [
    ("", "float32", "default of TRL's trainers with trl >=0.27.0"),  # tests/scripts/trl_load_dtype.py: float32
    ("dtype: bfloat16\n", "bfloat16", "training config dtype"),
    ("model_init_kwargs:\n  dtype: bfloat16\n", "bfloat16", "training config model_init_kwargs.dtype"),
    ("dtype: auto\n", "bfloat16", None),  # the checkpoint's dtype: the precision's load
])
def test_a_trl_config_without_dtype_is_planned_with_the_float32_weights_trl_loads(cli, hub, tmp_path, text, load,
                                                                                 source):
    """TRL 1.16's SFTTrainer loads a model id in float32 unless a dtype is given (tests/scripts/trl_load_dtype.py: a
    bf16 checkpoint's parameters come back float32), yet check planned bf16 weights (1.9 GiB for Gemma 3 1B, TRL holds
    3.7 GiB). The plan counts what TRL loads and says so, with the cure."""
    hub.add("google/gemma-3-1b-it", {"config.json": gemma3_1b_config()})
    tc = tmp_path / "sft.yaml"
    tc.write_text("per_device_train_batch_size: 1\nmax_length: 1024\nuse_peft: true\n" + text)
    args = ["check", "--cache-dir", hub.root, "--gpu", "L4", "--training-config", tc, "--fail-on", "never"]
    m = cli(*args, "--format", "json").json()["models"][0]
    assert m["run"]["load_dtype"] == load and m["memory"]["run"]["load_dtype"] == load
    line = next(a for a in m["memory"]["assumptions"] if "weights loaded in" in a)
    weights = m["memory"]["components"]["weights"]
    if source is None:
        assert "load_dtype" not in m["memory"]["run"]["sources"] and weights < 2.1e9
        return
    assert m["memory"]["run"]["sources"]["load_dtype"].startswith(source), line
    if load == "float32":
        assert "`dtype: bfloat16`" in line and "model_init_kwargs" in line, line  # the cure
        assert weights > 3.9e9 and ", bf16 with float32 weights, " in m["memory"]["summary"]
    else:
        assert weights < 2.1e9 and "float32 weights" not in m["memory"]["summary"]


@pytest.mark.parametrize("text, on, source", [
    ("max_length: 2048\n", True, "default of TRL SFTConfig (trl >=0.21.0)"),
    ("learning_rate: 0.0001\n", False, "default of transformers TrainingArguments"),
    ("max_length: 2048\ngradient_checkpointing: false\n", False, "training config gradient_checkpointing"),
    ("base_model: google/gemma-3-1b-it\nmicro_batch_size: 4\nsequence_len: 2048\n", False, "default of axolotl"),
    ("stage: sft\nfinetuning_type: lora\ncutoff_len: 2048\n", True, "default of LLaMA-Factory"),
    ("stage: sft\nfinetuning_type: lora\ncutoff_len: 2048\ndisable_gradient_checkpointing: true\n", False,
     "training config disable_gradient_checkpointing"),
    # LLaMA-Factory checkpoints the model unless disable_gradient_checkpointing (model_utils/checkpointing.py
    # prepare_model_for_training): its TrainingArguments' gradient_checkpointing: false does not turn that off, and
    # true turns it on whatever disable says (the Trainer enables it itself). Planned off before.
    ("stage: sft\nfinetuning_type: lora\ncutoff_len: 2048\ngradient_checkpointing: false\n", True,
     "default of LLaMA-Factory (disable_gradient_checkpointing: false"),
    ("stage: sft\nfinetuning_type: lora\ncutoff_len: 2048\ngradient_checkpointing: false\n"
     "disable_gradient_checkpointing: true\n", False, "training config disable_gradient_checkpointing"),
    ("stage: sft\nfinetuning_type: lora\ncutoff_len: 2048\ngradient_checkpointing: true\n"
     "disable_gradient_checkpointing: true\n", True, "training config gradient_checkpointing"),
])
def test_checkpointing_a_config_leaves_open_is_the_trainers_default_not_chosen_to_fit(cli, hub, tmp_path, text, on,
                                                                                      source):
    """A training config without gradient_checkpointing was planned "chosen to fit" (off on a GPU where the run fits
    without it), yet the trainer that runs it decides: TrainingArguments and axolotl leave it off, TRL's configs
    (trl/trainer/base_config.py) and LLaMA-Factory turn it on. check plans that run, with the default's source."""
    hub.add("google/gemma-3-1b-it", {"config.json": gemma3_1b_config()})
    tc = tmp_path / "run.yaml"
    tc.write_text("per_device_train_batch_size: 1\n" * ("stage" not in text and "base_model" not in text) + text)
    args = ["check", "--cache-dir", hub.root, "--gpu", "A100", "--training-config", tc, "--fail-on", "never"]
    m = cli(*args, "--format", "json").json()["models"][0]
    assert m["run"]["gradient_checkpointing"]["value"] is on
    assert m["run"]["gradient_checkpointing"]["source"].startswith(source), m["run"]["gradient_checkpointing"]
    assert m["memory"]["run"]["gradient_checkpointing"] is on


def test_a_run_that_does_not_fit_at_the_trainers_default_names_the_setting(cli, hub, tmp_path):
    """TrainingArguments leaves checkpointing off: a run that fits only with it is GD801, and the way out says to set
    it (before, the search turned it on silently and called the run "chosen to fit")."""
    hub.add("google/gemma-3-1b-it", {"config.json": gemma3_1b_config()})
    tc = tmp_path / "run.yaml"
    tc.write_text("per_device_train_batch_size: 4\nlearning_rate: 0.0001\nbf16: true\n")
    args = ["check", "--cache-dir", hub.root, "--gpu", "L4", "--seq-len", "2048", "--training-config", tc,
            "--format", "json"]
    found = [f for f in cli(*args).json()["models"][0]["findings"] if f["code"] == "GD801"]
    assert len(found) == 1, found
    assert found[0]["fix"].startswith("set gradient_checkpointing: true (off by the default of transformers "
                                      "TrainingArguments); it would fit as: "), found[0]["fix"]
    assert "gradient checkpointing" in found[0]["fix"]


@pytest.mark.parametrize("text, trainer", [
    ("gradient_accumulation_steps: 2\nbf16: true\n", "transformers"),
    ("gradient_accumulation_steps: 2\nbf16: true\nmax_length: 1024\n", "trl-sft"),
])
def test_a_batch_a_config_leaves_open_is_the_trainers_default_and_its_accumulation_is_kept(cli, hub, tmp_path, text,
                                                                                           trainer):
    """A TrainingArguments / TRL config without per_device_train_batch_size trains 8 per device (TrainingArguments'
    default, which TRL's configs keep: transformers 5.23.0, TRL 1.16.0), with its own gradient_accumulation_steps.
    check planned a batch "chosen to fit" instead and rewrote the accumulation the config wrote (2 -> 16) to keep the
    effective batch, so the plan (and its verdict) was of a run that does not execute."""
    hub.add("google/gemma-3-1b-it", {"config.json": gemma3_1b_config()})
    tc = tmp_path / "run.yaml"
    tc.write_text(text)
    m = cli("check", "google/gemma-3-1b-it", "--cache-dir", hub.root, "--gpu", "A100", "--training-config", tc,
            "--fail-on", "never", "--format", "json").json()["models"][0]
    assert m["run"]["trainer"]["value"] == trainer, m["run"]["trainer"]
    assert m["run"]["batch"] == {"value": 8, "source": "default of transformers TrainingArguments "
                                                      "(per_device_train_batch_size 8)"}, m["run"]["batch"]
    assert (m["memory"]["run"]["batch_size"], m["memory"]["run"]["gradient_accumulation_steps"]) == (8, 2)
    assert "batch 8 (x2 accumulation)" in m["memory"]["summary"]


def test_a_run_that_does_not_fit_at_the_trainers_default_batch_names_the_batch_to_set(cli, hub, tmp_path):
    """Where the default batch of 8 does not fit, GD801's way out names the settings it changes (the batch and the
    accumulation, as the checkpointing it turns on), not only a run line with another batch."""
    hub.add("google/gemma-3-12b-it", {"config.json": (EXAMPLES / "google--gemma-3-12b-it" / "config.json").read_bytes()})
    tc = tmp_path / "run.json"
    tc.write_text('{"gradient_accumulation_steps": 2, "bf16": true}')
    m = cli("check", "google/gemma-3-12b-it", "--cache-dir", hub.root, "--gpu", "A100", "--training-config", tc,
            "--format", "json").json()["models"][0]
    found = [f for f in m["findings"] if f["code"] == "GD801"]
    assert len(found) == 1, [f["code"] for f in m["findings"]]
    assert "batch 8 (x2 accumulation)" in found[0]["message"], found[0]["message"]
    assert "per_device_train_batch_size: 2 and gradient_accumulation_steps: 8 (by the default of transformers " \
           "TrainingArguments (per_device_train_batch_size 8))" in found[0]["fix"], found[0]["fix"]
    assert "batch 2 (x8 accumulation)" in found[0]["fix"]


# Each kind of training config as its trainer runs it, on GPUs with and without bf16 and on Apple MPS: (config, GPU,
# the precision that trainer trains in). Issue 32: the precision line said the recommendation's bf16 beside GD609's
# "trains in fp32" for a TrainingArguments config that sets no bf16/fp16.
_KINDS = {
    "TrainingArguments, no switch": ("per_device_train_batch_size: 1\nlora_r: 8\nload_in_4bit: true\n",
                                     {"L4": "fp32", "A100": "fp32", "T4": "fp32"}),
    "TrainingArguments bf16": ("bf16: true\nper_device_train_batch_size: 1\nlora_r: 8\n",
                               {"L4": "bf16", "A100": "bf16", "T4": "bf16"}),
    "TRL SFT, no switch": ("per_device_train_batch_size: 1\nmax_length: 1024\nuse_peft: true\n",
                           {"L4": "bf16", "A100": "bf16", "T4": "bf16"}),
    "axolotl, bf16 unset (auto)": ("base_model: google/gemma-3-1b-it\nadapter: lora\nmicro_batch_size: 1\n"
                                   "sequence_len: 1024\ndatasets:\n  - path: x\n    type: alpaca\n",
                                   {"L4": "bf16", "A100": "bf16", "T4": "bf16", "M3": "fp16"}),
    # A DeepSpeed JSON's precision: `enabled: true` is the run's; `auto` copies TrainingArguments' bf16 (false).
    "TrainingArguments + DeepSpeed bf16": ("per_device_train_batch_size: 1\nlora_r: 8\ndeepspeed: {ds_on}\n",
                                           {"L4": "bf16", "A100": "bf16"}),
    "TrainingArguments + DeepSpeed bf16 auto": ("per_device_train_batch_size: 1\nlora_r: 8\ndeepspeed: {ds_auto}\n",
                                                {"L4": "fp32", "A100": "fp32"}),
    "LLaMA-Factory, no switch": ("stage: sft\nfinetuning_type: lora\nper_device_train_batch_size: 1\ncutoff_len: 1024\n",
                                 {"L4": "fp32", "A100": "fp32"}),
    "LLaMA-Factory pure_bf16": ("stage: sft\nfinetuning_type: lora\npure_bf16: true\nper_device_train_batch_size: 1\n"
                                "cutoff_len: 1024\n", {"L4": "bf16", "A100": "bf16"}),
}


@pytest.mark.parametrize("kind, gpu, precision", [(k, g, p) for k, (_, gpus) in _KINDS.items()
                                                  for g, p in gpus.items()])
def test_the_precision_line_states_the_precision_the_run_trains_in(cli, hub, tmp_path, kind, gpu, precision):
    """The precision line, run.precision and the memory plan's precision are one: the precision the config's trainer
    trains in; where the recommendation differs, the line names it as the cure, and the JSON keeps it apart."""
    hub.add("google/gemma-3-1b-it", {"config.json": gemma3_1b_config()})
    tc = tmp_path / "train.yaml"
    for name, enabled in (("ds_on", True), ("ds_auto", "auto")):
        (tmp_path / f"{name}.json").write_text(json.dumps({"bf16": {"enabled": enabled},
                                                           "zero_optimization": {"stage": 2}}))
    tc.write_text(_KINDS[kind][0].format(ds_on=tmp_path / "ds_on.json", ds_auto=tmp_path / "ds_auto.json"))
    args = ["check", "--cache-dir", hub.root, "--gpu", gpu, "--training-config", tc, "--fail-on", "never"]
    m = cli(*args, "--format", "json").json()["models"][0]
    assert m["run"]["precision"]["value"] == precision, m["run"]["precision"]
    assert m["memory"]["run"]["precision"] == precision
    line = next(ln for ln in cli(*args).out.splitlines() if ln.startswith("  precision "))
    assert line.split()[1].rstrip(":") == precision, line
    recommended = m["recommendation"]["precision"]
    if recommended != precision:
        cure = "set bf16: false and fp16: false" if recommended == "fp32" else f"set {recommended}: true"
        assert f"; recommended {recommended}: {cure} (" in line, line
    else:
        assert "recommended" not in line.split("(")[0], line

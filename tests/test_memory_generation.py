"""A GRPO step's generation in the memory plan (run.Generation, plan/memory._generation): the key/value cache of the
rows TRL's GRPOTrainer generates at once, a colocated vLLM engine, the reference model, TRL's fused LM head.

The cache is held against the cache transformers' own generate() returns on tiny models of each family (every layer
kind, Gemma 3n's and Gemma 4's shared layers, Gemma 4's global head dim and key/value heads, in the Hub's keys and as
transformers 5.23 saves them again); the rows against TRL 1.16's own GRPOConfig and, in one slow test, against the
rows its GRPOTrainer hands generate().
"""

from __future__ import annotations

import json

import pytest

from gemma_doctor import frozen
from gemma_doctor.plan import memory, runplan
from gemma_doctor.run import Generation, Settings

TINY = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
            head_dim=8)


def _configs():
    """(name, config class, kwargs as a Hub config.json writes them) for a tiny model of each family."""
    from transformers import Gemma2Config, Gemma3nTextConfig, Gemma3TextConfig, Gemma4TextConfig, GemmaConfig

    g4 = dict(TINY, num_hidden_layers=6, global_head_dim=16, sliding_window=6, hidden_size_per_layer_input=8,
              vocab_size_per_layer_input=128)
    return [
        ("gemma", GemmaConfig, dict(TINY, num_hidden_layers=3)),
        ("gemma2", Gemma2Config, dict(TINY, num_hidden_layers=4, sliding_window=6)),
        ("gemma3_text", Gemma3TextConfig, dict(TINY, num_hidden_layers=7, sliding_window=6)),
        ("gemma3n_text", Gemma3nTextConfig, dict(TINY, num_hidden_layers=10, sliding_window=6, num_kv_shared_layers=4,
                                                 vocab_size_per_layer_input=128, hidden_size_per_layer_input=8,
                                                 laurel_rank=4, altup_num_inputs=2,
                                                 activation_sparsity_pattern=[0.0] * 10)),
        ("gemma4_text-shared", Gemma4TextConfig, dict(g4, num_hidden_layers=12, num_kv_shared_layers=4)),
        ("gemma4_text-k-eq-v", Gemma4TextConfig, dict(g4, attention_k_eq_v=True, num_global_key_value_heads=1)),
    ]


def _measured(model, rows: int, prompt: int, new: int) -> tuple[int, int]:
    """Bytes of keys and values generate() returns for ``rows`` sequences of prompt + new tokens, and the bytes of one
    token of every caching layer (what transformers 5.23 leaves out: the last token is never fed back)."""
    import torch

    ids = torch.randint(5, 100, (rows, prompt))
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                         do_sample=False, return_dict_in_generate=True, pad_token_id=0)
    assert out.sequences.shape == (rows, prompt + new)
    held = one = 0
    for layer in out.past_key_values.layers:
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if not isinstance(keys, torch.Tensor):
            continue  # a shared layer: no cache of its own
        held += keys.numel() * keys.element_size() + values.numel() * values.element_size()
        one += 2 * keys.shape[0] * keys.shape[1] * keys.shape[3] * keys.element_size()
    return held, one


@pytest.mark.parametrize("saved", ["hub", "resaved"])
def test_the_planned_cache_is_the_one_generate_holds_for_every_family(saved):
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    for name, cls, kwargs in _configs():
        config = cls(**kwargs)
        model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16).eval()
        # the Hub's keys (layer_types left to the class's default pattern), or the config as transformers saves it
        text = {**kwargs, "model_type": name.split("-")[0]} if saved == "hub" else config.to_dict()
        shape = memory.shape_from_config(text)
        for prompt, new in ((3, 2), (5, 10)):  # inside every sliding window, and beyond it
            held, one = _measured(model, 3, prompt, new)
            planned = memory.kv_cache_bytes(shape, 3, prompt + new, 2)
            assert planned == held + one, (name, saved, prompt, new, planned, held, one)


def test_published_shapes_know_their_sliding_and_shared_layers():
    g3 = memory.published_shape("gemma3", "12b")
    assert len(g3.kv_layers) == 48 and sum(1 for _, _, w in g3.kv_layers if w == 1024) == 40
    e2b = memory.published_shape("gemma4", "e2b")
    assert len(e2b.kv_layers) == 35 - 20  # the last 20 share the caches of the others
    assert {(k, d) for k, d, w in e2b.kv_layers if w == 0} == {(1, 512)}  # global head dim 512
    big = memory.published_shape("gemma4", "31b")
    assert {(k, d) for k, d, w in big.kv_layers if w == 0} == {(4, 512)}  # attention_k_eq_v: 4 global key/value heads


@pytest.mark.parametrize("kwargs", [dict(per_device_train_batch_size=4, gradient_accumulation_steps=3),
                                    dict(per_device_train_batch_size=2, gradient_accumulation_steps=2,
                                         steps_per_generation=4),
                                    dict(per_device_train_batch_size=4, generation_batch_size=16)])
def test_the_rows_are_grpoconfigs_generation_batch(kwargs, tmp_path):
    from trl import GRPOConfig

    args = GRPOConfig(output_dir=str(tmp_path), num_generations=4, use_cpu=True, report_to=[], **kwargs)
    gen = Generation(steps=kwargs.get("steps_per_generation"), batch=kwargs.get("generation_batch_size"))
    assert gen.rows(args.per_device_train_batch_size, args.gradient_accumulation_steps, 1) == args.generation_batch_size


@pytest.mark.slow
def test_grpotrainer_generates_its_whole_generation_batch_in_one_call(tmp_path):
    """TRL 1.16's GRPOTrainer, one step on a tiny model: generate() is called once, with every row of the generation
    batch, grown by the completion (the rows and the length the plan's cache counts)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, Gemma3TextConfig
    from trl import GRPOConfig, GRPOTrainer

    from gemma_doctor.rehearse.twin import synthetic_tokenizer

    torch.manual_seed(0)
    config = Gemma3TextConfig(**dict(TINY, vocab_size=512, num_hidden_layers=2))
    model = AutoModelForCausalLM.from_config(config)
    for name, data in synthetic_tokenizer(config.to_dict(), 512).items():
        (tmp_path / name).write_bytes(data)
    seen = []
    generate = model.generate

    def counted(*args, **kwargs):
        out = generate(*args, **kwargs)
        seen.append((tuple(kwargs["input_ids"].shape), tuple(out.shape)))
        return out

    model.generate = counted
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, gradient_accumulation_steps=3,
                      num_generations=2, max_completion_length=6, max_steps=1, use_cpu=True, report_to=[],
                      save_strategy="no", logging_steps=1)
    rows = Dataset.from_list([{"prompt": f"Say {i} please"} for i in range(16)])
    GRPOTrainer(model=model, reward_funcs=lambda completions, **_: [float(len(c)) for c in completions], args=args,
                train_dataset=rows, processing_class=AutoTokenizer.from_pretrained(tmp_path)).train()
    assert len(seen) == 1
    (asked, prompt), (got, length) = seen[0]
    assert asked == got == Generation().rows(2, 3, 1) == 6
    assert length == prompt + 6  # min_new_tokens is not set: a completion may end early, never later


def _grpo(shape, gen: Generation, *, method="lora", gpu=80 * 2**30, **settings):
    run = Settings(method=method, precision="bf16", load_dtype="bfloat16", batch_size=4, gradient_accumulation_steps=4,
                   seq_len=1536, gradient_checkpointing=True, task="grpo", generation=gen, **settings)
    return memory._plan(shape, run, gpu)


def test_the_generation_moment_holds_the_rows_cache_and_is_the_peak_where_it_is_larger():
    shape = memory.published_shape("gemma3", "12b")
    made = _grpo(shape, Generation(completion=1024))
    moment = made.phases["generation"]
    assert moment["kv_cache"] == memory.kv_cache_bytes(shape, 16, 1536, 2)  # 4 x 4 accumulation rows, bf16
    assert "gradients" not in moment and moment["weights"] == made.phases["loss"]["weights"]
    many = _grpo(shape, Generation(completion=1024, batch=256))
    assert many.peak == "generation" and many.components["kv_cache"] == memory.kv_cache_bytes(shape, 256, 1536, 2)
    assert any("256 sequences" in a for a in many.assumptions)
    # QLoRA computes in fp32 (prepare_model_for_kbit_training): its cache too
    q = _grpo(shape, Generation(completion=1024), method="qlora", quant_bits=4)
    assert q.phases["generation"]["kv_cache"] == memory.kv_cache_bytes(shape, 16, 1536, 4)


def test_a_colocated_vllm_engine_takes_its_share_of_the_gpu_and_a_server_nothing_here():
    shape = memory.published_shape("gemma3", "4b")
    gpu = 80 * 2**30
    always = _grpo(shape, Generation(engine="vllm-colocate", share=0.3), gpu=gpu)
    assert all(m["vllm_engine"] == int(0.3 * gpu) for m in always.phases.values())
    assert "kv_cache" not in always.phases.get("generation", {})
    asleep = _grpo(shape, Generation(engine="vllm-colocate", share=0.5, sleep=True), gpu=gpu)
    assert asleep.phases["generation"]["vllm_engine"] == int(0.5 * gpu)
    assert not any("vllm_engine" in m for k, m in asleep.phases.items() if k != "generation")
    server = _grpo(shape, Generation(engine="vllm-server"), gpu=gpu)
    assert "generation" not in server.phases and any("vLLM server" in a for a in server.assumptions)
    plain = _grpo(shape, Generation(), gpu=gpu)
    assert always.per_gpu_bytes - plain.per_gpu_bytes >= int(0.3 * gpu) * 0.9


def test_a_kl_term_loads_a_reference_model_for_full_fine_tuning_only():
    shape = memory.published_shape("gemma3", "1b")
    base = _grpo(shape, Generation(beta=0.0), method="full")
    kl = _grpo(shape, Generation(beta=0.04), method="full")
    assert kl.phases["loss"]["weights"] - base.phases["loss"]["weights"] == shape.params.text * 2
    assert _grpo(shape, Generation(beta=0.04)).phases["loss"]["weights"] == _grpo(shape, Generation()).phases["loss"]["weights"]


GRPO_YAML = ("bf16: true\nper_device_train_batch_size: 4\ngradient_accumulation_steps: 4\nnum_generations: 8\n"
             "max_completion_length: 1024\nuse_peft: true\nlora_target_modules: '.*language_model.*[.](q|k|v|o)_proj'\n"
             "dtype: bfloat16\n")


def _check(cli, tmp_path, yaml: str, *more: str) -> dict:
    folder = tmp_path / "google--gemma-3-12b-it"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**memory.published_config("gemma3", "12b"),
                                                    "architectures": ["Gemma3ForConditionalGeneration"]}))
    config = tmp_path / "grpo.yaml"
    config.write_text(yaml)
    got = cli("check", folder, "--training-config", config, "--gpu", "A100-80GB", "--format", "json", *more)
    return got.json()["models"][0]


def test_check_plans_a_grpo_configs_generation_with_its_keys_as_sources(cli, tmp_path):
    model = _check(cli, tmp_path, GRPO_YAML)
    run = model["memory"]["run"]
    assert run["generation"]["max_completion_length"] == 1024 and run["generation"]["engine"] == "transformers"
    assert run["sources"]["generation"].startswith("training config max_completion_length")
    # no prompt length in a GRPOConfig: the sequence is an assumed prompt and the completion, said so
    assert run["seq_len"] == runplan.GRPO_PROMPT + 1024 and "max_completion_length 1024" in run["sources"]["seq_len"]
    assert any("GRPO generation" in a and "16 sequences" in a for a in model["memory"]["assumptions"])
    # TRL >= 1.15's GRPOTrainer computes log-probs through the fused LM head: no b*s*V logits
    assert run["chunked_loss"] is True and "GRPOTrainer" in run["sources"]["chunked_loss"]
    # 16 rows of 1,536 tokens: the generation is this run's peak
    assert model["memory"]["peak"] == "generation"
    assert model["memory"]["components"]["kv_cache"] == memory.kv_cache_bytes(
        memory.shape_from_config(memory.published_config("gemma3", "12b")), 16, 1536, 2)


def test_check_plans_a_colocated_vllm_engine_from_the_config(cli, tmp_path):
    model = _check(cli, tmp_path, GRPO_YAML + "use_vllm: true\nvllm_gpu_memory_utilization: 0.4\n")
    assert model["memory"]["components"]["vllm_engine"] == int(0.4 * model["memory"]["gpu_bytes"])
    assert model["memory"]["run"]["generation"]["engine"] == "vllm-colocate"


def test_the_generation_is_part_of_the_plans_identity():
    shape = memory.published_shape("gemma3", "1b")
    run = Settings(task="grpo", generation=Generation())
    assert memory.plan(shape, run).phases["generation"]["kv_cache"] * 64 == memory.plan(
        shape, frozen.replace(run, generation=Generation(batch=512))).phases["generation"]["kv_cache"]


@pytest.mark.parametrize("line", ["max_completion_length: 99999999999999999999999999999", "generation_batch_size: 1e300",
                                  "vllm_gpu_memory_utilization: 1e400", "beta: .nan", "max_completion_length: true",
                                  "steps_per_generation: -3", "use_vllm: maybe", "generation_batch_size: " + "7" * 5000])
def test_a_hostile_generation_key_is_a_finding_or_a_default_never_a_traceback(cli, tmp_path, line):
    model = _check(cli, tmp_path, "num_generations: 8\n" + line + "\n")
    if "9999" in line:  # past any real run: refused as the batch and the sequence are
        assert any(f["code"] == "GD601" and "beyond any real run" in f["message"] for f in model["findings"])
        return
    if "7777" in line:  # past what Python converts: not YAML it can read
        assert any(f["code"] == "GD601" and "digits" in f["message"] for f in model["findings"])
        return
    gen = model["memory"]["run"]["generation"]
    assert 0 < gen["max_completion_length"] <= 1 << 27 and gen["beta"] == 0.0 and gen["engine"] == "transformers"


@pytest.mark.parametrize("gpu", [("L4",), ("A100-80GB", "--batch-size", "32", "--seq-len", "4096")])
def test_a_grpo_prescription_states_its_completion_and_check_of_it_plans_the_same_run(cli, tmp_path, gpu):
    """recommend --task grpo: axolotl's YAML states trl.max_completion_length (axolotl hands GRPOConfig None where
    unset) and the TRL snippet max_completion_length (GRPOConfig has no max_length: a TypeError before); check of the
    YAML plans the very run, its generation too (the second point's peak)."""
    from trl import GRPOConfig

    got = cli("recommend", "--family", "gemma3", "--size", "4b", "--gpu", *gpu, "--task", "grpo", "--format", "json")
    rec = got.json()["models"][0]
    assert rec["status"] == "prescribed"
    gen = rec["memory"]["run"]["generation"]
    config = rec["recommendation"]["frameworks"]["trl"]["config"]
    assert config["max_completion_length"] == gen["max_completion_length"] and "max_length" not in config
    GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, **{k: v for k, v in config.items() if k != "tf32"})
    yaml = tmp_path / "grpo.yaml"
    yaml.write_text(rec["snippets"]["yaml"])
    assert f"trl: {{max_completion_length: {gen['max_completion_length']}}}" in yaml.read_text()
    folder = tmp_path / "google--gemma-3-4b-it"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**memory.published_config("gemma3", "4b"),
                                                    "architectures": ["Gemma3ForConditionalGeneration"]}))
    checked = cli("check", folder, "--training-config", yaml, "--gpu", gpu[0], "--fail-on", "warning", "--format", "json")
    assert checked.code == 0, checked.out[-2000:]
    memory_of = checked.json()["models"][0]["memory"]
    assert memory_of["summary"] == rec["memory"]["summary"] and memory_of["peak"] == rec["memory"]["peak"]
    assert memory_of["run"]["generation"] == gen


# Generation batches TRL 1.16's GRPOConfig accepts or refuses (per-device batch, accumulation, steps_per_generation,
# generation_batch_size, num_generations), one process: its __post_init__ is the judge.
_BATCHES = [(1, 1, None, None, 8), (3, 1, None, None, 8), (2, 4, None, None, 8), (1, 8, None, None, 8),
            (1, 1, None, None, 2), (2, 1, None, None, 2), (4, 1, 3, None, 4), (4, 1, 2, None, 4),
            (4, 1, None, 12, 4), (4, 1, None, 6, 2), (4, 1, None, 16, 8), (3, 2, None, None, 1), (2, 1, 2, 4, 2)]


@pytest.mark.parametrize("batch,accumulation,steps,total,groups", _BATCHES)
def test_a_generation_batch_is_refused_exactly_where_grpoconfig_refuses_it(batch, accumulation, steps, total, groups,
                                                                            tmp_path):
    """Generation.indivisible against GRPOConfig's own ValueError: `recommend --task grpo --batch-size 1` prescribed
    batch 1 x 1 accumulation, a generation batch of 1 that TRL refuses (num_generations 8)."""
    from trl import GRPOConfig

    kwargs = dict(per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation, num_generations=groups)
    kwargs.update({k: v for k, v in (("steps_per_generation", steps), ("generation_batch_size", total)) if v})
    try:
        GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[], **kwargs)
        refused = None
    except ValueError as e:
        refused = str(e)
    why = Generation(steps=steps, batch=total, groups=groups).indivisible(batch, accumulation, 1)
    assert (why is None) == (refused is None), (why, refused)


def test_check_of_a_grpo_config_trl_refuses_is_gd664(cli, tmp_path):
    config = GRPO_YAML.replace("per_device_train_batch_size: 4\ngradient_accumulation_steps: 4\n",
                               "per_device_train_batch_size: 3\ngradient_accumulation_steps: 1\n")
    flagged = [f for f in _check(cli, tmp_path, config)["findings"] if f["code"] == "GD664"]
    assert [f["severity"] for f in flagged] == ["error"] and "(3) must be divisible by num_generations (8)" in \
        flagged[0]["message"]
    assert not [f for f in _check(cli, tmp_path, GRPO_YAML)["findings"] if f["code"] == "GD664"]


@pytest.mark.parametrize("fixed", [("--batch-size", "1"), ("--batch-size", "3"), ("--batch-size", "5", "--num-gpus", "2")])
def test_recommend_never_prescribes_a_grpo_batch_trl_refuses(cli, tmp_path, fixed):
    """Gemma 3 4B on an H100: a fixed batch whose generation batch is no multiple of num_generations was prescribed
    (batch 1, no accumulation: GRPOConfig's ValueError at start-up)."""
    from trl import GRPOConfig

    got = cli("recommend", "--family", "gemma3", "--size", "4b", "--gpu", "H100", "--task", "grpo", "--format", "json",
              *fixed)
    rec = got.json()["models"][0]
    if rec["prescription"] is None:
        assert got.code == 1 and rec["way_out"]
        return
    config = rec["recommendation"]["frameworks"]["trl"]["config"]
    if "--num-gpus" not in fixed:  # GRPOConfig's world size is this process's
        GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, **{k: v for k, v in config.items() if k != "tf32"})
    p = rec["prescription"]
    n = int(fixed[fixed.index("--num-gpus") + 1]) if "--num-gpus" in fixed else 1
    assert p["batch_size"] * p["gradient_accumulation_steps"] * n % 8 == 0


def test_a_config_naming_no_task_is_read_as_the_grpo_run_task_grpo_says(cli, tmp_path):
    """`check --task grpo` of a GRPOConfig YAML writing none of GRPO_ONLY_KEYS (use_vllm, max_completion_length,
    vllm_enable_sleep_mode, beta): every key was dropped and TRL's defaults planned (generate() in the process, 512)."""
    model = _check(cli, tmp_path, "bf16: true\nper_device_train_batch_size: 4\ngradient_accumulation_steps: 2\n"
                                  "use_peft: true\ndtype: bfloat16\nmax_completion_length: 1024\nuse_vllm: true\n"
                                  "vllm_enable_sleep_mode: true\nbeta: 0.04\n", "--task", "grpo")
    gen = model["memory"]["run"]["generation"]
    assert (gen["max_completion_length"], gen["engine"], gen["vllm_enable_sleep_mode"], gen["beta"]) == \
        (1024, "vllm-colocate", True, 0.04)
    assert "vllm_engine" in model["memory"]["components"] or any("vLLM" in a for a in model["memory"]["assumptions"])


@pytest.mark.parametrize("options, whole", [(("--gpu", "L4", "--batch-size", "4"), 8),
                                            (("--gpu", "H100", "--num-gpus", "2", "--batch-size", "1"), 4),
                                            (("--gpu", "A100-80GB", "--num-gpus", "4", "--batch-size", "3"), 4)])
def test_a_grpo_batch_trl_refuses_has_a_way_out_run_that_holds_when_followed(cli, options, whole):
    """GD664's way out was its fix text alone; now also the run the command line with the whole batch prescribes
    (Generation.whole_batch: the smallest per-process batch from the user's up whose generation batch holds whole
    groups of num_generations over the processes), and following it prescribes exactly that run."""
    base = ("recommend", "--family", "gemma3", "--size", "4b", "--task", "grpo", "--format", "json", *options)
    m = cli(*base).json()["models"][0]
    assert m["status"] != "prescribed"
    line = next(w for w in m["way_out"] if w.startswith(f"--batch-size {whole} (GD664): "))
    followed = cli(*base[:-2], "--batch-size", str(whole)).json()["models"][0]
    assert followed["status"] == "prescribed" and line.endswith(followed["memory"]["summary"])


def test_the_whole_batch_is_the_smallest_trl_accepts():
    from trl import GRPOConfig

    for groups in (2, 4, 6, 8):
        for n in (1, 2, 3, 4):
            for per in range(1, 13):
                whole = Generation(groups=groups).whole_batch(per, 1, n)
                assert whole >= per and (whole * n) % groups == 0
                assert all((b * n) % groups for b in range(per, whole))  # none smaller from the user's up
    assert Generation(batch=16).whole_batch(4, 1, 1) is None and Generation(steps=2).whole_batch(4, 1, 1) is None
    args = GRPOConfig(output_dir="/tmp/unused", use_cpu=True, report_to=[], num_generations=8,
                      per_device_train_batch_size=Generation().whole_batch(3, 1, 1))
    assert args.generation_batch_size % 8 == 0


def test_numbers_written_as_strings_are_read_as_trls_parser_reads_them(tmp_path, cli):
    """TRL's parser hands a config's values to argparse, whose float type converts a string (TRL 1.16.0's TrlParser:
    beta '0.04' -> 0.04, vllm_gpu_memory_utilization '0.5' -> 0.5): the plan read them as absent (beta 0: no reference
    model for a full fine-tuning that loads one)."""
    from trl import GRPOConfig, TrlParser

    yaml = "num_generations: 8\nbeta: '0.04'\nuse_vllm: true\nvllm_gpu_memory_utilization: '0.5'\n"
    config = tmp_path / "trl.yaml"
    config.write_text(yaml + f"output_dir: {tmp_path / 'out'}\nuse_cpu: true\nbf16: false\n")
    (args,) = TrlParser((GRPOConfig,)).parse_args_and_config(args=["--config", str(config)])[:1]
    gen = _check(cli, tmp_path, yaml)["memory"]["run"]["generation"]
    assert (gen["beta"], gen["vllm_gpu_memory_utilization"]) == (args.beta, args.vllm_gpu_memory_utilization) == (0.04, 0.5)

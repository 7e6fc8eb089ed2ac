"""One prescription (issue 20): what `recommend` prescribes passes `check` with the same inputs, or there is none and
a way out; every view says the same run. The grid and its judge are benchmarks/prescription_grid.py's."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import prescription_grid as grid  # noqa: E402

sys.path.pop(0)
G3, G4 = "google/gemma-3-12b-it", "google/gemma-4-E2B-it"


def _runner(cli):
    def run(*args: str) -> tuple[int, str, str]:
        r = cli(*args)
        return r.code, r.out, r.err
    return run


# --- the property, on the grid -------------------------------------------------------------------------------------

@pytest.mark.parametrize("model", grid.EXAMPLES)
@pytest.mark.parametrize("gpu", grid.GPUS)
def test_every_prescription_passes_its_own_check_or_there_is_none_and_a_way_out(cli, examples, tmp_path, model, gpu):
    outcomes = [grid.judge_point(_runner(cli), p, tmp_path) for p in grid.example_points(examples, (model,), (gpu,))]
    assert len(outcomes) == len(grid.VERSIONS) * len(grid.TASKS)
    violations = [f"{o.point.transformers} {o.point.task}: {o.detail}" for o in outcomes if o.kind == "violation"]
    assert not violations, "\n".join(violations)


def test_the_grid_prescribes_where_a_run_exists(cli, examples, tmp_path):
    """Not an empty promise: on GPUs where the run fits and no window bites, there is a prescription."""
    points = grid.example_points(examples, (G3, G4), ("A100", "H100"), ("5.23.0",), ("sft", "qlora", "dpo"))
    kinds = [grid.judge_point(_runner(cli), p, tmp_path).kind for p in points]
    assert kinds == ["prescribed"] * len(points)


FAMILY_SIZES = [("gemma", "2b"), ("gemma", "7b"), ("gemma2", "2b"), ("gemma2", "9b"), ("gemma2", "27b"), ("gemma3", "1b"),
                ("gemma3", "4b"), ("gemma3", "12b"), ("gemma3", "27b"), ("gemma4", "e2b"), ("gemma4", "e4b"),
                ("gemma4", "31b"), ("gemma4", "26b-a4b")]


@pytest.mark.parametrize("family, size", FAMILY_SIZES)
def test_published_sizes_prescriptions_pass_check_on_their_published_config(cli, hub, tmp_path, family, size):
    """A --family plan is judged on the published config: the same config, cached, passes check with its YAML."""
    from gemma_doctor.plan import advice

    facts = advice.planned_facts(family, size, "org/planned")
    hub.add("org/planned", {"config.json": facts.config.data})
    bad = []
    for gpu in ("T4", "L4", "A100-80GB"):
        for version in ("4.50.3", "5.5.1", "5.23.0"):
            for task in ("sft", "qlora", "dpo"):
                p = grid.Point(("--family", family, "--size", size, "--cache-dir", str(hub.root)),
                               ("org/planned", "--cache-dir", str(hub.root)), gpu, version, task)
                o = grid.judge_point(_runner(cli), p, tmp_path)
                if o.kind == "violation":
                    bad.append(f"{gpu} {version} {task}: {o.detail}")
    assert not bad, "\n".join(bad)


def test_a_sample_of_one_to_eight_gpus_on_the_gpu_table_passes_its_own_check(cli, examples, tmp_path):
    """The grid's GPU counts are 1-8 on every GPU of the table, the search's method and full fine-tuning (ZeRO / FSDP
    sharding on odd counts too): a fixed sample here, the whole (1,440 points) in benchmarks/prescription_grid.py."""
    points = grid.gpu_count_points(examples)
    sample = points[::61]
    counts = {p.extra[1] for p in sample}
    assert counts == {str(n) for n in grid.GPU_COUNTS} and any("full" in p.extra for p in sample)
    assert len({p.gpu for p in sample}) >= 15
    bad = [f"{o.point.target[0]} {o.point.gpu} {' '.join(o.point.extra)}: {o.detail}"
           for o in (grid.judge_point(_runner(cli), p, tmp_path) for p in sample) if o.kind == "violation"]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("extra", [("--method", "full", "--num-gpus", "8"), ("--method", "lora", "--batch-size", "4", "--seq-len", "2048"),
                                   ("--seq-len", "4096"), ("--gradient-checkpointing",), ("--method", "qlora", "--batch-size", "16")],
                         ids=["full-8gpus", "lora-b4-s2048", "s4096", "ckpt", "qlora-b16"])
def test_fixed_choices_stay_fixed_and_the_prescription_still_passes(cli, examples, tmp_path, extra):
    for model in (G3, G4):
        for gpu in ("A100", "H100", "L4"):
            p = grid.Point((model, "--cache-dir", str(examples)), (model, "--cache-dir", str(examples)), gpu, "5.23.0",
                           "sft", extra)
            o = grid.judge_point(_runner(cli), p, tmp_path)
            assert o.kind != "violation", (model, gpu, o.detail)


# --- the defects of issue 20, each shown on 2df619a ----------------------------------------------------------------

def _rec(cli, *args: str) -> tuple[int, dict]:
    r = cli("recommend", *args, "--format", "json")
    assert r.code in (0, 1), r
    return r.code, r.json()["models"][0]


def test_yaml_is_one_document_that_check_reads(cli, examples):
    r = cli("recommend", G3, "--cache-dir", examples, "--gpu", "A100", "--format", "yaml")
    docs = list(yaml.safe_load_all(r.out))
    assert len(docs) == 1 and docs[0]["base_model"] == G3  # was two documents: GD601 "found another document"


def test_gemma4_e2b_on_5_5_1_gets_no_axolotl_prescription_gd107_blocks_it(cli, examples, tmp_path):
    """The prescription was the axolotl YAML with `use_cache: true`: axolotl has no such key and switches the cache
    off whatever its config says (check_model_config, 0.19.0), so the run it prescribed trained the wrong loss
    (GD107). Now no prescription, the way out transformers>=5.5.2; the nearest run's Python keeps the cache on."""
    code, m = _rec(cli, G4, "--cache-dir", examples, "--gpu", "L4", "--with", "transformers==5.5.1")
    assert code == 1 and m["prescription"] is None
    assert any('"transformers>=5.5.2"' in w for w in m["way_out"]), m["way_out"]
    assert [b.split(":")[0] for b in m["blocking"]] == ["GD107"], m["blocking"]


def test_a_gemma4_family_plan_on_5_5_1_is_not_prescribed_use_cache_off(cli):
    """It set use_cache=False on every sub-config: the KV sharing then breaks (GD107). Under axolotl nothing keeps the
    cache on (above): no prescription on 5.5.1, the way out transformers>=5.5.2, where the cache goes off again."""
    code, m = _rec(cli, "--family", "gemma4", "--gpu", "A100", "--with", "transformers==5.5.1")
    assert code == 1 and m["prescription"] is None and any("transformers>=5.5.2" in w for w in m["way_out"])
    code, m = _rec(cli, "--family", "gemma4", "--gpu", "A100", "--with", "transformers==5.5.2")
    assert code == 0 and "sub_config.use_cache = False" in m["snippets"]["python"]["loading"]


def test_gpu_memory_is_what_the_device_reports(cli):
    from gemma_doctor import gpus

    assert gpus.parse_gpu_spec("T4").memory_bytes == 15_360 * 2**20  # not 16 GiB
    code, m = _rec(cli, "--family", "gemma3", "--size", "12b", "--gpu", "T4")
    assert m["memory"]["gpu_bytes"] == 15_360 * 2**20
    assert any("15,360 MiB" in a for a in m["memory"]["assumptions"])


def test_no_prescription_is_ever_one_its_own_memory_line_calls_does_not_fit(cli, examples):
    for model in (G3, G4):
        for gpu in grid.GPUS:
            code, m = _rec(cli, model, "--cache-dir", examples, "--gpu", gpu)
            if m["prescription"] is not None:
                assert m["memory"]["verdict"] == "fits", (model, gpu, m["memory"]["summary"])


def test_gemma3_on_5_5_1_has_no_prescription_that_leaves_gd105_and_says_the_way_out(cli, examples):
    code, m = _rec(cli, G3, "--cache-dir", examples, "--gpu", "A100", "--with", "transformers==5.5.1")
    assert code == 1 and m["prescription"] is None
    assert any(w.startswith("GD105:") and "transformers>=5.6.0" in w for w in m["way_out"])
    assert any(b.startswith("GD105") for b in m["blocking"])


def test_where_accumulating_is_refused_the_prescription_drops_it_and_says_so(cli, examples, tmp_path):
    """GD739 (transformers 4.50-4.56 scale Gemma 3's multimodal loss by the accumulation steps) refuses every run that
    accumulates: the search then prescribes the same run without accumulation (a smaller effective batch) and says why,
    instead of "none"; the YAML passes check on the same GPU and stack. From 4.57.1 the run accumulates again."""
    code, m = _rec(cli, G3, "--cache-dir", examples, "--gpu", "A100", "--with", "transformers==4.51.0")
    assert code == 0 and m["prescription"]["gradient_accumulation_steps"] == 1, m["way_out"]
    assert any(n.startswith("no gradient accumulation") and "GD739" in n for n in m["recommendation"]["notes"])
    r = cli("recommend", G3, "--cache-dir", examples, "--gpu", "A100", "--with", "transformers==4.51.0",
            "--format", "yaml")
    (tmp_path / "run.yaml").write_text(r.out)
    c = cli("check", G3, "--cache-dir", examples, "--gpu", "A100", "--with", "transformers==4.51.0",
            "--training-config", tmp_path / "run.yaml", "--format", "json", "--fail-on", "warning")
    assert c.code == 0, [f["code"] for f in c.json()["models"][0]["findings"]]
    code, m = _rec(cli, G3, "--cache-dir", examples, "--gpu", "A100", "--with", "transformers==4.57.1")
    assert code == 0 and m["prescription"]["gradient_accumulation_steps"] > 1
    assert not any(n.startswith("no gradient accumulation") for n in m["recommendation"]["notes"])


def test_headline_snippets_yaml_and_json_say_the_same_checkpointing(cli, examples):
    """The headline said gradient checkpointing, the snippet dropped it (Gemma 4 on an H100)."""
    for gpu in ("H100", "L4", "T4"):
        code, m = _rec(cli, G4, "--cache-dir", examples, "--gpu", gpu, "--task", "dpo")
        if m["prescription"] is None:
            continue
        ckpt = m["prescription"]["gradient_checkpointing"]
        args = m["recommendation"]["frameworks"]["transformers"]["training_arguments"]
        assert bool(args.get("gradient_checkpointing") or args.get("activation_checkpointing")) is ckpt
        assert ("gradient checkpointing" in m["recommendation"]["summary"]) is ckpt
        assert yaml.safe_load(m["snippets"]["yaml"])["gradient_checkpointing"] is ckpt


def test_full_fine_tuning_on_8_gpus_shards_before_changing_the_method(cli, examples):
    code, m = _rec(cli, G3, "--cache-dir", examples, "--gpu", "H100", "--method", "full", "--num-gpus", "8")
    p = m["prescription"]
    # it said "would fit as LoRA"; ZeRO-2 (gradients and optimizer states sharded) is preferred to ZeRO-3 when it fits
    assert code == 0 and p["method"] == "full" and p["num_gpus"] == 8 and p["zero_stage"] in (2, 3)
    assert yaml.safe_load(m["snippets"]["yaml"])["deepspeed"].startswith(f"deepspeed_configs/zero{p['zero_stage']}")


@pytest.mark.parametrize("model, args", [(G3, ("--gpu", "H100", "--method", "full", "--num-gpus", "8")),  # ZeRO-2
                                         (G3, ("--gpu", "A100", "--method", "full", "--num-gpus", "8"))])  # ZeRO-3
def test_the_prescribed_deepspeed_file_is_one_axolotl_ships_and_check_reads_its_stage(cli, examples, tmp_path, model,
                                                                                      args):
    """Issue 32: the YAML named deepspeed_configs/zero2_bf16.json / zero3_fp16.json, files axolotl's repository does not
    ship (`axolotl fetch deepspeed_configs` has zero1/zero2/zero3.json and zero3_bf16*.json), and check read no stage
    of it. Now a file axolotl ships, whose stage check reads back by its name: the Run's DeepSpeed stage is the
    prescription's (axolotl's zero2.json offloads the optimizer to the CPU: the Run says so too)."""
    from gemma_doctor.readers.training_config import AXOLOTL_DEEPSPEED_FILES

    code, m = _rec(cli, model, "--cache-dir", examples, *args)
    p = m["prescription"]
    if p is None or p["num_gpus"] < 2 or not p["zero_stage"]:
        pytest.skip("no sharded prescription here")
    text = m["snippets"]["yaml"]
    name = Path(yaml.safe_load(text)["deepspeed"]).name
    assert name in AXOLOTL_DEEPSPEED_FILES and AXOLOTL_DEEPSPEED_FILES[name]["zero_stage"] == p["zero_stage"], text
    path = tmp_path / "ax.yaml"
    path.write_text(text)
    r = cli("check", model, "--cache-dir", examples, "--training-config", path, *args[:2], "--format", "json",
            "--fail-on", "never")
    stage = r.json()["models"][0]["run"]["distributed"]["zero_stage"]
    assert (stage["value"], stage["source"]) == (p["zero_stage"], f"training config deepspeed (axolotl's "
                                                                   f"deepspeed_configs/{name}: zero_optimization.stage)")
    offload = r.json()["models"][0]["run"]["distributed"]["offload_optimizer"]
    assert (offload or {}).get("value") == AXOLOTL_DEEPSPEED_FILES[name].get("offload_optimizer")


def test_a_fixed_batch_that_does_not_fit_keeps_the_effective_batch(cli, examples):
    code, m = _rec(cli, G3, "--cache-dir", examples, "--gpu", "A100", "--method", "lora", "--batch-size", "4",
                   "--seq-len", "2048")
    p = m["prescription"]
    assert code == 0 and p["method"] == "lora" and p["seq_len"] == 2048
    assert p["batch_size"] * p["gradient_accumulation_steps"] == 4 and p["batch_size"] < 4
    # The relaxation is named (it read "batch size 2 (option)", with no word why).
    assert m["memory"]["run"]["sources"]["batch_size"] == "relaxed from --batch-size 4"
    assert any(n.startswith("--batch-size 4 (your choice) cannot pass check here") and "does not fit" in n
               for n in m["recommendation"]["notes"])


@pytest.mark.parametrize("gpu", ["none", "H100"])
def test_a_batch_the_user_chose_is_kept_where_nothing_limits_it(cli, examples, gpu):
    """--batch-size 4 became 2 x 2 (or 1 x 4) also with --gpu none, where no GPU's memory limits anything: the choice
    is kept, or there is no prescription and the answer says why; never silently another batch."""
    code, m = _rec(cli, G3, "--cache-dir", examples, "--gpu", gpu, "--method", "lora", "--batch-size", "4")
    if m["prescription"] is not None:
        assert m["prescription"]["batch_size"] == 4
        assert m["memory"]["run"]["sources"]["batch_size"] == "option"
    else:
        assert code == 1 and m["way_out"] and m["blocking"]


def test_nothing_fits_a_named_gpu_is_an_error(cli, examples):
    r = cli("check", G3, "--cache-dir", examples, "--gpu", "RTX 3060", "--format", "json")
    found = {f["code"]: f for f in r.json()["models"][0]["findings"]}
    assert r.code == 1 and found["GD803"]["severity"] == "error"  # was a warning: OK, exit 0


@pytest.mark.parametrize("size", ["E2B", "E4B", "31B", "26B-A4B"])
def test_gemma4_published_sizes_are_known(cli, size):
    code, m = _rec(cli, "--family", "gemma4", "--size", size, "--gpu", "H100")
    assert m["memory"]["model"]["source"].startswith("published config of gemma4")


def test_snippets_use_no_argument_the_transformers_named_deprecates(cli, examples):
    """transformers 5.23 renamed gradient_checkpointing(_kwargs) to activation_checkpointing(_kwargs) (FutureWarning)."""
    from transformers import TrainingArguments

    code, m = _rec(cli, G3, "--cache-dir", examples, "--gpu", "A100", "--with", "transformers==5.23.0")
    args = m["recommendation"]["frameworks"]["transformers"]["training_arguments"]
    assert args["activation_checkpointing"] is True and "gradient_checkpointing" not in args
    args = {k: v for k, v in args.items() if k not in ("tf32",)}  # tf32 needs an Ampere GPU to construct
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        TrainingArguments(output_dir="out", use_cpu=True, **{k: v for k, v in args.items() if k != "bf16"})
    code, m = _rec(cli, G3, "--cache-dir", examples, "--gpu", "A100", "--with", "transformers==5.22.0")
    assert m["recommendation"]["frameworks"]["transformers"]["training_arguments"]["gradient_checkpointing"] is True


def test_the_memory_line_is_printed_once(cli, examples):
    r = cli("recommend", G3, "--cache-dir", examples, "--gpu", "A100")
    summary = json.loads(cli("recommend", G3, "--cache-dir", examples, "--gpu", "A100", "--format", "json").out)[
        "models"][0]["memory"]["summary"]
    assert r.out.count(summary.split(":")[0]) == 1, r.out


def test_check_shows_the_same_prescription_as_recommend(cli, examples):
    rec = _rec(cli, G4, "--cache-dir", examples, "--gpu", "L4")[1]["prescription"]
    r = cli("check", G4, "--cache-dir", examples, "--gpu", "L4", "--format", "json", "--fail-on", "never")
    assert r.json()["models"][0]["prescription"] == rec


def test_a_planned_config_is_judged_by_the_rules_a_cached_one_is():
    from gemma_doctor.plan import advice

    facts = advice.planned_facts("gemma4", "e2b", "google/gemma-4-E2B-it")
    assert facts.family.label == "gemma4" and facts.family.nested
    assert facts.config.data["text_config"]["num_kv_shared_layers"] == 20



def test_prepare_renders_the_same_prescription_as_recommend(cli, hub):
    """prepare() shares the entry point: the in-memory model's prescription is recommend's for the same config."""
    import json as _json

    import torch
    from transformers import Gemma3TextConfig, Gemma3ForCausalLM

    import gemma_doctor

    cfg = Gemma3TextConfig(vocab_size=262144, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=32)
    with torch.device("meta"):
        model = Gemma3ForCausalLM(cfg)
    hub.add("org/tiny", {"config.json": _json.loads(cfg.to_json_string())})
    for gpu in ("A100", "T4"):
        prepared = gemma_doctor.prepare(model, gpu=gpu, on_mismatch="ignore")
        code, m = _rec(cli, "org/tiny", "--cache-dir", hub.root, "--gpu", gpu)
        assert prepared.prescription is not None and m["prescription"] is not None
        for key in ("precision", "method", "batch_size", "gradient_accumulation_steps", "gradient_checkpointing",
                    "attention", "use_cache", "seq_len"):
            assert prepared.prescription[key] == m["prescription"][key], (gpu, key)
    assert gemma_doctor.prepare(model, gpu="T4", on_mismatch="ignore").prescription["precision"] == "fp32"


@pytest.mark.parametrize("target", [("--family", "gemma3", "--size", "12b"), (G3,)])
def test_without_transformers_the_prescription_pins_what_it_needs_and_passes_check_with_it(cli, examples, tmp_path,
                                                                                              target):
    """A stack that names no transformers (the README's install; here a requirements file without it): GD105 cannot be
    ruled out, and every candidate was rejected for it: "no prescription" for every multimodal Gemma 3 while check
    passed. The prescription now pins transformers out of GD105's window, says so in every view, and the run passes
    check --fail-on warning with that pin."""
    reqs = tmp_path / "requirements.txt"
    reqs.write_text("peft==0.21.2\ntrl==1.16.0\naccelerate==1.15.0\n")
    stack = ("--requirements", str(reqs), "--cache-dir", str(examples), "--gpu", "A100")
    code, m = _rec(cli, *target, *stack)
    assert code == 0 and m["status"] == "prescribed", m["way_out"]
    assert m["prescription"]["pins"] == [{"requirement": "transformers>=5.6.0", "resolves": "GD105"}]
    r = cli("recommend", *target, *stack, "--format", "yaml")
    assert r.code == 0 and '# needs transformers>=5.6.0: pip install "transformers>=5.6.0"' in r.out
    assert "needs transformers>=5.6.0" in cli("recommend", *target, *stack).out
    if target == (G3,):
        (tmp_path / "run.yaml").write_text(r.out)
        c = cli("check", G3, *stack, "--with", "transformers>=5.6.0", "--training-config", tmp_path / "run.yaml",
                "--format", "json", "--fail-on", "warning")
        assert c.code == 0, [f["code"] for f in c.json()["models"][0]["findings"]]
        assert c.json()["models"][0]["memory"]["summary"] == m["prescription"]["memory"]



@pytest.mark.parametrize("gpu", ["none", "A100", "T4"])
@pytest.mark.parametrize("config", [None, "per_device_train_batch_size: 4\ngradient_accumulation_steps: 4\nbf16: true\n"])
def test_check_states_one_run_in_its_precision_line_memory_line_and_prescription(cli, examples, tmp_path, gpu, config):
    """check without a GPU printed "batch 1 x8 accumulation" in the precision line and "batch 8 x 1024" in the memory
    line; with a 4 x 4 training config the precision line said 1 x 16; on an A100 prescription.memory (32.5 GiB) and
    memory.summary (33.3 GiB) differed in one JSON."""
    args = ["check", G3, "--cache-dir", examples, "--gpu", gpu, "--format", "json"]
    if config is not None:
        (tmp_path / "run.yaml").write_text(config)
        args += ["--training-config", tmp_path / "run.yaml"]
    m = cli(*args).json()["models"][0]
    run = m["memory"]["run"]
    args_ = m["recommendation"]["frameworks"]["transformers"]["training_arguments"]
    assert (args_.get("per_device_train_batch_size"), args_.get("gradient_accumulation_steps", 1)) == \
        (run["batch_size"], run["gradient_accumulation_steps"])
    summary = m["recommendation"]["summary"]
    acc = run["gradient_accumulation_steps"]
    assert f"batch {run['batch_size']}" + (f" x{acc} accumulation" if acc > 1 else "") in summary, summary
    if config is not None:
        assert (run["batch_size"], acc) == (4, 4)
    elif m["prescription"] is not None:
        assert m["prescription"]["memory"] == m["memory"]["summary"]


def _followed(line: str) -> tuple[str, ...] | None:
    """The options a way-out line tells the user to add, or None (a finding's cure)."""
    import re

    for pattern, opt in ((r"\(--num-gpus (\d+)\)", "--num-gpus"), (r"--seq-len (\d+):", "--seq-len"),
                         (r'\(--gpu "([^"]+)"\)', "--gpu"), (r"^--method (\w+):", "--method")):
        found = re.search(pattern, line)
        if found:
            return opt, found.group(1)
    return None


@pytest.mark.parametrize("target", [("--family", "gemma3", "--size", "12b"), ("--family", "gemma3", "--size", "27b")])
def test_every_way_out_passes_check_when_followed_at_the_figure_it_states(cli, tmp_path, target):
    """The way out named runs that did not hold: "4 GPUs with ZeRO-3 ... 13.7 GiB tight" while --num-gpus 4 gave
    13.3 GiB (or nothing), "V100: bf16" (GD603), "tight" ones (GD802 is the blocker). Each line is now the
    prescription of the change it names: followed, recommend prescribes exactly that run."""
    base = (*target, "--cache-dir", str(tmp_path), "--gpu", "T4")
    code, m = _rec(cli, *base)
    assert code == 1 and m["way_out"]
    followed = [(line, _followed(line)) for line in m["way_out"] if _followed(line)]
    assert followed
    for line, change in followed:
        assert not line.endswith(": tight") and not ("V100" in line and "bf16" in line), line
        extra = change if change[0] != "--gpu" else ()
        args = [*base[:-2], "--gpu", change[1]] if change[0] == "--gpu" else [*base, *extra]
        c, p = _rec(cli, *args)
        assert c == 0 and p["prescription"] is not None, (line, p["way_out"])
        assert line.endswith(p["prescription"]["memory"]), (line, p["prescription"]["memory"])


def test_the_yaml_carries_the_fix_first_step_the_text_shows(cli, examples):
    """The text said "first: GD101 gemma-doctor fix ... --inplace"; the YAML dropped it, and the YAML alone then
    failed check on the unfixed model."""
    args = (G3, "--cache-dir", examples, "--gpu", "A100", "--with", "transformers==4.50.3")
    text = [line.strip().removeprefix("first: ") for line in cli("recommend", *args).out.splitlines()
            if line.strip().startswith("first: ")]
    yaml_first = [line.removeprefix("# first: ") for line in cli("recommend", *args, "--format", "yaml").out.splitlines()
                  if line.startswith("# first: ")]
    assert text and [t.split(" ", 1) for t in text] == [y.split(": ", 1) for y in yaml_first]
    assert all("gemma-doctor fix" in y and y.endswith("--inplace") for y in yaml_first)


@pytest.mark.parametrize("extra", [(), ("--method", "lora", "--batch-size", "4", "--seq-len", "2048"),
                                   ("--requirements", "REQS")])
def test_the_prescription_is_a_typed_run_whose_every_field_says_where_it_came_from(cli, examples, tmp_path, extra):
    """prescription.run (gemma_doctor/run.py) states the run the flat fields, the memory line and the snippets state,
    each field with its source; a relaxed batch, a pinned transformers and the search's choices are named so."""
    reqs = tmp_path / "requirements.txt"
    reqs.write_text("peft==0.21.2\ntrl==1.16.0\n")
    extra = tuple(str(reqs) if a == "REQS" else a for a in extra)
    code, m = _rec(cli, G3, "--cache-dir", examples, "--gpu", "A100", *extra)
    p, run = m["prescription"], m["prescription"]["run"]
    assert code == 0 and run["model"] == "gemma3"
    assert (run["batch"]["value"], run["gradient_accumulation_steps"]["value"], run["seq_len"]["value"]) == \
        (p["batch_size"], p["gradient_accumulation_steps"], p["seq_len"])
    assert run["method"]["value"] == p["method"] and run["precision"]["value"] == p["precision"]
    assert run["memory"] == p["memory"] == m["memory"]["summary"]
    assert run["hardware"]["gpu"] == "A100 (sm_80)" and run["trainer"]["value"] == "axolotl"
    fields = [v for v in run.values() if isinstance(v, dict) and "source" in v]
    assert len(fields) >= 10 and all(isinstance(f["source"], str) and f["source"] for f in fields)
    if p["method"] != "full":
        assert run["lora"]["value"]["trainable_params"] == m["memory"]["trainable_params"] > 0
    if "--batch-size" in extra:
        assert run["batch"]["source"] == "relaxed from --batch-size 4" and run["seq_len"]["source"] == "option"
    if "--requirements" in extra:
        assert {"value": "transformers>=5.6.0", "source": "prescription"} in run["stack"]


def test_the_run_module_sits_below_the_rules_and_views():
    """Layers one way: run.py imports none of the rules, the plan's search, the views or the CLI, only what sits below
    the rules (the trainer kinds its trainer field is, a reader's: tests/test_layers.py's table)."""
    import ast

    from tests.test_layers import LAYERS, layer

    tree = ast.parse((ROOT / "gemma_doctor" / "run.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module} | \
        {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    rules = next(i for i, (name, _) in enumerate(LAYERS) if name == "rules")
    assert all(layer(m) < rules for m in imported if m.startswith("gemma_doctor")), imported


def test_what_blocks_a_prescription_is_read_from_the_codes_entry_as_list_reads_it():
    """The search's "cured by fix" is the code's cure (codes.py), the one `list` reads, never the wording of a fix:
    a use_cache finding is fix's whatever its text says, and an invalid config.json whose text happens to name
    `gemma-doctor fix` blocks a prescription as list calls it not fixable (issue 32, "what a finding is")."""
    from gemma_doctor.codes import CODES, Cure
    from gemma_doctor.plan import search
    from gemma_doctor.report import Finding, Severity

    reworded = Finding("GD101", Severity.WARNING, "use_cache true", file="config.json", key="use_cache",
                       fix="run the doctor's fix command")
    assert CODES["GD101"].cure is Cure.FIX and search.cured_by_fix(reworded) and not search.blocking((reworded,))
    invalid = Finding("GD002", Severity.ERROR, 'use_cache is "yes"', file="config.json", key="use_cache",
                      fix="gemma-doctor fix org/m --inplace (writes false)")
    assert CODES["GD002"].cure is not Cure.FIX and search.blocking((invalid,)) == (invalid,)


def test_a_way_out_remembered_is_the_way_out_searched_afresh(cli, examples, monkeypatch):
    """The way out's searches are remembered by their inputs (plan/search.py's _WAY_OUTS): a larger GPU asked from a
    V100 is the search a T4's way out made already, though check's own judgement of the two runs (the facts'
    recommendation and memory plan) differs. Served from the cache, recommend prints what a fresh search prints."""
    from gemma_doctor.plan import search

    searched: list[tuple] = []  # each search's GPU and memory options
    real = search.prescribe
    monkeypatch.setattr(search, "prescribe", lambda *a, **k: searched.append((a[2].gpu, a[2].memory)) or real(*a, **k))
    monkeypatch.setattr(search, "_WAY_OUTS", {})

    def way_out(gpu: str) -> tuple[str, list[tuple]]:
        searched.clear()
        r = cli("recommend", G4, "--cache-dir", examples, "--gpu", gpu, "--with", "transformers==5.23.0", "--format",
                "json")
        assert r.code == 1 and r.json()["models"][0]["way_out"], r
        return r.out, list(searched)

    way_out("T4")
    served, some = way_out("V100")
    search._WAY_OUTS.clear()
    fresh, every = way_out("V100")
    assert served == fresh
    # the V100's own search and the way-out searches no T4 asked were made; the larger GPUs' came from the cache
    assert len(some) < len(every) and some[0] == every[0], (some, every)


# --- the YAML is axolotl's own (issue 32) --------------------------------------------------------------------------

@pytest.mark.parametrize("model,gpu,transformers,task,extra", [
    (G3, "T4", "5.23.0", "sft", ("--num-gpus", "8")),  # num_processes was written: axolotl has no such key
    # 4 x 40 GB hold no full fine-tuning of 12B under DeepSpeed (its fp32 copies: 2 + 18/4 bytes a parameter, as its own
    # estimator counts); 4 x 80 GB do.
    (G3, "A100-80GB", "5.23.0", "full", ("--num-gpus", "4")),
    (G3, "L4", "4.50.3", "qlora", ()),  # torch_dtype and bnb_4bit_compute_dtype were written
    (G3, "A100", "5.23.0", "sft", ("--quantization", "8bit")),  # an 8-bit run's YAML had no adapter at all
], ids=["T4-8gpus", "A100-full-4gpus", "L4-qlora-4.50.3", "A100-8bit"])
def test_the_yaml_writes_only_keys_axolotls_schema_has_and_passes_check(cli, examples, tmp_path, model, gpu,
                                                                       transformers, task, extra):
    where = (model, "--cache-dir", str(examples))
    o = grid.judge_point(_runner(cli), grid.Point(where, where, gpu, transformers, task, extra), tmp_path)
    assert o.kind == "prescribed", o.detail


def test_an_8bit_prescription_says_lora_on_8bit_in_its_yaml(cli, examples):
    r = cli("recommend", G3, "--cache-dir", examples, "--gpu", "A100", "--quantization", "8bit", "--format", "yaml")
    data = yaml.safe_load(r.out)
    assert (data.get("adapter"), data.get("load_in_8bit")) == ("lora", True), data

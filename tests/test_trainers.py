"""The registry of trainer kinds and the one decision of which trainer executes a run (gemma_doctor/trainers.py):
each kind recognised from a config shape the project's fixtures already hold, the decision taken by check's memory
plan, GD650 and the rehearsal alike, and no rule comparing a training config's kind to a string."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gemma_doctor import trainers
from gemma_doctor.readers import launch, training_config
from gemma_doctor.trainers import Trainer
from tests.builders import EXAMPLES, HubCache, gemma3_1b_config
from tests.test_distributed import ACCEL_FSDP, DS_Z3
from tests.test_training_lint import ACCELERATE_BF16, AXOLOTL_AUTO

PACKAGE = Path(__file__).resolve().parent.parent / "gemma_doctor"
TRL_SFT = (EXAMPLES / "gemma-4-E2B-it.train.yaml").read_text()  # the demo's TRL SFT recipe
# Only TrainingArguments keys: what `python train.py` reads with HfArgumentParser(TrainingArguments).
TRAINING_ARGUMENTS = "per_device_train_batch_size: 8\nbf16: true\ngradient_checkpointing: true\nuse_peft: true\n"
LLAMA_FACTORY = "stage: sft\nfinetuning_type: lora\nbf16: true\n"  # tests/test_gemma4_lint.py's


@pytest.mark.parametrize("text, kind, trainer", [
    (TRL_SFT, "transformers", Trainer.TRL_SFT),
    (TRAINING_ARGUMENTS, "transformers", Trainer.TRANSFORMERS),
    ("rl: dpo\nbeta: 0.1\nloss_type: sigmoid\n", "transformers", Trainer.TRL_DPO),  # tests/test_scan_speed.py's
    ("num_generations: 8\nper_device_train_batch_size: 8\nbf16: true\n", "transformers", Trainer.TRL_GRPO),
    ('{"bf16": true, "beta": 0.1, "max_grad_norm": 1.0}', "transformers", Trainer.TRL_RL),  # the doc tests' dpo.json
    (AXOLOTL_AUTO, "axolotl", Trainer.AXOLOTL),
    (LLAMA_FACTORY, "llama-factory", Trainer.LLAMA_FACTORY),
    (ACCEL_FSDP, "accelerate", Trainer.SCRIPT),
    (ACCELERATE_BF16, "accelerate", Trainer.SCRIPT),
    (DS_Z3, "deepspeed", Trainer.SCRIPT),
    # tests/test_training_keys.py's serving and NeMo configs: recognised, and no trainer runs them
    ("model: google/gemma-3-12b-it\ntensor-parallel-size: 2\nmax-model-len: 8192\ndtype: bfloat16\n", "vllm", None),
    ("model-path: google/gemma-3-12b-it\ntp-size: 2\nmem-fraction-static: 0.8\n", "sglang", None),
    ("trainer:\n  devices: 8\n  precision: bf16-mixed\nmodel:\n  micro_batch_size: 1\nexp_manager: {}\n", "nemo", None),
], ids=["trl-sft", "training-arguments", "trl-dpo", "trl-grpo", "trl-preference", "axolotl", "llama-factory", "accelerate-fsdp",
        "accelerate-bf16", "deepspeed", "vllm", "sglang", "nemo"])
def test_each_kind_is_recognised_and_decides_its_trainer(text, kind, trainer):
    tc = training_config.parse(text, "c.yaml", yaml_first=True)
    assert tc.kind == kind and tc.format is trainers.kind_named(kind) and tc.format.name == kind
    assert (tc.trainer.value if tc.trainer is not None else None) is trainer
    assert tc.format.trains is (trainer is not None)


def test_the_registry_names_each_kind_once_and_refuses_what_trains_nothing():
    names = [k.name for k in trainers.REGISTRY]
    assert len(names) == len(set(names)) and names[-1] == "transformers"  # the fallback is tried last
    assert training_config.NOT_TRAINING == {k.name: k.refusal for k in trainers.REGISTRY if not k.trains}
    assert set(training_config.NOT_TRAINING) == {"vllm", "sglang", "nemo"}
    assert trainers.kind_named("no such kind") is trainers.UNKNOWN
    # The facts the rules ask instead of names: each is one kind's, not a default that every kind shares by accident.
    ask = {"packs_with_trl": {"transformers"}, "lora_targets_peft_default": {"transformers"},
           "checkpoints_by_default": {"llama-factory"}, "own_lora_targets": {"llama-factory"},
           "auto_copies_training_arguments": {"deepspeed"},
           "key_table": {"transformers", "axolotl", "llama-factory"}}
    for fact, kinds in ask.items():
        assert {k.name for k in trainers.REGISTRY if getattr(k, fact)} == kinds, fact
    assert {k.name for k in trainers.REGISTRY if k.trains and not k.fsdp_by_training_arguments} == {"accelerate"}


def test_the_launch_line_names_the_trainer_the_file_alone_does_not(tmp_path):
    """`trl sft --config args.yaml` runs TRL's SFTTrainer on a file of TrainingArguments keys, which alone is planned
    as a plain Trainer; a script's own TRL flags decide as a file's keys do."""
    (tmp_path / "args.yaml").write_text(TRAINING_ARGUMENTS)
    file = training_config.read(str(tmp_path / "args.yaml"))
    assert file.trainer.value is Trainer.TRANSFORMERS and file.trainer.default
    trl = launch.parse("trl sft --config args.yaml", str(tmp_path))
    assert trl.ok and (trl.trainer.value, trl.trainer.source) == (Trainer.TRL_SFT, "--launch trl sft")
    assert launch.combine(file, trl).trainer.value is Trainer.TRL_SFT
    plain = launch.parse("accelerate launch train.py --config args.yaml", str(tmp_path))
    assert launch.combine(file, plain).trainer.value is Trainer.TRANSFORMERS
    flags = launch.parse("python train.py --max_length 2048", str(tmp_path))
    assert launch.combine(file, flags).trainer.value is Trainer.TRL_SFT and "max_length" in flags.trainer.source
    assert launch.parse("trl dpo --config args.yaml", str(tmp_path)).trainer.value is Trainer.TRL_DPO
    assert launch.parse("axolotl train args.yaml", str(tmp_path)).trainer.value is Trainer.AXOLOTL


@pytest.mark.parametrize("text, twin, chunked", [
    (TRAINING_ARGUMENTS, "transformers", False),
    (TRAINING_ARGUMENTS + "max_length: 1024\n", "trl-sft", True),
    # LLaMA-Factory's own `packing` is no TRL key: its Seq2SeqTrainer runs it (the twin was TRL's SFTTrainer)
    (LLAMA_FACTORY + "packing: true\nper_device_train_batch_size: 8\n", "transformers", False),
], ids=["training-arguments", "trl-sft", "llama-factory-packing"])
def test_check_plans_the_loss_of_the_trainer_the_rehearsal_runs(cli, tmp_path, text, twin, chunked):
    """One config, one trainer: check planned a file of TrainingArguments keys as TRL's SFTTrainer (chunked log-probs,
    TRL >= 1.15 installed) while the rehearsal ran it under a plain Trainer, which holds the full logits."""
    from gemma_doctor.rehearse.runner import plan_for

    hub = HubCache(tmp_path / "hub")
    hub.add("acme/gemma", {"config.json": gemma3_1b_config()})
    path = tmp_path / "train.yaml"
    path.write_text(text)
    report = cli("check", "acme/gemma", "--cache-dir", hub.root, "--gpu", "A100", "--training-config", path,
                 "--format", "json").json()
    m = report["models"][0]
    plan, _, _, _ = plan_for("acme/gemma", hub.root, "main", path, 1)
    assert plan["trainer"] == twin
    # check's JSON says which trainer it planned for (LLaMA-Factory's own, whose loop the twin runs as a plain Trainer's)
    assert report["environment"]["training_config"]["trainer"]["value"] == \
        ("llama-factory" if text.startswith(LLAMA_FACTORY) else twin)
    assert ("chunked_loss" in m["memory"]["run"]["sources"]) is chunked is (twin == "trl-sft")


# A training config's kind, under the names the code gives it (readers, rules, plan, the rehearsal).
_CONFIG_NAMES = frozenset({"tc", "training_config", "base", "launch", "layer", "ds", "config"})


def _compares_kind_to_text(node: ast.AST) -> bool:
    """``tc.kind == "axolotl"`` / ``tc.kind in ("a", "b")`` / ``getattr(tc, "kind", None) != "x"``."""
    if not isinstance(node, ast.Compare):
        return False
    left = node.left
    kind = (isinstance(left, ast.Attribute) and left.attr == "kind" and isinstance(left.value, ast.Name)
            and left.value.id in _CONFIG_NAMES) or (
        isinstance(left, ast.Call) and isinstance(left.func, ast.Name) and left.func.id == "getattr"
        and len(left.args) >= 2 and isinstance(left.args[1], ast.Constant) and left.args[1].value == "kind")
    if not kind:
        return False
    for right in node.comparators:
        items = right.elts if isinstance(right, (ast.Tuple, ast.List, ast.Set)) else [right]
        if any(isinstance(i, ast.Constant) and isinstance(i.value, str) for i in items):
            return True
    return False


def test_no_module_compares_a_training_configs_kind_to_a_string():
    """The rules ask the kind object (trainers.ConfigKind) or the decided trainer; a string compare is how six rule
    modules drifted apart (issue 32)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found += [f"{path.relative_to(PACKAGE.parent)}:{n.lineno}" for n in ast.walk(tree) if _compares_kind_to_text(n)]
    assert found == []


def test_the_kind_compare_finder_finds_one():
    """The test above can fail: it finds the compares main had."""
    for text in ('tc.kind == "axolotl"', 'tc.kind != "llama-factory"', 'getattr(tc, "kind", None) == "transformers"',
                 'ds.kind in ("deepspeed",)'):
        assert _compares_kind_to_text(ast.parse(text, mode="eval").body), text
    assert not _compares_kind_to_text(ast.parse('source.kind == "hub"', mode="eval").body)


def test_gd650_counts_the_logits_a_plain_trainer_holds_and_names_the_trainer_that_would_not(cli, tmp_path):
    """GD650 said "does not apply here: TRL computes SFT log-probs in chunks" for a file of TrainingArguments keys,
    which a plain Trainer runs with its full logits; it now counts them, and names TRL's SFTTrainer as a way out."""
    hub = HubCache(tmp_path / "hub")
    hub.add("acme/gemma", {"config.json": gemma3_1b_config()})
    path = tmp_path / "train.yaml"
    path.write_text("per_device_train_batch_size: 2\nbf16: true\nmodel_max_length: 4096\n")
    # On a GPU the plan is judged against (without one nothing limits memory: GD650 is information there)
    m = cli("check", "acme/gemma", "--cache-dir", hub.root, "--gpu", "T4", "--training-config", path,
            "--format", "json").json()
    [gd650] = [f for f in m["models"][0]["findings"] if f["code"] == "GD650"]
    assert (gd650["severity"], gd650["details"]["chunked"]) == ("warning", False)
    assert "TRL >= 1.15 SFTTrainer" in gd650["fix"]


def test_check_plans_chunked_log_probs_where_the_launch_line_runs_trl_sft(cli, tmp_path):
    """The same file of TrainingArguments keys, launched with `trl sft --config`, is TRL's SFTTrainer's run: check
    plans its chunked log-probs (TRL 1.16 in the test stack), and the source names the launch line."""
    hub = HubCache(tmp_path / "hub")
    hub.add("acme/gemma", {"config.json": gemma3_1b_config()})
    path = tmp_path / "args.yaml"
    path.write_text(TRAINING_ARGUMENTS)
    args = ["check", "acme/gemma", "--cache-dir", hub.root, "--gpu", "A100", "--training-config", path, "--format", "json"]
    alone = cli(*args).json()["models"][0]["memory"]["run"]["sources"]
    launched = cli(*args, "--launch", f"trl sft --config {path}").json()["models"][0]["memory"]["run"]["sources"]
    assert "chunked_loss" not in alone and "chunked_loss" in launched

"""One run's answers agree, as properties over random runs (issue 32).

A random run is a model (the bundled example cache's Gemma 3 12B and Gemma 4 E2B, or a published size of the family
table), a GPU of the GPU table or none, 1-8 GPUs, a method (or the search's choice), LoRA targets as a list, a regex or
all-linear, a batch, accumulation and sequence, and the trainer format that states them (command-line options, an
axolotl YAML or a TRL JSON), on the test stack's transformers or on a stack that names no transformers (the README's
own install, given as a requirements file without it, as tests/test_prescription.py and benchmarks/prescription_grid.py
give it). For each:

(a) the text, the JSON, the YAML and the TRL / TrainingArguments / PEFT snippets of one `recommend` state the same
    batch, accumulation, precision, method, targets (and the trainable parameters they come to), memory figure and
    verdict; a choice the user made is kept, or the relaxation is named as its source;
(b) every way-out line, followed (the option it names, added to the same command), gets a prescription at the figure
    the line states, and that prescription passes check;
(c) the prescription passes `check --fail-on warning` with the same model, GPU and stack plus the pins it names (after
    the `first:` step it names, `gemma-doctor fix ... --inplace`, run on a copy of the model), with transformers named
    or not, and check plans the very run (memory figure and trainable parameters);
(d) the prescription does not depend on the runs the process judged before;
(e) that check states, in its text and its JSON, the batch, accumulation, precision, checkpointing, attention, trainer
    and memory of its own Run (the model's `run` block).

Everything runs in this process (benchmarks/prescription_grid.in_process); Hypothesis in the derandomised CI profile
(tests/conftest.py), so CI sees the same examples on every run. Each `@example` is a counterexample the properties
found, fixed in gemma_doctor, that fails before its fix."""

from __future__ import annotations

import ast
import difflib
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gemma_doctor import gpus as gpu_table
from tests.builders import HubCache

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import prescription_grid as grid  # noqa: E402

sys.path.pop(0)

G3, G4 = "google/gemma-3-12b-it", "google/gemma-4-E2B-it"
FAMILY_SIZES = (("gemma", "2b"), ("gemma", "7b"), ("gemma2", "2b"), ("gemma2", "9b"), ("gemma2", "27b"), ("gemma3", "1b"),
                ("gemma3", "4b"), ("gemma3", "12b"), ("gemma3", "27b"), ("gemma4", "e2b"), ("gemma4", "e4b"),
                ("gemma4", "31b"), ("gemma4", "26b-a4b"))
# Every GPU of the table, by the name --gpu takes, and no GPU.
GPUS = tuple(g.name for g in gpu_table.KNOWN_GPUS) + ("none",)
NO_TRANSFORMERS = grid.NO_TRANSFORMERS
# LoRA targets as a user writes them: a list of names, a regex over whole module names (PEFT's reading of a string),
# all-linear.
TARGETS = {"list": ["q_proj", "k_proj", "v_proj", "o_proj"], "regex": r".*language_model.*\.(q_proj|v_proj)",
           "all-linear": "all-linear"}
METHOD_WORDS = {"full": "full fine-tuning", "lora": "LoRA", "qlora": "QLoRA"}
SUMMARY_START = {"full": "full fine-tuning, ", "lora": "LoRA r=", "qlora": "QLoRA "}


@dataclass(frozen=True)
class Case:
    """One random run, as the options and the training config a user would give."""

    model: tuple[str, ...]  # (repo,) of the example cache, or (family, size) of the family table
    gpu: str
    num_gpus: int | None  # None: not said (the default, 1 here)
    transformers: str  # "5.23.0" or NO_TRANSFORMERS
    method: str | None
    trainer: str | None  # None: options only; "axolotl" (YAML) or "trl" (JSON): the config that states the run
    targets: str | None  # a key of TARGETS
    batch: int | None
    accumulation: int | None
    seq_len: int | None
    # recommend's --trainer (the format the prescription is written in) where the options state the run (trainer None):
    # TRL's and TrainingArguments' formats write no use_peft for full fine-tuning, which check read as "chosen to fit"
    # (issue 32). LLaMA-Factory's keys are not held by assert_views_agree: not drawn.
    fmt: str | None = None


@st.composite
def cases(draw: st.DrawFn) -> Case:
    model = draw(st.sampled_from(((G3,), (G4,)) + FAMILY_SIZES))
    trainer = draw(st.sampled_from((None, "axolotl", "trl")))
    method = draw(st.sampled_from((None, "full", "lora", "qlora")))
    targets = draw(st.sampled_from((None, *TARGETS))) if trainer is not None and method in ("lora", "qlora") else None
    gpu, num_gpus = draw(st.sampled_from(GPUS)), draw(st.none() | st.integers(1, 8))
    transformers, batch = draw(st.sampled_from(("5.23.0", NO_TRANSFORMERS))), draw(st.none() | st.integers(1, 16))
    accumulation = draw(st.none() | st.integers(1, 16)) if trainer is not None else None
    seq_len = draw(st.none() | st.sampled_from((256, 512, 1024, 2048, 4096)))
    # (TRL's and TrainingArguments' formats hold one process: --trainer with --num-gpus 2 is a usage error, exit 2)
    fmt = draw(st.sampled_from((None, "trl", "transformers"))) if trainer is None and (num_gpus or 1) == 1 else None
    return Case(model=model, gpu=gpu, num_gpus=num_gpus, transformers=transformers, method=method, trainer=trainer,
                targets=targets, batch=batch, accumulation=accumulation, seq_len=seq_len, fmt=fmt)


class World:
    """The caches, the stack files and the in-process CLI every example shares."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.examples = root / "examples" / "hub"
        subprocess.run([sys.executable, str(ROOT / "examples" / "build_example_cache.py"), str(self.examples)],
                       check=True, capture_output=True)
        # The family table's published configs, cached, for check (recommend plans them with --family/--size).
        from gemma_doctor.plan import advice

        self.planned = HubCache(root / "planned")
        for family, size in FAMILY_SIZES:
            facts = advice.planned_facts(family, size, f"org/{family}-{size}")
            self.planned.add(f"org/{family}-{size}", {"config.json": facts.config.data})
        self.configs = {f"org/{family}-{size}": advice.planned_facts(family, size, "").config.data
                        for family, size in FAMILY_SIZES}
        self.fixed = 0
        self.requirements = root / "requirements-without-transformers.txt"
        self.requirements.write_text("peft==0.21.2\ntrl==1.16.0\naccelerate==1.15.0\n")
        self.run = grid.in_process()

    def targets(self, case: Case) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """recommend's target arguments and check's, for the same model."""
        if len(case.model) == 1:
            where = (case.model[0], "--cache-dir", str(self.examples))
            return where, where
        family, size = case.model
        cached = (f"org/{family}-{size}", "--cache-dir", str(self.planned.root))
        return ("--family", family, "--size", size, "--cache-dir", str(self.planned.root)), cached

    def followed_fix(self, case: Case, pins: tuple[str, ...]) -> tuple[str, ...]:
        """check's target once the prescription's first step (`gemma-doctor fix ... --inplace`, on the stack it plans
        for) has run: on a copy of the model, so no other example sees it fixed."""
        _, (repo, _, _) = self.targets(case)
        assert repo in self.configs, f"a fix-first step on the shared example cache: {repo}"
        self.fixed += 1
        hub = HubCache(self.root / f"fixed-{self.fixed}")
        hub.add(repo, {"config.json": self.configs[repo]})
        code, out, err = self.run("fix", repo, "--cache-dir", str(hub.root), *self.stack(case)[2:], *pins, "--inplace")
        assert code == 0, (code, out, err[-2000:])
        return (repo, "--cache-dir", str(hub.root))

    def stack(self, case: Case) -> tuple[str, ...]:
        """The GPU and the stack, the same for recommend and check."""
        if case.transformers == NO_TRANSFORMERS:
            return ("--gpu", case.gpu, "--requirements", str(self.requirements))
        return ("--gpu", case.gpu, "--with", f"transformers=={case.transformers}")


def user_config(case: Case) -> str | None:
    """The training config the user states the run in (None: options only)."""
    if case.trainer is None:
        return None
    targets = TARGETS.get(case.targets) if case.targets else None
    if case.trainer == "axolotl":
        data: dict[str, Any] = {"base_model": "the-model"}
        if case.method in ("lora", "qlora"):
            data["adapter"] = case.method
            if case.method == "qlora":
                data["load_in_4bit"] = True
        if targets is not None:
            data["lora_target_modules"] = targets
        for key, value in (("micro_batch_size", case.batch), ("gradient_accumulation_steps", case.accumulation),
                           ("sequence_len", case.seq_len)):
            if value is not None:
                data[key] = value
        return yaml.safe_dump(data, sort_keys=False)
    data = {}
    if case.method is not None:
        data["use_peft"] = case.method != "full"  # TRL's ModelConfig: no PEFT trains every weight
        if case.method == "qlora":
            data["load_in_4bit"] = True
    if targets is not None:
        data["lora_target_modules"] = targets
    for key, value in (("per_device_train_batch_size", case.batch), ("gradient_accumulation_steps", case.accumulation),
                       ("max_length", case.seq_len)):
        if value is not None:
            data[key] = value
    return json.dumps(data)


def recommend_args(world: World, case: Case, workdir: Path) -> tuple[str, ...]:
    """The recommend command line of ``case`` (model, GPU, stack, choices, training config), without --format."""
    target, _ = world.targets(case)
    args = [*target, *world.stack(case)]
    if case.num_gpus is not None:
        args += ["--num-gpus", str(case.num_gpus)]
    config = user_config(case)
    if config is None:
        if case.method is not None:
            args += ["--method", case.method]
        if case.batch is not None:
            args += ["--batch-size", str(case.batch)]
        if case.seq_len is not None:
            args += ["--seq-len", str(case.seq_len)]
        if case.fmt is not None:
            args += ["--trainer", case.fmt]
    else:
        path = workdir / ("run.yaml" if case.trainer == "axolotl" else "run.json")
        path.write_text(config)
        args += ["--training-config", str(path)]
    return tuple(args)


def _recommend(world: World, args: tuple[str, ...], fmt: str) -> tuple[int, str, str]:
    code, out, err = world.run("recommend", *args, "--format", fmt)
    assert code in (0, 1), (args, fmt, code, err[-2000:])
    return code, out, err


def called(code: str, name: str) -> dict[str, Any]:
    """The keyword arguments of the first call of ``name`` in a snippet, as values. An argument given as a variable is
    its assignment's value; a conditional one (the PEFT snippet's targets: the language-model regex where the model's
    module names hold language_model, else all-linear after its own "load the language model alone" snippet) is the
    branch for the checkpoint as prescribed, its other branch held to all-linear."""
    tree = ast.parse(code)
    assigned = {t.id: n.value for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets
                if isinstance(t, ast.Name)}

    def value(node: ast.expr) -> Any:
        if isinstance(node, ast.Name) and node.id in assigned:
            return value(assigned[node.id])
        if isinstance(node, ast.IfExp):
            assert ast.literal_eval(node.orelse) == "all-linear", ast.unparse(node)
            return value(node.body)
        return ast.literal_eval(node)

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name:
            return {k.arg: value(k.value) for k in node.keywords if k.arg is not None}
    raise AssertionError(f"no {name}(...) in {code}")


def _yaml_flag(data: dict[str, Any], key: str) -> bool:
    return data.get(key) is True


def assert_views_agree(world: World, case: Case, args: tuple[str, ...], m: dict[str, Any]) -> None:
    """(a): the JSON's blocks, the YAML, the snippets and the text state one run."""
    p, mem, rec, run = m["prescription"], m["memory"], m["recommendation"], m["prescription"]["run"]
    b, acc, seq, method, precision = (p["batch_size"], p["gradient_accumulation_steps"], p["seq_len"], p["method"],
                                      p["precision"])
    # The JSON: the prescription, its typed Run, the memory plan and the precision decision.
    assert (run["batch"]["value"], run["gradient_accumulation_steps"]["value"], run["seq_len"]["value"]) == (b, acc, seq)
    assert (mem["run"]["batch_size"], mem["run"]["gradient_accumulation_steps"], mem["run"]["seq_len"]) == (b, acc, seq)
    assert run["method"]["value"] == mem["run"]["method"] == mem["method"] == rec["method"] == method
    # ... and the memory line names that method (on main `--trainer trl --method full` said "QLoRA 4-bit" there)
    assert mem["summary"].startswith(SUMMARY_START[method]), (method, mem["summary"])
    assert run["precision"]["value"] == mem["run"]["precision"] == rec["precision"] == precision
    assert p["memory"] == run["memory"] == mem["summary"], (p["memory"], mem["summary"])
    attention = p["attention"]
    assert run["attention"]["value"] == mem["run"]["attention"] == attention, (run["attention"], mem["run"])
    # Without a GPU, or one whose memory the table does not know (Apple's M3), the plan is not judged against a GPU's
    # memory: "unknown", never "does-not-fit".
    assert mem["verdict"] == ("unknown" if mem["gpu_bytes"] is None else "fits"), mem["summary"]
    assert mem["summary"].endswith(f": {mem['verdict']}"), mem["summary"]
    assert run["hardware"]["count"]["value"] == mem["run"]["num_gpus"] == p["num_gpus"]
    if method == "full":
        assert p["lora"] is None and run["lora"] is None
    else:
        lora = run["lora"]["value"]
        targets = p["lora"]["target_modules"]
        assert lora["targets"] == targets == mem["run"]["lora_targets"] == rec["frameworks"]["peft"]["target_modules"]
        assert lora["trainable_params"] == mem["trainable_params"] > 0
        assert lora["r"] == p["lora"]["r"] == rec["frameworks"]["peft"]["r"]
    # The YAML (`--format yaml`, the same text as snippets.yaml), as axolotl reads it.
    code, yaml_text, _ = _recommend(world, args, "yaml")
    # --format yaml heads the YAML with the model and the precision line, as comments.
    assert code == 0 and yaml_text.endswith(m["snippets"]["yaml"]), "".join(
        difflib.unified_diff(m["snippets"]["yaml"].splitlines(True), yaml_text.splitlines(True)))
    y = yaml.safe_load(yaml_text)
    assert (_yaml_flag(y, "bf16"), _yaml_flag(y, "fp16")) == (precision == "bf16", precision == "fp16")
    # The attention backend: written where it is not transformers' default (sdpa), as TRL's ModelConfig and axolotl
    # name it (LLaMA-Factory's flash_attn is not drawn here).
    assert y.get("attn_implementation", "sdpa") == attention, (y.get("attn_implementation"), attention)
    if run["trainer"]["value"] != "axolotl":
        # A user's TRL / TrainingArguments config names its trainer: the prescription is written in its format
        # (recommend --trainer; tests/test_trainer_formats.py), TRL's keys for the run, one process.
        assert (y["per_device_train_batch_size"], y.get("gradient_accumulation_steps", 1)) == (b, acc)
        assert y.get("max_length", seq) == seq and ("max_length" in y) is (run["trainer"]["value"] == "trl-sft")
        assert bool(y.get("use_peft")) is (method != "full") and bool(y.get("load_in_4bit")) is (method == "qlora")
        assert bool(y.get("gradient_checkpointing", y.get("activation_checkpointing"))) is p["gradient_checkpointing"]
        assert p["num_gpus"] == 1 and (method == "full" or y["lora_target_modules"] == p["lora"]["target_modules"])
    else:
        _axolotl_yaml_states(y, p, b, acc, seq, method)
    _snippets_state(m, rec, b, acc, seq, precision, method, p)
    _text_states(world, args, mem, b, acc, precision, method, p)


def _loading_attention(m: dict[str, Any]) -> tuple[str, str]:
    """The attention the loading snippet's from_pretrained(...) names (sdpa where it names none), as data and as the
    Python the text prints."""
    data = m["recommendation"]["frameworks"]["transformers"]["from_pretrained"].get("attn_implementation", "sdpa")
    said = "sdpa"
    for node in ast.walk(ast.parse(m["snippets"]["python"]["loading"])):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "from_pretrained":
            said = next((ast.literal_eval(k.value) for k in node.keywords if k.arg == "attn_implementation"), "sdpa")
            break
    return data, said


def _axolotl_yaml_states(y: dict[str, Any], p: dict[str, Any], b: int, acc: int, seq: int, method: str) -> None:
    assert (y["micro_batch_size"], y.get("gradient_accumulation_steps", 1), y["sequence_len"]) == (b, acc, seq)
    assert y.get("adapter") == (None if method == "full" else method)
    assert bool(y.get("gradient_checkpointing")) is p["gradient_checkpointing"]
    assert y.get("world_size", 1) == p["num_gpus"]  # axolotl's key for the process count (its schema has no num_processes)
    if method != "full":
        # axolotl spells all-linear lora_target_linear: true.
        said = "all-linear" if y.get("lora_target_linear") is True else y["lora_target_modules"]
        assert said == p["lora"]["target_modules"] and y["lora_r"] == p["lora"]["r"]


def _snippets_state(m: dict[str, Any], rec: dict[str, Any], b: int, acc: int, seq: int, precision: str, method: str,
                    p: dict[str, Any]) -> None:
    # The TrainingArguments and TRL snippets, as data and as the Python the text prints.
    fw = rec["frameworks"]
    for name, config in (("transformers", fw["transformers"]["training_arguments"]), ("trl", fw["trl"]["config"])):
        if config is None:
            continue
        assert (config["per_device_train_batch_size"], config.get("gradient_accumulation_steps", 1)) == (b, acc), name
        assert (config.get("bf16") is True, config.get("fp16") is True) == (precision == "bf16", precision == "fp16")
        if name == "trl":
            assert config.get("max_length", seq) == seq
    # The Python the text prints says the same settings as the data.
    python = m["snippets"]["python"]
    # TRL's SFTConfig is another run beside axolotl's prescription (chunked log-probs): shown only with --trainer trl;
    # a TRL prescription shows no plain Trainer's TrainingArguments (full logits).
    trl_run = m["prescription"]["run"]["trainer"]["value"] == "trl-sft"
    assert ("trl" in python) is (fw["trl"]["config"] is not None and (trl_run or fw["trl"]["config_class"] != "SFTConfig"))
    assert ("transformers" in python) is not trl_run
    if "transformers" in python:
        assert called(python["transformers"], "dict") == fw["transformers"]["training_arguments"]
    if "trl" in python:
        trl = called(python["trl"], fw["trl"]["config_class"])
        assert {k: v for k, v in trl.items() if k != "output_dir"} == fw["trl"]["config"]
    assert _loading_attention(m) == (p["attention"], p["attention"]), (_loading_attention(m), p["attention"])
    if method != "full":
        lora = called(python["peft"], "LoraConfig")
        assert (lora["r"], lora["target_modules"]) == (p["lora"]["r"], p["lora"]["target_modules"]), python["peft"]


def _text_states(world: World, args: tuple[str, ...], mem: dict[str, Any], b: int, acc: int, precision: str,
                 method: str, p: dict[str, Any]) -> None:
    # The text: the precision line and the memory line.
    code, text, _ = _recommend(world, args, "text")
    assert code == 0
    head = next(line for line in text.splitlines() if line.strip().startswith("precision "))
    assert head.split()[1] == precision, head
    assert f"batch {b}" + (f" x{acc} accumulation" if acc > 1 else "") + ("," if p["gradient_checkpointing"] else "") \
        in head + ",", head
    assert METHOD_WORDS[method] in head, head
    assert f"memory {mem['summary']}" in text
    # the memory line's assumptions name the attention it plans (eager materialises the s x s scores)
    assert f"attention {p['attention']} (" in text, p["attention"]


def assert_choices_kept(case: Case, m: dict[str, Any]) -> None:
    """(a): what the user chose is what is prescribed, or the prescription names the relaxation as its source."""
    p, sources = m["prescription"], m["memory"]["run"]["sources"]
    if case.method is not None:
        assert p["method"] == case.method, (case.method, p["method"])
    if case.seq_len is not None:
        assert p["seq_len"] == case.seq_len
    if case.num_gpus is not None:
        assert p["num_gpus"] == case.num_gpus
    if case.batch is not None and p["batch_size"] != case.batch:
        assert sources["batch_size"].startswith("relaxed from"), sources
    if case.targets is not None:
        said = TARGETS[case.targets]
        assert p["lora"]["target_modules"] == said, (said, p["lora"])
        assert sources["lora_targets"].startswith("training config"), sources


def check_prescription(world: World, case: Case, m: dict[str, Any], workdir: Path, task: str = "sft") -> None:
    """(c): the prescription's YAML passes check --fail-on warning with the same model, GPU and stack (and its pins),
    and check plans that very run."""
    p = m["prescription"]
    _, target = world.targets(case)
    path = workdir / "prescription.yaml"
    path.write_text(m["snippets"]["yaml"])
    pins = tuple(a for pin in p.get("pins", ()) for a in ("--with", pin["requirement"]))
    if p["fix_first"]:
        target = world.followed_fix(case, pins)
    gpu = p["run"]["hardware"]["gpu"]
    stack = list(world.stack(case))
    # A TrainingArguments file leaves the sequence length to the script (its head says so): check is told it.
    if p["run"]["trainer"]["value"] == "transformers":
        stack += ["--seq-len", str(p["seq_len"])]
    code, out, err = world.run("check", *target, *stack, *pins, "--task", task, "--training-config", str(path),
                               "--format", "json", "--fail-on", "warning")
    assert out, err[-2000:]
    checked = json.loads(out)["models"][0]
    flagged = [f"{f['code']} {f['severity']}: {f['message'][:200]}" for f in checked["findings"]
               if f["severity"] in ("error", "warning")]
    assert code == 0 and not flagged, (code, flagged, p["fix_first"], gpu)
    assert checked["memory"]["summary"] == p["memory"]
    assert checked["memory"]["trainable_params"] == m["memory"]["trainable_params"]
    code, text, err = world.run("check", *target, *stack, *pins, "--task", task, "--training-config", str(path),
                                "--fail-on", "never")
    assert code == 0, err[-2000:]
    assert_check_states_its_run(json.loads(out), text)


def assert_check_states_its_run(doc: dict[str, Any], text: str) -> None:
    """check of one run states, in its text and in its JSON, the batch, accumulation, precision, checkpointing,
    attention, trainer and memory of its own Run (the model's `run` block)."""
    checked = doc["models"][0]
    run, mem, rec = checked["run"], checked["memory"], checked["recommendation"]
    value = {k: run[k]["value"] for k in ("batch", "gradient_accumulation_steps", "precision", "gradient_checkpointing",
                                          "attention", "method", "trainer")}
    # The JSON: the memory block, the precision decision and the training config's trainer are that Run's.
    assert (mem["run"]["batch_size"], mem["run"]["gradient_accumulation_steps"], mem["run"]["precision"],
            mem["run"]["gradient_checkpointing"], mem["run"]["attention"], mem["method"]) == (
        value["batch"], value["gradient_accumulation_steps"], value["precision"], value["gradient_checkpointing"],
        value["attention"], value["method"]), (mem["run"], run)
    assert rec["precision"] == value["precision"] and mem["summary"] == run["memory"]
    config = doc["environment"].get("training_config")
    if config is not None:
        assert config["trainer"] == run["trainer"]
    # The text: the precision line, the trainer line where a training config decided it, the attention line where the
    # attention is not transformers' default, and the memory line.
    lines = [line.strip() for line in text.splitlines()]
    head = next(line for line in lines if line.startswith("precision "))
    assert head.split()[1] == value["precision"] + ":", head
    acc = value["gradient_accumulation_steps"]
    assert head.endswith(f"batch {value['batch']}" + (f" x{acc} accumulation" if acc > 1 else "")
                         + (", gradient checkpointing" if value["gradient_checkpointing"] else "")), head
    assert METHOD_WORDS[value["method"]] in head, head
    trainer = [line for line in lines if line.startswith("trainer ")]
    assert trainer == ([f"trainer {value['trainer']}: {run['trainer']['source']}"] if config is not None else []), lines
    said = [line for line in lines if line.startswith("attention ")]
    assert said == ([] if run["attention"]["source"] == "default" else
                    [f"attention {value['attention']}: {run['attention']['source']}"]), (said, run["attention"])
    assert f"memory {run['memory']}" in lines


# A way-out line names one change to the command: the option it adds (or the GPU it swaps in).
_CHANGES = ((r"\(--num-gpus (\d+)\)", "--num-gpus"), (r"--seq-len (\d+):", "--seq-len"), (r'\(--gpu "([^"]+)"\)', "--gpu"),
            (r"^--method (\w+):", "--method"), (r"^--trainer ([\w-]+) \(its run: ", "--trainer"))


def followed(args: tuple[str, ...], line: str) -> tuple[tuple[str, ...], str] | None:
    """The command line ``line`` tells the user to run, and the GPU it runs on; None for a finding's cure."""
    for pattern, option in _CHANGES:
        found = re.search(pattern, line)
        if found is None:
            continue
        value, out, skip = found.group(1), [], False
        for i, a in enumerate(args):  # the option replaced where the user gave it, added where not
            if skip:
                skip = False
                continue
            if a == option:
                skip = True
                continue
            out.append(a)
        return (*out, option, value), value if option == "--gpu" else ""
    return None


def assert_way_out_holds(world: World, case: Case, args: tuple[str, ...], m: dict[str, Any], workdir: Path) -> None:
    """(b): no prescription comes with a way out, and each line, followed, prescribes at the figure it states a run
    that passes check."""
    assert m["way_out"], m
    assert_other_trainers_named(world, case, args, m)
    for line in m["way_out"]:
        change = followed(args, line)
        if change is None:
            continue
        new_args, gpu = change
        code, out, err = _recommend(world, new_args, "json")
        got = json.loads(out)["models"][0]
        assert code == 0 and got["prescription"] is not None, (line, got["way_out"], got["blocking"])
        assert line.endswith(got["prescription"]["memory"]), (line, got["prescription"]["memory"])
        # check with the GPU (and the option) the line names
        moved = Case(**{**case.__dict__, "gpu": gpu or case.gpu})
        check_prescription(world, moved, got, workdir)


def assert_other_trainers_named(world: World, case: Case, args: tuple[str, ...], m: dict[str, Any]) -> None:
    """(b): where the trainer was left open and a blocker that is not memory stops every run, a trainer whose run
    passes is named in the way out (`--trainer NAME`): no trainer TRL's or TrainingArguments' format could state (one
    SFT process) prescribes where the way out names none."""
    from gemma_doctor.codes import CODES

    if case.trainer is not None or case.fmt is not None or (case.num_gpus or 1) > 1 or any(
            w.startswith("--trainer ") for w in m["way_out"]):
        return
    codes = {b.split(":", 1)[0] for b in m["blocking"]}
    if all(c in CODES and CODES[c].memory for c in codes):
        return
    for fmt in ("trl", "transformers", "llama-factory"):
        code, out, _ = _recommend(world, (*args, "--trainer", fmt), "json")
        assert code == 1, (fmt, m["way_out"], m["blocking"])


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    return World(tmp_path_factory.mktemp("props"))


def _case(model: tuple[str, ...], gpu: str, **kw: Any) -> Case:
    fields = dict(num_gpus=None, transformers="5.23.0", method=None, trainer=None, targets=None, batch=None,
                  accumulation=None, seq_len=None)
    fields.update(kw)
    return Case(model, gpu, **fields)


# Small enough for the module to run well under a minute on a quiet machine (about 20 s here, 2 cores shared: the
# in-process judgements are shared between examples): each example runs recommend three times and check once (and
# each way-out line once more of each). GEMMA_DOCTOR_HYPOTHESIS=explore searches further (tests/conftest.py).
@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(case=cases())
# A user's all-linear became the language-model regex of the search, with "chosen by the search" as its source (the
# all-linear of a training config was dropped as if it were the plan's default); now kept, and on a multimodal
# checkpoint GD421 (the towers wrapped) blocks it with its cure as the way out.
@example(case=_case((G3,), "A100", method="lora", trainer="trl", targets="all-linear"))
@example(case=_case(("gemma4", "e2b"), "H100", method="qlora", trainer="axolotl", targets="all-linear", batch=2))
# A user's regex, kept, was sourced "chosen by the search".
@example(case=_case((G3,), "L4", method="lora", trainer="axolotl", targets="regex"))
# The language-model regex of a multimodal Gemma, on a text-only Gemma 2, wraps nothing (0 trainable parameters, and
# PEFT raises NoMatchingPeftModuleError): it was prescribed all the same; now GD425 blocks it and its cure is the way out.
@example(case=_case(("gemma2", "2b"), "A10", method="lora", trainer="axolotl", targets="regex", batch=9, seq_len=2048))
@example(case=_case(("gemma2", "2b"), "MI325X", num_gpus=4, method="lora", trainer="trl", targets="regex"))
# Without transformers, a way-out line ("8 GPUs with ZeRO-3 (--num-gpus 8): ... fits", "--seq-len 1024: ... fits") was
# found with the search's own pin (transformers>=5.5.2 for GD107): followed, the command gave no prescription (GD109,
# GD606 under the unpinned stack).
@example(case=_case((G4,), "L4", num_gpus=4, transformers=NO_TRANSFORMERS, method="full", batch=14))
@example(case=_case(("gemma4", "e4b"), "RTX 4090", transformers=NO_TRANSFORMERS, trainer="trl", accumulation=4,
                    seq_len=4096))
# A blocker that is not memory stopped every axolotl run (GD107: Gemma 4 E2B on transformers 5.5.1, where axolotl
# switches use_cache off) and the way out named no other trainer, though TRL's run keeps the cache on and passes.
@example(case=_case((G4,), "A100", transformers="5.5.1"))
# A run the search gives eager attention (Gemma 2's softcapping on transformers 4.50.3, GD640): the draws above, on
# 5.23.0 or no transformers, are always prescribed SDPA, so no view's attention was ever held to the Run's.
@example(case=_case(("gemma2", "2b"), "A100", transformers="4.50.3", method="lora"))
@example(case=_case(("gemma2", "9b"), "H100", transformers="4.50.3", method="lora", trainer="axolotl", targets="list"))
# `--trainer trl|transformers --method full` on a T4: the YAML wrote no use_peft, which check (and so the search's
# judgement of the candidate) read as a method "chosen to fit": prescribed "full fine-tuning" with a QLoRA memory line.
@example(case=_case(("gemma", "2b"), "T4", method="full", fmt="trl"))
@example(case=_case(("gemma", "2b"), "T4", method="full", fmt="transformers"))
# A user's axolotl YAML without `adapter` (full fine-tuning) got a QLoRA prescription once the default was read only
# with the trainer's defaults, which the search's own request does not take.
@example(case=_case((G3,), "P40", method="full", trainer="axolotl"))
def test_one_runs_answers_agree_and_hold_when_followed(world, tmp_path_factory, case):
    workdir = tmp_path_factory.mktemp("case")
    args = recommend_args(world, case, workdir)
    code, out, err = _recommend(world, args, "json")
    m = json.loads(out)["models"][0]
    if m["prescription"] is None:
        assert code == 1 and m["status"] != "prescribed", m
        assert_way_out_holds(world, case, args, m, workdir)
        return
    assert code == 0 and m["status"] == "prescribed", m
    assert_views_agree(world, case, args, m)
    assert_choices_kept(case, m)
    check_prescription(world, case, m, workdir)


def test_the_prescription_does_not_depend_on_the_runs_judged_before(world, monkeypatch, tmp_path):
    """The search tries the rule that rejected the last candidate first (search._LAST_REJECTED, a speed heuristic that
    may change only the order of trying), and decided a transformers pin on the findings of that first rule alone: a
    Gemma 4 run on a stack without transformers was prescribed with SDPA after one earlier run in the process and with
    eager attention after another (found by the property above: its JSON and its YAML, one call apart, differed). Every
    first rule now gives the same answer."""
    from gemma_doctor.plan import search

    case = _case((G4,), "Jetson AGX Orin", num_gpus=6, transformers=NO_TRANSFORMERS, method="full", trainer="axolotl",
                 batch=10)
    args = recommend_args(world, case, tmp_path)
    answers = {}
    for first in ((), *((i,) for i in range(len(search.rules.RULES)))):
        monkeypatch.setattr(search, "_LAST_REJECTED", first)
        monkeypatch.setattr(search, "_WAY_OUTS", {})  # every way out searched after this first rule, not remembered
        code, out, _ = _recommend(world, args, "json")
        answers.setdefault(out, []).append(first)
    assert len(answers) == 1, [(json.loads(o)["models"][0]["prescription"]["attention"], firsts)
                               for o, firsts in answers.items()]


def test_gemma4_without_transformers_pins_past_gd109_instead_of_no_prescription(world, tmp_path):
    """GD109 (a Gemma 4 config's rope_parameters, unread by transformers < 5.0) carried no window, so the search could not
    pin past it: with a stack that names no transformers, full fine-tuning of Gemma 4 E2B on 8 L4s got "no
    prescription" and the way out of the 4-GPU run named that very command (found by the property above)."""
    # (8 L40S since DeepSpeed's fp32 copies are counted: 8 L4s hold no full fine-tuning of E2B under ZeRO-3 then.)
    case = _case((G4,), "L40S", num_gpus=8, transformers=NO_TRANSFORMERS, method="full", batch=14)
    code, out, _ = _recommend(world, recommend_args(world, case, tmp_path), "json")
    m = json.loads(out)["models"][0]
    assert code == 0 and m["prescription"] is not None, m["blocking"]
    # the pin past GD109's window: transformers>=5.0.0, or one past it that resolves more (transformers>=5.5.2 for
    # GD107 since an axolotl run cannot keep the KV-shared cache on: check_model_config, axolotl 0.19.0)
    from packaging.version import Version
    pins = [p["requirement"] for p in m["prescription"]["pins"] if p["requirement"].startswith("transformers>=")]
    assert pins and all(Version(p.split(">=")[1]) >= Version("5.0.0") for p in pins), m["prescription"]["pins"]
    check_prescription(world, case, m, tmp_path)


@pytest.mark.parametrize("targets, flagged", [(TARGETS["regex"], True), (["query", "value"], True), ("(q_proj", True),
                                              (["q_proj", "v_proj"], False), (r".*\.(q_proj|v_proj)", False),
                                              ("all-linear", False)])
def test_lora_targets_that_match_no_layer_of_a_text_only_gemma_are_an_error(world, tmp_path, targets, flagged):
    """GD425: PEFT 0.21.2 raises NoMatchingPeftModuleError for targets that wrap nothing (reproduced on a tiny Gemma 2,
    docs/findings.md), re.error for a regex that does not compile; check said nothing and recommend prescribed it."""
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"use_peft": True, "lora_target_modules": targets}))
    code, out, _ = world.run("check", "org/gemma2-2b", "--cache-dir", str(world.planned.root), "--gpu", "A100",
                             "--training-config", str(config), "--format", "json", "--fail-on", "error")
    found = {f["code"]: f for f in json.loads(out)["models"][0]["findings"]}
    assert ("GD425" in found) is flagged, sorted(found)
    if flagged:
        assert code == 1 and found["GD425"]["severity"] == "error" and found["GD425"]["key"] == "lora_target_modules"
        assert "q_proj" in found["GD425"]["fix"]


def test_check_without_a_prescription_states_its_run_in_the_precision_line(world):
    """With no GPU memory known and no prescription (transformers 4.50.3 on a Gemma 4), the precision line said no
    batch ("fp32: ... on no GPU") while the memory line planned batch 8: the precision line now renders from check's
    own Run, as the memory line does."""
    args = (G4, "--cache-dir", str(world.examples), "--gpu", "none", "--with", "transformers==4.50.3")
    code, out, err = world.run("check", *args, "--format", "json", "--fail-on", "never")
    assert code == 0, err[-2000:]
    doc = json.loads(out)
    assert doc["models"][0]["prescription"] is None
    code, text, err = world.run("check", *args, "--fail-on", "never")
    assert code == 0, err[-2000:]
    assert_check_states_its_run(doc, text)


def test_check_of_a_launch_line_states_its_trainer_and_attention(world):
    """A launch line names the trainer (`trl sft`) and the attention (`--attn_implementation eager`): the text view said
    neither (the JSON's environment block alone had the trainer); both now come with their sources, from check's Run."""
    args = (G3, "--cache-dir", str(world.examples), "--gpu", "A100", "--launch",
            "trl sft --per_device_train_batch_size 2 --attn_implementation eager")
    code, out, err = world.run("check", *args, "--format", "json", "--fail-on", "never")
    assert code == 0, err[-2000:]
    doc = json.loads(out)
    run = doc["models"][0]["run"]
    assert (run["trainer"]["value"], run["attention"]["value"], run["batch"]["value"]) == ("trl-sft", "eager", 2)
    code, text, err = world.run("check", *args, "--fail-on", "never")
    assert code == 0, err[-2000:]
    assert_check_states_its_run(doc, text)

"""The prescription against its own check, over a grid (issue 20): for every point, `recommend --format json` is run,
the training config it prints (`snippets.yaml`, the same text `--format yaml` prints) is handed to `check
--training-config` with the same model, GPU and stack, and the point passes when check raises no error and no warning
other than those `gemma-doctor fix` cures in the model files, or when recommend exits 1 with `prescription: null`
and a non-empty `way_out`.

    python benchmarks/prescription_grid.py [--cache DIR] [--dump FILE] [--shard I/N]   (builds the example cache when
                                                                                        not given)

prints the grid's size, how many points got a prescription that passes, how many an honest "none", and every
violation. tests/test_prescription.py runs the same points (GRID below) through the same function. The grid also
holds a stack that names no transformers (the prescription's pins are handed to check), 1-8 GPUs on every GPU of
gemma_doctor's table (full fine-tuning among them, sharded), every GPU of the table, and LoRA targets (list, regex, all-linear) in a user's axolotl or TRL config; a point also
fails when check's memory line differs from the prescription's, or when the YAML writes a key axolotl's schema lacks
(readers/axolotl_keys.json; axolotl drops such a key without a word) other than the known gap in NOT_AXOLOTLS, or, for
the trainer-format dimension (`--trainer trl|transformers`, trainer_points), a key TRL's parser lacks, or a run check
executes under another trainer than the prescription's. ``--dump`` writes every command's exit code and
stdout, in order (the temporary folder's name blanked): two trees' dumps of one cache are byte-equal when their
searches give the same answers in one process, whatever each remembers between points.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
GPUS = ("T4", "V100", "L4", "A100", "H100", "RTX 3060")
# transformers releases at the edges of the windows that touch these models: the HybridCache crash (4.50.3 / 4.51.0),
# Gemma 3's token_type_ids and Gemma 4's mm_token_type_ids (5.5.x / 5.6.0), Gemma 4's KV sharing (5.5.1 / 5.5.2),
# and today's (5.23.0).
VERSIONS = ("4.50.3", "4.51.0", "5.5.1", "5.5.2", "5.6.0", "5.23.0")
TASKS = ("sft", "lora", "qlora", "full", "dpo")
EXAMPLES = ("google/gemma-3-12b-it", "google/gemma-4-E2B-it")


@dataclass(frozen=True)
class Point:
    """One grid point: a model (cached repo or --family plan), a GPU, a transformers release, a task, fixed choices."""

    target: tuple[str, ...]  # recommend's target arguments
    check_target: tuple[str, ...]  # check's
    gpu: str
    transformers: str
    task: str
    extra: tuple[str, ...] = ()  # fixed choices: --method, --batch-size, --seq-len, --num-gpus...


@dataclass(frozen=True)
class Outcome:
    """What happened at one point."""

    point: Point
    kind: str  # "prescribed" | "none" | "violation"
    detail: str = ""


Runner = Callable[..., tuple[int, str, str]]


# A point's transformers "none": the stack names no transformers (the README's install, where none is installed),
# given as a requirements file without it; the prescription then pins what it needs, and check gets the pins.
NO_TRANSFORMERS = "none"


def _stack(point: Point, workdir: Path) -> tuple[str, ...]:
    if point.transformers != NO_TRANSFORMERS:
        return ("--gpu", point.gpu, "--with", f"transformers=={point.transformers}")
    reqs = workdir / "requirements-without-transformers.txt"
    reqs.write_text("peft==0.21.2\ntrl==1.16.0\naccelerate==1.15.0\n")
    return ("--gpu", point.gpu, "--requirements", str(reqs))


# Keys the YAML still writes that axolotl's schema lacks, each with why it stays (a known gap, not a pass). None since
# `use_cache: true` went: axolotl switches use_cache off whatever its config says (check_model_config, 0.19.0), so the
# YAML no longer writes it and a Run that needs the cache on (Gemma 4's KV sharing on 5.5.0-5.5.1) is GD107 under it.
NOT_AXOLOTLS: dict[str, str] = {}


def axolotl_keys() -> set[str]:
    """The top-level keys of axolotl's config schema (gemma_doctor/readers/axolotl_keys.json, GD986's table)."""
    return set(json.loads((ROOT / "gemma_doctor" / "readers" / "axolotl_keys.json").read_text())["keys"])


def trainer_keys() -> set[str]:
    """The keys TRL's and TrainingArguments' parsers accept (gemma_doctor/readers/trainer_keys.json, GD680's table)."""
    return set(json.loads((ROOT / "gemma_doctor" / "readers" / "trainer_keys.json").read_text())["keys"])


# The keys recommend writes in LLaMA-Factory's YAML (its ModelArguments, DataArguments, FinetuningArguments and
# Seq2SeqTrainingArguments): each parsed by LLaMA-Factory 0.9.5's own HfArgumentParser with allow_extra_keys=False in
# tests/test_trainer_formats.py (slow). The project has no table of LF's every key; this is the part recommend writes.
LF_KEYS = frozenset({
    "model_name_or_path", "stage", "do_train", "finetuning_type", "lora_rank", "lora_alpha", "lora_target",
    "quantization_bit", "quantization_method", "quantization_type", "double_quantization", "template", "cutoff_len",
    "flash_attn", "bf16", "fp16", "pure_bf16", "tf32", "per_device_train_batch_size", "gradient_accumulation_steps",
    "use_reentrant_gc", "disable_gradient_checkpointing", "optim", "output_dir"})


def llamafactory_keys() -> set[str]:
    """The LLaMA-Factory 0.9.5 keys recommend writes (LF_KEYS)."""
    return set(LF_KEYS)


# The trainer formats `recommend --trainer` writes (plan/recommend.TRAINER_FORMATS), by the Run's trainer that executes
# each: the keys its parser accepts, and its name of the per-device batch.
FORMATS = {"axolotl": (axolotl_keys, "micro_batch_size"), "trl-sft": (trainer_keys, "per_device_train_batch_size"),
           "trl-dpo": (trainer_keys, "per_device_train_batch_size"),
           "transformers": (trainer_keys, "per_device_train_batch_size"),
           "llama-factory": (llamafactory_keys, "per_device_train_batch_size")}
# beside axolotl, the default: the grid's trainer-format dimension
TRAINERS = ("trl", "transformers", "llama-factory")


def _yaml_keys(text: str) -> list[str]:
    """The top-level keys of a YAML document."""
    import yaml

    data = yaml.safe_load(text)
    return list(data) if isinstance(data, dict) else []


def judge_point(run: Runner, point: Point, workdir: Path) -> Outcome:
    """recommend, then check of what it printed (with the versions the prescription pins); the outcome at ``point``."""
    stack = _stack(point, workdir)
    code, out, err = run("recommend", *point.target, *stack, "--task", point.task, "--format", "json", *point.extra)
    if code not in (0, 1):
        return Outcome(point, "violation", f"recommend exit {code}: {err.strip()[-300:]}")
    model = json.loads(out)["models"][0]
    if model["prescription"] is None:
        if code == 1 and model["way_out"]:
            return Outcome(point, "none", "; ".join(sorted({b.split(":")[0] for b in model["blocking"]})) or "memory")
        return Outcome(point, "violation", f"no prescription but exit {code} and way_out {model['way_out']!r}")
    if code != 0:
        return Outcome(point, "violation", f"a prescription but exit {code}")
    yaml_text = model["snippets"]["yaml"]
    trainer = model["prescription"]["run"]["trainer"]["value"]
    if trainer not in FORMATS:
        return Outcome(point, "violation", f"the prescription's trainer {trainer} has no format of its own")
    asked = point.extra[point.extra.index("--trainer") + 1] if "--trainer" in point.extra else None
    # the `trl` format's DPO is TRL's DPOTrainer's (`trl dpo --config`)
    if asked is not None and {"trl": "trl-dpo" if point.task == "dpo" else "trl-sft"}.get(asked, asked) != trainer:
        return Outcome(point, "violation", f"--trainer {asked} prescribed a run of {trainer}")
    keys, batch_key = FORMATS[trainer]
    # axolotl drops a key its schema has no field for (GD986's table), TRL's parser refuses one (GD680's): every key
    # the YAML writes must be its trainer's own.
    foreign = sorted(set(_yaml_keys(yaml_text)) - keys() - set(NOT_AXOLOTLS))
    if foreign:
        return Outcome(point, "violation", f"the YAML writes keys {trainer}'s parser lacks: {', '.join(foreign)}")
    path = workdir / "prescription.yaml"
    path.write_text(yaml_text)
    pins = tuple(a for pin in model["prescription"].get("pins", ()) for a in ("--with", pin["requirement"]))
    # The same inputs as recommend's, the task included (a DPO run pairs its sequences: the plan counts both).
    # A TrainingArguments file leaves the sequence length to the script: check is told it, as the YAML's head says.
    seq = ("--seq-len", str(model["prescription"]["seq_len"])) if trainer == "transformers" else ()
    code, out, err = run("check", *point.check_target, *stack, *pins, "--task", point.task, "--training-config",
                         str(path), "--format", "json", "--fail-on", "never", *seq)
    if code != 0:
        return Outcome(point, "violation", f"check exit {code}: {err.strip()[-300:]}")
    checked = json.loads(out)["models"][0]
    findings = checked["findings"]
    flagged = [f"{f['code']} {f['severity']}: {f['message'][:160]}" for f in findings
               if f["severity"] in ("error", "warning") and not (f.get("fix") or "").startswith("gemma-doctor fix")]
    if flagged:
        return Outcome(point, "violation", " | ".join(flagged))
    p = model["prescription"]
    # One method in the prescription, its memory plan and check's plan of its YAML (the memory line said QLoRA under
    # a full fine-tuning prescription: issue 32)
    if not p["method"] == model["memory"]["method"] == checked["memory"]["method"]:
        return Outcome(point, "violation", f"the prescription's method {p['method']}, its memory plan's "
                                           f"{model['memory']['method']}, check's {checked['memory']['method']}")
    if checked["memory"]["summary"] != p["memory"]:  # check plans the very run recommend prescribed
        return Outcome(point, "violation", f"check plans {checked['memory']['summary']}, recommend {p['memory']}")
    # The YAML says the same run as the JSON prescription.
    said = ((batch_key, p["batch_size"]), ("gradient_accumulation_steps", p["gradient_accumulation_steps"]))
    if trainer == "llama-factory":  # it checkpoints unless told: off is written, on is its default
        off = "\ndisable_gradient_checkpointing: true\n" in "\n" + yaml_text
        if off is p["gradient_checkpointing"]:
            return Outcome(point, "violation", f"the YAML does not say gradient checkpointing {p['gradient_checkpointing']}")
    else:
        said += (("gradient_checkpointing", p["gradient_checkpointing"]),)
    for key, value in said:
        # transformers 5.23's name of checkpointing (activation_checkpointing) says it as well
        names = (key, "activation_checkpointing") if key == "gradient_checkpointing" else (key,)
        if not any(f"\n{k}: {json.dumps(value)}\n" in "\n" + yaml_text for k in names):
            return Outcome(point, "violation", f"the YAML does not say {key}: {value}")
    if checked["run"]["trainer"]["value"] != trainer:
        return Outcome(point, "violation", f"check runs the YAML under {checked['run']['trainer']['value']}, "
                                           f"the prescription under {trainer}")
    return Outcome(point, "prescribed")


def example_points(cache: Path, models: tuple[str, ...] = EXAMPLES, gpus: tuple[str, ...] = GPUS,
                   versions: tuple[str, ...] = VERSIONS, tasks: tuple[str, ...] = TASKS) -> list[Point]:
    """The bundled example checkpoints (exact parameter counts from their safetensors headers)."""
    where = ("--cache-dir", str(cache))
    return [Point((m, *where), (m, *where), g, v, t) for m in models for g in gpus for v in versions for t in tasks]


# LoRA targets as a user's training config writes them (issue 32): a list, a regex over whole module names, all-linear.
USER_TARGETS = {"list": ["q_proj", "k_proj", "v_proj", "o_proj"], "regex": r".*language_model.*\.(q_proj|v_proj)",
                "all-linear": "all-linear"}


def _user_config(workdir: Path, trainer: str, method: str, targets: str) -> Path:
    """A training config stating method and LoRA targets, in axolotl's YAML or TRL's JSON."""
    if trainer == "axolotl":
        path = workdir / f"user-{trainer}-{method}-{targets}.yaml"
        data: dict[str, object] = {"base_model": "the-model", "adapter": method, "lora_target_modules": USER_TARGETS[targets]}
        if method == "qlora":
            data["load_in_4bit"] = True
    else:
        path = workdir / f"user-{trainer}-{method}-{targets}.json"
        data = {"use_peft": True, "lora_target_modules": USER_TARGETS[targets]}
        if method == "qlora":
            data["load_in_4bit"] = True
    path.write_text(json.dumps(data))  # JSON is YAML too: axolotl's reader reads it the same
    return path


# How many GPUs a run may use: every count from one to eight (odd ones too: ZeRO partitions and FSDP shards need not be
# a power of two).
GPU_COUNTS = tuple(range(1, 9))


def gpu_count_points(cache: Path) -> list[Point]:
    """1-8 GPUs on every GPU of gemma_doctor's table: the search's choice of method, and full fine-tuning from two GPUs
    (sharded by ZeRO or FSDP). tests/test_prescription.py runs a fixed sample of them."""
    from gemma_doctor import gpus as gpu_table

    where = ("--cache-dir", str(cache))
    points = [Point((m, *where), (m, *where), g.name, "5.23.0", "sft", ("--num-gpus", str(n)))
              for m in EXAMPLES for g in gpu_table.KNOWN_GPUS for n in GPU_COUNTS]
    points += [Point((m, *where), (m, *where), g.name, "5.23.0", "sft", ("--num-gpus", str(n), "--method", "full"))
               for m in EXAMPLES for g in gpu_table.KNOWN_GPUS for n in GPU_COUNTS if n > 1]
    return points


def trainer_points(cache: Path) -> list[Point]:
    """The trainer-format dimension (issue 32): each example on every GPU of the grid, for each SFT task, written for
    TRL's SFTTrainer (`trl sft --config`), a plain Trainer's TrainingArguments and LLaMA-Factory (--trainer), and DPO
    written for TRL's DPOTrainer (`trl dpo --config`); the default (axolotl) is every other point's. Full fine-tuning
    also as `--method full` (with `--task full` check is told the method; with `--method` only the YAML tells it: TRL's
    and TrainingArguments' write no use_peft, which check planned as a method chosen to fit, issue 32)."""
    where = ("--cache-dir", str(cache))
    return [Point((m, *where), (m, *where), g, "5.23.0", t, ("--trainer", tr))
            for m in EXAMPLES for g in GPUS for t in ("sft", "lora", "qlora", "full") for tr in TRAINERS] + \
        [Point((m, *where), (m, *where), g, "5.23.0", "sft", ("--trainer", tr, "--method", "full"))
         for m in EXAMPLES for g in GPUS for tr in TRAINERS] + \
        [Point((m, *where), (m, *where), g, "5.23.0", "dpo", ("--trainer", "trl")) for m in EXAMPLES for g in GPUS]


def extended_points(cache: Path, workdir: Path | None = None) -> list[Point]:
    """Beyond the example grid (issue 32): no transformers named on every GPU of the grid; 1-8 GPUs on every GPU of
    gemma_doctor's table (gpu_count_points); every GPU of the table with and without transformers; and (with
    ``workdir`` for the files) the LoRA targets of a user's axolotl or TRL config as a list, a regex or all-linear.
    tests/test_run_props.py draws its random runs from the same space."""
    from gemma_doctor import gpus as gpu_table

    where = ("--cache-dir", str(cache))
    points = [Point((m, *where), (m, *where), g, NO_TRANSFORMERS, t) for m in EXAMPLES for g in GPUS for t in TASKS]
    points += gpu_count_points(cache)
    points += trainer_points(cache)
    points += [Point((m, *where), (m, *where), g.name, v, "sft")
               for m in EXAMPLES for g in gpu_table.KNOWN_GPUS for v in ("5.23.0", NO_TRANSFORMERS)]
    if workdir is not None:
        points += [Point((m, *where), (m, *where), g, v, "sft", ("--training-config", str(_user_config(workdir, tr, me, tg))))
                   for m in EXAMPLES for g in ("T4", "L4", "A100") for v in ("5.23.0", NO_TRANSFORMERS)
                   for tr in ("axolotl", "trl") for me in ("lora", "qlora") for tg in USER_TARGETS]
    return points


# The GRPO dimension (issue 32, the generation moment): every example on these GPUs ("none": no GPU named), with and
# without transformers, the search's own batch and fixed ones (a generation batch TRL refuses: GD664), a long sequence,
# and 2 or 4 GPUs.
GRPO_GPUS = ("T4", "L4", "A10G", "A100", "A100-80GB", "H100", "none")
GRPO_EXTRAS = ((), ("--batch-size", "1"), ("--batch-size", "3"), ("--batch-size", "4", "--seq-len", "2048"),
               ("--num-gpus", "2"), ("--num-gpus", "4"), ("--batch-size", "1", "--num-gpus", "2"))


def grpo_points(cache: Path) -> list[Point]:
    """`--task grpo` over GRPO_GPUS x GRPO_EXTRAS x (5.23.0, no transformers) for each example."""
    where = ("--cache-dir", str(cache))
    return [Point((m, *where), (m, *where), g, v, "grpo", extra)
            for m in EXAMPLES for g in GRPO_GPUS for v in ("5.23.0", NO_TRANSFORMERS) for extra in GRPO_EXTRAS]


def judge_grpo_point(run: Runner, point: Point, workdir: Path) -> Outcome:
    """judge_point, and for a prescription: its generation batch is one TRL 1.16's GRPOConfig accepts (a multiple of
    num_generations 8), check of its YAML plans the same peak and generation, and the text view's memory line is the
    JSON's summary."""
    outcome = judge_point(run, point, workdir)
    if outcome.kind != "prescribed":
        return outcome
    stack = _stack(point, workdir)
    code, out, _ = run("recommend", *point.target, *stack, "--task", "grpo", "--format", "json", *point.extra)
    model = json.loads(out)["models"][0]
    p = model["prescription"]
    n = int(point.extra[point.extra.index("--num-gpus") + 1]) if "--num-gpus" in point.extra else 1
    if p["batch_size"] * p["gradient_accumulation_steps"] * n % 8:
        return Outcome(point, "violation", f"generation batch {p['batch_size']} x {p['gradient_accumulation_steps']} x "
                                           f"{n} is no multiple of num_generations 8 (GRPOConfig's ValueError)")
    path = workdir / "prescription.yaml"
    pins = tuple(a for pin in p.get("pins", ()) for a in ("--with", pin["requirement"]))
    code, out, _ = run("check", *point.check_target, *stack, *pins, "--task", "grpo", "--training-config", str(path),
                       "--format", "json", "--fail-on", "never")
    checked = json.loads(out)["models"][0]["memory"]
    if checked["peak"] != model["memory"]["peak"] or checked["run"]["generation"] != model["memory"]["run"]["generation"]:
        return Outcome(point, "violation", f"check's peak/generation {checked['peak']} {checked['run']['generation']} "
                                           f"vs recommend's {model['memory']['peak']} {model['memory']['run']['generation']}")
    code, text, _ = run("recommend", *point.target, *stack, "--task", "grpo", *point.extra)
    if f"memory {model['memory']['summary']}" not in text:
        return Outcome(point, "violation", f"the text's memory line differs from the JSON's {model['memory']['summary']}")
    return outcome


def in_process(argv_prefix: tuple[str, ...] = ()) -> Runner:
    """Run the CLI in this process: (exit code, stdout, stderr)."""
    from gemma_doctor.cli import main

    def run(*args: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        code = 0
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main([*argv_prefix, *map(str, args)])
            except SystemExit as e:
                code = int(e.code or 0)
        return code, out.getvalue(), err.getvalue()

    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", help="a hub cache holding the bundled examples (built when not given)")
    ap.add_argument("--dump", help="write every command's exit code and stdout here, in order")
    ap.add_argument("--trainers", action="store_true",
                    help="only the trainer-format points (trainer_points), counted per trainer and task")
    ap.add_argument("--shard", metavar="I/N", default="0/1",
                    help="only every N-th point from the I-th (0-based), so N processes run the grid together; their "
                         "counts add up to the whole grid's")
    ap.add_argument("--grpo", action="store_true", help="only the GRPO points (grpo_points)")
    args = ap.parse_args(argv)
    try:
        shard, shards = (int(x) for x in args.shard.split("/"))
        if not 0 <= shard < shards:
            raise ValueError
    except ValueError:
        ap.error(f"--shard {args.shard}: I/N with 0 <= I < N")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory(prefix="gd-grid-") as tmp:
        cache = Path(args.cache) if args.cache else Path(tmp) / "hub"
        if not args.cache:
            import subprocess

            subprocess.run([sys.executable, str(ROOT / "examples" / "build_example_cache.py"), str(cache)], check=True,
                           capture_output=True)
        run = in_process()
        dumped: list[str] = []
        if args.dump:
            plain = run

            def run(*argv: str) -> tuple[int, str, str]:
                code, out, err = plain(*argv)
                dumped.append(f"{code}\n{out}".replace(tmp, "<tmp>"))
                return code, out, err

        if args.grpo:
            points, judge = grpo_points(cache), judge_grpo_point
        else:
            points = trainer_points(cache) if args.trainers else example_points(cache) + extended_points(cache, Path(tmp))
            judge = judge_point
        points = points[shard::shards]
        outcomes = []
        for i, p in enumerate(points, 1):
            outcomes.append(judge(run, p, Path(tmp)))
            if outcomes[-1].kind == "violation":  # as found: a run cut short still says what it found
                print(f"  found: VIOLATION {p}: {outcomes[-1].detail}", file=sys.stderr, flush=True)
            if i % 100 == 0 or i == len(points):
                done = {k: sum(o.kind == k for o in outcomes) for k in ("prescribed", "none", "violation")}
                print(f"  {i}/{len(points)} points: {done}", file=sys.stderr, flush=True)
        if args.dump:
            Path(args.dump).write_text("\n".join(dumped))
    kinds = {k: sum(o.kind == k for o in outcomes) for k in ("prescribed", "none", "violation")}
    print(f"{len(outcomes)} points: {kinds['prescribed']} prescriptions pass check, {kinds['none']} honest 'none' "
          f"with a way out, {kinds['violation']} violations")
    if args.trainers:
        by: dict[tuple[str, str], dict[str, int]] = {}
        for o in outcomes:
            key = (o.point.extra[1], "dpo" if o.point.task == "dpo" else "sft tasks")
            by.setdefault(key, {"prescribed": 0, "none": 0, "violation": 0})[o.kind] += 1
        for (trainer, task), n in sorted(by.items()):
            print(f"  {trainer} ({task}): {n['prescribed']} prescribed, {n['none']} none, {n['violation']} violations")
    reasons: dict[str, int] = {}
    for o in outcomes:
        if o.kind == "none":
            reasons[o.detail] = reasons.get(o.detail, 0) + 1
    for why, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
        print(f"  none ({n}): check flags {why}")
    for o in outcomes:
        if o.kind == "violation":
            print(f"  VIOLATION {o.point}: {o.detail}")
    return 1 if kinds["violation"] else 0


if __name__ == "__main__":
    sys.exit(main())

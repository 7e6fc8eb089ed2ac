"""The layers run one way: every import of gemma_doctor (top-level and inside functions) goes down the table below,
fixes never reads the rules, and no module imports itself back through others (docs/architecture.md, "Layers")."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "gemma_doctor"

# The layers, lowest first; a module (or a package: every module below it) may import its own layer and those before
# it. The same table is in docs/architecture.md.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("core", ("gemma_doctor", "errors", "frozen", "units", "codes", "report", "family", "targets", "jsonedit", "guards",
              "parallel", "gpus")),
    ("readers", ("fsafe", "locate", "source", "hub", "readers", "stack", "versioning", "horizon", "trainers")),
    ("facts", ("facts", "run", "traits", "model", "adapters", "undo", "catalogue")),
    ("rules", ("rules",)),
    ("plan", ("plan",)),
    ("engine", ("pipeline", "memo", "fixes", "listing")),
    ("render", ("render",)),
    ("commands", ("cli", "__main__", "api", "callback", "rehearse")),
)
# Imports that a layer order allows but the design does not: applying a fix reads the facts, never a rule's opinion
# or the decision (issue 32).
NEVER: tuple[tuple[str, str], ...] = (("fixes", "rules"), ("fixes", "plan"))
# Imports against the order that are allowed only under `if TYPE_CHECKING:` (annotations, never executed): none. The
# rules read check's run as a Run (run.py, on ModelFacts.run); the plan's objects (the precision decision, the memory
# plan, the prescription) travel beside the facts (pipeline.Judgement).
ANNOTATION_ONLY: frozenset[tuple[str, str]] = frozenset()
# What never imports the plan, not even for annotations: the rules and the facts and Run they read (issue 32).
PLAN_FREE = ("facts", "run", "rules")


def modules() -> dict[str, tuple[Path, bool]]:
    """Every module of the package: dotted name -> (file, is a package's __init__)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


MODULES = modules()


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _targets(name: str, is_pkg: bool, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The gemma_doctor modules an import statement loads (``from pkg import mod`` names the module)."""
    if isinstance(node, ast.Import):
        found = [a.name for a in node.names]
    else:
        if node.level:
            base = name.split(".") if is_pkg else name.split(".")[:-1]
            base = base[:len(base) - (node.level - 1)]
            mod = ".".join([*base, *([node.module] if node.module else [])])
        else:
            mod = node.module or ""
        found = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in MODULES else mod for a in node.names]
    out = []
    for target in found:
        if target.split(".")[0] != "gemma_doctor":
            continue
        while target not in MODULES and "." in target:
            target = target.rsplit(".", 1)[0]
        out.append(target)
    return out


def imports(name: str) -> list[tuple[str, int, bool]]:
    """(module, line, annotations only) for every gemma_doctor import in ``name``, at any depth."""
    path, is_pkg = MODULES[name]
    out: list[tuple[str, int, bool]] = []

    def walk(node: ast.AST, typing_only: bool) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.extend((t, node.lineno, typing_only) for t in dict.fromkeys(_targets(name, is_pkg, node)) if t != name)
        if isinstance(node, ast.If) and _type_checking(node.test):
            for child in node.body:
                walk(child, True)
            for child in node.orelse:
                walk(child, typing_only)
            return
        for child in ast.iter_child_nodes(node):
            walk(child, typing_only)

    walk(ast.parse(path.read_text(encoding="utf-8")), False)
    return out


def unit(module: str) -> str:
    """The entry of LAYERS that holds ``module`` (the longest match: a module, else its package)."""
    short = module.split(".", 1)[1] if "." in module else module
    entries = {e for _, names in LAYERS for e in names}
    parts = short.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in entries:
            return ".".join(parts[:i])
    raise KeyError(module)


def layer(module: str) -> int:
    """The index in LAYERS of ``module``'s layer."""
    entry = unit(module)
    return next(i for i, (_, names) in enumerate(LAYERS) if entry in names)


GRAPH = {name: imports(name) for name in MODULES}


def test_every_module_has_one_layer() -> None:
    entries = [e for _, names in LAYERS for e in names]
    assert len(entries) == len(set(entries))
    missing = []
    for name in MODULES:
        try:
            unit(name)
        except KeyError:
            missing.append(name)
    assert not missing, f"modules without a layer (add them to LAYERS and docs/architecture.md): {missing}"
    top = {n.split(".")[1] if "." in n else n for n in MODULES}
    assert not [e for e in entries if e.split(".")[0] not in top], "LAYERS names a module that does not exist"


def _exempt(name: str, target: str) -> bool:
    """Whether ``name`` may import ``target`` for annotations only (ANNOTATION_ONLY)."""
    return (unit(name).split(".")[0], unit(target).split(".")[0]) in ANNOTATION_ONLY


def test_imports_go_down_the_layers() -> None:
    wrong = []
    for name, found in GRAPH.items():
        for target, line, typing_only in found:
            if layer(target) <= layer(name):
                continue
            if typing_only and _exempt(name, target):
                continue
            wrong.append(f"{MODULES[name][0].relative_to(PACKAGE.parent)}:{line} ({LAYERS[layer(name)][0]}) imports "
                         f"{target} ({LAYERS[layer(target)][0]})")
    assert not wrong, "imports against the layer order:\n" + "\n".join(wrong)


def test_fixes_never_read_the_rules_or_the_plan() -> None:
    wrong = [f"{name}:{line} imports {target}" for name, found in GRAPH.items() for target, line, _ in found
             for low, high in NEVER if unit(name).split(".")[0] == low and unit(target).split(".")[0] == high]
    assert not wrong, "\n".join(wrong)


def test_the_rules_and_the_facts_import_nothing_of_the_plan() -> None:
    """rules/, facts.py and run.py name no module of plan/, under TYPE_CHECKING included: the rules judge the Run and
    never reach into the plan's objects (on main before this rule, facts.py named Recommendation and MemoryFacts for
    the annotations of the fields the rules read)."""
    wrong = [f"{MODULES[name][0].relative_to(PACKAGE.parent)}:{line} imports {target}"
             + (" (under TYPE_CHECKING)" if typing_only else "")
             for name, found in GRAPH.items() if unit(name).split(".")[0] in PLAN_FREE
             for target, line, typing_only in found if unit(target).split(".")[0] == "plan"]
    assert not wrong, "\n".join(wrong)


def test_no_import_cycle() -> None:
    # Tarjan's strongly connected components over every import, annotation-only ones included but for the exemptions
    # ANNOTATION_ONLY lists (none now).
    edges = {name: sorted({t for t, _, typing_only in found if not (typing_only and _exempt(name, t))})
             for name, found in GRAPH.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in edges:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


@pytest.mark.parametrize("source, expected", [
    ("import gemma_doctor.rules.memory\n", ["gemma_doctor.rules.memory"]),
    ("from gemma_doctor.plan import memory\n", ["gemma_doctor.plan.memory"]),
    ("def f():\n    from ..plan.memory import gib\n", ["gemma_doctor.plan.memory"]),
    ("from . import common\n", ["gemma_doctor.rules.common"]),
    ("from gemma_doctor import __version__\n", ["gemma_doctor"]),
])
def test_the_walk_sees_every_kind_of_import(source: str, expected: list[str]) -> None:
    """The walk itself: top-level, function-level and relative imports all count (a walk that saw none passes)."""
    name, is_pkg = "gemma_doctor.rules.attention", False
    found = [t for node in ast.walk(ast.parse(source)) if isinstance(node, (ast.Import, ast.ImportFrom))
             for t in _targets(name, is_pkg, node)]
    assert found == expected


def test_the_cli_is_one_module_per_command_and_none_imports_another() -> None:
    """A command's module imports what the commands share (cli.common) and no other command's, and the group names
    them without importing them (cli.COMMANDS): running one command loads no other (docs/architecture.md)."""
    from gemma_doctor.cli import COMMANDS

    commands = {f"gemma_doctor.cli.{module}" for module, _ in COMMANDS.values()}
    assert commands <= set(MODULES) and {"gemma_doctor.cli", "gemma_doctor.cli.common"} <= set(MODULES)
    assert set(MODULES) & {n for n in MODULES if n.startswith("gemma_doctor.cli.")} == commands | {
        "gemma_doctor.cli.common"}, "a module of cli/ that is neither a command nor common.py"
    wrong = [f"{name} imports {target}" for name in commands | {"gemma_doctor.cli", "gemma_doctor.cli.common"}
             for target, _, _ in GRAPH[name] if target in commands and target != name]
    assert not wrong, "\n".join(wrong)


# The settings the Run models (run.Run: trainer, precision, batch, accumulation, sequence length, checkpointing,
# attention, method and LoRA, distributed engine, and run.Written: the settings as the file writes them), by the names the training-config reader gives them (readers/
# training_config.KEYS). A rule judges them from model.run, never from the training config itself.
RUN_FIELDS = ("batch_size", "seq_len", "gradient_accumulation_steps", "gradient_checkpointing", "attn_implementation",
              "flash_attention", "sdp_attention", "bf16", "fp16", "mixed_precision", "lora_target_modules",
              "lora_target_linear", "lora_r", "adapter", "load_in_4bit", "load_in_8bit", "zero_stage", "num_processes",
              "num_machines",
              # how the processes run together (run.Distributed: engine, DeepSpeed's stage, offload, wrap classes)
              "distributed_type", "deepspeed", "fsdp", "fsdp_wrap_classes", "offload_optimizer", "offload_param",
              "fsdp_offload_params",
              # FSDP's version and auto-wrap policy, each as written or left to the default (Distributed.auto_wrap,
              # auto_wrap_stated, version_stated)
              "fsdp_version", "fsdp_auto_wrap_policy", "fsdp_min_num_params",
              # the settings as written (run.Written): tf32, the backend's switches, packing, evaluation, modules_to_save
              "tf32", "flex_attention", "packing", "padding_free", "eval_batch_size", "prediction_loss_only",
              "eval_accumulation_steps", "modules_to_save")
_NAMES = "|".join(RUN_FIELDS)
# A read of one of them from the training config: tc.trainer, tc.get("bf16"), s.get("bf16"), s["bf16"], "bf16" in s.
_READ = re.compile(r'\btc\.trainer\b|\b(?:tc\.get|tc\.settings\.get|s\.get)\(\s*"(' + _NAMES + r')"'
                   r'|\b(?:tc\.settings|s)\[\s*"(' + _NAMES + r')"\]|"(' + _NAMES + r')" in (?:s|tc\.settings)\b')
# What rules/ still reads of them from the training config, and why: the reads left to move to the Run (issue 32),
# and judgements of the file itself. A module moved to the Run leaves this table; a new read fails the test.
# Otherwise empty: the settings as the file writes them (the precision switches and tf32, the backend as named, packing, LoRA's
# targets, modules_to_save and 4-bit loading) are the Run's (run.Written, read through common.written_of), and FSDP's
# auto-wrap policy and version, as written or by default, are the Run's distributed (GD660, GD662).
# GD663 (rules/distributed.py) compares the files themselves: the DeepSpeed JSON's batch against the batch, accumulation
# and machines the training config writes (else TrainingArguments' defaults), as transformers' DeepSpeed integration
# does at start-up, whatever batch the Run plans (`--batch-size`) and whether a Run is made at all.
STILL_READ_FROM_CONFIG: dict[str, frozenset[str]] = {
    "distributed": frozenset({"batch_size", "gradient_accumulation_steps", "num_machines"})}


def config_reads(text: str) -> dict[str, list[int]]:
    """The Run's fields a module's source reads from the training config, with their lines ("trainer": tc.trainer)."""
    found: dict[str, list[int]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        for m in _READ.finditer(line):
            lines = found.setdefault(next((g for g in m.groups() if g), "trainer"), [])
            if number not in lines:
                lines.append(number)
    return found


def test_the_rules_read_the_runs_fields_from_the_run() -> None:
    """A rule judges the trainer, precision, batch, sequence, checkpointing, attention, LoRA and engine of the run from
    model.run, not from the training config (issue 32): on main before this rule, rules/tokens.py (GD903) and
    rules/attention.py (GD650) read tc.trainer."""
    wrong = [f"rules/{path.name}:{line} reads {field} from the training config, not from model.run"
             for path in sorted((PACKAGE / "rules").glob("*.py"))
             for field, lines in config_reads(path.read_text()).items()
             if field not in STILL_READ_FROM_CONFIG.get(path.stem, frozenset()) for line in lines]
    assert not wrong, "\n".join(wrong)
    stale = [f"{stem}: {field}" for stem, fields in STILL_READ_FROM_CONFIG.items() for field in fields
             if field not in config_reads((PACKAGE / "rules" / f"{stem}.py").read_text())]
    assert not stale, "moved to the Run: take them out of STILL_READ_FROM_CONFIG\n" + "\n".join(stale)


@pytest.mark.parametrize("line, expected", [
    ('    chosen = tc.trainer.value', {"trainer": [1]}),
    ('    b, s = tc.get("batch_size"), tc.get("seq_len")', {"batch_size": [1], "seq_len": [1]}),
    ('    if "gradient_checkpointing" in s and truthy(s["bf16"].value):', {"gradient_checkpointing": [1], "bf16": [1]}),
    ('    uc = tc.get("use_cache")  # not a field of the Run', {}),
    # the distributed settings (run.Distributed), each way of reading them
    ('    dist, procs = tc.get("distributed_type"), tc.get("num_processes")', {"distributed_type": [1],
                                                                             "num_processes": [1]}),
    ('    if tc.get("deepspeed") is not None or tc.settings.get("fsdp") is not None:', {"deepspeed": [1], "fsdp": [1]}),
    ('    z, w = s["zero_stage"].value, s.get("fsdp_wrap_classes")', {"zero_stage": [1], "fsdp_wrap_classes": [1]}),
    ('    if "offload_optimizer" in s or "fsdp_offload_params" in tc.settings:', {"offload_optimizer": [1],
                                                                              "fsdp_offload_params": [1]}),
    ('    off = tc.get("offload_param")', {"offload_param": [1]}),
    # FSDP's version and auto-wrap policy as written (GD662, GD660 read them from the Run: Distributed)
    ('    version, policy = tc.get("fsdp_version"), tc.get("fsdp_auto_wrap_policy")', {"fsdp_version": [1],
                                                                                   "fsdp_auto_wrap_policy": [1]}),
    ('    minimum = s.get("fsdp_min_num_params")', {"fsdp_min_num_params": [1]}),
    ('    engine = run.distributed.engine.value', {}),
    ('    batch = run.batch.value', {}),
    ('    packing = tc.get("packing")', {"packing": [1]}),
    ('    packing = model.run.written.packing', {}),
])
def test_the_read_scan_sees_each_way_of_reading(line: str, expected: dict[str, list[int]]) -> None:
    """The scan itself: each way a rule reads a setting counts, and reading the Run does not (a scan that saw none
    passes)."""
    assert config_reads(line) == expected

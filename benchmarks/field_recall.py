"""Recall of `check` on reports from the field scan: caught / partly / missed, per area, for one or two source trees.

Each report of benchmarks/field_corpus.json carries the inputs a user has (config.json, a training config, the
versions with --with, the GPU) and the codes that count: `expect` (caught) and `partly`. The report's inputs are laid
out in a temporary folder and `python -m gemma_doctor check ... --format json` runs on them with PYTHONPATH set to
each tree, so main as it is and this branch are measured the same way:

    git archive main | tar -x -C /tmp/gd-main
    python benchmarks/field_recall.py --tree before=/tmp/gd-main --tree after=. [--json out.json]

A report is *caught* when one of its `expect` codes is reported, *partly* when one of its `partly` codes is, else
*missed*. "held out" are the reports the catalogue (gemma_doctor/catalogue/field.json) does not cite.

`--rehearse` adds the column "caught by the rehearsal" (issue 34): `gemma-doctor rehearse` (no rule of `check` runs
in it) on a tiny twin of the report's config.json with the report's training config, in the interpreter of the
reproduction venv (tests/venvs.py) whose locked versions satisfy every `--with` requirement of the report, else the
pinned stack's (tests/constraints.txt) when it does. A report is *caught* only when a rehearsal finding is on the
stage named by the report's `rehearsal.stage` in the corpus and is about the report's failure: its code is one of
`rehearsal.codes`, and, when `rehearsal.shows` is given, its message holds that text (the report's own error). The
catalogue's name for a crash (details.catalogue) is never looked at. *not caught* otherwise; *not here* (with why)
when the report's failure lives in a serving engine, a GPU kernel, a trainer or converter the venvs do not hold, or a
stack no venv provides. A LLaMA-Factory report (its config holds `template`, or its `--with` names llamafactory) runs
through `llamafactory-cli train` in LLaMA-Factory's venv (tests/venvs.py ensure_llamafactory) when that stack provides
its `--with`. The expectation of each rehearsable report is written in the corpus before it is run.

    python benchmarks/field_recall.py --rehearse [--only ID ...] [--rehearsal-docs docs/rehearsal.md]

Where no venv of tests/venvs.py provides a report's `--with`, FIELD_STACKS names one built for it (the report's pins
and what the rehearsal needs beside them, said in the report's row); `--build-stacks` builds and locks them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Mapping

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "benchmarks" / "field_corpus.json"
sys.path.insert(0, str(ROOT))  # tests.venvs: the reproduction venvs and their locks


def run_check(tree: Path, inputs: dict, work: Path) -> set[str]:
    """The finding codes `check` reports for one report's inputs, with the gemma_doctor of ``tree``."""
    model = work / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps(inputs["config"]))
    if "tokenizer_config" in inputs:
        (model / "tokenizer_config.json").write_text(json.dumps(inputs["tokenizer_config"]))
    args = [sys.executable, "-m", "gemma_doctor", "check", str(model), "--format", "json"]
    if "training" in inputs:
        (work / "train.json").write_text(json.dumps(inputs["training"]))
        args += ["--training-config", str(work / "train.json")]
    for w in inputs.get("with", []):
        args += ["--with", w]
    args += ["--gpu", inputs.get("gpu", "none")]
    env = dict(os.environ, PYTHONPATH=str(tree), HF_HUB_OFFLINE="1")
    proc = subprocess.run(args, capture_output=True, text=True, env=env, cwd=work, timeout=120)
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise SystemExit(f"check failed on {inputs}: {proc.stderr[-2000:]}") from None
    return {f["code"] for m in doc["models"] for f in m["findings"]}


def verdict(report: dict, codes: set[str]) -> str:
    if codes & set(report["expect"]):
        return "caught"
    if codes & set(report["partly"]):
        return "partly"
    return "missed"


def cited_refs() -> set[str]:
    doc = json.loads((ROOT / "gemma_doctor" / "catalogue" / "field.json").read_text())
    return {s["ref"] for e in doc["entries"] for s in e["sources"]}


def measure(trees: dict[str, Path]) -> list[dict]:
    reports = json.loads(CORPUS.read_text())["reports"]
    cited = cited_refs()
    rows = []
    for report in reports:
        row = {"id": report["id"], "area": report["area"], "detectable": report["detectable"],
               "held_out": report["id"] not in cited}
        for label, tree in trees.items():
            with tempfile.TemporaryDirectory() as tmp:
                codes = run_check(tree, report["inputs"], Path(tmp))
            row[label] = verdict(report, codes)
            row[label + "_codes"] = sorted(codes & set(report["expect"] + report["partly"]))
        rows.append(row)
    return rows


def table(rows: list[dict], labels: list[str]) -> str:
    """Markdown: per area, caught / partly / missed for each tree; then totals, all and held out."""
    out = ["| area | reports | " + " | ".join(f"{t} caught / partly / missed" for t in labels) + " |",
           "| --- | ---: | " + " | ".join("---" for _ in labels) + " |"]
    by_area: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_area[r["area"]].append(r)

    def cell(group: list[dict], label: str) -> str:
        c = Counter(r[label] for r in group)
        return f"{c['caught']} / {c['partly']} / {c['missed']}"

    for area in sorted(by_area):
        out.append(f"| {area} | {len(by_area[area])} | " + " | ".join(cell(by_area[area], t) for t in labels) + " |")
    for name, group in (("**all**", rows), ("**held out** (not cited by the catalogue)", [r for r in rows if r["held_out"]]),
                        ("**detectable** (yes)", [r for r in rows if r["detectable"] == "yes"])):
        out.append(f"| {name} | {len(group)} | " + " | ".join(cell(group, t) for t in labels) + " |")
    return "\n".join(out)


# -- the rehearsal's column ----------------------------------------------------------------------------------------
# Where a report's failure lives when the rehearsal cannot meet it on this machine.
SERVING = ("vllm", "text-generation-inference", "sglang", "ollama", "llama-cpp-python")
GPU_PACKAGES = {"liger-kernel": "Liger Kernel's Triton kernels", "unsloth": "Unsloth's kernels",
                "unsloth-zoo": "Unsloth's kernels", "bitsandbytes": "bitsandbytes' kernels",
                "flash-attn": "flash-attention's kernels"}
TRAINERS = {"llamafactory": "LLaMA-Factory", "axolotl": "axolotl", "ms-swift": "ms-swift"}
# Keys only an axolotl config holds (the readers' own split of axolotl and TRL keys).
AXOLOTL_KEYS = ("base_model", "micro_batch_size", "lora_target_linear", "adapter")
# The modules of axolotl's data path the rehearsal imports (gemma_doctor/rehearse/axolotl.py).
AXOLOTL_MODULES = ("axolotl.prompt_strategies", "axolotl.prompt_tokenizers", "axolotl.datasets",
                   "axolotl.utils.collators", "axolotl.utils.dict")


def _name(spec: str) -> str:
    from packaging.requirements import Requirement

    return Requirement(spec).name.lower().replace("_", "-")


# Stacks built for reports whose `--with` no venv of tests/venvs.py provides: the report's own pins, and beside them
# what the rehearsal needs to run (accelerate, huggingface_hub<1.0 for transformers 4.x; PEFT, TRL and datasets where
# the report names them or the trainer imports them), each the release of the report's date, or the one its own
# system info lists (pyarrow of the date where TRL 0.9.6 holds numpy below 2.0, which today's pyarrow refuses at import).
# Built through tests/venvs.py's ensure_venv (cached, locked in tests/venv-locks/ like the others:
# `--build-stacks`); only this benchmark uses them, no test builds them. Each: (label, packages, packages beside the
# venv on PYTHONPATH (LLaMA-Factory, installed without its dependencies as ensure_llamafactory does), the report's
# requirements a release stands in for (name -> what the row says), what the row says was added).
FIELD_STACKS: tuple[tuple[str, tuple[str, ...], tuple[str, ...], dict[str, str], str], ...] = (
    # LlamaFactory#7893: LLaMA-Factory 0.9.2's ceiling; its own accelerate ceiling (1.2.1) beside it.
    ("TRANSFORMERS_4_49", ("transformers==4.49.0", "accelerate==1.2.1", "huggingface_hub<1.0"), (), {},
     "added accelerate 1.2.1 (LLaMA-Factory 0.9.2's ceiling), huggingface_hub<1.0"),
    # transformers#36938: the report's system info (transformers 4.50.0, accelerate 1.3.0, huggingface_hub 0.28.1).
    ("TRANSFORMERS_4_50_ACCEL_1_3", ("transformers==4.50.0", "accelerate==1.3.0", "huggingface_hub<1.0"), (), {},
     "added huggingface_hub<1.0"),
    # transformers#37197 (2025-04-01): the accelerate of 4.50.3's days.
    ("TRANSFORMERS_4_50_3", ("transformers==4.50.3", "accelerate==1.5.2", "huggingface_hub<1.0"), (), {},
     "added accelerate 1.5.2, huggingface_hub<1.0"),
    # peft#2128 (2024-10-04): the transformers, accelerate and datasets releases of its date beside PEFT 0.12.0 / TRL 0.9.6.
    ("PEFT_0_12_TRL_0_9", ("transformers==4.45.1", "accelerate==0.34.2", "huggingface_hub<1.0", "peft==0.12.0",
                           "trl==0.9.6", "datasets==3.0.1", "pyarrow==17.0.0"), (), {},
     "added transformers 4.45.1, accelerate 0.34.2, datasets 3.0.1, pyarrow 17.0.0 (of the report's date), "
     "huggingface_hub<1.0"),
    # axolotl#2834 (2025-06-26): PEFT, accelerate and datasets of its date; axolotl 0.19.0's data path beside it.
    ("TRANSFORMERS_4_52_4", ("transformers==4.52.4", "accelerate==1.7.0", "huggingface_hub<1.0", "peft==0.15.2",
                             "datasets==3.6.0"), (), {},
     "added accelerate 1.7.0, peft 0.15.2, datasets 3.6.0 (of the report's date), huggingface_hub<1.0"),
    # axolotl#2850 (2025-06-30): the report's transformers 4.53.0 and timm (Gemma 3n's vision tower), the PEFT,
    # accelerate and datasets of its date; torchvision 0.28.0, timm's requirement, the one built for torch 2.13.
    ("TRANSFORMERS_4_53_TIMM", ("transformers==4.53.0", "accelerate==1.8.1", "huggingface_hub<1.0", "peft==0.15.2",
                                "datasets==3.6.0", "timm==1.0.16", "torchvision==0.28.0"), (), {},
     "added timm 1.0.16 (the report installed timm), torchvision 0.28.0 (timm's, built for torch 2.13), accelerate "
     "1.8.1, peft 0.15.2, datasets 3.6.0 (of the report's date), huggingface_hub<1.0"),
    # LlamaFactory#7427: the report's system info (transformers 4.50.0, datasets 3.3.2, accelerate 1.4.0, TRL 0.9.6)
    # beside LLaMA-Factory 0.9.3, the nearest release with the gemma3 template (0.9.3.dev0 is not on PyPI; 0.9.2 has no
    # gemma3 template); its dependency check wants peft>=0.14.0, so peft 0.14.0 for the report's 0.12.0.
    ("LLAMAFACTORY_0_9_3", ("transformers==4.50.0", "accelerate==1.4.0", "huggingface_hub<1.0", "peft==0.14.0",
                            "trl==0.9.6", "datasets==3.3.2", "pyarrow==19.0.1", "omegaconf==2.3.0",
                            "pydantic==2.10.6"),
     ("llamafactory==0.9.3",),
     {"llamafactory": "llamafactory 0.9.3 for 0.9.3.dev0 (not on PyPI; 0.9.2 has no gemma3 template)"},
     "added accelerate 1.4.0, datasets 3.3.2, trl 0.9.6 (the report's), peft 0.14.0 (LLaMA-Factory 0.9.3's floor; "
     "the report's 0.12.0), pyarrow 19.0.1 (of its date: TRL 0.9.6 holds numpy below 2), omegaconf 2.3.0 and "
     "pydantic 2.10.6 (LLaMA-Factory's train path imports them), huggingface_hub<1.0"),
)


def _locked(path: Path) -> dict[str, str]:
    """Every ``name==version`` of a lock or constraints file, by normalised name."""
    out = {}
    for line in path.read_text().splitlines():
        spec = line.split("#", 1)[0].strip()
        if "==" in spec:
            name, version = (x.strip() for x in spec.split("==", 1))
            out[name.lower().replace("_", "-")] = version
    return out


def field_stack(label: str) -> tuple[str, tuple[str, ...], tuple[str, ...], dict[str, str], str] | None:
    return next((s for s in FIELD_STACKS if s[0] == label), None)


def build_stacks() -> list[Path]:
    """Build every FIELD_STACKS venv through ensure_venv and freeze the unlocked ones into tests/venv-locks/."""
    from tests import venvs

    written = []
    for label, packages, beside, _, _ in FIELD_STACKS:
        lock = venvs.lock_file(packages)
        python = venvs.ensure_venv(packages)
        if beside:
            venvs.ensure_packages(beside)
        if not lock.exists():
            lock.parent.mkdir(parents=True, exist_ok=True)
            lock.write_text(f"# The venv of tests/venvs.py for {' '.join(packages)}: every package, exact "
                            "(python -m tests.venvs --lock).\n" + "\n".join(venvs._frozen(python)) + "\n")
            written.append(lock)
        print(f"{label}: {python}", file=sys.stderr, flush=True)
    return written


def stacks() -> list[tuple[str, tuple[str, ...] | None, dict[str, str]]]:
    """(label, the venv's packages or None for the pinned stack, every locked version): the pinned stack first, then
    tests/venvs.py's venvs, then this benchmark's FIELD_STACKS (their exact pins where not yet locked)."""
    from tests import venvs

    locked = _locked
    found = [("pinned stack", None, locked(venvs.CONSTRAINTS))]
    for label in ("LEGACY", "V4_PRE_LAYOUT", "V4_LATE", "V5_EARLY", "ACCEL_FSDP2_TIED", "LLAMAFACTORY_STACK"):
        packages = getattr(venvs, label)
        if venvs.lock_file(packages).exists():
            versions = locked(venvs.lock_file(packages))
            if label == "LLAMAFACTORY_STACK":  # LLaMA-Factory itself sits beside the stack (ensure_llamafactory)
                for spec in venvs.LLAMAFACTORY_PACKAGES:
                    name, version = spec.split("==")
                    versions[_name(name)] = version
            found.append((label, packages, versions))
    for label, packages, beside, stands_for, _ in FIELD_STACKS:
        lock = venvs.lock_file(packages)
        versions = locked(lock) if lock.exists() else {_name(p): p.split("==", 1)[1] for p in packages if "==" in p}
        for spec in beside:
            name, version = spec.split("==")
            versions[_name(name)] = version
        found.append((label, packages, versions))
    return found


def llamafactory_report(report: dict) -> bool:
    """A report of a LLaMA-Factory run: it names llamafactory, or its config holds LLaMA-Factory's `template` key."""
    inputs = report["inputs"]
    return "template" in inputs.get("training", {}) or any(_name(w) == "llamafactory" for w in inputs.get("with", []))


def axolotl_report(report: dict) -> bool:
    """A report of an axolotl run: it names axolotl, or its config holds axolotl's own keys."""
    inputs = report["inputs"]
    return any(k in inputs.get("training", {}) for k in AXOLOTL_KEYS) \
        or any(_name(w) == "axolotl" for w in inputs.get("with", []))


def provides(versions: dict[str, str], specs: list[str], stands_for: Mapping[str, str] | None = None) -> bool:
    """True when every requirement of ``specs`` is installed at a version it allows (a name of ``stands_for``: the
    stack's nearest release stands in for the one asked for, which is not on PyPI)."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    for spec in specs:
        req = Requirement(spec)
        if stands_for and _name(spec) in stands_for:
            if _name(spec) not in versions:
                return False
            continue
        have = versions.get(_name(spec))
        if have is None or not req.specifier.contains(Version(have), prereleases=True):
            return False
    return True


def llamafactory_stack(label: str) -> bool:
    """True for a stack with LLaMA-Factory beside it (tests/venvs.py's, or one of FIELD_STACKS)."""
    stack = field_stack(label)
    return label == "LLAMAFACTORY_STACK" or (stack is not None and any(_name(p) == "llamafactory" for p in stack[2]))


def stack_provides(stack: tuple, specs: list[str]) -> bool:
    """True when ``stack`` (a row of stacks()) provides every requirement of ``specs``."""
    label, _, versions = stack
    extra = field_stack(label)
    return provides(versions, specs, extra[3] if extra else None)


def _beside(found: list, what: str) -> str:
    """The LLaMA-Factory stacks here, in words (for a report none of them provides)."""
    return "; ".join(f"llamafactory {v['llamafactory']} with transformers {v['transformers']}"
                     for label, _, v in found if llamafactory_stack(label) and what in v)


def not_here(report: dict, found: list) -> str | None:
    """Why the rehearsal cannot meet this report's failure on this machine, or None when a stack here provides it."""
    inputs, plan = report["inputs"], report.get("rehearsal") or {}
    if plan.get("not_here"):
        return plan["not_here"]
    names = [_name(w) for w in inputs.get("with", [])]
    serving = [n for n in names if n in SERVING]
    if serving or report["area"] == "serving":
        return f"serving engine ({', '.join(serving) or 'the server'}): the rehearsal runs training, not a server"
    if report["area"] == "export":
        return "export converter (GGUF / Ollama): the rehearsal runs no converter"
    training = inputs.get("training", {})
    gpu = [GPU_PACKAGES[n] for n in names if n in GPU_PACKAGES]
    if training.get("use_liger_kernel") or training.get("enable_liger_kernel"):
        gpu.append(GPU_PACKAGES["liger-kernel"])
    if training.get("load_in_4bit") or training.get("load_in_8bit"):
        gpu.append(GPU_PACKAGES["bitsandbytes"])
    if gpu:
        return f"GPU kernel: {sorted(set(gpu))[0]} need a GPU"
    trainers = [TRAINERS[n] for n in names if n in TRAINERS] + (["axolotl"] if any(k in training for k in AXOLOTL_KEYS)
                                                                else [])
    if llamafactory_report(report):
        # LLaMA-Factory's own train, through its CLI, in the venv of its stack (tests/venvs.py ensure_llamafactory)
        if any(llamafactory_stack(f[0]) and stack_provides(f, inputs.get("with", [])) for f in found):
            return None
        return "stack no venv here provides: " + ", ".join(inputs.get("with", [])) + " (LLaMA-Factory's venvs: " \
               + _beside(found, "llamafactory") + ")"
    if trainers and trainers != ["axolotl"]:
        return f"trainer not in the stacks here: {trainers[0]}"
    if not any(stack_provides(f, inputs.get("with", [])) for f in found if not llamafactory_stack(f[0])):
        return "stack no venv here provides: " + ", ".join(inputs.get("with", []))
    return None


def rehearse_report(report: dict, tree: Path, found: list, work: Path, timeout: float = 300.0) -> dict:
    """The rehearsal's verdict on one report: caught / not caught / not here, with the stack, codes and why."""
    why = not_here(report, found)
    if why is not None:
        return {"rehearsal": "not here", "rehearsal_why": why}
    plan = report.get("rehearsal")
    if not plan or not plan.get("stage") or not plan.get("codes"):
        raise SystemExit(f"{report['id']}: rehearsable here, but the corpus names no rehearsal.stage / codes for it")
    factory = llamafactory_report(report)
    label, packages, _ = next(f for f in found if stack_provides(f, report["inputs"].get("with", []))
                              and llamafactory_stack(f[0]) == factory)
    extra = field_stack(label)
    said = "; ".join([*(extra[3].values() if extra else ()), *((extra[4],) if extra else ())])
    from tests import venvs

    path = str(tree)
    python = Path(sys.executable) if packages is None else venvs.ensure_venv(packages)
    if factory and label == "LLAMAFACTORY_STACK":
        python, folder = venvs.ensure_llamafactory()
        path = os.pathsep.join((str(tree), str(folder)))
    elif factory:
        # LLaMA-Factory without its dependencies beside the stack, as ensure_llamafactory puts it
        path = os.pathsep.join((str(tree), str(venvs.ensure_packages(extra[2]))))
    elif axolotl_report(report):
        # axolotl's own data path where axolotl is importable (rehearse/axolotl.py): its package, no dependencies
        from tests.test_catalogue import AXOLOTL

        path = os.pathsep.join((str(tree), str(venvs.ensure_packages(AXOLOTL))))
        if packages is not None:
            # axolotl 0.19.0 was released beside a later stack: where its data path does not import beside this one,
            # the report's axolotl run cannot be rehearsed here (said with the import error, nothing run)
            probe = subprocess.run([str(python), "-c", "import " + ", ".join(AXOLOTL_MODULES)], capture_output=True,
                                   text=True, env=venvs.subprocess_env(PYTHONPATH=path), timeout=600)
            if probe.returncode:
                last = (probe.stderr.strip().splitlines() or ["?"])[-1]
                return {"rehearsal": "not here", "rehearsal_why": f"stack no venv here provides: axolotl 0.19.0's data "
                        f"path does not import beside {label} ({', '.join(packages)}): {last}"}
    inputs = report["inputs"]
    model = work / "google--report-model"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps(inputs["config"]))
    if "tokenizer_config" in inputs:
        (model / "tokenizer_config.json").write_text(json.dumps(inputs["tokenizer_config"]))
    if factory:
        import yaml

        # The report's LLaMA-Factory keys as a YAML for `llamafactory-cli train` (a YAML: LLaMA-Factory 0.9.5 cannot
        # read a JSON config, LlamaFactory#10316); what any such YAML must name and the report does not give (a
        # training run, a dataset: synthetic rows in LLaMA-Factory's default format).
        (work / "train.yaml").write_text(yaml.safe_dump({"do_train": True, "dataset": "report_rows",
                                                         **inputs.get("training", {})}))
        run = ["--launch", "llamafactory-cli train train.yaml"]
    else:
        (work / "train.json").write_text(json.dumps(inputs.get("training", {})))
        run = ["--training-config", str(work / "train.json")]
    started = time.monotonic()
    proc = subprocess.run([str(python), "-m", "gemma_doctor", "rehearse", str(model), *run, "--format", "json",
                           "--timeout", f"{timeout:g}"],
                          capture_output=True, text=True, cwd=work, timeout=3 * timeout + 600,
                          env=venvs.subprocess_env(PYTHONPATH=path))
    seconds = round(time.monotonic() - started, 1)
    try:
        doc = json.loads(proc.stdout)["rehearsals"][0]
    except (json.JSONDecodeError, KeyError, IndexError):
        return {"rehearsal": "not caught", "rehearsal_stack": f"{label} ({said})" if said else label,
                "rehearsal_seconds": seconds,
                "rehearsal_why": "the rehearsal gave no verdict: " + (proc.stderr.strip().splitlines() or ["?"])[-1]}
    # Caught: a finding on the report's stage, of one of its codes, holding the report's own error text when the
    # corpus names one. The catalogue's label of a crash (details.catalogue) is not read: the rehearsal alone.
    hits = [f for f in doc["findings"] if f.get("key") == plan["stage"] and f["code"] in plan["codes"]
            and (not plan.get("shows") or plan["shows"].lower() in f["message"].lower())]
    stack = doc.get("stack") or {}
    versions = ", ".join(f"{k} {stack[k]}" for k in ("transformers", "peft", "trl", "accelerate") if stack.get(k))
    return {"rehearsal": "caught" if hits else "not caught",
            "rehearsal_stack": f"{label} ({versions}{'; ' + said if said else ''})",
            "rehearsal_codes": sorted({f["code"] for f in doc["findings"]}), "rehearsal_seconds": seconds,
            "rehearsal_why": (hits[0]["message"] if hits else
                              "; ".join(f"{f['code']} {f['message']}" for f in doc["findings"])
                              or f"no finding: every stage passed ({doc.get('status')})")[:300]}


def rehearsal_table(rows: list[dict]) -> str:
    """Markdown: per area, caught / not caught / not here by the rehearsal."""
    out = ["| area | reports | caught by the rehearsal / not caught / not here |", "| --- | ---: | --- |"]
    by_area: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_area[r["area"]].append(r)

    def cell(group: list[dict]) -> str:
        c = Counter(r["rehearsal"] for r in group)
        return f"{c['caught']} / {c['not caught']} / {c['not here']}"

    for area in sorted(by_area):
        out.append(f"| {area} | {len(by_area[area])} | {cell(by_area[area])} |")
    out.append(f"| **all** | {len(rows)} | {cell(rows)} |")
    return "\n".join(out)


REHEARSAL_BEGIN = "<!-- BEGIN rehearsal recall: written by `python benchmarks/field_recall.py --rehearse " \
                  "--rehearsal-docs`, do not edit -->"
REHEARSAL_END = "<!-- END rehearsal recall -->"


def write_rehearsal_docs(page: Path, rows: list[dict]) -> None:
    """Replace the rehearsal's measured block of ``page``: the table, the reports it ran, and why the rest could not."""
    ran = [r for r in rows if r["rehearsal"] != "not here"]
    lines = [REHEARSAL_BEGIN, rehearsal_table(rows), "", "Rehearsed here:", "",
             "| report | stack | verdict | seconds | the rehearsal's finding, or why not caught |",
             "| --- | --- | --- | ---: | --- |"]
    for r in ran:
        why = r["rehearsal_why"].replace("|", "\\|")
        lines.append(f"| {r['id']} | {r.get('rehearsal_stack', '')} | {r['rehearsal']} | {r.get('rehearsal_seconds', '')} "
                     f"| {why} |")
    reasons = Counter(r["rehearsal_why"].split(":")[0].split(" (")[0] for r in rows if r["rehearsal"] == "not here")
    lines += ["", "Not here: " + ", ".join(f"{n} {why}" for why, n in reasons.most_common()) + ".", "",
              "| report | why not here |", "| --- | --- |"]
    lines += [f"| {r['id']} | {r['rehearsal_why']} |" for r in rows if r["rehearsal"] == "not here"]
    lines.append(REHEARSAL_END)
    text = page.read_text()
    if REHEARSAL_BEGIN in text:
        head, rest = text.split(REHEARSAL_BEGIN, 1)
        _, tail = rest.split(REHEARSAL_END, 1)
    else:
        head, tail = text.rstrip("\n") + "\n\n", "\n"
    page.write_text(head + "\n".join(lines) + tail)


def measured_rows(page: Path) -> dict[str, dict]:
    """The rows of the rehearsal block ``page`` holds, by report id (what an earlier run measured), for --only to keep."""
    import re

    text = page.read_text()
    if REHEARSAL_BEGIN not in text:
        return {}
    block = text.split(REHEARSAL_BEGIN, 1)[1].split(REHEARSAL_END, 1)[0]
    areas = {r["id"]: r["area"] for r in json.loads(CORPUS.read_text())["reports"]}
    rows = {}
    for line in block.splitlines():
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if not cells or cells[0] not in areas:
            continue
        if len(cells) == 5:
            rows[cells[0]] = {"id": cells[0], "area": areas[cells[0]], "rehearsal": cells[2],
                              "rehearsal_stack": cells[1], "rehearsal_seconds": cells[3], "rehearsal_why": cells[4]}
        elif len(cells) == 2:
            rows[cells[0]] = {"id": cells[0], "area": areas[cells[0]], "rehearsal": "not here",
                              "rehearsal_why": cells[1]}
    return rows


def with_measured(rows: list[dict], page: Path) -> list[dict]:
    """``rows`` (an --only run) with every other report's row as ``page`` holds it, in the corpus's order."""
    measured = {**measured_rows(page), **{r["id"]: r for r in rows}}
    return [measured[r["id"]] for r in json.loads(CORPUS.read_text())["reports"] if r["id"] in measured]


def measure_rehearsal(tree: Path, only: list[str], timeout: float = 300.0) -> list[dict]:
    """The rehearsal's column over the corpus (or the reports of ``only``)."""
    found = stacks()
    rows = []
    for report in json.loads(CORPUS.read_text())["reports"]:
        if only and report["id"] not in only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            row = {"id": report["id"], "area": report["area"],
                   **rehearse_report(report, tree, found, Path(tmp), timeout)}
        print(f"{row['id']:48} {row['rehearsal']:10} {row.get('rehearsal_seconds', '')} {row['rehearsal_why'][:120]}",
              file=sys.stderr, flush=True)
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", action="append", default=[], metavar="LABEL=PATH",
                    help="a source tree holding gemma_doctor/ (default: after=this repository)")
    ap.add_argument("--json", metavar="FILE", help="also write the per-report rows as JSON")
    ap.add_argument("--docs", metavar="FILE", help="write the table and the per-report verdicts into FILE between "
                    "the recall markers (docs/field-recall.md)")
    ap.add_argument("--rehearse", action="store_true", help="the column 'caught by the rehearsal' instead of check's "
                    "(each rehearsable report rehearsed in the venv that provides its stack; minutes per report)")
    ap.add_argument("--only", action="append", default=[], metavar="ID", help="with --rehearse: only this report")
    ap.add_argument("--rehearsal-docs", metavar="FILE", help="with --rehearse: write the table into FILE between the "
                    "rehearsal recall markers (docs/rehearsal.md)")
    ap.add_argument("--rehearsal-timeout", type=float, default=300.0, metavar="S",
                    help="with --rehearse: each rehearsal's --timeout (default: rehearse's own, 300 s); one that "
                    "does not finish is not caught (GD952)")
    ap.add_argument("--build-stacks", action="store_true", help="build FIELD_STACKS' venvs (tests/venvs.py ensure_venv, "
                    "the shared cache) and write the lock of each one not yet locked into tests/venv-locks/")
    ns = ap.parse_args()
    if ns.build_stacks:
        for lock in build_stacks():
            print(lock.relative_to(ROOT))
        return
    trees = dict(t.split("=", 1) for t in ns.tree) if ns.tree else {"after": str(ROOT)}
    if ns.rehearse:
        rows = measure_rehearsal(Path(list(trees.values())[-1]).resolve(), ns.only, ns.rehearsal_timeout)
        print(rehearsal_table(rows))
        if ns.json:
            Path(ns.json).write_text(json.dumps(rows, indent=1))
        if ns.rehearsal_docs:
            # --only measures some reports: every other row stays as the page has it (measured before), not dropped
            page = Path(ns.rehearsal_docs)
            write_rehearsal_docs(page, with_measured(rows, page) if ns.only else rows)
        return
    rows = measure({k: Path(v).resolve() for k, v in trees.items()})
    print(table(rows, list(trees)))
    print()
    for r in rows:
        print(f"{r['id']:48} {r['area']:26} " + "  ".join(f"{t}={r[t]:7}" for t in trees) + ("" if r["held_out"] else "  (cited)"))
    if ns.json:
        Path(ns.json).write_text(json.dumps(rows, indent=1))
    if ns.docs:
        write_docs(Path(ns.docs), rows, list(trees))


BEGIN = "<!-- BEGIN measured recall: written by `python benchmarks/field_recall.py --docs`, do not edit -->"
END = "<!-- END measured recall -->"


def write_docs(page: Path, rows: list[dict], labels: list[str]) -> None:
    """Replace the measured block of ``page`` with this run's table and per-report verdicts."""
    lines = [BEGIN, table(rows, labels), "", "| report | area | detectable | held out | "
             + " | ".join(labels) + " | codes (" + labels[-1] + ") |", "| --- | --- | --- | --- | "
             + " | ".join("---" for _ in labels) + " | --- |"]
    for r in rows:
        repo, num = r["id"].split("#")
        lines.append(f"| [{r['id']}](https://github.com/{repo}/issues/{num}) | {r['area']} | {r['detectable']} | "
                     f"{'yes' if r['held_out'] else 'no'} | " + " | ".join(r[t] for t in labels)
                     + f" | {', '.join(r[labels[-1] + '_codes']) or '-'} |")
    lines.append(END)
    text = page.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    page.write_text(head + "\n".join(lines) + tail)


if __name__ == "__main__":
    main()

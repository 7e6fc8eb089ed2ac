"""The rehearsal on a GPU (run by benchmarks/gpu_rehearsal.sh after the probe; docs/rehearsal.md, "On a GPU"):
the twin trained on the GPU (`rehearse --device cuda`), `rehearse --real-weights` end to end, and one measured step
of the planned run for several runs of real-sized checkpoints against check's memory plan of the same run.

    python benchmarks/gpu_session.py --out DIR [--sizes 1b,4b] [--site DIR] [--quick] [--device cpu --dry]

Nothing is downloaded: the checkpoints are the published Gemma 3 shapes with random weights
(benchmarks/random_checkpoint.py). Each memory case runs in a process of its own, so that one case's allocations are
not another's peak. Each part is independent: a part that fails is recorded with its last line and the next one runs.
Results go to DIR/gpu-session.json and, one line each, to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "google--gemma-3-12b-it"

# (name, checkpoint, training config): plain TrainingArguments keys plus the LoRA keys both trainers read.
CASES = [
    ("1b-lora-b4x1024", "1b", {"bf16": True, "per_device_train_batch_size": 4, "gradient_checkpointing": False,
                               "model_max_length": 1024, "use_peft": True, "lora_r": 16,
                               "lora_target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}),
    ("1b-full-b2x1024", "1b", {"bf16": True, "per_device_train_batch_size": 2, "gradient_checkpointing": False,
                               "model_max_length": 1024}),
    ("1b-full-ckpt-b8x2048", "1b", {"bf16": True, "per_device_train_batch_size": 8, "gradient_checkpointing": True,
                                    "model_max_length": 2048}),
    ("4b-lora-b2x2048", "4b", {"bf16": True, "per_device_train_batch_size": 2, "gradient_checkpointing": False,
                               "model_max_length": 2048, "use_peft": True, "lora_r": 16,
                               "lora_target_modules": "all-linear"}),
    ("4b-lora-ckpt-b8x2048", "4b", {"bf16": True, "per_device_train_batch_size": 8, "gradient_checkpointing": True,
                                    "model_max_length": 2048, "use_peft": True, "lora_r": 16,
                                    "lora_target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}),
]


def _env(extra_path: str | None = None) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), extra_path) if p), PYTHONUNBUFFERED="1")
    return env


def _cli(args: list[str], timeout: float, extra_path: str | None = None) -> dict[str, Any]:
    """gemma-doctor as a user runs it: (exit code, JSON or the output's tail, seconds)."""
    started = time.monotonic()
    try:
        p = subprocess.run([sys.executable, "-m", "gemma_doctor", *args], capture_output=True, text=True,
                           timeout=timeout, env=_env(extra_path), cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"code": None, "error": f"timeout after {timeout:g} s", "seconds": round(time.monotonic() - started, 1)}
    out: dict[str, Any] = {"code": p.returncode, "seconds": round(time.monotonic() - started, 1)}
    try:
        out["json"] = json.loads(p.stdout)
    except ValueError:
        out["stdout"] = p.stdout[-3000:]
    out["stderr"] = p.stderr[-1500:]
    return out


def build(size: str, where: Path, dry: bool) -> Path:
    """A random-weight checkpoint of the published Gemma 3 ``size`` (benchmarks/random_checkpoint.py), once."""
    folder = where / f"google--gemma-3-{size}-it"
    if not (folder / "model.safetensors").exists() and not (folder / "model.safetensors.index.json").exists():
        args = [sys.executable, str(ROOT / "benchmarks" / "random_checkpoint.py"), f"gemma-3-{size}", str(folder)]
        subprocess.run(args + (["--layers", "2"] if dry else []), check=True, capture_output=True, text=True,
                       timeout=300, env=_env())
    return folder


_MEASURE = """
import json, sys
from pathlib import Path
from gemma_doctor.rehearse.runner import _memory_plan, _measurable
from gemma_doctor.rehearse.realweights import measure_step
folder, config = Path(sys.argv[1]), Path(sys.argv[2])
memory = _memory_plan(str(folder), None, "main", config)
run, _ = _measurable(memory)
out = {"plan": memory and {k: memory[k] for k in ("summary", "tensor_bytes", "per_gpu_bytes", "components", "peak")},
       "run": run}
if run:
    got = measure_step(folder, seq_len=run["seq_len"], batch=run["batch_size"], dtype=run["load_dtype"] or "bfloat16",
                       lora=run["method"] != "full", lora_r=run.get("lora_r") or 8, lora_targets=run.get("lora_targets"),
                       gradient_checkpointing=bool(run.get("gradient_checkpointing")), optimizer_step=True)
    got.pop("modules", None)
    out["measured"] = got
    if got.get("peak_bytes") and memory["tensor_bytes"]:
        out["measured_over_plan"] = round(got["peak_bytes"] / memory["tensor_bytes"], 3)
print(json.dumps(out, default=str))
"""


def measure(folder: Path, config: dict[str, Any], where: Path, name: str, timeout: float) -> dict[str, Any]:
    """The memory plan of the case's run and one measured step of it, in a process of its own."""
    path = where / f"{name}.json"
    path.write_text(json.dumps(config))
    started = time.monotonic()
    try:
        p = subprocess.run([sys.executable, "-c", _MEASURE, str(folder), str(path)], capture_output=True, text=True,
                           timeout=timeout, env=_env(), cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout:g} s"}
    try:
        out = json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": (p.stderr or p.stdout)[-1500:], "code": p.returncode}
    out["seconds"] = round(time.monotonic() - started, 1)
    return out


def _line(name: str, got: dict[str, Any]) -> str:
    if "error" in got:
        return f"{name}: error {str(got['error']).strip().splitlines()[-1] if got['error'] else ''}"
    m, plan = got.get("measured") or {}, got.get("plan") or {}
    if not m:
        return f"{name}: plan {plan.get('summary')}; not measured (run {got.get('run')})"
    return (f"{name}: measured {m.get('peak_bytes', 0) / 2**30:.2f} GiB ({m.get('peak_source')}) vs plan tensors "
            f"{plan.get('tensor_bytes', 0) / 2**30:.2f} GiB: x{got.get('measured_over_plan')} | {plan.get('summary')}"
            f" | oom {m.get('oom')}, fp16 headroom {m.get('fp16_headroom')}, {got.get('seconds')} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--sizes", default="1b,4b")
    ap.add_argument("--site", default=None, help="a folder of extra packages (TRL, datasets) for the TRL rehearsal")
    ap.add_argument("--quick", action="store_true", help="the probe and the rehearsals only")
    ap.add_argument("--device", default="cuda", help="the rehearsals' --device (cpu: a dry run of this script)")
    ap.add_argument("--dry", action="store_true", help="2-layer checkpoints and short rows: a CPU dry run")
    a = ap.parse_args()
    if a.dry:
        for _, _, config in CASES:
            config.update(per_device_train_batch_size=1, model_max_length=64)
    a.out.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("GD_GPU_WORK", "/tmp/gd-gpu"))
    work.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {}

    def save() -> None:
        (a.out / "gpu-session.json").write_text(json.dumps(result, indent=1, default=str))

    started = time.monotonic()

    sft = work / "sft.yaml"
    sft.write_text("model_name_or_path: google/gemma-3-12b-it\nbf16: true\nper_device_train_batch_size: 2\n"
                   "max_length: 256\nuse_peft: true\nlora_r: 16\nlora_target_modules: [q_proj, k_proj, v_proj, o_proj]\n")
    plain = work / "trainer.json"
    plain.write_text(json.dumps({"bf16": True, "per_device_train_batch_size": 2, "use_peft": True, "lora_r": 16,
                                 "lora_target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}))
    for name, target, args, site in (
            ("rehearse-trl-sft-cuda", EXAMPLE, ["--training-config", str(sft)], a.site),
            ("rehearse-trainer-cuda", EXAMPLE, ["--training-config", str(plain)], None),
            ("rehearse-gemma4-trainer-cuda", EXAMPLE.parent / "google--gemma-4-E2B-it", ["--training-config", str(plain)],
             None)):
        got = _cli(["rehearse", str(target), *args, "--device", a.device, "--format", "json"], 240, site)
        result[name] = got
        doc = (got.get("json") or {}).get("rehearsals") or [got.get("json") or {}]
        r = doc[0] if doc else {}
        stages = [f"{s.get('stage')}:{s.get('status')}" for s in r.get("stages", [])]
        print(f"{name}: exit {got.get('code')} in {got.get('seconds')} s; stack {r.get('stack')}; {' '.join(stages)}; "
              f"findings {[f.get('code') + ' ' + f.get('message', '')[:160] for f in r.get('findings', [])]}"
              + ("" if got.get("json") else f"; {got.get('stdout', '')[-400:]} {got.get('stderr', '')[-600:]}"),
              flush=True)
        save()
    if a.quick:
        return 0

    folders = {}
    for size in a.sizes.split(","):
        t = time.monotonic()
        try:
            folders[size] = build(size, work, a.dry)
            print(f"built gemma-3-{size}: {time.monotonic() - t:.1f} s", flush=True)
        except Exception as e:  # noqa: BLE001
            result[f"build-{size}"] = f"{type(e).__name__}: {e}"
            print(f"build {size}: {type(e).__name__}: {e}", flush=True)
    if "1b" in folders:
        cfg = work / "real.json"
        cfg.write_text(json.dumps(CASES[0][2]))
        got = _cli(["rehearse", str(folders["1b"]), "--training-config", str(cfg), "--real-weights", "--device", a.device,
                    "--format", "json"], 300)
        result["rehearse-real-weights-1b"] = got
        doc = ((got.get("json") or {}).get("rehearsals") or [got.get("json") or {}])[0]
        real = [s for s in doc.get("stages", []) if s.get("stage") == "real-weights"]
        print(f"rehearse --real-weights 1b: exit {got.get('code')} in {got.get('seconds')} s; "
              f"{json.dumps(real, default=str)[:900]}; findings "
              f"{[f.get('code') + ' ' + f.get('message', '')[:200] for f in doc.get('findings', [])]}; "
              f"notes {doc.get('notes')}" + ("" if got.get("json") else f"; {got.get('stderr', '')[-800:]}"), flush=True)
        save()
    result["cases"] = {}
    for name, size, config in CASES:
        if size not in folders:
            continue
        got = measure(folders[size], config, work, name, 150)
        result["cases"][name] = got
        print(_line(name, got), flush=True)
        save()
    result["seconds"] = round(time.monotonic() - started, 1)
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Peak memory of one gemma-doctor process on hostile input, against the same command on a benign repo.

    python benchmarks/hostile_inputs.py                  # this checkout
    python benchmarks/hostile_inputs.py --code /tmp/old  # another checkout (e.g. `git worktree add /tmp/old <rev>`)

Cases (the issue-11 list; tests/test_attacker.py asserts bounds on each): a 700-byte YAML alias bomb in a
training config; `check --weights` on a [3e7, 1] zero embedding and on a single row of 3e8 elements (sparse
files: no disk used); 40 index entries linked to one blob whose safetensors header is 99 MB. Peak RSS is read
from /proc/self/status (VmHWM) at exit; each process runs under RLIMIT_AS (--cap-gib) so a run of old code
that would eat the machine fails instead. Prints one JSON document: baseline MiB and, per case, peak MiB,
peak minus baseline, exit code and seconds. Round 10 added the run's readers: YAML 2,000 `[` deep, a LoRA target
regex that backtracks exponentially (`(.*)*Z`) and `deepspeed: <300 characters>.json` (each case has --case-timeout
seconds; old code hangs on the regex).

    python benchmarks/hostile_inputs.py --sweep          # the in-process sweep of the run's readers, below

--sweep: every key of readers/training_config.KEYS set, one at a time, to each of 20 hostile values (lists, mappings,
null, "ture", 10**30, -5, NaN, inf, 2.5, "auto", "", unicode, 100,000 characters, 30 digits, "1e9"...) in a TRL,
axolotl, accelerate FSDP and DeepSpeed config, through check, recommend and fix --dry-run; and hostile launch lines
through check --launch. Counts the runs that end in exit 70, another exception, or more than 8 s (a SIGALRM stops a
run at 20 s), and prints each with its last lines. No child process is started.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.test_attacker import REPO, World, _sparse_safetensors  # noqa: E402
from tests.builders import HubCache, gemma2_config  # noqa: E402

_RUN = """
import atexit, os, resource, sys
cap = int(os.environ['GD_CAP'])
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
def _peak():
    for line in open('/proc/self/status'):
        if line.startswith('VmHWM:'):
            open(os.environ['GD_PEAK_FILE'], 'w').write(line.split()[1])
atexit.register(_peak)
import gemma_doctor
assert gemma_doctor.__file__.startswith(os.environ['PYTHONPATH']), gemma_doctor.__file__
from gemma_doctor.cli import main
main(sys.argv[1:])
"""


def run(code: Path, cache: Path, cap: int, *args: str, timeout: float = 1800) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PYTHONPATH=str(code), HF_HUB_OFFLINE="1", NO_COLOR="1", GD_CAP=str(cap),
                   GD_PEAK_FILE=os.path.join(tmp, "peak"), GEMMA_DOCTOR_WITH="transformers==4.50.3")
        t0 = time.perf_counter()
        # cwd elsewhere: `python -c` puts the working folder first on sys.path, before PYTHONPATH.
        try:
            r = subprocess.run([sys.executable, "-c", _RUN, *args, "--cache-dir", str(cache)], env=env, cwd=tmp,
                               capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"exit": "timeout", "peak_mib": None, "seconds": timeout, "stderr_tail": []}
        seconds = time.perf_counter() - t0
        peak = Path(env["GD_PEAK_FILE"])
        return {"exit": r.returncode, "peak_mib": round(int(peak.read_text()) / 1024, 1) if peak.exists() else None,
                "seconds": round(seconds, 2), "stderr_tail": r.stderr.strip().splitlines()[-1:] if r.returncode > 3 else []}


def weights_repo(root: Path, shape: list[int]) -> HubCache:
    hub = HubCache(root)
    snap = hub.add(REPO, {"config.json": gemma2_config()})
    _sparse_safetensors(hub.repo_dir(REPO) / "blobs" / "w", {"model.embed_tokens.weight": ("BF16", shape)})
    os.symlink("../../blobs/w", snap / "model.safetensors")
    return hub


def gemma3_1b_repo(root: Path) -> HubCache:
    from tests.builders import gemma3_1b_config, generation_config

    hub = HubCache(root)
    hub.add("google/gemma-3-1b-it", {"config.json": gemma3_1b_config(), "generation_config.json": generation_config()})
    return hub


def shared_header_repo(root: Path, links: int) -> HubCache:
    hub = HubCache(root)
    snap = hub.add(REPO, {"config.json": gemma2_config()})
    _sparse_safetensors(hub.repo_dir(REPO) / "blobs" / "big", {"model.norm.weight": ("BF16", [4])}, {"pad": "x" * 99_000_000})
    names = [f"model-{i:05d}-of-{links:05d}.safetensors" for i in range(links)]
    for n in names:
        os.symlink("../../blobs/big", snap / n)
    (snap / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {f"t{i}": n for i, n in enumerate(names)}}))
    return hub


_SWEEP_VALUES: dict[str, object] = {
    "list": [1, "a"], "dict": {"x": 1}, "null": None, "ture": "ture", "huge": 10**30, "neg": -5, "nan": float("nan"),
    "inf": float("inf"), "float": 2.5, "auto": "auto", "empty": "", "unicode": "\u00e9\u202e\U0001f600", "true": True,
    "false": False, "zero": 0, "bigstr": "x" * 100_000, "nested": [[[[[]]]]], "digits": "9" * 30, "neg_str": "-1",
    "1e9": "1e9"}
_SWEEP_BASES: dict[str, dict] = {
    "trl": {"output_dir": "o"},
    "axolotl": {"base_model": REPO, "adapter": "lora", "datasets": [{"path": "x", "type": "chat_template"}]},
    "accelerate": {"compute_environment": "LOCAL_MACHINE", "distributed_type": "FSDP", "num_processes": 2},
    "deepspeed": {"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1}}
_SWEEP_LAUNCHES = [
    'torchrun --nproc-per-node 2 train.py --bf16 "true', "torchrun --nproc-per-node 2 train.py --bf16 true\x00x",
    "torchrun --nproc-per-node 2 train.py " + "--x y " * 17000, "python train.py --lora_target_modules " + "a" * 100000,
    *(f"accelerate launch --num_processes {n} train.py" for n in ("0", "-1", "1e9", "1e300", "nan", "inf", "2.5",
                                                                   "9" * 5000, "auto")),
    "accelerate launch --num_machines 0 --num_processes 4 train.py", "torchrun --nproc-per-node auto train.py",
    "torchrun --nproc-per-node 0 train.py", "torchrun --nnodes 1:9999999999999999999 --nproc-per-node 2 train.py",
    "deepspeed --num_gpus 0 train.py --deepspeed ds.json", f"deepspeed --num_gpus 2 train.py --deepspeed {'a' * 300}.json",
    f"accelerate launch --config_file {'a' * 300}.yaml train.py", "accelerate launch --config_file /dev/zero train.py",
    "python train.py --fsdp '[full_shard' --fsdp_config.version 1e999", "python train.py --lora_target_modules '([' "
    "--use_peft", "python train.py --lora_target_modules '(.*)*Z' --use_peft", "python train.py --bf16 " + "9" * 5000,
    "A=1 B=2", "torchrun \\", "python train.py --" + ".".join(["a"] * 8) + " 1", "python train.py --a 1 --a.b 2"]


def sweep(root: Path) -> dict:
    """The in-process sweep (--sweep): every KEYS key x hostile value x config kind x command, and the launch lines."""
    import contextlib
    import copy
    import io
    import signal
    import traceback

    from gemma_doctor.cli import main as cli_main
    from gemma_doctor.readers.training_config import KEYS
    from tests.builders import gemma3_1b_config, generation_config

    os.environ.update(HF_HUB_OFFLINE="1", NO_COLOR="1")
    hub = HubCache(root / "hub")
    hub.add("google/gemma-3-1b-it", {"config.json": gemma3_1b_config(), "generation_config.json": generation_config()})

    class Stalled(Exception):
        pass

    def stalled(*_: object) -> None:
        raise Stalled

    signal.signal(signal.SIGALRM, stalled)
    bad: list[dict] = []
    runs = 0
    slowest: list[tuple[float, str]] = []

    def one(name: str, argv: list[str]) -> None:
        nonlocal runs
        runs += 1
        out, err = io.StringIO(), io.StringIO()
        t0 = time.perf_counter()
        code: object = 0
        signal.alarm(20)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                cli_main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except Stalled:
            code = "stalled (20 s)"
        except BaseException:  # noqa: BLE001 (the sweep reports any exception as a defect)
            code, err = "exception", io.StringIO(traceback.format_exc())
        finally:
            signal.alarm(0)
        seconds = time.perf_counter() - t0
        slowest.append((round(seconds, 2), name))
        if code in (70, "exception", "stalled (20 s)") or "Traceback" in err.getvalue() or seconds > 8:
            bad.append({"case": name, "exit": code, "seconds": round(seconds, 2), "tail": err.getvalue()[-600:]})

    def nest(dotted: str, value: object) -> dict:
        d: object = copy.deepcopy(value)
        for part in reversed(dotted.split(".")):
            d = [d] if part.isdigit() else {part: d}
        return d  # type: ignore[return-value]

    def merge(a: dict, b: dict) -> dict:
        for k, v in b.items():
            if isinstance(a.get(k), dict) and isinstance(v, dict):
                merge(a[k], v)
            else:
                a[k] = v
        return a

    keys = sorted({k for ks in KEYS.values() for k in ks})
    for kind, base in _SWEEP_BASES.items():
        path = root / (f"{kind}.yaml" if kind in ("axolotl", "accelerate") else f"{kind}.json")
        for key in keys:
            for vname, value in _SWEEP_VALUES.items():
                path.write_text(json.dumps(merge(copy.deepcopy(base), nest(key, value)), allow_nan=True))
                for command in ("check", "recommend", "fix"):
                    argv = [command, "google/gemma-3-1b-it", "--cache-dir", str(hub.root), "--training-config", str(path)]
                    argv += ["--dry-run"] if command == "fix" else ["--format", "json"]
                    one(f"{command} {kind} {key}={vname}", argv)
    for line in _SWEEP_LAUNCHES:
        one(f"check --launch {line[:60]!r}", ["check", "google/gemma-3-1b-it", "--cache-dir", str(hub.root), "--launch",
                                              line, "--format", "json"])
    return {"runs": runs, "bad": bad, "slowest": sorted(slowest, reverse=True)[:5]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code", type=Path, default=ROOT, help="checkout whose gemma_doctor runs")
    ap.add_argument("--cap-gib", type=float, default=6.0, help="address-space limit per process")
    ap.add_argument("--case-timeout", type=float, default=120.0, help="seconds each case may run (old code hangs)")
    ap.add_argument("--only", default="", help="run only the cases whose name holds this text")
    ap.add_argument("--sweep", action="store_true", help="run the in-process sweep of the run's readers instead")
    args = ap.parse_args()
    if args.sweep:
        with tempfile.TemporaryDirectory(prefix="gd-sweep-") as tmp:
            print(json.dumps(sweep(Path(tmp)), indent=2))
        return 0
    cap = int(args.cap_gib * 2**30)
    out: dict = {"code": str(args.code), "cap_gib": args.cap_gib}
    with tempfile.TemporaryDirectory(prefix="gd-hostile-") as tmp:
        base = World(Path(tmp) / "base")
        out["baseline"] = run(args.code, base.hub.root, cap, "check", REPO, "--weights", "--format", "json")
        bomb = Path(tmp) / "bomb.yaml"
        bomb.write_text("a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
            f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 9) + "]\n" for i in range(8)) + "fp16: *i\n")
        cases = {
            "yaml alias bomb (700 bytes) as --training-config": (base.hub.root, ("check", REPO, "--training-config", str(bomb), "--format", "json")),
            "--weights, [3e7, 1] zero embedding": (weights_repo(Path(tmp) / "rows", [30_000_000, 1]).root, ("check", REPO, "--weights", "--format", "json")),
            "--weights, one row of 3e8 elements": (weights_repo(Path(tmp) / "row", [1, 300_000_000]).root, ("check", REPO, "--weights", "--format", "json")),
            "40 shard links sharing one 99 MB header": (shared_header_repo(Path(tmp) / "shared", 40).root, ("check", REPO, "--format", "json")),
        }
        deep, regex, named = (Path(tmp) / n for n in ("deep.yaml", "regex.yaml", "named.json"))
        deep.write_text("output_dir: o\nfsdp_config: " + "[" * 2000 + "]" * 2000 + "\n")
        regex.write_text("output_dir: o\nuse_peft: true\nlora_r: 8\nlora_target_modules: '(.*)*Z'\n")
        named.write_text(json.dumps({"output_dir": "o", "deepspeed": "a" * 300 + ".json"}))
        cases.update({
            "YAML 2,000 [ deep as --training-config": (base.hub.root, ("check", REPO, "--training-config", str(deep), "--format", "json")),
            # Gemma 3 1B: its module names are derived whole (model.layers.0.self_attn.q_proj), which the regex meets.
            "LoRA target regex (.*)*Z": (gemma3_1b_repo(Path(tmp) / "g3").root, ("check", "google/gemma-3-1b-it", "--training-config", str(regex), "--format", "json")),
            "deepspeed: <300 characters>.json": (base.hub.root, ("check", REPO, "--training-config", str(named), "--format", "json")),
        })
        base_mib = out["baseline"]["peak_mib"] or 0.0
        for name, (cache, argv) in cases.items():
            if args.only and args.only not in name:
                continue
            res = run(args.code, cache, cap, *argv, timeout=args.case_timeout)
            res["above_baseline_mib"] = round(res["peak_mib"] - base_mib, 1) if res["peak_mib"] is not None else None
            out[name] = res
            print(f"{name}: {res}", file=sys.stderr)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark `gemma-doctor check` start-up and whole-cache scans against `hf cache ls` on the same cache.

1. One cached repo (the bundled gemma-3-12b-it configs): whole-process time of
   `gemma-doctor check google/gemma-3-12b-it` vs `hf cache ls`, and which heavy modules `check` imports
   (torch and transformers must not be among them).
2. Synthetic caches of 1,000 and 2,000 repos x 2 revisions (half Gemma-family, built with
   tests/builders.HubCache), in two shapes (--shapes): Gemma repos equal but for their names, and no two alike:
   `gemma-doctor check` (no target) vs `hf cache ls`; 2,000 must stay within 2.2x of 1,000. `list` on the same caches, and with --baseline TREE the check of another checkout.
Wall and CPU (user + system) medians of --runs runs, alternating the commands. Run: .venv/bin/python benchmarks/startup.py [--runs 7]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.builders import HubCache, gemma3_12b_config, generation_config, llama_config, variant  # noqa: E402

BIN = Path(sys.executable).parent
HEAVY = ("torch", "transformers", "numpy", "safetensors", "huggingface_hub", "rich", "packaging", "accelerate")

_IMPORTS = """
import json, sys
from gemma_doctor.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & set(%r))), file=sys.stderr)
""" % (HEAVY,)


def tiny_checkpoints(dest: Path) -> list[dict[str, bytes]]:
    """Two revisions of a tiny Gemma 3 text model (2 layers, 64 wide, bf16) saved by transformers' save_pretrained
    (seeds 0 and 1: a base and a later training step): issue 23's cache holds checkpoints like these, whose
    model.safetensors headers check parses. Built in a child so this process never imports torch."""
    subprocess.run([sys.executable, "-c", _TINY, str(dest)], check=True, capture_output=True)
    return [{p.name: p.read_bytes() for p in sorted((dest / str(seed)).iterdir())} for seed in (1, 0)]


_TINY = """
import sys
import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig
cfg = Gemma3TextConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=32, sliding_window=64)
for seed in (0, 1):
    torch.manual_seed(seed)
    Gemma3ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(f"{sys.argv[1]}/{seed}")
"""


def build_cache(root: Path, repos: int, shape: str = "same") -> float:
    """``repos`` repos x 2 revisions (main and an older detached one), half of them Gemma 3.

    ``same``: every Gemma repo is gemma-3-12b-it's config but for its names (a team's fine-tunes of one base: gemma-doctor
    judges one and serves the rest, gemma_doctor/memo.py). ``distinct``: no two Gemma repos share their facts (the
    text model's layer count and MLP width differ per repo), so each is judged on its own. ``checkpoints``: issue 23's
    own shape, every Gemma repo a tiny Gemma 3 checkpoint saved by transformers (config, generation config and
    model.safetensors), an older training step as its second revision."""
    t0 = time.perf_counter()
    hub = HubCache(root)
    gem, gen, other = gemma3_12b_config(), generation_config(), llama_config()
    if shape == "checkpoints":
        older, newer = tiny_checkpoints(root.parent / f"tiny-{root.name}")
        for i in range(repos):
            repo = f"org{i % 37}/model-{i:05d}"
            if i % 2:
                hub.add(repo, {"config.json": variant(other, _name_or_path=f"old-{i}"), "generation_config.json": gen},
                        refs=())
                hub.add(repo, {"config.json": variant(other, _name_or_path=repo), "generation_config.json": gen})
            else:
                hub.add(repo, older, refs=())
                hub.add(repo, newer)
        return time.perf_counter() - t0
    for i in range(repos):
        cfg = gem if i % 2 == 0 else other
        if shape == "distinct" and i % 2 == 0:
            j = i // 2
            text = dict(gem["text_config"], num_hidden_layers=8 + j % 40, intermediate_size=15360 + 256 * (j // 40))
            cfg = variant(gem, text_config=text)
        repo = f"org{i % 37}/model-{i:05d}"
        hub.add(repo, {"config.json": variant(cfg, _name_or_path=f"old-{i}"), "generation_config.json": gen}, refs=())
        hub.add(repo, {"config.json": variant(cfg, _name_or_path=repo), "generation_config.json": gen})
    return time.perf_counter() - t0


# Every command runs from a neutral folder: `python -m gemma_doctor` puts the working directory first on sys.path, so
# run from a checkout's root, the baseline's PYTHONPATH would lose to the checkout's own gemma_doctor (it did: until
# 25 Nov, --baseline run from the repo root timed this tree twice).
NEUTRAL = tempfile.gettempdir()
# Bytecode is cached as an installed package has it (pip compiles on install): with PYTHONDONTWRITEBYTECODE set in the
# caller's environment, every gemma-doctor run compiled its modules from source while `hf` used its .pyc files.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
CPU: dict[tuple[str, ...], list[float]] = {}


def timed(cmd: list[str]) -> float:
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, cwd=NEUTRAL, env=ENV)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU.setdefault(tuple(cmd), []).append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
    return wall


def compare(cmds: dict[str, list[str]], runs: int) -> dict[str, float]:
    """Median whole-process seconds per command, alternating them so load affects each alike (and, in ``cpu``, the
    median CPU seconds, user + system, of the same runs: steadier than wall time on a loaded machine)."""
    for cmd in cmds.values():
        timed(cmd)  # warm the page cache and .pyc files
    CPU.clear()
    times: dict[str, list[float]] = {k: [] for k in cmds}
    for _ in range(runs):
        for k, cmd in cmds.items():
            times[k].append(timed(cmd))
    cpu.update({k: statistics.median(CPU[tuple(cmd)]) for k, cmd in cmds.items()})
    return {k: statistics.median(v) for k, v in times.items()}


cpu: dict[str, float] = {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--repos", type=int, default=1000)
    ap.add_argument("--sizes", type=int, nargs="+", metavar="N",
                    help="cache sizes to scan (default: --repos and twice it; growth is from the first to the second)")
    ap.add_argument("--shapes", nargs="+", choices=("same", "distinct", "checkpoints"),
                    default=["checkpoints", "same", "distinct"],
                    help="cache shapes: Gemma repos tiny checkpoints saved by transformers (checkpoints: issue 23's), "
                    "equal but for their names (same), or no two alike (distinct)")
    ap.add_argument("--baseline", metavar="TREE", help="also time the one-repo check and the whole-cache scans of another "
                    "checkout (a git worktree of an older commit), both trees run as `python -m gemma_doctor`, "
                    "alternated in one run")
    ap.add_argument("--one-repo-only", action="store_true", help="time the one-repo case alone (no whole-cache scans)")
    args = ap.parse_args()
    doctor, hf = str(BIN / "gemma-doctor"), str(BIN / "hf")
    trees = {}
    if args.baseline:
        # env(1) sets PYTHONPATH for both trees alike (the same small cost for each)
        trees = {"this tree": ["env", f"PYTHONPATH={ROOT}", sys.executable, "-m", "gemma_doctor"],
                 "baseline": ["env", f"PYTHONPATH={Path(args.baseline).resolve()}", sys.executable, "-m", "gemma_doctor"]}
    with tempfile.TemporaryDirectory() as tmp:
        one = Path(tmp) / "one"
        HubCache(one).add("google/gemma-3-12b-it", {"config.json": gemma3_12b_config(),
                                                    "generation_config.json": generation_config()})
        res = subprocess.run([sys.executable, "-c", _IMPORTS, "check", "google/gemma-3-12b-it", "--cache-dir", str(one)],
                             capture_output=True, text=True, cwd=ROOT)
        imported = json.loads(res.stderr.strip().splitlines()[-1])
        print(f"heavy modules imported by `check <repo>`: {imported or 'none'}")
        assert "torch" not in imported and "transformers" not in imported
        one_check = ["check", "google/gemma-3-12b-it", "--cache-dir", str(one)]
        m = compare({"gemma-doctor check <repo>": [doctor, *one_check], "hf cache ls": [hf, "cache", "ls", "--cache-dir", str(one)],
                     **{k: [*v, *one_check] for k, v in trees.items()}}, args.runs)
        a, b = m["gemma-doctor check <repo>"], m["hf cache ls"]
        print(f"\none repo, median of {args.runs}: check {a * 1000:.0f} ms, hf cache ls {b * 1000:.0f} ms, ratio {a / b:.2f}"
              f"  (CPU: {cpu['gemma-doctor check <repo>'] * 1000:.0f} ms vs {cpu['hf cache ls'] * 1000:.0f} ms)")
        if trees:
            t, bl = m["this tree"], m["baseline"]
            print(f"  python -m gemma_doctor check <repo>: this tree {t * 1000:.1f} ms, baseline {bl * 1000:.1f} ms, this / "
                  f"baseline {t / bl:.2f} (CPU {cpu['this tree'] * 1000:.1f} vs {cpu['baseline'] * 1000:.1f} ms: "
                  f"{cpu['this tree'] / cpu['baseline']:.2f}; / hf cache ls {t / b:.2f} vs {bl / b:.2f})")
        if args.one_repo_only:
            return

        for shape in args.shapes:
            scans: dict[int, dict[str, float]] = {}
            print(f"\ncache shape: {shape}")
            for n in args.sizes or (args.repos, 2 * args.repos):
                cache = Path(tmp) / f"c{n}"
                built = build_cache(cache, n, shape)
                scans[n] = scan_cache(cache, n, built, doctor, hf, trees, args.runs)
                shutil.rmtree(cache)
            sizes = list(scans)
            if len(sizes) >= 2:
                n1, n2 = sizes[:2]
                print(f"growth {n1} -> {n2} repos ({shape}): check {scans[n2]['check'] / scans[n1]['check']:.2f}x, "
                      f"list {scans[n2]['list'] / scans[n1]['list']:.2f}x, "
                      f"hf cache ls {scans[n2]['hf'] / scans[n1]['hf']:.2f}x (target <= 2.2x)")


def scan_cache(cache: Path, n: int, built: float, doctor: str, hf: str, trees: dict[str, list[str]],
               runs: int) -> dict[str, float]:
    """check, list and `hf cache ls` (and the baseline's check) on one cache, alternated; the figures printed."""
    scan = ["check", "--cache-dir", str(cache), "--fail-on", "never"]
    listing = ["list", "--cache-dir", str(cache)]
    out = compare({"check": [doctor, *scan], "list": [doctor, *listing], "hf": [hf, "cache", "ls", "--cache-dir", str(cache)],
                   **{k: [*v, *scan] for k, v in trees.items()}}, runs)
    c, li, h = out["check"], out["list"], out["hf"]
    print(f"{n} repos x 2 revisions (built in {built:.1f} s), median of {runs}: check {c:.3f} s, "
          f"list {li:.3f} s, hf cache ls {h:.3f} s, ratio check {c / h:.2f}, list {li / h:.2f}")
    print(f"  CPU seconds: check {cpu['check']:.3f}, list {cpu['list']:.3f}, hf cache ls {cpu['hf']:.3f}, "
          f"ratio check {cpu['check'] / cpu['hf']:.2f}, list {cpu['list'] / cpu['hf']:.2f}")
    out.update({f"cpu {k}": v for k, v in cpu.items()})
    if trees:
        t, b = out["this tree"], out["baseline"]
        print(f"  python -m gemma_doctor check: this tree {t:.3f} s, baseline {b:.3f} s, this / baseline "
              f"{t / b:.2f} (CPU {cpu['this tree']:.3f} vs {cpu['baseline']:.3f}: {cpu['this tree'] / cpu['baseline']:.2f})")
    return out


if __name__ == "__main__":
    main()

"""The shared judgements of a scan, this tree against another checkout, in process: the CPU time of judging every model
of an alike cache (each model read, then `pipeline.judged` with the scan's memo and `model_report`, as a scan does,
without the process start, the locating and the report's rendering that startup.py times with them), and of making
the memo key alone per model. Two alike caches: the example cache with two copies of each repo under other names
(large safetensors headers), and ``--repos`` repos of gemma-3-12b-it's config equal but for their names (configs only).
Medians of --runs, the trees alternated so load affects each alike.

    .venv/bin/python benchmarks/memo_ab.py BASELINE_TREE [--repos 60] [--runs 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

# Run in a child with the tree first on sys.path: the judge path's CPU seconds and the key's per model, as JSON.
_CHILD = r"""
import json, sys, time
tree, root = sys.argv[1], sys.argv[2]
sys.path.insert(0, tree)
import gemma_doctor
assert gemma_doctor.__file__.startswith(tree), gemma_doctor.__file__
from pathlib import Path
from gemma_doctor import locate, memo, pipeline
from gemma_doctor.facts import CheckOptions
from gemma_doctor.readers import parsed

options = CheckOptions()
env = pipeline.environment(options)
with parsed.sharing():
    models, _ = pipeline.select(locate.resolve([], Path(root), "main", False), explicit=False)
    remembered = memo.Memo(env, options)
    t = time.process_time()
    for m in models:
        pipeline.model_report(pipeline.judged(m, options, env, remembered), env)
    scan = time.process_time() - t
    facts = [pipeline.read_more(m, options) for m in models if m.family.is_gemma]
    t = time.process_time()
    if hasattr(memo, "name_free"):
        for f in facts:
            memo.key_of(memo.name_free(f)[1], f)
    else:  # the renaming memo
        tokens = memo.Tensors()
        for f in facts:
            memo._canonical(f, memo.renaming_for(f, tokens))
    key = (time.process_time() - t) / len(facts)
print(json.dumps({"scan": scan, "key": key, "models": len(models)}))
"""


def measure(tree: str, cache: Path) -> dict[str, float]:
    """One child's figures for ``tree`` on ``cache``."""
    out = subprocess.run([sys.executable, "-c", _CHILD, tree, str(cache)], capture_output=True, text=True, check=True,
                         cwd=tempfile.gettempdir())
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("baseline", metavar="TREE")
    ap.add_argument("--repos", type=int, default=60)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    from output_ab import alike
    from tests.builders import HubCache, gemma3_12b_config, generation_config, variant

    trees = {"this tree": str(ROOT), "baseline": str(Path(args.baseline).resolve())}
    with tempfile.TemporaryDirectory() as tmp:
        example = Path(tmp) / "example"
        subprocess.run([sys.executable, str(ROOT / "examples" / "build_example_cache.py"), str(example)], check=True,
                       capture_output=True)
        same = HubCache(Path(tmp) / "same")
        gem, gen = gemma3_12b_config(), generation_config()
        for i in range(args.repos):
            repo = f"org{i % 37}/model-{i:05d}"
            same.add(repo, {"config.json": variant(gem, _name_or_path=repo), "generation_config.json": gen})
        caches = {"example x3 (headers)": alike(example, Path(tmp) / "alike"), f"{args.repos} configs": same.root}
        for name, cache in caches.items():
            got: dict[str, list[dict[str, float]]] = {k: [] for k in trees}
            for _ in range(args.runs):
                for k, tree in trees.items():
                    got[k].append(measure(tree, cache))
            med = {k: {f: statistics.median(r[f] for r in v) for f in ("scan", "key")} for k, v in got.items()}
            t, b = med["this tree"], med["baseline"]
            print(f"{name} ({int(got['this tree'][0]['models'])} models): judging them {t['scan'] * 1e3:.1f} ms vs "
                  f"{b['scan'] * 1e3:.1f} ms CPU, this / baseline {t['scan'] / b['scan']:.2f}; the key per model "
                  f"{t['key'] * 1e3:.3f} ms vs {b['key'] * 1e3:.3f} ms, {t['key'] / b['key']:.2f}")


if __name__ == "__main__":
    main()

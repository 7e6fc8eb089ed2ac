"""Benchmark build_twin (gemma_doctor/rehearse/twin.py): build time and size of the twin per family member.

Targets: the bundled example snapshots (google/gemma-3-12b-it with its 4.50-era key layout, google/gemma-4-E2B-it;
real configs and tensor names), real-size configs without weights (tests/test_twin.py's REAL_SIZES), and every
member's tiny real checkpoint (tests/tiny_family.py). Per target, medians of --runs builds into fresh caches, timed
in this process after torch and transformers are imported (their import is reported once, separately); the
baseline measured in the same run is loading that twin back with from_pretrained (by repo id, offline), so
``build / load`` says what building costs beside what every run pays anyway. Size: the twin's blobs on disk.
Run: .venv/bin/python benchmarks/rehearse_twin.py [--runs 3] [--only gemma3 gemma-3-12b-it ...] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    t0 = time.perf_counter()
    import torch
    import transformers
    imports = time.perf_counter() - t0
    torch.set_num_threads(1)
    from gemma_doctor.rehearse.twin import TwinError, build_twin
    from tests import tiny_family
    from tests.builders import HubCache
    from tests.test_twin import REAL_SIZES

    work = Path(tempfile.mkdtemp(prefix="twin-bench-"))
    try:
        examples = work / "examples"
        subprocess.run([sys.executable, str(ROOT / "examples" / "build_example_cache.py"), str(examples)], check=True,
                       capture_output=True)
        hub = HubCache(work / "hub")
        targets: dict[str, tuple[Path, str]] = {}
        for repo in ("google/gemma-3-12b-it", "google/gemma-4-E2B-it"):
            snaps = examples / ("models--" + repo.replace("/", "--")) / "snapshots"
            targets[repo.split("/")[1]] = (next(snaps.iterdir()), repo)
        for name, config in sorted(REAL_SIZES.items()):
            targets[name] = (hub.add(f"org/{name}", {"config.json": config}), f"org/{name}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for model_type in sorted(tiny_family.SPECS):
                folder = tiny_family.save(model_type, work / "tiny" / model_type)
                files = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
                targets[f"tiny:{model_type}"] = (hub.add(f"tiny/{model_type}", files), f"tiny/{model_type}")
        rows = []
        for name, (snap, repo) in targets.items():
            if args.only and not any(o in name for o in args.only):
                continue
            builds, loads, twin, error = [], [], None, None
            for i in range(args.runs):
                cache = work / "twins" / f"{name.replace(':', '-')}-{i}"
                t = time.perf_counter()
                try:
                    twin = build_twin(snap, repo, cache)
                except TwinError as e:
                    error = str(e)
                    break
                builds.append(time.perf_counter() - t)
                t = time.perf_counter()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    getattr(transformers, twin.architecture).from_pretrained(repo, cache_dir=cache,
                                                                             local_files_only=True)
                loads.append(time.perf_counter() - t)
                size = _size(cache)
                if i:
                    shutil.rmtree(cache)
            if error is not None:
                rows.append({"target": name, "refused": error})
                print(f"{name:28s} refused: {error}", file=sys.stderr)
                continue
            assert twin is not None
            build, load = statistics.median(builds), statistics.median(loads)
            rows.append({"target": name, "class": twin.architecture, "layout": twin.layout,
                         "parameters": twin.parameters, "bytes": size, "build_s": round(build, 3),
                         "load_s": round(load, 3), "build_over_load": round(build / load, 2)})
            print(f"{name:28s} {twin.architecture:40s} {twin.parameters / 1e6:7.2f} M params "
                  f"{size / 2**20:7.1f} MiB  build {build:6.2f} s  load {load:6.2f} s  ratio {build / load:5.2f}",
                  file=sys.stderr)
        report = {"machine": {"python": platform.python_version(), "torch": torch.__version__,
                              "transformers": transformers.__version__, "cpus": os.cpu_count(),
                              "load_average": os.getloadavg()},
                  "runs": args.runs, "import_torch_transformers_s": round(imports, 2), "targets": rows}
        text = json.dumps(report, indent=1)
        print(text)
        if args.out:
            args.out.write_text(text + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

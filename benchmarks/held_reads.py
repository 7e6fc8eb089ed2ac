"""What fsafe's reads of a whole-cache scan cost, thread time per read: a plain open/read against fsafe.read_file
walked from the repo folder's path, and through the folders an Area holds (fsafe.Area.holding), for one file of a repo
(config.json) and for two (config.json and generation_config.json, what a scan reads of an alike Gemma repo); with
--baseline TREE the same reads of another checkout (a git worktree of main), alternated in one run. Cache: startup.py's
``same`` shape of --repos repos. Run: .venv/bin/python benchmarks/held_reads.py [--baseline TREE] [--repos 1000]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_CHILD = r"""
import os, sys, time
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from gemma_doctor import fsafe, locate
cache = Path(sys.argv[2])
snaps = list(locate.snapshots_in(cache, locate.cache_folders(cache)))
one = [(fsafe.Area(s.repo_dir), os.fspath(s.path / "config.json"), ["snapshots", s.commit, "config.json"])
       for s in snaps]
two = [(a, p, parts, os.fspath(Path(p).with_name("generation_config.json")), [*parts[:2], "generation_config.json"])
       for a, p, parts in one]
held = hasattr(fsafe.Area, "holding")


def plain():
    for _a, p, _parts in one:
        with open(p, "rb") as f:
            f.read()


def walked():
    for a, p, parts in one:
        fsafe.read_file(p, 1 << 24, a, unread_over=True, parts=parts)


def walked_two():
    for a, p, parts, p2, parts2 in two:
        fsafe.read_file(p, 1 << 24, a, unread_over=True, parts=parts)
        fsafe.read_file(p2, 1 << 24, a, unread_over=True, parts=parts2)


def held_one():
    for a, p, parts in one:
        with a.holding() as h:
            fsafe.read_file(p, 1 << 24, h, unread_over=True, parts=parts)


def held_two():
    for a, p, parts, p2, parts2 in two:
        with a.holding() as h:
            fsafe.read_file(p, 1 << 24, h, unread_over=True, parts=parts)
            fsafe.read_file(p2, 1 << 24, h, unread_over=True, parts=parts2)


for f in [plain, walked, walked_two] + ([held_one, held_two] if held else []):
    ts = []
    for _ in range(7):
        t0 = time.thread_time()
        f()
        ts.append(time.thread_time() - t0)
    print(f"  {f.__name__:<11} {sorted(ts)[3] / len(one) * 1e6:6.1f} us a repo")
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repos", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--baseline", metavar="TREE")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    sys.path.insert(0, str(ROOT))
    from startup import build_cache

    trees = {"this tree": str(ROOT), **({"baseline": str(Path(args.baseline).resolve())} if args.baseline else {})}
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        build_cache(cache, args.repos, "same")
        for _ in range(args.rounds):
            for name, tree in trees.items():
                print(name)
                subprocess.run([sys.executable, "-c", _CHILD, tree, str(cache)], check=True, cwd=tempfile.gettempdir())


if __name__ == "__main__":
    main()

"""The fourteenth round's attacker pass over the held-folder reads (fsafe.Area.holding, fsafe._hub_file,
LocalSource.holding, pipeline.select_each): a whole-cache scan reads each repo through its folders held open once.

- A hold keeps at most fsafe.HELD_MAX folders open. A hostile link that walks down thousands of nested folders of the
  snapshot and up again (a 4,095-byte target, 40 links of them) held every one of them until the repo was done: the
  scan ran out of descriptors (ulimit -n 1024) and said "cannot read: Too many open files" of config.json and
  generation_config.json, where the walk without a hold (which closes a folder as it leaves it) read both.
- The hub fast path (_hub_file) closes what it opened past the bound; a read through a full hold leaks nothing.
- Output identity under attack: `check` of a hostile cache, held and with the holding forced off, says the same bytes,
  under a low descriptor limit too; a thread swapping the held folders (blobs/, the snapshot folder) for links out
  while scans run never makes a scan read the planted secret, hang, or fail.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gemma_doctor import fsafe, locate, pipeline, source
from gemma_doctor.model import source_of
from tests.builders import HubCache, gemma3_12b_config, generation_config, llama_config, variant

ROOT = Path(__file__).resolve().parent.parent


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _deep_chain(snap: Path, depth: int, links: int) -> None:
    """config.json becomes a chain of ``links`` links, each walking ``depth`` nested folders of the snapshot down and up
    again before naming the next; the last names the real config (renamed real_config.json)."""
    top = os.open(snap, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for k in range(links):
            d = os.dup(top)
            for _ in range(depth):
                os.mkdir(f"d{k}", dir_fd=d)
                n = os.open(f"d{k}", os.O_RDONLY | os.O_DIRECTORY, dir_fd=d)
                os.close(d)
                d = n
            os.close(d)
    finally:
        os.close(top)
    os.rename(snap / "config.json", snap / "real_config.json")
    for k in range(links):
        nxt = f"l{k + 1}" if k + 1 < links else "real_config.json"
        os.symlink(f"d{k}/" * depth + "../" * depth + nxt, snap / ("config.json" if k == 0 else f"l{k}"))


def _deep_cache(root: Path, depth: int = 60, links: int = 4) -> tuple[HubCache, Path]:
    hub = HubCache(root)
    hub.add("org/plain", {"config.json": gemma3_12b_config(), "generation_config.json": generation_config()})
    snap = hub.add("org/deep", {"config.json": gemma3_12b_config(), "generation_config.json": generation_config()})
    _deep_chain(snap, depth, links)
    return hub, snap


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
def test_a_hold_keeps_no_more_folders_open_than_its_bound(tmp_path):
    """A link through 240 nested folders held them all (main: 244 more open in the hold); now at most HELD_MAX, the
    reads the same as without a hold, and nothing left open after it, however often the hub fast path runs past the
    bound."""
    hub, snap = _deep_cache(tmp_path / "hub")
    area = fsafe.Area(hub.repo_dir("org/deep"))
    names = ["config.json", "generation_config.json"]
    plain = [vars(fsafe.read_file(snap / n, 1 << 20, area)) for n in names]
    assert all(p["data"] for p in plain)
    before = _open_fds()
    with area.holding() as held:
        for _ in range(20):
            got = [vars(fsafe.read_file(snap / n, 1 << 20, held, parts=held.parts(snap / n))) for n in names]
            assert got == plain
        assert _open_fds() - before <= fsafe.HELD_MAX
    assert _open_fds() == before


_CHECK = """
import contextlib, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
from gemma_doctor import source
if sys.argv[2] == "plain":
    source.LocalSource.holding = lambda self: contextlib.nullcontext()
from gemma_doctor.cli import main
try:
    main(sys.argv[3:])
except SystemExit as e:
    print("exit", e.code)
"""


def _check(args: list[str], limit: int, mode: str) -> tuple[str, str]:
    env = dict(os.environ, GEMMA_DOCTOR_WORKERS="1", NO_COLOR="1")
    done = subprocess.run([sys.executable, "-c", _CHECK, str(limit), mode, *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return done.stdout, done.stderr


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "O_PATH"), reason="Linux")
def test_a_scan_under_a_low_descriptor_limit_says_what_the_walk_says(tmp_path):
    """`check` and `list` of a cache holding the deep link chain with 256 descriptors allowed: main said GD001/GD004
    "cannot read: Too many open files" of the deep repo (its config read through 4 x 100 held folders); the walk
    without a hold read it. Now the same bytes, held or not."""
    hub, _snap = _deep_cache(tmp_path / "hub", depth=100, links=4)
    for cmd in (["check", "--cache-dir", str(hub.root)], ["check", "--format", "json", "--cache-dir", str(hub.root)],
                ["list", "--cache-dir", str(hub.root)]):
        held = _check(cmd, 256, "held")
        plain = _check(cmd, 256, "plain")
        assert "Too many open files" not in held[0]
        assert held == plain, cmd

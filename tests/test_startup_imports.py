"""`check` never imports torch or transformers, and the census needs no numpy (start-up stays fast)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.builders import HubCache, gemma3_12b_config, generation_config
from tests.test_safetensors import st_file

ROOT = Path(__file__).resolve().parent.parent
PROBE = """
import json, sys
from gemma_doctor.cli import main
try:
    main(sys.argv[1:])
except SystemExit as e:
    code = e.code
print(json.dumps({"code": code, "modules": sorted({m.split('.')[0] for m in sys.modules})}), file=sys.stderr)
"""


def imported(*args: str) -> tuple[int, set[str]]:
    env = {k: v for k, v in os.environ.items() if k != "GEMMA_DOCTOR_PROGRESS"}
    res = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, cwd=ROOT, env=env,
                         timeout=120)
    doc = json.loads(res.stderr.strip().splitlines()[-1])
    return doc["code"], set(doc["modules"])


@pytest.fixture
def cached(hub: HubCache) -> HubCache:
    weights = st_file({"language_model.model.embed_tokens.weight": ("BF16", [16, 8]), "x.weight": ("BF16", [4])})
    hub.add("google/gemma-3-12b-it", {"config.json": gemma3_12b_config(), "generation_config.json": generation_config(),
                                      "model.safetensors": weights})
    return hub


def test_check_imports_neither_torch_nor_transformers(cached):
    code, mods = imported("check", "google/gemma-3-12b-it", "--cache-dir", str(cached.root), "--format", "json")
    assert code in (0, 1)
    assert not mods & {"torch", "transformers", "accelerate", "peft", "numpy", "safetensors", "huggingface_hub"}


def test_whole_cache_check_imports_no_torch(cached):
    code, mods = imported("check", "--cache-dir", str(cached.root))
    assert code in (0, 1)
    assert not mods & {"torch", "transformers"}


def test_weights_scan_needs_numpy_not_torch(cached):
    code, mods = imported("check", "google/gemma-3-12b-it", "--cache-dir", str(cached.root), "--weights")
    assert code in (0, 1)
    assert "numpy" in mods and not mods & {"torch", "transformers", "safetensors"}


LATE_PROBE = PROBE.replace("{m.split('.')[0] for m in sys.modules}", "set(sys.modules)")


def test_check_of_one_repo_leaves_the_writers_and_the_heavy_parsers_unimported(cached):
    """What only fix/restore, --weights, --with or --requirements need is imported by them (each cost 3-35 ms)."""
    env = {k: v for k, v in os.environ.items() if k != "GEMMA_DOCTOR_PROGRESS"}
    res = subprocess.run([sys.executable, "-c", LATE_PROBE, "check", "google/gemma-3-12b-it", "--cache-dir",
                          str(cached.root)], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    mods = set(json.loads(res.stderr.strip().splitlines()[-1])["modules"])
    assert "gemma_doctor.pipeline" in mods  # the probe saw the check run
    assert not mods & {"gemma_doctor.fixes", "gemma_doctor.jsonedit", "gemma_doctor.readers.weights",
                       "packaging.specifiers", "packaging.requirements"}


@pytest.mark.parametrize("fmt", ["text", "json", "github"])
def test_check_of_one_repo_leaves_stdlib_modules_for_one_small_use_unimported(cached, fmt):
    """The GPU probe's PATH look-up does without shutil (and bz2, lzma with it: 2 ms), the AMD probe imports glob only
    on an AMD machine, and --format json does without fixes (difflib, the JSON editor: 3 ms)."""
    env = {k: v for k, v in os.environ.items() if k != "GEMMA_DOCTOR_PROGRESS"}
    res = subprocess.run([sys.executable, "-c", LATE_PROBE, "check", "google/gemma-3-12b-it", "--cache-dir",
                          str(cached.root), "--format", fmt], capture_output=True, text=True, cwd=ROOT, env=env,
                         timeout=120)
    mods = set(json.loads(res.stderr.strip().splitlines()[-1])["modules"])
    assert "gemma_doctor.pipeline" in mods and "gemma_doctor.readers.gpu" in mods  # the probe saw the check run
    assert not mods & {"gemma_doctor.fixes", "gemma_doctor.jsonedit", "difflib", "glob", "bz2", "lzma"}
    if sys.platform != "win32":  # Windows' look-up (PATHEXT) is shutil.which's own
        assert "shutil" not in mods


def test_the_cli_leaves_the_interpreter_as_it_was(cached):
    """No state of the interpreter is switched: importing and running the CLI, in-process or as the console script,
    leaves the cyclic garbage collector on with nothing frozen, and the standard library's dataclasses unpatched
    (cli.py switched the collector off while loading and froze everything at exit; lazymethods.py replaced the private
    dataclasses._create_fn for every importer)."""
    code = ("import dataclasses, gc, sys\n"
            "create = dataclasses._create_fn\n"
            "from gemma_doctor.cli import main\n"
            "after_import = gc.isenabled() and dataclasses._create_fn is create\n"
            "try:\n"
            "    main(sys.argv[1:])\n"
            "except SystemExit:\n"
            "    pass\n"
            "print(after_import, gc.isenabled(), gc.get_freeze_count(), dataclasses._create_fn is create,\n"
            "      file=sys.stderr)\n")
    args = ["check", "google/gemma-3-12b-it", "--cache-dir", str(cached.root)]
    res = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.stderr.strip().splitlines()[-1] == "True True 0 True"
    as_script = code.replace("main(sys.argv[1:])", "sys.argv[0] = 'gemma-doctor'; main()")
    res = subprocess.run([sys.executable, "-c", as_script, *args], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.stderr.strip().splitlines()[-1] == "True True 0 True"


def test_check_of_one_repo_counts_its_tensors_once(cached):
    """The memory plan and the search plan one model: its shape (every tensor of its headers counted) is made once per
    check, not once for each (pipeline.decide)."""
    code = ("import sys\n"
            "from gemma_doctor.plan import memory\n"
            "real, calls = memory.counts_from_names, []\n"
            "memory.counts_from_names = lambda shapes: calls.append(len(shapes)) or real(shapes)\n"
            "from gemma_doctor.cli import main\n"
            "try:\n"
            "    main(sys.argv[1:])\n"
            "except SystemExit:\n"
            "    pass\n"
            "print(calls, file=sys.stderr)\n")
    env = {k: v for k, v in os.environ.items() if k != "GEMMA_DOCTOR_PROGRESS"}
    res = subprocess.run([sys.executable, "-c", code, "check", "google/gemma-3-12b-it", "--cache-dir", str(cached.root),
                          "--format", "json"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert res.stderr.strip().splitlines()[-1] == "[2]"  # the fixture's two tensors, counted once


def test_check_imports_no_other_command(cached):
    """The CLI is one module per command and the group imports a command's module when it runs: check builds none of
    the other commands' options and loads neither the recommend nor the rehearse views (nor the rehearsal)."""
    env = {k: v for k, v in os.environ.items() if k != "GEMMA_DOCTOR_PROGRESS"}
    res = subprocess.run([sys.executable, "-c", LATE_PROBE, "check", "google/gemma-3-12b-it", "--cache-dir",
                          str(cached.root)], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    mods = set(json.loads(res.stderr.strip().splitlines()[-1])["modules"])
    assert {"gemma_doctor.cli.check", "gemma_doctor.pipeline"} <= mods  # the probe saw the check run
    others = {f"gemma_doctor.cli.{m}" for m in ("fix", "restore", "recommend", "list_models", "rehearse", "completion")}
    assert not mods & (others | {"gemma_doctor.render.recommend", "gemma_doctor.render.rehearse"})
    assert not [m for m in mods if m == "gemma_doctor.rehearse" or m.startswith("gemma_doctor.rehearse.")]

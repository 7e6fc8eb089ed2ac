"""Time the light venv and one locked venv of tests/venvs.py, built from nothing into a cache folder (docs/ci.md).

Compare two trees' builds in one session, alternating, with the same cache (its shared torch and project wheel are
built once, untimed; the venvs are removed before each build):

    git show main:tests/venvs.py > /tmp/venvs_main.py
    python benchmarks/venv_build.py /tmp/cache --venvs /tmp/venvs_main.py   # before
    python benchmarks/venv_build.py /tmp/cache                              # after: this tree's tests/venvs.py
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    """Build and time the two venvs; print one line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cache", type=Path, help="the venv cache folder (GEMMA_DOCTOR_TEST_VENVS)")
    parser.add_argument("--venvs", type=Path, default=ROOT / "tests" / "venvs.py", help="the tests/venvs.py to time")
    parser.add_argument("--stack", default="ACCEL_FSDP2_TIED", help="the locked venv to build (a name in tests/venvs.py)")
    args = parser.parse_args()
    os.environ["GEMMA_DOCTOR_TEST_VENVS"] = str(args.cache)
    spec = importlib.util.spec_from_file_location("venvs_timed", args.venvs)
    venvs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(venvs)
    # A copy extracted elsewhere still builds from this checkout (its locks, constraints and project).
    venvs.ROOT, venvs.CONSTRAINTS, venvs.LOCKS = ROOT, ROOT / "tests" / "constraints.txt", ROOT / "tests" / "venv-locks"
    venvs.shared_torch()
    venvs.project_wheel()
    for path in [*args.cache.glob("venv-*"), *args.cache.glob("light-*")]:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    started = time.monotonic()
    venvs.ensure_light_venv()
    light = time.monotonic() - started
    started = time.monotonic()
    venvs.ensure_venv(getattr(venvs, args.stack))
    locked = time.monotonic() - started
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3]) if Path("/proc/loadavg").exists() else "?"
    print(f"{args.venvs}: light {light:.1f} s, {args.stack} {locked:.1f} s, load {load}")


if __name__ == "__main__":
    main()

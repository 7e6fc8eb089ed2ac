"""The 7 hand mutations of issue 15 that once survived the whole suite: each applied to a fresh copy of the work
tree, and the test named for it run there. Each named test must pass on the unmutated copy and fail on its mutant.

    .venv/bin/python benchmarks/hand_mutations.py            # prints one line per mutation, JSON at the end
    .venv/bin/python benchmarks/hand_mutations.py MODULE BEFORE AFTER TEST   # any one mutation, the same way

The mapping (mutation -> test) is in docs/mutation.md; this script is how it was verified.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class HandMutation:
    """One line changed in one module, and the test that must catch it."""

    what: str
    module: str
    before: str  # must occur exactly once in the module
    after: str
    test: str


MUTATIONS = (
    HandMutation("restore --dry-run actually restores (the dry-run branch never taken)",
                 "gemma_doctor/fixes.py", "    if dry_run:\n        for a in to_restore:",
                 "    if False:\n        for a in to_restore:",
                 "tests/test_restore.py::test_restore_dry_run_changes_nothing"),
    HandMutation("a user's edit made between two fixes is not the original restore brings back "
                 "(the `fixed_sha256 != sha256(before)` clause dropped)",
                 "gemma_doctor/fixes.py",
                 'if entry is None or entry.get("fixed_sha256") != undo.sha256(change.before) or link_target is not None:',
                 "if entry is None or link_target is not None:",
                 "tests/test_restore.py::test_restore_brings_back_a_users_edit_made_between_two_fixes"),
    HandMutation("file mode lost on write (the explicit chmod after writing dropped; it moved from undo.py to fsafe.py)",
                 "gemma_doctor/fsafe.py", "                    os.fchmod(fd, mode & 0o777)\n",
                 "                    pass\n",
                 "tests/test_restore.py::test_fix_and_restore_keep_bytes_and_a_mode_the_umask_would_change"),
    HandMutation("the 100,000,000-byte header limit dropped",
                 "gemma_doctor/readers/safetensors_header.py", "    if n > MAX_HEADER_BYTES:\n",
                 "    if False:\n",
                 "tests/test_safetensors.py::test_header_over_100_million_bytes_is_refused_for_its_size_like_safetensors"),
    HandMutation("the whole-byte rule for sub-byte dtypes dropped (3 x F4 in one byte accepted)",
                 "gemma_doctor/readers/safetensors_header.py", "        if bits % 8:\n", "        if False:\n",
                 "tests/test_safetensors.py::test_sub_byte_dtypes_must_fill_whole_bytes_like_safetensors"),
    HandMutation("GD102 only when generation_config.json lacks use_cache (not for an explicit true)",
                 "gemma_doctor/rules/use_cache.py", "        if gvalue is not False:\n", "        if gvalue is _MISSING:\n",
                 "tests/test_check.py::test_generation_config_use_cache_is_judged_by_value_not_presence"),
    HandMutation("the backup checksum check dropped (a corrupted backup restored with exit 0)",
                 "gemma_doctor/undo.py", "    if sha256(got.data) != digest:\n", "    if False:\n",
                 "tests/test_restore.py::test_a_corrupted_backup_is_never_restored"),
)


def _fresh_copy(dst: Path) -> None:
    spec = importlib.util.spec_from_file_location("gd_hypothesis_runs", ROOT / "benchmarks" / "hypothesis_runs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.fresh_copy(dst)


def _pytest(work: Path, test: str) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": str(work)}
    code = ("import sys, pytest, gemma_doctor; "
            f"assert gemma_doctor.__file__.startswith({str(work)!r}), gemma_doctor.__file__; "
            f"sys.exit(pytest.main(['-q', '-x', '-p', 'no:cacheprovider', '-o', 'addopts=', '-p', 'no:xdist', {test!r}]))")
    done = subprocess.run([sys.executable, "-c", code], cwd=work, env=env, capture_output=True, text=True)
    return done.returncode, (done.stdout.strip().splitlines() or [""])[-1]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    mutations = MUTATIONS
    if argv and (len(argv) != 4 or argv[0] in ("-h", "--help")):
        print("usage: hand_mutations.py [MODULE BEFORE AFTER TEST]\n  no arguments: the seven hand mutations of "
              "issue 15; four: one mutation (replace BEFORE by AFTER in MODULE, which TEST must catch)", file=sys.stderr)
        return 0 if argv[0] in ("-h", "--help") else 2
    if argv:
        module, before, after, test = argv
        mutations = (HandMutation("given on the command line", module, before, after, test),)
    results = []
    with tempfile.TemporaryDirectory(prefix="gd-hand-mutations-") as tmp:
        work = Path(tmp) / "repo"
        _fresh_copy(work)
        for m in mutations:
            path = work / m.module
            original = path.read_text()
            assert original.count(m.before) == 1, f"{m.module}: {m.before!r} occurs {original.count(m.before)} times"
            clean_rc, clean = _pytest(work, m.test)
            path.write_text(original.replace(m.before, m.after))
            try:
                mutant_rc, mutant = _pytest(work, m.test)
            finally:
                path.write_text(original)
            caught = clean_rc == 0 and mutant_rc == 1
            results.append({"mutation": m.what, "module": m.module, "test": m.test, "passes_unmutated": clean_rc == 0,
                            "fails_on_mutant": mutant_rc == 1, "unmutated": clean, "mutant": mutant})
            print(f"{'caught ' if caught else 'MISSED '} {m.test}\n         {m.what}: {clean} -> {mutant}",
                  file=sys.stderr, flush=True)
    print(json.dumps(results, indent=1))
    return 0 if all(r["passes_unmutated"] and r["fails_on_mutant"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

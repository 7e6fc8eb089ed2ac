"""The newest-release check: does every finding's version window still hold on the newest releases?

Builds (or reuses) a venv with the newest release of each library the findings depend on, runs every reproduction
(tests/scripts/crash_cases.py, tests/scripts/pitfalls_repro.py) there, and prints per finding:

  still right    the window says affected and the failure shows, or says safe and it does not
  fixed upstream the window says affected, the failure no longer shows: the window should close before this release
  new failure    the window says safe, the failure shows: a regression, or a window that must be extended
  could not run  the reproduction did not run (the reason is printed)

Usage:
  python benchmarks/newest_releases.py                         newest releases from PyPI (pip index versions)
  python benchmarks/newest_releases.py --with transformers==5.24.0 --with peft==0.21.2
  python benchmarks/newest_releases.py --python .venv/bin/python      the libraries of an existing interpreter
  ... [--only GD105,GD107] [--json OUT.json]
Exit status: 0 when every window still holds, 1 otherwise (a scheduled CI job fails and someone looks).
When a window moved: change it in gemma_doctor/versioning.py with its test; when all hold, raise the library's entry
in gemma_doctor/horizon.py (VERIFIED) and record the table in docs/horizon.md.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gemma_doctor import versioning  # noqa: E402
from gemma_doctor.stack import Window  # noqa: E402

CRASHES = ROOT / "tests" / "scripts" / "crash_cases.py"
PITFALLS = ROOT / "tests" / "scripts" / "pitfalls_repro.py"
# The libraries a finding's reproduction runs on, newest first asked of PyPI.
LIBRARIES = ("transformers", "peft", "accelerate", "trl")


@dataclass(frozen=True)
class Probe:
    """One finding's reproduction: which script case shows it, and how to read its result."""

    code: str
    what: str
    windows: tuple[Window, ...]
    script: Path
    case: str
    fails: Callable[[dict[str, Any]], bool]


def _err(r: dict[str, Any]) -> bool:
    return "error" in r


PROBES: tuple[Probe, ...] = (
    Probe("GD105", "Gemma 3 text-only training needs token_type_ids", (versioning.TOKEN_TYPE_IDS_GEMMA3,), CRASHES,
          "token-type-ids", lambda r: _err(r["gemma3"]["unguarded"])),
    Probe("GD105", "PaliGemma text-only training needs token_type_ids", (versioning.TOKEN_TYPE_IDS_PALIGEMMA,), CRASHES,
          "token-type-ids", lambda r: _err(r["paligemma"]["unguarded"])),
    Probe("GD106", "Gemma 4 (vision-bidirectional) needs mm_token_type_ids", (versioning.GEMMA4_MM_TOKEN_TYPE_IDS,),
          CRASHES, "mm-token-type-ids", lambda r: _err(r["unguarded"])),
    Probe("GD107", "Gemma 4 KV sharing skipped without a cache (wrong loss)", (versioning.GEMMA4_KV_SHARE_NO_CACHE,),
          CRASHES, "kv-sharing-save", lambda r: abs(r["without_cache"] - r["with_cache"]) > 1e-3),
    Probe("GD109", "rope_parameters not read (RoPE scaling dropped)", (versioning.ROPE_PARAMETERS_READER,), CRASHES,
          "rope-save+rope-load", lambda r: r["rope-load"]["ratio"] != 8.0),
    Probe("GD422", "PEFT ignores Gemma 3's embed_scale", (versioning.PEFT_EMBED_SCALE,), PITFALLS, "embed_scale",
          lambda r: not r["scaled"]),
    Probe("GD423", "use_bidirectional_attention ignored", (versioning.BIDIRECTIONAL_IGNORED,), PITFALLS,
          "bidirectional", lambda r: r["first_token_changes_with_last"] == 0.0),
    Probe("GD424", "sliding_window halved by load + save", (versioning.SLIDING_WINDOW_HALVED,), PITFALLS,
          "bidirectional", lambda r: r["saved_sliding_window_after_each_round_trip"] != [512, 512]),
    Probe("GD640", "Gemma 2 defaults to SDPA, which drops softcapping", versioning.GEMMA2_SDPA_DEFAULT, PITFALLS,
          "gemma2_sdpa", lambda r: r["default_backend"] == "sdpa"),
    Probe("GD640", "SDPA refuses softcapping (ValueError)", (versioning.SDPA_SOFTCAP_RAISES,), PITFALLS, "gemma2_sdpa",
          lambda r: "sdpa_error" in r),
    Probe("GD645", "packed sequences attend across boundaries without a mask", (versioning.PACKED_MASK_MISSING,),
          PITFALLS, "packing", lambda r: r["reset_position_ids_no_mask_diff"] > 0.5 * r["reference_max_logit"]),
)


def verdict(expected: bool, observed: bool) -> str:
    """The answer for one finding: what its window says against what the library did."""
    if expected == observed:
        return "still right"
    return "fixed upstream" if expected else "new failure"


def _versions(python: str) -> dict[str, str | None]:
    code = ("import importlib.metadata as m, json\nout = {}\nfor p in %r:\n    try: out[p] = m.version(p)\n"
            "    except m.PackageNotFoundError: out[p] = None\nprint(json.dumps(out))") % (LIBRARIES + ("torch",),)
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def _env() -> dict[str, str]:
    sys.path.insert(0, str(ROOT))
    from tests.venvs import subprocess_env

    return subprocess_env()


def _run_script(python: str, script: Path, cases: list[str], work: Path) -> dict[str, Any]:
    args = [python, str(script)] + ([str(work)] if script == CRASHES else []) + cases
    done = subprocess.run(args, capture_output=True, text=True, timeout=1800, env=_env())
    if done.returncode != 0 or not done.stdout.strip():
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {case: {"error": f"exit {done.returncode}: {tail[:200]}"} for case in cases}
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_probes(python: str, only: set[str] | None = None,
               probes: tuple[Probe, ...] = PROBES) -> tuple[dict[str, str | None], list[dict[str, Any]]]:
    """Run every probe (or those of ``only``'s codes) with ``python``'s libraries; the versions and one row each."""
    versions = _versions(python)
    probes = tuple(p for p in probes if only is None or p.code in only)
    results: dict[tuple[Path, str], dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="gd-newest-") as tmp:
        for script in (CRASHES, PITFALLS):
            cases = list(dict.fromkeys(c for p in probes if p.script == script for c in p.case.split("+")))
            if not cases:
                continue
            if script == CRASHES and "rope-load" in cases:  # the load reads what the save wrote: save first, apart
                cases = [c for c in cases if c != "rope-load"]
                got = _run_script(python, script, cases, Path(tmp))
                got.update(_run_script(python, script, ["rope-load"], Path(tmp)))
            else:
                got = _run_script(python, script, cases, Path(tmp))
            for case in cases + (["rope-load"] if script == CRASHES and "rope-save" in cases else []):
                results[(script, case)] = got.get(case, {"error": "no result"})
    rows = []
    for p in probes:
        parts = p.case.split("+")
        result = results.get((p.script, parts[0]), {"error": "not run"}) if len(parts) == 1 else \
            {c: results.get((p.script, c), {"error": "not run"}) for c in parts}
        package = p.windows[0].package
        version = versions.get(package)
        row: dict[str, Any] = {"code": p.code, "what": p.what, "package": package, "version": version,
                               "window": " or ".join(w.spec for w in p.windows)}
        case_error = result.get("case_error") or result.get("error") if isinstance(result, dict) else None
        if len(parts) > 1:
            case_error = next((r.get("error") or r.get("case_error") for r in result.values() if isinstance(r, dict)
                               and (r.get("error") or r.get("case_error"))), None)
        if version is None:
            row.update(verdict="could not run", reason=f"{package} is not installed")
        elif case_error:
            row.update(verdict="could not run", reason=str(case_error)[:200])
        else:
            expected = any(w.contains(version) for w in p.windows)
            try:
                observed = bool(p.fails(result))
            except (KeyError, TypeError, IndexError) as e:
                row.update(verdict="could not run", reason=f"unexpected result shape: {e!r}"[:200])
            else:
                row.update(expected=expected, observed=observed, verdict=verdict(expected, observed))
        rows.append(row)
    return versions, rows


def newest(package: str) -> str:
    """The newest release of ``package`` on the index pip uses."""
    done = subprocess.run([sys.executable, "-m", "pip", "index", "versions", package, "--disable-pip-version-check"],
                          capture_output=True, text=True, check=True)
    m = re.search(rf"^{re.escape(package)} \(([^)]+)\)", done.stdout, re.M | re.I)
    if not m:
        raise SystemExit(f"newest_releases: cannot read the newest {package} from pip index: {done.stdout[:200]}")
    return m.group(1)


def table(versions: dict[str, str | None], rows: list[dict[str, Any]]) -> str:
    """The Markdown table docs/horizon.md shows."""
    head = ", ".join(f"{k} {v}" for k, v in versions.items() if v)
    out = [f"Stack: {head}", "", "| finding | what | window | version | verdict |", "| --- | --- | --- | --- | --- |"]
    for r in rows:
        v = r["verdict"] + (f" ({r['reason']})" if r.get("reason") else "")
        out.append(f"| {r['code']} | {r['what']} | {r['package']} {r['window']} | {r['version']} | {v} |")
    return "\n".join(out)


def parser() -> argparse.ArgumentParser:
    """The command line (docs/ci.md's weekly job uses it; a test parses that job's line with it)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", help="run with this interpreter's libraries instead of building a venv")
    ap.add_argument("--with", dest="withs", action="append", default=[], metavar="PKG==VER",
                    help="a release to test instead of the newest (repeatable)")
    ap.add_argument("--only", help="comma-separated finding codes")
    ap.add_argument("--json", help="write the rows here too")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.python:
        python = args.python
    else:
        from tests.venvs import ensure_venv

        pins = {w.split("==")[0].lower(): w for w in args.withs}
        packages = tuple(pins.get(p, f"{p}=={newest(p)}") for p in LIBRARIES)
        print(f"building (or reusing) a venv with {' '.join(packages)}", file=sys.stderr)
        python = str(ensure_venv(packages))
    only = set(args.only.split(",")) if args.only else None
    versions, rows = run_probes(python, only)
    print(table(versions, rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"versions": versions, "rows": rows}, indent=2) + "\n")
    return 0 if all(r["verdict"] == "still right" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

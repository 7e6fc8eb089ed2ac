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
It also lets the newest huggingface_hub lay out a cache (a download from a local Hub, then its cache-wide blob store,
its no-symlink fallback and a local_dir download: tests/scripts/hf_layout.py) and runs check, fix and restore on each
layout (``cache_layouts``): a layout change upstream shows here as a failure before users meet it.
Exit status: 0 when every window still holds and every layout is read alike, 1 otherwise (a scheduled CI job fails
and someone looks).
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
LIBRARIES = ("transformers", "peft", "accelerate", "trl", "huggingface_hub")
LAYOUT_SCRIPT = ROOT / "tests" / "scripts" / "hf_layout.py"
LAYOUTS = ("classic", "shared", "nosymlinks", "localdir")


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


def _store_state(cache: Path) -> dict[str, tuple]:
    """Every entry of the cache-wide store as lstat and its bytes show it (what fix and restore must not change)."""
    import hashlib
    import os
    import stat as st_

    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(cache / "blobs"):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            s = p.lstat()
            data = hashlib.sha256(p.read_bytes()).hexdigest() if st_.S_ISREG(s.st_mode) else None
            out[str(p.relative_to(cache))] = (st_.S_IFMT(s.st_mode), st_.S_IMODE(s.st_mode), s.st_mtime_ns, data)
    return out


def cache_layouts(python: str) -> list[dict[str, Any]]:
    """Let ``python``'s huggingface_hub lay out each cache layout from a local Hub, then check / fix / restore it with
    this tree's gemma-doctor: one row per layout ("still right", "new failure" or "could not run", with why)."""
    sys.path.insert(0, str(ROOT))
    from tests.builders import HubCache, gemma3_12b_config, generation_config
    from tests.hubserver import HubServer, repos_from_cache
    from tests.test_safetensors import st_file

    repo = "google/gemma-3-12b-it"
    files = {"config.json": gemma3_12b_config(), "generation_config.json": generation_config(),
             "model.safetensors": st_file({"language_model.model.embed_tokens.weight": ("BF16", [64, 8]),
                                           "language_model.model.norm.weight": ("BF16", [8])})}
    planned = ["--with", "transformers==4.50.3"]  # GD101: a fix to apply and restore
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gd-layouts-") as tmp:
        work = Path(tmp)
        storage = HubCache(work / "hub")
        storage.add(repo, files)
        with HubServer(repos_from_cache(storage.root)) as server:
            env = {**_env(), "HF_ENDPOINT": server.endpoint, "HF_HOME": str(work / "home")}
            env.pop("HF_HUB_OFFLINE", None)
            reference = None
            for layout in LAYOUTS:
                where = work / layout
                extra = {"HF_HUB_DISABLE_SYMLINKS": "1"} if layout == "nosymlinks" else {}
                made = subprocess.run([python, str(LAYOUT_SCRIPT), layout, str(where), repo], capture_output=True,
                                      text=True, timeout=600, env={**env, **extra})
                row: dict[str, Any] = {"layout": layout}
                rows.append(row)
                if made.returncode != 0:
                    tail = (made.stderr.strip().splitlines() or made.stdout.strip().splitlines() or ["no output"])[-1]
                    row.update(verdict="could not run", reason=f"exit {made.returncode}: {tail[:200]}")
                    continue
                row["version"] = json.loads(made.stdout.strip().splitlines()[-1])["huggingface_hub"]
                target = [str(where)] if layout == "localdir" else [repo, "--cache-dir", str(where)]

                def gd(*args: str) -> subprocess.CompletedProcess:
                    return subprocess.run([sys.executable, "-m", "gemma_doctor", *args], capture_output=True,
                                          text=True, timeout=600, env=_env())

                checked = gd("check", *target, *planned, "--format", "json")
                try:
                    model = json.loads(checked.stdout)["models"][0]
                except (ValueError, KeyError, IndexError):
                    row.update(verdict="new failure", reason=f"check exit {checked.returncode}: {checked.stderr[-200:]}")
                    continue
                seen = (sorted(f["code"] for f in model["findings"]), model["dtypes"].get("total_params"))
                reference = reference or seen
                before = _store_state(where) if layout == "shared" else None
                fixed, restored = gd("fix", *target, *planned, "--inplace"), gd("restore", *target)
                problems = []
                if seen != reference:
                    problems.append(f"check differs from the classic layout: {seen} != {reference}")
                if fixed.returncode != 0 or restored.returncode != 0:
                    problems.append(f"fix exit {fixed.returncode}, restore exit {restored.returncode}")
                if before is not None and _store_state(where) != before:
                    problems.append("fix or restore changed the blob store")
                row.update(verdict="new failure" if problems else "still right", reason="; ".join(problems))
    return rows


def layout_table(rows: list[dict[str, Any]]) -> str:
    """The Markdown table of cache layouts docs/horizon.md shows."""
    out = ["| cache layout | huggingface_hub | verdict |", "| --- | --- | --- |"]
    for r in rows:
        v = r["verdict"] + (f" ({r['reason']})" if r.get("reason") else "")
        out.append(f"| {r['layout']} | {r.get('version', '?')} | {v} |")
    return "\n".join(out)


def parser() -> argparse.ArgumentParser:
    """The command line (docs/ci.md's weekly job uses it; a test parses that job's line with it)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", help="run with this interpreter's libraries instead of building a venv")
    ap.add_argument("--with", dest="withs", action="append", default=[], metavar="PKG==VER",
                    help="a release to test instead of the newest (repeatable)")
    ap.add_argument("--only", help="comma-separated finding codes")
    ap.add_argument("--json", help="write the rows here too")
    ap.add_argument("--no-layouts", action="store_true", help="skip the cache-layout check (cache_layouts)")
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
    layouts = [] if args.no_layouts or only else cache_layouts(python)
    if layouts:
        print()
        print(layout_table(layouts))
    if args.json:
        Path(args.json).write_text(json.dumps({"versions": versions, "rows": rows, "layouts": layouts}, indent=2) + "\n")
    return 0 if all(r["verdict"] == "still right" for r in rows + layouts) else 1


if __name__ == "__main__":
    sys.exit(main())

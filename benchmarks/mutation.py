"""Mutation testing of the modules whose mistakes lose data or mislead users, against the fast tests.

A small AST mutator of our own (why not mutmut or cosmic-ray: docs/mutation.md). For each module it makes
single-point mutants of the kinds a reviewer tries by hand: a comparison flipped, a clause of ``and``/``or``
dropped, a ``not`` removed, a condition negated, a call statement deleted (``os.chmod(tmp, mode)`` gone), a
number moved by one, a boolean flipped, ``+``/``-`` swapped, a returned value replaced by None. Each mutant runs
only the tests that execute its line (measured once with coverage.py's per-test contexts), fastest first, and
stops at the first failure. A mutant that makes those tests fail or hang is killed; one they pass survives.

    .venv/bin/python benchmarks/mutation.py                       # every module, 2 workers
    .venv/bin/python benchmarks/mutation.py --module gemma_doctor/stack.py --jobs 1
    .venv/bin/python benchmarks/mutation.py --list                # the mutants only, no tests run

Work files go to .ci-cache/mutation/ (git-ignored); the report is printed and written as JSON to
.ci-cache/mutation/report.json. coverage.py is installed into the running interpreter when it is missing;
the normal test command does not need it.
"""

from __future__ import annotations

import argparse
import ast
import copy
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".ci-cache" / "mutation"

MODULES = (
    "gemma_doctor/fixes.py",
    "gemma_doctor/undo.py",
    "gemma_doctor/fsafe.py",
    "gemma_doctor/rules/__init__.py",
    "gemma_doctor/rules/dtypes.py",
    "gemma_doctor/rules/files.py",
    "gemma_doctor/rules/libraries.py",
    "gemma_doctor/rules/precision.py",
    "gemma_doctor/rules/training.py",
    "gemma_doctor/rules/use_cache.py",
    "gemma_doctor/rules/weights.py",
    "gemma_doctor/readers/safetensors_header.py",
    "gemma_doctor/family.py",
    "gemma_doctor/stack.py",
)

# The fast part of the suite: no venv builds or training (-m "not slow"), and none of the files whose tests
# drive gemma-doctor in child processes (crash kills, lock races, start-up imports): coverage cannot attribute
# a child's lines to a test, so they would only add time.
# addopts= and no:xdist: pyproject's addopts run the suite on every core (-n auto); here the tests must run in this process,
# where coverage records them and the import hook serves the mutant (an xdist worker would see neither).
PYTEST_ARGS = ("-m", "not slow", "-p", "no:cacheprovider", "-o", "addopts=", "-p", "no:xdist",
               "--ignore=tests/test_crash_safety.py", "--ignore=tests/test_concurrency.py",
               "--ignore=tests/test_startup_imports.py", "--ignore=tests/test_install.py",
               "--ignore=tests/test_e2e_transformers450.py", "--ignore=tests/test_versions.py")


# --- making mutants -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Mutant:
    """One single-point change to a module."""

    module: str
    index: int  # position in the module's list (stable for unchanged source)
    line: int
    kind: str
    before: str
    after: str

    @property
    def name(self) -> str:
        """``gemma_doctor/stack.py:42#3``."""
        return f"{self.module}:{self.line}#{self.index}"


_CMP_SWAP: dict[type, type] = {ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Lt: ast.LtE, ast.LtE: ast.Lt,
                               ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.In: ast.NotIn, ast.NotIn: ast.In,
                               ast.Is: ast.IsNot, ast.IsNot: ast.Is}
_BIN_SWAP: dict[type, type] = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.FloorDiv: ast.Mult,
                               ast.Div: ast.Mult, ast.Mod: ast.FloorDiv, ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd,
                               ast.LShift: ast.RShift, ast.RShift: ast.LShift}


def _docstring_nodes(tree: ast.AST) -> set[int]:
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                out.add(id(first))
    return out


def _annotation_nodes(tree: ast.AST) -> set[int]:
    """Nodes inside type annotations (mutating them changes nothing at run time)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        anns: list[ast.AST | None] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            anns.append(node.returns)
            a = node.args
            anns += [x.annotation for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if x is not None]
        elif isinstance(node, ast.AnnAssign):
            anns.append(node.annotation)
        for ann in anns:
            if ann is not None:
                out |= {id(n) for n in ast.walk(ann)}
    return out


def _message_nodes(tree: ast.AST) -> set[int]:
    """Nodes inside f-strings: they shape message text (a slice bound, a plural), not behaviour."""
    return {id(n) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for n in ast.walk(node)}


def _candidates(tree: ast.Module) -> Iterator[tuple[ast.AST, str, object]]:
    """(node, kind, action) for every mutation point; a callable action mutates a copy of the node in place."""
    skip = _docstring_nodes(tree) | _annotation_nodes(tree) | _message_nodes(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                if type(op) in _CMP_SWAP:
                    def flip(n: ast.Compare, i: int = i) -> None:
                        n.ops[i] = _CMP_SWAP[type(n.ops[i])]()
                    yield node, f"compare {type(op).__name__}->{_CMP_SWAP[type(op)].__name__}", flip
        elif isinstance(node, ast.BoolOp):
            for i in range(len(node.values)):
                def drop(n: ast.BoolOp, i: int = i) -> None:
                    del n.values[i]
                yield node, f"drop clause {i + 1} of {type(node.op).__name__.lower()}", drop
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            yield node, "remove not", "unwrap"
        elif isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert)):
            if not (isinstance(node.test, ast.UnaryOp) and isinstance(node.test.op, ast.Not)):  # "remove not" does it
                yield node, "negate condition", "negate"
        elif isinstance(node, ast.comprehension):
            for i in range(len(node.ifs)):
                def neg_if(n: ast.comprehension, i: int = i) -> None:
                    n.ifs[i] = ast.UnaryOp(op=ast.Not(), operand=n.ifs[i])
                yield node, "negate filter", neg_if
        elif isinstance(node, ast.BinOp) and type(node.op) in _BIN_SWAP:
            def binswap(n: ast.BinOp) -> None:
                n.op = _BIN_SWAP[type(n.op)]()
            yield node, f"{type(node.op).__name__}->{_BIN_SWAP[type(node.op)].__name__}", binswap
        elif isinstance(node, ast.AugAssign) and type(node.op) in _BIN_SWAP:
            def augswap(n: ast.AugAssign) -> None:
                n.op = _BIN_SWAP[type(n.op)]()
            yield node, f"{type(node.op).__name__}= -> {_BIN_SWAP[type(node.op)].__name__}=", augswap
        elif isinstance(node, ast.Constant) and type(node.value) is bool:
            def boolflip(n: ast.Constant) -> None:
                n.value = not n.value
            yield node, "flip boolean", boolflip
        elif isinstance(node, ast.Constant) and type(node.value) in (int, float):
            def bump(n: ast.Constant) -> None:
                n.value = n.value + 1
            yield node, "number + 1", bump
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            yield node, "delete call", "pass"
        elif isinstance(node, ast.Return) and node.value is not None and not (
                isinstance(node.value, ast.Constant) and node.value.value is None):
            def ret_none(n: ast.Return) -> None:
                n.value = ast.Constant(value=None)
            yield node, "return None", ret_none


class _Replace(ast.NodeTransformer):
    """Apply one mutation to the node at ``target`` (an index into ast.walk order)."""

    def __init__(self, target: int, action) -> None:  # noqa: ANN001
        self.target, self.action, self.pos = target, action, -1
        self.order: dict[int, int] = {}

    def run(self, tree: ast.Module) -> ast.Module:
        self.order = {id(n): i for i, n in enumerate(ast.walk(tree))}
        return self.visit(tree)

    def generic_visit(self, node: ast.AST) -> ast.AST:
        node = super().generic_visit(node)
        return node

    def visit(self, node: ast.AST) -> ast.AST:  # noqa: D102
        if self.order.get(id(node)) == self.target:
            if self.action == "unwrap":
                return node.operand  # type: ignore[attr-defined]
            if self.action == "pass":
                return ast.copy_location(ast.Pass(), node)
            if self.action == "negate":
                node.test = ast.UnaryOp(op=ast.Not(), operand=node.test)  # type: ignore[attr-defined]
                return node
            self.action(node)
            return node
        return self.generic_visit(node)


def make_mutants(module: str, source: str) -> list[tuple[Mutant, str]]:
    """Every mutant of ``module`` with its full mutated source; mutants whose code equals the original are dropped."""
    tree = ast.parse(source)
    original = ast.unparse(tree)
    walk_index = {id(n): i for i, n in enumerate(ast.walk(tree))}
    lines = source.splitlines()
    out: list[tuple[Mutant, str]] = []
    seen: set[str] = set()
    for node, kind, action in list(_candidates(tree)):
        mutated_tree = _Replace(walk_index[id(node)], action).run(copy.deepcopy(tree))
        try:
            code = ast.unparse(ast.fix_missing_locations(mutated_tree))
            compile(code, module, "exec")
        except (SyntaxError, ValueError, TypeError):
            continue  # e.g. a BoolOp left with one operand is still valid; a broken one is not a mutant
        if code == original or code in seen:
            continue
        seen.add(code)
        # A comprehension clause has no position of its own: its target's is the line the filter is on.
        line = getattr(node, "lineno", None) or getattr(getattr(node, "target", None), "lineno", 0)
        before = lines[line - 1].strip() if 0 < line <= len(lines) else ""
        after = _changed_line(original, code) or kind
        out.append((Mutant(module, len(out), line, kind, before, after), code))
    return out


def _changed_line(original: str, mutated: str) -> str:
    for a, b in zip(original.splitlines(), mutated.splitlines()):
        if a != b:
            return b.strip()
    return ""


# --- which tests run each line -----------------------------------------------------------------------

def _ensure_coverage() -> None:
    try:
        import coverage  # noqa: F401
    except ImportError:
        print("installing coverage (needed only by this script)", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "coverage>=7"], check=True)


def measure(extra: list[str]) -> tuple[dict[str, dict[int, set[str]]], dict[str, float]]:
    """Run the fast tests once under coverage: line -> test functions per module, and seconds per test function."""
    _ensure_coverage()
    WORK.mkdir(parents=True, exist_ok=True)
    rc = WORK / "coveragerc"
    data_file = WORK / "coverage-data"
    rc.write_text(f"[run]\ndynamic_context = test_function\nsource = gemma_doctor\ndata_file = {data_file}\n")
    junit = WORK / "junit.xml"
    cmd = [sys.executable, "-m", "coverage", "run", "--rcfile", str(rc), "-m", "pytest", "-q", *PYTEST_ARGS, *extra,
           f"--junitxml={junit}", "tests"]
    print("measuring which tests run which lines:", " ".join(cmd[1:]), file=sys.stderr, flush=True)
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"the fast tests fail on unmutated code; fix that first\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}")
    from coverage import CoverageData

    data = CoverageData(basename=str(data_file))
    data.read()
    if not any(c for c in data.measured_contexts()):
        sys.exit("coverage recorded no test: the tests did not run in the measured process (a plugin such as "
                 "xdist moved them to workers?); a score from this would be 0% for nothing")
    by_module: dict[str, dict[int, set[str]]] = {}
    for measured in data.measured_files():
        rel = os.path.relpath(measured, ROOT)
        by_module[rel] = {line: {_node(c) for c in contexts if c}
                          for line, contexts in data.contexts_by_lineno(measured).items()}
    durations: dict[str, float] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        node = case.get("classname", "").replace(".", "/") + ".py::" + case.get("name", "").split("[")[0]
        durations[node] = durations.get(node, 0.0) + float(case.get("time") or 0)
    return by_module, durations


def _node(context: str) -> str:
    """coverage's test_function context ``tests.test_fix.test_x`` -> ``tests/test_fix.py::test_x``."""
    parts = context.split(".")
    for i in range(len(parts), 0, -1):
        path = "/".join(parts[:i]) + ".py"
        if (ROOT / path).is_file():
            return path + "::" + "::".join(parts[i:])
    return context


# --- running mutants: a fork server ----------------------------------------------------------------
# The parent imports pytest and the heavy third-party libraries once (never gemma_doctor or the tests), then
# forks one child per mutant. The child installs an import hook that serves the mutated source for its module,
# so the working tree is never written and several mutants run at once; pytest then imports everything else
# fresh. Tests that run gemma-doctor in a child process of their own see the unmutated code (docs/mutation.md).

PREIMPORT = ("pytest", "hypothesis", "hypothesis.strategies", "click", "rich", "rich.console", "numpy", "safetensors",
             "huggingface_hub", "packaging.version", "packaging.specifiers", "filelock", "yaml", "jsonschema",
             "torch", "transformers", "peft", "trl", "accelerate")


@dataclass
class Result:
    """What the tests made of one mutant."""

    mutant: Mutant
    status: str  # killed | survived | timeout | no-tests | error (the tool failed; neither killed nor survived)
    tests: int = 0
    seconds: float = 0.0
    killer: str | None = None


def _tests_for(m: Mutant, lines: dict[int, set[str]], durations: dict[str, float], node_end: int) -> list[str]:
    tests: set[str] = set()
    for line in range(m.line, max(m.line, node_end) + 1):
        tests |= lines.get(line, set())
    if not tests and m.line in lines:  # run at import time only (a module-level table): every test of the module
        tests = set().union(*lines.values())
    return sorted(tests, key=lambda t: (durations.get(t, 1.0), t))


def _child(m: Mutant, code: str, tests: list[str], extra: list[str], out: Path) -> None:
    """In the forked child: serve the mutant for its module, run the tests, write the outcome, exit."""
    import importlib.abc
    import importlib.util

    name = m.module[:-3].replace("/", ".").removesuffix(".__init__")
    path = str(ROOT / m.module)

    class Loader(importlib.abc.SourceLoader):
        def get_filename(self, fullname: str) -> str:
            return path

        def get_data(self, p: str) -> bytes:
            return code.encode() if p == path else Path(p).read_bytes()

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, target_path=None, target=None):  # noqa: ANN001, ANN201
            if fullname != name:
                return None
            pkg = [str(Path(path).parent)] if m.module.endswith("__init__.py") else None
            return importlib.util.spec_from_file_location(fullname, path, loader=Loader(),
                                                          submodule_search_locations=pkg)

    sys.meta_path.insert(0, Finder())
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    import pytest

    class FirstFailure:
        nodeid: str | None = None

        def pytest_runtest_logreport(self, report) -> None:  # noqa: ANN001
            if report.failed and self.nodeid is None:
                self.nodeid = report.nodeid

    plugin = FirstFailure()
    try:
        # no:unraisableexception: its gc.collect() per test costs more than the test with torch in memory.
        rc = int(pytest.main(["-x", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-p", "no:xdist", "-p", "no:unraisableexception", "-m", "not slow",
                              *extra, *tests], plugins=[plugin]))
    except BaseException as e:  # noqa: BLE001 - anything the mutant breaks is a failure of the tests
        rc, plugin.nodeid = 99, f"{type(e).__name__}"
    out.write_text(json.dumps({"rc": rc, "failed": plugin.nodeid}))
    os._exit(0)


def run_all(jobs: list[tuple[Mutant, str, list[str]]], durations: dict[str, float], extra: list[str],
            workers: int, progress=None) -> list[Result]:  # noqa: ANN001
    """Run every mutant's tests in forked children, ``workers`` at a time; a child past its budget is a timeout."""
    import signal
    import tempfile

    # Bytecode and pytest's rewritten test modules are cached outside the work tree and shared by the children:
    # compiling them again in every child was most of a mutant's cost. (The mutated module is never cached: its
    # loader has no path_stats.)
    sys.dont_write_bytecode = False
    sys.pycache_prefix = str(WORK / "pycache")
    for mod in PREIMPORT:
        try:
            __import__(mod)
        except Exception:  # noqa: BLE001 - only a speed-up
            pass
    assert not any(k == "gemma_doctor" or k.startswith(("gemma_doctor.", "tests")) for k in sys.modules)
    os.chdir(ROOT)
    outdir = Path(tempfile.mkdtemp(prefix="gd-mutation-"))
    results: list[Result] = []
    running: dict[int, tuple[Mutant, list[str], float, float, Path]] = {}
    queue = list(jobs)
    done_count = 0

    def finish(pid: int, timed_out: bool, status: int = 0) -> None:
        nonlocal done_count
        m, tests, start, _, out = running.pop(pid)
        seconds = time.monotonic() - start
        if timed_out:
            results.append(Result(m, "timeout", len(tests), seconds))
        elif os.WIFSIGNALED(status):  # the mutant crashed the interpreter running the tests
            results.append(Result(m, "killed", len(tests), seconds, f"signal {os.WTERMSIG(status)}"))
        else:
            try:
                got = json.loads(out.read_text())
            except (OSError, ValueError):  # the child could not report: a fault of this tool, not a kill
                got = {"rc": None, "failed": f"no result (child exit {os.WEXITSTATUS(status)})"}
            status_ = "error" if got["rc"] is None else "survived" if got["rc"] == 0 else "killed"
            results.append(Result(m, status_, len(tests), seconds, got["failed"] or (f"exit {got['rc']}" if got["rc"] else None)))
        done_count += 1
        if progress is not None and done_count % 25 == 0:
            progress(results)
        mark = {"killed": ".", "timeout": "T", "survived": "S", "error": "E"}[results[-1].status]
        print(mark, end="\n" if done_count % 80 == 0 else "", file=sys.stderr, flush=True)

    for m, code, tests in list(queue):
        if not tests:
            results.append(Result(m, "no-tests"))
    queue = [j for j in queue if j[2]]
    while queue or running:
        while queue and len(running) < workers:
            m, code, tests = queue.pop(0)
            out = outdir / f"{len(results) + len(running)}-{m.index}.json"
            budget = 60 + 10 * sum(durations.get(t, 1.0) for t in tests)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                try:
                    _child(m, code, tests, extra, out)
                finally:
                    os._exit(97)
            running[pid] = (m, tests, time.monotonic(), budget, out)
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid:
            finish(pid, False, status)
            continue
        now = time.monotonic()
        for cpid, (_, _, start, budget, _) in list(running.items()):
            if now - start > budget:
                os.kill(cpid, signal.SIGKILL)
                os.waitpid(cpid, 0)
                finish(cpid, True)
        time.sleep(0.05)
    print(file=sys.stderr)
    shutil.rmtree(outdir, ignore_errors=True)
    return results


def _node_ends(source: str) -> dict[int, int]:
    """First line -> last line of each simple statement (and of each if/while test), so a mutant on a
    multi-line statement finds the tests that run any of its lines."""
    ends: dict[int, int] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.If, ast.While)):
            last = node.test.end_lineno or node.lineno
        elif isinstance(node, ast.stmt) and not isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.For, ast.With,
                                                                   ast.Try, ast.AsyncFunctionDef)):
            last = node.end_lineno or node.lineno
        else:
            continue
        ends[node.lineno] = max(ends.get(node.lineno, 0), last)
    return ends


@dataclass
class Report:
    """Per-module scores and every mutant that was not killed."""

    modules: dict[str, dict[str, int | float]] = field(default_factory=dict)
    survivors: list[dict] = field(default_factory=list)
    seconds: float = 0.0


def build_report(modules: list[str], results: list[Result], seconds: float, digests: dict[str, str],
                 out: Path, partial: bool = False) -> Report:
    """Scores per module and the mutants not killed; written to ``out`` as JSON (also while running: partial)."""
    report = Report(seconds=round(seconds, 1))
    for module in modules:
        rs = [r for r in results if r.mutant.module == module]
        killed = sum(r.status in ("killed", "timeout") for r in rs)
        errors = sum(r.status == "error" for r in rs)
        report.modules[module] = {"mutants": len(rs), "killed": killed,
                                  "survived": sum(r.status == "survived" for r in rs),
                                  "no_tests": sum(r.status == "no-tests" for r in rs),
                                  "errors": sum(r.status == "error" for r in rs),
                                  "score": round(100 * killed / max(1, len(rs) - errors), 1) if rs else 100.0}
    report.survivors = [{**asdict(r.mutant), "status": r.status, "tests": r.tests}
                        for r in results if r.status not in ("killed", "timeout")]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**asdict(report), "partial": partial, "sources": digests,
                                    "killers": {r.mutant.name: r.killer for r in results if r.killer}}, indent=1))

    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--module", action="append", help="a module to mutate (repeatable); default: the list in MODULES")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="mutants tested at once (default 2)")
    p.add_argument("--list", action="store_true", help="print the mutants and stop")
    p.add_argument("--pytest-arg", action="append", default=[], help="extra pytest argument (e.g. -k expression)")
    p.add_argument("--out", type=Path, default=WORK / "report.json")
    p.add_argument("--reuse-measure", action="store_true",
                   help="reuse the last coverage measurement (only when neither code nor tests changed since)")
    p.add_argument("--also-test", action="append", default=[], metavar="NODEID",
                   help="a test every mutant also runs (repeatable): one added since the coverage measurement that "
                        "--reuse-measure reuses, so it can kill mutants the measurement does not know it reaches")
    p.add_argument("--retest", type=Path, metavar="REPORT",
                   help="test again only the mutants REPORT did not kill (and every mutant of a module whose source "
                        "changed since); the others count as killed. Tests may only have been added since REPORT")
    args = p.parse_args(argv)
    modules = args.module or list(MODULES)
    started = time.monotonic()

    mutants: dict[str, list[tuple[Mutant, str]]] = {}
    digests: dict[str, str] = {}
    for module in modules:
        source = (ROOT / module).read_text()
        digests[module] = hashlib.sha256(source.encode()).hexdigest()
        mutants[module] = make_mutants(module, source)
    carried: list[Result] = []
    if args.retest is not None:
        previous = json.loads(args.retest.read_text())
        if previous.get("partial"):
            sys.exit(f"{args.retest} is a partial report (its run was stopped): run every mutant instead")
        for module in modules:
            if previous.get("sources", {}).get(module) != digests[module]:
                continue  # changed (or new): every mutant is tested
            retest = {s["index"] for s in previous["survivors"] if s["module"] == module}
            carried += [Result(m, "killed", killer="(killed in " + args.retest.name + ")")
                        for m, _ in mutants[module] if m.index not in retest]
            mutants[module] = [(m, c) for m, c in mutants[module] if m.index in retest]
    if args.list:
        for module, ms in mutants.items():
            for m, _ in ms:
                print(f"{m.name:48} {m.kind:32} {m.after}")
        print(f"{sum(map(len, mutants.values()))} mutants", file=sys.stderr)
        return 0

    cached = WORK / "measure.json"
    if args.reuse_measure and cached.exists():
        raw = json.loads(cached.read_text())
        by_module = {m: {int(k): set(v) for k, v in lines.items()} for m, lines in raw["lines"].items()}
        durations = raw["durations"]
    else:
        by_module, durations = measure(args.pytest_arg)
        cached.write_text(json.dumps({"lines": {m: {k: sorted(v) for k, v in lines.items()} for m, lines in by_module.items()},
                                      "durations": durations}))
    jobs: list[tuple[Mutant, str, list[str]]] = []
    for module, ms in mutants.items():
        ends = _node_ends((ROOT / module).read_text())
        lines = by_module.get(module, {})
        for m, code in ms:
            tests = _tests_for(m, lines, durations, ends.get(m.line, m.line))
            # The added tests first: they were written for the survivors a retest is about.
            jobs.append((m, code, [*args.also_test, *(t for t in tests if t not in args.also_test)]))
    print(f"{len(jobs)} mutants in {len(modules)} modules, {args.jobs} at a time", file=sys.stderr, flush=True)
    results = carried + run_all(jobs, durations, args.pytest_arg, max(1, args.jobs), progress=lambda rs: build_report(
        modules, carried + rs, time.monotonic() - started, digests, args.out, partial=True))

    report = build_report(modules, results, time.monotonic() - started, digests, args.out)
    total = sum(int(v["mutants"]) for v in report.modules.values())
    total_killed = sum(int(v["killed"]) for v in report.modules.values())
    print(f"\n{'module':45} {'mutants':>7} {'killed':>7} {'score':>6}")
    for module, v in report.modules.items():
        print(f"{module:45} {v['mutants']:>7} {v['killed']:>7} {v['score']:>5}%")
    print(f"{'all':45} {total:>7} {total_killed:>7} {round(100 * total_killed / max(total, 1), 1):>5}%")
    if report.survivors:
        print("\nsurviving mutants:")
        for s in report.survivors:
            print(f"  {s['module']}:{s['line']} [{s['kind']}] {s['before']}\n      -> {s['after']}"
                  + {"no-tests": "   (no test runs this line)", "error": "   (TOOL ERROR: not tested)"}.get(s["status"], ""))
    print(f"\n{report.seconds:.0f} s; report: {args.out}", file=sys.stderr)
    return 1 if any(s["status"] == "error" for s in report.survivors) else 0


if __name__ == "__main__":
    sys.exit(main())

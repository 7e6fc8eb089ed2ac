"""Module-level state is only what docs/architecture.md lists ("Process-wide state"): every cache, registry or global a
module changes after import, found by walking the source, must have its row there (issue 32: each documented)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "gemma_doctor"
DOC = ROOT / "docs" / "architecture.md"
# Calls to these methods change the container they are called on.
MUTATORS = frozenset({"clear", "add", "append", "update", "setdefault", "pop", "popitem", "extend", "discard", "remove",
                      "insert"})
# Module-level values that are state by what they are, whether or not the module changes them by name.
STATEFUL_CALLS = frozenset({"dict", "list", "set", "count", "Lock", "RLock", "WeakKeyDictionary", "WeakValueDictionary",
                            "Cache", "local"})


def _call_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Call):
        f = node.func
        return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
    return None


def module_state(source: str) -> set[str]:
    """The names of a module's state: module-level names it assigns through ``global``, changes in place, or binds to
    an empty container or a stateful object, and its functions memoised by functools (``name()``)."""
    tree = ast.parse(source)
    top: dict[str, ast.expr | None] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            top.update({t.id: node.value for t in node.targets if isinstance(t, ast.Name)})
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            top[node.target.id] = node.value
    found = {name for name, value in top.items()
             if (isinstance(value, (ast.Dict, ast.List, ast.Set)) and not getattr(value, "keys", getattr(value, "elts", None)))
             or (_call_name(value) in STATEFUL_CALLS and not (
                 _call_name(value) in ("dict", "list", "set") and (value.args or value.keywords)))}
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            found.update(n for n in node.names if n in top)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS \
                and isinstance(node.func.value, ast.Name) and node.func.value.id in top:
            found.add(node.func.value.id)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
            targets = [node.target] if isinstance(node, ast.AugAssign) else node.targets
            found.update(t.value.id for t in targets
                         if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id in top)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and any(
                re.search(r"(^|\.)(lru_cache|cache)\b", ast.unparse(d)) for d in node.decorator_list):
            found.add(node.name + "()")
    return found


def identity_keyed(source: str) -> set[str]:
    """The module state a module keys by identity: state named in a function that calls ``id()``, or that compares with
    ``is`` a value read from that state (directly or through a local bound to it) to anything but None."""
    tree = ast.parse(source)
    names = {n for n in module_state(source) if not n.endswith("()")}
    found: set[str] = set()
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        used = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)} & names
        if not used:
            continue
        # Locals bound to the state (``last = _LAST``, ``hit = _BY_ID.get(...)``) read it too.
        reads = set(used)
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)} & used:
                reads.update(t.id for t in node.targets if isinstance(t, ast.Name))
        for node in ast.walk(fn):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "id":
                found |= used
            elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops):
                sides = [node.left, *node.comparators]
                if any(isinstance(x, ast.Constant) and x.value is None for x in sides):
                    continue
                if any(isinstance(n, ast.Name) and n.id in reads for x in sides for n in ast.walk(x)):
                    found |= used
    return found


def state() -> set[str]:
    """Every module's state as ``module.NAME`` (module relative to the package, dotted)."""
    out = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        mod = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out.update(f"{mod}.{name}" for name in module_state(path.read_text(encoding="utf-8")))
    return out


def documented() -> set[str]:
    """The names in the first cell of each row of docs/architecture.md's "Process-wide state" table."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Process-wide state", 1)[1].split("\n## ", 1)[0]
    return {name for line in section.splitlines() if line.startswith("| `")
            for name in re.findall(r"`([^`]+)`", line.split("|")[1])}


def test_every_piece_of_module_state_is_documented() -> None:
    missing = sorted(state() - documented())
    assert not missing, ("module-level state without a row in docs/architecture.md's \"Process-wide state\" (say what "
                         "it holds and why it is process-wide, or make it local): " + ", ".join(missing))


@pytest.mark.parametrize("source, expected", [
    ("_A: dict = {}\n", {"_A"}),
    ("_A = {'x': 1}\n", set()),  # a table, not state
    ("_A = {'x': 1}\ndef f():\n    _A['y'] = 2\n", {"_A"}),
    ("_A = None\ndef f():\n    global _A\n    _A = 1\n", {"_A"}),
    ("_A = [False]\ndef f():\n    _A.append(1)\n", {"_A"}),
    ("import functools\n@functools.lru_cache(maxsize=1)\ndef f():\n    return 1\n", {"f()"}),
    ("import threading\n_L = threading.Lock()\n", {"_L"}),
    ("def f():\n    x = {}\n    x['a'] = 1\n", set()),  # a local, not module state
    ("_A = dict(a=1)\n", set()),  # a table made by a call
])
def test_the_walk_finds_state(source: str, expected: set[str]) -> None:
    assert module_state(source) == expected


def test_no_module_state_is_keyed_by_identity() -> None:
    """A value kept by a module and found again by an object's id() or by ``is`` is state of a scan, a search or a
    call kept where every later one meets it (issue 32): it belongs to that scan, search or call, passed explicitly,
    or to a cache keyed by the value itself."""
    held = []
    for path in sorted(PACKAGE.rglob("*.py")):
        mod = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        held.extend(f"{mod}.{name}" for name in sorted(identity_keyed(path.read_text(encoding="utf-8"))))
    assert not held, "module state keyed by identity: " + ", ".join(held)


@pytest.mark.parametrize("source, expected", [
    ("_C: dict = {}\ndef f(x):\n    return _C.get(id(x))\n", {"_C"}),
    ("_L = None\ndef f(x):\n    global _L\n    last = _L\n    if last is not None and last[0] is x:\n"
     "        return last[1]\n    _L = (x, 1)\n", {"_L"}),
    ("_L = None\ndef f(x):\n    global _L\n    if _L is None:\n        _L = x\n    return _L\n", set()),
    ("_N = object()\n_C: dict = {}\ndef f(k):\n    hit = _C.get(k, _N)\n    return hit\n", set()),
    ("_C: dict = {}\ndef f(k, a, b):\n    if a is b:\n        _C[k] = 1\n", set()),  # not a read of the state
])
def test_the_walk_finds_identity_keys(source: str, expected: set[str]) -> None:
    assert identity_keyed(source) == expected

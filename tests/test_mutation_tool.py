"""benchmarks/mutation.py makes the single-point mutants a reviewer would try by hand, and only those."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _tool():
    spec = importlib.util.spec_from_file_location("gd_mutation_tool", ROOT / "benchmarks" / "mutation.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


SOURCE = '''"""Module docstring."""
import os


def restore(path: str, mode: int = 0o644) -> bool:
    """Docstring."""
    if os.path.exists(path) and not os.path.islink(path):
        os.chmod(path, mode)
        return True
    print(f"{path[:80]} not restored")
    return False
'''


def test_mutants_are_single_point_changes_of_behaviour():
    mutants = {(m.kind, m.after) for m, _ in _tool().make_mutants("x.py", SOURCE)}
    assert ("delete call", "pass") in mutants  # os.chmod(path, mode) dropped: the file mode is lost
    assert ("drop clause 1 of and", "if not os.path.islink(path):") in mutants
    assert ("drop clause 2 of and", "if os.path.exists(path):") in mutants
    assert ("remove not", "if os.path.exists(path) and os.path.islink(path):") in mutants
    assert ("negate condition", "if not (os.path.exists(path) and (not os.path.islink(path))):") in mutants
    assert ("flip boolean", "return False") in mutants and ("flip boolean", "return True") in mutants
    assert ("number + 1", "def restore(path: str, mode: int=421) -> bool:") in mutants


def test_docstrings_annotations_and_message_text_are_not_mutated():
    tool = _tool()
    for m, code in tool.make_mutants("x.py", SOURCE):
        assert '"""Docstring."""' in code or "'Docstring.'" in code, m
        assert "path[:80]" in code or m.kind == "delete call", m  # inside an f-string: message text
        compile(code, "x.py", "exec")
    names = [m.name for m, _ in tool.make_mutants("x.py", SOURCE)]
    assert len(names) == len(set(names))


def test_a_negated_comprehension_filter_is_placed_on_its_line():
    """Otherwise the mutant has line 0, no test is chosen for it, and it counts as a survivor nobody tested."""
    source = "def f(xs):\n    return [\n        x for x in xs if x > 1]\n"
    [(m, code)] = [(m, c) for m, c in _tool().make_mutants("x.py", source) if m.kind == "negate filter"]
    assert m.line == 3 and "if not x > 1" in code

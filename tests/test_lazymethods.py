"""gemma_doctor/lazymethods.py: the dataclass methods made on first use are the methods dataclasses would have made at
import, and behave as them; other modules' dataclasses are untouched."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gemma_doctor import lazymethods

ROOT = Path(__file__).resolve().parent.parent
LAZY_ON = sys.version_info[:2] <= (3, 12) and hasattr(dataclasses, "_create_fn")

# Every module of the package imported, then for every dataclass each method lazymethods may defer: its code (the
# bytes, constants, names and argument names of the function dataclasses makes), made by the stub where it is one.
_SURVEY = """
import dataclasses, hashlib, importlib, json, marshal, pkgutil, sys
import gemma_doctor
for m in pkgutil.walk_packages(gemma_doctor.__path__, "gemma_doctor."):
    if m.name not in ("gemma_doctor.callback", "gemma_doctor.__main__"):  # transformers; the CLI entry point
        importlib.import_module(m.name)
out = {}
stubs = 0
for name, mod in sorted(sys.modules.items()):
    if not name.startswith("gemma_doctor"):
        continue
    for cls in list(vars(mod).values()):
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls.__module__ == name):
            continue
        for meth in ("__repr__", "__eq__", "__hash__", "__setattr__", "__delattr__", "__init__"):
            f = cls.__dict__.get(meth)
            f = getattr(f, "__wrapped__", f)
            if f is None:
                continue
            if hasattr(f, "make"):
                stubs += 1
                f = f.make()
            c = f.__code__
            out[f"{name}.{cls.__qualname__}.{meth}"] = [hashlib.sha256(marshal.dumps(
                (c.co_code, c.co_consts, c.co_names, c.co_varnames, c.co_freevars))).hexdigest(), f.__qualname__]
print(json.dumps({"methods": out, "stubs": stubs}))
"""


def _survey(eager: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "GEMMA_DOCTOR_EAGER_METHODS"}
    if eager:
        env["GEMMA_DOCTOR_EAGER_METHODS"] = "1"
    got = subprocess.run([sys.executable, "-c", _SURVEY], capture_output=True, text=True, cwd=ROOT, env=env,
                         timeout=300)
    assert got.returncode == 0, got.stderr[-3000:]
    return json.loads(got.stdout)


@pytest.mark.skipif(not LAZY_ON, reason="this Python's dataclasses make no method one at a time")
def test_every_deferred_method_is_the_method_dataclasses_makes():
    lazy, eager = _survey(False), _survey(True)
    assert eager["stubs"] == 0 and lazy["stubs"] > 200  # the comparison is of deferred methods with eager ones
    assert lazy["methods"] == eager["methods"]
    assert len(eager["methods"]) > 300


def _made_in(module: str, source: str, monkeypatch) -> dict:
    """The classes of ``source`` made in a module of that name (dataclasses looks the module up by name)."""
    import types

    mod = types.ModuleType(module)
    mod.dataclasses = dataclasses
    monkeypatch.setitem(sys.modules, module, mod)
    exec(compile(source, module, "exec", dont_inherit=True), mod.__dict__)
    return mod.__dict__


_CLASSES = """
@dataclasses.dataclass(frozen=True)
class Point:
    x: int
    y: tuple = ()

@dataclasses.dataclass(frozen=True, slots=True)
class Slotted:
    a: str
    b: float = 1.0

class Sub(Point):
    pass
"""


@pytest.mark.skipif(not LAZY_ON, reason="this Python's dataclasses make no method one at a time")
def test_deferred_methods_behave_as_made_ones(monkeypatch):
    assert lazymethods.install()
    ours = _made_in("gemma_doctor.somewhere", _CLASSES, monkeypatch)
    theirs = _made_in("elsewhere", _CLASSES, monkeypatch)
    assert hasattr(ours["Point"].__dict__["__eq__"], "make") and not hasattr(theirs["Point"].__dict__["__eq__"], "make")
    for ns in (ours, theirs):
        p, q, s = ns["Point"](1, (2,)), ns["Point"](1, (2,)), ns["Sub"](1, (2,))
        assert (p == q, p != ns["Point"](2), hash(p) == hash(q), repr(p)) == (True, True, True, "Point(x=1, y=(2,))")
        assert p.__eq__(3) is NotImplemented and repr(s) == "Sub(x=1, y=(2,))" and s == ns["Sub"](1, (2,))
        with pytest.raises(dataclasses.FrozenInstanceError):
            p.x = 3
        with pytest.raises(dataclasses.FrozenInstanceError):
            del p.x
        t = ns["Slotted"]("a")
        assert (repr(t), t == ns["Slotted"]("a"), hash(t) == hash(ns["Slotted"]("a"))) == ("Slotted(a='a', b=1.0)", True, True)
        with pytest.raises(dataclasses.FrozenInstanceError):
            t.a = "b"
        assert dataclasses.replace(p, x=5) == ns["Point"](5, (2,))
    # once called, the class holds the method itself, named as dataclasses names it
    eq = ours["Point"].__dict__["__eq__"]
    assert not hasattr(eq, "make") and eq.__qualname__ == "Point.__eq__"
    assert ours["Point"].__dict__["__setattr__"].__qualname__ == "Point.__setattr__"

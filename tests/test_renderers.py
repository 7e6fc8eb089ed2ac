"""Every output format of check, fix/restore and list is one renderer of render/formats.py's registry, and the CLI picks
it from there: the commands compare no format names (outputs themselves: test_check, test_list, test_github_format)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from gemma_doctor.listing import ListFormat
from gemma_doctor.render import OutputFormat
from gemma_doctor.render.formats import OUTCOMES, RENDERERS, REPORT, ROWS, VIEWS, Renderer, formats, renderer

CLI = Path(__file__).resolve().parent.parent / "gemma_doctor" / "cli"
# The commands whose output format comes from the registry (recommend's and rehearse's views are their own modules'),
# each in its module of the CLI package.
COMMANDS = ("check", "fix", "restore", "list_models")
NAMES = {name for r in RENDERERS.values() for name in (r.name,)} | {f.value for f in OutputFormat} | \
    {f.value for f in ListFormat}


def _function(tree: ast.Module, name: str) -> ast.FunctionDef:
    return next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)


@pytest.mark.parametrize("command", COMMANDS)
def test_the_commands_compare_no_format_name(command: str) -> None:
    """No if/elif on a format: no enum member of a format and no comparison with a format's name in the command."""
    body = _function(ast.parse((CLI / f"{command}.py").read_text(encoding="utf-8")), command)
    wrong = []
    for node in ast.walk(body):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in (
                "OutputFormat", "ListFormat"):
            wrong.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
        if isinstance(node, ast.Compare):
            consts = [c.value for c in (node.left, *node.comparators) if isinstance(c, ast.Constant)]
            wrong.extend(f"line {node.lineno}: compares with {c!r}" for c in consts if c in NAMES)
    assert not wrong, f"{command} chooses its output by format name:\n" + "\n".join(wrong)


def test_the_registry_is_the_choices() -> None:
    """The enums the docs list and the registry agree, in order (an exhaustiveness check, as pip-audit's)."""
    assert formats(REPORT) == tuple(f.value for f in OutputFormat)
    assert formats(ROWS) == tuple(f.value for f in ListFormat)
    assert formats(OUTCOMES) == ("text", "json")


@pytest.mark.parametrize("name", list(RENDERERS))
def test_each_renderer_has_the_interface(name: str) -> None:
    r = RENDERERS[name]
    assert r.name == name and r.views and r.views <= set(VIEWS) and isinstance(r.for_people, bool)
    for method in ("streaming", "report", "outcomes", "rows"):
        ours = inspect.signature(getattr(type(r), method))
        theirs = inspect.signature(getattr(Renderer, method))
        assert list(ours.parameters) == list(theirs.parameters), (name, method)


@pytest.mark.parametrize("name", list(RENDERERS))
@pytest.mark.parametrize("view", VIEWS)
def test_a_view_a_format_lacks_is_refused(name: str, view: str) -> None:
    if view in RENDERERS[name].views:
        assert renderer(name.upper(), view) is RENDERERS[name]
    else:
        with pytest.raises(ValueError, match="has no"):
            renderer(name, view)

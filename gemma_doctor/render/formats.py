"""Every output format of check, fix/restore and list behind one interface (as pip-audit's formats and ruff's emitters):
the CLI looks --format up in RENDERERS and calls the view its command needs; no command compares format names.

Each renderer imports the module that draws its view only when asked (rich, JSON), so the registry costs start-up
nothing: the --format choices are read from it when the CLI is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol

if TYPE_CHECKING:
    from gemma_doctor.report import FailOn, ModelReport, Report

# The views a renderer may offer: check's report, fix's and restore's outcomes, list's rows.
REPORT, OUTCOMES, ROWS = "report", "outcomes", "rows"
VIEWS = (REPORT, OUTCOMES, ROWS)


class Renderer(Protocol):
    """One output format; ``views`` says which of its methods exist for a user (the others are never called)."""

    name: str
    views: frozenset[str]
    # Whether a person reads it: the commands' hints (stderr) that follow a table go with such a format only.
    for_people: bool

    def streaming(self, color: bool) -> Callable[[ModelReport], ModelReport] | None:
        """What a whole-cache scan's workers apply to each model as they finish (None: nothing ahead of the view)."""

    def report(self, report: Report, fail_on: FailOn, color: bool) -> str:
        """check's report."""

    def outcomes(self, command: str, outcomes: list[Any], dry_run: bool, ok: bool, color: bool) -> str:
        """fix's or restore's outcomes."""

    def rows(self, rows: list[Any], skipped: int, color: bool) -> str:
        """list's rows."""


class _Views:
    """What a format without a view answers: nothing ahead of the view, and no method for a view it lacks (``views``
    keeps the CLI from calling one)."""

    name = ""

    def streaming(self, color: bool) -> Callable[[ModelReport], ModelReport] | None:
        """Nothing ahead of the view."""
        return None

    def report(self, report: Report, fail_on: FailOn, color: bool) -> str:
        """Not a view of this format."""
        raise NotImplementedError(self.name)

    def outcomes(self, command: str, outcomes: list[Any], dry_run: bool, ok: bool, color: bool) -> str:
        """Not a view of this format."""
        raise NotImplementedError(self.name)

    def rows(self, rows: list[Any], skipped: int, color: bool) -> str:
        """Not a view of this format."""
        raise NotImplementedError(self.name)


class Text(_Views):
    """The human view (rich markup, plain without colour)."""

    name = "text"
    views = frozenset(VIEWS)
    for_people = True

    def streaming(self, color: bool) -> Callable[[ModelReport], ModelReport] | None:
        """Without colour each model's block is drawn in the worker that judged it."""
        if color:
            return None
        from gemma_doctor.render.text import with_block

        return with_block

    def report(self, report: Report, fail_on: FailOn, color: bool) -> str:
        """render/text.py's report."""
        from gemma_doctor.render.text import render_report

        return render_report(report, fail_on, color)

    def outcomes(self, command: str, outcomes: list[Any], dry_run: bool, ok: bool, color: bool) -> str:
        """render/text.py's outcomes."""
        from gemma_doctor.render.text import render_outcomes

        return render_outcomes(outcomes, color)

    def rows(self, rows: list[Any], skipped: int, color: bool) -> str:
        """render/listing.py's table."""
        from gemma_doctor.render.listing import render_text

        return render_text(rows, color)


class Json(_Views):
    """One JSON document (docs/usage.md: its shape is stable)."""

    name = "json"
    views = frozenset(VIEWS)
    for_people = False

    def streaming(self, color: bool) -> Callable[[ModelReport], ModelReport] | None:
        """Each model's JSON object is made in the worker that judged it."""
        from gemma_doctor.render.jsonout import with_json

        return with_json

    def report(self, report: Report, fail_on: FailOn, color: bool) -> str:
        """render/jsonout.py's report."""
        from gemma_doctor.render.jsonout import render_report

        return render_report(report, fail_on)

    def outcomes(self, command: str, outcomes: list[Any], dry_run: bool, ok: bool, color: bool) -> str:
        """render/jsonout.py's outcomes document."""
        from gemma_doctor.render.jsonout import dumps, outcomes_doc

        return dumps(outcomes_doc(command, outcomes, dry_run, ok))

    def rows(self, rows: list[Any], skipped: int, color: bool) -> str:
        """render/listing.py's JSON rows."""
        from gemma_doctor.render.listing import render_json

        return render_json(rows, skipped)


class Github(_Views):
    """GitHub Actions workflow commands: one annotation per finding (check only: fix and list report no findings)."""

    name = "github"
    views = frozenset({REPORT})
    for_people = False

    def report(self, report: Report, fail_on: FailOn, color: bool) -> str:
        """render/github.py's annotations."""
        from gemma_doctor.render.github import render_report

        return render_report(report, fail_on)


class Quiet(_Views):
    """list's repo ids, one a line (as `hf cache ls -q`)."""

    name = "quiet"
    views = frozenset({ROWS})
    for_people = False

    def rows(self, rows: list[Any], skipped: int, color: bool) -> str:
        """render/listing.py's ids."""
        from gemma_doctor.render.listing import render_quiet

        return render_quiet(rows)


# The registry, in the order --help lists the choices.
RENDERERS: dict[str, Renderer] = {r.name: r for r in (Text(), Json(), Github(), Quiet())}


def formats(view: str) -> tuple[str, ...]:
    """The --format names that offer ``view``."""
    return tuple(name for name, r in RENDERERS.items() if view in r.views)


def renderer(name: str, view: str) -> Renderer:
    """The renderer of a --format value (click has checked it against formats(view))."""
    found = RENDERERS[name.lower()]
    if view not in found.views:
        raise ValueError(f"--format {name} has no {view} view")
    return found

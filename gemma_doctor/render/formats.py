"""Every output format of every command behind one interface (as pip-audit's formats and ruff's emitters): a renderer is
registered under (command, format), takes what its command has to show (one of the result types below) and returns a
string. The CLI looks --format up with ``renderer(command, fmt)`` and prints what it returns; no command compares format
names, and each command's --format choices are ``formats(command)``, so a new format is one class and one registry
entry.

Each renderer imports the module that draws its view only when asked (rich, JSON, YAML), so the registry costs start-up
nothing: the --format choices are read from it when a command is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol

if TYPE_CHECKING:
    from gemma_doctor.report import FailOn, ModelReport, Report

# The commands whose output a renderer draws (their names on the command line).
CHECK, FIX, RESTORE, LIST, RECOMMEND, REHEARSE = "check", "fix", "restore", "list", "recommend", "rehearse"
COMMANDS = (CHECK, FIX, RESTORE, LIST, RECOMMEND, REHEARSE)


# What each command hands its renderer.
@dataclass(frozen=True)
class Checked:
    """check's report, and the severity that fails it."""

    report: Report
    fail_on: FailOn


@dataclass(frozen=True)
class Outcomes:
    """fix's or restore's outcome per model (fixes.Outcome), and whether the run wrote (``dry_run``) and went well."""

    command: str
    outcomes: list[Any]
    dry_run: bool
    ok: bool


@dataclass(frozen=True)
class Rows:
    """list's rows (listing.Row) after filtering, and how many repos were skipped."""

    rows: list[Any]
    skipped: int


@dataclass(frozen=True)
class Prescriptions:
    """recommend's items (pipeline's per-model decisions), the GPU planned for, the task, and with --rehearse each
    item's rehearsal verdict ((name, verdict) or None where nothing was prescribed); None: not rehearsed."""

    items: list[Any]
    gpu: Any
    task: str
    rehearsed: Optional[list[Optional[tuple[str, str]]]] = None


@dataclass(frozen=True)
class Rehearsals:
    """rehearse's rehearsals (rehearse.runner.Rehearsal)."""

    rehearsals: list[Any]


class Renderer(Protocol):
    """One output format of one command."""

    command: str
    name: str  # the --format value
    # Whether a person reads it: the commands' hints (stderr) that follow a table go with such a format only.
    for_people: bool
    # Whether it shows check's prescription (its block, its Run, its way out) and check's run as JSON: a view that
    # does not gets none of them made (pipeline.diagnose's ``prescription``).
    shows_prescription: bool

    def streaming(self, color: bool) -> Callable[[ModelReport], ModelReport] | None:
        """What a whole-cache scan's workers apply to each model as they finish (None: nothing ahead of the view)."""

    def render(self, result: Any, color: bool) -> str:
        """The command's result (its type above) as this format prints it."""


class _Base:
    """What most renderers answer: nothing made ahead of the view."""

    command = name = ""
    for_people = False
    shows_prescription = True

    def streaming(self, color: bool) -> Callable[[ModelReport], ModelReport] | None:
        """Nothing ahead of the view."""
        return None


# check
class CheckText(_Base):
    """The human view (rich markup, plain without colour)."""

    command, name, for_people = CHECK, "text", True
    shows_prescription = False  # check's own run, its memory line and findings; never the prescription's block

    def streaming(self, color: bool) -> Callable[[ModelReport], ModelReport] | None:
        """Without colour each model's block is drawn in the worker that judged it."""
        if color:
            return None
        from gemma_doctor.render.text import with_block

        return with_block

    def render(self, result: Checked, color: bool) -> str:
        """render/text.py's report."""
        from gemma_doctor.render.text import render_report

        return render_report(result.report, result.fail_on, color)


class CheckJson(_Base):
    """One JSON document (docs/usage.md: its shape is stable)."""

    command, name = CHECK, "json"

    def streaming(self, color: bool) -> Callable[[ModelReport], ModelReport] | None:
        """Each model's JSON object is made in the worker that judged it."""
        from gemma_doctor.render.jsonout import with_json

        return with_json

    def render(self, result: Checked, color: bool) -> str:
        """render/jsonout.py's report."""
        from gemma_doctor.render.jsonout import render_report

        return render_report(result.report, result.fail_on)


class CheckGithub(_Base):
    """GitHub Actions workflow commands: one annotation per finding."""

    command, name = CHECK, "github"
    shows_prescription = False  # the findings alone

    def render(self, result: Checked, color: bool) -> str:
        """render/github.py's annotations."""
        from gemma_doctor.render.github import render_report

        return render_report(result.report, result.fail_on)


# fix and restore (no findings to annotate, so no github format)
class OutcomesText(_Base):
    """The diff of each file, and what was done."""

    name, for_people = "text", True

    def __init__(self, command: str) -> None:
        self.command = command

    def render(self, result: Outcomes, color: bool) -> str:
        """render/text.py's outcomes."""
        from gemma_doctor.render.text import render_outcomes

        return render_outcomes(result.outcomes, color)


class OutcomesJson(_Base):
    """One JSON document of the outcomes."""

    name = "json"

    def __init__(self, command: str) -> None:
        self.command = command

    def render(self, result: Outcomes, color: bool) -> str:
        """render/jsonout.py's outcomes document."""
        from gemma_doctor.render.jsonout import dumps, outcomes_doc

        return dumps(outcomes_doc(result.command, result.outcomes, result.dry_run, result.ok))


# list
class ListText(_Base):
    """A plain column table."""

    command, name, for_people = LIST, "text", True

    def render(self, result: Rows, color: bool) -> str:
        """render/listing.py's table."""
        from gemma_doctor.render.listing import render_text

        return render_text(result.rows, color)


class ListJson(_Base):
    """The rows as JSON."""

    command, name = LIST, "json"

    def render(self, result: Rows, color: bool) -> str:
        """render/listing.py's JSON rows."""
        from gemma_doctor.render.listing import render_json

        return render_json(result.rows, result.skipped)


class ListQuiet(_Base):
    """Repo ids, one a line (as `hf cache ls -q`)."""

    command, name = LIST, "quiet"

    def render(self, result: Rows, color: bool) -> str:
        """render/listing.py's ids."""
        from gemma_doctor.render.listing import render_quiet

        return render_quiet(result.rows)


# recommend
class RecommendText(_Base):
    """The decision, its reasons and notes, then the Python snippets."""

    command, name, for_people = RECOMMEND, "text", True

    def render(self, result: Prescriptions, color: bool) -> str:
        """render/recommend.py's text, each rehearsal's verdict after it."""
        from gemma_doctor.render import recommend

        return recommend.with_verdicts(recommend.render_text(result.items, result.gpu, color), result.rehearsed, "")


class RecommendPython(_Base):
    """Paste-able Python only."""

    command, name = RECOMMEND, "python"

    def render(self, result: Prescriptions, color: bool) -> str:
        """render/recommend.py's Python, the verdicts as comments (it stays pasteable)."""
        from gemma_doctor.render import recommend

        return recommend.with_verdicts(recommend.render_python(result.items, result.gpu), result.rehearsed, "# ")


class RecommendYaml(_Base):
    """The prescribed run as the training config check --training-config reads."""

    command, name = RECOMMEND, "yaml"

    def render(self, result: Prescriptions, color: bool) -> str:
        """render/recommend.py's YAML, the verdicts as comments."""
        from gemma_doctor.render import recommend

        return recommend.with_verdicts(recommend.render_yaml(result.items, result.gpu), result.rehearsed, "# ")


class RecommendJson(_Base):
    """The stable JSON document (docs/precision.md)."""

    command, name = RECOMMEND, "json"

    def render(self, result: Prescriptions, color: bool) -> str:
        """render/recommend.py's JSON, with each model's rehearsal verdict when rehearsed."""
        from gemma_doctor.render.recommend import render_json

        return render_json(result.items, result.gpu, result.task, result.rehearsed)


# rehearse
class RehearseText(_Base):
    """The stack, one line per stage, the findings, the verdict."""

    command, name, for_people = REHEARSE, "text", True

    def render(self, result: Rehearsals, color: bool) -> str:
        """render/rehearse.py's text."""
        from gemma_doctor.render.rehearse import render_text

        return "".join(render_text(r) for r in result.rehearsals)


class RehearseJson(_Base):
    """The JSON document of the rehearsals."""

    command, name = REHEARSE, "json"

    def render(self, result: Rehearsals, color: bool) -> str:
        """render/rehearse.py's JSON."""
        from gemma_doctor.render.rehearse import render_json

        return render_json(list(result.rehearsals))


# The registry, each command's formats in the order --help lists them.
RENDERERS: dict[tuple[str, str], Renderer] = {(r.command, r.name): r for r in (
    CheckText(), CheckJson(), CheckGithub(),
    OutcomesText(FIX), OutcomesJson(FIX), OutcomesText(RESTORE), OutcomesJson(RESTORE),
    ListText(), ListJson(), ListQuiet(),
    RecommendText(), RecommendPython(), RecommendYaml(), RecommendJson(),
    RehearseText(), RehearseJson(),
)}


def formats(command: str) -> tuple[str, ...]:
    """The --format names of ``command``."""
    return tuple(name for (cmd, name) in RENDERERS if cmd == command)


def renderer(command: str, name: str) -> Renderer:
    """The renderer of ``command``'s --format value (click has checked it against formats(command))."""
    found = RENDERERS.get((command, name.lower()))
    if found is None:
        raise ValueError(f"{command} has no --format {name}")
    return found

"""The human-readable views of check, fix and restore."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from gemma_doctor.render.style import SEVERITY_STYLE, to_string
from gemma_doctor.report import FailOn, ModelReport, Report, Severity

if TYPE_CHECKING:
    from gemma_doctor.fixes import Outcome


def _title(repo_id: str | None, revision: str | None, commit: str | None, path: str, family: str | None) -> str:
    from gemma_doctor.render.style import escape

    name = repo_id or path
    rev = ""
    if repo_id:
        rev = f" @ {revision or '?'}" + (f" ({commit[:12]})" if commit else "")
    fam = f"  [dim]{escape(family)}[/dim]" if family else ""
    where = f"\n  [dim]{escape(path)}[/dim]" if repo_id else ""
    return f"[bold]{escape(name)}[/bold]{escape(rev)}{fam}{where}"


def _model_lines(m: ModelReport) -> list[str]:
    from gemma_doctor.render.style import escape

    lines = [_title(m.repo_id, m.revision, m.commit, m.path, m.family)]
    from gemma_doctor.render.census import adapter_lines, census_lines, remote_lines

    lines.extend(f"  [dim]{escape(line)}[/dim]" for line in remote_lines(m.extra) + adapter_lines(m.extra)
                 + census_lines(m.extra))
    rec = m.extra.get("recommendation")
    run = m.run
    if run is not None and m.precision:
        # check's own Run: the precision decision's clause, then the run it is for (method, batch, accumulation,
        # checkpointing).
        from gemma_doctor.plan.recommend import run_clause

        clause = run_clause(run.method.value, run.batch.value, run.accumulation.value, run.checkpointing.value)
        head = m.precision
        if isinstance(rec, dict) and rec.get("precision") not in (None, run.precision.value):
            # The training config sets another precision than the one recommended: the run trains in the config's
            # (the memory line plans it), and the recommendation is named beside it, not in its place.
            # The cure is the switch that gives the recommended precision (bf16/fp16 are every trainer's keys here).
            want = rec["precision"]
            cure = "set bf16: false and fp16: false" if want == "fp32" else f"set {want}: true"
            head = f"{run.precision.value} ({run.precision.source}); recommended {want}: {cure} ({m.precision})"
        lines.append(f"  [bold]precision[/bold] {escape(head + clause)}")
    elif isinstance(rec, dict) and rec.get("summary"):
        lines.append(f"  [bold]precision[/bold] {escape(rec['summary'])}")
    if run is not None:
        from gemma_doctor import run as run_mod
        from gemma_doctor.plan.memory import components_line

        # The trainer that executes the run, where the user's training config or launch line decided it (an assumed
        # or prescribed one is the JSON's to state).
        if run.trainer.source not in (run_mod.ASSUMED_TRAINER, run_mod.PRESCRIBED_TRAINER):
            lines.append(f"  [bold]trainer[/bold] {escape(run.trainer.value.value + ': ' + run.trainer.source)}")
        if run.attention.source != "default":  # SDPA, transformers' own default, goes without saying
            lines.append(f"  [bold]attention[/bold] {escape(run.attention.value + ': ' + run.attention.source)}")
        mem = m.extra.get("memory")
        components = mem.get("components") if isinstance(mem, dict) else None
        lines.append(f"  [bold]memory[/bold] {escape(run.memory.summary)}")
        lines.append(f"  [dim]  {escape(components_line(components or {}))}[/dim]")
    if not m.findings:
        lines.append("  [green]no findings[/green]")
    for f in m.findings:
        where = ":".join(x for x in (f.file, f.key) if x)
        sev = f.severity.value
        lines.append(f"  [{SEVERITY_STYLE[sev]}]{sev.upper():7}[/] {f.code} {escape((where + ': ' if where else '') + f.message)}")
        if f.fix:
            lines.append(f"          [dim]fix:[/dim] {escape(f.fix)}")
    return lines


def with_block(m: ModelReport) -> ModelReport:
    """``m`` with its lines as the colourless view prints them (what render_report's plain path makes of it): a
    whole-cache scan has each worker make its models' lines (pipeline.diagnose's ``finish``)."""
    from gemma_doctor.frozen import replace
    from gemma_doctor.render.style import plain

    return replace(m, block=("text", "".join(plain(line) + "\n" for line in _model_lines(m)) + "\n"))


def render_report(report: Report, fail_on: FailOn, color: bool) -> str:
    """`check` as text: each model with its findings and fixes, then a summary line."""
    lines: list[str] = []
    blocks = None if color else [m.block[1] if m.block is not None and m.block[0] == "text" else None
                                 for m in report.models]
    if blocks is not None and None not in blocks:
        # every model's lines already made plain (with_block): the same text, joined
        lines.append("".join(blocks))  # type: ignore[arg-type]
    else:
        for m in report.models:
            lines.extend(_model_lines(m))
            lines.append("")
    counts = {s: 0 for s in Severity}
    for f in report.all_findings():
        counts[f.severity] += 1
    verdict = "[bold red]FAIL[/]" if report.failed(fail_on) else "[bold green]OK[/]"
    skipped = f", {len(report.skipped)} non-Gemma skipped" if report.skipped else ""
    lines.append(f"{verdict} {len(report.models)} model(s){skipped}: {counts[Severity.ERROR]} error(s), "
                 f"{counts[Severity.WARNING]} warning(s), {counts[Severity.INFO]} info (--fail-on {fail_on.value})")
    if blocks is not None and None not in blocks:
        from gemma_doctor.render.style import plain

        return lines[0] + "".join(plain(line) + "\n" for line in lines[1:])
    return to_string(lines, color)


def _status_text(status: object) -> str:
    # fixes (with the JSON editor) is imported by fix and restore only: `check` starts without it.
    from gemma_doctor.fixes import Status

    return {
        Status.WOULD_CHANGE: "[yellow]would change[/]",
        Status.CHANGED: "[green]fixed[/]",
        Status.UP_TO_DATE: "[green]already fixed[/]",
        Status.NOT_APPLICABLE: "[dim]left alone[/]",
        Status.REFUSED: "[red]refused[/]",
        Status.FAILED: "[bold red]failed[/]",
        Status.RESTORED: "[green]restored[/]",
        Status.NOTHING_TO_RESTORE: "[dim]nothing to restore[/]",
    }[status]


def _diff_text(diff: str):  # noqa: ANN202 - a rich Text
    from rich.text import Text

    from gemma_doctor.render.style import printable

    out = Text()
    for line in diff.splitlines(keepends=True):
        # The diff shows config text: a value holding ESC or CR must show as text, not act on the terminal.
        line = printable(line[:-1]) + "\n" if line.endswith("\n") else printable(line)
        style = "green" if line.startswith("+") and not line.startswith("+++") else (
            "red" if line.startswith("-") and not line.startswith("---") else ("cyan" if line.startswith("@@") else ""))
        out.append(line, style=style)
    return out


def render_outcomes(outcomes: Iterable[Outcome], color: bool, show_diffs: bool = True) -> str:
    """`fix` / `restore` as text: per model its status, messages and (for fix) the unified diffs."""
    from gemma_doctor.render.style import escape

    items: list = []
    for o in outcomes:
        s = o.facts.snapshot
        items.append(_title(s.repo_id, s.revision, s.commit, str(s.path), o.facts.family.label) + "  " + _status_text(o.status))
        for c in o.changes:
            if show_diffs and c.after != c.before:
                items.append(_diff_text(c.diff()))
        for msg in o.messages:
            items.append(f"  {escape(msg)}")
    return to_string(items, color)

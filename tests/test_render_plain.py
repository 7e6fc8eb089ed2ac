"""The colour-free fast path prints exactly what rich would: same escaping, same text, no rich import."""

from __future__ import annotations

import io
import os
import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from rich.markup import escape as rich_escape
from rich.text import Text

from gemma_doctor.render.style import escape, plain, to_string

_text = st.text(alphabet=st.sampled_from(list("ab[]/\\#@ z:=.")), max_size=30)


@settings(max_examples=500, deadline=None)
@given(_text)
def test_escape_matches_rich(s):
    assert escape(s) == rich_escape(s)


def _markup(parts: list[tuple[str, str]]) -> str:
    """Markup as the renderers build it: each run of plain text escaped once, styled runs wrapped in tags.

    Escaping two plain pieces separately and gluing them is a misuse: ``escape("[/") + escape("]")`` is the
    closing tag ``[/]``. The renderers escape a whole run at once, and so does this builder."""
    out: list[str] = []
    pending = ""
    for text, style in parts:
        if not style:
            pending += text
            continue
        if pending:
            out.append(escape(pending))
            pending = ""
        out.append(f"[{style}]{escape(text)}[/]")
    if pending:
        out.append(escape(pending))
    return "".join(out)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(_text, st.sampled_from(["", "bold", "dim", "bold red", "yellow"])), max_size=5))
def test_plain_of_escaped_markup_matches_rich(parts):
    markup = _markup(parts)
    assert plain(markup) == Text.from_markup(markup, emoji=False).plain  # our console runs with emoji=False
    for t, _ in parts:
        if "\\" not in t:  # rich itself is lossy around backslashes; we match rich above
            assert plain(escape(t)) == t


def test_separately_escaped_pieces_can_form_a_tag():
    """Why the builder above merges plain runs: this is the input that made the old test flaky."""
    glued = escape("[/") + escape("]")
    assert glued == "[/]"
    assert plain(escape("[/" + "]")) == "[/]"


@settings(max_examples=300, deadline=None)
@given(where=_text, message=_text, name=_text, cells=st.lists(st.text(alphabet=st.sampled_from(list("ab[]/#@z:=.")), min_size=1, max_size=30),
                                                                       min_size=4, max_size=4))
def test_real_views_render_hostile_text_like_rich(where, message, name, cells):
    """check's and list's text views, fed names and messages full of brackets, print what rich prints."""
    from gemma_doctor.listing import Row, RowStatus
    from gemma_doctor.render import listing as list_view
    from gemma_doctor.render.text import _model_lines
    from gemma_doctor.report import Finding, ModelReport, Severity

    report = ModelReport(target=name, path="/p/" + name, repo_id=name or None, revision="main", commit=None,
                         family="gemma3", findings=(Finding("GD101", Severity.ERROR, message, file=where or None,
                                                            key=message or None, fix=message),))
    for line in _model_lines(report):
        assert plain(line) == Text.from_markup(line, emoji=False).plain
    row = Row(cells[0], cells[1], None, "/x", cells[2], cells[3], 5, RowStatus.OK, {}, None)
    printed = list_view.render_text([row], color=False).splitlines()[1]
    assert printed.split() == " ".join([*cells[:4], "5 B", "ok"]).split()  # every cell verbatim, nothing eaten


def test_fast_path_equals_rich_console_output():
    diff = Text("--- a\n+++ b\n@@ -1 +1 @@\n-x\n+y\n")
    items = ["[bold]org/m[/bold] @ main  [dim]gemma3[/dim]", "  [bold red]ERROR  [/] GD101 config.json: \\[x] y", diff, ""]
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=False, no_color=True, color_system=None, width=100, highlight=False,
                      emoji=False, soft_wrap=True)
    for r in items:
        console.print(r)
    assert to_string(items, color=False) == buf.getvalue()


def test_uncoloured_check_does_not_import_rich(tmp_path):
    code = ("import sys; from gemma_doctor.cli import main\n"
            "try:\n    main(['check', sys.argv[1]])\nexcept SystemExit:\n    pass\n"
            "print('RICH' if any(m == 'rich' or m.startswith('rich.') for m in sys.modules) else 'NO-RICH', file=sys.stderr)")
    (tmp_path / "config.json").write_text('{"model_type": "gemma2"}')
    env = {**os.environ, "GEMMA_DOCTOR_WITH": "transformers==4.50.3"}  # a finding to print
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env)
    assert "GD101" in done.stdout and done.stderr.strip().endswith("NO-RICH"), done.stderr


# --- linear time on hostile values (issue 33) --------------------------------------------------------------------

_OLD_TAG = __import__("re").compile(r"(\\*)(\[[a-z#/@][^[]*?])")


def _old_escape(text: str) -> str:
    """escape as it was before issue 33 (rich's own pattern: quadratic in a run of backslashes): the reference."""
    from gemma_doctor.render.style import printable

    text = printable(text)
    if "[" not in text and "\\" not in text:
        return text
    out = _OLD_TAG.sub(lambda m: f"{m.group(1)}{m.group(1)}\\{m.group(2)}", text)
    if out.endswith("\\") and not out.endswith("\\\\"):
        out += "\\"
    return out


def _old_plain(markup: str) -> str:
    """plain as it was before issue 33: the reference."""
    if "\\" not in markup:
        return _OLD_TAG.sub("", markup)
    out, pos = [], 0
    for m in _OLD_TAG.finditer(markup):
        if m.start() > pos:
            out.append(markup[pos:m.start()].replace("\\[", "["))
        backslashes, escaped = divmod(len(m.group(1)), 2)
        out.append("\\" * backslashes)
        if escaped:
            out.append(m.group(2))
        pos = m.end()
    if pos < len(markup):
        out.append(markup[pos:].replace("\\[", "["))
    return "".join(out)


@settings(max_examples=1000, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab[]/\\#@ z:=.\x1b\n")), max_size=60))
def test_escape_and_plain_are_unchanged_on_ordinary_text(s):
    assert escape(s) == _old_escape(s)
    assert plain(s) == _old_plain(s)
    assert plain(escape(s)) == _old_plain(_old_escape(s))


# 1 MB values the old code took hours on (61 s at 40,000 backslashes, and four times longer at each doubling); the
# answers are known without running it. The timeout is only a safety net: no time is asserted.
_HUGE = """
from gemma_doctor.render.style import escape, plain, to_string
n = 1 << 20
run = "\\\\" * n
assert escape(run) == run and plain(run) == run
assert escape(run + "[b]") == "\\\\" * (2 * n + 1) + "[b]"
assert plain(escape(run + "[b]x")) == run + "[b]x"
line = "[bold]GD109[/] " + escape(run + "[b]")
assert to_string([line], False) == "GD109 " + run + "[b]\\n"
assert "GD109 " + run + "[b]" in to_string([line], True)
# Runs just short of any per-line bound, a megabyte of them, and a thousand lines of 1,000-backslash runs: rich's own
# parser would take N^2 steps on each run; past the view's budget such lines are printed uncoloured (no escape code).
runs = ("\\\\" * 255 + "x") * 4096
lines = ["[bold]ok[/] plain", "[bold]GD109[/] " + escape(runs + "[b]")] + ["[bold]GD109[/] " + escape("\\\\" * 1000 + "[b]")] * 1000
out = to_string(lines, True).splitlines()
assert "\x1b[" in out[0] and out[1] == "GD109 " + runs + "[b]" and "\x1b[" not in out[-1], out[-1][:80]
print("ok")
"""


def test_escape_plain_and_the_coloured_view_are_linear_on_a_megabyte_of_backslashes():
    got = subprocess.run([sys.executable, "-c", _HUGE], capture_output=True, text=True, timeout=120)
    assert got.stdout.strip() == "ok", got.stderr[-2000:]

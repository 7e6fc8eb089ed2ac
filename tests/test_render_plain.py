"""The colour-free fast path prints exactly what rich would: same escaping, same text, no rich import."""

from __future__ import annotations

import io
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


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(_text, st.sampled_from(["", "bold", "dim", "bold red", "yellow"])), max_size=5))
def test_plain_of_escaped_markup_matches_rich(parts):
    markup = "".join(f"[{style}]{escape(t)}[/]" if style else escape(t) for t, style in parts)
    assert plain(markup) == Text.from_markup(markup, emoji=False).plain  # our console runs with emoji=False
    for t, _ in parts:
        if "\\" not in t:  # rich itself is lossy around backslashes; we match rich above
            assert plain(escape(t)) == t


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
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True)
    assert "GD101" in done.stdout and done.stderr.strip().endswith("NO-RICH"), done.stderr

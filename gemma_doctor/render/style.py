"""Shared helpers for the human-readable views: a string-returning rich console."""

from __future__ import annotations

import io
import re
from typing import Any, Iterator

# rich's markup grammar (rich.markup.RE_TAGS): a tag is "[" + [a-z#/@] + ... + "]", escaped by an odd
# number of backslashes before it. The backslashes are counted by _tags, not matched here: rich's own pattern,
# "(\\*)(\[...])", tries again at every backslash of a run and scans the rest of the run each time, so a
# config value of N backslashes took N^2 steps (61 s at 40,000; issue 33).
_TAG = re.compile(r"\[[a-z#/@][^[]*?]")
# What a terminal acts on instead of printing: C0 controls (ESC starts escape sequences; CR and LF fake lines),
# DEL, C1 controls (U+009B is a one-character CSI), line/paragraph separators and the bidirectional overrides
# that reorder what is shown ("Trojan Source"). Tabs are harmless and kept. Lone surrogates too: Python names
# a file whose name is not UTF-8 with U+DC80-U+DCFF (surrogateescape), which a UTF-8 stdout refuses to encode.
_UNPRINTABLE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff\ud800-\udfff]")


def _visible(m: re.Match[str]) -> str:
    c = ord(m.group())
    if 0xDC80 <= c <= 0xDCFF:  # the byte that was not UTF-8, as the name holds it on disk
        return f"\\x{c - 0xDC00:02x}"
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def printable(text: str) -> str:
    """``text`` with every character a terminal would act on shown as an escape (ESC as \\x1b, a newline as
    \\x0a): folder names, file names and config values reach the terminal as text, never as commands."""
    return _UNPRINTABLE.sub(_visible, text)


def _tags(text: str) -> Iterator[tuple[int, int, int]]:
    """Each tag of ``text`` as (where the backslashes before it start, where it starts, where it ends): what rich's
    pattern matches, in time linear in ``text`` (each stretch before a tag is looked at once)."""
    prev = 0
    for m in _TAG.finditer(text):
        start = m.start()
        before = text[prev:start]
        yield start - (len(before) - len(before.rstrip("\\"))), start, m.end()
        prev = m.end()


def escape(text: str) -> str:
    """Escape text for rich markup, exactly as rich.markup.escape does (without importing rich), after making it
    printable: every piece of text from the cache or a config file passes through here on its way to the view."""
    text = printable(text)
    if "[" not in text and "\\" not in text:  # no tag to escape, no backslash to double: itself
        return text
    parts: list[str] = []
    pos = 0
    for slashes, start, end in _tags(text):  # a tag's backslashes doubled, then one more: the tag is literal text
        parts += (text[pos:slashes], "\\" * (2 * (start - slashes) + 1), text[start:end])
        pos = end
    parts.append(text[pos:])
    out = "".join(parts)
    if out.endswith("\\") and not out.endswith("\\\\"):
        out += "\\"
    return out


def plain(markup: str) -> str:
    """The text rich would print for ``markup`` without colour (mirrors rich.markup._parse and render)."""
    if "\\" not in markup:  # no escape anywhere: every tag is a tag, and goes (the loop below, in one C call)
        return _TAG.sub("", markup)
    out: list[str] = []
    pos = 0
    for slashes, start, end in _tags(markup):
        if slashes > pos:
            out.append(markup[pos:slashes].replace("\\[", "["))
        backslashes, escaped = divmod(start - slashes, 2)
        out.append("\\" * backslashes)
        if escaped:  # an escaped tag is literal text
            out.append(markup[start:end])
        pos = end
    if pos < len(markup):
        out.append(markup[pos:].replace("\\[", "["))
    return "".join(out)


# rich parses markup with the pattern _TAG's comment describes: a run of N backslashes in a line that holds any "["
# costs it N^2 steps (2.3 s at 10,000; 5 s for a megabyte of 255-backslash runs). Markup past this many such steps,
# counted over one view, is shown without colour on a terminal too. No real report comes near it; only hostile values
# echoed in full do.
RICH_STEPS = 1 << 20
_SLASHES = re.compile(r"\\+")


def _rich_steps(markup: str, most: int) -> int:
    """The steps rich's markup parser takes on the backslash runs of ``markup``, counted up to just past ``most``."""
    if "\\" not in markup:
        return 0
    steps = 0
    for m in _SLASHES.finditer(markup):  # linear: a run is matched once, whole
        steps += (m.end() - m.start()) ** 2
        if steps > most:
            break
    return steps


def to_string(renderables: list[Any], color: bool, width: int = 100) -> str:
    """Render markup strings and rich objects to a string; colour only when asked (the CLI asks for a TTY
    without NO_COLOR). Without colour, markup strings skip rich entirely: rich's parsing dominated the
    time of whole-cache reports piped to a file or CI log."""
    if not color and all(isinstance(r, str) or hasattr(r, "plain") for r in renderables):
        return "".join((plain(r) if isinstance(r, str) else r.plain) + "\n" for r in renderables)
    from rich.console import Console
    from rich.text import Text

    spent = 0  # over the whole view: many lines each just under the bound must not add up to a quadratic parse
    kept: list[Any] = []
    for r in renderables:
        if isinstance(r, str):
            steps = _rich_steps(r, RICH_STEPS - spent)
            if spent + steps > RICH_STEPS:
                r = Text(plain(r))
            else:
                spent += steps
        kept.append(r)
    renderables = kept

    buf = io.StringIO()
    console = Console(file=buf, force_terminal=color, no_color=not color, color_system="standard" if color else None,
                      width=width, highlight=False, emoji=False, soft_wrap=True)
    # Consecutive markup strings are printed as one: rich's per-call overhead dominated whole-cache reports.
    run: list[str] = []
    for r in renderables:
        if isinstance(r, str):
            run.append(r)
            continue
        if run:
            console.print("\n".join(run))
            run = []
        console.print(r)
    if run:
        console.print("\n".join(run))
    return buf.getvalue()


SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}

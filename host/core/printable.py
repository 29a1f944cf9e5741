"""Text that came from outside (a guest, a test, a lab host) as it may
reach the operator's terminal: every control character replaced by a
visible escape.  rich passes ESC on (it strips only BEL, BS, VT, FF and
CR), so an OSC or CSI sequence in a test's fail reason or a host's facts
could retitle the window, hide text, move the cursor over what was
printed, or write to the clipboard.  The one helper every printer of such
text uses; and ``format_number``, the one format of a number in verdict
texts, tables and pages."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

# C0 but tab and line feed, DEL, C1, and the bidirectional overrides and
# isolates, which reorder what the eye reads ("Trojan Source").
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: object) -> str:
    """``text`` with its control characters shown as ``\\xNN`` or ``\\uNNNN``
    (tab and line feed kept)."""
    return _CONTROL.sub(_escape, str(text))


def one_line(text: object) -> str:
    """``printable``, with line feeds and tabs shown as ``\\n`` and ``\\t``
    too: for text that must stay on its line."""
    return printable(text).replace("\n", "\\n").replace("\t", "\\t")


class _Shown:
    """A renderable drawn as rich draws it, its text through ``printable``
    (rich's own styles and cursor controls kept)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __rich_console__(self, console: Any, options: Any) -> Iterator[Any]:
        from rich.segment import Segment

        for segment in console.render(self.inner, options):
            yield segment if segment.control else Segment(printable(segment.text), segment.style)


def console(**options: Any) -> Console:
    """A rich Console (``options`` as rich's) that shows every control
    character of what it prints as ``printable`` does: table cells, markup
    and plain text alike.  Every console that prints what a guest, a test,
    a results file or a lab host said is made here."""
    from rich.console import Console, RenderHook

    class ShowPrintable(RenderHook):
        """rich's render hook: every renderable printed goes through ``_Shown``."""

        def process_renderables(self, renderables: list[Any]) -> list[Any]:
            return [_Shown(r) for r in renderables]

    made = Console(**options)
    made.push_render_hook(ShowPrintable())
    return made


def format_number(x: float | None) -> str:
    """Four significant digits (kernbench's 42.809 reads as 42.81), whole
    numbers with thousands separators from 1,000 on; n/a for no value.
    The one format of verdict texts and pages (every page's and table's ``num``)."""
    if x is None or not math.isfinite(x):
        return "n/a"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.4g}"

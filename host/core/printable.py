"""Text that came from outside (a guest, a test, a lab host) as it may
reach the operator's terminal: every control character replaced by a
visible escape.  rich passes ESC on (it strips only BEL, BS, VT, FF and
CR), so an OSC or CSI sequence in a test's fail reason or a host's facts
could retitle the window, hide text, move the cursor over what was
printed, or write to the clipboard.  The one helper every printer of such
text uses."""

from __future__ import annotations

import re

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

"""The files a patch touches, as GNU ``patch -p1`` (kernel_patches'
``apply_patch``) may touch them, in one pass over its lines: every name
a header offers (``---``, ``+++``, ``*** ``, ``Index:``, ``diff --git``,
git's ``rename``/``copy from``/``to``), since GNU patch patches whichever
exists; a git diff's names without a hunk (renames, copies, modes, binary
patches).  What memqual cannot read as GNU patch would is ``Unreadable``:
a hunk no header names, a context, normal or ed diff, an indented header,
an absolute name, a ``..`` component, a quoted name that does not decode.
docs/patch-qualification.md, "A patch qualifies what it touches"."""

from __future__ import annotations

import dataclasses
import posixpath
import re

# GNU patch's -p1 as apply_patch gives it.
STRIP = 1
# A unified hunk's header: the lines it takes from the old and new sides.
HUNK = re.compile(r"@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")
# The headers of the forms memqual refuses: a context diff's hunk
# separator, a normal diff's command (1c1, 3,4d2) and an ed script's (5a).
CONTEXT_HUNK = "***************"
COMMAND = re.compile(r"\d+(?:,\d+)?[acdi](?:\d+(?:,\d+)?)?")
# What GNU patch reads as a header, after indentation it also accepts
# (spaces, tabs and 'X', pch.c intuit_diff_type).
HEADER = ("--- ", "+++ ", "*** ", "Index:", "diff --git ", "@@ -")
INDENT = re.compile(r"[ \tX]+")
SPACE = re.compile(r"[ \v\f]")
# The usual ---/+++ line (a/ or b/, plain names, maybe a tab and a time):
# its -p1 name at once, what _header_name would give it.
PLAIN_HEADER = re.compile(r"(?:---|\+\+\+) [^\s/\"]+/((?:[\w,+=@-][\w.,+=@-]*/)*[\w,+=@-][\w.,+=@-]*)(?:\t.*)?")
# git's renames and copies, named from the tree's top (no prefix).
GIT_MOVE = re.compile(r"(?:rename|copy) (?:from|to|old|new) (.*)")
C_ESCAPES = {"a": 7, "b": 8, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11, "\\": 92, '"': 34}


class Unreadable(ValueError):
    """A patch whose touched files memqual cannot tell; the message is
    what to say, with the line."""


def patch_files(text: str) -> tuple[str, ...]:
    """Every file GNU ``patch -p1`` may touch for ``text``, in the order
    first named, each once; ``Unreadable`` for what memqual cannot tell."""
    reading = PatchReading()
    # GNU patch splits on line feeds alone (str.splitlines would split on
    # form feeds and NEL inside a name too)
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # what follows the last line feed is no line
    for number, line in enumerate(lines, 1):
        if reading.old or reading.new:  # a hunk's body: most of a patch, so kept to a few tests a line
            reading.hunk_line(line, number)
            continue
        line = line.removesuffix("\r")
        if line.startswith("@@ -"):
            reading.hunk_header(line, number)
        elif reading.after_hunk and line.startswith("\\"):
            continue  # "\ No newline at end of file" after a hunk's last line
        else:
            reading.after_hunk = False
            reading.header_line(line, number)
    if reading.old or reading.new:
        raise Unreadable("the last hunk is cut short (fewer lines than its @@ header says)")
    return tuple(reading.touched)


@dataclasses.dataclass(slots=True)
class PatchReading:
    """Where one pass over a patch's lines stands: the files named so far
    and the hunk or header it is in."""

    touched: dict[str, None] = dataclasses.field(default_factory=dict)  # ordered; a second mention costs O(1)
    named: list[str] = dataclasses.field(default_factory=list)  # the names the headers since the last hunk offer
    old: int = 0  # the old and new lines the current hunk still takes
    new: int = 0
    after_hunk: bool = False  # a hunk just ended: an @@ line goes on the same file
    in_git: bool = False  # in a git diff's extended header: its rename and copy lines count

    def hunk_line(self, line: str, number: int) -> None:
        """One line of a hunk's body, counted off its @@ header's sizes."""
        kind = line[:1]
        if kind == "+":
            self.new -= 1
        elif kind == "-":
            self.old -= 1
        elif kind in (" ", "", "\r"):  # GNU patch reads an empty line as empty context
            self.old, self.new = self.old - 1, self.new - 1
        elif kind != "\\":
            raise Unreadable(f"line {number}: a hunk cut short (fewer lines than its @@ header says)")
        if self.old < 0 or self.new < 0:
            raise Unreadable(f"line {number}: a hunk longer than its @@ header says")
        self.after_hunk = not (self.old or self.new)

    def hunk_header(self, line: str, number: int) -> None:
        """An ``@@ -`` line: the names its headers offered are touched."""
        if not self.named and not self.after_hunk and not self.in_git:
            raise Unreadable(f"line {number}: a hunk whose header names no file (as patch -p1 reads it)")
        for name in self.named:
            self.touched.setdefault(name)
        self.named, self.in_git = [], False
        self.old, self.new = _hunk_size(line, number)
        self.after_hunk = not (self.old or self.new)

    def header_line(self, line: str, number: int) -> None:
        """A line outside hunks: a header's name, a git diff's names, or a
        form memqual refuses (anything else is text between diffs)."""
        if line.startswith(("--- ", "+++ ", "*** ", "Index:")):
            plain = PLAIN_HEADER.fullmatch(line)
            header_name = plain.group(1) if plain else _header_name(line, number)
            if header_name is not None:
                self.named.append(header_name)
        elif line.startswith("diff --git "):
            # named at once: the diff may have no hunk, and GNU patch
            # still renames, copies or changes the mode
            self.named, self.in_git = [], True
            for name in _git_names(line[11:], number):
                self.touched.setdefault(name)
        elif self.in_git and (move := GIT_MOVE.fullmatch(line)):
            self.touched.setdefault(_checked(_unquoted(move.group(1), number), number))
        else:
            _refuse_other_forms(line, number)


def _refuse_other_forms(line: str, number: int) -> None:
    """``Unreadable`` for a context, normal or ed diff's line and for an
    indented header."""
    if line.startswith(CONTEXT_HUNK):
        raise Unreadable(f"line {number}: a context diff (diff -c): give a unified one (diff -u, git format-patch)")
    if COMMAND.fullmatch(line):
        raise Unreadable(f"line {number}: {line!r} is a normal or ed diff command: give a unified diff")
    if (indent := INDENT.match(line)) and line[indent.end() :].startswith(HEADER):
        raise Unreadable(f"line {number}: an indented diff header: give the patch unindented")


def _hunk_size(line: str, number: int) -> tuple[int, int]:
    header = HUNK.match(line)
    if header is None:
        raise Unreadable(f"line {number}: {line[:60]!r} is not a unified hunk header (@@ -a,b +c,d @@)")
    old, new = (1 if count is None else int(count) for count in header.groups())
    return old, new


def _header_name(line: str, number: int) -> str | None:
    """The file a ``---``/``+++``/``***``/``Index:`` header names, read as
    GNU patch's fetchname reads it and stripped as -p1 strips it; None for
    /dev/null, no name, or a name too short to strip (GNU patch ignores
    those too)."""
    index = line.startswith("Index:")
    field = line[6 if index else 4 :].lstrip(" \t\v\f")
    if field.startswith('"'):
        name, _ = _c_string(field, number)
    elif index or "\t" in field:
        # a name with spaces ends at a tab (git writes one after such a
        # name; diff -u a timestamp after it); an Index: name at the line's end
        name = field.split("\t", 1)[0].rstrip(" \v\f")
    else:
        end = SPACE.search(field)  # GNU patch ends it at its first space
        name = field[: end.start()] if end else field
    if name in ("", "/dev/null"):
        return None
    return _stripped(name, number)


def _git_names(field: str, number: int) -> list[str]:
    """The two names of a ``diff --git a/X b/Y`` line, -p1 stripped."""
    names = []
    rest = field
    for _ in range(2):
        rest = rest.lstrip(" ")
        if rest.startswith('"'):
            name, rest = _c_string(rest, number)
        else:
            name, _, rest = rest.partition(" ")
        names.append(name)
    if rest.strip() or "" in names:
        raise Unreadable(f"line {number}: cannot tell the two names of 'diff --git {field[:60]}'")
    return [s for s in (_stripped(n, number) for n in names if n != "/dev/null") if s is not None]


def _stripped(name: str, number: int) -> str | None:
    """``name`` without its first folder (-p1), None if it has none."""
    if name.startswith("/"):
        raise Unreadable(f"line {number}: {name[:60]!r} is an absolute name")
    if "/" not in name:
        return None
    return _checked(name.split("/", STRIP)[STRIP], number)


def _checked(name: str, number: int) -> str:
    """A name below the tree's top, in the form the scenario table names
    files (no ./ or //), or ``Unreadable``."""
    parts = name.split("/")
    if name.startswith("/") or ".." in parts:
        raise Unreadable(f"line {number}: {name[:60]!r} is not a name below the tree's top")
    if "\n" in name:
        raise Unreadable(f"line {number}: a quoted name holds a line feed")
    if "." in parts or "" in parts:
        name = posixpath.normpath(name)
        if name == ".":
            raise Unreadable(f"line {number}: {name[:60]!r} names no file")
    return name


def _unquoted(field: str, number: int) -> str:
    if not field.startswith('"'):
        return field
    name, rest = _c_string(field, number)
    if rest.strip():
        raise Unreadable(f"line {number}: text after the quoted name {field[:60]!r}")
    return name


def _c_string(field: str, number: int) -> tuple[str, str]:
    """A C-style quoted name as git writes one (``"a/\\033x"``): its text
    and what follows its closing quote."""
    out = bytearray()
    index = 1
    while index < len(field):
        char = field[index]
        if char == '"':
            return out.decode(errors="replace"), field[index + 1 :]
        if char != "\\":
            out += char.encode()
            index += 1
            continue
        code = field[index + 1 : index + 2]
        octal = re.match(r"[0-7]{3}", field[index + 1 : index + 4])
        if octal:
            out.append(int(octal.group(), 8) & 0xFF)
            index += 4
        elif code in C_ESCAPES:
            out.append(C_ESCAPES[code])
            index += 2
        else:
            raise Unreadable(f"line {number}: {field[:60]!r}: a quoted name memqual cannot decode")
    raise Unreadable(f"line {number}: {field[:60]!r}: a quoted name with no closing quote")

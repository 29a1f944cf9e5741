"""Reading a user-given JSON file (a claims file, a record, results.json,
a layout, a trace): every way it can be wrong is one BadInput line that
names the file and says what to do."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from memqual.host.errors import BadInput


def read_json(path: str | os.PathLike[str], what: str, remedy: str) -> Any:
    """The parsed contents of ``path``, a ``what`` ("record file", ...).
    ``remedy`` ends the message of a missing or broken file."""
    path = Path(path)
    try:
        # A device or a FIFO is no file to parse: /dev/zero would never end.
        if path.exists() and not path.is_dir() and not path.is_file():
            raise BadInput(f"{path}: not a regular file, so no {what}: {remedy}")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise BadInput(f"{path}: no such {what}: {remedy}") from exc
    except IsADirectoryError as exc:
        raise BadInput(f"{path}: is a directory, not a {what}: {remedy}") from exc
    except UnicodeDecodeError as exc:
        raise BadInput(f"{path}: not UTF-8 text, so no {what}: {remedy}") from exc
    except OSError as exc:
        raise BadInput(f"{path}: cannot read the {what} ({exc.strerror})") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadInput(f"{path}: {what} truncated or not JSON ({exc.msg} at line {exc.lineno}): {remedy}") from exc

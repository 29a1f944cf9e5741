"""Reading a user-given JSON file (a claims file, a record, results.json,
a layout, a trace): every way it can be wrong is one BadInput line that
names the file and says what to do.

Beyond the syntax it refuses what no memqual file holds: nesting deeper
than MAX_DEPTH, over-long integers, magnitudes above MAX_MAGNITUDE and,
unless allowed, NaN and Infinity.  docs/architecture.md,
"host/core/jsonfile.py", says why each."""

from __future__ import annotations

import functools
import json
import math
import os
from pathlib import Path
from typing import Any

from memqual.host.core import bounded
from memqual.host.core.errors import BadInput

# memqual's own files nest six or seven levels deep.
MAX_DEPTH = 64
# Far beyond any measured figure; far enough from float's 1.8e308 that two
# numbers' product stays finite.  The schemas keep samples within 1e100, so
# what is derived from them and written beside them (a spread of samples of
# +-1e100 is 1.41e100) reads back.
MAX_MAGNITUDE = 1e150
# What any JSON file memqual reads may weigh (a memslot trace of a few
# million frames is the largest); a reader whose files are smaller and
# costlier to check gives its own, lower cap.
JSON_MAX = 64 << 20


class _Unusable(ValueError):
    """A number the decoder met that no memqual file holds."""


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or abs(value) > MAX_MAGNITUDE:
        raise _Unusable(f"the number {text[:40]} is beyond {MAX_MAGNITUDE:g}")
    return value


def _int(text: str) -> int:
    # Checked before int(): a long enough digit string costs quadratic time.
    if len(text.lstrip("-")) > 151:
        raise _Unusable(f"an integer of {len(text.lstrip('-'))} digits is beyond {MAX_MAGNITUDE:g}")
    value = int(text)
    if abs(value) > MAX_MAGNITUDE:
        raise _Unusable(f"the number {text} is beyond {MAX_MAGNITUDE:g}")
    return value


def _no_constant(text: str) -> float:
    raise _Unusable(f"{text} is no number JSON has")


def _nan_allowed(text: str) -> float:
    return float(text)


def _depth(data: Any) -> int:
    """How deep ``data`` nests, without recursion."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            deepest = max(deepest, depth)
            if depth <= MAX_DEPTH:
                stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))
    return deepest


def read_json(
    path: str | os.PathLike[str], what: str, remedy: str, *, allow_nan: bool = False, max_bytes: int = JSON_MAX
) -> Any:
    """The parsed contents of ``path``, a ``what`` ("record file", ...) of
    at most ``max_bytes`` (checked before it is read: host/core/bounded.py).
    ``remedy`` ends the message of a missing or broken file.  NaN and
    Infinity are refused unless ``allow_nan`` (a record's derived figures
    may be NaN where nothing could be computed); the reader checks that
    its measured values are finite."""
    path = Path(path)
    raw = bounded.read_file(path, max_bytes, what, remedy)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput(f"{path}: not UTF-8 text, so no {what}: {remedy}") from exc
    try:
        data = json.loads(
            text, parse_float=_float, parse_int=_int, parse_constant=_nan_allowed if allow_nan else _no_constant
        )
    except json.JSONDecodeError as exc:
        raise BadInput(f"{path}: {what} truncated or not JSON ({exc.msg} at line {exc.lineno}): {remedy}") from exc
    except _Unusable as exc:
        raise BadInput(f"{path}: not a usable {what}: {exc}: {remedy}") from exc
    except RecursionError as exc:
        raise BadInput(f"{path}: not a usable {what}: nested deeper than {MAX_DEPTH} levels: {remedy}") from exc
    except ValueError as exc:  # what int() or float() refuses beyond the checks above
        raise BadInput(f"{path}: not a usable {what}: {str(exc)[:120]}: {remedy}") from exc
    if _depth(data) > MAX_DEPTH:
        raise BadInput(f"{path}: not a usable {what}: nested deeper than {MAX_DEPTH} levels: {remedy}")
    return data


@functools.cache
def schema_validator(path: Path) -> Any:
    """The JSON Schema validator of a schema file shipped with memqual,
    checked once and kept."""
    import jsonschema

    schema = json.loads(path.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)

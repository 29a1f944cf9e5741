"""``python -m memqual.lab.comparison_page OUTPUT [--html FILE]``:
comparison.html of a finished two-arm ``memqual run`` rendered again from
its directory (A/results.json, B/results.json, and until-decided.json,
patch.json or host-patch.json when the run wrote them): its outcome built
as the run builds it at its end (host/judge/ab_outcome.py), with
--until-decided from the looks' decisions, and the card of the patch under
test, a guest patch's or a host patch's, as the run's own page has it.
For a page from before a change to the page, or a run whose end was cut
short after its looks.  Prints the exit status the
decisions give and the controls' power; exits 0, or 2 on bad input."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memqual.host.core.errors import BadInput
from memqual.host.judge.ab_outcome import of_results
from memqual.host.judge.results import load_results
from memqual.host.judge.sequential_run import SequentialRun
from memqual.host.run.host_scope import HOST_ARM, TEXTS
from memqual.host.run.patch_scope import arm_names_of

GUEST_PATCH = "patch.json"  # memqual run --patch's record (host/cli/kernel.py)
HOST_PATCH = f"{TEXTS}.json"  # memqual run --host-patch's (host/cli/host_patch.py)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m memqual.lab.comparison_page", description=__doc__)
    parser.add_argument("output", metavar="OUTPUT", help="the run's output directory (holding A/ and B/)")
    parser.add_argument("--html", metavar="FILE", help="where to write the page (default OUTPUT/comparison.html)")
    args = parser.parse_args(argv)
    try:
        status, line, path = render(Path(args.output), Path(args.html) if args.html else None)
    except BadInput as exc:
        print(f"memqual: {exc}", file=sys.stderr)
        return 2
    print(f"exit status of the decisions: {status}; {line}")
    print(f"wrote {path}")
    return 0


def render(output: Path, html: Path | None = None) -> tuple[int, str, Path]:
    """The outcome of the run in ``output`` from its files, and its page."""
    # lazy: the pages bring jinja2, numpy and scipy (~300 ms); only this path writes one
    from memqual.host.report.compare_report import comparison_page, write_comparison_html

    files = [output / "A" / "results.json", output / "B" / "results.json"]
    for f in files:
        if not f.is_file():
            raise BadInput(f"{f}: no such file; give the output directory of a two-arm memqual run")
    a, b = (load_results(f) for f in files)
    looks = looks_of(output / "until-decided.json")
    if looks is None:
        outcome = of_results([a], [b])
    else:  # the run's --threshold and --alpha are its looks'
        outcome = of_results([a], [b], looks, threshold=looks.tracker.threshold, alpha=looks.tracker.alpha)
    patch = record_of(output / GUEST_PATCH)
    host_patch = record_of(output / HOST_PATCH)
    names = ("A", "B")
    if patch is not None:
        names = named_by(patch, output / GUEST_PATCH)
    elif host_patch is not None:
        names = named_by(host_patch, output / HOST_PATCH, HOST_ARM)
    page = comparison_page(outcome, a, b, *names, patch=patch, host_patch=host_patch)
    path = write_comparison_html(page, html or output / "comparison.html")
    return int(outcome.exit_status), outcome.power.line(), path


def json_of(path: Path) -> Any:
    """A JSON file the run wrote, read."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BadInput(f"{path}: not the JSON memqual run writes ({exc})") from exc


def record_of(path: Path) -> dict[str, Any] | None:
    """A patch's record the run wrote (None: the run had no such patch)."""
    if not path.is_file():
        return None
    data = json_of(path)
    if not isinstance(data, dict):
        raise BadInput(f"{path}: not the JSON memqual run writes (no object)")
    return data


def named_by(record: dict[str, Any], path: Path, prefix: str = "") -> tuple[str, str]:
    """A and B as the run named them, from its patch's ``record``."""
    try:
        return arm_names_of(record, prefix)
    except (KeyError, TypeError) as exc:
        raise BadInput(f"{path}: not the JSON memqual run writes (no {exc})") from exc


def looks_of(path: Path) -> SequentialRun | None:
    """The looks a run of --until-decided wrote (None: a run without them)."""
    return SequentialRun.from_json(json_of(path), str(path)) if path.is_file() else None


if __name__ == "__main__":
    sys.exit(main())

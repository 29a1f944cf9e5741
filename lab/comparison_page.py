"""``python -m memqual.lab.comparison_page OUTPUT [--html FILE]``:
comparison.html of a finished two-arm ``memqual run`` rendered again from
its directory (A/results.json, B/results.json, and until-decided.json and
patch.json when the run wrote them): its outcome built as the run builds
it at its end (host/judge/ab_outcome.py), with --until-decided from the
looks' decisions.  For a page from before a change to the page, or a run
whose end was cut short after its looks.  Prints the exit status the
decisions give and the controls' power; exits 0, or 2 on bad input."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from memqual.host.core.errors import BadInput
from memqual.host.judge.ab_outcome import of_results
from memqual.host.judge.results import load_results
from memqual.host.judge.sequential_run import SequentialRun


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
    patch = None
    names = ("A", "B")
    if (output / "patch.json").is_file():
        patch = json.loads((output / "patch.json").read_text())
        titles = "; ".join(str(p["subject"]) for p in patch["patches"]) or "a second source"
        names = (f"A {patch['a']['name']}", f"B {patch['b']['name']} (+ {titles})")
    page = comparison_page(outcome, a, b, *names, patch=patch)
    path = write_comparison_html(page, html or output / "comparison.html")
    return int(outcome.exit_status), outcome.power.line(), path


def looks_of(path: Path) -> SequentialRun | None:
    """The looks a run of --until-decided wrote (None: a run without them)."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BadInput(f"{path}: not the JSON memqual run writes ({exc})") from exc
    return SequentialRun.from_json(data, str(path))


if __name__ == "__main__":
    sys.exit(main())

"""``python -m memqual.lab.comparison_page OUTPUT [--html FILE]``:
comparison.html of a finished two-arm ``memqual run`` rendered again from
its directory (A/results.json, B/results.json, and until-decided.json and
patch.json when the run wrote them), as the run renders it at its end:
with --until-decided the looks' decisions set the exit status, the
controls' power is the best look's.  For a page from before a change to
the page, or a run whose end was cut short after its looks.  Prints the
exit status the decisions give and the controls' power; exits 0, or 2 on
bad input."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memqual.host.core.errors import BadInput
from memqual.host.judge import comparison, control_power, decisions
from memqual.host.judge.primaries import PRIMARY
from memqual.host.judge.results import load_results
from memqual.host.judge.verdicts import SLOWER


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
    """Decide the run in ``output`` again from its files and write its page."""
    # lazy: the pages bring jinja2, numpy and scipy (~300 ms); only this path writes one
    from memqual.host.report.compare_report import write_comparison_html

    files = [output / "A" / "results.json", output / "B" / "results.json"]
    for f in files:
        if not f.is_file():
            raise BadInput(f"{f}: no such file; give the output directory of a two-arm memqual run")
    a, b = (load_results(f) for f in files)
    result = comparison.compare_results(a, b)
    summary_path = output / "until-decided.json"
    designs = control_power.designs_of(result.metrics)
    if summary_path.is_file():
        try:
            summary = json.loads(summary_path.read_text())
        except (OSError, ValueError) as exc:
            raise BadInput(f"{summary_path}: not the JSON memqual run writes ({exc})") from exc
        table = decisions.sequential(result, summary, sequential_status(summary))
        looks = [
            (int(x.get("look", 0)), int(x.get("blocks", 0)), float(x.get("alpha", 0.0)))
            for x in (summary.get("controls") or {}).get("looks") or []
        ]
        _, power = control_power.over_looks(designs, looks, threshold=result.threshold)
    else:
        table = decisions.one_look(result)
        power = control_power.of_comparison(result)
    power = control_power.with_blocks_needed(power, designs, threshold=result.threshold)
    patch = None
    names = ("A", "B")
    if (output / "patch.json").is_file():
        patch = json.loads((output / "patch.json").read_text())
        titles = "; ".join(str(p["subject"]) for p in patch["patches"]) or "a second source"
        names = (f"A {patch['a']['name']}", f"B {patch['b']['name']} (+ {titles})")
    path = write_comparison_html(
        result, a, b, html or output / "comparison.html", *names, table=table, power=power, patch=patch
    )
    return table.exit_status, power.line(), path


def sequential_status(summary: dict[str, Any]) -> int:
    """The exit status until-decided.json's looks decided, as the run's
    Tracker gives it: 3 when a negative control was flagged, 1 when a
    primary was decided slower, 0 otherwise."""
    if summary.get("controls_flagged") or summary.get("host_drifted"):
        return 3
    metrics = summary.get("metrics") or []
    return (
        1
        if any(m.get("role") == PRIMARY and m.get("state") == "decided" and m.get("verdict") == SLOWER for m in metrics)
        else 0
    )


if __name__ == "__main__":
    sys.exit(main())

"""What a run says: results.json, report.html and the terminal tables.

results.json is the one artefact everything else reads (report.html is
rendered from it, ``memqual compare`` compares two of them), so it holds the
raw samples, not only summaries::

    {"schema": "memqual.results/1", "memqual_version": "0.1.0",
     "created": "...", "run": {...profile, label, avocado status...},
     "environment": {host_kernel, qemu, accel, accel_reason, cpu, ksm, thp,
                     kvm_nr_memslots, guest_kernel_sha256, ...},
     "scenarios": ["ksm.volatile_scan", ...],
     "claims": [{id, verdict, reason, published, measured, ci, unit,
                 samples, ...}],
     "metrics": [{key, scenario, metric, unit, better, variant, settings,
                  samples, summary}]}

The environment comes from the records' ``environment`` fields (what the
scenarios saw, host.environment's keys); what no record says is filled from
this host's ``probe.environment()`` (read-only, no guest booted) and marked
in ``environment_sources``.
"""

from __future__ import annotations

import base64
import collections
import datetime as _dt
import html
import io
import json
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from host import stats
from host.claims import DIRECTION_ONLY, NOT_MEASURABLE, NOT_REPRODUCED, REPRODUCED, UNDERPOWERED, Verdict, format_ratio
from host.environment import FINGERPRINT_KEYS
from host.jsonfile import read_json
from host.errors import BadInput
from host.record import Measurement

SCHEMA = "memqual.results/1"

VERDICT_COLOURS = {
    REPRODUCED: "#1a7f37",
    DIRECTION_ONLY: "#b7791f",
    NOT_REPRODUCED: "#c62828",
    UNDERPOWERED: "#7c3aed",
    NOT_MEASURABLE: "#6b7280",
}
_RICH_STYLES = {
    REPRODUCED: "bold green",
    DIRECTION_ONLY: "bold yellow",
    NOT_REPRODUCED: "bold red",
    UNDERPOWERED: "bold magenta",
    NOT_MEASURABLE: "dim",
}


def memqual_version() -> str:
    try:
        from importlib.metadata import version

        return version("memqual")
    except Exception:  # not installed (a bare checkout): say so rather than guess
        return "unknown"


# ---------------------------------------------------------------- results


def variant_label(variant: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(variant.items())) or "default"


def metric_key(rec: Measurement | dict[str, Any]) -> str:
    """Identifies one metric of one variant across runs: what `memqual
    compare` pairs up."""
    d = rec.to_json() if isinstance(rec, Measurement) else rec
    return (
        f"{d['scenario']} {d['metric']} [{variant_label(d.get('variant') or {})}]"
        f" {json.dumps(d.get('settings') or {}, sort_keys=True)}"
    )


def metrics_of(records: Iterable[Measurement]) -> list[dict[str, Any]]:
    out = []
    for rec in records:
        if not rec.samples:
            continue
        out.append(
            {
                "key": metric_key(rec),
                "scenario": rec.scenario,
                "metric": rec.metric,
                "claim": rec.claim,
                "unit": rec.unit,
                "better": rec.better,
                "variant": rec.variant,
                "settings": rec.settings,
                "samples": rec.samples,
                # grouped by independent unit: what `memqual compare` tests
                "replicates": rec.replicates,
                "summary": stats.summarize(rec.samples).to_json(),
                "duration_s": rec.duration_s,
            }
        )
    # Two tests may record the same metric with the same settings: keep both
    # (in collection order, which follows avocado's test order) as "#2"...
    seen: collections.Counter[str] = collections.Counter()
    for m in out:
        seen[m["key"]] += 1
        if seen[m["key"]] > 1:
            m["key"] += f" #{seen[m['key']]}"
    out.sort(key=lambda m: m["key"])
    return out


def environment_fingerprint(records: Sequence[Measurement], *, host_fallback: bool = True) -> dict[str, Any]:
    """The records' environment, one value per key (the most common when
    records disagree, all of them under ``<key>_all``), then this host's
    facts for the keys no record gave."""
    from host import probe

    values: dict[str, list[str]] = collections.defaultdict(list)
    originals: dict[str, dict[str, Any]] = collections.defaultdict(dict)
    for rec in records:
        for key, value in (rec.environment or {}).items():
            encoded = json.dumps(value, sort_keys=True)
            values[key].append(encoded)
            originals[key][encoded] = value
    env: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for key, seen in values.items():
        counts = collections.Counter(seen)
        env[key] = originals[key][counts.most_common(1)[0][0]]
        sources[key] = "records"
        if len(counts) > 1:
            env[key + "_all"] = [originals[key][v] for v in counts]
    if host_fallback:
        for key, value in probe.environment(with_ksm=True).to_json().items():
            if key not in env:
                env[key] = value
                sources[key] = "host (no record said)"
    for key in FINGERPRINT_KEYS:
        if key not in env:
            env[key] = None
            sources[key] = "unknown: no record said"
    ordered = {k: env[k] for k in FINGERPRINT_KEYS}
    ordered.update({k: v for k, v in sorted(env.items()) if k not in ordered})
    ordered["environment_sources"] = sources
    return ordered


def build_results(
    verdicts: Sequence[Verdict],
    records: Sequence[Measurement],
    *,
    run: dict[str, Any] | None = None,
    host_fallback: bool = True,
) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "memqual_version": memqual_version(),
        "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "run": run or {},
        "environment": environment_fingerprint(records, host_fallback=host_fallback),
        "scenarios": sorted({r.scenario for r in records}),
        "claims": [v.to_json() for v in verdicts],
        "metrics": metrics_of(records),
    }


def write_results(results: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=2, sort_keys=False, allow_nan=False) + "\n")
    os.replace(tmp, path)
    return path


def load_results(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A results.json, checked: missing, truncated, another schema or a
    file that is not a results file are BadInput with one line."""
    path = Path(path)
    data = read_json(path, "results file", "give OUTPUT/results.json of a memqual run, or re-run memqual run")
    if not isinstance(data, dict) or "schema" not in data:
        raise BadInput(f"{path}: not a memqual results file (no 'schema')")
    if str(data["schema"]).startswith("memqual.measurement/"):
        raise BadInput(f"{path}: a measurement record, not a results.json (memqual run writes OUTPUT/results.json)")
    if data["schema"] != SCHEMA:
        raise BadInput(f"{path}: schema {data['schema']!r} is not {SCHEMA!r}: written by another memqual version")
    for key, kind in (("claims", list), ("metrics", list), ("environment", dict)):
        if not isinstance(data.get(key), kind):
            raise BadInput(f"{path}: field {key!r} missing or of the wrong type: truncated or hand-edited?")
    for index, m in enumerate(data["metrics"]):
        if not isinstance(m, dict) or not {"key", "samples", "better", "unit"} <= m.keys():
            raise BadInput(f"{path}: metric #{index} is incomplete")
        if not m["samples"] or not all(isinstance(x, (int, float)) for x in m["samples"]):
            raise BadInput(f"{path}: metric {m['key']} has no numeric samples")
    return data


# ------------------------------------------------------------- terminal


def _mean_stdev(samples: Sequence[float]) -> str:
    s = stats.summarize(samples)
    return f"{_num(s.mean)} ({_num(s.stdev)})"


def _num(x: float | None) -> str:
    """Four significant digits (kernbench's 42.809 reads as 42.81)."""
    if x is None or not math.isfinite(x):
        return "n/a"
    if abs(x) >= 10000:
        return f"{x:,.0f}"
    return f"{x:.4g}"


def kernbench_tables(results: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """Per scenario (and settings) a table shaped like seed 002's kernbench
    table: a row per metric, a column per variant, cells "mean (stdev)"."""
    groups: dict[tuple[str, str], dict[str, dict[str, Any]]] = collections.defaultdict(dict)
    for m in results["metrics"]:
        settings = json.dumps(m.get("settings") or {}, sort_keys=True)
        groups[(m["scenario"], settings)].setdefault(m["metric"], {})[variant_label(m.get("variant") or {})] = m
    tables = []
    for (scenario, settings), by_metric in sorted(groups.items()):
        columns = sorted({v for cells in by_metric.values() for v in cells})
        rows = []
        for metric, cells in sorted(by_metric.items()):
            unit = next(iter(cells.values()))["unit"]
            scale, unit = _time_scale(unit, [x for m in cells.values() for x in m["samples"]])
            rows.append(
                [f"{metric} ({unit})"]
                + [_mean_stdev([x * scale for x in cells[c]["samples"]]) if c in cells else "" for c in columns]
            )
        title = scenario if settings == "{}" else f"{scenario}  {_short_settings(settings)}"
        tables.append((title, columns, rows))
    return tables


def _time_scale(unit: str, samples: Sequence[float]) -> tuple[float, str]:
    """Seconds shown in ms or us when they are that small (a column of
    4.696e-05 reads badly)."""
    if unit != "s" or not samples:
        return 1.0, unit
    typical = stats.median([abs(x) for x in samples])
    if 0 < typical < 1e-3:
        return 1e6, "us"
    if 0 < typical < 1.0:
        return 1e3, "ms"
    return 1.0, unit


def _short_settings(settings_json: str) -> str:
    """Settings as k=v, long values cut (the full text is in results.json)."""
    settings = json.loads(settings_json)

    def short(value: Any) -> str:
        text = str(value)
        return text if len(text) <= 24 else text[:21] + "..."

    return ", ".join(f"{k}={short(v)}" for k, v in sorted(settings.items()))


def _measured_text(c: dict[str, Any]) -> str:
    if c.get("measured") is None:
        return "-"
    text = f"{format_ratio(c['measured'])}x"
    if c.get("ci") and c["ci"][0] is not None and c["ci"][0] != c["ci"][1]:
        # A model's spread is the range over real layouts, not a CI.
        lo, hi = format_ratio(c["ci"][0]), format_ratio(c["ci"][1])
        text += f" (layouts {lo}-{hi})" if c.get("computed") else f" [{lo}, {hi}]"
    return text


def evidence_class(c: dict[str, Any]) -> str:
    return str((c.get("evidence") or {}).get("class") or NOT_MEASURABLE)


def evidence_line(c: dict[str, Any]) -> str:
    """The first line of a claim's card: the class of its evidence and what
    it is."""
    ev = c.get("evidence") or {}
    kind = evidence_class(c)
    if kind == NOT_MEASURABLE:
        return f"Evidence: not measurable. Would measure it: {ev.get('would_measure') or c.get('reason', '')}"
    return f"Evidence: {kind}. {ev.get('instead', '')}"


def _published_text(c: dict[str, Any]) -> str:
    if c.get("expected") is not None:
        return f"{_num(c['expected'])}x"
    if c.get("source") == "none":
        figures = [p for p in c.get("published") or [] if p.get("value") is not None]
        return f"{_num(figures[0]['value'])}{figures[0].get('unit', '')}" if figures else "-"
    # The seed asserts a direction only.
    return {"greater": "> 1", "less": "< 1", "at_least": ">= 1"}.get(c.get("direction") or "", "-")


def print_tables(results: dict[str, Any], console: Any = None) -> None:
    """The verdicts and the kernbench-shaped tables, with rich."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console()
    for title, columns, rows in kernbench_tables(results):
        # The title (scenario and settings) on its own line: as a table title
        # it would wrap to the table's width.
        console.print(f"\n[bold]{escape(title)}[/]  [dim]mean (stdev) of the repeats[/]", highlight=False, soft_wrap=True)
        table = Table()
        table.add_column("", style="bold", overflow="fold")
        for column in columns:
            table.add_column(escape(column), justify="right", overflow="fold")
        for row in rows:
            table.add_row(*[escape(cell) for cell in row])
        console.print(table)
    table = Table(title="Claims", title_justify="left")
    table.add_column("claim", no_wrap=True)
    table.add_column("evidence", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    table.add_column("measured B/A [95% CI]", justify="right", overflow="fold")
    table.add_column("published", justify="right")
    for c in results["claims"]:
        table.add_row(
            c["id"],
            evidence_class(c),
            f"[{_RICH_STYLES.get(c['verdict'], '')}]{c['verdict']}[/]",
            escape(_measured_text(c)),
            escape(_published_text(c)),
        )
    console.print(table)
    # The reasons are sentences: print them below the table, not squeezed
    # into a column.
    for c in results["claims"]:
        console.print(
            f"[bold]{c['id']}[/] ({evidence_class(c)}): {escape(c['reason'])}",
            highlight=False,
            soft_wrap=not console.is_terminal,
        )


# ------------------------------------------------------------------ plots


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # no display; before pyplot is imported anywhere
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 9, "axes.spines.top": False, "axes.spines.right": False})
    return plt


_A_COLOUR, _B_COLOUR, _PUB_COLOUR = "#2563eb", "#ea580c", "#111827"


def claim_plot(c: dict[str, Any]) -> str | None:
    """Left: A's and B's values (every repeat, the median as a bar) with the
    published figures; right: B / A with its CI against the published ratio
    and its tolerance band.  None when nothing was measured."""
    if c.get("measured") is None or not c["samples"]["a"] or not c["samples"]["b"]:
        return None
    plt = _pyplot()
    import numpy as np

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8.6, 2.7), gridspec_kw={"width_ratios": [1.25, 1]})
    sides = [("a", _A_COLOUR), ("b", _B_COLOUR)]
    rng = np.random.default_rng(0)  # jitter only
    for x, (side, colour) in enumerate(sides):
        samples = c["samples"][side]
        med = float(np.median(samples))
        ax1.bar(x, med, width=0.55, color=colour, alpha=0.25, edgecolor=colour)
        jitter = rng.uniform(-0.12, 0.12, len(samples)) if len(samples) > 1 else [0.0]
        ax1.scatter(x + np.asarray(jitter), samples, s=14, color=colour, zorder=3, label=None)
        pub = (c.get(side) or {}).get("published")
        if pub is not None:
            ax1.scatter([x + 0.38], [pub], marker="D", s=34, facecolor="white", edgecolor=_PUB_COLOUR, zorder=4)
            ax1.annotate(f"published {_num(pub)}", (x + 0.38, pub), xytext=(4, 4), textcoords="offset points", fontsize=7)
    ax1.set_xticks([0, 1], [(c.get("a") or {}).get("label", "A"), (c.get("b") or {}).get("label", "B")])
    unit = (c.get("a") or {}).get("unit", "")
    ax1.set_ylabel(unit)
    ax1.set_title("A and B" + (" (a model: one point per real layout)" if c.get("computed") else " (every repeat, bar = median)"), fontsize=9)
    ax1.set_ylim(bottom=0)

    ratio = c["measured"]
    ci = c.get("ci")
    expected, tol = c.get("expected"), c.get("tolerance") or 0.0
    ax2.axhline(1.0, color="#9ca3af", linestyle="--", linewidth=1)
    ax2.text(1.45, 1.0, "no change", va="bottom", ha="right", fontsize=7, color="#6b7280")
    top = max(v for v in [ratio, 1.0, (ci[1] if ci and ci[1] is not None else 0), (expected or 0) * (1 + tol)] if v is not None)
    top *= 1.18
    if expected is not None:
        ax2.axhspan(expected * (1 - tol), expected * (1 + tol), color="#d1fae5", alpha=0.8, zorder=0)
        ax2.scatter([1], [expected], marker="D", s=40, facecolor="white", edgecolor=_PUB_COLOUR, zorder=4)
        ax2.annotate(f"published {_num(expected)}x ±{tol:.0%}", (1, expected), xytext=(8, -3), textcoords="offset points", fontsize=7)
        right_label = "published"
    else:
        # The seed asserts a direction only: shade the side it asserts.
        direction = c.get("direction")
        low, high = {"greater": (1.0, top), "less": (0.0, 1.0), "at_least": (1.0 - tol, top)}.get(direction or "", (1.0, top))
        ax2.axhspan(low, high, color="#d1fae5", alpha=0.6, zorder=0)
        ax2.text(1, (low + high) / 2, {"less": "asserted: B / A < 1"}.get(direction or "", "asserted: B / A >= 1" if direction == "at_least" else "asserted: B / A > 1"), ha="center", fontsize=8, color="#065f46")
        right_label = "seed asserts"
    colour = VERDICT_COLOURS.get(c["verdict"], _PUB_COLOUR)
    if ci and ci[0] is not None and ci[1] is not None:
        ax2.errorbar([0], [ratio], yerr=[[ratio - ci[0]], [ci[1] - ratio]], fmt="o", color=colour, capsize=5, markersize=6)
    else:
        ax2.scatter([0], [ratio], color=colour, s=36, zorder=3)
    ax2.annotate(f"{_num(ratio)}x", (0, ratio), xytext=(8, -3), textcoords="offset points", fontsize=8, color=colour)
    ax2.set_xticks([0, 1], ["measured" if not c.get("computed") else "model", right_label])
    ax2.set_xlim(-0.5, 1.5)
    ax2.set_ylim(0, top)
    ax2.set_ylabel("B / A (x)")
    ax2.set_title("B / A" + (" with 95% CI" if ci and ci[0] != ci[1] else ""), fontsize=9)
    fig.tight_layout()
    return _png(fig)


def distribution_plot(metric_name: str, unit: str, entries: Sequence[dict[str, Any]]) -> str:
    """The repeats of one metric, a box and the points per variant."""
    plt = _pyplot()
    import numpy as np

    fig, ax = plt.subplots(figsize=(4.2, 2.6))
    labels = [variant_label(e.get("variant") or {}) for e in entries]
    scale, unit = _time_scale(unit, [x for e in entries for x in e["samples"]])
    data = [[x * scale for x in e["samples"]] for e in entries]
    ax.boxplot(data, widths=0.45, showfliers=False, medianprops={"color": _PUB_COLOUR})
    rng = np.random.default_rng(0)
    palette = [_A_COLOUR, _B_COLOUR, "#059669", "#7c3aed", "#db2777"]
    for i, samples in enumerate(data, start=1):
        jitter = rng.uniform(-0.1, 0.1, len(samples))
        ax.scatter(i + jitter, samples, s=12, color=palette[(i - 1) % len(palette)], zorder=3)
    ax.set_xticks(range(1, len(labels) + 1), labels, rotation=0 if len(labels) < 4 else 20)
    ax.set_ylabel(unit)
    ax.set_title(metric_name, fontsize=9)
    fig.tight_layout()
    return _png(fig)


# ------------------------------------------------------------------- html

_CSS = """
body{font-family:-apple-system,BlinkMacSystemFont,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;
 color:#111827;background:#f3f4f6;margin:0;line-height:1.45}
main{max-width:1080px;margin:0 auto;padding:24px 28px 60px}
h1{font-size:26px;margin:8px 0 2px} h2{font-size:19px;margin:34px 0 10px;border-bottom:1px solid #d1d5db;padding-bottom:4px}
h3{font-size:16px;margin:0 0 4px}
.sub{color:#4b5563;margin:0 0 16px}
.badges{display:flex;gap:10px;flex-wrap:wrap;margin:14px 0}
.badge{border-radius:999px;padding:3px 12px;color:#fff;font-weight:600;font-size:13px;white-space:nowrap}
.count{background:#fff;border:1px solid #e5e7eb;border-radius:10px;padding:10px 16px;min-width:120px}
.count b{font-size:24px;display:block}
.card{background:#fff;border:1px solid #e5e7eb;border-radius:10px;padding:16px 18px;margin:14px 0;
 box-shadow:0 1px 2px rgba(0,0,0,.04)}
.card header{display:flex;justify-content:space-between;align-items:flex-start;gap:12px}
.cid{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;color:#6b7280;font-size:13px}
.evidence{margin:6px 0;color:#111827}
table.sidebyside td{vertical-align:top;width:50%}
blockquote{margin:8px 0;padding:6px 12px;border-left:3px solid #d1d5db;color:#374151;font-style:italic;background:#f9fafb}
.reason{margin:8px 0;padding:8px 12px;border-radius:6px;background:#f9fafb;font-size:14px}
table{border-collapse:collapse;font-size:13px;margin:6px 0}
td,th{padding:4px 10px;border-bottom:1px solid #e5e7eb;text-align:left;vertical-align:top}
th{color:#374151;background:#f9fafb} td.num{text-align:right;font-variant-numeric:tabular-nums}
.summary td:nth-child(2){font-weight:600}
.env td:first-child{color:#4b5563;white-space:nowrap} .env td{font-family:ui-monospace,Menlo,monospace;font-size:12px}
img{max-width:100%} .grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(460px,1fr));gap:12px}
.small{font-size:12px;color:#6b7280} .seed{font-size:12px;color:#6b7280}
"""


def _esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _badge(verdict: str) -> str:
    return f'<span class="badge" style="background:{VERDICT_COLOURS.get(verdict, "#6b7280")}">{_esc(verdict)}</span>'


def _env_value(value: Any) -> str:
    if value is None:
        return "<span class='small'>not recorded</span>"
    if isinstance(value, dict):
        return _esc(", ".join(f"{k}={v}" for k, v in value.items()))
    return _esc(value)


def _environment_line(env: dict[str, Any]) -> str:
    """Where the figures come from, in one line under the title."""
    bits = []
    if env.get("accel"):
        bits.append(f"<b>{_esc(str(env['accel']).upper())}</b>" + (f" ({_esc(env['accel_reason'])})" if env.get("accel_reason") else ""))
    if env.get("host_kernel"):
        bits.append(f"host kernel {_esc(env['host_kernel'])}")
    if env.get("qemu"):
        qemu = str(env["qemu"]).split(" (")[0]
        bits.append(_esc(qemu if qemu.lower().startswith("qemu") else f"QEMU {qemu}"))
    if env.get("guest_kernel") or env.get("guest_kernel_sha256"):
        sha = str(env.get("guest_kernel_sha256") or "")[:12]
        bits.append(f"guest kernel {_esc(env.get('guest_kernel') or '')}" + (f" (sha256 {_esc(sha)}...)" if sha else ""))
    return f"<p class='sub'>{' · '.join(bits)}</p>" if bits else ""


def render_html(results: dict[str, Any]) -> str:
    claims = results["claims"]
    counts = collections.Counter(c["verdict"] for c in claims)
    run = results.get("run") or {}
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width,initial-scale=1'>",
        f"<title>memqual report {_esc(results.get('created', ''))}</title><style>{_CSS}</style></head><body><main>",
        "<h1>memqual: do today's systems reproduce the published claims?</h1>",
        f"<p class='sub'>{_esc(results.get('created', ''))} · memqual {_esc(results.get('memqual_version', ''))}"
        + (f" · profile {_esc(run['profile'])}" if run.get("profile") else "")
        + (f" · {_esc(run['label'])}" if run.get("label") else "")
        + (f" · avocado: {_esc(run['avocado']['summary'])}" if (run.get("avocado") or {}).get("summary") else "")
        + "</p>",
        _environment_line(results.get("environment") or {}),
        "<div class='badges'>",
    ]
    for verdict in (REPRODUCED, DIRECTION_ONLY, NOT_REPRODUCED, UNDERPOWERED, NOT_MEASURABLE):
        parts.append(
            f"<div class='count'><b style='color:{VERDICT_COLOURS[verdict]}'>{counts.get(verdict, 0)}</b>{_esc(verdict)}</div>"
        )
    parts.append("</div>")

    # The verdict at a glance.
    parts.append(
        "<table class='summary'><tr><th>claim</th><th>evidence</th><th>verdict</th>"
        "<th>evidence B/A [95% CI]</th><th>published</th></tr>"
    )
    for c in claims:
        parts.append(
            f"<tr><td><a href='#{_esc(c['id'])}'>{_esc(c['id'])}</a></td><td>{_esc(evidence_class(c))}</td>"
            f"<td>{_badge(c['verdict'])}</td>"
            f"<td class='num'>{_esc(_measured_text(c))}</td><td class='num'>{_esc(_published_text(c))}</td></tr>"
        )
    parts.append("</table>")

    parts.append("<h2>Claims</h2>")
    for c in claims:
        parts.append(f"<section class='card' id='{_esc(c['id'])}'><header><div><h3>{_esc(c.get('title', c['id']))}</h3>")
        parts.append(f"<div class='cid'>{_esc(c['id'])} · seed {_esc(c.get('seed', ''))}</div></div>{_badge(c['verdict'])}</header>")
        parts.append(f"<p class='evidence'><b>{_esc(evidence_line(c))}</b></p>")
        parts.append(_claim_against_evidence(c))
        if c.get("quote"):
            parts.append(f"<blockquote>{_esc(c['quote'])}</blockquote>")
        parts.append(f"<div class='reason'><b>Why:</b> {_esc(c['reason'])}</div>")
        parts.append(_layouts_table(c))
        parts.append(_beside_table(c))
        published = c.get("published") or []
        if published:
            parts.append("<table><tr><th>published figure</th><th>value</th></tr>")
            for p in published:
                value = "" if p.get("value") is None else f"{p['value']} {p.get('unit', '')}"
                if p.get("stdev") is not None:
                    value += f" (stdev {p['stdev']})"
                if p.get("note"):
                    value += f" · {p['note']}"
                parts.append(f"<tr><td>{_esc(p.get('what', ''))}</td><td class='num'>{_esc(value.strip())}</td></tr>")
            parts.append("</table>")
        png = claim_plot(c)
        if png:
            parts.append(f"<img alt='{_esc(c['id'])} measured against published' src='data:image/png;base64,{png}'>")
        parts.append("</section>")

    metrics = results["metrics"]
    if metrics:
        parts.append("<h2>Measurements</h2>")
        for title, columns, rows in kernbench_tables(results):
            parts.append(f"<h3>{_esc(title)}</h3><div class='small'>mean (stdev) of the repeats</div><table><tr><th></th>")
            parts.extend(f"<th>{_esc(col)}</th>" for col in columns)
            parts.append("</tr>")
            for row in rows:
                parts.append(f"<tr><td>{_esc(row[0])}</td>" + "".join(f"<td class='num'>{_esc(x)}</td>" for x in row[1:]) + "</tr>")
            parts.append("</table>")
        parts.append(
            "<h3>Location and spread</h3><table><tr><th>metric</th><th>variant</th><th>settings</th><th>n</th>"
            "<th>median</th><th>IQR</th><th>MAD</th><th>CV</th></tr>"
        )
        # One unit per metric, whatever its variant or settings.
        scales: dict[tuple[str, str], tuple[float, str]] = {}
        for key in {(m["scenario"], m["metric"]) for m in metrics}:
            same = [m for m in metrics if (m["scenario"], m["metric"]) == key]
            scales[key] = _time_scale(same[0]["unit"], [x for m in same for x in m["samples"]])
        for m in metrics:
            s = m["summary"]
            scale, unit = scales[(m["scenario"], m["metric"])]
            cv_text = "n/a" if s["cv"] is None else f"{100 * s['cv']:.1f} %"
            parts.append(
                f"<tr><td>{_esc(m['scenario'])} {_esc(m['metric'])} ({_esc(unit)}, {_esc(m['better'])} is better)</td>"
                f"<td>{_esc(variant_label(m.get('variant') or {}))}</td>"
                f"<td class='small'>{_esc(_short_settings(json.dumps(m.get('settings') or {})))}</td><td class='num'>{s['n']}</td>"
                f"<td class='num'>{_esc(_num(s['median'] * scale))}</td><td class='num'>{_esc(_num(s['iqr'] * scale))}</td>"
                f"<td class='num'>{_esc(_num(s['mad'] * scale))}</td><td class='num'>{cv_text}</td></tr>"
            )
        parts.append("</table>")
        grouped: dict[tuple[str, str, str], list[dict[str, Any]]] = collections.defaultdict(list)
        for m in metrics:
            grouped[(m["scenario"], m["metric"], json.dumps(m.get("settings") or {}, sort_keys=True))].append(m)
        # A single repeat has no distribution to show.
        plotted = {k: v for k, v in grouped.items() if any(len(e["samples"]) > 1 for e in v)}
        if plotted:
            parts.append("<h2>Distributions of the repeats</h2><div class='grid'>")
            for (scenario, metric, settings), entries in sorted(plotted.items()):
                subtitle = _short_settings(settings)
                png = distribution_plot(f"{scenario}: {metric}" + (f"\n{subtitle}" if subtitle else ""), entries[0]["unit"], entries)
                parts.append(f"<img alt='{_esc(scenario)} {_esc(metric)}' src='data:image/png;base64,{png}'>")
            parts.append("</div>")

    parts.append("<h2>Environment</h2><table class='env'>")
    env = results.get("environment") or {}
    sources = env.get("environment_sources") or {}
    for key, value in env.items():
        if key == "environment_sources":
            continue
        src = sources.get(key, "")
        note = f" <span class='small'>({_esc(src)})</span>" if src and src != "records" else ""
        parts.append(f"<tr><td>{_esc(key)}</td><td>{_env_value(value)}{note}</td></tr>")
    parts.append("</table>")
    tests = run.get("tests") or []
    if tests:
        parts.append("<h2>Tests</h2><table><tr><th>test</th><th>status</th><th>time</th><th>reason</th></tr>")
        for t in tests:
            time_s = t.get("time")
            parts.append(
                f"<tr><td>{_esc(t.get('id', ''))}</td><td>{_esc(t.get('status', ''))}</td>"
                f"<td class='num'>{'' if time_s is None else f'{time_s:.1f} s'}</td><td>{_esc(t.get('reason') or '')}</td></tr>"
            )
        parts.append("</table>")
    parts.append(
        "<p class='small'>Evidence: measured = the claimed mechanism measured here on a real system; successor = "
        "the mechanism upstream adopted instead, measured in place of one no kernel has; model = a model of code "
        "that runs nowhere today, with the source of every input; not measurable = no evidence here, with what "
        "would measure it. Measured ratios are medians of B over A with 95% two-stage bootstrap intervals over "
        "independent replicates (fresh guests or rounds); p-values come from a permutation test of the replicate "
        "medians. A model's figure has no sampling spread: it is given as the median and range over the real "
        "layouts it ran on. Verdicts: reproduced = direction holds and the magnitude is within tolerance of the "
        "published figure; direction only = the direction holds, the magnitude does not; not reproduced = the "
        "direction is not established; underpowered = measured on too few independent replicates to decide; "
        "not measurable = no evidence in this run (the reason says why).</p>"
    )
    parts.append("</main></body></html>")
    return "".join(parts)


def _claim_against_evidence(c: dict[str, Any]) -> str:
    """What the claim said and what was measured instead, side by side."""
    ev = c.get("evidence") or {}
    inputs = "".join(f"<li>{_esc(i)}</li>" for i in ev.get("inputs") or [])
    right = _esc(ev.get("instead", ""))
    if inputs:
        right += f"<ul class='small'>{inputs}</ul>"
    if ev.get("would_measure") and evidence_class(c) == NOT_MEASURABLE:
        right += f"<div class='small'><b>What would measure it:</b> {_esc(ev['would_measure'])}</div>"
    return (
        "<table class='sidebyside'><tr><th>the claim measured</th><th>this run's evidence</th></tr>"
        f"<tr><td>{_esc(ev.get('claimed', ''))}</td><td>{right}</td></tr></table>"
    )


def _layouts_table(c: dict[str, Any]) -> str:
    rows = c.get("layouts") or []
    if not rows:
        return ""
    a_label = (c.get("a") or {}).get("label", "A")
    b_label = (c.get("b") or {}).get("label", "B")
    out = [
        f"<table><tr><th>real guest layout</th><th>slots</th><th>{_esc(a_label)}</th>"
        f"<th>{_esc(b_label)}</th><th>B / A</th></tr>"
    ]
    for r in rows:
        out.append(
            f"<tr><td>{_esc(r['config'])}</td><td class='num'>{r['slots']}</td><td class='num'>{_num(r['a'])}</td>"
            f"<td class='num'>{_num(r['b'])}</td><td class='num'>{format_ratio(r['ratio'])}x</td></tr>"
        )
    out.append("</table>")
    return "".join(out)


def _beside_table(c: dict[str, Any]) -> str:
    rows = c.get("beside") or []
    if not rows:
        return ""
    out = [
        "<div class='small'>Shown beside the evidence (does not decide the verdict):</div>"
        "<table><tr><th>what</th><th>variant</th><th>median</th><th>95% CI (or range)</th><th>replicates</th></tr>"
    ]
    for r in rows:
        out.append(
            f"<tr><td>{_esc(r['label'])}</td><td>{_esc(variant_label(r.get('variant') or {}))}</td>"
            f"<td class='num'>{_num(r['median'])} {_esc(r['unit'])}</td>"
            f"<td class='num'>{_num(r['low'])}-{_num(r['high'])}</td><td class='num'>{r['replicates']}</td></tr>"
        )
    out.append("</table>")
    return "".join(out)


def write_html(results: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(results))
    return path

"""``memqual export --kcidb FILE RESULTS.json``: a run as KCIDB JSON.

The guest kernel as checkout and build, a test per metric, per claim and
per Avocado test, the environment in each; built for kcidb-io's latest
schema and validated with it before it is written.  Ids derive from the
results file's content, so exporting a run twice gives the same ids.
What goes where: docs/bisect-history-export.md, "What
host/report/export.py puts where in KCIDB".
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any

from memqual.host.core.errors import BadInput, MemqualError

ORIGIN = "memqual"

CLAIM_STATUS = {
    "reproduced": "PASS",
    "not reproduced": "FAIL",
    "direction only": "DONE",  # the direction holds, the magnitude does not: neither pass nor fail
    "underpowered": "SKIP",
    "not measurable": "SKIP",
}
AVOCADO_STATUS = {
    "PASS": "PASS",
    "FAIL": "FAIL",
    "ERROR": "ERROR",
    "SKIP": "SKIP",
    "CANCEL": "SKIP",
    "INTERRUPTED": "MISS",
    "INTERRUPT": "MISS",
    "WARN": "DONE",  # completed with warnings: not a PASS
}


class ExportInvalid(MemqualError):
    """memqual built KCIDB data its schema rejects: a bug, exit 1."""

    exit_status = 1


def _segment(text: Any) -> str:
    """One element of a KCIDB path: letters, digits, _ and - only."""
    seg = re.sub(r"[^A-Za-z0-9_-]+", "_", str(text)).strip("_")
    return seg or "_"


def _path(*parts: Any) -> str:
    segments: list[str] = []
    for part in parts:
        segments += [_segment(p) for p in str(part).split(".") if p != ""]
    return ".".join(segments)


def _finite(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def _timestamp(created: str | None) -> str | None:
    """results.json's "created" (UTC, Z) as RFC 3339, or None."""
    if isinstance(created, str) and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", created):
        return created.replace("Z", "+00:00")
    return None


def run_id(results: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(results, sort_keys=True).encode()).hexdigest()[:12]
    stamp = re.sub(r"[^0-9TZ]", "", str(results.get("created") or ""))
    return f"{stamp}-{digest}" if stamp else digest


def _variant_text(variant: dict[str, Any]) -> str:
    return "_".join(f"{k}-{v}" for k, v in sorted(variant.items()))


def to_kcidb(results: dict[str, Any], origin: str = ORIGIN) -> dict[str, Any]:
    """KCIDB data (the latest schema kcidb-io knows) for one results.json."""
    from kcidb_io import schema

    if not re.fullmatch(r"[a-z0-9_]+", origin):
        raise BadInput(f"--origin {origin!r}: KCIDB origins are lower-case letters, digits and _")
    rid = run_id(results)
    env = results.get("environment") or {}
    run = results.get("run") or {}
    started = _timestamp(results.get("created"))
    kernel = run.get("guest_kernel") or {}
    release = env.get("guest_kernel") or "unknown"
    sha = env.get("guest_kernel_sha256") or kernel.get("sha256")
    checkout_id = f"{origin}:{rid}"
    build_id = f"{origin}:{rid}:{(sha or 'kernel')[:16]}"
    env_misc = {k: v for k, v in env.items() if k != "environment_sources"}
    environment = {
        "comment": f"QEMU {env.get('qemu') or '?'} ({env.get('accel') or '?'}) on host kernel "
        f"{env.get('host_kernel') or '?'}",
        "misc": env_misc,
    }
    checkout: dict[str, Any] = {
        "id": checkout_id,
        "origin": origin,
        "comment": f"guest kernel {release}",
        "valid": True,
        "misc": {
            "guest_kernel": release,
            "guest_kernel_sha256": sha,
            "memqual_version": results.get("memqual_version"),
            "profile": run.get("profile"),
            "label": run.get("label"),
        },
    }
    build: dict[str, Any] = {
        "id": build_id,
        "checkout_id": checkout_id,
        "origin": origin,
        "architecture": "x86_64",
        "comment": f"guest kernel {release}" + (f" ({kernel.get('bzimage')})" if kernel.get("bzimage") else ""),
        "misc": {"sha256": sha, "modules": kernel.get("modules"), "built_by": "not memqual: a given kernel binary"},
    }
    if started:
        checkout["start_time"] = started
        build["start_time"] = started
    tests: list[dict[str, Any]] = []

    def add(kind: str, key: str, path: str, status: str, **fields: Any) -> None:
        test = {
            "id": f"{origin}:{rid}:{kind}:{hashlib.sha256(key.encode()).hexdigest()[:12]}",
            "build_id": build_id,
            "origin": origin,
            "path": path,
            "status": status,
            "environment": environment,
            **{k: v for k, v in fields.items() if v is not None},
        }
        if started:
            test["start_time"] = started
        tests.append(test)

    for m in results.get("metrics") or []:
        summary = m.get("summary") or {}
        median = _finite(summary.get("median"))
        number = {"value": median, "unit": str(m.get("unit") or "")} if median is not None else None
        if number is not None and not number["unit"]:
            del number["unit"]
        variant = m.get("variant") or {}
        path = _path("memqual", m.get("scenario"), m.get("metric"), *([_variant_text(variant)] if variant else []))
        add(
            "metric",
            str(m["key"]),
            path,
            "DONE",
            number=number,
            duration=_finite(m.get("duration_s")) or None,
            comment=str(m["key"]),
            misc={
                "key": m["key"],
                "better": m.get("better"),
                "unit": m.get("unit"),
                "variant": variant,
                "settings": m.get("settings") or {},
                "samples": m.get("samples"),
                "replicates": len(m.get("replicates") or [m.get("samples")]),
                "summary": summary,
                "claim": m.get("claim"),
            },
        )
    for c in results.get("claims") or []:
        verdict = str(c.get("verdict") or "")
        measured = _finite(c.get("measured"))
        add(
            "claim",
            str(c.get("id")),
            _path("memqual", "claims", c.get("id")),
            CLAIM_STATUS.get(verdict, "MISS"),
            number={"value": measured, "unit": "x"} if measured is not None else None,
            comment=f"{c.get('id')}: {verdict}",
            misc={
                "verdict": verdict,
                "reason": c.get("reason"),
                "evidence": c.get("evidence"),
                "expected": c.get("expected"),
                "published": c.get("published"),
                "ci": c.get("ci"),
                "p_value": c.get("p_value"),
            },
        )
    for index, t in enumerate(run.get("tests") or []):
        name = str(t.get("id") or "?")
        status = AVOCADO_STATUS.get(str(t.get("status")), "ERROR")
        add(
            "e2e",
            f"{name}#{t.get('round', 1)}#{index}",
            _path("memqual", "e2e", re.sub(r"\.py:", ".", re.sub(r"^e2e/", "", name))),
            status,
            duration=_finite(t.get("time")),
            comment=f"{name}: {t.get('status')}",
            misc={"avocado_status": t.get("status"), "reason": t.get("reason"), "round": t.get("round")},
        )
    data = {
        "version": {"major": schema.LATEST.major, "minor": schema.LATEST.minor},
        "checkouts": [checkout],
        "builds": [build],
        "tests": tests,
    }
    validate(data)
    return data


def validate(data: dict[str, Any]) -> None:
    """kcidb-io's validation of the latest schema; a rejection is one line."""
    import jsonschema
    from kcidb_io import schema

    try:
        schema.LATEST.validate(data)
    except jsonschema.exceptions.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        raise ExportInvalid(
            f"KCIDB {schema.LATEST} rejects the export at {where or 'the top'}: {exc.message[:200]}"
        ) from exc

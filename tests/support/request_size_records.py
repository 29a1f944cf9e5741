"""Request-size records of the balloon driver variant, as the report's curve
reads them."""

from __future__ import annotations

import math

from memqual.host.core.record import Measurement

SETTINGS = {"guest_mib": 1024, "target_mib": 256, "machine": "pc", "profile": "full"}


SIZES = {"256 pfns": 256, "1024 pfns": 1024, "1/16 guest": 16384, "whole guest": 262144}


def request_size_records(settings=SETTINGS, with_pfns=True):
    out = []
    for label, pfns in SIZES.items():
        variant = {"per_request": label, **({"pfns": pfns} if with_pfns else {})}
        for metric, base in (("inflate_s", 4.0), ("deflate_s", 1.0)):
            seconds = base + 768 / math.sqrt(pfns) * 0.01
            out.append(
                Measurement(
                    scenario="balloon.request_size",
                    metric=metric,
                    unit="s",
                    better="lower",
                    replicates=[[seconds * f] for f in (0.95, 1.0, 1.1)],
                    samples=[],
                    variant=variant,
                    settings=settings,
                )
            )
    for metric, unit, values in (("per_request_us", "us", [150.0, 180.0, 165.0]), ("per_page_ns", "ns", [3e3] * 3)):
        out.append(
            Measurement(
                scenario="balloon.request_size",
                metric=metric,
                unit=unit,
                better="lower",
                replicates=[[v] for v in values],
                samples=[],
                settings=settings,
            )
        )
    return out

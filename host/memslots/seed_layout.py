"""Seed 000's guest's memslots as a layout file with its miss target.

``layouts/seed-000.json`` holds the slots QEMU registers for
guest_layouts.SEED_000_GUEST (pc, 10 GiB, cirrus, rtl8139), read from its
flat view as e2e/test_memslots_qemu.py test_guest_layouts_recorded reads
them, beside the rtl8139's MMIO BAR (``nic``: in no slot, where the
memslot-miss claim's misses go) and the command that made it
(``made_by``).  ``record`` boots that guest on this machine (TCG is
enough: the flat view is the same) and writes the file; ``load`` reads it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from memqual.host.core.errors import BadInput
from memqual.host.core.jsonfile import read_json
from memqual.host.core.paths import write_private_atomic
from memqual.host.memslots import guest_layouts
from memqual.host.memslots.layout import LAYOUTS_DIR, Layout, from_json
from memqual.host.memslots.qemu_layout import layout_from_flatview, read_qemu

NAME = "seed-000"
PATH = LAYOUTS_DIR / f"{NAME}.json"
MADE_BY = "PYTHONPATH=src .venv/bin/python -m memqual.host.memslots.seed_layout"
# SeaBIOS assigns the BARs before it looks for a boot device: by the time
# the guest answers on SSH the rtl8139's BAR is mapped.
BOOT_TIMEOUT_S = 180.0


@dataclasses.dataclass(frozen=True)
class SeedLayout:
    """The seed guest's slots (registration order = QEMU's id order) and
    its rtl8139's MMIO BAR."""

    layout: Layout
    nic: guest_layouts.NicBar

    @property
    def miss_gfn(self) -> int:
        return self.nic.gfn

    def to_json(self) -> dict[str, Any]:
        return {"made_by": MADE_BY, "config": guest_layouts.SEED_000_GUEST.name, "nic": self.nic.to_json()}


def write(seed: SeedLayout, path: Path = PATH) -> None:
    """The file: its header keys, then one slot a line (diffs stay readable)."""
    head = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in seed.to_json().items())
    slots = ",\n".join("    " + json.dumps(s.to_json()) for s in seed.layout.slots)
    write_private_atomic(path, ("{\n" + head + ',\n  "slots": [\n' + slots + "\n  ]\n}\n").encode(), 0o644)


def parse(data: Any, source: str) -> SeedLayout:
    """A seed layout from a file's JSON: BadInput naming what is wrong."""
    layout = from_json(data, name=NAME, source=source)
    nic = data.get("nic")
    if not isinstance(nic, dict) or not all(isinstance(nic.get(k), int) for k in ("start", "end")):
        raise BadInput(f'{source}: no "nic": {{"model", "start", "end"}} (the rtl8139 BAR the miss goes to)')
    bar = guest_layouts.NicBar(str(nic.get("model", "")), nic["start"], nic["end"])
    if layout.find(bar.gfn) is not None:
        raise BadInput(f"{source}: the NIC BAR at gfn {bar.gfn:#x} lies in a slot: a miss there would hit")
    return SeedLayout(layout, bar)


def load(path: Path = PATH) -> SeedLayout:
    data = read_json(path, "seed layout file", f"make it: {MADE_BY}")
    return parse(data, f"layout file {path.name}")


def record(path: Path = PATH) -> SeedLayout:
    """Boot SEED_000_GUEST's QEMU here, read its flat view, write ``path``."""
    # lazy: the machine brings paramiko; only a boot needs it
    from memqual.host.core.machine import Machine

    config = guest_layouts.SEED_000_GUEST
    with Machine(config.machine_config(), boot_timeout=BOOT_TIMEOUT_S) as vm:
        flat, _dimms = read_qemu(vm)
    nic = guest_layouts.nic_bar(flat, config.nic)
    if nic is None:
        raise BadInput(f"{config.name}: no MMIO BAR of the {config.nic} NIC in the flat view")
    seed = SeedLayout(layout_from_flatview(flat, name=NAME), nic)
    write(seed, path)
    return seed


def main() -> int:
    seed = record()
    print(f"{PATH}: {len(seed.layout)} slots, {seed.nic.model} BAR at gfn {seed.nic.gfn:#x}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Regenerate tests/data/guest-flatviews.json: the flat views of real QEMU
pc guests, the raw input ``guest_layouts.layout_record`` turns into the
memslot-miss claim's records.

Run by hand (not a test): ``.venv/bin/python tests/support/capture_flatviews.py``.
Each configuration is QEMU started with the e2e scenario's own device
arguments (``GuestConfig.extra_args``) and no guest kernel: SeaBIOS maps
every BAR, and the flat view is read over QMP when the firmware is done.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from memqual.host.memslots import guest_layouts as G
from memqual.host.memslots import qemu_layout as Q

OUT = Path(__file__).parents[1] / "data" / "guest-flatviews.json"
BARS = (G.RamBar("mq-vga", "VGA", 16),) + tuple(G.RamBar(f"mq-ivshmem{i}", "ivshmem-plain", 1 << i) for i in range(4))
CONFIGS = (
    G.GuestConfig("pc-plain"),
    G.GuestConfig("pc-rtl8139", nic="rtl8139"),
    G.GuestConfig("pc-ram-bars", bars=BARS),
    G.GuestConfig("pc-rtl8139-ram-bars", bars=BARS, nic="rtl8139"),
    G.GuestConfig("pc-rtl8139-26-dimms", boot_dimms=26, nic="rtl8139"),
    G.GuestConfig("pc-64-dimms", boot_dimms=64),
    G.SEED_000_GUEST,
    # The seed's own 3.5 GiB split: QEMU 7.2's pc-i440fx-1.7 (before the
    # 1 GiB alignment of 1.8; gone from QEMU 9.0) still makes it.
    dataclasses.replace(G.SEED_000_GUEST, name="pc-i440fx-1.7-seed000-guest", machine="pc-i440fx-1.7"),
)


def _qmp(path: str, command: str, arguments: dict | None = None) -> dict:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(path)
        f = s.makefile("rw")
        f.readline()
        for cmd, args in (("qmp_capabilities", None), (command, arguments)):
            f.write(json.dumps({"execute": cmd, **({"arguments": args} if args else {})}) + "\n")
            f.flush()
            while True:
                reply = json.loads(f.readline())
                if "return" in reply or "error" in reply:
                    break
        return reply


def capture(config: G.GuestConfig) -> list[list]:
    with tempfile.TemporaryDirectory() as tmp:
        sock = f"{tmp}/qmp"
        mem = f"{config.ram_mib}"
        if config.boot_dimms:
            mem += f",slots={config.boot_dimms},maxmem={config.ram_mib + config.boot_dimms * G.GUEST_DIMM_MIB}M"
        argv = ["qemu-system-x86_64", "-M", config.machine, "-m", mem]
        argv += ["-display", "none", "-nodefaults", "-serial", "none", "-qmp", f"unix:{sock},server=on,wait=off"]
        argv += list(config.extra_args())
        proc = subprocess.Popen(argv)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    text = _qmp(sock, "human-monitor-command", {"command-line": "info mtree -f"})["return"]
                    ranges = Q.parse_flatview(text)
                    if not config.nic or G.nic_bar(ranges, config.nic):
                        return [[r.start, r.end, r.kind, r.name, r.offset] for r in ranges]
                except (OSError, KeyError):
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{config.name}: no flat view with its BARs in 30 s")
                time.sleep(0.2)
        finally:
            proc.kill()
            proc.wait(timeout=10)


def main() -> None:
    out = {
        "about": "flat views (info mtree -f, address space memory) of real QEMU pc guests; "
        "tests/support/capture_flatviews.py",
        "qemu": subprocess.run(["qemu-system-x86_64", "--version"], capture_output=True, text=True).stdout.split("\n")[
            0
        ],
        "configs": {
            c.name: {"settings": c.settings(), "ranges": capture(c), "config": dataclasses.asdict(c)} for c in CONFIGS
        },
    }
    OUT.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()

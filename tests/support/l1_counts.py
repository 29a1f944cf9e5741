"""What L1 prints of its memslot counters and a guest's /proc/iomem, for
the tests of host/memslots/l1_kinds.py and the windows that read them."""

from __future__ import annotations

IOMEM = """\
00000000-00000fff : Reserved
00001000-0009fbff : System RAM
000a0000-000bffff : PCI Bus 0000:00
000c0000-000c8bff : Video ROM
00100000-bffdffff : System RAM
  01000000-01ffffff : Kernel code
100000000-2bfffffff : System RAM
"""
RAM = ((1, 160), (256, 786400), (1048576, 2883584))


def reading_text(search: str, slots: list[tuple[int, int, int, int, int]], misses: int = 5) -> str:
    """L1's READ_SCRIPT output: ``slots`` as (id, base, npages, hits, hit_nodes)."""
    hits = sum(s[3] for s in slots)
    nodes = sum(s[4] for s in slots) + misses * 9
    head = (
        f"memslot_lookups {hits + misses}\nmemslot_nodes {nodes}\nmemslot_misses {misses}\n"
        f"memslot_miss_nodes {misses * 9}\nmemslot_search {search}\nslots\n"
    )
    return head + "".join(f"321 0 {i} {b} {n} {h} {hn}\n" for i, b, n, h, hn in slots)

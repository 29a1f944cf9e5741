"""A guest kernel's symbols read from the kernel itself: its kallsyms
tables, found by their shape (the token table, the names with their
markers, the addresses from a relative base, in the layouts of 6.1 and of
6.4 on), each part checked against the next; tables that do not fit are
one ``BadInput`` line, never a wrong name.  For naming where a stuck
guest's vCPU was (host/core/stuck.py).  Why not System.map, and the
layouts: docs/host-under-test.md, "A guest that stops answering"."""

from __future__ import annotations

import bisect
import dataclasses
import struct
from pathlib import Path

from memqual.host.core import bounded
from memqual.host.core.errors import BadInput

# The largest kernel read (as images/kernel.py's VMLINUX_MAX).
KERNEL_MAX = 256 << 20
ELF_MAGIC = b"\x7fELF"
# A kernel has tens of thousands of symbols; more than this is no count.
MIN_SYMBOLS, MAX_SYMBOLS = 1000, 2_000_000
# How far before the token table kallsyms_num_syms may lie: past every
# name (about 2.5 MB for 6.12's 200,000 symbols) and the tables between.
NAMES_REACH = 24 << 20
# The symbol types of code: T/t text (kallsyms gives weak code T too).
TEXT_TYPES = frozenset(b"Tt")
# What the first letter of an entry is (nm's types), and its name's bytes.
SYMBOL_TYPES = frozenset(bytes([c]) for c in b"AaBbDdGgRrSsTtVvWwNnUu")
NAME_BYTES = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.$"
_DIGITS = b"".join(bytes([c]) + b"\0" for c in b"0123456789")
# The kernel's own base: every symbol of x86-64's kernel image lies above.
KERNEL_BASE = 0xFFFFFFFF80000000


@dataclasses.dataclass(frozen=True)
class SymbolMap:
    """The symbols of one kernel, sorted by address; only code is named."""

    source: str
    addresses: tuple[int, ...]
    names: tuple[str, ...]
    code: tuple[bool, ...]
    by_name: dict[str, int]

    @classmethod
    def of(cls, source: str, symbols: list[tuple[int, int, str]]) -> SymbolMap:
        """From (address, type letter, name) triples (``read_kallsyms``)."""
        triples = sorted(symbols)
        by_name: dict[str, int] = {}
        for address, _, name in triples:
            by_name.setdefault(name, address)
        return cls(
            source,
            tuple(a for a, _, _ in triples),
            tuple(n for _, _, n in triples),
            tuple(t in TEXT_TYPES for _, t, _ in triples),
            by_name,
        )

    def name(self, address: int, offset: int = 0) -> str | None:
        """``symbol+0xoff`` for an address in the kernel's code (the running
        kernel's, ``offset`` its KASLR shift); None elsewhere: before the
        first symbol, past the last, or in data."""
        linked = address - offset
        at = bisect.bisect_right(self.addresses, linked) - 1
        if at < 0 or at >= len(self.addresses) - 1 or not self.code[at]:
            return None
        return f"{self.names[at]}+{linked - self.addresses[at]:#x}"

    def address(self, name: str) -> int | None:
        return self.by_name.get(name)


def of_kernel(path: Path) -> SymbolMap:
    """The text symbols of the kernel at ``path``: an ELF vmlinux (what a
    guest image boots through PVH) or a bzImage."""
    remedy = "rebuild the guest image ('memqual image build --force')"
    data = bounded.read_file(path, KERNEL_MAX, "kernel", remedy)
    if not data.startswith(ELF_MAGIC):
        from memqual.images.kernel import extract_vmlinux

        vmlinux = extract_vmlinux(path)
        if vmlinux is None:
            raise BadInput(f"{path}: no vmlinux inside to read symbols from")
        data = vmlinux
    return SymbolMap.of(str(path), read_kallsyms(data))


def read_kallsyms(data: bytes) -> list[tuple[int, int, str]]:
    """Every (address, type, name) of the kallsyms tables in ``data``."""
    try:
        for table, index, index_at in _token_tables(data):
            tokens = [data[table + o : data.index(b"\0", table + o)] for o in index]
            names = _names(data, table, tokens)
            if names is None:
                continue
            count_at, entries = names
            addresses = _addresses(data, count_at, index_at + 512, len(entries))
            if addresses is None:
                continue
            pairs = zip(addresses, entries, strict=True)
            return [(a, e[0], e[1:].decode("ascii", errors="replace")) for a, e in pairs]
    except (ValueError, struct.error) as exc:
        # a table cut short by the end of the file: no tables, not a crash
        raise BadInput(f"the kernel's kallsyms tables run past its end ({exc})") from None
    raise BadInput("the kernel holds no kallsyms tables memqual can read (CONFIG_KALLSYMS off?)")


def _u16s(data: bytes, at: int, n: int) -> tuple[int, ...]:
    return struct.unpack_from(f"<{n}H", data, at)


def _u32(data: bytes, at: int) -> int:
    return int(struct.unpack_from("<I", data, at)[0])


def _token_tables(data: bytes) -> list[tuple[int, tuple[int, ...], int]]:
    """(start, index, where the index is) of each place that has a token
    table's shape."""
    found = []
    at = data.find(_DIGITS)
    while at != -1:
        end = at
        for _ in range(256 - ord("0")):
            end = data.index(b"\0", end) + 1
        for pad in range(8):
            if end + pad + 512 > len(data):
                break
            index = _u16s(data, end + pad, 256)
            start = at - index[ord("0")]
            if (
                index[0] == 0
                and start >= 0
                and all(b > a for a, b in zip(index, index[1:], strict=False))
                and all(data[start + o - 1] == 0 for o in index[1:])
                and start + index[255] < end
            ):
                found.append((start, index, end + pad))
                break
        at = data.find(_DIGITS, at + 1)
    return found


def _decode(data: bytes, at: int, count: int, tokens: list[bytes]) -> tuple[list[bytes], list[int], int] | None:
    """``count`` name entries from ``at``, the offset of every 256th from
    ``at`` (what the markers hold), and where they end; None when they do
    not look like names."""
    out: list[bytes] = []
    every: list[int] = []
    start = at
    for n in range(count):
        if n % 256 == 0:
            every.append(at - start)
        if at >= len(data):
            return None
        length = data[at]
        at += 1
        if length & 0x80:  # a long name: its length in two bytes
            length = (length & 0x7F) | data[at] << 7
            at += 1
        if length == 0:
            return None
        entry = b"".join(tokens[b] for b in data[at : at + length])
        if n < 64 and not _looks_like_symbol(entry):
            return None
        out.append(entry)
        at += length
    return out, every, at


def _looks_like_symbol(entry: bytes) -> bool:
    """A type letter, then a C identifier (with the dots and dollars
    compilers add), no longer than the kernel allows (KSYM_NAME_LEN)."""
    return 1 < len(entry) <= 512 and entry[:1] in SYMBOL_TYPES and entry[1:].translate(None, NAME_BYTES) == b""


def _names(data: bytes, table: int, tokens: list[bytes]) -> tuple[int, list[bytes]] | None:
    """Where kallsyms_num_syms is and the decoded entries: the count whose
    entries end where markers begin that agree with them."""
    low = max(0, table - NAMES_REACH)
    for at in range((table - 4) & ~3, low, -4):
        count = _u32(data, at)
        if not MIN_SYMBOLS <= count <= MAX_SYMBOLS:
            continue
        for gap in (4, 8):
            decoded = _decode(data, at + gap, count, tokens)
            if decoded is None:
                continue
            entries, every, end = decoded
            if _markers_agree(data, end, every):
                return at, entries
    return None


def _markers_agree(data: bytes, end: int, every: list[int]) -> bool:
    """Do markers follow the names (after their alignment), each the
    offset of its 256th entry?"""
    for pad in range(0, 8, 4):
        markers = ((end + 3) & ~3) + pad
        if markers + 4 * len(every) <= len(data):
            if list(struct.unpack_from(f"<{len(every)}I", data, markers)) == every:
                return True
    return False


def _addresses(data: bytes, count_at: int, index_end: int, count: int) -> list[int] | None:
    """The symbols' addresses: offsets from a relative base, before the
    count (up to 6.3) or after the token index (6.4 on)."""
    places = []
    for base_at in (count_at - 8, count_at - 16):
        places += [(base_at - 4 * count, base_at), (base_at - 4 * count - 4, base_at)]
    for gap in (0, 4):
        start = index_end + gap
        for pad in (0, 4):
            places.append((start, start + 4 * count + pad))
    for start, base_at in places:
        if start < 0 or base_at + 8 > len(data):
            continue
        base = int(struct.unpack_from("<Q", data, base_at)[0])
        if base < KERNEL_BASE:
            continue
        offsets = struct.unpack_from(f"<{count}i", data, start)
        for addresses in (
            # x86-64 with absolute per-CPU symbols: a positive offset is the
            # address itself, a negative n is base - 1 - n
            [o if o >= 0 else base - 1 - o for o in offsets],
            # elsewhere every offset is unsigned, from the base
            [base + (o & 0xFFFFFFFF) for o in offsets],
        ):
            text = [a for a in addresses if a >= KERNEL_BASE]
            if len(text) > count // 2 and all(b >= a for a, b in zip(text, text[1:], strict=False)):
                return addresses
    return None

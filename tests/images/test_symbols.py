"""images/symbols.py: a kernel's kallsyms tables found by their shape, in
both layouts the kernels memqual boots have, and refused when they do not
fit.  The tables here are built the way scripts/kallsyms lays them out;
e2e/test_host_under_test.py reads the real guest kernels'."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from memqual.host.core.errors import BadInput
from memqual.images import symbols

BASE = 0xFFFFFFFF81000000
COUNT = 1500


def _symbols(absolute_percpu: bool = True) -> list[tuple[int, str]]:
    """Per-CPU symbols first (absolute, small: x86-64's), then code, then data."""
    out = [(0x0, "Afixed_percpu_data"), (0x1000, "Acpu_debug_store")] if absolute_percpu else []
    out += [(BASE + 0x40 * i, f"Tfunc_{i:04d}") for i in range(COUNT)]
    out[len(out) - COUNT + 10] = (BASE + 0x40 * 10, "Tasm_exc_divide_error")
    out += [(BASE + 0x40 * COUNT + 0x1000, "Dsome_data"), (BASE + 0x40 * COUNT + 0x2000, "Bmore_data")]
    return out


def _tokens() -> list[bytes]:
    """A token table: every byte a name uses is a token of its own at its
    own code (so the digits follow each other); the other codes hold
    longer tokens, as the compressor's would."""
    return [bytes([c]) if 0x21 <= c < 0x7F else b"_%02x" % c for c in range(256)]


def _align(blob: bytearray, to: int) -> None:
    while len(blob) % to:
        blob.append(0)


def _names(entries: list[str]) -> tuple[bytes, list[int]]:
    names = bytearray()
    markers = []
    for n, entry in enumerate(entries):
        if n % 256 == 0:
            markers.append(len(names))
        encoded = entry.encode()
        names.append(len(encoded))
        names += encoded  # every character its own token
    return bytes(names), markers


def _token_table(tokens: list[bytes]) -> tuple[bytes, bytes]:
    table = bytearray()
    index = []
    for token in tokens:
        index.append(len(table))
        table += token + b"\0"
    return bytes(table), struct.pack("<256H", *index)


def kallsyms_blob(layout: str, absolute_percpu: bool = True) -> bytes:
    """``layout`` "6.1": offsets, base and count before the names, the
    names' sequence table before the tokens (Debian's 6.1.192); "6.4":
    count, names, markers, tokens, then offsets and base (6.4 on).  With
    ``absolute_percpu`` (x86-64) an offset >= 0 is an address and a
    negative one counts down from the base; else each is unsigned, from it."""
    syms = _symbols(absolute_percpu)
    if absolute_percpu:
        offsets = [a if a < BASE else BASE - 1 - a for a, _ in syms]
    else:
        offsets = [a - BASE - (1 << 32 if a - BASE >= 1 << 31 else 0) for a, _ in syms]
    names, markers = _names([n for _, n in syms])
    table, index = _token_table(_tokens())
    blob = bytearray(b"\x7fELF" + b"\xaa" * 60)  # some of the kernel before the tables
    if layout == "6.1":
        blob += struct.pack(f"<{len(syms)}i", *offsets)
        _align(blob, 8)
        blob += struct.pack("<Q", BASE)
        blob += struct.pack("<I", len(syms))
        _align(blob, 8)
        blob += names
        _align(blob, 4)
        blob += struct.pack(f"<{len(markers)}I", *markers)
        blob += bytes(3 * len(syms))  # kallsyms_seqs_of_names
        _align(blob, 8)
        blob += table
        _align(blob, 8)
        blob += index
    else:
        blob += struct.pack("<I", len(syms))
        _align(blob, 8)
        blob += names
        _align(blob, 8)
        blob += struct.pack(f"<{len(markers)}I", *markers)
        _align(blob, 8)
        blob += table
        _align(blob, 8)
        blob += index
        _align(blob, 8)
        blob += struct.pack(f"<{len(syms)}i", *offsets)
        _align(blob, 8)
        blob += struct.pack("<Q", BASE)
    blob += b"\x55" * 64
    return bytes(blob)


@pytest.mark.parametrize("layout", ["6.1", "6.4"])
@pytest.mark.parametrize("absolute_percpu", [True, False])
def test_every_symbol_is_read_back_with_its_address_and_type(layout: str, absolute_percpu: bool) -> None:
    read = symbols.read_kallsyms(kallsyms_blob(layout, absolute_percpu))
    assert [(a, chr(t) + n) for a, t, n in read] == _symbols(absolute_percpu)


@pytest.mark.parametrize("layout", ["6.1", "6.4"])
def test_only_code_is_named_and_names_carry_their_offset(layout: str, tmp_path: Path) -> None:
    kernel = tmp_path / "kernel"
    kernel.write_bytes(kallsyms_blob(layout))
    found = symbols.of_kernel(kernel)
    assert found.address("asm_exc_divide_error") == BASE + 0x40 * 10
    assert found.name(BASE + 0x40 * 3 + 0x11) == "func_0003+0x11"
    assert found.name(BASE + 0x40 * 3, offset=0x200000) is None, "below the first symbol once shifted"
    assert found.name(BASE + 0x200000 + 0x40 * 3 + 4, offset=0x200000) == "func_0003+0x4"
    assert found.name(BASE + 0x40 * COUNT + 0x1008) is None, "an address in data is not named"
    assert found.name(0x1000) is None, "nor a per-CPU one"


def test_tables_that_do_not_agree_are_refused_not_guessed() -> None:
    """A marker off by one: the names no longer fit their markers, and
    nothing is read rather than names at the wrong addresses."""
    blob = bytearray(kallsyms_blob("6.4"))
    second_marker = _names([n for _, n in _symbols()])[1][1]
    names_end = blob.find(b"\0" * 4, blob.find(b"Tfunc_1499"))
    at = blob.find(struct.pack("<I", second_marker), names_end)
    assert at > 0
    blob[at] ^= 1
    with pytest.raises(BadInput, match="no kallsyms tables"):
        symbols.read_kallsyms(bytes(blob))
    with pytest.raises(BadInput, match="no kallsyms tables"):
        symbols.read_kallsyms(b"\x7fELF" + b"\0" * 4096)


def test_tables_cut_short_by_the_file_s_end_are_one_line_not_a_crash() -> None:
    """The token table's digits with nothing after them: the walk to its
    end runs out of file (a ValueError inside), said as BadInput."""
    with pytest.raises(BadInput, match="kallsyms"):
        symbols.read_kallsyms(b"\x7fELF" + b"".join(bytes([c]) + b"\0" for c in b"0123456789") + b"ab")
    whole = kallsyms_blob("6.4")
    with pytest.raises(BadInput, match="kallsyms"):
        symbols.read_kallsyms(whole[: whole.find(b"Tfunc_1499") + 3])


def test_a_kernel_that_is_no_elf_and_holds_no_vmlinux_is_one_line(tmp_path: Path) -> None:
    kernel = tmp_path / "bzImage"
    kernel.write_bytes(b"MZ" + b"\0" * 1024)
    with pytest.raises(BadInput):
        symbols.of_kernel(kernel)

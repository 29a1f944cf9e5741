"""What a /dev/kvm benchmark's VM holds: the guest program (flat 32-bit
code that touches each slot and reports through an OUT), the slots'
geometry (where each of N one-page slots sits, below 4 GiB), and the
reference model's walk of the same layout.  docs/memslots-kvm.md, "How
host/memslots/kvm_bench.py measures".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from memqual.host.core import kvm as K
from memqual.host.core.errors import BadInput
from memqual.host.memslots import model as memslot_model
from memqual.host.memslots.layout import Layout, Slot
from memqual.host.memslots.structures import balanced_bound

PAGE = K.PAGE_SIZE
REPORT_PORT = 0x0501  # the guest reports its access count with OUT to this port
GPA_CEILING = 1 << 32  # every slot stays below 4 GiB (flat 32-bit addressing)


# --- the guest program ------------------------------------------------------------
# Flat 32-bit protected mode, no paging, interrupts off.  Inputs in registers
# (set with KVM_SET_REGS before each pass): ESI = first address, ECX = number
# of accesses, EDI = stride in bytes.  Each access writes the running count
# (1, 2, 3...) as a 32-bit word, so the host can tell which access reached
# which page and the MMIO exits carry their sequence number.
# The listing below is the program: machine code in hex, the assembly, and
# after ";" why; "label:" lines only name the offset that follows.
GUEST_LISTING = """
    31 db          xor ebx, ebx                  ; ebx = accesses done
loop:  (offset 2)
    85 c9          test ecx, ecx                 ; any access left?
    74 08          je done (+8 -> offset 14)     ; no: report
    43             inc ebx                       ; count this access (first access writes 1)
    89 1e          mov [esi], ebx                ; the access: fault + slot lookup, or an MMIO exit
    01 fe          add esi, edi                  ; next page
    49             dec ecx
    eb f4          jmp loop (-12 -> offset 2)
done:  (offset 14)
    89 d8          mov eax, ebx                  ; the count to report
    66 ba 01 05    mov dx, 0x501                 ; REPORT_PORT
    ef             out dx, eax                   ; KVM_EXIT_IO with the count
halt:  (offset 21)
    f4             hlt                           ; KVM_EXIT_HLT (no in-kernel irqchip: HLT exits to us)
    eb fd          jmp halt (-3 -> offset 21)    ; never run on
"""


def _assemble(listing: str) -> list[tuple[bytes, str, str]]:
    """(bytes, assembly, why) per instruction line of a listing."""
    program = []
    for line in listing.splitlines():
        if not line.startswith(" "):  # blank, or a label
            continue
        text, _, why = line.partition(";")
        code, asm = re.split(r"\s{2,}", text.strip(), maxsplit=1)
        program.append((bytes.fromhex(code), asm.strip(), why.strip()))
    return program


GUEST_PROGRAM = _assemble(GUEST_LISTING)
GUEST_CODE = b"".join(code for code, _, _ in GUEST_PROGRAM)
GUEST_ENTRY = 0x0


# --- geometry -------------------------------------------------------------------
@dataclass(frozen=True)
class SlotGeometry:
    """Where slot i lives in guest-physical and host memory (see module doc)."""

    n: int
    slot_pages: int = 1

    @property
    def stride(self) -> int:
        return (self.slot_pages + 1) * PAGE

    def touch_gpa(self, i: int) -> int:
        return PAGE + i * self.stride

    def slot_gpa(self, i: int) -> int:
        return 0 if i == 0 else self.touch_gpa(i)

    def slot_size(self, i: int) -> int:
        return (self.slot_pages + (1 if i == 0 else 0)) * PAGE

    def gap_gpa(self, i: int) -> int:
        return self.touch_gpa(i) + self.slot_pages * PAGE

    def touch_host_offset(self, i: int) -> int:
        return (1 + i * self.slot_pages) * PAGE

    def slot_host_offset(self, i: int) -> int:
        return 0 if i == 0 else self.touch_host_offset(i)

    @property
    def host_size(self) -> int:
        return (1 + self.n * self.slot_pages) * PAGE

    @property
    def top_gpa(self) -> int:
        """First guest-physical byte above the layout (moves go up one page
        and stay below it)."""
        return PAGE + self.n * self.stride

    def check(self) -> None:
        if self.n < 1:
            raise BadInput(f"slot count {self.n} is not positive: give at least 1 slot")
        if self.slot_pages < 1:
            raise BadInput(f"--slot-pages {self.slot_pages} is not positive: give at least 1")
        if self.top_gpa > GPA_CEILING:
            raise BadInput(
                f"{self.n} slots of {self.slot_pages} pages reach {self.top_gpa:#x}, above 4 GiB: "
                "use fewer pages per slot (--slot-pages) so the 32-bit guest reaches every slot"
            )


# --- model ------------------------------------------------------------------------
def balanced_tree_nodes(n: int) -> tuple[int, str]:
    """Nodes a balanced binary search tree over n slots examines on a miss,
    ceil(log2(n + 1)), and where the figure came from."""
    return int(balanced_bound(n)), "memqual.host.memslots.structures.balanced_bound"


MODEL_STRUCTURE = "rbtree"  # today's kernel: gfn-keyed balanced tree (2021)
MODEL_SAMPLE = 4096  # lookups per pattern fed to the model (evenly spaced)


def model_walk(geo: SlotGeometry) -> dict[str, Any]:
    """The reference model run on this exact layout and access pattern:
    mean and worst nodes examined by the kernel-like tree for the touch
    pass (a hit in a different slot each time) and the MMIO pass (a
    complete miss each time).  A wrong answer (ModelDisagreement) or any
    other error is a bug and propagates as a failure."""
    layout = Layout(
        tuple(Slot(i, geo.slot_gpa(i) // PAGE, geo.slot_size(i) // PAGE) for i in range(geo.n)),
        name=f"kvm-bench-{geo.n}",
    )
    step = max(1, geo.n // MODEL_SAMPLE)
    picks = range(0, geo.n, step)
    out: dict[str, Any] = {
        "source": f"memqual.host.memslots.model.run_structure ({MODEL_STRUCTURE})",
        "lookups": len(picks),
    }
    for name, gpa in (("touch", geo.touch_gpa), ("mmio", geo.gap_gpa)):
        gfns = [gpa(i) // PAGE for i in picks]
        # run_structure checks every answer against the layout (the
        # oracle): a touch must hit its slot, a gap frame must miss.
        stats = memslot_model.run_structure(MODEL_STRUCTURE, layout, gfns, memslot_model.oracle(layout, gfns))
        out[f"{name}_nodes_mean"] = stats.mean_nodes
        out[f"{name}_nodes_max"] = stats.max_nodes
    return out

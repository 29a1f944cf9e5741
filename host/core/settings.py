"""Every MEMQUAL_* environment variable memqual reads, in one place, each
with a typed accessor (docs/setup-and-tests.md, "Environment variables", lists them).
``memqual run`` passes the scenarios' parameters to Avocado's tests this
way; the rest are a user's or a test's overrides.  Reads the environment
when asked (never cached, so a changed variable takes effect at once) and
checks nothing beyond the type: what a value must name is its user's check.
"""

from __future__ import annotations

import os
from pathlib import Path

from memqual.host.core.errors import BadInput

# What the scenarios read, set by `memqual run` (host/run/avocado.py) or an
# arm's variant (e2e/base.py)
PROFILE = "MEMQUAL_PROFILE"  # quick, full or ab (host/core/profiles.py)
GUEST_KERNEL = "MEMQUAL_GUEST_KERNEL"  # a bzImage instead of Debian's
GUEST_MODULES = "MEMQUAL_GUEST_MODULES"  # its lib/modules/RELEASE
GUEST_KERNEL_BUILD = "MEMQUAL_GUEST_KERNEL_BUILD"  # the tree it was built in (the balloon driver variant)
GUEST_CMDLINE_EXTRA = "MEMQUAL_GUEST_CMDLINE_EXTRA"  # appended to every guest's kernel command line
RUN_LABEL = "MEMQUAL_RUN_LABEL"  # A or B in an A/B run
HOST_KERNEL = (
    "MEMQUAL_HOST_KERNEL"  # the host under test's kernel, KERNEL[:CMDLINE] (--host-kernel; host/core/nested.py)
)
HOST_KERNEL_PARAMS = "MEMQUAL_HOST_KERNEL_PARAMS"  # its KVM's module parameters, space-separated
QEMU = "MEMQUAL_QEMU"  # the QEMU binary (--qemu; a patched build, or a test's fake)
CLOCK = "MEMQUAL_CLOCK"  # wall or icount:SHIFT (--clock; host/core/clock.py)
BOOT_SEED = "MEMQUAL_BOOT_SEED"  # icount: the guests' RNG seed (an A/B block's number; host/core/clock.py)
LAB_HOST = "MEMQUAL_LAB_HOST"  # the lab host a fleet task runs on (host/run/hosts/)
# A user's or a test's overrides
AVOCADO = "MEMQUAL_AVOCADO"  # another avocado executable (the tests' fake)
CACHE = "MEMQUAL_CACHE"  # the cache directory (default $XDG_CACHE_HOME/memqual)
SOCKET_DIR = "MEMQUAL_SOCKET_DIR"  # where sockets go (default /tmp; keep the path short)
STATE_DIR = "MEMQUAL_STATE_DIR"  # where host knobs are saved before a change (default /run/memqual)
WARM = "MEMQUAL_WARM"  # 0: every guest boots cold
COLD_MEASURING = "MEMQUAL_COLD_MEASURING"  # 1: every guest of a measuring test boots cold (memqual run sets it)
DEBUG = "MEMQUAL_DEBUG"  # set: a traceback instead of one line
OUTPUT_DIR = "MEMQUAL_OUTPUT_DIR"  # where an e2e test run by pytest writes its records
KSM_PAGES_TO_SCAN = "MEMQUAL_KSM_PAGES_TO_SCAN"  # the volatile scan's pages_to_scan
BUILD_USER = "MEMQUAL_BUILD_USER"  # the unprivileged user kernels are built as (default nobody)
KBUILD_DIR = "MEMQUAL_KBUILD_DIR"  # root's folder of kernel build folders (default /var/tmp/memqual-kbuild)

# Passed on to a lab host's tasks as they are (host/run/hosts/fleet.py).
FORWARDED_TO_LAB_HOSTS = (WARM, KSM_PAGES_TO_SCAN, CLOCK)
# Set per arm by `memqual run`; cleared where an arm has none.
PER_ARM = (
    GUEST_KERNEL,
    GUEST_MODULES,
    GUEST_KERNEL_BUILD,
    RUN_LABEL,
    GUEST_CMDLINE_EXTRA,
    HOST_KERNEL,
    HOST_KERNEL_PARAMS,
)


def text(name: str) -> str | None:
    """The variable's value, None when unset or empty."""
    return os.environ.get(name) or None


def path(name: str) -> Path | None:
    value = text(name)
    return Path(value) if value else None


def put(name: str, value: str | None) -> None:
    """Set the variable for this process and its children (None: unset)."""
    if value:
        os.environ[name] = value
    else:
        os.environ.pop(name, None)


def profile() -> str | None:
    return text(PROFILE)


def qemu() -> str | None:
    return text(QEMU)


def boot_seed(default: int) -> int:
    """$MEMQUAL_BOOT_SEED as a whole number, else ``default``."""
    value = text(BOOT_SEED)
    if value is None or not value.strip():
        return default
    try:
        return int(value)
    except ValueError:
        raise BadInput(f"{BOOT_SEED}={value!r}: give a whole number") from None


def clock() -> str | None:
    return text(CLOCK)


def host_kernel() -> str | None:
    return text(HOST_KERNEL)


def host_kernel_params() -> list[str]:
    return (text(HOST_KERNEL_PARAMS) or "").split()


def guest_kernel() -> str | None:
    return text(GUEST_KERNEL)


def guest_modules() -> str | None:
    return text(GUEST_MODULES)


def guest_kernel_build() -> str | None:
    return text(GUEST_KERNEL_BUILD)


def guest_cmdline_extra() -> str:
    return (os.environ.get(GUEST_CMDLINE_EXTRA) or "").strip()


def avocado() -> str | None:
    return text(AVOCADO)


def cache() -> Path | None:
    return path(CACHE)


def socket_dir() -> str:
    return text(SOCKET_DIR) or "/tmp"


def state_dir() -> Path | None:
    return path(STATE_DIR)


def warm_starts() -> bool:
    """False when MEMQUAL_WARM=0 (every start cold, e.g. to time the difference)."""
    return os.environ.get(WARM) != "0"


def cold_measuring() -> bool:
    """True when MEMQUAL_COLD_MEASURING=1: a test that measures boots every
    guest cold (``memqual run`` sets it: its results are compared)."""
    return os.environ.get(COLD_MEASURING) == "1"


def debug() -> bool:
    return bool(os.environ.get(DEBUG))


def output_dir() -> Path | None:
    return path(OUTPUT_DIR)


def ksm_pages_to_scan(default: int) -> int:
    """MEMQUAL_KSM_PAGES_TO_SCAN as a count (a bad value is a ValueError)."""
    value = text(KSM_PAGES_TO_SCAN)
    return int(value) if value else default


def build_user() -> str | None:
    return text(BUILD_USER)


def kbuild_dir() -> Path | None:
    return path(KBUILD_DIR)


def forwarded_to_lab_hosts() -> dict[str, str]:
    return {name: os.environ[name] for name in FORWARDED_TO_LAB_HOSTS if name in os.environ}

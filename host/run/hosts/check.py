"""``memqual hosts check FILE``: for each lab host, is it reachable, does it
have memqual in the same version, QEMU and a KVM that boots Linux (its own
``memqual doctor --json``), and is it free (no other memqual holding its
measurement lock)?  The same probe decides, at the start of ``memqual run
--hosts``, which hosts take part.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import re
import subprocess
from collections.abc import Callable
from typing import Any, TypeVar

from memqual.host.core.printable import one_line
from memqual.host.run.hosts import ssh
from memqual.host.run.hosts.config import LabHost
from memqual.host.run.hosts.probe import HostProbe, memqual_version

T = TypeVar("T")
PROBE_TIMEOUT_S = 60.0
# The doctor boots a guest under KVM once per host (15 s deadline) and
# caches the answer.
DOCTOR_TIMEOUT_S = 120.0
# A probe asked for a QEMU version may fetch it first (13 MB from the
# host's mirror, its apt lists refreshed): about 10 s here.
QEMU_PROBE_TIMEOUT_S = 300.0
# What a host may answer as its QEMU's binary: an absolute path of the
# characters of Debian package versions and ordinary paths, nothing a
# shell, ssh or Avocado's config reads as syntax.
# A probe or doctor answer nests four or five levels deep; results files
# are held to 64 (host/core/jsonfile.py).
MAX_ANSWER_DEPTH = 64
QEMU_PATH = re.compile(r"/[A-Za-z0-9_.+~/-]{1,400}")


@dataclasses.dataclass(frozen=True)
class HostCheck:
    host: LabHost
    problem: str  # "" when memqual can run there
    probe: HostProbe | None = None
    doctor: dict[str, Any] | None = None

    @property
    def usable(self) -> bool:
        return not self.problem

    @property
    def free(self) -> bool:
        return self.probe is not None and self.probe.lock_free

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host.name,
            "address": self.host.address,
            "usable": self.usable,
            "problem": self.problem,
            "probe": self.probe.to_json() if self.probe else None,
            "doctor": self.doctor,
        }


def memqual_argv(host: LabHost, *args: str) -> list[str]:
    return [f"{host.checkout}/.venv/bin/memqual", *args]


def probe_host(host: LabHost, timeout_s: float = PROBE_TIMEOUT_S, qemu: str | None = None) -> HostCheck:
    """Reach ``host`` and ask its memqual (``memqual hosts probe``).  With
    ``qemu`` the host makes that QEMU its own first (fetching a version
    into its cache): a host that cannot have it is not usable, and the
    binary it answers must be a plain absolute path (it becomes the host's
    tasks' $MEMQUAL_QEMU)."""
    argv = memqual_argv(host, "hosts", "probe", *(["--qemu", qemu] if qemu else []))
    if qemu and timeout_s == PROBE_TIMEOUT_S:
        timeout_s = QEMU_PROBE_TIMEOUT_S
    try:
        result = ssh.run(host, argv, timeout_s)
    except subprocess.TimeoutExpired:
        return HostCheck(host, f"no answer within {timeout_s:.0f} s")
    if result.returncode == 255:
        return HostCheck(host, f"unreachable: {ssh.ssh_error(result)}")
    if result.returncode == 127:
        return HostCheck(host, f"no memqual at {host.checkout}/.venv/bin/memqual: run ./setup there")
    if result.returncode != 0:
        return HostCheck(host, f"memqual hosts probe exited {result.returncode}: {ssh.ssh_error(result)}")
    try:
        probe = HostProbe.from_json(answer(result.stdout))
    except (ValueError, KeyError, TypeError) as exc:
        return HostCheck(host, f"memqual there gave no probe answer ({one_line(exc)[:200]})")
    mine = memqual_version()
    if probe.version != mine:
        return HostCheck(host, f"memqual {probe.version} there, {mine} here: install the same version", probe)
    if qemu:
        if probe.qemu_problem:
            return HostCheck(host, f"cannot have QEMU {qemu}: {probe.qemu_problem}", probe)
        if not QEMU_PATH.fullmatch(probe.qemu_binary):
            return HostCheck(
                host, f"its QEMU {qemu} answered as {probe.qemu_binary[:80]!r}, not a plain absolute path", probe
            )
    return HostCheck(host, "", probe)


def doctor(
    host: LabHost, timeout_s: float = DOCTOR_TIMEOUT_S, qemu: str | None = None
) -> tuple[dict[str, Any] | None, str]:
    """The host's own ``memqual doctor --json`` (``--qemu``: of that QEMU,
    which the host fetches into its own cache), or the problem."""
    try:
        result = ssh.run(host, memqual_argv(host, "doctor", "--json", *(["--qemu", qemu] if qemu else [])), timeout_s)
    except subprocess.TimeoutExpired:
        return None, f"memqual doctor gave no answer within {timeout_s:.0f} s"
    if result.returncode != 0:
        return None, f"memqual doctor exited {result.returncode}: {ssh.ssh_error(result)}"
    try:
        return answer(result.stdout), ""
    except ValueError as exc:
        return None, f"memqual doctor gave no usable answer ({one_line(exc)[:200]})"


def answer(text: str) -> dict[str, Any]:
    """A host's JSON answer (probe, doctor) as a dict, or ValueError: what a
    host sends is read as strictly as a results file, so no answer of one
    host can raise past its own check (RecursionError) and end the run for
    every host, and none nests deeper than memqual's own files."""
    try:
        data = json.loads(text)
    except RecursionError:
        raise ValueError(f"nested deeper than {MAX_ANSWER_DEPTH} levels") from None
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > MAX_ANSWER_DEPTH:
                raise ValueError(f"nested deeper than {MAX_ANSWER_DEPTH} levels")
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))
    return data


def check_host(host: LabHost, qemu: str | None = None) -> HostCheck:
    """Probe ``host`` and run its doctor, of its own QEMU or of ``qemu``
    (a version of the archive, or a path on that host)."""
    checked = probe_host(host)
    if not checked.usable:
        return checked
    report, problem = doctor(host, qemu=qemu)
    if report is None:
        return dataclasses.replace(checked, problem=problem)
    if not report.get("qemu_version") or report.get("qemu_version") == "missing":
        problem = f"no QEMU {qemu} there" if qemu else "no QEMU: install qemu-system-x86 there"
    elif checked.probe is not None and not checked.probe.lock_free:
        holder = checked.probe.lock_holder
        problem = f"busy: pid {holder or '?'} there holds the measurement lock {checked.probe.lock_path}"
    return dataclasses.replace(checked, problem=problem, doctor=report)


def for_each(hosts: list[LabHost], check: Callable[[LabHost], T]) -> list[T]:
    """``check(host)`` for every host at once; in the hosts file's order."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(16, len(hosts)))) as pool:
        return list(pool.map(check, hosts))


def kvm_text(report: dict[str, Any] | None) -> str:
    if not report:
        return "?"
    if report.get("kvm_boots_linux"):
        return "KVM boots Linux"
    detail = report.get("kvm_boot_detail") or ("no /dev/kvm" if not report.get("kvm_device") else "")
    return f"no KVM for Linux guests (TCG): {detail}"


def lines(checks: list[HostCheck]) -> list[str]:
    """One line per host for the terminal."""
    out = []
    for c in checks:
        head = f"{c.host.name} ({c.host.destination}:{c.host.port})"
        if c.probe is None:
            out.append(f"{head}: NOT READY: {c.problem}")
            continue
        facts = [
            f"memqual {c.probe.version}",
            f"kernel {c.probe.environment.get('host_kernel', '?')}",
            f"QEMU {c.doctor.get('qemu_version') if c.doctor else c.probe.environment.get('qemu', '?')}",
        ]
        origin = (c.doctor or {}).get("qemu_origin") or c.probe.environment.get("qemu_origin")
        if origin:
            facts.append(f"QEMU from {str(origin).split(' (cache ')[0]}")
        if c.doctor is not None:
            facts.append(kvm_text(c.doctor))
        facts.append("free" if c.probe.lock_free else f"busy (pid {c.probe.lock_holder or '?'})")
        if c.probe.cleaned_qemu:
            facts.append(f"ended {len(c.probe.cleaned_qemu)} QEMU left behind")
        state = "ready" if c.usable else f"NOT READY: {c.problem}"
        out.append(f"{head}: {state}; " + ", ".join(facts))
    # What a host reports goes to the operator's terminal: no escape sequence of its own.
    return [one_line(line) for line in out]

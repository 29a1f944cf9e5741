"""A /dev/kvm program of guest/ run in the host under test (L1), which
has no Python: built static here, pushed over L1's SSH, and its exit
status read as memqual's errors (the programs' shared statuses:
guest/kvm_vm.h)."""

from __future__ import annotations

from memqual.host.core.errors import BadInput, CapabilityMissing, GuestError, MemqualError, Timeout
from memqual.host.core.printable import one_line
from memqual.host.core.shell import Shell
from memqual.images import agents

COMMAND_TIMEOUT_S = 60.0
# guest/kvm_vm.h's exit statuses.
EXIT_FAILED, EXIT_USAGE, EXIT_CANNOT, EXIT_DEADLINE = 1, 2, 3, 4


def deploy(shell: Shell, agent: str, path: str) -> str:
    """Build guest/<agent>.c (cached, static) and stream it to ``path``
    through ``shell``; returns the path."""
    binary = agents.build_agent(agent)
    script = 'cat > "$1" && chmod 755 "$1"'
    shell.run(["sh", "-c", script, "push", path], timeout=COMMAND_TIMEOUT_S, input=binary.read_bytes())
    return path


def failure(status: int, stderr: str, where: str, failed: type[MemqualError]) -> MemqualError:
    """The error for a run that ended with ``status``, the program's last
    line on stderr kept: a refused argument is bad input, a host that
    cannot run it a missing capability, a failed check ``failed``."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    said = one_line(lines[-1])[:300] if lines else f"no message, exit status {status}"
    if status == EXIT_USAGE:
        return BadInput(f"{where} refused its arguments: {said}")
    if status == EXIT_CANNOT:
        return CapabilityMissing(f"{where} cannot run here: {said}")
    if status == EXIT_DEADLINE:
        return Timeout(f"{where}: {said}")
    if status == EXIT_FAILED:
        return failed(f"{where} failed: {said}")
    return GuestError(f"{where} ended with status {status}: {said}")

"""The one way memqual reaches a lab host: OpenSSH with the host's key,
public-key authentication only, and the host key checked against the
known_hosts file the hosts file names (never accepted on first sight).

Every option is given on the command line and the user's own ssh_config is
not read (``-F none``), so a run does what the hosts file says and nothing
else.  OpenSSH keeps the first value it gets for an option, so these options
also win over the ones Avocado's remote spawner (aexpect) appends after
them, ``StrictHostKeyChecking=no`` among them.
"""

from __future__ import annotations

import shlex
import subprocess
import time
from collections.abc import Sequence

from memqual.host.core import bounded
from memqual.host.run.hosts.config import LabHost

CONNECT_TIMEOUT_S = 5
# A lost host is noticed within ServerAliveInterval * ServerAliveCountMax.
ALIVE_INTERVAL_S = 2
ALIVE_COUNT = 3
# What is kept of a host's answer: a probe's or doctor's JSON is a few KiB.
ANSWER_MAX = 1 << 20


def options(host: LabHost) -> list[str]:
    """ssh options for ``host``, before the destination."""
    return [
        "-F",
        "none",
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        f"UserKnownHostsFile={host.known_hosts}",
        "-o",
        "GlobalKnownHostsFile=none",
        "-o",
        "CheckHostIP=no",
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "IdentityAgent=none",
        "-o",
        "PreferredAuthentications=publickey",
        "-o",
        "PasswordAuthentication=no",
        "-o",
        "KbdInteractiveAuthentication=no",
        "-o",
        f"ConnectTimeout={CONNECT_TIMEOUT_S}",
        "-o",
        f"ServerAliveInterval={ALIVE_INTERVAL_S}",
        "-o",
        f"ServerAliveCountMax={ALIVE_COUNT}",
        "-o",
        "ForwardAgent=no",
        "-o",
        "ForwardX11=no",
        "-o",
        "LogLevel=ERROR",
        "-i",
        str(host.key),
        "-p",
        str(host.port),
    ]


def command(host: LabHost, argv: Sequence[str]) -> list[str]:
    """The local argv that runs ``argv`` on ``host``.  The remote side gets
    one shell-quoted string (sshd hands it to the user's shell): each word
    is quoted, none is interpreted."""
    return ["ssh", *options(host), "--", host.destination, shlex.join(argv)]


def run(host: LabHost, argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` on ``host`` and wait at most ``timeout_s`` (then
    subprocess.TimeoutExpired): ssh's exit status 255 is ssh's own failure
    (unreachable, key refused, host key unknown or changed), anything else
    the remote command's.  Of what the host answers, the last ANSWER_MAX
    bytes of each stream are kept (host/core/bounded.py)."""
    cmd = command(host, argv)
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        done = bounded.collect(proc, time.monotonic() + timeout_s, keep=ANSWER_MAX)
    except bounded.Overdue:
        raise subprocess.TimeoutExpired(cmd, timeout_s) from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(cmd, done.returncode, done.stdout, done.stderr)


def ssh_error(result: subprocess.CompletedProcess[str]) -> str:
    """ssh's own complaint, one line."""
    lines = [line.strip() for line in (result.stderr or "").splitlines() if line.strip()]
    return lines[-1] if lines else f"ssh exited {result.returncode}"

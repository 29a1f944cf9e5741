"""Lab hosts for the e2e tests, for real: network namespaces on this
machine, each with its own veth address and its own sshd (Debian's
openssh-server), and the clean-up of labs a killed test left behind.
Fixture code, not tests: Avocado finds no test class here."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import re
import shutil
import signal
import socket
import subprocess
from pathlib import Path

from memqual.host.core.paths import REPO_ROOT
from memqual.host.core.polling import poll

SSHD = Path("/usr/sbin/sshd")
# A /16 of the private range, one /30 per host; an address already on
# this machine is never taken (only addresses the test made are touched).
LAB_NET = ipaddress.IPv4Network("10.213.0.0/16")
START_DEADLINE_S = 10.0


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10, check=check)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


_STALE_NS = re.compile(r"mqlab-(\d+)-\d+")
_STALE_DIR = re.compile(r"mqlab-(\d+)-\w+")


def remove_stale_labs() -> list[str]:
    """Namespaces (with their processes and veths) and sshd directories of
    labs whose creating process is gone; what was removed."""
    removed = []
    for line in ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        match = _STALE_NS.fullmatch(name)
        if match and not alive(int(match.group(1))):
            for pid in ip("netns", "pids", name, check=False).stdout.split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            ip("netns", "del", name, check=False)
            removed.append(name)
    for path in Path("/run").glob("mqlab-*"):
        match = _STALE_DIR.fullmatch(path.name)
        if match and not alive(int(match.group(1))):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
    return removed


class NamespaceLab:
    """Lab hosts as network namespaces with an sshd each; a context manager
    that removes every namespace, veth and process it made, on every exit."""

    def __init__(self, count: int, workdir: Path) -> None:
        self.count = count
        self.scratch = workdir
        self.tag = f"{os.getpid() % 100000:05d}"  # veth names have 15 characters
        self.hosts: list[dict[str, str]] = []
        self.sshd: dict[str, subprocess.Popen[bytes]] = {}
        self.client_key = workdir / "client_key"
        self.known_hosts = workdir / "known_hosts"

    def __enter__(self) -> NamespaceLab:
        try:
            self._make()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _free_subnets(self) -> list[ipaddress.IPv4Network]:
        used = ip("-o", "-4", "addr", "show").stdout
        taken = [
            ipaddress.IPv4Interface(word).network
            for line in used.splitlines()
            for word in line.split()[3:4]  # "2: eth0 inet 192.0.2.2/24 ..."
        ]
        subnets = list(LAB_NET.subnets(new_prefix=30))
        random.shuffle(subnets)
        free = [s for s in subnets if not any(s.overlaps(t) for t in taken)]
        return free[: self.count]

    def _make(self) -> None:
        self.scratch.mkdir(mode=0o700, parents=True, exist_ok=True)
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.client_key)], check=True, timeout=30
        )
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        known = []
        for index, subnet in enumerate(self._free_subnets()):
            name = f"lab{index + 1}"
            ns = f"mqlab-{os.getpid()}-{index + 1}"  # the creator's pid: remove_stale_labs() reads it
            outside, inside = (str(a) for a in list(subnet.hosts())[:2])
            veth_out, veth_in = f"mq{self.tag}{index + 1}o", f"mq{self.tag}{index + 1}i"
            host = {"name": name, "ns": ns, "address": inside, "veth": veth_out}
            self.hosts.append(host)
            ip("netns", "add", ns)
            ip("link", "add", veth_out, "type", "veth", "peer", "name", veth_in)
            ip("link", "set", veth_in, "netns", ns)
            ip("addr", "add", f"{outside}/30", "dev", veth_out)
            ip("link", "set", veth_out, "up")
            ip("-n", ns, "addr", "add", f"{inside}/30", "dev", veth_in)
            ip("-n", ns, "link", "set", veth_in, "up")
            ip("-n", ns, "link", "set", "lo", "up")
            hostdir = self.scratch / name
            hostdir.mkdir(mode=0o700)
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(hostdir / "host_key")], check=True, timeout=30
            )
            shutil.copy(self.client_key.with_suffix(".pub"), hostdir / "authorized_keys")
            (hostdir / "sshd_config").write_text(
                "\n".join(
                    [
                        f"ListenAddress {inside}:22",
                        f"HostKey {hostdir / 'host_key'}",
                        f"AuthorizedKeysFile {hostdir / 'authorized_keys'}",
                        f"PidFile {hostdir / 'sshd.pid'}",
                        "PermitRootLogin prohibit-password",
                        "PubkeyAuthentication yes",
                        "PasswordAuthentication no",
                        "KbdInteractiveAuthentication no",
                        "UsePAM no",
                        # The status channel is a UNIX socket forward; this
                        # sshd (OpenSSH 9.2) denies that too under
                        # "AllowTcpForwarding no".
                        "AllowTcpForwarding remote",
                        "AllowStreamLocalForwarding remote",
                        "GatewayPorts no",
                        "X11Forwarding no",
                        "PrintMotd no",
                        "PrintLastLog no",
                        "",
                    ]
                )
            )
            self.sshd[name] = subprocess.Popen(
                ["ip", "netns", "exec", ns, str(SSHD), "-D", "-e", "-f", str(hostdir / "sshd_config")],
                stdin=subprocess.DEVNULL,
                stdout=(hostdir / "sshd.log").open("wb"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            pub = (hostdir / "host_key.pub").read_text().split()
            known.append(f"{inside} {pub[0]} {pub[1]}")
        self.known_hosts.write_text("\n".join(known) + "\n")
        for host in self.hosts:
            self._wait_listening(host)

    def _wait_listening(self, host: dict[str, str]) -> None:
        def listening() -> bool:
            with contextlib.suppress(OSError), socket.create_connection((host["address"], 22), timeout=1):
                return True
            if self.sshd[host["name"]].poll() is not None:
                raise not_listening()
            return False

        def not_listening() -> RuntimeError:
            log = (self.scratch / host["name"] / "sshd.log").read_text(errors="replace")
            return RuntimeError(f"sshd of {host['name']} did not listen within {START_DEADLINE_S:.0f} s: {log}")

        poll(listening, START_DEADLINE_S, 0.05, what="sshd", on_timeout=lambda _: not_listening())

    def hosts_file(self, path: Path, extra: dict[str, str] | None = None) -> Path:
        lines = []
        for host in self.hosts:
            lines += [
                "[[host]]",
                f'name = "{host["name"]}"',
                f'address = "{host["address"]}"',
                f'key = "{self.client_key}"',
                f'known_hosts = "{self.known_hosts}"',
                f'checkout = "{REPO_ROOT}"',
                *(f"{k} = {v}" for k, v in (extra or {}).items()),
                "",
            ]
        path.write_text("\n".join(lines))
        return path

    def pids(self, host: dict[str, str]) -> list[int]:
        result = ip("netns", "pids", host["ns"], check=False)
        return [int(p) for p in result.stdout.split()]

    def kill(self, host: dict[str, str]) -> list[int]:
        """The host dies: every process in its namespace, at once."""
        pids = self.pids(host)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pids

    def close(self) -> None:
        for host in self.hosts:
            self.kill(host)
        for proc in self.sshd.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        for host in self.hosts:
            ip("netns", "del", host["ns"], check=False)
            ip("link", "del", host["veth"], check=False)  # gone with the namespace, unless it never moved
        shutil.rmtree(self.scratch, ignore_errors=True)

    def leftovers(self) -> list[str]:
        """What of the lab is still there (nothing, after close())."""
        out = []
        namespaces = ip("netns", "list", check=False).stdout
        links = ip("-o", "link", "show", check=False).stdout
        for host in self.hosts:
            if host["ns"] in namespaces:
                out.append(f"namespace {host['ns']}")
            if host["veth"] in links:
                out.append(f"link {host['veth']}")
        for name, proc in self.sshd.items():
            if proc.poll() is None:
                out.append(f"sshd of {name} (pid {proc.pid})")
        return out

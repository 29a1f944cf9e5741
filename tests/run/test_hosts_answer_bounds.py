"""What a lab host answers over ``ssh.run`` (host/run/hosts/ssh.py) is
read within bounds (host/core/bounded.py): a host that floods keeps
ANSWER_MAX bytes of each stream, and one that answers nothing ends at the
deadline as subprocess.TimeoutExpired, which its callers already mark."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from memqual.host.run.hosts import config, ssh

FLOOD = 20_000_000


@pytest.fixture
def host(tmp_path: Path) -> config.LabHost:
    return config.LabHost(name="a", address="10.0.0.1", key=tmp_path / "key", known_hosts=tmp_path / "known")


def _answers(monkeypatch: pytest.MonkeyPatch, script: str) -> None:
    """The host's answer played here by ``script`` (no network)."""

    def command(host: config.LabHost, argv: Sequence[str]) -> list[str]:
        return ["sh", "-c", script]

    monkeypatch.setattr(ssh, "command", command)


def test_a_flooding_host_keeps_a_capped_answer(host: config.LabHost, monkeypatch: pytest.MonkeyPatch) -> None:
    _answers(monkeypatch, f"head -c {FLOOD} /dev/zero | tr '\\0' x; echo; echo end; head -c {FLOOD} /dev/zero >&2")
    result = ssh.run(host, ["memqual", "doctor", "--json"], 30)
    assert result.returncode == 0
    assert len(result.stdout) < ssh.ANSWER_MAX + 100 and result.stdout.endswith("x\nend\n")
    assert len(result.stderr) < ssh.ANSWER_MAX + 100


def test_a_silent_host_ends_at_the_deadline(host: config.LabHost, monkeypatch: pytest.MonkeyPatch) -> None:
    _answers(monkeypatch, "exec sleep 5")
    begun = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        ssh.run(host, ["true"], 0.2)
    assert time.monotonic() - begun < 1.5

"""``memqual run --hosts FILE --qemu V``: each lab host makes that QEMU its
own during its probe (a version fetched from its own mirror into its own
cache), its tasks run the binary it answered, a host that cannot have it
is left out with the reason, and what a host answers is checked before it
reaches a task's command line."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from memqual.host.cli.main import main
from memqual.host.core.errors import BadInput
from memqual.host.run.config import JobOutcome, RunConfig
from memqual.host.run.hosts import check, config, fleet, probe, ssh
from memqual.host.run.hosts.spawner import FleetSpec

GOOD = "/root/.cache/memqual/qemu/1_10.0.2+ds-2+deb13u1~bpo12+1/usr/bin/qemu-system-x86_64"


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    key = tmp_path / "id_test"
    key.write_text("not a real key\n")
    known = tmp_path / "known_hosts"
    known.write_text("10.0.0.1 ssh-ed25519 AAAA\n")
    return key, known


def hosts_file(tmp_path: Path, names: tuple[str, ...]) -> Path:
    path = tmp_path / "hosts.toml"
    path.write_text(
        "".join(
            f'[[host]]\nname = "{n}"\naddress = "10.0.0.1"\nkey = "id_test"\nknown_hosts = "known_hosts"\n'
            for n in names
        )
    )
    return path


def answer(binary: str = "", problem: str = "", version: str | None = None) -> dict[str, Any]:
    return probe.HostProbe(
        version=version or probe.memqual_version(),
        boot_id="b00t",
        environment={"qemu": "10.0.2", "qemu_origin": "Debian bookworm-backports"},
        lock_path="/run/memqual/measure.lock",
        lock_free=True,
        lock_holder=None,
        qemu_binary=binary,
        qemu_problem=problem,
    ).to_json()


@pytest.mark.parametrize(
    ("reply", "problem"),
    [
        (answer(GOOD), ""),
        (answer("", "no QEMU 10.0.2 in the archive: memqual qemu list shows the versions"), "cannot have QEMU 10.0.2"),
        (answer("qemu-system-x86_64"), "not a plain absolute path"),
        (answer("/usr/bin/qemu; rm -rf /"), "not a plain absolute path"),
        (answer("/usr/bin/qemu system"), "not a plain absolute path"),
        (answer("/usr/bin/$(id)"), "not a plain absolute path"),
        (answer(""), "not a plain absolute path"),
    ],
)
def test_a_hosts_qemu_answer_decides_whether_it_takes_part(
    keys: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, reply: dict[str, Any], problem: str
) -> None:
    host = config.LabHost(name="lab1", address="10.0.0.1", key=keys[0], known_hosts=keys[1])
    seen: list[tuple[list[str], float]] = []

    def run(h: config.LabHost, argv: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        seen.append((list(argv), timeout_s))
        return subprocess.CompletedProcess(argv, 0, json.dumps(reply), "")

    monkeypatch.setattr(ssh, "run", run)
    result = check.probe_host(host, qemu="10.0.2")
    assert result.usable == (problem == "")
    assert problem in result.problem
    ((argv, timeout_s),) = seen
    # The version is one word of the host's argv, never spliced into a shell string.
    assert argv[-3:] == ["probe", "--qemu", "10.0.2"]
    assert timeout_s == check.QEMU_PROBE_TIMEOUT_S


def test_a_probe_without_qemu_asks_for_none(keys: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    host = config.LabHost(name="lab1", address="10.0.0.1", key=keys[0], known_hosts=keys[1])
    seen: list[list[str]] = []

    def run(h: config.LabHost, argv: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        seen.append(list(argv))
        return subprocess.CompletedProcess(argv, 0, json.dumps(answer()), "")

    monkeypatch.setattr(ssh, "run", run)
    assert check.probe_host(host).usable
    assert "--qemu" not in seen[0]


def test_a_hostile_version_stays_one_word_on_the_ssh_command_line(keys: tuple[Path, Path]) -> None:
    host = config.LabHost(name="lab1", address="10.0.0.1", key=keys[0], known_hosts=keys[1])
    remote = ssh.command(host, check.memqual_argv(host, "hosts", "probe", "--qemu", "/x; touch /tmp/pwned"))[-1]
    assert shlex.split(remote)[-1] == "/x; touch /tmp/pwned"


def test_each_hosts_tasks_run_the_qemu_it_answered_and_a_host_without_it_is_left_out(
    tmp_path: Path, keys: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    hosts = hosts_file(tmp_path, ("a", "b", "c"))
    answers = {
        "a": answer(GOOD),
        "b": answer("/opt/qemu-10/bin/qemu-system-x86_64"),
        "c": answer("", "no QEMU 10.0.2 in this host's archive"),
    }
    asked: list[str | None] = []

    def probe_host(host: config.LabHost, qemu: str | None = None) -> check.HostCheck:
        asked.append(qemu)
        found = probe.HostProbe.from_json(answers[host.name])
        if found.qemu_problem:
            return check.HostCheck(host, f"cannot have QEMU {qemu}: {found.qemu_problem}", found)
        return check.HostCheck(host, "", found)

    monkeypatch.setattr(check, "probe_host", probe_host)
    monkeypatch.setattr(fleet, "remote_status_dir", lambda host: ("/tmp/memqual-status.0123456789", ""))
    monkeypatch.setattr(fleet, "remove_remote_dir", lambda host, path: None)
    specs: list[FleetSpec] = []

    def job(job_config: RunConfig, *args: Any, **kwargs: Any) -> JobOutcome:
        specs.append(FleetSpec.from_json(json.loads((tmp_path / "out" / "fleet" / "fleet-spec.json").read_text())))
        return JobOutcome(command=[], exit_status=0, job_dir=None, summary="", tests=[], counts={})

    monkeypatch.setattr(fleet, "run_avocado", job)
    status = fleet.run(RunConfig(output=tmp_path / "out"), hosts, qemu="10.0.2")
    assert asked == ["10.0.2"] * 3
    assert status == fleet.EXIT_INCOMPLETE  # c was left out
    (spec,) = specs
    assert spec.task_environment("a")["MEMQUAL_QEMU"] == GOOD
    assert spec.task_environment("b")["MEMQUAL_QEMU"] == "/opt/qemu-10/bin/qemu-system-x86_64"
    assert spec.task_environment("a")["MEMQUAL_LAB_HOST"] == "a"
    assert "c" not in spec.host_environment
    data = json.loads((tmp_path / "out" / "fleet.json").read_text())
    by_name = {h["name"]: h for h in data["hosts"]}
    assert by_name["c"]["status"] == "left out"
    assert by_name["c"]["reason"] == "cannot have QEMU 10.0.2: no QEMU 10.0.2 in this host's archive"
    html = (tmp_path / "out" / "fleet.html").read_text()
    assert "qemu_origin" in html and "Debian bookworm-backports" in html


def test_without_qemu_the_tasks_get_no_qemu_of_the_controllers() -> None:
    spec = FleetSpec(slots={}, environment={"MEMQUAL_PROFILE": "quick"})
    assert "MEMQUAL_QEMU" not in spec.task_environment("a")
    assert fleet.qemu_environment([]) == {}


def test_the_fleet_spec_round_trips_with_each_hosts_environment() -> None:
    spec = FleetSpec(slots={}, environment={"MEMQUAL_PROFILE": "quick"}, host_environment={"a": {"MEMQUAL_QEMU": GOOD}})
    back = FleetSpec.from_json(json.loads(json.dumps(spec.to_json())))
    assert back == spec
    # A host's own entry never hides which host a task ran on.
    odd = FleetSpec(slots={}, environment={}, host_environment={"a": {"MEMQUAL_LAB_HOST": "b"}})
    assert odd.task_environment("a")["MEMQUAL_LAB_HOST"] == "a"


def test_two_qemus_over_the_hosts_are_one_line_exit_2(tmp_path: Path, keys: tuple[Path, Path], capsys: Any) -> None:
    hosts = hosts_file(tmp_path, ("a",))
    status = main(["run", "--hosts", str(hosts), "--qemu", "7.2", "--qemu", "10.0.2", "--output", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert len(err) == 1 and "give --qemu once" in err[0]


def test_the_probe_answers_why_this_host_cannot_have_a_qemu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The probe itself, here: a path that is no QEMU is an answer, not a
    failed probe; the environment it reports is still this host's."""
    monkeypatch.setenv("MEMQUAL_QEMU", "")
    monkeypatch.setattr(probe, "end_processes", lambda pids: [])
    monkeypatch.setattr(probe, "stale_task_dirs", lambda *a, **k: [])
    answered = probe.probe(qemu=str(tmp_path / "no-qemu"))
    assert answered.qemu_binary == ""
    assert "no executable file there" in answered.qemu_problem


def test_the_probe_makes_a_qemu_it_can_have_its_own(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from memqual.host.core import qemu_binary

    fake = tmp_path / "qemu-system-x86_64"
    fake.write_text("#!/bin/sh\necho 'QEMU emulator version 10.0.2 (fake)'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("MEMQUAL_QEMU", "")
    monkeypatch.setattr(probe, "end_processes", lambda pids: [])
    monkeypatch.setattr(probe, "stale_task_dirs", lambda *a, **k: [])
    answered = probe.probe(qemu=str(fake))
    assert answered.qemu_problem == ""
    assert answered.qemu_binary == str(fake.resolve())
    assert check.QEMU_PATH.fullmatch(answered.qemu_binary)
    assert answered.environment["qemu"] == "10.0.2"
    assert qemu_binary.current().binary == fake.resolve()


def test_bad_input_is_refused_before_any_host_is_asked(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    with pytest.raises(BadInput, match="give --qemu once"):
        fleet.main(RunConfig(output=tmp_path / "o"), str(hosts_file(tmp_path, ("a",))), ["7.2", "10.0.2"])


# -- for real: one lab host (a network namespace with its own sshd) --------


def _lab_ready() -> str:
    import os
    import shutil

    from memqual.e2e.lab import SSHD

    if os.geteuid() != 0:
        return "needs root (ip netns)"
    if not SSHD.exists() or shutil.which("ip") is None:
        return "needs /usr/sbin/sshd and ip"
    return ""


@pytest.mark.skipif(bool(_lab_ready()), reason=_lab_ready() or "lab ready")
def test_a_real_lab_host_answers_the_qemu_it_can_have_and_why_not(tmp_path: Path) -> None:
    """Over real SSH into a namespace host running this checkout: a QEMU
    it has (the newest archive QEMU in the shared cache, else the system's,
    by path: a version would need the host to reach a mirror) is answered
    with its binary and named in the host's environment; a path that is no
    QEMU leaves the host out with the reason."""
    import os
    import shutil
    import tempfile

    from memqual.e2e.lab import NamespaceLab, remove_stale_labs
    from memqual.host.core.paths import cache_dir

    archive = sorted((cache_dir() / "qemu").glob("*/usr/bin/qemu-system-x86_64"))
    binary = archive[-1] if archive else Path(shutil.which("qemu-system-x86_64") or "/usr/bin/qemu-system-x86_64")
    if not binary.exists():
        pytest.skip("no QEMU on this machine")
    remove_stale_labs()
    workdir = Path(tempfile.mkdtemp(prefix=f"mqlab-{os.getpid()}-", dir="/run"))
    try:
        with NamespaceLab(1, workdir) as lab:
            (host,) = config.load(lab.hosts_file(tmp_path / "hosts.toml"))
            have = check.probe_host(host, qemu=str(binary))
            lacking = check.probe_host(host, qemu=str(tmp_path / "no-qemu"))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    assert have.usable, have.problem
    assert have.probe is not None
    assert have.probe.qemu_binary == str(binary.resolve())
    from memqual.host.core.qemu_binary import version_of

    assert have.probe.environment["qemu"] == version_of(binary, {})
    assert not lacking.usable
    assert "no executable file there" in lacking.problem

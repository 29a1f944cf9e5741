"""The hosts file, the fleet page's majority marking and the fault
bookkeeping of ``memqual run --hosts`` (host/run/hosts/), without a network."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from memqual.host.cli.main import main
from memqual.host.core.errors import BadInput
from memqual.host.judge.results import Results
from memqual.host.report import fleet_page as page
from memqual.host.run.config import JobOutcome
from memqual.host.run.hosts import config, fleet, probe, ssh
from memqual.host.run.hosts.spawner import (
    INTERRUPTED,
    NOT_RUN,
    RAN,
    FleetSpec,
    Place,
    assigned_host,
    read_place,
    write_place,
)
from memqual.host.run.outputs import collect_records


@pytest.fixture
def keys(tmp_path):
    key = tmp_path / "id_test"
    key.write_text("not a real key\n")
    known = tmp_path / "known_hosts"
    known.write_text("10.0.0.1 ssh-ed25519 AAAA\n")
    return key, known


def write_hosts(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hosts.toml"
    path.write_text(text)
    return path


def test_a_hosts_file_with_defaults_and_relative_paths(tmp_path, keys):
    path = write_hosts(
        tmp_path,
        """
[[host]]
name = "lab1"
address = "10.0.0.1"
key = "id_test"
known_hosts = "known_hosts"

[[host]]
name = "lab2"
address = "lab2.example.org"
port = 2222
user = "qual"
key = "id_test"
known_hosts = "known_hosts"
slots = 2
checkout = "/opt/memqual"
""",
    )
    first, second = config.load(path)
    assert first == config.LabHost(
        name="lab1", address="10.0.0.1", key=keys[0].resolve(), known_hosts=keys[1].resolve()
    )
    assert (first.port, first.user, first.slots) == (22, "root", 1)
    assert second.destination == "qual@lab2.example.org"
    assert (second.port, second.slots, second.checkout) == (2222, 2, "/opt/memqual")


@pytest.mark.parametrize(
    "body, message",
    [
        ('adress = "x"\nname = "a"\naddress = "10.0.0.1"', "unknown key 'adress'"),
        ('address = "10.0.0.1"', "no name"),
        ('name = "a"', "no address"),
        ('name = "a b"\naddress = "10.0.0.1"', "name = 'a b'"),
        ('name = "a"\naddress = "-oProxyCommand=x"', "address"),
        ('name = "a"\naddress = "10.0.0.1"\nport = 0', "port = 0"),
        ('name = "a"\naddress = "10.0.0.1"\nport = "22"', "port = '22'"),
        ('name = "a"\naddress = "10.0.0.1"\nslots = 0', "slots = 0"),
        ('name = "a"\naddress = "10.0.0.1"\nslots = true', "slots = True"),
        ('name = "a"\naddress = "10.0.0.1"\nuser = "root; rm"', "user"),
        ('name = "a"\naddress = "10.0.0.1"\ncheckout = "relative"', "absolute path"),
        ('name = "a"\naddress = "10.0.0.1"\nkey = "no such key"', "key = 'no such key'"),
        ('name = "a"\naddress = "10.0.0.1"\nkey = "missing"', "no such file"),
    ],
)
def test_bad_hosts_files_are_one_line_errors(tmp_path, keys, body, message):
    defaults = 'key = "id_test"\nknown_hosts = "known_hosts"\n'
    extra = "" if "key =" in body else defaults
    extra = extra if "known_hosts" in body or "key =" not in body else 'known_hosts = "known_hosts"\n'
    path = write_hosts(tmp_path, "[[host]]\n" + body + "\n" + extra)
    with pytest.raises(BadInput) as err:
        config.load(path)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_file_level_errors(tmp_path, keys):
    with pytest.raises(BadInput, match="no such file|No such file"):
        config.load(tmp_path / "none.toml")
    with pytest.raises(BadInput, match="not TOML"):
        config.load(write_hosts(tmp_path, "[[host]\n"))
    with pytest.raises(BadInput, match="no \\[\\[host\\]\\] table"):
        config.load(write_hosts(tmp_path, ""))
    with pytest.raises(BadInput, match="unknown top-level key 'hosts'"):
        config.load(write_hosts(tmp_path, "[[hosts]]\nname = 'a'\n"))
    twice = '[[host]]\nname = "a"\naddress = "10.0.0.1"\nkey = "id_test"\nknown_hosts = "known_hosts"\n'
    with pytest.raises(BadInput, match="two hosts are named 'a'"):
        config.load(write_hosts(tmp_path, twice + twice))


def test_the_command_says_one_line_and_exits_2(tmp_path, keys, capsys):
    path = write_hosts(tmp_path, '[[host]]\nname = "a"\naddress = "10.0.0.1"\nsolts = 2\n')
    for argv in (["hosts", "check", str(path)], ["run", "--hosts", str(path), "--output", str(tmp_path / "o")]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1
        assert "unknown key 'solts'" in err


def test_ssh_pins_the_host_key_and_uses_the_key_only(tmp_path, keys):
    host = config.LabHost(name="a", address="10.0.0.1", key=keys[0], known_hosts=keys[1], port=2200)
    argv = ssh.command(host, ["/opt/memqual/.venv/bin/memqual", "hosts", "probe"])
    options = " ".join(argv)
    assert "StrictHostKeyChecking=yes" in options
    assert f"UserKnownHostsFile={keys[1]}" in options
    assert "PasswordAuthentication=no" in options and "BatchMode=yes" in options
    assert argv[argv.index("-p") + 1] == "2200"
    assert argv[-2:] == ["root@10.0.0.1", "/opt/memqual/.venv/bin/memqual hosts probe"]


def test_slot_files_put_the_pinned_options_before_aexpects(tmp_path, keys):
    host = config.LabHost(name="a", address="10.0.0.1", key=keys[0], known_hosts=keys[1], slots=2)
    remote = {"a": "/tmp/memqual-status.AbCdEf0123"}
    conf = fleet.write_spawner_config(tmp_path / "fleet", [host], "/x/status.sock", remote, "quick")
    text = conf.read_text()
    assert "spawner = memqual-remote" in text and "status_server_listen = /x/status.sock" in text
    slots = sorted((tmp_path / "fleet").glob("slot-*.json"))
    assert len(slots) == 2 and all(oct(p.stat().st_mode & 0o777) == "0o600" for p in slots)
    first, second = (json.loads(p.read_text()) for p in slots)
    words = shlex.split(first["extra_cmdline"])
    # aexpect appends "-o StrictHostKeyChecking=no" after these: ssh keeps the first.
    assert words[words.index("StrictHostKeyChecking=yes") - 1] == "-o"
    # The host's own relay to the status server (status_relay), through the
    # session, to a socket in a private directory there: no TCP port any
    # local user there could reach.
    assert words[words.index("-R") + 1] == "/tmp/memqual-status.AbCdEf0123/status.sock:/x/relay-1.sock"
    assert "-R" not in shlex.split(second["extra_cmdline"])  # one forward per host
    spec = FleetSpec.from_json(json.loads((tmp_path / "fleet" / "fleet-spec.json").read_text()))
    assert set(spec.slots.values()) == {host}
    assert spec.environment["MEMQUAL_PROFILE"] == "quick"
    assert spec.status_sockets == {"a": "/tmp/memqual-status.AbCdEf0123/status.sock"}


@pytest.mark.parametrize(
    "verdicts, top, odd",
    [
        ({"a": "reproduced", "b": "reproduced", "c": "not reproduced"}, "reproduced", {"c"}),
        ({"a": "reproduced", "b": "reproduced"}, "reproduced", set()),
        ({"a": "reproduced", "b": "not reproduced"}, None, set()),
        ({"a": "x", "b": "y", "c": "z"}, None, set()),
        ({"a": "x", "b": "x", "c": "y", "d": "z"}, None, set()),
        ({"a": "x", "b": "x", "c": "x", "d": "z"}, "x", {"d"}),
        ({}, None, set()),
    ],
)
def test_majority_marks_the_hosts_that_differ(verdicts, top, odd):
    assert page.majority(verdicts) == (top, frozenset(odd))


def _results(**verdicts: str) -> Results:
    return Results.from_json({"claims": [{"id": claim, "verdict": v} for claim, v in verdicts.items()]})


def test_the_fleet_page_sets_verdicts_side_by_side_and_marks_the_odd_host(tmp_path):
    columns = (
        page.HostColumn(
            "a",
            "completed",
            boot_id="k1",
            results=_results(c1="reproduced", c2="underpowered"),
            report="hosts/a/report.html",
        ),
        page.HostColumn("b", "completed", boot_id="k1", results=_results(c1="reproduced", c2="underpowered")),
        page.HostColumn("c", "completed", boot_id="k2", results=_results(c1="not reproduced", c2="underpowered")),
        page.HostColumn("d", "left out", reason="unreachable: Connection refused", boot_id=""),
        # Lost half-way: its verdicts are shown, but it is no voter.
        page.HostColumn("e", "lost", boot_id="k3", results=_results(c1="not measurable", c2="not measurable")),
    )
    fleet_page = page.Fleet(columns=columns)
    rows = {r.claim: r for r in page.claim_rows(fleet_page)}
    assert rows["c1"].odd == {"c"} and rows["c1"].majority == "reproduced"
    assert rows["c2"].odd == frozenset() and rows["c2"].majority == "underpowered"
    assert rows["c2"].verdicts["e"] == "not measurable"
    assert page.shared_kernels(fleet_page) == [("k1", ("a", "b"))]
    page.write(fleet_page, tmp_path)
    html = (tmp_path / "fleet.html").read_text()
    assert html.count("differs</td>") == 1
    assert 'href="hosts/a/report.html"' in html
    assert "One kernel" in html and "unreachable: Connection refused" in html
    data = json.loads((tmp_path / "fleet.json").read_text())
    assert data["claims"][0] == {
        "claim": "c1",
        "verdicts": {"a": "reproduced", "b": "reproduced", "c": "not reproduced", "e": "not measurable"},
        "majority": "reproduced",
        "differs": ["c"],
    }
    lines = page.summary_lines(fleet_page)
    assert "lab host d: LEFT OUT (no tasks): unreachable: Connection refused" in lines
    assert any("c differ from the majority (reproduced)" in line for line in lines)


def _task(job_dir: Path, index: int, place: Place | None, status: str | None, record: bool = True) -> Path:
    logdir = job_dir / "test-results" / f"{index}-e2e_test_x.py_X.test_{index}"
    (logdir / "data").mkdir(parents=True)
    if place is not None:
        write_place(logdir, place)
    if record:
        (logdir / "data" / f"memqual-x.t{index}-m-default.json").write_text(
            json.dumps(
                {
                    "schema": "memqual.measurement/1",
                    "scenario": f"x.t{index}",
                    "metric": "m",
                    "unit": "s",
                    "better": "lower",
                    "samples": [1.0],
                    "environment": {"host_kernel": "6.1"},
                }
            )
        )
    return logdir


def test_fault_bookkeeping_keeps_only_what_ran_to_its_end(tmp_path):
    job_dir = tmp_path / "job"
    ran = _task(job_dir, 1, Place("1-x", "a", RAN, started=1.0, ended=2.0), "PASS")
    cut = _task(job_dir, 2, Place("2-x", "b", INTERRUPTED, "lab host b was lost"), None)
    moved = _task(job_dir, 3, Place("3-x", "a", RAN), "PASS")
    _task(job_dir, 4, Place("4-x", "", NOT_RUN, "no lab host left"), None, record=False)
    (job_dir / "test-results" / "by-status").mkdir()
    (job_dir / "results.json").write_text(
        json.dumps(
            {
                "tests": [
                    {"name": "1-x", "status": "PASS", "logdir": str(ran), "time_elapsed": 1.0},
                    {"name": "3-x", "status": "PASS", "logdir": str(moved), "time_elapsed": 1.0},
                ]
            }
        )
    )
    job = JobOutcome(command=[], exit_status=0, job_dir=job_dir, summary="", tests=[], counts={})
    tasks = fleet.task_results(job)
    assert [(t.id, t.host, t.outcome, t.status) for t in tasks] == [
        ("1-x", "a", RAN, "PASS"),
        ("2-x", "b", INTERRUPTED, "SKIP"),
        ("3-x", "a", RAN, "PASS"),
        ("4-x", "", NOT_RUN, "SKIP"),
    ]
    assert read_place(cut) == Place("2-x", "b", INTERRUPTED, "lab host b was lost")
    assert fleet.host_records(tasks, "a", tmp_path / "a") == (2, [])
    assert all(json.loads(p.read_text())["environment"]["lab_host"] == "a" for p in (tmp_path / "a").iterdir())
    records, problems = collect_records(tmp_path / "a")
    assert sorted(r.scenario for r in records) == ["x.t1", "x.t3"] and problems == []
    # The half-run task's record is never merged.
    assert fleet.host_records(tasks, "b", tmp_path / "b") == (0, [])
    assert list((tmp_path / "b").iterdir()) == []


def test_lost_hosts_are_read_back(tmp_path):
    assert fleet.read_lost(tmp_path) == {}
    (tmp_path / "lost.json").write_text(json.dumps({"b": "the SSH session ended"}))
    assert fleet.read_lost(tmp_path) == {"b": "the SSH session ended"}


def test_an_unreachable_host_is_left_out_and_the_run_says_so(tmp_path, keys, monkeypatch):
    hosts = write_hosts(
        tmp_path, '[[host]]\nname = "a"\naddress = "10.0.0.1"\nkey = "id_test"\nknown_hosts = "known_hosts"\n'
    )
    from memqual.host.run.config import RunConfig
    from memqual.host.run.hosts import check

    monkeypatch.setattr(check, "probe_host", lambda host: check.HostCheck(host, "unreachable: No route to host"))
    called = []
    monkeypatch.setattr(fleet, "run_avocado", lambda *a, **k: called.append(a))
    status = fleet.run(RunConfig(output=tmp_path / "out"), hosts)
    assert status == fleet.EXIT_INCOMPLETE
    assert called == []  # no host left: no job
    data = json.loads((tmp_path / "out" / "fleet.json").read_text())
    assert data["hosts"][0]["status"] == "left out"
    assert data["hosts"][0]["reason"] == "unreachable: No route to host"


def test_qemus_left_behind_are_found_by_their_orphaned_parent(tmp_path):
    def fake(pid: int, argv: list[str], ppid: int) -> None:
        d = tmp_path / str(pid)
        d.mkdir()
        (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
        (d / "stat").write_text(f"{pid} (qemu-system-x86) S {ppid} {pid} {pid} 0")

    cache = "/root/.cache/memqual"
    fake(100, ["/usr/bin/qemu-system-x86_64", "-kernel", f"{cache}/images/x/vmlinux"], 1)
    fake(101, ["/usr/bin/qemu-system-x86_64", "-kernel", f"{cache}/images/x/vmlinux"], 55)  # its runner lives
    fake(102, ["/usr/bin/qemu-system-x86_64", "-kernel", "/srv/other/vmlinux"], 1)  # not memqual's
    fake(103, ["/usr/bin/python3", cache], 1)
    (tmp_path / "self").mkdir()
    assert probe.orphaned_qemus(cache, proc=tmp_path) == [100]


def test_the_probe_answer_round_trips():
    answer = probe.HostProbe("0.1.0", "b00t", {"host_kernel": "6.1"}, "/run/memqual/measure.lock", True, None, (7,))
    assert probe.HostProbe.from_json(json.loads(json.dumps(answer.to_json()))) == answer
    with pytest.raises(ValueError):
        probe.HostProbe.from_json({"schema": "other"})


def test_every_test_runs_once_per_host_through_avocados_variants(tmp_path, keys):
    hosts = [config.LabHost(name=n, address="10.0.0.1", key=keys[0], known_hosts=keys[1]) for n in ("lab1", "lab2")]
    remote = {h.name: "/tmp/memqual-status.0123456789" for h in hosts}
    text = fleet.write_spawner_config(tmp_path / "fleet", hosts, "/s.sock", remote, "quick").read_text()
    assert "dict_variants = [{'lab_host': 'lab1'}, {'lab_host': 'lab2'}]" in text
    assert "variant_id_keys = ['lab_host']" in text
    # A task's runnable carries its variant like this; the spawner reads its host.
    variant = {"variant_id": "lab2", "variant": [["", [["", "lab_host", "lab2"]]]], "paths": ["/"]}
    assert assigned_host(variant) == "lab2"
    assert assigned_host(None) == ""
    assert assigned_host({"variant": [["/run/x", []]]}) == ""


def test_task_directories_left_by_a_lost_connection_are_stale_after_twice_the_task_limit(tmp_path):
    import os

    old, fresh = tmp_path / "memqual-task.old", tmp_path / "memqual-task.new"
    for path in (old, fresh):
        (path / "data").mkdir(parents=True)
    os.utime(old / "data", (1000.0, 1000.0))
    os.utime(old, (1000.0, 1000.0))
    now = 1000.0 + probe.STALE_TASK_S + 1
    os.utime(fresh / "data", (now - 10, now - 10))
    os.utime(fresh, (1000.0, 1000.0))  # an old directory with a fresh record: in use
    (tmp_path / "memqual-task.file").write_text("")
    empty = tmp_path / "memqual-task.empty"
    empty.mkdir()
    os.utime(empty, (now - 5, now - 5))
    assert probe.stale_task_dirs(now, tmp=tmp_path) == [old]


def test_the_jobs_tmpdir_lives_in_the_run_and_is_removed_even_when_interrupted(tmp_path, keys, monkeypatch):
    """aexpect's session files go under $TMPDIR: the job gets one inside the
    run's output, private, and gone after the job, also after Ctrl-C."""
    hosts = write_hosts(
        tmp_path, '[[host]]\nname = "a"\naddress = "10.0.0.1"\nkey = "id_test"\nknown_hosts = "known_hosts"\n'
    )
    from memqual.host.run.config import RunConfig
    from memqual.host.run.hosts import check

    monkeypatch.setattr(check, "probe_host", lambda host: check.HostCheck(host, ""))
    monkeypatch.setattr(fleet, "remote_status_dir", lambda host: ("/tmp/memqual-status.0123456789", ""))
    monkeypatch.setattr(fleet, "remove_remote_dir", lambda host, path: None)
    seen = []

    def job(config, *args, **kwargs):
        scratch = Path(dict(config.environment)["TMPDIR"])
        seen.append((scratch, scratch.stat().st_mode & 0o777))
        (scratch / "aexpect_x").mkdir()  # what a session would leave
        raise KeyboardInterrupt

    monkeypatch.setattr(fleet, "run_avocado", job)
    monkeypatch.chdir(tmp_path)  # a relative --output, as by default: avocado runs elsewhere
    with pytest.raises(KeyboardInterrupt):
        fleet.run(RunConfig(output=Path("out")), hosts)
    ((scratch, mode),) = seen
    assert scratch.is_absolute() and scratch.is_relative_to(tmp_path / "out") and mode == 0o700
    assert not scratch.exists()


def test_a_host_running_any_memqual_test_is_busy(tmp_path):
    """lock_state tries the lock exclusive: a test that measures nothing
    holds it shared, and that host is busy too."""
    import fcntl
    import os

    lock = tmp_path / "measure.lock"
    assert probe.lock_state(lock) == (True, None)  # no lock file yet
    lock.write_text(f"{os.getpid()}\n")
    assert probe.lock_state(lock) == (True, None)
    for mode in (fcntl.LOCK_SH, fcntl.LOCK_EX):
        fd = os.open(lock, os.O_RDWR)
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            assert probe.lock_state(lock) == (False, os.getpid())
        finally:
            os.close(fd)
        assert probe.lock_state(lock) == (True, None)


# -- what a lab host sends is trusted less than the controller ------------


def _tar(path: Path, members: list[tuple[str, str, str]]) -> Path:
    """A tar file of (name, kind, content or link target) members."""
    import io
    import tarfile

    with tarfile.open(path, "w") as archive:
        for name, kind, body in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                data = body.encode()
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
                continue
            info.type = {
                "dir": tarfile.DIRTYPE,
                "symlink": tarfile.SYMTYPE,
                "hardlink": tarfile.LNKTYPE,
                "chardev": tarfile.CHRTYPE,
                "fifo": tarfile.FIFOTYPE,
            }[kind]
            info.linkname = body
            archive.addfile(info)
    return path


def _fetch_from(tmp_path: Path, monkeypatch, members) -> tuple[str, Path]:
    """fetch_data with the host's side played by ``cat`` of a tar file."""
    from memqual.host.run.hosts import spawner

    stream = _tar(tmp_path / "stream.tar", members)
    monkeypatch.setattr(spawner.ssh, "command", lambda host, argv: ["cat", str(stream)])
    local = tmp_path / "task"
    local.mkdir()
    host = config.LabHost(name="a", address="10.0.0.1", key=tmp_path, known_hosts=tmp_path)
    return spawner.fetch_data(host, "/tmp/memqual-task.x", local), local


def test_a_hosts_records_come_back(tmp_path, monkeypatch):
    members = [("data", "dir", ""), ("data/memqual-x.json", "file", "{}"), ("data/sub/y", "file", "y")]
    problem, local = _fetch_from(tmp_path, monkeypatch, members)
    assert problem == ""
    assert (local / "data" / "memqual-x.json").read_text() == "{}"
    assert (local / "data" / "sub" / "y").read_text() == "y"
    assert sorted(p.name for p in local.iterdir()) == ["data"]  # no staging left


@pytest.mark.parametrize(
    "members",
    [
        [("fleet-place.json.tmp", "symlink", "OUTSIDE")],  # what write_place then wrote through
        [("data", "dir", ""), ("data/memqual-x.json", "symlink", "OUTSIDE")],
        [("data", "dir", ""), ("data/memqual-x.json", "hardlink", "OUTSIDE")],
        [("data", "dir", ""), ("data/dev", "chardev", "")],
        [("data", "dir", ""), ("data/fifo", "fifo", "")],
        [("OUTSIDE", "file", "overwritten")],
        [("data/../../x", "file", "overwritten")],
        [("data", "dir", ""), ("data/a", "file", "1"), ("data/a", "file", "2")],
    ],
    ids=["planted-link", "symlink", "hardlink", "device", "fifo", "absolute", "dotdot", "twice"],
)
def test_a_hosts_stream_cannot_write_outside_or_plant_links(tmp_path, monkeypatch, members):
    outside = tmp_path / "controller-file"
    outside.write_text("precious\n")
    members = [(n.replace("OUTSIDE", str(outside)), k, b.replace("OUTSIDE", str(outside))) for n, k, b in members]
    problem, local = _fetch_from(tmp_path, monkeypatch, members)
    assert problem.startswith("unpacking the records failed"), problem
    # The spawner writes its place file next, as after every task.
    write_place(local, Place("1-x", "a", RAN))
    assert outside.read_text() == "precious\n"
    assert sorted(p.name for p in local.iterdir()) == ["fleet-place.json"]  # nothing of the stream kept
    assert not (local / "fleet-place.json").is_symlink()
    assert not (tmp_path / "x").exists()


def test_records_that_are_links_or_truncated_are_marked_bad_and_the_rest_kept(tmp_path):
    import os

    job_dir = tmp_path / "job"
    logdir = _task(job_dir, 1, Place("1-x", "a", RAN), "PASS")
    secret = tmp_path / "controller.json"
    secret.write_text(json.dumps({"schema": "memqual.measurement/1"}))
    os.symlink(secret, logdir / "data" / "memqual-link.json")
    (logdir / "data" / "memqual-cut.json").write_text('{"schema": "memqual.measurement/1", "sam')
    os.mkfifo(logdir / "data" / "memqual-fifo.json")
    tasks = [fleet.TaskResult("1-x", "PASS", "", 1.0, logdir, Place("1-x", "a", RAN))]
    count, bad = fleet.host_records(tasks, "a", tmp_path / "a")
    assert count == 1
    assert sorted(b.file for b in bad) == [
        "data/memqual-cut.json",
        "data/memqual-fifo.json",
        "data/memqual-link.json",
    ]
    assert all(b.task == "1-x" and b.host == "a" and b.reason for b in bad)
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["memqual-x.t1-m-default-task1.json"]


def test_a_truncated_record_still_gives_the_fleet_page_and_says_so(tmp_path, keys, monkeypatch):
    hosts = write_hosts(
        tmp_path,
        "".join(
            f'[[host]]\nname = "{n}"\naddress = "10.0.0.1"\nkey = "id_test"\nknown_hosts = "known_hosts"\n'
            for n in ("a", "b")
        ),
    )
    from memqual.host.run.config import RunConfig
    from memqual.host.run.hosts import check

    monkeypatch.setattr(check, "probe_host", lambda host: check.HostCheck(host, ""))
    monkeypatch.setattr(fleet, "remote_status_dir", lambda host: ("/tmp/memqual-status.0123456789", ""))
    monkeypatch.setattr(fleet, "remove_remote_dir", lambda host, path: None)

    def job(config, *args, **kwargs):
        job_dir = tmp_path / "job"
        _task(job_dir, 1, Place("1-x", "a", RAN), "PASS")
        _task(job_dir, 2, Place("2-x", "a", RAN), "PASS")
        _task(job_dir, 3, Place("3-x", "b", RAN), "PASS")
        cut = job_dir / "test-results" / "2-e2e_test_x.py_X.test_2" / "data" / "memqual-x.t2-m-default.json"
        cut.write_text(cut.read_text()[:40])
        return JobOutcome(command=[], exit_status=0, job_dir=job_dir, summary="", tests=[], counts={})

    monkeypatch.setattr(fleet, "run_avocado", job)
    status = fleet.run(RunConfig(output=tmp_path / "out"), hosts)
    assert status == fleet.EXIT_INCOMPLETE
    data = json.loads((tmp_path / "out" / "fleet.json").read_text())
    a, b = data["hosts"]
    assert a["status"] == "incomplete" and "could not be read" in a["reason"]
    assert [r["file"] for r in a["bad_records"]] == ["data/memqual-x.t2-m-default.json"]
    assert b["status"] == "completed" and b["bad_records"] == []
    # Its other record is kept.
    assert [p.name for p in (tmp_path / "out" / "hosts" / "a" / "records").iterdir()] == [
        "memqual-x.t1-m-default-task1.json"
    ]
    assert "bad record from a" in (tmp_path / "out" / "fleet.html").read_text()


# -- the status channel ---------------------------------------------------


def test_a_task_posts_its_status_to_its_hosts_end_of_the_channel():
    args = ["-i", "1-x", "-j", "j", "-k", "avocado-instrumented", "output_dir=/here/t1", "-s", "/here/status.sock"]
    out = fleet_spawner_remote_args(args)
    assert out == ["-i", "1-x", "-j", "j", "-k", "avocado-instrumented", "output_dir=/tmp/memqual-task.x"] + [
        "-s",
        "/tmp/memqual-status.0123456789/status.sock",
    ]


def fleet_spawner_remote_args(args: list[str]) -> list[str]:
    from memqual.host.run.hosts.spawner import remote_args

    return remote_args(args, "/here/t1", "/tmp/memqual-task.x", "/tmp/memqual-status.0123456789/status.sock")


def test_the_status_socket_here_is_in_the_private_fleet_directory_or_a_private_one(tmp_path):
    path, private = fleet.local_status_socket(tmp_path / "fleet")
    assert (path, private) == (str(tmp_path / "fleet" / "status.sock"), None)
    # ":" would make it TCP for Avocado and a separator for ssh -R, "%" an
    # ssh token; a long path is no UNIX socket.
    for odd in ("a:b", "100%", "x" * 120):
        path, private = fleet.local_status_socket(tmp_path / odd / "fleet")
        assert private is not None and private.parent == Path("/tmp")
        assert oct(private.stat().st_mode & 0o777) == "0o700" and path == str(private / "status.sock")
        private.rmdir()


def test_a_hosts_answer_to_mktemp_must_be_a_status_directory(tmp_path, keys, monkeypatch):
    import subprocess

    host = config.LabHost(name="a", address="10.0.0.1", key=keys[0], known_hosts=keys[1])
    for answer, ok in (("/tmp/memqual-status.AbCdEf0123\n", True), ("/tmp/x -oProxyCommand=y\n", False)):
        done = subprocess.CompletedProcess([], 0, stdout=answer, stderr="")
        monkeypatch.setattr(fleet.ssh, "run", lambda *a, done=done, **k: done)
        path, problem = fleet.remote_status_dir(host)
        assert bool(path) == ok and bool(problem) != ok


def test_a_percent_in_the_output_path_reaches_avocado_unchanged(tmp_path, keys):
    import configparser

    host = config.LabHost(name="a", address="10.0.0.1", key=keys[0], known_hosts=keys[1])
    fleet_dir = tmp_path / "100%(x)s done" / "fleet"
    conf = fleet.write_spawner_config(fleet_dir, [host], "/s.sock", {"a": "/tmp/memqual-status.0123456789"}, "quick")
    parser = configparser.ConfigParser()  # as Avocado reads it, interpolation and all
    parser.read(conf)
    assert parser.get("spawner.memqual", "fleet") == str(fleet_dir / "fleet-spec.json")
    with pytest.raises(BadInput, match="line break"):
        fleet.conf_value("/tmp/a\nspawner = other")


# -- the hosts file -------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["x = " + "[" * 100_000 + "]" * 100_000, "x = " + "{a = " * 3000 + "1" + "}" * 3000, "x = " + "9" * 5000],
    ids=["arrays", "tables", "digits"],
)
def test_a_deeply_nested_hosts_file_is_one_line_exit_2(tmp_path, capsys, text):
    path = write_hosts(tmp_path, text)
    assert main(["hosts", "check", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err


@pytest.mark.parametrize("address", ["fe80-lab.example", "FE80::1", "fe80lab", "lab-fe80.example", "10.0.0.1"])
def test_the_address_check_refuses_what_aexpect_refuses(tmp_path, keys, address):
    from aexpect import remote

    # aexpect's own check comes before it looks at the client: an unknown
    # client shows what it would have done with the address, no ssh run.
    try:
        remote.remote_login("no-such-client", address, 22, "root", "", "#", timeout=1)
    except remote.LoginBadClientError:
        aexpect_takes = True
    except remote.RemoteError:
        aexpect_takes = False
    path = write_hosts(
        tmp_path, f'[[host]]\nname = "a"\naddress = "{address}"\nkey = "id_test"\nknown_hosts = "known_hosts"\n'
    )
    if aexpect_takes:
        assert config.load(path)[0].address == address
    else:
        with pytest.raises(BadInput, match="fe80"):
            config.load(path)
    assert aexpect_takes == (not address.lower().startswith("fe80"))


def test_what_gnu_tar_on_a_host_sends_comes_back_whole(tmp_path, monkeypatch):
    """The host's side is GNU tar (``tar -cf - data``): its stream, padding
    and all, unpacks and the sender exits 0."""
    from memqual.host.run.hosts import spawner

    remote = tmp_path / "remote"
    (remote / "data" / "sub").mkdir(parents=True)
    (remote / "data" / "memqual-x.json").write_text("{}" * 5000)
    (remote / "data" / "sub" / "y").write_text("y")
    monkeypatch.setattr(spawner.ssh, "command", lambda host, argv: argv)  # the host's argv, run here
    local = tmp_path / "task"
    local.mkdir()
    host = config.LabHost(name="a", address="10.0.0.1", key=tmp_path, known_hosts=tmp_path)
    assert spawner.fetch_data(host, str(remote), local) == ""
    assert (local / "data" / "memqual-x.json").read_text() == "{}" * 5000
    assert (local / "data" / "sub" / "y").read_text() == "y"
    empty, nothing = tmp_path / "empty", tmp_path / "task2"
    empty.mkdir()
    nothing.mkdir()
    assert spawner.fetch_data(host, str(empty), nothing) == ""  # no data/ there: nothing, no error
    assert list(nothing.iterdir()) == []


def test_a_hostile_host_name_claim_and_reason_are_escaped_once_on_the_fleet_page():
    from hostile import ESCAPED, HOSTILE, assert_escaped_once

    columns = (
        page.HostColumn(
            HOSTILE,
            "completed",
            boot_id=HOSTILE,
            results=_results(**{HOSTILE: "reproduced"}),
            report=HOSTILE,
            environment={"cpu": HOSTILE},
            tasks=(page.TaskLine(HOSTILE, HOSTILE, "interrupted", HOSTILE),),
            bad_records=(page.BadRecord(HOSTILE, HOSTILE, HOSTILE, HOSTILE),),
        ),
        page.HostColumn("b", "completed", boot_id=HOSTILE, results=_results(**{HOSTILE: "reproduced"})),
        page.HostColumn("c", "left out", reason=HOSTILE),
    )
    text = page.render(page.Fleet(columns=columns, not_run=(page.TaskLine(HOSTILE, "", "not run", HOSTILE),)))
    assert_escaped_once(text)
    assert f'href="{ESCAPED}"' in text
    # Headings (twice), the claim and its majority, the environment, the
    # shared kernel's hosts, and every fault.
    assert text.count(ESCAPED) >= 15, text.count(ESCAPED)

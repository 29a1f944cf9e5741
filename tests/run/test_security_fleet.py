"""Lab hosts against the controller and against each other: a host's
records come only from the data/ memqual fetched from it; each host posts
status through its own relay, which passes on only its own tasks' messages
(Avocado's own status server and client here); a probe or doctor answer
nested too deep leaves that host out, not the run."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path

import pytest
from test_hosts import _task

from memqual.host.run.hosts import check, config, fleet
from memqual.host.run.hosts.spawner import RAN, Place

JOB_ID = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    key = tmp_path / "id_test"
    key.write_text("not a real key\n")
    known = tmp_path / "known_hosts"
    known.write_text("10.0.0.1 ssh-ed25519 AAAA\n")
    return key, known


# -- records only from the fetched data/ ---------------------------------------------
def _record(scenario: str) -> str:
    return json.dumps(
        {
            "schema": "memqual.measurement/1",
            "scenario": scenario,
            "metric": "m",
            "unit": "s",
            "better": "lower",
            "samples": [1.0],
            "environment": {"host_kernel": "6.1"},
        }
    )


def test_records_are_read_only_from_the_fetched_data_folder(tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    logdir = _task(job_dir, 1, Place("1-x;lab2", "lab2", RAN), "PASS")
    # What Avocado's "file" status handler writes into the task's folder,
    # posted by any host that knows the job id: never the host's evidence.
    (logdir / "memqual-injected-m-default.json").write_text(_record("injected"))
    (logdir / "sub").mkdir()
    (logdir / "sub" / "memqual-injected2-m-default.json").write_text(_record("injected2"))
    tasks = [fleet.TaskResult("1-x;lab2", "PASS", "", 1.0, logdir, Place("1-x;lab2", "lab2", RAN))]
    count, bad = fleet.host_records(tasks, "lab2", tmp_path / "lab2")
    assert (count, bad) == (1, [])
    assert [p.name for p in (tmp_path / "lab2").iterdir()] == ["memqual-x.t1-m-default-task1.json"]


def test_a_data_folder_that_is_a_link_gives_no_records(tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    logdir = _task(job_dir, 1, Place("1-x;lab2", "lab2", RAN), "PASS", record=False)
    (logdir / "data").rmdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "memqual-planted-m-default.json").write_text(_record("planted"))
    (logdir / "data").symlink_to(elsewhere)
    tasks = [fleet.TaskResult("1-x;lab2", "PASS", "", 1.0, logdir, Place("1-x;lab2", "lab2", RAN))]
    assert fleet.host_records(tasks, "lab2", tmp_path / "lab2") == (0, [])


# -- one relay per host ----------------------------------------------------------------
@pytest.mark.parametrize(
    "task_id, host", [("1-e2e/test_x.py:X.test;lab1", "lab1"), ("1-a;b;lab-2", "lab-2"), ("1-x", ""), (";lab1", "")]
)
def test_the_host_of_a_task_is_its_variant(task_id: str, host: str) -> None:
    from memqual.host.run.hosts.status_relay import task_host

    assert task_host(task_id) == host


@pytest.mark.parametrize(
    "message, why",
    [
        ({"id": "1-x;lab1", "job_id": JOB_ID, "status": "running"}, ""),
        ({"id": "1-x;lab2", "job_id": JOB_ID, "status": "running"}, "not assigned to lab host lab1"),
        ({"id": "1-x;lab1", "status": "running", "type": "file", "path": "data/memqual-x.json"}, "into data/"),
        ({"id": "1-x;lab1", "status": "running", "type": "file", "path": "a/../data/x.json"}, "into data/"),
        ({"id": "1-x;lab1", "status": "running", "type": "file", "path": "stdout"}, ""),
        ({"id": 1}, "no task id"),
        ([1, 2], "not a JSON object"),
    ],
)
def test_what_a_relay_refuses(message: object, why: str) -> None:
    from memqual.host.run.hosts.status_relay import refusal

    got = refusal(json.dumps(message).encode(), "lab1")
    assert (why in got) if why else got == ""
    assert "not a JSON object" in refusal(b"[" * 100_000 + b"\n", "lab1")


def test_one_lab_host_cannot_post_as_anothers_task(tmp_path: Path) -> None:
    """Avocado's own status server and client: lab1, through its own relay,
    posts one message of its own task and one as lab2's task; only its own
    reaches the status server's repository."""
    from avocado.core.nrunner.task import TaskStatusService
    from avocado.core.status.repo import StatusRepo
    from avocado.core.status.server import StatusServer

    from memqual.host.run.hosts.status_relay import StatusRelay

    folder = tmp_path / "s"
    folder.mkdir(mode=0o700)
    upstream = str(folder / "status.sock")
    repo = StatusRepo(JOB_ID)
    server = StatusServer(upstream, repo)
    loop = asyncio.new_event_loop()
    serving = threading.Thread(target=loop.run_forever, daemon=True)
    serving.start()
    try:
        asyncio.run_coroutine_threadsafe(server.create_server(), loop).result(10)
        sockets = {"lab1": str(folder / "relay-1.sock"), "lab2": str(folder / "relay-2.sock")}
        with StatusRelay(upstream, sockets) as relay:
            lab1 = TaskStatusService(sockets["lab1"])
            own = {"id": "1-e2e/test_x.py:X.test;lab1", "job_id": JOB_ID, "status": "running", "time": 1.0}
            forged = {**own, "id": "2-e2e/test_x.py:X.test;lab2", "type": "log", "log": b"forged"}
            into_data = {**own, "type": "file", "path": "data/memqual-x.json", "log": b"{}"}
            for message in (forged, into_data, own):
                assert lab1.post(message)
            lab1.close()
            from memqual.host.core.polling import poll

            poll(lambda: repo.get_all_task_data(own["id"]), 10, 0.02, what="lab1's message")
            assert relay.refusals()["lab1"]["dropped"] == 2
            assert "lab2" not in relay.refusals()
        assert repo.get_all_task_data("2-e2e/test_x.py:X.test;lab2") is None
        assert len(repo.get_all_task_data(own["id"])) == 1
        assert not any(os.path.exists(p) for p in sockets.values())  # closed and removed
    finally:
        loop.call_soon_threadsafe(server.close)
        loop.call_soon_threadsafe(loop.stop)
        serving.join(10)
        loop.close()


def test_each_hosts_forward_ends_at_its_own_relay(tmp_path: Path, keys) -> None:
    hosts = [
        config.LabHost(name=name, address="10.0.0.1", key=keys[0], known_hosts=keys[1]) for name in ("lab1", "lab2")
    ]
    remote = {"lab1": "/tmp/memqual-status.AAAAAAAAAA", "lab2": "/tmp/memqual-status.BBBBBBBBBB"}
    fleet.write_spawner_config(tmp_path / "fleet", hosts, "/x/status.sock", remote, "quick")
    import shlex

    forwards = {}
    for slot in sorted((tmp_path / "fleet").glob("slot-*-1.json")):
        words = shlex.split(json.loads(slot.read_text())["extra_cmdline"])
        forwards[slot.name] = words[words.index("-R") + 1].split(":")[1]
    assert forwards == {"slot-lab1-1.json": "/x/relay-1.sock", "slot-lab2-1.json": "/x/relay-2.sock"}


# -- a probe or doctor answer nested too deep ------------------------------------------
class _Done:
    def __init__(self, stdout: str, returncode: int = 0) -> None:
        self.stdout, self.stderr, self.returncode = stdout, "", returncode


def _deep(depth: int) -> str:
    from memqual.host.run.hosts.probe import SCHEMA

    return f'{{"schema": "{SCHEMA}", "environment": ' + "[" * depth + "]" * depth + "}"


@pytest.mark.parametrize("depth", [100, 100_000])
def test_a_deeply_nested_probe_answer_leaves_that_host_out(monkeypatch, keys, depth: int) -> None:
    hosts = [config.LabHost(name=n, address="10.0.0.1", key=keys[0], known_hosts=keys[1]) for n in ("bad", "good")]
    from memqual.host.run.hosts.probe import SCHEMA, memqual_version

    good = json.dumps(
        {
            "schema": SCHEMA,
            "version": memqual_version(),
            "boot_id": "b",
            "environment": {"host_kernel": "6.1"},
            "lock_free": True,
        }
    )
    monkeypatch.setattr(
        check.ssh, "run", lambda host, argv, timeout: _Done(_deep(depth) if host.name == "bad" else good)
    )
    results = check.for_each(hosts, check.probe_host)
    assert not results[0].usable and "nested deeper than" in results[0].problem
    assert results[1].usable


def test_a_deeply_nested_doctor_answer_is_that_hosts_problem(monkeypatch, keys) -> None:
    host = config.LabHost(name="bad", address="10.0.0.1", key=keys[0], known_hosts=keys[1])
    monkeypatch.setattr(check.ssh, "run", lambda host, argv, timeout: _Done("[" * 100_000 + "]" * 100_000))
    report, problem = check.doctor(host)
    assert report is None and "nested deeper than" in problem
    monkeypatch.setattr(check.ssh, "run", lambda host, argv, timeout: _Done("[1]"))
    report, problem = check.doctor(host)
    assert report is None and "not a JSON object" in problem

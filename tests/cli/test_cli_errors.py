"""Bad input at the ``memqual`` command: one line on stderr starting
``memqual: error:``, exit status 2, no traceback, and nothing left running.

Each command runs under a small wrapper that makes itself the child
subreaper: whatever the command leaves behind (a QEMU it failed to reap)
is re-parented to the wrapper, which reports and kills it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import fake_kernel
import fake_qemu
import pytest
from one_line_errors import assert_one_line_error, in_process

from memqual.host.core.paths import REPO_ROOT
from memqual.images import build as build_module

WRAPPER = r"""
import ctypes, json, os, signal, subprocess, sys
PR_SET_CHILD_SUBREAPER = 36
ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
proc = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=60)
while True:  # reap orphans that already exited
    try:
        if os.waitpid(-1, os.WNOHANG)[0] == 0:
            break
    except ChildProcessError:
        break
left = []
for entry in os.listdir("/proc"):
    if entry.isdigit():
        try:
            stat = open(f"/proc/{entry}/stat").read()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid():
            left.append(open(f"/proc/{entry}/cmdline").read().replace("\0", " "))
            os.kill(int(entry), signal.SIGKILL)
            os.waitpid(int(entry), 0)
print(json.dumps({"status": proc.returncode, "stderr": proc.stderr, "stdout": proc.stdout, "left": left}))
"""

needs_host_tools = pytest.mark.skipif(
    not (
        build_module.BUSYBOX.exists()
        and build_module.DROPBEAR.exists()
        and shutil.which("dropbearkey")
        and shutil.which("dpkg")
        and shutil.which("apt-get")
    ),
    reason="busybox-static, dropbear-bin, dpkg and apt-get are needed to build an image (run ./setup)",
)


def memqual(args: list[str], env: dict[str, str]) -> dict:
    full_env = {**os.environ, **env}
    full_env.pop("MEMQUAL_DEBUG", None)
    out = subprocess.run(
        [sys.executable, "-c", WRAPPER, sys.executable, "-m", "memqual.host.cli.main", *args],
        cwd=REPO_ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=90,
        check=True,
    )
    return json.loads(out.stdout)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A private cache and a fake QEMU that would answer QMP but never SSH."""
    fake = fake_qemu.install(tmp_path / "qemu", "qmp")
    return {"MEMQUAL_CACHE": str(tmp_path / "cache"), "MEMQUAL_QEMU": str(fake)}


def test_the_leftover_check_sees_a_leftover() -> None:
    out = subprocess.run(
        [sys.executable, "-c", WRAPPER, "sh", "-c", "sleep 30 >/dev/null 2>&1 &"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    assert json.loads(out.stdout)["left"] == ["sleep 30 "]


@needs_host_tools
def test_a_kernel_path_that_does_not_exist(tmp_path, env) -> None:
    result = memqual(["boot", "--kernel", str(tmp_path / "bzImage-nope"), "--modules", str(tmp_path)], env)
    assert_one_line_error(result, "bzImage-nope: no such kernel file")


@needs_host_tools
def test_image_build_with_a_kernel_path_that_does_not_exist(tmp_path, env, monkeypatch, capsys) -> None:
    result = in_process(
        ["image", "build", "--kernel", str(tmp_path / "nope"), "--modules", str(tmp_path)], env, monkeypatch, capsys
    )
    assert_one_line_error(result, "nope: no such kernel file")


def test_kernel_without_modules(env, monkeypatch, capsys) -> None:
    result = in_process(["boot", "--kernel", "/boot/vmlinuz"], env, monkeypatch, capsys)
    assert_one_line_error(result, "give both --kernel")


def test_qemu_missing_from_path(tmp_path, env) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    result = memqual(["boot", "--", "true"], {**env, "PATH": str(empty), "MEMQUAL_QEMU": ""})
    assert_one_line_error(result, "qemu-system-x86_64 not found", "./setup")


def test_memqual_qemu_that_is_no_program(tmp_path, env, monkeypatch, capsys) -> None:
    result = in_process(["boot", "--", "true"], {**env, "MEMQUAL_QEMU": str(tmp_path / "nope")}, monkeypatch, capsys)
    assert_one_line_error(result, "MEMQUAL_QEMU=", "is not an executable file")


def test_invalid_memory_size(env) -> None:
    assert_one_line_error(memqual(["boot", "--memory=10", "--", "true"], env), "guest memory 10 MiB is too small")


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["boot", "--memory=abc"], "'abc' is not a whole number"),
        (["boot", "--memory=-1", "--", "true"], "at least 1"),
        (["boot", "--cpus=0", "--", "true"], "at least 1"),
        (["boot", "--machine", "virt"], "invalid choice: 'virt'"),
        (["no-such-command"], "invalid choice: 'no-such-command'"),
    ],
)
def test_usage_errors(env, monkeypatch, capsys, args: list[str], fragment: str) -> None:
    assert_one_line_error(in_process(args, env, monkeypatch, capsys), fragment)


@needs_host_tools
def test_a_guest_whose_ssh_never_answers(tmp_path, env) -> None:
    bzimage, modules = fake_kernel.make(tmp_path / "kernel")
    result = memqual(
        [
            "boot",
            "--kernel",
            str(bzimage),
            "--modules",
            str(modules),
            "--accel",
            "tcg",
            "--cold",
            "--timeout",
            "3",
            "--",
            "true",
        ],
        env,
    )
    assert_one_line_error(result, "did not answer SSH within 3 s")
    assert len(fake_qemu.pids(Path(env["MEMQUAL_QEMU"]))) == 1  # QEMU did start, and is gone


@needs_host_tools
def test_a_qemu_that_fails_at_once(tmp_path, env) -> None:
    failing = fake_qemu.install(tmp_path / "failing", "exit")
    bzimage, modules = fake_kernel.make(tmp_path / "kernel")
    result = memqual(
        ["boot", "--kernel", str(bzimage), "--modules", str(modules), "--accel", "tcg", "--cold", "--", "true"],
        {**env, "MEMQUAL_QEMU": str(failing)},
    )
    assert_one_line_error(result, "QEMU did not come up (exit status 1)", "fake failure for the test")

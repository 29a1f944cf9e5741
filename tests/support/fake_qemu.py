"""A fake qemu-system-x86_64 for the pytest suite, installed through
``$MEMQUAL_QEMU``.

It answers ``--version``, connects to QMP and answers every command, binds
the SSH forward port without a banner, and writes the console's ready line;
its modes (``exit``, ``hang``, ``qmp``, ``ignore-quit``, ``ready``,
``spin``: ``qmp`` with a thread that burns CPU, as a guest's TCG does) and the
files it leaves in its state folder are in docs/setup-and-tests.md,
"tests/support/fake_qemu.py"."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

VERSION = "7.2.99"
MODES = ("exit", "hang", "qmp", "ignore-quit", "ready", "spin")

_SCRIPT = textwrap.dedent(
    '''\
    #!{python}
    import json, os, socket, sys, threading, time
    MODE = {mode!r}
    STATE = {state!r}
    argv = sys.argv[1:]
    if "--version" in argv:
        print("QEMU emulator version {version} (fake)")
        sys.exit(0)

    def append(name, text):
        with open(os.path.join(STATE, name), "a") as handle:
            handle.write(text + "\\n")

    append("invocations", json.dumps(argv))
    append("pids", str(os.getpid()))

    def options(flag, kind):
        """key=value options of the argv entry after ``flag`` starting with ``kind``."""
        for i, arg in enumerate(argv[:-1]):
            if arg == flag and argv[i + 1].startswith(kind):
                return dict(p.split("=", 1) for p in argv[i + 1].split(",") if "=" in p)
        return {{}}

    if MODE == "exit":
        sys.stderr.write("qemu-system-x86_64: -accel tcg: fake failure for the test\\n")
        sys.exit(1)
    if MODE == "hang":
        while True:
            time.sleep(3600)

    if MODE == "spin":
        def burn():
            while True:
                pass

        threading.Thread(target=burn, daemon=True).start()

    listeners = []
    hostfwd = options("-netdev", "user").get("hostfwd")
    if hostfwd:
        rule = hostfwd  # tcp:127.0.0.1:PORT-:22
        port = int(rule.split(":")[2].split("-")[0])
        listener = socket.socket()
        try:
            listener.bind(("127.0.0.1", port))
        except OSError:
            sys.stderr.write(f"qemu-system-x86_64: -netdev user,id=net0,hostfwd={{rule}}: "
                             f"Could not set up host forwarding rule '{{rule}}'\\n")
            sys.exit(1)
        listener.listen(8)

        def hold():  # accept and keep connections, never send a banner
            while True:
                conn, _ = listener.accept()
                listeners.append(conn)

        threading.Thread(target=hold, daemon=True).start()

    console = options("-chardev", "file").get("path")
    if MODE == "ready" and console:
        with open(console, "a") as handle:
            handle.write("[    1.0] booted\\nmemqual-ready\\n")

    qmp_path = options("-chardev", "socket").get("path")
    if not qmp_path or MODE == "ready":
        while True:
            time.sleep(3600)

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(qmp_path)
    sock.sendall(json.dumps({{"QMP": {{"version": {{"qemu": {{"major": 7, "minor": 2, "micro": 99}},
                 "package": ""}}, "capabilities": []}}}}).encode() + b"\\r\\n")
    decoder = json.JSONDecoder()
    buffer = ""
    while True:
        data = sock.recv(65536)
        if not data:  # the client hung up: QEMU keeps running
            while True:
                time.sleep(3600)
        buffer += data.decode()
        while buffer.strip():
            try:
                message, end = decoder.raw_decode(buffer.lstrip())
            except ValueError:
                break
            buffer = buffer.lstrip()[end:]
            command = message.get("execute")
            append("qmp.log", command)
            reply = {{"return": {{}}}}
            if "id" in message:
                reply["id"] = message["id"]
            sock.sendall(json.dumps(reply).encode() + b"\\r\\n")
            if command == "quit" and MODE != "ignore-quit":
                sys.exit(0)
    '''
)


def install(directory: Path, mode: str) -> Path:
    """Write the fake QEMU into ``directory`` and return its path; its state
    files go to ``directory``/state."""
    if mode not in MODES:
        raise ValueError(f"fake QEMU mode {mode!r}: use one of {MODES}")
    state = directory / "state"
    state.mkdir(parents=True, exist_ok=True)
    path = directory / f"qemu-fake-{mode}"
    path.write_text(_SCRIPT.format(python=sys.executable, mode=mode, state=str(state), version=VERSION))
    path.chmod(0o755)
    return path


def state_dir(fake: Path) -> Path:
    return fake.parent / "state"


def pids(fake: Path) -> list[int]:
    path = state_dir(fake) / "pids"
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def invocations(fake: Path) -> list[list[str]]:
    path = state_dir(fake) / "invocations"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def qmp_commands(fake: Path) -> list[str]:
    path = state_dir(fake) / "qmp.log"
    return path.read_text().split() if path.exists() else []


def alive(pid: int) -> bool:
    """True if ``pid`` runs (a zombie waiting to be reaped counts as dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"

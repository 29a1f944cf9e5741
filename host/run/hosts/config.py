"""The hosts file: TOML, one ``[[host]]`` table per lab host.

Why it is built so: docs/architecture.md, "Module notes", host/run/hosts/config.py.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path
from typing import Any

from memqual.host.core import trust
from memqual.host.core.errors import BadInput
from memqual.host.core.paths import REPO_ROOT

KEYS = ("name", "address", "port", "user", "key", "known_hosts", "slots", "checkout")
MAX_SLOTS = 64  # more tasks than that on one host would measure each other, whatever the host

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_ADDRESS = re.compile(r"[A-Za-z0-9][A-Za-z0-9.:-]{0,252}")
_USER = re.compile(r"[a-z_][a-z0-9_.-]{0,31}")
# No spaces, quotes or shell characters: paths go into ssh -o options and
# into the remote shell's command line.
_PATH = re.compile(r"[A-Za-z0-9_./~+-]+")
DEFAULT_KEYS = ("id_ed25519", "id_ecdsa", "id_rsa")


@dataclasses.dataclass(frozen=True)
class LabHost:
    name: str
    address: str
    key: Path
    known_hosts: Path
    port: int = 22
    user: str = "root"
    slots: int = 1
    checkout: str = str(REPO_ROOT)

    @property
    def destination(self) -> str:
        return f"{self.user}@{self.address}"

    def to_json(self) -> dict[str, Any]:
        """The hosts file's keys, in its order, paths as text."""
        values = {key: getattr(self, key) for key in KEYS}
        return {key: str(v) if isinstance(v, Path) else v for key, v in values.items()}


def load(path: Path) -> list[LabHost]:
    """The hosts of ``path``; BadInput (one line) for anything wrong."""
    try:
        if path.exists() and not path.is_file():  # a device or a FIFO could be read forever
            raise BadInput(f"{path}: not a regular file: give a hosts file (TOML, one [[host]] table a host)")
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise BadInput(f"{path}: not UTF-8 text: give a hosts file (TOML, one [[host]] table a host)") from None
    except OSError as exc:
        raise BadInput(f"{path}: {exc.strerror or exc}: give a hosts file (TOML, one [[host]] table a host)") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise BadInput(f"{path}: not TOML ({exc}): fix the file (one [[host]] table a host)") from None
    except RecursionError:
        # tomllib parses nested arrays and inline tables recursively.
        raise BadInput(f"{path}: nested too deeply to read: a hosts file holds flat [[host]] tables") from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise BadInput(f"{path}: unreadable value ({exc}): fix the file (one [[host]] table a host)") from None
    return parse(data, path)


def parse(data: dict[str, Any], path: Path) -> list[LabHost]:
    extra = sorted(set(data) - {"host"})
    if extra:
        raise BadInput(f"{path}: unknown top-level key {extra[0]!r}: the file holds [[host]] tables only")
    tables = data.get("host")
    if not isinstance(tables, list) or not tables or not all(isinstance(t, dict) for t in tables):
        raise BadInput(f"{path}: no [[host]] table: add one per lab host (name, address, ...)")
    hosts = [_host(table, index + 1, path) for index, table in enumerate(tables)]
    seen: set[str] = set()
    for host in hosts:
        if host.name in seen:
            raise BadInput(f"{path}: two hosts are named {host.name!r}: give each [[host]] its own name")
        seen.add(host.name)
    return hosts


def _host(table: dict[str, Any], index: int, path: Path) -> LabHost:
    where = f"{path}: [[host]] {index}"
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise BadInput(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(KEYS)})")
    name = table.get("name")
    if name is None:
        raise BadInput(f'{where}: no name: give name = "..." (letters, digits, _ . -)')
    name = _text(table, "name", _NAME, where, "letters, digits, _ . - (at most 63)")
    where = f"{path}: host {name!r}"
    if "address" not in table:
        raise BadInput(f'{where}: no address: give address = "host name or IP"')
    # Each field read from its key, in the order the errors are met.
    return LabHost(
        name=name,
        address=_address(table, where),
        user=_text(table, "user", _USER, where, "a user name", default=LabHost.user),
        port=_integer(table, "port", where, 1, 65535, default=LabHost.port),
        slots=_integer(table, "slots", where, 1, MAX_SLOTS, default=LabHost.slots),
        key=_file(table, "key", where, path.parent, default=_default_key(where)),
        known_hosts=_file(table, "known_hosts", where, path.parent, default=Path.home() / ".ssh" / "known_hosts"),
        checkout=_checkout(table, where),
    )


def _address(table: dict[str, Any], where: str) -> str:
    address = _text(table, "address", _ADDRESS, where, "a host name or an IP address")
    if aexpect_refuses(address):
        raise BadInput(
            f"{where}: address {address!r}: Avocado's SSH sessions (aexpect) take any address that begins "
            "with fe80 for an IPv6 link-local one and refuse it without an interface: give another name "
            "(an /etc/hosts alias) or a global address"
        )
    return address


def aexpect_refuses(address: str) -> bool:
    """What aexpect's remote_login (1.8.0) refuses before it runs ssh: any
    host that begins with "fe80", name or address, unless it is given an
    interface (which the remote spawner never gives)."""
    return address.lower().startswith("fe80")


def _checkout(table: dict[str, Any], where: str) -> str:
    checkout = _text(table, "checkout", _PATH, where, "an absolute path", default=LabHost.checkout)
    if not checkout.startswith("/"):
        raise BadInput(f"{where}: checkout {checkout!r}: give the absolute path of memqual's checkout on that host")
    return checkout


def _text(table: dict[str, Any], key: str, pattern: re.Pattern[str], where: str, what: str, default: str = "") -> str:
    value = table.get(key, default)
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise BadInput(f"{where}: {key} = {value!r}: give {what}")
    return value


def _integer(table: dict[str, Any], key: str, where: str, low: int, high: int, default: int) -> int:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadInput(f"{where}: {key} = {value!r}: give a whole number from {low} to {high}")
    return value


def _default_key(where: str) -> Path | None:
    for name in DEFAULT_KEYS:
        candidate = Path.home() / ".ssh" / name
        if candidate.is_file():
            return candidate
    return None


def _file(table: dict[str, Any], key: str, where: str, base: Path, default: Path | None) -> Path:
    raw = table.get(key)
    if raw is None:
        if default is None:
            raise BadInput(f"{where}: no {key} given and no ~/.ssh/id_ed25519, id_ecdsa or id_rsa: give {key} = PATH")
        path = default
    else:
        if not isinstance(raw, str) or not _PATH.fullmatch(raw):
            raise BadInput(f"{where}: {key} = {raw!r}: give a path (letters, digits, _ . / ~ + -)")
        path = Path(raw).expanduser()
        if not path.is_absolute():
            path = base / path
    if not _PATH.fullmatch(str(path)):
        raise BadInput(f"{where}: {key} {path}: give a path without spaces or shell characters")
    if not path.is_file():
        raise BadInput(f"{where}: {key} {path}: no such file")
    # ssh proves who is who with these: nobody else's to change
    return trust.private_file(path, f"{where}: {key}")

"""Distribution packages, fetched with ``apt-get download`` and unpacked
with ``dpkg -x`` (no root needed for either), cached by file name."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Callable

from host.errors import BadInput, CapabilityMissing


def _run(argv: list[str], cwd: Path | None = None) -> str:
    try:
        proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=600)
    except FileNotFoundError as exc:
        raise CapabilityMissing(f"{argv[0]} not found: run ./setup (installs apt, dpkg and kmod)") from exc
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        raise BadInput(f"{' '.join(argv[:3])} failed: {tail[0]} (run 'apt-get update' and try again)")
    return proc.stdout


def _lists_fingerprint() -> str:
    """Changes whenever ``apt-get update`` brings new package lists."""
    lists = Path("/var/lib/apt/lists")
    stamps = sorted(f"{p.name}:{p.stat().st_mtime_ns}" for p in lists.glob("*Packages*"))
    return hashlib.sha256("\n".join(stamps).encode()).hexdigest()


def _memoized(question: str, answer: Callable[[], str], cache: Path) -> str:
    """apt-cache takes about half a second a call: remember its answers
    until the package lists change, so a cached image build stays fast."""
    memo_file = cache / "debs" / "apt-answers.json"
    fingerprint = _lists_fingerprint()
    try:
        memo = json.loads(memo_file.read_text())
    except (OSError, ValueError):
        memo = {}
    if memo.get("lists") != fingerprint:
        memo = {"lists": fingerprint}
    if question not in memo:
        memo[question] = answer()
        memo_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo_file.with_suffix(f".{os.getpid()}")
        tmp.write_text(json.dumps(memo))
        os.replace(tmp, memo_file)
    return str(memo[question])


def resolve_kernel_package(cache: Path, meta: str = "linux-image-amd64") -> str:
    """The versioned kernel package a meta package points at."""
    return _memoized(f"depends:{meta}", lambda: _resolve_kernel_package(meta), cache)


def _resolve_kernel_package(meta: str) -> str:
    for line in _run(["apt-cache", "depends", meta]).splitlines():
        line = line.strip()
        if line.startswith("Depends:") and "linux-image-" in line:
            return line.split()[1]
    raise BadInput(f"apt-cache knows no kernel behind {meta}: run 'apt-get update'")


def download(package: str, cache: Path) -> Path:
    """The .deb of ``package`` (current candidate), downloaded once."""
    debs = cache / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    version = _memoized(f"candidate:{package}", lambda: _candidate(package), cache)
    if not version or version == "(none)":
        raise BadInput(f"no installable version of {package}: run 'apt-get update'")
    existing = [p for p in debs.glob(f"{package}_*.deb") if _deb_version(p) == version]
    if existing:
        return existing[0]
    work = debs / f".dl-{package}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    _run(["apt-get", "download", f"{package}={version}"], cwd=work)
    (fetched,) = list(work.glob("*.deb"))
    target = debs / fetched.name
    fetched.replace(target)
    shutil.rmtree(work, ignore_errors=True)
    return target


def _candidate(package: str) -> str:
    for line in _run(["apt-cache", "policy", package]).splitlines():
        if line.strip().startswith("Candidate:"):
            return line.split(":", 1)[1].strip()
    return ""


def _deb_version(path: Path) -> str:
    # file names are name_version_arch.deb, with ':' of an epoch as %3a
    return path.name.split("_")[1].replace("%3a", ":")


def unpack(deb: Path, cache: Path) -> Path:
    """The unpacked tree of ``deb`` (``dpkg -x``), unpacked once."""
    target = cache / "unpacked" / deb.stem
    if (target / ".complete").exists():
        return target
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    _run(["dpkg", "-x", str(deb), str(target)])
    (target / ".complete").touch()
    return target

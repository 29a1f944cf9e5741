"""The QEMUs ``memqual qemu build`` made (images/qemu_build.py), as the
cache holds them: ``<cache>/qemu-builds/<name>/`` with bin/qemu-system-x86_64
and manifest.json; their names stand for them wherever ``--qemu`` takes a
version (host/core/qemu_binary.py)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from memqual.host.core.errors import BadInput
from memqual.host.core.trust import trusted_dir
from memqual.images.built_kernels import PatchRecord

BINARY = "qemu-system-x86_64"
MANIFEST = "manifest.json"
# A built QEMU's name: <upstream version>-<12 hex digits of the key>.
BUILT_NAME = re.compile(r"[0-9]+\.[0-9]+[0-9.]*-[0-9a-f]{12}")


@dataclasses.dataclass(frozen=True)
class BuiltQemu:
    name: str
    directory: Path
    version: str  # upstream, as the source's VERSION says: "7.2.22"
    source: str  # "qemu 1:7.2+dfsg-7+deb12u18"
    source_sha256: str  # the .dsc's, which names every file's hash
    patches: tuple[PatchRecord, ...]
    configure: tuple[str, ...]
    compiler: str
    key: str
    cached: bool = False
    build_s: float = 0.0
    steps_s: dict[str, float] = dataclasses.field(default_factory=dict)
    jobs: int = 0
    ccache: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def binary(self) -> Path:
        return self.directory / "bin" / BINARY

    def describe(self) -> str:
        """What a record says this QEMU is."""
        patches = "".join(f" + {Path(p.path).name}" for p in self.patches)
        return f"memqual build {self.name}: Debian {self.source}{patches}"

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["directory"] = str(self.directory)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any], directory: Path) -> BuiltQemu:
        return cls(
            name=str(data["name"]),
            directory=directory,
            version=str(data["version"]),
            source=str(data["source"]),
            source_sha256=str(data["source_sha256"]),
            patches=tuple(PatchRecord.from_json(p) for p in data.get("patches", ())),
            configure=tuple(map(str, data.get("configure", ()))),
            compiler=str(data["compiler"]),
            key=str(data["key"]),
            build_s=float(data.get("build_s", 0.0)),
            steps_s={str(k): float(v) for k, v in data.get("steps_s", {}).items()},
            jobs=int(data.get("jobs", 0)),
            ccache={str(k): int(v) for k, v in data.get("ccache", {}).items()},
        )


def builds_dir(cache: Path) -> Path:
    """The builds' folder, made if missing (by a build)."""
    return trusted_dir(cache / "qemu-builds", "QEMU build cache directory")


def _existing(cache: Path) -> Path | None:
    """The builds' folder, checked, or None when no build was ever made:
    reading never makes it."""
    return builds_dir(cache) if (cache / "qemu-builds").is_dir() else None


def load(entry: Path) -> BuiltQemu | None:
    """The build in ``entry``, or None when it is not a whole one."""
    manifest = entry / MANIFEST
    try:
        data = json.loads(manifest.read_text())
        built = BuiltQemu.from_json(data, entry)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return built if built.binary.is_file() and built.name == entry.name else None


def cached(key: str, cache: Path) -> BuiltQemu | None:
    root = _existing(cache)
    for entry in root.glob(f"*-{key}") if root is not None else ():
        built = load(entry)
        if built is not None:
            return dataclasses.replace(built, cached=True, build_s=0.0)
    return None


def named(name: str, cache: Path) -> BuiltQemu | None:
    """The build called ``name`` (what ``qemu build`` printed), or None:
    then ``name`` is a version of the archive's."""
    root = _existing(cache)
    if root is None or not BUILT_NAME.fullmatch(name.strip()):
        return None
    return load(root / name.strip())


def owning(binary: Path, cache: Path) -> BuiltQemu | None:
    """The build whose binary ``binary`` is, or None."""
    root = _existing(cache)
    if root is None:
        return None
    try:
        rel = binary.resolve().relative_to(root.resolve())
    except ValueError:
        return None
    if rel.parts[1:] != ("bin", BINARY):
        return None
    return named(rel.parts[0], cache)


def find(name: str, cache: Path) -> BuiltQemu:
    built = named(name, cache)
    if built is None:
        raise BadInput(f"no built QEMU {name!r}: memqual qemu list shows them; memqual qemu build makes one")
    return built


def listing(cache: Path) -> list[BuiltQemu]:
    root = _existing(cache)
    return [b for entry in sorted(root.iterdir()) if (b := load(entry)) is not None] if root is not None else []

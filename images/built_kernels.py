"""The kernels ``memqual kernel build`` made (images/kernel_build.py), as
the cache holds them: ``<cache>/kernels/<name>/`` with bzImage, config,
lib/modules/<release>, the balloon driver variant when it was built, and
manifest.json; and their names, which stand for them wherever a Debian
kernel is accepted by name (images/build.py)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from memqual.host.core import bounded
from memqual.host.core.errors import BadInput
from memqual.host.core.paths import cache_dir

# A built kernel's name: <release>-<16 hex digits of the key> (no Debian
# release ends so).
BUILT_NAME = re.compile(r"[0-9]+\.[0-9]+[0-9A-Za-z.+~-]*-[0-9a-f]{16}")
# A .config is 100 to 300 KiB; an allyesconfig's under 1 MiB.
CONFIG_MAX = 4 << 20
VARIANT = "virtio_balloon_mq.ko"  # the balloon driver variant beside the kernel (images/balloon_driver.py)


@dataclasses.dataclass(frozen=True)
class PatchRecord:
    """A patch as a built kernel's record names it."""

    path: str
    sha256: str
    subject: str
    files: tuple[str, ...]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PatchRecord:
        return cls(str(data["path"]), str(data["sha256"]), str(data["subject"]), tuple(map(str, data["files"])))


@dataclasses.dataclass(frozen=True)
class BuiltKernel:
    name: str
    release: str
    directory: Path
    source: str
    source_sha256: str
    patches: tuple[PatchRecord, ...]
    config_fragments: tuple[str, ...]
    compiler: str
    key: str
    config_unmet: tuple[str, ...] = ()
    balloon_variant_unavailable: str | None = None  # why there is no virtio_balloon_mq.ko, if there is none
    cached: bool = False
    build_s: float = 0.0
    steps_s: dict[str, float] = dataclasses.field(default_factory=dict)  # wall time of each step
    cpu_s: dict[str, float] = dataclasses.field(default_factory=dict)  # CPU time of each step's processes
    incremental: bool = False
    jobs: int = 0
    # the compile's ccache lookups: hits (direct + preprocessed) and misses;
    # empty when the build ran without ccache
    ccache: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def bzimage(self) -> Path:
        return self.directory / "bzImage"

    @property
    def modules(self) -> Path:
        return self.directory / "lib" / "modules" / self.release

    @property
    def config(self) -> Path:
        return self.directory / "config"

    def config_text(self) -> str:
        """The kernel's .config, which its build (maybe a patch's) wrote:
        read within bounds, and anything but UTF-8 text one BadInput line."""
        remedy = f"build it again (memqual kernel build --force), or remove {self.directory}"
        data = bounded.read_file(self.config, CONFIG_MAX, "kernel .config", remedy)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadInput(
                f"{self.config}: not UTF-8 text (byte {exc.start}), so no kernel .config: {remedy}"
            ) from None

    @property
    def balloon_variant(self) -> Path | None:
        ko = self.directory / VARIANT
        return ko if self.balloon_variant_unavailable is None and ko.is_file() else None

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["directory"] = str(self.directory)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any], directory: Path) -> BuiltKernel:
        """A manifest.json as ``to_json`` wrote it."""
        return cls(
            name=str(data["name"]),
            release=str(data["release"]),
            directory=directory,
            source=str(data["source"]),
            source_sha256=str(data["source_sha256"]),
            patches=tuple(PatchRecord.from_json(p) for p in data.get("patches", ())),
            config_fragments=tuple(map(str, data.get("config_fragments", ()))),
            compiler=str(data["compiler"]),
            key=str(data["key"]),
            config_unmet=tuple(map(str, data.get("config_unmet", ()))),
            balloon_variant_unavailable=data.get("balloon_variant_unavailable"),
            build_s=float(data.get("build_s", 0.0)),
            steps_s={str(k): float(v) for k, v in data.get("steps_s", {}).items()},
            cpu_s={str(k): float(v) for k, v in data.get("cpu_s", {}).items()},
            incremental=bool(data.get("incremental", False)),
            jobs=int(data.get("jobs", 0)),
            ccache={str(k): int(v) for k, v in data.get("ccache", {}).items()},
        )


def kernels_dir(cache: Path | None = None) -> Path:
    out = (cache or cache_dir()) / "kernels"
    out.mkdir(parents=True, exist_ok=True)
    return out


def cached(key: str, cache: Path | None = None) -> BuiltKernel | None:
    for entry in kernels_dir(cache).glob(f"*-{key}"):
        manifest = entry / "manifest.json"
        if manifest.is_file():
            kernel = BuiltKernel.from_json(json.loads(manifest.read_text()), entry)
            return dataclasses.replace(kernel, cached=True, build_s=0.0)
    return None


def named(name: str, cache: Path | None = None) -> BuiltKernel | None:
    """The built kernel called ``name`` (what ``kernel build`` printed), or
    None when no kernel was built by that name: then ``name`` is a Debian
    kernel's.  Wherever a Debian kernel is accepted by name, so is this."""
    if not BUILT_NAME.fullmatch(name.strip()):
        return None
    manifest = kernels_dir(cache) / name.strip() / "manifest.json"
    if not manifest.is_file():
        return None
    return BuiltKernel.from_json(json.loads(manifest.read_text()), manifest.parent)


def of_bzimage(bzimage: Path, cache: Path | None = None) -> BuiltKernel | None:
    """The built kernel whose bzImage this is, or None."""
    entry = kernels_dir(cache)
    try:
        rel = bzimage.resolve().relative_to(entry.resolve())
    except ValueError:
        return None
    if len(rel.parts) != 2 or rel.parts[1] != "bzImage":
        return None
    return named(rel.parts[0], cache)


def find(name: str, cache: Path | None = None) -> BuiltKernel:
    """A built kernel by the name ``kernel build`` printed, or one BadInput line."""
    kernel = named(name, cache)
    if kernel is None:
        raise BadInput(f"no built kernel {name!r}: memqual kernel list shows them; memqual kernel build makes one")
    return kernel


def listing(cache: Path | None = None) -> list[BuiltKernel]:
    found = []
    for manifest in sorted(kernels_dir(cache).glob("*/manifest.json")):
        found.append(BuiltKernel.from_json(json.loads(manifest.read_text()), manifest.parent))
    return found

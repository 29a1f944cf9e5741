"""Kernel module closure: the modules a guest needs, with everything they
depend on, copied with their real paths and indexed by ``depmod`` so the
guest's busybox ``modprobe`` resolves dependencies itself."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from memqual.host.core.errors import BadInput, CapabilityMissing
from memqual.images.kernel import check_release

# What the guest loads: the network and balloon drivers on both virtio
# transports (microvm uses virtio-mmio, pc/q35 virtio-pci).
GUEST_MODULES = ("virtio_mmio", "virtio_pci", "virtio_net", "virtio_balloon")
# Shipped when the kernel has them, loaded by the scenario that needs one
# (which skips without it): virtio-mem, the successor of ballooning; the
# rtl8139's driver (8139cp: QEMU's is a C+ chip, which 8139too leaves to it), seed 000's netperf NIC.
OPTIONAL_GUEST_MODULES = ("virtio_mem", "8139cp")
# What depmod is given of a modules tree: modules, by the names kbuild and
# the packages give them (INSTALL_MOD_STRIP, CONFIG_MODULE_COMPRESS_*), and
# the index files beside them.
MODULE_SUFFIXES = (".ko", ".ko.xz", ".ko.zst", ".ko.gz")
INDEX_PREFIX = "modules."
# Entries of a modules tree (files, folders, links): Debian 6.1's whole
# linux-image tree has 4,909 (4,023 modules in 883 folders), so this is
# three times that with room, and far from a tree made to stall depmod.
MAX_TREE_ENTRIES = 16384


def depmod(root: Path, release: str) -> None:
    """Write modules.dep & co. for ``root``/lib/modules/``release``."""
    exe = shutil.which("depmod") or "/usr/sbin/depmod"
    if not Path(exe).exists():
        raise CapabilityMissing("depmod not found: run ./setup (installs kmod)")
    proc = subprocess.run([exe, "-b", str(root), release], capture_output=True, text=True)
    if proc.returncode != 0:
        raise BadInput(f"depmod failed for {release}: {proc.stderr.strip()}")


def parse_modules_dep(text: str) -> dict[str, list[str]]:
    """modules.dep lines ``kernel/x/a.ko: kernel/y/b.ko ...`` as a mapping."""
    deps: dict[str, list[str]] = {}
    for line in text.splitlines():
        if ":" in line:
            module, rest = line.split(":", 1)
            deps[module.strip()] = rest.split()
    return deps


def module_name(path: str) -> str:
    name = Path(path).name
    for suffix in (".xz", ".zst", ".gz"):
        name = name.removesuffix(suffix)
    return name.removesuffix(".ko").replace("-", "_")


def closure(deps: dict[str, list[str]], wanted: tuple[str, ...]) -> list[str]:
    """Paths (relative to the release directory) of ``wanted`` modules and
    all their dependencies.  A wanted module that is neither a file nor
    built in is an error that names it."""
    by_name = {module_name(p): p for p in deps}
    result: list[str] = []
    stack = []
    for name in wanted:
        key = name.replace("-", "_")
        if key not in by_name:
            raise BadInput(f"kernel module {name} not found: build the kernel with CONFIG_{key.upper()}=m or =y")
        stack.append(by_name[key])
    while stack:
        path = stack.pop()
        if path in result:
            continue
        result.append(path)
        stack.extend(deps.get(path, []))
    return sorted(result)


def builtin_names(release_dir: Path) -> set[str]:
    builtin = release_dir / "modules.builtin"
    if not builtin.exists():
        return set()
    return {module_name(line) for line in builtin.read_text().split()}


def inside(root: Path, rel: str, what: str) -> Path:
    """``root``/``rel``, refused (one BadInput line) unless ``rel`` is a
    plain relative path (no '..', not absolute, no empty part) that still
    lies inside ``root`` once every symlink on the way is resolved.  The
    module tree is a user's: a line of its modules.dep must not make root
    read or write outside it."""
    parts = rel.split("/")
    if not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in rel:
        raise BadInput(f"{what}: {rel!r} is not a path inside {root}: give a modules tree kbuild or a package made")
    path = root / rel
    real_root = root.resolve()
    if not path.resolve().is_relative_to(real_root):
        raise BadInput(f"{what}: {rel!r} leads outside {root} through a symlink: give a tree without such links")
    return path


def stage_modules(
    source_release_dir: Path,
    release: str,
    dest_root: Path,
    extra: tuple[str, ...] = (),
    optional_extra: tuple[str, ...] = (),
) -> list[str]:
    """Copy the closure of GUEST_MODULES (and the ``extra`` ones, which must
    exist as modules or be built in; ``optional_extra`` when the kernel has
    them) from ``source_release_dir`` (a
    lib/modules/RELEASE tree) into ``dest_root``/lib/modules/RELEASE and run
    depmod there.  Returns the copied paths.

    Every path is checked before anything is written: the release has the
    kernel's release form, and each module path (from modules.dep) and
    metadata file stays inside both the source tree and the destination."""
    check_release(release, str(source_release_dir))
    if not source_release_dir.is_dir():
        raise BadInput(f"{source_release_dir}: no such modules directory (pass lib/modules/RELEASE)")
    dep_file = source_release_dir / "modules.dep"
    if not dep_file.exists():
        # Packages ship no modules.dep (it is made at install time): index a
        # scratch copy of the tree's metadata without touching the source.
        scratch = dest_root.parent / (dest_root.name + "-depmod")
        shutil.rmtree(scratch, ignore_errors=True)
        target = scratch / "lib/modules" / release
        target.parent.mkdir(parents=True)
        # depmod writes into the release dir: index a hard-linked copy of
        # what was checked (modules and index files, regular ones) only.
        for rel in checked_tree(source_release_dir):
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            os_link_or_copy(str(source_release_dir / rel), str(target / rel))
        depmod(scratch, release)
        dep_text = (target / "modules.dep").read_text()
        shutil.rmtree(scratch, ignore_errors=True)
    else:
        dep_text = dep_file.read_text()
    deps = parse_modules_dep(dep_text)
    built_in = builtin_names(source_release_dir)
    present = {module_name(p) for p in deps}
    optional = tuple(m for m in OPTIONAL_GUEST_MODULES + optional_extra if m in present and m not in built_in)
    wanted = tuple(m for m in GUEST_MODULES + extra if m not in built_in) + optional
    paths = closure(deps, wanted)
    dest = inside(dest_root, f"lib/modules/{release}", "kernel release")
    dep_source = str(dep_file if dep_file.exists() else "modules.dep")
    for rel in paths:
        if not is_module(rel):
            raise BadInput(
                f"{dep_source}: {rel!r} is not a module's name (*.ko, *.ko.xz): give a modules tree kbuild made"
            )
    copies = [(inside(source_release_dir, rel, dep_source), rel) for rel in paths]
    for rel in paths:
        inside(dest, rel, dep_source)
    for meta in ("modules.builtin", "modules.order", "modules.builtin.modinfo"):
        if (source_release_dir / meta).exists():
            copies.append((inside(source_release_dir, meta, str(source_release_dir)), meta))
    dest.mkdir(parents=True, exist_ok=True)  # even when every guest driver is built in
    for source, rel in copies:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, dest / rel)
    depmod(dest_root, release)
    return paths


def is_module(rel: str) -> bool:
    return rel.endswith(MODULE_SUFFIXES)


def checked_tree(release_dir: Path) -> list[str]:
    """What depmod may read of ``release_dir`` (a built kernel's came from
    the build user): its regular files named as modules anywhere below it
    and as index files (modules.*) at its top, by their relative names.
    Walked without following a link, so nothing outside the tree is named;
    links and every other entry are left out; a tree of more than
    MAX_TREE_ENTRIES entries is refused."""
    kept: list[str] = []
    entries = 0
    pending = [""]
    while pending:
        rel_dir = pending.pop()
        with os.scandir(release_dir / rel_dir) as listing:
            for entry in listing:  # counted as read: one huge folder is refused before it is all in memory
                entries += 1
                if entries > MAX_TREE_ENTRIES:
                    raise BadInput(
                        f"{release_dir}: more than {MAX_TREE_ENTRIES} files and folders, "
                        "not a kernel's modules tree: refused"
                    )
                rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
                if entry.is_dir(follow_symlinks=False):
                    pending.append(rel)
                elif entry.is_file(follow_symlinks=False) and (
                    is_module(rel) or (not rel_dir and rel.startswith(INDEX_PREFIX))
                ):
                    kept.append(rel)
    return sorted(kept)


def os_link_or_copy(src: str, dst: str) -> None:
    """Hard-link when possible (same filesystem, fast), else copy; a link
    itself never followed."""
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError:
        shutil.copy2(src, dst, follow_symlinks=False)

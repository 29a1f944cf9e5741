"""A QEMU built from Debian's source package: ``memqual qemu build``.

The source (images/qemu_sources.py) unpacked by the build user, Debian's
own patch series applied, then the user's patches; configured for
x86_64-softmmu with a fixed feature set (CONFIGURE) and compiled with
ninja; only the binary taken back, checked to run, and kept as
``<cache>/qemu-builds/<version>-<key>/`` whole or absent
(images/built_qemus.py).  docs/qemu-builds.md."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from memqual.host.core import bounded
from memqual.host.core.errors import BadInput, CapabilityMissing
from memqual.host.core.locks import file_lock
from memqual.host.core.paths import cache_dir
from memqual.host.core.printable import one_line
from memqual.images import packages, qemu_sources, unprivileged
from memqual.images.build_uids import own_uid
from memqual.images.built_qemus import BINARY, BuiltQemu, builds_dir, cached
from memqual.images.kernel_build import StepTimes, compiler_version
from memqual.images.kernel_env import STEP_TIMEOUT_S, ccache_counts, kbuild_parent, run_compile, run_ok
from memqual.images.kernel_patches import Patch, apply_patch, read_patch
from memqual.images.qemu_sources import QemuSource

RECIPE_VERSION = "1"  # bump when the steps change what comes out
# Debian packages a QEMU build needs beyond ./setup's gcc, make and ccache.
TOOLCHAIN = ("meson", "ninja-build", "pkg-config", "libglib2.0-dev", "libpixman-1-dev", "zlib1g-dev", "libslirp-dev")
# One target and the features memqual's guests use: KVM and TCG, user
# networking (the SSH forwards), malloc_trim (Debian's build has it: QEMU
# gives freed memory back with it, which the balloon's host side sees).
# Every other optional feature off, so what is built does not depend on
# which -dev packages a machine has.  The firmware is the system's, where
# Debian's QEMU finds it (qemu-system-data, seabios, ipxe-qemu).
CONFIGURE = (
    "--target-list=x86_64-softmmu",
    "--without-default-features",
    "--enable-kvm",
    "--enable-tcg",
    "--enable-slirp",
    "--enable-malloc-trim",
    "--disable-docs",
    "--disable-werror",
    "--firmwarepath=/usr/share/qemu:/usr/share/seabios:/usr/lib/ipxe/qemu",
)
COMPILE_TIMEOUT_S = 2 * 3600.0
NINJA_STEP = re.compile(r"^\[(\d+)/(\d+)\] (.*)")
TREE = "qemu"


def missing_toolchain() -> list[str]:
    """Toolchain packages not installed (dpkg's view)."""
    return packages.not_installed(TOOLCHAIN)


def check_toolchain() -> None:
    missing = missing_toolchain()
    if not shutil.which("gcc") or not shutil.which("patch"):
        missing = ["gcc", "patch", *missing]
    if missing:
        raise CapabilityMissing(f"building QEMU needs {' '.join(missing)}: run apt-get install {' '.join(missing)}")


def cache_key(source: QemuSource, patches: Sequence[Patch], compiler: str) -> str:
    parts = [RECIPE_VERSION, source.dsc_sha256, *(p.sha256 for p in patches), "|", *CONFIGURE, compiler]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


def pkgversion(source: QemuSource, key: str) -> str:
    """What the binary's --version says after its version: the build."""
    return f"memqual {key} of Debian {source.package_version}"


def build(
    version: str | None = None,
    patch_paths: Sequence[str | os.PathLike[str]] = (),
    *,
    jobs: int | None = None,
    force: bool = False,
    say: Callable[[str], None] = print,
) -> BuiltQemu:
    """Debian's qemu source of ``version`` with ``patch_paths`` applied in
    order, built once and cached."""
    started = time.monotonic()

    def shown(text: str) -> None:
        say(one_line(text))

    cache = cache_dir()
    patches = [read_patch(p) for p in patch_paths]
    source = qemu_sources.fetch(version, cache)
    compiler = compiler_version()
    key = cache_key(source, patches, compiler)
    hit = cached(key, cache)
    if hit is not None and not force:
        return hit
    check_toolchain()
    lock = builds_dir(cache) / f".lock-{key}"
    with file_lock(lock, exclusive=True, deadline_s=COMPILE_TIMEOUT_S, held="another build of this QEMU runs"):
        hit = cached(key, cache)
        if hit is not None and not force:
            return hit
        # a patch is input root must not trust: its build runs confined,
        # as a uid of its own (as a patched kernel's does)
        if patches and unprivileged.can_confine():
            with own_uid() as uid:
                return _build_as(uid, source, patches, compiler, key, cache, jobs, shown, started)
        return _build_as(None, source, patches, compiler, key, cache, jobs, shown, started)


def _build_as(
    uid: int | None,
    source: QemuSource,
    patches: Sequence[Patch],
    compiler: str,
    key: str,
    cache: Path,
    jobs: int | None,
    say: Callable[[str], None],
    started: float,
) -> BuiltQemu:
    user = unprivileged.build_user()
    jobs = jobs or os.cpu_count() or 1
    parent = kbuild_parent()
    name = f"qemu-{key}"
    if uid is not None:
        user = unprivileged.confined(user, parent, parent / name, uid)
    elif patches:
        say("  no mount namespace here: this build can write into ccache's folder")
    root = builds_dir(cache)
    folder = parent / name
    staging: Path | None = None
    times = StepTimes(say)
    try:
        folder = unprivileged.fresh_folder(parent, user, name)
        # a staging folder a killed build of this key left (the lock is ours)
        for stale in root.glob(f".staging-{key}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=f".staging-{key}-", dir=root))
        say(f"building {source.label}" + "".join(f" + {p.path.name}" for p in patches) + f" with -j{jobs}")
        times.timed("unpack", lambda: unpack(user, folder, source))
        debian = qemu_sources.series(source)
        times.timed(f"Debian's {len(debian)} patches", lambda: apply_series(user, folder, debian))
        for patch in patches:
            times.timed(f"patch {patch.path.name}", functools.partial(apply_patch, user, folder, patch, TREE))
        times.timed("configure", lambda: configure(user, folder, pkgversion(source, key)))
        before = ccache_counts(user, folder)
        times.timed("compile", lambda: compile_qemu(user, folder, jobs, say))
        after = ccache_counts(user, folder)
        lookups = {k: after[k] - before[k] for k in after if k in before}
        if lookups:
            say(f"  ccache: {lookups['hits']} hits, {lookups['misses']} misses")
        upstream = tree_version(user, folder)
        # run by the build user, where it was built: root runs no binary a
        # patch made before someone asks to run it
        version = times.timed("checks", lambda: check_binary(user, folder, pkgversion(source, key)))
        out = staging
        times.timed("copy out", lambda: send_binary(user, folder, out))
        built = BuiltQemu(
            name=f"{upstream}-{key}",
            directory=root / f"{upstream}-{key}",
            version=version,
            source=source.label,
            source_sha256=source.dsc_sha256,
            patches=tuple(p.record() for p in patches),
            configure=CONFIGURE,
            compiler=compiler,
            key=key,
            build_s=round(time.monotonic() - started, 1),
            steps_s=times.wall,
            jobs=jobs,
            ccache=lookups,
        )
        (staging / "manifest.json").write_text(json.dumps(built.to_json(), indent=2) + "\n")
        os.chmod(staging, 0o755)
        install(staging, built.directory)
        return built
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        if os.path.lexists(folder):
            unprivileged.remove_folder(user, folder)


def install(staging: Path, target: Path) -> None:
    """``staging`` made the entry ``target`` in one rename; an entry there
    (--force) is moved aside first and removed after, so the name never
    points at half of one."""
    aside = target.with_name(f".old-{target.name}-{os.getpid()}")
    try:
        if os.path.lexists(target):
            os.replace(target, aside)
        os.replace(staging, target)
    except OSError as exc:
        raise BadInput(f"{target} could not be replaced ({exc.strerror}): remove it and build again") from exc
    finally:
        shutil.rmtree(aside, ignore_errors=True)


# tar's option for each compression a 3.0 (quilt) tarball may have
DECOMPRESS = {".xz": "-J", ".gz": "-z", ".bz2": "-j"}


def unpack(user: unprivileged.BuildUser, folder: Path, source: QemuSource) -> None:
    """The upstream tarball into ``folder``/qemu and the Debian one over it,
    each read by root from its checked copy and unpacked by the build user."""
    home = folder / "home"
    unprivileged.run(user, ["mkdir", TREE], folder, home)
    for tarball, strip in ((source.orig, ["--strip-components=1"]), (source.debian, [])):
        # tar's complaints into root's unnamed file, not a pipe: a pipe
        # nobody reads while root writes its input could block both
        with tempfile.TemporaryFile() as err:
            untar = unprivileged.popen(
                user,
                [
                    "tar",
                    "-x",
                    DECOMPRESS[tarball.suffix],
                    "--no-same-owner",
                    "--no-same-permissions",
                    *strip,
                    "-f",
                    "-",
                ],
                folder / TREE,
                home,
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
            assert untar.stdin is not None
            try:
                with tarball.open("rb") as raw:
                    shutil.copyfileobj(raw, untar.stdin, 1 << 20)
                untar.stdin.close()
                status = untar.wait(timeout=STEP_TIMEOUT_S)
            except (BrokenPipeError, subprocess.TimeoutExpired) as exc:
                raise BadInput(
                    f"unpacking {tarball.name} failed ({exc}): remove {source.directory}, try again"
                ) from exc
            finally:
                if untar.poll() is None:
                    unprivileged.end_group(untar)
            if status != 0:
                err.seek(0)
                last = err.read(bounded.TAIL_MAX).decode(errors="replace").strip().splitlines()[-1:] or ["?"]
                raise BadInput(f"unpacking {tarball.name} failed: {one_line(last[0])}")


def apply_series(user: unprivileged.BuildUser, folder: Path, series: Sequence[qemu_sources.SeriesPatch]) -> None:
    """Debian's patches in order, as dpkg-source would apply them."""
    tree, home = folder / TREE, folder / "home"
    for patch in series:
        argv = ["patch", f"-p{patch.strip}", "--batch", "--forward", "--no-backup-if-mismatch", "--reject-file=-"]
        run_ok(user, [*argv, "-i", f"debian/patches/{patch.name}"], tree, home, f"Debian's patch {patch.name}")


def configure(user: unprivileged.BuildUser, folder: Path, version_note: str) -> None:
    tree, home = folder / TREE, folder / "home"
    run_ok(user, ["mkdir", "-p", "build"], tree, home, "making build/")
    run_ok(
        user,
        ["../configure", *CONFIGURE, f"--with-pkgversion={version_note}"],
        tree / "build",
        home,
        "QEMU's configure",
    )


def compile_qemu(user: unprivileged.BuildUser, folder: Path, jobs: int, say: Callable[[str], None]) -> None:
    """ninja's build of the one binary, its progress a line every 15 s; a
    failure is the compiler's last lines (on stderr) and one line naming
    the file (kernel_env.run_compile)."""
    begun = time.monotonic()
    shown = [begun]

    def progress(text: str) -> None:
        step = NINJA_STEP.match(text)
        now = time.monotonic()
        if step and now - shown[0] >= 15.0:
            shown[0] = now
            done, total = int(step.group(1)), int(step.group(2))
            left = (now - begun) * (total - done) / done if done else 0.0
            say(f"  building: {done} of {total} steps, {(now - begun) / 60:.1f} min so far, ~{left / 60:.1f} min left")

    argv = ["ninja", f"-j{jobs}", BINARY]
    run_compile(user, argv, folder / TREE / "build", folder / "home", COMPILE_TIMEOUT_S, progress, "the QEMU build")


# the binary alone; 7.2's is about 60 MB, with debug information 150 MB
OUTPUTS = unprivileged.Outputs(
    files=(re.compile(f"bin/{re.escape(BINARY)}"),), folders=(re.compile("bin"),), max_entries=4, max_bytes=512 << 20
)


def send_binary(user: unprivileged.BuildUser, folder: Path, staging: Path) -> None:
    """The binary alone sent to root's ``staging`` as a tar stream."""
    tree, home = folder / TREE, folder / "home"
    run_ok(user, ["mkdir", "-p", "../out/bin"], tree, home, "making out/")
    run_ok(user, ["cp", f"build/{BINARY}", f"../out/bin/{BINARY}"], tree, home, "copying the binary")
    sender = unprivileged.popen(
        user, ["tar", "-c", "-f", "-", "-C", "../out", "."], tree, home, stderr=subprocess.DEVNULL
    )
    assert sender.stdout is not None
    try:
        unprivileged.receive(sender.stdout, staging, OUTPUTS)
    finally:
        sender.stdout.close()
        try:
            status = sender.wait(timeout=STEP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            unprivileged.end_group(sender)
            status = -1
    if status != 0:
        raise BadInput("sending the built QEMU back failed")
    if not (staging / "bin" / BINARY).is_file():
        raise BadInput(f"the build left no {BINARY}")


def tree_version(user: unprivileged.BuildUser, folder: Path) -> str:
    """The tree's VERSION (7.2.22), read by the build user, whose file it is."""
    out = run_ok(user, ["cat", "VERSION"], folder / TREE, folder / "home", "reading VERSION").stdout.strip()
    if not re.fullmatch(r"[0-9]+\.[0-9]+[0-9.]*", out):
        raise BadInput(f"the tree's VERSION says {out[:40]!r}, no QEMU version: refused")
    return out


def check_binary(user: unprivileged.BuildUser, folder: Path, version_note: str) -> str:
    """The built binary, run by the build user, answers --version with its
    build's note; its version."""
    proc = unprivileged.run(user, [f"./{BINARY}", "--version"], folder / TREE / "build", folder / "home", timeout=60)
    match = re.search(r"QEMU emulator version (\S+) \((.*)\)", proc.stdout)
    if proc.returncode != 0 or match is None or match.group(2) != version_note:
        raise BadInput(f"the built {BINARY} does not say it is this build: {proc.stdout.strip()[:120]!r}")
    return match.group(1)

"""A guest kernel built from source: ``memqual kernel build``.

The build itself as the build user (images/unprivileged.py): the
toolchain, the compile with its progress, the balloon driver variant, the
install and the checks of what comes back, and the result's cache entry
``<cache>/kernels/<release>-<key>/``, whole or absent.  Its source, patches,
config, environment and kept base tree are in kernel_sources, kernel_patches,
kernel_config, kernel_env and tree_copy; the A/B of a patch in kernel_arms.
docs/patch-qualification.md, "images/kernel_build.py", has the details."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from memqual.host.core.errors import BadInput, CapabilityMissing
from memqual.host.core.locks import file_lock
from memqual.host.core.paths import cache_dir
from memqual.host.core.printable import one_line
from memqual.images import packages, tree_copy, unprivileged
from memqual.images.build_uids import own_uid
from memqual.images.built_kernels import VARIANT, BuiltKernel, cached, kernels_dir
from memqual.images.kernel import check_release, read_release
from memqual.images.kernel_config import assemble_config, kept_config, read_fragment
from memqual.images.kernel_env import STEP_TIMEOUT_S, build_env, ccache_counts, kbuild_parent, run_compile, run_ok
from memqual.images.kernel_patches import Patch, apply_patch, config_touched, patch_failure, read_patch
from memqual.images.kernel_sources import Source, resolve_source, unpack
from memqual.images.modules import INDEX_PREFIX, MAX_TREE_ENTRIES, MODULE_SUFFIXES

T = TypeVar("T")
GUEST_CONFIG = Path(__file__).resolve().with_name("guest.config")
# On top of GUEST_CONFIG, what makes a kernel a host under test (L1): KVM
# for AMD as modules and the fw_cfg reader (docs/host-under-test.md).
HOST_CONFIG = GUEST_CONFIG.with_name("host.config")
RECIPE_VERSION = "2"  # bump when the build steps change what comes out
# Debian packages the build needs beyond ./setup's gcc and make.
TOOLCHAIN = ("bc", "flex", "bison", "libelf-dev", "libssl-dev", "ccache")
COMPILE_TIMEOUT_S = 4 * 3600.0
# kbuild's short lines: what make is doing, one a file.
KBUILD_STEP = re.compile(r"^\s{2}([A-Z0-9_]+(?: \[M\])?)\s+(\S+)")
FIRST_BUILD_STEPS = 3600  # kbuild lines of a first x86_64_defconfig+guest build, when none was timed here


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def missing_toolchain() -> list[str]:
    """Toolchain packages not installed (dpkg's view)."""
    return packages.not_installed(TOOLCHAIN)


def check_toolchain() -> None:
    missing = missing_toolchain()
    if not shutil.which("gcc") or not shutil.which("make"):
        missing = ["gcc", "make", *missing]
    if missing:
        raise CapabilityMissing(f"building a kernel needs {' '.join(missing)}: run apt-get install {' '.join(missing)}")


def compiler_version() -> str:
    gcc = shutil.which("gcc")
    if gcc is None:
        raise CapabilityMissing("gcc not found: run ./setup (installs gcc)")
    try:
        proc = subprocess.run([gcc, "--version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        raise CapabilityMissing(f"{gcc} --version failed ({exc}): run ./setup (installs gcc)") from exc
    return (proc.stdout.splitlines() or ["gcc (no version)"])[0]


@dataclasses.dataclass
class Progress:
    """What ``make`` is doing, as one line every ``every_s``: steps done,
    the last file, and the time left estimated from the expected steps."""

    expected: int
    every_s: float = 15.0
    say: Callable[[str], None] = print
    done: int = 0
    last: str = ""
    started: float = dataclasses.field(default_factory=time.monotonic)
    shown: float = 0.0
    # when the first link step came (vmlinux.o, or modpost where no built-in
    # object changed; not a composite module's "LD [M] x.o", which kbuild
    # links while it still compiles): the compile's time before it, the
    # linking's after
    link_at: float | None = None

    def line(self, text: str) -> None:
        step = KBUILD_STEP.match(text)
        if step is None:
            return
        self.done += 1
        self.last = f"{step.group(1)} {step.group(2)}"
        if self.link_at is None and (
            step.group(1) == "MODPOST" or (step.group(1) == "LD" and step.group(2) == "vmlinux.o")
        ):
            self.link_at = time.monotonic()
        now = time.monotonic()
        if now - self.shown >= self.every_s:
            self.shown = now
            self.say(self.status(now))

    def status(self, now: float) -> str:
        elapsed = now - self.started
        share = min(self.done / self.expected, 0.99) if self.expected else 0.0
        left = elapsed * (1 - share) / share if share > 0 else 0.0
        return (
            f"  building: {self.done} of ~{self.expected} steps ({share:.0%}), {elapsed / 60:.1f} min so far, "
            f"~{left / 60:.1f} min left; now {self.last}"
        )


def compile_kernel(user: unprivileged.BuildUser, folder: Path, jobs: int, progress: Progress) -> None:
    """make bzImage modules, its progress read from kbuild's lines; a
    failure is the compiler's last lines (on stderr) and one line naming
    the file (kernel_env.run_compile)."""
    argv = ["make", f"-j{jobs}", "bzImage", "modules"]
    run_compile(user, argv, folder / "linux", folder / "home", COMPILE_TIMEOUT_S, progress.line, "the kernel build")


def build_variant(user: unprivileged.BuildUser, folder: Path) -> str | None:
    """The balloon driver variant (guest/virtio_balloon-mq.patch on this
    tree's own virtio_balloon.c) built against the tree as the build user
    into out/; None when built, else why not (the kernel is usable without
    it: the balloon-driver scenario then skips with this reason)."""
    from memqual.images.balloon_driver import MODULE, PATCH, SOURCE_MEMBER

    tree, home = folder / "linux", folder / "home"
    run_ok(user, ["mkdir", "-p", "../variant", "../out"], tree, home, "making the variant's folder")
    # a copy patched in place: GNU patch's -o into another folder fails with
    # EXDEV on some filesystems (overlayfs here)
    copied = unprivileged.run(user, ["cp", SOURCE_MEMBER, f"../variant/{MODULE}.c"], tree, home)
    if copied.returncode != 0:
        return f"{PATCH.name} does not apply: this tree has no {SOURCE_MEMBER}"
    proc = unprivileged.run(
        user,
        ["patch", "--batch", "-s", "--no-backup-if-mismatch", "--read-only=ignore", f"../variant/{MODULE}.c"],
        tree,
        home,
        stdin=PATCH.read_bytes(),
        timeout=STEP_TIMEOUT_S,
    )
    if proc.returncode != 0:
        return f"{PATCH.name} does not apply to this tree's {SOURCE_MEMBER}: {patch_failure(proc.stdout + proc.stderr)}"
    run_ok(
        user,
        ["tee", "../variant/Kbuild"],
        tree,
        home,
        "writing the variant's Kbuild",
        f"obj-m := {MODULE}.o\n".encode(),
    )
    proc = unprivileged.run(
        user, ["make", "-s", "M=../variant", "modules"], tree, home, env=build_env(user), timeout=STEP_TIMEOUT_S
    )
    if proc.returncode != 0:
        lines = [line for line in (proc.stderr + proc.stdout).splitlines() if "error" in line.lower()][:2]
        return f"building {MODULE}.ko against this tree failed: {' | '.join(lines) or 'make failed'}"
    run_ok(user, ["cp", f"../variant/{MODULE}.ko", f"../out/{MODULE}.ko"], tree, home, "copying the variant")
    return None


def build_outputs(release: str) -> unprivileged.Outputs:
    """What root takes back from a build of ``release``: what install_and_send
    puts in out/ and nothing else (manifest.json is root's own, written
    after), at most a modules tree's worth of entries."""
    tree = f"lib/modules/{re.escape(release)}"
    module = "|".join(re.escape(suffix) for suffix in MODULE_SUFFIXES)
    return unprivileged.Outputs(
        files=(
            re.compile(f"bzImage|config|{re.escape(VARIANT)}"),
            re.compile(rf"{tree}/{re.escape(INDEX_PREFIX)}[^/]+"),
            re.compile(rf"{tree}/(?:[^/]+/)*[^/]+(?:{module})"),
        ),
        folders=(re.compile(rf"lib|lib/modules|{tree}(?:/[^/]+)*"),),
        max_entries=MAX_TREE_ENTRIES,
    )


def install_and_send(user: unprivileged.BuildUser, folder: Path, staging: Path, release: str) -> list[str]:
    """modules_install into the build folder's out/, the kernel and .config
    beside it, then out/ sent to root's ``staging`` as a tar stream, kept as
    far as ``build_outputs`` allows."""
    tree, home = folder / "linux", folder / "home"
    run_ok(user, ["mkdir", "-p", "../out"], tree, home, "making out/")
    run_ok(
        user,
        ["make", "-s", "modules_install", "INSTALL_MOD_PATH=../out", "INSTALL_MOD_STRIP=1", "DEPMOD=/bin/true"],
        tree,
        home,
        "make modules_install",
    )
    run_ok(user, ["cp", "arch/x86/boot/bzImage", "../out/bzImage"], tree, home, "copying bzImage")
    run_ok(user, ["cp", ".config", "../out/config"], tree, home, "copying .config")
    sender = unprivileged.popen(
        user, ["tar", "-c", "-f", "-", "-C", "../out", "."], tree, home, stderr=subprocess.DEVNULL
    )
    assert sender.stdout is not None
    try:
        skipped = unprivileged.receive(sender.stdout, staging, build_outputs(release))
    finally:
        # a refused stream's sender ends on its closed pipe; the refusal,
        # not that, is what is said
        sender.stdout.close()
        try:
            status = sender.wait(timeout=STEP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            unprivileged.end_group(sender)
            status = -1
    if status != 0:
        raise BadInput("sending the built kernel back failed")
    return skipped


def check_artefacts(staging: Path, release: str) -> None:
    """What root keeps: a bzImage of exactly ``release`` and its modules."""
    if not (staging / "bzImage").is_file():
        raise BadInput("the build left no bzImage")
    built = read_release(staging / "bzImage")
    if built != release:
        raise BadInput(f"the bzImage says release {built}, kbuild said {release}: refused")
    modules = staging / "lib" / "modules" / release
    if not (modules / "modules.order").is_file():
        raise BadInput(f"the build left no modules tree lib/modules/{release}")


# ------------------------------------------------------------ the build


def cache_key(source: Source, patches: Sequence[Patch], fragments: Sequence[tuple[str, bytes]], compiler: str) -> str:
    from memqual.images.balloon_driver import PATCH as VARIANT_PATCH

    parts = [
        RECIPE_VERSION,
        _sha256(VARIANT_PATCH.read_bytes()),  # the balloon driver variant built beside the kernel
        source.sha256,
        *(p.sha256 for p in patches),
        "|",
        *(_sha256(data) for _, data in fragments),
        compiler,
    ]
    return _sha256("\n".join(parts).encode())[:16]


def _children_cpu_s() -> float:
    """User + system CPU seconds of every child process waited for so far
    (make's compilers included: each parent waits for its own)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _expected_steps(cache: Path, incremental: bool) -> int:
    record = kernels_dir(cache) / ".steps.json"
    try:
        known = json.loads(record.read_text())
        return int(known["incremental" if incremental else "full"])
    except (OSError, ValueError, KeyError, TypeError):
        return 60 if incremental else FIRST_BUILD_STEPS


def _remember_steps(cache: Path, incremental: bool, steps: int) -> None:
    from memqual.host.core.paths import write_private_atomic

    record = kernels_dir(cache) / ".steps.json"
    try:
        known = json.loads(record.read_text())
    except (OSError, ValueError):
        known = {}
    known["incremental" if incremental else "full"] = max(steps, 1)
    write_private_atomic(record, json.dumps(known).encode(), 0o644)


def _escaped(say: Callable[[str], None]) -> Callable[[str], None]:
    """``say`` with each control character shown as an escape: what a
    build says holds make's file names and a patch's, whoever prints it
    (kernel build, run --patch, a bisect's builds, a test's log)."""

    def shown(text: str) -> None:
        say(one_line(text))

    return shown


def build(
    source_spec: str,
    patch_paths: Sequence[str | os.PathLike[str]] = (),
    config_paths: Sequence[str | os.PathLike[str]] = (),
    *,
    jobs: int | None = None,
    force: bool = False,
    say: Callable[[str], None] = print,
) -> BuiltKernel:
    """The kernel of ``source_spec`` with ``patch_paths`` applied in order
    and the config fragments on top of memqual's, built once and cached."""
    started = time.monotonic()
    say = _escaped(say)
    cache = cache_dir()
    patches = [read_patch(p) for p in patch_paths]
    fragments = [(str(GUEST_CONFIG), GUEST_CONFIG.read_bytes()), *(read_fragment(p) for p in config_paths)]
    source = resolve_source(source_spec, cache)
    compiler = compiler_version()
    key = cache_key(source, patches, fragments, compiler)
    hit = cached(key, cache)
    if hit is not None and not force:
        return hit
    check_toolchain()
    # One build of a key at a time (and of a base tree: A's and B's share
    # it); the second finds the first's kernel in the cache.
    lock = kernels_dir(cache) / f".lock-{cache_key(source, [], fragments, compiler)}"
    with file_lock(lock, exclusive=True, deadline_s=COMPILE_TIMEOUT_S, held="another build of this source runs"):
        hit = cached(key, cache)
        if hit is not None and not force:
            return hit
        base_key = cache_key(source, [], fragments, compiler)
        base = kbuild_parent() / f"base-{base_key}"
        problem = tree_copy.base_problem(base) if patches and cached(base_key, cache) is not None else None
        if problem is not None:
            # the unpatched kernel is cached but its sealed tree is not there
            # (gone, refused, or of an older memqual): built again and kept,
            # not installed (the cached kernel stays), so that this build
            # and the next patches' are incremental.  Without the unpatched
            # kernel, a patched build is a full one and keeps nothing: a
            # patch that does not apply is then found at once.
            say(f"  the base tree is {problem}: building the unpatched source first, kept as the base")
            tree_copy.remove_base(base)
            _build(source, [], fragments, compiler, base_key, cache, jobs, say, time.monotonic(), install=False)
        return _build(source, patches, fragments, compiler, key, cache, jobs, say, started)


def _build(
    source: Source,
    patches: Sequence[Patch],
    fragments: Sequence[tuple[str, bytes]],
    compiler: str,
    key: str,
    cache: Path,
    jobs: int | None,
    say: Callable[[str], None],
    started: float,
    install: bool = True,
) -> BuiltKernel:
    """One build in its base's build folder; a patched one, or one with a
    --config fragment, where the host gives it namespaces
    (``can_confine``), confined and as a uid of its own for as long as it
    runs (images/build_uids.py)."""
    args = (source, patches, fragments, compiler, key, cache, jobs, say, started, install)
    if (patches or len(fragments) > 1) and unprivileged.can_confine():
        with own_uid() as uid:
            return _build_as(uid, *args)
    return _build_as(None, *args)


def _build_as(
    uid: int | None,
    source: Source,
    patches: Sequence[Patch],
    fragments: Sequence[tuple[str, bytes]],
    compiler: str,
    key: str,
    cache: Path,
    jobs: int | None,
    say: Callable[[str], None],
    started: float,
    install: bool,
) -> BuiltKernel:
    user = unprivileged.build_user()
    jobs = jobs or os.cpu_count() or 1
    parent = kbuild_parent()
    base_key = cache_key(source, [], fragments, compiler)
    base = parent / f"base-{base_key}"
    times = StepTimes(say)
    # One path for every build of this base (they are serialized by the
    # caller's lock): kbuild writes the absolute path into objtool's build,
    # so a copy of the base elsewhere would relink objtool and recompile
    # every object after it.
    name = f"work-{base_key}"
    if uid is not None:
        # a patch, and a --config fragment (its string values reach make
        # and the shell as they are, kernel_config.FRAGMENT_VALUE), is input
        # root must not trust: its build's steps see the build parent
        # read-only (ccache's folder, every other build's) and run as a uid
        # no other process has
        user = unprivileged.confined(user, parent, parent / name, uid)
    elif patches or len(fragments) > 1:
        say("  no mount namespace here: this build can write into ccache's folder")
    folder = unprivileged.fresh_folder(parent, user, name)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=kernels_dir(cache)))
    incremental = bool(patches) and _base_tree_usable(base, say)
    keep_as_base = not patches
    try:
        say(f"building {source.label}" + "".join(f" + {p.path.name}" for p in patches) + f" with -j{jobs}")
        incremental, sources_end_ns = _kernel_tree(user, source, base, folder, incremental, times)
        for patch in patches:
            times.timed(f"patch {patch.path.name}", functools.partial(apply_patch, user, folder, patch))
        touched = config_touched(patches)
        missing = _configure(user, folder, fragments, incremental and not touched, times)
        lookups = _compile(user, folder, cache, jobs, incremental, times)
        # after the compile: before it, kbuild has no include/config/auto.conf
        # yet and kernelrelease leaves CONFIG_LOCALVERSION out
        release = check_release(
            run_ok(
                user, ["make", "-s", "kernelrelease"], folder / "linux", folder / "home", "make kernelrelease"
            ).stdout.strip(),
            "make kernelrelease",
        )
        run_ok(user, ["rm", "-rf", "../out", "../variant"], folder / "linux", folder / "home", "clearing out/")
        no_variant = times.timed("balloon driver variant", lambda: build_variant(user, folder))
        if no_variant:
            say(f"  no balloon driver variant: {no_variant}")
        # the modules tree's build/source links stay behind (install_and_send)
        times.timed("install + copy out", lambda: install_and_send(user, folder, staging, release))
        times.timed("checks", lambda: check_artefacts(staging, release))
        kernel = BuiltKernel(
            name=f"{release}-{key}",
            release=release,
            directory=kernels_dir(cache) / f"{release}-{key}",
            source=source.label,
            source_sha256=source.sha256,
            patches=tuple(p.record() for p in patches),
            config_fragments=tuple(name for name, _ in fragments),
            compiler=compiler,
            key=key,
            config_unmet=tuple(missing),
            balloon_variant_unavailable=no_variant,
            build_s=round(time.monotonic() - started, 1),
            steps_s=times.wall,
            cpu_s=times.cpu,
            incremental=incremental,
            jobs=jobs,
            ccache=lookups,
        )
        if install:
            _install(kernel, staging)
        if keep_as_base:
            _keep_as_base(folder, base, sources_end_ns, say)
        return kernel
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if folder.exists():
            begun = time.monotonic()
            unprivileged.remove_folder(user, folder)
            say(f"  removing the build folder: {time.monotonic() - begun:.0f} s")


@dataclasses.dataclass
class StepTimes:
    """A build's steps, each announced, with its wall time and the CPU time
    of the processes it ran (what a shared machine's load does not change)."""

    say: Callable[[str], None]
    wall: dict[str, float] = dataclasses.field(default_factory=dict)
    cpu: dict[str, float] = dataclasses.field(default_factory=dict)

    def timed(self, name: str, step: Callable[[], T]) -> T:
        begun, begun_cpu = time.monotonic(), _children_cpu_s()
        self.say(f"  {name} ...")
        result = step()
        self.wall[name] = round(time.monotonic() - begun, 1)
        self.cpu[name] = round(_children_cpu_s() - begun_cpu, 1)
        return result


def _base_tree_usable(base: Path, say: Callable[[str], None]) -> bool:
    """Whether a patched build starts from the kept base tree; one that is
    there but refused is removed."""
    problem = tree_copy.base_problem(base)
    if problem is not None and problem != "absent":
        # detected, refused, and rebuilt: B from the source (ccache's),
        # the next unpatched build kept as the base again
        say(f"  the kept base tree {base.name} is {problem}: removed; building from the source")
        tree_copy.remove_base(base)
    return problem is None


def _kernel_tree(
    user: unprivileged.BuildUser, source: Source, base: Path, folder: Path, incremental: bool, times: StepTimes
) -> tuple[bool, int]:
    """``folder``/linux: a copy of the base tree for an incremental build,
    else the source unpacked (also when the copy fails); whether the build
    is incremental, and the time (ns) unpacking gave (0 for a copy)."""
    sources_end_ns = 0
    if incremental:
        try:
            copied = times.timed("copy A's tree", lambda: tree_copy.copy_base(user, base, folder))
            times.say(f"  copy A's tree: {copied}")
        except BadInput as exc:  # a full disk, say
            times.say(f"  {exc}: building from the source instead")
            run_ok(user, ["rm", "-rf", "linux"], folder, folder / "home", "removing the partial copy")
            incremental = False
    if not incremental:
        sources_end_ns = times.timed("unpack", lambda: unpack(source, user, folder))
    return incremental, sources_end_ns


def _configure(
    user: unprivileged.BuildUser,
    folder: Path,
    fragments: Sequence[tuple[str, bytes]],
    keep_base: bool,
    times: StepTimes,
) -> list[str]:
    """The tree's .config (the base's kept, or assembled from the
    fragments); what the fragments ask that it does not have."""
    if keep_base:
        # the patches touch no Kconfig: the base's .config is this build's
        _, missing = times.timed("config (A's .config kept)", lambda: kept_config(user, folder, fragments))
    else:
        _, missing = times.timed("config", lambda: assemble_config(user, folder, fragments))
    for line in missing:
        times.say(f"  config: the fragments ask {line}")
    return missing


def _compile(
    user: unprivileged.BuildUser, folder: Path, cache: Path, jobs: int, incremental: bool, times: StepTimes
) -> dict[str, int]:
    """The compile, with its progress and its wall time split at make's
    first link step; ccache's hits and misses during it."""
    progress = Progress(_expected_steps(cache, incremental), say=times.say)
    before = ccache_counts(user, folder)
    times.timed("compile", lambda: compile_kernel(user, folder, jobs, progress))
    if progress.link_at is not None:
        total = times.wall.pop("compile")
        linking = round(min(time.monotonic() - progress.link_at, total), 1)
        times.wall["compile"] = round(total - linking, 1)
        times.wall["link + modules"] = linking
    after = ccache_counts(user, folder)
    lookups = {k: after[k] - before[k] for k in after if k in before}
    if lookups:
        times.say(f"  ccache: {lookups['hits']} hits, {lookups['misses']} misses")
    _remember_steps(cache, incremental, progress.done)
    return lookups


def _install(kernel: BuiltKernel, staging: Path) -> None:
    """The staged kernel, with its manifest, made its cache entry."""
    (staging / "manifest.json").write_text(json.dumps(kernel.to_json(), indent=2) + "\n")
    os.chmod(staging, 0o755)
    shutil.rmtree(kernel.directory, ignore_errors=True)
    os.replace(staging, kernel.directory)


def _keep_as_base(folder: Path, base: Path, sources_end_ns: int, say: Callable[[str], None]) -> None:
    """An unpatched build's tree kept, sealed, as the base of patched
    builds; a tree that cannot be kept is said and left."""
    begun = time.monotonic()
    try:
        tree_copy.keep_base(folder, base, sources_end_ns)
        say(f"  kept as the base of patched builds (sealed): {time.monotonic() - begun:.0f} s")
    except (OSError, tree_copy.TreeRefused) as exc:
        say(f"  not kept as the base of patched builds: {exc}")

"""memqual kernel build (images/kernel_build.py, images/unprivileged.py):
its parts on their own (patch records, config fragments, cache keys, the
tar stream root takes back), and whole builds of a tiny fake kernel tree
through the real privilege drop: a patch that does not apply, a build that
fails, a hostile Makefile and a patch with a symlink.  No real kernel is
compiled here (that is the slow profile's and docs/patch-qualification.md's)."""

from __future__ import annotations

import argparse
import dataclasses
import io
import os
import re
import shutil
import signal
import stat
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import fake_kernel
import pytest
from build_parent import build_parent

from memqual.host.core.errors import BadInput, CapabilityMissing
from memqual.images import (
    balloon_driver,
    built_kernels,
    kernel_arms,
    kernel_config,
    kernel_env,
    kernel_patches,
    kernel_sources,
    tree_copy,
    unprivileged,
)
from memqual.images import kernel_build as kb
from memqual.images.build import debian_kernel_files

RELEASE = "1.2.3-memqual"

FORMAT_PATCH = """From 1234 Mon Sep 17 00:00:00 2001
From: A Developer <dev@example.org>
Subject: [PATCH v2 3/7] virtio_balloon: a longer subject
 that goes on

Body.
---
 drivers/virtio/virtio_balloon.c | 2 +-
 mm/gone.c | 1 -

diff --git a/drivers/virtio/virtio_balloon.c b/drivers/virtio/virtio_balloon.c
--- a/drivers/virtio/virtio_balloon.c
+++ b/drivers/virtio/virtio_balloon.c
@@ -1 +1 @@
-a
+b
diff --git a/mm/gone.c b/mm/gone.c
--- a/mm/gone.c
+++ /dev/null
@@ -1 +0,0 @@
-x
"""


# ------------------------------------------------------------ the parts


def test_patch_record_subject_files_hash(tmp_path: Path) -> None:
    path = tmp_path / "p.patch"
    path.write_text(FORMAT_PATCH)
    patch = kernel_patches.read_patch(path)
    assert patch.subject == "virtio_balloon: a longer subject that goes on"
    assert patch.files == ("drivers/virtio/virtio_balloon.c", "mm/gone.c")
    other = tmp_path / "q.patch"
    other.write_text(FORMAT_PATCH.replace("+b", "+c"))
    assert kernel_patches.read_patch(other).sha256 != patch.sha256
    plain = tmp_path / "plain.diff"
    plain.write_text("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n")
    assert kernel_patches.read_patch(plain).subject == "plain.diff"


def test_patch_that_is_no_file_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="no such file"):
        kernel_patches.read_patch(tmp_path / "missing.patch")


def test_fragment_wants_and_what_olddefconfig_did_not_keep() -> None:
    wants = kernel_config.fragment_wants("CONFIG_A=y\n# CONFIG_B is not set\nCONFIG_C=m\n# a comment\n")
    assert wants == {"CONFIG_A": "y", "CONFIG_B": "n", "CONFIG_C": "m"}
    final = kernel_config.config_values("CONFIG_A=y\nCONFIG_B=y\nCONFIG_C=y\n")
    assert kernel_config.unmet(wants, final) == ["CONFIG_B=n (got y)", "CONFIG_C=m (got y)"]
    assert kernel_config.unmet(wants, kernel_config.config_values("CONFIG_A=y\nCONFIG_C=m\n")) == []


def test_config_diff_lists_only_what_differs() -> None:
    a = "CONFIG_A=y\nCONFIG_B=m\n# CONFIG_C is not set\n"
    b = "CONFIG_A=y\nCONFIG_B=y\nCONFIG_C=y\n"
    assert kernel_config.config_diff(a, b) == ["CONFIG_B: m -> y", "CONFIG_C: n -> y"]
    assert kernel_config.config_diff(a, a) == []


def test_user_fragment_is_checked(tmp_path: Path) -> None:
    good = tmp_path / "good.config"
    good.write_text("# mine\nCONFIG_KASAN=y\n# CONFIG_X is not set\n")
    assert kernel_config.read_fragment(good)[1] == good.read_bytes()
    bad = tmp_path / "bad.config"
    bad.write_text("CONFIG_A=y\nrm -rf /\n")
    with pytest.raises(BadInput, match=r"bad.config:2"):
        kernel_config.read_fragment(bad)


@pytest.mark.parametrize(
    "value",
    [
        '"$(shell touch /tmp/x)"',  # make runs it where kbuild expands the symbol (auto.conf)
        "$(shell touch /tmp/x)",
        '"${shell touch /tmp/x}"',
        '"`touch /tmp/x`"',
        '"x; touch /tmp/x"',  # a recipe's shell: CONFIG_INITRAMFS_SOURCE is a word of gen_initramfs.sh's
        '"x | sh"',
        '"x && sh"',
        '"x > /tmp/x"',
        '"a\\" b"',
        "y # $(shell id)",
        "'x'",
    ],
)
def test_fragment_values_make_or_the_shell_would_run_are_refused(
    tmp_path: Path, value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """kernel build --config and run --kernel-config read fragments here
    before anything is fetched or built: one line, exit 2."""
    from one_line_errors import assert_one_line_error, in_process

    fragment = tmp_path / "f.config"
    fragment.write_text(f"CONFIG_A=y\nCONFIG_INITRAMFS_SOURCE={value}\n")
    with pytest.raises(BadInput, match=r"f.config:2: .*give y, m, n, a number or a quoted string"):
        kernel_config.read_fragment(fragment)
    result = in_process(["kernel", "build", str(tmp_path), "--config", str(fragment)], {}, monkeypatch, capsys)
    assert_one_line_error(result, "f.config:2")


def test_fragment_values_of_every_kind_memqual_uses_are_kept(tmp_path: Path) -> None:
    fragment = tmp_path / "f.config"
    values = ['"-memqual"', '"console=ttyS0,115200 root=/dev/vda"', '""', "y", "m", "n", "1024", "-1", "0x1000", ""]
    fragment.write_text("".join(f"CONFIG_V{n}={v}\n" for n, v in enumerate(values)) + kb.GUEST_CONFIG.read_text())
    assert kernel_config.read_fragment(fragment)[1] == fragment.read_bytes()


def test_guest_config_asks_what_the_image_and_scenarios_need() -> None:
    wants = kernel_config.fragment_wants(kb.GUEST_CONFIG.read_text())
    for module in ("VIRTIO_BALLOON", "VIRTIO_NET", "VIRTIO_PCI", "VIRTIO_MMIO", "VIRTIO_MEM"):
        assert wants[f"CONFIG_{module}"] == "m"  # guest/rc.sh modprobes them; the variant replaces one
    symbols = ("KSM", "TRANSPARENT_HUGEPAGE", "MEMORY_HOTPLUG", "MEMORY_HOTREMOVE", "PAGE_REPORTING", "PVH")
    # the QEMU memslot layouts' pc-dimms reach the guest only through ACPI's memory devices
    for symbol in (*symbols, "ACPI_HOTPLUG_MEMORY"):
        assert wants[f"CONFIG_{symbol}"] == "y"


def _source(sha: str = "s" * 64) -> kernel_sources.Source:
    return kernel_sources.Source("folder", "x", "x", sha, Path("/x"))


def test_cache_key_covers_source_patches_config_and_compiler(tmp_path: Path) -> None:
    patch_file = tmp_path / "p.patch"
    patch_file.write_text(FORMAT_PATCH)
    patch = kernel_patches.read_patch(patch_file)
    frag = [("guest", b"CONFIG_A=y\n")]
    key = kb.cache_key(_source(), [patch], frag, "gcc 12")
    assert kb.cache_key(_source(), [patch], frag, "gcc 12") == key
    assert kb.cache_key(_source("t" * 64), [patch], frag, "gcc 12") != key
    assert kb.cache_key(_source(), [], frag, "gcc 12") != key
    assert kb.cache_key(_source(), [patch], [("guest", b"CONFIG_A=m\n")], "gcc 12") != key
    assert kb.cache_key(_source(), [patch], [*frag, ("user", b"CONFIG_B=y\n")], "gcc 12") != key
    assert kb.cache_key(_source(), [patch], frag, "gcc 13") != key
    moved = tmp_path / "elsewhere.patch"
    shutil.copy(patch_file, moved)
    assert kb.cache_key(_source(), [kernel_patches.read_patch(moved)], frag, "gcc 12") == key  # the text, not the path


def test_patch_failure_names_file_and_hunk() -> None:
    out = "patching file drivers/virtio/virtio_balloon.c\nHunk #2 FAILED at 29.\n1 out of 2 hunks FAILED\n"
    assert kernel_patches.patch_failure(out) == "drivers/virtio/virtio_balloon.c hunk #2 (at line 29) fails"
    assert "not in the tree" in kernel_patches.patch_failure("can't find file to patch at input line 3\n")


def test_missing_toolchain_prints_the_apt_get_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kb, "missing_toolchain", lambda: ["flex", "bison"])
    with pytest.raises(CapabilityMissing, match=r"run apt-get install flex bison$"):
        kb.check_toolchain()


def test_built_names_are_told_from_debian_ones(memqual_cache: Path) -> None:
    assert built_kernels.named("6.1.0-57-amd64") is None
    assert built_kernels.named("6.1.192-memqual-0123456789abcdef") is None  # the form, but never built
    with pytest.raises(BadInput, match="no built kernel"):
        built_kernels.find("6.1.192-memqual-0123456789abcdef")


def _tar(members: list[tuple[tarfile.TarInfo, bytes]]) -> io.BytesIO:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as archive:
        for info, body in members:
            info.size = len(body) if info.isreg() else 0
            archive.addfile(info, io.BytesIO(body) if info.isreg() else None)
    data.seek(0)
    return data


def _info(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.mode = 0o4755  # a setuid bit root must not keep
    return info


# Every name allowed: the tests of what receive does whatever a build's outputs are.
ANY_OUTPUT = unprivileged.Outputs(files=(re.compile(".*"),), folders=(re.compile(".*"),), max_entries=100)


def test_receive_keeps_plain_files_only(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    stream = _tar(
        [
            (_info("./lib", tarfile.DIRTYPE), b""),
            (_info("./lib/a.ko"), b"module"),
            (_info("./build", tarfile.SYMTYPE, "/etc"), b""),
            (_info("./hard", tarfile.LNKTYPE, "lib/a.ko"), b""),
        ]
    )
    assert sorted(unprivileged.receive(stream, dest, ANY_OUTPUT)) == ["build", "hard"]
    assert (dest / "lib/a.ko").read_bytes() == b"module"
    assert stat.S_IMODE((dest / "lib/a.ko").stat().st_mode) == 0o755  # no setuid
    assert not os.path.lexists(dest / "build")


@pytest.mark.parametrize("name", ["../escape", "/abs", "lib/../../x"])
def test_receive_refuses_names_outside(tmp_path: Path, name: str) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(BadInput, match="not a plain relative name"):
        unprivileged.receive(_tar([(_info(name), b"x")]), dest, ANY_OUTPUT)
    assert not (tmp_path / "escape").exists()


def test_receive_refuses_a_file_below_a_file(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    stream = _tar([(_info("a"), b"x"), (_info("a/b"), b"y")])
    with pytest.raises(BadInput, match="not a directory"):
        unprivileged.receive(stream, dest, ANY_OUTPUT)


def test_receive_refuses_too_much(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(BadInput, match="more than"):
        small = dataclasses.replace(ANY_OUTPUT, max_bytes=1024)
        unprivileged.receive(_tar([(_info("big"), b"x" * 4096)]), dest, small)


# ------------------------------------------------------------ through the privilege drop

needs_drop = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None or shutil.which("patch") is None,
    reason="the privilege drop needs root, setpriv (util-linux) and patch",
)

MAKEFILE = """\
RELEASE := {release}
# as kbuild: the local version (here all of RELEASE) only once the build
# has written include/config/auto.conf
x86_64_defconfig:
\tprintf 'CONFIG_DEFCONFIG=y\\n' > .config
kvm_guest.config:
\tprintf 'CONFIG_KVM_GUEST=y\\n' >> .config
olddefconfig:
\t@true
kernelrelease:
\t@if [ -f include/config/auto.conf ]; then echo $(RELEASE); else echo 1.2.3; fi
bzImage:
{hostile}\ttest "$$(id -u)" != 0
\t@# as kbuild's objtool (built with O=<absolute path>): a tree built at one
\t@# path and built again at another rebuilds everything; here it fails
\ttest ! -f .built-at || test "$$(cat .built-at)" = "$$(pwd)"
\tpwd > .built-at
\t@echo '  CC      init/main.o'
\tcat init/main.c > /dev/null
\tmkdir -p arch/x86/boot && cp bzImage.in arch/x86/boot/bzImage && cp init/main.c vmlinux
\tmkdir -p include/config && touch include/config/auto.conf
# after bzImage, as its first progress line must be bzImage's own: under
# make -j2 the two raced, and a progress line is shown every 15 s only
modules: bzImage
\t@echo '  CC [M]  drivers/x.o'
modules_install:
\tmkdir -p $(INSTALL_MOD_PATH)/lib/modules/$(RELEASE)/kernel
\tprintf 'kernel/x.ko\\n' > $(INSTALL_MOD_PATH)/lib/modules/$(RELEASE)/modules.order
\tcp init/main.c $(INSTALL_MOD_PATH)/lib/modules/$(RELEASE)/kernel/x.ko
\tln -sf /etc $(INSTALL_MOD_PATH)/lib/modules/$(RELEASE)/build
"""
MERGE = """#!/bin/sh
# the fake merge_config.sh: -m -O . BASE FRAGMENT...
shift 3
base=$1
shift
for f in "$@"; do cat "$f" >> "$base"; done
"""


@pytest.fixture
def probe_dir() -> Iterator[Path]:
    """A root-owned directory outside every build folder that the build
    user may read but must not write: what a hostile build aims at."""
    probe = Path(tempfile.mkdtemp(prefix="mq-probe-", dir="/tmp"))
    os.chmod(probe, 0o755)
    (probe / "victim").write_text("root's\n")
    yield probe
    shutil.rmtree(probe)


@pytest.fixture
def build_env(memqual_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The build folders under a fresh root-owned 0711 parent the build
    user can pass through (a test's tmp_path is root's 0700); the toolchain
    taken as installed (the fake tree needs none of it)."""
    monkeypatch.setattr(kb, "missing_toolchain", list)
    with build_parent(monkeypatch, "mq-kbuild-test-") as parent:
        yield parent


def fake_tree(root: Path, hostile: str = "") -> Path:
    tree = root / "linux"
    (tree / "init").mkdir(parents=True)
    (tree / "scripts/kconfig").mkdir(parents=True)
    (tree / "Makefile").write_text(MAKEFILE.format(release=RELEASE, hostile=hostile))
    (tree / "Kconfig").write_text("mainmenu fake\n")
    (tree / "scripts/kconfig/merge_config.sh").write_text(MERGE)
    (tree / "init/main.c").write_text("int main(void) { return 0; }\n")
    (tree / "bzImage.in").write_bytes(fake_kernel.bzimage_bytes(RELEASE))
    # as an unpacked release's: older than the build (the copy of a base
    # tree links what is older than its unpacking, and copies the rest)
    for path in tree.rglob("*"):
        os.utime(path, (1e9, 1e9))
    return tree


def left_behind(cache: Path, parent: Path) -> list[str]:
    kernels = cache / "kernels"
    kept = (".steps.json", ".lock-")  # the step counts and the build locks stay; .staging-* must not
    return sorted(p.name for p in kernels.iterdir() if not p.name.startswith(kept)) + sorted(
        p.name for p in parent.glob("*") if p.name.startswith(("build-", "work-"))
    )


@needs_drop
def test_fake_build_cached_then_patched_incrementally(tmp_path: Path, memqual_cache: Path, build_env: Path) -> None:
    tree = fake_tree(tmp_path)
    kernel = kb.build(str(tree), jobs=1, say=lambda _: None)
    assert not kernel.cached and kernel.release == RELEASE
    assert set(kernel.steps_s) == set(kernel.cpu_s) and "compile" in kernel.steps_s
    assert kernel.bzimage.is_file() and (kernel.modules / "modules.order").is_file()
    assert not os.path.lexists(kernel.modules / "build")  # the link stayed behind
    assert "CONFIG_KVM_GUEST=y" in kernel.config.read_text()
    assert kernel.balloon_variant is None and kernel.balloon_variant_unavailable  # no virtio_balloon.c here
    again = kb.build(str(tree), jobs=1, say=lambda _: None)
    assert again.cached and again.name == kernel.name
    # the name stands for the kernel where a Debian kernel's name is taken
    assert debian_kernel_files(kernel.name) == (kernel.bzimage, kernel.modules)
    with pytest.raises(CapabilityMissing, match="does not apply"):  # the variant's reason, from the manifest
        balloon_driver.built_variant(kernel.bzimage)
    assert balloon_driver.built_variant(tree / "bzImage.in") is None
    assert built_kernels.named(kernel.name) is not None
    patch = tmp_path / "p.patch"
    patch.write_text(
        "Subject: [PATCH] init: return 1\n---\n--- a/init/main.c\n+++ b/init/main.c\n@@ -1 +1 @@\n"
        "-int main(void) { return 0; }\n+int main(void) { return 1; }\n"
    )
    patched = kb.build(str(tree), [patch], jobs=1, say=lambda _: None)
    assert patched.incremental and patched.name != kernel.name
    assert patched.patches[0].subject == "init: return 1"
    assert kernel_config.config_diff(kernel.config.read_text(), patched.config.read_text()) == []
    assert (tree / "init/main.c").read_text() == "int main(void) { return 0; }\n"  # the user's tree untouched
    assert left_behind(memqual_cache, build_env) == sorted([kernel.name, patched.name])
    # B ran at A's path (the Makefile's .built-at check), from a copy: the
    # base's source is A's, linked read-only, and its config was kept
    base = build_env / f"base-{kernel.key}" / "linux"
    assert (base / "init/main.c").read_text() == "int main(void) { return 0; }\n"
    assert not os.stat(base / "init/main.c").st_mode & 0o222
    assert "config (A's .config kept)" in patched.steps_s and "copy A's tree" in patched.steps_s
    kconfig = tmp_path / "k.patch"
    kconfig.write_text("--- a/Kconfig\n+++ b/Kconfig\n@@ -1 +1 @@\n-mainmenu fake\n+mainmenu other\n")
    assert "config" in kb.build(str(tree), [kconfig], jobs=1, say=lambda _: None).steps_s  # assembled again


@needs_drop
def test_patched_build_writing_a_source_in_place_fails_and_the_base_stays(
    tmp_path: Path, memqual_cache: Path, build_env: Path
) -> None:
    """A's sources are linked into B's copy read-only: a build step that
    writes into one in place fails instead of changing A's tree."""
    import difflib

    tree = fake_tree(tmp_path)
    kernel = kb.build(str(tree), jobs=1, say=lambda _: None)
    old = (tree / "Makefile").read_text()
    new = old.replace("bzImage:\n", "bzImage:\n\techo changed >> init/main.c\n", 1)
    patch = tmp_path / "inplace.patch"
    patch.write_text(
        "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), "a/Makefile", "b/Makefile"))
    )
    with pytest.raises(BadInput, match="build failed"):
        kb.build(str(tree), [patch], jobs=1, say=lambda _: None)
    base = build_env / f"base-{kernel.key}" / "linux"
    assert (base / "init/main.c").read_text() == "int main(void) { return 0; }\n"
    assert left_behind(memqual_cache, build_env) == [kernel.name]


def _makefile_patch(tree: Path, name: str, recipe: str) -> Path:
    """A patch to the fake tree's Makefile that adds ``recipe``'s lines at
    the start of the bzImage rule: what a hostile patch's build runs."""
    import difflib

    old = (tree / "Makefile").read_text()
    new = old.replace("bzImage:\n", "bzImage:\n" + recipe, 1)
    patch = tree.parent / name
    patch.write_text(
        "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), "a/Makefile", "b/Makefile"))
    )
    return patch


DAEMON = "sleep 4711.5"  # what a hostile build leaves running; found by its command line


def _daemons() -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if (
                entry.name.isdigit()
                and (entry / "cmdline").read_bytes().replace(b"\0", b" ").strip() == DAEMON.encode()
            ):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


# What a hostile patch's build tries on the base it was copied from: the
# hard-linked source made writable and written through, the base's own
# folder, the link's times, and a daemon left behind to write later.
HOSTILE_ON_THE_BASE = (
    "\t-chmod u+w init/main.c\n"
    "\t-sh -c 'echo evil >> init/main.c'\n"
    "\t-touch -d 2001-01-01 init/main.c\n"
    "\t-sh -c 'for f in ../../base-*/linux/init/main.c; do chmod u+w $$f; echo evil >> $$f; done'\n"
    f"\t-setsid sh -c 'exec {DAEMON}' > /dev/null 2>&1 < /dev/null &\n"
)


@needs_drop
def test_hostile_patch_cannot_change_the_base_through_a_linked_source(
    tmp_path: Path, memqual_cache: Path, build_env: Path
) -> None:
    """B's copy links A's sources; they are root's and read-only, so a
    hostile build can neither chmod nor write them, nor reach the base's
    folder, nor leave a process behind; the next patched build from the same
    base is incremental and built from A's sources as they were."""
    tree = fake_tree(tmp_path)
    kernel = kb.build(str(tree), jobs=1, say=lambda _: None)
    base = build_env / f"base-{kernel.key}"
    assert tree_copy.base_problem(base) is None and os.stat(base / "linux/init/main.c").st_uid == 0
    hostile = kb.build(str(tree), [_makefile_patch(tree, "hostile.patch", HOSTILE_ON_THE_BASE)], jobs=1, say=print)
    assert hostile.incremental
    assert _daemons() == []  # ended with its step (the step's PID namespace)
    main_c = base / "linux/init/main.c"
    assert main_c.read_text() == "int main(void) { return 0; }\n"
    st = os.stat(main_c)
    assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o444 and st.st_mtime_ns == int(1e9 * 1e9)
    assert tree_copy.base_problem(base) is None
    benign = tmp_path / "benign.patch"
    benign.write_text("--- a/init/main.c\n+++ b/init/main.c\n@@ -1 +1 @@\n-int main(void) { return 0; }\n+int b;\n")
    after = kb.build(str(tree), [benign], jobs=1, say=lambda _: None)
    assert after.incremental
    # the fake Makefile builds init/main.c into vmlinux and x.ko: B's source is A's plus its own patch
    assert (after.modules / "kernel/x.ko").read_text() == "int b;\n"
    assert main_c.read_text() == "int main(void) { return 0; }\n"


@needs_drop
def test_without_the_seal_the_hostile_patch_reaches_the_base(
    tmp_path: Path, memqual_cache: Path, build_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test above can fail: with the base left the build user's (the
    seal a no-op, as before it) and no PID namespace, the same hostile
    build writes through the link into A's tree and leaves its daemon
    running; the base's check sees the change afterwards."""

    monkeypatch.setattr(tree_copy, "seal", lambda tree: None)
    tree = fake_tree(tmp_path)
    kernel = kb.build(str(tree), jobs=1, say=lambda _: None)
    base = build_env / f"base-{kernel.key}"
    with monkeypatch.context() as unchecked:
        unchecked.setattr(tree_copy, "base_problem", lambda base: None)
        unchecked.setattr(unprivileged, "pid_namespace", tuple)
        unchecked.setattr(unprivileged, "can_confine", lambda: False)  # its namespaces would hold the daemon too
        kb.build(str(tree), [_makefile_patch(tree, "hostile.patch", HOSTILE_ON_THE_BASE)], jobs=1, say=lambda _: None)
    left = _daemons()
    for pid in left:  # the daemon this test's build started
        os.kill(pid, signal.SIGKILL)
    assert left, "without its PID namespace, the step's daemon outlives it"
    assert "evil" in (base / "linux/init/main.c").read_text()
    assert tree_copy.base_problem(base) is not None


# What a hostile patch's build tries beside its own folder: another
# build's folder and ccache's, both the build user's.
HOSTILE_BESIDE = "\t-touch ../../work-other/pwned\n\t-sh -c 'touch ../../ccache-$$(id -u)/pwned'\n"


def _other_builds(build_env: Path) -> tuple[Path, Path]:
    """A folder of another build and ccache's, the build user's, beside
    this build's folder."""
    user = unprivileged.build_user()
    parent = unprivileged.build_parent(build_env)
    other = unprivileged.user_folder(parent, user, "work-other")
    cache = unprivileged.user_folder(parent, user, f"ccache-{user.uid}")
    assert other is not None and cache is not None
    return other, cache


@needs_drop
@pytest.mark.skipif(not unprivileged.can_confine(), reason="no mount namespace for a build step here")
def test_patched_build_cannot_write_into_other_builds_or_ccache(
    tmp_path: Path, memqual_cache: Path, build_env: Path
) -> None:
    """A patch's build steps see the build parent read-only but for their
    own folder: another build's folder and ccache's stay as they were."""
    tree = fake_tree(tmp_path)
    kb.build(str(tree), jobs=1, say=lambda _: None)
    other, cache = _other_builds(build_env)
    patched = kb.build(str(tree), [_makefile_patch(tree, "beside.patch", HOSTILE_BESIDE)], jobs=1, say=lambda _: None)
    assert patched.incremental and patched.bzimage.is_file()
    assert not (other / "pwned").exists() and not (cache / "pwned").exists()


@needs_drop
def test_without_confinement_the_patched_build_writes_beside_its_folder(
    tmp_path: Path, memqual_cache: Path, build_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test above can fail: unconfined, the same build writes into
    the other build's folder and ccache's (they are the build user's)."""
    monkeypatch.setattr(unprivileged, "can_confine", lambda: False)
    tree = fake_tree(tmp_path)
    kb.build(str(tree), jobs=1, say=lambda _: None)
    other, cache = _other_builds(build_env)
    said: list[str] = []
    kb.build(str(tree), [_makefile_patch(tree, "beside.patch", HOSTILE_BESIDE)], jobs=1, say=said.append)
    assert (other / "pwned").exists() and (cache / "pwned").exists()
    assert any("no mount namespace here" in line for line in said)


@needs_drop
@pytest.mark.skipif(not unprivileged.can_confine(), reason="no mount namespace for a build step here")
def test_a_build_with_a_config_fragment_is_confined(tmp_path: Path, memqual_cache: Path, build_env: Path) -> None:
    """A --config fragment's values reach make and the shell: its build,
    patched or not, writes into no other build's folder and not into
    ccache's (what make runs for it stands in for the tree's Makefile here);
    the same tree without a fragment does, which the check needs to mean
    anything."""
    tree = fake_tree(tmp_path, hostile=HOSTILE_BESIDE)
    other, cache = _other_builds(build_env)
    fragment = tmp_path / "f.config"
    fragment.write_text('CONFIG_LOCALVERSION="-mine"\n')
    assert kb.build(str(tree), [], [fragment], jobs=1, say=lambda _: None).bzimage.is_file()
    assert not (other / "pwned").exists() and not (cache / "pwned").exists()
    kb.build(str(tree), jobs=1, say=lambda _: None)
    assert (other / "pwned").exists() and (cache / "pwned").exists()


@needs_drop
@pytest.mark.skipif(shutil.which("ccache") is None or shutil.which("gcc") is None, reason="needs ccache and gcc")
@pytest.mark.skipif(not unprivileged.can_confine(), reason="no mount namespace for a build step here")
def test_confined_patched_build_compiles_without_ccache_and_adds_nothing(
    tmp_path: Path, memqual_cache: Path, build_env: Path
) -> None:
    """A patch's compiles, as a uid of their own, cannot read the build
    user's ccache: they build with the compiler alone, and the cache holds
    no more files than before."""
    tree = fake_tree(tmp_path, hostile="\tgcc -c init/main.c -o init/main.o\n")
    kb.build(str(tree), jobs=1, say=lambda _: None)
    cache = kernel_env.ccache_folder(unprivileged.build_user())
    assert cache is not None
    before = sorted(p.name for p in cache.rglob("*") if p.is_file() and "stats" not in p.name)
    patch = tmp_path / "p.patch"
    patch.write_text("--- a/init/main.c\n+++ b/init/main.c\n@@ -1 +1 @@\n-int main(void) { return 0; }\n+int b;\n")
    patched = kb.build(str(tree), [patch], jobs=1, say=lambda _: None)
    assert patched.incremental and (patched.modules / "kernel/x.ko").read_text() == "int b;\n"
    assert sorted(p.name for p in cache.rglob("*") if p.is_file() and "stats" not in p.name) == before


@needs_drop
def test_a_base_changed_after_its_seal_is_refused_and_rebuilt(
    tmp_path: Path, memqual_cache: Path, build_env: Path
) -> None:
    """A write that reached the base anyway (through a descriptor kept from
    before the seal: here root's own) is found before the next copy: the
    base is removed and built again from the source (A's cached kernel
    left as it is), and B is built on it."""
    tree = fake_tree(tmp_path)
    kernel = kb.build(str(tree), jobs=1, say=lambda _: None)
    base = build_env / f"base-{kernel.key}"
    with open(base / "linux/init/main.c", "a") as sneaked:
        sneaked.write("evil\n")
    said: list[str] = []
    benign = tmp_path / "benign.patch"
    benign.write_text("--- a/init/main.c\n+++ b/init/main.c\n@@ -1 +1 @@\n-int main(void) { return 0; }\n+int b;\n")
    manifest = (kernel.directory / "manifest.json").stat()
    patched = kb.build(str(tree), [benign], jobs=1, say=said.append)
    assert any("changed since it was sealed: building the unpatched source first" in line for line in said)
    assert patched.incremental and (patched.modules / "kernel/x.ko").read_text() == "int b;\n"
    assert tree_copy.base_problem(base) is None and "evil" not in (base / "linux/init/main.c").read_text()
    assert (kernel.directory / "manifest.json").stat().st_mtime_ns == manifest.st_mtime_ns  # A's, not rebuilt


@needs_drop
def test_a_base_the_build_user_owns_is_not_used(tmp_path: Path, memqual_cache: Path, build_env: Path) -> None:
    """A base kept by an older memqual (the build user's, unsealed) is
    refused as such, never copied."""
    tree = fake_tree(tmp_path)
    kernel = kb.build(str(tree), jobs=1, say=lambda _: None)
    base = build_env / f"base-{kernel.key}"
    user = unprivileged.build_user()
    for path in [base, *base.rglob("*")]:
        os.chown(path, user.uid, user.gid, follow_symlinks=False)
    assert tree_copy.base_problem(base) == "not sealed (not root's)"
    (base / tree_copy.BASE_RECORD).unlink()
    assert tree_copy.base_problem(base) == "not sealed (kept by an older memqual)"


@pytest.mark.skipif(os.geteuid() != 0, reason="sealing gives the tree to root, copying gives it to the build user")
def test_tree_copy_links_sealed_sources_and_copies_outputs_with_their_times(tmp_path: Path) -> None:
    user = unprivileged.build_user()
    base, stamp_ns = tmp_path / "base", 2 * 10**18
    (base / "sub").mkdir(parents=True)
    (base / "main.c").write_text("source\n")
    os.utime(base / "main.c", ns=(10**18, 10**18))
    (base / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(base / "run.sh", 0o4775)  # a set-id bit root must not keep
    os.utime(base / "run.sh", ns=(10**18, 10**18))
    (base / "sub/main.o").write_text("object\n")
    os.utime(base / "sub/main.o", ns=(3 * 10**18 + 7, 3 * 10**18 + 7))
    (base / "link").symlink_to("sub/main.o")
    (base / "dirlink").symlink_to("sub")
    os.mkfifo(base / "fifo")
    for path in [base, *base.rglob("*")]:
        os.chown(path, user.uid, user.gid, follow_symlinks=False)  # as the build user left it
    elsewhere = tmp_path / "elsewhere"
    os.link(base / "sub/main.o", elsewhere)  # a second link, outside the tree
    tree_copy.seal(base)
    assert not (base / "fifo").exists()
    for path in [base, *base.rglob("*")]:
        assert os.lstat(path).st_uid == 0
    assert stat.S_IMODE(os.stat(base / "main.c").st_mode) == 0o444
    assert stat.S_IMODE(os.stat(base / "run.sh").st_mode) == 0o555
    assert stat.S_IMODE(os.stat(base / "sub").st_mode) == 0o755
    assert os.stat(elsewhere).st_uid == user.uid  # the outside inode is not root's now: replaced in the tree
    assert os.stat(base / "sub/main.o").st_ino != os.stat(elsewhere).st_ino
    assert os.stat(base / "sub/main.o").st_mtime_ns == 3 * 10**18 + 7
    sealed = tree_copy.digest(base)
    assert tree_copy.verify(base, sealed) is None
    dest = tmp_path / "copy"
    copied = tree_copy.copy_tree(base, dest, stamp_ns, user.uid, user.gid)
    assert (copied.linked, copied.copied, copied.copied_bytes) == (2, 1, 7)
    assert os.stat(dest / "main.c").st_ino == os.stat(base / "main.c").st_ino  # linked: root's, read-only
    copy = os.stat(dest / "sub/main.o")
    assert copy.st_ino != os.stat(base / "sub/main.o").st_ino  # copied ...
    assert copy.st_mtime_ns == 3 * 10**18 + 7 and copy.st_uid == user.uid and copy.st_mode & 0o200  # ... the user's
    assert os.stat(dest / "sub").st_uid == user.uid and os.stat(dest).st_uid == user.uid
    assert os.readlink(dest / "link") == "sub/main.o" and os.readlink(dest / "dirlink") == "sub"
    assert tree_copy.verify(base, sealed) is None  # linking changed no entry's digest
    with pytest.raises(FileExistsError):  # never into a tree that is there
        tree_copy.copy_tree(base, dest, 0, user.uid, user.gid)
    with open(base / "main.c", "a") as sneaked:  # a write that got in (root's here)
        sneaked.write("x")
    assert tree_copy.verify(base, sealed) == "changed since it was sealed"


def test_config_is_assembled_again_only_for_patches_to_its_inputs() -> None:
    def patch(*files: str) -> kernel_patches.Patch:
        return kernel_patches.Patch(Path("p"), b"", "0", "s", files)

    assert kernel_patches.config_touched([patch("drivers/virtio/virtio_balloon.c", "mm/page_alloc.c")]) == []
    touched = ["mm/Kconfig", "drivers/virtio/Kconfig.debug", "scripts/kconfig/conf.c", "arch/x86/configs/x.config"]
    assert kernel_patches.config_touched([patch(*touched), patch("init/main.c")]) == touched


@needs_drop
def test_patch_that_does_not_apply_leaves_nothing(tmp_path: Path, memqual_cache: Path, build_env: Path) -> None:
    tree = fake_tree(tmp_path)
    patch = tmp_path / "bad.patch"
    patch.write_text("--- a/init/main.c\n+++ b/init/main.c\n@@ -1 +1 @@\n-int nothing_here;\n+int x;\n")
    with pytest.raises(BadInput, match=r"bad.patch does not apply: init/main.c hunk #1 \(at line 1\) fails") as exc:
        kb.build(str(tree), [patch], jobs=1, say=lambda _: None)
    assert exc.value.exit_status == 2
    assert left_behind(memqual_cache, build_env) == []


@needs_drop
def test_build_failure_names_the_file_and_leaves_nothing(
    tmp_path: Path, memqual_cache: Path, build_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = fake_tree(tmp_path, hostile="\t@echo 'init/main.c:1:5: error: expected something' >&2; exit 1\n")
    with pytest.raises(BadInput, match=r"the kernel build failed in init/main.c: init/main.c:1:5: error"):
        kb.build(str(tree), jobs=1, say=lambda _: None)
    assert "error: expected something" in capsys.readouterr().err  # the compiler's last lines
    assert left_behind(memqual_cache, build_env) == []


@needs_drop
def test_build_failure_text_reaches_the_terminal_escaped(
    tmp_path: Path,
    memqual_cache: Path,
    build_env: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from one_line_errors import assert_one_line_error, in_process

    tree = fake_tree(tmp_path, hostile="\t@printf 'init/main.c:1:5: error: \\033]0;owned\\007\\n' >&2; exit 1\n")
    result = in_process(["kernel", "build", str(tree)], {}, monkeypatch, capsys)
    assert result["status"] == 2 and "\x1b" not in result["stderr"] and "\x07" not in result["stderr"]
    # the compiler's last lines on stderr, then memqual's one line
    assert "error: \\x1b]0;owned\\x07" in result["stderr"]
    assert_one_line_error(
        {**result, "stderr": result["stderr"].splitlines()[-1]}, "the kernel build failed in init/main.c"
    )


@needs_drop
def test_hostile_makefile_cannot_write_outside_or_run_as_root(
    tmp_path: Path, memqual_cache: Path, build_env: Path, probe_dir: Path
) -> None:
    marker = Path("/root/memqual-hostile-build-probe")
    marker.unlink(missing_ok=True)
    hostile = (
        # no capabilities left, none to regain, no_new_privs: a failed test fails the build
        '\ttest "$$(grep CapEff /proc/self/status | cut -f2)" = 0000000000000000\n'
        '\ttest "$$(grep CapBnd /proc/self/status | cut -f2)" = 0000000000000000\n'
        '\ttest "$$(grep NoNewPrivs /proc/self/status | cut -f2)" = 1\n'
        f"\t-touch {marker}\n"
        f"\t-touch {probe_dir}/pwned\n"
        f"\t-sh -c 'echo owned > {probe_dir}/victim'\n"
        f"\t-touch {memqual_cache}/pwned\n"
        f"\t-ln -s {probe_dir}/victim arch-victim\n"
    )
    tree = fake_tree(tmp_path, hostile=hostile)
    try:
        kernel = kb.build(str(tree), jobs=1, say=lambda _: None)  # test "$(id -u)" != 0 in the Makefile passed
        assert not marker.exists()
        assert not (probe_dir / "pwned").exists() and (probe_dir / "victim").read_text() == "root's\n"
        assert not (memqual_cache / "pwned").exists()
        assert kernel.bzimage.is_file()
    finally:
        marker.unlink(missing_ok=True)


@needs_drop
def test_without_the_privilege_drop_the_hostile_build_is_caught(
    tmp_path: Path, memqual_cache: Path, build_env: Path, probe_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hostile tests above can fail: with setpriv taken out, the same
    kind of Makefile runs as root, writes root's file, and the build's own
    check (``test $(id -u) != 0``) fails it."""
    monkeypatch.setattr(unprivileged, "as_user", lambda uid, gid, argv, confined_to=None: list(argv))
    tree = fake_tree(tmp_path, hostile=f"\t-sh -c 'echo owned > {probe_dir}/victim'\n")
    with pytest.raises(BadInput, match="the kernel build failed"):
        kb.build(str(tree), jobs=1, say=lambda _: None)
    assert (probe_dir / "victim").read_text() == "owned\n"


@needs_drop
@pytest.mark.skipif(shutil.which("ccache") is None or shutil.which("gcc") is None, reason="needs ccache and gcc")
def test_ccache_is_the_build_users_and_shared_between_build_folders(
    tmp_path: Path, memqual_cache: Path, build_env: Path
) -> None:
    """A compiler cache in a folder of the build user's beside the build
    folders: a second build of the same tree (a new build folder) hits."""
    tree = fake_tree(tmp_path, hostile="\tgcc -c init/main.c -o init/main.o\n")
    first = kb.build(str(tree), jobs=1, say=lambda _: None)
    again = kb.build(str(tree), jobs=1, force=True, say=lambda _: None)
    assert first.ccache == {"hits": 0, "misses": 1}
    assert again.ccache == {"hits": 1, "misses": 0}
    user = unprivileged.build_user()
    folder = kernel_env.ccache_folder(user)
    assert folder is not None and folder.parent == build_env
    st = folder.stat()
    assert st.st_uid == user.uid and stat.S_IMODE(st.st_mode) == 0o700


@needs_drop
def test_ccache_folder_planted_as_a_link_is_not_used(build_env: Path, probe_dir: Path) -> None:
    """Something else where the cache belongs (a link to root's folder, a
    folder of another owner) is left alone: no chown through it, no ccache."""
    user = unprivileged.build_user()
    parent = unprivileged.build_parent(build_env)
    planted = parent / f"ccache-{user.uid}"
    planted.symlink_to(probe_dir)
    assert kernel_env.ccache_folder(user) is None
    assert "CCACHE_DIR" not in kernel_env.build_env(user) and "PATH" not in kernel_env.build_env(user)
    assert probe_dir.stat().st_uid == 0
    planted.unlink()
    planted.mkdir(mode=0o700)  # root's own
    assert kernel_env.ccache_folder(user) is None


@needs_drop
def test_patch_with_a_symlink_cannot_write_through_it(
    tmp_path: Path, memqual_cache: Path, build_env: Path, probe_dir: Path
) -> None:
    """The patch plants a link to root's file and the build writes through
    it (GNU patch itself refuses to patch through a link; the build does not)."""
    victim = probe_dir / "victim"
    tree = fake_tree(tmp_path, hostile="\t-sh -c 'echo owned > evil'\n\t-cp evil arch-copy\n")
    patch = tmp_path / "symlink.patch"
    patch.write_text(
        "diff --git a/evil b/evil\nnew file mode 120000\n--- /dev/null\n+++ b/evil\n@@ -0,0 +1 @@\n"
        f"+{victim}\n\\ No newline at end of file\n"
    )
    kernel = kb.build(str(tree), [patch], jobs=1, say=lambda _: None)
    assert victim.read_text() == "root's\n"
    assert kernel.bzimage.is_file()


@needs_drop
def test_patch_naming_a_path_outside_the_tree_is_refused(tmp_path: Path, memqual_cache: Path, build_env: Path) -> None:
    tree = fake_tree(tmp_path)
    patch = tmp_path / "escape.patch"
    patch.write_text("--- a/../../escape\n+++ b/../../escape\n@@ -0,0 +1 @@\n+x\n")
    # refused as it is read, before anything is fetched or built
    with pytest.raises(BadInput, match=r"escape.patch: line 1: '../../escape' is not a name below the tree's top"):
        kb.build(str(tree), [patch], jobs=1, say=lambda _: None)
    assert not (build_env / "escape").exists() and not (build_env.parent / "escape").exists()
    assert not (memqual_cache / "kernels").exists() and list(build_env.glob("*")) == []


@needs_drop
def test_remove_folder_does_not_follow_links(tmp_path: Path, build_env: Path, probe_dir: Path) -> None:
    user = unprivileged.build_user()
    folder = unprivileged.private_folder(unprivileged.build_parent(build_env), user, "build-")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and folder.stat().st_uid == user.uid
    unprivileged.run(user, ["ln", "-s", str(probe_dir), "link"], folder, folder / "home")
    unprivileged.remove_folder(user, folder)
    assert not folder.exists() and (probe_dir / "victim").is_file()


@needs_drop
def test_build_steps_run_without_root_or_groups(tmp_path: Path, build_env: Path) -> None:
    user = unprivileged.build_user()
    folder = unprivileged.private_folder(unprivileged.build_parent(build_env), user, "build-")
    try:
        proc = unprivileged.run(user, ["sh", "-c", "id -u; id -G; echo $HOME; env | wc -l"], folder, folder / "home")
        uid, groups, home, env_count = proc.stdout.split()
        assert int(uid) == user.uid != 0
        assert groups == str(user.gid)
        assert home == str(folder / "home")
        assert int(env_count) < 12  # a cleared environment, not root's
        status = subprocess.run(
            unprivileged.as_user(user.uid, user.gid, ["grep", "NoNewPrivs", "/proc/self/status"]),
            capture_output=True,
            text=True,
            check=True,
        )
        assert status.stdout.split()[-1] == "1"
    finally:
        unprivileged.remove_folder(user, folder)


def test_build_user_is_never_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(unprivileged.BUILD_USER_ENV, "root")
    with pytest.raises(BadInput, match="uid or gid 0"):
        unprivileged.build_user()
    monkeypatch.setenv(unprivileged.BUILD_USER_ENV, "no-such-user-memqual")
    with pytest.raises(BadInput, match="does not exist"):
        unprivileged.build_user()


@needs_drop
def test_run_patch_builds_both_arms_and_names_the_patch(
    tmp_path: Path, memqual_cache: Path, build_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memqual.host.cli.kernel import run_with_patch

    tree = fake_tree(tmp_path)
    patch = tmp_path / "0001-init.patch"
    patch.write_text(
        "Subject: [PATCH] init: return 1\n---\n--- a/init/main.c\n+++ b/init/main.c\n@@ -1 +1 @@\n"
        "-int main(void) { return 0; }\n+int main(void) { return 1; }\n"
    )
    args = _run_args(["run", "--patch", str(patch), "--kernel-source", str(tree), "--output", str(tmp_path / "out")])
    seen: list[argparse.Namespace] = []

    def inner(given: argparse.Namespace) -> int:
        seen.append(given)
        return 0

    assert run_with_patch(args, inner) == 0
    (given,) = seen
    assert len(given.guest_kernel) == 2 and given.guest_kernel[0] != given.guest_kernel[1]
    record = __import__("json").loads((tmp_path / "out/patch.json").read_text())
    assert record["patches"][0]["subject"] == "init: return 1"
    assert record["patches"][0]["files"] == ["init/main.c"]
    assert (tmp_path / "out" / record["patches"][0]["text"]).read_bytes() == patch.read_bytes()
    assert record["b"]["incremental"] is True and record["config_diff"] == []
    # init/main.c is in no scenario's kernel_paths: every scenario runs
    assert record["scope"]["kind"] == "everything" and "init/main.c" in record["scope"]["reason"]
    assert given.test_scope is None
    assert record["built_diff"] == ["kernel/x.ko: differs"]  # the bzImage is the same
    # the run is handed the value patch.json records, not the file
    assert __import__("json").loads(__import__("json").dumps(given.patch_run.to_json())) == record


# A patch's Subject and file name, and make's progress, with escape
# sequences: a window title (OSC), a colour and a screen clear (CSI).
ESC_SUBJECT = "init: \x1b]0;owned\x07return 1\x1b[2J"
RED_FILE = "init/\x1b[31mred.c"


@needs_drop
def test_what_a_patch_and_a_build_say_reaches_the_terminal_escaped(
    tmp_path: Path,
    memqual_cache: Path,
    build_env: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """run --patch, kernel build, kernel list and the comparison page's
    card: the Subject, the file names, make's progress show no control
    character; and two patches of one base name keep a text each in
    OUTPUT/patch/, each record naming its own."""
    from one_line_errors import in_process

    from memqual.host.cli.kernel import run_with_patch
    from memqual.host.report.compare_report import patch_section

    tree = fake_tree(tmp_path, hostile="\t@printf '  CC      init/\\033[31mred.o\\n'\n")
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    first, second = tmp_path / "one/0001-init.patch", tmp_path / "two/0001-init.patch"
    first.write_text(
        f"Subject: [PATCH] {ESC_SUBJECT}\n---\n--- /dev/null\n+++ b/{RED_FILE}\n@@ -0,0 +1 @@\n+int red;\n"
    )
    second.write_text(
        "Subject: [PATCH] init: return 1\n---\n--- a/init/main.c\n+++ b/init/main.c\n@@ -1 +1 @@\n"
        "-int main(void) { return 0; }\n+int main(void) { return 1; }\n"
    )
    patches = ["--patch", str(first), "--patch", str(second)]
    args = _run_args(["run", *patches, "--kernel-source", str(tree), "--output", str(tmp_path / "out")])
    assert run_with_patch(args, lambda given: 0) == 0
    said = capsys.readouterr()
    record = __import__("json").loads((tmp_path / "out/patch.json").read_text())
    texts = [tmp_path / "out" / p["text"] for p in record["patches"]]
    assert [t.read_bytes() for t in texts] == [first.read_bytes(), second.read_bytes()]
    assert record["patches"][0]["subject"] == ESC_SUBJECT and record["patches"][0]["files"] == [RED_FILE]
    card = patch_section(record)
    assert card is not None
    shown = [
        said.out + said.err,
        "\n".join([card.a_kernel, card.b_kernel, card.scope, *(f"{p.subject} {p.files}" for p in card.patches)]),
    ]
    for command in (["kernel", "build", str(tree), *patches], ["kernel", "list"]):
        result = in_process(command, {}, monkeypatch, capsys)
        assert result["status"] == 0, result
        shown.append(result["stdout"] + result["stderr"])
    for text in shown:
        assert "\x1b" not in text and "\x07" not in text
        assert "\\x1b]0;owned\\x07return 1\\x1b[2J" in text
    assert "init/\\x1b[31mred.o" in said.err  # make's progress line
    assert "\\x1b[31mred.c" in said.out  # the file name, in the patch's line and the scope's


def test_run_patch_checks_the_run_options_before_building(
    tmp_path: Path, memqual_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[object] = []
    monkeypatch.setattr(kernel_arms, "arms", lambda *a, **k: built.append(a))
    args = _run_args(["run", "--patch", "x.patch", "--rounds", "0", "--output", str(tmp_path / "out")])
    with pytest.raises(BadInput, match="--rounds"):
        args.command_run(args)
    assert built == [] and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("files", "extra", "kind", "builds"),
    [
        (["Documentation/mm/balloon.rst"], [], "nothing", False),  # nothing to qualify: no build, exit 0
        (["Documentation/mm/balloon.rst"], ["--all-scenarios"], "everything", True),
        (["drivers/virtio/virtio_balloon.c"], [], "scoped", True),
        (["drivers/virtio/virtio_balloon.c"], ["--all-scenarios"], "everything", True),
        (["drivers/virtio/virtio_balloon.c"], ["--only", "ksm"], "only", True),  # --only decides alone
        (["mm/page_alloc.c"], [], "everything", True),
    ],
)
def test_run_patch_scopes_the_run_by_the_files_it_touches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], files: list[str], extra: list[str], kind: str, builds: bool
) -> None:
    from memqual.host.cli.kernel import patch_scope_of, run_with_patch

    patch = tmp_path / "p.patch"
    patch.write_text("".join(f"--- a/{f}\n+++ b/{f}\n@@ -1 +1 @@\n-a\n+b\n" for f in files))
    args = _run_args(["run", "--patch", str(patch), "--output", str(tmp_path / "out"), *extra])
    assert patch_scope_of(args).kind == kind
    if builds:
        return  # the builds themselves: test_run_patch_builds_both_arms_and_names_the_patch
    assert run_with_patch(args, lambda a: 1) == 0
    out = capsys.readouterr().out
    assert out.startswith("nothing to qualify: Documentation/mm/balloon.rst: no guest kernel builds any of it")
    assert "--all-scenarios" in out and len(out.splitlines()) == 1 and not (tmp_path / "out").exists()


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_two_revisions_of_one_repository_list_the_files_between_them(tmp_path: Path) -> None:
    """--kernel-source twice: two revisions of one repository are scoped
    by ``git diff --name-only``; two folders are not listed (everything runs)."""
    from memqual.host.cli.kernel import patch_scope_of

    repo = tmp_path / "linux"
    (repo / "mm").mkdir(parents=True)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    commits = []
    for n in range(2):
        (repo / "mm/ksm.c").write_text(f"int ksm = {n};\n")
        subprocess.run([*git, "add", "-A"], check=True)
        subprocess.run([*git, "commit", "-qm", f"c{n}"], check=True)
        commits.append(subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip())
    assert kernel_sources.source_diff_files(f"{repo}@{commits[0]}", f"{repo}@HEAD") == ("mm/ksm.c",)
    assert kernel_sources.source_diff_files(str(repo), str(tmp_path)) is None
    args = _run_args(["run", "--kernel-source", f"{repo}@{commits[0]}", "--kernel-source", f"{repo}@HEAD"])
    scope = patch_scope_of(args)
    assert scope.kind == "scoped" and [c.scenario for c in scope.chosen] == ["ksm.guest_merge"]
    two_folders = _run_args(["run", "--kernel-source", str(repo), "--kernel-source", str(tmp_path)])
    assert patch_scope_of(two_folders).kind == "everything"


def _run_args(argv: list[str]) -> argparse.Namespace:
    """``memqual run`` with the options memqual kernel adds to it, parsed."""
    from memqual.host.cli import kernel as kernel_cli
    from memqual.host.cli import run as run_cli
    from memqual.host.cli.command import parser_for

    return parser_for(run_cli.COMMAND, options=[kernel_cli.RUN_PATCH]).parse_args(argv)


def test_run_patch_refuses_kernels_beside_it(tmp_path: Path) -> None:
    from memqual.host.cli.kernel import run_with_patch

    args = argparse.Namespace(
        patch=["x.patch"],
        kernel_source=[],
        kernel_config=[],
        guest_kernel=["bz"],
        guest_modules=None,
        debian_kernel=None,
        kernel_build=None,
        output=None,
    )
    with pytest.raises(BadInput, match="not both"):
        run_with_patch(args, lambda a: 0)
    with pytest.raises(BadInput, match="compares nothing"):
        kernel_arms.arms([str(tmp_path)], [])


@needs_drop
def test_git_revision_is_exported_not_the_work_tree(tmp_path: Path, memqual_cache: Path, build_env: Path) -> None:
    tree = fake_tree(tmp_path)
    git = ["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    (tree / "init/main.c").write_text("uncommitted\n")  # not in the revision
    kernel = kb.build(f"{tree}@HEAD", jobs=1, say=lambda _: None)
    assert kernel.source_sha256.startswith("git:") and kernel.source.startswith(f"{tree}@")
    built_from = build_env / f"base-{kernel.key}" / "linux/init/main.c"  # kept as the base of patched builds
    assert built_from.read_text() == "int main(void) { return 0; }\n"
    with pytest.raises(BadInput, match="no commit"):
        kernel_sources.resolve_source(f"{tree}@no-such-branch")


@needs_drop
def test_bisect_over_revisions_builds_only_the_probed_ones(
    tmp_path: Path, memqual_cache: Path, build_env: Path
) -> None:
    """--kernel-source DIR --good REV --bad REV: the series is GOOD then
    BAD's first-parent line; a revision is built when first asked for,
    once (then cached), and a Debian kernel of a series is still found at once."""
    from memqual.host.cli.bisect import kernel_names
    from memqual.host.run.bisect import series

    tree = fake_tree(tmp_path)
    git = ["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    commits = []
    for n in range(4):
        (tree / "init/main.c").write_text(f"int main(void) {{ return {n}; }}\n")
        subprocess.run([*git, "add", "-A"], check=True)
        subprocess.run([*git, "commit", "-qm", f"c{n}"], check=True)
        commits.append(subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip())
    args = argparse.Namespace(kernels=None, kernel_source=str(tree), good=commits[0][:8], bad="HEAD")
    names = kernel_names(args)
    assert names == [f"{tree.resolve()}@{c}" for c in commits]
    specs = series.parse_series(names)
    assert [s.version for s in specs] == names and all(kernel_sources.is_source_revision(n) for n in names)
    built: list[str] = []

    def build(name: str) -> tuple[Path, Path]:
        built.append(name)
        return series.build_revision(name)

    files = series.Kernels(specs, resolve=lambda v: (_ for _ in ()).throw(AssertionError(v)), build=build)
    assert built == []  # nothing is built before a probe needs it
    bzimage, modules = files[names[2]]
    assert files[names[2]] == (bzimage, modules) and built == [names[2]]
    kernel = built_kernels.of_bzimage(bzimage)
    assert kernel is not None and kernel.source_sha256 == f"git:{commits[2]}"
    assert "return 2;" in (build_env / f"base-{kernel.key}" / "linux/init/main.c").read_text()
    with pytest.raises(BadInput, match="not an ancestor"):
        kernel_names(argparse.Namespace(kernels=None, kernel_source=str(tree), good="HEAD", bad=commits[0]))
    with pytest.raises(BadInput, match="needs all three"):
        kernel_names(argparse.Namespace(kernels=None, kernel_source=str(tree), good="HEAD", bad=None))
    with pytest.raises(BadInput, match="not both"):
        kernel_names(argparse.Namespace(kernels=["a", "b"], kernel_source=str(tree), good="HEAD~1", bad="HEAD"))


@needs_drop
def test_tree_of_another_user_is_refused(tmp_path: Path) -> None:
    tree = fake_tree(tmp_path)
    user = unprivileged.build_user()
    os.chown(tree, user.uid, user.gid)
    with pytest.raises(BadInput, match="build from a tree of your own"):
        kernel_sources.resolve_source(str(tree))


def test_bad_sources_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="give debian:X.Y"):
        kernel_sources.resolve_source("debian:six")
    with pytest.raises(BadInput, match="not the top of a kernel tree|no Makefile and Kconfig"):
        kernel_sources.resolve_source(str(tmp_path))
    with pytest.raises(BadInput, match="not a git repository"):
        kernel_sources.resolve_source(f"{tmp_path}@HEAD")


def run_cli(argv: list[str]) -> int:
    """``memqual kernel ...`` through a parser of its own, with main's error handling."""
    from memqual.host.cli import kernel as kernel_cli
    from memqual.host.cli.command import parser_for, run_command
    from memqual.host.core.errors import MemqualError

    args = parser_for(kernel_cli.COMMAND).parse_args(argv)
    try:
        return run_command(args)
    except MemqualError as exc:
        print(exc)
        return exc.exit_status


def test_cli_bad_source_and_patch_exit_2(
    tmp_path: Path, memqual_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(["kernel", "build", "debian:six"]) == 2
    assert "give debian:X.Y" in capsys.readouterr().out
    assert run_cli(["kernel", "build", str(tmp_path), "--patch", str(tmp_path / "none.patch")]) == 2
    assert "--patch" in capsys.readouterr().out
    assert run_cli(["kernel", "list"]) == 0


@needs_drop
def test_cli_prints_the_name_and_how_to_boot_it(
    tmp_path: Path, memqual_cache: Path, build_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = fake_tree(tmp_path)
    assert run_cli(["kernel", "build", str(tree), "-j", "1"]) == 0
    out = capsys.readouterr().out
    (kernel,) = built_kernels.listing()
    assert out.startswith(f"{kernel.name}: {RELEASE}")
    assert f"--guest-kernel {kernel.bzimage} --guest-modules {kernel.modules}" in out
    assert run_cli(["kernel", "build", str(tree)]) == 0
    assert "cached" in capsys.readouterr().out.splitlines()[0]


@needs_drop
def test_a_build_that_sends_manifest_json_back_as_a_folder_is_one_line(
    tmp_path: Path, memqual_cache: Path, build_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """root writes manifest.json into the entry itself: a patch whose
    build gives one back (here a folder, which root could not write into)
    is refused in one line, exit 2, and leaves no entry."""
    import difflib

    tree = fake_tree(tmp_path)
    old = (tree / "Makefile").read_text()
    new = old.replace("modules_install:\n", "modules_install:\n\tmkdir -p $(INSTALL_MOD_PATH)/manifest.json\n", 1)
    patch = tmp_path / "manifest.patch"
    patch.write_text(
        "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), "a/Makefile", "b/Makefile"))
    )
    assert run_cli(["kernel", "build", str(tree), "--patch", str(patch), "-j", "1"]) == 2
    said = capsys.readouterr().out.strip().splitlines()[-1]
    assert "a folder 'manifest.json', which a build does not make: refused" in said
    assert left_behind(memqual_cache, build_env) == []


@needs_drop
def test_sigterm_ends_make_and_leaves_nothing(tmp_path: Path, memqual_cache: Path, build_env: Path) -> None:
    """memqual kernel build stopped by SIGTERM (a timeout's) takes make's
    process group and its build folder with it."""
    import signal
    import sys
    import time

    tree = fake_tree(tmp_path, hostile="\t@echo '  CC      slow.o'; sleep 60\n")
    env = {**os.environ, "MEMQUAL_CACHE": str(memqual_cache), kernel_env.BUILD_PARENT_ENV: str(build_env)}
    # the toolchain taken as installed in the child too: the fake tree needs none
    code = (
        "import sys; from memqual.images import kernel_build as kb; kb.missing_toolchain = list; "
        "from memqual.host.cli.main import main; sys.exit(main(sys.argv[1:]))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "kernel", "build", str(tree), "-j", "1"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if "compile" in line:
            break
    time.sleep(1.0)  # make is in its sleep
    sleeping = subprocess.run(["pgrep", "-u", "nobody", "-f", "sleep 60"], capture_output=True, text=True).stdout
    assert sleeping.split(), "make's step did not start"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    for pid in sleeping.split():
        assert not Path(f"/proc/{pid}").exists() or "sleep" not in Path(f"/proc/{pid}/cmdline").read_text()
    assert left_behind(memqual_cache, build_env) == []


def test_progress_counts_kbuild_steps_and_estimates_what_is_left() -> None:
    said: list[str] = []
    progress = kb.Progress(expected=100, every_s=0.0, say=said.append, started=0.0)
    for line in ["  CC      mm/ksm.o", "warning: something", "  CC [M]  drivers/virtio/virtio_balloon.o"]:
        progress.line(line)
    assert progress.done == 2 and progress.last == "CC [M] drivers/virtio/virtio_balloon.o"
    assert len(said) == 2  # one line a step here (every_s=0); make's other lines count for nothing
    # 25 of 100 steps in 10 minutes: 30 minutes left
    progress.done = 25
    assert "~30.0 min left" in progress.status(600.0)
    # the linking starts at vmlinux.o (or modpost), not at a composite module's object
    progress.line("  LD [M]  fs/9p/9p.o")
    assert progress.link_at is None
    progress.line("  LD      vmlinux.o")
    assert progress.link_at is not None


@needs_drop
def test_cpu_time_of_a_step_is_its_processes(tmp_path: Path, memqual_cache: Path, build_env: Path) -> None:
    """The compile step's CPU seconds are the compiler's (here a busy
    loop of make's), counted through setpriv and make."""
    spin = "\t@sh -c 'i=0; while [ $$i -lt 150000 ]; do i=$$((i+1)); done'\n"
    kernel = kb.build(str(fake_tree(tmp_path, hostile=spin)), jobs=1, say=lambda _: None)
    assert kernel.cpu_s["compile"] >= 0.05
    assert kernel.cpu_s["compile"] > kernel.cpu_s["config"]


def test_comparison_page_names_the_patch_and_links_its_text(tmp_path: Path) -> None:
    """comparison.html of a --patch run: both kernels, the patch's subject,
    files and hash, a link to its text beside the page, the config diff."""
    from hostile import ESCAPED, HOSTILE
    from results_files import inflate_record, write_results_file

    from memqual.host.judge.ab_outcome import decide
    from memqual.host.judge.comparison import compare_runs
    from memqual.host.judge.results import Results, load_results
    from memqual.host.report.compare_report import comparison_page, render_comparison_html

    def results(name: str, loc: float) -> Results:
        replicates = [[loc * (1 + 0.01 * i)] * 3 for i in range(6)]
        record = dataclasses.replace(inflate_record(replicates), blocks=list(range(1, 7)))
        return load_results(str(write_results_file(tmp_path / f"{name}.json", [record])))

    a, b = results("a", 0.8), results("b", 0.8)
    result = decide(compare_runs([a], [b]))
    record = {
        "patches": [
            {
                "path": "/x/0001-p.patch",
                "sha256": "ab" * 32,
                "subject": f"virtio_balloon: raise {HOSTILE}",
                "files": ["drivers/virtio/virtio_balloon.c"],
                "text": "patch/0001-p.patch",
            }
        ],
        "a": {"name": "6.1.192-memqual-aaaa", "source": "linux-source-6.1 6.1.192-3"},
        "b": {"name": "6.1.192-memqual-bbbb", "source": "linux-source-6.1 6.1.192-3"},
        "config_diff": ["CONFIG_X: n -> y"],
        "built_diff": ["kernel/drivers/virtio/virtio_balloon.ko: differs"],
        "scope": {"kind": "scoped", "line": "the patch touches only code balloon.inflate exercise: running those"},
    }
    page = render_comparison_html(comparison_page(result, a, b, patch=record))
    assert "What ran: the patch touches only code balloon.inflate exercise" in page
    assert "The patch under test" in page and f"virtio_balloon: raise {ESCAPED}" in page and HOSTILE not in page
    assert "drivers/virtio/virtio_balloon.c" in page and "ab" * 32 in page
    assert "virtio_balloon.ko: differs" in page
    assert "href='patch/0001-p.patch'" in page and "6.1.192-memqual-bbbb" in page and "CONFIG_X: n -&gt; y" in page
    assert "The patch under test" not in render_comparison_html(comparison_page(result, a, b))


def test_balloon_variant_patch_applies_over_the_balloon_patch() -> None:
    """The variant is built from each arm's own tree, B's with the balloon
    patch: no hunk of the variant's patch may need the line that patch
    changes (as context or as a removed line)."""
    shipped = Path(__file__).resolve().parents[2]
    balloon = (shipped / "docs/patches/0001-virtio_balloon-raise-ARRAY_PFNS_MAX.patch").read_text()
    changed = {line[1:] for line in balloon.splitlines() if line.startswith("-#")}
    assert changed == {"#define VIRTIO_BALLOON_ARRAY_PFNS_MAX 256"}
    variant = balloon_driver.PATCH.read_text().split("\n--- a/", 1)[1]
    needed = {line[1:] for line in variant.splitlines() if line[:1] in (" ", "-")}
    assert not changed & needed


def test_run_patch_says_when_only_leaves_out_the_negative_controls() -> None:
    from memqual.host.cli.kernel import controls_left_out

    left_out, tag = controls_left_out(("balloon-timing",))
    assert set(left_out) == {"memslots.kvm", "memslots.kvm_lookup"} and tag == "kvm"
    assert controls_left_out(("balloon-timing", "kvm")) == ([], "")
    assert controls_left_out(()) == ([], "")  # the whole run keeps them


@needs_drop
def test_patched_build_without_a_copy_of_the_base_builds_from_the_source(
    tmp_path: Path, memqual_cache: Path, build_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = fake_tree(tmp_path)
    kb.build(str(tree), jobs=1, say=lambda _: None)

    def no_copy(*_: object) -> str:
        raise BadInput("copying the base tree failed: python3: not found")

    monkeypatch.setattr(tree_copy, "copy_base", no_copy)
    patch = tmp_path / "p.patch"
    patch.write_text("--- a/init/main.c\n+++ b/init/main.c\n@@ -1 +1 @@\n-int main(void) { return 0; }\n+int x;\n")
    said: list[str] = []
    patched = kb.build(str(tree), [patch], jobs=1, say=said.append)
    assert not patched.incremental and "unpack" in patched.steps_s
    assert any("building from the source instead" in line for line in said)


@needs_drop
def test_fresh_folder_replaces_what_a_killed_build_left(build_env: Path) -> None:
    user = unprivileged.build_user()
    parent = unprivileged.build_parent(build_env)
    first = unprivileged.fresh_folder(parent, user, "work-k")
    unprivileged.run(user, ["touch", "left-behind"], first, first / "home")
    again = unprivileged.fresh_folder(parent, user, "work-k")
    st = os.lstat(again)
    assert again == first and not (again / "left-behind").exists()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (user.uid, 0o700) and (again / "home/tmp").is_dir()

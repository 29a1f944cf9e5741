"""memqual qemu build (images/qemu_build.py, qemu_sources.py, built_qemus.py):
the source package's parts (series, .dsc, versions), and whole builds of
a tiny fake QEMU source package through the real privilege drop: Debian's
patches then the user's applied in order, a patch that does not apply, a
compile that fails, and the build found again by name through --qemu.
No real QEMU is compiled here (docs/qemu-builds.md has the real one)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from build_parent import build_parent

from memqual.host.cli.main import main
from memqual.host.core import qemu_binary
from memqual.host.core.errors import BadInput
from memqual.images import built_qemus, qemu_sources
from memqual.images import qemu_build as qb

VERSION = "1:7.2+dfsg-7+deb12u18"

CONFIGURE = """#!/bin/sh
# the fake configure: its options kept, a build.ninja that makes the binary
note=
for a in "$@"; do case "$a" in --with-pkgversion=*) note="${a#--with-pkgversion=}";; esac; done
printf '%s\\n' "$@" > configure.args
cat > build.ninja <<EOF
rule make
  command = sh ../make-binary.sh "$note" \\$out
build qemu-system-x86_64: make ../src.c
EOF
"""
MAKE_BINARY = """#!/bin/sh
# as QEMU's build: never as root; {hostile}
test "$(id -u)" != 0
printf '#!/bin/sh\\n# %s\\necho "QEMU emulator version %s (%s)"\\n' "$(cat ../src.c)" "$(cat ../VERSION)" "$1" > "$2"
chmod 755 "$2"
"""
SERIES = "# Debian's series\nfirst.patch\n"
DEBIAN_PATCH = "--- a/src.c\n+++ b/src.c\n@@ -1 +1 @@\n-base\n+debian\n"
USER_PATCH = "Subject: [PATCH] svm: a fix\n---\n--- a/src.c\n+++ b/src.c\n@@ -1 +1 @@\n-debian\n+user\n"


def tarball(path: Path, files: dict[str, tuple[str, int]]) -> None:
    with tarfile.open(path, "w:xz") as out:
        for name, (text, mode) in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            out.addfile(info, io.BytesIO(data))


def fake_source(cache: Path, hostile: str = "") -> qemu_sources.QemuSource:
    """A 3.0 (quilt) source package in the cache as ``fetch`` leaves one."""
    folder = cache / "qemu-src" / "fake"
    folder.mkdir(parents=True)
    os.chmod(cache / "qemu-src", 0o700)
    make = MAKE_BINARY.format(hostile=hostile) + (f"{hostile}\n" if hostile else "")
    tarball(
        folder / "qemu_7.2+dfsg.orig.tar.xz",
        {
            "qemu-7.2.0/VERSION": ("7.2.22\n", 0o644),
            "qemu-7.2.0/configure": (CONFIGURE, 0o755),
            "qemu-7.2.0/make-binary.sh": (make, 0o755),
            "qemu-7.2.0/src.c": ("base\n", 0o644),
        },
    )
    tarball(
        folder / "qemu_7.2+dfsg-7.debian.tar.xz",
        {"debian/patches/series": (SERIES, 0o644), "debian/patches/first.patch": (DEBIAN_PATCH, 0o644)},
    )
    manifest = {
        "package_version": VERSION,
        "dsc": "qemu.dsc",
        "orig": "qemu_7.2+dfsg.orig.tar.xz",
        "debian": "qemu_7.2+dfsg-7.debian.tar.xz",
        "dsc_sha256": "d" * 64,
    }
    (folder / "qemu.dsc").write_text("Format: 3.0 (quilt)\n")
    (folder / qemu_sources.MANIFEST).write_text(json.dumps(manifest))
    source = qemu_sources.load(folder)
    assert source is not None
    return source


needs_drop = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("setpriv", "patch", "ninja", "xz")),
    reason="the privilege drop needs root, setpriv (util-linux), patch, ninja and xz",
)


@pytest.fixture
def build_env(memqual_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Build folders under a fresh root-owned 0711 parent the build user can
    pass through; the toolchain taken as installed (the fake needs none)."""
    memqual_cache.mkdir(mode=0o700)
    monkeypatch.setattr(qb, "missing_toolchain", list)
    with build_parent(monkeypatch, "mq-qbuild-test-") as parent:
        yield parent


def use_source(monkeypatch: pytest.MonkeyPatch, source: qemu_sources.QemuSource) -> None:
    monkeypatch.setattr(qemu_sources, "fetch", lambda version, cache: source)


def left_behind(cache: Path, parent: Path) -> list[str]:
    builds = cache / "qemu-builds"
    kept = sorted(p.name for p in builds.iterdir() if not p.name.startswith(".lock-")) if builds.exists() else []
    return kept + sorted(p.name for p in parent.glob("qemu-*"))


@needs_drop
def test_fake_build_applies_debian_then_user_patches_and_is_found_by_name(
    tmp_path: Path, memqual_cache: Path, build_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_source(monkeypatch, fake_source(memqual_cache))
    plain = qb.build(jobs=1, say=lambda _: None)
    assert plain.name.startswith("7.2.22-") and plain.version == "7.2.22"
    assert "# debian" in plain.binary.read_text()  # Debian's series applied
    assert f"memqual {plain.key} of Debian {VERSION}" in plain.binary.read_text()
    assert set(plain.steps_s) >= {"unpack", "Debian's 1 patches", "configure", "compile", "checks"}
    (tmp_path / "fix.patch").write_text(USER_PATCH)
    patched = qb.build(patch_paths=[tmp_path / "fix.patch"], jobs=1, say=lambda _: None)
    assert patched.key != plain.key and "# user" in patched.binary.read_text()
    assert [p.subject for p in patched.patches] == ["svm: a fix"]
    # cached: the same inputs give the same build without building
    assert qb.build(patch_paths=[tmp_path / "fix.patch"], say=lambda _: None).cached
    assert left_behind(memqual_cache, build_env) == sorted([plain.name, patched.name])
    # --qemu NAME is the build's binary, and says what it is
    choice = qemu_binary.resolve(patched.name, memqual_cache)
    assert choice.binary == patched.binary and choice.version == "7.2.22"
    assert choice.origin == f"memqual build {patched.name}: Debian qemu {VERSION} + fix.patch"


@needs_drop
def test_patch_that_does_not_apply_leaves_nothing(
    tmp_path: Path, memqual_cache: Path, build_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_source(monkeypatch, fake_source(memqual_cache))
    (tmp_path / "stale.patch").write_text(USER_PATCH.replace("-debian", "-other"))
    with pytest.raises(BadInput, match=r"stale.patch does not apply: src.c hunk #1"):
        qb.build(patch_paths=[tmp_path / "stale.patch"], jobs=1, say=lambda _: None)
    assert left_behind(memqual_cache, build_env) == []


@needs_drop
def test_failed_compile_names_the_file_and_leaves_nothing(
    memqual_cache: Path, build_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hostile = "echo '../src.c:1:1: error: this does not compile'; exit 1"
    use_source(monkeypatch, fake_source(memqual_cache, hostile=hostile))
    with pytest.raises(BadInput, match=r"the QEMU build failed in ../src.c: .*this does not compile"):
        qb.build(jobs=1, say=lambda _: None)
    assert left_behind(memqual_cache, build_env) == []


def test_series_in_order_with_strip_levels_and_no_escapes() -> None:
    text = "# head\nv7.2.1.diff\n\nmicrovm/fix.patch -p0  # why\n"
    assert qemu_sources.parse_series(text) == [
        qemu_sources.SeriesPatch("v7.2.1.diff", 1),
        qemu_sources.SeriesPatch("microvm/fix.patch", 0),
    ]
    for bad in ("../etc/passwd", "a b c", "x.patch -p"):
        with pytest.raises(BadInput, match="is no patch name"):
            qemu_sources.parse_series(bad)


def test_dsc_check_takes_one_quilt_package_with_its_hashes(tmp_path: Path) -> None:
    orig, debian = tmp_path / "q_1.orig.tar.xz", tmp_path / "q_1-1.debian.tar.xz"
    orig.write_bytes(b"upstream")
    debian.write_bytes(b"debian")

    def line(path: Path) -> str:
        return f" {hashlib.sha256(path.read_bytes()).hexdigest()} {path.stat().st_size} {path.name}\n"

    dsc = tmp_path / "q_1-1.dsc"
    dsc.write_text("Format: 3.0 (quilt)\nChecksums-Sha256:\n" + line(orig) + line(debian) + "Files:\n x 1 y\n")
    manifest = qemu_sources.check(tmp_path, VERSION)
    assert (manifest["orig"], manifest["debian"]) == (orig.name, debian.name)
    debian.write_bytes(b"changed")
    with pytest.raises(BadInput, match="not the sha256 its .dsc names"):
        qemu_sources.check(tmp_path, VERSION)
    dsc.write_text("Format: 1.0\n")
    with pytest.raises(BadInput, match="not a 3.0 \\(quilt\\) source package"):
        qemu_sources.check(tmp_path, VERSION)


def test_version_resolves_to_the_archive_source(memqual_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(qemu_sources, "offers", lambda cache: ["1:10.0.2+ds-2~bpo12+1", VERSION])
    monkeypatch.setattr(qemu_sources, "system_source_version", lambda: VERSION)
    assert qemu_sources.resolve(None, memqual_cache) == VERSION  # the system QEMU's own source
    assert qemu_sources.resolve("10.0.2", memqual_cache) == "1:10.0.2+ds-2~bpo12+1"
    assert qemu_sources.resolve("7.2+dfsg-7+deb12u18", memqual_cache) == VERSION
    with pytest.raises(BadInput, match="the archive's qemu sources are"):
        qemu_sources.resolve("8.2", memqual_cache)
    monkeypatch.setattr(qemu_sources, "system_source_version", lambda: "1:7.2+dfsg-7+deb12u1")
    assert qemu_sources.resolve(None, memqual_cache) == "1:10.0.2+ds-2~bpo12+1"  # gone from the archive: the newest


def test_cache_key_covers_source_patches_and_compiler(tmp_path: Path) -> None:
    source = qemu_sources.QemuSource(VERSION, tmp_path, tmp_path, tmp_path, tmp_path, "a" * 64)
    other = qemu_sources.QemuSource(VERSION, tmp_path, tmp_path, tmp_path, tmp_path, "b" * 64)
    (tmp_path / "p.patch").write_text(USER_PATCH)
    patch = qb.read_patch(tmp_path / "p.patch")
    keys = {
        qb.cache_key(source, [], "gcc 12"),
        qb.cache_key(other, [], "gcc 12"),
        qb.cache_key(source, [patch], "gcc 12"),
        qb.cache_key(source, [], "gcc 13"),
    }
    assert len(keys) == 4
    assert built_qemus.BUILT_NAME.fullmatch(f"7.2.22-{qb.cache_key(source, [], 'gcc 12')}")


@pytest.mark.parametrize(
    "argv, says",
    [
        (["qemu", "build", "--patch", "/nonexistent.patch"], "--patch /nonexistent.patch: no such file"),
        (["qemu", "build", "--jobs", "0"], "--jobs"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], says: str, memqual_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status: object
    try:
        status = main(argv)
    except SystemExit as exc:  # argparse's own refusals
        status = exc.code
    assert status == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert says in err[-1]
    assert not (memqual_cache / "qemu-builds").exists()


def test_versions_sort_as_debian_orders_them() -> None:
    import functools

    listed = ["1:7.2+dfsg-7+deb12u18", "1:7.2+dfsg-7+deb12u2", "1:10.0.2+ds-2~bpo12+1", "1:7.2+dfsg-7"]
    newest = sorted(listed, key=functools.cmp_to_key(qemu_sources.compare_versions), reverse=True)
    assert newest == ["1:10.0.2+ds-2~bpo12+1", "1:7.2+dfsg-7+deb12u18", "1:7.2+dfsg-7+deb12u2", "1:7.2+dfsg-7"]


def test_the_signed_lists_name_each_file_and_its_hash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    printed = (
        "Need to get 23.9 MB of source archives.\n"
        f"'http://deb.debian.org/debian/pool/main/q/qemu/qemu_7.2%2bdfsg-7.dsc' qemu_7.2+dfsg-7.dsc 6909 "
        f"SHA256:{'a' * 64}\n"
        f"'http://deb.debian.org/debian/pool/main/q/qemu/qemu_7.2%2bdfsg.orig.tar.xz' qemu_7.2+dfsg.orig.tar.xz 1 "
        f"SHA256:{'b' * 64}\n"
    )
    seen: list[list[str]] = []

    def apt(argv: list[str], cwd: Path | None = None) -> str:
        seen.append(argv)
        assert cwd is not None and not list(cwd.iterdir())  # asked in an empty folder: apt lists every file
        return printed

    monkeypatch.setattr(qemu_sources.packages, "run_apt", apt)
    apt_dir = qemu_sources.PrivateApt(tmp_path, source_packages=True)
    files = qemu_sources.listed_files(VERSION, apt_dir)
    assert files == {"qemu_7.2+dfsg-7.dsc": "a" * 64, "qemu_7.2+dfsg.orig.tar.xz": "b" * 64}
    assert seen[0][-2:] == ["--print-uris", f"qemu={VERSION}"]
    # only deb-src lines of the release's suites, none of the system's sources
    assert f"Dir::Etc::sourceparts={tmp_path / 'parts'}" in seen[0]
    assert all(line.startswith("deb-src ") for line in apt_dir.lines("bookworm").splitlines())


def test_a_build_name_that_is_not_here_is_refused_as_a_build(memqual_cache: Path) -> None:
    (memqual_cache / "qemu-builds").mkdir(parents=True, mode=0o700)
    os.chmod(memqual_cache, 0o700)
    with pytest.raises(BadInput, match="no built QEMU '7.2.22-0123456789ab': memqual qemu list"):
        qemu_binary.resolve("7.2.22-0123456789ab", memqual_cache)

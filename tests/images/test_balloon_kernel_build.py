"""``--kernel-build DIR``: a user kernel's build tree gives it the balloon
driver variant; without it the variant is unavailable with that reason; a
directory that is not a kbuild tree is one line and exit 2 on image build,
boot and run, before anything is built or booted."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from memqual.host.cli import main as cli
from memqual.host.cli import run as run_command
from memqual.host.cli.command import parser_for
from memqual.host.core.errors import BadInput, CapabilityMissing
from memqual.host.run import avocado as run_avocado_job
from memqual.host.run import job as runjob
from memqual.images import balloon_driver as bdrv


def _tree(root: Path, release: str = "6.9.0-test", balloon: str = "m", source: bool = True) -> Path:
    tree = root / "linux"
    (tree / "include/config").mkdir(parents=True)
    (tree / "Makefile").write_text("# kbuild\n")
    (tree / ".config").write_text(f"CONFIG_VIRTIO=y\nCONFIG_VIRTIO_BALLOON={balloon}\n")
    (tree / "Module.symvers").write_text("0x00000000\tprintk\tvmlinux\tEXPORT_SYMBOL\t\n")
    (tree / "include/config/kernel.release").write_text(release + "\n")
    if source:
        (tree / "drivers/virtio").mkdir(parents=True)
        (tree / bdrv.SOURCE_MEMBER).write_text("/* virtio_balloon.c */\n")
    return tree


@pytest.mark.parametrize("missing", bdrv.KBUILD_MARKS)
def test_a_directory_without_kbuilds_marks_is_refused_naming_them(tmp_path, missing):
    tree = _tree(tmp_path)
    (tree / missing).unlink()
    with pytest.raises(BadInput, match=f"not a kernel build tree \\(no {missing}\\)"):
        bdrv.check_kernel_build(tree)
    with pytest.raises(BadInput, match="no such directory"):
        bdrv.check_kernel_build(tmp_path / "nowhere")
    assert bdrv.check_kernel_build(_tree(tmp_path / "good")) == (tmp_path / "good/linux").resolve()


def _must_not_run(*args, **kwargs):
    raise AssertionError("built or booted despite a bad --kernel-build")


@pytest.mark.parametrize(
    "command",
    [
        ["image", "build", "--kernel", "K", "--modules", "M"],
        ["boot", "--kernel", "K", "--modules", "M"],
        ["run", "--guest-kernel", "K", "--guest-modules", "M"],
    ],
)
def test_a_bad_tree_is_one_line_and_exit_2_before_anything_runs(tmp_path, monkeypatch, capsys, command):
    monkeypatch.setattr("memqual.images.build.build", _must_not_run)
    monkeypatch.setattr(runjob, "run", _must_not_run)
    (tmp_path / "notatree").mkdir()
    with pytest.raises(SystemExit) as exited:
        cli.main([*command, "--kernel-build", str(tmp_path / "notatree")])
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a kernel build tree (no Makefile, .config, Module.symvers)" in err[0]


def test_kernel_build_goes_with_a_users_kernel(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("memqual.images.build.build", _must_not_run)
    tree = _tree(tmp_path)
    assert cli.main(["image", "build", "--kernel-build", str(tree)]) == 2
    assert "goes with --kernel/--modules" in capsys.readouterr().err


def _run_args(tmp_path: Path, *extra: str) -> argparse.Namespace:
    parser = parser_for(run_command.COMMAND)
    (tmp_path / "e2e").mkdir(exist_ok=True)
    return parser.parse_args(["run", "--output", str(tmp_path / "out"), "--tests", str(tmp_path / "e2e"), *extra])


def test_run_passes_each_kernels_tree_to_the_scenarios(tmp_path):
    kernel = tmp_path / "bzImage"
    kernel.write_bytes(b"kernel")
    (tmp_path / "mods").mkdir()
    tree = _tree(tmp_path)
    args = _run_args(tmp_path, "--guest-kernel", str(kernel), "--guest-modules", str(tmp_path / "mods"))
    config = run_command.config_from_args(args)
    assert config.kernels[0].kernel_build is None
    env = run_avocado_job.scenario_environment(config, config.kernels[0])
    assert bdrv.ENV_KERNEL_BUILD not in env
    args.kernel_build = [str(tree)]
    config = run_command.config_from_args(args)
    env = run_avocado_job.scenario_environment(config, config.kernels[0])
    assert env[bdrv.ENV_KERNEL_BUILD] == str(tree) and env[bdrv.ENV_KERNEL] == str(kernel.resolve())
    args.kernel_build = [str(tree), str(tree)]
    with pytest.raises(BadInput, match="once per --guest-kernel"):
        run_command.config_from_args(args)


class _Image:
    release = "6.9.0-test"


def test_a_users_kernel_without_its_tree_has_no_variant_and_says_why(monkeypatch):
    monkeypatch.setenv(bdrv.ENV_KERNEL, "/k/bzImage")
    monkeypatch.delenv(bdrv.ENV_KERNEL_BUILD, raising=False)
    with pytest.raises(CapabilityMissing, match="only with its build tree: give --kernel-build DIR"):
        bdrv.for_image(_Image())  # type: ignore[arg-type]  # only .release is read


def test_a_users_kernel_with_its_tree_gets_the_variant_built_from_it(tmp_path, monkeypatch):
    tree = _tree(tmp_path)
    monkeypatch.setenv(bdrv.ENV_KERNEL, "/k/bzImage")
    monkeypatch.setenv(bdrv.ENV_KERNEL_BUILD, str(tree))
    monkeypatch.setenv("MEMQUAL_CACHE", str(tmp_path / "cache"))
    calls = []

    def build_into(out, source, kbuild, variant, what, started):
        calls.append((source, kbuild, variant))
        return variant

    monkeypatch.setattr(bdrv, "_build_into", build_into)
    variant = bdrv.for_image(_Image())  # type: ignore[arg-type]  # only .release is read
    ((source, kbuild, made),) = calls
    assert source == tree.resolve() / bdrv.SOURCE_MEMBER
    assert kbuild == ["make", "-s", "-C", str(tree.resolve())]
    assert variant.release == "6.9.0-test" and variant.ko.name == "virtio_balloon_mq.ko"
    assert variant.ko.parent.name.startswith("6.9.0-test-")


def test_a_tree_of_another_kernel_or_without_a_balloon_module_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMQUAL_CACHE", str(tmp_path / "cache"))
    with pytest.raises(BadInput, match="built 6.9.0-test, but the guest kernel is 6.1.0-57-amd64"):
        bdrv.build_from_tree(_tree(tmp_path / "a"), "6.1.0-57-amd64")
    with pytest.raises(CapabilityMissing, match="CONFIG_VIRTIO_BALLOON=y; .* needs CONFIG_VIRTIO_BALLOON=m"):
        bdrv.build_from_tree(_tree(tmp_path / "b", balloon="y"), "6.9.0-test")
    with pytest.raises(CapabilityMissing, match="has no drivers/virtio/virtio_balloon.c"):
        bdrv.build_from_tree(_tree(tmp_path / "c", source=False), "6.9.0-test")
    # An O= build keeps the source behind its "source" link.
    out_of_tree = _tree(tmp_path / "d", source=False)
    src = _tree(tmp_path / "e")
    (out_of_tree / "source").symlink_to(src)
    monkeypatch.setattr(bdrv, "_build_into", lambda out, source, kbuild, variant, what, started: source)
    assert bdrv.build_from_tree(out_of_tree, "6.9.0-test") == out_of_tree.resolve() / "source" / bdrv.SOURCE_MEMBER


def test_a_debian_kernel_handed_over_as_a_file_gets_the_debian_variant(tmp_path, monkeypatch):
    """``--debian-kernel`` reaches the scenarios as a kernel file in the
    cache: it is built from Debian's source like the default kernel, not
    refused like a user's kernel without its tree."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("MEMQUAL_CACHE", str(cache))
    vmlinuz = cache / "unpacked/linux-image-6.12.111+deb12-amd64_6.12.111-1~deb12u1_amd64/boot"
    vmlinuz.mkdir(parents=True)
    (vmlinuz / "vmlinuz-6.12.111+deb12-amd64").write_bytes(b"")
    kernel = vmlinuz / "vmlinuz-6.12.111+deb12-amd64"
    assert bdrv.debian_release_of(kernel) == "6.12.111+deb12-amd64"
    assert bdrv.debian_release_of(tmp_path / "bzImage") is None
    assert bdrv.debian_release_of(cache / "unpacked/x/boot/vmlinuz-1") is None  # not a kernel package's tree

    monkeypatch.setenv(bdrv.ENV_KERNEL, str(kernel))
    monkeypatch.delenv(bdrv.ENV_KERNEL_BUILD, raising=False)
    built = []

    def build(release=None, force=False):
        built.append(release)
        return "variant"

    monkeypatch.setattr(bdrv, "build", build)

    class Image:
        release = "6.12.111+deb12-amd64"

    assert bdrv.for_image(Image()) == "variant"  # type: ignore[arg-type]  # only .release is read
    assert built == ["6.12.111+deb12-amd64"]


def test_a_packages_dependencies_are_read_by_name(tmp_path, monkeypatch):
    from memqual.images import packages

    field = (
        "Depends: linux-base (>= 4.12~), linux-headers-6.12.111+deb12-common (= 6.12.111-1~deb12u1), "
        "linux-image-6.12.111+deb12-amd64 (= 6.12.111-1~deb12u1) | linux-image-6.12.111+deb12-amd64-unsigned, "
        "linux-kbuild-6.12.111+deb12, gcc-12\n"
    )
    monkeypatch.setattr(packages, "_run", lambda argv, cwd=None: "Package: x\n" + field)
    (tmp_path / "debs").mkdir()
    assert packages.depends("linux-headers-6.12.111+deb12-amd64", "6.12.111-1~deb12u1", tmp_path) == [
        "linux-base",
        "linux-headers-6.12.111+deb12-common",
        "linux-image-6.12.111+deb12-amd64",
        "linux-kbuild-6.12.111+deb12",
        "gcc-12",
    ]

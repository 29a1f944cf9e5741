"""``memqual image build|kernels|clean``."""

from __future__ import annotations

import argparse
import json
import shutil
import time

from memqual.host.cli import args as cliargs
from memqual.host.cli.command import Command, dispatch
from memqual.host.core.errors import BadInput
from memqual.host.core.paths import cache_dir
from memqual.images.balloon_driver import tree_variant_or_reason
from memqual.images.packages import available_kernels, resolve_kernel_package


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="image_command", required=True)
    build = actions.add_parser(
        "build",
        help="build the guest image (or find it in the cache)",
        description="Build the guest image (kernel, initramfs, SSH keys) or find it in the cache.  It takes "
        "no --qemu: nothing in the image depends on the QEMU that runs it (its modules, virtio_mem among "
        "them, are the kernel's), so one image serves every QEMU; what does depend on the QEMU, the warm "
        "snapshot, is kept per QEMU binary.",
    )
    cliargs.add_guest_kernel(build)
    build.add_argument("--force", action="store_true", help="rebuild even when cached")
    build.add_argument("--json", action="store_true")
    build.set_defaults(handler=_build)
    kernels = actions.add_parser("kernels", help="list the Debian kernels the archive offers")
    kernels.add_argument("--json", action="store_true")
    kernels.set_defaults(handler=_kernels)
    clean = actions.add_parser("clean", help="remove cached images and snapshots")
    clean.set_defaults(handler=_clean)


def _build(args: argparse.Namespace) -> int:
    # lazy: the image builder (with cryptography, ~50 ms) only where an image is checked or built
    from memqual.images.build import KernelSource, build

    started = time.monotonic()
    if args.kernel_build and not args.kernel:
        raise BadInput("--kernel-build DIR goes with --kernel/--modules (the tree that kernel was built in)")
    image = build(KernelSource(args.kernel, args.modules, args.debian_kernel), force=args.force)
    variant = tree_variant_or_reason(args.kernel_build, image.release) if args.kernel_build else None
    elapsed = time.monotonic() - started
    if args.json:
        print(json.dumps({**image.to_json(), "seconds": round(elapsed, 3), **(variant or {})}, indent=2))
    else:
        state = "cached" if image.cached else "built"
        print(f"{state} in {elapsed:.2f} s: guest kernel {image.release} ({'PVH vmlinux' if image.pvh else 'bzImage'})")
        print(f"  kernel     {image.kernel}  sha256 {image.kernel_sha256}")
        print(f"  initramfs  {image.directory / 'initramfs.cpio'}  sha256 {image.initramfs_sha256}")
        print(f"  initrd     {image.initrd}  (initramfs + per-image SSH keys)")
        if variant:
            print(f"  balloon    {variant['balloon_variant'] or variant['balloon_variant_unavailable']}")
    return 0


def _kernels(args: argparse.Namespace) -> int:
    # lazy: the image builder (with cryptography, ~50 ms) only where an image is checked or built

    releases = available_kernels(cache_dir())
    default = resolve_kernel_package(cache_dir()).removeprefix("linux-image-")
    if args.json:
        print(json.dumps({"default": default, "kernels": releases}, indent=2))
        return 0
    for release in releases:
        print(release + ("  (default)" if release == default else ""))
    return 0


def _clean(args: argparse.Namespace) -> int:
    removed = 0
    for name in ("images", "snapshots", "agents"):
        path = cache_dir() / name
        if path.exists():
            removed += sum(1 for _ in path.iterdir())
            shutil.rmtree(path)
    print(f"removed {removed} cache entries from {cache_dir()}")
    return 0


COMMAND = Command(
    "image",
    help="build or clean the guest image",
    configure=configure,
    run=dispatch,
)

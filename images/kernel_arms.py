"""The two kernels of ``memqual run --patch``: A the source as it is, B
with the patches (or a second source), built A first, and what differs
between them (their .configs, their artefacts)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

from memqual.host.core.errors import BadInput
from memqual.images import packages
from memqual.images.built_kernels import BuiltKernel
from memqual.images.kernel_build import build
from memqual.images.kernel_config import config_diff
from memqual.images.kernel_patches import Patch, read_patch
from memqual.images.kernel_sources import default_source


@dataclasses.dataclass(frozen=True)
class PatchArms:
    """The two kernels of ``memqual run --patch``: A the source as it is,
    B with the patches (or a second source), and what a record says of them."""

    a: BuiltKernel
    b: BuiltKernel
    patches: tuple[Patch, ...]
    config_diff: tuple[str, ...]
    # what differs between the two builds' artefacts (bzImage, each module,
    # by path): a patch to one driver should change its module alone
    built_diff: tuple[str, ...] = ()

    def text_names(self) -> tuple[str, ...]:
        """Each patch's text's name in OUTPUT/patch/, in the order applied:
        numbered, so two patches of one base name (one/0001-x.patch,
        two/0001-x.patch) each keep their own text."""
        return tuple(f"{number}-{p.path.name}" for number, p in enumerate(self.patches, 1))

    def to_json(self, texts: str = "patch") -> dict[str, Any]:
        """The record; each patch's text in the folder ``texts`` of the
        output (patch/ for guest kernels, host-patch/ for host kernels)."""
        return {
            "patches": [
                dataclasses.asdict(p.record()) | {"text": f"{texts}/{name}"}
                for p, name in zip(self.patches, self.text_names(), strict=True)
            ],
            "a": self.a.to_json(),
            "b": self.b.to_json(),
            "config_diff": list(self.config_diff),
            "built_diff": list(self.built_diff),
        }


def artefact_hashes(kernel: BuiltKernel) -> dict[str, str]:
    """sha256 of the bzImage and of each module (.ko), by path below the
    release's modules folder; the balloon driver variant beside them."""
    found = {"bzImage": packages.sha256_file(kernel.bzimage)}
    for ko in sorted(kernel.modules.rglob("*.ko")):
        found[str(ko.relative_to(kernel.modules))] = packages.sha256_file(ko)
    if kernel.balloon_variant is not None:
        found[kernel.balloon_variant.name] = packages.sha256_file(kernel.balloon_variant)
    return found


def built_diff(a: BuiltKernel, b: BuiltKernel) -> list[str]:
    """The artefacts that differ between two builds, one line each: what
    a patch changed in what the guest runs (nothing, for a null patch of
    a reproducible build: kbuild's stamps are fixed, STAMP_ENV)."""
    ha, hb = artefact_hashes(a), artefact_hashes(b)
    lines = []
    for name in sorted(set(ha) | set(hb)):
        if name not in hb:
            lines.append(f"{name}: only in A")
        elif name not in ha:
            lines.append(f"{name}: only in B")
        elif ha[name] != hb[name]:
            lines.append(f"{name}: differs")
    return lines


def arms(
    sources: Sequence[str],
    patch_paths: Sequence[str | os.PathLike[str]],
    config_paths: Sequence[str | os.PathLike[str]] = (),
    *,
    jobs: int | None = None,
    say: Callable[[str], None] = print,
) -> PatchArms:
    """A and B built (A first: B then starts from A's objects): one source
    with the patches on B, or two sources (the patches, if any, on B)."""
    if len(sources) > 2:
        raise BadInput("give --kernel-source at most twice (A and B)")
    if len(sources) < 2 and not patch_paths:
        raise BadInput("one --kernel-source compares nothing: give --patch FILE, or --kernel-source twice")
    patches = tuple(read_patch(p) for p in patch_paths)  # checked before anything is fetched or built
    chosen = list(sources) or [default_source()]
    a = build(chosen[0], (), config_paths, jobs=jobs, say=say)
    b = build(chosen[-1], patch_paths, config_paths, jobs=jobs, say=say)
    diff = config_diff(a.config_text(), b.config_text())
    return PatchArms(a, b, patches, tuple(diff), tuple(built_diff(a, b)))

"""A kernel build's config: the fragments (memqual's and the user's), what
they ask for and what olddefconfig kept of it, the difference of two
.configs, and the config step (assembled, or a copied base's kept)."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from memqual.host.core import bounded
from memqual.host.core.errors import BadInput
from memqual.images import unprivileged
from memqual.images.kernel_env import run_ok

# What a fragment's value may be: a tristate, a number, or a quoted string
# of letters, digits, spaces and ._,:/=+@%- .  kconfig writes a string
# value into include/config/auto.conf as it is (unquoted since Linux 5.17),
# make includes that file, and kbuild expands CONFIG_ variables in make
# ("$(shell ...)", "${...}" run there) and in recipes, where the shell
# reads ; | & ` < > ( ) ' \ and quotes: an unpatched build, which runs
# unconfined, would run them.
FRAGMENT_VALUE = re.compile(r'[ymn]|-?[0-9]+|0[xX][0-9a-fA-F]+|"[A-Za-z0-9 ._,:/=+@%-]*"|')


# A Kconfig fragment is a few lines; Debian's whole .config is about 250 kB.
FRAGMENT_LIMIT = 1 << 20


def read_fragment(path: str | os.PathLike[str]) -> tuple[str, bytes]:
    file = Path(path)
    if not file.is_file():
        raise BadInput(f"--config {file}: no such file: give a Kconfig fragment (CONFIG_X=y lines)")
    data = bounded.read_file(file, FRAGMENT_LIMIT, "Kconfig fragment", "give a Kconfig fragment (CONFIG_X=y lines)")
    for number, line in enumerate(data.decode(errors="replace").splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        setting = re.fullmatch(r"CONFIG_[A-Za-z0-9_]+=(.*)", stripped)
        if setting is None:
            raise BadInput(f"--config {file}:{number}: {stripped[:60]!r} is not CONFIG_NAME=value or a comment")
        if not FRAGMENT_VALUE.fullmatch(setting.group(1)):
            raise BadInput(
                f"--config {file}:{number}: {stripped[:60]!r}: give y, m, n, a number or a quoted string of letters, "
                "digits, spaces and ._,:/=+@%- (make and the shell would read $, `, ;, quotes and the like in it)"
            )
    return str(file.resolve()), data


def fragment_wants(text: str) -> dict[str, str]:
    """CONFIG_X -> value a fragment asks for ('n' for "# CONFIG_X is not set")."""
    wants: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        unset = re.fullmatch(r"# (CONFIG_[A-Za-z0-9_]+) is not set", line)
        if unset:
            wants[unset.group(1)] = "n"
        elif line.startswith("CONFIG_") and "=" in line:
            name, value = line.split("=", 1)
            wants[name] = value
    return wants


def config_values(text: str) -> dict[str, str]:
    """A .config's CONFIG_X -> value; unset symbols are absent."""
    return {k: v for k, v in fragment_wants(text).items() if v != "n"}


def unmet(wants: dict[str, str], final: dict[str, str]) -> list[str]:
    """What a fragment asked for that olddefconfig did not keep."""
    missing = []
    for name, value in sorted(wants.items()):
        got = final.get(name, "n")
        if got != value:
            missing.append(f"{name}={value} (got {got})")
    return missing


def config_diff(a: str, b: str) -> list[str]:
    """The symbols whose values differ between two .configs, one line each."""
    va, vb = config_values(a), config_values(b)
    return [f"{n}: {va.get(n, 'n')} -> {vb.get(n, 'n')}" for n in sorted(set(va) | set(vb)) if va.get(n) != vb.get(n)]


def assemble_config(
    user: unprivileged.BuildUser, folder: Path, fragments: Sequence[tuple[str, bytes]]
) -> tuple[str, list[str]]:
    """defconfig + kvm_guest.config + the fragments, then olddefconfig; the
    final .config's text and what it did not keep of the fragments."""
    tree, home = folder / "linux", folder / "home"
    wants: dict[str, str] = {}
    for index, (_, data) in enumerate(fragments):
        wants.update(fragment_wants(data.decode(errors="replace")))
        run_ok(user, ["tee", f"../home/fragment-{index}.config"], tree, home, "writing a config fragment", data)
    names = [f"../home/fragment-{index}.config" for index in range(len(fragments))]
    run_ok(user, ["make", "-s", "x86_64_defconfig"], tree, home, "make x86_64_defconfig")
    run_ok(user, ["make", "-s", "kvm_guest.config"], tree, home, "make kvm_guest.config")
    run_ok(
        user,
        ["sh", "scripts/kconfig/merge_config.sh", "-m", "-O", ".", ".config", *names],
        tree,
        home,
        "merging the config fragments",
    )
    run_ok(user, ["make", "-s", "olddefconfig"], tree, home, "make olddefconfig")
    final = run_ok(user, ["cat", ".config"], tree, home, "reading .config").stdout
    return final, unmet(wants, config_values(final))


def kept_config(
    user: unprivileged.BuildUser, folder: Path, fragments: Sequence[tuple[str, bytes]]
) -> tuple[str, list[str]]:
    """The .config a copied base tree already has (assembled from the same
    fragments: they are part of the base's key), and what it did not keep
    of them."""
    wants: dict[str, str] = {}
    for _, data in fragments:
        wants.update(fragment_wants(data.decode(errors="replace")))
    final = run_ok(user, ["cat", ".config"], folder / "linux", folder / "home", "reading .config").stdout
    return final, unmet(wants, config_values(final))

"""The table of memqual's commands, in ``memqual --help``'s order, and the
options one feature adds to another's command.  A new command is one row
here and one module beside this one.  Each command module keeps its heavy
imports inside its run, so that building this table (every ``memqual``
start) stays quick.
"""

from __future__ import annotations

from memqual.host.cli import (
    balloon,
    bisect,
    boot,
    compare,
    doctor,
    export,
    history,
    host_patch,
    hosts,
    image,
    kernel,
    ksm,
    memslots,
    qemu,
    qemu_patch,
    run,
)
from memqual.host.cli.command import Command, Option

COMMANDS: tuple[Command, ...] = (
    image.COMMAND,  # memqual image build|kernels|clean
    kernel.COMMAND,  # memqual kernel build|list
    doctor.COMMAND,  # memqual doctor
    boot.COMMAND,  # memqual boot
    ksm.COMMAND,  # memqual ksm status|restore
    balloon.COMMAND,  # memqual balloon model|curve|measure
    compare.COMMAND,  # memqual compare A.json B.json
    run.COMMAND,  # memqual run
    memslots.COMMAND,  # memqual memslots model|lookup|kvm|qemu
    bisect.COMMAND,  # memqual bisect --kernels K1 ... Kn --metric NAME
    export.COMMAND,  # memqual export --kcidb FILE RESULTS.json
    history.COMMAND,  # memqual history DIR...
    hosts.COMMAND,  # memqual hosts check|probe
    qemu.COMMAND,  # memqual qemu list|build
)

OPTIONS: tuple[Option, ...] = (
    hosts.RUN_ON_HOSTS,  # memqual run --hosts FILE
    kernel.RUN_PATCH,  # memqual run --patch FILE [--kernel-source SOURCE]
    # memqual run --host-patch FILE [--host-kernel-source SOURCE]; last, so it runs first: it refuses --patch
    # beside it before run --patch builds anything
    host_patch.RUN_HOST_PATCH,
    # memqual run --qemu-patch FILE [--qemu-source VERSION]: after the kernel patches, so it runs before them and
    # refuses them beside it before anything is built
    qemu_patch.RUN_QEMU_PATCH,
)

"""A guest and a balloon controller as the balloon driver variant
(host/balloon/driver.py) sees them: insmod refuses what the real driver
refuses, and a move counts its pages."""

from __future__ import annotations

from memqual.host.balloon import driver as bd


# -- deployment against a fake guest ----------------------------------------
class Result:
    def __init__(self, stdout="", status=0, stderr=""):
        self.stdout, self.status, self.stderr = stdout, status, stderr


class Moved:
    def __init__(self, actual):
        self.reached, self.actual_bytes = True, actual


class FakeGuest:
    """Just enough of a guest: insmod refuses what the real driver refuses."""

    def __init__(self):
        self.module: str | None = "virtio_balloon"
        self.pfns = 0
        self.pages = 0
        self.commands: list[str] = []
        self.ssh = self

    def push(self, local, path, mode):
        self.commands.append(f"push {path}")

    def run(self, argv, check=True, timeout=60.0, input=None):
        script = argv[-1]
        self.commands.append(script)
        if script.startswith("insmod"):
            n = int(script.rsplit("=", 1)[1].strip("'"))
            if not 1 <= n <= bd.PFNS_MAX:
                return Result(status=1, stderr="insmod: can't insert: Invalid argument")
            self.module, self.pfns = bd.MODULE, n
            return Result()
        if script.startswith("dmesg"):
            return Result(
                "[ 1.0] virtio_balloon_mq: pfns_per_request=0 refused: give 1..1048576\n"
                f"[ 2.0] virtio_balloon_mq virtio1: memqual variant: {self.pfns} PFNs per request\n"
            )
        if script.startswith("ls /sys/bus/virtio/drivers/"):
            bound = "1" if self.module and f"/{self.module}/" in script else "0"
            return Result(f"{bound}\n{self.pfns}\n12288\n" if "tainted" in script else bound + "\n")
        if script.startswith("rmmod") and "modprobe" in script:
            self.module = "virtio_balloon"
        if script.startswith("cat") and "timing" in script:
            return Result(
                f"inflate requests=1 pfns={self.pages} alloc_ns=1 wait_ns=1 total_ns=2 span_ns=2\n"
                "deflate requests=1 pfns=0 alloc_ns=0 wait_ns=0 total_ns=0 span_ns=0\n"
            )
        if script.startswith("echo 1 >"):
            self.pages = 0
        return Result()


class FakeController:
    def __init__(self, guest):
        self.guest = guest

    def ram_bytes(self):
        return 1 << 30

    def reach(self, target, deadline_s=60.0):
        if target < self.ram_bytes():
            self.guest.pages += (self.ram_bytes() - target) // bd.PAGE
        return Moved(target)

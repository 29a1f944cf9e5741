#!/bin/sh
# memqual guest start-up, run once by busybox init (sysinit).  Kept short:
# under TCG every command here costs boot time.
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm /tmp /run
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /tmp
# Drivers: modprobe resolves dependencies from modules.dep and reads
# module options (virtio_mmio.device=...) from /proc/cmdline.
# Only the transport this machine has (memqual.transport= on the kernel
# command line): probing virtio_pci on microvm costs time and finds nothing.
transport=virtio_pci
role=guest
for arg in $(cat /proc/cmdline); do
  case "$arg" in
  memqual.transport=mmio) transport=virtio_mmio ;;
  memqual.role=host) role=host ;;
  esac
done
modprobe -q -a "$transport" virtio_net virtio_balloon
ip link set lo up
ip link set eth0 up
ip addr add 10.0.2.15/24 dev eth0
ip route add default via 10.0.2.2
# -s: keys only; -E: log to stderr (the console).  The host key comes from
# the per-image keys archive.
dropbear -s -E -r /etc/dropbear/dropbear_ed25519_host_key -p 22
# The host under test (L1) starts its guest; the guest's own rc.sh says
# when it is ready, on this console too.
if [ "$role" = host ]; then
  . /etc/rc.host
else
  echo "memqual-ready"
fi

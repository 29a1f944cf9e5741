/*
 * mmio_pingpong: round trips to an emulated device's MMIO register.
 *
 *     mmio_pingpong VENDOR DEVICE BAR READS RUNS
 *
 * Finds the first PCI device with VENDOR:DEVICE (hex, as sysfs prints
 * them: 0x10ec 0x8139 is the rtl8139), maps its BAR (a memory BAR) through
 * /sys/bus/pci/devices/BDF/resourceBAR and reads the 32-bit register at
 * its offset 0 READS times a run, timed with CLOCK_MONOTONIC.  An emulated
 * device's BAR is in no memslot: on the host each read is a memslot search
 * that misses, then the exit to the device model and back, the path of
 * every register access a netperf request makes through an emulated NIC.
 * Under QEMU's icount clock (the host under test's) the guest's clock
 * counts the host's instructions, so the figure repeats across boots.
 *
 * One line per record, machine readable:
 *     event=device path=/sys/bus/pci/devices/BDF/resourceN
 *     event=run index=I reads=N duration_s=S ns_per_read=X
 *     event=done runs=R
 *     event=error reason=...
 *
 * Exit status: 0 done, 2 bad arguments, 4 a system call failed or no
 * such device.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define PCI_DEVICES "/sys/bus/pci/devices"
#define MAX_READS 100000000UL
#define MAX_RUNS 1000UL

static int fail(const char *what)
{
	printf("event=error reason=%s:%s\n", what, strerror(errno));
	return 4;
}

static int parse(const char *text, unsigned long max, unsigned long *out)
{
	char *end;

	errno = 0;
	*out = strtoul(text, &end, 0);
	return errno || *end || end == text || *out > max;
}

static unsigned long read_hex(const char *dir, const char *name)
{
	char path[512], buf[32] = "";
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s/%s", PCI_DEVICES, dir, name);
	f = fopen(path, "r");
	if (!f)
		return ~0UL;
	if (!fgets(buf, sizeof(buf), f))
		buf[0] = 0;
	fclose(f);
	return strtoul(buf, NULL, 16);
}

/* The first device of vendor:device, its BDF in out. */
static int find_device(unsigned long vendor, unsigned long device, char *out, size_t size)
{
	struct dirent *e;
	DIR *d = opendir(PCI_DEVICES);

	if (!d)
		return -1;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		if (read_hex(e->d_name, "vendor") == vendor && read_hex(e->d_name, "device") == device) {
			snprintf(out, size, "%s", e->d_name);
			closedir(d);
			return 0;
		}
	}
	closedir(d);
	errno = ENODEV;
	return -1;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	unsigned long vendor, device, bar, reads, runs, i, r;
	char bdf[256], path[600];
	volatile uint32_t *reg;
	uint32_t sink = 0;
	void *map;
	int fd;

	if (argc != 6 || parse(argv[1], 0xffff, &vendor) || parse(argv[2], 0xffff, &device) ||
	    parse(argv[3], 5, &bar) || parse(argv[4], MAX_READS, &reads) || parse(argv[5], MAX_RUNS, &runs) ||
	    !reads || !runs) {
		fprintf(stderr, "usage: mmio_pingpong VENDOR DEVICE BAR(0-5) READS(1-%lu) RUNS(1-%lu)\n", MAX_READS,
			MAX_RUNS);
		return 2;
	}
	if (find_device(vendor, device, bdf, sizeof(bdf)))
		return fail("device");
	snprintf(path, sizeof(path), "%s/%s/resource%lu", PCI_DEVICES, bdf, bar);
	printf("event=device path=%s\n", path);
	fd = open(path, O_RDWR | O_SYNC);
	if (fd < 0)
		return fail("open");
	map = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED)
		return fail("mmap");
	reg = map;
	for (r = 0; r < runs; r++) {
		double start = now_s(), took;

		for (i = 0; i < reads; i++)
			sink += *reg;
		took = now_s() - start;
		printf("event=run index=%lu reads=%lu duration_s=%.9f ns_per_read=%.3f\n", r, reads, took,
		       took * 1e9 / reads);
		fflush(stdout);
	}
	printf("event=done runs=%lu sink=%u\n", runs, sink);
	munmap(map, 4096);
	close(fd);
	return 0;
}

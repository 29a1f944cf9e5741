/*
 * fault_probe: times the guest kernel's anonymous page fault.
 *
 *     fault_probe MIB RUNS
 *
 * Each run maps MIB MiB of fresh private anonymous memory, asks for base
 * pages only (MADV_NOHUGEPAGE: one fault per 4 KiB page, whatever the
 * guest's THP setting), writes one byte to each page in address order
 * and unmaps it.  The writes are timed with CLOCK_MONOTONIC, so the
 * figure is the kernel's work for a first touch: the fault, the zeroing
 * of the page, the page table update.  The process's minor faults
 * (getrusage) are read around the timed window, so the host can check that each page faulted
 * once (the path timed is the fault path, not a huge page or a reused
 * mapping).  Under QEMU's icount clock the guest's clock counts guest
 * instructions, so the figure repeats across fresh boots.
 *
 * One line per record, machine readable:
 *     event=run index=I pages=N faults=F duration_s=S ns_per_page=X
 *     event=done runs=R
 *     event=error reason=...
 *
 * Exit status: 0 done, 2 bad arguments, 4 a system call failed.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096UL
#define MAX_MIB 4096
#define MAX_RUNS 100

static int fail(const char *reason)
{
	printf("event=error reason=%s errno=%d\n", reason, errno);
	fprintf(stderr, "fault_probe: %s: %s\n", reason, strerror(errno));
	return 4;
}

/* This process's minor faults so far: the guest's other processes (sshd,
 * the boot's leftovers) fault too, so the system-wide pgfault would count
 * theirs. */
static long long minor_faults(void)
{
	struct rusage usage;

	if (getrusage(RUSAGE_SELF, &usage))
		return -1;
	return usage.ru_minflt;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int parse(const char *text, long max, long *out)
{
	char *end;
	long value;

	errno = 0;
	value = strtol(text, &end, 10);
	if (errno || *end || value < 1 || value > max)
		return -1;
	*out = value;
	return 0;
}

int main(int argc, char **argv)
{
	long mib, runs;

	if (argc != 3 || parse(argv[1], MAX_MIB, &mib) || parse(argv[2], MAX_RUNS, &runs)) {
		fprintf(stderr, "usage: fault_probe MIB RUNS (MIB 1-%d, RUNS 1-%d)\n", MAX_MIB, MAX_RUNS);
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	size_t length = (size_t)mib << 20;
	unsigned long pages = length / PAGE;

	for (long run = 0; run < runs; run++) {
		volatile char *area = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

		if (area == MAP_FAILED)
			return fail("mmap");
		if (madvise((void *)area, length, MADV_NOHUGEPAGE))
			return fail("madvise");
		long long before = minor_faults();
		double t0 = now_s();

		for (unsigned long page = 0; page < pages; page++)
			area[page * PAGE] = 1;
		double seconds = now_s() - t0;
		long long after = minor_faults();

		if (munmap((void *)area, length))
			return fail("munmap");
		printf("event=run index=%ld pages=%lu faults=%lld duration_s=%.9f ns_per_page=%.3f\n", run, pages,
		       before < 0 || after < 0 ? -1LL : after - before, seconds, seconds * 1e9 / (double)pages);
	}
	printf("event=done runs=%ld\n", runs);
	return 0;
}

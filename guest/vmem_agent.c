/*
 * vmem_agent: the guest half of memqual's virtio-mem scenario.
 *
 *   vmem_agent fill MIB SEED START END DEADLINE_S
 *   vmem_agent watch TARGET_KIB DEADLINE_S
 *
 * watch: prints "watching", then polls MemTotal of /proc/meminfo until it
 * equals TARGET_KIB and prints "reached seconds=S", S from the first poll
 * (the guest's own time of a plug or unplug the host asks for after
 * "watching"); exit status 3 when the deadline passes first.
 *
 * Allocates MIB MiB, writes a pattern into every 64-bit word (word i of the
 * allocation holds (i * 0x9E3779B97F4A7C15) ^ SEED: it follows the data, not
 * the frame, so it must survive the kernel migrating pages while virtio-mem
 * unplugs other blocks), and counts from /proc/self/pagemap how many of its
 * pages sit in the guest-physical range [START, END) (the virtio-mem
 * device's memory).  Prints
 *
 *     filled pages=N in_range=M
 *
 * then waits (at most DEADLINE_S seconds) for the file /tmp/vmem.verify to
 * appear, reads every word back and prints
 *
 *     verified pages=N in_range=M bad_words=B
 *
 * and holds the memory until /tmp/vmem.release appears (the same deadline).
 *
 * Exit status: 0 the pattern read back, 2 bad arguments, 3 the deadline
 * passed, 4 a system call failed, 5 the pattern did not read back.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096UL
#define MULT 0x9E3779B97F4A7C15ULL

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static long in_range(const unsigned char *mem, size_t pages, uint64_t start, uint64_t end)
{
	int fd = open("/proc/self/pagemap", O_RDONLY);
	if (fd < 0)
		return -1;
	long count = 0;
	for (size_t p = 0; p < pages; p++) {
		uint64_t entry;
		off_t off = (off_t)(((uintptr_t)mem / PAGE) + p) * 8;
		if (pread(fd, &entry, 8, off) != 8) {
			close(fd);
			return -1;
		}
		if (entry & (1ULL << 63)) {
			uint64_t addr = (entry & ((1ULL << 55) - 1)) * PAGE;
			if (addr >= start && addr < end)
				count++;
		}
	}
	close(fd);
	return count;
}

static int wait_file(const char *path, double deadline)
{
	while (access(path, F_OK) != 0) {
		if (now() > deadline) {
			fprintf(stderr, "no %s within the deadline\n", path);
			return 1;
		}
		usleep(10000); /* the host creates the file; polled with a deadline */
	}
	return 0;
}

static long mem_total_kib(void)
{
	char line[128];
	long kib = -1;
	FILE *f = fopen("/proc/meminfo", "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof line, f))
		if (sscanf(line, "MemTotal: %ld kB", &kib) == 1)
			break;
	fclose(f);
	return kib;
}

static int watch(long target, double limit_s)
{
	printf("watching\n");
	fflush(stdout);
	double start = now();
	for (;;) {
		long kib = mem_total_kib();
		if (kib < 0) {
			perror("/proc/meminfo");
			return 4;
		}
		if (kib == target) {
			printf("reached seconds=%.6f\n", now() - start);
			fflush(stdout);
			return 0;
		}
		if (now() - start > limit_s) {
			printf("timeout mem_total_kib=%ld\n", kib);
			fflush(stdout);
			return 3;
		}
		usleep(200); /* the poll period: the guest-timed resolution */
	}
}

int main(int argc, char **argv)
{
	if (argc == 4 && strcmp(argv[1], "watch") == 0)
		return watch(strtol(argv[2], NULL, 0), strtod(argv[3], NULL));
	if (argc != 7 || strcmp(argv[1], "fill") != 0) {
		fprintf(stderr, "usage: vmem_agent fill MIB SEED START END DEADLINE_S\n");
		return 2;
	}
	size_t mib = strtoull(argv[2], NULL, 0);
	uint64_t seed = strtoull(argv[3], NULL, 0);
	uint64_t start = strtoull(argv[4], NULL, 0);
	uint64_t end = strtoull(argv[5], NULL, 0);
	double deadline = now() + strtod(argv[6], NULL);
	size_t bytes = mib << 20, pages = bytes / PAGE, words = bytes / 8;
	if (mib == 0)
		return 2;
	uint64_t *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (mem == MAP_FAILED) {
		perror("mmap");
		return 4;
	}
	for (size_t i = 0; i < words; i++)
		mem[i] = (i * MULT) ^ seed;
	long before = in_range((unsigned char *)mem, pages, start, end);
	if (before < 0) {
		perror("pagemap");
		return 4;
	}
	printf("filled pages=%zu in_range=%ld\n", pages, before);
	fflush(stdout);
	if (wait_file("/tmp/vmem.verify", deadline))
		return 3;
	uint64_t bad = 0;
	for (size_t i = 0; i < words; i++)
		bad += mem[i] != ((i * MULT) ^ seed);
	long after = in_range((unsigned char *)mem, pages, start, end);
	printf("verified pages=%zu in_range=%ld bad_words=%" PRIu64 "\n", pages, after, bad);
	fflush(stdout);
	if (wait_file("/tmp/vmem.release", deadline))
		return 3;
	return bad ? 5 : 0;
}

/*
 * mem_probe: the guest half of memqual's QEMU memslot scenarios.
 *
 * Proves that guest-physical ranges (the memory slots of a layout) are
 * usable RAM, and records the guest frames it touched (the trace the host
 * replays through the memslot model).  Built static, runs as root in the
 * busybox guest.  Every line is one machine-readable record:
 *
 *     <event> key=value ...
 *
 * Subcommands (addresses and sizes in bytes, hex with 0x or decimal):
 *   blocks                  one "blocksize" line, then one "block" line per
 *                           /sys/devices/system/memory/memoryN: index, start,
 *                           size, state, valid zones
 *   online START SIZE       online every offline memory block inside
 *                           [START, START+SIZE) into ZONE_MOVABLE
 *                           ("online_movable"); one "onlined" line per block
 *   probe MIB SEED RANGE... RANGE is START:SIZE.  Allocate MIB MiB, touch each
 *                           page, read its frame from /proc/self/pagemap,
 *                           write a pattern derived from the frame into every
 *                           64-bit word of the page, read every word back and
 *                           read pagemap again (the frame must not have moved).
 *                           Prints "frames" lines (the frames in first-touch
 *                           order: the trace), one "range" line per RANGE
 *                           (pages in it, pages verified, bad words), up to
 *                           SAMPLES "sample" lines per range (frames the host
 *                           may read back through QEMU), then "holding": the
 *                           memory stays mapped until stdin closes, so the
 *                           host can read the same frames from outside.
 *
 * Why this method: /dev/mem refuses RAM on the Debian kernel
 * (CONFIG_STRICT_DEVMEM), so the agent cannot write a physical range
 * directly.  Instead the host onlines the hotplugged blocks as
 * ZONE_MOVABLE, the highest zone, which the page allocator serves user
 * pages from first; the agent's pages then land in the hotplugged slots,
 * pagemap says exactly which frame each page got, and the pattern encodes
 * the frame so the host can check, through QEMU's own view of guest
 * memory (pmemsave), that the data sits at that guest-physical address.
 *
 * Pattern: word i of frame F holds ((F << 12) | (i * 8)) ^ SEED.
 *
 * Exit status: 0 done, 2 bad arguments, 3 time bound hit, 4 a system call
 * failed, 5 the pattern did not read back.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MEMDIR "/sys/devices/system/memory"
#define MAX_RANGES 256
#define SAMPLES 4
#define FRAMES_PER_LINE 32
#define TIME_BOUND_S 240
#define PFN_MASK ((UINT64_C(1) << 55) - 1)
#define PAGE_PRESENT (UINT64_C(1) << 63)

static long page_size;

static void on_alarm(int sig)
{
	(void)sig;
	static const char msg[] = "timeout\n";
	if (write(1, msg, sizeof msg - 1) < 0) { /* nothing left to do */ }
	_exit(3);
}

static void die(const char *what)
{
	printf("error what=%s errno=%d msg=%s\n", what, errno, strerror(errno));
	fflush(stdout);
	exit(4);
}

static int parse_u64(const char *text, uint64_t *out)
{
	char *end;

	errno = 0;
	*out = strtoull(text, &end, 0);
	return errno == 0 && end != text && *end == '\0';
}

static int read_text(const char *path, char *buf, size_t len)
{
	int fd = open(path, O_RDONLY);
	ssize_t n;

	if (fd < 0)
		return -1;
	n = read(fd, buf, len - 1);
	close(fd);
	if (n < 0)
		return -1;
	buf[n] = '\0';
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
		buf[--n] = '\0';
	/* valid_zones separates zones by spaces: keep one word per value */
	for (ssize_t i = 0; i < n; i++)
		if (buf[i] == ' ')
			buf[i] = ',';
	return 0;
}

static uint64_t block_size(void)
{
	char buf[64];
	uint64_t size;

	if (read_text(MEMDIR "/block_size_bytes", buf, sizeof buf) < 0)
		die("block_size_bytes");
	/* the file is hex without a 0x prefix */
	size = strtoull(buf, NULL, 16);
	if (size == 0) {
		errno = EINVAL;
		die("block_size_bytes");
	}
	return size;
}

static int cmd_blocks(void)
{
	uint64_t bsize = block_size();
	DIR *dir = opendir(MEMDIR);
	struct dirent *entry;

	if (dir == NULL)
		die("opendir " MEMDIR);
	printf("blocksize size=0x%" PRIx64 "\n", bsize);
	while ((entry = readdir(dir)) != NULL) {
		char path[512], state[64], zones[128];
		unsigned long index;
		char *end;

		if (strncmp(entry->d_name, "memory", 6) != 0)
			continue;
		index = strtoul(entry->d_name + 6, &end, 10);
		if (end == entry->d_name + 6 || *end != '\0')
			continue;
		snprintf(path, sizeof path, MEMDIR "/%s/state", entry->d_name);
		if (read_text(path, state, sizeof state) < 0)
			strcpy(state, "unknown");
		snprintf(path, sizeof path, MEMDIR "/%s/valid_zones", entry->d_name);
		if (read_text(path, zones, sizeof zones) < 0)
			strcpy(zones, "unknown");
		printf("block index=%lu start=0x%" PRIx64 " size=0x%" PRIx64 " state=%s zones=%s\n", index,
		       (uint64_t)index * bsize, bsize, state, zones);
	}
	closedir(dir);
	return 0;
}

static int cmd_online(uint64_t start, uint64_t size)
{
	uint64_t bsize = block_size();
	int failed = 0;

	if (start % bsize || size % bsize || size == 0) {
		printf("error what=online msg=range_not_block_aligned blocksize=0x%" PRIx64 "\n", bsize);
		return 2;
	}
	for (uint64_t addr = start; addr < start + size; addr += bsize) {
		char path[256], state[64];
		int fd;

		snprintf(path, sizeof path, MEMDIR "/memory%" PRIu64 "/state", addr / bsize);
		if (read_text(path, state, sizeof state) < 0) {
			printf("onlined start=0x%" PRIx64 " result=missing\n", addr);
			failed = 1;
			continue;
		}
		if (strcmp(state, "online") == 0) {
			printf("onlined start=0x%" PRIx64 " result=already\n", addr);
			continue;
		}
		fd = open(path, O_WRONLY);
		if (fd < 0 || write(fd, "online_movable", 14) != 14) {
			printf("onlined start=0x%" PRIx64 " result=failed errno=%d\n", addr, errno);
			failed = 1;
		} else {
			printf("onlined start=0x%" PRIx64 " result=online_movable\n", addr);
		}
		if (fd >= 0)
			close(fd);
	}
	return failed ? 4 : 0;
}

struct range {
	uint64_t start, size;
	uint64_t pages, verified, bad_words, samples;
};

static int pagemap_frames(int fd, char *base, size_t pages, uint64_t *frames)
{
	size_t done = 0;

	while (done < pages) {
		size_t chunk = pages - done > 4096 ? 4096 : pages - done;
		off_t off = (off_t)(((uintptr_t)base / page_size + done) * 8);
		ssize_t n = pread(fd, frames + done, chunk * 8, off);

		if (n != (ssize_t)(chunk * 8))
			return -1;
		done += chunk;
	}
	for (size_t i = 0; i < pages; i++)
		frames[i] = (frames[i] & PAGE_PRESENT) ? (frames[i] & PFN_MASK) : UINT64_MAX;
	return 0;
}

static int cmd_probe(uint64_t mib, uint64_t seed, struct range *ranges, int nranges)
{
	size_t pages = (size_t)(mib * 1024 * 1024 / (uint64_t)page_size);
	size_t words = (size_t)page_size / 8;
	uint64_t *before, *after, other = 0, bad_total = 0, moved = 0, absent = 0;
	char *mem;
	int fd;

	mem = mmap(NULL, pages * page_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (mem == MAP_FAILED)
		die("mmap");
	before = calloc(pages, sizeof *before);
	after = calloc(pages, sizeof *after);
	if (before == NULL || after == NULL)
		die("calloc");
	/* first touch: the kernel picks a frame for each page now */
	for (size_t p = 0; p < pages; p++)
		mem[p * page_size] = 1;
	fd = open("/proc/self/pagemap", O_RDONLY);
	if (fd < 0)
		die("open pagemap");
	if (pagemap_frames(fd, mem, pages, before) < 0)
		die("read pagemap");
	for (size_t p = 0; p < pages; p++) {
		uint64_t *word = (uint64_t *)(mem + p * page_size);
		uint64_t frame_addr = before[p] << 12;

		for (size_t i = 0; i < words; i++)
			word[i] = (frame_addr | (i * 8)) ^ seed;
	}
	if (pagemap_frames(fd, mem, pages, after) < 0)
		die("read pagemap");
	close(fd);

	/* the trace: frames in first-touch order */
	for (size_t p = 0; p < pages; p += FRAMES_PER_LINE) {
		fputs("frames", stdout);
		for (size_t q = p; q < pages && q < p + FRAMES_PER_LINE; q++)
			printf(" 0x%" PRIx64, before[q]);
		putchar('\n');
	}
	for (size_t p = 0; p < pages; p++) {
		const uint64_t *word = (const uint64_t *)(mem + p * page_size);
		uint64_t frame_addr = before[p] << 12, bad = 0;
		int hit = 0;

		if (before[p] == UINT64_MAX) {
			absent++;
			continue;
		}
		if (after[p] != before[p])
			moved++;
		for (size_t i = 0; i < words; i++)
			if (word[i] != ((frame_addr | (i * 8)) ^ seed))
				bad++;
		bad_total += bad;
		for (int r = 0; r < nranges; r++) {
			struct range *rg = &ranges[r];

			if (frame_addr >= rg->start && frame_addr - rg->start < rg->size) {
				hit = 1;
				rg->pages++;
				rg->bad_words += bad;
				if (bad == 0 && after[p] == before[p]) {
					rg->verified++;
					/* spread the samples: the first pages and then every 1024th */
					if (rg->samples < SAMPLES && (rg->samples == 0 || rg->verified % 1024 == 0)) {
						rg->samples++;
						printf("sample range=0x%" PRIx64 " frame=0x%" PRIx64 "\n", rg->start, before[p]);
					}
				}
				break;
			}
		}
		if (!hit)
			other++;
	}
	for (int r = 0; r < nranges; r++)
		printf("range start=0x%" PRIx64 " size=0x%" PRIx64 " pages=%" PRIu64 " verified=%" PRIu64
		       " bad_words=%" PRIu64 "\n",
		       ranges[r].start, ranges[r].size, ranges[r].pages, ranges[r].verified, ranges[r].bad_words);
	printf("summary pages=%zu outside=%" PRIu64 " absent=%" PRIu64 " moved=%" PRIu64 " bad_words=%" PRIu64
	       " seed=0x%" PRIx64 "\n", pages, other, absent, moved, bad_total, seed);
	printf("holding\n");
	fflush(stdout);
	/* keep the frames until the host has read them through QEMU */
	{
		char byte;
		while (read(0, &byte, 1) > 0)
			;
	}
	return bad_total ? 5 : 0;
}

static int usage(void)
{
	fprintf(stderr, "usage: mem_probe blocks | online START SIZE | probe MIB SEED START:SIZE...\n");
	return 2;
}

int main(int argc, char **argv)
{
	page_size = sysconf(_SC_PAGESIZE);
	signal(SIGALRM, on_alarm);
	alarm(TIME_BOUND_S);
	if (argc < 2)
		return usage();
	if (strcmp(argv[1], "blocks") == 0 && argc == 2)
		return cmd_blocks();
	if (strcmp(argv[1], "online") == 0 && argc == 4) {
		uint64_t start, size;

		if (!parse_u64(argv[2], &start) || !parse_u64(argv[3], &size))
			return usage();
		return cmd_online(start, size);
	}
	if (strcmp(argv[1], "probe") == 0 && argc >= 5 && argc - 4 <= MAX_RANGES) {
		struct range ranges[MAX_RANGES];
		uint64_t mib, seed;
		int n = 0;

		if (!parse_u64(argv[2], &mib) || !parse_u64(argv[3], &seed) || mib == 0)
			return usage();
		memset(ranges, 0, sizeof ranges);
		for (int i = 4; i < argc; i++, n++) {
			char *colon = strchr(argv[i], ':');

			if (colon == NULL)
				return usage();
			*colon = '\0';
			if (!parse_u64(argv[i], &ranges[n].start) || !parse_u64(colon + 1, &ranges[n].size))
				return usage();
		}
		return cmd_probe(mib, seed, ranges, n);
	}
	return usage();
}

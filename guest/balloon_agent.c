/*
 * balloon_agent: the guest half of memqual's virtio-balloon scenarios.
 *
 * Runs in a busybox guest (no libc tools beyond busybox), built static.
 * Every line it prints is one machine-readable record:
 *
 *     t=<CLOCK_MONOTONIC seconds.nanoseconds> event=<name> key=value ...
 *
 * and it always ends: every subcommand has a hard time bound (SIGALRM),
 * after which it prints "event=timeout" and exits with status 3.
 *
 * Subcommands (sizes in MiB, times in seconds):
 *   stat                         one event=stat line (meminfo, vmstat, buddyinfo)
 *   watch INTERVAL_MS DURATION   event=stat lines every INTERVAL_MS for DURATION
 *   track inflate|deflate PAGES PERIOD_US BOUND
 *                                guest-side timing of one balloon move: prints
 *                                event=tracking once armed, then polls the
 *                                balloon_inflate (or _deflate) counter every
 *                                PERIOD_US (back to back near the start and
 *                                the end) until it grew by PAGES, and prints
 *                                event=tracked with the first change, the
 *                                end, and the poll gaps around both
 *   load | unload                modprobe / rmmod virtio_balloon (busybox)
 *   hold MIB SECONDS [touch|notouch]
 *                                allocate MIB, touch each page (default), hold
 *                                SECONDS, free; prints allocated/freed events
 *   pressure MIB STEP_MIB BOUND  allocate and touch STEP_MIB at a time up to
 *                                MIB (memory pressure), hold 1 s, free
 *
 * Exit status: 0 done, 2 bad arguments, 3 time bound hit, 4 a system call failed.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "procfs.h"

#define MIB (1024UL * 1024UL)

static long page_size;

/* Print one record: the timestamp first, then the caller's key=value pairs. */
static void emit(const char *fmt, ...)
{
	struct timespec ts;
	va_list ap;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	printf("t=%ld.%09ld ", (long)ts.tv_sec, ts.tv_nsec);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
}

/* Decimal digits of v into buf (async-signal-safe), width digits zero-padded. */
static size_t put_num(char *buf, unsigned long v, int width)
{
	char tmp[24];
	size_t n = 0, i;

	do {
		tmp[n++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	while ((int)n < width)
		tmp[n++] = '0';
	for (i = 0; i < n; i++)
		buf[i] = tmp[n - 1 - i];
	return n;
}

static void on_alarm(int sig)
{
	/* Only async-signal-safe calls here (clock_gettime, write, _exit). */
	char line[96];
	size_t n = 0;
	struct timespec ts;
	static const char tail[] = " event=timeout\n";

	(void)sig;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	line[n++] = 't';
	line[n++] = '=';
	n += put_num(line + n, (unsigned long)ts.tv_sec, 1);
	line[n++] = '.';
	n += put_num(line + n, (unsigned long)ts.tv_nsec, 9);
	memcpy(line + n, tail, sizeof(tail) - 1);
	n += sizeof(tail) - 1;
	if (write(STDOUT_FILENO, line, n) < 0) {
		/* nothing left to do: the exit status still says timeout */
	}
	_exit(3);
}

static void set_bound(unsigned int seconds)
{
	signal(SIGALRM, on_alarm);
	alarm(seconds ? seconds : 1);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Value of a counter in /proc/vmstat, -1 if absent (kernel without it). */
static long vmstat_value(const char *key)
{
	FILE *f = fopen("/proc/vmstat", "r");
	char name[128];
	long value;
	long found = -1;

	if (!f)
		return -1;
	while (fscanf(f, "%127s %ld", name, &value) == 2) {
		if (strcmp(name, key) == 0) {
			found = value;
			break;
		}
	}
	fclose(f);
	return found;
}

/* Is virtio_balloon in /proc/modules? (1 yes, 0 no, -1 unknown) */
static int balloon_module_loaded(void)
{
	FILE *f = fopen("/proc/modules", "r");
	char line[512];
	int loaded = 0;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		if (strncmp(line, "virtio_balloon ", 15) == 0) {
			loaded = 1;
			break;
		}
	}
	fclose(f);
	return loaded;
}

/*
 * Free pages per order, summed over zones, as "o0,o1,...": the host side
 * reads it to see how fragmented the guest is before and after inflation.
 * Per-zone lines are printed too (event=buddy) when per_zone is set.
 */
static void buddy_summary(char *out, size_t size, int per_zone)
{
	FILE *f = fopen("/proc/buddyinfo", "r");
	char line[512];
	long total[16] = {0};
	int orders = 0;

	out[0] = '\0';
	if (!f) {
		snprintf(out, size, "none");
		return;
	}
	while (fgets(line, sizeof(line), f)) {
		/* "Node 0, zone   Normal   12  3 ..." */
		int node;
		char zone[32];
		int consumed = 0;
		char *p;
		int order = 0;
		char counts[256];
		size_t used = 0;

		if (sscanf(line, "Node %d, zone %31s%n", &node, zone, &consumed) != 2)
			continue;
		p = line + consumed;
		counts[0] = '\0';
		while (order < 16) {
			char *end;
			long v = strtol(p, &end, 10);
			if (end == p)
				break;
			total[order] += v;
			used += (size_t)snprintf(counts + used, sizeof(counts) - used, "%s%ld",
						 order ? "," : "", v);
			if (used >= sizeof(counts))
				break;
			p = end;
			order++;
		}
		if (order > orders)
			orders = order;
		if (per_zone)
			emit("event=buddy node=%d zone=%s free_per_order=%s", node, zone, counts);
	}
	fclose(f);
	{
		size_t used = 0;
		for (int i = 0; i < orders && used < size; i++)
			used += (size_t)snprintf(out + used, size - used, "%s%ld", i ? "," : "", total[i]);
	}
}

static void print_stat(int per_zone)
{
	char buddy[512];

	buddy_summary(buddy, sizeof(buddy), per_zone);
	emit("event=stat mem_total_kib=%ld mem_free_kib=%ld mem_available_kib=%ld "
	     "balloon_inflate=%ld balloon_deflate=%ld balloon_migrate=%ld "
	     "module_loaded=%d buddy_free_per_order=%s",
	     meminfo_kib("MemTotal"), meminfo_kib("MemFree"), meminfo_kib("MemAvailable"),
	     vmstat_value("balloon_inflate"), vmstat_value("balloon_deflate"),
	     vmstat_value("balloon_migrate"), balloon_module_loaded(), buddy);
}

/* Run argv (searching PATH), return its exit status; no shell involved. */
static int run(char *const argv[])
{
	pid_t pid = fork();
	int status;

	if (pid < 0)
		return -1;
	if (pid == 0) {
		execvp(argv[0], argv);
		/* busybox guests may lack the applet link: try through busybox */
		{
			char *bb[8];
			int i;
			bb[0] = "busybox";
			for (i = 0; argv[i] && i < 6; i++)
				bb[i + 1] = argv[i];
			bb[i + 1] = NULL;
			execvp("busybox", bb);
		}
		_exit(127);
	}
	if (waitpid(pid, &status, 0) < 0)
		return -1;
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static int cmd_module(int load)
{
	char *modprobe[] = {"modprobe", "virtio_balloon", NULL};
	char *rmmod[] = {"rmmod", "virtio_balloon", NULL};
	double start = now_s();
	int status = run(load ? modprobe : rmmod);
	double took = now_s() - start;

	emit("event=%s status=%d seconds=%.6f module_loaded=%d", load ? "load" : "unload", status,
	     took, balloon_module_loaded());
	print_stat(0);
	return status == 0 ? 0 : 4;
}

/* Map MIB of anonymous memory; touch every page (one write per page) if asked. */
static char *allocate(unsigned long mib, int touch, double *touch_s)
{
	size_t len = mib * MIB;
	char *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	double start;

	if (mem == MAP_FAILED)
		return NULL;
	start = now_s();
	if (touch) {
		for (size_t off = 0; off < len; off += (size_t)page_size)
			mem[off] = (char)(off >> 12 | 1); /* non-zero: no zero-page sharing */
	}
	*touch_s = now_s() - start;
	return mem;
}

static int cmd_hold(unsigned long mib, unsigned int seconds, int touch)
{
	double touch_s = 0;
	char *mem;
	struct timespec rest = {.tv_sec = seconds, .tv_nsec = 0};

	print_stat(0);
	mem = allocate(mib, touch, &touch_s);
	if (!mem) {
		emit("event=error call=mmap errno=%d mib=%lu", errno, mib);
		return 4;
	}
	emit("event=allocated mib=%lu touched=%d touch_s=%.6f", mib, touch, touch_s);
	print_stat(0);
	while (nanosleep(&rest, &rest) < 0 && errno == EINTR)
		;
	munmap(mem, mib * MIB);
	emit("event=freed mib=%lu", mib);
	print_stat(0);
	return 0;
}

/*
 * Allocate and touch step_mib at a time up to mib.  Under real pressure the
 * kernel either reclaims (a deflate-on-oom balloon gives pages back) or the
 * OOM killer picks a victim: the host side tells which from the counters
 * and from who is still alive.  Every step is reported so a kill mid-way
 * still leaves the progress behind.
 */
static int cmd_pressure(unsigned long mib, unsigned long step_mib)
{
	unsigned long done = 0;
	char **chunks = calloc(mib / step_mib + 1, sizeof(char *));
	unsigned long n = 0;
	struct timespec hold = {.tv_sec = 1, .tv_nsec = 0};

	if (!chunks)
		return 4;
	print_stat(0);
	while (done < mib) {
		double touch_s;
		unsigned long step = mib - done < step_mib ? mib - done : step_mib;
		char *mem = allocate(step, 1, &touch_s);
		if (!mem) {
			emit("event=error call=mmap errno=%d allocated_mib=%lu", errno, done);
			break;
		}
		chunks[n++] = mem;
		done += step;
		emit("event=progress allocated_mib=%lu step_s=%.6f mem_available_kib=%ld "
		     "balloon_deflate=%ld",
		     done, touch_s, meminfo_kib("MemAvailable"), vmstat_value("balloon_deflate"));
	}
	emit("event=allocated mib=%lu", done);
	print_stat(0);
	nanosleep(&hold, NULL);
	for (unsigned long i = 0; i < n; i++)
		munmap(chunks[i], step_mib * MIB); /* the last chunk may be shorter: munmap rounds */
	free(chunks);
	emit("event=freed mib=%lu", done);
	print_stat(0);
	return done == mib ? 0 : 4;
}

static int cmd_watch(long interval_ms, long duration_s)
{
	double end = now_s() + (double)duration_s;
	struct timespec gap = {.tv_sec = interval_ms / 1000, .tv_nsec = (interval_ms % 1000) * 1000000L};

	while (now_s() < end) {
		print_stat(0);
		nanosleep(&gap, NULL);
	}
	return 0;
}

/* One counter of /proc/vmstat through an fd kept open (read from offset 0
 * again each time: procfs regenerates the text), so a poll costs one read
 * and a scan rather than fopen + fscanf of every line. */
static long vmstat_counter(int fd, const char *needle)
{
	static char buf[16384];
	ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
	char *hit;

	if (n <= 0)
		return -1;
	buf[n] = '\0';
	hit = strstr(buf, needle);
	return hit ? strtol(hit + strlen(needle), NULL, 10) : -1;
}

/*
 * Guest-side timing of one balloon move.  The host times a move by polling
 * QMP, and QEMU answers a poll only between two virtqueue requests, each of
 * which holds its big lock for about a millisecond: that is the host's
 * resolution.  Here the guest timestamps the move itself: the poll that
 * first sees the counter change and the poll that sees it reach PAGES, each
 * with the gap to the poll before it (the true instant lies in that gap).
 *
 * A read of /proc/vmstat costs about 65 us under TCG, but a guest sleep of
 * 300 us lasts about 650 us, so the tracker spins (reads back to back)
 * where an instant is to be caught: from arming until the first change
 * (the host sends the target right after "tracking"), and once the rate so
 * far predicts the end within NEAR_S.  In between it sleeps PERIOD_US, so
 * it does not take a vCPU from the balloon driver for the whole move.
 */
#define NEAR_S 0.02

static int cmd_track(const char *counter, long pages, long period_us)
{
	char needle[64];
	struct timespec gap = {.tv_sec = period_us / 1000000, .tv_nsec = (period_us % 1000000) * 1000L};
	int fd = open("/proc/vmstat", O_RDONLY);
	long base, value, spins = 0;
	double prev, t, first = 0.0, first_gap = 0.0, max_gap = 0.0, start, rate;
	long polls = 0;
	int spin = 1;

	snprintf(needle, sizeof(needle), "\nballoon_%s ", counter);
	if (fd < 0 || (base = vmstat_counter(fd, needle)) < 0) {
		emit("event=error reason=no_counter counter=balloon_%s", counter);
		return 4;
	}
	emit("event=tracking counter=balloon_%s base=%ld pages=%ld period_us=%ld", counter, base, pages, period_us);
	start = prev = now_s();
	for (;;) {
		if (!spin)
			nanosleep(&gap, NULL);
		value = vmstat_counter(fd, needle);
		t = now_s();
		polls++;
		spins += spin;
		if (t - prev > max_gap)
			max_gap = t - prev;
		if (value - base >= pages)
			break;
		if (first == 0.0 && value != base) {
			first = t;
			first_gap = t - prev;
		}
		if (first != 0.0) {
			rate = t > first ? (double)(value - base) / (t - first) : 0.0;
			spin = rate > 0.0 && (double)(pages - (value - base)) / rate <= NEAR_S;
		}
		prev = t;
	}
	if (first == 0.0) { /* the whole move fell between two polls */
		first = prev;
		first_gap = t - prev;
	}
	emit("event=tracked counter=balloon_%s pages=%ld moved=%ld first_s=%.9f end_s=%.9f seconds=%.9f "
	     "first_gap_s=%.9f end_gap_s=%.9f polls=%ld spins=%ld period_s=%.9f max_gap_s=%.9f",
	     counter, pages, value - base, first, t, t - first, first_gap, t - prev, polls, spins,
	     (t - start) / (double)polls, max_gap);
	close(fd);
	return 0;
}

static int usage(void)
{
	fprintf(stderr,
		"usage: balloon_agent stat | watch INTERVAL_MS DURATION_S | load | unload |\n"
		"       track inflate|deflate PAGES PERIOD_US BOUND_S |\n"
		"       hold MIB SECONDS [touch|notouch] | pressure MIB STEP_MIB BOUND_S\n");
	return 2;
}

/* Parse a positive integer argument; 0 or garbage -> -1. */
static long positive(const char *s)
{
	char *end;
	long v = strtol(s, &end, 10);
	return (*s && !*end && v > 0) ? v : -1;
}

int main(int argc, char **argv)
{
	page_size = sysconf(_SC_PAGESIZE);
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc < 2)
		return usage();

	if (strcmp(argv[1], "stat") == 0 && argc == 2) {
		set_bound(10);
		print_stat(1);
		return 0;
	}
	if (strcmp(argv[1], "watch") == 0 && argc == 4) {
		long interval = positive(argv[2]), duration = positive(argv[3]);
		if (interval < 0 || duration < 0)
			return usage();
		set_bound((unsigned int)duration + 5);
		return cmd_watch(interval, duration);
	}
	if (strcmp(argv[1], "track") == 0 && argc == 6) {
		long pages = positive(argv[3]), period = positive(argv[4]), bound = positive(argv[5]);
		if ((strcmp(argv[2], "inflate") != 0 && strcmp(argv[2], "deflate") != 0) || pages < 0 ||
		    period < 0 || period >= 1000000 || bound < 0)
			return usage();
		set_bound((unsigned int)bound);
		return cmd_track(argv[2], pages, period);
	}
	if ((strcmp(argv[1], "load") == 0 || strcmp(argv[1], "unload") == 0) && argc == 2) {
		set_bound(60);
		return cmd_module(argv[1][0] == 'l');
	}
	if (strcmp(argv[1], "hold") == 0 && (argc == 4 || argc == 5)) {
		long mib = positive(argv[2]);
		long seconds = strcmp(argv[3], "0") == 0 ? 0 : positive(argv[3]);
		int touch = argc == 4 || strcmp(argv[4], "touch") == 0;
		if (mib < 0 || seconds < 0 || (argc == 5 && !touch && strcmp(argv[4], "notouch") != 0))
			return usage();
		/* touching under TCG runs at a few hundred MiB/s: allow for it */
		set_bound((unsigned int)(seconds + 30 + mib / 32));
		return cmd_hold((unsigned long)mib, (unsigned int)seconds, touch);
	}
	if (strcmp(argv[1], "pressure") == 0 && argc == 5) {
		long mib = positive(argv[2]), step = positive(argv[3]), bound = positive(argv[4]);
		if (mib < 0 || step < 0 || bound < 0)
			return usage();
		set_bound((unsigned int)bound);
		return cmd_pressure((unsigned long)mib, (unsigned long)step);
	}
	return usage();
}

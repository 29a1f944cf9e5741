/*
 * ksm_stress: the workload of seed 001 (Nai Xia's volatile-page program)
 * made into a guest tool with phases, a hard time bound, machine-readable
 * progress and a content check.
 *
 * usage: ksm_stress --mib N [--byte B] [--phases LIST] [--mergeable] [--thp]
 *                   [--timeout S]
 *
 *   --mib N        size of the anonymous mapping in MiB (required)
 *   --byte B       fill byte, 0..255 (default 1, as in the seed)
 *   --phases LIST  comma-separated, run in order (default fill,hold:10):
 *                    fill       memset every page to the fill byte
 *                    tail       write a distinct pattern into the last
 *                               TAIL_BYTES bytes of every page (integrity)
 *                    hold:S     sleep up to S seconds; SIGUSR1 ends it early
 *                    dirty:S    write one word per page, pass after pass,
 *                               for S seconds (the seed's loop); SIGUSR1
 *                               ends it early
 *                    verify     check every page against what was written
 *                    corrupt:N  flip one byte in N pages spread over the
 *                               mapping (a negative control: the next
 *                               verify must report N bad pages)
 *   --mergeable    madvise(MADV_MERGEABLE) (for the guest kernel's own ksmd)
 *   --thp          madvise(MADV_HUGEPAGE) (2 MiB aligned mapping)
 *   --timeout S    hard bound on the whole run (default 600); past it the
 *                  program prints event=error reason=time_bound, exits 3
 *
 * Output: one record per line, "t=<CLOCK_MONOTONIC s.ns> event=<name> k=v...".
 * Exit status: 0 ok, 1 verify found bad pages, 2 bad usage, 3 time bound,
 * 4 cannot allocate, 5 madvise refused.
 *
 * The dirty word holds a value computed from (pass, page), not random():
 * the content check still knows every byte of every page after dirtying.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdarg.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/sysinfo.h>
#include <time.h>
#include <unistd.h>

#include "procfs.h"

#ifndef MADV_MERGEABLE
#define MADV_MERGEABLE 12
#endif
#ifndef MADV_HUGEPAGE
#define MADV_HUGEPAGE 14
#endif

#define TAIL_BYTES 96
#define HUGE_ALIGN (2UL << 20)
#define MAX_PHASES 32

enum phase_kind { PH_FILL, PH_TAIL, PH_HOLD, PH_DIRTY, PH_VERIFY, PH_CORRUPT };

struct phase {
	enum phase_kind kind;
	double seconds;
};

static volatile sig_atomic_t usr1_seen;
static double started;
static double deadline;
static long page_size;

/* What the pages hold, so verify knows what to expect. */
static int filled;
static int tailed;
static uint64_t dirty_passes;   /* completed passes */
static size_t dirty_partial;    /* pages written by the pass in progress */

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void emit(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void emit(const char *fmt, ...)
{
	va_list ap;
	printf("t=%.9f ", now());
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
}

static void on_usr1(int sig)
{
	(void)sig;
	usr1_seen = 1;
}

static void on_alarm(int sig)
{
	/* Backstop for a phase that does not look at the clock (a fill of a
	 * huge mapping under TCG): async-signal-safe output only. */
	static const char msg[] = "event=error reason=time_bound where=alarm\n";
	(void)sig;
	if (write(1, msg, sizeof(msg) - 1) < 0)
		_exit(3);
	_exit(3);
}

static void check_deadline(const char *where)
{
	if (now() > deadline) {
		emit("event=error reason=time_bound where=%s elapsed_s=%.3f", where, now() - started);
		exit(3);
	}
}

/* splitmix64: a cheap, well-mixed value per (pass, page). */
static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

static uint64_t dirty_value(uint64_t pass, size_t page)
{
	return mix((pass << 32) ^ page);
}

static unsigned char tail_byte(size_t page, size_t k)
{
	return (unsigned char)mix(((uint64_t)page << 8) | k);
}

/* Offset of the dirtied word: the last aligned word of the page. */
static size_t dirty_offset(void)
{
	return (size_t)page_size - sizeof(uint64_t);
}

static void alloc_error(size_t mib, const char *why, int err)
{
	long total = meminfo_kib("MemTotal");
	long avail = meminfo_kib("MemAvailable");
	emit("event=error reason=alloc size_mib=%zu guest_mem_mib=%ld available_mib=%ld why=%s errno=%d",
	     mib, total / 1024, avail / 1024, why, err);
	fprintf(stderr, "ksm_stress: cannot allocate %zu MiB: the guest has %ld MiB, %ld MiB available (%s)\n",
		mib, total / 1024, avail / 1024, why);
	exit(4);
}

static void usage(const char *msg)
{
	fprintf(stderr, "ksm_stress: %s\n"
		"usage: ksm_stress --mib N [--byte B] [--phases fill,tail,hold:S,dirty:S,verify] "
		"[--mergeable] [--thp] [--timeout S]\n", msg);
	exit(2);
}

static int parse_phases(const char *spec, struct phase *out)
{
	char *copy = strdup(spec), *save = NULL, *tok;
	int n = 0;
	for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		char *colon = strchr(tok, ':');
		char *end;
		if (n == MAX_PHASES)
			usage("too many phases");
		out[n].seconds = 0;
		if (colon) {
			*colon = '\0';
			out[n].seconds = strtod(colon + 1, &end);
			if (*end || out[n].seconds < 0)
				usage("a phase duration must be a number of seconds >= 0");
		}
		if (!strcmp(tok, "fill"))
			out[n].kind = PH_FILL;
		else if (!strcmp(tok, "tail"))
			out[n].kind = PH_TAIL;
		else if (!strcmp(tok, "hold"))
			out[n].kind = PH_HOLD;
		else if (!strcmp(tok, "dirty"))
			out[n].kind = PH_DIRTY;
		else if (!strcmp(tok, "verify"))
			out[n].kind = PH_VERIFY;
		else if (!strcmp(tok, "corrupt"))
			out[n].kind = PH_CORRUPT;
		else
			usage("unknown phase (use fill, tail, hold:S, dirty:S, verify, corrupt:N)");
		if ((out[n].kind == PH_HOLD || out[n].kind == PH_DIRTY || out[n].kind == PH_CORRUPT) && !colon)
			usage("hold, dirty and corrupt need a number: hold:S, dirty:S, corrupt:N");
		n++;
	}
	free(copy);
	if (n == 0)
		usage("no phases given");
	return n;
}

static void do_fill(unsigned char *p, size_t npages, int byte)
{
	double t0 = now();
	size_t i;
	for (i = 0; i < npages; i++) {
		memset(p + i * page_size, byte, page_size);
		if ((i & 0xfff) == 0)
			check_deadline("fill");
	}
	filled = 1;
	tailed = 0;
	dirty_passes = 0;
	dirty_partial = 0;
	emit("event=fill_done pages=%zu byte=%d duration_s=%.6f", npages, byte, now() - t0);
}

static void do_tail(unsigned char *p, size_t npages)
{
	double t0 = now();
	size_t i, k;
	for (i = 0; i < npages; i++) {
		unsigned char *tail = p + (i + 1) * page_size - TAIL_BYTES;
		for (k = 0; k < TAIL_BYTES; k++)
			tail[k] = tail_byte(i, k);
		if ((i & 0xfff) == 0)
			check_deadline("tail");
	}
	tailed = 1;
	dirty_passes = 0;
	dirty_partial = 0;
	emit("event=tail_done pages=%zu tail_bytes=%d duration_s=%.6f", npages, TAIL_BYTES, now() - t0);
}

static void do_hold(double seconds)
{
	double t0 = now(), end = t0 + seconds;
	usr1_seen = 0;
	emit("event=hold_start seconds=%.3f", seconds);
	while (!usr1_seen && now() < end) {
		struct timespec ts = {0, 10 * 1000 * 1000};
		check_deadline("hold");
		nanosleep(&ts, NULL);
	}
	emit("event=hold_done reason=%s held_s=%.6f", usr1_seen ? "signal" : "elapsed", now() - t0);
}

static void do_dirty(unsigned char *p, size_t npages, double seconds)
{
	double t0 = now(), end = t0 + seconds, last_report = t0;
	size_t off = dirty_offset(), i;
	uint64_t pass;
	usr1_seen = 0;
	emit("event=dirty_start seconds=%.3f pages=%zu", seconds, npages);
	for (pass = dirty_passes + 1;; pass++) {
		for (i = 0; i < npages; i++) {
			*(volatile uint64_t *)(p + i * page_size + off) = dirty_value(pass, i);
			dirty_partial = i + 1;
			/* Look at the clock every 16k pages so a huge pass still
			 * honours the phase end and the time bound. */
			if ((i & 0x3fff) == 0x3fff) {
				double t = now();
				if (t >= end || usr1_seen)
					goto out;
				check_deadline("dirty");
			}
		}
		dirty_passes = pass;
		dirty_partial = 0;
		{
			double t = now();
			if (t - last_report >= 1.0) {
				emit("event=dirty_progress passes=%llu elapsed_s=%.6f",
				     (unsigned long long)dirty_passes, t - t0);
				last_report = t;
			}
			if (t >= end || usr1_seen)
				break;
			check_deadline("dirty");
		}
	}
out:
	emit("event=dirty_done passes=%llu partial_pages=%zu duration_s=%.6f reason=%s",
	     (unsigned long long)(dirty_passes), dirty_partial, now() - t0,
	     usr1_seen ? "signal" : "elapsed");
}

/* Build in ref what page i must hold; ref already holds the fill byte
 * everywhere outside the tail and the dirty word. */
static void expected_page(unsigned char *ref, size_t i, int byte)
{
	size_t n = (size_t)page_size, off = dirty_offset(), k;
	uint64_t pass;
	if (tailed) {
		for (k = 0; k < TAIL_BYTES; k++)
			ref[n - TAIL_BYTES + k] = tail_byte(i, k);
	} else {
		memset(ref + off, byte, sizeof(uint64_t));
	}
	pass = i < dirty_partial ? dirty_passes + 1 : dirty_passes;
	if (pass > 0) {
		uint64_t word = dirty_value(pass, i);
		memcpy(ref + off, &word, sizeof(word));
	}
}

static void do_corrupt(unsigned char *p, size_t npages, size_t count)
{
	size_t i, step;
	if (count > npages)
		count = npages;
	step = count ? npages / count : 1;
	for (i = 0; i < count; i++)
		p[i * step * page_size + 17] ^= 0x5a; /* byte 17: neither tail nor dirty word */
	emit("event=corrupt_done pages=%zu", count);
}

static int do_verify(unsigned char *p, size_t npages, int byte)
{
	double t0 = now();
	size_t i, bad = 0;
	long first_bad = -1;
	if (!filled) {
		emit("event=error reason=verify_before_fill");
		exit(2);
	}
	unsigned char *ref = malloc(page_size);
	if (!ref) {
		emit("event=error reason=alloc_reference_page");
		exit(4);
	}
	memset(ref, byte, page_size);
	for (i = 0; i < npages; i++) {
		expected_page(ref, i, byte);
		if (memcmp(p + i * page_size, ref, page_size) != 0) {
			if (first_bad < 0)
				first_bad = (long)i;
			bad++;
		}
		if ((i & 0xfff) == 0)
			check_deadline("verify");
	}
	free(ref);
	emit("event=verify_done pages=%zu bad_pages=%zu first_bad=%ld tail=%d dirty_passes=%llu duration_s=%.6f",
	     npages, bad, first_bad, tailed, (unsigned long long)dirty_passes, now() - t0);
	return bad ? 1 : 0;
}

int main(int argc, char **argv)
{
	struct phase phases[MAX_PHASES];
	const char *phase_spec = "fill,hold:10";
	size_t mib = 0, size, npages, map_size;
	int byte = 1, mergeable = 0, thp = 0, nphases, i, status = 0;
	double timeout = 600;
	unsigned char *map, *p;
	char *end;

	setvbuf(stdout, NULL, _IOLBF, 0);
	page_size = sysconf(_SC_PAGESIZE);
	started = now();

	for (i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "--mergeable")) {
			mergeable = 1;
		} else if (!strcmp(a, "--thp")) {
			thp = 1;
		} else if (!strcmp(a, "--mib") && v) {
			mib = strtoul(v, &end, 10);
			if (*end || mib == 0)
				usage("--mib needs a size in MiB > 0");
			i++;
		} else if (!strcmp(a, "--byte") && v) {
			long b = strtol(v, &end, 0);
			if (*end || b < 0 || b > 255)
				usage("--byte needs a value 0..255");
			byte = (int)b;
			i++;
		} else if (!strcmp(a, "--phases") && v) {
			phase_spec = v;
			i++;
		} else if (!strcmp(a, "--timeout") && v) {
			timeout = strtod(v, &end);
			if (*end || timeout <= 0)
				usage("--timeout needs seconds > 0");
			i++;
		} else {
			usage("unknown or incomplete argument");
		}
	}
	if (mib == 0)
		usage("--mib is required");
	nphases = parse_phases(phase_spec, phases);
	deadline = started + timeout;
	signal(SIGALRM, on_alarm);
	alarm((unsigned)timeout + 5);
	{
		struct sigaction sa;
		memset(&sa, 0, sizeof(sa));
		sa.sa_handler = on_usr1;
		sigaction(SIGUSR1, &sa, NULL);
	}

	size = mib << 20;
	npages = size / page_size;
	{
		/* Fail early and clearly rather than be OOM-killed mid-fill. */
		long avail = meminfo_kib("MemAvailable");
		if (avail >= 0 && (long)(size >> 10) > avail)
			alloc_error(mib, "larger_than_MemAvailable", 0);
	}
	map_size = thp ? size + HUGE_ALIGN : size;
	map = mmap(NULL, map_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (map == MAP_FAILED)
		alloc_error(mib, "mmap_failed", errno);
	p = thp ? (unsigned char *)(((uintptr_t)map + HUGE_ALIGN - 1) & ~(HUGE_ALIGN - 1)) : map;
	if (thp && madvise(p, size, MADV_HUGEPAGE) != 0) {
		emit("event=error reason=madvise_hugepage errno=%d", errno);
		return 5;
	}
	if (mergeable && madvise(p, size, MADV_MERGEABLE) != 0) {
		emit("event=error reason=madvise_mergeable errno=%d", errno);
		return 5;
	}
	emit("event=start pid=%d mib=%zu pages=%zu page_size=%ld byte=%d mergeable=%d thp=%d "
	     "guest_mem_mib=%ld timeout_s=%.3f phases=%s",
	     (int)getpid(), mib, npages, page_size, byte, mergeable, thp,
	     meminfo_kib("MemTotal") / 1024, timeout, phase_spec);

	for (i = 0; i < nphases; i++) {
		switch (phases[i].kind) {
		case PH_FILL:
			do_fill(p, npages, byte);
			break;
		case PH_TAIL:
			if (!filled)
				do_fill(p, npages, byte);
			do_tail(p, npages);
			break;
		case PH_HOLD:
			do_hold(phases[i].seconds);
			break;
		case PH_DIRTY:
			if (!filled)
				do_fill(p, npages, byte);
			do_dirty(p, npages, phases[i].seconds);
			break;
		case PH_VERIFY:
			status |= do_verify(p, npages, byte);
			break;
		case PH_CORRUPT:
			do_corrupt(p, npages, (size_t)phases[i].seconds);
			break;
		}
	}
	emit("event=done status=%d elapsed_s=%.6f", status, now() - started);
	return status;
}

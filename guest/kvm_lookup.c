/*
 * kvm_lookup: the per-access memslot lookup benchmark of
 * host/memslots/kvm_lookup.py as one static program, for a host with no
 * Python: the host under test (L1), whose own KVM it drives.  The Python
 * stays the reference: the same layout, the same guest loop (byte for
 * byte: tests/memslots/test_memslots_l1_lookup.py), the same checks.
 *
 * usage:
 *   kvm_lookup run SLOTS ITERATIONS [rounds R] [unroll U] [ram-mib M]
 *                  [miss ioeventfd|exit] [deadline S]
 *       One VM of SLOTS memslots (slot 0 the RAM slot of M MiB at gpa 0
 *       holding the code, slots 1.. one page each above it with a gap page
 *       after each), one vCPU in flat 32-bit protected mode.  After a
 *       warm-up pass of each (16 iterations, not printed), R rounds of the
 *       passes null, miss, ram_hit, small_hit (none with one slot) in an
 *       order rotating by round, each of ITERATIONS iterations of U writes
 *       (the null loop: U register moves).  A miss is taken in the kernel
 *       by an ioeventfd (`miss ioeventfd`, the default, as kvm_lookup.py
 *       does) or comes out here as KVM_EXIT_MMIO (`miss exit`), checked
 *       and counted.  Defaults: rounds 1, unroll 8, ram-mib 1024,
 *       deadline 600 (seconds, for the whole run).
 *   kvm_lookup layout SLOTS [ram-mib M]
 *       The targets and sizes of that layout, one JSON object (no KVM).
 *   kvm_lookup program write|null UNROLL
 *       The guest loop's bytes in hex (no KVM).
 *
 * Output of run: one JSON object per timed pass, one a line:
 *   {"kind": "miss", "round": 0, "slots": N, "iterations": I, "unroll": U,
 *    "accesses": I*U (0 for null), "target_gpa": ..., "ns": CLOCK_MONOTONIC,
 *    "cpu_ns": this thread's CPU, "exits": KVM_RUN returns before the
 *    report, "mmio_exits": those that were KVM_EXIT_MMIO, "eventfd": writes
 *    the ioeventfd took, "counters": {"lookups", "nodes", "misses"[, "miss_nodes"]} deltas
 *    over the pass or null, "search": memslot_search or null}
 * The counters are the kvm module's parameters memslot_lookups,
 * memslot_nodes and memslot_misses, read before and after each pass when
 * all three exist (a kernel with memqual's memslot patches); memslot_search
 * names its structure.  On icount L1's CLOCK_MONOTONIC counts L1's
 * instructions, so `ns` is deterministic there.
 *
 * Exit status: 0 every pass checked; 1 a check or an ioctl failed; 2 bad
 * usage; 3 this host cannot run it (no /dev/kvm, no ioeventfd, too few
 * slots, a vCPU that does not run flat protected mode); 4 the deadline
 * passed.  Every failure is one line on stderr.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/kvm.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* kvm_lookup.py's constants (the reference). */
#define PAGE 4096UL
#define NULL_ENTRY 0x800UL     /* the null loop's copy, in the same code page */
#define REPORT_PORT 0x501
#define WARMUP_ITERATIONS 16UL
#define MAX_UNROLL 50
#define GPA_CEILING (1ULL << 32)
/* The miss target is this many pages above the small slot it follows: 1,
 * its gap page.  A test build sets 0 to aim the miss into the slot, where
 * the run must fail. */
#ifndef MISS_GAP_PAGES
#define MISS_GAP_PAGES 1
#endif
/* Where the kvm module's parameters are; a test build points it at files. */
#ifndef COUNTERS_DIR
#define COUNTERS_DIR "/sys/module/kvm/parameters"
#endif

enum { EXIT_OK = 0, EXIT_FAILED = 1, EXIT_USAGE = 2, EXIT_CANNOT = 3, EXIT_DEADLINE = 4 };
enum kind { K_NULL, K_MISS, K_RAM, K_SMALL, NKINDS };
/* The order of a round: kvm_lookup.py's ("null", then KINDS). */
static const char *const kind_name[NKINDS] = {"null", "miss", "ram_hit", "small_hit"};

static volatile sig_atomic_t deadline_passed;

static void fail(int status, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
static void fail(int status, const char *fmt, ...)
{
	va_list ap;

	fflush(stdout);
	fputs("kvm_lookup: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(status);
}

static void usage(void) __attribute__((noreturn));
static void usage(void)
{
	fail(EXIT_USAGE, "usage: kvm_lookup run SLOTS ITERATIONS [rounds R] [unroll U] [ram-mib M] "
			 "[miss ioeventfd|exit] [deadline S] | layout SLOTS [ram-mib M] | program write|null UNROLL");
}

/* A decimal number in [lo, hi], all of the word; anything else is usage. */
static unsigned long number(const char *what, const char *text, unsigned long lo, unsigned long hi)
{
	char *end;
	unsigned long value;

	if (text == NULL || *text < '0' || *text > '9')
		fail(EXIT_USAGE, "%s: give a number from %lu to %lu", what, lo, hi);
	errno = 0;
	value = strtoul(text, &end, 10);
	if (errno || *end || value < lo || value > hi)
		fail(EXIT_USAGE, "%s %s: give a number from %lu to %lu", what, text, lo, hi);
	return value;
}

/* --- the guest loop: kvm_lookup.py lookup_program(write, unroll) ------------- */
static size_t lookup_program(int write, unsigned unroll, unsigned char *code)
{
	size_t len = 0, done = 7 + 2 * unroll + 3;
	static const unsigned char tail[] = {0x89, 0xd8, 0x66, 0xba, 0x01, 0x05, 0xef, 0xf4, 0xeb, 0xfd};

	code[len++] = 0x31; code[len++] = 0xdb;                 /* xor ebx, ebx */
	code[len++] = 0x85; code[len++] = 0xc9;                 /* loop: test ecx, ecx */
	code[len++] = 0x74; code[len++] = (unsigned char)(done - 6); /* je done */
	code[len++] = 0x43;                                     /* inc ebx */
	for (unsigned i = 0; i < unroll; i++) {
		code[len++] = 0x89;                             /* mov [esi], ebx | mov ebx, ebx */
		code[len++] = write ? 0x1e : 0xdb;
	}
	code[len++] = 0x49;                                     /* dec ecx */
	code[len] = 0xeb;                                       /* jmp loop */
	code[len + 1] = (unsigned char)((2 - (long)(len + 2)) & 0xff);
	len += 2;
	memcpy(code + len, tail, sizeof(tail));                 /* report the count, halt */
	return len + sizeof(tail);
}

/* --- the layout: kvm_lookup.py LookupGeometry --------------------------------- */
struct geometry {
	unsigned long n;
	uint64_t ram;
	uint64_t target[NKINDS];   /* K_NULL runs on the RAM target, as the Python does */
};

static uint64_t small_gpa(const struct geometry *g, unsigned long i) { return g->ram + (i - 1) * 2 * PAGE; }
static uint64_t small_host_offset(const struct geometry *g, unsigned long i) { return g->ram + (i - 1) * PAGE; }
static uint64_t top_gpa(const struct geometry *g) { return g->ram + (g->n > 1 ? g->n - 1 : 1) * 2 * PAGE; }
static uint64_t host_size(const struct geometry *g) { return g->ram + (g->n > 1 ? g->n - 1 : 0) * PAGE; }

static struct geometry layout(unsigned long n, unsigned long ram_mib)
{
	struct geometry g = {.n = n, .ram = (uint64_t)ram_mib << 20};

	g.target[K_RAM] = g.target[K_NULL] = g.ram / 2;
	if (n >= 2) {
		g.target[K_SMALL] = small_gpa(&g, n / 2);
		g.target[K_MISS] = g.target[K_SMALL] + MISS_GAP_PAGES * PAGE;
	} else {
		g.target[K_MISS] = g.ram;
	}
	if (top_gpa(&g) > GPA_CEILING)
		fail(EXIT_USAGE, "%lu slots above a %lu MiB RAM slot reach %#llx, above 4 GiB: use a smaller RAM slot",
		     n, ram_mib, (unsigned long long)top_gpa(&g));
	return g;
}

static int has_kind(const struct geometry *g, int k) { return k != K_SMALL || g->n >= 2; }

/* --- the counters of a kernel with memqual's memslot patches ------------------ */
struct counters {
	unsigned long long lookups, nodes, misses;
	unsigned long long miss_nodes; /* a miss's own walks: kernels counting them only */
	int has_miss_nodes;
};

static int read_counter(const char *name, unsigned long long *value)
{
	char path[256], text[64], *end;
	ssize_t got;
	int fd;

	snprintf(path, sizeof(path), "%s/%s", COUNTERS_DIR, name);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		if (errno == ENOENT)
			return 0;
		fail(EXIT_FAILED, "%s: %s", path, strerror(errno));
	}
	got = read(fd, text, sizeof(text) - 1);
	close(fd);
	if (got <= 0)
		fail(EXIT_FAILED, "%s: cannot read it", path);
	text[got] = 0;
	errno = 0;
	*value = strtoull(text, &end, 10);
	if (errno || end == text || (*end && *end != '\n'))
		fail(EXIT_FAILED, "%s holds %.20s, not a count", path, text);
	return 1;
}

/* 1 with the three counters read, 0 when the kernel has none of them. */
static int read_counters(struct counters *c)
{
	int have = read_counter("memslot_lookups", &c->lookups);

	have += read_counter("memslot_nodes", &c->nodes);
	have += read_counter("memslot_misses", &c->misses);
	if (have != 0 && have != 3)
		fail(EXIT_FAILED, "%s has %d of the counters memslot_lookups, memslot_nodes, memslot_misses",
		     COUNTERS_DIR, have);
	c->has_miss_nodes = have == 3 && read_counter("memslot_miss_nodes", &c->miss_nodes);
	return have == 3;
}

/* memslot_search's word (letters, digits, '-', '_'), or "" without it. */
static void read_search(char *out, size_t size)
{
	char path[256];
	ssize_t got;
	size_t j = 0;
	int fd;

	out[0] = 0;
	snprintf(path, sizeof(path), "%s/memslot_search", COUNTERS_DIR);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	got = read(fd, out, size - 1);
	close(fd);
	for (ssize_t i = 0; i < got && out[i] != '\n'; i++) {
		char c = out[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_'))
			fail(EXIT_FAILED, "%s holds a byte %#x that names no structure", path, (unsigned char)c);
		out[j++] = c;
	}
	out[j] = 0;
}

/* --- the VM ------------------------------------------------------------------ */
struct options {
	unsigned long slots, iterations, rounds, unroll, ram_mib, deadline;
	int miss_exits;   /* misses come out as KVM_EXIT_MMIO, no ioeventfd */
};

struct vm {
	int kvm, fd, vcpu, efd;
	struct kvm_run *run;
	unsigned char *mem;
	struct geometry geo;
	const struct options *opt;
	char search[64];
};

struct pass {
	int kind;
	unsigned long iterations;
	uint64_t ns, cpu_ns;
	unsigned long exits, mmio_exits;
	uint64_t eventfd;
	int have_counters;
	struct counters delta;
};

static uint64_t clock_ns(clockid_t clock)
{
	struct timespec ts;

	clock_gettime(clock, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static int kvm_ioctl(int fd, unsigned long request, void *arg, const char *what)
{
	int r;

	do
		r = ioctl(fd, request, arg);
	while (r < 0 && errno == EINTR && !deadline_passed);
	if (r < 0 && deadline_passed)
		fail(EXIT_DEADLINE, "the deadline passed during %s", what);
	if (r < 0)
		fail(EXIT_FAILED, "%s failed: %s", what, strerror(errno));
	return r;
}

static void open_kvm(struct vm *vm)
{
	vm->kvm = open("/dev/kvm", O_RDWR | O_CLOEXEC);
	if (vm->kvm < 0)
		fail(EXIT_CANNOT, "/dev/kvm: %s", strerror(errno));
	if (ioctl(vm->kvm, KVM_GET_API_VERSION, 0) != KVM_API_VERSION)
		fail(EXIT_CANNOT, "/dev/kvm does not speak KVM API %d", KVM_API_VERSION);
	if (!vm->opt->miss_exits && ioctl(vm->kvm, KVM_CHECK_EXTENSION, KVM_CAP_IOEVENTFD) <= 0)
		fail(EXIT_CANNOT, "/dev/kvm has no KVM_CAP_IOEVENTFD: misses would exit to userspace (use: miss exit)");
	long nr = ioctl(vm->kvm, KVM_CHECK_EXTENSION, KVM_CAP_NR_MEMSLOTS);
	if (nr < 1 || (unsigned long)nr < vm->opt->slots)
		fail(EXIT_CANNOT, "%lu slots: this KVM has KVM_CAP_NR_MEMSLOTS = %ld", vm->opt->slots, nr);
}

static void set_region(struct vm *vm, unsigned slot, uint64_t gpa, uint64_t size, uint64_t offset)
{
	struct kvm_userspace_memory_region r = {
		.slot = slot, .guest_phys_addr = gpa, .memory_size = size,
		.userspace_addr = (uint64_t)(uintptr_t)(vm->mem + offset),
	};
	char what[96];

	snprintf(what, sizeof(what), "KVM_SET_USER_MEMORY_REGION(slot=%u, gpa=%#llx)", slot, (unsigned long long)gpa);
	kvm_ioctl(vm->fd, KVM_SET_USER_MEMORY_REGION, &r, what);
}

static void create_vm(struct vm *vm)
{
	unsigned char code[128];
	size_t len;

	vm->mem = mmap(NULL, host_size(&vm->geo), PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (vm->mem == MAP_FAILED)
		fail(EXIT_FAILED, "cannot map %llu bytes of guest memory", (unsigned long long)host_size(&vm->geo));
	len = lookup_program(1, (unsigned)vm->opt->unroll, code);
	memcpy(vm->mem, code, len);
	len = lookup_program(0, (unsigned)vm->opt->unroll, code);
	memcpy(vm->mem + NULL_ENTRY, code, len);
	vm->fd = kvm_ioctl(vm->kvm, KVM_CREATE_VM, 0, "KVM_CREATE_VM");
	set_region(vm, 0, 0, vm->geo.ram, 0);
	for (unsigned long i = 1; i < vm->geo.n; i++)
		set_region(vm, (unsigned)i, small_gpa(&vm->geo, i), PAGE, small_host_offset(&vm->geo, i));
	vm->efd = -1;
	if (!vm->opt->miss_exits) {
		struct kvm_ioeventfd io = {.addr = vm->geo.target[K_MISS], .len = 4};

		vm->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		if (vm->efd < 0)
			fail(EXIT_FAILED, "eventfd: %s", strerror(errno));
		io.fd = vm->efd;
		kvm_ioctl(vm->fd, KVM_IOEVENTFD, &io, "KVM_IOEVENTFD");
	}
}

/* Flat 32-bit protected mode, paging off, through KVM_SET_SREGS alone:
 * kvm.py enter_flat_protected_mode. */
static void flat_segment(struct kvm_segment *s, unsigned selector, unsigned type)
{
	memset(s, 0, sizeof(*s));
	s->limit = 0xffffffff;
	s->selector = (uint16_t)selector;
	s->type = (uint8_t)type;
	s->present = 1;
	s->db = 1;
	s->s = 1;
	s->g = 1;
}

static void create_vcpu(struct vm *vm)
{
	struct kvm_sregs sregs;
	int size;

	vm->vcpu = kvm_ioctl(vm->fd, KVM_CREATE_VCPU, 0, "KVM_CREATE_VCPU");
	size = kvm_ioctl(vm->kvm, KVM_GET_VCPU_MMAP_SIZE, 0, "KVM_GET_VCPU_MMAP_SIZE");
	if ((size_t)size < sizeof(struct kvm_run))
		fail(EXIT_CANNOT, "KVM_GET_VCPU_MMAP_SIZE is %d, smaller than kvm_run", size);
	vm->run = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, vm->vcpu, 0);
	if (vm->run == MAP_FAILED)
		fail(EXIT_FAILED, "cannot map the vCPU's kvm_run: %s", strerror(errno));
	kvm_ioctl(vm->vcpu, KVM_GET_SREGS, &sregs, "KVM_GET_SREGS");
	flat_segment(&sregs.cs, 0x08, 0xb);
	flat_segment(&sregs.ds, 0x10, 0x3);
	sregs.es = sregs.fs = sregs.gs = sregs.ss = sregs.ds;
	sregs.cr0 = (sregs.cr0 | 1 | (1 << 4)) & ~(1ULL << 31); /* PE, ET on; PG off */
	sregs.cr4 = 0;
	sregs.efer = 0;
	kvm_ioctl(vm->vcpu, KVM_SET_SREGS, &sregs, "KVM_SET_SREGS");
}

/* --- one pass ---------------------------------------------------------------- */
static const char *exit_text(uint32_t reason)
{
	switch (reason) {
	case KVM_EXIT_IO: return "KVM_EXIT_IO";
	case KVM_EXIT_HLT: return "KVM_EXIT_HLT";
	case KVM_EXIT_MMIO: return "KVM_EXIT_MMIO";
	case KVM_EXIT_SHUTDOWN: return "KVM_EXIT_SHUTDOWN";
	case KVM_EXIT_FAIL_ENTRY: return "KVM_EXIT_FAIL_ENTRY";
	case KVM_EXIT_INTERNAL_ERROR: return "KVM_EXIT_INTERNAL_ERROR";
	default: return "another exit";
	}
}

/* KVM_RUN once; the exit reason, KVM_EXIT_INTR for a signal. */
static uint32_t run_once(struct vm *vm)
{
	if (ioctl(vm->vcpu, KVM_RUN, 0) < 0) {
		if (errno != EINTR)
			fail(EXIT_FAILED, "KVM_RUN failed: %s", strerror(errno));
		if (deadline_passed)
			fail(EXIT_DEADLINE, "the deadline of %lu s passed inside a pass", vm->opt->deadline);
		return KVM_EXIT_INTR;
	}
	return vm->run->exit_reason;
}

/* A guest that stops where no pass should: a failure, or, in the warm-up
 * before anything is measured, a vCPU this host cannot run. */
static void unexpected_exit(struct vm *vm, const struct pass *p, uint32_t reason, int warmup)
{
	int cannot = warmup && (reason == KVM_EXIT_SHUTDOWN || reason == KVM_EXIT_FAIL_ENTRY ||
				reason == KVM_EXIT_INTERNAL_ERROR);

	fail(cannot ? EXIT_CANNOT : EXIT_FAILED, "%s pass at %#llx left the guest with %s (%u)%s",
	     kind_name[p->kind], (unsigned long long)vm->geo.target[p->kind], exit_text(reason), reason,
	     cannot ? ": this vCPU does not run flat protected mode" : "");
}

/* An MMIO exit of a miss pass in `miss exit` mode: the write at the
 * target, 4 bytes, carrying the iteration's count (every write of an
 * iteration writes the same EBX). */
static void check_mmio(struct vm *vm, struct pass *p)
{
	uint32_t data;
	uint64_t expected = p->mmio_exits / vm->opt->unroll + 1;

	memcpy(&data, vm->run->mmio.data, sizeof(data));
	if (p->kind != K_MISS || !vm->opt->miss_exits || vm->run->mmio.phys_addr != vm->geo.target[K_MISS] ||
	    vm->run->mmio.len != 4 || !vm->run->mmio.is_write || data != expected)
		fail(EXIT_FAILED, "%s pass: an MMIO %s of %u bytes at %#llx (data %u, expected a write of %llu at %#llx)",
		     kind_name[p->kind], vm->run->mmio.is_write ? "write" : "read", vm->run->mmio.len,
		     (unsigned long long)vm->run->mmio.phys_addr, data, (unsigned long long)expected,
		     (unsigned long long)vm->geo.target[K_MISS]);
	p->mmio_exits++;
}

/* The report: OUT of the count to REPORT_PORT, then HLT. */
static void check_report(struct vm *vm, const struct pass *p, int warmup)
{
	struct kvm_run *run = vm->run;
	uint32_t count = 0, reason;

	if (run->io.direction == KVM_EXIT_IO_OUT && run->io.size == 4 && run->io.count == 1)
		memcpy(&count, (unsigned char *)run + run->io.data_offset, 4);
	if (run->io.port != REPORT_PORT || run->io.size != 4 || count != p->iterations)
		fail(EXIT_FAILED, "%s pass: report on port %#x of %u bytes, count %u, expected %lu on %#x",
		     kind_name[p->kind], run->io.port, run->io.size, count, p->iterations, REPORT_PORT);
	while ((reason = run_once(vm)) == KVM_EXIT_INTR)
		;
	if (reason != KVM_EXIT_HLT)
		unexpected_exit(vm, p, reason, warmup);
}

static uint64_t read_eventfd(struct vm *vm)
{
	uint64_t value = 0;

	if (vm->efd >= 0 && read(vm->efd, &value, sizeof(value)) != sizeof(value)) {
		if (errno != EAGAIN)
			fail(EXIT_FAILED, "reading the ioeventfd: %s", strerror(errno));
		value = 0;
	}
	return value;
}

/* What a pass must have done: every miss taken by the ioeventfd or come
 * out as an MMIO exit, no hit leaving the guest, the hit's page holding
 * the guest's count. */
static void check_pass(struct vm *vm, const struct pass *p)
{
	uint64_t misses = p->kind == K_MISS ? (uint64_t)p->iterations * vm->opt->unroll : 0;
	uint64_t taken = vm->opt->miss_exits ? p->mmio_exits : p->eventfd;
	uint64_t offset = p->kind == K_SMALL ? small_host_offset(&vm->geo, vm->geo.n / 2) : vm->geo.target[K_RAM];
	uint32_t word;

	if (taken != misses || (vm->opt->miss_exits && p->eventfd) || (!vm->opt->miss_exits && p->mmio_exits))
		fail(EXIT_FAILED, "%s pass at %#llx: %llu writes came out as misses (%lu MMIO exits, %llu by the "
		     "ioeventfd), expected %llu: a miss hit a slot or a hit missed",
		     kind_name[p->kind], (unsigned long long)vm->geo.target[p->kind], (unsigned long long)taken,
		     p->mmio_exits, (unsigned long long)p->eventfd, (unsigned long long)misses);
	if (p->kind != K_RAM && p->kind != K_SMALL)
		return;
	memcpy(&word, vm->mem + offset, sizeof(word));
	if (word != p->iterations)
		fail(EXIT_FAILED, "%s pass: the target page holds %u, expected %lu: a write went elsewhere",
		     kind_name[p->kind], word, p->iterations);
}

static void run_pass(struct vm *vm, struct pass *p, int warmup)
{
	struct kvm_regs regs;
	struct counters before, after;
	uint64_t ns0, cpu0;
	uint32_t reason;

	p->exits = p->mmio_exits = 0;
	p->have_counters = read_counters(&before);
	memset(&regs, 0, sizeof(regs));
	regs.rip = p->kind == K_NULL ? NULL_ENTRY : 0;
	regs.rflags = 2;
	regs.rsi = vm->geo.target[p->kind];
	regs.rcx = p->iterations;
	kvm_ioctl(vm->vcpu, KVM_SET_REGS, &regs, "KVM_SET_REGS");
	ns0 = clock_ns(CLOCK_MONOTONIC);
	cpu0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
	while ((reason = run_once(vm)) != KVM_EXIT_IO) {
		if (reason == KVM_EXIT_MMIO)
			check_mmio(vm, p);
		else if (reason != KVM_EXIT_INTR)
			unexpected_exit(vm, p, reason, warmup);
		p->exits++;
	}
	p->cpu_ns = clock_ns(CLOCK_THREAD_CPUTIME_ID) - cpu0;
	p->ns = clock_ns(CLOCK_MONOTONIC) - ns0;
	check_report(vm, p, warmup);
	if (p->have_counters) {
		if (!read_counters(&after))
			fail(EXIT_FAILED, "the memslot counters in %s went away during a pass", COUNTERS_DIR);
		p->delta.lookups = after.lookups - before.lookups;
		p->delta.nodes = after.nodes - before.nodes;
		p->delta.misses = after.misses - before.misses;
		p->delta.has_miss_nodes = before.has_miss_nodes && after.has_miss_nodes;
		p->delta.miss_nodes = after.miss_nodes - before.miss_nodes;
	}
	p->eventfd = read_eventfd(vm);
	check_pass(vm, p);
}

static void print_pass(const struct vm *vm, const struct pass *p, unsigned long round)
{
	printf("{\"kind\": \"%s\", \"round\": %lu, \"slots\": %lu, \"iterations\": %lu, \"unroll\": %lu, "
	       "\"accesses\": %llu, \"target_gpa\": %llu, \"ns\": %llu, \"cpu_ns\": %llu, \"exits\": %lu, "
	       "\"mmio_exits\": %lu, \"eventfd\": %llu, ",
	       kind_name[p->kind], round, vm->geo.n, p->iterations, vm->opt->unroll,
	       p->kind == K_NULL ? 0ULL : (unsigned long long)p->iterations * vm->opt->unroll,
	       (unsigned long long)vm->geo.target[p->kind], (unsigned long long)p->ns, (unsigned long long)p->cpu_ns,
	       p->exits, p->mmio_exits, (unsigned long long)p->eventfd);
	if (p->have_counters && p->delta.has_miss_nodes)
		printf("\"counters\": {\"lookups\": %llu, \"nodes\": %llu, \"misses\": %llu, \"miss_nodes\": %llu}, ",
		       p->delta.lookups, p->delta.nodes, p->delta.misses, p->delta.miss_nodes);
	else if (p->have_counters)
		printf("\"counters\": {\"lookups\": %llu, \"nodes\": %llu, \"misses\": %llu}, ", p->delta.lookups,
		       p->delta.nodes, p->delta.misses);
	else
		printf("\"counters\": null, ");
	if (vm->search[0])
		printf("\"search\": \"%s\"}\n", vm->search);
	else
		printf("\"search\": null}\n");
	fflush(stdout);
}

static void on_alarm(int sig)
{
	(void)sig;
	deadline_passed = 1;
}

static int run_benchmark(const struct options *opt)
{
	struct vm vm = {.opt = opt};
	struct sigaction sa = {.sa_handler = on_alarm};   /* no SA_RESTART: KVM_RUN returns EINTR */
	int order[NKINDS], kinds = 0;

	vm.geo = layout(opt->slots, opt->ram_mib);
	sigaction(SIGALRM, &sa, NULL);
	alarm((unsigned)opt->deadline);
	for (int k = 0; k < NKINDS; k++)
		if (has_kind(&vm.geo, k))
			order[kinds++] = k;
	read_search(vm.search, sizeof(vm.search));
	open_kvm(&vm);
	create_vm(&vm);
	create_vcpu(&vm);
	/* Warm-up: fault in the code and target pages, warm the vCPU. */
	for (int i = 0; i < kinds; i++) {
		struct pass p = {.kind = order[i], .iterations = WARMUP_ITERATIONS};
		run_pass(&vm, &p, 1);
	}
	for (unsigned long r = 0; r < opt->rounds; r++) {
		/* Rotate the order every round so drift falls on every kind alike. */
		for (int i = 0; i < kinds; i++) {
			struct pass p = {.kind = order[(i + r) % (unsigned long)kinds], .iterations = opt->iterations};
			run_pass(&vm, &p, 0);
			print_pass(&vm, &p, r);
		}
	}
	return EXIT_OK;
}

/* --- the commands ------------------------------------------------------------ */
static int parse_run(int argc, char **argv)
{
	struct options opt = {.rounds = 1, .unroll = 8, .ram_mib = 1024, .deadline = 600};

	if (argc < 4)
		usage();
	opt.slots = number("SLOTS", argv[2], 1, 1UL << 20);
	opt.iterations = number("ITERATIONS", argv[3], 1, 100000000);
	for (int i = 4; i < argc; i += 2) {
		const char *word = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;

		if (value == NULL)
			usage();
		if (!strcmp(word, "rounds"))
			opt.rounds = number("rounds", value, 1, 1000);
		else if (!strcmp(word, "unroll"))
			opt.unroll = number("unroll", value, 1, MAX_UNROLL);
		else if (!strcmp(word, "ram-mib"))
			opt.ram_mib = number("ram-mib", value, 1, 4095);
		else if (!strcmp(word, "deadline"))
			opt.deadline = number("deadline", value, 1, 86400);
		else if (!strcmp(word, "miss") && (!strcmp(value, "ioeventfd") || !strcmp(value, "exit")))
			opt.miss_exits = !strcmp(value, "exit");
		else
			usage();
	}
	return run_benchmark(&opt);
}

static int print_layout(int argc, char **argv)
{
	unsigned long ram_mib = 1024;
	struct geometry g;

	if (argc != 3 && !(argc == 5 && !strcmp(argv[3], "ram-mib")))
		usage();
	if (argc == 5)
		ram_mib = number("ram-mib", argv[4], 1, 4095);
	g = layout(number("SLOTS", argv[2], 1, 1UL << 20), ram_mib);
	printf("{\"slots\": %lu, \"ram_bytes\": %llu, \"host_size\": %llu, \"top_gpa\": %llu, \"ram_hit\": %llu, "
	       "\"miss\": %llu",
	       g.n, (unsigned long long)g.ram, (unsigned long long)host_size(&g), (unsigned long long)top_gpa(&g),
	       (unsigned long long)g.target[K_RAM], (unsigned long long)g.target[K_MISS]);
	if (g.n >= 2)
		printf(", \"small_hit\": %llu", (unsigned long long)g.target[K_SMALL]);
	printf("}\n");
	return EXIT_OK;
}

static int print_program(int argc, char **argv)
{
	unsigned char code[128];
	size_t len;

	if (argc != 4 || (strcmp(argv[2], "write") && strcmp(argv[2], "null")))
		usage();
	len = lookup_program(!strcmp(argv[2], "write"), (unsigned)number("UNROLL", argv[3], 1, MAX_UNROLL), code);
	for (size_t i = 0; i < len; i++)
		printf("%02x", code[i]);
	printf("\n");
	return EXIT_OK;
}

int main(int argc, char **argv)
{
	if (argc >= 2 && !strcmp(argv[1], "run"))
		return parse_run(argc, argv);
	if (argc >= 2 && !strcmp(argv[1], "layout"))
		return print_layout(argc, argv);
	if (argc >= 2 && !strcmp(argv[1], "program"))
		return print_program(argc, argv);
	usage();
}

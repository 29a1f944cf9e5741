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
 *   kvm_lookup layout ITERATIONS [rounds R] [unroll U] [miss ioeventfd|exit]
 *                     [deadline S] slot ID GFN PAGES FLAGS ... code GFN
 *                     target miss GFN [target hit GFN]
 *       One VM of the slots given (a layout file's, host/memslots/layout.py:
 *       gfns and pages, flags KVM_MEM_LOG_DIRTY_PAGES 1 | KVM_MEM_READONLY
 *       2), registered in the order given (the order QEMU registered them),
 *       all backed by one MAP_NORESERVE anonymous mapping: nothing but the
 *       code page and the hit page is touched, so 10 GiB of slots register
 *       in a host of 2 GiB.  The loops run from `code GFN`, a page of a
 *       writable slot below 4 GiB (the layout's RAM slot: no slot is added
 *       to the layout).  Passes as run's: null, miss at the miss gfn (below
 *       4 GiB, in no slot), hit at the hit gfn (a writable slot, not the
 *       code's page) when given.  Same defaults, same checks, same lines.
 *   kvm_lookup geometry SLOTS [ram-mib M]
 *       The targets and sizes of run's layout, one JSON object (no KVM).
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
#include <fcntl.h>
#include <limits.h>
#include <sys/eventfd.h>

#define PROGRAM "kvm_lookup"
#include "kvm_vm.h"

/* kvm_lookup.py's constants (the reference). */
#define NULL_ENTRY 0x800UL     /* the null loop's copy, in the same code page */
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

enum kind { K_NULL, K_MISS, K_RAM, K_SMALL, K_HIT, NKINDS };
/* The order of a round: kvm_lookup.py's ("null", then KINDS); `layout`'s
 * passes are null, miss and hit. */
static const char *const kind_name[NKINDS] = {"null", "miss", "ram_hit", "small_hit", "hit"};

static void usage(void) __attribute__((noreturn));
static void usage(void)
{
	fail(EXIT_USAGE, "usage: kvm_lookup run SLOTS ITERATIONS [rounds R] [unroll U] [ram-mib M] "
			 "[miss ioeventfd|exit] [deadline S] | layout ITERATIONS [rounds R] [unroll U] [miss ioeventfd|exit] "
			 "[deadline S] slot ID GFN PAGES FLAGS ... code GFN target miss GFN [target hit GFN] | "
			 "geometry SLOTS [ram-mib M] | program write|null UNROLL");
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

static int has_kind(const struct geometry *g, int k) { return k != K_HIT && (k != K_SMALL || g->n >= 2); }

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
	struct geometry geo;       /* run's layout (unused by `layout`) */
	const struct options *opt;
	char search[64];
	unsigned long nslots;      /* slots registered */
	uint64_t target[NKINDS];   /* each pass's gpa */
	uint64_t code_gpa;         /* the write loop; the null loop NULL_ENTRY above it */
	/* Where a hit pass's count lands in mem, or -1 (no hit). */
	long long check_offset[NKINDS];
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

static void set_region(struct vm *vm, unsigned slot, uint64_t gpa, uint64_t size, uint64_t offset, uint32_t flags)
{
	struct kvm_userspace_memory_region r = {
		.slot = slot, .flags = flags, .guest_phys_addr = gpa, .memory_size = size,
		.userspace_addr = (uint64_t)(uintptr_t)(vm->mem + offset),
	};
	char what[96];

	snprintf(what, sizeof(what), "KVM_SET_USER_MEMORY_REGION(slot=%u, gpa=%#llx)", slot, (unsigned long long)gpa);
	kvm_ioctl(vm->fd, KVM_SET_USER_MEMORY_REGION, &r, what);
}

/* The write loop at `at`, the null loop NULL_ENTRY above it. */
static void load_code(const struct vm *vm, unsigned char *at)
{
	unsigned char code[128];
	size_t len;

	len = lookup_program(1, (unsigned)vm->opt->unroll, code);
	memcpy(at, code, len);
	len = lookup_program(0, (unsigned)vm->opt->unroll, code);
	memcpy(at + NULL_ENTRY, code, len);
}

static void add_ioeventfd(struct vm *vm)
{
	vm->efd = -1;
	if (!vm->opt->miss_exits) {
		struct kvm_ioeventfd io = {.addr = vm->target[K_MISS], .len = 4};

		vm->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		if (vm->efd < 0)
			fail(EXIT_FAILED, "eventfd: %s", strerror(errno));
		io.fd = vm->efd;
		kvm_ioctl(vm->fd, KVM_IOEVENTFD, &io, "KVM_IOEVENTFD");
	}
}

static void create_vm(struct vm *vm)
{
	vm->mem = map_guest(host_size(&vm->geo));
	load_code(vm, vm->mem);
	vm->fd = kvm_ioctl(vm->kvm, KVM_CREATE_VM, 0, "KVM_CREATE_VM");
	set_region(vm, 0, 0, vm->geo.ram, 0, 0);
	for (unsigned long i = 1; i < vm->geo.n; i++)
		set_region(vm, (unsigned)i, small_gpa(&vm->geo, i), PAGE, small_host_offset(&vm->geo, i), 0);
	add_ioeventfd(vm);
}

static void create_vcpu(struct vm *vm)
{
	vm->vcpu = flat_vcpu(vm->kvm, vm->fd, &vm->run);
}

/* --- one pass ---------------------------------------------------------------- */
static uint32_t run_once(struct vm *vm)
{
	return run_vcpu_once(vm->vcpu, vm->run, "a pass");
}

/* A guest that stops where no pass should: a failure, or, in the warm-up
 * before anything is measured, a vCPU this host cannot run. */
static void unexpected_exit(struct vm *vm, const struct pass *p, uint32_t reason, int warmup)
{
	int cannot = warmup && cannot_run(reason);

	fail(cannot ? EXIT_CANNOT : EXIT_FAILED, "%s pass at %#llx left the guest with %s (%u)%s",
	     kind_name[p->kind], (unsigned long long)vm->target[p->kind], exit_text(reason), reason,
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
	if (p->kind != K_MISS || !vm->opt->miss_exits || vm->run->mmio.phys_addr != vm->target[K_MISS] ||
	    vm->run->mmio.len != 4 || !vm->run->mmio.is_write || data != expected)
		fail(EXIT_FAILED, "%s pass: an MMIO %s of %u bytes at %#llx (data %u, expected a write of %llu at %#llx)",
		     kind_name[p->kind], vm->run->mmio.is_write ? "write" : "read", vm->run->mmio.len,
		     (unsigned long long)vm->run->mmio.phys_addr, data, (unsigned long long)expected,
		     (unsigned long long)vm->target[K_MISS]);
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
	long long offset = vm->check_offset[p->kind];
	uint32_t word;

	if (taken != misses || (vm->opt->miss_exits && p->eventfd) || (!vm->opt->miss_exits && p->mmio_exits))
		fail(EXIT_FAILED, "%s pass at %#llx: %llu writes came out as misses (%lu MMIO exits, %llu by the "
		     "ioeventfd), expected %llu: a miss hit a slot or a hit missed",
		     kind_name[p->kind], (unsigned long long)vm->target[p->kind], (unsigned long long)taken,
		     p->mmio_exits, (unsigned long long)p->eventfd, (unsigned long long)misses);
	if (offset < 0)
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
	regs.rip = vm->code_gpa + (p->kind == K_NULL ? NULL_ENTRY : 0);
	regs.rflags = 2;
	regs.rsi = vm->target[p->kind];
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
	       kind_name[p->kind], round, vm->nslots, p->iterations, vm->opt->unroll,
	       p->kind == K_NULL ? 0ULL : (unsigned long long)p->iterations * vm->opt->unroll,
	       (unsigned long long)vm->target[p->kind], (unsigned long long)p->ns, (unsigned long long)p->cpu_ns,
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

/* The warm-up pass of each kind (not printed: it faults in the code and
 * target pages and warms the vCPU), then the timed rounds. */
static void measure(struct vm *vm, const int *order, int kinds)
{
	for (int i = 0; i < kinds; i++) {
		struct pass p = {.kind = order[i], .iterations = WARMUP_ITERATIONS};
		run_pass(vm, &p, 1);
	}
	for (unsigned long r = 0; r < vm->opt->rounds; r++) {
		/* Rotate the order every round so drift falls on every kind alike. */
		for (int i = 0; i < kinds; i++) {
			struct pass p = {.kind = order[(i + r) % (unsigned long)kinds], .iterations = vm->opt->iterations};
			run_pass(vm, &p, 0);
			print_pass(vm, &p, r);
		}
	}
}

static int run_benchmark(const struct options *opt)
{
	struct vm vm = {.opt = opt};
	int order[NKINDS], kinds = 0;

	vm.geo = layout(opt->slots, opt->ram_mib);
	vm.nslots = vm.geo.n;
	memcpy(vm.target, vm.geo.target, sizeof(vm.target));
	for (int k = 0; k < NKINDS; k++)
		vm.check_offset[k] = -1;
	vm.check_offset[K_RAM] = (long long)vm.geo.target[K_RAM];
	if (vm.geo.n >= 2)
		vm.check_offset[K_SMALL] = (long long)small_host_offset(&vm.geo, vm.geo.n / 2);
	start_deadline(opt->deadline);
	for (int k = 0; k < NKINDS; k++)
		if (has_kind(&vm.geo, k))
			order[kinds++] = k;
	read_search(vm.search, sizeof(vm.search));
	open_kvm(&vm);
	create_vm(&vm);
	create_vcpu(&vm);
	measure(&vm, order, kinds);
	return EXIT_OK;
}

/* --- `layout`: an explicit slot list ------------------------------------------ */
struct lslot {
	unsigned long id;
	uint64_t gfn, pages, flags, host_offset;
};

struct layout_args {
	struct options opt;
	struct lslot *slots;
	unsigned long n;
	uint64_t miss_gfn, hit_gfn, code_gfn;
	int have_miss, have_hit, have_code;
};

#define KNOWN_FLAGS (KVM_MEM_LOG_DIRTY_PAGES | KVM_MEM_READONLY)
#define GFN_LIMIT (1ULL << 52)
#define LOW_GFNS (GPA_CEILING / PAGE)   /* the guest runs flat 32-bit, paging off */

/* The slot holding gfn, or NULL. */
static const struct lslot *slot_of(const struct layout_args *a, uint64_t gfn)
{
	for (unsigned long i = 0; i < a->n; i++)
		if (a->slots[i].gfn <= gfn && gfn < a->slots[i].gfn + a->slots[i].pages)
			return &a->slots[i];
	return NULL;
}

/* A page the guest writes (the code's, the hit's): below 4 GiB, in a slot
 * that is not read-only. */
static void check_writable(const struct layout_args *a, const char *what, uint64_t gfn)
{
	const struct lslot *s = slot_of(a, gfn);

	if (gfn >= LOW_GFNS)
		fail(EXIT_USAGE, "%s gfn %#llx is above 4 GiB: the guest runs flat 32-bit", what, (unsigned long long)gfn);
	if (s == NULL || (s->flags & KVM_MEM_READONLY))
		fail(EXIT_USAGE, "%s gfn %#llx is in no writable slot", what, (unsigned long long)gfn);
}

/* Ids distinct, no two slots overlapping (KVM would refuse or, for an id
 * given twice, move the slot), the targets where they belong. */
static void check_layout(struct layout_args *a)
{
	uint64_t offset = 0;

	if (a->n == 0 || !a->have_miss)
		fail(EXIT_USAGE, "layout: give at least one `slot ID GFN PAGES FLAGS` and `target miss GFN`");
	for (unsigned long i = 0; i < a->n; i++) {
		struct lslot *s = &a->slots[i];

		for (unsigned long j = 0; j < i; j++) {
			const struct lslot *t = &a->slots[j];
			if (t->id == s->id)
				fail(EXIT_USAGE, "slot id %lu given twice", s->id);
			if (t->gfn < s->gfn + s->pages && s->gfn < t->gfn + t->pages)
				fail(EXIT_USAGE, "slots %lu and %lu overlap", t->id, s->id);
		}
		s->host_offset = offset;
		offset += s->pages * PAGE;
	}
	if (slot_of(a, a->miss_gfn) != NULL || a->miss_gfn >= LOW_GFNS)
		fail(EXIT_USAGE, "miss gfn %#llx: give one below 4 GiB in no slot", (unsigned long long)a->miss_gfn);
	if (a->have_hit)
		check_writable(a, "hit", a->hit_gfn);
	if (!a->have_code)
		fail(EXIT_USAGE, "layout: give `code GFN`, the page the guest loop runs from");
	check_writable(a, "code", a->code_gfn);
	if (a->have_hit && a->hit_gfn == a->code_gfn)
		fail(EXIT_USAGE, "hit gfn %#llx is the code's page: give another", (unsigned long long)a->hit_gfn);
}

static uint64_t host_offset_of(const struct layout_args *a, uint64_t gfn)
{
	const struct lslot *s = slot_of(a, gfn);

	return s->host_offset + (gfn - s->gfn) * PAGE;
}

static int run_layout(struct layout_args *a)
{
	struct vm vm = {.opt = &a->opt};
	int order[NKINDS], kinds = 0;
	uint64_t size = 0;

	check_layout(a);
	for (unsigned long i = 0; i < a->n; i++)
		size += a->slots[i].pages * PAGE;
	vm.nslots = a->n;
	for (int k = 0; k < NKINDS; k++)
		vm.check_offset[k] = -1;
	vm.code_gpa = a->code_gfn * PAGE;
	vm.target[K_NULL] = vm.code_gpa;   /* the null loop writes nothing */
	vm.target[K_MISS] = a->miss_gfn * PAGE;
	order[kinds++] = K_NULL;
	order[kinds++] = K_MISS;
	if (a->have_hit) {
		vm.target[K_HIT] = a->hit_gfn * PAGE;
		vm.check_offset[K_HIT] = (long long)host_offset_of(a, a->hit_gfn);
		order[kinds++] = K_HIT;
	}
	start_deadline(a->opt.deadline);
	read_search(vm.search, sizeof(vm.search));
	a->opt.slots = a->n;
	open_kvm(&vm);
	vm.mem = map_guest(size);
	load_code(&vm, vm.mem + host_offset_of(a, a->code_gfn));
	vm.fd = kvm_ioctl(vm.kvm, KVM_CREATE_VM, 0, "KVM_CREATE_VM");
	/* In the layout's order: the order QEMU registered them in. */
	for (unsigned long i = 0; i < a->n; i++)
		set_region(&vm, (unsigned)a->slots[i].id, a->slots[i].gfn * PAGE, a->slots[i].pages * PAGE,
			   a->slots[i].host_offset, (uint32_t)a->slots[i].flags);
	add_ioeventfd(&vm);
	create_vcpu(&vm);
	measure(&vm, order, kinds);
	return EXIT_OK;
}

/* One option word and its value; 0 when the word is none of them. */
static int parse_option(struct options *opt, const char *word, const char *value)
{
	if (!strcmp(word, "rounds"))
		opt->rounds = number("rounds", value, 1, 1000);
	else if (!strcmp(word, "unroll"))
		opt->unroll = number("unroll", value, 1, MAX_UNROLL);
	else if (!strcmp(word, "deadline"))
		opt->deadline = number("deadline", value, 1, 86400);
	else if (!strcmp(word, "miss") && (!strcmp(value, "ioeventfd") || !strcmp(value, "exit")))
		opt->miss_exits = !strcmp(value, "exit");
	else
		return 0;
	return 1;
}

static int parse_layout(int argc, char **argv)
{
	struct layout_args a = {.opt = {.rounds = 1, .unroll = 8, .deadline = 600}};
	int i = 3;

	if (argc < 4)
		usage();
	a.opt.iterations = number("ITERATIONS", argv[2], 1, 100000000);
	a.slots = calloc((size_t)argc / 5 + 1, sizeof(*a.slots));
	if (a.slots == NULL)
		fail(EXIT_FAILED, "out of memory");
	while (i < argc) {
		const char *word = argv[i];

		if (!strcmp(word, "slot") && i + 4 < argc) {
			struct lslot *s = &a.slots[a.n++];

			s->id = number("slot ID", argv[i + 1], 0, 32767);
			s->gfn = number("slot GFN", argv[i + 2], 0, GFN_LIMIT - 1);
			s->pages = number("slot PAGES", argv[i + 3], 1, GFN_LIMIT - s->gfn);
			s->flags = number("slot FLAGS", argv[i + 4], 0, KNOWN_FLAGS);
			i += 5;
		} else if (!strcmp(word, "target") && i + 2 < argc && !strcmp(argv[i + 1], "miss")) {
			a.miss_gfn = number("miss GFN", argv[i + 2], 0, GFN_LIMIT - 1);
			a.have_miss = 1;
			i += 3;
		} else if (!strcmp(word, "target") && i + 2 < argc && !strcmp(argv[i + 1], "hit")) {
			a.hit_gfn = number("hit GFN", argv[i + 2], 0, GFN_LIMIT - 1);
			a.have_hit = 1;
			i += 3;
		} else if (!strcmp(word, "code") && i + 1 < argc) {
			a.code_gfn = number("code GFN", argv[i + 1], 0, GFN_LIMIT - 1);
			a.have_code = 1;
			i += 2;
		} else if (i + 1 < argc && parse_option(&a.opt, word, argv[i + 1])) {
			i += 2;
		} else {
			usage();
		}
	}
	return run_layout(&a);
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
		if (!strcmp(word, "ram-mib"))
			opt.ram_mib = number("ram-mib", value, 1, 4095);
		else if (!parse_option(&opt, word, value))
			usage();
	}
	return run_benchmark(&opt);
}

static int print_geometry(int argc, char **argv)
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
		return parse_layout(argc, argv);
	if (argc >= 2 && !strcmp(argv[1], "geometry"))
		return print_geometry(argc, argv);
	if (argc >= 2 && !strcmp(argv[1], "program"))
		return print_program(argc, argv);
	usage();
}

/*
 * kvm_slots: the slot operations of host/memslots/kvm_bench.py as one
 * static program, for a host with no Python: the host under test (L1),
 * whose own KVM it drives.  The Python stays the reference: the same
 * geometry, the same guest program (byte for byte:
 * tests/memslots/test_memslots_l1_slots.py), the same probes and checks.
 *
 * usage:
 *   kvm_slots bench [slot-pages P] [no-vcpu] [deadline S] WARMUP RUN...
 *       WARMUP is `warmup N`, RUN is `run N REPEAT`: fresh VMs in the order
 *       given (the caller's schedule; the warm-up is not printed).  First
 *       what /dev/kvm says and its errnos to six invalid requests in a small
 *       VM, then whether the vCPU runs the guest (a one-slot VM: an empty
 *       pass and one write), then each VM: N slots of P pages created,
 *       timed as a whole; unless no-vcpu or the vCPU cannot run, two
 *       empty passes (the second timed), a first and a warm touch of every
 *       slot, N writes into one page of slot 0, and a write into every gap
 *       frame (a miss and a KVM_EXIT_MMIO each); one slot more when the VM
 *       is full (its errno); every slot moved one page up, timed; every
 *       slot deleted, timed.  Defaults: slot-pages 1, deadline 3600.
 *   kvm_slots geometry N [slot-pages P]
 *       The layout's addresses, one JSON object (no KVM).
 *   kvm_slots program
 *       The guest program's bytes in hex (no KVM).
 *
 * Output of bench, one JSON object a line:
 *   {"line": "kvm", "api_version", "nr_memslots", "address_spaces",
 *    "vcpu_mmap_size", "kvm_module", "release"}
 *   {"line": "probe", "name": "limit", "observed": "EINVAL"|"accepted"}  (six)
 *   {"line": "vcpu", "error": null|"why the guest cannot run here"}
 *   {"line": "run", "slots", "repeat", "setup_ns", "move_ns", "delete_ns",
 *    "limit": null|"EINVAL", "vcpu": null|{"empty_ns", "first_ns",
 *    "warm_ns", "same_ns", "mmio_ns", "reported": [4 counts],
 *    "mmio_exits", "mmio_mismatches", "touched_ok", "other_exits"}}
 * Times are CLOCK_MONOTONIC: on icount L1's, so its instructions.
 *
 * Exit status: 0 every run done (the caller checks the probes and
 * counts); 1 an ioctl or a pass failed; 2 bad usage; 3 this host cannot
 * run it (no /dev/kvm, too few slots); 4 the deadline passed.  Every
 * failure is one line on stderr.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <sys/utsname.h>

#define PROGRAM "kvm_slots"
#include "kvm_vm.h"

#define GPA_CEILING (1ULL << 32)
#define MAX_RUNS 4096
/* The MMIO pass writes into each slot's gap frame.  A test build sets
 * MMIO_INTO_SLOTS to aim it at the slots' own pages instead: its writes
 * stay in the guest and the caller's checks must fail. */
#ifndef MMIO_INTO_SLOTS
#define MMIO_INTO_SLOTS 0
#endif

/* kvm_guest.py GUEST_LISTING: ESI first address, ECX count, EDI stride;
 * writes the running count at each address, reports it with OUT, halts. */
static const unsigned char guest_code[] = {
	0x31, 0xdb,                   /* xor ebx, ebx */
	0x85, 0xc9,                   /* loop: test ecx, ecx */
	0x74, 0x08,                   /* je done */
	0x43,                         /* inc ebx */
	0x89, 0x1e,                   /* mov [esi], ebx */
	0x01, 0xfe,                   /* add esi, edi */
	0x49,                         /* dec ecx */
	0xeb, 0xf4,                   /* jmp loop */
	0x89, 0xd8,                   /* done: mov eax, ebx */
	0x66, 0xba, 0x01, 0x05,       /* mov dx, 0x501 */
	0xef,                         /* out dx, eax */
	0xf4,                         /* halt: hlt */
	0xeb, 0xfd,                   /* jmp halt */
};

/* --- the layout: kvm_guest.py SlotGeometry ------------------------------------ */
struct geometry {
	unsigned long n, pages;
};

static uint64_t stride(const struct geometry *g) { return (g->pages + 1) * PAGE; }
static uint64_t touch_gpa(const struct geometry *g, unsigned long i) { return PAGE + i * stride(g); }
static uint64_t slot_gpa(const struct geometry *g, unsigned long i) { return i ? touch_gpa(g, i) : 0; }
static uint64_t slot_size(const struct geometry *g, unsigned long i) { return (g->pages + !i) * PAGE; }
static uint64_t gap_gpa(const struct geometry *g, unsigned long i) { return touch_gpa(g, i) + g->pages * PAGE; }
static uint64_t touch_offset(const struct geometry *g, unsigned long i) { return (1 + i * g->pages) * PAGE; }
static uint64_t slot_offset(const struct geometry *g, unsigned long i) { return i ? touch_offset(g, i) : 0; }
static uint64_t host_size(const struct geometry *g) { return (1 + g->n * g->pages) * PAGE; }
static uint64_t top_gpa(const struct geometry *g) { return PAGE + g->n * stride(g); }

static struct geometry geometry(unsigned long n, unsigned long pages)
{
	struct geometry g = {.n = n, .pages = pages};

	if (top_gpa(&g) > GPA_CEILING)
		fail(EXIT_USAGE, "%lu slots of %lu pages reach %#llx, above 4 GiB: use fewer pages per slot", n, pages,
		     (unsigned long long)top_gpa(&g));
	return g;
}

/* --- KVM ---------------------------------------------------------------------- */
struct kvm {
	int fd;
	long nr_memslots;
};

struct vm {
	const struct kvm *kvm;
	int fd, vcpu;
	struct kvm_run *run;
	unsigned char *mem;
	uint64_t size;
	struct geometry geo;
};

static struct kvm open_kvm(void)
{
	struct kvm k;

	k.fd = open("/dev/kvm", O_RDWR | O_CLOEXEC);
	if (k.fd < 0)
		fail(EXIT_CANNOT, "/dev/kvm: %s", strerror(errno));
	if (ioctl(k.fd, KVM_GET_API_VERSION, 0) != KVM_API_VERSION)
		fail(EXIT_CANNOT, "/dev/kvm does not speak KVM API %d", KVM_API_VERSION);
	if (ioctl(k.fd, KVM_CHECK_EXTENSION, KVM_CAP_USER_MEMORY) <= 0)
		fail(EXIT_CANNOT, "/dev/kvm has no user memory slots (KVM_CAP_USER_MEMORY)");
	k.nr_memslots = ioctl(k.fd, KVM_CHECK_EXTENSION, KVM_CAP_NR_MEMSLOTS);
	if (k.nr_memslots < 1)
		fail(EXIT_CANNOT, "/dev/kvm has KVM_CAP_NR_MEMSLOTS = %ld", k.nr_memslots);
	return k;
}

/* The errno name KVM_SET_USER_MEMORY_REGION answered, or "accepted". */
static const char *attempt(int vm_fd, unsigned slot, uint64_t gpa, uint64_t size, uint64_t hva)
{
	struct kvm_userspace_memory_region r = {
		.slot = slot, .guest_phys_addr = gpa, .memory_size = size, .userspace_addr = hva,
	};
	int got;

	do
		got = ioctl(vm_fd, KVM_SET_USER_MEMORY_REGION, &r);
	while (got < 0 && errno == EINTR && !deadline_passed);
	if (got == 0)
		return "accepted";
	switch (errno) {
	case EINVAL: return "EINVAL";
	case EEXIST: return "EEXIST";
	case ENOMEM: return "ENOMEM";
	case EFAULT: return "EFAULT";
	case EPERM: return "EPERM";
	case ENOSPC: return "ENOSPC";
	case EINTR: fail(EXIT_DEADLINE, "the deadline passed during KVM_SET_USER_MEMORY_REGION");
	default: return "another errno";
	}
}

static void set_region(struct vm *vm, unsigned long slot, uint64_t gpa, uint64_t size, uint64_t offset)
{
	struct kvm_userspace_memory_region r = {
		.slot = (uint32_t)slot, .guest_phys_addr = gpa, .memory_size = size,
		.userspace_addr = (uint64_t)(uintptr_t)(vm->mem + offset),
	};
	char what[96];

	snprintf(what, sizeof(what), "KVM_SET_USER_MEMORY_REGION(slot=%lu, gpa=%#llx)", slot, (unsigned long long)gpa);
	kvm_ioctl(vm->fd, KVM_SET_USER_MEMORY_REGION, &r, what);
}

static void print_kvm(const struct kvm *k)
{
	struct utsname u;
	const char *module = access("/sys/module/kvm_amd", F_OK) == 0	   ? "kvm_amd"
			     : access("/sys/module/kvm_intel", F_OK) == 0 ? "kvm_intel"
			     : access("/sys/module/kvm_pvm", F_OK) == 0	   ? "kvm_pvm"
									   : "unknown";
	long spaces = ioctl(k->fd, KVM_CHECK_EXTENSION, KVM_CAP_MULTI_ADDRESS_SPACE);

	uname(&u);
	printf("{\"line\": \"kvm\", \"api_version\": %d, \"nr_memslots\": %ld, \"address_spaces\": %ld, "
	       "\"vcpu_mmap_size\": %d, \"kvm_module\": \"%s\", \"release\": \"%s\"}\n",
	       ioctl(k->fd, KVM_GET_API_VERSION, 0), k->nr_memslots, spaces > 1 ? spaces : 1,
	       ioctl(k->fd, KVM_GET_VCPU_MMAP_SIZE, 0), module, u.release);
}

/* kvm_bench.py probe_errors: each invalid request in a small VM. */
static void probe_errors(const struct kvm *k)
{
	unsigned char *mem = map_guest(4 * PAGE);
	uint64_t base = (uint64_t)(uintptr_t)mem;
	int fd = kvm_ioctl(k->fd, KVM_CREATE_VM, 0, "KVM_CREATE_VM");
	unsigned nr = (unsigned)k->nr_memslots;
	struct {
		const char *name;
		unsigned slot;
		uint64_t gpa, size, hva;
	} probes[] = {
		{"limit", nr, 0x300000, PAGE, base + 3 * PAGE},
		{"overlap", 1, 0x101000, 2 * PAGE, base + 2 * PAGE},
		{"misaligned_gpa", 1, 0x300800, PAGE, base + 3 * PAGE},
		{"misaligned_size", 1, 0x300000, PAGE / 2, base + 3 * PAGE},
		{"misaligned_hva", 1, 0x300000, PAGE, base + 3 * PAGE + PAGE / 2},
		{"resize", 0, 0x100000, PAGE, base},
	};

	/* The last valid id must work, so the limit probe tests the id alone. */
	if (strcmp(attempt(fd, 0, 0x100000, 2 * PAGE, base), "accepted") ||
	    strcmp(attempt(fd, nr - 1, 0x200000, PAGE, base + 2 * PAGE), "accepted"))
		fail(EXIT_FAILED, "the probes' VM refused its two valid slots (0 and %u)", nr - 1);
	for (size_t i = 0; i < sizeof(probes) / sizeof(probes[0]); i++)
		printf("{\"line\": \"probe\", \"name\": \"%s\", \"observed\": \"%s\"}\n", probes[i].name,
		       attempt(fd, probes[i].slot, probes[i].gpa, probes[i].size, probes[i].hva));
	close(fd);
	munmap(mem, 4 * PAGE);
}

static void create_vm(struct vm *vm, const struct kvm *k, struct geometry geo)
{
	vm->kvm = k;
	vm->geo = geo;
	vm->size = host_size(&geo);
	vm->mem = map_guest(vm->size);
	memcpy(vm->mem, guest_code, sizeof(guest_code));
	vm->fd = kvm_ioctl(k->fd, KVM_CREATE_VM, 0, "KVM_CREATE_VM");
	vm->vcpu = -1;
}

static void destroy_vm(struct vm *vm)
{
	if (vm->vcpu >= 0) {
		munmap(vm->run, (size_t)ioctl(vm->kvm->fd, KVM_GET_VCPU_MMAP_SIZE, 0));
		close(vm->vcpu);
	}
	close(vm->fd);
	munmap(vm->mem, vm->size);
}

/* --- the guest passes: kvm_bench.py _run_pass ---------------------------------- */
struct pass {
	uint64_t ns;
	uint32_t reported;
	unsigned long other_exits, mmio_exits, mmio_mismatches;
	const char *cannot;   /* the capability probe's: the exit that says this vCPU cannot run the guest */
};

/* A pass that stopped where the program cannot: a failure, except in the
 * capability probe (`probing`), where an exit that says this vCPU cannot
 * run flat protected mode at all is its answer. */
static void stopped(struct pass *p, uint32_t reason, int probing, const char *what)
{
	if (probing && cannot_run(reason)) {
		p->cannot = exit_text(reason);
		return;
	}
	fail(EXIT_FAILED, "%s stopped with %s (%u)", what, exit_text(reason), reason);
}

static uint32_t run_vcpu(struct vm *vm)
{
	return run_vcpu_once(vm->vcpu, vm->run, "a guest pass");
}

/* One pass of `count` writes from `first`, `step` apart; MMIO exits
 * allowed (and checked against the gap frames) when `mmio`.  Timed from
 * the first KVM_RUN to the report's exit. */
static struct pass guest_pass(struct vm *vm, uint64_t first, unsigned long count, uint64_t step, int mmio,
			      int probing)
{
	struct kvm_regs regs = {.rip = 0, .rflags = 2, .rsi = first, .rcx = count, .rdi = step};
	struct pass p = {0};
	uint32_t reason, data;
	uint64_t start;

	kvm_ioctl(vm->vcpu, KVM_SET_REGS, &regs, "KVM_SET_REGS");
	start = clock_ns(CLOCK_MONOTONIC);
	while ((reason = run_vcpu(vm)) != KVM_EXIT_IO) {
		if (reason == KVM_EXIT_INTR) {
			p.other_exits++;
			continue;
		}
		if (reason != KVM_EXIT_MMIO) {
			stopped(&p, reason, probing, "a guest pass");
			return p;
		}
		if (!mmio)
			fail(EXIT_FAILED, "a slot access left KVM: an MMIO exit at %#llx",
			     (unsigned long long)vm->run->mmio.phys_addr);
		memcpy(&data, vm->run->mmio.data, sizeof(data));
		if (!(vm->run->mmio.is_write && vm->run->mmio.len == 4 &&
		      vm->run->mmio.phys_addr == gap_gpa(&vm->geo, p.mmio_exits) && data == p.mmio_exits + 1))
			p.mmio_mismatches++;
		p.mmio_exits++;
	}
	p.ns = clock_ns(CLOCK_MONOTONIC) - start;
	if (vm->run->io.port != REPORT_PORT || vm->run->io.direction != KVM_EXIT_IO_OUT || vm->run->io.size != 4)
		fail(EXIT_FAILED, "unexpected port access: port %#x, %u bytes", vm->run->io.port, vm->run->io.size);
	memcpy(&p.reported, (unsigned char *)vm->run + vm->run->io.data_offset, 4);
	/* Finish on HLT so no port access is pending into the next pass. */
	while ((reason = run_vcpu(vm)) == KVM_EXIT_INTR)
		p.other_exits++;
	if (reason != KVM_EXIT_HLT)
		stopped(&p, reason, probing, "the guest after its report");
	return p;
}

static void setup_slots(struct vm *vm)
{
	for (unsigned long i = 0; i < vm->geo.n; i++)
		set_region(vm, i, slot_gpa(&vm->geo, i), slot_size(&vm->geo, i), slot_offset(&vm->geo, i));
}

/* kvm_bench.py probe_vcpu: whether this KVM runs the guest program (a
 * one-slot VM, an empty pass and a pass of one write, checked), said in
 * the "vcpu" line; 1 when it does.  One that runs but miscounts fails. */
static int probe_vcpu(const struct kvm *k)
{
	struct vm vm;
	struct pass p;
	uint32_t word;

	create_vm(&vm, k, geometry(1, 1));
	setup_slots(&vm);
	vm.vcpu = flat_vcpu(k->fd, vm.fd, &vm.run);
	p = guest_pass(&vm, touch_gpa(&vm.geo, 0), 0, stride(&vm.geo), 0, 1);
	if (!p.cannot)
		p = guest_pass(&vm, touch_gpa(&vm.geo, 0), 1, stride(&vm.geo), 0, 1);
	memcpy(&word, vm.mem + touch_offset(&vm.geo, 0), sizeof(word));
	destroy_vm(&vm);
	if (p.cannot) {
		printf("{\"line\": \"vcpu\", \"error\": \"the flat protected-mode guest cannot run on this KVM: "
		       "its pass stopped with %s\"}\n", p.cannot);
		return 0;
	}
	if (p.reported != 1 || word != 1)
		fail(EXIT_FAILED, "capability probe: the guest reported %u writes and wrote %u, expected 1 and 1",
		     p.reported, word);
	printf("{\"line\": \"vcpu\", \"error\": null}\n");
	return 1;
}

/* Slots whose page holds exactly the guest's write to it (after the
 * touches, before the same-slot pass writes into slot 0 again). */
static unsigned long touched_ok(const struct vm *vm)
{
	unsigned long touched = 0;
	uint32_t word;

	for (unsigned long i = 0; i < vm->geo.n; i++) {
		memcpy(&word, vm->mem + touch_offset(&vm->geo, i), sizeof(word));
		touched += word == i + 1;
	}
	return touched;
}

static void print_passes(const struct pass *empty, const struct pass *first, const struct pass *warm,
			 const struct pass *same, const struct pass *mmio, unsigned long touched)
{
	printf("{\"empty_ns\": %llu, \"first_ns\": %llu, \"warm_ns\": %llu, \"same_ns\": %llu, \"mmio_ns\": %llu, "
	       "\"reported\": [%u, %u, %u, %u], \"mmio_exits\": %lu, \"mmio_mismatches\": %lu, \"touched_ok\": %lu, "
	       "\"other_exits\": %lu}",
	       (unsigned long long)empty->ns, (unsigned long long)first->ns, (unsigned long long)warm->ns,
	       (unsigned long long)same->ns, (unsigned long long)mmio->ns, first->reported, warm->reported,
	       same->reported, mmio->reported, mmio->mmio_exits, mmio->mmio_mismatches, touched,
	       empty->other_exits + first->other_exits + warm->other_exits + same->other_exits + mmio->other_exits);
}

/* kvm_bench.py run_once: one fresh VM of n slots; printed unless a warm-up. */
static void run_once(const struct kvm *k, struct geometry geo, long repeat, int vcpu, int print)
{
	struct vm vm;
	struct pass empty, first, warm, same, mmio;
	uint64_t t0, setup_ns, move_ns, delete_ns;
	const char *limit = NULL;
	unsigned long n = geo.n, touched = 0;

	create_vm(&vm, k, geo);
	t0 = clock_ns(CLOCK_MONOTONIC);
	setup_slots(&vm);
	setup_ns = clock_ns(CLOCK_MONOTONIC) - t0;
	if (vcpu) {
		uint64_t at = touch_gpa(&geo, 0), step = stride(&geo);

		vm.vcpu = flat_vcpu(k->fd, vm.fd, &vm.run);
		/* The first empty pass faults in the code page and warms the
		 * vCPU; the second is a pass's fixed cost. */
		guest_pass(&vm, at, 0, step, 0, 0);
		empty = guest_pass(&vm, at, 0, step, 0, 0);
		first = guest_pass(&vm, at, n, step, 0, 0);
		warm = guest_pass(&vm, at, n, step, 0, 0);
		touched = touched_ok(&vm);
		same = guest_pass(&vm, at, n, 0, 0, 0);
		mmio = guest_pass(&vm, MMIO_INTO_SLOTS ? at : gap_gpa(&geo, 0), n, step, 1, 0);
	}
	if ((long)n >= k->nr_memslots)
		limit = attempt(vm.fd, (unsigned)k->nr_memslots, top_gpa(&geo) + PAGE, PAGE, (uint64_t)(uintptr_t)vm.mem);
	/* One page up: into the slot's own gap frame, never onto the next. */
	t0 = clock_ns(CLOCK_MONOTONIC);
	for (unsigned long i = 0; i < n; i++)
		set_region(&vm, i, slot_gpa(&geo, i) + PAGE, slot_size(&geo, i), slot_offset(&geo, i));
	move_ns = clock_ns(CLOCK_MONOTONIC) - t0;
	t0 = clock_ns(CLOCK_MONOTONIC);
	for (unsigned long i = 0; i < n; i++) {
		struct kvm_userspace_memory_region r = {.slot = (uint32_t)i};

		kvm_ioctl(vm.fd, KVM_SET_USER_MEMORY_REGION, &r, "KVM_SET_USER_MEMORY_REGION (delete)");
	}
	delete_ns = clock_ns(CLOCK_MONOTONIC) - t0;
	if (print) {
		printf("{\"line\": \"run\", \"slots\": %lu, \"repeat\": %ld, \"setup_ns\": %llu, \"move_ns\": %llu, "
		       "\"delete_ns\": %llu, ",
		       n, repeat, (unsigned long long)setup_ns, (unsigned long long)move_ns, (unsigned long long)delete_ns);
		if (limit)
			printf("\"limit\": \"%s\", \"vcpu\": ", limit);
		else
			printf("\"limit\": null, \"vcpu\": ");
		if (vcpu)
			print_passes(&empty, &first, &warm, &same, &mmio, touched);
		else
			printf("null");
		printf("}\n");
		fflush(stdout);
	}
	destroy_vm(&vm);
}

/* --- the commands ------------------------------------------------------------ */
static void usage(void) __attribute__((noreturn));
static void usage(void)
{
	fail(EXIT_USAGE, "usage: kvm_slots bench [slot-pages P] [no-vcpu] [deadline S] warmup N run N REPEAT ... | "
			 "geometry N [slot-pages P] | program");
}

struct run_arg {
	unsigned long n;
	long repeat;
};

static int bench(int argc, char **argv)
{
	unsigned long pages = 1, deadline = 3600, warmup = 0, nruns = 0;
	static struct run_arg runs[MAX_RUNS];
	int vcpu = 1, i = 2;
	struct kvm k;

	while (i < argc) {
		if (!strcmp(argv[i], "slot-pages") && i + 1 < argc) {
			pages = number("slot-pages", argv[i + 1], 1, 1UL << 20);
			i += 2;
		} else if (!strcmp(argv[i], "deadline") && i + 1 < argc) {
			deadline = number("deadline", argv[i + 1], 1, 86400);
			i += 2;
		} else if (!strcmp(argv[i], "no-vcpu")) {
			vcpu = 0;
			i++;
		} else if (!strcmp(argv[i], "warmup") && i + 1 < argc) {
			warmup = number("warmup N", argv[i + 1], 1, 1UL << 20);
			i += 2;
		} else if (!strcmp(argv[i], "run") && i + 2 < argc && nruns < MAX_RUNS) {
			runs[nruns].n = number("run N", argv[i + 1], 1, 1UL << 20);
			runs[nruns++].repeat = (long)number("run REPEAT", argv[i + 2], 0, 1000000);
			i += 3;
		} else {
			usage();
		}
	}
	if (!warmup || !nruns)
		usage();
	geometry(warmup, pages);
	for (unsigned long r = 0; r < nruns; r++)
		geometry(runs[r].n, pages);
	start_deadline(deadline);
	k = open_kvm();
	for (unsigned long r = 0; r < nruns; r++)
		if ((long)runs[r].n > k.nr_memslots)
			fail(EXIT_CANNOT, "%lu slots: this KVM has KVM_CAP_NR_MEMSLOTS = %ld", runs[r].n, k.nr_memslots);
	print_kvm(&k);
	probe_errors(&k);
	if (vcpu)
		vcpu = probe_vcpu(&k);
	else
		printf("{\"line\": \"vcpu\", \"error\": null}\n");
	fflush(stdout);
	/* The first VM of a process pays for cold caches and lazily set-up
	 * kernel state, which is no slot's cost. */
	run_once(&k, geometry(warmup, pages), -1, vcpu, 0);
	for (unsigned long r = 0; r < nruns; r++)
		run_once(&k, geometry(runs[r].n, pages), runs[r].repeat, vcpu, 1);
	return EXIT_OK;
}

static int print_geometry(int argc, char **argv)
{
	unsigned long pages = 1;
	struct geometry g;

	if (argc != 3 && !(argc == 5 && !strcmp(argv[3], "slot-pages")))
		usage();
	if (argc == 5)
		pages = number("slot-pages", argv[4], 1, 1UL << 20);
	g = geometry(number("N", argv[2], 1, 1UL << 20), pages);
	printf("{\"slots\": %lu, \"stride\": %llu, \"host_size\": %llu, \"top_gpa\": %llu, \"last_slot_gpa\": %llu, "
	       "\"last_gap_gpa\": %llu, \"last_touch_offset\": %llu, \"slot0_size\": %llu}\n",
	       g.n, (unsigned long long)stride(&g), (unsigned long long)host_size(&g), (unsigned long long)top_gpa(&g),
	       (unsigned long long)slot_gpa(&g, g.n - 1), (unsigned long long)gap_gpa(&g, g.n - 1),
	       (unsigned long long)touch_offset(&g, g.n - 1), (unsigned long long)slot_size(&g, 0));
	return EXIT_OK;
}

int main(int argc, char **argv)
{
	if (argc >= 2 && !strcmp(argv[1], "bench"))
		return bench(argc, argv);
	if (argc >= 2 && !strcmp(argv[1], "geometry"))
		return print_geometry(argc, argv);
	if (argc == 2 && !strcmp(argv[1], "program")) {
		for (size_t i = 0; i < sizeof(guest_code); i++)
			printf("%02x", guest_code[i]);
		printf("\n");
		return EXIT_OK;
	}
	usage();
}

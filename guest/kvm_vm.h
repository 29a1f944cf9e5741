/*
 * What the /dev/kvm programs for the host under test (kvm_lookup.c,
 * kvm_slots.c) share: one failure line and the exit statuses, checked
 * numbers, ioctls that end at the deadline, the clocks, guest memory and
 * a vCPU in flat 32-bit protected mode (host/core/kvm.py's
 * enter_flat_protected_mode).  Define PROGRAM, the name every failure
 * line starts with, before including it.
 */
#ifndef MEMQUAL_KVM_VM_H
#define MEMQUAL_KVM_VM_H

#include <errno.h>
#include <linux/kvm.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#ifndef PROGRAM
#error "define PROGRAM before including kvm_vm.h"
#endif

#define PAGE 4096UL
#define REPORT_PORT 0x501

/* 0 all checked; 1 a check or an ioctl failed; 2 bad usage; 3 this host
 * cannot run it; 4 the deadline passed. */
enum { EXIT_OK = 0, EXIT_FAILED = 1, EXIT_USAGE = 2, EXIT_CANNOT = 3, EXIT_DEADLINE = 4 };

static volatile sig_atomic_t deadline_passed;
static unsigned long deadline_seconds;   /* start_deadline's, for the message */

static void fail(int status, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
static void fail(int status, const char *fmt, ...)
{
	va_list ap;

	fflush(stdout);
	fputs(PROGRAM ": ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(status);
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

static uint64_t clock_ns(clockid_t clock)
{
	struct timespec ts;

	clock_gettime(clock, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* An ioctl that must succeed: retried on a signal until the deadline,
 * which also ends the program after one the signal did not interrupt
 * (a slot update runs to its end). */
static int kvm_ioctl(int fd, unsigned long request, void *arg, const char *what)
{
	int r;

	do
		r = ioctl(fd, request, arg);
	while (r < 0 && errno == EINTR && !deadline_passed);
	if (deadline_passed)
		fail(EXIT_DEADLINE, "the deadline of %lu s passed during %s", deadline_seconds, what);
	if (r < 0)
		fail(EXIT_FAILED, "%s failed: %s", what, strerror(errno));
	return r;
}

static void on_alarm(int sig)
{
	(void)sig;
	deadline_passed = 1;
}

static void start_deadline(unsigned long seconds)
{
	struct sigaction sa = {.sa_handler = on_alarm};   /* no SA_RESTART: KVM_RUN returns EINTR */

	deadline_seconds = seconds;
	sigaction(SIGALRM, &sa, NULL);
	alarm((unsigned)seconds);
}

static unsigned char *map_guest(uint64_t size)
{
	/* MAP_NORESERVE: a layout of 10 GiB registers in a host of 2 GiB, as
	 * only the pages the guest writes are backed (with
	 * vm.overcommit_memory 0 or 1; mode 2 ignores the flag). */
	unsigned char *mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

	if (mem == MAP_FAILED)
		fail(EXIT_CANNOT, "cannot map %llu bytes of guest memory: %s (vm.overcommit_memory 2 refuses "
		     "MAP_NORESERVE: set 0)", (unsigned long long)size, strerror(errno));
	return mem;
}

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

/* vCPU 0 of the VM `vm_fd`, in flat 32-bit protected mode with paging off
 * through KVM_SET_SREGS alone; its kvm_run mapped into *run. */
static int flat_vcpu(int kvm, int vm_fd, struct kvm_run **run)
{
	struct kvm_sregs sregs;
	int vcpu, size;

	vcpu = kvm_ioctl(vm_fd, KVM_CREATE_VCPU, 0, "KVM_CREATE_VCPU");
	size = kvm_ioctl(kvm, KVM_GET_VCPU_MMAP_SIZE, 0, "KVM_GET_VCPU_MMAP_SIZE");
	if ((size_t)size < sizeof(struct kvm_run))
		fail(EXIT_CANNOT, "KVM_GET_VCPU_MMAP_SIZE is %d, smaller than kvm_run", size);
	*run = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, vcpu, 0);
	if (*run == MAP_FAILED)
		fail(EXIT_FAILED, "cannot map the vCPU's kvm_run: %s", strerror(errno));
	kvm_ioctl(vcpu, KVM_GET_SREGS, &sregs, "KVM_GET_SREGS");
	flat_segment(&sregs.cs, 0x08, 0xb);
	flat_segment(&sregs.ds, 0x10, 0x3);
	sregs.es = sregs.fs = sregs.gs = sregs.ss = sregs.ds;
	sregs.cr0 = (sregs.cr0 | 1 | (1 << 4)) & ~(1ULL << 31); /* PE, ET on; PG off */
	sregs.cr4 = 0;
	sregs.efer = 0;
	kvm_ioctl(vcpu, KVM_SET_SREGS, &sregs, "KVM_SET_SREGS");
	return vcpu;
}

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

/* KVM_RUN once; the exit reason, KVM_EXIT_INTR for a signal.  The
 * deadline is checked before each entry too: a SIGALRM that lands while
 * the program handles an exit interrupts no ioctl. */
static uint32_t run_vcpu_once(int vcpu, const struct kvm_run *run, const char *where)
{
	if (!deadline_passed && ioctl(vcpu, KVM_RUN, 0) == 0)
		return run->exit_reason;
	if (deadline_passed)
		fail(EXIT_DEADLINE, "the deadline of %lu s passed inside %s", deadline_seconds, where);
	if (errno != EINTR)
		fail(EXIT_FAILED, "KVM_RUN failed: %s", strerror(errno));
	return KVM_EXIT_INTR;
}

/* An exit that says this vCPU cannot run flat protected mode at all. */
static int cannot_run(uint32_t reason)
{
	return reason == KVM_EXIT_SHUTDOWN || reason == KVM_EXIT_FAIL_ENTRY || reason == KVM_EXIT_INTERNAL_ERROR;
}

#endif

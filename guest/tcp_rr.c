/*
 * tcp_rr: netperf's TCP_RR in one small static program, request and
 * response of one byte each over one TCP connection.
 *
 *     tcp_rr ADDRESS PORT TRANSACTIONS RUNS
 *
 * Connects to ADDRESS:PORT (an IPv4 address; the peer echoes what it gets,
 * as an echo service does) with TCP_NODELAY, then RUNS times sends one
 * byte and waits for it to come back, TRANSACTIONS times a run, each run
 * timed with CLOCK_MONOTONIC.  Through an emulated NIC every transaction is
 * the driver's register accesses and an interrupt (on a 2011 guest, with
 * xAPIC, an EOI written to the APIC's page): the host's work a netperf
 * round trip costs.  Under QEMU's icount clock the guest's clock counts
 * the host's instructions.
 *
 * One line per record, machine readable:
 *     event=connected address=A port=P
 *     event=run index=I transactions=N duration_s=S us_per_transaction=X
 *     event=done runs=R
 *     event=error reason=...
 *
 * A send or receive that waits more than 30 s of the guest's clock is an
 * error: a peer that went away must not hold the run.
 *
 * Exit status: 0 done, 2 bad arguments, 4 a system call failed or the
 * peer closed or answered a byte that was not sent.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define MAX_TRANSACTIONS 100000000UL
#define MAX_RUNS 1000UL
#define IO_TIMEOUT_S 30

static int fail(const char *what)
{
	printf("event=error reason=%s:%s\n", what, errno ? strerror(errno) : "unexpected");
	return 4;
}

static int parse(const char *text, unsigned long max, unsigned long *out)
{
	char *end;

	errno = 0;
	*out = strtoul(text, &end, 0);
	return errno || *end || end == text || *out > max || *out == 0;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* One transaction: a byte out, the same byte back. */
static int transact(int fd, unsigned char byte)
{
	unsigned char got;
	ssize_t n;

	do
		n = send(fd, &byte, 1, 0);
	while (n < 0 && errno == EINTR);
	if (n != 1)
		return -1;
	do
		n = recv(fd, &got, 1, 0);
	while (n < 0 && errno == EINTR);
	if (n != 1) {
		if (n == 0)
			errno = 0;
		return -1;
	}
	if (got != byte) {
		errno = 0;
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	unsigned long port, transactions, runs;
	struct sockaddr_in peer = { .sin_family = AF_INET };
	struct timeval timeout = { .tv_sec = IO_TIMEOUT_S };
	int fd, one = 1;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc != 5 || inet_pton(AF_INET, argv[1], &peer.sin_addr) != 1 || parse(argv[2], 65535, &port) ||
	    parse(argv[3], MAX_TRANSACTIONS, &transactions) || parse(argv[4], MAX_RUNS, &runs)) {
		printf("event=error reason=usage: tcp_rr ADDRESS PORT TRANSACTIONS RUNS\n");
		return 2;
	}
	peer.sin_port = htons((unsigned short)port);
	fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0)
		return fail("socket");
	if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) ||
	    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout)) ||
	    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout)))
		return fail("setsockopt");
	if (connect(fd, (struct sockaddr *)&peer, sizeof(peer)))
		return fail("connect");
	printf("event=connected address=%s port=%lu\n", argv[1], port);
	/* One transaction first: the peer's first answer starts its process. */
	if (transact(fd, 0x55))
		return fail("warm-up");
	for (unsigned long run = 0; run < runs; run++) {
		double start = now_s(), seconds;

		for (unsigned long i = 0; i < transactions; i++)
			if (transact(fd, (unsigned char)(i & 0xff)))
				return fail("transaction");
		seconds = now_s() - start;
		printf("event=run index=%lu transactions=%lu duration_s=%.9f us_per_transaction=%.3f\n", run, transactions,
		       seconds, seconds * 1e6 / transactions);
	}
	close(fd);
	printf("event=done runs=%lu\n", runs);
	return 0;
}

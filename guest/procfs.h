/* Small /proc readers shared by the guest agents (header-only: each agent
 * is one static program built from one .c file plus these headers). */
#ifndef MEMQUAL_GUEST_PROCFS_H
#define MEMQUAL_GUEST_PROCFS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Value of "Key:" in /proc/meminfo in KiB, -1 if absent. */
static inline long meminfo_kib(const char *key)
{
	FILE *f = fopen("/proc/meminfo", "r");
	char line[256];
	size_t n = strlen(key);
	long value = -1;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		if (strncmp(line, key, n) == 0 && line[n] == ':') {
			value = strtol(line + n + 1, NULL, 10);
			break;
		}
	}
	fclose(f);
	return value;
}

#endif

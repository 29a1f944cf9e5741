/*
 * kvm_memslots_harness: the memslot search of a patched kernel
 * (images/kvm-memslots/) run in user space, so that its counts can be
 * compared with memqual's model for the same slots and lookups.
 *
 * The test pastes the patch's own functions in (extracted.c: the search,
 * __search_memslots, and the update of its structure) over the few kernel
 * names they use, defined below; one memslot set (node_idx 0), whose gfn
 * tree is a sorted list (the rebuild only walks it in order).
 *
 * Reads one operation a line on stdin:
 *     I ID BASE NPAGES   register a slot (a new registration number)
 *     D ID               delete it
 *     L GFN              search: prints "ID NODES" (ID -1 when none)
 * Built with -DLINEAR, -DTREE2011 or -DREORDER for the structure.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef uint64_t gfn_t;
typedef uint64_t u64;
#define unlikely(x) (x)
#define WARN_ON_ONCE(x) (x)
#define max(a, b) ((a) > (b) ? (a) : (b))
#define container_of(ptr, type, member) ((type *)((char *)(ptr) - offsetof(type, member)))
#define KVM_MEM_SLOTS_NUM 512

struct rb_node {
	struct rb_node *next;
};
struct rb_root {
	struct rb_node *first;
};
struct kvm_memory_slot {
	struct rb_node gfn_node[2];
	struct kvm_memory_slot *wbt_left[2], *wbt_right[2], *wbt_parent[2];
	u64 wbt_seq;
	gfn_t base_gfn;
	unsigned long npages;
	short id;
};
struct kvm_memslots {
	struct rb_root gfn_tree;
	int node_idx;
	struct kvm_memory_slot *wbt_root;
	struct kvm_memory_slot *by_size[KVM_MEM_SLOTS_NUM];
	int nr_by_size;
	struct kvm_memory_slot *array[KVM_MEM_SLOTS_NUM];
	int nmemslots;
};

static inline struct rb_node *rb_first(struct rb_root *root) { return root->first; }
static inline struct rb_node *rb_next(struct rb_node *node) { return node->next; }

static inline bool is_gfn_in_memslot(const struct kvm_memory_slot *slot, gfn_t gfn)
{
	return gfn >= slot->base_gfn && gfn < slot->base_gfn + slot->npages;
}

/* Only s390's approximate search reaches the gfn tree's walk. */
static inline struct kvm_memory_slot *__search_gfn_tree(struct kvm_memslots *slots, gfn_t gfn, bool approx,
						 unsigned long *nodes)
{
	abort();
}

#include "extracted.c"

static struct kvm_memslots set;
static struct kvm_memory_slot *by_id[KVM_MEM_SLOTS_NUM];
static u64 registered;

static void gfn_list_insert(struct kvm_memory_slot *slot)
{
	struct rb_node **at = &set.gfn_tree.first;

	while (*at && container_of(*at, struct kvm_memory_slot, gfn_node[0])->base_gfn < slot->base_gfn)
		at = &(*at)->next;
	slot->gfn_node[0].next = *at;
	*at = &slot->gfn_node[0];
}

static void gfn_list_remove(struct kvm_memory_slot *slot)
{
	struct rb_node **at = &set.gfn_tree.first;

	while (*at != &slot->gfn_node[0])
		at = &(*at)->next;
	*at = slot->gfn_node[0].next;
}

/* What kvm_replace_memslot() does for the structure, after the gfn tree. */
static void replace(struct kvm_memory_slot *old, struct kvm_memory_slot *new)
{
#if defined(LINEAR)
	kvm_array_replace(&set, old, new);
#elif defined(TREE2011)
	kvm_wbt_rebuild(&set);
#elif defined(REORDER)
	kvm_reorder_replace(&set, old, new);
#endif
}

int main(void)
{
	unsigned long long a, b;
	char op;
	int id;

	while (scanf(" %c", &op) == 1) {
		if (op == 'I' && scanf("%d %llu %llu", &id, &a, &b) == 3 && id >= 0 && id < KVM_MEM_SLOTS_NUM) {
			struct kvm_memory_slot *slot = calloc(1, sizeof(*slot));

			slot->id = id;
			slot->base_gfn = a;
			slot->npages = b;
			slot->wbt_seq = ++registered;
			by_id[id] = slot;
			gfn_list_insert(slot);
			replace(NULL, slot);
		} else if (op == 'D' && scanf("%d", &id) == 1 && id >= 0 && id < KVM_MEM_SLOTS_NUM && by_id[id]) {
			gfn_list_remove(by_id[id]);
			replace(by_id[id], NULL);
			free(by_id[id]);
			by_id[id] = NULL;
		} else if (op == 'L' && scanf("%llu", &a) == 1) {
			unsigned long nodes = 0;
			struct kvm_memory_slot *slot = __search_memslots(&set, a, false, &nodes);

			printf("%d %lu\n", slot ? slot->id : -1, nodes);
		} else {
			fprintf(stderr, "bad operation %c\n", op);
			return 2;
		}
	}
	return 0;
}

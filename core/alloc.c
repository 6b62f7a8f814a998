/* alloc.c - see alloc.h */
#include "core/alloc.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* A header in front of each block keeps its size and tag; 64 bytes keeps the
 * user pointer cache-line (and AVX-512) aligned. */
typedef struct {
    size_t bytes;
    int tag;
    char pad[64 - sizeof(size_t) - sizeof(int)];
} block_header;

static atomic_size_t g_current[TW_MEM_TAG_COUNT + 1];
static atomic_size_t g_peak[TW_MEM_TAG_COUNT + 1];
static atomic_uint_fast64_t g_count;

static void bump_peak(int i, size_t now)
{
    size_t old = atomic_load(&g_peak[i]);
    while (now > old && !atomic_compare_exchange_weak(&g_peak[i], &old, now)) {
    }
}

void *tw_alloc(tw_mem_tag tag, size_t bytes)
{
    if (tag < 0 || tag >= TW_MEM_TAG_COUNT) tag = TW_MEM_OTHER;
    if (bytes > SIZE_MAX - 2 * sizeof(block_header)) return NULL;
    size_t total = sizeof(block_header) + ((bytes + 63) & ~(size_t)63);
    void *raw = NULL;
    if (posix_memalign(&raw, 64, total) != 0) return NULL;
    block_header *h = raw;
    h->bytes = total;
    h->tag = tag;
    atomic_fetch_add(&g_count, 1);
    bump_peak(tag, atomic_fetch_add(&g_current[tag], total) + total);
    bump_peak(TW_MEM_TAG_COUNT, atomic_fetch_add(&g_current[TW_MEM_TAG_COUNT], total) + total);
    return h + 1;
}

void *tw_calloc(tw_mem_tag tag, size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size) return NULL;
    void *p = tw_alloc(tag, n * size);
    if (p) memset(p, 0, n * size);
    return p;
}

void tw_free(void *p)
{
    if (!p) return;
    block_header *h = (block_header *)p - 1;
    atomic_fetch_sub(&g_current[h->tag], h->bytes);
    atomic_fetch_sub(&g_current[TW_MEM_TAG_COUNT], h->bytes);
    free(h);
}

size_t tw_mem_current(tw_mem_tag tag)
{
    return atomic_load(&g_current[tag <= TW_MEM_TAG_COUNT ? tag : TW_MEM_OTHER]);
}

size_t tw_mem_peak(tw_mem_tag tag)
{
    return atomic_load(&g_peak[tag <= TW_MEM_TAG_COUNT ? tag : TW_MEM_OTHER]);
}

uint64_t tw_mem_alloc_count(void)
{
    return atomic_load(&g_count);
}

const char *tw_mem_tag_name(tw_mem_tag tag)
{
    static const char *names[] = {"weights", "slots", "workspace", "strip",
                                  "read",    "other", "total"};
    return tag <= TW_MEM_TAG_COUNT ? names[tag] : "other";
}

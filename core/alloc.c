/* alloc.c - see alloc.h */
#include "core/alloc.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* A header in front of each block keeps its size and tag; 64 bytes keeps the
 * user pointer cache-line (and AVX-512) aligned. */
typedef struct {
    size_t bytes;
    tw_mem_scope *scope; /* counted there too, or NULL */
    int tag;
    char pad[64 - sizeof(size_t) - sizeof(void *) - sizeof(int)];
} block_header;
_Static_assert(sizeof(block_header) == 64, "the header keeps blocks 64-byte aligned");

/* One set of counters: the process's, or a scope's. */
typedef struct counters {
    atomic_size_t current[TW_MEM_TAG_COUNT + 1];
    atomic_size_t peak[TW_MEM_TAG_COUNT + 1];
    atomic_uint_fast64_t count;
} counters;

struct tw_mem_scope {
    counters c;
    /* References: one for the opener until it closes, one per live block.
     * The last one gone frees the scope (not through tw_alloc: a scope is
     * not counted in itself). */
    atomic_size_t refs;
};

static counters g;
static _Thread_local tw_mem_scope *t_scope;

static void bump_peak(counters *c, int i, size_t now)
{
    size_t old = atomic_load(&c->peak[i]);
    while (now > old && !atomic_compare_exchange_weak(&c->peak[i], &old, now)) {
    }
}

static void count_alloc(counters *c, int tag, size_t total)
{
    atomic_fetch_add(&c->count, 1);
    bump_peak(c, tag, atomic_fetch_add(&c->current[tag], total) + total);
    bump_peak(c, TW_MEM_TAG_COUNT, atomic_fetch_add(&c->current[TW_MEM_TAG_COUNT], total) + total);
}

static void count_free(counters *c, int tag, size_t total)
{
    atomic_fetch_sub(&c->current[tag], total);
    atomic_fetch_sub(&c->current[TW_MEM_TAG_COUNT], total);
}

static void scope_unref(tw_mem_scope *s)
{
    if (s && atomic_fetch_sub(&s->refs, 1) == 1) free(s);
}

tw_mem_scope *tw_mem_scope_open(void)
{
    tw_mem_scope *s = calloc(1, sizeof *s);
    if (s) atomic_init(&s->refs, 1);
    return s;
}

void tw_mem_scope_close(tw_mem_scope *s)
{
    scope_unref(s);
}

tw_mem_scope *tw_mem_scope_enter(tw_mem_scope *s)
{
    tw_mem_scope *prev = t_scope;
    t_scope = s;
    return prev;
}

tw_mem_scope *tw_mem_scope_current(void)
{
    return t_scope;
}

size_t tw_mem_scope_peak(const tw_mem_scope *s, tw_mem_tag tag)
{
    return s ? atomic_load(&s->c.peak[tag <= TW_MEM_TAG_COUNT ? tag : TW_MEM_OTHER]) : 0;
}

uint64_t tw_mem_scope_alloc_count(const tw_mem_scope *s)
{
    return s ? atomic_load(&s->c.count) : 0;
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
    h->scope = t_scope;
    count_alloc(&g, tag, total);
    if (h->scope) {
        atomic_fetch_add(&h->scope->refs, 1);
        count_alloc(&h->scope->c, tag, total);
    }
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
    count_free(&g, h->tag, h->bytes);
    if (h->scope) {
        count_free(&h->scope->c, h->tag, h->bytes);
        scope_unref(h->scope);
    }
    free(h);
}

size_t tw_mem_current(tw_mem_tag tag)
{
    return atomic_load(&g.current[tag <= TW_MEM_TAG_COUNT ? tag : TW_MEM_OTHER]);
}

size_t tw_mem_peak(tw_mem_tag tag)
{
    return atomic_load(&g.peak[tag <= TW_MEM_TAG_COUNT ? tag : TW_MEM_OTHER]);
}

uint64_t tw_mem_alloc_count(void)
{
    return atomic_load(&g.count);
}

const char *tw_mem_tag_name(tw_mem_tag tag)
{
    static const char *names[] = {"weights", "slots", "workspace", "strip",
                                  "read",    "other", "total"};
    return tag <= TW_MEM_TAG_COUNT ? names[tag] : "other";
}

/* budget.c - see budget.h */
#include "pipeline/engine/budget.h"

#include <stdio.h>
#include <string.h>

#define MIB ((size_t)1 << 20)

int tw_budget_ref_capacity(int batch)
{
    /* a batch's tiles are refs too (kept or not): a slot holds one batch
     * of consecutive tile positions */
    return batch;
}

/* The most one reader's strip may take: a window this size still runs at
 * GDAL's full strip speed (bench/feed_rate), and N readers stay small
 * beside the slots. */
#define READ_STRIP_MAX (32 * MIB)

/* Widest window a reader takes for batches of `batch` tiles: a run of
 * consecutive tiles of one tile row, at most the raster's width (plus the
 * padding of the last tile), at most READ_STRIP_MAX, at least one tile. */
static int read_strip_w_for(const tw_budget_in *in, int batch)
{
    int stride = in->stride > 0 ? in->stride : in->tile;
    long run = (long)(batch - 1) * stride + in->tile;
    long full = (long)in->raster_w + in->tile;
    long w = run < full ? run : full;
    size_t col = tw_raster_strip_bytes(1, in->tile, in->bands, in->dtype, in->mask);
    long cap = (long)(READ_STRIP_MAX / col);
    if (w > cap) w = cap;
    if (w < in->tile) w = in->tile;
    return (int)w;
}

size_t tw_budget_slot_bytes(const tw_budget_in *in, int batch, int ref_capacity)
{
    size_t px = (size_t)in->tile * (size_t)in->tile;
    size_t b = (size_t)batch;
    size_t bytes = b * (size_t)in->bands * px * tw_dtype_size(in->dtype); /* raw */
    bytes += b * px;                                                      /* valid */
    if (!in->backend->i->wants_raw(in->backend->ctx))
        bytes += b * (size_t)in->bands * px * sizeof(float); /* normalized */
    /* probabilities: per tile, or per pixel (a segmentation model) */
    bytes += b * (size_t)in->n_classes * (in->seg ? px : 1) * sizeof(float);
    if (in->want_emb) bytes += b * (size_t)in->feat_dim * sizeof(float); /* embeddings */
    bytes += (size_t)ref_capacity * 48;                                  /* tile refs */
    return bytes + 8 * 64;
}

/* Enough GDAL block cache to keep one tile row's blocks across the width
 * for each reader, so no block is decoded twice; capped so that a very wide raster re-reads
 * rather than blowing the budget. */
static size_t gdal_cache_for(const tw_budget_in *in, int readers, size_t cap)
{
    int bw = in->block_w > 0 ? in->block_w : in->raster_w;
    int bh = in->block_h > 0 ? in->block_h : 1;
    int stride = in->stride > 0 ? in->stride : in->tile;
    size_t blocks_x = ((size_t)in->raster_w + (size_t)bw - 1) / (size_t)bw; /* 2^31-1 wide */
    /* Block rows one tile row touches, worst case over the tile rows (the
     * pattern repeats, so a bounded scan finds it). */
    int rows = 1;
    for (int a = 0; a < 4096; a++) {
        long y0 = (long)a * stride;
        int n = (int)((y0 + in->tile - 1) / bh - y0 / bh + 1);
        if (n > rows) rows = n;
    }
    size_t need = blocks_x * (size_t)rows * (size_t)bw * (size_t)bh * (size_t)in->bands *
                  tw_dtype_size(in->dtype);
    need *= (size_t)readers; /* each reader works on its own tile row */
    need += need / 8;        /* GDAL's per-block bookkeeping */
    if (need < 4 * MIB) need = 4 * MIB;
    return need < cap ? need : cap;
}

static size_t total_for(const tw_budget_in *in, int batch, tw_budget *b)
{
    b->batch = batch;
    b->readers = in->readers > 0 ? in->readers : 1;
    /* one per reader, normalize, infer (two with a backend that overlaps
     * batches: infer_begin/infer_end), write */
    b->n_slots = b->readers + 3 + (tw_backend_overlaps(in->backend) ? 1 : 0);
    b->ref_capacity = tw_budget_ref_capacity(batch);
    b->slot_bytes = tw_budget_slot_bytes(in, batch, b->ref_capacity);
    b->slots = b->slot_bytes * (size_t)b->n_slots;
    b->read_strip_w = read_strip_w_for(in, batch);
    b->read = (size_t)b->readers *
              (tw_raster_strip_bytes(b->read_strip_w, in->tile, in->bands, in->dtype, in->mask) +
               (size_t)batch * (sizeof(int) + 2 * sizeof(int64_t)));
    b->workspace =
        in->seg ? in->backend->i->seg_workspace_bytes(in->backend->ctx, in->seg, in->tile, batch)
                : in->backend->i->workspace_bytes(in->backend->ctx, in->net, in->tile, batch,
                                                  in->precision);
    b->weights = in->weights;
    b->strip = in->strip;
    b->polygons = in->polygons;
    b->base = in->base;
    b->margin = TW_BUDGET_MARGIN;
    size_t kept = in->weights_consumed ? 0 : b->weights; /* through the run */
    b->weights_kept = kept;
    size_t fixed = b->base + kept + b->strip + b->polygons + b->margin;
    size_t cap = in->total > fixed ? (in->total - fixed) / 4 : 4 * MIB;
    b->gdal_cache = gdal_cache_for(in, b->readers, cap);
    b->gdal_cache_expected = in->vrt && b->gdal_cache > 4 * MIB ? 4 * MIB : b->gdal_cache;
    /* the model load comes first: the file's tensors and the folded net */
    size_t load = 2 * b->weights;
    size_t run = kept + b->slots + b->read + b->workspace;
    size_t worst = run + b->gdal_cache, expected = run + b->gdal_cache_expected;
    b->total = b->base + b->strip + b->polygons + b->margin + (worst > load ? worst : load);
    b->estimate =
        b->base + b->strip + b->polygons + b->margin + (expected > load ? expected : load);
    return b->total;
}

tw_status tw_budget_plan(const tw_budget_in *in, tw_budget *out, tw_error *err)
{
    char need[32], have[32];
    memset(out, 0, sizeof *out);
    if (in->fixed_batch > 0) {
        char items[512];
        if (total_for(in, in->fixed_batch, out) > in->total)
            return tw_error_set(err, TW_ERR_NOMEM,
                                "runtime.memory %s is too small for tiling.batch %d: it needs "
                                "about %s (%s; use batch: auto or a larger budget)",
                                tw_format_bytes(in->total, have, sizeof have), in->fixed_batch,
                                tw_format_bytes(out->total, need, sizeof need),
                                tw_budget_breakdown(out, true, items, sizeof items));
        return TW_OK;
    }
    if (total_for(in, 1, out) > in->total) {
        char items[512];
        return tw_error_set(err, TW_ERR_NOMEM,
                            "runtime.memory %s is too small: even batch 1 needs about %s (%s)",
                            tw_format_bytes(in->total, have, sizeof have),
                            tw_format_bytes(out->total, need, sizeof need),
                            tw_budget_breakdown(out, true, items, sizeof items));
    }
    /* Largest power-of-two-ish batch that fits: bisection over [1, max]. */
    int lo = 1, hi = in->max_auto_batch > 0 ? in->max_auto_batch : 64;
    tw_budget tmp;
    if (total_for(in, hi, &tmp) <= in->total) {
        *out = tmp;
        return TW_OK;
    }
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (total_for(in, mid, &tmp) <= in->total)
            lo = mid;
        else
            hi = mid;
    }
    total_for(in, lo, out);
    return TW_OK;
}

const char *tw_format_bytes(size_t bytes, char *buf, size_t size)
{
    if (bytes >= ((size_t)1 << 30))
        snprintf(buf, size, "%.2f GiB", bytes / (double)((size_t)1 << 30));
    else if (bytes >= MIB)
        snprintf(buf, size, "%.1f MiB", bytes / (double)MIB);
    else if (bytes >= 1024) /* not "0.0 MiB" for a small output */
        snprintf(buf, size, "%.1f KiB", bytes / 1024.0);
    else
        snprintf(buf, size, "%zu bytes", bytes);
    return buf;
}

const char *tw_budget_breakdown(const tw_budget *b, bool worst, char *buf, size_t size)
{
    /* The same sum as total_for: the larger of the run and the model load. */
    size_t cache = worst ? b->gdal_cache : b->gdal_cache_expected;
    size_t run = b->weights_kept + b->slots + b->read + b->workspace + cache;
    size_t load = 2 * b->weights;
    struct {
        const char *name;
        size_t bytes;
    } it[11];
    int n = 0;
    it[n].name = "base (code and libraries)", it[n++].bytes = b->base;
    if (load > run) {
        it[n].name = "model load (file + folded weights)", it[n++].bytes = load;
    } else {
        if (b->weights_kept) it[n].name = "weights", it[n++].bytes = b->weights_kept;
        it[n].name = "slots", it[n++].bytes = b->slots;
        if (b->read) it[n].name = "readers", it[n++].bytes = b->read;
        it[n].name = "workspace", it[n++].bytes = b->workspace;
        it[n].name = "GDAL cache", it[n++].bytes = cache;
    }
    it[n].name = "strip", it[n++].bytes = b->strip;
    if (b->polygons) it[n].name = "polygons", it[n++].bytes = b->polygons;
    it[n].name = "margin (allocator, GDAL, threads, JIT code)", it[n++].bytes = b->margin;
    /* Tenths of MiB, largest remainders first, so the shown items add up
     * to the shown total. */
    size_t total = 0;
    for (int i = 0; i < n; i++) total += it[i].bytes;
    const double unit = (double)MIB / 10.0;
    long long shown[11], want = (long long)(total / unit + 0.5), sum = 0;
    double rem[11];
    for (int i = 0; i < n; i++) {
        shown[i] = (long long)(it[i].bytes / unit);
        rem[i] = it[i].bytes / unit - (double)shown[i];
        sum += shown[i];
    }
    while (sum < want) {
        int best = 0;
        for (int i = 1; i < n; i++)
            if (rem[i] > rem[best]) best = i;
        shown[best]++;
        rem[best] = -1.0;
        sum++;
    }
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < n; i++) {
        int w = snprintf(buf + used, size - used, "%s%s %lld.%lld MiB", i ? " + " : "", it[i].name,
                         shown[i] / 10, shown[i] % 10);
        if (w < 0 || (size_t)w >= size - used) return buf;
        used += (size_t)w;
    }
    snprintf(buf + used, size - used, " = %lld.%lld MiB", sum / 10, sum % 10);
    return buf;
}

size_t tw_budget_assembly_room(const tw_budget *b, size_t total)
{
    size_t fixed = b->base + b->weights_kept + b->workspace + b->margin + b->gdal_cache;
    return total > fixed ? total - fixed : 0;
}

static size_t status_kib(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    size_t kib = 0, n = strlen(key);
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, n) == 0) {
            sscanf(line + n, " %zu", &kib);
            break;
        }
    }
    fclose(f);
    return kib * 1024;
}

size_t tw_rss_now(void)
{
    return status_kib("VmRSS:");
}
size_t tw_rss_peak(void)
{
    return status_kib("VmHWM:");
}

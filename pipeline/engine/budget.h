/* budget.h - one memory budget for the whole run, fixed at start-up.
 *
 * Peak memory = base (TW_BUDGET_BASE: the code and libraries a run needs) +
 * output strip + margin + the larger of the model load (the file's tensors
 * and the folded weights side by side: twice the weights) and the run
 * (slots x slot size + the readers' strips + backend workspace + GDAL block
 * cache, + the weights unless the backend consumes them in reserve). Raster size enters only
 * through the strip (one band of output rows)
 * and the GDAL cache (one row of blocks, capped). batch: auto is the largest
 * batch whose total fits; an explicit batch that does not fit, or a budget
 * too small for batch 1, is refused before any work with the number needed.
 */
#ifndef TW_BUDGET_H
#define TW_BUDGET_H

#include <stdbool.h>
#include <stddef.h>

#include "io/input/raster.h"
#include "model/backend.h"
#include "core/error.h"
#include "pipeline/engine/plan.h"

/* The run's base: the code and the libraries' state a run needs (GDAL,
 * oneDNN, HDF5), as the CLI's RSS before a run measures it (37 MiB on
 * x86-64, GDAL 3.6), rounded up. A constant, not the host process's RSS:
 * runtime.memory is the run's own budget, so a library session (Python,
 * QGIS) that already holds memory of its own gets the CLI's batch for the
 * same workflow (before, its RSS counted as base: a smaller batch, or a
 * refusal where the CLI runs). */
#define TW_BUDGET_BASE ((size_t)40 << 20)

/* What tw_alloc does not see: allocator slack, GDAL datasets, HDF5,
 * threads' stacks, oneDNN's JIT-compiled kernels. Measured: peak RSS -
 * base - tw_alloc's peak = 16-17 MiB for ResNet-18/50 on the CPU
 * (bench/RESULTS.md, "Bounded memory"). */
#define TW_BUDGET_MARGIN ((size_t)16 << 20)

typedef struct tw_budget_in {
    size_t total;          /* runtime.memory */
    size_t base;           /* TW_BUDGET_BASE (tests give others) */
    size_t weights;        /* folded weights on the host */
    bool weights_consumed; /* freed by the backend's reserve (consumes_weights) */
    const tw_backend *backend;
    const tw_resnet *net; /* a classifier, or */
    const tw_segnet *seg; /* a segmentation model: per-pixel probabilities in the slots */
    tw_precision precision;
    int tile, stride, bands;
    tw_dtype dtype;
    int n_classes, feat_dim;
    bool want_emb;
    int fixed_batch;      /* 0: auto */
    int max_auto_batch;   /* upper bound for auto */
    int raster_w;         /* widest input, pixels */
    int block_w, block_h; /* its natural block */
    size_t strip;         /* stitcher + writer row buffers */
    bool vrt;             /* a VRT reads through to its sources: its own
                             blocks never enter the GDAL cache */
    int readers;          /* reader workers, >= 1 (runtime.readers resolved) */
    bool mask;            /* some input has a mask band (read strips hold it too) */
    size_t polygons;      /* products: [polygons]: what the assembly needs beside its
                             regions (io/output/polygons.h, tw_polygons_memory of no region);
                             the regions take what the budget leaves, checked at
                             assembly */
} tw_budget_in;

typedef struct tw_budget {
    int batch;   /* tiles per batch slot */
    int n_slots; /* one per reader, one each for normalize, infer (two when the
                    backend overlaps batches) and write */
    int readers;
    int read_strip_w;  /* widest window one read takes (pixels; T rows) */
    size_t read;       /* the readers' strips, all of them */
    int ref_capacity;  /* tile refs per slot (kept + skipped tiles) */
    size_t slot_bytes; /* one slot */
    size_t slots;      /* all slots */
    size_t workspace;  /* backend */
    size_t weights;
    size_t strip;
    size_t polygons;            /* the polygons' rows (tw_budget_in.polygons) */
    size_t gdal_cache;          /* GDAL_CACHEMAX set for the run */
    size_t gdal_cache_expected; /* what the reads are expected to fill of it */
    size_t base;
    size_t margin;       /* allocator slack, GDAL datasets, HDF5, threads, JIT code */
    size_t total;        /* worst case, must fit runtime.memory */
    size_t estimate;     /* expected peak (total with the expected GDAL cache) */
    size_t weights_kept; /* weights held through the run (0: the backend consumed them) */
} tw_budget;

/* Bytes of one batch slot for `batch` tiles. */
size_t tw_budget_slot_bytes(const tw_budget_in *in, int batch, int ref_capacity);

/* Tile refs a slot of `batch` tiles holds (tw_budget.ref_capacity): the
 * budget's rule, and the run's when the backend lowers the batch. */
int tw_budget_ref_capacity(int batch);

/* Fit the run into in->total. TW_ERR_NOMEM with the bytes needed when even
 * batch 1 does not fit (or the fixed batch does not). */
tw_status tw_budget_plan(const tw_budget_in *in, tw_budget *out, tw_error *err);

/* "1.5 GiB", "512.0 MiB" into buf. Returns buf. */
const char *tw_format_bytes(size_t bytes, char *buf, size_t size);

/* The items of b->total (worst) or b->estimate (!worst) as text,
 * "base 36.3 MiB + weights 2.7 MiB + ... = 90.3 MiB", every item that
 * counts and nothing else, rounded so that the shown items add up to the
 * shown total. Returns buf. */
const char *tw_budget_breakdown(const tw_budget *b, bool worst, char *buf, size_t size);

/* What the assembly of products (polygons' regions) may take of total
 * (runtime.memory) beside b's fixed items: base, the weights kept, the
 * backend's workspace, the margin and the GDAL cache (the slots, readers
 * and strip are released by then); 0 when they fill it. The same number
 * for validate and the run. */
size_t tw_budget_assembly_room(const tw_budget *b, size_t total);

/* Resident set size of this process now, and its peak (VmHWM), in bytes. */
size_t tw_rss_now(void);
size_t tw_rss_peak(void);

#endif

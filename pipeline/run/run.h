/* run.h - the run driver: a workflow's params in, output rasters and a report out.
 *
 * tw_run loads the model once, checks every input against it before any
 * work, fixes the memory budget, then for each input runs four stage workers
 * joined by bounded queues of preallocated batch slots:
 *
 *   read (GDAL windows, nodata mask) -> normalize (OpenMP) -> infer (backend)
 *        -> stitch + write (strip buffer, output rasters, tile table)
 *
 * Slots circulate through a free queue, so nothing is allocated once the
 * first batch is under way. Errors stop every stage; outputs of an input that
 * did not finish are removed (they only ever exist under temporary names).
 */
#ifndef TW_RUN_H
#define TW_RUN_H

#include <signal.h>
#include <stdint.h>
#include <stdatomic.h>
#include <stdio.h>

#include "model/backend.h"
#include "pipeline/engine/budget.h"
#include "core/alloc.h"
#include "core/error.h"
#include "pipeline/run/advice.h"
#include "core/params.h"
#include "pipeline/resolved.h"

/* GDAL-style progress: complete in [0, 1]; return 0 to cancel the run. */
typedef int (*tw_progress_fn)(double complete, const char *message, void *user);
/* Tile counts of the input under way (message = its path), called just
 * before each progress call: tiles looked at so far and in all, this run's
 * share (its shard, less the rows an earlier run committed). */
typedef void (*tw_tiles_fn)(int64_t done, int64_t total, const char *message, void *user);

typedef struct tw_run_hooks {
    tw_progress_fn progress; /* may be NULL */
    void *progress_user;     /* for progress and tiles */
    tw_tiles_fn tiles;       /* may be NULL */
    /* May be NULL; non-zero: stop at the next claim/commit point (resumable).
     * Set from a signal handler (a volatile sig_atomic_t is what C lets a
     * handler store to; __atomic_store_n keeps that store race-free) or from
     * another thread; the stage threads only read it, with an atomic load.
     * The public API's tilewise_run_options.stop is this pointer. */
    const volatile sig_atomic_t *stop;
    tw_log log; /* notices and warnings (log.fn NULL: dropped) */
} tw_run_hooks;

enum { TW_STAGE_READ = 0, TW_STAGE_NORMALIZE, TW_STAGE_INFER, TW_STAGE_WRITE, TW_STAGE_COUNT };

typedef struct tw_stage_stats {
    double busy_s; /* working (wall seconds, summed over the stage's workers) */
    double wait_s; /* blocked on its queues */
    double cpu_s;  /* CPU time of the stage's threads (not of the threads
                      its library calls start, such as OpenMP's) */
} tw_stage_stats;

typedef struct tw_input_result {
    char path[TW_PATH_MAX];
    char stem[256];
    int width, height, grid_w, grid_h;
    int64_t tiles_total; /* tiles this shard had to look at */
    int64_t tiles_classified;
    int64_t tiles_nodata;      /* skipped: above max_nodata_fraction */
    int64_t tiles_read_errors; /* unreadable, made nodata (on_error: skip) */
    int64_t tiles_outside_aoi; /* not computed: outside input.aoi (nodata) */
    double seconds;
    tw_stage_stats stage[TW_STAGE_COUNT];
    int64_t hist[TW_MAX_CLASSES]; /* output cells per argmax class */
    int64_t nodata_cells;
    int64_t valid_unclassified;   /* output.resolution: input: pixels valid in the input that no
                                     classified tile covers (nodata in the products) */
    uint64_t steady_state_allocs; /* tw_alloc calls after the first rows were written */
    int rows_resumed;             /* output rows committed by an earlier, interrupted run */
    char reader[16];              /* who decoded the pixels: "libtiff" or "gdal" */
    int read_workers;             /* reader workers (runtime.readers) */
    int64_t read_bytes;           /* raw pixel bytes the readers read (windows) */
    int64_t tiff_tiles_decoded;   /* TIFF tiles the libtiff reader decoded, summed
                                     over readers (-1: GDAL read the pixels) */
    char outputs[10][TW_PATH_MAX + 320]; /* files written (the products, then the STAC item) */
    int n_outputs;
    char stale[10][TW_PATH_MAX + 320]; /* product files of this name in output.dir that this run
                                          did not write (an earlier configuration's), kept */
    int n_stale;
    char skipped[512]; /* "" : run; else why it was skipped (input.on_error: skip) */
} tw_input_result;

typedef struct tw_run_result {
    tw_resolved model;
    char backend[16];
    tw_budget budget;
    tw_backend_stats backend_stats;
    int n_inputs;
    tw_input_result *inputs; /* [n_inputs] */
    double seconds;
    size_t peak_rss; /* the process's (VmHWM): in a process that runs other
                        things too, more than this run's */
    /* This run's allocator peaks per tag and in all ([TW_MEM_TAG_COUNT]):
     * its own blocks only (core/alloc.h, tw_mem_scope). */
    size_t mem_peak[TW_MEM_TAG_COUNT + 1];
    int64_t tiles_classified;
    int inputs_skipped; /* inputs not opened (input.on_error: skip); the CLI exits 5 */
    /* Every warning given before the first tile, in the order logged: the
     * output checks' (free disk space, skipped inputs) then advice.h's. */
    tw_advice advice;
} tw_run_result;

/* Run the workflow. *result (may be NULL to not ask) receives what happened,
 * also on failure (as far as it got); free it with tw_run_result_destroy.
 * Returns TW_CANCELLED when stopped through hooks (progress returned 0 or
 * *stop was set). */
tw_status tw_run(const tw_run_params *p, const tw_run_hooks *hooks, tw_run_result **result,
                 tw_error *err);

/* One input as tw_validate planned it. */
typedef struct tw_validation_input {
    char shown[2048];      /* the path, credentials redacted (url.h) */
    bool skipped;          /* not opened (input.on_error: skip) */
    char skip_reason[512]; /* why */
    int width, height, bands;
    tw_dtype dtype;
    int tiles_x, tiles_y; /* this shard's tile columns and rows */
    int64_t n_tiles;
    int tile, stride;
    int grid_w, grid_h;                    /* this shard's output cells */
    bool remote;                           /* some object is read over the network */
    int64_t remote_bytes, remote_requests; /* at least; -1: unknown (not a tiled COG) */
    int remote_row0, remote_row1;          /* the rows whose blocks are read */
    int64_t aoi_tiles, all_tiles;          /* tiles touching input.aoi (-1: no AOI) of all */
    uint64_t output_bytes;                 /* at most, on disk (uncompressed, parts included) */
    /* products: [polygons]: the class map's grid, the smallest region
     * output.min_area leaves (cells) and so the most regions it can hold */
    int polygons_grid_w, polygons_grid_h;
    double polygons_min_cells, polygons_most;
    int64_t polygons_fit; /* the regions (before the sieve) that fit at assembly */
    /* output.stac: the item's name and datetime (pipeline/report/stac_run.h) */
    char stem[256];
    char stac_datetime[64];
    char stac_source[48];                    /* where the datetime came from */
    char stac_derived_from[TW_PATH_MAX * 2]; /* the input's own STAC item, or "" */
} tw_validation_input;

/* What tw_validate found, as data: validate's listing is one rendering of
 * it (api/validate.c), the C API's accessors and Python's dict others. */
typedef struct tw_validation {
    char weights[TW_PATH_MAX]; /* model.weights */
    char aoi[TW_PATH_MAX];     /* input.aoi */
    int retries;               /* input.retries */
    char out_dir[TW_PATH_MAX]; /* output.dir */
    bool stac;                 /* output.stac */
    unsigned products;         /* output.products */
    tw_vector_format vector_format;
    size_t polygons_room; /* products: [polygons]: memory left at assembly (its rows and
                             the regions: tw_budget_assembly_room) */
    int stac_items;       /* items a run writes (inputs not skipped) */
    int shard_count;
    bool resolved; /* model, backend and precision below are set */
    tw_resolved model;
    char backend[16];
    tw_precision precision;
    int n_inputs; /* planned so far: all of them when planned */
    tw_validation_input inputs[TW_MAX_INPUTS];
    bool planned; /* every input planned: budget and checks hold */
    tw_budget budget;
    size_t memory; /* runtime.memory */
    /* Every warning a run would give before the first tile, in its order:
     * the output checks' (code "output": free disk space, an AOI that
     * touches no tile), then advice.h's warnings and notes. */
    tw_advice advice;
    int n_checks; /* the first n_checks items are the output checks' */
} tw_validation;

/* Check config, inputs and the model against each other and plan the run
 * (tile grid, batch, slots, memory estimate) into *v (cleared first; filled
 * as far as it got on error), without running the model; when planned, the
 * advice for its inputs (advice.h) too. Sets GDAL's block cache limit
 * (process-wide) to the budget's, as tw_run does, for the advice's reads:
 * callers that share the process restore it (api/validate.c). */
tw_status tw_validate(const tw_run_params *p, tw_validation *v, tw_error *err);

/* Load the model file and resolve what the run would use (bundle values,
 * config overrides, defaults: bands, scale, mean, std, classes, tile) into
 * *m, with the same checks and messages as tw_run; nothing else is opened.
 * For the CLI's extra validation. */
tw_status tw_resolve(const tw_run_params *p, tw_resolved *m, tw_error *err);
/* The same resolution for a model file the caller has loaded and built (the
 * public API keeps the net to classify tiles in memory). Borrows mf and net. */
tw_status tw_resolve_loaded(const tw_run_params *p, const tw_model_file *mf, const tw_resnet *net,
                            tw_resolved *m, tw_error *err);

/* What validate checks that does not depend on the machine: the model file
 * against the config, and every input against the model (opens, bands,
 * size). Not the device or the memory budget: `submit` calls it on a login
 * node for jobs that run elsewhere. Same errors and messages as tw_run. */
tw_status tw_check_inputs(const tw_run_params *p, tw_error *err);

/* `tilewise merge`: after sharded runs into out_dir, check that every
 * output row of every input is committed, then write the final products
 * (as the workflow asked: GTiff or COG, tile table) and remove the parts.
 * TW_ERR_INPUT naming the missing rows when a shard has not finished.
 * Merged already (no parts left, final products there): TW_OK and no input
 * in *result. */
tw_status tw_merge(const char *out_dir, bool quiet, tw_run_result **result, tw_error *err);
/* The same with a stop flag (NULL: none; the CLI's SIGINT/SIGTERM): once it
 * is set, no further input is assembled (the one under way finishes, its
 * parts removed as usual) and the merge returns TW_CANCELLED, the inputs
 * left still in their parts: the same merge again finishes them. */
tw_status tw_merge_ex(const char *out_dir, bool quiet, const volatile sig_atomic_t *stop,
                      tw_run_result **result, tw_error *err);

void tw_run_result_destroy(tw_run_result *r);

/* Reader workers a run uses: runtime.readers, or for auto: 1 with a backend
 * that normalizes on the host (the CPU: inference owns the cores), else the
 * cores less two (infer, write), 1..8. Cores: those the process may run on. */
int tw_run_readers(const tw_run_params *p, const tw_backend *be);

/* OpenMP threads of the normalize stage: with a backend that computes on
 * the host, the cores its runtime.threads leave, at least 1 (1: no team of
 * its own); else 0 (OpenMP's default). */
int tw_run_normalize_threads(const tw_run_params *p, const tw_backend *be);

/* run.json for params p and result r, as text: *json (NUL-terminated,
 * from tw_alloc: free it with tw_free) and its length. TW_ERR_NOMEM, or
 * TW_ERR_INTERNAL when it would be cut short; *json NULL then. */
tw_status tw_report_render(const tw_run_params *p, const tw_run_result *r, tw_status status,
                           const char *message, char **json, size_t *len, tw_error *err);
/* Write run.json for params p and result r to path (atomically: temp + rename). */
tw_status tw_report_write(const char *path, const tw_run_params *p, const tw_run_result *r,
                          tw_status status, const char *message, tw_error *err);
/* Append one line (a JSON object: UTC time, status, exit code, message,
 * shard, tiles classified, seconds, the report's path) for this attempt to
 * out_dir/.tilewise/attempts.jsonl, creating it. One write(2) with
 * O_APPEND, so that concurrent shards do not interleave lines. r may be
 * NULL (a run that failed before its result). TW_ERR_OUTPUT on failure. */
tw_status tw_report_log_attempt(const char *out_dir, const tw_run_params *p, const tw_run_result *r,
                                tw_status status, const char *message, const char *report_path,
                                tw_error *err);

/* The resolved configuration as a JSON object (for GDAL metadata: the keys
 * an output byte depends on, core/keys.h TW_KEY_BYTES, and the versions;
 * run.json's "config" has every key). Returns
 * the length it needed: size or more means it was cut (the run refuses to
 * go on with a cut one). TW_CONFIG_JSON_MAX (pipeline/resolved.h) holds any
 * configuration that params.h's limits allow. */
size_t tw_report_config_json(const tw_run_params *p, const tw_resolved *m, char *buf, size_t size);

#endif

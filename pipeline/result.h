/* result.h - what a run tells its caller, which the floors of pipeline/
 * fill in turn: as it goes (tw_run_hooks: progress, tile counts, the stop
 * flag, the log; the stages call them), per input (tw_input_result: the
 * stages' times and counts, the products written) and before the first
 * tile (tw_advice: advice.h's warnings and notes). The run's whole result,
 * tw_run_result, is pipeline/report/report.h's. Like resolved.h, on the
 * lowest floor of pipeline/: it includes core/ only.
 */
#ifndef TW_RESULT_H
#define TW_RESULT_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/error.h"
#include "core/params.h"

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

#define TW_ADVICE_MAX 64
#define TW_ADVICE_TEXT 640

typedef struct tw_advice_item {
    bool warning;              /* else a note */
    char code[24];             /* warnings: stable codes ("no_crs", "values", "padding", ...);
                                  notes: validate's column ("crs", "values", "reader") */
    int input;                 /* index into input.path */
    char text[TW_ADVICE_TEXT]; /* one line, the input named */
} tw_advice_item;

/* In the order validate lists them. */
typedef struct tw_advice {
    int n, n_warnings;
    tw_advice_item items[TW_ADVICE_MAX];
} tw_advice;

#endif

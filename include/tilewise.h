/* tilewise.h - the public C API of tilewise (libtilewise.so, pkg-config tilewise).
 *
 * What it offers, over the same code the `tilewise` command runs:
 *   - run a workflow (a YAML file, or YAML text in memory) with `key.path=value`
 *     overrides, a GDALProgressFunc-shaped progress callback that can cancel,
 *     and a log callback; get the run report (run.json) back as JSON text;
 *   - open a model file, describe it (JSON), and classify tiles already in
 *     memory (raw pixels of any GDAL data type, optional nodata value and
 *     validity mask) into probabilities and embeddings, in batches that fit a
 *     memory budget, with the backend and normalization a run would use.
 *
 * Conventions (the same as inside tilewise):
 *   - Handles are opaque; every open/run call that returns one has a matching
 *     close/free call that accepts NULL and cannot fail.
 *   - Fallible calls return a tilewise_status (0 ok, TILEWISE_CANCELLED when a
 *     callback asked to stop, negative on error) and, when err is not NULL,
 *     fill *err with the status, its exit-code class and a one-line message.
 *     No environment variable is read by the library (GDAL and OpenMP read
 *     their own). A run's notices and warnings (a CPU fallback, a lowered
 *     batch, an unreadable tile skipped) go to its log callback, and are
 *     dropped without one or with "run.quiet=true"; the one message still
 *     written on stderr is an earlier run's parts being discarded (parts.c).
 *   - Strings returned as `const char *` are borrowed: they stay valid until
 *     the handle they came from is closed or freed.
 *   - A handle may be used by one thread at a time; distinct handles may be
 *     used from distinct threads.
 *
 * ABI: the soname is libtilewise.so.0; only functions and types named
 * tilewise_* / TILEWISE_* are exported. Structs passed in carry no pointers to
 * internal types and do not change layout with build options.
 */
#ifndef TILEWISE_H
#define TILEWISE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TILEWISE_API_VERSION 1

/* Status codes: the same values as the library's internal ones. */
typedef enum tilewise_status {
    TILEWISE_OK = 0,
    TILEWISE_CANCELLED = 1,     /* stopped on request; a rerun resumes (exit class "interrupted") */
    TILEWISE_ERR_USAGE = -1,    /* bad argument */
    TILEWISE_ERR_CONFIG = -2,   /* workflow: syntax, unknown key, type, range */
    TILEWISE_ERR_INPUT = -3,    /* raster unreadable or not fitting the model; bad pixels given */
    TILEWISE_ERR_MODEL = -4,    /* model file unreadable, inconsistent or unsupported */
    TILEWISE_ERR_OUTPUT = -5,   /* output cannot be written */
    TILEWISE_ERR_NOMEM = -6,    /* memory budget too small, allocation failed */
    TILEWISE_ERR_DEVICE = -7,   /* GPU missing or failing */
    TILEWISE_ERR_INTERNAL = -8, /* a bug: please report */
    TILEWISE_ERR_PARTS = -10,   /* output dir holds parts of another configuration: refused */
    TILEWISE_ERR_LOCKED = -11,  /* another process runs the same shard of the same output */
} tilewise_status;

#define TILEWISE_MESSAGE_MAX 1024

/* What went wrong. exit_code is what the `tilewise` command would exit with
 * (README: 1 internal, 2 usage/config, 3 input/model, 4 resource, 75
 * interrupted); exit_class names it ("ok", "internal", "usage", "input",
 * "resource", "interrupted"). */
typedef struct tilewise_error {
    int status; /* a tilewise_status */
    int exit_code;
    char exit_class[16];
    char message[TILEWISE_MESSAGE_MAX]; /* one line, no trailing newline */
} tilewise_error;

/* Short name of a status ("config error", ...). Never NULL; static storage. */
const char *tilewise_status_name(int status);
/* The exit code the CLI uses for status (0 for TILEWISE_OK). */
int tilewise_exit_code(int status);
/* "MAJOR.MINOR.PATCH" of the library. Static storage. */
const char *tilewise_version(void);

/* Progress, shaped like GDALProgressFunc: complete in [0, 1], message = the
 * input under way. Return 0 to cancel: the run stops at its next commit point
 * and returns TILEWISE_CANCELLED; running the same workflow again resumes.
 * Called from a worker thread of the run. */
typedef int (*tilewise_progress_fn)(double complete, const char *message, void *user);

enum { TILEWISE_LOG_INFO = 0, TILEWISE_LOG_WARNING = 1 };
/* Messages of a run (one line, no newline): notices (what was chosen for
 * the user: a fallback, a lowered batch) and the per-input summary at the
 * end as INFO; warnings (something to look at: an unreadable tile skipped,
 * the run interrupted) as WARNING. May be called from the run's worker
 * threads, possibly from two at once: make it thread-safe. */
typedef void (*tilewise_log_fn)(int level, const char *message, void *user);

/* ---- running workflows ---- */

typedef struct tilewise_report tilewise_report;

/* Run the workflow file `path` (YAML, as `tilewise run` reads it) with the
 * overrides sets[0..n_sets) of the form "key.path=value" (YAML values:
 * "tiling.stride=32", "output.products=[class]"). Relative paths in the file
 * are taken relative to the current directory, as the CLI does. Besides the
 * workflow keys, the overrides take the command line's run options:
 * "run.shard=I/N" (1-based, as --shard), "run.chunk_rows=N" (--chunk-rows),
 * "run.report=PATH" (--report), "run.quiet=true" (no notices on stderr).
 * progress and log may be NULL; user is passed to both.
 * *report (when report is not NULL) receives the run report, also on failure
 * as far as the run got (NULL when the workflow could not be read); free it
 * with tilewise_report_free. The report is also written to
 * OUTPUT_DIR/run.json (run.shardIIII-of-NNNN.json for a shard), as the CLI
 * writes it. Returns TILEWISE_OK,
 * TILEWISE_CANCELLED (progress returned 0; resumable) or an error. */
tilewise_status tilewise_run_file(const char *path, const char *const *sets, int n_sets,
                                  tilewise_progress_fn progress, tilewise_log_fn log, void *user,
                                  tilewise_report **report, tilewise_error *err);

/* Same, from YAML text in memory (len bytes; name is used in messages, e.g.
 * "<memory>"). */
tilewise_status tilewise_run_yaml(const char *name, const char *yaml, size_t len,
                                  const char *const *sets, int n_sets,
                                  tilewise_progress_fn progress, tilewise_log_fn log, void *user,
                                  tilewise_report **report, tilewise_error *err);

/* The report as JSON text (the bytes of run.json). Borrowed until
 * tilewise_report_free. */
const char *tilewise_report_json(const tilewise_report *r);
/* Where run.json was written ("" when the output folder did not exist). */
const char *tilewise_report_path(const tilewise_report *r);
void tilewise_report_free(tilewise_report *r);

/* ---- models and in-memory tiles ---- */

typedef struct tilewise_model tilewise_model;

/* Open a model file (HDF5 bundle or safetensors) as a run would, with
 * workflow overrides sets[0..n_sets) for what concerns the model and its
 * inputs: "runtime.device=cpu", "runtime.precision=fp32", "runtime.memory=1GiB",
 * "runtime.threads=2", "tiling.tile=64", "tiling.batch=16",
 * "tiling.max_nodata_fraction=0.5", "input.scale=0.0001", "input.nodata=0",
 * "model.mean=[...]", "model.std=[...]", "model.classes=[...]", "model.arch=resnet18".
 * The backend is created now; its memory is reserved at the first classify.
 * On success *out must be closed with tilewise_model_close. */
tilewise_status tilewise_model_open(const char *path, const char *const *sets, int n_sets,
                                    tilewise_model **out, tilewise_error *err);
void tilewise_model_close(tilewise_model *m);

/* The model as JSON: {"path","arch","bands","in_bands","classes":[...],
 * "n_classes","feature_dim","tile","stride","scale","mean":[...],"std":[...],
 * "sha256","backend","batch","memory"}. Borrowed until close. */
const char *tilewise_model_info_json(const tilewise_model *m);
int tilewise_model_bands(const tilewise_model *m);       /* input bands the net takes */
int tilewise_model_classes(const tilewise_model *m);     /* K */
int tilewise_model_feature_dim(const tilewise_model *m); /* F, length of an embedding */
int tilewise_model_tile(const tilewise_model *m);        /* the tile size a run would use */
/* Name of class c (0 <= c < K), NULL outside. Borrowed until close. */
const char *tilewise_model_class_name(const tilewise_model *m, int c);

/* Pixel data types; the values are GDAL's GDALDataType values. */
typedef enum tilewise_dtype {
    TILEWISE_DT_BYTE = 1,
    TILEWISE_DT_UINT16 = 2,
    TILEWISE_DT_INT16 = 3,
    TILEWISE_DT_UINT32 = 4,
    TILEWISE_DT_INT32 = 5,
    TILEWISE_DT_FLOAT32 = 6,
    TILEWISE_DT_FLOAT64 = 7,
    TILEWISE_DT_INT8 = 14,
} tilewise_dtype;

/* n tiles of raw pixels, C order [n][bands][size][size] of dtype, as read from
 * a raster (the model's normalization is applied inside: scale, mean, std).
 *   valid   [n][size][size]: 0 = nodata, 2 = outside the image (padding of
 *           an edge tile: invalid, but not counted as nodata), any other
 *           value = valid; may be NULL (all valid)
 *   use_nodata: non-zero: pixels where any band equals nodata (as the dtype
 *           holds it) are nodata too; float NaN/Inf are always nodata
 * Invalid pixels become 0 after normalization, as in a run. A tile whose
 * nodata share of its inside pixels exceeds tiling.max_nodata_fraction (or
 * that has no valid pixel) is not classified, as in a run: its probabilities
 * and embedding are NaN. */
typedef struct tilewise_tiles {
    const void *pixels;
    int dtype; /* a tilewise_dtype */
    int n, bands, size;
    const uint8_t *valid;
    int use_nodata;
    double nodata;
} tilewise_tiles;

/* Classify tiles: probs [n][K] (softmax), emb [n][F] (pooled features; may
 * be NULL). Works in batches sized from runtime.memory; the first call (and a
 * call with another tile size) reserves the backend's memory. Results equal a
 * run's for the same tiles (same backend, precision and normalization).
 * Errors: TILEWISE_ERR_USAGE for a bad argument (wrong band count, dtype,
 * size below 32), TILEWISE_ERR_NOMEM when not even one tile fits. */
tilewise_status tilewise_model_classify(tilewise_model *m, const tilewise_tiles *tiles,
                                        float *probs, float *emb, tilewise_error *err);

#ifdef __cplusplus
}
#endif

#endif

/* tilewise.h - the public C API of tilewise (libtilewise.so, pkg-config tilewise).
 *
 * What it offers, over the same code the `tilewise` command runs (the
 * command is itself a client of this header):
 *   - run a workflow (a YAML file, or YAML text in memory) with `key.path=value`
 *     overrides, a GDALProgressFunc-shaped progress callback that can cancel,
 *     a tiles callback, a log callback and a stop flag a signal handler may
 *     set, with the command line's options; get the run report (run.json)
 *     back as JSON text and as summaries; merge shards; validate a workflow
 *     (its advice as data); describe a raster or a model file;
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
 *     dropped without one; quiet (run.quiet=true) drops the notices.
 *     Nothing is written on stdout or stderr (but a failed internal
 *     assertion's last line).
 *   - Strings returned as `const char *` are borrowed: they stay valid until
 *     the handle they came from is closed or freed.
 *   - A handle may be used by one thread at a time; distinct handles may be
 *     used from distinct threads, and two runs may run at once on two
 *     threads: each writes the bytes it writes alone, and its report's
 *     allocator figures (memory.allocator_peak, steady_state_allocs) are its
 *     own. Process-wide stay: GDAL's block cache limit (the last run to
 *     start sets it), GDAL's HTTP retry and read-ahead options while a run
 *     reads remote inputs (GDAL 3.6 has no per-path options for /vsicurl/:
 *     runs reading at once share them, the last to start sets the retries,
 *     and the last to end puts back what was there before), and
 *     peak_rss_bytes (the process's VmHWM). Callbacks run on the run's
 *     worker threads.
 *   - runtime.memory is the run's own budget: it counts a fixed base for
 *     the code and libraries (40 MiB, the CLI's size before a run) and what
 *     the run allocates, never the host process's size, so a Python or
 *     QGIS session that already holds memory gets the CLI's batch: auto
 *     and the same refusals for the same workflow.
 *     The only thing a signal handler may do with this API is store to a
 *     run's stop flag (tilewise_run_options.stop).
 *
 * ABI: the soname is libtilewise.so.0; only functions and types named
 * tilewise_* / TILEWISE_* are exported. Structs passed in carry no pointers to
 * internal types and do not change layout with build options.
 */
#ifndef TILEWISE_H
#define TILEWISE_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Version 2 adds, with every version 1 call unchanged: tilewise_run (one
 * entry for a file or YAML text, taking a tilewise_run_options: a tiles
 * callback, a graceful stop flag, the command line's run options and
 * tuning knobs), tilewise_run_options_init, tilewise_run_options_set,
 * tilewise_report_summary and tilewise_report_input (the run's numbers
 * without parsing JSON), tilewise_merge, tilewise_validate (the plan and
 * advice, warnings as data), tilewise_info (a raster or a model file
 * described), tilewise_config_set (the CLI's --config), tilewise_api_version
 * and TILEWISE_ERR_REMOTE. The `tilewise` command runs its run, merge,
 * validate and info commands through these.
 * Version 3 adds tilewise_run_options.strict (and run.strict=true).
 * Version 4 adds the validation as data (tilewise_validation_plan,
 * tilewise_validation_input, tilewise_validation_warning_code), the exit
 * codes by name (TILEWISE_EXIT_*), tilewise_redact, and tilewise_info's
 * TILEWISE_ERR_REMOTE for a remote raster that could not be reached (an
 * outage; version 3 returned TILEWISE_ERR_INPUT),
 * tilewise_model_classify_image (an image through the run's tiling and
 * stitching) and tilewise_check (submit's check on a login node); the
 * CUDA test hook cuda_fail_alloc_above left the API (its place is
 * reserved_v2, ignored; bench/run_hooked sets the hook).
 * Version 5 adds tilewise_run_options.shard_from (run.json's "sharding"). */
#define TILEWISE_API_VERSION 5

/* The most output rows per committed chunk (tilewise_run_options.chunk_rows,
 * run.chunk_rows, --chunk-rows). Version 4. */
#define TILEWISE_CHUNK_ROWS_MAX 1000000

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
    TILEWISE_ERR_REMOTE = -9,   /* a remote input unreachable after its retries (version 2
                                   names it; version 1 returned it without a name) */
    TILEWISE_ERR_PARTS = -10,   /* output dir holds parts of another configuration: refused */
    TILEWISE_ERR_LOCKED =
        -11, /* another run (process or thread) has the same shard of the same output */
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

/* The `tilewise` command's exit codes (README "Exit codes"; version 4
 * names them): tilewise_exit_code maps a status onto them. */
enum {
    TILEWISE_EXIT_OK = 0,
    TILEWISE_EXIT_INTERNAL = 1,
    TILEWISE_EXIT_USAGE = 2,    /* command line or workflow file */
    TILEWISE_EXIT_INPUT = 3,    /* bad raster or model */
    TILEWISE_EXIT_RESOURCE = 4, /* memory, disk, device, output not writable, network outage */
    TILEWISE_EXIT_SKIPPED = 5,  /* finished, but inputs were skipped (input.on_error: skip) */
    TILEWISE_EXIT_PARTS = 6,    /* parts of another configuration in output.dir: refused */
    TILEWISE_EXIT_LOCKED =
        7, /* another run (process or thread) has the same shard of the same output */
    TILEWISE_EXIT_INTERRUPTED = 75, /* interrupted, resumable: run the same command again */
};

/* Copy text into out[size] (NUL-terminated, cut to fit) with the secrets
 * of any URL in it replaced by "REDACTED", as the library's own messages
 * have them: presigned-URL signatures and tokens, user:password@. For what
 * a caller prints that did not come from the library (an input's path as
 * the user gave it). Safe on any text; thread-safe. Version 4. */
void tilewise_redact(const char *text, char *out, size_t size);

/* Short name of a status ("config error", ...). Never NULL; static storage. */
const char *tilewise_status_name(int status);
/* The exit code the CLI uses for status (0 for TILEWISE_OK). */
int tilewise_exit_code(int status);
/* "MAJOR.MINOR.PATCH" of the library. Static storage. */
const char *tilewise_version(void);
/* TILEWISE_API_VERSION of the library loaded (it may be newer than the
 * header a program was compiled with, never older than what it links). */
int tilewise_api_version(void);

/* Progress, shaped like GDALProgressFunc: complete in [0, 1], message = the
 * input under way. Return 0 to cancel: the run stops at its next commit point
 * and returns TILEWISE_CANCELLED; running the same workflow again resumes.
 * Called from a worker thread of the run. */
typedef int (*tilewise_progress_fn)(double complete, const char *message, void *user);

enum { TILEWISE_LOG_INFO = 0, TILEWISE_LOG_WARNING = 1 };
/* Messages of a run (one line, no newline): notices (what was chosen for
 * the user: a fallback, a lowered batch) as INFO; warnings (something to
 * look at: an unreadable tile skipped, an input skipped) as WARNING; with
 * tilewise_run_file/_yaml (or log_summary) also the per-input summary at the
 * end as INFO and an interruption as WARNING. May be called from the run's
 * worker threads, possibly from two at once: make it thread-safe. */
typedef void (*tilewise_log_fn)(int level, const char *message, void *user);

/* A GDAL configuration option for this process, as `tilewise --config KEY
 * VALUE` and GDAL's tools take it (CPLSetConfigOption): AWS_PROFILE,
 * GDAL_HTTP_TIMEOUT, GDAL_HTTP_MAX_RETRY, ... for remote inputs. value NULL unsets it. Call it
 * before a run, not while one runs. TILEWISE_ERR_USAGE for a NULL or empty key. */
tilewise_status tilewise_config_set(const char *key, const char *value, tilewise_error *err);

/* ---- running workflows ---- */

typedef struct tilewise_report tilewise_report;

/* Version 1 (kept; new code may prefer tilewise_run below, which they now
 * call). Run the workflow file `path` (YAML, as `tilewise run` reads it) with the
 * overrides sets[0..n_sets) of the form "key.path=value" (YAML values:
 * "tiling.stride=32", "output.products=[class]"). Relative paths in the file
 * are taken relative to the current directory, as the CLI does. Besides the
 * workflow keys, the overrides take the command line's run options:
 * "run.shard=I/N" (1-based, as --shard), "run.chunk_rows=N" (--chunk-rows),
 * "run.report=PATH" (--report), "run.quiet=true" (no notices), "run.restart=true"
 * (--restart; version 2).
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

/* ---- running workflows: version 2 ---- */

/* Tile counts of the input under way (input: its path, as progress's
 * message): tiles looked at so far and in all, this run's share (its shard,
 * less the output rows an earlier run committed). Called from a worker
 * thread of the run: at the start of each input (done 0) and after each
 * batch, just before progress. When an input finishes, done == total ==
 * its tiles_total (tilewise_input_summary, run.json). */
typedef void (*tilewise_tiles_fn)(int64_t done, int64_t total, const char *input, void *user);

/* How to run a workflow. Fill it with tilewise_run_options_init, then set
 * what you need; fields added by later versions come after these, and the
 * library reads only the first `size` bytes, so a program compiled against
 * this header keeps working with a newer library. Nothing in it is kept
 * after tilewise_run returns; the pointers must stay valid until then. */
typedef struct tilewise_run_options {
    size_t size; /* sizeof(tilewise_run_options) of the caller (set by init) */

    /* In-memory workflow: when yaml is not NULL the workflow is these
     * yaml_len bytes of YAML and tilewise_run's `workflow` argument only
     * names it in messages (NULL: "<memory>"). */
    const char *yaml;
    size_t yaml_len;
    /* Workflow overrides "key.path=value" (YAML values), as --set: workflow
     * keys only (the run.* keys of tilewise_run_file are the fields below;
     * tilewise_run_options_set parses them). */
    const char *const *sets;
    int n_sets;

    /* Callbacks; each may be NULL and each gets `user`. progress may cancel
     * (return 0: the run stops at its next commit point, TILEWISE_CANCELLED;
     * committed rows stay, a rerun resumes). log gets the run's notices and
     * warnings; see log_summary. */
    tilewise_progress_fn progress;
    tilewise_tiles_fn tiles;
    tilewise_log_fn log;
    void *user;
    /* Graceful stop (the CLI's SIGINT/SIGTERM/SIGUSR1): when *stop becomes
     * non-zero the run claims no new tiles, finishes the batch being
     * computed, commits and checkpoints every tile classified (within 10 s)
     * and returns TILEWISE_CANCELLED; a rerun resumes from there. The
     * library only reads it, with an atomic load, in its stages' loops.
     * Setting it is async-signal-safe: a signal handler may store 1 to it
     * (`*stop = 1`, or __atomic_store_n(stop, 1, __ATOMIC_RELAXED) to be
     * free of data races with the run's threads);
     * another thread stores the same way. It is never reset by the library.
     * NULL: no stop flag. */
    volatile sig_atomic_t *stop;
    /* Non-zero: after the run, the per-input summary lines ("PATH: N tiles
     * classified, ...", "wrote FILE") go to log as INFO and an interruption's
     * message as WARNING, as tilewise_run_file does. Default 0 (read them
     * with tilewise_report_input). */
    int log_summary;

    /* The command line's run options (tilewise run --help). */
    int shard_index; /* 0-based, < shard_count (--shard I/N is I-1 of N) */
    int shard_count; /* default 1: not sharded */
    int chunk_rows;  /* output rows per committed chunk, 1..TILEWISE_CHUNK_ROWS_MAX; 0 (default):
                        about 1024 tiles */
    int quiet;       /* non-zero (-q): no notices to log (warnings still) */
    int restart;     /* non-zero (--restart): discard parts of another configuration */
    const char *report_path; /* also write the report here (--report); NULL: not */

    /* Tuning and test knobs, the CLI's environment variables (tilewise.1,
     * ENVIRONMENT); -1 (default) leaves the library's choice. */
    int tiff_direct;      /* 0: GDAL decodes every input (TILEWISE_TIFF_DIRECT=0); 1: libtiff
                             decodes plain tiled GeoTIFFs (the default) */
    int cpu_winograd;     /* 0: no Winograd convolutions on the CPU (TILEWISE_CPU_WINOGRAD=0);
                             1: oneDNN's where it has them (AVX-512), tilewise's elsewhere;
                             2: tilewise's everywhere (TILEWISE_CPU_WINOGRAD=own; with
                             cpu_nhwc 1 on AVX-512 CPUs) */
    int cpu_gemm;         /* 0 never, 1 wherever it applies: the CPU's GEMM convolutions
                             (TILEWISE_CPU_GEMM) */
    int cpu_nhwc;         /* 0 or 1: the CPU's NHWC layout (TILEWISE_CPU_NHWC) */
    uint64_t reserved_v2; /* ignored (version 2 to 4: a test hook of the CUDA backend, now
                             bench/run_hooked's; issue 28) */

    /* Since version 3. Non-zero (--strict, run.strict=true): a warning before
     * the first tile (validate's advice: a raster without CRS, values far
     * from the model's mean/std, tiles mostly padding; low disk space) stops
     * the run with TILEWISE_ERR_CONFIG (exit 2) instead of running on.
     * Default 0: the warnings are logged and listed in the report. */
    int strict;

    /* Since version 5. Where shard_index/shard_count came from, as run.json's
     * "sharding" says it: "--shard", "SLURM", ... or a sentence such as the
     * CLI's "none: a whole run in a SLURM array task (SLURM_ARRAY_TASK_ID=3)".
     * NULL (default): "none" unsharded, "run.shard" sharded. Copied. */
    const char *shard_from;
} tilewise_run_options;

/* Defaults in every field and size = sizeof *o. Cannot fail. */
void tilewise_run_options_init(tilewise_run_options *o);

/* One command-line run option given as "run.KEY=VALUE", as tilewise_run_file
 * takes them: run.shard=I/N (1-based), run.chunk_rows=N, run.report=PATH
 * (o->report_path then points into kv: keep kv alive), run.quiet=true|false,
 * run.restart=true|false. TILEWISE_ERR_USAGE with a message naming the key
 * for anything else. */
tilewise_status tilewise_run_options_set(tilewise_run_options *o, const char *kv,
                                         tilewise_error *err);

/* Run a workflow: the YAML file `workflow` (relative paths taken from the
 * current directory, as the CLI does), or o->yaml. o may be NULL
 * (defaults). The same run as `tilewise run` with the same options: the
 * same output bytes, run.json written to OUTPUT_DIR/run.json
 * (run.shardIIII-of-NNNN.json for a shard) when the folder exists and the
 * run is not refused with TILEWISE_ERR_LOCKED (that file is the other
 * process's), and to o->report_path when given.
 * *report (when report is not NULL) receives the report, also on failure as
 * far as the run got; it is NULL only when the workflow or the overrides
 * could not be read (err says why) or memory ran out. Free it with
 * tilewise_report_free. Returns TILEWISE_OK (see also the summary's
 * inputs_skipped), TILEWISE_CANCELLED (progress returned 0 or *stop was
 * set; resumable) or an error; TILEWISE_ERR_USAGE for a NULL workflow
 * without o->yaml, n_sets < 0, sets NULL with n_sets > 0, a bad shard,
 * chunk_rows or knob value, or o->size too small. */
tilewise_status tilewise_run(const char *workflow, const tilewise_run_options *o,
                             tilewise_report **report, tilewise_error *err);

/* `tilewise merge`: after sharded runs into output_dir, check that every
 * output row of every input is committed, write the final products as the
 * workflow asked and remove the parts. Of o (may be NULL) it uses quiet.
 * *report receives what was written (tilewise_report_input's outputs; no
 * JSON: tilewise_report_json gives ""), also on failure. TILEWISE_ERR_INPUT
 * naming the missing rows when a shard has not finished. A directory merged
 * already (no parts left, its products there): TILEWISE_OK, no input. */
tilewise_status tilewise_merge(const char *output_dir, const tilewise_run_options *o,
                               tilewise_report **report, tilewise_error *err);

/* `tilewise validate`: check the workflow (a file, or o->yaml), its inputs
 * and the model against each other without running the model. Of o (may be
 * NULL) it uses yaml, sets and the tuning knobs. *v (when v is not NULL)
 * receives the text the command prints (the plan: tiles, grid, batch,
 * memory estimate; then advice on georeferencing, value ranges and the
 * reader, and a last line "advice    N warnings"), also on failure as far
 * as it got (NULL when the workflow could not be read). Advice is never an
 * error: TILEWISE_OK means the run can start. Free *v with
 * tilewise_validation_free. */
typedef struct tilewise_validation tilewise_validation;
tilewise_status tilewise_validate(const char *workflow, const tilewise_run_options *o,
                                  tilewise_validation **v, tilewise_error *err);
/* The whole text, lines ending in '\n'. Borrowed until free. "" for NULL. */
const char *tilewise_validation_text(const tilewise_validation *v);
/* The warnings (the text's lines starting "warning": the output checks'
 * and the advice's), without that word. i in [0, count); NULL outside.
 * Borrowed until free. */
int tilewise_validation_warnings(const tilewise_validation *v);
const char *tilewise_validation_warning(const tilewise_validation *v, int i);
/* Warning i's stable code: "output" (the output checks: free disk space, an
 * AOI that touches no tile) or advice's ("no_crs", "values", "padding", ...;
 * README "Advice"). NULL outside [0, count). Borrowed until free. */
const char *tilewise_validation_warning_code(const tilewise_validation *v, int i);

/* The plan as numbers (what the listing's model, batch, readers and memory
 * lines say). Set size = sizeof(tilewise_plan_summary) before the call; the
 * library fills what fits. Strings borrowed until tilewise_validation_free. */
typedef struct tilewise_plan_summary {
    size_t size;
    int resolved;     /* the model and backend below are known */
    int planned;      /* every input planned: the budget below holds */
    const char *arch; /* "resnet50" */
    const char *model_sha256;
    int bands, n_classes, features, tile, stride;
    const char *backend; /* "cpu", "cuda" */
    const char *precision;
    int n_inputs; /* planned so far; tilewise_validation_input takes 0 <= i < n_inputs */
    int batch, slots, readers;
    uint64_t memory_bytes;   /* runtime.memory */
    uint64_t estimate_bytes; /* the expected peak */
    uint64_t worst_bytes;    /* the worst case, within memory_bytes */
    /* The worst case's items: */
    uint64_t base_bytes, weights_bytes, slots_bytes, read_bytes, workspace_bytes, strip_bytes,
        gdal_cache_bytes, margin_bytes;
    /* "classification" (a value per cell of stride pixels) or "segmentation"
     * (a value per pixel; tiles blended by blend and margin) */
    const char *task;
    const char *blend; /* tiling.blend (segmentation) */
    int margin;        /* tiling.margin (segmentation) */
} tilewise_plan_summary;

/* One input as planned. Set size as above. */
typedef struct tilewise_plan_input {
    size_t size;
    const char *path;    /* credentials redacted */
    const char *skipped; /* "": planned; else why it is skipped (input.on_error: skip) */
    int width, height, bands;
    const char *dtype; /* GDAL's name: "Byte", "UInt16", "Float32" */
    int tiles_x, tiles_y;
    int64_t tiles;               /* this shard's */
    int grid_width, grid_height; /* output cells */
    int64_t aoi_tiles;           /* tiles touching input.aoi; -1: no AOI */
    int remote;                  /* read over the network */
    int64_t remote_bytes;        /* at least; -1: unknown or not remote */
} tilewise_plan_input;

/* Fill *s / input i's *s. TILEWISE_ERR_USAGE for NULL arguments, i out of
 * range or a size too small. */
tilewise_status tilewise_validation_plan(const tilewise_validation *v, tilewise_plan_summary *s,
                                         tilewise_error *err);
tilewise_status tilewise_validation_input(const tilewise_validation *v, int i,
                                          tilewise_plan_input *s, tilewise_error *err);
void tilewise_validation_free(tilewise_validation *v);

/* What a scheduler's job script needs of a workflow (version 4). */
typedef struct tilewise_job {
    size_t size;
    char output_dir[4096]; /* output.dir as the workflow gives it */
    char device[16];       /* runtime.device: auto, cpu, cuda, cuda:N */
    uint64_t memory_bytes; /* runtime.memory */
    int threads;           /* runtime.threads; 0: all cores */
} tilewise_job;

/* `tilewise submit`'s check on a login node, before anything is queued:
 * the workflow (a file, or o->yaml with o's sets) read as a run reads it,
 * then what needs neither a GPU nor the model's weights in memory: every
 * input against the model file (opens, bands, size), the weights' format,
 * the creation options and output.dir. *job (set job->size =
 * sizeof(tilewise_job) first) receives the facts a job script needs.
 * Errors as tilewise_validate's, and TILEWISE_ERR_USAGE for a NULL job or
 * a size too small. Version 4. */
tilewise_status tilewise_check(const char *workflow, const tilewise_run_options *o,
                               tilewise_job *job, tilewise_error *err);

/* `tilewise info`: describe a raster (any GDAL path, https:// and s3:// as
 * a run opens them: driver, size, CRS, pixel size, layout, per-band type,
 * nodata, statistics, whether tilewise can read it and why not, where a
 * class map's legend lives) or a model file (.h5, .hdf5, .safetensors:
 * architecture, bands, classes, parameters, normalization, tile, sha256).
 * json 0: the command's text; non-zero: `info --json`'s one JSON object.
 * Of o (may be NULL) it uses tiff_direct. *text (malloc'ed, free it with
 * tilewise_string_free) is NULL on error. Errors: TILEWISE_ERR_INPUT (a file
 * that cannot be opened or read), TILEWISE_ERR_REMOTE (a remote raster that
 * could not be reached: an outage, not a bad object), TILEWISE_ERR_MODEL,
 * TILEWISE_ERR_USAGE (NULL path or text). */
tilewise_status tilewise_info(const char *path, const tilewise_run_options *o, int json,
                              char **text, tilewise_error *err);
/* Free a string the library returned as `char **`. Accepts NULL. */
void tilewise_string_free(char *s);

/* The run as a whole. Set size = sizeof(tilewise_run_summary) before the
 * call; the library fills what fits in size. Strings and arrays are
 * borrowed until tilewise_report_free. */
typedef struct tilewise_run_summary {
    size_t size;
    int status;    /* how the run ended: a tilewise_status */
    int exit_code; /* what `tilewise run` exits with: tilewise_exit_code(status), or 5 when
                      it finished but inputs were skipped (input.on_error: skip) */
    int n_inputs;  /* tilewise_report_input takes 0 <= i < n_inputs */
    int inputs_skipped;
    int64_t tiles_classified;
    double seconds;
    int n_classes;                  /* 0 for a headless backbone */
    const char *const *class_names; /* [n_classes] */
    const char *backend;            /* "cpu", "cuda", "merge" */
    const char *output_dir;
    const char *run_json;         /* where run.json goes (OUTPUT_DIR/run.json, or the
                                     shard's), named even when it could not be written
                                     (tilewise_report_path says where it was) */
    int shard_index, shard_count; /* 0-based; count 1: not sharded */
} tilewise_run_summary;

/* One input of the run, the numbers the CLI prints after a run and run.json
 * holds. Set size as above. Borrowed until tilewise_report_free. */
typedef struct tilewise_input_summary {
    size_t size;
    const char *path;            /* as the workflow names it */
    const char *skipped;         /* "": it ran; else why it was skipped (input.on_error: skip) */
    int width, height;           /* pixels */
    int grid_width, grid_height; /* output cells */
    int64_t tiles_total;         /* tiles this run (shard) had to look at */
    int64_t tiles_classified;
    int64_t tiles_nodata;      /* above tiling.max_nodata_fraction */
    int64_t tiles_read_errors; /* unreadable, made nodata (input.on_error: skip) */
    int64_t tiles_outside_aoi; /* not computed: outside input.aoi */
    int rows_resumed;          /* output rows an earlier, interrupted run had committed */
    double seconds;
    const int64_t *class_cells; /* [n_classes]: output cells per (argmax) class */
    int64_t nodata_cells;
    int n_outputs;
    const char *const *outputs; /* [n_outputs]: files written */
} tilewise_input_summary;

/* Fill *s. TILEWISE_ERR_USAGE for NULL arguments or s->size below the
 * version 2 size. A run that kept no result (memory ran out before it
 * started) has n_inputs 0 and zero counts. */
tilewise_status tilewise_report_summary(const tilewise_report *r, tilewise_run_summary *s,
                                        tilewise_error *err);
/* Fill *s for input i. TILEWISE_ERR_USAGE for NULL arguments, i out of
 * range, or a size too small. */
tilewise_status tilewise_report_input(const tilewise_report *r, int i, tilewise_input_summary *s,
                                      tilewise_error *err);

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

/* An image in memory: raw pixels, C order [bands][height][width] of dtype,
 * as read from a raster. valid [height][width] may be NULL (all valid):
 * 0 = nodata, any other value = valid; use_nodata and nodata as in
 * tilewise_tiles. */
typedef struct tilewise_image {
    const void *pixels;
    int dtype; /* a tilewise_dtype */
    int bands, width, height;
    const uint8_t *valid;
    int use_nodata;
    double nodata;
} tilewise_image;

/* Classify a whole image as `tilewise run` classifies a raster with
 * tiling.edge pad and tiling.stride = stride (0: the model's tile, which
 * stride must divide): the same tiles, the same nodata rule, each tile's
 * probabilities averaged into the stride x stride cells it covers, by the
 * run's own tiling plan and stitcher (the same bytes as prob.tif's).
 * probs [K][grid_h][grid_w] with grid_w = ceil(width / stride), grid_h =
 * ceil(height / stride); a cell that no classified tile covers is NaN.
 * Holds a batch of tiles and tile/stride rows of cells besides the
 * caller's arrays. Errors as tilewise_model_classify's, and
 * TILEWISE_ERR_USAGE for a negative stride, one that does not divide the tile, or an
 * empty image. Version 4. */
tilewise_status tilewise_model_classify_image(tilewise_model *m, const tilewise_image *img,
                                              int stride, float *probs, tilewise_error *err);

#ifdef __cplusplus
}
#endif

#endif

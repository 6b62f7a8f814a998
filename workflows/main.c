/* main.c - the tilewise command line.
 *
 *   tilewise run WORKFLOW.yaml [--set key.path=value]... [--shard I/N] [-q]
 *                [--progress=text|json|none] [--report FILE] [--chunk-rows N]
 *   tilewise validate WORKFLOW.yaml [--set ...]
 *   tilewise info [--json] FILE
 *   tilewise merge [-q] OUTPUT_DIR
 *   tilewise submit WORKFLOW.yaml --array N ...   (workflows/submit.c)
 *   tilewise COMMAND --help, tilewise help COMMAND, tilewise --version
 *
 * The only place that chooses an exit code (see README.md, "Exit codes"),
 * and the only one that prints progress. run, merge, validate and info are
 * clients of the public C API (include/tilewise.h: tilewise_run,
 * tilewise_merge, tilewise_validate, tilewise_info, the report's
 * summaries), as any program linking libtilewise is: this file turns
 * arguments and environment knobs into tilewise_run_options and prints
 * what comes back. submit (workflows/submit.c) is the CLI's own. Of
 * tilewise's headers it includes tilewise.h and the CLI's own (workflows/);
 * scripts/check_layers.sh holds it to that.
 */
#include <malloc.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <gdal.h>
#include <jansson.h>
#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/lsan_interface.h>
#endif

#include "tilewise.h"
#include "workflows/shard.h"
#include "workflows/submit.h"

#define MAX_SETS 128
#define MSG_MAX (TILEWISE_MESSAGE_MAX * 2) /* a message, redacted */
#define PATH_MAX_ 4096

/* ---- JSON events (--progress=json): one object per stderr line ---- */

/* A JSON string of s; bytes that are not UTF-8 (a Latin-1 file name)
 * become '?', where jansson would refuse the whole string. */
static json_t *jstr(const char *s)
{
    json_t *v = json_string(s ? s : "");
    if (v) return v;
    char buf[MSG_MAX];
    size_t n = 0;
    for (; s[n] && n + 1 < sizeof buf; n++) buf[n] = (unsigned char)s[n] < 0x80 ? s[n] : '?';
    buf[n] = '\0';
    return json_string(buf);
}

/* A number; null for NaN and infinities (JSON has neither), rounded to
 * `digits` decimals when digits >= 0. */
static json_t *jnum(double v, int digits)
{
    if (!isfinite(v)) return json_null();
    if (digits >= 0) {
        double k = pow(10, digits);
        v = round(v * k) / k;
    }
    return json_real(v);
}

/* Write event (consumed) as one line on stderr, its keys in the order set. */
static void emit_event(json_t *event)
{
    if (!event) return;
    json_dumpf(event, stderr, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
    fputc('\n', stderr);
    json_decref(event);
}

static json_t *new_event(const char *name)
{
    json_t *e = json_object();
    if (e) json_object_set_new(e, "event", json_string(name));
    return e;
}

/* The graceful stop flag (tilewise_run_options.stop): a volatile
 * sig_atomic_t, what C lets a handler store to; the store and the loads are
 * __atomic builtins (lock-free on an int, checked below), so the handler and
 * the stage threads that read it do not race. */
static volatile sig_atomic_t g_stop;
_Static_assert(__GCC_ATOMIC_INT_LOCK_FREE == 2 && sizeof(sig_atomic_t) == sizeof(int),
               "the stop flag must be a lock-free int to be set in a handler");

static void on_signal(int sig)
{
    (void)sig;
    __atomic_store_n(&g_stop, 1, __ATOMIC_RELAXED);
}

/* The thread that takes SIGINT, SIGTERM and SIGUSR1 (stop_on_signals). */
static void *signal_thread(void *arg)
{
    const sigset_t *set = arg;
    for (;;) {
        int sig;
        if (sigwait(set, &sig) == 0) on_signal(sig);
    }
    return NULL;
}

/* SIGINT, SIGTERM and SIGUSR1 set the stop flag. SA_RESTART: a system call
 * a signal interrupts in any thread (GDAL's, libtiff's, libcurl's reads,
 * writes and waits) is restarted rather than failing with EINTR, which
 * their callers may not expect.
 *
 * They are taken by a thread of their own, and blocked in this one before
 * it starts any other (the stage threads, the OpenMP team: they inherit
 * the mask): a handler never runs on a thread that runs oneDNN. Its JIT
 * GEMM kernels (the CPU backend's AVX2 path, inner products) point the
 * stack pointer into a heap workspace while they run, so the kernel wrote
 * the signal's frame there: the heap corrupted, the run ended in SIGABRT or
 * SIGSEGV instead of exit 75 (issue 39; oneDNN issue 4845). The handler
 * stays for threads a library started before this (OpenBLAS's). */
static void stop_on_signals(void)
{
    static sigset_t set;
    static bool started;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    if (started) return;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGUSR1);
    pthread_t t;
    if (pthread_sigmask(SIG_BLOCK, &set, NULL) != 0) return;
    if (pthread_create(&t, NULL, signal_thread, &set) != 0) {
        pthread_sigmask(SIG_UNBLOCK, &set, NULL); /* the handler then, on any thread */
        return;
    }
    pthread_detach(t);
    started = true;
}

/* ---- help texts ---- */

static const char *usage_text =
    "usage: tilewise <command> [options]      (tilewise <command> --help for more)\n"
    "       any command also takes --config KEY VALUE (a GDAL configuration option)\n"
    "\n"
    "commands:\n"
    "  run WORKFLOW.yaml [--set key.path=value]... [--shard I/N|auto[/N]] [-q] [--report FILE]\n"
    "                    [--progress=text|json|none] [--chunk-rows N] [--restart] [--strict]\n"
    "                    classify every input raster of the workflow; output rows are\n"
    "                    committed in chunks (N rows; default about 1024 tiles' worth), so\n"
    "                    running the same command after a kill redoes only what is missing.\n"
    "                    --shard I/N (or auto: the array task's) runs the I-th of N bands of rows\n"
    "  validate WORKFLOW.yaml [--set key.path=value]...\n"
    "                    check config, inputs and model; print the plan and memory estimate\n"
    "  info [--json] FILE\n"
    "                    describe a raster, a model file, a STAC item or a polygons file\n"
    "  merge [-q] OUTPUT_DIR\n"
    "                    after sharded runs: check every shard finished, write the mosaics\n"
    "  submit WORKFLOW.yaml --array N [--dry-run] [--set k=v]... [--sbatch OPT]...\n"
    "                    [--chunk-rows N]\n"
    "                    SLURM job array of N shards, then a merge job after it succeeds\n"
    "\n"
    "exit codes: 0 ok, 1 internal error, 2 usage or workflow error, 3 bad input raster or\n"
    "model, 4 resource failure (memory, disk, device, output not writable), 5 finished but\n"
    "inputs were skipped (input.on_error: skip), 6 output.dir holds parts of a run with\n"
    "another configuration (nothing deleted; see --restart), 7 another process is running\n"
    "the same shard, 75 interrupted (resumable: run the same command again)\n";

static const char *run_help =
    "usage: tilewise run WORKFLOW.yaml [options]\n"
    "\n"
    "Classify every input raster of the workflow into OUTPUT_DIR (output.dir): class map,\n"
    "probabilities, confidence, tile table, GeoPackage of tiles, as output.products asks,\n"
    "and run.json. Output rows are committed in chunks: after a kill, the same command\n"
    "redoes only what no chunk holds.\n"
    "\n"
    "options:\n"
    "  --set key.path=value   override a workflow key (repeatable), e.g. --set tiling.stride=32\n"
    "  --shard I/N            run the I-th of N bands of output rows (1-based).\n"
    "                         Then: tilewise merge OUTPUT_DIR. Without --shard a run is a\n"
    "                         whole run, inside a job array too\n"
    "  --shard auto[/N]       the array task's index from the batch system: SLURM, AWS Batch\n"
    "                         (with their counts), Kubernetes indexed Jobs "
    "(JOB_COMPLETION_INDEX),\n"
    "                         PBS Pro (PBS_ARRAY_INDEX, -J 1-N), LSF (LSB_JOBINDEX, [1-N]);\n"
    "                         N: the array's size where the system does not say it\n"
    "  --chunk-rows N         output rows per committed chunk (default: about 1024 tiles)\n"
    "  --restart              discard committed parts made with another configuration,\n"
    "                         model or raster (without it the run refuses, exit 6, and\n"
    "                         deletes nothing); parts of this configuration still resume\n"
    "  --strict               a warning before the first tile (validate's advice: no CRS,\n"
    "                         values far from the model's mean/std, mostly padding, low disk\n"
    "                         space) stops the run with exit 2, for batch jobs\n"
    "  --report FILE          also write the run report to FILE\n"
    "  --progress=MODE        text (default): 0...10...20 on stderr, with tiles/s and the\n"
    "                         time left when stderr is a terminal; json: one JSON object\n"
    "                         per line on stderr (events start, progress, done); none\n"
    "  -q, --quiet            no progress, no notices (errors are still printed)\n"
    "  --config KEY VALUE     a GDAL configuration option, as GDAL's tools take it (any\n"
    "                         command): AWS_PROFILE, GDAL_HTTP_TIMEOUT, ... Credentials are\n"
    "                         never printed or stored\n"
    "  -h, --help             this text\n"
    "\n"
    "exit codes: 0 ok, 1 internal error, 2 usage or workflow error, 3 bad input raster or\n"
    "model, 4 resource failure or network outage, 5 finished but inputs were skipped\n"
    "(input.on_error: skip), 6 output.dir holds parts of a run with another configuration\n"
    "(run with that configuration, or add --restart), 7 another process is running the\n"
    "same shard, 75 interrupted (resumable: run the same command again)\n";

static const char *validate_help =
    "usage: tilewise validate WORKFLOW.yaml [--set key.path=value]...\n"
    "\n"
    "Check the workflow, the inputs and the model against each other without running the\n"
    "model: band counts and types, mean/std lengths, tile and stride, the memory budget.\n"
    "Prints the plan (tiles, output grid, batch, memory estimate), then advice:\n"
    "  * value ranges: each band's minimum and maximum (from its statistics, or an\n"
    "    approximate scan) after input.scale and the model's mean/std; a range far from\n"
    "    what the model was trained on usually means a wrong input.scale;\n"
    "  * georeferencing: CRS, pixel size and ground size of a tile; degrees that make\n"
    "    stretched pixels or huge tiles, odd pixel sizes, no CRS;\n"
    "  * padding: tiles more than half outside the raster (one smaller than a tile).\n"
    "Advice lines start with 'warning'; they do not change the exit code.\n"
    "\n"
    "options:\n"
    "  --set key.path=value   override a workflow key (repeatable), as for run\n"
    "  --config KEY VALUE     a GDAL configuration option (any command)\n"
    "  -h, --help             this text\n"
    "\n"
    "exit codes: 0 the run can start, 2 workflow error, 3 input or model does not fit\n";

static const char *info_help =
    "usage: tilewise info [--json] FILE\n"
    "\n"
    "Describe one of:\n"
    "  * a raster: driver, size, CRS as EPSG code and units, pixel size, bands with type,\n"
    "    nodata, block size, description, overviews; the class map's legend;\n"
    "  * a model file (.h5 bundle, .safetensors, .onnx): architecture, family and stem,\n"
    "    bands, classes, parameters, normalization, tile size, sha256, checksum; for ONNX\n"
    "    also opset, producer, where batch norm was, the head and the metadata used;\n"
    "  * a STAC item or collection a run wrote (.stac.json, collection.json): id, datetime,\n"
    "    bbox, assets with sizes, model;\n"
    "  * a polygons file (.class.gpkg, .class.fgb): features, CRS, area unit, per class\n"
    "    its features, cells and area.\n"
    "A PyTorch checkpoint (.pth, .pt) gets the tools/export_model.py command.\n"
    "\n"
    "options:\n"
    "  --json               one JSON object on stdout instead of text\n"
    "  --config KEY VALUE   a GDAL configuration option (any command)\n"
    "  -h, --help           this text\n"
    "\n"
    "exit codes: 0 ok, 2 usage error, 3 unreadable or unknown file (also a remote raster\n"
    "that cannot be reached)\n";

static const char *merge_help =
    "usage: tilewise merge [-q] OUTPUT_DIR\n"
    "\n"
    "After sharded runs (--shard I/N or --shard auto) into OUTPUT_DIR: check that every\n"
    "output row of every input is committed, then write the final products as the\n"
    "workflow asked and remove the parts. Exit 3 naming the missing rows when a shard\n"
    "has not finished.\n"
    "\n"
    "options:\n"
    "  -q, --quiet          no notices and no \"already merged\" line\n"
    "  --config KEY VALUE   a GDAL configuration option (any command)\n"
    "  -h, --help           this text\n";

static const char *submit_help =
    "usage: tilewise submit WORKFLOW.yaml --array N [options]\n"
    "\n"
    "Write and submit two SLURM batch jobs: an array of N tasks, each running\n"
    "`tilewise run` on its shard, and a merge job that runs once all have succeeded.\n"
    "Scripts and logs go to OUTPUT_DIR/.tilewise-slurm/.\n"
    "\n"
    "options:\n"
    "  --array N          number of tasks (shards)\n"
    "  --dry-run          print the scripts, submit nothing\n"
    "  --set k=v          workflow override, passed on to every task (repeatable)\n"
    "  --sbatch OPT       an sbatch option for both jobs, e.g. --sbatch --time=4:00:00\n"
    "  --chunk-rows N     passed on to tilewise run\n"
    "  --config KEY VALUE a GDAL configuration option for the check here (not passed on)\n"
    "  -h, --help         this text\n"
    "\n"
    "exit 4 when sbatch is missing or refuses a job (its message is shown)\n";

/* `run --progress=json` promises a scheduler JSON lines on stderr, the last
 * one a "done" event with the exit code and the message, however the run
 * ends: set (by main and cmd_run) as soon as the arguments ask for it, so
 * that usage and workflow errors end that way too. */
static bool g_json_done;

static double mono_s(void);

/* The last JSON progress line: how the command ended. message NULL on
 * success; report NULL when no report was written. */
static void json_done(int status, int exit_code, const char *message, int inputs, long long tiles,
                      double seconds, const char *report)
{
    json_t *e = new_event("done");
    if (!e) return;
    json_object_set_new(e, "status",
                        jstr(status == TILEWISE_OK ? "ok" : tilewise_status_name(status)));
    json_object_set_new(e, "exit_code", json_integer(exit_code));
    if (message) {
        char shown[MSG_MAX];
        tilewise_redact(message, shown, sizeof shown);
        json_object_set_new(e, "message", jstr(shown));
    }
    json_object_set_new(e, "inputs", json_integer(inputs));
    json_object_set_new(e, "tiles_classified", json_integer(tiles));
    json_object_set_new(e, "seconds", jnum(seconds, 3));
    json_object_set_new(e, "report", report ? jstr(report) : json_null());
    emit_event(e);
    fflush(stderr);
}

static double g_t0; /* when main started: the done event's seconds before a run */

static int usage_error(const char *fmt, const char *arg)
{
    char msg[MSG_MAX];
    int n = snprintf(msg, sizeof msg, fmt, arg);
    if (n >= 0 && (size_t)n < sizeof msg)
        snprintf(msg + n, sizeof msg - (size_t)n, " (see tilewise --help)");
    if (g_json_done)
        json_done(TILEWISE_ERR_USAGE, TILEWISE_EXIT_USAGE, msg, 0, 0, mono_s() - g_t0, NULL);
    else
        fprintf(stderr, "tilewise: %s\n", msg);
    return TILEWISE_EXIT_USAGE;
}

/* "tilewise: STATUS: MESSAGE" on stderr (a done event under
 * --progress=json); returns the exit code. */
static int fail(const tilewise_error *err)
{
    if (g_json_done) {
        json_done(err->status, tilewise_exit_code(err->status), err->message, 0, 0, mono_s() - g_t0,
                  NULL);
        return tilewise_exit_code(err->status);
    }
    /* Messages name inputs redacted where they are made (io/url.h); this
     * catches one that quotes a URL from elsewhere. */
    char msg[MSG_MAX];
    tilewise_redact(err->message, msg, sizeof msg);
    fprintf(stderr, "tilewise: %s: %s\n", tilewise_status_name(err->status), msg);
    return tilewise_exit_code(err->status);
}

/* Whether run's arguments ask for --progress=json (the last --progress
 * wins), looked at before they are parsed. */
static bool json_progress_asked(int argc, char **argv)
{
    bool json = false;
    for (int i = 0; i < argc; i++) {
        const char *v = NULL;
        if (strncmp(argv[i], "--progress=", 11) == 0)
            v = argv[i] + 11;
        else if (strcmp(argv[i], "--progress") == 0 && i + 1 < argc)
            v = argv[++i];
        if (v) json = strcmp(v, "json") == 0;
    }
    return json;
}

/* --help or -h among a subcommand's arguments, not as the value of an
 * option that takes one (--sbatch --help would be sbatch's). */
static bool help_asked(int argc, char **argv)
{
    static const char *const takes_value[] = {"--set",   "--sbatch",     "--report",
                                              "--shard", "--chunk-rows", "--array"};
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--help") && strcmp(argv[i], "-h")) continue;
        bool is_value = false;
        for (size_t k = 0; i > 0 && k < sizeof takes_value / sizeof *takes_value; k++)
            if (strcmp(argv[i - 1], takes_value[k]) == 0) is_value = true;
        if (!is_value) return true;
    }
    return false;
}

/* ---- JSON output helpers (progress events, info --json) ---- */

/* ---- progress ----
 * text, stderr not a terminal: GDAL style, 0...10...20 ... 100 - done.
 * text, stderr a terminal: the same line redrawn with tiles/s and time left.
 * json: one object per line (start, progress at each whole percent, done). */

typedef enum { PROGRESS_TEXT = 0, PROGRESS_JSON, PROGRESS_NONE } progress_mode;

typedef struct progress_state {
    progress_mode mode;
    bool tty;
    char current[PATH_MAX_]; /* input under way; "" before the first */
    int last_step;           /* text: of 40 (2.5 % each), 41 = line closed */
    int last_pct;            /* json: last whole percent written */
    double t0;               /* when the input started */
    double last_draw;        /* tty: last redraw */
    int64_t done, total;     /* tiles, from the tiles hook */
    bool quiet;              /* -q: notices are not shown */
} progress_state;

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void tiles_cb(int64_t done, int64_t total, const char *message, void *user)
{
    (void)message;
    progress_state *ps = user;
    ps->done = done;
    ps->total = total;
}

static void fmt_duration(double s, char *out, size_t size)
{
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(out, size, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(out, size, "%ld:%02ld", t / 60, t % 60);
}

static void progress_rate(const progress_state *ps, double complete, double *rate, double *eta)
{
    double el = mono_s() - ps->t0;
    *rate = el > 0 ? (double)ps->done / el : 0.0;
    *eta = NAN;
    if (ps->total > 0 && *rate > 0)
        *eta = (double)(ps->total - ps->done) / *rate;
    else if (complete > 0 && complete < 1)
        *eta = el * (1 - complete) / complete;
    if (complete >= 1) *eta = 0;
}

static void progress_json(progress_state *ps, double complete)
{
    double rate, eta;
    progress_rate(ps, complete, &rate, &eta);
    json_t *e = new_event("progress");
    if (!e) return;
    json_object_set_new(e, "input", jstr(ps->current));
    json_object_set_new(e, "fraction", jnum(complete, 6));
    json_object_set_new(e, "tiles_done", json_integer(ps->done));
    json_object_set_new(e, "tiles_total", json_integer(ps->total));
    json_object_set_new(e, "tiles_per_s", jnum(rate, -1));
    json_object_set_new(e, "eta_s", jnum(eta, -1));
    json_object_set_new(e, "elapsed_s", jnum(mono_s() - ps->t0, 3));
    emit_event(e);
}

/* The dots of steps 0..step, as GDAL prints them. */
static int dots(char *out, size_t size, int step)
{
    int n = 0;
    for (int s = 0; s <= step && s <= 40 && (size_t)n + 8 < size; s++)
        n += snprintf(out + n, size - (size_t)n, s % 4 == 0 ? "%d" : ".", s / 4 * 10);
    return n;
}

static int progress_cb(double complete, const char *message, void *user)
{
    progress_state *ps = user;
    if (complete > 1) complete = 1;
    char shown[sizeof ps->current]; /* the input's path: a presigned URL's signature redacted */
    if (message) {
        tilewise_redact(message, shown, sizeof shown);
        message = shown;
    }
    if (message && strcmp(ps->current, message) != 0) {
        if (ps->mode == PROGRESS_TEXT && ps->current[0] && ps->last_step <= 40) fputc('\n', stderr);
        snprintf(ps->current, sizeof ps->current, "%s", message);
        ps->last_step = -1;
        ps->last_pct = -1;
        ps->t0 = mono_s();
        ps->last_draw = 0;
        if (ps->mode == PROGRESS_JSON) {
            json_t *e = new_event("start");
            if (e) {
                json_object_set_new(e, "input", jstr(message));
                json_object_set_new(e, "tiles_total", json_integer(ps->total));
                emit_event(e);
            }
        } else if (!ps->tty) {
            fprintf(stderr, "%s: ", message);
        }
    }
    int step = (int)floor(complete * 40.0 + 1e-9);
    if (ps->mode == PROGRESS_JSON) {
        int pct = (int)floor(complete * 100.0 + 1e-9);
        if (pct > ps->last_pct) {
            ps->last_pct = pct;
            progress_json(ps, complete);
        }
    } else if (!ps->tty) {
        while (ps->last_step < step) {
            ps->last_step++;
            if (ps->last_step % 4 == 0)
                fprintf(stderr, "%d", ps->last_step / 4 * 10);
            else
                fprintf(stderr, ".");
        }
        if (step == 40) {
            fprintf(stderr, " - done.\n");
            ps->last_step = 41;
        }
    } else if (ps->last_step <= 40) {
        /* Redraw at most 10 times a second, and always at the end. */
        double now = mono_s();
        if (step == 40 || now - ps->last_draw >= 0.1) {
            ps->last_draw = now;
            double rate, eta;
            progress_rate(ps, complete, &rate, &eta);
            char line[256], t[32];
            int n = dots(line, sizeof line, step);
            if (step == 40) {
                fmt_duration(now - ps->t0, t, sizeof t);
                snprintf(line + n, sizeof line - (size_t)n,
                         " - done. %lld tiles in %s (%.0f tiles/s)", (long long)ps->done, t, rate);
            } else {
                if (isfinite(eta))
                    fmt_duration(eta, t, sizeof t);
                else
                    snprintf(t, sizeof t, "?");
                snprintf(line + n, sizeof line - (size_t)n,
                         "  %lld/%lld tiles, %.0f tiles/s, %s left", (long long)ps->done,
                         (long long)ps->total, rate, t);
            }
            fprintf(stderr, "\r%s: %s\033[K%s", ps->current, line, step == 40 ? "\n" : "");
            ps->last_step = step == 40 ? 41 : step;
        }
    }
    fflush(stderr);
    return __atomic_load_n(&g_stop, __ATOMIC_RELAXED) ? 0 : 1;
}

/* ---- run / validate ---- */

typedef struct cli_opts {
    const char *workflow;
    const char *sets[MAX_SETS];
    int n_sets;
    int shard_index, shard_count;
    const char *shard_arg; /* --shard's value, or NULL */
    char shard_from[160];  /* where the shard came from, for run.json */
    char shard_note[256];  /* a whole run inside an array task: the notice */
    int chunk_rows;
    bool quiet;
    bool restart;
    bool strict; /* --strict: a warning before the first tile is exit 2 */
    progress_mode progress;
    bool progress_given;
    const char *report;
} cli_opts;

static int parse_opts(int argc, char **argv, bool allow_run_opts, cli_opts *o)
{
    memset(o, 0, sizeof *o);
    o->shard_count = 1;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--set") == 0 || strncmp(a, "--set=", 6) == 0) {
            const char *v = a[5] == '=' ? a + 6 : (i + 1 < argc ? argv[++i] : NULL);
            if (!v) return usage_error("--set needs key.path=value%s", "");
            if (o->n_sets == MAX_SETS) return usage_error("too many --set options%s", "");
            o->sets[o->n_sets++] = v;
        } else if (allow_run_opts &&
                   (strcmp(a, "--shard") == 0 || strncmp(a, "--shard=", 8) == 0)) {
            const char *v = a[7] == '=' ? a + 8 : (i + 1 < argc ? argv[++i] : NULL);
            if (!v) return usage_error("--shard expects I/N, auto or auto/N%s", "");
            o->shard_arg = v; /* resolved once every option is read (shard.h) */
        } else if (allow_run_opts &&
                   (strcmp(a, "--chunk-rows") == 0 || strncmp(a, "--chunk-rows=", 13) == 0)) {
            const char *v = a[12] == '=' ? a + 13 : (i + 1 < argc ? argv[++i] : NULL);
            char *end = NULL;
            long n = v ? strtol(v, &end, 10) : 0;
            if (!v || *end || n < 1 || n > TILEWISE_CHUNK_ROWS_MAX)
                return usage_error("--chunk-rows expects a positive number of rows, got '%s'",
                                   v ? v : "");
            o->chunk_rows = (int)n;
        } else if (allow_run_opts && strcmp(a, "--restart") == 0) {
            o->restart = true;
        } else if (allow_run_opts && strcmp(a, "--strict") == 0) {
            o->strict = true;
        } else if (allow_run_opts && (strcmp(a, "-q") == 0 || strcmp(a, "--quiet") == 0)) {
            o->quiet = true;
        } else if (allow_run_opts &&
                   (strcmp(a, "--progress") == 0 || strncmp(a, "--progress=", 11) == 0)) {
            const char *v = a[10] == '=' ? a + 11 : (i + 1 < argc ? argv[++i] : NULL);
            if (v && strcmp(v, "text") == 0)
                o->progress = PROGRESS_TEXT;
            else if (v && strcmp(v, "json") == 0)
                o->progress = PROGRESS_JSON;
            else if (v && strcmp(v, "none") == 0)
                o->progress = PROGRESS_NONE;
            else
                return usage_error("--progress expects text, json or none, got '%s'", v ? v : "");
            o->progress_given = true;
        } else if (allow_run_opts &&
                   (strcmp(a, "--report") == 0 || strncmp(a, "--report=", 9) == 0)) {
            const char *v = a[8] == '=' ? a + 9 : (i + 1 < argc ? argv[++i] : NULL);
            if (!v) return usage_error("--report needs a file name%s", "");
            o->report = v;
        } else if (a[0] == '-' && a[1] != '\0') {
            return usage_error("unknown option '%s'", a);
        } else if (!o->workflow) {
            o->workflow = a;
        } else {
            return usage_error("unexpected argument '%s'", a);
        }
    }
    if (!o->workflow) return usage_error("missing WORKFLOW.yaml%s", "");
    /* -q silences the text progress; an explicit --progress=json still
     * speaks (a scheduler asked for it), with the notices silenced. */
    if (o->quiet && !o->progress_given) o->progress = PROGRESS_NONE;
    if (o->progress == PROGRESS_JSON) o->quiet = true;
    return 0;
}

static const char *process_env(const char *name, void *user)
{
    (void)user;
    return getenv(name);
}

/* --shard I/N or --shard auto[/N] (the batch system's array index); without
 * --shard a whole run, and inside an array task a notice that says so
 * (shard.h). */
static int resolve_shard(cli_opts *o)
{
    char msg[512];
    const char *from;
    if (tw_shard_resolve(o->shard_arg, process_env, NULL, &o->shard_index, &o->shard_count, &from,
                         msg, sizeof msg) != 0)
        return usage_error("%s", msg);
    char task[128];
    if (!o->shard_arg && tw_shard_array_task(process_env, NULL, task, sizeof task)) {
        snprintf(o->shard_from, sizeof o->shard_from, "none: a whole run in a %s", task);
        snprintf(o->shard_note, sizeof o->shard_note,
                 "a whole run of every input in this %s; --shard auto runs only this "
                 "task's shard of the rows",
                 task);
    } else {
        snprintf(o->shard_from, sizeof o->shard_from, "%s", from);
    }
    return 0;
}

/* The environment knobs of tilewise.1's ENVIRONMENT: the command line reads
 * them, the library takes them as run options. */
static void env_knobs(tilewise_run_options *o)
{
    const char *v = getenv("TILEWISE_TIFF_DIRECT");
    if (v && strcmp(v, "0") == 0) o->tiff_direct = 0;
    v = getenv("TILEWISE_CPU_WINOGRAD");
    if (v && strcmp(v, "0") == 0) o->cpu_winograd = 0;
    if (v && strcmp(v, "own") == 0) o->cpu_winograd = 2;
    v = getenv("TILEWISE_CPU_GEMM"); /* 0 never, 1 wherever it applies (model/backend.h) */
    if (v && (strcmp(v, "0") == 0 || strcmp(v, "1") == 0)) o->cpu_gemm = atoi(v);
    v = getenv("TILEWISE_CPU_NHWC");
    if (v && (strcmp(v, "0") == 0 || strcmp(v, "1") == 0)) o->cpu_nhwc = atoi(v);
    v = getenv("TW_CUDA_FAIL_ALLOC_ABOVE"); /* gone from the API (issue 28): say so */
    if (v && *v)
        fprintf(stderr, "tilewise: TW_CUDA_FAIL_ALLOC_ABOVE is not read any more: "
                        "bench/run_hooked runs a workflow with that test hook\n");
}

/* What a run did, input by input (from the report's summaries). */
static void print_summary(const tilewise_report *rep, const tilewise_run_summary *sum)
{
    for (int i = 0; i < sum->n_inputs; i++) {
        tilewise_input_summary in = {.size = sizeof in};
        if (tilewise_report_input(rep, i, &in, NULL) != TILEWISE_OK) continue;
        if (in.skipped[0]) {
            printf("%s: skipped (input.on_error: skip): %s\n", in.path, in.skipped);
            continue;
        }
        /* Unreadable tiles (input.on_error: skip) are written as nodata too. */
        printf("%s: %lld tiles classified, %lld nodata", in.path, (long long)in.tiles_classified,
               (long long)(in.tiles_nodata + in.tiles_read_errors));
        if (in.tiles_read_errors) printf(" (%lld unreadable)", (long long)in.tiles_read_errors);
        printf(", in %.2f s (%.1f tiles/s)\n", in.seconds,
               in.seconds > 0 ? in.tiles_classified / in.seconds : 0.0);
        int64_t cells = in.nodata_cells;
        for (int c = 0; c < sum->n_classes; c++) cells += in.class_cells[c];
        if (cells == in.nodata_cells && in.tiles_classified > 0) { /* no class product asked */
            for (int o = 0; o < in.n_outputs; o++) printf("  wrote %s\n", in.outputs[o]);
            continue;
        }
        printf("  classes:");
        for (int c = 0; c < sum->n_classes; c++)
            printf(" %s %.1f%%", sum->class_names[c],
                   cells ? 100.0 * in.class_cells[c] / cells : 0.0);
        printf(", nodata %.1f%%\n", cells ? 100.0 * in.nodata_cells / cells : 0.0);
        for (int o = 0; o < in.n_outputs; o++) printf("  wrote %s\n", in.outputs[o]);
    }
}

/* The last JSON progress line of a run that got a report: how it ended,
 * and where run.json was written (null: nowhere, the output folder was
 * never made). */
static void progress_json_done(const tilewise_report *rep, const tilewise_run_summary *sum,
                               const tilewise_error *err, double seconds)
{
    const char *written = tilewise_report_path(rep);
    json_done(sum->status, sum->exit_code, sum->status == TILEWISE_OK ? NULL : err->message,
              sum->n_inputs, (long long)sum->tiles_classified, seconds,
              written[0] ? written : NULL);
}

/* The library's notices and warnings: one stderr line each ("tilewise: "
 * or "tilewise: warning: "), or a JSON event with --progress=json; -q drops
 * the notices. Called from any stage thread: one locked write per line. */
static void log_cb(int level, const char *msg, void *user)
{
    const progress_state *ps = user;
    if (level == TILEWISE_LOG_INFO && ps->quiet) return;
    char shown[MSG_MAX]; /* a warning may name a presigned URL */
    tilewise_redact(msg, shown, sizeof shown);
    msg = shown;
    flockfile(stderr);
    if (ps->mode == PROGRESS_JSON) {
        json_t *e = new_event("log");
        if (e) {
            json_object_set_new(e, "level",
                                json_string(level == TILEWISE_LOG_WARNING ? "warning" : "notice"));
            json_object_set_new(e, "message", jstr(msg));
            emit_event(e);
        }
    } else {
        fprintf(stderr, "tilewise: %s%s\n", level == TILEWISE_LOG_WARNING ? "warning: " : "", msg);
    }
    funlockfile(stderr);
}

static int cmd_run(int argc, char **argv)
{
    if (help_asked(argc, argv)) {
        fputs(run_help, stdout);
        return TILEWISE_EXIT_OK;
    }
    g_json_done = json_progress_asked(argc, argv);
    cli_opts o;
    int rc = parse_opts(argc, argv, true, &o);
    if (rc) return rc;
    g_json_done = o.progress == PROGRESS_JSON;
    if ((rc = resolve_shard(&o))) return rc;

    stop_on_signals();

    progress_state ps = {
        .mode = o.progress, .tty = isatty(2) != 0, .last_step = -1, .quiet = o.quiet};
    tilewise_run_options ro;
    tilewise_run_options_init(&ro);
    env_knobs(&ro);
    ro.sets = o.sets;
    ro.n_sets = o.n_sets;
    ro.progress = o.progress == PROGRESS_NONE ? NULL : progress_cb;
    ro.tiles = o.progress == PROGRESS_NONE ? NULL : tiles_cb;
    ro.log = log_cb;
    ro.user = &ps;
    ro.stop = &g_stop;
    if (o.shard_note[0]) log_cb(TILEWISE_LOG_INFO, o.shard_note, &ps);
    ro.shard_index = o.shard_index;
    ro.shard_count = o.shard_count;
    ro.shard_from = o.shard_from;
    ro.chunk_rows = o.chunk_rows;
    ro.quiet = o.quiet;
    ro.restart = o.restart;
    ro.strict = o.strict;
    ro.report_path = o.report;
    double t0 = mono_s();
    tilewise_report *rep = NULL;
    tilewise_error err;
    /* Writes run.json (also on failure, status and message inside, when the
     * output folder exists) and --report's file. */
    tilewise_status st = tilewise_run(o.workflow, &ro, &rep, &err);
    if (!rep) return fail(&err); /* the workflow could not be read (JSON: a done event) */

    tilewise_run_summary sum = {.size = sizeof sum};
    tilewise_report_summary(rep, &sum, NULL);
    if (st == TILEWISE_OK) {
        print_summary(rep, &sum);
        if (sum.shard_count > 1)
            printf("shard %d of %d done; when all are, run: tilewise merge %s\n",
                   sum.shard_index + 1, sum.shard_count, sum.output_dir);
        printf("report: %s\n", sum.run_json);
    }
    if (o.progress == PROGRESS_JSON) progress_json_done(rep, &sum, &err, mono_s() - t0);
    tilewise_report_free(rep);
    if (st == TILEWISE_OK) return sum.exit_code; /* 0, or 5: inputs were skipped */
    /* Stopped or failed mid-input: the progress line ends before the
     * message, which starts a line of its own ("tilewise: interrupted: ..."). */
    if (ps.mode == PROGRESS_TEXT && ps.current[0] && ps.last_step >= 0 && ps.last_step <= 40)
        fputc('\n', stderr);
    /* JSON mode: the done event carries the message; stderr stays JSON. */
    return o.progress == PROGRESS_JSON ? tilewise_exit_code(st) : fail(&err);
}

static int cmd_validate(int argc, char **argv)
{
    if (help_asked(argc, argv)) {
        fputs(validate_help, stdout);
        return TILEWISE_EXIT_OK;
    }
    cli_opts o;
    int rc = parse_opts(argc, argv, false, &o);
    if (rc) return rc;
    tilewise_run_options ro;
    tilewise_run_options_init(&ro);
    env_knobs(&ro);
    ro.sets = o.sets;
    ro.n_sets = o.n_sets;
    tilewise_validation *v = NULL;
    tilewise_error err;
    tilewise_status st = tilewise_validate(o.workflow, &ro, &v, &err);
    /* The plan as far as it got, then the error. */
    fputs(tilewise_validation_text(v), stdout);
    tilewise_validation_free(v);
    return st == TILEWISE_OK ? TILEWISE_EXIT_OK : fail(&err);
}

static int cmd_merge(int argc, char **argv)
{
    if (help_asked(argc, argv)) {
        fputs(merge_help, stdout);
        return TILEWISE_EXIT_OK;
    }
    bool quiet = false;
    const char *dir = NULL;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "-q") == 0 || strcmp(argv[i], "--quiet") == 0)
            quiet = true;
        else if (argv[i][0] == '-')
            return usage_error("unknown option '%s'", argv[i]);
        else if (!dir)
            dir = argv[i];
        else
            return usage_error("unexpected argument '%s'", argv[i]);
    }
    if (!dir) return usage_error("merge expects OUTPUT_DIR%s", "");
    stop_on_signals(); /* SLURM's TERM before its KILL: exit 75, never a signal */
    tilewise_run_options ro;
    tilewise_run_options_init(&ro);
    ro.quiet = quiet;
    ro.stop = &g_stop;
    tilewise_report *rep = NULL;
    tilewise_error err;
    tilewise_status st = tilewise_merge(dir, &ro, &rep, &err);
    tilewise_run_summary sum = {.size = sizeof sum};
    if (st == TILEWISE_OK && tilewise_report_summary(rep, &sum, NULL) == TILEWISE_OK) {
        for (int i = 0; i < sum.n_inputs; i++) {
            tilewise_input_summary in = {.size = sizeof in};
            if (tilewise_report_input(rep, i, &in, NULL) != TILEWISE_OK) continue;
            for (int o = 0; o < in.n_outputs; o++) printf("wrote %s\n", in.outputs[o]);
        }
        if (sum.n_inputs == 0 && !quiet)
            printf("%s: already merged (no parts left under %s/.tilewise/): nothing to do\n", dir,
                   dir);
    }
    tilewise_report_free(rep);
    return st == TILEWISE_OK ? TILEWISE_EXIT_OK : fail(&err);
}

static int cmd_info(int argc, char **argv)
{
    if (help_asked(argc, argv)) {
        fputs(info_help, stdout);
        return TILEWISE_EXIT_OK;
    }
    bool json = false;
    const char *path = NULL;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            json = true;
        else if (argv[i][0] == '-' && argv[i][1] != '\0')
            return usage_error("unknown option '%s'", argv[i]);
        else if (!path)
            path = argv[i];
        else
            return usage_error("info expects one FILE, got also '%s'", argv[i]);
    }
    if (!path) return usage_error("info expects one FILE%s", "");
    tilewise_run_options ro;
    tilewise_run_options_init(&ro);
    env_knobs(&ro); /* TILEWISE_TIFF_DIRECT decides what "usable" means */
    char *text = NULL;
    tilewise_error err;
    tilewise_status st = tilewise_info(path, &ro, json, &text, &err);
    if (text) fputs(text, stdout);
    tilewise_string_free(text);
    if (st == TILEWISE_OK) return TILEWISE_EXIT_OK;
    /* A remote raster that could not be reached is an input error to
     * info (exit 3), named as what it is. */
    if (st == TILEWISE_ERR_REMOTE) {
        char msg[MSG_MAX];
        tilewise_redact(err.message, msg, sizeof msg);
        fprintf(stderr, "tilewise: network error: %s\n", msg);
        return TILEWISE_EXIT_INPUT;
    }
    return fail(&err);
}

static int print_help(const char *cmd)
{
    static const struct {
        const char *name;
        const char **text;
    } helps[] = {
        {"run", &run_help},     {"validate", &validate_help}, {"info", &info_help},
        {"merge", &merge_help}, {"submit", &submit_help},
    };
    for (size_t i = 0; cmd && i < sizeof helps / sizeof *helps; i++) {
        if (strcmp(cmd, helps[i].name) == 0) {
            fputs(*helps[i].text, stdout);
            return TILEWISE_EXIT_OK;
        }
    }
    if (cmd) return usage_error("no help for unknown command '%s'", cmd);
    fputs(usage_text, stdout);
    return TILEWISE_EXIT_OK;
}

/* A stopped run or merge (exit 75) leaves at once, without the teardown
 * that exit() runs after main: the libraries' destructors and atexit
 * handlers (GDAL's, oneDNN's, libgomp's and OpenBLAS's pools, still alive
 * at exit). Nothing is left to write: the committed chunks and run.json
 * are on disk (fsynced) before tilewise_run returns. Issue 39 saw two of
 * about 30 stopped runs crash after their last line ("free(): invalid
 * pointer", SIGSEGV): a clean stop must never end in a core dump, which a
 * SLURM requeue would not survive, whatever a library does at exit. (The
 * cause of those crashes was the signal's frame written into oneDNN's heap
 * workspace: see stop_on_signals.) */
static int leave_if_stopped(int rc)
{
    if (rc != TILEWISE_EXIT_INTERRUPTED) return rc;
    fflush(NULL);
#ifdef __SANITIZE_ADDRESS__
    __lsan_do_leak_check(); /* the sanitizer pass still checks the stop path for leaks */
#endif
    _exit(rc);
}

int main(int argc, char **argv)
{
    /* A fixed mmap threshold: every allocation of 128 KiB or more gets its
     * own mapping and goes back to the system when freed. glibc's default
     * raises the threshold to the size of each large block freed, so after
     * the model file's tensors and the net's weights are freed (at load,
     * and as the CPU backend reorders them) blocks of those sizes come from
     * the heap, where freed memory stays resident: 38-44 MiB more peak RSS
     * for ResNet-50 (bench/RESULTS.md). */
    mallopt(M_MMAP_THRESHOLD, 128 * 1024);
    g_t0 = mono_s();
    /* run --progress=json: even a bad --config ends with a done event. */
    g_json_done = argc > 2 && strcmp(argv[1], "run") == 0 &&
                  json_progress_asked(argc - 2, argv + 2) && !help_asked(argc - 2, argv + 2);
    if (argc < 2) {
        fputs(usage_text, stderr);
        return TILEWISE_EXIT_USAGE;
    }
    /* --config KEY VALUE, anywhere, as GDAL's own tools take it: set here,
     * before any GDAL call, and removed from the arguments (so that a
     * credential passed this way is not echoed into a job script). */
    int n = 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--config") == 0) {
            if (i + 2 >= argc) return usage_error("--config needs KEY VALUE%s", "");
            tilewise_config_set(argv[i + 1], argv[i + 2], NULL);
            i += 2;
            continue;
        }
        argv[n++] = argv[i];
    }
    argc = n;
    argv[argc] = NULL;
    if (argc < 2) {
        fputs(usage_text, stderr);
        return TILEWISE_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0)
        return print_help(argc > 2 ? argv[2] : NULL);
    if (strcmp(cmd, "--version") == 0) {
        printf("tilewise %s\n", tilewise_version());
        printf("GDAL %s\n", GDALVersionInfo("RELEASE_NAME"));
        return TILEWISE_EXIT_OK;
    }
    if (strcmp(cmd, "run") == 0) return leave_if_stopped(cmd_run(argc - 2, argv + 2));
    if (strcmp(cmd, "validate") == 0) return cmd_validate(argc - 2, argv + 2);
    if (strcmp(cmd, "info") == 0) return cmd_info(argc - 2, argv + 2);
    if (strcmp(cmd, "merge") == 0) return leave_if_stopped(cmd_merge(argc - 2, argv + 2));
    if (strcmp(cmd, "submit") == 0) {
        if (help_asked(argc - 2, argv + 2)) return print_help("submit");
        return tw_cli_submit(argc - 2, argv + 2);
    }
    return usage_error("unknown command '%s'", cmd);
}

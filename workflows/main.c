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
 * and the only one that prints progress. validate's value-range and CRS
 * checks live here too: they are advice for a person, printed, never
 * errors, so the library stays free of printing.
 */
#include <malloc.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cpl_conv.h>
#include <gdal.h>

#include "io/inspect.h"
#include "io/legend.h"
#include "io/model_file.h"
#include "io/raster.h"
#include "io/url.h"
#include "model/resnet.h"
#include "pipeline/json.h"
#include "pipeline/run.h"
#include "workflows/submit.h"
#include "workflows/workflow.h"

#define MAX_SETS 128

/* Lock-free (checked below), so the handler may store to it and the stage
 * threads read it without a data race; volatile sig_atomic_t promises the
 * first only. */
static atomic_int g_stop;
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "the stop flag must be lock-free to be set in a handler");

static void on_signal(int sig)
{
    (void)sig;
    atomic_store(&g_stop, 1);
}

/* ---- help texts ---- */

static const char *usage_text =
    "usage: tilewise <command> [options]      (tilewise <command> --help for more)\n"
    "\n"
    "commands:\n"
    "  run WORKFLOW.yaml [--set key.path=value]... [--shard I/N] [-q] [--report FILE]\n"
    "                    [--progress=text|json|none] [--chunk-rows N] [--restart]\n"
    "                    classify every input raster of the workflow; output rows are\n"
    "                    committed in chunks (N rows; default about 1024 tiles' worth), so\n"
    "                    running the same command after a kill redoes only what is missing.\n"
    "                    --shard I/N (or a SLURM array task) runs the I-th of N bands of rows\n"
    "  validate WORKFLOW.yaml [--set key.path=value]...\n"
    "                    check config, inputs and model; print the plan and memory estimate\n"
    "  info [--json] FILE\n"
    "                    describe a raster or a model file\n"
    "  merge OUTPUT_DIR  after sharded runs: check every shard finished, write the mosaics\n"
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
    "  --shard I/N            run the I-th of N bands of output rows (1-based); under a SLURM\n"
    "                         job array it comes from SLURM_ARRAY_TASK_ID/COUNT/MIN.\n"
    "                         Then: tilewise merge OUTPUT_DIR\n"
    "  --chunk-rows N         output rows per committed chunk (default: about 1024 tiles)\n"
    "  --restart              discard committed parts made with another configuration,\n"
    "                         model or raster (without it the run refuses, exit 6, and\n"
    "                         deletes nothing); parts of this configuration still resume\n"
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
    "    stretched pixels or huge tiles, odd pixel sizes, no CRS.\n"
    "Advice lines start with 'warning'; they do not change the exit code.\n"
    "\n"
    "exit codes: 0 the run can start, 2 workflow error, 3 input or model does not fit\n";

static const char *info_help =
    "usage: tilewise info [--json] FILE\n"
    "\n"
    "Describe a raster (driver, size, CRS as EPSG code and units, pixel size, bands with\n"
    "type, nodata, block size, description) or a model file (.h5 bundle, .safetensors:\n"
    "architecture, bands, classes, parameters, normalization, tile size, sha256).\n"
    "  --json   one JSON object on stdout instead of text\n";

static const char *merge_help =
    "usage: tilewise merge [-q] OUTPUT_DIR\n"
    "\n"
    "After sharded runs (--shard I/N, or a SLURM array) into OUTPUT_DIR: check that every\n"
    "output row of every input is committed, then write the final products as the\n"
    "workflow asked and remove the parts. Exit 3 naming the missing rows when a shard\n"
    "has not finished.\n";

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
    "\n"
    "exit 4 when sbatch is missing or refuses a job (its message is shown)\n";

static int usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, "tilewise: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (see tilewise --help)\n");
    return TW_EXIT_USAGE;
}

static int fail(const tw_error *err)
{
    /* Messages name inputs redacted where they are made (io/url.h); this
     * catches one that quotes a URL from elsewhere. */
    char msg[TW_ERROR_MSG_MAX];
    tw_url_redact(err->msg, msg, sizeof msg);
    fprintf(stderr, "tilewise: %s: %s\n", tw_status_name(err->status), msg);
    return tw_status_exit_code(err->status);
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
    char current[TW_PATH_MAX]; /* input under way; "" before the first */
    int last_step;             /* text: of 40 (2.5 % each), 41 = line closed */
    int last_pct;              /* json: last whole percent written */
    double t0;                 /* when the input started */
    double last_draw;          /* tty: last redraw */
    int64_t done, total;       /* tiles, from the tiles hook */
    bool quiet;                /* -q: notices are not shown */
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
    tw_json j = tw_json_file(stderr);
    tw_json_open(&j, NULL, '{');
    tw_json_str(&j, "event", "progress");
    tw_json_str(&j, "input", ps->current);
    tw_json_fixed(&j, "fraction", complete, 6);
    tw_json_int(&j, "tiles_done", (long long)ps->done);
    tw_json_int(&j, "tiles_total", (long long)ps->total);
    tw_json_num(&j, "tiles_per_s", rate);
    tw_json_num(&j, "eta_s", eta);
    tw_json_fixed(&j, "elapsed_s", mono_s() - ps->t0, 3);
    tw_json_close(&j, '}');
    fputc('\n', stderr);
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
        tw_url_redact(message, shown, sizeof shown);
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
            tw_json j = tw_json_file(stderr);
            tw_json_open(&j, NULL, '{');
            tw_json_str(&j, "event", "start");
            tw_json_str(&j, "input", message);
            tw_json_int(&j, "tiles_total", (long long)ps->total);
            tw_json_close(&j, '}');
            fputc('\n', stderr);
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
    return atomic_load(&g_stop) ? 0 : 1;
}

/* ---- run / validate ---- */

typedef struct cli_opts {
    const char *workflow;
    const char *sets[MAX_SETS];
    int n_sets;
    int shard_index, shard_count;
    bool shard_given;
    int chunk_rows;
    bool quiet;
    bool restart;
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
            int idx, cnt;
            char extra;
            if (!v || sscanf(v, "%d/%d%c", &idx, &cnt, &extra) != 2 || cnt < 1 || idx < 1 ||
                idx > cnt)
                return usage_error("--shard expects I/N with 1 <= I <= N, got '%s'", v ? v : "");
            o->shard_index = idx - 1;
            o->shard_count = cnt;
            o->shard_given = true;
        } else if (allow_run_opts &&
                   (strcmp(a, "--chunk-rows") == 0 || strncmp(a, "--chunk-rows=", 13) == 0)) {
            const char *v = a[12] == '=' ? a + 13 : (i + 1 < argc ? argv[++i] : NULL);
            char *end = NULL;
            long n = v ? strtol(v, &end, 10) : 0;
            if (!v || *end || n < 1 || n > 1000000)
                return usage_error("--chunk-rows expects a positive number of rows, got '%s'",
                                   v ? v : "");
            o->chunk_rows = (int)n;
        } else if (allow_run_opts && strcmp(a, "--restart") == 0) {
            o->restart = true;
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

/* A SLURM job array task runs its shard without --shard: task ID minus the
 * array's first ID, of the array's task count. */
static int slurm_shard(cli_opts *o)
{
    const char *id = getenv("SLURM_ARRAY_TASK_ID");
    const char *count = getenv("SLURM_ARRAY_TASK_COUNT");
    const char *min = getenv("SLURM_ARRAY_TASK_MIN");
    if (!id || !count) return 0;
    char *end;
    long i = strtol(id, &end, 10);
    if (*end) return usage_error("SLURM_ARRAY_TASK_ID '%s' is not a number", id);
    long n = strtol(count, &end, 10);
    if (*end || n < 1) return usage_error("SLURM_ARRAY_TASK_COUNT '%s' is not a count", count);
    long lo = min ? strtol(min, &end, 10) : 0;
    if (min && *end) return usage_error("SLURM_ARRAY_TASK_MIN '%s' is not a number", min);
    if (i - lo < 0 || i - lo >= n)
        return usage_error("SLURM array task %s is outside the array (use --array=0-N-1 or set "
                           "--shard)",
                           id);
    o->shard_index = (int)(i - lo);
    o->shard_count = (int)n;
    return 0;
}

/* The environment knobs of tilewise.1's ENVIRONMENT: the command line reads
 * them, the library takes them as params. */
static void env_knobs(tw_run_params *p)
{
    const char *v = getenv("TILEWISE_TIFF_DIRECT");
    if (v && strcmp(v, "0") == 0) p->input.tiff_direct = false;
    v = getenv("TILEWISE_CPU_WINOGRAD");
    if (v && strcmp(v, "0") == 0) p->runtime.cpu_winograd = 0;
    if (v && strcmp(v, "own") == 0) p->runtime.cpu_winograd = 2;
    v = getenv("TILEWISE_CPU_GEMM"); /* 0 never, 1 wherever it applies (model/backend.h) */
    if (v && (strcmp(v, "0") == 0 || strcmp(v, "1") == 0)) p->runtime.cpu_gemm = atoi(v);
    v = getenv("TILEWISE_CPU_NHWC");
    if (v && (strcmp(v, "0") == 0 || strcmp(v, "1") == 0)) p->runtime.cpu_nhwc = atoi(v);
    v = getenv("TW_CUDA_FAIL_ALLOC_ABOVE"); /* test hook, cuda/README.md */
    if (v && *v) p->runtime.cuda_fail_above = (size_t)strtoull(v, NULL, 10);
}

static int load_params(const cli_opts *o, tw_run_params *p, tw_error *err)
{
    if (tw_workflow_load(o->workflow, o->sets, o->n_sets, p, err) != TW_OK) return fail(err);
    env_knobs(p);
    p->shard_index = o->shard_index;
    p->shard_count = o->shard_count;
    p->quiet = o->quiet;
    p->restart = o->restart;
    p->chunk_rows = o->chunk_rows;
    if (o->report) snprintf(p->report_path, sizeof p->report_path, "%s", o->report);
    return 0;
}

static void print_summary(const tw_run_result *r)
{
    for (int i = 0; i < r->n_inputs; i++) {
        const tw_input_result *in = &r->inputs[i];
        if (in->skipped[0]) {
            printf("%s: skipped (input.on_error: skip): %s\n", in->path, in->skipped);
            continue;
        }
        printf("%s: %lld tiles classified, %lld nodata, in %.2f s (%.1f tiles/s)\n", in->path,
               (long long)in->tiles_classified, (long long)in->tiles_nodata, in->seconds,
               in->seconds > 0 ? in->tiles_classified / in->seconds : 0.0);
        printf("  classes:");
        int64_t cells = in->nodata_cells;
        for (int c = 0; c < r->model.n_classes; c++) cells += in->hist[c];
        for (int c = 0; c < r->model.n_classes; c++)
            printf(" %s %.1f%%", r->model.classes[c], cells ? 100.0 * in->hist[c] / cells : 0.0);
        printf(", nodata %.1f%%\n", cells ? 100.0 * in->nodata_cells / cells : 0.0);
        for (int o = 0; o < in->n_outputs; o++) printf("  wrote %s\n", in->outputs[o]);
    }
}

/* The last JSON progress line: how the run ended. */
static void progress_json_done(const tw_run_result *r, tw_status st, const tw_error *err,
                               const char *report, double seconds)
{
    tw_json j = tw_json_file(stderr);
    tw_json_open(&j, NULL, '{');
    tw_json_str(&j, "event", "done");
    tw_json_str(&j, "status", st == TW_OK ? "ok" : tw_status_name(st));
    tw_json_int(&j, "exit_code",
                st != TW_OK                  ? tw_status_exit_code(st)
                : r && r->inputs_skipped > 0 ? TW_EXIT_SKIPPED
                                             : TW_EXIT_OK);
    if (st != TW_OK) tw_json_str(&j, "message", err->msg);
    if (r) {
        tw_json_int(&j, "inputs", r->n_inputs);
        tw_json_int(&j, "tiles_classified", (long long)r->tiles_classified);
    }
    tw_json_fixed(&j, "seconds", seconds, 3);
    tw_json_str(&j, "report", report);
    tw_json_close(&j, '}');
    fputc('\n', stderr);
    fflush(stderr);
}

/* The library's notices and warnings: one stderr line each ("tilewise: "
 * or "tilewise: warning: "), or a JSON event with --progress=json; -q drops
 * the notices. Called from any stage thread: one locked write per line. */
static void log_cb(tw_log_level level, const char *msg, void *user)
{
    const progress_state *ps = user;
    if (level == TW_LOG_NOTICE && ps->quiet) return;
    char shown[TW_ERROR_MSG_MAX * 2]; /* a warning may name a presigned URL (io/url.h) */
    tw_url_redact(msg, shown, sizeof shown);
    msg = shown;
    flockfile(stderr);
    if (ps->mode == PROGRESS_JSON) {
        tw_json j = tw_json_file(stderr);
        tw_json_open(&j, NULL, '{');
        tw_json_str(&j, "event", "log");
        tw_json_str(&j, "level", level == TW_LOG_WARNING ? "warning" : "notice");
        tw_json_str(&j, "message", msg);
        tw_json_close(&j, '}');
        fputc('\n', stderr);
    } else {
        fprintf(stderr, "tilewise: %s%s\n", level == TW_LOG_WARNING ? "warning: " : "", msg);
    }
    funlockfile(stderr);
}

static int cmd_run(int argc, char **argv)
{
    if (help_asked(argc, argv)) {
        fputs(run_help, stdout);
        return TW_EXIT_OK;
    }
    cli_opts o;
    int rc = parse_opts(argc, argv, true, &o);
    if (rc) return rc;
    if (!o.shard_given && (rc = slurm_shard(&o))) return rc;
    tw_error err;
    tw_error_init(&err);
    tw_run_params p;
    if ((rc = load_params(&o, &p, &err))) return rc;

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);

    progress_state ps = {
        .mode = o.progress, .tty = isatty(2) != 0, .last_step = -1, .quiet = p.quiet};
    tw_run_hooks hooks = {.progress = o.progress == PROGRESS_NONE ? NULL : progress_cb,
                          .progress_user = &ps,
                          .tiles = tiles_cb,
                          .stop = &g_stop,
                          .log = {.fn = log_cb, .user = &ps}};
    double t0 = mono_s();
    tw_run_result *r = NULL;
    tw_status st = tw_run(&p, &hooks, &r, &err);

    /* The report is written also on failure (status and message inside),
     * as long as the output directory exists. */
    char report[TW_PATH_MAX + 64];
    struct stat sb;
    if (p.shard_count > 1)
        snprintf(report, sizeof report, "%s/run.shard%04d-of-%04d.json", p.output.dir,
                 p.shard_index + 1, p.shard_count);
    else
        snprintf(report, sizeof report, "%s/run.json", p.output.dir);
    tw_error rerr;
    tw_error_init(&rerr);
    /* Not over the report of the process that holds the lock. */
    if (st != TW_ERR_LOCKED && stat(p.output.dir, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        tw_status rs = tw_report_write(report, &p, r, st, st == TW_OK ? NULL : err.msg, &rerr);
        if (rs != TW_OK && st == TW_OK) st = tw_error_set(&err, rs, "%s", rerr.msg);
    }
    if (p.report_path[0]) {
        tw_status rs =
            tw_report_write(p.report_path, &p, r, st, st == TW_OK ? NULL : err.msg, &rerr);
        if (rs != TW_OK && st == TW_OK) st = tw_error_set(&err, rs, "%s", rerr.msg);
    }
    if (st == TW_OK) {
        print_summary(r);
        if (p.shard_count > 1)
            printf("shard %d of %d done; when all are, run: tilewise merge %s\n", p.shard_index + 1,
                   p.shard_count, p.output.dir);
        printf("report: %s\n", report);
    }
    if (o.progress == PROGRESS_JSON) progress_json_done(r, st, &err, report, mono_s() - t0);
    int skipped = r ? r->inputs_skipped : 0;
    tw_run_result_destroy(r);
    if (st == TW_OK) return skipped > 0 ? TW_EXIT_SKIPPED : TW_EXIT_OK;
    /* JSON mode: the done event carries the message; stderr stays JSON. */
    return o.progress == PROGRESS_JSON ? tw_status_exit_code(st) : fail(&err);
}

/* ---- validate: advice on value ranges and georeferencing ---- */

static int g_warnings;

static void advise(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void advise(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("warning   ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    g_warnings++;
}

static void check_georef(const char *path, const tw_inspect *ri, int tile)
{
    if (!ri->has_geotransform) {
        advise("%s: no geotransform: the outputs will be in pixel coordinates", path);
        return;
    }
    if (!ri->has_crs) {
        advise("%s: no CRS: the outputs will have none either (assign one with "
               "gdal_edit.py -a_srs)",
               path);
        return;
    }
    if (!ri->crs_understood) {
        advise("%s: its CRS is not understood by GDAL", path);
        return;
    }
    double px, py;
    if (!tw_inspect_pixel_metres(ri, &px, &py)) {
        printf("crs       %s: %s\n", path, ri->crs);
        return;
    }
    const double *gt = ri->geotransform;
    const char *unit = ri->crs_units;
    printf("crs       %s: %s, units %s; pixel %.4g x %.4g m, a tile of %d px covers %.3g x %.3g "
           "km\n",
           path, ri->crs, unit, px, py, tile, tile * px / 1000, tile * py / 1000);
    bool geographic = ri->crs_geographic;
    if (gt[2] != 0 || gt[4] != 0)
        advise("%s: the raster is rotated (geotransform terms %g, %g): tiles follow its pixel "
               "grid, not north",
               path, gt[2], gt[4]);
    double ratio = px / py;
    if (ratio > 1.5 || ratio < 1 / 1.5)
        advise("%s: pixels are %.3g m wide but %.3g m high%s: the model sees stretched images "
               "(reproject with gdalwarp -t_srs to a projected CRS)",
               path, px, py, geographic ? " (degrees of longitude shrink with latitude)" : "");
    if (geographic && tile * fmax(px, py) > 10000)
        advise("%s: in a geographic CRS (%s) a tile of %d px spans about %.0f km: is that the "
               "resolution the model was trained at?",
               path, unit, tile, tile * fmax(px, py) / 1000);
    if (fmin(px, py) < 0.05 || fmax(px, py) > 5000)
        advise("%s: a pixel size of %.3g m is unusual for satellite imagery: are the CRS units "
               "(%s) right?",
               path, fmin(px, py) < 0.05 ? fmin(px, py) : fmax(px, py), unit);
}

static void check_values(const char *path, const char *gdal_path, const tw_resolved *m)
{
    int n = m->n_bands > 0 ? m->n_bands : m->in_bands;
    int fits = 0;
    int bands[TW_MAX_BANDS];
    double los[TW_MAX_BANDS], his[TW_MAX_BANDS];
    const char *hows[TW_MAX_BANDS];
    bool oks[TW_MAX_BANDS];
    for (int i = 0; i < n; i++) bands[i] = m->n_bands > 0 ? m->bands[i] : i + 1;
    tw_error err;
    tw_error_init(&err);
    if (tw_inspect_band_ranges(gdal_path, bands, n, los, his, hows, oks, &err) != TW_OK) return;
    for (int i = 0; i < n; i++) {
        int band = bands[i];
        double lo = los[i], hi = his[i];
        const char *how = hows[i];
        if (!hows[i]) continue; /* no such band: the run's checks say so */
        if (!oks[i]) {
            advise("%s band %d: cannot compute its range (no valid pixels?)", path, band);
            continue;
        }
        double mean = m->mean[i], sd = m->std[i];
        double zlo = (lo * m->scale - mean) / sd, zhi = (hi * m->scale - mean) / sd;
        /* A network trained on (x - mean) / std sees values within a few
         * units; ranges far outside, or squeezed to nothing, are the
         * classic wrong-input.scale symptoms. */
        bool far = zlo > 8 || zhi < -8;
        bool wide = zhi - zlo > 200;
        bool flat = hi > lo && zhi - zlo < 0.05;
        if (!far && !wide && !flat) {
            fits++;
            continue;
        }
        char hint[96] = "";
        double mid = (lo + hi) / 2;
        /* Only the order of magnitude: a mid-range is not a mean. */
        if (mid > 0 && mean > 0)
            snprintf(hint, sizeof hint, "; is input.scale %g meant?",
                     pow(10.0, round(log10(mean / mid))));
        advise("%s band %d: values %g..%g (%s) x scale %g give %.3g..%.3g after the model's "
               "mean %g / std %g, %s%s",
               path, band, lo, hi, how, m->scale, zlo, zhi, mean, sd,
               far    ? "far from what it was trained on"
               : wide ? "a very wide range"
                      : "almost constant",
               hint);
    }
    printf("values    %s: %d of %d bands within a plausible range of the model's mean/std "
           "(scale %g)\n",
           path, fits, n, m->scale);
}

static void validate_advice(const tw_run_params *p)
{
    tw_error err;
    tw_error_init(&err);
    tw_resolved m;
    if (tw_resolve(p, &m, &err) != TW_OK) return; /* tw_validate already accepted it */
    /* STAC items (input.assets) are checked by tw_validate; these hints are
     * for raster paths. */
    for (int i = 0; i < p->input.n_paths && p->input.n_assets == 0; i++) {
        char shown[TW_URL_SHOWN_MAX], gpath[TW_PATH_MAX + 16];
        tw_url_redact(p->input.paths[i], shown, sizeof shown);
        if (tw_url_to_gdal(p->input.paths[i], gpath, sizeof gpath, &err) != TW_OK) continue;
        tw_inspect *ri = NULL;
        if (tw_inspect_raster(gpath, shown, &ri, &err) != TW_OK) continue;
        check_georef(shown, ri, m.tile);
        tw_inspect_destroy(ri);
        /* Statistics read every pixel: not over the network. */
        if (!tw_url_is_remote(p->input.paths[i])) check_values(shown, gpath, &m);
        tw_raster *r = NULL;
        tw_raster_open_params op = {.tiff_direct = p->input.tiff_direct};
        if (tw_raster_open_ex(p->input.paths[i], m.bands, m.n_bands, &op, &r, &err) == TW_OK) {
            const char *why = "";
            tw_raster_reader(r, &why);
            if (why[0])
                printf("reader    %s: GDAL (%s)\n", shown, why);
            else
                printf("reader    %s: libtiff, whole tiles decoded directly\n", shown);
            tw_raster_close(r);
        }
    }
}

static int cmd_validate(int argc, char **argv)
{
    if (help_asked(argc, argv)) {
        fputs(validate_help, stdout);
        return TW_EXIT_OK;
    }
    cli_opts o;
    int rc = parse_opts(argc, argv, false, &o);
    if (rc) return rc;
    tw_error err;
    tw_error_init(&err);
    tw_run_params p;
    if ((rc = load_params(&o, &p, &err))) return rc;
    if (tw_validate(&p, stdout, &err) != TW_OK) return fail(&err);
    g_warnings = 0;
    validate_advice(&p);
    printf("advice    %d warning%s\n", g_warnings, g_warnings == 1 ? "" : "s");
    return TW_EXIT_OK;
}

static int cmd_merge(int argc, char **argv)
{
    if (help_asked(argc, argv)) {
        fputs(merge_help, stdout);
        return TW_EXIT_OK;
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
    tw_error err;
    tw_error_init(&err);
    tw_run_result *r = NULL;
    tw_status st = tw_merge(dir, quiet, &r, &err);
    if (st == TW_OK) {
        for (int i = 0; i < r->n_inputs; i++)
            for (int o = 0; o < r->inputs[i].n_outputs; o++)
                printf("wrote %s\n", r->inputs[i].outputs[o]);
    }
    tw_run_result_destroy(r);
    return st == TW_OK ? TW_EXIT_OK : fail(&err);
}

/* ---- info ---- */

static bool looks_like_model(const char *path)
{
    const char *dot = strrchr(path, '.');
    if (!dot) return false;
    return strcmp(dot, ".h5") == 0 || strcmp(dot, ".hdf5") == 0 || strcmp(dot, ".safetensors") == 0;
}

static int info_model(const char *path, bool json)
{
    tw_error err;
    tw_error_init(&err);
    tw_model_file *mf = NULL;
    if (tw_model_file_load(path, &mf, &err) != TW_OK) return fail(&err);
    tw_resnet *net = NULL;
    if (tw_resnet_create(mf, mf->arch, &net, &err) != TW_OK) {
        tw_model_file_destroy(mf);
        return fail(&err);
    }
    long long params = 0;
    for (int i = 0; i < mf->n_tensors; i++)
        if (!strstr(mf->tensors[i].name, "running_") && !strstr(mf->tensors[i].name, "num_batches"))
            params += mf->tensors[i].numel;
    if (json) {
        char arch[32];
        snprintf(arch, sizeof arch, "resnet%d", net->depth);
        tw_json j = tw_json_file(stdout);
        tw_json_open(&j, NULL, '{');
        tw_json_str(&j, "type", "model");
        tw_json_str(&j, "path", path);
        tw_json_str(&j, "arch", arch);
        tw_json_open(&j, "blocks", '[');
        for (int i = 0; i < 4; i++) tw_json_int(&j, NULL, net->stage_blocks[i]);
        tw_json_close(&j, ']');
        tw_json_int(&j, "in_bands", net->in_bands);
        tw_json_open(&j, "bands", '[');
        for (int i = 0; i < mf->n_bands; i++) tw_json_int(&j, NULL, mf->bands[i]);
        tw_json_close(&j, ']');
        tw_json_int(&j, "n_classes", net->n_classes);
        tw_json_open(&j, "classes", '[');
        for (int i = 0; i < mf->n_classes; i++) tw_json_str(&j, NULL, mf->classes[i]);
        tw_json_close(&j, ']');
        tw_json_int(&j, "features", net->feat_dim);
        tw_json_int(&j, "parameters", params);
        tw_json_num(&j, "scale", mf->scale);
        tw_json_open(&j, "mean", '[');
        for (int i = 0; i < mf->n_mean; i++) tw_json_real(&j, NULL, mf->mean[i], 9);
        tw_json_close(&j, ']');
        tw_json_open(&j, "std", '[');
        for (int i = 0; i < mf->n_std; i++) tw_json_real(&j, NULL, mf->std[i], 9);
        tw_json_close(&j, ']');
        if (mf->tile)
            tw_json_int(&j, "tile", mf->tile);
        else
            tw_json_null(&j, "tile");
        tw_json_str(&j, "sha256", mf->sha256);
        tw_json_close(&j, '}');
        printf("\n");
    } else {
        printf("model:      %s\n", path);
        printf("arch:       resnet%d (%s blocks %d-%d-%d-%d)\n", net->depth,
               net->bottleneck ? "bottleneck" : "basic", net->stage_blocks[0], net->stage_blocks[1],
               net->stage_blocks[2], net->stage_blocks[3]);
        printf("bands:      %d", net->in_bands);
        if (mf->n_bands) {
            printf(" (raster bands");
            for (int i = 0; i < mf->n_bands; i++) printf(" %d", mf->bands[i]);
            printf(")");
        }
        printf("\nclasses:    %d", net->n_classes);
        for (int i = 0; i < mf->n_classes; i++) printf("%s%s", i ? ", " : " (", mf->classes[i]);
        printf("%s\n", mf->n_classes ? ")" : "");
        printf("features:   %d\n", net->feat_dim);
        printf("parameters: %lld\n", params);
        if (!isnan(mf->scale)) printf("scale:      %g\n", mf->scale);
        if (mf->n_mean) {
            printf("mean:      ");
            for (int i = 0; i < mf->n_mean; i++) printf(" %g", mf->mean[i]);
            printf("\n");
        }
        if (mf->n_std) {
            printf("std:       ");
            for (int i = 0; i < mf->n_std; i++) printf(" %g", mf->std[i]);
            printf("\n");
        }
        if (!mf->n_mean && !mf->n_std)
            printf("normalize:  not in the file (give model.mean and model.std)\n");
        if (mf->tile) printf("tile:       %d\n", mf->tile);
        printf("sha256:     %s\n", mf->sha256);
    }
    tw_resnet_destroy(net);
    tw_model_file_destroy(mf);
    return TW_EXIT_OK;
}

static int info_raster(const char *user_path, bool json)
{
    /* https:// and s3:// as the run opens them; shown with credentials
     * redacted (io/url.h). */
    char path[TW_URL_SHOWN_MAX], gpath[TW_PATH_MAX + 16];
    tw_url_redact(user_path, path, sizeof path);
    tw_error uerr;
    tw_error_init(&uerr);
    if (tw_url_to_gdal(user_path, gpath, sizeof gpath, &uerr) != TW_OK) return fail(&uerr);
    tw_inspect *ri = NULL;
    if (tw_inspect_raster(gpath, path, &ri, &uerr) != TW_OK) {
        fprintf(stderr, "tilewise: %s: %s\n",
                tw_url_is_remote(user_path) && tw_url_transient(uerr.msg) ? "network error"
                                                                          : "input error",
                uerr.msg);
        return TW_EXIT_INPUT;
    }
    /* Whether tilewise itself accepts it (all bands one supported type). */
    tw_error err;
    tw_error_init(&err);
    tw_raster *tr = NULL;
    tw_run_params knobs = tw_run_default_params();
    env_knobs(&knobs);
    tw_raster_open_params op = {.tiff_direct = knobs.input.tiff_direct};
    bool usable = tw_raster_open_ex(user_path, NULL, 0, &op, &tr, &err) == TW_OK;
    tw_raster_close(tr);

    int w = ri->width, h = ri->height, nb = ri->band_count;
    const char *dname = ri->driver;
    const double *gt = ri->geotransform;
    bool has_gt = ri->has_geotransform;
    const char *crs = ri->crs, *kind = ri->crs_kind, *unit_buf = ri->crs_units;
    double mx = ri->metres_x, my = ri->metres_y;
    const char *ovr_layout = ri->layout[0] ? ri->layout : NULL;
    const char *compression = ri->compression[0] ? ri->compression : NULL;

    tw_json j = tw_json_file(stdout);
    if (json) {
        tw_json_open(&j, NULL, '{');
        tw_json_str(&j, "type", "raster");
        tw_json_str(&j, "path", path);
        tw_json_str(&j, "driver", dname);
        tw_json_int(&j, "width", w);
        tw_json_int(&j, "height", h);
        tw_json_int(&j, "band_count", nb);
        tw_json_str(&j, "crs", crs);
        tw_json_str(&j, "crs_kind", kind);
        tw_json_str(&j, "crs_units", unit_buf);
        if (has_gt) {
            tw_json_open(&j, "geotransform", '[');
            for (int i = 0; i < 6; i++) tw_json_real(&j, NULL, gt[i], 17);
            tw_json_close(&j, ']');
        } else {
            tw_json_null(&j, "geotransform");
        }
        if (has_gt && unit_buf[0]) {
            tw_json_open(&j, "pixel_size_m", '[');
            tw_json_num(&j, NULL, hypot(gt[1], gt[4]) * mx);
            tw_json_num(&j, NULL, hypot(gt[2], gt[5]) * my);
            tw_json_close(&j, ']');
        } else {
            tw_json_null(&j, "pixel_size_m");
        }
        tw_json_str(&j, "layout", ovr_layout ? ovr_layout : "");
        tw_json_str(&j, "compression", compression ? compression : "");
        tw_json_bool(&j, "usable", usable);
        if (!usable) tw_json_str(&j, "problem", err.msg);
        tw_json_open(&j, "bands", '[');
    } else {
        printf("raster:     %s (%s)\n", path, dname);
        printf("size:       %d x %d pixels, %d band%s\n", w, h, nb, nb == 1 ? "" : "s");
        if (kind[0])
            printf("crs:        %s, %s%s%s\n", crs, kind, unit_buf[0] ? ", units " : "", unit_buf);
        else
            printf("crs:        %s\n", crs);
        if (has_gt) {
            printf("origin:     %.10g, %.10g\n", gt[0], gt[3]);
            printf("pixel:      %.10g x %.10g", gt[1], gt[5]);
            if (gt[2] != 0 || gt[4] != 0) printf(" (rotated: %g, %g)", gt[2], gt[4]);
            if (unit_buf[0] && strcmp(kind, "projected") != 0)
                printf(" %s (about %.4g x %.4g m)", unit_buf, hypot(gt[1], gt[4]) * mx,
                       hypot(gt[2], gt[5]) * my);
            else if (unit_buf[0])
                printf(" %s", unit_buf);
            printf("\n");
        } else {
            printf("pixel:      no geotransform (pixel coordinates)\n");
        }
        if (ovr_layout || compression)
            printf("layout:     %s%s%s\n", ovr_layout ? ovr_layout : "",
                   ovr_layout && compression ? ", " : "", compression ? compression : "");
        if (usable)
            printf("usable:     yes\n");
        else
            printf("usable:     no: %s\n", err.msg);
    }
    for (int i = 1; i <= nb; i++) {
        const tw_inspect_band *ib = &ri->bands[i - 1];
        int bw = ib->block_w, bh = ib->block_h, has_nd = ib->has_nodata;
        double nd = ib->nodata;
        const char *type = ib->type, *desc = ib->description, *ci = ib->color;
        int n_ovr = ib->overviews;
        double lo = ib->min, hi = ib->max;
        bool stats = ib->has_stats;
        if (json) {
            tw_json_open(&j, NULL, '{');
            tw_json_int(&j, "band", i);
            tw_json_str(&j, "type", type);
            tw_json_open(&j, "block", '[');
            tw_json_int(&j, NULL, bw);
            tw_json_int(&j, NULL, bh);
            tw_json_close(&j, ']');
            if (has_nd)
                tw_json_num(&j, "nodata", nd);
            else
                tw_json_null(&j, "nodata");
            tw_json_str(&j, "description", desc);
            tw_json_str(&j, "color", ci);
            tw_json_int(&j, "overviews", n_ovr);
            if (stats) {
                tw_json_num(&j, "min", lo);
                tw_json_num(&j, "max", hi);
            }
            tw_json_close(&j, '}');
        } else {
            printf("band %-5d  %s, block %d x %d, nodata ", i, type, bw, bh);
            if (has_nd)
                printf("%.17g", nd);
            else
                printf("none");
            printf(", %s", ci);
            if (desc && desc[0]) printf(", \"%s\"", desc);
            if (n_ovr) printf(", %d overview%s", n_ovr, n_ovr == 1 ? "" : "s");
            if (stats) printf(", min %g max %g", lo, hi);
            printf("\n");
        }
    }
    if (!json && tw_url_is_remote(user_path)) {
        int64_t bytes = -1, reqs = -1;
        tw_error cerr;
        tw_error_init(&cerr);
        if (tw_url_read_cost(gpath, 0, h, 0, &bytes, &reqs, &cerr) == TW_OK && bytes >= 0)
            printf("reading:    remote; all of it takes at least %lld range requests, %lld bytes\n",
                   (long long)reqs + 2, (long long)bytes);
        else
            printf("reading:    remote; cost unknown (not a tiled GeoTIFF/COG)\n");
    }
    char legend[1536];
    bool has_legend = tw_legend_note(path, legend, sizeof legend);
    if (json) {
        tw_json_close(&j, ']');
        if (has_legend) tw_json_str(&j, "legend", legend);
        tw_json_close(&j, '}');
        printf("\n");
    } else if (has_legend) {
        printf("legend:     %s\n", legend);
    }
    tw_inspect_destroy(ri);
    return TW_EXIT_OK;
}

static int cmd_info(int argc, char **argv)
{
    if (help_asked(argc, argv)) {
        fputs(info_help, stdout);
        return TW_EXIT_OK;
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
    /* GDAL opens /vsicurl/, https://, s3:// and other virtual paths that
     * fopen does not. */
    if (strncmp(path, "/vsi", 4) != 0 && !tw_url_is_remote(path)) {
        FILE *f = fopen(path, "rb");
        if (!f) {
            fprintf(stderr, "tilewise: input error: %s: cannot open\n", path);
            return TW_EXIT_INPUT;
        }
        fclose(f);
    }
    return looks_like_model(path) ? info_model(path, json) : info_raster(path, json);
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
            return TW_EXIT_OK;
        }
    }
    if (cmd) return usage_error("no help for unknown command '%s'", cmd);
    fputs(usage_text, stdout);
    return TW_EXIT_OK;
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
    if (argc < 2) {
        fputs(usage_text, stderr);
        return TW_EXIT_USAGE;
    }
    /* --config KEY VALUE, anywhere, as GDAL's own tools take it: set here,
     * before any GDAL call, and removed from the arguments (so that a
     * credential passed this way is not echoed into a job script). */
    int n = 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--config") == 0) {
            if (i + 2 >= argc) return usage_error("--config needs KEY VALUE%s", "");
            CPLSetConfigOption(argv[i + 1], argv[i + 2]);
            i += 2;
            continue;
        }
        argv[n++] = argv[i];
    }
    argc = n;
    argv[argc] = NULL;
    if (argc < 2) {
        fputs(usage_text, stderr);
        return TW_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0)
        return print_help(argc > 2 ? argv[2] : NULL);
    if (strcmp(cmd, "--version") == 0) {
        printf("tilewise %s\n", TW_VERSION);
        printf("GDAL %s\n", GDALVersionInfo("RELEASE_NAME"));
        return TW_EXIT_OK;
    }
    if (strcmp(cmd, "run") == 0) return cmd_run(argc - 2, argv + 2);
    if (strcmp(cmd, "validate") == 0) return cmd_validate(argc - 2, argv + 2);
    if (strcmp(cmd, "info") == 0) return cmd_info(argc - 2, argv + 2);
    if (strcmp(cmd, "merge") == 0) return cmd_merge(argc - 2, argv + 2);
    if (strcmp(cmd, "submit") == 0) {
        if (help_asked(argc - 2, argv + 2)) return print_help("submit");
        return tw_cli_submit(argc - 2, argv + 2);
    }
    return usage_error("unknown command '%s'", cmd);
}

/* main.c - the tilewise command line.
 *
 *   tilewise run WORKFLOW.yaml [--set key.path=value]... [--shard I/N] [-q] [--report FILE]
 *   tilewise validate WORKFLOW.yaml [--set ...]
 *   tilewise info FILE
 *
 * The only place that chooses an exit code (see README.md, "Exit codes").
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "io/model_file.h"
#include "io/raster.h"
#include "model/resnet.h"
#include "pipeline/run.h"
#include "workflows/submit.h"
#include "workflows/workflow.h"

#define MAX_SETS 128

static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

static const char *usage_text =
    "usage: tilewise <command> [options]\n"
    "\n"
    "commands:\n"
    "  run WORKFLOW.yaml [--set key.path=value]... [--shard I/N] [-q] [--report FILE]\n"
    "                    [--chunk-rows N]\n"
    "                    classify every input raster of the workflow; output rows are\n"
    "                    committed in chunks (N rows; default about 1024 tiles' worth), so\n"
    "                    running the same command after a kill redoes only what is missing.\n"
    "                    --shard I/N (or a SLURM array task) runs the I-th of N bands of rows\n"
    "  validate WORKFLOW.yaml [--set key.path=value]...\n"
    "                    check config, inputs and model; print the plan and memory estimate\n"
    "  info FILE         describe a raster or a model file\n"
    "  merge OUTPUT_DIR  after sharded runs: check every shard finished, write the mosaics\n"
    "  submit WORKFLOW.yaml --array N [--dry-run] [--set k=v]... [--sbatch OPT]...\n"
    "                    [--chunk-rows N]\n"
    "                    SLURM job array of N shards, then a merge job after it succeeds\n"
    "\n"
    "exit codes: 0 ok, 1 internal error, 2 usage or workflow error, 3 bad input raster or\n"
    "model, 4 resource failure (memory, disk, device, output not writable), 75 interrupted\n"
    "(resumable: run the same command again)\n";

static int usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, "tilewise: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (see tilewise --help)\n");
    return TW_EXIT_USAGE;
}

static int fail(const tw_error *err)
{
    fprintf(stderr, "tilewise: %s: %s\n", tw_status_name(err->status), err->msg);
    return tw_status_exit_code(err->status);
}

/* ---- progress, GDAL style: 0...10...20...30 ... 100 - done. ---- */

typedef struct progress_state {
    int last_step;      /* of 40 (2.5 % each) */
    bool tty;
    double t0;
    const char *current;
} progress_state;

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int progress_cb(double complete, const char *message, void *user)
{
    progress_state *ps = user;
    if (message && ps->current != message) {
        if (ps->current && ps->last_step < 40) fprintf(stderr, "\n");
        ps->current = message;
        ps->last_step = -1;
        ps->t0 = mono_s();
        fprintf(stderr, "%s: ", message);
    }
    int step = (int)floor(complete * 40.0 + 1e-9);
    if (step > 40) step = 40;
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
    fflush(stderr);
    return g_stop ? 0 : 1;
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
        } else if (allow_run_opts && (strcmp(a, "--shard") == 0 || strncmp(a, "--shard=", 8) == 0)) {
            const char *v = a[7] == '=' ? a + 8 : (i + 1 < argc ? argv[++i] : NULL);
            int idx, cnt;
            char extra;
            if (!v || sscanf(v, "%d/%d%c", &idx, &cnt, &extra) != 2 || cnt < 1 || idx < 1 || idx > cnt)
                return usage_error("--shard expects I/N with 1 <= I <= N, got '%s'", v ? v : "");
            o->shard_index = idx - 1;
            o->shard_count = cnt;
            o->shard_given = true;
        } else if (allow_run_opts && (strcmp(a, "--chunk-rows") == 0 ||
                                      strncmp(a, "--chunk-rows=", 13) == 0)) {
            const char *v = a[12] == '=' ? a + 13 : (i + 1 < argc ? argv[++i] : NULL);
            char *end = NULL;
            long n = v ? strtol(v, &end, 10) : 0;
            if (!v || *end || n < 1 || n > 1000000)
                return usage_error("--chunk-rows expects a positive number of rows, got '%s'",
                                   v ? v : "");
            o->chunk_rows = (int)n;
        } else if (allow_run_opts && (strcmp(a, "-q") == 0 || strcmp(a, "--quiet") == 0)) {
            o->quiet = true;
        } else if (allow_run_opts && (strcmp(a, "--report") == 0 || strncmp(a, "--report=", 9) == 0)) {
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

static int load_params(const cli_opts *o, tw_run_params *p, tw_error *err)
{
    if (tw_workflow_load(o->workflow, o->sets, o->n_sets, p, err) != TW_OK) return fail(err);
    p->shard_index = o->shard_index;
    p->shard_count = o->shard_count;
    p->quiet = o->quiet;
    p->chunk_rows = o->chunk_rows;
    if (o->report) snprintf(p->report_path, sizeof p->report_path, "%s", o->report);
    return 0;
}

static void print_summary(const tw_run_result *r)
{
    for (int i = 0; i < r->n_inputs; i++) {
        const tw_input_result *in = &r->inputs[i];
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

static int cmd_run(int argc, char **argv)
{
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

    progress_state ps = {.last_step = -1, .tty = isatty(2)};
    tw_run_hooks hooks = {.progress = p.quiet ? NULL : progress_cb, .progress_user = &ps,
                          .stop = &g_stop};
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
    if (stat(p.output.dir, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        tw_status rs = tw_report_write(report, &p, r, st, st == TW_OK ? NULL : err.msg, &rerr);
        if (rs != TW_OK && st == TW_OK) st = tw_error_set(&err, rs, "%s", rerr.msg);
    }
    if (p.report_path[0]) {
        tw_status rs = tw_report_write(p.report_path, &p, r, st, st == TW_OK ? NULL : err.msg, &rerr);
        if (rs != TW_OK && st == TW_OK) st = tw_error_set(&err, rs, "%s", rerr.msg);
    }
    if (st == TW_OK) {
        print_summary(r);
        if (p.shard_count > 1)
            printf("shard %d of %d done; when all are, run: tilewise merge %s\n",
                   p.shard_index + 1, p.shard_count, p.output.dir);
        printf("report: %s\n", report);
    }
    tw_run_result_destroy(r);
    return st == TW_OK ? TW_EXIT_OK : fail(&err);
}

static int cmd_validate(int argc, char **argv)
{
    cli_opts o;
    int rc = parse_opts(argc, argv, false, &o);
    if (rc) return rc;
    tw_error err;
    tw_error_init(&err);
    tw_run_params p;
    if ((rc = load_params(&o, &p, &err))) return rc;
    if (tw_validate(&p, stdout, &err) != TW_OK) return fail(&err);
    return TW_EXIT_OK;
}

static int cmd_merge(int argc, char **argv)
{
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
    return strcmp(dot, ".h5") == 0 || strcmp(dot, ".hdf5") == 0 ||
           strcmp(dot, ".safetensors") == 0;
}

static int info_model(const char *path)
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
    if (mf->tile) printf("tile:       %d\n", mf->tile);
    printf("sha256:     %s\n", mf->sha256);
    tw_resnet_destroy(net);
    tw_model_file_destroy(mf);
    return TW_EXIT_OK;
}

static int info_raster(const char *path)
{
    tw_error err;
    tw_error_init(&err);
    tw_raster *r = NULL;
    if (tw_raster_open(path, NULL, 0, &r, &err) != TW_OK) return fail(&err);
    const tw_raster_info *in = tw_raster_get_info(r);
    printf("raster:     %s (%s)\n", path, in->driver);
    printf("size:       %d x %d, %d bands, %s\n", in->width, in->height, in->band_count,
           tw_dtype_name(in->dtype));
    printf("blocks:     %d x %d\n", in->block_w, in->block_h);
    if (in->has_nodata)
        printf("nodata:     %.17g\n", in->nodata);
    else
        printf("nodata:     none\n");
    if (in->has_geotransform)
        printf("origin:     %.10g, %.10g; pixel %.10g x %.10g\n", in->geotransform[0],
               in->geotransform[3], in->geotransform[1], in->geotransform[5]);
    printf("crs:        %s\n", in->crs_wkt[0] ? in->crs_wkt : "none");
    tw_raster_close(r);
    return TW_EXIT_OK;
}

static int cmd_info(int argc, char **argv)
{
    if (argc != 1) return usage_error("info expects one FILE%s", "");
    FILE *f = fopen(argv[0], "rb");
    if (!f) {
        fprintf(stderr, "tilewise: input error: %s: cannot open\n", argv[0]);
        return TW_EXIT_INPUT;
    }
    fclose(f);
    return looks_like_model(argv[0]) ? info_model(argv[0]) : info_raster(argv[0]);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fputs(usage_text, stderr);
        return TW_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        fputs(usage_text, stdout);
        return TW_EXIT_OK;
    }
    if (strcmp(cmd, "--version") == 0) {
        printf("tilewise %s\n", TW_VERSION);
        return TW_EXIT_OK;
    }
    if (strcmp(cmd, "run") == 0) return cmd_run(argc - 2, argv + 2);
    if (strcmp(cmd, "validate") == 0) return cmd_validate(argc - 2, argv + 2);
    if (strcmp(cmd, "info") == 0) return cmd_info(argc - 2, argv + 2);
    if (strcmp(cmd, "merge") == 0) return cmd_merge(argc - 2, argv + 2);
    if (strcmp(cmd, "submit") == 0) return tw_cli_submit(argc - 2, argv + 2);
    return usage_error("unknown command '%s'", cmd);
}

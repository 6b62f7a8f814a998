/* client.c - a small program written against the installed tilewise.h only,
 * built by tests/e2e_capi.py with `pkg-config --cflags --libs tilewise`.
 *
 *   client run WORKFLOW [key.path=value]...   run it, print progress calls and
 *                                             the report's path and status
 *   client run2 WORKFLOW [key.path=value]...  the same through tilewise_run
 *                                             (API version 2): tiles callback,
 *                                             stop flag on SIGINT, the summaries
 *   client tiles MODEL                        open MODEL, print its info, classify
 *                                             two constant tiles, and check that
 *                                             a wrong band count is refused
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tilewise.h>

static int progress_calls;

static int on_progress(double complete, const char *message, void *user)
{
    (void)user;
    (void)message;
    if (complete < 0 || complete > 1) return 0;
    progress_calls++;
    return 1;
}

static void on_log(int level, const char *message, void *user)
{
    (void)user;
    printf("log %d: %s\n", level, message);
}

static int cmd_run(int argc, char **argv)
{
    tilewise_error err;
    tilewise_report *rep = NULL;
    tilewise_status st = tilewise_run_file(argv[0], (const char *const *)(argv + 1), argc - 1,
                                           on_progress, on_log, NULL, &rep, &err);
    printf("status %d (%s), exit %d %s\n", (int)st, tilewise_status_name(st), err.exit_code,
           err.exit_class);
    if (st != TILEWISE_OK) printf("message: %s\n", err.message);
    printf("progress calls %d\n", progress_calls);
    printf("report %s, %zu bytes of JSON\n", tilewise_report_path(rep),
           strlen(tilewise_report_json(rep)));
    tilewise_report_free(rep);
    return st == TILEWISE_OK ? 0 : err.exit_code;
}

static volatile sig_atomic_t stop;

static void on_sigint(int sig)
{
    (void)sig;
    stop = 1;
}

static long long last_done = -1, last_total = -1;

static void on_tiles(int64_t done, int64_t total, const char *input, void *user)
{
    (void)input;
    (void)user;
    last_done = done;
    last_total = total;
}

/* run2: tilewise_run; run.KEY=VALUE arguments are options, the others
 * workflow overrides. */
static int cmd_run2(int argc, char **argv)
{
    signal(SIGINT, on_sigint);
    tilewise_error err;
    tilewise_run_options o;
    tilewise_run_options_init(&o);
    const char **sets = malloc(sizeof *sets * (size_t)(argc > 1 ? argc : 1));
    if (!sets) return 1;
    for (int i = 1; i < argc; i++) {
        if (strncmp(argv[i], "run.", 4) != 0)
            sets[o.n_sets++] = argv[i];
        else if (tilewise_run_options_set(&o, argv[i], &err) != TILEWISE_OK)
            printf("option: %s\n", err.message);
    }
    o.sets = sets;
    o.progress = on_progress;
    o.tiles = on_tiles;
    o.log = on_log;
    o.stop = &stop;
    o.quiet = 1;
    tilewise_report *rep = NULL;
    tilewise_status st = tilewise_run(argv[0], &o, &rep, &err);
    free(sets);
    printf("status %d (%s), exit %d %s\n", (int)st, tilewise_status_name(st), err.exit_code,
           err.exit_class);
    if (st != TILEWISE_OK) printf("message: %s\n", err.message);
    printf("progress calls %d, last tiles %lld/%lld\n", progress_calls, last_done, last_total);
    tilewise_run_summary sum = {.size = sizeof sum};
    if (rep && tilewise_report_summary(rep, &sum, &err) == TILEWISE_OK) {
        printf("summary: %d inputs, %lld tiles classified, exit %d, report %s\n", sum.n_inputs,
               (long long)sum.tiles_classified, sum.exit_code, sum.run_json);
        for (int i = 0; i < sum.n_inputs; i++) {
            tilewise_input_summary in = {.size = sizeof in};
            if (tilewise_report_input(rep, i, &in, &err) != TILEWISE_OK) continue;
            printf("input %s: tiles_total %lld, classified %lld, %d outputs\n", in.path,
                   (long long)in.tiles_total, (long long)in.tiles_classified, in.n_outputs);
        }
    }
    tilewise_report_free(rep);
    return st == TILEWISE_OK ? 0 : err.exit_code;
}

static int cmd_tiles(const char *model)
{
    tilewise_error err;
    tilewise_model *m = NULL;
    const char *sets[] = {"runtime.device=cpu", "runtime.memory=256MiB"};
    if (tilewise_model_open(model, sets, 2, &m, &err) != TILEWISE_OK) {
        printf("open failed: %s\n", err.message);
        return 1;
    }
    printf("info %s\n", tilewise_model_info_json(m));
    int bands = tilewise_model_bands(m), k = tilewise_model_classes(m);
    int f = tilewise_model_feature_dim(m), t = tilewise_model_tile(m);
    size_t px = (size_t)t * (size_t)t;
    unsigned char *pix = malloc(2 * (size_t)bands * px);
    float *probs = malloc(2 * (size_t)k * sizeof(float));
    float *emb = malloc(2 * (size_t)f * sizeof(float));
    int rc = 0;
    if (!pix || !probs || !emb) {
        rc = 1;
        goto done;
    }
    memset(pix, 60, (size_t)bands * px);
    memset(pix + (size_t)bands * px, 120, (size_t)bands * px);
    tilewise_tiles tiles = {
        .pixels = pix, .dtype = TILEWISE_DT_BYTE, .n = 2, .bands = bands, .size = t};
    if (tilewise_model_classify(m, &tiles, probs, emb, &err) != TILEWISE_OK) {
        printf("classify failed: %s\n", err.message);
        rc = 1;
        goto done;
    }
    for (int i = 0; i < 2; i++) {
        double sum = 0;
        printf("tile %d:", i);
        for (int c = 0; c < k; c++) {
            printf(" %s=%.6f", tilewise_model_class_name(m, c), probs[i * k + c]);
            sum += probs[i * k + c];
        }
        printf(" (sum %.6f)\n", sum);
    }
    tiles.bands = bands + 1;
    tilewise_status st = tilewise_model_classify(m, &tiles, probs, NULL, &err);
    printf("wrong bands: status %d, exit class %s: %s\n", (int)st, err.exit_class, err.message);
    if (st != TILEWISE_ERR_USAGE) rc = 1;
done:
    free(pix);
    free(probs);
    free(emb);
    tilewise_model_close(m);
    return rc;
}

int main(int argc, char **argv)
{
    printf("tilewise %s (API %d, library %d)\n", tilewise_version(), TILEWISE_API_VERSION,
           tilewise_api_version());
    if (argc >= 3 && strcmp(argv[1], "run") == 0) return cmd_run(argc - 2, argv + 2);
    if (argc >= 3 && strcmp(argv[1], "run2") == 0) return cmd_run2(argc - 2, argv + 2);
    if (argc == 3 && strcmp(argv[1], "tiles") == 0) return cmd_tiles(argv[2]);
    fprintf(stderr, "usage: client run|run2 WORKFLOW [key=value]... | client tiles MODEL\n");
    return 2;
}

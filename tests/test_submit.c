/* test_submit.c - `tilewise submit`: quoting, the job scripts, and sbatch.
 *
 * The scripts are run for real by bash with a fake tilewise that records its
 * argv byte for byte, from a working directory whose name holds spaces,
 * quotes, $, backticks and a newline; signals sent to the batch shell must
 * reach tilewise, and only USR1 (SLURM's time-limit warning) may requeue.
 * Submission runs a fake sbatch that records where and how it was called.
 * The real scheduler is tested by e2e_slurm.sh.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "testutil.h"
#include "workflows/submit.h"
#include "config/workflow.h"

/* Names no shell may mangle: every character that means something to bash. */
static const char *nasty[] = {
    "plain",
    "with space",
    "it's",
    "say \"hi\"",
    "$HOME and ${PATH} and $(echo no)",
    "`echo no`",
    "back\\slash\\",
    "line\nbreak",
    "*?[a]~!#&;|<>(){}",
    "-n",
    "'",
    "''\\''",
    "tab\there %A %a",
    "",
};

/* ---- small helpers ---- */

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (cap - n - 1 == 0) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) {
                free(buf);
                buf = NULL;
            }
            buf = nb;
        }
    }
    fclose(f);
    if (buf) buf[n] = '\0';
    if (len) *len = n;
    return buf;
}

static void write_text(const char *path, const char *text, mode_t mode)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    assert_int_equal(fclose(f), 0);
    assert_int_equal(chmod(path, mode), 0);
}

static char *join(const char *a, const char *b)
{
    char *s = malloc(strlen(a) + strlen(b) + 2);
    assert_non_null(s);
    sprintf(s, "%s/%s", a, b);
    return s;
}

static pid_t spawn(const char *const argv[], const char *cwd)
{
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setpgid(0, 0); /* its own group: a timeout kills what it started too */
        if (cwd && chdir(cwd) != 0) _exit(126);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}

/* Wait at most timeout_s for pid; kill its process group on timeout (and
 * fail), so that no stray child keeps ctest's output pipe open. Returns the
 * exit code, or 128 + signal. */
static int wait_bounded(pid_t pid, double timeout_s)
{
    struct timespec nap = {0, 10 * 1000 * 1000};
    for (double t = 0; t < timeout_s; t += 0.01) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        nanosleep(&nap, NULL);
    }
    kill(-pid, SIGKILL);
    waitpid(pid, NULL, 0);
    fail_msg("process %d did not end within %.0f s", (int)pid, timeout_s);
    return -1;
}

static int run_bash_file(const char *script, const char *cwd)
{
    const char *argv[] = {"/bin/bash", script, NULL};
    return wait_bounded(spawn(argv, cwd), 30);
}

/* Split a NUL-separated record into its fields. Returns the count. */
static int split_nul(const char *buf, size_t len, const char **fields, int max)
{
    int n = 0;
    for (size_t i = 0; i < len && n < max; i += strlen(buf + i) + 1) fields[n++] = buf + i;
    return n;
}

/* The job facts of a workflow (tilewise_check's, without its checks of
 * inputs that these tests do not have). */
static tilewise_job job_from(const char *yaml)
{
    tw_run_params p;
    tw_error err;
    tw_error_init(&err);
    tw_status st = tw_workflow_parse("t.yaml", yaml, strlen(yaml), NULL, 0, &p, &err);
    if (st != TW_OK) fail_msg("workflow: %s", err.msg);
    tilewise_job j = {
        .size = sizeof j, .memory_bytes = p.runtime.memory, .threads = p.runtime.threads};
    snprintf(j.output_dir, sizeof j.output_dir, "%s", p.output.dir);
    snprintf(j.device, sizeof j.device, "%s", p.runtime.device);
    return j;
}

#define BASE_YAML                                                                                  \
    "input:\n  path: in.tif\nmodel:\n  weights: m.safetensors\ntiling: {tile: 64, stride: 32}\n"   \
    "output: {dir: out}\n"

/* ---- tw_shell_quote ---- */

static void test_quote_roundtrip(void **state)
{
    (void)state;
    const char *dir = tw_test_tmpdir();
    char *outfile = join(dir, "printed");
    char *script = join(dir, "print.sh");
    for (size_t i = 0; i < sizeof nasty / sizeof *nasty; i++) {
        size_t need = tw_shell_quote(nasty[i], NULL, 0);
        char *q = malloc(need + 1);
        assert_int_equal(tw_shell_quote(nasty[i], q, need + 1), need);
        size_t qo = tw_shell_quote(outfile, NULL, 0);
        char *qout = malloc(qo + 1);
        tw_shell_quote(outfile, qout, qo + 1);
        char *text = malloc(need + qo + 64);
        sprintf(text, "printf '%%s' %s > %s\n", q, qout);
        write_text(script, text, 0644);
        assert_int_equal(run_bash_file(script, dir), 0);
        size_t len = 0;
        char *got = read_all(outfile, &len);
        assert_non_null(got);
        if (len != strlen(nasty[i]) || memcmp(got, nasty[i], len) != 0)
            fail_msg("quoting '%s' as %s gave '%s'", nasty[i], q, got);
        free(got);
        free(text);
        free(qout);
        free(q);
    }
    free(script);
    free(outfile);
}

static void test_quote_truncates_like_snprintf(void **state)
{
    (void)state;
    char buf[8];
    /* 'it'\''s' = 9 characters */
    assert_int_equal(tw_shell_quote("it's", buf, sizeof buf), 9);
    assert_string_equal(buf, "'it'\\''");
    assert_int_equal(tw_shell_quote("", buf, sizeof buf), 2);
    assert_string_equal(buf, "''");
}

/* ---- script contents ---- */

static void scripts_for(const char *yaml, int array, char **a, char **m)
{
    tilewise_job p = job_from(yaml);
    tw_submit_params sp = tw_submit_default_params();
    sp.workflow = "flow.yaml";
    sp.array = array;
    sp.tilewise = "/opt/tw/bin/tilewise";
    tilewise_error err = {0};
    tilewise_status st = tw_submit_scripts(&sp, &p, "/home/u/proj", "777", a, m, &err);
    if (st != TILEWISE_OK) fail_msg("scripts: %s", err.message);
}

static void test_script_lines(void **state)
{
    (void)state;
    char *a, *m;
    scripts_for(BASE_YAML "runtime: {device: cpu, memory: 1GiB, threads: 3}\n", 4, &a, &m);
    assert_non_null(strstr(a, "#!/bin/bash\n"));
    assert_non_null(strstr(a, "\n#SBATCH --array=0-3\n"));
    assert_non_null(strstr(a, "\n#SBATCH --requeue\n"));
    /* a stop takes at most 10 s: 30 s before the limit leaves 20 for the requeue */
    assert_non_null(strstr(a, "\n#SBATCH --signal=B:USR1@30\n"));
    assert_non_null(strstr(a, "\n#SBATCH --cpus-per-task=3\n"));
    assert_non_null(strstr(a, "\n#SBATCH --mem=2048M\n")); /* 1 GiB + 1 GiB margin */
    assert_non_null(strstr(a, "\n#SBATCH --job-name=flow\n"));
    assert_non_null(strstr(a, "\n#SBATCH --output=tilewise-%A_%a.out\n"));
    assert_non_null(strstr(a, "\n#SBATCH --open-mode=append\n"));
    assert_null(strstr(a, "--gres"));
    assert_non_null(strstr(a, "\ncd -- '/home/u/proj' || exit 1\n"));
    /* the shard is asked for (--shard auto reads SLURM's variables): without
     * it a run in an array task is a whole run */
    assert_non_null(
        strstr(a, "\n'/opt/tw/bin/tilewise' run '/home/u/proj/flow.yaml' --shard auto &\n"));
    /* the merge: after the array, never a GPU, the absolute output dir */
    assert_non_null(strstr(m, "\n#SBATCH --dependency=afterok:777\n"));
    assert_non_null(strstr(m, "\n#SBATCH --kill-on-invalid-dep=yes\n"));
    assert_non_null(strstr(m, "\n#SBATCH --job-name=flow-merge\n"));
    assert_non_null(strstr(m, "\nexec '/opt/tw/bin/tilewise' merge '/home/u/proj/out'\n"));
    assert_null(strstr(m, "--array"));
    assert_null(strstr(m, "--cpus-per-task"));
    free(a);
    free(m);

    scripts_for(BASE_YAML "runtime: {device: auto}\n", 1, &a, &m);
    assert_non_null(strstr(a, "\n#SBATCH --array=0-0\n"));
    assert_null(strstr(a, "--gres"));
    assert_null(strstr(a, "--cpus-per-task"));             /* threads: auto */
    assert_non_null(strstr(a, "\n#SBATCH --mem=3072M\n")); /* default 2 GiB + 1 GiB */
    free(a);
    free(m);
}

static void test_gres_only_for_cuda(void **state)
{
    (void)state;
    const struct {
        const char *device;
        bool gres;
    } cases[] = {{"cpu", false},
                 {"auto", false},
                 {"cuda", true},
                 {"\"cuda:0\"", true},
                 {"\"cuda:1\"", true}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char yaml[512];
        snprintf(yaml, sizeof yaml, BASE_YAML "runtime: {device: %s}\n", cases[i].device);
        char *a, *m;
        scripts_for(yaml, 8, &a, &m);
        bool has = strstr(a, "\n#SBATCH --gres=gpu:1\n") != NULL;
        if (has != cases[i].gres) fail_msg("device %s: gres %d", cases[i].device, has);
        assert_null(strstr(m, "--gres")); /* merge needs no GPU */
        /* the granted GPU is the task's cuda:0 */
        bool reset = strstr(a, " --set runtime.device=cuda &\n") != NULL;
        assert_int_equal(reset, strcmp(cases[i].device, "\"cuda:1\"") == 0);
        free(a);
        free(m);
    }
}

static void test_array_range(void **state)
{
    (void)state;
    tilewise_job p = job_from(BASE_YAML);
    tw_submit_params sp = tw_submit_default_params();
    sp.workflow = "flow.yaml";
    sp.tilewise = "/bin/true";
    char *a = NULL, *m = NULL;
    const int bad[] = {0, -1, TW_SUBMIT_MAX_ARRAY + 1};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        sp.array = bad[i];
        tilewise_error err = {0};
        assert_int_equal(tw_submit_scripts(&sp, &p, "/", "1", &a, &m, &err), TILEWISE_ERR_USAGE);
        assert_non_null(strstr(err.message, "--array must be 1..10000"));
        assert_null(a);
    }
    sp.array = TW_SUBMIT_MAX_ARRAY;
    tilewise_error err = {0};
    assert_int_equal(tw_submit_scripts(&sp, &p, "/", "1", &a, &m, &err), TILEWISE_OK);
    assert_non_null(strstr(a, "\n#SBATCH --array=0-9999\n"));
    free(a);
    free(m);
}

/* ---- the scripts run by bash, with a fake tilewise ---- */

static const char *fake_tilewise =
    "#!/bin/bash\n"
    "printf '%s\\0' \"$@\" > \"$TW_FAKE_DIR/argv\"\n"
    "printf '%s' \"$PWD\" > \"$TW_FAKE_DIR/pwd\"\n"
    "printf '%s|%s|%s' \"${SLURM_ARRAY_TASK_ID:-}\" \"${SLURM_ARRAY_TASK_COUNT:-}\" "
    "\"${SLURM_ARRAY_TASK_MIN:-}\" > \"$TW_FAKE_DIR/env\"\n"
    "if [ -n \"${TW_FAKE_WAIT:-}\" ]; then\n"
    "  trap 'echo usr1 > \"$TW_FAKE_DIR/signal\"; exit 75' USR1\n"
    "  trap 'echo term > \"$TW_FAKE_DIR/signal\"; exit 75' TERM\n"
    "  : > \"$TW_FAKE_DIR/ready\"\n"
    "  while :; do sleep 0.05; done\n"
    "fi\n"
    "exit \"${TW_FAKE_RC:-0}\"\n";

static const char *fake_scontrol =
    "#!/bin/bash\nprintf '%s\\0' \"$@\" > \"$TW_FAKE_DIR/scontrol\"\n";

typedef struct sandbox {
    char *root;     /* temp dir */
    char *cwd;      /* a nasty directory name under root: submit's cwd */
    char *fake_dir; /* where the fakes record */
    char *bin_dir;  /* fake scontrol, sbatch */
    char *tilewise; /* fake tilewise (its path has a space and a quote) */
} sandbox;

static void sandbox_make(sandbox *s)
{
    s->root = strdup(tw_test_tmpdir());
    s->cwd = join(s->root, "sub mit 'dir' \"$x\" `y`\nz");
    s->fake_dir = join(s->root, "rec");
    s->bin_dir = join(s->root, "bin dir");
    assert_int_equal(mkdir(s->cwd, 0755), 0);
    assert_int_equal(mkdir(s->fake_dir, 0755), 0);
    assert_int_equal(mkdir(s->bin_dir, 0755), 0);
    s->tilewise = join(s->bin_dir, "tile'wise");
    write_text(s->tilewise, fake_tilewise, 0755);
    char *sc = join(s->bin_dir, "scontrol");
    write_text(sc, fake_scontrol, 0755);
    free(sc);
    assert_int_equal(setenv("TW_FAKE_DIR", s->fake_dir, 1), 0);
}

static void sandbox_free(sandbox *s)
{
    free(s->root);
    free(s->cwd);
    free(s->fake_dir);
    free(s->bin_dir);
    free(s->tilewise);
}

static char *rec(const sandbox *s, const char *name, size_t *len)
{
    char *path = join(s->fake_dir, name);
    char *text = read_all(path, len);
    free(path);
    return text;
}

static void rec_clear(const sandbox *s)
{
    const char *names[] = {"argv", "pwd", "env", "signal", "ready", "scontrol", "sbatch.n"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char *path = join(s->fake_dir, names[i]);
        unlink(path);
        free(path);
    }
}

/* Write the scripts of sp/p into the sandbox root. */
static void write_scripts(const sandbox *s, const tw_submit_params *sp, const tilewise_job *p,
                          char **array_path, char **merge_path)
{
    char *a, *m;
    tilewise_error err = {0};
    if (tw_submit_scripts(sp, p, s->cwd, "5", &a, &m, &err) != TILEWISE_OK)
        fail_msg("%s", err.message);
    *array_path = join(s->root, "array.sh");
    *merge_path = join(s->root, "merge.sh");
    write_text(*array_path, a, 0644);
    write_text(*merge_path, m, 0644);
    free(a);
    free(m);
}

static void test_scripts_run_with_exact_argv(void **state)
{
    (void)state;
    sandbox s;
    sandbox_make(&s);
    tilewise_job p = job_from(BASE_YAML);
    snprintf(p.output_dir, sizeof p.output_dir, "out \"$HOME\"\n'x'");
    tw_submit_params sp = tw_submit_default_params();
    const char *sets[] = {nasty[2], nasty[4], nasty[5], nasty[7], nasty[11], ""};
    sp.workflow = "my flow '1' $(x).yaml";
    sp.sets = sets;
    sp.n_sets = 6;
    sp.array = 3;
    sp.chunk_rows = 2;
    sp.tilewise = s.tilewise;
    char *ap, *mp;
    write_scripts(&s, &sp, &p, &ap, &mp);

    /* bash -n: both parse */
    const char *check_a[] = {"/bin/bash", "-n", ap, NULL};
    assert_int_equal(wait_bounded(spawn(check_a, NULL), 30), 0);
    const char *check_m[] = {"/bin/bash", "-n", mp, NULL};
    assert_int_equal(wait_bounded(spawn(check_m, NULL), 30), 0);

    /* The array script, run from elsewhere (as SLURM runs it from the log
     * directory), passes exactly these arguments from submit's cwd. */
    setenv("SLURM_ARRAY_TASK_ID", "2", 1);
    setenv("SLURM_ARRAY_TASK_COUNT", "3", 1);
    setenv("SLURM_ARRAY_TASK_MIN", "0", 1);
    rec_clear(&s);
    assert_int_equal(run_bash_file(ap, s.root), 0);
    size_t len;
    char *argv_rec = rec(&s, "argv", &len);
    assert_non_null(argv_rec);
    const char *f[32];
    int n = split_nul(argv_rec, len, f, 32);
    assert_int_equal(n, 2 + 2 + 2 * 6 + 2);
    assert_string_equal(f[0], "run");
    char *abs_wf = join(s.cwd, sp.workflow);
    assert_string_equal(f[1], abs_wf);
    /* the shard is asked for: a plain run in an array task is a whole run */
    assert_string_equal(f[2], "--shard");
    assert_string_equal(f[3], "auto");
    for (int i = 0; i < 6; i++) {
        assert_string_equal(f[4 + 2 * i], "--set");
        assert_string_equal(f[5 + 2 * i], sets[i]);
    }
    assert_string_equal(f[16], "--chunk-rows");
    assert_string_equal(f[17], "2");
    char *pwd = rec(&s, "pwd", NULL);
    assert_string_equal(pwd, s.cwd);
    char *env = rec(&s, "env", NULL);
    assert_string_equal(env, "2|3|0"); /* SLURM's variables reach tilewise */
    free(argv_rec);
    free(pwd);
    free(env);

    /* tilewise's exit code is the task's */
    setenv("TW_FAKE_RC", "3", 1);
    assert_int_equal(run_bash_file(ap, s.root), 3);
    unsetenv("TW_FAKE_RC");

    /* The merge script: merge and the absolute output directory. */
    rec_clear(&s);
    assert_int_equal(run_bash_file(mp, s.root), 0);
    argv_rec = rec(&s, "argv", &len);
    n = split_nul(argv_rec, len, f, 32);
    assert_int_equal(n, 2);
    assert_string_equal(f[0], "merge");
    char *abs_out = join(s.cwd, p.output_dir);
    assert_string_equal(f[1], abs_out);
    free(argv_rec);

    unsetenv("SLURM_ARRAY_TASK_ID");
    unsetenv("SLURM_ARRAY_TASK_COUNT");
    unsetenv("SLURM_ARRAY_TASK_MIN");
    free(abs_out);
    free(abs_wf);
    free(ap);
    free(mp);
    sandbox_free(&s);
}

/* Run the array script, wait until the fake tilewise is up, send sig to the
 * batch shell. Returns the script's exit code. */
static int signal_run(const sandbox *s, const char *script, int sig)
{
    rec_clear(s);
    const char *argv[] = {"/bin/bash", script, NULL};
    pid_t pid = spawn(argv, s->root);
    char *ready = join(s->fake_dir, "ready");
    struct timespec nap = {0, 10 * 1000 * 1000};
    for (int i = 0; i < 1000 && !tw_test_file_exists(ready); i++) nanosleep(&nap, NULL);
    assert_true(tw_test_file_exists(ready));
    free(ready);
    assert_int_equal(kill(pid, sig), 0);
    return wait_bounded(pid, 20);
}

static void test_signals_forwarded_usr1_requeues(void **state)
{
    (void)state;
    sandbox s;
    sandbox_make(&s);
    tilewise_job p = job_from(BASE_YAML);
    tw_submit_params sp = tw_submit_default_params();
    sp.workflow = "w.yaml";
    sp.array = 2;
    sp.tilewise = s.tilewise;
    char *ap, *mp;
    write_scripts(&s, &sp, &p, &ap, &mp);
    const char *old_path = getenv("PATH");
    char *path = malloc(strlen(s.bin_dir) + strlen(old_path ? old_path : "") + 2);
    sprintf(path, "%s:%s", s.bin_dir, old_path ? old_path : "");
    setenv("PATH", path, 1);
    setenv("SLURM_JOB_ID", "4242", 1);
    setenv("TW_FAKE_WAIT", "1", 1);

    /* USR1, SLURM's warning before the time limit: tilewise gets it, exits
     * 75, and the task requeues itself. */
    assert_int_equal(signal_run(&s, ap, SIGUSR1), 75);
    char *sig = rec(&s, "signal", NULL);
    assert_non_null(sig);
    assert_string_equal(sig, "usr1\n");
    size_t len;
    char *sc = rec(&s, "scontrol", &len);
    assert_non_null(sc);
    const char *f[4];
    assert_int_equal(split_nul(sc, len, f, 4), 2);
    assert_string_equal(f[0], "requeue");
    assert_string_equal(f[1], "4242");
    free(sig);
    free(sc);

    /* TERM (scancel): forwarded, never requeued. */
    assert_int_equal(signal_run(&s, ap, SIGTERM), 75);
    sig = rec(&s, "signal", NULL);
    assert_non_null(sig);
    assert_string_equal(sig, "term\n");
    assert_null(rec(&s, "scontrol", NULL));
    free(sig);

    unsetenv("TW_FAKE_WAIT");
    unsetenv("SLURM_JOB_ID");
    setenv("PATH", old_path ? old_path : "/usr/bin:/bin", 1);
    free(path);
    free(ap);
    free(mp);
    sandbox_free(&s);
}

/* ---- submission through a fake sbatch ---- */

/* Records cwd and argv per call (rec/sbatch.K.*), copies the script, prints
 * ids 101, 102, ... ; TW_FAKE_SBATCH=fail|garbage changes its answer. */
static const char *fake_sbatch =
    "#!/bin/bash\n"
    "n=$(cat \"$TW_FAKE_DIR/sbatch.n\" 2>/dev/null || echo 0); n=$((n + 1))\n"
    "echo $n > \"$TW_FAKE_DIR/sbatch.n\"\n"
    "printf '%s' \"$PWD\" > \"$TW_FAKE_DIR/sbatch.$n.pwd\"\n"
    "printf '%s\\0' \"$@\" > \"$TW_FAKE_DIR/sbatch.$n.argv\"\n"
    "for last; do :; done; cp -- \"$last\" \"$TW_FAKE_DIR/sbatch.$n.script\"\n"
    "case \"${TW_FAKE_SBATCH:-}\" in\n"
    "  fail) echo 'sbatch: error: invalid partition specified: nope' >&2; exit 1 ;;\n"
    "  garbage) echo 'Submitted batch job'; exit 0 ;;\n"
    "esac\n"
    "echo 'sbatch: warning: a warning on stderr' >&2\n"
    "[ $n = 1 ] && echo \"$((100 + n));cluster\" || echo \"$((100 + n))\"\n";

static void test_submit_with_fake_sbatch(void **state)
{
    (void)state;
    sandbox s;
    sandbox_make(&s);
    char *sbatch = join(s.bin_dir, "sbatch");
    write_text(sbatch, fake_sbatch, 0755);
    tilewise_job p = job_from(BASE_YAML "runtime: {device: cuda}\n");
    snprintf(p.output_dir, sizeof p.output_dir, "o u't");
    tw_submit_params sp = tw_submit_default_params();
    const char *opts[] = {"--time=1:00:00", "--partition=x y"};
    sp.workflow = "w.yaml";
    sp.array = 5;
    sp.tilewise = s.tilewise;
    sp.sbatch = sbatch;
    sp.sbatch_opts = opts;
    sp.n_sbatch_opts = 2;
    char old_cwd[4096];
    assert_non_null(getcwd(old_cwd, sizeof old_cwd));
    assert_int_equal(chdir(s.cwd), 0);
    rec_clear(&s);

    /* --dry-run: both scripts printed, nothing submitted or written. */
    sp.dry_run = true;
    FILE *out = tmpfile();
    tilewise_error err = {0};
    assert_int_equal(tw_submit(&sp, &p, out, &err), TILEWISE_OK);
    rewind(out);
    char dry[16384];
    size_t dn = fread(dry, 1, sizeof dry - 1, out);
    dry[dn] = '\0';
    fclose(out);
    assert_non_null(strstr(dry, "\n#SBATCH --array=0-4\n"));
    assert_non_null(strstr(dry, "\n#SBATCH --gres=gpu:1\n"));
    assert_non_null(strstr(dry, "\n#SBATCH --dependency=afterok:ARRAY_JOB_ID\n"));
    assert_non_null(strstr(dry, " merge '"));
    assert_null(rec(&s, "sbatch.n", NULL));
    char *logdir = join(s.cwd, "o u't/.tilewise-slurm");
    struct stat sb;
    assert_int_not_equal(stat(logdir, &sb), 0);

    /* The real thing: array first, then the merge on its id, both run in
     * the log directory with the extra options. */
    sp.dry_run = false;
    out = tmpfile();
    memset(&err, 0, sizeof err);
    tilewise_status st = tw_submit(&sp, &p, out, &err);
    if (st != TILEWISE_OK) fail_msg("submit: %s", err.message);
    rewind(out);
    dn = fread(dry, 1, sizeof dry - 1, out);
    dry[dn] = '\0';
    fclose(out);
    assert_non_null(strstr(dry, "array job 101: 5 tasks"));
    assert_non_null(strstr(dry, "merge job 102: after array job 101"));
    char *n = rec(&s, "sbatch.n", NULL);
    assert_string_equal(n, "2\n");
    free(n);
    for (int k = 1; k <= 2; k++) {
        char name[32];
        snprintf(name, sizeof name, "sbatch.%d.pwd", k);
        char *pwd = rec(&s, name, NULL);
        assert_string_equal(pwd, logdir);
        free(pwd);
        snprintf(name, sizeof name, "sbatch.%d.argv", k);
        size_t len;
        char *av = rec(&s, name, &len);
        const char *f[8];
        assert_int_equal(split_nul(av, len, f, 8), 4);
        assert_string_equal(f[0], "--parsable");
        assert_string_equal(f[1], "--time=1:00:00");
        assert_string_equal(f[2], "--partition=x y");
        char *script = join(logdir, k == 1 ? "array.sh" : "merge.sh");
        assert_string_equal(f[3], script);
        assert_true(tw_test_file_exists(script));
        free(script);
        free(av);
    }
    char *merge = rec(&s, "sbatch.2.script", NULL);
    assert_non_null(strstr(merge, "\n#SBATCH --dependency=afterok:101\n"));
    free(merge);
    char *array = rec(&s, "sbatch.1.script", NULL);
    assert_non_null(strstr(array, "\n#SBATCH --array=0-4\n"));
    free(array);

    /* sbatch refuses: its message, exit class "resource" */
    rec_clear(&s);
    setenv("TW_FAKE_SBATCH", "fail", 1);
    memset(&err, 0, sizeof err);
    out = tmpfile();
    assert_int_equal(tw_submit(&sp, &p, out, &err), TILEWISE_ERR_DEVICE);
    assert_non_null(strstr(err.message, "invalid partition specified: nope"));
    assert_non_null(strstr(err.message, "exited with 1"));
    assert_int_equal(tilewise_exit_code(err.status), TILEWISE_EXIT_RESOURCE);
    n = rec(&s, "sbatch.n", NULL);
    assert_string_equal(n, "1\n"); /* no merge without an array */
    free(n);

    /* sbatch says something that is not a job id */
    setenv("TW_FAKE_SBATCH", "garbage", 1);
    memset(&err, 0, sizeof err);
    assert_int_equal(tw_submit(&sp, &p, out, &err), TILEWISE_ERR_DEVICE);
    assert_non_null(strstr(err.message, "printed no job id"));
    unsetenv("TW_FAKE_SBATCH");

    /* no sbatch at all */
    sp.sbatch = "tw-no-such-sbatch";
    memset(&err, 0, sizeof err);
    assert_int_equal(tw_submit(&sp, &p, out, &err), TILEWISE_ERR_DEVICE);
    assert_non_null(strstr(err.message, "'tw-no-such-sbatch' not found in PATH"));
    fclose(out);

    assert_int_equal(chdir(old_cwd), 0);
    free(logdir);
    free(sbatch);
    sandbox_free(&s);
}

/* ---- the command line ---- */

static int cli(int argc, const char **argv)
{
    return tw_cli_submit(argc, (char **)argv);
}

static void test_cli_errors(void **state)
{
    (void)state;
    const char *dir = tw_test_tmpdir();
    char *wf = join(dir, "w.yaml");
    write_text(wf, BASE_YAML, 0644);
    const char *a0[] = {wf, "--array", "0"};
    assert_int_equal(cli(3, a0), TW_EXIT_USAGE);
    const char *a1[] = {wf, "--array=10001"};
    assert_int_equal(cli(2, a1), TW_EXIT_USAGE);
    const char *a2[] = {wf, "--array", "4x"};
    assert_int_equal(cli(3, a2), TW_EXIT_USAGE);
    const char *a3[] = {wf};
    assert_int_equal(cli(1, a3), TW_EXIT_USAGE);
    const char *a4[] = {wf, "--array", "2", "--bogus"};
    assert_int_equal(cli(4, a4), TW_EXIT_USAGE);
    const char *a5[] = {wf, "--array", "2", "--set", "tiling.nope=1"};
    assert_int_equal(cli(5, a5), TW_EXIT_USAGE);
    /* submit validates before it submits: a workflow whose model or input
     * is bad fails here, once (exit 3), before sbatch is even looked for
     * -- not in each of the array's tasks. With --dry-run too. */
    const char *old = getenv("PATH");
    char *saved = strdup(old ? old : "/usr/bin:/bin");
    setenv("PATH", dir, 1);
    const char *a6[] = {wf, "--array", "2"};
    assert_int_equal(cli(3, a6), TW_EXIT_INPUT); /* in.tif, m.safetensors do not exist */
    const char *a7[] = {wf, "--array", "2", "--dry-run"};
    assert_int_equal(cli(4, a7), TW_EXIT_INPUT);
    const char *fx = tw_test_fixtures();
    const char *src = getenv("TW_SOURCE_DIR");
    if (fx && src) {
        char yaml[4096];
        snprintf(yaml, sizeof yaml,
                 "input:\n  path: %s/sample_data/L7_ETMs.tif\nmodel:\n"
                 "  weights: %s/resnet18_6b_7c.safetensors\noutput: {dir: %s/out}\n",
                 src, fx, dir);
        write_text(wf, yaml, 0644);
        /* A good workflow: the input fits, so the missing scheduler is what
         * fails (exit 4); a model with 4 bands for the 6-band raster is
         * refused naming both counts, before sbatch is looked for. */
        assert_int_equal(cli(3, a6), TW_EXIT_RESOURCE);
        const char *a8[] = {wf, "--array", "2", "--set", "input.bands=[1,2,3,4]"};
        assert_int_equal(cli(5, a8), TW_EXIT_INPUT);
    }
    setenv("PATH", saved, 1);
    free(saved);
    free(wf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quote_roundtrip),
        cmocka_unit_test(test_quote_truncates_like_snprintf),
        cmocka_unit_test(test_script_lines),
        cmocka_unit_test(test_gres_only_for_cuda),
        cmocka_unit_test(test_array_range),
        cmocka_unit_test(test_scripts_run_with_exact_argv),
        cmocka_unit_test(test_signals_forwarded_usr1_requeues),
        cmocka_unit_test(test_submit_with_fake_sbatch),
        cmocka_unit_test(test_cli_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* submit.c - see submit.h */
#include "workflows/submit.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_SETS 128

/* The message into *err (a tilewise_error, as the library fills one);
 * returns status. */
static tilewise_status fail_with(tilewise_error *err, tilewise_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static tilewise_status fail_with(tilewise_error *err, tilewise_status status, const char *fmt, ...)
{
    err->status = status;
    err->exit_code = tilewise_exit_code(status);
    snprintf(err->exit_class, sizeof err->exit_class, "%s",
             err->exit_code == TILEWISE_EXIT_USAGE ? "usage" : "resource");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return status;
}

/* mkdir -p: path and every missing folder above it. */
static tilewise_status make_dirs(const char *path, tilewise_error *err)
{
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return fail_with(err, TILEWISE_ERR_OUTPUT, "%s: path too long", path);
    for (char *c = buf + 1;; c++) {
        if (*c != '/' && *c != '\0') continue;
        char keep = *c;
        *c = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST)
            return fail_with(err, TILEWISE_ERR_OUTPUT, "cannot create %s: %s", buf,
                             strerror(errno));
        *c = keep;
        if (!keep) return TILEWISE_OK;
    }
}

/* A script, whole or not at all: written beside its name, then renamed. */
static tilewise_status write_script(const char *path, const char *text, tilewise_error *err)
{
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return fail_with(err, TILEWISE_ERR_OUTPUT, "%s: path too long", path);
    FILE *f = fopen(tmp, "wb");
    size_t n = strlen(text);
    bool ok = f && fwrite(text, 1, n, f) == n && fflush(f) == 0 && fsync(fileno(f)) == 0;
    if (f && fclose(f) != 0) ok = false;
    if (ok && rename(tmp, path) == 0) return TILEWISE_OK;
    int e = errno;
    unlink(tmp);
    return fail_with(err, TILEWISE_ERR_OUTPUT, "cannot write %s: %s", path, strerror(e));
}
#define MAX_SBATCH_OPTS 64
/* Memory asked of SLURM on top of runtime.memory: the program, its
 * libraries, GDAL's and oneDNN's own allocations, a CUDA context. */
#define MEM_MARGIN_MIB 1024
/* SIGUSR1 this long before the time limit: a stop takes at most 10 s
 * (pipeline/engine/stages.h), the rest is for the task's scontrol requeue. SLURM
 * may send it up to 60 s earlier than asked, never later. */
#define SIGNAL_LEAD_S 30

tw_submit_params tw_submit_default_params(void)
{
    return (tw_submit_params){.sbatch = "sbatch"};
}

size_t tw_shell_quote(const char *s, char *buf, size_t size)
{
    size_t n = 0;
#define PUT(ch)                                                                                    \
    do {                                                                                           \
        if (n + 1 < size) buf[n] = (ch);                                                           \
        n++;                                                                                       \
    } while (0)
    PUT('\'');
    for (const char *c = s; *c; c++) {
        if (*c == '\'') {
            /* close the quote, an escaped quote, reopen */
            PUT('\'');
            PUT('\\');
            PUT('\'');
            PUT('\'');
        } else {
            PUT(*c);
        }
    }
    PUT('\'');
#undef PUT
    if (size) buf[n < size ? n : size - 1] = '\0';
    return n;
}

/* ---- a growing string; ok turns false for good once memory runs out ---- */

typedef struct strbuf {
    char *s;
    size_t len, cap;
    bool ok;
} strbuf;

static void sb_grow(strbuf *b, size_t more)
{
    if (!b->ok || b->len + more + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < b->len + more + 1) cap *= 2;
    char *s = realloc(b->s, cap);
    if (!s) {
        b->ok = false;
        return;
    }
    b->s = s;
    b->cap = cap;
}

static void sb_add(strbuf *b, const char *text)
{
    size_t n = strlen(text);
    sb_grow(b, n);
    if (!b->ok) return;
    memcpy(b->s + b->len, text, n + 1);
    b->len += n;
}

static void sb_printf(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(strbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->ok = false;
        return;
    }
    sb_grow(b, (size_t)n);
    if (!b->ok) return;
    va_start(ap, fmt);
    vsnprintf(b->s + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

static void sb_quoted(strbuf *b, const char *s)
{
    size_t n = tw_shell_quote(s, NULL, 0);
    sb_grow(b, n);
    if (!b->ok) return;
    tw_shell_quote(s, b->s + b->len, n + 1);
    b->len += n;
}

/* Text for a comment line: control characters (a newline would end the
 * comment and make the rest a command) become '?'. */
static void sb_comment_text(strbuf *b, const char *s)
{
    for (const char *c = s; *c; c++) {
        char ch = ((unsigned char)*c < 0x20 || *c == 0x7f) ? '?' : *c;
        sb_grow(b, 1);
        if (!b->ok) return;
        b->s[b->len++] = ch;
        b->s[b->len] = '\0';
    }
}

/* ---- paths ---- */

/* path made absolute against cwd (no symlinks resolved: the user's spelling
 * is kept, only anchored). */
static char *abs_path(const char *cwd, const char *path)
{
    strbuf b = {.ok = true};
    if (path[0] != '/') {
        sb_add(&b, cwd);
        if (b.len == 0 || b.s[b.len - 1] != '/') sb_add(&b, "/");
    }
    sb_add(&b, path);
    if (!b.ok) {
        free(b.s);
        return NULL;
    }
    return b.s;
}

/* The job name: the workflow's file name without .yaml/.yml, only
 * [A-Za-z0-9._-] (squeue shows it; #SBATCH lines need no escaping). */
static void job_name(const char *workflow, char *out, size_t size)
{
    const char *base = strrchr(workflow, '/');
    base = base ? base + 1 : workflow;
    size_t n = strlen(base);
    if (n > 5 && strcmp(base + n - 5, ".yaml") == 0)
        n -= 5;
    else if (n > 4 && strcmp(base + n - 4, ".yml") == 0)
        n -= 4;
    size_t k = 0;
    for (size_t i = 0; i < n && k + 1 < size && k < 48; i++) {
        char c = base[i];
        bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
        out[k++] = keep ? c : '_';
    }
    if (k == 0 && size > 1) out[k++] = 'w';
    out[k] = '\0';
}

static bool device_is_cuda(const char *device)
{
    return strcmp(device, "cuda") == 0 || strncmp(device, "cuda:", 5) == 0;
}

/* ---- the scripts ---- */

static void add_header(strbuf *b, const char *out_dir, const char *name, const char *what)
{
    sb_add(b, "#!/bin/bash\n");
    sb_printf(b, "# %s, written by tilewise submit (tilewise %s).\n", what, tilewise_version());
    sb_add(b, "# Output directory: ");
    sb_comment_text(b, out_dir);
    sb_add(b, "\n# Log paths are relative: sbatch is run in <output directory>/.tilewise-slurm/,\n"
              "# the jobs' working directory. The script cds back to where submit ran.\n");
    sb_printf(b, "#SBATCH --job-name=%s\n", name);
}

static void add_resources(strbuf *b, const tilewise_job *job, bool gpu)
{
    sb_add(b, "#SBATCH --ntasks=1\n");
    if (job->threads > 0) sb_printf(b, "#SBATCH --cpus-per-task=%d\n", job->threads);
    uint64_t mib = (job->memory_bytes + (1u << 20) - 1) >> 20;
    sb_printf(b, "#SBATCH --mem=%lluM\n", (unsigned long long)(mib + MEM_MARGIN_MIB));
    if (gpu) sb_add(b, "#SBATCH --gres=gpu:1\n");
}

static void add_cd(strbuf *b, const char *cwd)
{
    sb_add(b, "cd -- ");
    sb_quoted(b, cwd);
    sb_add(b, " || exit 1\n");
}

tilewise_status tw_submit_scripts(const tw_submit_params *sp, const tilewise_job *job,
                                  const char *cwd, const char *array_job_id, char **array_script,
                                  char **merge_script, tilewise_error *err)
{
    *array_script = *merge_script = NULL;
    if (sp->array < 1 || sp->array > TW_SUBMIT_MAX_ARRAY)
        return fail_with(err, TILEWISE_ERR_USAGE, "--array must be 1..%d tasks, got %d",
                         TW_SUBMIT_MAX_ARRAY, sp->array);
    char *wf = abs_path(cwd, sp->workflow);
    char *out_dir = abs_path(cwd, job->output_dir);
    char name[64];
    job_name(sp->workflow, name, sizeof name);
    bool gpu = device_is_cuda(job->device);

    /* The array: tilewise runs as a child of the batch shell, which forwards
     * USR1 and TERM. wait returns early (> 128) when a trap ran; wait again
     * for the real status. */
    strbuf a = {.ok = true};
    add_header(&a, out_dir ? out_dir : "", name, "Array job: one shard of output rows per task");
    sb_printf(&a, "#SBATCH --array=0-%d\n", sp->array - 1);
    sb_add(&a, "#SBATCH --requeue\n");
    sb_printf(&a, "#SBATCH --signal=B:USR1@%d\n", SIGNAL_LEAD_S);
    add_resources(&a, job, gpu);
    /* append: a requeued task adds to its logs instead of wiping the first run's */
    sb_add(&a, "#SBATCH --output=tilewise-%A_%a.out\n#SBATCH --error=tilewise-%A_%a.err\n"
               "#SBATCH --open-mode=append\n\n");
    add_cd(&a, cwd ? cwd : "/");
    /* A signal that lands before tw_pid is set (the batch shell may be
     * descheduled right after the fork) is kept and forwarded once it is. */
    sb_add(&a, "tw_usr1=0\ntw_sig=0\ntw_pid=\ntw_pending=\n"
               "tw_forward() {\n"
               "  if [ -n \"$tw_pid\" ]; then kill -\"$1\" \"$tw_pid\" 2>/dev/null\n"
               "  else tw_pending=$1; fi\n"
               "}\n"
               "trap 'tw_usr1=1; tw_sig=1; tw_forward USR1' USR1\n"
               "trap 'tw_sig=1; tw_forward TERM' TERM INT\n"
               "# --shard auto: the shard comes from SLURM_ARRAY_TASK_ID/COUNT/MIN\n");
    sb_quoted(&a, sp->tilewise);
    sb_add(&a, " run ");
    sb_quoted(&a, wf ? wf : "");
    sb_add(&a, " --shard auto");
    for (int i = 0; i < sp->n_sets; i++) {
        sb_add(&a, " --set ");
        sb_quoted(&a, sp->sets[i]);
    }
    /* The one GPU SLURM grants is the task's cuda:0 (CUDA_VISIBLE_DEVICES):
     * an index meant for a workstation would name a device the task lacks. */
    if (gpu && strcmp(job->device, "cuda") != 0 && strcmp(job->device, "cuda:0") != 0)
        sb_add(&a, " --set runtime.device=cuda");
    if (sp->chunk_rows > 0) sb_printf(&a, " --chunk-rows %d", sp->chunk_rows);
    sb_add(&a,
           " &\n"
           "tw_pid=$!\n"
           "[ -z \"$tw_pending\" ] || kill -\"$tw_pending\" \"$tw_pid\" 2>/dev/null\n"
           "while :; do\n"
           "  tw_sig=0\n"
           "  wait \"$tw_pid\"\n"
           "  tw_rc=$?\n"
           "  [ \"$tw_sig\" = 1 ] && [ \"$tw_rc\" -gt 128 ] || break\n"
           "done\n"
           "# 75: stopped by the time-limit warning, rows committed: resume in a new run\n"
           "if [ \"$tw_rc\" = 75 ] && [ \"$tw_usr1\" = 1 ] && [ -n \"${SLURM_JOB_ID:-}\" ]; then\n"
           "  echo \"tilewise submit: time limit near, requeueing job $SLURM_JOB_ID\" >&2\n"
           "  scontrol requeue \"$SLURM_JOB_ID\"\n"
           "fi\n"
           "exit \"$tw_rc\"\n");

    strbuf m = {.ok = true};
    char mname[80];
    snprintf(mname, sizeof mname, "%s-merge", name);
    add_header(&m, out_dir ? out_dir : "", mname,
               "Merge job: the final products once every array task succeeded");
    sb_printf(&m, "#SBATCH --dependency=afterok:%s\n", array_job_id);
    sb_add(&m, "#SBATCH --kill-on-invalid-dep=yes\n#SBATCH --requeue\n");
    tilewise_job mj = *job;
    mj.threads = 0; /* merge is I/O: one CPU */
    add_resources(&m, &mj, false);
    sb_add(&m, "#SBATCH --output=tilewise-merge-%j.out\n#SBATCH --error=tilewise-merge-%j.err\n"
               "#SBATCH --open-mode=append\n\n");
    add_cd(&m, cwd ? cwd : "/");
    sb_add(&m, "exec ");
    sb_quoted(&m, sp->tilewise);
    sb_add(&m, " merge ");
    sb_quoted(&m, out_dir ? out_dir : "");
    sb_add(&m, "\n");

    bool ok = wf && out_dir && a.ok && m.ok;
    free(wf);
    free(out_dir);
    if (!ok) {
        free(a.s);
        free(m.s);
        return fail_with(err, TILEWISE_ERR_NOMEM, "out of memory writing the job scripts");
    }
    *array_script = a.s;
    *merge_script = m.s;
    return TILEWISE_OK;
}

/* ---- running sbatch ---- */

/* The program sbatch names: itself when it holds a '/', else the first
 * executable of that name in PATH. NULL when there is none. */
static char *find_program(const char *prog)
{
    if (strchr(prog, '/')) return access(prog, X_OK) == 0 ? strdup(prog) : NULL;
    const char *path = getenv("PATH");
    if (!path) path = "/usr/bin:/bin";
    while (*path) {
        const char *end = strchr(path, ':');
        size_t n = end ? (size_t)(end - path) : strlen(path);
        char *cand = malloc(n + strlen(prog) + 3);
        if (!cand) return NULL;
        if (n == 0)
            sprintf(cand, "./%s", prog);
        else
            sprintf(cand, "%.*s/%s", (int)n, path, prog);
        struct stat st;
        if (stat(cand, &st) == 0 && S_ISREG(st.st_mode) && access(cand, X_OK) == 0) return cand;
        free(cand);
        if (!end) break;
        path = end + 1;
    }
    return NULL;
}

/* Drain fd into b (the child's stdout or stderr). Returns false at EOF. */
static bool drain(int fd, strbuf *b)
{
    char chunk[4096];
    ssize_t n = read(fd, chunk, sizeof chunk);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
    if (n <= 0) return false;
    sb_grow(b, (size_t)n);
    if (b->ok) {
        memcpy(b->s + b->len, chunk, (size_t)n);
        b->len += (size_t)n;
        b->s[b->len] = '\0';
    }
    return true;
}

/* Run `prog --parsable [opts...] script` in dir; the job id it prints goes
 * to id. TILEWISE_ERR_DEVICE with sbatch's own message when it fails. */
static tilewise_status run_sbatch(const char *prog, const tw_submit_params *sp, const char *dir,
                                  const char *script, const char *what, char *id, size_t id_size,
                                  tilewise_error *err)
{
    const char *argv[MAX_SBATCH_OPTS + 4];
    int argc = 0;
    argv[argc++] = prog;
    argv[argc++] = "--parsable";
    for (int i = 0; i < sp->n_sbatch_opts; i++) argv[argc++] = sp->sbatch_opts[i];
    argv[argc++] = script;
    argv[argc] = NULL;

    int out_pipe[2], err_pipe[2];
    if (pipe2(out_pipe, O_CLOEXEC) != 0)
        return fail_with(err, TILEWISE_ERR_DEVICE, "cannot run %s: pipe: %s", prog,
                         strerror(errno));
    if (pipe2(err_pipe, O_CLOEXEC) != 0) {
        close(out_pipe[0]);
        close(out_pipe[1]);
        return fail_with(err, TILEWISE_ERR_DEVICE, "cannot run %s: pipe: %s", prog,
                         strerror(errno));
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        for (int i = 0; i < 2; i++) close(out_pipe[i]), close(err_pipe[i]);
        return fail_with(err, TILEWISE_ERR_DEVICE, "cannot run %s: fork: %s", prog,
                         strerror(errno));
    }
    if (pid == 0) {
        /* Only async-signal-safe calls between fork and exec. */
        if (dup2(out_pipe[1], 1) < 0 || dup2(err_pipe[1], 2) < 0 || chdir(dir) != 0) _exit(126);
        execv(prog, (char *const *)argv);
        _exit(127);
    }
    close(out_pipe[1]);
    close(err_pipe[1]);
    strbuf o = {.ok = true}, e = {.ok = true};
    struct pollfd fds[2] = {{.fd = out_pipe[0], .events = POLLIN},
                            {.fd = err_pipe[0], .events = POLLIN}};
    int open_fds = 2;
    while (open_fds > 0) {
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        for (int i = 0; i < 2; i++) {
            if (fds[i].fd >= 0 && (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) &&
                !drain(fds[i].fd, i == 0 ? &o : &e)) {
                close(fds[i].fd);
                fds[i].fd = -1;
                open_fds--;
            }
        }
    }
    for (int i = 0; i < 2; i++)
        if (fds[i].fd >= 0) close(fds[i].fd);
    int wstatus = 0;
    while (waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
    }

    tilewise_status st = TILEWISE_OK;
    const char *emsg = e.ok && e.s ? e.s : "";
    if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
        int code = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
        if (code == 126)
            st = fail_with(err, TILEWISE_ERR_DEVICE, "%s: cannot run %s in %s", what, prog, dir);
        else
            st = fail_with(err, TILEWISE_ERR_DEVICE, "%s: %s exited with %d: %s", what, prog, code,
                           emsg[0] ? emsg : "(no message)");
    } else {
        /* --parsable: "jobid" or "jobid;cluster" */
        const char *s = o.ok && o.s ? o.s : "";
        size_t n = strspn(s, "0123456789");
        if (n == 0 || n >= id_size || (s[n] != '\0' && s[n] != ';' && s[n] != '\n')) {
            st = fail_with(err, TILEWISE_ERR_DEVICE, "%s: %s printed no job id (got '%.80s')%s%s",
                           what, prog, s, emsg[0] ? ": " : "", emsg);
        } else {
            memcpy(id, s, n);
            id[n] = '\0';
        }
    }
    free(o.s);
    free(e.s);
    return st;
}

tilewise_status tw_submit(const tw_submit_params *sp, const tilewise_job *job, FILE *out,
                          tilewise_error *err)
{
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd))
        return fail_with(err, TILEWISE_ERR_OUTPUT, "cannot read the current directory: %s",
                         strerror(errno));
    if (sp->array < 1 || sp->array > TW_SUBMIT_MAX_ARRAY)
        return fail_with(err, TILEWISE_ERR_USAGE, "--array must be 1..%d tasks, got %d",
                         TW_SUBMIT_MAX_ARRAY, sp->array);
    if (sp->n_sbatch_opts > MAX_SBATCH_OPTS)
        return fail_with(err, TILEWISE_ERR_USAGE, "too many --sbatch options (at most %d)",
                         MAX_SBATCH_OPTS);
    if (!sp->tilewise || sp->tilewise[0] != '/')
        return fail_with(err, TILEWISE_ERR_USAGE, "the tilewise binary must be an absolute path");

    char *array_s = NULL, *merge_s = NULL;
    tilewise_status st;
    if (sp->dry_run) {
        st = tw_submit_scripts(sp, job, cwd, "ARRAY_JOB_ID", &array_s, &merge_s, err);
        if (st == TILEWISE_OK) {
            fprintf(out,
                    "%s\n# ---- the merge job (submitted after the array; ARRAY_JOB_ID = its "
                    "job id) ----\n%s",
                    array_s, merge_s);
            if (fflush(out) != 0 || ferror(out))
                st = fail_with(err, TILEWISE_ERR_OUTPUT, "cannot write the scripts: %s",
                               strerror(errno));
        }
        free(array_s);
        free(merge_s);
        return st;
    }

    if (device_is_cuda(job->device) && strcmp(job->device, "cuda") != 0 &&
        strcmp(job->device, "cuda:0") != 0)
        fprintf(out,
                "note: runtime.device %s: each task runs on the GPU SLURM grants it "
                "(--gres=gpu:1), which it sees as cuda:0\n",
                job->device);
    char *prog = find_program(sp->sbatch);
    if (!prog)
        return fail_with(err, TILEWISE_ERR_DEVICE,
                         "'%s' not found in PATH: submit needs SLURM's sbatch on this machine "
                         "(tilewise submit --dry-run prints the job scripts)",
                         sp->sbatch);
    char *out_dir = abs_path(cwd, job->output_dir);
    strbuf dir = {.ok = true}, array_path = {.ok = true}, merge_path = {.ok = true};
    sb_add(&dir, out_dir ? out_dir : "");
    sb_add(&dir, "/.tilewise-slurm");
    sb_printf(&array_path, "%s/array.sh", dir.s ? dir.s : "");
    sb_printf(&merge_path, "%s/merge.sh", dir.s ? dir.s : "");
    char array_id[64] = "", merge_id[64] = "";
    if (!out_dir || !dir.ok || !array_path.ok || !merge_path.ok) {
        st = fail_with(err, TILEWISE_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((st = make_dirs(dir.s, err)) != TILEWISE_OK) goto done;
    if ((st = tw_submit_scripts(sp, job, cwd, "ARRAY_JOB_ID", &array_s, &merge_s, err)) !=
        TILEWISE_OK)
        goto done;
    if ((st = write_script(array_path.s, array_s, err)) != TILEWISE_OK) goto done;
    if ((st = run_sbatch(prog, sp, dir.s, array_path.s, "the array job", array_id, sizeof array_id,
                         err)) != TILEWISE_OK)
        goto done;
    fprintf(out, "array job %s: %d tasks (script %s)\n", array_id, sp->array, array_path.s);
    /* The merge script names the array job it waits for. */
    free(array_s);
    free(merge_s);
    array_s = merge_s = NULL;
    if ((st = tw_submit_scripts(sp, job, cwd, array_id, &array_s, &merge_s, err)) != TILEWISE_OK)
        goto done;
    if ((st = write_script(merge_path.s, merge_s, err)) != TILEWISE_OK) goto done;
    if ((st = run_sbatch(prog, sp, dir.s, merge_path.s, "the merge job", merge_id, sizeof merge_id,
                         err)) != TILEWISE_OK) {
        fprintf(out,
                "the array job %s is queued without its merge: scancel %s, or run "
                "tilewise merge on the output directory when it is done\n",
                array_id, array_id);
        goto done;
    }
    fprintf(out, "merge job %s: after array job %s succeeds (script %s)\n", merge_id, array_id,
            merge_path.s);
    fprintf(out, "logs: %s/tilewise-%s_*.out|err\n", dir.s, array_id);
    fflush(out);
done:
    free(prog);
    free(out_dir);
    free(dir.s);
    free(array_path.s);
    free(merge_path.s);
    free(array_s);
    free(merge_s);
    return st;
}

/* ---- the command ---- */

static int usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, "tilewise: submit: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (see tilewise --help)\n");
    return TILEWISE_EXIT_USAGE;
}

/* The value of option name at argv[*i] ("--name v" or "--name=v"), or NULL
 * when argv[*i] is another option. *missing is set when the value lacks. */
static const char *opt_value(int argc, char **argv, int *i, const char *name, bool *missing)
{
    size_t n = strlen(name);
    const char *a = argv[*i];
    if (strncmp(a, name, n) != 0) return NULL;
    if (a[n] == '=') return a + n + 1;
    if (a[n] != '\0') return NULL;
    if (*i + 1 >= argc) {
        *missing = true;
        return NULL;
    }
    return argv[++*i];
}

int tw_cli_submit(int argc, char **argv)
{
    static const char *sets[MAX_SETS];
    static const char *opts[MAX_SBATCH_OPTS];
    tw_submit_params sp = tw_submit_default_params();
    sp.sets = sets;
    sp.sbatch_opts = opts;
    bool array_given = false;
    for (int i = 0; i < argc; i++) {
        bool missing = false;
        const char *v;
        if ((v = opt_value(argc, argv, &i, "--array", &missing)) || missing) {
            char *end = NULL;
            long n = v ? strtol(v, &end, 10) : 0;
            if (!v || *end || end == v || n < 1 || n > TW_SUBMIT_MAX_ARRAY) {
                fprintf(stderr,
                        "tilewise: submit: --array expects a number of tasks 1..%d, got '%s'\n",
                        TW_SUBMIT_MAX_ARRAY, v ? v : "");
                return TILEWISE_EXIT_USAGE;
            }
            sp.array = (int)n;
            array_given = true;
        } else if ((v = opt_value(argc, argv, &i, "--chunk-rows", &missing)) || missing) {
            char *end = NULL;
            long n = v ? strtol(v, &end, 10) : 0;
            if (!v || *end || end == v || n < 1 || n > TILEWISE_CHUNK_ROWS_MAX)
                return usage_error("--chunk-rows expects a positive number of rows, got '%s'",
                                   v ? v : "");
            sp.chunk_rows = (int)n;
        } else if ((v = opt_value(argc, argv, &i, "--set", &missing)) || missing) {
            if (!v) return usage_error("--set needs key.path=value%s", "");
            if (sp.n_sets == MAX_SETS) return usage_error("too many --set options%s", "");
            sets[sp.n_sets++] = v;
        } else if ((v = opt_value(argc, argv, &i, "--sbatch", &missing)) || missing) {
            if (!v)
                return usage_error("--sbatch needs an sbatch option such as --time=2:00:00%s", "");
            if (sp.n_sbatch_opts == MAX_SBATCH_OPTS)
                return usage_error("too many --sbatch options%s", "");
            opts[sp.n_sbatch_opts++] = v;
        } else if (strcmp(argv[i], "--dry-run") == 0) {
            sp.dry_run = true;
        } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
            return usage_error("unknown option '%s'", argv[i]);
        } else if (!sp.workflow) {
            sp.workflow = argv[i];
        } else {
            return usage_error("unexpected argument '%s'", argv[i]);
        }
    }
    if (!sp.workflow) return usage_error("missing WORKFLOW.yaml%s", "");
    if (!array_given) return usage_error("missing --array N (the number of tasks)%s", "");

    tilewise_error err = {0};
    tilewise_run_options o;
    tilewise_run_options_init(&o);
    o.sets = sets;
    o.n_sets = sp.n_sets;
    tilewise_job job = {.size = sizeof job};
    /* A bad workflow fails here, once, rather than in every array task;
     * what can be checked on this machine is, before anything is queued. */
    tilewise_status st = tilewise_check(sp.workflow, &o, &job, &err);
    char self[PATH_MAX];
    if (st == TILEWISE_OK) {
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n <= 0)
            st = fail_with(&err, TILEWISE_ERR_INTERNAL,
                           "cannot find the tilewise binary: /proc/self/exe: %s", strerror(errno));
        else
            self[n] = '\0';
        sp.tilewise = self;
    }
    if (st == TILEWISE_OK) st = tw_submit(&sp, &job, stdout, &err);
    if (st == TILEWISE_OK) return TILEWISE_EXIT_OK;
    /* The scheduler is the resource a submit needs (exit 4, like a missing GPU). */
    fprintf(stderr, "tilewise: %s: %s\n",
            err.status == TILEWISE_ERR_DEVICE ? "scheduler error"
                                              : tilewise_status_name(err.status),
            err.message);
    return tilewise_exit_code(err.status);
}

/* testutil.c - see testutil.h */
#include "tests/testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/modelfile/model_file.h"

const char *tw_test_fixtures(void)
{
    const char *d = getenv("TW_FIXTURES");
    return (d && *d) ? d : NULL;
}

const char *tw_test_path(const char *dir, const char *name)
{
    static char bufs[8][4096];
    static int next;
    char *b = bufs[next++ & 7];
    snprintf(b, 4096, "%s/%s", dir, name);
    return b;
}

const char *tw_test_shared_rasters(void)
{
    static char buf[4096];
    const char *d = getenv("TW_SHARED_DATA");
    if (!d || !*d) return NULL;
    snprintf(buf, sizeof buf, "%s/rasters", d);
    struct stat st;
    if (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode)) return NULL;
    return buf;
}

char *tw_test_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    char *s = n >= 0 && fseek(f, 0, SEEK_SET) == 0 ? malloc((size_t)n + 1) : NULL;
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s) {
        s[n] = '\0';
        if (len) *len = (size_t)n;
    }
    fclose(f);
    return s;
}

long tw_test_read_f32(const char *path, float **out)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return -1;
    }
    long bytes = ftell(f);
    rewind(f);
    if (bytes < 0 || bytes % 4) {
        fclose(f);
        return -1;
    }
    float *v = malloc(bytes ? (size_t)bytes : 1);
    if (!v || fread(v, 1, (size_t)bytes, f) != (size_t)bytes) {
        free(v);
        fclose(f);
        return -1;
    }
    fclose(f);
    *out = v;
    return bytes / 4;
}

const char *tw_test_tmpdir(void)
{
    static char bufs[4][4096];
    static int next;
    char *b = bufs[next++ & 3];
    const char *t = getenv("TMPDIR");
    snprintf(b, 4096, "%s/tilewise-test-XXXXXX", (t && *t) ? t : "/tmp");
    return mkdtemp(b);
}

bool tw_test_file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

const char *tw_test_fixture(const char *name)
{
    const char *dir = tw_test_fixtures();
    if (!dir) return NULL;
    const char *p = tw_test_path(dir, name);
    return tw_test_file_exists(p) ? p : NULL;
}

struct tw_model_file *tw_test_load_model(const char *path)
{
    tw_error err;
    tw_error_init(&err);
    tw_model_file *mf = NULL;
    if (tw_model_file_load(path, &mf, &err) != TW_OK) {
        fprintf(stderr, "load %s: %s\n", path, err.msg);
        return NULL;
    }
    return mf;
}

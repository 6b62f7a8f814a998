/* test_fileio.c - durable files (pipeline/fileio.c): an atomic write leaves
 * the old file or the whole new one and never its temporary; mkdir -p makes
 * every level, accepts what exists and names the component it cannot make. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/fileio.h"
#include "testutil.h"

static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = calloc(1, 1 << 16);
    *n = fread(buf, 1, (1 << 16) - 1, f);
    fclose(f);
    return buf;
}

/* Entries of dir other than . and .. */
static int entries(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) n++;
    closedir(d);
    return n;
}

static void test_atomic_write(void **state)
{
    (void)state;
    const char *dir = tw_test_tmpdir();
    const char *path = tw_test_path(dir, "a.json");
    tw_error err;
    tw_error_init(&err);
    assert_int_equal(tw_write_file_atomic(path, "first\n", 6, &err), TW_OK);
    size_t n;
    char *got = slurp(path, &n);
    assert_int_equal(n, 6);
    assert_memory_equal(got, "first\n", 6);
    free(got);
    /* Replacing: the new content whole, binary bytes (NULs) included. */
    const char bin[5] = {'x', 0, 'y', 0, 'z'};
    assert_int_equal(tw_write_file_atomic(path, bin, sizeof bin, &err), TW_OK);
    got = slurp(path, &n);
    assert_int_equal(n, sizeof bin);
    assert_memory_equal(got, bin, sizeof bin);
    free(got);
    /* Empty content is a file of 0 bytes, not an error. */
    assert_int_equal(tw_write_file_atomic(path, "", 0, &err), TW_OK);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_size, 0);
    assert_int_equal(entries(dir), 1); /* no temporary left behind */
}

static void test_atomic_write_errors(void **state)
{
    (void)state;
    const char *dir = tw_test_tmpdir();
    tw_error err;
    tw_error_init(&err);
    /* The directory does not exist: the message names the path and why. */
    const char *missing = tw_test_path(dir, "no/such/x.json");
    assert_int_equal(tw_write_file_atomic(missing, "x", 1, &err), TW_ERR_OUTPUT);
    assert_non_null(strstr(err.msg, missing));
    assert_non_null(strstr(err.msg, "No such file or directory"));
    /* The final name is a directory: the rename fails, the temporary goes,
     * and the directory is untouched. */
    const char *sub = tw_test_path(dir, "taken");
    assert_int_equal(mkdir(sub, 0777), 0);
    tw_error_init(&err);
    assert_int_equal(tw_write_file_atomic(sub, "x", 1, &err), TW_ERR_OUTPUT);
    assert_non_null(strstr(err.msg, "cannot write"));
    assert_non_null(strstr(err.msg, sub));
    assert_int_equal(entries(dir), 1);
    struct stat sb;
    assert_int_equal(stat(sub, &sb), 0);
    assert_true(S_ISDIR(sb.st_mode));
}

static void test_mkdir_p(void **state)
{
    (void)state;
    const char *dir = tw_test_tmpdir();
    tw_error err;
    tw_error_init(&err);
    const char *deep = tw_test_path(dir, "a/b/c/d");
    assert_int_equal(tw_mkdir_p(deep, &err), TW_OK);
    struct stat sb;
    assert_int_equal(stat(deep, &sb), 0);
    assert_true(S_ISDIR(sb.st_mode));
    assert_int_equal(tw_mkdir_p(deep, &err), TW_OK); /* exists: fine */
    assert_int_equal(tw_mkdir_p(tw_test_path(dir, "a/b/"), &err), TW_OK);

    /* A file where a directory should be: named, not created through. */
    const char *file = tw_test_path(dir, "a/file");
    assert_int_equal(tw_write_file_atomic(file, "x", 1, &err), TW_OK);
    const char *under = tw_test_path(dir, "a/file/sub");
    assert_int_equal(tw_mkdir_p(under, &err), TW_ERR_OUTPUT);
    assert_non_null(strstr(err.msg, "cannot create"));
    assert_non_null(strstr(err.msg, "a/file/sub"));
    assert_non_null(strstr(err.msg, "Not a directory"));
    tw_error_init(&err);
    assert_int_equal(tw_mkdir_p(file, &err), TW_ERR_OUTPUT);
    assert_non_null(strstr(err.msg, "is not a directory"));

    /* fsync of a directory: fine on one that exists, named when missing. */
    tw_error_init(&err);
    assert_int_equal(tw_fsync_dir(deep, &err), TW_OK);
    assert_int_equal(tw_fsync_dir(tw_test_path(dir, "nope"), &err), TW_ERR_OUTPUT);
    assert_non_null(strstr(err.msg, "nope"));

    /* Longer than any path tilewise keeps: refused, not truncated. */
    char *longp = malloc(8192);
    memset(longp, 'x', 8191);
    longp[8191] = '\0';
    tw_error_init(&err);
    assert_int_equal(tw_mkdir_p(longp, &err), TW_ERR_OUTPUT);
    assert_non_null(strstr(err.msg, "path too long"));
    tw_error_init(&err);
    assert_int_equal(tw_write_file_atomic(longp, "x", 1, &err), TW_ERR_OUTPUT);
    assert_non_null(strstr(err.msg, "path too long"));
    free(longp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_atomic_write),
        cmocka_unit_test(test_atomic_write_errors),
        cmocka_unit_test(test_mkdir_p),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

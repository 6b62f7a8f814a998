/* test_tiletable.c - the HDF5 tile table: written by io/output/tiletable.c, read
 * back with the HDF5 C API. */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <hdf5.h>

#include "io/output/tiletable.h"
#include "tests/testutil.h"

static const char k_names[3][TW_NAME_MAX] = {"water", "forest", "urban"};
static const double k_gt[6] = {600000.0, 30.0, 0.0, 5100000.0, 0.0, -30.0};
static const char *k_wkt = "PROJCS[\"WGS 84 / UTM zone 32N\",AUTHORITY[\"EPSG\",\"32632\"]]";

static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) unlink(tw_test_path(dir, e->d_name));
    closedir(d);
    rmdir(dir);
}

static tw_tiletable_params base_params(const char *path, int feat_dim)
{
    tw_tiletable_params p;
    memset(&p, 0, sizeof p);
    p.path = path;
    p.n_classes = 3;
    p.class_names = k_names;
    p.feat_dim = feat_dim;
    p.tile = 64;
    p.stride = 32;
    memcpy(p.geotransform, k_gt, sizeof k_gt);
    p.crs_wkt = k_wkt;
    return p;
}

/* Read a whole 2-D dataset; checks its dims and type class. */
static void read_2d(hid_t file, const char *name, hid_t mtype, hsize_t rows, hsize_t cols,
                    void *out)
{
    hid_t ds = H5Dopen2(file, name, H5P_DEFAULT);
    assert_true(ds >= 0);
    hid_t sp = H5Dget_space(ds);
    hsize_t dims[2] = {0, 0};
    assert_int_equal(H5Sget_simple_extent_ndims(sp), 2);
    H5Sget_simple_extent_dims(sp, dims, NULL);
    assert_int_equal(dims[0], rows);
    assert_int_equal(dims[1], cols);
    /* Chunked and deflated at level 4. */
    hid_t dcpl = H5Dget_create_plist(ds);
    assert_int_equal(H5Pget_layout(dcpl), H5D_CHUNKED);
    unsigned flags, cd[4];
    size_t ncd = 4;
    assert_int_equal(H5Pget_filter2(dcpl, 0, &flags, &ncd, cd, 0, NULL, NULL), H5Z_FILTER_DEFLATE);
    assert_int_equal(cd[0], 4);
    H5Pclose(dcpl);
    hid_t ftype = H5Dget_type(ds);
    assert_int_equal(H5Tget_class(ftype), H5Tget_class(mtype));
    assert_int_equal(H5Tget_size(ftype), 4);
    H5Tclose(ftype);
    if (rows) assert_true(H5Dread(ds, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, out) >= 0);
    H5Sclose(sp);
    H5Dclose(ds);
}

static void read_attr(hid_t file, const char *name, hid_t mtype, void *out)
{
    hid_t a = H5Aopen(file, name, H5P_DEFAULT);
    assert_true(a >= 0);
    assert_true(H5Aread(a, mtype, out) >= 0);
    H5Aclose(a);
}

static void test_write_read(void **state)
{
    (void)state;
    const char *dir = tw_test_tmpdir();
    assert_non_null(dir);
    char path[4096], part[4200];
    snprintf(path, sizeof path, "%s/scene.tiles.h5", dir);
    snprintf(part, sizeof part, "%s.part", path);
    tw_tiletable_params p = base_params(path, 5);
    tw_error err;
    tw_error_init(&err);
    tw_tiletable *t = NULL;
    if (tw_tiletable_create(&p, &t, &err) != TW_OK) fail_msg("create: %s", err.msg);

    enum { N = 5, F = 5 };
    int32_t rows[N], cols[N];
    float probs[N * 3], emb[N * F];
    for (int i = 0; i < N; i++) {
        rows[i] = 32 * (i / 2);
        cols[i] = 1000 + 32 * i;
        for (int j = 0; j < 3; j++) probs[i * 3 + j] = 0.1f * (float)(i + 1) + 0.01f * (float)j;
        for (int j = 0; j < F; j++) emb[i * F + j] = (float)(i * 100 + j) - 0.5f;
    }
    assert_int_equal(tw_tiletable_append(t, 3, rows, cols, probs, emb, &err), TW_OK);
    assert_int_equal(tw_tiletable_append(t, 0, NULL, NULL, NULL, NULL, &err), TW_OK);
    assert_int_equal(tw_tiletable_append(t, 2, rows + 3, cols + 3, probs + 9, emb + 15, &err),
                     TW_OK);
    assert_true(tw_test_file_exists(part));
    assert_false(tw_test_file_exists(path));
    if (tw_tiletable_finish(t, &err) != TW_OK) fail_msg("finish: %s", err.msg);
    assert_false(tw_test_file_exists(part));
    assert_true(tw_test_file_exists(path));
    /* After finish, destroy must keep the file. */
    tw_tiletable_destroy(t);
    assert_true(tw_test_file_exists(path));

    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    assert_true(f >= 0);
    int32_t origin[N][2];
    read_2d(f, "origin", H5T_NATIVE_INT32, N, 2, origin);
    for (int i = 0; i < N; i++) {
        assert_int_equal(origin[i][0], rows[i]);
        assert_int_equal(origin[i][1], cols[i]);
    }
    float pr[N * 3], em[N * F];
    read_2d(f, "probabilities", H5T_NATIVE_FLOAT, N, 3, pr);
    assert_memory_equal(pr, probs, sizeof pr);
    read_2d(f, "embeddings", H5T_NATIVE_FLOAT, N, F, em);
    assert_memory_equal(em, emb, sizeof em);

    double gt[6];
    read_attr(f, "geotransform", H5T_NATIVE_DOUBLE, gt);
    assert_memory_equal(gt, k_gt, sizeof gt);
    int tile = 0, stride = 0;
    read_attr(f, "tile", H5T_NATIVE_INT, &tile);
    read_attr(f, "stride", H5T_NATIVE_INT, &stride);
    assert_int_equal(tile, 64);
    assert_int_equal(stride, 32);

    hid_t vstr = H5Tcopy(H5T_C_S1);
    H5Tset_size(vstr, H5T_VARIABLE);
    H5Tset_cset(vstr, H5T_CSET_UTF8); /* HDF5 does not convert between character sets */
    char *wkt = NULL;
    read_attr(f, "crs_wkt", vstr, &wkt);
    assert_string_equal(wkt, k_wkt);
    H5free_memory(wkt);
    hid_t a = H5Aopen(f, "classes", H5P_DEFAULT);
    hid_t sp = H5Aget_space(a);
    hsize_t n_cls = 0;
    H5Sget_simple_extent_dims(sp, &n_cls, NULL);
    assert_int_equal(n_cls, 3);
    char *cls[3] = {NULL, NULL, NULL};
    assert_true(H5Aread(a, vstr, cls) >= 0);
    for (int j = 0; j < 3; j++) {
        assert_string_equal(cls[j], k_names[j]);
        H5free_memory(cls[j]);
    }
    H5Sclose(sp);
    H5Aclose(a);
    H5Tclose(vstr);
    H5Fclose(f);
    remove_dir(dir);
}

/* Many tiles over several appends (crossing chunk boundaries), no embeddings. */
static void test_many_no_embeddings(void **state)
{
    (void)state;
    enum { N = 9000 };
    const char *dir = tw_test_tmpdir();
    const char *path = tw_test_path(dir, "big.tiles.h5");
    tw_tiletable_params p = base_params(path, 0);
    p.class_names = NULL; /* default names */
    tw_error err;
    tw_error_init(&err);
    tw_tiletable *t = NULL;
    assert_int_equal(tw_tiletable_create(&p, &t, &err), TW_OK);
    int32_t *rows = malloc(sizeof(int32_t) * N), *cols = malloc(sizeof(int32_t) * N);
    float *probs = malloc(sizeof(float) * N * 3);
    assert_non_null(rows);
    assert_non_null(cols);
    assert_non_null(probs);
    for (int i = 0; i < N; i++) {
        rows[i] = (i / 100) * 64;
        cols[i] = (i % 100) * 64;
        for (int j = 0; j < 3; j++) probs[i * 3 + j] = (float)((i * 3 + j) % 1000) / 1000.0f;
    }
    const int parts[] = {4000, 1, 3999, 1000};
    int at = 0;
    for (int k = 0; k < 4; k++) {
        assert_int_equal(
            tw_tiletable_append(t, parts[k], rows + at, cols + at, probs + at * 3, NULL, &err),
            TW_OK);
        at += parts[k];
    }
    assert_int_equal(tw_tiletable_finish(t, &err), TW_OK);
    tw_tiletable_destroy(t);

    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    assert_true(f >= 0);
    assert_int_equal(H5Lexists(f, "embeddings", H5P_DEFAULT), 0);
    int32_t *origin = malloc(sizeof(int32_t) * N * 2);
    float *pr = malloc(sizeof(float) * N * 3);
    read_2d(f, "origin", H5T_NATIVE_INT32, N, 2, origin);
    read_2d(f, "probabilities", H5T_NATIVE_FLOAT, N, 3, pr);
    for (int i = 0; i < N; i++) {
        assert_int_equal(origin[2 * i], rows[i]);
        assert_int_equal(origin[2 * i + 1], cols[i]);
    }
    assert_memory_equal(pr, probs, sizeof(float) * N * 3);
    hid_t vstr = H5Tcopy(H5T_C_S1);
    H5Tset_size(vstr, H5T_VARIABLE);
    H5Tset_cset(vstr, H5T_CSET_UTF8); /* HDF5 does not convert between character sets */
    char *cls[3] = {NULL, NULL, NULL};
    read_attr(f, "classes", vstr, cls);
    assert_string_equal(cls[2], "class_2");
    for (int j = 0; j < 3; j++) H5free_memory(cls[j]);
    H5Tclose(vstr);
    H5Fclose(f);
    free(origin);
    free(pr);
    free(rows);
    free(cols);
    free(probs);
    remove_dir(dir);
}

static void test_destroy_removes_part(void **state)
{
    (void)state;
    const char *dir = tw_test_tmpdir();
    const char *path = tw_test_path(dir, "scene.tiles.h5");
    tw_tiletable_params p = base_params(path, 2);
    tw_error err;
    tw_error_init(&err);
    tw_tiletable *t = NULL;
    assert_int_equal(tw_tiletable_create(&p, &t, &err), TW_OK);
    int32_t r = 0, c = 0;
    float pr[3] = {0.2f, 0.3f, 0.5f}, em[2] = {1, 2};
    assert_int_equal(tw_tiletable_append(t, 1, &r, &c, pr, em, &err), TW_OK);
    /* Embeddings were promised: leaving them out is a caller bug. */
    assert_int_equal(tw_tiletable_append(t, 1, &r, &c, pr, NULL, &err), TW_ERR_INTERNAL);
    assert_int_equal(count_entries(dir), 1);
    tw_tiletable_destroy(t);
    assert_int_equal(count_entries(dir), 0);
    tw_tiletable_destroy(NULL);
    remove_dir(dir);
}

static void test_bad_path(void **state)
{
    (void)state;
    const char *dir = tw_test_tmpdir();
    char path[4096];
    snprintf(path, sizeof path, "%s/missing/scene.tiles.h5", dir);
    tw_tiletable_params p = base_params(path, 0);
    tw_error err;
    tw_error_init(&err);
    tw_tiletable *t = (tw_tiletable *)&err;
    assert_int_equal(tw_tiletable_create(&p, &t, &err), TW_ERR_OUTPUT);
    assert_null(t);
    if (!strstr(err.msg, path)) fail_msg("message '%s' does not name %s", err.msg, path);

    /* Under a regular file. */
    const char *afile = tw_test_path(dir, "afile");
    FILE *f = fopen(afile, "w");
    assert_non_null(f);
    fclose(f);
    snprintf(path, sizeof path, "%s/afile/scene.tiles.h5", dir);
    tw_error_init(&err);
    assert_int_equal(tw_tiletable_create(&p, &t, &err), TW_ERR_OUTPUT);
    if (!strstr(err.msg, path)) fail_msg("message '%s' does not name %s", err.msg, path);
    assert_int_equal(count_entries(dir), 1);

    /* The final name is a directory: the rename at finish could never work. */
    snprintf(path, sizeof path, "%s/taken.h5", dir);
    assert_int_equal(mkdir(path, 0755), 0);
    tw_error_init(&err);
    assert_int_equal(tw_tiletable_create(&p, &t, &err), TW_ERR_OUTPUT);
    if (!strstr(err.msg, path)) fail_msg("message '%s' does not name %s", err.msg, path);
    assert_int_equal(count_entries(dir), 2);
    rmdir(path);
    remove_dir(dir);
}

/* A full disk, simulated with RLIMIT_FSIZE (writes fail with EFBIG). */
static void test_write_failure(void **state)
{
    (void)state;
    enum { N = 20000, F = 16 };
    const char *dir = tw_test_tmpdir();
    const char *path = tw_test_path(dir, "scene.tiles.h5");
    tw_tiletable_params p = base_params(path, F);
    tw_error err;
    tw_error_init(&err);
    tw_tiletable *t = NULL;
    assert_int_equal(tw_tiletable_create(&p, &t, &err), TW_OK);
    int32_t *rc = calloc(N, sizeof(int32_t));
    float *probs = malloc(sizeof(float) * N * 3), *emb = malloc(sizeof(float) * N * F);
    assert_non_null(rc);
    assert_non_null(probs);
    assert_non_null(emb);
    /* Poorly compressible values so that deflate cannot hide the size. */
    uint32_t x = 12345;
    for (size_t i = 0; i < (size_t)N * F; i++) {
        x = x * 1664525u + 1013904223u;
        emb[i] = (float)x;
        if (i < (size_t)N * 3) probs[i] = (float)(x >> 8);
    }

    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim = old;
    lim.rlim_cur = 64 * 1024;
    void (*old_sig)(int) = signal(SIGXFSZ, SIG_IGN);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    tw_status st = tw_tiletable_append(t, N, rc, rc, probs, emb, &err);
    if (st == TW_OK) st = tw_tiletable_finish(t, &err);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, old_sig);

    assert_int_equal(st, TW_ERR_OUTPUT);
    if (!strstr(err.msg, path)) fail_msg("message '%s' does not name %s", err.msg, path);
    assert_false(tw_test_file_exists(path));
    tw_tiletable_destroy(t);
    assert_int_equal(count_entries(dir), 0);
    free(rc);
    free(probs);
    free(emb);
    remove_dir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_write_read),           cmocka_unit_test(test_many_no_embeddings),
        cmocka_unit_test(test_destroy_removes_part), cmocka_unit_test(test_bad_path),
        cmocka_unit_test(test_write_failure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

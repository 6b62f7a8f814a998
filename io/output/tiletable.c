/* tiletable.c - see tiletable.h
 *
 * The datasets start empty with an unlimited first dimension and grow by
 * H5Dset_extent on each append. All attributes are written at create time,
 * so finish only has to flush, close and rename. HDF5's automatic error
 * printing is switched off inside every public call (and restored after it);
 * failures are turned into one tw_error naming the file, the call and the
 * most specific message on HDF5's error stack.
 */
#include "io/output/tiletable.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <hdf5.h>

#include "core/alloc.h"
#include "core/fileio.h"

/* Chunks of about this many bytes: big enough for deflate to work well,
 * small enough that HDF5's per-dataset chunk cache (1 MiB) holds one. */
#define TW_TT_CHUNK_BYTES (256 * 1024)
#define TW_TT_CHUNK_ROWS_MAX 4096
#define TW_TT_DEFLATE_LEVEL 4

struct tw_tiletable {
    hid_t file, ds_origin, ds_prob, ds_emb;
    int n_classes, feat_dim;
    hsize_t n_tiles;
    bool finished;
    char path[TW_PATH_MAX];
    char part_path[TW_PATH_MAX + 8];
    char h5_msg[256]; /* error-stack text captured right after a failed call */
};

/* HDF5 error-stack walker: keep the innermost (most specific) description. */
static herr_t h5_walk_first(unsigned n, const H5E_error2_t *e, void *data)
{
    char *buf = data;
    if (n == 0 && e && e->desc) snprintf(buf, 256, "%s", e->desc);
    return 0;
}

/* Capture HDF5's error stack now: the next successful API call (a close in
 * the cleanup path) clears it. */
static void h5_note(tw_tiletable *t)
{
    if (t->h5_msg[0]) return;
    (void)H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, h5_walk_first, t->h5_msg);
}

/* Record a failed HDF5 call on t's file. Always returns TW_ERR_OUTPUT. */
static tw_status h5_fail(tw_tiletable *t, const char *what, tw_error *err)
{
    h5_note(t);
    return tw_error_set(err, TW_ERR_OUTPUT, "tile table %s: %s failed%s%s", t->part_path, what,
                        t->h5_msg[0] ? ": " : "", t->h5_msg);
}

/* Rows per chunk for rows of row_bytes bytes. */
static hsize_t chunk_rows(size_t row_bytes)
{
    size_t r = TW_TT_CHUNK_BYTES / (row_bytes ? row_bytes : 1);
    if (r < 1) r = 1;
    if (r > TW_TT_CHUNK_ROWS_MAX) r = TW_TT_CHUNK_ROWS_MAX;
    return (hsize_t)r;
}

/* An empty, extendible, deflated 2-D dataset [0][cols]. Returns <0 on failure. */
static hid_t make_dataset(tw_tiletable *t, const char *name, hid_t type, int cols, tw_error *err)
{
    hsize_t dims[2] = {0, (hsize_t)cols};
    hsize_t maxdims[2] = {H5S_UNLIMITED, (hsize_t)cols};
    hsize_t chunk[2] = {chunk_rows((size_t)cols * H5Tget_size(type)), (hsize_t)cols};
    hid_t space = H5Screate_simple(2, dims, maxdims);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    hid_t ds = -1;
    char what[96];
    if (space < 0 || dcpl < 0) {
        h5_note(t);
        snprintf(what, sizeof what, "creating the dataspace of /%s", name);
        h5_fail(t, what, err);
    } else if (H5Pset_chunk(dcpl, 2, chunk) < 0 || H5Pset_deflate(dcpl, TW_TT_DEFLATE_LEVEL) < 0) {
        snprintf(what, sizeof what, "setting chunking/deflate of /%s", name);
        h5_fail(t, what, err);
    } else {
        ds = H5Dcreate2(t->file, name, type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
        if (ds < 0) {
            snprintf(what, sizeof what, "creating dataset /%s", name);
            h5_fail(t, what, err);
        }
    }
    if (dcpl >= 0) H5Pclose(dcpl);
    if (space >= 0) H5Sclose(space);
    return ds;
}

/* Scalar or 1-D attribute on the root group. dims == 0: scalar. */
static tw_status write_attr(tw_tiletable *t, const char *name, hid_t type, hsize_t dims,
                            const void *data, tw_error *err)
{
    hid_t space = dims ? H5Screate_simple(1, &dims, NULL) : H5Screate(H5S_SCALAR);
    hid_t attr = space >= 0 ? H5Acreate2(t->file, name, type, space, H5P_DEFAULT, H5P_DEFAULT) : -1;
    herr_t rc = attr >= 0 ? H5Awrite(attr, type, data) : -1;
    if (rc < 0) h5_note(t);
    if (attr >= 0 && H5Aclose(attr) < 0) rc = -1;
    if (space >= 0) H5Sclose(space);
    if (rc < 0) {
        char what[96];
        snprintf(what, sizeof what, "writing attribute %s", name);
        return h5_fail(t, what, err);
    }
    return TW_OK;
}

static tw_status write_attributes(tw_tiletable *t, const tw_tiletable_params *p, tw_error *err)
{
    /* Variable-length UTF-8 strings: h5py and netCDF tools read them as text. */
    hid_t str = H5Tcopy(H5T_C_S1);
    if (str < 0 || H5Tset_size(str, H5T_VARIABLE) < 0 || H5Tset_cset(str, H5T_CSET_UTF8) < 0) {
        if (str >= 0) H5Tclose(str);
        return h5_fail(t, "making the string type", err);
    }
    const char *wkt = p->crs_wkt ? p->crs_wkt : "";
    tw_status st = write_attr(t, "crs_wkt", str, 0, &wkt, err);
    if (st == TW_OK) st = write_attr(t, "geotransform", H5T_NATIVE_DOUBLE, 6, p->geotransform, err);
    if (st == TW_OK) st = write_attr(t, "tile", H5T_NATIVE_INT, 0, &p->tile, err);
    if (st == TW_OK) st = write_attr(t, "stride", H5T_NATIVE_INT, 0, &p->stride, err);
    if (st == TW_OK) {
        const char *names[TW_MAX_CLASSES];
        char fallback[TW_MAX_CLASSES][24];
        for (int i = 0; i < p->n_classes; i++) {
            if (p->class_names && p->class_names[i][0]) {
                names[i] = p->class_names[i];
            } else {
                snprintf(fallback[i], sizeof fallback[i], "class_%d", i);
                names[i] = fallback[i];
            }
        }
        /* a headless backbone's table: no classes, no probabilities */
        if (p->n_classes > 0) st = write_attr(t, "classes", str, (hsize_t)p->n_classes, names, err);
    }
    H5Tclose(str);
    return st;
}

static tw_status tiletable_create(tw_tiletable *t, const tw_tiletable_params *p, tw_error *err)
{
    t->file = H5Fcreate(t->part_path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (t->file < 0) return h5_fail(t, "creating the file", err);
    tw_status st = write_attributes(t, p, err);
    if (st != TW_OK) return st;
    t->ds_origin = make_dataset(t, "origin", H5T_STD_I32LE, 2, err);
    if (t->ds_origin < 0) return TW_ERR_OUTPUT;
    if (p->n_classes > 0) {
        t->ds_prob = make_dataset(t, "probabilities", H5T_IEEE_F32LE, p->n_classes, err);
        if (t->ds_prob < 0) return TW_ERR_OUTPUT;
    }
    if (p->feat_dim > 0) {
        t->ds_emb = make_dataset(t, "embeddings", H5T_IEEE_F32LE, p->feat_dim, err);
        if (t->ds_emb < 0) return TW_ERR_OUTPUT;
    }
    return TW_OK;
}

tw_status tw_tiletable_create(const tw_tiletable_params *p, tw_tiletable **out, tw_error *err)
{
    *out = NULL;
    if (!p->path || !p->path[0]) return tw_error_set(err, TW_ERR_INTERNAL, "tile table: no path");
    if (p->n_classes < 0 || p->n_classes > TW_MAX_CLASSES || p->feat_dim < 0 ||
        (p->n_classes == 0 && p->feat_dim == 0))
        return tw_error_set(err, TW_ERR_INTERNAL, "tile table %s: %d classes, %d features", p->path,
                            p->n_classes, p->feat_dim);
    tw_tiletable *t = tw_calloc(TW_MEM_OTHER, 1, sizeof *t);
    if (!t) return tw_error_set(err, TW_ERR_NOMEM, "tile table: out of memory");
    t->file = t->ds_origin = t->ds_prob = t->ds_emb = -1;
    t->n_classes = p->n_classes;
    t->feat_dim = p->feat_dim;
    int n1 = snprintf(t->path, sizeof t->path, "%s", p->path);
    int n2 = snprintf(t->part_path, sizeof t->part_path, "%s.part", p->path);
    if (n1 < 0 || (size_t)n1 >= sizeof t->path || n2 < 0 || (size_t)n2 >= sizeof t->part_path) {
        t->part_path[0] = '\0'; /* nothing of ours to remove */
        tw_tiletable_destroy(t);
        return tw_error_set(err, TW_ERR_OUTPUT, "tile table path too long: %s", p->path);
    }

    /* Found now rather than by the rename after the whole run. */
    struct stat sb;
    if (stat(t->path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        t->part_path[0] = '\0';
        tw_tiletable_destroy(t);
        return tw_error_set(err, TW_ERR_OUTPUT, "tile table %s exists and is a directory", p->path);
    }

    H5E_auto2_t old_func;
    void *old_data;
    H5Eget_auto2(H5E_DEFAULT, &old_func, &old_data);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    tw_status st = tiletable_create(t, p, err);
    H5Eset_auto2(H5E_DEFAULT, old_func, old_data);
    if (st != TW_OK) {
        tw_tiletable_destroy(t);
        return st;
    }
    *out = t;
    return TW_OK;
}

/* Write an [n][cols] block (or, with col >= 0, a single column) at row t->n_tiles. */
static herr_t write_block(tw_tiletable *t, hid_t ds, hsize_t row0, hsize_t n, hsize_t cols, int col,
                          hid_t mtype, const void *data)
{
    hid_t fspace = H5Dget_space(ds);
    if (fspace < 0) {
        h5_note(t);
        return -1;
    }
    hsize_t start[2] = {row0, col >= 0 ? (hsize_t)col : 0};
    hsize_t count[2] = {n, col >= 0 ? 1 : cols};
    hsize_t mdims[2] = {n, count[1]};
    hid_t mspace = H5Screate_simple(2, mdims, NULL);
    herr_t rc = -1;
    if (mspace >= 0 && H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, NULL, count, NULL) >= 0)
        rc = H5Dwrite(ds, mtype, mspace, fspace, H5P_DEFAULT, data);
    if (rc < 0) h5_note(t);
    if (mspace >= 0) H5Sclose(mspace);
    H5Sclose(fspace);
    return rc;
}

static tw_status tiletable_append(tw_tiletable *t, int n, const int32_t *rows, const int32_t *cols,
                                  const float *probs, const float *emb, tw_error *err)
{
    hsize_t total = t->n_tiles + (hsize_t)n;
    hsize_t dims_o[2] = {total, 2};
    hsize_t dims_p[2] = {total, (hsize_t)t->n_classes};
    hsize_t dims_e[2] = {total, (hsize_t)t->feat_dim};
    if (H5Dset_extent(t->ds_origin, dims_o) < 0 ||
        (t->ds_prob >= 0 && H5Dset_extent(t->ds_prob, dims_p) < 0) ||
        (t->ds_emb >= 0 && H5Dset_extent(t->ds_emb, dims_e) < 0))
        return h5_fail(t, "growing the datasets", err);
    /* rows and cols go straight into the two columns of /origin: no
     * interleaving buffer needed. */
    if (write_block(t, t->ds_origin, t->n_tiles, (hsize_t)n, 2, 0, H5T_NATIVE_INT32, rows) < 0 ||
        write_block(t, t->ds_origin, t->n_tiles, (hsize_t)n, 2, 1, H5T_NATIVE_INT32, cols) < 0)
        return h5_fail(t, "writing /origin", err);
    if (t->ds_prob >= 0 && write_block(t, t->ds_prob, t->n_tiles, (hsize_t)n, (hsize_t)t->n_classes,
                                       -1, H5T_NATIVE_FLOAT, probs) < 0)
        return h5_fail(t, "writing /probabilities", err);
    if (t->ds_emb >= 0 && write_block(t, t->ds_emb, t->n_tiles, (hsize_t)n, (hsize_t)t->feat_dim,
                                      -1, H5T_NATIVE_FLOAT, emb) < 0)
        return h5_fail(t, "writing /embeddings", err);
    t->n_tiles = total;
    return TW_OK;
}

tw_status tw_tiletable_append(tw_tiletable *t, int n, const int32_t *rows, const int32_t *cols,
                              const float *probs, const float *emb, tw_error *err)
{
    if (t->finished || t->file < 0)
        return tw_error_set(err, TW_ERR_INTERNAL, "tile table %s: append after finish", t->path);
    if (n < 0 || (n > 0 && (!rows || !cols || !probs)))
        return tw_error_set(err, TW_ERR_INTERNAL, "tile table %s: bad append of %d tiles", t->path,
                            n);
    if (n == 0) return TW_OK;
    if (t->feat_dim > 0 && !emb)
        return tw_error_set(err, TW_ERR_INTERNAL, "tile table %s: embeddings missing", t->path);
    H5E_auto2_t old_func;
    void *old_data;
    H5Eget_auto2(H5E_DEFAULT, &old_func, &old_data);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    tw_status st = tiletable_append(t, n, rows, cols, probs, emb, err);
    H5Eset_auto2(H5E_DEFAULT, old_func, old_data);
    return st;
}

/* Close every handle; returns <0 if any close failed (buffered data lost). */
static herr_t close_all(tw_tiletable *t)
{
    herr_t rc = 0;
    hid_t *ids[] = {&t->ds_emb, &t->ds_prob, &t->ds_origin};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        if (*ids[i] >= 0 && H5Dclose(*ids[i]) < 0) rc = -1;
        *ids[i] = -1;
    }
    if (t->file >= 0 && H5Fclose(t->file) < 0) rc = -1;
    t->file = -1;
    return rc;
}

static tw_status tiletable_finish(tw_tiletable *t, tw_error *err)
{
    if (H5Fflush(t->file, H5F_SCOPE_GLOBAL) < 0) return h5_fail(t, "flushing", err);
    if (close_all(t) < 0) return h5_fail(t, "closing", err);
    tw_status st = tw_fsync_path(t->part_path, false, err);
    if (st != TW_OK) return st;
    if (rename(t->part_path, t->path) != 0)
        return tw_error_set(err, TW_ERR_OUTPUT, "cannot rename %s to %s: %s", t->part_path, t->path,
                            strerror(errno));
    t->finished = true;
    return TW_OK;
}

tw_status tw_tiletable_finish(tw_tiletable *t, tw_error *err)
{
    if (t->finished) return TW_OK;
    if (t->file < 0)
        return tw_error_set(err, TW_ERR_INTERNAL, "tile table %s: finish after a failed finish",
                            t->path);
    H5E_auto2_t old_func;
    void *old_data;
    H5Eget_auto2(H5E_DEFAULT, &old_func, &old_data);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    tw_status st = tiletable_finish(t, err);
    H5Eset_auto2(H5E_DEFAULT, old_func, old_data);
    return st;
}

void tw_tiletable_destroy(tw_tiletable *t)
{
    if (!t) return;
    H5E_auto2_t old_func;
    void *old_data;
    H5Eget_auto2(H5E_DEFAULT, &old_func, &old_data);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    (void)close_all(t);
    H5Eset_auto2(H5E_DEFAULT, old_func, old_data);
    if (!t->finished && t->part_path[0]) (void)unlink(t->part_path);
    tw_free(t);
}

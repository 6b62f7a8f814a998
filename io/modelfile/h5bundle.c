/* h5bundle.c - the tilewise HDF5 bundle reader (layout in model_file.h).
 *
 * libhdf5 checks the file's structure; each failure becomes one message
 * naming the file and the dataset or attribute. The root attributes go
 * through the same metadata checks as safetensors' (io/modelfile/model_file.c). HDF5
 * checks no data: a bundle with flipped data bytes reads without a word,
 * hence tensors_sha256, verified here when the bundle has one.
 */
#include <hdf5.h>
#include <math.h>
#include <nettle/sha2.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/modelfile/model_file_impl.h"
#include "io/modelfile/readers.h"
#include "core/alloc.h"

/* ------------------------------------------------------------------------ */
/* HDF5 bundle                                                               */

/* One line of the tensors checksum (model_file.h), for a tensor read. */
typedef struct h5_digest {
    const char *name; /* the tensor's name (borrowed from mf->tensors) */
    char dtype[8];    /* "F32", ...: the stored type */
    char shape[64];   /* "64,6,7,7": the stored shape, "" for a scalar */
    uint8_t sha[SHA256_DIGEST_SIZE];
} h5_digest;

typedef struct h5_ctx {
    tw_model_file *mf;
    tw_error *err;
    hid_t file, group;
    char want_sha[65]; /* the bundle's tensors_sha256; "" when it has none */
    h5_digest *dig;    /* [tensor capacity] when want_sha is set, parallel to mf->tensors */
} h5_ctx;

/* Read a whole attribute as strings; *names gets n malloc'ed strings. */
static tw_status h5_attr_strings(h5_ctx *c, const char *key, char ***names, int *n_out, int max_n)
{
    const char *path = c->mf->path;
    tw_status st = TW_OK;
    hid_t a = -1, ftype = -1, space = -1, mtype = -1;
    char **out = NULL;
    char *fixed = NULL;
    int n = 0;
    a = H5Aopen(c->file, key, H5P_DEFAULT);
    if (a < 0) return tw_model_error(c->err, path, "cannot open attribute '%s'", key);
    ftype = H5Aget_type(a);
    space = H5Aget_space(a);
    if (ftype < 0 || space < 0) {
        st = tw_model_error(c->err, path, "cannot read attribute '%s'", key);
        goto done;
    }
    if (H5Tget_class(ftype) != H5T_STRING) {
        st = tw_model_error(c->err, path, "attribute '%s' is not a string", key);
        goto done;
    }
    hssize_t np = H5Sget_simple_extent_npoints(space);
    if (np < 1 || np > max_n) {
        st = tw_model_error(c->err, path, "attribute '%s' has %lld strings (1..%d allowed)", key,
                            (long long)np, max_n);
        goto done;
    }
    n = (int)np;
    out = calloc((size_t)n, sizeof *out);
    if (!out) {
        st = tw_model_nomem(c->err, path, (size_t)n * sizeof *out);
        goto done;
    }
    htri_t vlen = H5Tis_variable_str(ftype);
    mtype = H5Tcopy(H5T_C_S1);
    if (vlen < 0 || mtype < 0) {
        st = tw_model_error(c->err, path, "cannot inspect the type of attribute '%s'", key);
        goto done;
    }
    if (vlen) {
        char **raw = calloc((size_t)n, sizeof *raw);
        if (!raw) {
            st = tw_model_nomem(c->err, path, (size_t)n * sizeof *raw);
            goto done;
        }
        if (H5Tset_size(mtype, H5T_VARIABLE) < 0 || H5Tset_cset(mtype, H5Tget_cset(ftype)) < 0 ||
            H5Aread(a, mtype, raw) < 0) {
            free(raw);
            st = tw_model_error(c->err, path, "cannot read string attribute '%s'", key);
            goto done;
        }
        for (int i = 0; i < n && st == TW_OK; i++) {
            out[i] = strdup(raw[i] ? raw[i] : "");
            if (!out[i]) st = tw_model_nomem(c->err, path, 64);
        }
#if H5_VERSION_GE(1, 12, 0)
        H5Treclaim(mtype, space, H5P_DEFAULT, raw);
#else
        H5Dvlen_reclaim(mtype, space, H5P_DEFAULT, raw);
#endif
        free(raw);
    } else {
        size_t sz = H5Tget_size(ftype);
        if (sz == 0 || sz > 4096) {
            st = tw_model_error(c->err, path, "attribute '%s' has strings of %zu bytes", key, sz);
            goto done;
        }
        /* one more byte than stored: a NULLPAD string of exactly sz bytes
         * would otherwise lose its last character to the terminator */
        sz += 1;
        fixed = calloc((size_t)n, sz);
        if (!fixed || H5Tset_size(mtype, sz) < 0 || H5Tset_cset(mtype, H5Tget_cset(ftype)) < 0) {
            st = fixed ? tw_model_error(c->err, path, "cannot read string attribute '%s'", key)
                       : tw_model_nomem(c->err, path, (size_t)n * sz);
            goto done;
        }
        if (H5Aread(a, mtype, fixed) < 0) {
            st = tw_model_error(c->err, path, "cannot read string attribute '%s'", key);
            goto done;
        }
        for (int i = 0; i < n && st == TW_OK; i++) {
            const char *s = fixed + (size_t)i * sz;
            out[i] = strndup(s, strnlen(s, sz));
            if (!out[i]) st = tw_model_nomem(c->err, path, sz);
        }
    }
done:
    if (st != TW_OK && out) {
        for (int i = 0; i < n; i++) free(out[i]);
        free(out);
        out = NULL;
    }
    free(fixed);
    if (mtype >= 0) H5Tclose(mtype);
    if (space >= 0) H5Sclose(space);
    if (ftype >= 0) H5Tclose(ftype);
    H5Aclose(a);
    *names = out;
    *n_out = st == TW_OK ? n : 0;
    return st;
}

static void free_strings(char **s, int n)
{
    if (!s) return;
    for (int i = 0; i < n; i++) free(s[i]);
    free(s);
}

/* Read a numeric attribute as int64 (want_int) or double, 1..max_n values. */
static tw_status h5_attr_numbers(h5_ctx *c, const char *key, bool want_int, int64_t *iv, double *dv,
                                 int *n_out, int max_n)
{
    const char *path = c->mf->path;
    tw_status st = TW_OK;
    hid_t a = H5Aopen(c->file, key, H5P_DEFAULT);
    if (a < 0) return tw_model_error(c->err, path, "cannot open attribute '%s'", key);
    hid_t ftype = H5Aget_type(a), space = H5Aget_space(a);
    if (ftype < 0 || space < 0) {
        st = tw_model_error(c->err, path, "cannot read attribute '%s'", key);
        goto done;
    }
    H5T_class_t cls = H5Tget_class(ftype);
    if (cls != H5T_INTEGER && (want_int || cls != H5T_FLOAT)) {
        st = tw_model_error(c->err, path, "attribute '%s' is not %s", key,
                            want_int ? "an integer" : "a number");
        goto done;
    }
    hssize_t np = H5Sget_simple_extent_npoints(space);
    if (np < 1 || np > max_n) {
        st = tw_model_error(c->err, path, "attribute '%s' has %lld values (1..%d allowed)", key,
                            (long long)np, max_n);
        goto done;
    }
    herr_t r = want_int ? H5Aread(a, H5T_NATIVE_INT64, iv) : H5Aread(a, H5T_NATIVE_DOUBLE, dv);
    if (r < 0) {
        st = tw_model_error(c->err, path, "cannot read attribute '%s'", key);
        goto done;
    }
    *n_out = (int)np;
done:
    if (space >= 0) H5Sclose(space);
    if (ftype >= 0) H5Tclose(ftype);
    H5Aclose(a);
    return st;
}

static tw_status h5_read_metadata(h5_ctx *c)
{
    tw_model_file *mf = c->mf;
    const char *path = mf->path;
    char **s = NULL;
    int n = 0;
    tw_status st;
    htri_t has = H5Aexists(c->file, "format");
    if (has <= 0)
        return tw_model_error(c->err, path,
                              "no 'format' attribute: not a tilewise bundle (write one with "
                              "tools/export_model.py)");
    if ((st = h5_attr_strings(c, "format", &s, &n, 1)) != TW_OK) return st;
    bool ok = strcmp(s[0], "tilewise-resnet") == 0;
    if (!ok)
        st = tw_model_error(c->err, path, "attribute 'format' is '%.60s', not 'tilewise-resnet'",
                            s[0]);
    free_strings(s, n);
    if (st != TW_OK) return st;

    int64_t iv[TW_MAX_CLASSES];
    double dv[TW_MAX_CLASSES];
    if (H5Aexists(c->file, "format_version") <= 0)
        return tw_model_error(c->err, path, "no 'format_version' attribute");
    if ((st = h5_attr_numbers(c, "format_version", true, iv, NULL, &n, 1)) != TW_OK) return st;
    if (iv[0] != 1)
        return tw_model_error(c->err, path,
                              "format_version %lld is not supported (this tilewise reads 1)",
                              (long long)iv[0]);

    htri_t has_sha = H5Aexists(c->file, "tensors_sha256");
    if (has_sha < 0) return tw_model_error(c->err, path, "cannot query attribute 'tensors_sha256'");
    if (has_sha > 0) {
        if ((st = h5_attr_strings(c, "tensors_sha256", &s, &n, 1)) != TW_OK) return st;
        size_t len = strlen(s[0]);
        bool hex = len == 64 && strspn(s[0], "0123456789abcdef") == 64;
        if (hex)
            memcpy(c->want_sha, s[0], 65);
        else
            st = tw_model_error(c->err, path,
                                "attribute 'tensors_sha256' is not a checksum (64 lowercase hex "
                                "digits): '%.80s'",
                                s[0]);
        free_strings(s, n);
        if (st != TW_OK) return st;
    }

    static const char *const keys[] = {"arch", "stem",    "bands", "scale", "mean",
                                       "std",  "classes", "tile",  "stride"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        const char *key = keys[k];
        htri_t e = H5Aexists(c->file, key);
        if (e < 0) return tw_model_error(c->err, path, "cannot query attribute '%s'", key);
        if (e == 0) continue;
        if (strcmp(key, "arch") == 0) {
            if ((st = h5_attr_strings(c, key, &s, &n, 1)) != TW_OK) return st;
            st = tw_model_set_arch(mf, s[0], c->err);
            free_strings(s, n);
        } else if (strcmp(key, "stem") == 0) {
            if ((st = h5_attr_strings(c, key, &s, &n, 1)) != TW_OK) return st;
            st = tw_model_set_stem(mf, s[0], c->err);
            free_strings(s, n);
        } else if (strcmp(key, "classes") == 0) {
            if ((st = h5_attr_strings(c, key, &s, &n, TW_MAX_CLASSES)) != TW_OK) return st;
            for (int i = 0; i < n && st == TW_OK; i++) st = tw_model_set_class(mf, i, s[i], c->err);
            if (st == TW_OK) mf->n_classes = n;
            free_strings(s, n);
        } else if (strcmp(key, "bands") == 0 || strcmp(key, "tile") == 0 ||
                   strcmp(key, "stride") == 0) {
            bool bands = key[0] == 'b';
            st = h5_attr_numbers(c, key, true, iv, NULL, &n, bands ? TW_MAX_BANDS : 1);
            if (st == TW_OK)
                st = bands           ? tw_model_set_bands(mf, iv, n, c->err)
                     : key[0] == 't' ? tw_model_set_tile(mf, iv[0], c->err)
                                     : tw_model_set_stride(mf, iv[0], c->err);
        } else {
            bool scale = strcmp(key, "scale") == 0;
            st = h5_attr_numbers(c, key, false, NULL, dv, &n, scale ? 1 : TW_MAX_BANDS);
            if (st == TW_OK) {
                if (scale)
                    st = tw_model_set_scale(mf, dv[0], c->err);
                else if (key[0] == 'm')
                    st = tw_model_set_floats(mf, "mean", dv, n, mf->mean, &mf->n_mean, false,
                                             c->err);
                else
                    st = tw_model_set_floats(mf, "std", dv, n, mf->std, &mf->n_std, true, c->err);
            }
        }
        if (st != TW_OK) return st;
    }
    return TW_OK;
}

/* The checksum line's fields for tensor t, just read from dataset ds of
 * file type `type` and ndim stored dimensions: its data as stored, as
 * little-endian bytes. IEEE float32 data is the float array just read (on a
 * little-endian host); any other type is read again in its own type. */
static tw_status h5_digest_tensor(h5_ctx *c, hid_t ds, hid_t type, int ndim, const tw_tensor *t,
                                  h5_digest *d)
{
    const char *path = c->mf->path;
    size_t esize = H5Tget_size(type);
    if (esize == 0 || esize > 16)
        return tw_model_error(c->err, path, "/tensors/%s: float of %zu bytes", t->name, esize);
    d->name = t->name;
    snprintf(d->dtype, sizeof d->dtype, "F%zu", esize * 8);
    size_t o = 0;
    d->shape[0] = '\0';
    for (int i = 0; i < ndim && o < sizeof d->shape; i++)
        o += (size_t)snprintf(d->shape + o, sizeof d->shape - o, i ? ",%lld" : "%lld",
                              (long long)t->shape[i]);
    struct sha256_ctx h;
    sha256_init(&h);
    bool same = false;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    same = H5Tequal(type, H5T_IEEE_F32LE) > 0 || H5Tequal(type, H5T_IEEE_F32BE) > 0;
#endif
    if (same) {
        sha256_update(&h, (size_t)t->numel * sizeof(float), (const uint8_t *)t->data);
    } else if (t->numel > 0) {
        size_t bytes = (size_t)t->numel * esize;
        uint8_t *raw = tw_alloc(TW_MEM_OTHER, bytes);
        if (!raw) return tw_model_nomem(c->err, path, bytes);
        hid_t mt = H5Tcopy(type);
        bool ok = mt >= 0 && H5Tset_order(mt, H5T_ORDER_LE) >= 0 &&
                  H5Dread(ds, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, raw) >= 0;
        if (mt >= 0) H5Tclose(mt);
        if (ok) sha256_update(&h, bytes, raw);
        tw_free(raw);
        if (!ok)
            return tw_model_error(c->err, path, "cannot read /tensors/%s as stored (checksum)",
                                  t->name);
    }
    sha256_digest(&h, SHA256_DIGEST_SIZE, d->sha);
    return TW_OK;
}

static int cmp_digest(const void *a, const void *b)
{
    return strcmp(((const h5_digest *)a)->name, ((const h5_digest *)b)->name);
}

static void hex_of(const uint8_t *sha, char hex[65])
{
    for (int i = 0; i < SHA256_DIGEST_SIZE; i++) snprintf(hex + 2 * i, 3, "%02x", sha[i]);
    hex[64] = '\0';
}

/* Compare the tensors' checksum (lines sorted by name; model_file.h) with
 * the bundle's tensors_sha256. Sorts c->dig. */
static tw_status h5_verify_checksum(h5_ctx *c)
{
    tw_model_file *mf = c->mf;
    qsort(c->dig, (size_t)mf->n_tensors, sizeof *c->dig, cmp_digest);
    struct sha256_ctx h;
    sha256_init(&h);
    for (int i = 0; i < mf->n_tensors; i++) {
        const h5_digest *d = &c->dig[i];
        char hex[65];
        hex_of(d->sha, hex);
        sha256_update(&h, strlen(d->name), (const uint8_t *)d->name);
        sha256_update(&h, 1, (const uint8_t *)"\t");
        sha256_update(&h, strlen(d->dtype), (const uint8_t *)d->dtype);
        sha256_update(&h, 1, (const uint8_t *)"\t");
        sha256_update(&h, strlen(d->shape), (const uint8_t *)d->shape);
        sha256_update(&h, 1, (const uint8_t *)"\t");
        sha256_update(&h, 64, (const uint8_t *)hex);
        sha256_update(&h, 1, (const uint8_t *)"\n");
    }
    uint8_t sum[SHA256_DIGEST_SIZE];
    char got[65];
    sha256_digest(&h, SHA256_DIGEST_SIZE, sum);
    hex_of(sum, got);
    if (strcmp(got, c->want_sha) != 0)
        return tw_model_error(c->err, mf->path,
                              "tensors checksum mismatch (tensors_sha256 %.16s..., the tensors "
                              "hash to %.16s...): the bundle was corrupted or changed after "
                              "export; export it again with tools/export_model.py",
                              c->want_sha, got);
    mf->checksum = TW_CHECKSUM_VERIFIED;
    return TW_OK;
}

static tw_status h5_read_tensor(h5_ctx *c, const char *name, tw_tensor *t, h5_digest *dig,
                                bool *skipped)
{
    const char *path = c->mf->path;
    tw_status st = TW_OK;
    *skipped = false;
    hid_t ds = H5Dopen2(c->group, name, H5P_DEFAULT);
    if (ds < 0) return tw_model_error(c->err, path, "/tensors/%s is not a readable dataset", name);
    hid_t type = H5Dget_type(ds), space = H5Dget_space(ds);
    if (type < 0 || space < 0) {
        st = tw_model_error(c->err, path, "cannot read the type of /tensors/%s", name);
        goto done;
    }
    H5T_class_t cls = H5Tget_class(type);
    if (cls != H5T_FLOAT) {
        size_t nl = strlen(name), sl = strlen("num_batches_tracked");
        if (cls == H5T_INTEGER && nl >= sl && strcmp(name + nl - sl, "num_batches_tracked") == 0) {
            *skipped = true;
            goto done;
        }
        st = tw_model_error(c->err, path, "/tensors/%s is not a float dataset", name);
        goto done;
    }
    int ndim = H5Sget_simple_extent_ndims(space);
    if (ndim < 0 || ndim > 4) {
        st = tw_model_error(c->err, path, "/tensors/%s has %d dimensions (at most 4 supported)",
                            name, ndim);
        goto done;
    }
    hsize_t dims[4] = {1, 1, 1, 1};
    if (ndim > 0 && H5Sget_simple_extent_dims(space, dims, NULL) < 0) {
        st = tw_model_error(c->err, path, "cannot read the shape of /tensors/%s", name);
        goto done;
    }
    uint64_t numel = 1;
    for (int i = 0; i < (ndim ? ndim : 1); i++) {
        t->shape[i] = (int64_t)dims[i];
        if (dims[i] > ((uint64_t)1 << 34) || (numel *= dims[i]) > ((uint64_t)1 << 34)) {
            st = tw_model_error(c->err, path, "/tensors/%s is implausibly large", name);
            goto done;
        }
    }
    t->ndim = ndim ? ndim : 1;
    t->numel = (int64_t)numel;
    snprintf(t->name, sizeof t->name, "%s", name);
    size_t bytes = (size_t)numel * sizeof(float);
    t->data = tw_alloc(TW_MEM_WEIGHTS, bytes ? bytes : sizeof(float));
    if (!t->data) {
        st = tw_model_nomem(c->err, path, bytes);
        goto done;
    }
    if (numel && H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, t->data) < 0) {
        st = tw_model_error(c->err, path, "cannot read /tensors/%s (truncated or corrupt file?)",
                            name);
        /* Not counted in n_tensors, so destroy would not free it. */
        tw_free(t->data);
        t->data = NULL;
    } else if (dig && (st = h5_digest_tensor(c, ds, type, ndim, t, dig)) != TW_OK) {
        tw_free(t->data);
        t->data = NULL;
    }
done:
    if (space >= 0) H5Sclose(space);
    if (type >= 0) H5Tclose(type);
    H5Dclose(ds);
    return st;
}

typedef struct h5_iter {
    h5_ctx *c;
    int cap;      /* entries the tensor array has room for */
    tw_status st; /* the error that stopped the iteration */
} h5_iter;

#if H5_VERSION_GE(1, 12, 0)
typedef H5L_info2_t h5_link_info;
#else
typedef H5L_info_t h5_link_info;
#endif

/* H5Literate callback: read the tensor called name. Returns 0 to go on,
 * -1 (with it->st set) to stop on an error. */
static herr_t h5_tensor_cb(hid_t group, const char *name, const h5_link_info *info, void *user)
{
    (void)group;
    (void)info;
    h5_iter *it = user;
    tw_model_file *mf = it->c->mf;
    if (mf->n_tensors >= it->cap) {
        it->st = tw_model_error(it->c->err, mf->path, "/tensors lists more entries than it holds");
        return -1;
    }
    if (strlen(name) >= sizeof mf->tensors[0].name) {
        it->st = tw_model_error(it->c->err, mf->path,
                                "/tensors entry '%.40s...': name longer than %zu bytes", name,
                                sizeof mf->tensors[0].name - 1);
        return -1;
    }
    bool skipped;
    h5_digest *dig = it->c->dig ? &it->c->dig[mf->n_tensors] : NULL;
    it->st = h5_read_tensor(it->c, name, &mf->tensors[mf->n_tensors], dig, &skipped);
    if (it->st != TW_OK) return -1;
    if (!skipped) mf->n_tensors++;
    return 0;
}

tw_status tw_h5bundle_load(tw_model_file *mf, tw_error *err)
{
    const char *path = mf->path;
    /* HDF5 prints its error stack to stderr by default; our message says it. */
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    h5_ctx c = {.mf = mf, .err = err, .file = -1, .group = -1};
    tw_status st = TW_OK;
    c.file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (c.file < 0)
        return tw_model_error(err, path, "cannot open as HDF5 (truncated or corrupt file?)");
    if ((st = h5_read_metadata(&c)) != TW_OK) goto done;
    htri_t has = H5Lexists(c.file, "tensors", H5P_DEFAULT);
    if (has <= 0) {
        st = tw_model_error(err, path, "no /tensors group");
        goto done;
    }
    c.group = H5Gopen2(c.file, "tensors", H5P_DEFAULT);
    H5G_info_t info;
    if (c.group < 0 || H5Gget_info(c.group, &info) < 0) {
        st = tw_model_error(err, path, "/tensors is not a readable group");
        goto done;
    }
    if (info.nlinks > 100000) {
        st = tw_model_error(err, path, "/tensors holds %llu entries: implausible",
                            (unsigned long long)info.nlinks);
        goto done;
    }
    int n = (int)info.nlinks;
    mf->tensors = tw_calloc(TW_MEM_OTHER, (size_t)(n ? n : 1), sizeof(tw_tensor));
    if (!mf->tensors) {
        st = tw_model_nomem(err, path, (size_t)n * sizeof(tw_tensor));
        goto done;
    }
    if (c.want_sha[0]) {
        c.dig = tw_calloc(TW_MEM_OTHER, (size_t)(n ? n : 1), sizeof *c.dig);
        if (!c.dig) {
            st = tw_model_nomem(err, path, (size_t)n * sizeof *c.dig);
            goto done;
        }
    }
    /* One pass in the name index's native order: H5Lget_name_by_idx would
     * rebuild a sorted table of every link for each call (quadratic), and
     * libhdf5 1.10 frees uninitialised pointers when building that table
     * fails on corrupt dense link storage (found by fuzz_hdf5). */
    h5_iter it = {.c = &c, .cap = n, .st = TW_OK};
    hsize_t idx = 0;
    if (H5Literate(c.group, H5_INDEX_NAME, H5_ITER_NATIVE, &idx, h5_tensor_cb, &it) < 0)
        st = it.st != TW_OK ? it.st
                            : tw_model_error(err, path, "cannot list /tensors (corrupt file?)");
    if (st == TW_OK) {
        if (c.want_sha[0])
            st = h5_verify_checksum(&c);
        else
            mf->checksum = TW_CHECKSUM_ABSENT;
    }
done:
    tw_free(c.dig);
    if (c.group >= 0) H5Gclose(c.group);
    if (H5Fclose(c.file) < 0 && st == TW_OK)
        st = tw_model_error(err, path, "error closing the file");
    return st;
}

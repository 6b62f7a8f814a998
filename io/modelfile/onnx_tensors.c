/* onnx_tensors.c - ONNX tensors as float32: initializers and Constant
 * values, raw or typed data, external data files kept inside the model's
 * folder and hashed into the model's identity (see onnx_internal.h). */
#include "io/modelfile/onnx_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/half.h"

/* ------------------------------------------------------------------------ */
/* Tensors                                                                   */

/* The constant behind value name (an initializer, or a Constant node's
 * value, through Identity nodes), or NULL. */
const Onnx__TensorProto *onnx_constant(const octx *c, const char *name)
{
    int v = onnx_find_value(c, name);
    if (v < 0) return NULL;
    v = c->canon[v];
    const value *x = &c->values[v];
    if (x->kind == V_INIT) return c->g->initializer[x->index];
    if (x->kind == V_NODE) {
        const Onnx__NodeProto *n = c->g->node[x->index];
        if (op_is(n, "Constant")) {
            const Onnx__AttributeProto *a = onnx_attr(n, "value");
            if (a && a->t) return a->t;
        }
    }
    return NULL;
}

static size_t elem_size(int32_t dt)
{
    switch (dt) {
    case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT: return 4;
    case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16: return 2;
    case ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16: return 2;
    case ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE: return 8;
    case ONNX__TENSOR_PROTO__DATA_TYPE__INT64: return 8;
    default: return 0;
    }
}

static void le_to_float(int32_t dt, const uint8_t *p, float *dst, int64_t n)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (dt == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT) { /* the common case: no per-value work */
        memcpy(dst, p, (size_t)n * sizeof(float));
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) {
        if (dt == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT) {
            const uint8_t *q = p + 4 * i;
            uint32_t u =
                (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
            memcpy(&dst[i], &u, 4);
        } else if (dt == ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE) {
            uint64_t u = 0;
            for (int b = 7; b >= 0; b--) u = u << 8 | p[8 * i + b];
            double d;
            memcpy(&d, &u, 8);
            dst[i] = (float)d;
        } else {
            uint16_t u = (uint16_t)(p[2 * i] | p[2 * i + 1] << 8);
            if (dt == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16) {
                dst[i] = tw_half_to_float(u);
            } else {
                uint32_t w = (uint32_t)u << 16;
                memcpy(&dst[i], &w, 4);
            }
        }
    }
}

/* Open the external data file of tensor tname: location loc, relative to
 * the model's folder, must be a regular file inside that folder once every
 * link (in loc and in the folder's own path) is resolved. Its resolved path
 * into full, its size into *size. A location that leads outside is refused
 * with the same words whatever is there: nothing of the target (its size,
 * its kind, its bytes) reaches a message. */
static tw_status open_external(octx *c, const char *tname, const char *loc, char *full,
                               size_t full_cap, FILE **out, uint64_t *size)
{
    char lb[400], dir[TW_PATH_MAX], base[PATH_MAX], joined[TW_PATH_MAX + PATH_MAX];
    *out = NULL;
    /* ONNX's own rule first: relative, no ".." component */
    bool escapes = loc[0] == '/';
    for (const char *p = loc; *p && !escapes; p = strchr(p, '/') ? strchr(p, '/') + 1 : "")
        escapes = p[0] == '.' && p[1] == '.' && (p[2] == '/' || p[2] == '\0');
    if (escapes)
        return tw_model_error(c->err, c->path,
                              "tensor '%s': external data location '%s' is outside the model's "
                              "folder",
                              tname, onnx_clean(loc, lb, sizeof lb));
    const char *slash = strrchr(c->path, '/');
    if (slash)
        snprintf(dir, sizeof dir, "%.*s", slash == c->path ? 1 : (int)(slash - c->path), c->path);
    else
        snprintf(dir, sizeof dir, ".");
    if (!realpath(dir, base))
        return tw_model_error(c->err, c->path, "cannot resolve the model's folder: %s",
                              strerror(errno));
    size_t bl = strlen(base);
    if (snprintf(joined, sizeof joined, "%s/%s", base, loc) >= (int)sizeof joined)
        return tw_model_error(c->err, c->path, "tensor '%s': external data path is too long",
                              tname);
    char resolved[PATH_MAX];
    if (!realpath(joined, resolved))
        return tw_model_error(c->err, c->path, "tensor '%s': cannot open external data '%s': %s",
                              tname, onnx_clean(loc, lb, sizeof lb), strerror(errno));
    /* inside: base itself is a folder, so the file is below it ("/" holds all) */
    bool inside = strncmp(resolved, base, bl) == 0 &&
                  (resolved[bl] == '/' || (bl == 1 && base[0] == '/')) && resolved[bl] != '\0';
    if (!inside)
        return tw_model_error(c->err, c->path,
                              "tensor '%s': external data location '%s' is outside the model's "
                              "folder (through a link)",
                              tname, onnx_clean(loc, lb, sizeof lb));
    if (snprintf(full, full_cap, "%s", resolved) >= (int)full_cap)
        return tw_model_error(c->err, c->path, "tensor '%s': external data path is too long",
                              tname);
    /* a FIFO or a device is not opened at all (opening one may block or act) */
    struct stat sb;
    if (stat(resolved, &sb) != 0 || !S_ISREG(sb.st_mode))
        return tw_model_error(c->err, c->path,
                              "tensor '%s': external data %s is not a regular file", tname,
                              onnx_clean(full, lb, sizeof lb));
    /* resolved has no link left: O_NOFOLLOW refuses one put there since,
     * O_NONBLOCK a FIFO swapped in, and fstat checks what was opened */
    int fd = open(resolved, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return tw_model_error(c->err, c->path, "tensor '%s': cannot open external data %s: %s",
                              tname, onnx_clean(full, lb, sizeof lb), strerror(errno));
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return tw_model_error(c->err, c->path,
                              "tensor '%s': external data %s is not a regular file", tname,
                              onnx_clean(full, lb, sizeof lb));
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return tw_model_error(c->err, c->path, "tensor '%s': cannot open external data %s: %s",
                              tname, onnx_clean(full, lb, sizeof lb), strerror(errno));
    }
    *size = (uint64_t)sb.st_size;
    *out = f;
    return TW_OK;
}

/* Read the bytes of an external tensor (location relative to the model's
 * folder, offset, length) into a new buffer of want bytes. */
static tw_status read_external(octx *c, const Onnx__TensorProto *tp, const char *tname, size_t want,
                               uint8_t **out)
{
    const char *loc = NULL;
    int64_t offset = 0, length = -1;
    for (size_t i = 0; i < tp->n_external_data; i++) {
        const char *k = S(tp->external_data[i]->key), *v = S(tp->external_data[i]->value);
        char *end = NULL, vb[48];
        if (strcmp(k, "location") == 0) {
            loc = v;
        } else if (strcmp(k, "offset") == 0 || strcmp(k, "length") == 0) {
            errno = 0;
            long long x = strtoll(v, &end, 10);
            if (errno || end == v || *end || x < 0)
                return tw_model_error(c->err, c->path,
                                      "tensor '%s': external data %s '%s' is not a byte count",
                                      tname, k, onnx_clean(v, vb, sizeof vb));
            if (k[0] == 'o')
                offset = x;
            else
                length = x;
        }
    }
    if (!loc || !*loc)
        return tw_model_error(c->err, c->path, "tensor '%s': external data without a location",
                              tname);
    if (length >= 0 && (uint64_t)length != want)
        return tw_model_error(c->err, c->path,
                              "tensor '%s': external data length %lld but its dims need %zu bytes",
                              tname, (long long)length, want);
    char full[PATH_MAX], lb[400];
    FILE *f = NULL;
    uint64_t size = 0;
    tw_status st = open_external(c, tname, loc, full, sizeof full, &f, &size);
    if (st != TW_OK) return st;
    if ((uint64_t)offset > size || want > size - (uint64_t)offset) {
        fclose(f);
        return tw_model_error(c->err, c->path,
                              "tensor '%s': external data %s holds %llu bytes, the tensor needs "
                              "%zu at offset %lld",
                              tname, onnx_clean(full, lb, sizeof lb), (unsigned long long)size,
                              want, (long long)offset);
    }
    uint8_t *buf = tw_alloc(TW_MEM_OTHER, want ? want : 1);
    if (!buf) {
        fclose(f);
        return tw_model_nomem(c->err, c->path, want);
    }
    bool ok = fseeko(f, (off_t)offset, SEEK_SET) == 0 && fread(buf, 1, want, f) == want;
    fclose(f);
    if (!ok) {
        tw_free(buf);
        return tw_model_error(c->err, c->path, "tensor '%s': cannot read external data %s", tname,
                              onnx_clean(full, lb, sizeof lb));
    }
    sha256_update(&c->sha, want, buf);
    c->mf->onnx.n_external++;
    *out = buf;
    return TW_OK;
}

/* tp's values as float32 in a new buffer (TW_MEM_WEIGHTS); its dims into
 * shape (at most 4), count into *ndim. what names it in messages. */
tw_status onnx_tensor_floats(octx *c, const Onnx__TensorProto *tp, const char *what, float **out,
                             int64_t shape[4], int *ndim)
{
    char nb[96];
    const char *tname = tp->name && *tp->name ? onnx_clean(tp->name, nb, sizeof nb) : what;
    *out = NULL;
    if (tp->n_dims > 4)
        return tw_model_error(c->err, c->path, "tensor '%s' has %zu dimensions (at most 4)", tname,
                              tp->n_dims);
    int64_t numel = 1;
    for (size_t d = 0; d < tp->n_dims; d++) {
        if (tp->dims[d] <= 0 || tp->dims[d] > ONNX_MAX_VALUES ||
            numel * tp->dims[d] > ONNX_MAX_VALUES)
            return tw_model_error(c->err, c->path, "tensor '%s' has dimension %lld = %lld", tname,
                                  (long long)d, (long long)tp->dims[d]);
        numel *= tp->dims[d];
        shape[d] = tp->dims[d];
    }
    *ndim = (int)tp->n_dims;
    int32_t dt = tp->data_type;
    size_t es = elem_size(dt);
    if (!es || dt == ONNX__TENSOR_PROTO__DATA_TYPE__INT64)
        return tw_model_error(c->err, c->path,
                              "tensor '%s' has data type %d (float, float16, bfloat16 or double "
                              "expected)",
                              tname, (int)dt);
    size_t bytes = (size_t)numel * es;
    float *dst = tw_alloc(TW_MEM_WEIGHTS, (size_t)numel * sizeof(float));
    if (!dst) return tw_model_nomem(c->err, c->path, (size_t)numel * sizeof(float));
    tw_status st = TW_OK;
    if (tp->has_data_location && tp->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL) {
        uint8_t *raw = NULL;
        st = read_external(c, tp, tname, bytes, &raw);
        if (st == TW_OK) le_to_float(dt, raw, dst, numel);
        tw_free(raw);
    } else if (tp->has_raw_data && tp->raw_data.len > 0) {
        if (tp->raw_data.len != bytes)
            st =
                tw_model_error(c->err, c->path, "tensor '%s' holds %zu bytes but its dims need %zu",
                               tname, tp->raw_data.len, bytes);
        else
            le_to_float(dt, tp->raw_data.data, dst, numel);
    } else if (dt == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT && tp->n_float_data == (size_t)numel) {
        memcpy(dst, tp->float_data, bytes);
    } else if (dt == ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE && tp->n_double_data == (size_t)numel) {
        for (int64_t i = 0; i < numel; i++) dst[i] = (float)tp->double_data[i];
    } else if ((dt == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16 ||
                dt == ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16) &&
               tp->n_int32_data == (size_t)numel) {
        for (int64_t i = 0; i < numel; i++) {
            uint16_t u = (uint16_t)(tp->int32_data[i] & 0xffff);
            uint8_t b[2] = {(uint8_t)(u & 0xff), (uint8_t)(u >> 8)};
            le_to_float(dt, b, &dst[i], 1);
        }
    } else {
        st = tw_model_error(c->err, c->path,
                            "tensor '%s' holds no data of the %lld values its "
                            "dims say",
                            tname, (long long)numel);
    }
    if (st != TW_OK) {
        tw_free(dst);
        return st;
    }
    *out = dst;
    return TW_OK;
}

/* Up to max int64 values of a constant (shapes, axes). */
bool onnx_tensor_ints(const Onnx__TensorProto *tp, int64_t *out, int max, int *n)
{
    if (!tp || tp->data_type != ONNX__TENSOR_PROTO__DATA_TYPE__INT64 || tp->n_dims > 1)
        return false;
    if (tp->has_data_location && tp->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL)
        return false;
    if (tp->has_raw_data && tp->raw_data.len > 0) {
        if (tp->raw_data.len % 8 || tp->raw_data.len / 8 > (size_t)max) return false;
        *n = (int)(tp->raw_data.len / 8);
        for (int i = 0; i < *n; i++) {
            uint64_t u = 0;
            for (int b = 7; b >= 0; b--) u = u << 8 | tp->raw_data.data[8 * i + b];
            out[i] = (int64_t)u;
        }
        return true;
    }
    if (tp->n_int64_data > (size_t)max) return false;
    *n = (int)tp->n_int64_data;
    for (int i = 0; i < *n; i++) out[i] = tp->int64_data[i];
    return true;
}

/* Append a tensor called name (owning data) to mf. */
tw_status onnx_add_tensor(octx *c, const char *name, float *data, int ndim, const int64_t *shape)
{
    tw_model_file *mf = c->mf;
    if (mf->n_tensors >= c->cap) {
        tw_free(data);
        return tw_error_set(c->err, TW_ERR_INTERNAL, "model file %s: tensor table full", c->path);
    }
    tw_tensor *t = &mf->tensors[mf->n_tensors++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    t->numel = 1;
    for (int d = 0; d < ndim; d++) {
        t->shape[d] = shape[d];
        t->numel *= shape[d];
    }
    t->data = data;
    return TW_OK;
}

/* model_file_impl.c - what the model-file readers share (model_file_impl.h):
 * the messages, the metadata checks every format ends in, and the lookup of
 * a tensor by name. The readers (safetensors.c, h5bundle.c, onnx.c) and the
 * front (model_file.c) call down into it; it calls none of them. */
#include "io/modelfile/model_file_impl.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "core/keys.h"

/* Record a TW_ERR_MODEL message prefixed with the file name. */
tw_status tw_model_error(tw_error *err, const char *path, const char *fmt, ...)
{
    char buf[TW_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return tw_error_set(err, TW_ERR_MODEL, "model file %s: %s", path, buf);
}

tw_status tw_model_nomem(tw_error *err, const char *path, size_t bytes)
{
    return tw_error_set(err, TW_ERR_NOMEM, "model file %s: cannot allocate %zu bytes", path, bytes);
}

/* ------------------------------------------------------------------------ */
/* Metadata shared by both formats. Values arrive as JSON (safetensors) or as
 * HDF5 attributes (bundle); both end in these checks. */

/* The arch names a file may carry: model.arch's (core/keys.c, one list). */
tw_status tw_model_set_arch(tw_model_file *mf, const char *arch, tw_error *err)
{
    const tw_key *k = &tw_keys[TW_KEY_MODEL_ARCH];
    for (int i = 0; i < k->n_names; i++) {
        if (strcmp(arch, k->names[i]) == 0) {
            snprintf(mf->arch, sizeof mf->arch, "%s", arch);
            return TW_OK;
        }
    }
    return tw_model_error(err, mf->path,
                          "metadata 'arch' is '%.40s' (expected resnet18/34/50/101/152, "
                          "resnext50_32x4d, resnext101_32x8d, resnext101_64x4d, "
                          "wide_resnet50_2, wide_resnet101_2, fcn_resnet50/101, "
                          "deeplabv3_resnet50/101 or unet_resnet18/34/50/101)",
                          arch);
}

tw_status tw_model_set_stem(tw_model_file *mf, const char *stem, tw_error *err)
{
    /* "auto" is what the workflow key says by default: the same as no stem */
    for (int i = 0; i < 3; i++)
        if (strcmp(stem, tw_stem_names[i]) == 0) {
            mf->stem = (tw_stem)i;
            return TW_OK;
        }
    return tw_model_error(err, mf->path,
                          "metadata 'stem' is '%.40s' (expected standard, small or auto)", stem);
}

tw_status tw_model_set_bands(tw_model_file *mf, const int64_t *v, int64_t n, tw_error *err)
{
    if (n < 1 || n > TW_MAX_BANDS)
        return tw_model_error(err, mf->path, "metadata 'bands' has %lld entries (1..%d allowed)",
                              (long long)n, TW_MAX_BANDS);
    for (int64_t i = 0; i < n; i++) {
        if (v[i] < 1 || v[i] > 65535)
            return tw_model_error(err, mf->path,
                                  "metadata 'bands'[%lld] = %lld is not a 1-based band",
                                  (long long)i, (long long)v[i]);
        mf->bands[i] = (int)v[i];
    }
    mf->n_bands = (int)n;
    return TW_OK;
}

tw_status tw_model_set_floats(tw_model_file *mf, const char *key, const double *v, int64_t n,
                              float *dst, int *n_dst, bool positive, tw_error *err)
{
    if (n < 1 || n > TW_MAX_BANDS)
        return tw_model_error(err, mf->path, "metadata '%s' has %lld entries (1..%d allowed)", key,
                              (long long)n, TW_MAX_BANDS);
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(v[i]) || (positive && !(v[i] > 0)))
            return tw_model_error(err, mf->path, "metadata '%s'[%lld] = %g is not %s", key,
                                  (long long)i, v[i], positive ? "a positive number" : "finite");
        dst[i] = (float)v[i];
    }
    *n_dst = (int)n;
    return TW_OK;
}

tw_status tw_model_set_scale(tw_model_file *mf, double v, tw_error *err)
{
    if (!isfinite(v) || v == 0)
        return tw_model_error(err, mf->path, "metadata 'scale' = %g must be finite and non-zero",
                              v);
    mf->scale = v;
    return TW_OK;
}

tw_status tw_model_set_tile(tw_model_file *mf, int64_t v, tw_error *err)
{
    if (v < 1 || v > 65536)
        return tw_model_error(err, mf->path, "metadata 'tile' = %lld is out of range 1..65536",
                              (long long)v);
    mf->tile = (int)v;
    return TW_OK;
}

tw_status tw_model_set_stride(tw_model_file *mf, int64_t v, tw_error *err)
{
    if (v < 1 || v > 65536)
        return tw_model_error(err, mf->path, "metadata 'stride' = %lld is out of range 1..65536",
                              (long long)v);
    mf->stride = (int)v;
    return TW_OK;
}

tw_status tw_model_set_class(tw_model_file *mf, int i, const char *name, tw_error *err)
{
    if (strlen(name) >= TW_NAME_MAX || name[0] == '\0')
        return tw_model_error(err, mf->path,
                              "metadata 'classes'[%d] is empty or longer than %d bytes", i,
                              TW_NAME_MAX - 1);
    snprintf(mf->classes[i], TW_NAME_MAX, "%s", name);
    return TW_OK;
}

const tw_tensor *tw_model_file_find(const tw_model_file *mf, const char *name)
{
    if (!mf || !name) return NULL;
    for (int i = 0; i < mf->n_tensors; i++)
        if (strcmp(mf->tensors[i].name, name) == 0) return &mf->tensors[i];
    return NULL;
}

/* model_file.c - the model-file front (see model_file.h): detects the
 * format, hashes the file, and checks what every reader produces.
 *
 * Model files come from users and the internet, so every byte is
 * distrusted. The readers are io/modelfile/safetensors.c (header parsed by jansson,
 * then every tensor's dtype, shape and byte range checked before anything
 * is read) and io/modelfile/h5bundle.c (libhdf5's own checks, each failure turned into
 * one message naming the file and the dataset or attribute; the bundle's
 * tensors checksum) and io/modelfile/onnx.c (readers.h). Each ends in the
 * metadata checks of model_file_impl.c, which they share; this front then
 * runs check_finite (every value of every tensor) and check_resnet.
 */
#include "io/modelfile/model_file.h"

#include <errno.h>
#include <math.h>
#include <nettle/sha2.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "core/alloc.h"
#include "io/modelfile/model_file_impl.h"
#include "io/modelfile/readers.h"

#define SHA_CHUNK (1u << 20)

static const unsigned char HDF5_SIGNATURE[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};

/* ------------------------------------------------------------------------ */
/* SHA-256 of the whole file (nettle: SHA-NI where the CPU has it).          */

static tw_status hash_file(const char *path, char hex[65], uint64_t *size, tw_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) return tw_model_error(err, path, "cannot open: %s", strerror(errno));
    unsigned char *buf = tw_alloc(TW_MEM_OTHER, SHA_CHUNK);
    if (!buf) {
        fclose(f);
        return tw_model_nomem(err, path, SHA_CHUNK);
    }
    struct sha256_ctx c;
    sha256_init(&c);
    uint64_t total = 0;
    size_t n;
    while ((n = fread(buf, 1, SHA_CHUNK, f)) > 0) {
        sha256_update(&c, n, buf);
        total += n;
    }
    int failed = ferror(f);
    tw_free(buf);
    fclose(f);
    if (failed) return tw_model_error(err, path, "read error while hashing");
    uint8_t digest[SHA256_DIGEST_SIZE];
    sha256_digest(&c, SHA256_DIGEST_SIZE, digest);
    for (int i = 0; i < SHA256_DIGEST_SIZE; i++) snprintf(hex + 2 * i, 3, "%02x", digest[i]);
    hex[64] = '\0';
    *size = total;
    return TW_OK;
}

static tw_model_file *model_file_new(const char *path)
{
    tw_model_file *mf = tw_calloc(TW_MEM_OTHER, 1, sizeof *mf);
    if (!mf) return NULL;
    snprintf(mf->path, sizeof mf->path, "%s", path);
    mf->scale = NAN;
    return mf;
}

bool tw_model_file_notice(const tw_model_file *mf, char *buf, size_t cap)
{
    if (!mf || mf->checksum != TW_CHECKSUM_ABSENT) return false;
    snprintf(buf, cap,
             "model file %s has no tensors checksum (written before tools/export_model.py "
             "added one): its tensors cannot be verified; `tools/export_model.py %s -o NEW.h5` "
             "adds it",
             mf->path, mf->path);
    return true;
}

const char *tw_model_checksum_name(tw_model_checksum c)
{
    return c == TW_CHECKSUM_VERIFIED ? "verified" : c == TW_CHECKSUM_ABSENT ? "absent" : "none";
}

void tw_model_file_destroy(tw_model_file *mf)
{
    if (!mf) return;
    for (int i = 0; i < mf->n_tensors; i++) tw_free(mf->tensors[i].data);
    tw_free(mf->tensors);
    tw_free(mf);
}

static void shape_str(const tw_tensor *t, char *buf, size_t cap)
{
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < t->ndim && o < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, i ? ",%lld" : "%lld", (long long)t->shape[i]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

/* A segmentation network (model/segnet.h: torchvision's backbone. +
 * classifier., or a U-Net's encoder. + decoder.blocks.) holds its ResNet
 * under a prefix and no fc; model/segnet.c checks its graph. True when mf
 * is one (*st: whether its metadata agrees with its conv1), false when it
 * is to be checked as a plain ResNet. */
static bool check_segmentation(tw_model_file *mf, tw_status *st, tw_error *err)
{
    const tw_tensor *seg = tw_model_file_find(mf, "backbone.conv1.weight");
    const char *head = "classifier.";
    if (!seg) {
        seg = tw_model_file_find(mf, "encoder.conv1.weight");
        head = "decoder.blocks.";
    }
    bool has_head = false;
    for (int i = 0; seg && !has_head && i < mf->n_tensors; i++)
        has_head = strncmp(mf->tensors[i].name, head, strlen(head)) == 0;
    if (!has_head || tw_model_file_find(mf, "conv1.weight")) return false;
    *st = TW_OK;
    if (seg->ndim != 4) {
        *st = tw_model_error(err, mf->path, "tensor '%s' is not 4-D", seg->name);
        return true;
    }
    int64_t b = seg->shape[1];
    const char *what = mf->n_bands && mf->n_bands != b ? "bands"
                       : mf->n_mean && mf->n_mean != b ? "mean"
                       : mf->n_std && mf->n_std != b   ? "std"
                                                       : NULL;
    if (what)
        *st = tw_model_error(err, mf->path,
                             "metadata '%s' does not list one value per band of %s (%lld)", what,
                             seg->name, (long long)b);
    return true;
}

/* A stride larger than the tile would leave pixels no tile covers. */
static tw_status check_stride(const tw_model_file *mf, tw_error *err)
{
    if (mf->stride && mf->tile && mf->stride > mf->tile)
        return tw_model_error(err, mf->path,
                              "metadata 'stride' = %d is larger than metadata 'tile' = %d (tiles "
                              "would leave gaps)",
                              mf->stride, mf->tile);
    return TW_OK;
}

/* The loader promises a ResNet state_dict, so check the few tensors every
 * consumer relies on, and that the metadata agrees with them. The rest of
 * the graph is checked by model/resnet.c against the architecture. */
static tw_status check_resnet(tw_model_file *mf, tw_error *err)
{
    tw_status seg_st;
    if (check_segmentation(mf, &seg_st, err)) return seg_st;
    const tw_tensor *conv1 = tw_model_file_find(mf, "conv1.weight");
    const tw_tensor *fcw = tw_model_file_find(mf, "fc.weight");
    const tw_tensor *fcb = tw_model_file_find(mf, "fc.bias");
    /* No fc at all: a headless backbone (embedding products only); one of
     * the two alone is a damaged head. */
    const char *missing = !conv1        ? "conv1.weight"
                          : !fcw && fcb ? "fc.weight"
                          : fcw && !fcb ? "fc.bias"
                                        : NULL;
    if (missing) {
        /* A checkpoint's tensors under a prefix (backbone., model.,
         * module.backbone., ...): P + "conv1.weight" with a
         * P + "layer1.0.conv1.weight" beside it (which tells it from a
         * block's own conv1). export_model.py strips the prefix. */
        const char *prefixed = NULL;
        size_t ml = strlen(missing);
        for (int i = 0; !prefixed && !conv1 && i < mf->n_tensors; i++) {
            const char *name = mf->tensors[i].name;
            size_t nl = strlen(name);
            char block[320];
            if (nl > ml && name[nl - ml - 1] == '.' && strcmp(name + nl - ml, missing) == 0 &&
                snprintf(block, sizeof block, "%.*slayer1.0.conv1.weight", (int)(nl - ml), name) <
                    (int)sizeof block &&
                tw_model_file_find(mf, block))
                prefixed = name;
        }
        if (prefixed)
            return tw_model_error(err, mf->path,
                                  "no tensor '%s' but '%s': the tensors carry a prefix ('%.*s'); "
                                  "tools/export_model.py %s -o model.h5 strips it",
                                  missing, prefixed, (int)(strlen(prefixed) - ml), prefixed,
                                  mf->path);
        return tw_model_error(err, mf->path,
                              "no tensor '%s': not a torchvision-layout ResNet state_dict "
                              "(tools/export_model.py converts a timm, TorchGeo or Lightning one)",
                              missing);
    }
    char s1[64], s2[64];
    if (conv1->ndim != 4) {
        shape_str(conv1, s1, sizeof s1);
        return tw_model_error(err, mf->path, "tensor 'conv1.weight' has shape %s (expected 4-D)",
                              s1);
    }
    if (fcw && (fcw->ndim != 2 || fcb->ndim != 1 || fcb->shape[0] != fcw->shape[0])) {
        shape_str(fcw, s1, sizeof s1);
        shape_str(fcb, s2, sizeof s2);
        return tw_model_error(
            err, mf->path,
            "tensor 'fc.weight' %s and 'fc.bias' %s do not fit (expected [K,C] and [K])", s1, s2);
    }
    int64_t in_bands = conv1->shape[1], k = fcw ? fcw->shape[0] : 0;
    if (mf->n_bands && mf->n_bands != in_bands)
        return tw_model_error(err, mf->path,
                              "metadata 'bands' lists %d bands but conv1.weight takes %lld",
                              mf->n_bands, (long long)in_bands);
    if (mf->n_mean && mf->n_mean != in_bands)
        return tw_model_error(err, mf->path,
                              "metadata 'mean' has %d values but conv1.weight takes %lld bands",
                              mf->n_mean, (long long)in_bands);
    if (mf->n_std && mf->n_std != in_bands)
        return tw_model_error(err, mf->path,
                              "metadata 'std' has %d values but conv1.weight takes %lld bands",
                              mf->n_std, (long long)in_bands);
    if (mf->n_classes && !fcw)
        return tw_model_error(err, mf->path,
                              "metadata 'classes' names %d classes but there is no fc.weight "
                              "(a headless backbone)",
                              mf->n_classes);
    if (mf->n_classes && mf->n_classes != k)
        return tw_model_error(err, mf->path,
                              "metadata 'classes' names %d classes but fc.weight has %lld",
                              mf->n_classes, (long long)k);
    return TW_OK;
}

/* Every value of every tensor, whichever reader produced it, must be
 * finite: a NaN in fc.weight turns every probability into NaN (a map of
 * class 0 with exit 0), one in a convolution flattens every answer. Checked
 * here, once, on the float32 values the readers converted (an F16/BF16 NaN
 * or Inf stays one). The scan ORs the exponent bits' "all ones" test over a
 * block, which the compiler vectorizes; only a block that holds a
 * non-finite value is walked again to find the first one. */
static bool block_all_finite(const float *v, size_t n)
{
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], sizeof u);
        bad |= (uint32_t)((u & 0x7f800000u) == 0x7f800000u);
    }
    return bad == 0;
}

static tw_status check_finite(const tw_model_file *mf, tw_error *err)
{
    enum { BLOCK = 4096 };
    for (int k = 0; k < mf->n_tensors; k++) {
        const tw_tensor *t = &mf->tensors[k];
        for (int64_t b = 0; b < t->numel; b += BLOCK) {
            size_t n = (size_t)(t->numel - b < BLOCK ? t->numel - b : BLOCK);
            if (block_all_finite(t->data + b, n)) continue;
            int64_t i = b;
            while (isfinite(t->data[i])) i++;
            /* the flat index as a row-major multi-dimensional one */
            int64_t idx[4] = {0}, rest = i;
            for (int d = t->ndim - 1; d >= 0; d--) {
                int64_t dim = t->shape[d] > 0 ? t->shape[d] : 1;
                idx[d] = rest % dim;
                rest /= dim;
            }
            char where[96];
            size_t o = 0;
            for (int d = 0; d < t->ndim && o < sizeof where; d++)
                o += (size_t)snprintf(where + o, sizeof where - o, d ? ", %lld" : "%lld",
                                      (long long)idx[d]);
            float v = t->data[i];
            return tw_model_error(err, mf->path,
                                  "tensor %s[%s] is %s: non-finite weights are refused (a "
                                  "corrupt file, or a training run that diverged)",
                                  t->name, where,
                                  isnan(v) ? "NaN"
                                  : v > 0  ? "+Inf"
                                           : "-Inf");
        }
    }
    return TW_OK;
}

/* ------------------------------------------------------------------------ */

/* ONNX: the name says so, or the bytes do where safetensors' would not (a
 * safetensors header length is followed by '{'; a ModelProto written by
 * onnx or torch starts with field 1, ir_version, as a varint: byte 0x08). */
static bool looks_like_onnx(const char *path, const unsigned char *head, size_t got)
{
    size_t n = strlen(path);
    if (n >= 5 && strcasecmp(path + n - 5, ".onnx") == 0) return true;
    if (got >= 9 && head[8] == '{') return false;
    return got >= 1 && head[0] == 0x08;
}

tw_status tw_model_file_load(const char *path, tw_model_file **out, tw_error *err)
{
    *out = NULL;
    if (!path || !*path) return tw_error_set(err, TW_ERR_MODEL, "model file: no path given");
    if (strlen(path) >= TW_PATH_MAX)
        return tw_error_set(err, TW_ERR_MODEL, "model file path is longer than %d bytes",
                            TW_PATH_MAX - 1);
    struct stat sb;
    if (stat(path, &sb) != 0) return tw_model_error(err, path, "cannot open: %s", strerror(errno));
    if (!S_ISREG(sb.st_mode)) return tw_model_error(err, path, "not a regular file");

    tw_model_file *mf = model_file_new(path);
    if (!mf) return tw_model_nomem(err, path, sizeof *mf);
    uint64_t size = 0;
    tw_status st = hash_file(path, mf->sha256, &size, err);
    if (st == TW_OK) {
        unsigned char sig[9] = {0};
        FILE *f = fopen(path, "rb");
        if (!f) {
            st = tw_model_error(err, path, "cannot open: %s", strerror(errno));
        } else {
            size_t got = fread(sig, 1, sizeof sig, f);
            fclose(f);
            if (got >= sizeof HDF5_SIGNATURE &&
                memcmp(sig, HDF5_SIGNATURE, sizeof HDF5_SIGNATURE) == 0) {
                mf->format = TW_MODEL_FORMAT_HDF5;
                st = tw_h5bundle_load(mf, err);
            } else if (looks_like_onnx(path, sig, got)) {
                mf->format = TW_MODEL_FORMAT_ONNX;
                st = tw_onnx_load(mf, size, err);
            } else {
                st = tw_safetensors_load(mf, size, err);
            }
        }
    }
    if (st == TW_OK) st = check_finite(mf, err);
    if (st == TW_OK) st = check_stride(mf, err);
    if (st == TW_OK) st = check_resnet(mf, err);
    if (st != TW_OK) {
        tw_model_file_destroy(mf);
        return st;
    }
    *out = mf;
    return TW_OK;
}

/* model_api.c - models and tiles in memory through the public API
 * (tilewise.h): open a model file as a run would (tw_resolve_loaded: the
 * same bands, scale, mean, std, classes and tile), classify tiles through
 * tw_normalize (or the backend's own normalization when it wants raw
 * pixels), and whole images through the run's tiling plan and stitcher.
 */
#include "tilewise.h"

#include <math.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cpl_conv.h>
#include <jansson.h>

#include "io/modelfile/model_file.h"
#include "io/url.h"
#include "model/backend.h"
#include "model/resnet.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "pipeline/engine/normalize.h"
#include "pipeline/engine/plan.h"
#include "pipeline/run/preflight.h"
#include "pipeline/run/run.h"
#include "pipeline/engine/stitch.h"
#include "api/api_internal.h"
#include "api/info.h"
#include "api/validate.h"
#include "config/workflow.h"

tw_status tw_api_backend_for(const tw_run_params *p, tw_backend *be, tw_error *err)
{
    tw_backend_params bp = tw_backend_default_params();
    bp.threads = p->runtime.threads;
    bp.cpu_winograd = p->runtime.cpu_winograd;
    return tw_backend_create_ex(p->runtime.device, &bp, be, err);
}

/* ---- models ---- */

struct tilewise_model {
    tw_run_params p;
    tw_resolved m;
    tw_resnet *net;
    tw_backend be;
    bool have_be;
    tw_norm norm;
    /* What reserve fixed, and the batch buffers it was sized for. */
    int tile;  /* 0: not reserved yet */
    int batch; /* tiles per backend call */
    void *raw; /* [batch][bands][tile][tile], 8 bytes per sample (widest dtype) */
    uint8_t *valid;
    float *x, *probs, *emb;
    char *info;
};

static tw_dtype to_internal(int t, bool *ok)
{
    *ok = true;
    switch (t) {
    case TILEWISE_DT_BYTE: return TW_DT_BYTE;
    case TILEWISE_DT_UINT16: return TW_DT_UINT16;
    case TILEWISE_DT_INT16: return TW_DT_INT16;
    case TILEWISE_DT_UINT32: return TW_DT_UINT32;
    case TILEWISE_DT_INT32: return TW_DT_INT32;
    case TILEWISE_DT_FLOAT32: return TW_DT_FLOAT32;
    case TILEWISE_DT_FLOAT64: return TW_DT_FLOAT64;
    case TILEWISE_DT_INT8: return TW_DT_INT8;
    }
    *ok = false;
    return TW_DT_BYTE;
}

static void model_info_json(tilewise_model *mo)
{
    const tw_resolved *m = &mo->m;
    json_t *o = json_object(), *bands = json_array(), *classes = json_array();
    json_t *mean = json_array(), *std = json_array();
    for (int i = 0; i < m->n_bands; i++) json_array_append_new(bands, json_integer(m->bands[i]));
    for (int c = 0; c < m->n_classes; c++)
        json_array_append_new(classes, json_string_nocheck(m->classes[c]));
    for (int c = 0; c < m->n_norm; c++) {
        json_array_append_new(mean, json_real((double)m->mean[c]));
        json_array_append_new(std, json_real((double)m->std[c]));
    }
    json_object_set_new(o, "path", json_string_nocheck(mo->p.model.weights));
    json_object_set_new(o, "arch", json_string_nocheck(m->arch));
    json_object_set_new(o, "bands", bands);
    json_object_set_new(o, "in_bands", json_integer(m->in_bands));
    json_object_set_new(o, "classes", classes);
    json_object_set_new(o, "n_classes", json_integer(m->n_classes));
    json_object_set_new(o, "feature_dim", json_integer(m->feat_dim));
    json_object_set_new(o, "tile", json_integer(m->tile));
    json_object_set_new(o, "stride", json_integer(m->stride));
    json_object_set_new(o, "scale", json_real(m->scale));
    /* a headless backbone: its probabilities are a stand-in head's (all 1) */
    json_object_set_new(o, "head", json_boolean(!m->headless));
    json_object_set_new(o, "mean", mean);
    json_object_set_new(o, "std", std);
    json_object_set_new(o, "sha256", json_string_nocheck(m->model_sha256));
    json_object_set_new(o, "backend", json_string(mo->have_be ? mo->be.i->name : ""));
    json_object_set_new(o, "batch", json_integer(mo->batch));
    json_object_set_new(o, "memory", json_integer((json_int_t)mo->p.runtime.memory));
    /* 17 digits: the float32 mean/std and the double scale read back exactly */
    char *text = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    json_decref(o);
    free(mo->info);
    mo->info = text; /* NULL when out of memory: tilewise_model_info_json gives "{}" */
}

tilewise_status tilewise_model_open(const char *path, const char *const *sets, int n_sets,
                                    tilewise_model **out, tilewise_error *oerr)
{
    if (out) *out = NULL;
    if (!path || !out || n_sets < 0 || (n_sets > 0 && !sets) || n_sets > MAX_SETS - 2)
        return tw_api_give_new(oerr, TW_ERR_USAGE, "tilewise_model_open: bad arguments");
    tilewise_model *mo = calloc(1, sizeof *mo);
    if (!mo) return tw_api_give_new(oerr, TW_ERR_NOMEM, "out of memory");
    tw_error err;
    tw_error_init(&err);
    /* The workflow parser checks the overrides (names, types, ranges) as for
     * a run; the two required keys get placeholders, replaced below. */
    const char *all[MAX_SETS];
    all[0] = "input.path=unused.tif";
    all[1] = "model.weights=unused.h5";
    for (int i = 0; i < n_sets; i++) all[2 + i] = sets[i];
    static const char empty[] = "{}\n";
    tw_status st = tw_workflow_parse("<model options>", empty, sizeof empty - 1, all, n_sets + 2,
                                     &mo->p, &err);
    tw_model_file *mf = NULL;
    if (st == TW_OK) {
        snprintf(mo->p.model.weights, sizeof mo->p.model.weights, "%s", path);
        mo->p.input.n_paths = 0;
        st = tw_preflight_weights(path, &err); /* a .pth: the export hint a run gives */
        if (st == TW_OK) st = tw_model_file_load(path, &mf, &err);
    }
    if (st == TW_OK) st = tw_resnet_create(mf, mo->p.model.arch, &mo->net, &err);
    if (st == TW_OK) st = tw_resolve_loaded(&mo->p, mf, mo->net, NULL, &mo->m, &err);
    tw_model_file_destroy(mf);
    if (st == TW_OK) st = tw_api_backend_for(&mo->p, &mo->be, &err);
    if (st == TW_OK) {
        mo->have_be = true;
        mo->norm.bands = mo->m.in_bands;
        mo->norm.scale = mo->m.scale;
        memcpy(mo->norm.mean, mo->m.mean, sizeof mo->norm.mean);
        memcpy(mo->norm.std, mo->m.std, sizeof mo->norm.std);
        model_info_json(mo);
        if (!mo->info) st = tw_error_set(&err, TW_ERR_NOMEM, "out of memory");
    }
    if (st != TW_OK) {
        tilewise_model_close(mo);
        return tw_api_give(oerr, st, &err);
    }
    *out = mo;
    return tw_api_give(oerr, TW_OK, &err);
}

static void free_buffers(tilewise_model *mo)
{
    tw_free(mo->raw);
    tw_free(mo->valid);
    tw_free(mo->x);
    tw_free(mo->probs);
    tw_free(mo->emb);
    mo->raw = mo->valid = NULL;
    mo->x = mo->probs = mo->emb = NULL;
}

void tilewise_model_close(tilewise_model *mo)
{
    if (!mo) return;
    free_buffers(mo);
    if (mo->have_be) tw_backend_destroy(&mo->be);
    tw_resnet_destroy(mo->net);
    free(mo->info);
    free(mo);
}

const char *tilewise_model_info_json(const tilewise_model *m)
{
    return m && m->info ? m->info : "{}";
}
int tilewise_model_bands(const tilewise_model *m)
{
    return m ? m->m.in_bands : 0;
}
int tilewise_model_classes(const tilewise_model *m)
{
    return m ? m->m.n_classes : 0;
}
int tilewise_model_feature_dim(const tilewise_model *m)
{
    return m ? m->m.feat_dim : 0;
}
int tilewise_model_tile(const tilewise_model *m)
{
    return m ? m->m.tile : 0;
}
const char *tilewise_model_class_name(const tilewise_model *m, int c)
{
    return m && c >= 0 && c < m->m.n_classes ? m->m.classes[c] : NULL;
}

/* Bytes one tile needs in the batch buffers. */
static size_t tile_bytes(const tilewise_model *mo, int T)
{
    size_t px = (size_t)T * (size_t)T;
    return px * (size_t)mo->m.in_bands * (8 + sizeof(float)) + px +
           (size_t)(mo->m.n_classes + mo->m.feat_dim) * sizeof(float);
}

/* Fix the batch from runtime.memory and reserve the backend for tiles of T
 * pixels. A second tile size makes a new backend (reserve runs once per
 * backend), so the net's weights are never handed over (consume = false). */
static tw_status reserve(tilewise_model *mo, int T, tw_error *err)
{
    if (mo->tile == T) return TW_OK;
    free_buffers(mo);
    if (mo->tile) {
        tw_backend_destroy(&mo->be);
        mo->have_be = false;
        tw_status st = tw_api_backend_for(&mo->p, &mo->be, err);
        if (st != TW_OK) return st;
        mo->have_be = true;
        mo->tile = 0;
    }
    const tw_backend *be = &mo->be;
    tw_precision prec = mo->p.runtime.precision;
    size_t weights = mo->net->weight_bytes;
    if (be->i->consumes_weights(be->ctx, prec)) weights *= 2; /* the net's and the backend's */
    int batch =
        mo->p.tiling.batch > 0 ? mo->p.tiling.batch : be->i->auto_batch(be->ctx, mo->net, T);
    if (batch < 1) batch = 1;
    size_t total = mo->p.runtime.memory;
    for (;;) {
        size_t need = weights + be->i->workspace_bytes(be->ctx, mo->net, T, batch, prec) +
                      (size_t)batch * tile_bytes(mo, T);
        if (need <= total) break;
        if (batch == 1)
            return tw_error_set(err, TW_ERR_NOMEM,
                                "runtime.memory %zu bytes cannot hold one %dx%d tile of %s "
                                "(%zu bytes needed)",
                                total, T, T, mo->m.arch, need);
        batch /= 2;
    }
    tw_status st = tw_backend_reserve(&mo->be, mo->net, T, &batch, prec, false, NULL, err);
    if (st != TW_OK) return st;
    size_t px = (size_t)T * (size_t)T, nb = (size_t)batch;
    size_t band_px = px * (size_t)mo->m.in_bands;
    mo->raw = tw_alloc(TW_MEM_SLOTS, nb * band_px * 8);
    mo->valid = tw_alloc(TW_MEM_SLOTS, nb * px);
    mo->x = tw_alloc(TW_MEM_SLOTS, nb * band_px * sizeof(float));
    mo->probs = tw_alloc(TW_MEM_SLOTS, nb * (size_t)mo->m.n_classes * sizeof(float));
    mo->emb = tw_alloc(TW_MEM_SLOTS, nb * (size_t)mo->m.feat_dim * sizeof(float));
    if (!mo->raw || !mo->valid || !mo->x || !mo->probs || !mo->emb) {
        free_buffers(mo);
        return tw_error_set(err, TW_ERR_NOMEM, "cannot allocate buffers for %d tiles", batch);
    }
    mo->tile = T;
    mo->batch = batch;
    model_info_json(mo);
    return TW_OK;
}

/* The readers' nodata rule (io/input/raster.h, tw_mark_nodata) on one tile
 * [bands][T][T]: clears valid[] where it says nodata. Returns the invalid
 * count. */
static int64_t mark_valid(const void *tile, tw_dtype t, int bands, int T, bool use_nd, double nd,
                          uint8_t *valid)
{
    const size_t px = (size_t)T * (size_t)T, plane = px * tw_dtype_size(t);
    for (int b = 0; b < bands; b++)
        tw_mark_nodata(t, (const char *)tile + (size_t)b * plane, T, T, T, use_nd, nd, valid);
    int64_t n = 0;
    for (size_t i = 0; i < px; i++) n += valid[i] == 0;
    return n;
}

tilewise_status tilewise_model_classify(tilewise_model *mo, const tilewise_tiles *in, float *probs,
                                        float *emb, tilewise_error *oerr)
{
    if (!mo || !in || !probs)
        return tw_api_give_new(oerr, TW_ERR_USAGE,
                               "tilewise_model_classify: no model, tiles or output");
    bool ok;
    tw_dtype t = to_internal(in->dtype, &ok);
    if (!ok)
        return tw_api_give_new(
            oerr, TW_ERR_USAGE,
            "pixel data type %d is not supported (Byte, Int8, UInt16, Int16, UInt32, "
            "Int32, Float32, Float64)",
            in->dtype);
    if (in->bands != mo->m.in_bands)
        return tw_api_give_new(oerr, TW_ERR_USAGE,
                               "%s expects %d input bands but the tiles have %d",
                               mo->p.model.weights, mo->m.in_bands, in->bands);
    if (in->size < 32)
        return tw_api_give_new(oerr, TW_ERR_USAGE,
                               "tiles of %d pixels are too small for a ResNet (32 pixels at least)",
                               in->size);
    if (in->n < 0 || (in->n > 0 && !in->pixels))
        return tw_api_give_new(oerr, TW_ERR_USAGE, "tilewise_model_classify: %d tiles, pixels %s",
                               in->n, in->pixels ? "given" : "missing");
    if (in->n == 0) return tw_api_give_new(oerr, TW_OK, "ok");
    tw_error err;
    tw_error_init(&err);
    const int T = in->size;
    tw_status st = reserve(mo, T, &err);
    if (st != TW_OK) return tw_api_give(oerr, st, &err);

    const int K = mo->m.n_classes, F = mo->m.feat_dim;
    const size_t px = (size_t)T * (size_t)T, esz = tw_dtype_size(t);
    const size_t tile_raw = px * (size_t)in->bands * esz;
    const bool wants_raw = mo->be.i->wants_raw(mo->be.ctx);
    const double max_frac = mo->p.tiling.max_nodata_fraction;
    int64_t next = 0;
    while (next < in->n) {
        /* Gather up to batch classifiable tiles; the others get NaN. */
        int64_t idx[4096];
        int k = 0;
        int cap = mo->batch < 4096 ? mo->batch : 4096;
        for (; next < in->n && k < cap; next++) {
            const char *src = (const char *)in->pixels + (size_t)next * tile_raw;
            uint8_t *v = mo->valid + (size_t)k * px;
            int64_t outside = 0;
            if (in->valid) {
                const uint8_t *iv = in->valid + (size_t)next * px;
                for (size_t i = 0; i < px; i++) {
                    v[i] = iv[i] != 0 && iv[i] != 2;
                    outside += iv[i] == 2;
                }
            } else {
                memset(v, 1, px);
            }
            /* As the run's tile_classified: nodata counted over the pixels
             * inside the image. */
            int64_t inside = (int64_t)px - outside;
            int64_t bad =
                mark_valid(src, t, in->bands, T, in->use_nodata != 0, in->nodata, v) - outside;
            if (!tw_tile_classified(bad, inside, max_frac)) {
                for (int c = 0; c < K; c++) probs[(size_t)next * K + c] = NAN;
                if (emb)
                    for (int f = 0; f < F; f++) emb[(size_t)next * F + f] = NAN;
                continue;
            }
            memcpy((char *)mo->raw + (size_t)k * tile_raw, src, tile_raw);
            idx[k++] = next;
        }
        if (k == 0) continue;
        if (!wants_raw) tw_normalize(mo->raw, t, mo->valid, k, T, T, &mo->norm, 0, mo->x);
        tw_infer_batch b = {.n = k,
                            .tile = T,
                            .x = mo->x,
                            .raw = mo->raw,
                            .raw_type = t,
                            .valid = mo->valid,
                            .norm = &mo->norm,
                            .probs = mo->probs,
                            .emb = emb ? mo->emb : NULL};
        st = tw_backend_infer(&mo->be, &b, &err);
        if (st != TW_OK) return tw_api_give(oerr, st, &err);
        for (int j = 0; j < k; j++) {
            memcpy(probs + (size_t)idx[j] * K, mo->probs + (size_t)j * K, sizeof(float) * K);
            if (emb) memcpy(emb + (size_t)idx[j] * F, mo->emb + (size_t)j * F, sizeof(float) * F);
        }
    }
    return tw_api_give(oerr, TW_OK, &err);
}

/* ---- a whole image: the run's plan and stitcher ---- */

/* Where the stitcher's finished rows go: probs [K][grid_h][grid_w]. */
typedef struct image_sink {
    float *out;
    int K, grid_w, grid_h;
} image_sink;

static tw_status image_rows(void *user, int row0, int n, const float *probs, const uint8_t *has,
                            tw_error *err)
{
    (void)err;
    const image_sink *is = user;
    const size_t plane = (size_t)is->grid_w * (size_t)is->grid_h;
    for (int r = 0; r < n; r++)
        for (int x = 0; x < is->grid_w; x++) {
            size_t cell = (size_t)r * is->grid_w + x, at = (size_t)(row0 + r) * is->grid_w + x;
            for (int c = 0; c < is->K; c++)
                is->out[(size_t)c * plane + at] = has[cell] ? probs[cell * is->K + c] : NAN;
        }
    return TW_OK;
}

/* Tile (x0, y0) of img into tile [bands][T][T] and its validity: 1 valid,
 * 0 nodata (the caller's mask; the nodata rule follows in classify), 2
 * outside the image (padding, zeros). */
static void cut_image_tile(const tilewise_image *img, size_t esz, int T, int x0, int y0,
                           uint8_t *tile, uint8_t *valid)
{
    const int cols = x0 + T <= img->width ? T : img->width - x0;
    const size_t plane = (size_t)img->width * (size_t)img->height;
    for (int y = 0; y < T; y++) {
        const bool row_in = y0 + y < img->height;
        const size_t src_px = (size_t)(y0 + y) * (size_t)img->width + (size_t)x0;
        for (int b = 0; b < img->bands; b++) {
            uint8_t *dst = tile + (((size_t)b * T + y) * T) * esz;
            if (row_in) {
                memcpy(dst, (const uint8_t *)img->pixels + ((size_t)b * plane + src_px) * esz,
                       (size_t)cols * esz);
                memset(dst + (size_t)cols * esz, 0, (size_t)(T - cols) * esz);
            } else {
                memset(dst, 0, (size_t)T * esz);
            }
        }
        uint8_t *v = valid + (size_t)y * T;
        for (int x = 0; x < T; x++)
            v[x] = !row_in || x >= cols ? 2 : img->valid ? img->valid[src_px + x] != 0 : 1;
    }
}

tilewise_status tilewise_model_classify_image(tilewise_model *mo, const tilewise_image *img,
                                              int stride, float *probs, tilewise_error *oerr)
{
    if (!mo || !img || !probs || !img->pixels)
        return tw_api_give_new(oerr, TW_ERR_USAGE,
                               "tilewise_model_classify_image: no model, image, pixels or output");
    if (img->width <= 0 || img->height <= 0)
        return tw_api_give_new(oerr, TW_ERR_USAGE, "an image of %d x %d pixels", img->width,
                               img->height);
    if (stride < 0)
        return tw_api_give_new(oerr, TW_ERR_USAGE,
                               "tilewise_model_classify_image: stride %d (expected 0, the model's "
                               "tile %d, or a divisor of it)",
                               stride, mo->m.tile);
    bool ok;
    tw_dtype t = to_internal(img->dtype, &ok);
    if (!ok) /* tilewise_model_classify names the type */
        return tilewise_model_classify(mo, &(tilewise_tiles){.dtype = img->dtype, .n = 1}, probs,
                                       NULL, oerr);
    const int T = mo->m.tile, S = stride > 0 ? stride : T, K = mo->m.n_classes;
    tw_error err;
    tw_error_init(&err);
    tw_plan plan;
    tw_status st = tw_plan_make(img->width, img->height, T, S, TW_EDGE_PAD, 0, 1, &plan, &err);
    if (st != TW_OK) return tw_api_give(oerr, st == TW_ERR_CONFIG ? TW_ERR_USAGE : st, &err);
    st = reserve(mo, T, &err);
    if (st != TW_OK) return tw_api_give(oerr, st, &err);
    image_sink sink = {.out = probs, .K = K, .grid_w = plan.grid_w, .grid_h = plan.grid_h};
    tw_stitch *stitch = NULL;
    st = tw_stitch_create(&plan, K, image_rows, &sink, &stitch, &err);
    if (st != TW_OK) return tw_api_give(oerr, st, &err);
    /* A tile row at a time, in batches: cut, classify (the nodata rule and
     * the backend as for tiles), add to the stitcher in raster order. */
    const size_t esz = tw_dtype_size(t), px = (size_t)T * (size_t)T;
    const size_t tile_raw = px * (size_t)img->bands * esz;
    const int cap = mo->batch > 0 ? mo->batch : 1;
    uint8_t *raw = tw_alloc(TW_MEM_SLOTS, (size_t)cap * tile_raw);
    uint8_t *valid = tw_alloc(TW_MEM_SLOTS, (size_t)cap * px);
    float *tp = tw_alloc(TW_MEM_SLOTS, (size_t)cap * (size_t)K * sizeof(float));
    if (!raw || !valid || !tp) st = tw_error_set(&err, TW_ERR_NOMEM, "out of memory");
    tilewise_status ret = TILEWISE_OK;
    tilewise_error e2;
    for (int ty = plan.ty_begin; st == TW_OK && ret == TILEWISE_OK && ty < plan.ty_end; ty++) {
        st = tw_stitch_begin_row(stitch, ty, &err);
        const int y0 = tw_axis_pos(&plan.y, T, S, ty);
        for (int tx0 = 0; st == TW_OK && tx0 < plan.x.n_pos; tx0 += cap) {
            const int n = plan.x.n_pos - tx0 < cap ? plan.x.n_pos - tx0 : cap;
            for (int i = 0; i < n; i++)
                cut_image_tile(img, esz, T, tw_axis_pos(&plan.x, T, S, tx0 + i), y0,
                               raw + (size_t)i * tile_raw, valid + (size_t)i * px);
            tilewise_tiles tiles = {.pixels = raw,
                                    .dtype = img->dtype,
                                    .n = n,
                                    .bands = img->bands,
                                    .size = T,
                                    .valid = valid,
                                    .use_nodata = img->use_nodata,
                                    .nodata = img->nodata};
            ret = tilewise_model_classify(mo, &tiles, tp, NULL, &e2);
            if (ret != TILEWISE_OK) break;
            for (int i = 0; i < n; i++)
                if (!isnan(tp[(size_t)i * K])) /* NaN: not classified (nodata) */
                    tw_stitch_add(stitch, tx0 + i, ty, tp + (size_t)i * K);
        }
    }
    if (st == TW_OK && ret == TILEWISE_OK) st = tw_stitch_finish(stitch, &err);
    tw_stitch_destroy(stitch);
    tw_free(raw);
    tw_free(valid);
    tw_free(tp);
    if (ret != TILEWISE_OK) {
        if (oerr) *oerr = e2;
        return ret;
    }
    return tw_api_give(oerr, st, &err);
}

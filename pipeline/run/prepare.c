/* prepare.c - what a run settles before the first tile (run_internal.h's
 * prepare steps, shared by run.c, validate.c and merge.c): the model
 * resolved against the config (tw_resolve), every input opened and checked
 * (bands, AOI, what can be read), the products and the output folder checked
 * (preflight.c), the budget planned, and the advice gathered. */
#include "pipeline/run/run.h"

#include <errno.h>
#include <gdal.h>
#include <math.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/output/polygons.h"
#include "io/modelfile/model_file.h"
#include "io/input/identity.h"
#include "io/input/raster.h"
#include "io/input/stac.h"
#include "io/url.h"
#include "core/alloc.h"
#include "core/keys.h"
#include "core/clock.h"
#include "core/fileio.h"
#include "pipeline/store/parts.h"
#include "pipeline/engine/plan.h"
#include "pipeline/store/manifest.h"
#include "pipeline/store/names.h"
#include "pipeline/run/products.h"
#include "pipeline/run/preflight.h"
#include "pipeline/run/run_internal.h"
#include "pipeline/engine/stages.h"
#include "pipeline/engine/stitch.h"
#include "pipeline/engine/blend.h"

/* ------------------------------------------------------------------------ */
/* Model and inputs: resolve config against the bundle, check before work.  */

/* A segmentation model's default stride leaves 1/TW_SEG_DEFAULT_OVERLAP of
 * the tile to the overlap with each neighbour. */
#define TW_SEG_DEFAULT_OVERLAP 2

/* batch: auto's bound for a segmentation model: its tiles run one at a
 * time (seg_cpu.h), so a batch only saves the stages' hand-overs, while
 * each tile's per-pixel probabilities fill its slot. */
#define TW_SEG_MAX_AUTO_BATCH 4

/* The network's own facts: a classifier's (net) or a segmentation
 * model's (seg); one of the two is NULL. */
static tw_status resolve_net(const tw_run_params *p, const tw_resnet *net, const tw_segnet *seg,
                             tw_resolved *m, tw_error *err)
{
    if (seg) {
        snprintf(m->arch, sizeof m->arch, "%s", seg->arch);
        m->stem = TW_STEM_STANDARD;
        m->segmentation = true;
        m->multiple = seg->multiple;
        m->in_bands = seg->in_bands;
        m->n_classes = seg->n_classes;
        return TW_OK;
    }
    tw_resnet_arch_name(net, m->arch, sizeof m->arch);
    m->stem = net->stem_kind;
    m->multiple = 1;
    m->in_bands = net->in_bands;
    m->n_classes = net->n_classes;
    m->feat_dim = net->feat_dim;
    m->headless = net->headless;
    return tw_resnet_check_stem(net, p->model.stem, p->model.weights, "model.stem", err);
}

/* tiling.tile and tiling.stride against the network: a classifier's stride
 * divides its tile; a segmentation model's is any in 1..tile and its tile
 * a multiple of what the network takes; tiling.blend and tiling.margin are
 * a segmentation model's alone. */
static tw_status resolve_tiling(const tw_run_params *p, const tw_model_file *mf, tw_resolved *m,
                                tw_error *err)
{
    const char *wpath = p->model.weights;
    const char *from = p->tiling.tile > 0 ? "tiling.tile" : "the model bundle's tile size";
    m->tile = p->tiling.tile > 0 ? p->tiling.tile : (mf->tile > 0 ? mf->tile : 64);
    /* a segmentation model's tiles overlap by default: the seams measured
     * in bench/RESULTS.md ("Seams") chose TW_SEG_DEFAULT_OVERLAP */
    m->stride = p->tiling.stride > 0 ? p->tiling.stride
                : m->segmentation    ? m->tile - m->tile / TW_SEG_DEFAULT_OVERLAP
                                     : m->tile;
    if (m->tile < 32)
        return tw_error_set(err, TW_ERR_CONFIG,
                            "tiling.tile %d is too small for a ResNet (32 pixels at least)",
                            m->tile);
    if (m->segmentation) {
        m->cell = 1;
        if (m->stride > m->tile)
            return tw_error_set(err, TW_ERR_CONFIG,
                                "tiling.stride: %d is larger than tile %d (%s) (expected 1..tile)",
                                m->stride, m->tile, from);
        if (m->tile % m->multiple != 0)
            return tw_error_set(err, TW_ERR_CONFIG,
                                "tiling.tile: %s (%s) takes tiles whose side is a multiple of %d; "
                                "%d is not (use %d or %d)",
                                wpath, m->arch, m->multiple, m->tile,
                                m->tile / m->multiple * m->multiple > 0
                                    ? m->tile / m->multiple * m->multiple
                                    : m->multiple,
                                (m->tile / m->multiple + 1) * m->multiple);
        int mmax = (m->tile - m->stride) / 2;
        if (p->tiling.margin > mmax)
            return tw_error_set(err, TW_ERR_CONFIG,
                                "tiling.margin: %d is too large for tile %d and stride %d: at most "
                                "%d (floor((tile - stride) / 2); a larger margin leaves pixels "
                                "between two tiles that neither gives a weight)",
                                p->tiling.margin, m->tile, m->stride, mmax);
        return TW_OK;
    }
    m->cell = m->stride;
    if (p->tiling.margin != 0 || p->tiling.blend != TW_BLEND_DEFAULT)
        return tw_error_set(err, TW_ERR_CONFIG,
                            "tiling.%s: %s is a classifier (one answer per tile): only a "
                            "segmentation model blends per pixel",
                            p->tiling.margin != 0 ? "margin" : "blend", wpath);
    /* The tile came from the bundle (the parser checks a given one): the
     * parser's message, saying so. */
    char why[TW_ERROR_MSG_MAX / 2];
    if (tw_key_check_stride(m->tile, m->stride, from, why, sizeof why) != 0)
        return tw_error_set(err, TW_ERR_CONFIG, "tiling.stride: %s", why);
    return TW_OK;
}

static tw_status resolve_model(const tw_run_params *p, const tw_model_file *mf,
                               const tw_resnet *net, const tw_segnet *seg, tw_resolved *m,
                               tw_error *err)
{
    memset(m, 0, sizeof *m);
    const char *wpath = p->model.weights;
    tw_status st0 = resolve_net(p, net, seg, m, err);
    if (st0 != TW_OK) return st0;
    const char *conv1 =
        seg ? (seg->kind == TW_SEG_UNET ? "encoder.conv1.weight" : "backbone.conv1.weight")
            : "conv1.weight";
    const char *head = seg ? "the last convolution" : "fc.weight";
    memcpy(m->model_sha256, mf->sha256, sizeof m->model_sha256);

    if (p->input.n_bands > 0) {
        m->n_bands = p->input.n_bands;
        memcpy(m->bands, p->input.bands, sizeof(int) * (size_t)m->n_bands);
    } else if (mf->n_bands > 0) {
        m->n_bands = mf->n_bands;
        memcpy(m->bands, mf->bands, sizeof(int) * (size_t)m->n_bands);
    }
    if (m->n_bands > 0 && m->n_bands != m->in_bands)
        return tw_error_set(err, TW_ERR_MODEL, "%s expects %d input bands (%s) but %s selects %d",
                            wpath, m->in_bands, conv1,
                            p->input.n_bands > 0 ? "input.bands" : "the bundle's band list",
                            m->n_bands);

    m->scale = !isnan(p->input.scale) ? p->input.scale
                                      : (!isnan(mf->scale) && mf->scale > 0 ? mf->scale : 1.0);

    m->n_norm = m->in_bands;
    int n_mean = p->model.n_mean > 0 ? p->model.n_mean : mf->n_mean;
    int n_std = p->model.n_std > 0 ? p->model.n_std : mf->n_std;
    const float *mean = p->model.n_mean > 0 ? p->model.mean : mf->mean;
    const float *std = p->model.n_std > 0 ? p->model.std : mf->std;
    if (n_mean > 0 && n_mean != m->in_bands)
        return tw_error_set(err, TW_ERR_CONFIG,
                            "model.mean has %d values but %s expects %d input bands", n_mean, wpath,
                            m->in_bands);
    if (n_std > 0 && n_std != m->in_bands)
        return tw_error_set(err, TW_ERR_CONFIG,
                            "model.std has %d values but %s expects %d input bands", n_std, wpath,
                            m->in_bands);
    for (int c = 0; c < m->in_bands; c++) {
        m->mean[c] = n_mean > 0 ? mean[c] : 0.0f;
        m->std[c] = n_std > 0 ? std[c] : 1.0f;
        if (!(m->std[c] > 0.0f) || !isfinite(m->std[c]) || !isfinite(m->mean[c]))
            return tw_error_set(err, TW_ERR_CONFIG, "model.std[%d] must be a positive number", c);
    }

    if (m->headless && (p->model.n_classes > 0 || p->model.n_colors > 0))
        return tw_error_set(err, TW_ERR_CONFIG,
                            "model.%s: %s is a headless backbone (no fc.weight): it has no classes",
                            p->model.n_classes > 0 ? "classes" : "colors", wpath);
    if (m->n_classes > TW_MAX_CLASSES)
        return tw_error_set(err, TW_ERR_MODEL, "%s has %d classes; tilewise supports at most %d",
                            wpath, m->n_classes, TW_MAX_CLASSES);
    if (p->model.n_classes > 0 && p->model.n_classes != m->n_classes)
        return tw_error_set(err, TW_ERR_CONFIG, "model.classes names %d classes but %s has %d (%s)",
                            p->model.n_classes, wpath, m->n_classes, head);
    for (int c = 0; c < m->n_classes; c++) {
        if (p->model.n_classes > 0)
            snprintf(m->classes[c], TW_NAME_MAX, "%s", p->model.classes[c]);
        else if (mf->n_classes == m->n_classes)
            snprintf(m->classes[c], TW_NAME_MAX, "%s", mf->classes[c]);
        else
            snprintf(m->classes[c], TW_NAME_MAX, "class_%d", c);
        /* Names reach terminals, band descriptions and legends: a control
         * character (ESC, CR, a newline) there rewrites what a user sees. The
         * parser refuses them in model.classes; a bundle's are refused here. */
        for (const unsigned char *ch = (const unsigned char *)m->classes[c]; *ch; ch++)
            if (*ch < 0x20 || *ch == 0x7f)
                return tw_error_set(err, TW_ERR_MODEL,
                                    "%s: class name %d holds a control character (byte 0x%02x); "
                                    "give model.classes in the workflow",
                                    wpath, c + 1, *ch);
    }

    if (p->model.n_colors > 0 && p->model.n_colors != m->n_classes)
        return tw_error_set(err, TW_ERR_CONFIG,
                            "model.colors has %d colours but %s has %d classes (%s)",
                            p->model.n_colors, wpath, m->n_classes, head);

    return resolve_tiling(p, mf, m, err);
}

/* input.aoi for one raster, on the tile grid of its full plan (tile
 * indices are the plan's, whatever the shard). NULL in *out without an
 * AOI. */
tw_status tw_run_aoi_for(const tw_run_params *p, const tw_resolved *m, const tw_raster_info *info,
                         tw_aoi **out, tw_error *err)
{
    *out = NULL;
    if (!p->input.aoi[0]) return TW_OK;
    tw_plan full;
    tw_status st = tw_plan_make_cell(info->width, info->height, m->tile, m->stride, m->cell,
                                     p->tiling.edge, 0, 1, &full, err);
    if (st != TW_OK) return st;
    int *xs = tw_calloc(TW_MEM_OTHER, (size_t)full.x.n_pos + (size_t)full.y.n_pos, sizeof(int));
    if (!xs) return tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    int *ys = xs + full.x.n_pos;
    for (int i = 0; i < full.x.n_pos; i++) xs[i] = tw_axis_pos(&full.x, m->tile, m->stride, i);
    for (int i = 0; i < full.y.n_pos; i++) ys[i] = tw_axis_pos(&full.y, m->tile, m->stride, i);
    tw_aoi_geometry g = {.tile = m->tile,
                         .stride = m->stride,
                         .n_x = full.x.n_pos,
                         .n_y = full.y.n_pos,
                         .x0 = xs,
                         .y0 = ys};
    st = tw_aoi_create(p->input.aoi, info, &g, out, err);
    tw_free(xs);
    return st;
}

/* A band selection the raster cannot give: name both sides. */
static tw_status band_mismatch(const tw_run_params *p, const tw_resolved *m, const char *src,
                               const char *shown, tw_error *err)
{
    tw_raster *r = NULL;
    tw_error e;
    tw_error_init(&e);
    if (m->n_bands == 0 || tw_raster_open(src, NULL, 0, &r, &e) != TW_OK)
        return TW_OK; /* not about the bands */
    int have = tw_raster_get_info(r)->band_count;
    tw_raster_close(r);
    int worst = 0;
    for (int b = 0; b < m->n_bands; b++)
        if (m->bands[b] > worst) worst = m->bands[b];
    if (worst <= have) return TW_OK;
    if (have < m->in_bands)
        return tw_error_set(err, TW_ERR_INPUT,
                            "%s has %d band%s, but %s asks for band %d: the model %s needs %d "
                            "bands, more than this raster has (use a model made for %d band%s)",
                            shown, have, have == 1 ? "" : "s",
                            p->input.n_bands > 0 ? "input.bands" : "the model bundle's band list",
                            worst, p->model.weights, m->in_bands, have, have == 1 ? "" : "s");
    return tw_error_set(err, TW_ERR_INPUT,
                        "%s has %d band%s, but %s asks for band %d: the model %s needs %d "
                        "bands (set input.bands to %d of this raster's bands 1..%d)",
                        shown, have, have == 1 ? "" : "s",
                        p->input.n_bands > 0 ? "input.bands" : "the model bundle's band list",
                        worst, p->model.weights, m->in_bands, m->in_bands, have);
}

/* Was the run asked to stop (tw_run_hooks.stop)? */
static bool stopped(const run_ctx *c)
{
    return c->hooks && c->hooks->stop && __atomic_load_n(c->hooks->stop, __ATOMIC_RELAXED) != 0;
}

static tw_status check_inputs(const tw_run_params *p, const tw_resolved *m,
                              const char *const *sources, input_info *infos,
                              const volatile sig_atomic_t *stop, tw_error *err)
{
    int n_ok = 0;
    for (int i = 0; i < p->input.n_paths; i++) {
        tw_raster *r = NULL;
        char shown[TW_URL_SHOWN_MAX], shown_j[TW_URL_SHOWN_MAX];
        tw_url_redact(p->input.paths[i], shown, sizeof shown);
        tw_raster_open_params op = {.tiff_direct = p->input.tiff_direct, .stop = stop};
        tw_error oerr;
        tw_error_init(&oerr);
        tw_status st = tw_raster_open_ex(sources[i], m->bands, m->n_bands, &op, &r, &oerr);
        if (st == TW_CANCELLED) return tw_error_set(err, st, "%s", oerr.msg);
        if (st != TW_OK && band_mismatch(p, m, sources[i], shown, err) != TW_OK) return err->status;
        if (st != TW_OK && p->input.on_error == TW_ON_ERROR_SKIP && p->input.n_paths > 1) {
            /* One bad input of a batch: reported and skipped, the others run. */
            infos[i].skipped = true;
            snprintf(infos[i].skip_reason, sizeof infos[i].skip_reason, "%.500s", oerr.msg);
            continue;
        }
        if (st != TW_OK) return tw_error_set(err, oerr.status, "%s", oerr.msg);
        n_ok++;
        infos[i].info = *tw_raster_get_info(r);
        infos[i].bands = tw_raster_selected_bands(r);
        infos[i].mask = tw_raster_has_mask(r);
        tw_raster_close(r);
        if (infos[i].bands != m->in_bands)
            return tw_error_set(err, TW_ERR_INPUT,
                                "%s: %d bands selected but the model %s expects %d (set "
                                "input.bands)",
                                shown, infos[i].bands, p->model.weights, m->in_bands);
        /* The plan's own message (e.g. smaller than a tile with edge: skip)
         * cannot name the raster: check each input here, where the path is known. */
        tw_plan plan;
        tw_error perr;
        tw_error_init(&perr);
        if (tw_plan_make_cell(infos[i].info.width, infos[i].info.height, m->tile, m->stride,
                              m->cell, p->tiling.edge, 0, 1, &plan, &perr) != TW_OK)
            return tw_error_set(err, perr.status, "%s: %s", shown, perr.msg);
        /* input.aoi: read and placed on every raster before any tile. */
        infos[i].all_tiles = plan.n_tiles;
        infos[i].aoi_tiles = -1;
        if (p->input.aoi[0]) {
            tw_aoi *aoi = NULL;
            tw_status ast = tw_run_aoi_for(p, m, &infos[i].info, &aoi, err);
            if (ast != TW_OK) return ast;
            infos[i].aoi_tiles = tw_aoi_count(aoi);
            tw_aoi_destroy(aoi);
        }
        char si[256], sj[256];
        tw_status nst = tw_output_name(p, i, si, sizeof si, err);
        for (int j = 0; nst == TW_OK && j < i; j++) {
            nst = tw_output_name(p, j, sj, sizeof sj, err);
            if (nst == TW_OK && strcmp(si, sj) == 0) {
                tw_url_redact(p->input.paths[j], shown_j, sizeof shown_j);
                return tw_error_set(
                    err, TW_ERR_CONFIG,
                    "input.path: %s and %s would write the same outputs (%s.*): name them "
                    "apart with output.name, e.g. \"{parent}_{stem}\" or \"{stem}_{index}\"",
                    shown_j, shown, si);
            }
        }
        if (nst != TW_OK) return nst;
    }
    if (n_ok == 0 && p->input.n_paths > 0) {
        for (int i = 0; i < p->input.n_paths; i++)
            if (infos[i].skipped)
                return tw_error_set(err, TW_ERR_INPUT,
                                    "no input can be opened (input.on_error: skip skips some, "
                                    "not all); the first: %s",
                                    infos[i].skip_reason);
    }
    return TW_OK;
}

void tw_run_ctx_release(run_ctx *c)
{
    for (int i = 0; c->stacs && i < c->p->input.n_paths; i++) tw_stac_destroy(c->stacs[i]);
    tw_free(c->stacs);
    tw_free(c->sources);
    tw_url_settings_restore(c->net_saved);
    c->net_saved = NULL;
    if (c->have_be) tw_backend_destroy(&c->be);
    tw_resnet_destroy(c->net);
    tw_segnet_destroy(c->seg);
    tw_free(c->infos);
}

/* The products against the model: a headless backbone has no class
 * probabilities to give (TW_ERR_MODEL naming the product and the file). */
static tw_status check_products(const tw_run_params *p, const tw_resolved *m, tw_error *err)
{
    unsigned need = p->output.products & tw_products_needing_head();
    /* 'embeddings' brings the tile table: a headless one holds no probabilities */
    if (p->output.products & TW_PRODUCT_EMB) need &= ~(unsigned)TW_PRODUCT_TILES;
    if (m->headless && need) {
        const char *name = "?";
        for (int i = 0; i < TW_PRODUCT_COUNT; i++)
            if (need & tw_products[i].bit) {
                name = tw_products[i].word;
                break;
            }
        return tw_error_set(err, TW_ERR_MODEL,
                            "output.products: '%s' needs a classification head, but %s is a "
                            "headless backbone (no fc.weight): ask for embedding_raster or "
                            "embeddings only",
                            name, p->model.weights);
    }
    /* a segmentation model answers per pixel: no tile table, no pooled
     * features */
    unsigned per_tile =
        TW_PRODUCT_TILES | TW_PRODUCT_TILES_GPKG | TW_PRODUCT_EMB | TW_PRODUCT_EMB_RASTER;
    for (int i = 0; m->segmentation && i < TW_PRODUCT_COUNT; i++)
        if (p->output.products & per_tile & tw_products[i].bit)
            return tw_error_set(err, TW_ERR_CONFIG,
                                "output.products: '%s' is a classifier's product, but %s is a "
                                "segmentation model (%s, one answer per pixel): ask for class, "
                                "prob, confidence or polygons",
                                tw_products[i].word, p->model.weights, m->arch);
    /* the products against other keys: config/workflow.c's check_all */
    return TW_OK;
}

/* pipeline/run/preflight.h: everything about the outputs that can fail after
 * the first tile, checked before it. Warnings land in c->warn. */
static tw_status preflight(run_ctx *c, const tw_run_params *p, tw_error *err)
{
    int n = p->input.n_paths;
    int *wh = tw_calloc(TW_MEM_OTHER, 2 * (size_t)n, sizeof(int));
    char(*stems)[256] = tw_calloc(TW_MEM_OTHER, (size_t)n, 256);
    tw_status st = TW_OK;
    if (!wh || !stems) st = tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    for (int i = 0; st == TW_OK && i < n; i++) {
        wh[i] = c->infos[i].skipped ? 0 : c->infos[i].info.width;
        wh[n + i] = c->infos[i].info.height;
        st = tw_output_name(p, i, stems[i], sizeof stems[i], err);
    }
    tw_preflight_params pf = {
        .run = p,
        .n_classes = c->m.n_classes,
        .feat_dim = c->m.feat_dim,
        .tile = c->m.tile,
        .stride = c->m.stride,
        .cell = c->m.cell,
        .n_inputs = n,
        .width = wh,
        .height = wh + n,
        .stems = (const char(*)[256])stems,
        .sources = c->sources,
    };
    if (st == TW_OK) st = tw_preflight_output(&pf, &c->warn, err);
    for (int i = 0; st == TW_OK && i < n; i++)
        if (!c->infos[i].skipped && c->infos[i].aoi_tiles == 0 &&
            c->warn.n < TW_PREFLIGHT_MAX_WARNINGS) {
            char shown[TW_URL_SHOWN_MAX];
            tw_url_redact(p->input.paths[i], shown, sizeof shown);
            snprintf(c->warn.msg[c->warn.n++], sizeof c->warn.msg[0],
                     "input.aoi: %.200s touches no tile of %.200s: its outputs will be all nodata",
                     p->input.aoi, shown);
        }
    tw_free(wh);
    tw_free(stems);
    return st;
}

void tw_run_checks_advice(const run_ctx *c, tw_advice *a)
{
    for (int i = 0; i < c->warn.n && a->n < TW_ADVICE_MAX; i++) {
        tw_advice_item *it = &a->items[a->n++];
        memset(it, 0, sizeof *it);
        it->warning = true;
        a->n_warnings++;
        snprintf(it->code, sizeof it->code, "output");
        snprintf(it->text, sizeof it->text, "%s", c->warn.msg[i]);
    }
    for (int i = 0; i < c->polygons.n && a->n < TW_ADVICE_MAX; i++) {
        tw_advice_item *it = &a->items[a->n++];
        memset(it, 0, sizeof *it);
        it->warning = true;
        a->n_warnings++;
        snprintf(it->code, sizeof it->code, "polygons_memory");
        snprintf(it->text, sizeof it->text, "%s", c->polygons.msg[i]);
    }
}

int64_t tw_run_polygons_fit(const run_ctx *c, int i, int *grid_w, int *grid_h)
{
    const tw_raster_info *info = &c->infos[i].info;
    int gw = info->width, gh = info->height;
    tw_plan plan;
    tw_error e;
    tw_error_init(&e);
    if (c->p->output.resolution != TW_RESOLUTION_INPUT &&
        tw_plan_make_cell(info->width, info->height, c->m.tile, c->m.stride, c->m.cell,
                          c->p->tiling.edge, 0, 1, &plan, &e) == TW_OK) {
        gw = plan.grid_w;
        gh = plan.grid_h;
    }
    *grid_w = gw;
    *grid_h = gh;
    /* the run's check (merge.c, io/output/polygons.c): tw_polygons_memory of the
     * regions within the room */
    size_t room = tw_budget_assembly_room(&c->bud, c->p->runtime.memory);
    size_t fixed = tw_polygons_memory(gw, gh, 0);
    return room > fixed ? (int64_t)((room - fixed) / TW_POLYGONS_REGION_BYTES) : 0;
}

/* products: [polygons]: a warning per input whose class map, a region per
 * cell at worst, may not fit what the budget leaves at assembly. */
static void polygons_check(run_ctx *c)
{
    c->polygons.n = 0;
    for (int i = 0; i < c->p->input.n_paths && c->polygons.n < TW_PREFLIGHT_MAX_WARNINGS; i++) {
        if (c->infos[i].skipped) continue;
        int gw, gh;
        int64_t fit = tw_run_polygons_fit(c, i, &gw, &gh);
        int64_t cells = (int64_t)gw * gh;
        if (cells <= fit) continue;
        char shown[TW_URL_SHOWN_MAX], more[32];
        tw_url_redact(c->p->input.paths[i], shown, sizeof shown);
        size_t worst = tw_polygons_memory(gw, gh, cells);
        size_t room = tw_budget_assembly_room(&c->bud, c->p->runtime.memory);
        snprintf(c->polygons.msg[c->polygons.n++], sizeof c->polygons.msg[0],
                 "%.160s: polygons: its class map of %d x %d cells may have up to %lld regions "
                 "and runtime.memory leaves room for %lld at assembly: a class map with more "
                 "stops the run (exit 4) after the inference; give runtime.memory about %s more "
                 "for the worst case, " TW_POLYGONS_HELP,
                 shown, gw, gh, (long long)cells, (long long)fit,
                 tw_format_bytes(worst - room, more, sizeof more));
    }
}

/* ------------------------------------------------------------------------ */
/* Preparing a run (run_internal.h): shared with validate.c.                */

tw_status tw_run_prepare_inputs(run_ctx *c, const tw_run_params *p, tw_error *err)
{
    if (p->input.n_paths <= 0)
        return tw_error_set(err, TW_ERR_CONFIG, "input.path: no input raster given");
    tw_model_file *mf = NULL;
    tw_status st = tw_preflight_weights(p->model.weights, err);
    if (st == TW_OK) st = tw_model_file_load(p->model.weights, &mf, err);
    if (st != TW_OK) return st;
    char note[TW_ERROR_MSG_MAX]; /* a bundle without a tensors checksum (an older export) */
    if (tw_model_file_notice(mf, note, sizeof note))
        tw_log_printf(tw_run_log(c), TW_LOG_NOTICE, "%s", note);
    st = tw_load_net(p, mf, &c->net, &c->seg, err);
    if (st == TW_OK) st = resolve_model(p, mf, c->net, c->seg, &c->m, err);
    tw_model_file_destroy(mf);
    if (st == TW_OK) st = check_products(p, &c->m, err);
    if (st != TW_OK) return st;

    c->infos = tw_calloc(TW_MEM_OTHER, (size_t)p->input.n_paths, sizeof(input_info));
    c->stacs = tw_calloc(TW_MEM_OTHER, (size_t)p->input.n_paths, sizeof(tw_stac *));
    c->sources = tw_calloc(TW_MEM_OTHER, (size_t)p->input.n_paths, sizeof(const char *));
    if (!c->infos || !c->stacs || !c->sources)
        return tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    /* GDAL's HTTP retries and read-ahead for this run (url.h); restored by
     * tw_run_ctx_release. */
    tw_url_settings net = tw_url_default_settings(p->input.retries, p->input.retry_delay);
    net.timeout = p->input.timeout;
    tw_url_settings_apply(&net, &c->net_saved);
    for (int i = 0; i < p->input.n_paths; i++) {
        c->sources[i] = p->input.paths[i];
        if (p->input.n_assets > 0) {
            st = tw_stac_open(p->input.paths[i], (const char(*)[TW_NAME_MAX])p->input.assets,
                              p->input.n_assets, &c->stacs[i], err);
            /* a remote item's fetch ends within input.timeout; a stop then
             * is a stop, not a bad item */
            if (st != TW_OK && stopped(c)) {
                tw_error_init(err);
                return tw_error_set(err, TW_CANCELLED, "stopped while reading the STAC item");
            }
            if (st != TW_OK) return st;
            c->sources[i] = tw_stac_path(c->stacs[i]);
        }
    }
    st = check_inputs(p, &c->m, c->sources, c->infos, c->hooks ? c->hooks->stop : NULL, err);
    /* output.stac: every input's datetime is known before the first tile */
    for (int i = 0; st == TW_OK && p->output.stac && i < p->input.n_paths; i++) {
        if (c->infos[i].skipped) continue;
        char gpath[TW_PATH_MAX + 16];
        const char *src = c->sources[i];
        if (!c->stacs[i] && tw_url_to_gdal(src, gpath, sizeof gpath, NULL) == TW_OK) src = gpath;
        st = tw_stac_run_input(p, i, src, c->stacs[i], &c->infos[i].stac, err);
    }
    return st;
}

tw_status tw_run_prepare(run_ctx *c, const tw_run_params *p, bool quiet, tw_error *err)
{
    tw_status st = tw_run_prepare_inputs(c, p, err);
    if (st == TW_OK) st = preflight(c, p, err);
    if (st != TW_OK) return st;

    tw_backend_params bp = tw_backend_default_params();
    bp.threads = p->runtime.threads;
    bp.cpu_winograd = p->runtime.cpu_winograd;
    bp.cpu_gemm = p->runtime.cpu_gemm;
    bp.cpu_nhwc = p->runtime.cpu_nhwc;
    bp.cuda_fail_above = p->runtime.cuda_fail_above;
    bp.log = quiet ? NULL : tw_run_log(c);
    /* runtime.device auto: a segmentation model runs where it can (the CPU) */
    const char *device =
        c->seg && strcmp(p->runtime.device, "auto") == 0 ? "cpu" : p->runtime.device;
    st = tw_backend_create_ex(device, &bp, &c->be, err);
    if (st != TW_OK) return st;
    c->have_be = true;
    if (c->seg && !tw_backend_segments(&c->be))
        return tw_error_set(err, TW_ERR_CONFIG,
                            "runtime.device %s: the %s backend runs no segmentation model yet "
                            "(%s is %s); use runtime.device: cpu",
                            p->runtime.device, c->be.i->name, p->model.weights, c->m.arch);

    /* Budget over the widest input: one plan for all of them. */
    int widest = 0;
    while (c->infos[widest].skipped) widest++; /* check_inputs: not all are */
    for (int i = 1; i < p->input.n_paths; i++)
        if (!c->infos[i].skipped && c->infos[i].info.width > c->infos[widest].info.width)
            widest = i;
    const tw_raster_info *wi = &c->infos[widest].info;
    tw_plan plan;
    st = tw_plan_make_cell(wi->width, wi->height, c->m.tile, c->m.stride, c->m.cell, p->tiling.edge,
                           0, 1, &plan, err);
    if (st != TW_OK) return st;
    /* values per cell: the probabilities and (embedding_raster) the features */
    int cell_values = c->m.n_classes + tw_run_cell_emb(p->output.products, c->m.feat_dim);
    /* the stitcher's or the blender's held rows, and as many rows on their
     * way to the chunks */
    size_t strip = (c->seg ? tw_blend_bytes(plan.grid_w, plan.tile, cell_values)
                           : tw_stitch_bytes(&plan, cell_values)) +
                   (size_t)plan.k * (size_t)plan.grid_w * ((size_t)cell_values * 4 + 8);
    /* embedding_raster's assembly: 16 rows of D floats per cell read back from
     * the chunks and as many in the writer's band-interleaved strip */
    strip += (size_t)16 * (size_t)plan.grid_w *
             (size_t)tw_run_cell_emb(p->output.products, c->m.feat_dim) * (4 + 4);
    tw_dtype widest_dtype = wi->dtype;
    size_t dsize = tw_dtype_size(widest_dtype);
    for (int i = 0; i < p->input.n_paths; i++)
        if (!c->infos[i].skipped && tw_dtype_size(c->infos[i].info.dtype) > dsize) {
            dsize = tw_dtype_size(c->infos[i].info.dtype);
            widest_dtype = c->infos[i].info.dtype;
        }
    tw_budget_in bin = {
        .total = p->runtime.memory,
        .base = TW_BUDGET_BASE, /* the run's own, not the host process's (budget.h) */
        .weights = c->seg ? c->seg->weight_bytes : c->net->weight_bytes,
        .weights_consumed = !c->seg && c->be.i->consumes_weights(c->be.ctx, p->runtime.precision),
        .backend = &c->be,
        .net = c->net,
        .seg = c->seg,
        .precision = p->runtime.precision,
        .tile = c->m.tile,
        .stride = c->m.stride,
        .bands = c->m.in_bands,
        .dtype = widest_dtype,
        .n_classes = c->m.n_classes,
        .feat_dim = c->m.feat_dim,
        .want_emb = (p->output.products & (TW_PRODUCT_EMB | TW_PRODUCT_EMB_RASTER)) != 0,
        .fixed_batch = p->tiling.batch,
        .max_auto_batch =
            c->seg ? TW_SEG_MAX_AUTO_BATCH : c->be.i->auto_batch(c->be.ctx, c->net, c->m.tile),
        .raster_w = wi->width,
        .block_w = wi->block_w,
        .block_h = wi->block_h,
        .strip = strip,
        .vrt = strcmp(wi->driver, "VRT") == 0,
        .readers = tw_run_readers(p, &c->be),
    };
    for (int i = 0; i < p->input.n_paths; i++) bin.mask = bin.mask || c->infos[i].mask;
    if (p->output.products & TW_PRODUCT_POLYGONS)
        bin.polygons = p->output.resolution == TW_RESOLUTION_INPUT
                           ? tw_polygons_memory(wi->width, wi->height, 0)
                           : tw_polygons_memory(plan.grid_w, plan.row_end - plan.row_begin, 0);
    st = tw_budget_plan(&bin, &c->bud, err);
    if (st == TW_OK && (p->output.products & TW_PRODUCT_POLYGONS)) polygons_check(c);
    return st;
}

tw_status tw_resolve(const tw_run_params *p, tw_resolved *m, tw_error *err)
{
    tw_model_file *mf = NULL;
    tw_resnet *net = NULL;
    tw_segnet *seg = NULL;
    tw_status st = tw_model_file_load(p->model.weights, &mf, err);
    if (st == TW_OK) st = tw_load_net(p, mf, &net, &seg, err);
    if (st == TW_OK) st = resolve_model(p, mf, net, seg, m, err);
    tw_resnet_destroy(net);
    tw_segnet_destroy(seg);
    tw_model_file_destroy(mf);
    return st;
}

tw_status tw_resolve_loaded(const tw_run_params *p, const tw_model_file *mf, const tw_resnet *net,
                            const tw_segnet *seg, tw_resolved *m, tw_error *err)
{
    return resolve_model(p, mf, net, seg, m, err);
}

tw_status tw_load_net(const tw_run_params *p, const tw_model_file *mf, tw_resnet **net,
                      tw_segnet **seg, tw_error *err)
{
    *net = NULL;
    *seg = NULL;
    if (tw_key_arch_segments(p->model.arch) || tw_segnet_detect(mf))
        return tw_segnet_create(mf, p->model.arch, seg, err);
    return tw_resnet_create(mf, p->model.arch, net, err);
}

/* products.c - an input's committed chunks into its final products: see
 * products.h */
#include "pipeline/run/products.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <gdal.h>

#include "core/products.h"
#include "io/output/gpkg.h"
#include "io/output/polygons.h"
#include "io/output/resample.h"
#include "io/output/tiletable.h"
#include "io/output/writer.h"
#include "pipeline/engine/plan.h"
#include "pipeline/store/assemble.h"

static void output_geotransform(const tw_raster_info *info, const tw_plan *pl, double gt[6])
{
    const double *g = info->geotransform;
    double S = pl->cell; /* the stride, or 1 (a segmentation model's pixels) */
    gt[0] = g[0];
    gt[1] = g[1] * S;
    gt[2] = g[2] * S;
    gt[3] = g[3];
    gt[4] = g[4] * S;
    gt[5] = g[5] * S;
}

/* The writer's params for the final products of an input: its outputs in
 * p->output.dir, named stem.*, on the plan's cell grid. Borrows every
 * pointer (m's class names, config_json). */
static void writer_params_for(const tw_run_params *p, const tw_resolved *m, const char *config_json,
                              const tw_raster_info *info, const tw_plan *plan, const char *stem,
                              tw_writer_params *wp)
{
    memset(wp, 0, sizeof *wp);
    wp->dir = p->output.dir;
    wp->stem = stem;
    wp->grid_w = plan->grid_w;
    wp->grid_h = plan->grid_h;
    wp->crs_wkt = info->crs_wkt;
    wp->n_classes = m->n_classes;
    wp->class_names = (const char(*)[TW_NAME_MAX])m->classes;
    wp->products = p->output.products;
    wp->prob_type = p->output.prob_type;
    wp->emb_dim = tw_run_cell_emb(p->output.products, m->feat_dim);
    wp->emb_type = p->output.emb_type;
    wp->format = p->output.format;
    wp->creation_options = (const char(*)[128])p->output.creation_options;
    wp->n_creation_options = p->output.n_creation_options;
    wp->metadata_json = config_json;
    if (p->model.n_colors > 0) {
        wp->colors = (const unsigned char(*)[3])p->model.colors;
        wp->n_colors = p->model.n_colors;
    }
    output_geotransform(info, plan, wp->geotransform);
}

/* What one input's assembly settles before its passes, carried from step to
 * step: the products asked for, the writer's params for the final products
 * (wp) and for the polygons' class map and confidence in the parts
 * directory (pw), the tile table's (tp) and the GeoPackage's (gp). The
 * params point into the struct's paths: it is never copied. */
typedef struct assembly {
    const tw_run_params *p;
    const tw_resolved *m;
    const tw_raster_info *info;
    tw_parts *parts;
    tw_input_result *res;
    bool rasters, table, gpkg, polys, poly_tmp;
    tw_writer_params wp, pw;
    tw_tiletable_params tp;
    tw_gpkg_params gp;
    char tpath[TW_PATH_MAX + 300], gpath[TW_PATH_MAX + 300], pdir[TW_PATH_MAX + 300];
} assembly;

static void plan_assembly(assembly *a, const char *config_json, const tw_plan *plan)
{
    const tw_run_params *p = a->p;
    const tw_resolved *m = a->m;
    tw_input_result *res = a->res;
    writer_params_for(p, m, config_json, a->info, plan, res->stem, &a->wp);
    a->rasters = (p->output.products & (TW_PRODUCT_CLASS | TW_PRODUCT_PROB | TW_PRODUCT_CONF |
                                        TW_PRODUCT_EMB_RASTER)) != 0;
    a->table = (p->output.products & (TW_PRODUCT_TILES | TW_PRODUCT_EMB)) != 0;
    snprintf(a->tpath, sizeof a->tpath, "%s/%s.tiles.h5", p->output.dir, res->stem);
    a->tp = (tw_tiletable_params){
        .path = a->tpath,
        .n_classes = m->headless ? 0 : m->n_classes, /* a stand-in head's: not written */
        .class_names = (const char(*)[TW_NAME_MAX])m->classes,
        .feat_dim = (p->output.products & TW_PRODUCT_EMB) ? m->feat_dim : 0,
        .tile = m->tile,
        .stride = m->stride,
        .crs_wkt = a->info->crs_wkt,
    };
    memcpy(a->tp.geotransform, a->info->geotransform, sizeof a->tp.geotransform);
    a->gpkg = (p->output.products & TW_PRODUCT_TILES_GPKG) != 0;
    snprintf(a->gpath, sizeof a->gpath, "%s/%s.tiles.gpkg", p->output.dir, res->stem);
    /* The GeoPackage holds the table's tiles as polygons: its grid is the table's. */
    a->gp = (tw_gpkg_params){.path = a->gpath, .tile = a->tp.tile, .crs_wkt = a->tp.crs_wkt};
    a->gp.n_classes = m->n_classes;
    a->gp.class_names = a->tp.class_names;
    memcpy(a->gp.geotransform, a->tp.geotransform, sizeof a->gp.geotransform);
    /* polygons come from the class map and the confidence on the products'
     * grid: the final files when both are asked for, else the same two
     * written into the parts directory for the purpose (removed with it) */
    const unsigned need = TW_PRODUCT_CLASS | TW_PRODUCT_CONF;
    a->polys = (p->output.products & TW_PRODUCT_POLYGONS) != 0;
    a->poly_tmp = a->polys && (p->output.products & need) != need;
    snprintf(a->pdir, sizeof a->pdir, "%s/.tilewise/%s", p->output.dir, res->stem);
    a->pw = a->wp;
    a->pw.dir = a->pdir;
    a->pw.stem = "polygons";
    a->pw.products = need;
    a->pw.format = TW_FORMAT_GTIFF;
    a->pw.creation_options = NULL;
    a->pw.n_creation_options = 0;
}

/* output.resolution: input: the cell grid's probabilities first (float32,
 * in the parts directory), then resampled onto the input's grid (source:
 * the input, whose own nodata stays nodata in every product). */
static tw_status assemble_at_input(assembly *a, const char *source, tw_error *err)
{
    const tw_run_params *p = a->p;
    tw_input_result *res = a->res;
    char cdir[TW_PATH_MAX + 300], cells[TW_PATH_MAX + 400];
    snprintf(cdir, sizeof cdir, "%s/.tilewise/%s", p->output.dir, res->stem);
    tw_writer_params cw = a->wp;
    cw.dir = cdir;
    cw.stem = "cells";
    cw.products = TW_PRODUCT_PROB;
    cw.prob_type = TW_PROB_FLOAT32;
    cw.format = TW_FORMAT_GTIFF;
    cw.creation_options = NULL;
    cw.n_creation_options = 0;
    tw_status st = tw_parts_assemble(a->parts, &cw, a->table ? &a->tp : NULL,
                                     a->gpkg ? &a->gp : NULL, res->hist, &res->nodata_cells, err);
    tw_writer_product_path(cdir, "cells", "prob", cells, sizeof cells);
    tw_writer_params iw = a->wp;
    iw.grid_w = a->info->width;
    iw.grid_h = a->info->height;
    memcpy(iw.geotransform, a->info->geotransform, sizeof iw.geotransform);
    /* the input's own nodata stays nodata in every product */
    tw_resample_input rin = {.path = source,
                             .bands = a->m->bands,
                             .n_bands = a->m->n_bands,
                             .nodata_auto = p->input.nodata_auto,
                             .nodata = p->input.nodata};
    res->valid_unclassified = 0;
    if (st == TW_OK && a->rasters)
        st = tw_resample_to_input(cells, &iw, source ? &rin : NULL, NULL, NULL,
                                  &res->valid_unclassified, err);
    if (st == TW_OK && a->poly_tmp) {
        tw_writer_params ipw = a->pw;
        ipw.grid_w = iw.grid_w;
        ipw.grid_h = iw.grid_h;
        memcpy(ipw.geotransform, iw.geotransform, sizeof ipw.geotransform);
        int64_t unclassified = 0;
        st =
            tw_resample_to_input(cells, &ipw, source ? &rin : NULL, NULL, NULL, &unclassified, err);
    }
    return st;
}

/* output.resolution: cells: one pass when the polygons' rasters are the
 * only ones, else a second over the chunks for them. */
static tw_status assemble_cells(assembly *a, tw_error *err)
{
    tw_input_result *res = a->res;
    int64_t scratch_hist[TW_MAX_CLASSES + 1], scratch_nodata = 0;
    tw_status st = tw_parts_assemble(a->parts,
                                     a->rasters    ? &a->wp
                                     : a->poly_tmp ? &a->pw
                                                   : NULL,
                                     a->table ? &a->tp : NULL, a->gpkg ? &a->gp : NULL, res->hist,
                                     &res->nodata_cells, err);
    if (st == TW_OK && a->poly_tmp && a->rasters)
        st = tw_parts_assemble(a->parts, &a->pw, NULL, NULL, scratch_hist, &scratch_nodata, err);
    return st;
}

/* The polygons product from the class map and confidence (the final files,
 * or the parts directory's), its regions within room bytes. */
static tw_status write_polygons(const assembly *a, const char *config_json, size_t room,
                                tw_error *err)
{
    const tw_run_params *p = a->p;
    char ppath[TW_PATH_MAX + 300];
    tw_polygons_path(p->output.dir, a->res->stem, p->output.vector_format, ppath, sizeof ppath);
    const char *dir = a->poly_tmp ? a->pdir : p->output.dir;
    const char *stem = a->poly_tmp ? "polygons" : a->res->stem;
    char cpath[TW_PATH_MAX + 400], fpath[TW_PATH_MAX + 400];
    tw_writer_product_path(dir, stem, "class", cpath, sizeof cpath);
    tw_writer_product_path(dir, stem, "conf", fpath, sizeof fpath);
    tw_polygons_params pp = {
        .class_path = cpath,
        .conf_path = fpath,
        .path = ppath,
        .scratch_dir = a->pdir,
        .format = p->output.vector_format,
        .n_classes = a->m->n_classes,
        .class_names = (const char(*)[TW_NAME_MAX])a->m->classes,
        .colors = a->wp.colors,
        .n_colors = a->wp.n_colors,
        .min_area = p->output.min_area,
        .simplify = p->output.simplify,
        .metadata_json = config_json,
    };
    /* the regions may take what the run's budget leaves at assembly
     * (checked before the sieve): the number validate shows, not the
     * host process's RSS */
    pp.max_bytes = room > ((size_t)1 << 20) ? room : ((size_t)1 << 20);
    return tw_polygons_write(&pp, NULL, err);
}

/* The files written into res->outputs, in core/products.h's file order. */
static void list_outputs(const tw_run_params *p, tw_input_result *res)
{
    res->n_outputs = 0;
    const tw_product *files[TW_PRODUCT_COUNT];
    int n_files = tw_product_files(files);
    unsigned wrote = tw_products_with_implied(p->output.products);
    for (int i = 0; i < n_files; i++)
        if (wrote & files[i]->bit)
            snprintf(res->outputs[res->n_outputs++], sizeof res->outputs[0], "%s/%s%s",
                     p->output.dir, res->stem,
                     tw_product_suffix(files[i], p->output.vector_format == TW_VECTOR_FGB));
}

/* The writer's GeoTIFFs are tiled in 256 x 256 blocks and filled 16 rows
 * at a time (the chunks' rows): a block that leaves GDAL's block cache
 * before its 256 rows are in is compressed and written, then appended again
 * at each later write. With the run's cache (sized for reading) a wide
 * product was rewritten up to 16 times: a 4096 x 1024 prob.tif of 4 classes
 * took 443 MB for 64 MiB of pixels, and an 8192 x 8192 one passed the
 * classic TIFF's 4 GiB (a segmentation model's per-pixel products are the
 * first this wide). The bytes one row of blocks of every raster product
 * holds, on a grid w pixels wide. */
static size_t block_row_bytes(const tw_run_params *p, const tw_resolved *m, int w)
{
    unsigned prod = p->output.products;
    size_t per = 0;
    if (prod & (TW_PRODUCT_CLASS | TW_PRODUCT_POLYGONS)) per += 1;
    if (prod & TW_PRODUCT_PROB)
        per += (size_t)m->n_classes * (p->output.prob_type == TW_PROB_UINT8 ? 1 : 4);
    if (prod & (TW_PRODUCT_CONF | TW_PRODUCT_POLYGONS)) per += 4;
    return (size_t)256 * (size_t)w * per;
}

tw_status tw_products_assemble(const tw_run_params *p, const tw_resolved *m,
                               const tw_raster_info *info, const char *source,
                               const char *config_json, size_t room, tw_parts *parts,
                               tw_input_result *res, tw_error *err)
{
    tw_plan plan;
    tw_status st = tw_plan_make_cell(info->width, info->height, m->tile, m->stride, m->cell,
                                     p->tiling.edge, 0, 1, &plan, err);
    if (st != TW_OK) return st;
    assembly as = {.p = p, .m = m, .info = info, .parts = parts, .res = res};
    assembly *a = &as;
    plan_assembly(a, config_json, &plan);
    memset(res->hist, 0, sizeof res->hist);
    res->nodata_cells = 0; /* assembly counts every cell again; the stitcher already did */
    /* (a segmentation model's cells are the input's pixels already) */
    bool at_input =
        (a->rasters || a->polys) && p->output.resolution == TW_RESOLUTION_INPUT && !m->segmentation;
    /* GDAL's cache holds a row of blocks while they fill (block_row_bytes),
     * within what the budget leaves at assembly; as it was afterwards */
    const GIntBig cache = GDALGetCacheMax64();
    size_t want = block_row_bytes(p, m, at_input ? info->width : plan.grid_w);
    want += want / 4 + ((size_t)4 << 20);
    if ((GIntBig)want > cache && want - (size_t)cache <= room) GDALSetCacheMax64((GIntBig)want);
    st = at_input ? assemble_at_input(a, source, err) : assemble_cells(a, err);
    GDALSetCacheMax64(cache);
    if (st == TW_OK && a->polys) st = write_polygons(a, config_json, room, err);
    if (st == TW_OK) st = tw_parts_remove(parts, err);
    if (st != TW_OK) return st;
    /* embedding_raster alone (a headless backbone's stand-in head
     * included): no class was asked, none is counted */
    if ((p->output.products & ~(unsigned)TW_PRODUCT_EMB_RASTER) == 0)
        memset(res->hist, 0, sizeof res->hist);
    list_outputs(p, res);
    return TW_OK;
}

int tw_products_suffixes(const char **suffixes, bool stac)
{
    const tw_product *files[TW_PRODUCT_COUNT];
    int n_files = tw_product_files(files), n = 0;
    for (int i = 0; i < n_files; i++) {
        suffixes[n++] = files[i]->suffix;
        if (files[i]->suffix_fgb) suffixes[n++] = files[i]->suffix_fgb;
    }
    if (stac) suffixes[n++] = ".stac.json";
    return n;
}

int tw_products_stale(const tw_run_params *p, tw_input_result *res)
{
    const char *suffixes[TW_PRODUCT_SUFFIXES_MAX];
    int n_suffixes = tw_products_suffixes(suffixes, true);
    const int cap = (int)(sizeof res->stale / sizeof res->stale[0]);
    res->n_stale = 0;
    for (int k = 0; k < n_suffixes && res->n_stale < cap; k++) {
        char path[sizeof res->stale[0]];
        struct stat sb;
        if (snprintf(path, sizeof path, "%s/%s%s", p->output.dir, res->stem, suffixes[k]) >=
                (int)sizeof path ||
            stat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
            continue;
        bool written = false;
        for (int o = 0; o < res->n_outputs && !written; o++)
            written = strcmp(res->outputs[o], path) == 0;
        if (!written) memcpy(res->stale[res->n_stale++], path, sizeof path);
    }
    return res->n_stale;
}

/* writer.c - see writer.h
 *
 * Each product is one GTiff dataset created under ".<name>.part" in the output
 * directory. Strips arrive in raster order; each is converted into a strip
 * buffer in the product's pixel type and written with one GDALDatasetRasterIO
 * call. Band statistics are accumulated while writing, so finish never has to
 * read the rasters back. GDAL reports failures (ENOSPC, I/O errors) through
 * its error handler rather than through every return value, so each public
 * function pushes a handler that records the first failure into the writer
 * and checks it after the calls whose results GDAL does not return.
 */
#include "io/output/writer.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cpl_conv.h>
#include <cpl_error.h>
#include <cpl_string.h>
#include <gdal.h>
#include <gdal_utils.h>

#include "core/alloc.h"
#include "core/argmax.h"
#include "core/fileio.h"
#include "io/gdal_msgs.h"

/* The raster products (core/products.h's TW_PRODUCT_RASTER rows) this writer
 * has the code for; their names, bands and pixels are the table's. */
enum { TW_WP_CLASS = 0, TW_WP_PROB, TW_WP_CONF, TW_WP_EMB, TW_WP_COUNT };
static const unsigned k_product_bits[TW_WP_COUNT] = {TW_PRODUCT_CLASS, TW_PRODUCT_PROB,
                                                     TW_PRODUCT_CONF, TW_PRODUCT_EMB_RASTER};

#define TW_EMB_INT8_NODATA (-128)

#define TW_CLASS_NODATA 255
#define TW_FLOAT_NODATA (-1.0)

typedef struct tw_band_stats {
    double min, max, sum, sumsq;
    uint64_t n;
} tw_band_stats;

typedef struct tw_writer_file {
    bool active;
    GDALDatasetH ds;
    GDALDataType type;
    int n_bands;
    bool cog_made; /* cog_path exists and must be cleaned up */
    char final_path[TW_PATH_MAX];
    char part_path[TW_PATH_MAX]; /* GTiff being written */
    char cog_path[TW_PATH_MAX];  /* COG copy made at finish */
    tw_band_stats *stats;        /* [n_bands] */
    void *buf;                   /* strip buffer, pixel-interleaved [rows][w][bands] */
} tw_writer_file;

struct tw_writer {
    int grid_w, grid_h, n_classes;
    int emb_dim; /* features after each cell's probabilities (0: none) */
    tw_emb_type emb_type;
    double *emb_scale; /* int8: own copies [emb_dim] */
    double *emb_offset;
    tw_prob_type prob_type;
    tw_format format;
    char (*class_names)[TW_NAME_MAX]; /* own copy [n_classes] */
    char **cog_options;               /* CSL: COG driver options (user's merged in) */
    unsigned char (*colors)[3];       /* [n_colors] class colours, or NULL */
    int n_colors;
    bool default_compress; /* the user named no COMPRESS: ours, with a predictor */
    bool user_photometric; /* the user named PHOTOMETRIC */
    tw_writer_file files[TW_WP_COUNT];
    uint8_t *mask_buf; /* uint8 probabilities: per-dataset validity mask */
    int cap_rows;      /* rows the strip buffers hold */
    int next_row;
    bool finished;
    /* GDAL messages seen while our handler was pushed. */
    tw_gdal_msgs gdal; /* io/gdal_msgs.h */
};

/* ---- GDAL message routing ---- */

static void writer_gdal_begin(tw_writer *w)
{
    tw_gdal_capture_begin(&w->gdal);
}

static void writer_gdal_end(void)
{
    tw_gdal_capture_end();
}

static const char *writer_gdal_msg(const tw_writer *w)
{
    return w->gdal.failure[0] ? w->gdal.failure : "unknown GDAL error";
}

/* ---- small helpers ---- */

void tw_writer_product_path(const char *dir, const char *stem, const char *product, char *out,
                            size_t out_size)
{
    snprintf(out, out_size, "%s/%s.%s.tif", dir, stem, product);
}

/* snprintf into a path buffer; false when it did not fit. */
static bool path_printf(char *out, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static bool path_printf(char *out, size_t size, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, size, fmt, ap);
    va_end(ap);
    return n >= 0 && (size_t)n < size;
}

static void remove_file_and_sidecars(const char *path)
{
    char side[TW_PATH_MAX + 16];
    if (!path[0]) return;
    (void)unlink(path);
    snprintf(side, sizeof side, "%s.aux.xml", path);
    (void)unlink(side);
    snprintf(side, sizeof side, "%s.msk", path);
    (void)unlink(side);
}

/* Rename src (and its .aux.xml sidecar, which carries category names and
 * descriptions GTiff keeps outside the file) to dst. The sidecar goes first
 * so that the main file only appears with its legend already in place. */
static tw_status rename_with_sidecar(const char *src, const char *dst, tw_error *err)
{
    char src_aux[TW_PATH_MAX + 16], dst_aux[TW_PATH_MAX + 16];
    snprintf(src_aux, sizeof src_aux, "%s.aux.xml", src);
    snprintf(dst_aux, sizeof dst_aux, "%s.aux.xml", dst);
    if (access(src_aux, F_OK) == 0) {
        tw_status st = tw_fsync_path(src_aux, false, err);
        if (st != TW_OK) return st;
        if (rename(src_aux, dst_aux) != 0)
            return tw_error_set(err, TW_ERR_OUTPUT, "cannot rename %s to %s: %s", src_aux, dst_aux,
                                strerror(errno));
    } else {
        /* A stale sidecar from an earlier run would contradict the new file. */
        (void)unlink(dst_aux);
    }
    tw_status st = tw_fsync_path(src, false, err);
    if (st != TW_OK) return st;
    if (rename(src, dst) != 0)
        return tw_error_set(err, TW_ERR_OUTPUT, "cannot rename %s to %s: %s", src, dst,
                            strerror(errno));
    return TW_OK;
}

/* Merge "KEY=VALUE" user options over the defaults in *list (user's win). */
static tw_status merge_options(char ***list, const char (*opts)[128], int n, tw_error *err)
{
    for (int i = 0; i < n; i++) {
        char key[128];
        const char *eq = strchr(opts[i], '=');
        size_t klen = eq ? (size_t)(eq - opts[i]) : 0;
        if (!eq || klen == 0 || klen >= sizeof key)
            return tw_error_set(err, TW_ERR_CONFIG,
                                "output.creation_options: '%.127s' is not KEY=VALUE", opts[i]);
        memcpy(key, opts[i], klen);
        key[klen] = '\0';
        *list = CSLSetNameValue(*list, key, eq + 1);
    }
    return TW_OK;
}

/* GDAL only warns about unknown or malformed creation options and then
 * ignores them; a user who asked for COMPRESS=ZSTDX should hear about it. */
static tw_status validate_options(tw_writer *w, const char *driver, char **opts, tw_error *err)
{
    GDALDriverH drv = GDALGetDriverByName(driver);
    if (!drv) return tw_error_set(err, TW_ERR_INTERNAL, "GDAL has no %s driver", driver);
    w->gdal.first_warning[0] = '\0';
    if (!GDALValidateCreationOptions(drv, opts))
        return tw_error_set(err, TW_ERR_CONFIG, "output.creation_options (format %s): %s", driver,
                            w->gdal.first_warning[0] ? w->gdal.first_warning : "invalid option");
    return TW_OK;
}

/* A fixed, readable palette: 12 hand-picked qualitative colours, then colours
 * spread around the hue circle by the golden angle with alternating
 * saturation/value so that neighbouring class ids stay distinguishable. */
static void class_color_builtin(int i, GDALColorEntry *c);

static void class_color(const tw_writer *w, int i, GDALColorEntry *c)
{
    if (w->colors && i < w->n_colors) {
        c->c1 = w->colors[i][0];
        c->c2 = w->colors[i][1];
        c->c3 = w->colors[i][2];
        c->c4 = 255;
        return;
    }
    class_color_builtin(i, c);
}

void tw_writer_class_rgb(const unsigned char (*colors)[3], int n_colors, int i,
                         unsigned char rgb[3])
{
    if (colors && i < n_colors) {
        memcpy(rgb, colors[i], 3);
        return;
    }
    GDALColorEntry c;
    class_color_builtin(i, &c);
    rgb[0] = (unsigned char)c.c1;
    rgb[1] = (unsigned char)c.c2;
    rgb[2] = (unsigned char)c.c3;
}

static void class_color_builtin(int i, GDALColorEntry *c)
{
    static const short base[12][3] = {
        {0, 114, 189},   {34, 139, 34},  {230, 159, 0},   {204, 37, 41},
        {148, 103, 189}, {140, 86, 75},  {227, 119, 194}, {127, 127, 127},
        {188, 189, 34},  {23, 190, 207}, {255, 221, 51},  {0, 68, 27},
    };
    c->c4 = 255;
    if (i < 12) {
        c->c1 = base[i][0];
        c->c2 = base[i][1];
        c->c3 = base[i][2];
        return;
    }
    double h = fmod(i * 0.6180339887498949, 1.0) * 6.0;
    double s = (i % 2) ? 0.55 : 0.85;
    double v = (i % 3 == 0) ? 0.65 : 0.92;
    int sector = (int)h;
    double f = h - sector;
    double p = v * (1 - s), q = v * (1 - s * f), t = v * (1 - s * (1 - f));
    double r, g, b;
    switch (sector % 6) {
    case 0: r = v, g = t, b = p; break;
    case 1: r = q, g = v, b = p; break;
    case 2: r = p, g = v, b = t; break;
    case 3: r = p, g = q, b = v; break;
    case 4: r = t, g = p, b = v; break;
    default: r = v, g = p, b = q; break;
    }
    c->c1 = (short)lrint(255 * r);
    c->c2 = (short)lrint(255 * g);
    c->c3 = (short)lrint(255 * b);
}

/* ---- create ---- */

static tw_status set_band_common(tw_writer *w, tw_writer_file *f, int b, const char *desc,
                                 tw_error *err)
{
    GDALRasterBandH band = GDALGetRasterBand(f->ds, b);
    if (!band)
        return tw_error_set(err, TW_ERR_OUTPUT, "%s: band %d missing after create: %s",
                            f->part_path, b, writer_gdal_msg(w));
    GDALSetDescription(band, desc);
    if (f == &w->files[TW_WP_EMB]) {
        double nd = w->emb_type == TW_EMB_INT8 ? TW_EMB_INT8_NODATA : NAN;
        if (GDALSetRasterNoDataValue(band, nd) != CE_None)
            return tw_error_set(err, TW_ERR_OUTPUT, "%s: cannot set nodata: %s", f->part_path,
                                writer_gdal_msg(w));
        if (w->emb_type == TW_EMB_INT8 &&
            (GDALSetRasterScale(band, w->emb_scale[b - 1]) != CE_None ||
             GDALSetRasterOffset(band, w->emb_offset[b - 1]) != CE_None))
            return tw_error_set(err, TW_ERR_OUTPUT, "%s: cannot set scale/offset: %s", f->part_path,
                                writer_gdal_msg(w));
    } else if (f->type == GDT_Byte && f != &w->files[TW_WP_PROB]) {
        if (GDALSetRasterNoDataValue(band, TW_CLASS_NODATA) != CE_None)
            return tw_error_set(err, TW_ERR_OUTPUT, "%s: cannot set nodata: %s", f->part_path,
                                writer_gdal_msg(w));
    } else if (f->type == GDT_Float32) {
        if (GDALSetRasterNoDataValue(band, TW_FLOAT_NODATA) != CE_None)
            return tw_error_set(err, TW_ERR_OUTPUT, "%s: cannot set nodata: %s", f->part_path,
                                writer_gdal_msg(w));
    }
    return TW_OK;
}

static tw_status set_class_legend(tw_writer *w, tw_writer_file *f, tw_error *err)
{
    GDALRasterBandH band = GDALGetRasterBand(f->ds, 1);
    GDALColorTableH ct = GDALCreateColorTable(GPI_RGB);
    if (!ct) return tw_error_set(err, TW_ERR_OUTPUT, "%s: cannot create color table", f->part_path);
    for (int i = 0; i < w->n_classes; i++) {
        GDALColorEntry c;
        class_color(w, i, &c);
        GDALSetColorEntry(ct, i, &c);
    }
    CPLErr e = GDALSetRasterColorTable(band, ct);
    GDALDestroyColorTable(ct);
    if (e != CE_None)
        return tw_error_set(err, TW_ERR_OUTPUT, "%s: cannot set color table: %s", f->part_path,
                            writer_gdal_msg(w));
    char *names[TW_MAX_CLASSES + 1];
    for (int i = 0; i < w->n_classes; i++) names[i] = w->class_names[i];
    names[w->n_classes] = NULL;
    if (GDALSetRasterCategoryNames(band, names) != CE_None)
        return tw_error_set(err, TW_ERR_OUTPUT, "%s: cannot set category names: %s", f->part_path,
                            writer_gdal_msg(w));
    return TW_OK;
}

static tw_status create_mask(tw_writer *w, tw_writer_file *f, tw_error *err)
{
    /* Without this, GDAL 3.6 writes the mask to a ".msk" sidecar that the
     * rename would leave behind. */
    const char *old = CPLGetThreadLocalConfigOption("GDAL_TIFF_INTERNAL_MASK", NULL);
    char *saved = old ? CPLStrdup(old) : NULL;
    CPLSetThreadLocalConfigOption("GDAL_TIFF_INTERNAL_MASK", "YES");
    CPLErr e = GDALCreateDatasetMaskBand(f->ds, GMF_PER_DATASET);
    CPLSetThreadLocalConfigOption("GDAL_TIFF_INTERNAL_MASK", saved);
    CPLFree(saved);
    if (e != CE_None)
        return tw_error_set(err, TW_ERR_OUTPUT, "%s: cannot create mask band: %s", f->part_path,
                            writer_gdal_msg(w));
    return TW_OK;
}

static tw_status create_file(tw_writer *w, const tw_writer_params *p, int which,
                             char **gtiff_options, tw_error *err)
{
    tw_writer_file *f = &w->files[which];
    GDALDriverH drv = GDALGetDriverByName("GTiff");
    if (!drv) return tw_error_set(err, TW_ERR_INTERNAL, "GDAL has no GTiff driver");
    /* A crashed earlier run may have left temporaries; their sidecars would
     * otherwise be picked up as ours. */
    remove_file_and_sidecars(f->part_path);
    remove_file_and_sidecars(f->cog_path);
    char **opts = CSLDuplicate(gtiff_options);
    bool emb = which == TW_WP_EMB;
    if (w->default_compress && w->format != TW_FORMAT_COG)
        opts = CSLSetNameValue(
            opts, "PREDICTOR",
            f->type == GDT_Float32 && !(emb && w->emb_type == TW_EMB_FLOAT16) ? "3" : "2");
    if (emb) {
        /* writer.h: one feature per block, blocks completed by each strip */
        if (!CSLFetchNameValue(opts, "INTERLEAVE"))
            opts = CSLSetNameValue(opts, "INTERLEAVE", "BAND");
        if (!CSLFetchNameValue(opts, "BLOCKYSIZE"))
            opts = CSLSetNameValue(opts, "BLOCKYSIZE", "16");
        if (!CSLFetchNameValue(opts, "BLOCKXSIZE"))
            opts = CSLSetNameValue(opts, "BLOCKXSIZE", "256");
        if (w->emb_type == TW_EMB_FLOAT16) opts = CSLSetNameValue(opts, "NBITS", "16");
        if (w->emb_type == TW_EMB_INT8) opts = CSLSetNameValue(opts, "PIXELTYPE", "SIGNEDBYTE");
    }
    /* Several Byte bands would be tagged Red, Green, Blue by default. */
    if (!w->user_photometric && f->n_bands > 1)
        opts = CSLSetNameValue(opts, "PHOTOMETRIC", "MINISBLACK");
    f->ds = GDALCreate(drv, f->part_path, w->grid_w, w->grid_h, f->n_bands, f->type, opts);
    CSLDestroy(opts);
    if (!f->ds)
        return tw_error_set(err, TW_ERR_OUTPUT, "cannot create %s: %s", f->part_path,
                            writer_gdal_msg(w));
    double gt[6];
    memcpy(gt, p->geotransform, sizeof gt);
    if (GDALSetGeoTransform(f->ds, gt) != CE_None)
        return tw_error_set(err, TW_ERR_OUTPUT, "%s: cannot set geotransform: %s", f->part_path,
                            writer_gdal_msg(w));
    if (p->crs_wkt && p->crs_wkt[0] && GDALSetProjection(f->ds, p->crs_wkt) != CE_None)
        return tw_error_set(err, TW_ERR_OUTPUT, "%s: cannot set CRS: %s", f->part_path,
                            writer_gdal_msg(w));
    if (p->metadata_json &&
        GDALSetMetadataItem(f->ds, "TILEWISE_RUN", p->metadata_json, NULL) != CE_None)
        return tw_error_set(err, TW_ERR_OUTPUT, "%s: cannot set metadata: %s", f->part_path,
                            writer_gdal_msg(w));

    tw_status st = TW_OK;
    if (which == TW_WP_CLASS) {
        st = set_band_common(w, f, 1, "class", err);
        if (st == TW_OK) st = set_class_legend(w, f, err);
    } else if (which == TW_WP_CONF) {
        st = set_band_common(w, f, 1, "confidence", err);
    } else if (emb) {
        for (int b = 1; b <= f->n_bands && st == TW_OK; b++) {
            char desc[32];
            snprintf(desc, sizeof desc, "emb_%d", b - 1);
            st = set_band_common(w, f, b, desc, err);
            if (st == TW_OK && f->n_bands > 1)
                GDALSetRasterColorInterpretation(GDALGetRasterBand(f->ds, b), GCI_Undefined);
        }
    } else {
        for (int b = 1; b <= f->n_bands && st == TW_OK; b++) {
            st = set_band_common(w, f, b, w->class_names[b - 1], err);
            if (st == TW_OK && f->n_bands > 1)
                GDALSetRasterColorInterpretation(GDALGetRasterBand(f->ds, b), GCI_Undefined);
        }
        if (st == TW_OK && f->type == GDT_Byte) st = create_mask(w, f, err);
    }
    if (st != TW_OK) return st;
    if (w->gdal.failures) /* a setter that reported through the handler only */
        return tw_error_set(err, TW_ERR_OUTPUT, "%s: %s", f->part_path, writer_gdal_msg(w));
    return TW_OK;
}

static tw_status check_dir(const tw_writer_params *p, tw_error *err)
{
    struct stat st;
    if (!p->dir || !p->dir[0])
        return tw_error_set(err, TW_ERR_OUTPUT, "output directory is not set");
    if (stat(p->dir, &st) != 0)
        return tw_error_set(err, TW_ERR_OUTPUT, "output directory %s: %s", p->dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return tw_error_set(err, TW_ERR_OUTPUT, "output directory %s is not a directory", p->dir);
    if (access(p->dir, W_OK | X_OK) != 0)
        return tw_error_set(err, TW_ERR_OUTPUT, "output directory %s is not writable: %s", p->dir,
                            strerror(errno));
    return TW_OK;
}

static tw_status writer_create(tw_writer *w, const tw_writer_params *p, tw_error *err)
{
    tw_status st = check_dir(p, err);
    if (st != TW_OK) return st;

    size_t name_bytes = (size_t)w->n_classes * TW_NAME_MAX;
    w->class_names = tw_alloc(TW_MEM_OTHER, name_bytes);
    if (!w->class_names)
        return tw_error_set(err, TW_ERR_NOMEM, "writer: cannot allocate %zu bytes", name_bytes);
    for (int i = 0; i < w->n_classes; i++) {
        if (p->class_names && p->class_names[i][0])
            snprintf(w->class_names[i], TW_NAME_MAX, "%s", p->class_names[i]);
        else
            snprintf(w->class_names[i], TW_NAME_MAX, "class_%d", i);
    }

    if (p->colors && p->n_colors > 0) {
        w->colors = tw_alloc(TW_MEM_OTHER, (size_t)p->n_colors * 3);
        if (!w->colors) return tw_error_set(err, TW_ERR_NOMEM, "writer: out of memory");
        memcpy(w->colors, p->colors, (size_t)p->n_colors * 3);
        w->n_colors = p->n_colors;
    }
    w->default_compress = true;
    for (int i = 0; i < p->n_creation_options; i++) {
        if (strncasecmp(p->creation_options[i], "COMPRESS=", 9) == 0) w->default_compress = false;
        if (strncasecmp(p->creation_options[i], "PHOTOMETRIC=", 12) == 0)
            w->user_photometric = true;
    }
    char **gtiff = NULL;
    if (w->format == TW_FORMAT_COG) {
        /* The intermediate only has to be cheap to write and re-read; the
         * user's options apply to the COG that users see. */
        gtiff = CSLSetNameValue(gtiff, "TILED", "YES");
        gtiff = CSLSetNameValue(gtiff, "BIGTIFF", "IF_SAFER");
        gtiff = CSLSetNameValue(gtiff, "COMPRESS", "LZW");
        w->cog_options = CSLSetNameValue(w->cog_options, "BIGTIFF", "IF_SAFER");
        if (w->default_compress) {
            w->cog_options =
                CSLSetNameValue(w->cog_options, "COMPRESS", TW_WRITER_DEFAULT_COMPRESS);
            w->cog_options = CSLSetNameValue(w->cog_options, "PREDICTOR", "YES");
        }
        st = merge_options(&w->cog_options, p->creation_options, p->n_creation_options, err);
        if (st == TW_OK) st = validate_options(w, "COG", w->cog_options, err);
    } else {
        gtiff = CSLSetNameValue(gtiff, "TILED", "YES");
        gtiff = CSLSetNameValue(gtiff, "BIGTIFF", "IF_SAFER");
        if (w->default_compress)
            gtiff = CSLSetNameValue(gtiff, "COMPRESS", TW_WRITER_DEFAULT_COMPRESS);
        st = merge_options(&gtiff, p->creation_options, p->n_creation_options, err);
        if (st == TW_OK) st = validate_options(w, "GTiff", gtiff, err);
    }

    for (int i = 0; i < TW_WP_COUNT && st == TW_OK; i++) {
        tw_writer_file *f = &w->files[i];
        const tw_product *row = tw_product_of(k_product_bits[i]);
        if (!(p->products & row->bit)) continue;
        f->n_bands = row->bands == TW_BANDS_CLASSES    ? w->n_classes
                     : row->bands == TW_BANDS_FEATURES ? w->emb_dim
                                                       : 1;
        f->type = GDT_Float32;
        if (row->pixels == TW_PIXELS_BYTE ||
            (row->pixels == TW_PIXELS_PROB_TYPE && w->prob_type == TW_PROB_UINT8) ||
            (row->pixels == TW_PIXELS_EMBED_TYPE && w->emb_type == TW_EMB_INT8))
            f->type = GDT_Byte;
        char name[TW_PATH_MAX];
        if (!path_printf(name, sizeof name, "%s%s", p->stem, row->suffix) ||
            !path_printf(f->final_path, sizeof f->final_path, "%s/%s", p->dir, name) ||
            !path_printf(f->part_path, sizeof f->part_path, "%s/.%s.part", p->dir, name) ||
            !path_printf(f->cog_path, sizeof f->cog_path, "%s/.%s.cog.part", p->dir, name)) {
            /* Truncated names must never reach unlink() in destroy. */
            f->final_path[0] = f->part_path[0] = f->cog_path[0] = '\0';
            st = tw_error_set(err, TW_ERR_OUTPUT, "output path too long: %s/%s%s", p->dir, p->stem,
                              row->suffix);
            break;
        }
        f->active = true;
        struct stat sb;
        if (stat(f->final_path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
            st = tw_error_set(err, TW_ERR_OUTPUT, "output %s exists and is a directory",
                              f->final_path);
            break;
        }
        f->stats = tw_calloc(TW_MEM_OTHER, (size_t)f->n_bands, sizeof *f->stats);
        if (!f->stats) {
            st = tw_error_set(err, TW_ERR_NOMEM, "writer: cannot allocate band statistics");
            break;
        }
        for (int b = 0; b < f->n_bands; b++) {
            f->stats[b].min = INFINITY;
            f->stats[b].max = -INFINITY;
        }
        st = create_file(w, p, i, gtiff, err);
    }
    CSLDestroy(gtiff);
    return st;
}

tw_status tw_writer_create(const tw_writer_params *p, tw_writer **out, tw_error *err)
{
    *out = NULL;
    if (p->grid_w <= 0 || p->grid_h <= 0)
        return tw_error_set(err, TW_ERR_INTERNAL, "writer: empty output grid %dx%d", p->grid_w,
                            p->grid_h);
    if (p->n_classes < 1 || p->n_classes > TW_MAX_CLASSES)
        return tw_error_set(err, TW_ERR_INTERNAL, "writer: %d classes (1..%d supported)",
                            p->n_classes, TW_MAX_CLASSES);
    if (!p->stem || !p->stem[0] || strchr(p->stem, '/'))
        return tw_error_set(err, TW_ERR_INTERNAL, "writer: bad output stem '%s'",
                            p->stem ? p->stem : "(null)");

    tw_writer *w = tw_calloc(TW_MEM_OTHER, 1, sizeof *w);
    if (!w) return tw_error_set(err, TW_ERR_NOMEM, "writer: out of memory");
    w->grid_w = p->grid_w;
    w->grid_h = p->grid_h;
    w->n_classes = p->n_classes;
    w->prob_type = p->prob_type;
    w->format = p->format;
    w->emb_dim = (p->products & TW_PRODUCT_EMB_RASTER) ? p->emb_dim : 0;
    w->emb_type = p->emb_type;
    if ((p->products & TW_PRODUCT_EMB_RASTER) && p->emb_dim < 1) {
        tw_free(w);
        return tw_error_set(err, TW_ERR_INTERNAL, "writer: embedding raster without features");
    }
    if (w->emb_dim > 0 && w->emb_type == TW_EMB_INT8) {
        w->emb_scale = tw_alloc(TW_MEM_OTHER, sizeof(double) * (size_t)w->emb_dim);
        w->emb_offset = tw_alloc(TW_MEM_OTHER, sizeof(double) * (size_t)w->emb_dim);
        if (!w->emb_scale || !w->emb_offset) {
            tw_writer_destroy(w);
            return tw_error_set(err, TW_ERR_NOMEM, "writer: out of memory");
        }
        for (int b = 0; b < w->emb_dim; b++) {
            w->emb_scale[b] = p->emb_scale ? p->emb_scale[b] : 1.0;
            w->emb_offset[b] = p->emb_offset ? p->emb_offset[b] : 0.0;
        }
    }

    if (!GDALGetDriverByName("GTiff")) GDALAllRegister();
    writer_gdal_begin(w);
    tw_status st = writer_create(w, p, err);
    writer_gdal_end();
    if (st != TW_OK) {
        tw_writer_destroy(w);
        return st;
    }
    *out = w;
    return TW_OK;
}

/* ---- write ---- */

static void stats_add(tw_band_stats *s, double v)
{
    if (v < s->min) s->min = v;
    if (v > s->max) s->max = v;
    s->sum += v;
    s->sumsq += v * v;
    s->n++;
}

static tw_status ensure_buffers(tw_writer *w, int n_rows, tw_error *err)
{
    if (n_rows <= w->cap_rows) return TW_OK;
    size_t cells = (size_t)n_rows * (size_t)w->grid_w;
    for (int i = 0; i < TW_WP_COUNT; i++) {
        tw_writer_file *f = &w->files[i];
        if (!f->active) continue;
        size_t bytes = cells * (size_t)f->n_bands * (size_t)GDALGetDataTypeSizeBytes(f->type);
        tw_free(f->buf);
        f->buf = tw_alloc(TW_MEM_STRIP, bytes);
        if (!f->buf) {
            w->cap_rows = 0;
            return tw_error_set(err, TW_ERR_NOMEM,
                                "writer: cannot allocate a %zu-byte strip buffer for %s", bytes,
                                f->final_path);
        }
    }
    if (w->files[TW_WP_PROB].active && w->prob_type == TW_PROB_UINT8) {
        tw_free(w->mask_buf);
        w->mask_buf = tw_alloc(TW_MEM_STRIP, cells);
        if (!w->mask_buf) {
            w->cap_rows = 0;
            return tw_error_set(err, TW_ERR_NOMEM, "writer: cannot allocate a %zu-byte mask",
                                cells);
        }
    }
    w->cap_rows = n_rows;
    return TW_OK;
}

/* Convert one strip into every product's buffer, updating the statistics. */
static void fill_emb(tw_writer *w, size_t cells, const float *probs, const uint8_t *has)
{
    tw_writer_file *fe = &w->files[TW_WP_EMB];
    const size_t K = (size_t)w->n_classes, E = (size_t)w->emb_dim, V = K + E;
    /* band-interleaved buffer: [E][cells] */
    for (size_t b = 0; b < E; b++) {
        tw_band_stats *st = &fe->stats[b];
        if (w->emb_type == TW_EMB_INT8) {
            int8_t *dst = (int8_t *)fe->buf + b * cells;
            const double sc = w->emb_scale[b], off = w->emb_offset[b];
            for (size_t c = 0; c < cells; c++) {
                if (!has[c]) {
                    dst[c] = TW_EMB_INT8_NODATA;
                    continue;
                }
                double q = nearbyint(((double)probs[c * V + K + b] - off) / sc);
                q = !(q > -127) ? -127 : q > 127 ? 127 : q; /* NaN to -127, never nodata */
                dst[c] = (int8_t)q;
                stats_add(st, q);
            }
        } else {
            float *dst = (float *)fe->buf + b * cells;
            for (size_t c = 0; c < cells; c++) {
                if (!has[c]) {
                    dst[c] = NAN;
                    continue;
                }
                float v = probs[c * V + K + b];
                if (w->emb_type == TW_EMB_FLOAT16) {
                    /* beyond the largest half GDAL fails the write (+-inf with
                     * an error): clamped (writer.h); the statistics get the
                     * value stored */
                    v = v > 65504.0f ? 65504.0f : v < -65504.0f ? -65504.0f : v;
                    _Float16 h = (_Float16)v;
                    dst[c] = v;
                    v = (float)h;
                } else {
                    dst[c] = v;
                }
                stats_add(st, v);
            }
        }
    }
}

static void fill_buffers(tw_writer *w, int n_rows, const float *probs, const uint8_t *has)
{
    const int k = w->n_classes;
    const size_t v = (size_t)k + (size_t)w->emb_dim; /* values per cell */
    const size_t cells = (size_t)n_rows * (size_t)w->grid_w;
    tw_writer_file *fc = w->files[TW_WP_CLASS].active ? &w->files[TW_WP_CLASS] : NULL;
    tw_writer_file *fp = w->files[TW_WP_PROB].active ? &w->files[TW_WP_PROB] : NULL;
    tw_writer_file *ff = w->files[TW_WP_CONF].active ? &w->files[TW_WP_CONF] : NULL;
    const bool prob_u8 = w->prob_type == TW_PROB_UINT8;

    if (w->files[TW_WP_EMB].active) fill_emb(w, cells, probs, has);
    for (size_t c = 0; c < cells; c++) {
        const float *pc = probs + c * v;
        if (!has[c]) {
            if (fc) ((uint8_t *)fc->buf)[c] = TW_CLASS_NODATA;
            if (ff) ((float *)ff->buf)[c] = (float)TW_FLOAT_NODATA;
            if (fp && prob_u8) {
                memset((uint8_t *)fp->buf + c * (size_t)k, 0, (size_t)k);
                w->mask_buf[c] = 0;
            } else if (fp) {
                float *dst = (float *)fp->buf + c * (size_t)k;
                for (int j = 0; j < k; j++) dst[j] = (float)TW_FLOAT_NODATA;
            }
            continue;
        }
        int best = tw_argmax(pc, (size_t)k); /* the lowest class index on ties */
        if (fc) {
            ((uint8_t *)fc->buf)[c] = (uint8_t)best;
            stats_add(&fc->stats[0], best);
        }
        if (ff) {
            ((float *)ff->buf)[c] = pc[best];
            stats_add(&ff->stats[0], pc[best]);
        }
        if (fp && prob_u8) {
            uint8_t *dst = (uint8_t *)fp->buf + c * (size_t)k;
            for (int j = 0; j < k; j++) {
                /* Written so that NaN maps to 0 too. */
                float v = !(pc[j] > 0) ? 0.0f : pc[j] > 1 ? 1.0f : pc[j];
                dst[j] = (uint8_t)lrintf(255.0f * v);
                stats_add(&fp->stats[j], dst[j]);
            }
            w->mask_buf[c] = 255;
        } else if (fp) {
            float *dst = (float *)fp->buf + c * (size_t)k;
            for (int j = 0; j < k; j++) {
                dst[j] = pc[j];
                stats_add(&fp->stats[j], pc[j]);
            }
        }
    }
}

static tw_status writer_write_rows(tw_writer *w, int row0, int n_rows, const float *probs,
                                   const uint8_t *has, tw_error *err)
{
    if (w->finished) return tw_error_set(err, TW_ERR_INTERNAL, "writer: write after finish");
    if (row0 != w->next_row || n_rows <= 0 || n_rows > w->grid_h - row0)
        return tw_error_set(err, TW_ERR_INTERNAL,
                            "writer: rows %d..%d out of order (next row %d of %d)", row0,
                            row0 + n_rows - 1, w->next_row, w->grid_h);
    tw_status st = ensure_buffers(w, n_rows, err);
    if (st != TW_OK) return st;
    fill_buffers(w, n_rows, probs, has);

    for (int i = 0; i < TW_WP_COUNT; i++) {
        tw_writer_file *f = &w->files[i];
        if (!f->active) continue;
        int sz = GDALGetDataTypeSizeBytes(f->type);
        GSpacing pixel = (GSpacing)sz * f->n_bands;
        GSpacing line = pixel * w->grid_w;
        GSpacing band = sz;
        if (i == TW_WP_EMB) { /* fill_emb: band-interleaved */
            pixel = sz;
            line = pixel * w->grid_w;
            band = line * n_rows;
        }
        CPLErr e =
            GDALDatasetRasterIOEx(f->ds, GF_Write, 0, row0, w->grid_w, n_rows, f->buf, w->grid_w,
                                  n_rows, f->type, f->n_bands, NULL, pixel, line, band, NULL);
        /* whole blocks of every feature are done: out of the cache now, so
         * that D bands x the raster's width never pile up in it */
        if (e == CE_None && i == TW_WP_EMB) GDALFlushCache(f->ds);
        if (e == CE_None && i == TW_WP_PROB && w->mask_buf) {
            GDALRasterBandH mask = GDALGetMaskBand(GDALGetRasterBand(f->ds, 1));
            e = mask ? GDALRasterIO(mask, GF_Write, 0, row0, w->grid_w, n_rows, w->mask_buf,
                                    w->grid_w, n_rows, GDT_Byte, 0, 0)
                     : CE_Failure;
        }
        if (e != CE_None || w->gdal.failures)
            return tw_error_set(err, TW_ERR_OUTPUT, "cannot write rows %d..%d of %s: %s", row0,
                                row0 + n_rows - 1, f->final_path, writer_gdal_msg(w));
    }
    w->next_row += n_rows;
    return TW_OK;
}

tw_status tw_writer_write_rows(tw_writer *w, int row0, int n_rows, const float *probs,
                               const uint8_t *has, tw_error *err)
{
    writer_gdal_begin(w);
    tw_status st = writer_write_rows(w, row0, n_rows, probs, has, err);
    writer_gdal_end();
    return st;
}

/* ---- finish ---- */

static tw_status store_statistics(tw_writer *w, tw_writer_file *f, tw_error *err)
{
    for (int b = 0; b < f->n_bands; b++) {
        const tw_band_stats *s = &f->stats[b];
        if (s->n == 0) continue; /* no valid cell: GDAL has nothing to describe */
        double mean = s->sum / (double)s->n;
        double var = s->sumsq / (double)s->n - mean * mean;
        double sd = var > 0 ? sqrt(var) : 0.0;
        GDALRasterBandH band = GDALGetRasterBand(f->ds, b + 1);
        if (GDALSetRasterStatistics(band, s->min, s->max, mean, sd) != CE_None)
            return tw_error_set(err, TW_ERR_OUTPUT, "%s: cannot store statistics: %s",
                                f->final_path, writer_gdal_msg(w));
        char pct[32];
        snprintf(pct, sizeof pct, "%.6g",
                 100.0 * (double)s->n / ((double)w->grid_w * (double)w->grid_h));
        GDALSetMetadataItem(band, "STATISTICS_VALID_PERCENT", pct, NULL);
    }
    return TW_OK;
}

static tw_status close_file(tw_writer *w, tw_writer_file *f, tw_error *err)
{
    GDALFlushCache(f->ds);
    /* GDALFlushCache and GDALClose return nothing in GDAL 3.6: write errors
     * (ENOSPC, EIO) only show up in the handler. */
    GDALClose(f->ds);
    f->ds = NULL;
    if (w->gdal.failures)
        return tw_error_set(err, TW_ERR_OUTPUT, "cannot write %s: %s", f->final_path,
                            writer_gdal_msg(w));
    return TW_OK;
}

static tw_status make_cog(tw_writer *w, tw_writer_file *f, int which, tw_error *err)
{
    char **argv = NULL;
    argv = CSLAddString(argv, "-of");
    argv = CSLAddString(argv, "COG");
    /* Class ids cannot be averaged; probabilities and confidence can. */
    if (!CSLFetchNameValue(w->cog_options, "OVERVIEW_RESAMPLING")) {
        argv = CSLAddString(argv, "-co");
        argv = CSLAddString(argv, which == TW_WP_CLASS ? "OVERVIEW_RESAMPLING=MODE"
                                                       : "OVERVIEW_RESAMPLING=AVERAGE");
    }
    /* GDAL 3.6's COG is pixel-interleaved: a 512 x 512 block of 2048 float
     * features would be 2 GiB; 64 x 64 keeps it at 32 MiB */
    if (which == TW_WP_EMB && !CSLFetchNameValue(w->cog_options, "BLOCKSIZE")) {
        argv = CSLAddString(argv, "-co");
        argv = CSLAddString(argv, "BLOCKSIZE=64");
    }
    for (char **o = w->cog_options; o && *o; o++) {
        argv = CSLAddString(argv, "-co");
        argv = CSLAddString(argv, *o);
    }
    GDALTranslateOptions *opts = GDALTranslateOptionsNew(argv, NULL);
    CSLDestroy(argv);
    if (!opts)
        return tw_error_set(err, TW_ERR_CONFIG, "%s: bad COG options: %s", f->final_path,
                            writer_gdal_msg(w));
    GDALDatasetH src = GDALOpen(f->part_path, GA_ReadOnly);
    if (!src) {
        GDALTranslateOptionsFree(opts);
        return tw_error_set(err, TW_ERR_OUTPUT, "cannot reopen %s: %s", f->part_path,
                            writer_gdal_msg(w));
    }
    int usage_error = FALSE;
    f->cog_made = true;
    GDALDatasetH dst = GDALTranslate(f->cog_path, src, opts, &usage_error);
    GDALTranslateOptionsFree(opts);
    if (dst) GDALClose(dst);
    GDALClose(src);
    if (!dst || usage_error || w->gdal.failures)
        return tw_error_set(err, TW_ERR_OUTPUT, "cannot write COG %s: %s", f->final_path,
                            writer_gdal_msg(w));
    return TW_OK;
}

static tw_status writer_finish(tw_writer *w, tw_error *err)
{
    if (w->finished) return TW_OK;
    if (w->next_row != w->grid_h)
        return tw_error_set(err, TW_ERR_INTERNAL, "writer: finish after %d of %d rows", w->next_row,
                            w->grid_h);
    tw_status st = TW_OK;
    char dir[TW_PATH_MAX] = "";
    for (int i = 0; i < TW_WP_COUNT && st == TW_OK; i++) {
        tw_writer_file *f = &w->files[i];
        if (!f->active) continue;
        st = store_statistics(w, f, err);
        if (st == TW_OK) st = close_file(w, f, err);
        if (st == TW_OK && w->format == TW_FORMAT_COG) st = make_cog(w, f, i, err);
    }
    /* Rename only when every product is complete, so a failure leaves no
     * final name behind. */
    for (int i = 0; i < TW_WP_COUNT && st == TW_OK; i++) {
        tw_writer_file *f = &w->files[i];
        if (!f->active) continue;
        if (w->format == TW_FORMAT_COG) {
            st = rename_with_sidecar(f->cog_path, f->final_path, err);
            if (st == TW_OK) {
                f->cog_made = false;
                remove_file_and_sidecars(f->part_path);
            }
        } else {
            st = rename_with_sidecar(f->part_path, f->final_path, err);
        }
        if (st == TW_OK) f->part_path[0] = '\0';
        snprintf(dir, sizeof dir, "%s", f->final_path);
    }
    if (st != TW_OK) return st;
    char *slash = strrchr(dir, '/');
    if (slash) {
        *slash = '\0';
        /* The renames are only durable once the directory is synced. */
        st = tw_fsync_path(dir[0] ? dir : "/", true, err);
        if (st != TW_OK) return st;
    }
    w->finished = true;
    return TW_OK;
}

tw_status tw_writer_finish(tw_writer *w, tw_error *err)
{
    writer_gdal_begin(w);
    tw_status st = writer_finish(w, err);
    writer_gdal_end();
    return st;
}

/* ---- destroy ---- */

void tw_writer_destroy(tw_writer *w)
{
    if (!w) return;
    /* Closing may complain (e.g. the disk that failed is still full): those
     * messages belong to nobody now. */
    writer_gdal_begin(w);
    for (int i = 0; i < TW_WP_COUNT; i++) {
        tw_writer_file *f = &w->files[i];
        if (f->ds) GDALClose(f->ds);
        f->ds = NULL;
        if (!w->finished) {
            if (f->part_path[0] && f->active) remove_file_and_sidecars(f->part_path);
            if (f->cog_made) remove_file_and_sidecars(f->cog_path);
        }
        tw_free(f->stats);
        tw_free(f->buf);
    }
    writer_gdal_end();
    CSLDestroy(w->cog_options);
    tw_free(w->colors);
    tw_free(w->mask_buf);
    tw_free(w->class_names);
    tw_free(w->emb_scale);
    tw_free(w->emb_offset);
    tw_free(w);
}

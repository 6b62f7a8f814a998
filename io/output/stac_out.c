/* stac_out.c - the STAC Item of a run's products (stac_out.h): its files'
 * hrefs and checksums, each asset from core/products.h's table, the
 * footprint, the classes and the model (mlm); items.json and the collection
 * are stac_items.c, the input's acquisition time stac_datetime.c. */
#include "io/output/stac_out.h"

#include <cpl_conv.h>
#include <cpl_error.h>
#include <ctype.h>
#include <errno.h>
#include <gdal.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <nettle/sha2.h>
#include <ogr_srs_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/url.h"
#include "core/datetime.h"
#include "core/alloc.h"
#include "core/fileio.h"
#include "core/products.h"
#include "io/output/stac_out_internal.h"

#define EXT_PROJ "https://stac-extensions.github.io/projection/v1.1.0/schema.json"
#define EXT_RASTER "https://stac-extensions.github.io/raster/v1.1.0/schema.json"
#define EXT_FILE "https://stac-extensions.github.io/file/v2.1.0/schema.json"
#define EXT_CLASS "https://stac-extensions.github.io/classification/v1.1.0/schema.json"
#define EXT_MLM "https://stac-extensions.github.io/mlm/v1.3.0/schema.json"

/* Points per footprint edge: a reprojected straight edge bends; 32 segments
 * keep a UTM scene's outline within centimetres of the curve. */
#define EDGE_SEGMENTS 32

/* ------------------------------------------------------------------------ */
/* files                                                                    */

bool tw_stac_item_path(const char *dir, const char *id, char *out, size_t size)
{
    int n = snprintf(out, size, "%s/%s.stac.json", dir, id);
    return n > 0 && (size_t)n < size;
}

/* file:size and the file:checksum multihash (0x12 sha2-256, 0x20 bytes). */
static tw_status hash_file(const char *path, int64_t *size, char hex[69], tw_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return tw_error_set(err, TW_ERR_OUTPUT, "output.stac: cannot read %s: %s", path,
                            strerror(errno));
    struct sha256_ctx c;
    sha256_init(&c);
    unsigned char *buf = tw_alloc(TW_MEM_OTHER, 1 << 20);
    if (!buf) {
        fclose(f);
        return tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    }
    int64_t total = 0;
    size_t n;
    while ((n = fread(buf, 1, 1 << 20, f)) > 0) {
        sha256_update(&c, n, buf);
        total += (int64_t)n;
    }
    bool bad = ferror(f) != 0;
    fclose(f);
    tw_free(buf);
    if (bad) return tw_error_set(err, TW_ERR_OUTPUT, "output.stac: error reading %s", path);
    unsigned char d[SHA256_DIGEST_SIZE];
    sha256_digest(&c, sizeof d, d);
    memcpy(hex, "1220", 4);
    for (int i = 0; i < SHA256_DIGEST_SIZE; i++) snprintf(hex + 4 + 2 * i, 3, "%02x", d[i]);
    *size = total;
    return TW_OK;
}

void tw_stac_relative_href(const char *dir, const char *target, char *out, size_t size)
{
    snprintf(out, size, "%s", target);
    if (strstr(target, "://") || strncmp(target, "/vsi", 4) == 0) return;
    char rd[PATH_MAX], rt[PATH_MAX];
    if (!realpath(dir, rd) || !realpath(target, rt)) return;
    /* split both into components and drop the common ones */
    char *cd[PATH_MAX / 2], *ctg[PATH_MAX / 2], *save = NULL;
    int nd = 0, nt = 0;
    for (char *t = strtok_r(rd, "/", &save); t; t = strtok_r(NULL, "/", &save)) cd[nd++] = t;
    for (char *t = strtok_r(rt, "/", &save); t; t = strtok_r(NULL, "/", &save)) ctg[nt++] = t;
    int common = 0;
    while (common < nd && common < nt - 1 && strcmp(cd[common], ctg[common]) == 0) common++;
    size_t len = 0;
    out[0] = '\0';
    if (common == nd) len = (size_t)snprintf(out, size, "./");
    for (int i = common; i < nd && len < size; i++)
        len += (size_t)snprintf(out + len, size - len, "../");
    for (int i = common; i < nt && len < size; i++)
        len += (size_t)snprintf(out + len, size - len, "%s%s", ctg[i], i + 1 < nt ? "/" : "");
}

bool tw_stac_model_href(const char *dir, const char *target, char *out, size_t size)
{
    out[0] = '\0';
    if (!target || !target[0]) return false;
    if (strncmp(target, "file://", 7) == 0) target += 7;
    if (strstr(target, "://")) {
        /* a URL is as good published as here, unless it carries a secret */
        if (tw_url_has_secret(target) || strlen(target) >= size) return false;
        snprintf(out, size, "%s", target);
        return true;
    }
    char rd[PATH_MAX], rt[PATH_MAX];
    if (strncmp(target, "/vsi", 4) == 0 || !realpath(dir, rd) || !realpath(target, rt))
        return false;
    size_t n = strlen(rd);
    if (strncmp(rt, rd, n) != 0 || rt[n] != '/' || strlen(rt + n + 1) + 3 > size) return false;
    snprintf(out, size, "./%s", rt + n + 1);
    return true;
}

/* ------------------------------------------------------------------------ */
/* the asset of a product file: core/products.h's table                    */

typedef struct asset_kind {
    const char *suffix; /* after "<id>" */
    const char *key;    /* asset key */
    const char *title;
    const char *type; /* media type; NULL: GeoTIFF (COG when its layout says) */
    bool classes;     /* carries classification:classes */
} asset_kind;

/* The kind of a product's file named by suffix (its row's, or the
 * FlatGeobuf's); false when no product's file has that suffix. */
static bool product_kind(const char *suffix, asset_kind *k)
{
    for (int i = 0; i < TW_PRODUCT_COUNT; i++) {
        const tw_product *r = &tw_products[i];
        bool fgb = r->suffix_fgb && strcmp(suffix, r->suffix_fgb) == 0;
        if (!fgb && !(r->suffix && strcmp(suffix, r->suffix) == 0)) continue;
        *k = (asset_kind){suffix, r->word, r->stac_title, fgb ? r->stac_type_fgb : r->stac_type,
                          r->stac_classes};
        return true;
    }
    return false;
}

/* The kind of a file the table does not know: its key from the suffix
 * ("x.foo.tif" -> "foo"), its type from the extension. */
static void unknown_kind(const char *suffix, asset_kind *k, char *key, size_t key_size)
{
    const char *s = suffix[0] == '.' ? suffix + 1 : suffix;
    const char *ext = strrchr(s, '.');
    size_t n = ext ? (size_t)(ext - s) : strlen(s);
    snprintf(key, key_size, "%.*s", (int)(n ? n : strlen(s)), s);
    for (char *c = key; *c; c++)
        if (*c == '.') *c = '_';
    memset(k, 0, sizeof *k);
    k->suffix = suffix;
    k->key = key;
    k->title = NULL;
    static const struct {
        const char *ext, *type;
    } types[] = {{".tif", NULL},
                 {".gpkg", "application/geopackage+sqlite3"},
                 {".fgb", "application/vnd.flatgeobuf"},
                 {".h5", "application/x-hdf5"},
                 {".json", "application/json"},
                 {".geojson", "application/geo+json"}};
    k->type = "application/octet-stream";
    for (size_t i = 0; ext && i < sizeof types / sizeof types[0]; i++)
        if (strcmp(ext, types[i].ext) == 0) k->type = types[i].type;
}

static json_t *strs(const char *const *s, int n, bool *ok)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++) push(a, json_string(s[i]), ok);
    if (!a) *ok = false;
    return a;
}

/* A number or, for NaN and infinities, raster's "nan", "inf", "-inf". */
static json_t *num_or_word(double v)
{
    if (isnan(v)) return json_string("nan");
    if (isinf(v)) return json_string(v > 0 ? "inf" : "-inf");
    if (v == floor(v) && fabs(v) < 9e15) return json_integer((json_int_t)v);
    return json_real(v);
}

static const char *raster_type(GDALDataType t)
{
    switch (t) {
    case GDT_Byte: return "uint8";
    case GDT_UInt16: return "uint16";
    case GDT_Int16: return "int16";
    case GDT_UInt32: return "uint32";
    case GDT_Int32: return "int32";
    case GDT_Float32: return "float32";
    case GDT_Float64: return "float64";
    case GDT_CInt16: return "cint16";
    case GDT_CInt32: return "cint32";
    case GDT_CFloat32: return "cfloat32";
    case GDT_CFloat64: return "cfloat64";
#if GDAL_VERSION_NUM >= 3050000
    case GDT_UInt64: return "uint64";
    case GDT_Int64: return "int64";
#endif
    default: return "other";
    }
}

/* STAC's proj:transform: the first two rows of the affine matrix. */
static json_t *proj_transform(const double gt[6], bool *ok)
{
    json_t *a = json_array();
    const double v[6] = {gt[1], gt[2], gt[0], gt[4], gt[5], gt[3]};
    for (int i = 0; i < 6; i++) push(a, json_real(v[i]), ok);
    if (!a) *ok = false;
    return a;
}

/* The EPSG code of a CRS, or 0. */
static int epsg_of(OGRSpatialReferenceH srs)
{
    const char *auth = OSRGetAuthorityName(srs, NULL);
    const char *code = OSRGetAuthorityCode(srs, NULL);
    if (auth && code && strcmp(auth, "EPSG") == 0) return atoi(code);
    OGRSpatialReferenceH c = OSRClone(srs);
    int out = 0;
    if (c && OSRAutoIdentifyEPSG(c) == OGRERR_NONE) {
        auth = OSRGetAuthorityName(c, NULL);
        code = OSRGetAuthorityCode(c, NULL);
        if (auth && code && strcmp(auth, "EPSG") == 0) out = atoi(code);
    }
    OSRDestroySpatialReference(c);
    return out;
}

/* The raster fields of one GDAL raster asset (with bands): raster:bands, proj:shape,
 * proj:transform (its own grid) and, for the class map, its colour table
 * (colors[c] = 0xRRGGBB, -1 none). false: GDAL does not open it as a
 * raster (the asset then has none of them). */
static bool raster_fields(const char *path, json_t *asset, const asset_kind *k, bool *cog,
                          int *colors, int n_colors, bool *ok)
{
    CPLPushErrorHandler(CPLQuietErrorHandler);
    GDALDatasetH ds = GDALOpenEx(path, GDAL_OF_RASTER | GDAL_OF_READONLY, NULL, NULL, NULL);
    CPLPopErrorHandler();
    if (ds && GDALGetRasterCount(ds) == 0) { /* an HDF5 file's subdatasets: not a raster */
        GDALClose(ds);
        ds = NULL;
    }
    if (!ds) return false;
    const char *layout = GDALGetMetadataItem(ds, "LAYOUT", "IMAGE_STRUCTURE");
    *cog = layout && strcmp(layout, "COG") == 0;
    double gt[6];
    if (GDALGetGeoTransform(ds, gt) == CE_None) {
        json_t *shape = json_array();
        push(shape, json_integer(GDALGetRasterYSize(ds)), ok);
        push(shape, json_integer(GDALGetRasterXSize(ds)), ok);
        set(asset, "proj:shape", shape, ok);
        set(asset, "proj:transform", proj_transform(gt, ok), ok);
        /* proj:bbox of the asset's own grid: GDAL's STACIT takes bbox and
         * shape before the transform, so it must be this grid's */
        double X = GDALGetRasterXSize(ds), Y = GDALGetRasterYSize(ds);
        double xs[2] = {gt[0], gt[0] + X * gt[1] + Y * gt[2]};
        double ys[2] = {gt[3], gt[3] + X * gt[4] + Y * gt[5]};
        json_t *pb = json_array();
        push(pb, json_real(fmin(xs[0], xs[1])), ok);
        push(pb, json_real(fmin(ys[0], ys[1])), ok);
        push(pb, json_real(fmax(xs[0], xs[1])), ok);
        push(pb, json_real(fmax(ys[0], ys[1])), ok);
        set(asset, "proj:bbox", pb, ok);
    }
    json_t *bands = json_array();
    for (int b = 1; b <= GDALGetRasterCount(ds); b++) {
        GDALRasterBandH band = GDALGetRasterBand(ds, b);
        json_t *o = json_object();
        const char *desc = GDALGetDescription(band);
        if (desc && *desc) set(o, "name", json_string(desc), ok);
        GDALDataType t = GDALGetRasterDataType(band);
        set(o, "data_type", json_string(raster_type(t)), ok);
        int has = 0;
        double nd = GDALGetRasterNoDataValue(band, &has);
        if (has) set(o, "nodata", num_or_word(nd), ok);
        int has_scale = 0, has_offset = 0;
        double scale = GDALGetRasterScale(band, &has_scale);
        double offset = GDALGetRasterOffset(band, &has_offset);
        /* uint8 probabilities are round(255 p) (README): value / 255 = p */
        if (!has_scale && strcmp(k->key, "prob") == 0 && t == GDT_Byte) {
            has_scale = 1;
            scale = 1.0 / 255.0;
        }
        if (has_scale && scale != 1.0) set(o, "scale", json_real(scale), ok);
        if (has_offset && offset != 0.0) set(o, "offset", json_real(offset), ok);
        set(o, "sampling", json_string("area"), ok);
        push(bands, o, ok);
        GDALColorTableH ct = b == 1 && colors ? GDALGetRasterColorTable(band) : NULL;
        for (int c = 0; ct && c < n_colors && c < GDALGetColorEntryCount(ct); c++) {
            const GDALColorEntry *e = GDALGetColorEntry(ct, c);
            colors[c] = (e->c1 & 255) << 16 | (e->c2 & 255) << 8 | (e->c3 & 255);
        }
    }
    set(asset, "raster:bands", bands, ok);
    GDALClose(ds);
    return true;
}

/* The classification extension's class names: letters, digits, '-' and '_'
 * only (v2.0.0's pattern), unique within the list. Each UTF-8 character
 * outside the set becomes one '_' ("open water" -> "open_water"); a name
 * left without a letter or digit ("é") is "class_<value>"; a name taken by
 * an earlier class or by the map's "nodata" gets "_<value>" appended (then
 * "_2", "_3", ... should that be taken too), so the same class map always
 * gets the same names. */
static void class_names(const tw_stac_model *m, char (*names)[TW_NAME_MAX + 24])
{
    for (int c = 0; c < m->n_classes; c++) {
        char base[TW_NAME_MAX + 24];
        size_t n = 0;
        bool readable = false;
        for (const unsigned char *ch = (const unsigned char *)m->classes[c];
             *ch && n + 1 < sizeof base; ch++) {
            if ((*ch & 0xC0) == 0x80) continue; /* a UTF-8 continuation byte */
            bool keep = isalnum(*ch) || *ch == '-' || *ch == '_';
            readable = readable || (*ch < 0x80 && isalnum(*ch));
            base[n++] = keep && *ch < 0x80 ? (char)*ch : '_';
        }
        base[n] = '\0';
        if (!readable) snprintf(base, sizeof base, "class_%d", c);
        snprintf(names[c], sizeof names[c], "%s", base);
        for (int k = 1;; k++) {
            bool taken = strcmp(names[c], "nodata") == 0;
            for (int e = 0; !taken && e < c; e++) taken = strcmp(names[e], names[c]) == 0;
            if (!taken) break;
            if (k == 1)
                snprintf(names[c], sizeof names[c], "%.*s_%d", TW_NAME_MAX, base, c);
            else
                snprintf(names[c], sizeof names[c], "%.*s_%d_%d", TW_NAME_MAX, base, c, k);
        }
    }
}

/* classification:classes of the class map: value = the class index, name
 * from class_names (unique, machine-readable), description and title the
 * class name as given (v1.1.0 requires description; title is v2.0.0's
 * legend text), colour from the map's own table; and 255, its nodata. */
static json_t *class_list(const tw_stac_model *m, const int *colors, bool *ok)
{
    char names[TW_MAX_CLASSES][TW_NAME_MAX + 24];
    class_names(m, names);
    json_t *a = json_array();
    for (int c = 0; c < m->n_classes; c++) {
        json_t *o = json_object();
        set(o, "value", json_integer(c), ok);
        set(o, "name", json_string(names[c]), ok);
        set(o, "description", json_string(m->classes[c]), ok);
        set(o, "title", json_string(m->classes[c]), ok);
        if (colors[c] >= 0) {
            char hex[12];
            snprintf(hex, sizeof hex, "%06X", (unsigned)colors[c] & 0xffffffu);
            set(o, "color_hint", json_string(hex), ok);
        }
        push(a, o, ok);
    }
    json_t *nd = json_object();
    set(nd, "value", json_integer(255), ok);
    set(nd, "name", json_string("nodata"), ok);
    set(nd, "description", json_string("no data (no class)"), ok);
    set(nd, "nodata", json_true(), ok);
    push(a, nd, ok);
    return a;
}

/* The footprint: the raster's outline (EDGE_SEGMENTS points per edge)
 * reprojected to WGS84 (lon, lat), as a GeoJSON Polygon whose ring runs
 * counter-clockwise (RFC 7946); bbox its extremes. NULL without a CRS or
 * when the transformation fails. */
static json_t *footprint(const tw_stac_item_params *ip, double bbox[4], bool *ok)
{
    if (!ip->crs_wkt || !ip->crs_wkt[0]) return NULL;
    OGRSpatialReferenceH src = OSRNewSpatialReference(NULL);
    OGRSpatialReferenceH dst = OSRNewSpatialReference(NULL);
    json_t *geom = NULL;
    OGRCoordinateTransformationH ct = NULL;
    if (src && dst && OSRSetFromUserInput(src, ip->crs_wkt) == OGRERR_NONE &&
        OSRImportFromEPSG(dst, 4326) == OGRERR_NONE) {
        OSRSetAxisMappingStrategy(src, OAMS_TRADITIONAL_GIS_ORDER);
        OSRSetAxisMappingStrategy(dst, OAMS_TRADITIONAL_GIS_ORDER);
        CPLPushErrorHandler(CPLQuietErrorHandler);
        ct = OCTNewCoordinateTransformation(src, dst);
        CPLPopErrorHandler();
    }
    enum { N = 4 * EDGE_SEGMENTS + 1 };
    double x[N], y[N];
    int succ[N];
    const double *g = ip->geotransform;
    const double W = ip->width, H = ip->height;
    /* pixel corners TL -> BL -> BR -> TR -> TL: counter-clockwise with north up */
    const double cx[5] = {0, 0, W, W, 0}, cy[5] = {0, H, H, 0, 0};
    int n = 0;
    for (int e = 0; e < 4; e++)
        for (int s = 0; s < EDGE_SEGMENTS; s++) {
            double t = (double)s / EDGE_SEGMENTS;
            double px = cx[e] + (cx[e + 1] - cx[e]) * t, py = cy[e] + (cy[e + 1] - cy[e]) * t;
            x[n] = g[0] + px * g[1] + py * g[2];
            y[n] = g[3] + px * g[4] + py * g[5];
            n++;
        }
    x[n] = x[0];
    y[n] = y[0];
    n++;
    bool good = ct != NULL;
    if (good) {
        CPLPushErrorHandler(CPLQuietErrorHandler);
        good = OCTTransformEx(ct, n, x, y, NULL, succ) != 0;
        CPLPopErrorHandler();
        for (int i = 0; good && i < n; i++) good = succ[i] && isfinite(x[i]) && isfinite(y[i]);
    }
    if (good) {
        bbox[0] = bbox[2] = x[0];
        bbox[1] = bbox[3] = y[0];
        json_t *ring = json_array();
        for (int i = 0; i < n; i++) {
            json_t *pt = json_array();
            push(pt, json_real(x[i]), ok);
            push(pt, json_real(y[i]), ok);
            push(ring, pt, ok);
            bbox[0] = fmin(bbox[0], x[i]);
            bbox[1] = fmin(bbox[1], y[i]);
            bbox[2] = fmax(bbox[2], x[i]);
            bbox[3] = fmax(bbox[3], y[i]);
        }
        /* a signed area (shoelace) < 0 means clockwise: a CRS whose axes
         * flip the picture; reverse to keep RFC 7946's orientation */
        double area = 0;
        for (int i = 0; i + 1 < n; i++) area += x[i] * y[i + 1] - x[i + 1] * y[i];
        if (area < 0) {
            json_t *rev = json_array();
            for (size_t i = json_array_size(ring); i-- > 0;)
                push(rev, json_incref(json_array_get(ring, i)), ok);
            json_decref(ring);
            ring = rev;
        }
        json_t *rings = json_array();
        push(rings, ring, ok);
        geom = json_object();
        set(geom, "type", json_string("Polygon"), ok);
        set(geom, "coordinates", rings, ok);
    }
    if (ct) OCTDestroyCoordinateTransformation(ct);
    OSRDestroySpatialReference(src);
    OSRDestroySpatialReference(dst);
    return geom;
}

/* "resnet18" -> "ResNet-18" (others as given). */
static void arch_name(const tw_stac_model *m, char *arch, size_t size)
{
    int depth = 0;
    if (sscanf(m->arch, "resnet%d", &depth) == 1)
        snprintf(arch, size, "ResNet-%d", depth);
    else if (sscanf(m->arch, "unet_resnet%d", &depth) == 1)
        snprintf(arch, size, "U-Net (ResNet-%d encoder)", depth);
    else if (sscanf(m->arch, "deeplabv3_resnet%d", &depth) == 1)
        snprintf(arch, size, "DeepLabV3 (ResNet-%d)", depth);
    else if (sscanf(m->arch, "fcn_resnet%d", &depth) == 1)
        snprintf(arch, size, "FCN (ResNet-%d)", depth);
    else
        snprintf(arch, size, "%s", m->arch);
}

/* The model's input bands by name, in its order: the names it carries, else
 * the raster's band numbers it reads, else band_1.. */
static json_t *band_names(const tw_stac_model *m, bool *ok)
{
    json_t *bands = json_array();
    for (int b = 0; b < m->in_bands; b++) {
        char name[TW_NAME_MAX + 8];
        if (m->band_names)
            snprintf(name, sizeof name, "%s", m->band_names[b]);
        else if (m->bands && b < m->n_bands)
            snprintf(name, sizeof name, "band_%d", m->bands[b]);
        else
            snprintf(name, sizeof name, "band_%d", b + 1);
        push(bands, json_string(name), ok);
    }
    return bands;
}

/* mlm:* item properties. */
static void mlm_fields(json_t *props, const tw_stac_model *m, bool *ok)
{
    char arch[40];
    arch_name(m, arch, sizeof arch);
    set(props, "mlm:name", json_string(m->name), ok);
    set(props, "mlm:architecture", json_string(arch), ok);
    const char *tasks[] = {m->segmentation ? "semantic-segmentation" : "classification"};
    set(props, "mlm:tasks", strs(tasks, 1, ok), ok);
    set(props, "mlm:framework", json_string(m->framework ? m->framework : "PyTorch"), ok);

    json_t *in = json_object();
    set(in, "name", json_string("tiles"), ok);
    json_t *bands = band_names(m, ok);
    set(in, "bands", bands, ok);
    json_t *st = json_object();
    json_t *shape = json_array();
    const json_int_t dims[4] = {-1, m->in_bands, m->tile, m->tile};
    for (int i = 0; i < 4; i++) push(shape, json_integer(dims[i]), ok);
    set(st, "shape", shape, ok);
    const char *order[] = {"batch", "channel", "height", "width"};
    set(st, "dim_order", strs(order, 4, ok), ok);
    set(st, "data_type", json_string("float32"), ok);
    set(in, "input", st, ok);
    /* x = (v * scale - mean) / std is a z-score of the raw value v with
     * mean / scale and std / scale */
    json_t *vs = json_array();
    for (int b = 0; b < m->in_bands; b++) {
        json_t *o = json_object();
        set(o, "type", json_string("z-score"), ok);
        set(o, "mean", json_real((double)m->mean[b] / m->scale), ok);
        set(o, "stddev", json_real((double)m->std[b] / m->scale), ok);
        push(vs, o, ok);
    }
    set(in, "value_scaling", vs, ok);
    set(in, "resize_type", json_null(), ok);
    char desc[160];
    snprintf(desc, sizeof desc,
             "raw pixel values v, as (v * %.17g - mean) / std with the run's mean and std "
             "(input.scale folded into value_scaling)",
             m->scale);
    set(in, "description", json_string(desc), ok);
    json_t *ins = json_array();
    push(ins, in, ok);
    set(props, "mlm:input", ins, ok);

    json_t *out = json_object();
    set(out, "name", json_string("class probabilities"), ok);
    set(out, "tasks", strs(tasks, 1, ok), ok);
    json_t *rs = json_object();
    json_t *rshape = json_array();
    push(rshape, json_integer(-1), ok);
    push(rshape, json_integer(m->n_classes), ok);
    if (m->segmentation) { /* a probability per class and pixel of the tile */
        push(rshape, json_integer(m->tile), ok);
        push(rshape, json_integer(m->tile), ok);
    }
    set(rs, "shape", rshape, ok);
    const char *rorder[] = {"batch", "class", "height", "width"};
    set(rs, "dim_order", strs(rorder, m->segmentation ? 4 : 2, ok), ok);
    set(rs, "data_type", json_string("float32"), ok);
    set(out, "result", rs, ok);
    int none[TW_MAX_CLASSES];
    for (int c = 0; c < TW_MAX_CLASSES; c++) none[c] = -1;
    json_t *cl = class_list(m, none, ok);
    json_array_remove(cl, json_array_size(cl) - 1); /* the map's nodata is not a model class */
    set(out, "classification:classes", cl, ok);
    set(out, "post_processing_function", json_null(), ok);
    json_t *outs = json_array();
    push(outs, out, ok);
    set(props, "mlm:output", outs, ok);
}

/* tilewise:model, the model without the mlm extension (whose Items need a
 * model asset with an href, and a weights file outside the output folder
 * has no href that survives publishing it): what identifies the weights
 * (name, SHA-256, size) and what the products came from. */
static void model_fields(json_t *props, const tw_stac_model *m, bool *ok)
{
    char arch[40];
    arch_name(m, arch, sizeof arch);
    json_t *o = json_object();
    set(o, "name", json_string(m->name), ok);
    set(o, "architecture", json_string(arch), ok);
    set(o, "framework", json_string(m->framework ? m->framework : "PyTorch"), ok);
    set(o, "sha256", json_string(m->weights_sha256), ok);
    if (m->weights_size >= 0) set(o, "size", json_integer(m->weights_size), ok);
    json_t *bands = band_names(m, ok);
    set(o, "bands", bands, ok);
    set(o, "tile", json_integer(m->tile), ok);
    json_t *classes = json_array();
    for (int c = 0; c < m->n_classes; c++) push(classes, json_string(m->classes[c]), ok);
    set(o, "classes", classes, ok);
    set(props, "tilewise:model", o, ok);
}

/* The item as JSON; NULL with err set. */
/* The item's properties: datetime, created, version; proj: the input's CRS
 * and extent (the grid of the products replaces the extent when an asset
 * gives one: file_asset); the model, as mlm fields or tilewise:model. */
static json_t *item_props(const tw_stac_item_params *ip, bool mlm, bool *ok)
{
    json_t *props = json_object();
    set(props, "datetime", json_string(ip->datetime), ok);
    if (ip->created) set(props, "created", json_string(ip->created), ok);
    set(props, "tilewise:version", json_string(TW_VERSION), ok);
    /* proj: the input's CRS and extent; the grid of the products (the
     * class map's, or the first raster's: its shape, transform and bbox,
     * which covers whole cells past the input's edge) replaces the extent
     * below when there is one */
    int epsg = 0;
    if (ip->crs_wkt && ip->crs_wkt[0]) {
        OGRSpatialReferenceH srs = OSRNewSpatialReference(NULL);
        if (srs && OSRSetFromUserInput(srs, ip->crs_wkt) == OGRERR_NONE) epsg = epsg_of(srs);
        OSRDestroySpatialReference(srs);
    }
    set(props, "proj:epsg", epsg > 0 ? json_integer(epsg) : json_null(), ok);
    if (epsg <= 0 && ip->crs_wkt && ip->crs_wkt[0])
        set(props, "proj:wkt2", json_string(ip->crs_wkt), ok);
    const double *g = ip->geotransform;
    double x0 = g[0], y0 = g[3], x1 = g[0] + ip->width * g[1] + ip->height * g[2],
           y1 = g[3] + ip->width * g[4] + ip->height * g[5];
    json_t *pb = json_array();
    push(pb, json_real(fmin(x0, x1)), ok);
    push(pb, json_real(fmin(y0, y1)), ok);
    push(pb, json_real(fmax(x0, x1)), ok);
    push(pb, json_real(fmax(y0, y1)), ok);
    set(props, "proj:bbox", pb, ok);
    if (mlm)
        mlm_fields(props, ip->model, ok);
    else if (ip->model)
        model_fields(props, ip->model, ok);
    return props;
}

/* The item's links: its collection (as collection, parent and root) and the
 * input's STAC item it derives from. */
static json_t *item_links(const tw_stac_item_params *ip, json_t *item, bool *ok)
{
    json_t *links = json_array();
    if (ip->collection) {
        static const char *const rels[] = {"collection", "parent", "root"};
        for (int i = 0; i < 3; i++) {
            json_t *l = json_object();
            set(l, "rel", json_string(rels[i]), ok);
            set(l, "href", json_string("./collection.json"), ok);
            set(l, "type", json_string("application/json"), ok);
            push(links, l, ok);
        }
        set(item, "collection", json_string(ip->collection), ok);
    }
    if (ip->derived_from && ip->derived_from[0]) {
        json_t *l = json_object();
        set(l, "rel", json_string("derived_from"), ok);
        set(l, "href", json_string(ip->derived_from), ok);
        set(l, "type", json_string("application/geo+json"), ok);
        set(l, "title", json_string("the input's STAC item"), ok);
        push(links, l, ok);
    }
    return links;
}

/* The asset of product file path into assets (under its kind's key): href,
 * type, title, roles, size and checksum, its raster fields and classes; the
 * first raster's grid becomes the item's (*have_grid). false with *err set
 * when the file cannot be read. */
static bool file_asset(const tw_stac_item_params *ip, const char *path, json_t *assets,
                       json_t *props, bool *have_grid, bool *ok, tw_error *err)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    asset_kind k;
    char key[64];
    size_t idlen = strlen(ip->id);
    const char *suffix = strncmp(base, ip->id, idlen) == 0 ? base + idlen : base;
    if (!product_kind(suffix, &k)) unknown_kind(suffix, &k, key, sizeof key);
    json_t *a = json_object();
    char href[PATH_MAX + 4];
    snprintf(href, sizeof href, "./%s", base);
    set(a, "href", json_string(href), ok);
    int64_t size = 0;
    char hex[69];
    tw_status st = hash_file(path, &size, hex, err);
    if (st != TW_OK) {
        json_decref(a);
        return false;
    }
    int colors[TW_MAX_CLASSES];
    for (int c = 0; c < TW_MAX_CLASSES; c++) colors[c] = -1;
    bool cog = false;
    int nc = ip->model ? ip->model->n_classes : 0;
    bool raster = raster_fields(path, a, &k, &cog, k.classes ? colors : NULL, nc, ok);
    const char *type = k.type;
    if (!type)
        type = cog ? "image/tiff; application=geotiff; profile=cloud-optimized"
                   : "image/tiff; application=geotiff";
    set(a, "type", json_string(type), ok);
    if (k.title) set(a, "title", json_string(k.title), ok);
    const char *roles[] = {"data"};
    set(a, "roles", strs(roles, 1, ok), ok);
    set(a, "file:size", json_integer(size), ok);
    set(a, "file:checksum", json_string(hex), ok);
    if (k.classes && ip->model)
        set(a, "classification:classes", class_list(ip->model, colors, ok), ok);
    if (raster && !*have_grid && json_object_get(a, "proj:shape")) {
        /* the item's grid: the first raster's (the class map comes first) */
        set(props, "proj:shape", json_deep_copy(json_object_get(a, "proj:shape")), ok);
        set(props, "proj:transform", json_deep_copy(json_object_get(a, "proj:transform")), ok);
        set(props, "proj:bbox", json_deep_copy(json_object_get(a, "proj:bbox")), ok);
        *have_grid = true;
    }
    set(assets, k.key, a, ok);
    return true;
}

/* The model's asset (mlm: its weights, with an href). */
static json_t *model_asset(const tw_stac_model *m, bool *ok)
{
    json_t *a = json_object();
    set(a, "href", json_string(m->weights_href), ok);
    set(a, "type", json_string("application/octet-stream"), ok);
    set(a, "title", json_string("Model weights"), ok);
    const char *roles[] = {"mlm:model", "mlm:weights", "model"};
    set(a, "roles", strs(roles, 3, ok), ok);
    if (m->weights_size >= 0) set(a, "file:size", json_integer(m->weights_size), ok);
    char hex[69];
    snprintf(hex, sizeof hex, "1220%s", m->weights_sha256);
    set(a, "file:checksum", json_string(hex), ok);
    return a;
}

static json_t *item_json(const tw_stac_item_params *ip, tw_error *err)
{
    bool ok = true;
    json_t *item = json_object();
    set(item, "type", json_string("Feature"), &ok);
    set(item, "stac_version", json_string("1.0.0"), &ok);
    /* mlm only with a model asset (mlm requires one, with an href) */
    bool mlm = ip->model && ip->model->weights_href && ip->model->weights_href[0];
    const char *exts[] = {EXT_PROJ, EXT_RASTER, EXT_FILE, EXT_CLASS, EXT_MLM};
    set(item, "stac_extensions", strs(exts, mlm ? 5 : 4, &ok), &ok);
    set(item, "id", json_string(ip->id), &ok);
    double bbox[4];
    json_t *geom = footprint(ip, bbox, &ok);
    set(item, "geometry", geom ? geom : json_null(), &ok);
    if (geom) {
        json_t *b = json_array();
        for (int i = 0; i < 4; i++) push(b, json_real(bbox[i]), &ok);
        set(item, "bbox", b, &ok);
    }
    json_t *props = item_props(ip, mlm, &ok);
    set(item, "properties", props, &ok);
    set(item, "links", item_links(ip, item, &ok), &ok);
    json_t *assets = json_object();
    set(item, "assets", assets, &ok);
    bool have_grid = false;
    for (int f = 0; ok && f < ip->n_files; f++)
        if (!file_asset(ip, ip->files[f], assets, props, &have_grid, &ok, err)) {
            json_decref(item);
            return NULL;
        }
    if (mlm) set(assets, "model", model_asset(ip->model, &ok), &ok);
    if (!ok) {
        json_decref(item);
        tw_error_set(err, TW_ERR_NOMEM, "out of memory");
        return NULL;
    }
    return item;
}

tw_status tw_stac_write_json(const char *path, json_t *j, tw_error *err)
{
    char *text = json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(17));
    if (!text) return tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    size_t n = strlen(text);
    char *t2 = realloc(text, n + 2);
    if (!t2) {
        free(text);
        return tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    }
    t2[n] = '\n';
    t2[n + 1] = '\0';
    tw_status st = tw_write_file_atomic(path, t2, n + 1, err);
    free(t2);
    return st;
}

tw_status tw_stac_item_write(const tw_stac_item_params *ip, tw_error *err)
{
    char path[TW_PATH_MAX + 300];
    if (!tw_stac_item_path(ip->dir, ip->id, path, sizeof path))
        return tw_error_set(err, TW_ERR_OUTPUT, "output.stac: the item path in %s is too long",
                            ip->dir);
    json_t *item = item_json(ip, err);
    if (!item) return err->status;
    tw_status st = tw_stac_write_json(path, item, err);
    json_decref(item);
    return st;
}

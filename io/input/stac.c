/* stac.c - a STAC item's assets as one band stack: see stac.h */
#include "io/input/stac.h"

#include <cpl_conv.h>
#include <cpl_string.h>
#include <cpl_vsi.h>
#include <gdal.h>
#include <gdal_utils.h>
#include <jansson.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "io/input/identity.h"
#include "io/url.h"
#include "core/alloc.h"
#include "core/fileio.h"

#define STAC_MAX_JSON (16 << 20)

struct tw_stac {
    char item[TW_PATH_MAX];
    char vrt[128];
    char datetime[64];        /* properties.datetime (else start_datetime), "" none */
    const char *datetime_key; /* "properties.datetime", "properties.start_datetime", "" */
    int n;
    char **hrefs; /* [n] GDAL paths of the assets, CPLStrdup'ed */
};

/* Resolve an asset href against the item's own (user) path: absolute URLs
 * and paths stay; "/x" on a remote item is host-relative; anything else is
 * relative to the item's folder. Result is a user path (url.h maps it). */
static void resolve_href(const char *item, const char *href, char *out, size_t size)
{
    if (strstr(href, "://") || strncmp(href, "/vsi", 4) == 0) {
        snprintf(out, size, "%s", href);
        return;
    }
    char base[TW_PATH_MAX];
    snprintf(base, sizeof base, "%s", item);
    if (tw_url_is_remote(base)) base[strcspn(base, "?#")] = '\0';
    if (href[0] == '/') {
        const char *sch = strstr(base, "://");
        if (sch) {
            const char *host_end = strchr(sch + 3, '/');
            int hl = host_end ? (int)(host_end - base) : (int)strlen(base);
            snprintf(out, size, "%.*s%s", hl, base, href);
        } else {
            snprintf(out, size, "%s", href);
        }
        return;
    }
    char *slash = strrchr(base, '/');
    if (slash)
        slash[1] = '\0';
    else
        base[0] = '\0';
    while (strncmp(href, "./", 2) == 0) href += 2;
    snprintf(out, size, "%s%s", base, href);
}

static tw_status read_item(const char *item, const char *shown, json_t **root, tw_error *err)
{
    char gpath[TW_PATH_MAX + 16];
    tw_status st = tw_url_to_gdal(item, gpath, sizeof gpath, err);
    /* a FIFO would block the read until a writer came */
    if (st == TW_OK && !tw_url_is_remote(item))
        st = tw_path_check_regular(item, "STAC item", false, TW_ERR_INPUT, err);
    if (st != TW_OK) return st;
    GByte *buf = NULL;
    vsi_l_offset len = 0;
    CPLPushErrorHandler(CPLQuietErrorHandler);
    int ok = VSIIngestFile(NULL, gpath, &buf, &len, STAC_MAX_JSON);
    char why[512];
    snprintf(why, sizeof why, "%s", CPLGetLastErrorMsg());
    CPLPopErrorHandler();
    if (!ok) {
        char shown_why[1024];
        tw_url_redact(why, shown_why, sizeof shown_why);
        return tw_error_set(
            err, tw_url_is_remote(item) && tw_url_transient(why) ? TW_ERR_REMOTE : TW_ERR_INPUT,
            "%s: cannot read the STAC item%s%s", shown, why[0] ? ": " : "", shown_why);
    }
    json_error_t jerr;
    *root = json_loadb((const char *)buf, (size_t)len, 0, &jerr);
    VSIFree(buf);
    /* jansson's text quotes the bytes where it stopped: not shown (they
     * may be a credentials file's) */
    char jwhy[sizeof jerr.text];
    if (!*root)
        return tw_error_set(err, TW_ERR_INPUT, "%s: not JSON (line %d, column %d: %s)", shown,
                            jerr.line, jerr.column,
                            tw_json_error_text(jerr.text, jwhy, sizeof jwhy));
    return TW_OK;
}

/* Open one asset to check it: single-band, and on the grid of the first. */
static tw_status check_asset(const char *shown, const char *name, const char *gpath, double gt0[6],
                             int *w0, int *h0, char *crs0, size_t crs_size, bool first,
                             tw_error *err)
{
    char gshown[TW_URL_SHOWN_MAX];
    tw_url_redact(gpath, gshown, sizeof gshown);
    if (!tw_url_is_remote(gpath) && strncmp(gpath, "/vsi", 4) != 0) {
        char what[TW_URL_SHOWN_MAX + TW_NAME_MAX + 16];
        snprintf(what, sizeof what, "%s: asset %s:", shown, name);
        tw_status rst = tw_path_check_regular(gpath, what, true, TW_ERR_INPUT, err);
        if (rst != TW_OK) return rst;
    }
    CPLPushErrorHandler(CPLQuietErrorHandler);
    CPLErrorReset();
    /* VERBOSE_ERROR: GDAL says why ("not recognized as a supported file
     * format", "No such file or directory") instead of nothing */
    GDALDatasetH ds = GDALOpenEx(gpath, GDAL_OF_RASTER | GDAL_OF_READONLY | GDAL_OF_VERBOSE_ERROR,
                                 NULL, NULL, NULL);
    char why[512];
    snprintf(why, sizeof why, "%s", CPLGetLastErrorMsg());
    CPLPopErrorHandler();
    if (!ds && !why[0]) {
        VSIStatBufL sb;
        snprintf(why, sizeof why, "%s",
                 VSIStatL(gpath, &sb) != 0 ? "no such file" : "not a raster format GDAL reads");
    }
    if (!ds) {
        char wshown[1024];
        tw_url_redact(why, wshown, sizeof wshown);
        return tw_error_set(
            err, tw_url_is_remote(gpath) && tw_url_transient(why) ? TW_ERR_REMOTE : TW_ERR_INPUT,
            "%s: asset %s (%s) cannot be opened as a raster: %s", shown, name, gshown, wshown);
    }
    tw_status st = TW_OK;
    double gt[6] = {0, 1, 0, 0, 0, 1};
    GDALGetGeoTransform(ds, gt);
    int w = GDALGetRasterXSize(ds), h = GDALGetRasterYSize(ds);
    const char *crs = GDALGetProjectionRef(ds);
    if (GDALGetRasterCount(ds) != 1) {
        st = tw_error_set(err, TW_ERR_INPUT,
                          "%s: asset %s has %d bands; input.assets takes single-band assets", shown,
                          name, GDALGetRasterCount(ds));
    } else if (first) {
        memcpy(gt0, gt, sizeof gt);
        *w0 = w;
        *h0 = h;
        snprintf(crs0, crs_size, "%s", crs ? crs : "");
    } else {
        bool same = w == *w0 && h == *h0 && strcmp(crs ? crs : "", crs0) == 0;
        for (int i = 0; i < 6; i++)
            same = same && fabs(gt[i] - gt0[i]) <= 1e-9 * (1 + fabs(gt0[i]));
        if (!same)
            st = tw_error_set(err, TW_ERR_INPUT,
                              "%s: asset %s (%d x %d, pixel %g) is not on the grid of the first "
                              "asset (%d x %d, pixel %g); list assets of one resolution",
                              shown, name, w, h, gt[1], *w0, *h0, gt0[1]);
    }
    GDALClose(ds);
    return st;
}

static atomic_int g_stac_seq;

tw_status tw_stac_open(const char *item, const char (*assets)[TW_NAME_MAX], int n, tw_stac **out,
                       tw_error *err)
{
    *out = NULL;
    char shown[TW_URL_SHOWN_MAX];
    tw_url_redact(item, shown, sizeof shown);
    if (n <= 0) return tw_error_set(err, TW_ERR_CONFIG, "%s: input.assets is empty", shown);
    GDALAllRegister();
    json_t *root = NULL;
    tw_status st = read_item(item, shown, &root, err);
    if (st != TW_OK) return st;
    tw_stac *s = tw_calloc(TW_MEM_OTHER, 1, sizeof *s);
    char **hrefs = tw_calloc(TW_MEM_OTHER, (size_t)n, sizeof *hrefs);
    if (!s || !hrefs) {
        json_decref(root);
        tw_free(s);
        tw_free(hrefs);
        return tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    }
    snprintf(s->item, sizeof s->item, "%s", item);
    s->hrefs = hrefs;
    s->n = n;
    json_t *jassets = json_object_get(root, "assets");
    const char *type = json_string_value(json_object_get(root, "type"));
    if (!json_is_object(jassets) || (type && strcmp(type, "Feature") != 0))
        st = tw_error_set(err, TW_ERR_INPUT,
                          "%s is not a STAC item (a GeoJSON Feature with \"assets\")%s", shown,
                          type && strcmp(type, "FeatureCollection") == 0
                              ? ": it is a collection; give one item per input.path"
                              : "");
    json_t *props = json_object_get(root, "properties");
    const char *dt = json_string_value(json_object_get(props, "datetime"));
    s->datetime_key = dt ? "properties.datetime" : "";
    if (!dt) {
        dt = json_string_value(json_object_get(props, "start_datetime"));
        s->datetime_key = dt ? "properties.start_datetime" : "";
    }
    snprintf(s->datetime, sizeof s->datetime, "%s", dt ? dt : "");
    double gt0[6] = {0, 1, 0, 0, 0, 1};
    int w0 = 0, h0 = 0;
    char crs0[4096];
    for (int i = 0; st == TW_OK && i < n; i++) {
        json_t *a = json_object_get(jassets, assets[i]);
        const char *href = json_string_value(json_object_get(a, "href"));
        if (!href) {
            char names[512] = "";
            const char *k;
            json_t *v;
            size_t len = 0;
            json_object_foreach(jassets, k, v)
            {
                (void)v;
                int m = snprintf(names + len, sizeof names - len, "%s%s", len ? ", " : "", k);
                if (m < 0 || (size_t)m >= sizeof names - len) break;
                len += (size_t)m;
            }
            st = tw_error_set(err, TW_ERR_CONFIG,
                              "input.assets: %s has no asset '%s'%s (its assets: %s)", shown,
                              assets[i], a ? " with an href" : "", names);
            break;
        }
        char user[TW_PATH_MAX * 2], gpath[TW_PATH_MAX * 2];
        resolve_href(item, href, user, sizeof user);
        st = tw_url_to_gdal(user, gpath, sizeof gpath, err);
        if (st == TW_OK)
            st =
                check_asset(shown, assets[i], gpath, gt0, &w0, &h0, crs0, sizeof crs0, i == 0, err);
        if (st == TW_OK) {
            s->hrefs[i] = CPLStrdup(gpath);
        }
    }
    json_decref(root);
    if (st == TW_OK) {
        char stem[64];
        tw_url_stem(item, stem, sizeof stem);
        snprintf(s->vrt, sizeof s->vrt, "/vsimem/tilewise-stac/%d/%s.vrt",
                 atomic_fetch_add(&g_stac_seq, 1), stem);
        char *argv[] = {"-separate", NULL};
        GDALBuildVRTOptions *o = GDALBuildVRTOptionsNew(argv, NULL);
        int usage = 0;
        CPLPushErrorHandler(CPLQuietErrorHandler);
        GDALDatasetH vrt =
            o ? GDALBuildVRT(s->vrt, n, NULL, (const char *const *)s->hrefs, o, &usage) : NULL;
        char why[512];
        snprintf(why, sizeof why, "%s", CPLGetLastErrorMsg());
        if (vrt) GDALClose(vrt); /* writes the VRT file under /vsimem/ */
        CPLPopErrorHandler();
        GDALBuildVRTOptionsFree(o);
        if (!vrt) {
            char wshown[1024];
            tw_url_redact(why, wshown, sizeof wshown);
            st = tw_error_set(err, TW_ERR_INPUT, "%s: cannot stack the assets: %s", shown, wshown);
        }
    }
    if (st != TW_OK) {
        tw_stac_destroy(s);
        return st;
    }
    *out = s;
    return TW_OK;
}

const char *tw_stac_path(const tw_stac *s)
{
    return s->vrt;
}

const char *tw_stac_datetime(const tw_stac *s)
{
    return s->datetime;
}

const char *tw_stac_datetime_key(const tw_stac *s)
{
    return s->datetime_key;
}

const char *tw_stac_asset(const tw_stac *s, int k)
{
    return s->hrefs[k];
}

tw_status tw_stac_identity(const tw_stac *s, char *out, size_t size, tw_error *err)
{
    size_t len = 0;
    out[0] = '\0';
    char line[TW_URL_SHOWN_MAX + 512];
    for (int i = -1; i < s->n; i++) {
        tw_status st = tw_identity(i < 0 ? s->item : s->hrefs[i], line, sizeof line, err);
        if (st != TW_OK) return st;
        int m = snprintf(out + len, size - len, "%s", line);
        if (m < 0 || (size_t)m >= size - len) break;
        len += (size_t)m;
    }
    return TW_OK;
}

void tw_stac_destroy(tw_stac *s)
{
    if (!s) return;
    if (s->vrt[0]) VSIUnlink(s->vrt);
    for (int i = 0; s->hrefs && i < s->n; i++) CPLFree(s->hrefs[i]);
    tw_free(s->hrefs);
    tw_free(s);
}

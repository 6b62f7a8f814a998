/* stac_datetime.c - an input's acquisition time for its STAC item
 * (stac_out.h, tw_stac_raster_datetime): its metadata's datetime
 * (ACQUISITIONDATETIME, TIFFTAG_DATETIME) normalized to RFC 3339. */
#include "io/output/stac_out.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include <cpl_conv.h>
#include <cpl_error.h>
#include <gdal.h>

#include "core/datetime.h"

/* Metadata text to RFC 3339: "YYYY:MM:DD HH:MM:SS" (TIFF) or
 * "YYYY-MM-DD[T ]HH:MM:SS[.f][zone]"; UTC when no zone is given. */
static bool normalize_datetime(const char *v, char *out, size_t size)
{
    char t[64];
    snprintf(t, sizeof t, "%s", v);
    size_t n = strlen(t);
    while (n && isspace((unsigned char)t[n - 1])) t[--n] = '\0';
    if (n < 19) return false;
    if (t[4] == ':' && t[7] == ':') t[4] = t[7] = '-';
    if (t[10] == ' ') t[10] = 'T';
    char cand[80];
    if (n == 19 || (t[19] == '.' && strspn(t + 20, "0123456789") == n - 20))
        snprintf(cand, sizeof cand, "%sZ", t);
    else
        snprintf(cand, sizeof cand, "%s", t);
    if (!tw_rfc3339_check(cand, NULL, 0) || strlen(cand) >= size) return false;
    snprintf(out, size, "%s", cand);
    return true;
}

bool tw_stac_raster_datetime(const char *gdal_path, char *out, size_t size, char *source,
                             size_t source_size)
{
    static const struct {
        const char *domain, *item;
    } where[] = {
        {"IMAGERY", "ACQUISITIONDATETIME"}, {NULL, "ACQUISITIONDATETIME"},
        {NULL, "ACQUISITION_DATETIME"},     {NULL, "DATETIME"},
        {NULL, "TIFFTAG_DATETIME"},
    };
    CPLPushErrorHandler(CPLQuietErrorHandler);
    GDALDatasetH ds = GDALOpenEx(gdal_path, GDAL_OF_RASTER | GDAL_OF_READONLY, NULL, NULL, NULL);
    CPLPopErrorHandler();
    if (!ds) return false;
    bool found = false;
    for (size_t i = 0; !found && i < sizeof where / sizeof where[0]; i++) {
        const char *v = GDALGetMetadataItem(ds, where[i].item, where[i].domain);
        if (v && normalize_datetime(v, out, size)) {
            found = true;
            snprintf(source, source_size, "%s%s%s", where[i].domain ? where[i].domain : "",
                     where[i].domain ? ":" : "", where[i].item);
        }
    }
    GDALClose(ds);
    return found;
}

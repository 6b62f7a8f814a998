/* legend.c - see legend.h */
#include "io/output/legend.h"

#include <gdal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

/* The class names of the TILEWISE_RUN item ("classes":["a","b"]) as "a, b"
 * into out; false when there are none. Names are written by tilewise
 * (report.c) without escapes other than \" and \\, which are copied raw. */
static bool run_classes(const char *run, char *out, size_t size)
{
    const char *p = run ? strstr(run, "\"classes\":[") : NULL;
    if (!p) return false;
    p += strlen("\"classes\":[");
    size_t n = 0;
    int count = 0;
    while (*p && *p != ']' && n + 8 < size) {
        if (*p != '"') {
            p++;
            continue;
        }
        p++;
        if (count++) n += (size_t)snprintf(out + n, size - n, ", ");
        while (*p && *p != '"' && n + 8 < size) {
            if (*p == '\\' && p[1]) p++;
            out[n++] = *p++;
        }
        out[n] = '\0';
        if (*p == '"') p++;
    }
    return count > 0;
}

bool tw_legend_note(const char *path, char *buf, size_t size)
{
    CPLPushErrorHandler(CPLQuietErrorHandler);
    GDALAllRegister();
    GDALDatasetH ds = GDALOpenEx(path, GDAL_OF_RASTER | GDAL_OF_READONLY, NULL, NULL, NULL);
    bool ok = false;
    if (ds && GDALGetRasterCount(ds) == 1) {
        GDALRasterBandH b = GDALGetRasterBand(ds, 1);
        if (GDALGetRasterColorTable(b)) {
            char **cats = GDALGetRasterCategoryNames(b);
            bool has_names = cats && cats[0];
            char side[4096];
            struct stat st;
            snprintf(side, sizeof side, "%s.aux.xml", path);
            bool sidecar = stat(side, &st) == 0;
            char names[1024];
            bool in_run =
                run_classes(GDALGetMetadataItem(ds, "TILEWISE_RUN", NULL), names, sizeof names);
            const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
            if (has_names && sidecar)
                snprintf(buf, size,
                         "class names from %s.aux.xml: keep it next to the .tif (GDAL's GTiff "
                         "and COG keep category names only there); colours%s are inside the file",
                         base, in_run ? " and TILEWISE_RUN (class names too)" : "");
            else if (has_names)
                snprintf(buf, size, "class names and colours inside the file");
            else if (in_run)
                snprintf(buf, size,
                         "no category names (%s.aux.xml did not come along): colours only; the "
                         "class names are in the TILEWISE_RUN metadata inside the file: %s",
                         base, names);
            else
                snprintf(buf, size, "colour table only, no class names");
            ok = true;
        }
    }
    if (ds) GDALClose(ds);
    CPLPopErrorHandler();
    return ok;
}

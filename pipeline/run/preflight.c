/* preflight.c - see preflight.h */
#include "pipeline/run/preflight.h"

#include <ctype.h>
#include <dirent.h>
#include <limits.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cpl_error.h>
#include <cpl_minixml.h>
#include <cpl_string.h>
#include <gdal.h>

#include "core/alloc.h"
#include "core/fileio.h"
#include "io/gdal_msgs.h"
#include "io/url.h"
#include "io/output/writer.h"
#include "pipeline/engine/budget.h"
#include "pipeline/engine/plan.h"

tw_status tw_preflight_weights(const char *path, tw_error *err)
{
    /* a FIFO would block the open until a writer came */
    tw_status rst = tw_path_check_regular(path, "model file", false, TW_ERR_MODEL, err);
    if (rst != TW_OK) return rst;
    FILE *f = fopen(path, "rb");
    if (!f) return TW_OK; /* the model reader names the path and the reason */
    unsigned char m[4] = {0};
    size_t n = fread(m, 1, sizeof m, f);
    fclose(f);
    /* torch.save writes a zip archive (PyTorch >= 1.6) or a bare pickle
     * (protocol 2..5 starts with 0x80 and the protocol number). Neither an
     * HDF5 file (\x89HDF) nor a safetensors file (little-endian header
     * length) starts so. */
    bool zip = n == 4 && m[0] == 'P' && m[1] == 'K' && m[2] == 3 && m[3] == 4;
    bool pickle = n >= 2 && m[0] == 0x80 && m[1] >= 2 && m[1] <= 5;
    if (zip || pickle)
        return tw_error_set(err, TW_ERR_MODEL,
                            "%s is a PyTorch checkpoint (%s), which tilewise does not read: "
                            "convert it with tools/export_model.py %s -o model.h5 (add --bands, "
                            "--mean, --std, --classes), then set model.weights to model.h5",
                            path, zip ? "torch.save zip archive" : "pickle", path);
    return TW_OK;
}

/* ---- creation options ---- */

static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return 99;
    size_t d[64][64];
    for (size_t i = 0; i <= la; i++) d[i][0] = i;
    for (size_t j = 0; j <= lb; j++) d[0][j] = j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            size_t c = toupper((unsigned char)a[i - 1]) == toupper((unsigned char)b[j - 1]) ? 0 : 1;
            size_t v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
            if (d[i - 1][j - 1] + c < v) v = d[i - 1][j - 1] + c;
            d[i][j] = v;
        }
    return d[la][lb];
}

static const char *xml_text(const CPLXMLNode *n)
{
    for (const CPLXMLNode *c = n->psChild; c; c = c->psNext)
        if (c->eType == CXT_Text) return c->pszValue;
    return "";
}

static const CPLXMLNode *find_option(const CPLXMLNode *root, const char *name)
{
    for (const CPLXMLNode *o = root ? root->psChild : NULL; o; o = o->psNext)
        if (o->eType == CXT_Element && strcmp(o->pszValue, "Option") == 0) {
            const char *on = CPLGetXMLValue(o, "name", "");
            if (strcasecmp(on, name) == 0) return o;
        }
    return NULL;
}

/* The known option nearest to name (edit distance <= 2), or NULL. */
static const char *nearest_option(const CPLXMLNode *root, const char *name)
{
    const char *best = NULL;
    size_t bd = 3;
    for (const CPLXMLNode *o = root ? root->psChild : NULL; o; o = o->psNext) {
        if (o->eType != CXT_Element || strcmp(o->pszValue, "Option") != 0) continue;
        const char *on = CPLGetXMLValue(o, "name", "");
        size_t d = edit_distance(name, on);
        if (d < bd) {
            bd = d;
            best = on;
        }
    }
    return best;
}

tw_status tw_preflight_creation_options(tw_format format, const char (*opts)[128], int n,
                                        tw_error *err)
{
    const char *driver = format == TW_FORMAT_COG ? "COG" : "GTiff";
    if (!GDALGetDriverByName("GTiff")) GDALAllRegister();
    GDALDriverH drv = GDALGetDriverByName(driver);
    if (!drv) return tw_error_set(err, TW_ERR_INTERNAL, "GDAL has no %s driver", driver);
    const char *xml = GDALGetMetadataItem(drv, GDAL_DMD_CREATIONOPTIONLIST, NULL);
    CPLXMLNode *root = xml ? CPLParseXMLString(xml) : NULL;
    tw_status st = TW_OK;
    char **list = NULL;
    for (int i = 0; i < n && st == TW_OK; i++) {
        const char *o = opts[i];
        const char *eq = strchr(o, '=');
        size_t kl = eq ? (size_t)(eq - o) : 0;
        char key[128];
        if (!eq || kl == 0 || kl >= sizeof key) {
            st = tw_error_set(err, TW_ERR_CONFIG,
                              "output.creation_options: '%.127s' is not KEY=VALUE (e.g. "
                              "COMPRESS=ZSTD)",
                              o);
            break;
        }
        memcpy(key, o, kl);
        key[kl] = '\0';
        const char *val = eq + 1;
        if (!root) {
            list = CSLSetNameValue(list, key, val);
            continue;
        }
        const CPLXMLNode *opt = find_option(root, key);
        if (!opt) {
            const char *near = nearest_option(root, key);
            if (near)
                st = tw_error_set(err, TW_ERR_CONFIG,
                                  "output.creation_options: %s is not a creation option of "
                                  "GDAL's %s driver (did you mean %s?)",
                                  key, driver, near);
            else
                st = tw_error_set(err, TW_ERR_CONFIG,
                                  "output.creation_options: %s is not a creation option of "
                                  "GDAL's %s driver (see gdalinfo --format %s)",
                                  key, driver, driver);
            break;
        }
        if (strcmp(CPLGetXMLValue(opt, "type", ""), "string-select") == 0) {
            bool found = false;
            char allowed[400] = "";
            size_t used = 0;
            for (const CPLXMLNode *v = opt->psChild; v; v = v->psNext) {
                if (v->eType != CXT_Element || strcmp(v->pszValue, "Value") != 0) continue;
                const char *t = xml_text(v);
                const char *alias = CPLGetXMLValue(v, "alias", NULL);
                if (strcasecmp(t, val) == 0 || (alias && strcasecmp(alias, val) == 0)) found = true;
                int w =
                    snprintf(allowed + used, sizeof allowed - used, "%s%s", used ? ", " : "", t);
                if (w > 0 && (size_t)w < sizeof allowed - used) used += (size_t)w;
            }
            if (!found) {
                st = tw_error_set(err, TW_ERR_CONFIG,
                                  "output.creation_options: %s=%s: GDAL's %s driver accepts %s = "
                                  "%s",
                                  key, val, driver, key, allowed);
                break;
            }
        }
        list = CSLSetNameValue(list, key, val);
    }
    if (st == TW_OK && list) {
        /* GDAL's own check (types, ranges): it only warns; make it an error. */
        tw_gdal_msgs m;
        tw_gdal_capture_begin(&m);
        int ok = GDALValidateCreationOptions(drv, list);
        tw_gdal_capture_end();
        /* (it speaks in warnings: the first one names the option) */
        const char *why = m.failure[0] ? m.failure : m.first_warning;
        if (!ok)
            st = tw_error_set(err, TW_ERR_CONFIG, "output.creation_options (format %s): %s", driver,
                              why[0] ? why : "invalid option");
    }
    CSLDestroy(list);
    if (root) CPLDestroyXMLNode(root);
    return st;
}

/* The products written once, 16 x 16 cells, with the run's format, types,
 * creation options and colours, into a temporary directory: whatever the
 * driver refuses only when it creates or converts a file (COMPRESS=JPEG
 * with float32 probabilities, a COG option that fails at conversion) is
 * found here rather than after the last tile. */
static tw_status trial_write(const tw_run_params *p, int n_classes, tw_error *err)
{
    unsigned products = p->output.products & (TW_PRODUCT_CLASS | TW_PRODUCT_PROB | TW_PRODUCT_CONF);
    if (!products || n_classes < 1) return TW_OK;
    char dir[] = "/tmp/tilewise-preflight-XXXXXX";
    if (!mkdtemp(dir)) return TW_OK; /* no scratch space: the run will tell */
    enum { N = 16 };
    float *probs = tw_alloc(TW_MEM_OTHER, sizeof(float) * N * N * (size_t)n_classes);
    uint8_t has[N * N];
    memset(has, 1, sizeof has);
    tw_status st = TW_OK;
    if (!probs) st = tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    for (size_t i = 0; st == TW_OK && i < (size_t)N * N * (size_t)n_classes; i++)
        probs[i] = 1.0f / (float)n_classes;
    tw_writer_params wp = {
        .dir = dir,
        .stem = "trial",
        .grid_w = N,
        .grid_h = N,
        .geotransform = {0, 1, 0, 0, 0, -1},
        .n_classes = n_classes,
        .products = products,
        .prob_type = p->output.prob_type,
        .format = p->output.format,
        .creation_options = (const char(*)[128])p->output.creation_options,
        .n_creation_options = p->output.n_creation_options,
        .colors = p->model.n_colors > 0 ? (const unsigned char(*)[3])p->model.colors : NULL,
        .n_colors = p->model.n_colors,
    };
    tw_writer *w = NULL;
    tw_error e;
    tw_error_init(&e);
    if (st == TW_OK) {
        tw_status ws = tw_writer_create(&wp, &w, &e);
        if (ws == TW_OK) ws = tw_writer_write_rows(w, 0, N, probs, has, &e);
        if (ws == TW_OK) ws = tw_writer_finish(w, &e);
        tw_writer_destroy(w);
        if (ws == TW_ERR_NOMEM)
            st = tw_error_set(err, ws, "%s", e.msg);
        else if (ws != TW_OK)
            st = tw_error_set(err, TW_ERR_CONFIG,
                              "output.creation_options: a trial write of the outputs (format %s) "
                              "failed: %s",
                              p->output.format == TW_FORMAT_COG ? "COG" : "GTiff", e.msg);
    }
    tw_free(probs);
    /* Remove what the trial left (products, sidecars, temporaries). */
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *de;
        char path[sizeof dir + 300];
        while ((de = readdir(d)) != NULL) {
            if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
            snprintf(path, sizeof path, "%s/%.250s", dir, de->d_name);
            unlink(path);
        }
        closedir(d);
    }
    rmdir(dir);
    return st;
}

/* ---- padding ---- */

/* Pixels of the tiles along one axis that lie inside the raster. */
static int64_t axis_inside(const tw_axis *ax, int tile, int stride)
{
    int64_t in = 0;
    for (int a = 0; a < ax->n_pos; a++) {
        int pos = tw_axis_pos(ax, tile, stride, a);
        int n = ax->size - pos < tile ? ax->size - pos : tile;
        if (n > 0) in += n;
    }
    return in;
}

double tw_preflight_padding(int width, int height, int tile, int stride, tw_edge_mode edge)
{
    tw_plan plan;
    tw_error e;
    tw_error_init(&e);
    /* (cells of a pixel: only the tiles' places count here, and they do not
     * depend on the cells; any stride in 1..tile) */
    if (tw_plan_make_cell(width, height, tile, stride, 1, edge, 0, 1, &plan, &e) != TW_OK ||
        plan.x.n_pos < 1 || plan.y.n_pos < 1)
        return -1;
    /* Tiles are the product of the two axes' positions. */
    double inside =
        (double)axis_inside(&plan.x, tile, stride) * (double)axis_inside(&plan.y, tile, stride);
    return 1.0 - inside / ((double)plan.x.n_pos * tile * (double)plan.y.n_pos * tile);
}

/* ---- output directory ---- */

uint64_t tw_preflight_output_bytes(const tw_preflight_params *pp)
{
    const tw_run_params *p = pp->run;
    const unsigned prod = p->output.products;
    const uint64_t C = (uint64_t)pp->n_classes;
    uint64_t total = 0;
    for (int i = 0; i < pp->n_inputs; i++) {
        if (pp->width[i] <= 0) continue;
        uint64_t S = (uint64_t)(pp->cell > 0 ? pp->cell : pp->stride);
        uint64_t gw = ((uint64_t)pp->width[i] + S - 1) / S,
                 gh = ((uint64_t)pp->height[i] + S - 1) / S;
        uint64_t cells = gw * gh, per = 0;
        /* output.resolution: input writes the rasters on the input's pixel
         * grid (stride^2 times the cells), from a float32 probability
         * raster of the cells in the parts directory. */
        bool input_grid = p->output.resolution == TW_RESOLUTION_INPUT;
        uint64_t px = input_grid ? (uint64_t)pp->width[i] * (uint64_t)pp->height[i] : cells;
        uint64_t raster = 0;
        if (prod & TW_PRODUCT_CLASS) raster += 1;
        if (prod & TW_PRODUCT_PROB)
            raster += C * (p->output.prob_type == TW_PROB_UINT8 ? 1 : 4) + 1;
        if (prod & TW_PRODUCT_CONF) raster += 4;
        total += px * raster;
        if (input_grid && raster) per += C * 4; /* the cells' probabilities, resampled */
        /* embedding_raster: D bands on the cell grid, uncompressed (features
         * compress little), and D floats per cell in the chunks */
        uint64_t E = (prod & TW_PRODUCT_EMB_RASTER) ? (uint64_t)pp->feat_dim : 0;
        static const uint64_t emb_bytes[] = {4, 2, 1};
        if (E) total += cells * E * emb_bytes[p->output.emb_type];
        per += (C + E) * 4 + 1;              /* committed chunks, until assembly */
        uint64_t k = (uint64_t)pp->tile / S; /* (tile products: a classifier's, S = stride) */
        uint64_t tiles = cells / k / k + 1;
        if (prod & (TW_PRODUCT_TILES | TW_PRODUCT_EMB | TW_PRODUCT_TILES_GPKG))
            total +=
                tiles * (8 + 4 * (C + ((prod & TW_PRODUCT_EMB) ? (uint64_t)pp->feat_dim : 0))) * 2;
        total += cells * per;
    }
    return total;
}

/* The deepest existing directory on the way to path, into buf. */
static bool nearest_existing(const char *path, char *buf, size_t size, struct stat *sb)
{
    if (snprintf(buf, size, "%s", path[0] ? path : ".") >= (int)size) return false;
    for (;;) {
        if (stat(buf, sb) == 0) return true;
        char *slash = strrchr(buf, '/');
        if (!slash) {
            snprintf(buf, size, ".");
            return stat(buf, sb) == 0;
        }
        if (slash == buf) {
            buf[1] = '\0';
            return stat(buf, sb) == 0;
        }
        *slash = '\0';
    }
}

static tw_status check_dir(const char *dir, tw_error *err)
{
    char at[TW_PATH_MAX];
    struct stat sb;
    if (!nearest_existing(dir, at, sizeof at, &sb))
        return tw_error_set(err, TW_ERR_OUTPUT, "output.dir: %s: no part of the path exists", dir);
    if (!S_ISDIR(sb.st_mode)) {
        if (strcmp(at, dir) == 0)
            return tw_error_set(err, TW_ERR_OUTPUT, "output.dir: %s exists and is not a directory",
                                dir);
        return tw_error_set(err, TW_ERR_OUTPUT,
                            "output.dir: %s cannot be created: %s is a file, not a directory", dir,
                            at);
    }
    if (access(at, W_OK | X_OK) != 0) {
        if (strcmp(at, dir) == 0)
            return tw_error_set(err, TW_ERR_OUTPUT, "output.dir: %s is not writable: %s", dir,
                                strerror(errno));
        return tw_error_set(err, TW_ERR_OUTPUT, "output.dir: %s cannot be created in %s: %s", dir,
                            at, strerror(errno));
    }
    /* access() says yes to root on /proc, /sys and to read-only mounts; a
     * run's first write there is a mkdir (output.dir's path, or its
     * .tilewise/), so try one, and remove it at once. */
    char probe[TW_PATH_MAX + 32];
    if (snprintf(probe, sizeof probe, "%s/.tilewise-probe-XXXXXX", at) < (int)sizeof probe) {
        if (!mkdtemp(probe))
            return tw_error_set(err, TW_ERR_OUTPUT,
                                "output.dir: %s: cannot create a directory in %s: %s", dir, at,
                                strerror(errno));
        rmdir(probe);
    }
    return TW_OK;
}

/* ---- outputs against inputs ---- */

/* One path the run writes, resolved. */
typedef struct out_path {
    char path[TW_PATH_MAX + 300]; /* real output.dir + name */
    const char *what;             /* "the prob product of", "the report of the run", ... */
    int input;                    /* whose product, -1: the run's */
    bool exists;
    dev_t dev;
    ino_t ino;
} out_path;

typedef struct out_list {
    out_path *v;
    int n, cap;
    char dir[PATH_MAX]; /* output.dir, resolved */
} out_list;

static bool out_add(out_list *l, const char *name, const char *what, int input)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        out_path *v = tw_alloc(TW_MEM_OTHER, (size_t)cap * sizeof *v);
        if (!v) return false;
        if (l->n) memcpy(v, l->v, (size_t)l->n * sizeof *v);
        tw_free(l->v);
        l->v = v;
        l->cap = cap;
    }
    out_path *o = &l->v[l->n++];
    snprintf(o->path, sizeof o->path, "%.1023s/%.299s", l->dir, name);
    o->what = what;
    o->input = input;
    struct stat sb;
    o->exists = stat(o->path, &sb) == 0;
    o->dev = o->exists ? sb.st_dev : 0;
    o->ino = o->exists ? sb.st_ino : 0;
    return true;
}

/* Every file a run of pp writes directly in output.dir (the store under
 * .tilewise/ is compared by its prefix). */
static bool out_collect(const tw_preflight_params *pp, out_list *l)
{
    const tw_run_params *p = pp->run;
    const tw_product *files[TW_PRODUCT_COUNT];
    int n_files = tw_product_files(files);
    unsigned wrote = tw_products_with_implied(p->output.products);
    bool fgb = p->output.vector_format == TW_VECTOR_FGB;
    char name[600];
    bool ok = true;
    for (int i = 0; ok && i < pp->n_inputs; i++) {
        if (pp->width[i] <= 0) continue;
        for (int k = 0; ok && k < n_files; k++) {
            if (!(wrote & files[k]->bit)) continue;
            snprintf(name, sizeof name, "%s%s", pp->stems[i], tw_product_suffix(files[k], fgb));
            ok = out_add(l, name, files[k]->what, i);
        }
        if (ok && p->output.stac) {
            snprintf(name, sizeof name, "%s.stac.json", pp->stems[i]);
            ok = out_add(l, name, "the STAC item of", i);
        }
    }
    char shard[40] = "";
    if (p->shard_count > 1)
        snprintf(shard, sizeof shard, ".shard%04d-of-%04d", p->shard_index + 1, p->shard_count);
    snprintf(name, sizeof name, "run%s.json", shard);
    if (ok) ok = out_add(l, name, "the run's report", -1);
    snprintf(name, sizeof name, "run%s.failed.json", shard);
    if (ok) ok = out_add(l, name, "the run's failure report", -1);
    if (ok && p->output.stac) ok = out_add(l, "collection.json", "the STAC collection", -1);
    return ok;
}

/* Is file (an input's, resolved as real and stat'ed) one the run writes?
 * The output it is, or NULL; *store set when it lies under .tilewise/. */
static const out_path *out_find(const out_list *l, const char *real, const struct stat *sb,
                                bool *store)
{
    size_t dl = strlen(l->dir);
    *store = strncmp(real, l->dir, dl) == 0 && strncmp(real + dl, "/.tilewise/", 11) == 0;
    for (int k = 0; k < l->n; k++) {
        const out_path *o = &l->v[k];
        if (strcmp(o->path, real) == 0) return o;
        if (sb && o->exists && o->dev == sb->st_dev && o->ino == sb->st_ino) return o;
    }
    return NULL;
}

/* The files of a local input: GDAL's list (the raster, its sidecars, a
 * VRT's sources), or the path alone when GDAL cannot open it or it is not
 * a regular file (a FIFO is not opened). Remote: none. */
static char **input_files(const char *path, const char *source)
{
    if (tw_url_is_remote(path)) return NULL;
    const char *src = source ? source : path;
    struct stat sb;
    bool local_file = stat(src, &sb) == 0 && S_ISREG(sb.st_mode);
    bool vsimem = strncmp(src, "/vsimem/", 8) == 0;
    char **list = NULL;
    if (local_file || vsimem) {
        CPLPushErrorHandler(CPLQuietErrorHandler);
        GDALDatasetH ds = GDALOpenEx(src, GDAL_OF_RASTER | GDAL_OF_READONLY, NULL, NULL, NULL);
        list = ds ? GDALGetFileList(ds) : NULL;
        if (ds) GDALClose(ds);
        CPLPopErrorHandler();
    }
    if (!vsimem) list = CSLAddString(list, path);
    return list;
}

static tw_status check_not_inputs(const tw_preflight_params *pp, tw_error *err)
{
    const tw_run_params *p = pp->run;
    out_list l = {0};
    if (!realpath(p->output.dir, l.dir)) return TW_OK; /* not there yet: holds no input */
    if (!out_collect(pp, &l)) {
        tw_free(l.v);
        return tw_error_set(err, TW_ERR_NOMEM, "out of memory");
    }
    tw_status st = TW_OK;
    for (int i = 0; st == TW_OK && i < p->input.n_paths; i++) {
        char **files = input_files(p->input.paths[i], pp->sources ? pp->sources[i] : NULL);
        for (int f = 0; st == TW_OK && files && files[f]; f++) {
            char real[PATH_MAX];
            struct stat sb;
            if (strncmp(files[f], "/vsi", 4) == 0 || !realpath(files[f], real)) continue;
            bool has_sb = stat(real, &sb) == 0;
            bool store = false;
            const out_path *o = out_find(&l, real, has_sb ? &sb : NULL, &store);
            if (!o && !store) continue;
            char shown[TW_URL_SHOWN_MAX], whose[TW_URL_SHOWN_MAX + 16] = "";
            tw_url_redact(p->input.paths[i], shown, sizeof shown);
            bool itself = strcmp(files[f], p->input.paths[i]) == 0 ||
                          (pp->sources && pp->sources[i] && strcmp(files[f], pp->sources[i]) == 0);
            char of[TW_URL_SHOWN_MAX + 300] = "";
            if (o && o->input >= 0) {
                tw_url_redact(p->input.paths[o->input], whose, sizeof whose);
                snprintf(of, sizeof of, "%s input %s", o->what, whose);
            } else if (o) {
                snprintf(of, sizeof of, "%s", o->what);
            }
            if (store)
                st = tw_error_set(err, TW_ERR_CONFIG,
                                  "input.path: %s%s%s lies in %s/.tilewise/, the run's own store "
                                  "of parts, which it writes and removes: move the input, or "
                                  "choose another output.dir",
                                  itself ? "" : files[f], itself ? "" : ", a file of ", shown,
                                  p->output.dir);
            else if (itself)
                st = tw_error_set(
                    err, TW_ERR_CONFIG,
                    "output.dir/output.name: %s (%s) would overwrite the input %s "
                    "(input.path); refused before the first tile: choose another output.dir "
                    "or output.name",
                    o->path, of, shown);
            else
                st = tw_error_set(
                    err, TW_ERR_CONFIG,
                    "output.dir/output.name: %s (%s) would overwrite %s, a file of "
                    "the input %s (input.path: its sidecar or a VRT's source): "
                    "refused before the first tile: choose another output.dir or output.name",
                    o->path, of, files[f], shown);
        }
        CSLDestroy(files);
    }
    tw_free(l.v);
    return st;
}

tw_status tw_preflight_submit(const tw_run_params *p, tw_error *err)
{
    tw_status st = tw_preflight_weights(p->model.weights, err);
    if (st == TW_OK)
        st = tw_preflight_creation_options(p->output.format,
                                           (const char(*)[128])p->output.creation_options,
                                           p->output.n_creation_options, err);
    if (st == TW_OK) st = check_dir(p->output.dir, err);
    return st;
}

tw_status tw_preflight_output(const tw_preflight_params *pp, tw_preflight_warnings *warn,
                              tw_error *err)
{
    const tw_run_params *p = pp->run;
    warn->n = 0;
    tw_status st = tw_preflight_creation_options(p->output.format,
                                                 (const char(*)[128])p->output.creation_options,
                                                 p->output.n_creation_options, err);
    if (st == TW_OK) st = check_dir(p->output.dir, err);
    if (st == TW_OK) st = check_not_inputs(pp, err);
    if (st == TW_OK) st = trial_write(p, pp->n_classes, err);
    if (st != TW_OK) return st;
    /* A final path taken by a directory fails at assembly: say it now. */
    const tw_product *files[TW_PRODUCT_COUNT];
    int n_files = tw_product_files(files);
    unsigned wrote = tw_products_with_implied(p->output.products);
    bool fgb = p->output.vector_format == TW_VECTOR_FGB;
    for (int i = 0; i < pp->n_inputs; i++) {
        if (pp->width[i] <= 0) continue;
        for (int k = 0; k < n_files; k++) {
            if (!(wrote & files[k]->bit)) continue;
            char path[TW_PATH_MAX + 300];
            struct stat sb;
            snprintf(path, sizeof path, "%s/%s%s", p->output.dir, pp->stems[i],
                     tw_product_suffix(files[k], fgb));
            if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
                return tw_error_set(err, TW_ERR_OUTPUT, "output %s exists and is a directory",
                                    path);
        }
    }
    char at[TW_PATH_MAX];
    struct stat sb;
    struct statvfs vfs;
    if (nearest_existing(p->output.dir, at, sizeof at, &sb) && statvfs(at, &vfs) == 0) {
        uint64_t avail = (uint64_t)vfs.f_bavail * (uint64_t)vfs.f_frsize;
        uint64_t need = tw_preflight_output_bytes(pp);
        if (need > avail && warn->n < TW_PREFLIGHT_MAX_WARNINGS) {
            char b1[32], b2[32];
            snprintf(warn->msg[warn->n++], sizeof warn->msg[0],
                     "output.dir: %.300s has %s free; the outputs may need up to %s before "
                     "compression (products, and the committed chunks until assembly)",
                     at, tw_format_bytes(avail, b1, sizeof b1),
                     tw_format_bytes(need, b2, sizeof b2));
        }
    }
    return TW_OK;
}

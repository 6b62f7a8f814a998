/* workflow.c - the YAML workflow file into tw_run_params (see workflow.h).
 *
 * The file is loaded with libyaml's document API (nodes carry their line),
 * then walked with a fixed depth: sections -> keys -> list items. Nothing is
 * recursive, so anchors, aliases and cycles in hostile input cannot hurt us;
 * every node is checked for the type we expect before it is used.
 *
 * Each known key has one setter that fully validates its value and replaces
 * the field it owns, so a key given in the file and again with --set goes
 * through exactly the same checks. Checks that involve two keys (stride vs
 * tile, mean vs std vs bands) and the required keys run once at the end, after
 * the overrides, and name where the offending key came from.
 *
 * All work happens on a private copy of the params: *out is written only on
 * success, so a failed parse leaves the caller's struct as it was.
 *
 * This file walks the document and runs the checks of more than one key;
 * workflow_values.c reads one value (scalars, lists, the messages about
 * them), workflow_setters.c holds the setter of each key
 * (workflow_internal.h).
 */
#include "config/workflow.h"
#include "config/workflow_internal.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <gdal.h>
#include <yaml.h>

#include "core/datetime.h"
#include "core/fileio.h"
#include "core/keys.h"

/* A workflow file is a few hundred bytes; anything this large is a mistake
 * (a raster passed instead of the YAML), not a config to read into memory. */
#define WF_FILE_MAX ((size_t)16 << 20)

#define N_SECTIONS TW_KEY_SECTIONS
#define k_sections tw_key_sections

/* An error at an explicit line with an explicit key label (may be NULL). */
__attribute__((format(printf, 4, 5))) static tw_status
fail_at(const wf_ctx *c, int line, const char *key, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    tw_status st = wf_fail_v(c, c->in_set, line, key, fmt, ap);
    va_end(ap);
    return st;
}

/* An error about key k as it stands after file and overrides. */
__attribute__((format(printf, 3, 4))) static tw_status fail_key(const wf_ctx *c, int k,
                                                                const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    tw_status st = wf_fail_v(c, c->origin[k].by_set, c->origin[k].line, tw_keys[k].path, fmt, ap);
    va_end(ap);
    return st;
}

/* ------------------------------------------------------------------------ */
/* key lookup and "did you mean"                                            */

/* Edit distance, capped: names are short (< 64 bytes) in every caller. */
static int edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return INT_MAX;
    int row[64];
    for (size_t j = 0; j <= lb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j];
            int best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

/* The known key closest to path ("input.bandz" -> "input.bands"; a known
 * leaf in the wrong section, "input.tile" -> "tiling.tile"), or NULL. */
static const char *suggest_key(const char *path)
{
    const char *dot = strchr(path, '.');
    const char *leaf = dot ? dot + 1 : path;
    const char *best = NULL;
    int best_d = INT_MAX;
    for (int k = 0; k < TW_KEY_COUNT; k++) {
        int d = edit_distance(path, tw_keys[k].path);
        const char *kl = strchr(tw_keys[k].path, '.') + 1;
        if (*leaf && strcmp(kl, leaf) == 0) d = d < 1 ? d : 1;
        if (d < best_d) {
            best_d = d;
            best = tw_keys[k].path;
        }
    }
    int limit = (int)strlen(path) / 3;
    if (limit < 2) limit = 2;
    return best_d <= limit ? best : NULL;
}

static const char *suggest_section(const char *name)
{
    const char *best = NULL;
    int best_d = INT_MAX;
    for (int i = 0; i < N_SECTIONS; i++) {
        int d = edit_distance(name, k_sections[i]);
        if (d < best_d) {
            best_d = d;
            best = k_sections[i];
        }
    }
    return best_d <= 2 ? best : NULL;
}

/* "path, bands, scale" for the keys of one section. */
static void section_keys(const char *section, char *buf, size_t cap)
{
    size_t sl = strlen(section);
    buf[0] = '\0';
    for (int k = 0; k < TW_KEY_COUNT; k++) {
        const char *kp = tw_keys[k].path;
        if (strncmp(kp, section, sl) != 0 || kp[sl] != '.') continue;
        if (buf[0]) strncat(buf, ", ", cap - strlen(buf) - 1);
        strncat(buf, kp + sl + 1, cap - strlen(buf) - 1);
    }
}

/* ------------------------------------------------------------------------ */
/* the document walk                                                        */

/* A mapping key: a non-null scalar without NUL bytes and of sane length. */
static tw_status key_name(wf_ctx *c, const yaml_node_t *k, const char *where, const char **name)
{
    char d[WF_SHOW_MAX + 16];
    if (!k || k->type != YAML_SCALAR_NODE || wf_is_null(k))
        return fail_at(c, wf_node_line(k), where, "expected a key name, got %s",
                       wf_describe(k, d, sizeof d));
    const char *s = (const char *)k->data.scalar.value;
    if (strlen(s) != k->data.scalar.length || k->data.scalar.length > 63) {
        char lbl[TW_ERROR_MSG_MAX / 4];
        snprintf(lbl, sizeof lbl, "%s%s%s", where ? where : "", where ? "." : "",
                 wf_show(s, k->data.scalar.length, d, sizeof d));
        return fail_at(c, wf_node_line(k), lbl, "unknown key");
    }
    *name = s;
    return TW_OK;
}

static tw_status walk_section(wf_ctx *c, const char *section, const yaml_node_t *map,
                              tw_run_params *p, int *seen_line)
{
    char d[WF_SHOW_MAX + 16];
    if (wf_is_null(map)) return TW_OK; /* "runtime:" with nothing under it */
    if (map->type != YAML_MAPPING_NODE)
        return fail_at(c, wf_node_line(map), section, "expected a mapping of keys, got %s",
                       wf_describe(map, d, sizeof d));
    for (yaml_node_pair_t *pr = map->data.mapping.pairs.start; pr < map->data.mapping.pairs.top;
         pr++) {
        const yaml_node_t *kn = yaml_document_get_node(c->doc, pr->key);
        const yaml_node_t *vn = yaml_document_get_node(c->doc, pr->value);
        const char *name;
        tw_status st = key_name(c, kn, section, &name);
        if (st) return st;
        char path[160];
        snprintf(path, sizeof path, "%s.%s", section, name);
        int line = wf_node_line(kn);
        int k = tw_key_find(path);
        if (k < 0) {
            char shown[WF_SHOW_MAX + 80];
            snprintf(shown, sizeof shown, "%s.%s", section,
                     wf_show(name, strlen(name), d, sizeof d));
            const char *s = suggest_key(path);
            if (s) return fail_at(c, line, shown, "unknown key (did you mean %s?)", s);
            char known[256];
            section_keys(section, known, sizeof known);
            return fail_at(c, line, shown, "unknown key (known keys of %s: %s)", section, known);
        }
        if (seen_line[k])
            return fail_at(c, line, path, "duplicate key (first given at line %d)", seen_line[k]);
        seen_line[k] = line;
        c->key = k;
        c->origin[k].line = line;
        c->origin[k].by_set = false;
        st = wf_setters[k](c, vn, p);
        if (st) return st;
    }
    return TW_OK;
}

static tw_status walk_document(wf_ctx *c, tw_run_params *p)
{
    char d[WF_SHOW_MAX + 16];
    const yaml_node_t *root = yaml_document_get_root_node(c->doc);
    if (wf_is_null(root))
        return fail_at(
            c, 0, NULL,
            "empty workflow file (expected sections input, model, tiling, runtime, output)");
    /* A file that is one scalar is not a workflow at all (a .netrc, a
     * raster's bytes): say what it is, never its content. */
    if (root->type == YAML_SCALAR_NODE)
        return fail_at(c, wf_node_line(root), NULL,
                       "expected a mapping of sections (input, model, tiling, runtime, output), "
                       "got a plain text of %zu bytes: not a workflow file",
                       root->data.scalar.length);
    if (root->type != YAML_MAPPING_NODE)
        return fail_at(
            c, wf_node_line(root), NULL,
            "expected a mapping of sections (input, model, tiling, runtime, output), got %s",
            wf_describe(root, d, sizeof d));
    int seen_section[N_SECTIONS] = {0};
    int seen_key[TW_KEY_COUNT] = {0};
    for (yaml_node_pair_t *pr = root->data.mapping.pairs.start; pr < root->data.mapping.pairs.top;
         pr++) {
        const yaml_node_t *kn = yaml_document_get_node(c->doc, pr->key);
        const char *name;
        tw_status st = key_name(c, kn, NULL, &name);
        if (st) return st;
        int line = wf_node_line(kn);
        int s = -1;
        for (int i = 0; i < N_SECTIONS; i++)
            if (strcmp(name, k_sections[i]) == 0) s = i;
        if (s < 0) {
            wf_show(name, strlen(name), d, sizeof d);
            const char *dot = strchr(name, '.');
            if (dot && tw_key_find(name) >= 0) /* "tiling.tile: 64" written flat */
                return fail_at(
                    c, line, d,
                    "unknown key (write it nested: '%.*s:' with '%s:' indented under it)",
                    (int)(dot - name), name, dot + 1);
            const char *sug = suggest_section(name);
            if (!sug && dot) sug = suggest_key(name);
            if (sug) return fail_at(c, line, d, "unknown key (did you mean %s?)", sug);
            return fail_at(c, line, d,
                           "unknown section (expected input, model, tiling, runtime, output)");
        }
        if (seen_section[s])
            return fail_at(c, line, name, "duplicate key (first given at line %d)",
                           seen_section[s]);
        seen_section[s] = line;
        st = walk_section(c, k_sections[s], yaml_document_get_node(c->doc, pr->value), p, seen_key);
        if (st) return st;
    }
    return TW_OK;
}

/* libyaml's own error, with the line and column it points at. */
static tw_status yaml_failure(wf_ctx *c, const yaml_parser_t *y, const char *text, size_t len,
                              const char *set_key, const char *set_value)
{
    if (y->error == YAML_MEMORY_ERROR)
        return tw_error_set(c->err, TW_ERR_NOMEM, "%s: out of memory while reading YAML", c->name);
    size_t line, col;
    if (y->error == YAML_READER_ERROR) {
        /* reader errors carry a byte offset, not a mark */
        size_t off = y->problem_offset < len ? y->problem_offset : len;
        line = 0;
        col = 0;
        for (size_t i = 0; i < off; i++) {
            if (text[i] == '\n') {
                line++;
                col = 0;
            } else {
                col++;
            }
        }
    } else {
        line = y->problem_mark.line;
        col = y->problem_mark.column;
    }
    const char *problem = y->problem ? y->problem : "unknown error";
    /* the commonest YAML mistake deserves a plain hint */
    const char *hint = "";
    size_t at = y->error == YAML_READER_ERROR ? y->problem_offset : y->problem_mark.index;
    if (at < len && text[at] == '\t') hint = " (indent YAML with spaces, not tabs)";
    /* {parent}_{stem} unquoted starts a YAML flow mapping: the line of the
     * problem has a value that starts with '{' */
    if (!*hint && y->error != YAML_READER_ERROR && at <= len) {
        size_t b = at, e = at;
        while (b > 0 && text[b - 1] != '\n') b--;
        while (e < len && text[e] != '\n') e++;
        for (size_t i = b; i + 2 < e; i++)
            if (text[i] == ':' && text[i + 1] == ' ' && text[i + 2] == '{') {
                hint = " (a value that starts with '{' is a YAML mapping: quote it, e.g. "
                       "name: \"{parent}_{stem}\")";
                break;
            }
    }
    char ctxbuf[160] = "";
    if (y->context && y->error != YAML_READER_ERROR)
        snprintf(ctxbuf, sizeof ctxbuf, " (%s at line %zu)", y->context,
                 (size_t)y->context_mark.line + 1);
    if (set_key) {
        char d[WF_SHOW_MAX + 8];
        return tw_error_set(
            c->err, TW_ERR_CONFIG, "--set %s: YAML syntax error in value '%s': %s%s%s", set_key,
            wf_show(set_value, strlen(set_value), d, sizeof d), problem, ctxbuf, hint);
    }
    return tw_error_set(c->err, TW_ERR_CONFIG, "%s:%zu:%zu: YAML syntax error: %s%s%s", c->name,
                        line + 1, col + 1, problem, ctxbuf, hint);
}

/* libyaml's scanner does work proportional to the flow nesting depth for
 * every token, so 100k '[' take minutes. No workflow nests more than a few
 * levels: refuse deep nesting before libyaml sees it. Brackets are counted
 * everywhere, quotes and comments included, so that no quoting trick can hide
 * nesting from this check; only absurd files can be refused by it. */
#define WF_FLOW_DEPTH_MAX 64

static tw_status check_nesting(wf_ctx *c, const char *text, size_t len, const char *set_key)
{
    int depth = 0, line = 1;
    for (size_t i = 0; i < len; i++) {
        char ch = text[i];
        if (ch == '\n')
            line++;
        else if (ch == '[' || ch == '{')
            depth++;
        else if ((ch == ']' || ch == '}') && depth > 0)
            depth--;
        if (depth > WF_FLOW_DEPTH_MAX) {
            if (set_key)
                return tw_error_set(c->err, TW_ERR_CONFIG,
                                    "--set %s: value nested deeper than %d levels", set_key,
                                    WF_FLOW_DEPTH_MAX);
            return fail_at(c, line, NULL, "YAML nested deeper than %d levels of [ ] or { }",
                           WF_FLOW_DEPTH_MAX);
        }
    }
    return TW_OK;
}

/* Load text as one YAML document into *doc (deleted by the caller on
 * success only: libyaml frees it itself when loading fails). */
static tw_status load_document(wf_ctx *c, yaml_document_t *doc, const char *text, size_t len,
                               const char *set_key)
{
    tw_status st = check_nesting(c, text, len, set_key);
    if (st) return st;
    yaml_parser_t y;
    if (!yaml_parser_initialize(&y))
        return tw_error_set(c->err, TW_ERR_NOMEM, "%s: out of memory while reading YAML", c->name);
    yaml_parser_set_input_string(&y, (const unsigned char *)text, len);
    if (!yaml_parser_load(&y, doc)) {
        st = yaml_failure(c, &y, text, len, set_key, text);
        yaml_parser_delete(&y);
        return st;
    }
    /* A second document would be silently ignored: say so instead. */
    if (yaml_document_get_root_node(doc)) {
        yaml_document_t extra;
        if (!yaml_parser_load(&y, &extra)) {
            st = yaml_failure(c, &y, text, len, set_key, text);
        } else {
            const yaml_node_t *r = yaml_document_get_root_node(&extra);
            if (r) {
                if (set_key)
                    st =
                        tw_error_set(c->err, TW_ERR_CONFIG,
                                     "--set %s: more than one YAML document in the value", set_key);
                else
                    st = fail_at(c, wf_node_line(r), NULL,
                                 "only one YAML document is allowed in a workflow file");
            }
            yaml_document_delete(&extra);
        }
    }
    yaml_parser_delete(&y);
    if (st) yaml_document_delete(doc);
    return st;
}

static tw_status apply_set(wf_ctx *c, const char *set, tw_run_params *p)
{
    char d[WF_SHOW_MAX + 16];
    if (!set) return tw_error_set(c->err, TW_ERR_CONFIG, "--set: missing key.path=value");
    const char *eq = strchr(set, '=');
    const char *kb = set, *ke = eq ? eq : set + strlen(set);
    while (kb < ke && isspace((unsigned char)*kb)) kb++;
    while (ke > kb && isspace((unsigned char)ke[-1])) ke--;
    char key[64];
    size_t kl = (size_t)(ke - kb);
    if (!eq || kl == 0)
        return tw_error_set(c->err, TW_ERR_CONFIG,
                            "--set %s: expected key.path=value (e.g. tiling.tile=32)",
                            wf_show(set, strlen(set), d, sizeof d));
    int k = -1;
    if (kl < sizeof key) {
        memcpy(key, kb, kl);
        key[kl] = '\0';
        k = tw_key_find(key);
    }
    if (k < 0) {
        wf_show(kb, kl, d, sizeof d);
        const char *s = kl < sizeof key ? suggest_key(key) : NULL;
        if (s)
            return tw_error_set(c->err, TW_ERR_CONFIG, "--set %s: unknown key (did you mean %s?)",
                                d, s);
        return tw_error_set(c->err, TW_ERR_CONFIG, "--set %s: unknown key", d);
    }
    const char *value = eq + 1;
    /* A string key's value that starts with '{' is a name template such as
     * {parent}_{stem}, never a YAML flow mapping (no string key takes one):
     * it is read as written, double-quoted for the parser. */
    char *quoted = NULL;
    const char *v0 = value;
    while (*v0 == ' ') v0++;
    if (*v0 == '{' && (tw_keys[k].type == TW_KT_STRING || tw_keys[k].type == TW_KT_PATH)) {
        size_t n = strlen(value);
        quoted = malloc(2 * n + 3);
        if (!quoted) return tw_error_set(c->err, TW_ERR_NOMEM, "out of memory");
        size_t o = 0;
        quoted[o++] = '"';
        for (size_t i = 0; i < n; i++) {
            if (value[i] == '"' || value[i] == '\\') quoted[o++] = '\\';
            quoted[o++] = value[i];
        }
        quoted[o++] = '"';
        quoted[o] = '\0';
        value = quoted;
    }
    yaml_document_t doc;
    tw_status st = load_document(c, &doc, value, strlen(value), tw_keys[k].path);
    free(quoted);
    if (st) return st;
    yaml_document_t *saved = c->doc;
    c->doc = &doc;
    c->in_set = true;
    c->key = k;
    st = wf_setters[k](c, yaml_document_get_root_node(&doc), p);
    c->in_set = false;
    c->doc = saved;
    yaml_document_delete(&doc);
    if (!st) {
        c->origin[k].by_set = true;
        c->origin[k].line = 0;
    }
    return st;
}

static bool given(const wf_ctx *c, int k)
{
    return c->origin[k].by_set || c->origin[k].line > 0;
}

/* Checks that involve more than one key, after the file and the overrides. */
static tw_status check_all(wf_ctx *c, const tw_run_params *p)
{
    if (!given(c, TW_KEY_INPUT_PATH))
        return fail_at(c, 0, NULL, "input.path is required (the raster(s) to classify)");
    if (!given(c, TW_KEY_MODEL_WEIGHTS))
        return fail_at(
            c, 0, NULL,
            "model.weights is required (an HDF5 bundle, a safetensors file or an ONNX model)");
    const tw_tiling_params *t = &p->tiling;
    char why[TW_ERROR_MSG_MAX / 2];
    /* A classifier's stride divides its tile (its cells); a segmentation
     * model's output is per pixel and takes any stride up to the tile. When
     * the workflow says which (model.arch, tiling.blend, tiling.margin) the
     * check is made here; else the run makes it once the model is read. */
    bool seg = given(c, TW_KEY_TILING_BLEND) || given(c, TW_KEY_TILING_MARGIN) ||
               tw_key_arch_segments(p->model.arch);
    if (t->tile > 0 && t->stride > 0 &&
        (seg ? t->stride > t->tile
             : tw_key_check_stride(t->tile, t->stride, NULL, why, sizeof why) != 0)) {
        if (seg)
            snprintf(why, sizeof why, "%d is larger than tile %d (expected 1..tile)", t->stride,
                     t->tile);
        return fail_key(c, TW_KEY_TILING_STRIDE, "%s", why);
    }
    const tw_model_params *m = &p->model;
    if (m->n_mean > 0 && m->n_std > 0 && m->n_mean != m->n_std)
        return fail_key(c, TW_KEY_MODEL_STD,
                        "%d values but model.mean has %d (expected one per band)", m->n_std,
                        m->n_mean);
    if (p->input.n_bands > 0) {
        if (m->n_mean > 0 && m->n_mean != p->input.n_bands)
            return fail_key(c, TW_KEY_MODEL_MEAN,
                            "%d values but input.bands selects %d bands (expected one per band)",
                            m->n_mean, p->input.n_bands);
        if (m->n_std > 0 && m->n_std != p->input.n_bands)
            return fail_key(c, TW_KEY_MODEL_STD,
                            "%d values but input.bands selects %d bands (expected one per band)",
                            m->n_std, p->input.n_bands);
    }
    /* the products against other keys (the C API's runs are parsed too) */
    const tw_output_params *o = &p->output;
    if ((o->products & TW_PRODUCT_EMB_RASTER) && o->resolution == TW_RESOLUTION_INPUT)
        return fail_key(c, TW_KEY_OUTPUT_RESOLUTION,
                        "input is not available for embedding_raster (a raster of output cells); "
                        "use resolution: cells");
    if ((o->products & TW_PRODUCT_EMB_RASTER) && o->emb_type == TW_EMB_FLOAT16 &&
        o->format == TW_FORMAT_COG)
        return fail_key(c, TW_KEY_OUTPUT_EMBEDDING_TYPE,
                        "float16 cannot be written as a COG with GDAL %s (its COG driver fills "
                        "half-float overviews with garbage); use float32 or int8, or "
                        "output.format: GTiff",
                        GDALVersionInfo("RELEASE_NAME"));
    return TW_OK;
}

tw_status tw_workflow_parse(const char *name, const char *text, size_t len, const char *const *sets,
                            int n_sets, tw_run_params *out, tw_error *err)
{
    TW_ASSERT(out != NULL);
    TW_ASSERT(text != NULL || len == 0);
    if (!name) name = "<workflow>";
    wf_ctx c;
    memset(&c, 0, sizeof c);
    c.name = name;
    c.err = err;
    if (strlen(name) >= TW_PATH_MAX)
        return fail_at(&c, 0, NULL, "workflow path too long (at most %d bytes)", TW_PATH_MAX - 1);
    /* ~100 KiB: on the heap, so that threads with small stacks can call us */
    tw_run_params *p = malloc(sizeof *p);
    if (!p) return tw_error_set(err, TW_ERR_NOMEM, "%s: out of memory", name);
    *p = tw_run_default_params();

    yaml_document_t doc;
    tw_status st = load_document(&c, &doc, text ? text : "", len, NULL);
    if (!st) {
        c.doc = &doc;
        st = walk_document(&c, p);
        c.doc = NULL;
        yaml_document_delete(&doc);
    }
    for (int i = 0; !st && i < n_sets; i++) st = apply_set(&c, sets[i], p);
    if (!st) st = check_all(&c, p);
    if (!st) {
        snprintf(p->workflow_path, sizeof p->workflow_path, "%s", name);
        *out = *p;
    }
    free(p);
    return st;
}

tw_status tw_workflow_load(const char *path, const char *const *sets, int n_sets,
                           tw_run_params *out, tw_error *err)
{
    if (!path || !*path) return tw_error_set(err, TW_ERR_CONFIG, "no workflow file given");
    /* a FIFO would block the open until a writer came */
    tw_status rst = tw_path_check_regular(path, "workflow file", false, TW_ERR_CONFIG, err);
    if (rst != TW_OK) return rst;
    FILE *f = fopen(path, "rb");
    if (!f)
        return tw_error_set(err, TW_ERR_CONFIG, "%s: cannot open workflow file: %s", path,
                            strerror(errno));
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    tw_status st = TW_OK;
    if (!buf) st = tw_error_set(err, TW_ERR_NOMEM, "%s: out of memory", path);
    while (!st) {
        if (len == cap) {
            if (cap >= WF_FILE_MAX) {
                st = tw_error_set(err, TW_ERR_CONFIG,
                                  "%s: workflow file larger than %zu MiB: is it a YAML file?", path,
                                  WF_FILE_MAX >> 20);
                break;
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                st = tw_error_set(err, TW_ERR_NOMEM, "%s: out of memory", path);
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f))
                st = tw_error_set(err, TW_ERR_CONFIG, "%s: cannot read workflow file: %s", path,
                                  strerror(errno));
            break;
        }
    }
    fclose(f);
    if (!st) st = tw_workflow_parse(path, buf, len, sets, n_sets, out, err);
    free(buf);
    return st;
}

int tw_parse_bytes(const char *s, size_t *out)
{
    static const struct {
        const char *unit;
        size_t mult;
    } units[] = {
        {"", 1},
        {"b", 1},
        /* single letters as SLURM and sort(1) read them: powers of 1024 */
        {"k", (size_t)1 << 10},
        {"m", (size_t)1 << 20},
        {"g", (size_t)1 << 30},
        {"t", (size_t)1 << 40},
        {"kib", (size_t)1 << 10},
        {"mib", (size_t)1 << 20},
        {"gib", (size_t)1 << 30},
        {"tib", (size_t)1 << 40},
        {"kb", 1000},
        {"mb", 1000000},
        {"gb", 1000000000},
        {"tb", (size_t)1000000000000ULL},
    };
    if (!s || !out) return -1;
    const char *p = s;
    while (isdigit((unsigned char)*p)) p++;
    const char *int_end = p;
    bool frac = false;
    if (*p == '.') {
        frac = true;
        p++;
        while (isdigit((unsigned char)*p)) p++;
    }
    const char *num_end = p;
    size_t ndigits = (size_t)(num_end - s) - (frac ? 1 : 0);
    if (ndigits == 0 || num_end - s > 40) return -1;
    /* "2 GiB" is fine, a lone trailing space is not */
    if (*p == ' ' && p[1] != '\0') p++;
    size_t mult = 0;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcasecmp(p, units[i].unit) == 0) {
            mult = units[i].mult;
            break;
        }
    if (mult == 0) return -1;
    if (!frac) {
        if (int_end == s) return -1;
        char buf[48];
        memcpy(buf, s, (size_t)(int_end - s));
        buf[int_end - s] = '\0';
        errno = 0;
        unsigned long long v = strtoull(buf, NULL, 10);
        if (errno == ERANGE || v > SIZE_MAX / mult || v == 0) return -1;
        *out = (size_t)v * mult;
        return 0;
    }
    char buf[48];
    memcpy(buf, s, (size_t)(num_end - s));
    buf[num_end - s] = '\0';
    double v = strtod(buf, NULL) * (double)mult;
    /* (double)SIZE_MAX rounds up to 2^64, which itself does not fit */
    if (!(v >= 1.0) || !(v < (double)SIZE_MAX)) return -1;
    *out = (size_t)v;
    return 0;
}

/* safetensors.c - the safetensors reader (see model_file.h).
 *
 * The file is an 8-byte little-endian header length, a JSON header
 * {"name": {"dtype", "shape", "data_offsets"}, ..., "__metadata__": {...}}
 * and the tensor data. Every byte is distrusted: the header length is
 * bounded, the JSON is parsed by jansson (duplicate keys refused, depth
 * bounded by jansson), and every tensor's dtype, shape and byte range are
 * checked (inside the data, no overlap, size matching the shape) before
 * anything is read.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/modelfile/model_file_impl.h"
#include "io/modelfile/readers.h"
#include "core/alloc.h"
#include "core/fileio.h"
#include "core/half.h"

/* A safetensors header larger than this is not a model we could use anyway
 * (a ResNet-152 header is ~100 KiB); refusing early avoids huge allocations. */
#define ST_MAX_HEADER (100u * 1024u * 1024u)

/* ------------------------------------------------------------------------ */
/* Tensor conversion                                                         */

typedef enum st_dtype { ST_F32, ST_F16, ST_BF16, ST_SKIP } st_dtype;

/* Little-endian bytes to float, whatever the host's endianness. */
static void convert_le(st_dtype dt, const unsigned char *src, float *dst, int64_t n)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (dt == ST_F32) { /* the common case needs no per-element work */
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) {
        if (dt == ST_F32) {
            const unsigned char *p = src + 4 * i;
            uint32_t u =
                (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
            memcpy(&dst[i], &u, 4);
        } else {
            const unsigned char *p = src + 2 * i;
            uint16_t u = (uint16_t)(p[0] | p[1] << 8);
            if (dt == ST_F16) {
                dst[i] = tw_half_to_float(u);
            } else {
                uint32_t w = (uint32_t)u << 16;
                memcpy(&dst[i], &w, 4);
            }
        }
    }
}

/* ------------------------------------------------------------------------ */
/* safetensors                                                               */

typedef struct st_entry {
    int tensor; /* index into mf->tensors */
    st_dtype dtype;
    uint64_t begin, end; /* relative to the data start */
} st_entry;

static int cmp_entry_begin(const void *a, const void *b)
{
    const st_entry *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Parse one tensor entry {"dtype", "shape", "data_offsets"}. */
static tw_status st_parse_entry(tw_model_file *mf, json_t *v, tw_tensor *t, st_entry *e,
                                uint64_t data_len, tw_error *err)
{
    const char *path = mf->path, *name = t->name;
    if (!json_is_object(v))
        return tw_model_error(err, path, "header entry for tensor '%s' is not an object", name);
    json_t *dtype_v = json_object_get(v, "dtype"), *shape_v = json_object_get(v, "shape"),
           *offs_v = json_object_get(v, "data_offsets");
    const char *missing = !dtype_v ? "dtype" : !shape_v ? "shape" : !offs_v ? "data_offsets" : NULL;
    if (missing) return tw_model_error(err, path, "tensor '%s': no '%s' field", name, missing);

    if (!json_is_string(dtype_v) || json_string_length(dtype_v) >= 16)
        return tw_model_error(err, path, "tensor '%s': 'dtype' is not a short string", name);
    const char *dtype = json_string_value(dtype_v);
    size_t esize;
    if (strcmp(dtype, "F32") == 0) {
        e->dtype = ST_F32;
        esize = 4;
    } else if (strcmp(dtype, "F16") == 0) {
        e->dtype = ST_F16;
        esize = 2;
    } else if (strcmp(dtype, "BF16") == 0) {
        e->dtype = ST_BF16;
        esize = 2;
    } else {
        static const struct {
            const char *name;
            size_t size;
        } ints[] = {{"I64", 8}, {"U64", 8}, {"I32", 4}, {"U32", 4},  {"I16", 2},
                    {"U16", 2}, {"I8", 1},  {"U8", 1},  {"BOOL", 1}, {"F64", 8}};
        esize = 0;
        for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
            if (strcmp(dtype, ints[i].name) == 0) esize = ints[i].size;
        if (!esize)
            return tw_model_error(err, path,
                                  "tensor '%s': unknown dtype '%s' (F32, F16, BF16 expected)", name,
                                  dtype);
        /* BN's step counter is stored as an integer and is not a weight */
        size_t nl = strlen(name), sl = strlen("num_batches_tracked");
        if (nl < sl || strcmp(name + nl - sl, "num_batches_tracked") != 0)
            return tw_model_error(
                err, path, "tensor '%s': dtype %s is not supported (F32, F16, BF16)", name, dtype);
        e->dtype = ST_SKIP;
    }

    if (!json_is_array(shape_v))
        return tw_model_error(err, path, "tensor '%s': 'shape' is not an array", name);
    size_t ndim = json_array_size(shape_v);
    if (ndim > 4)
        return tw_model_error(err, path, "tensor '%s': %zu dimensions (at most 4 supported)", name,
                              ndim);
    uint64_t numel = 1;
    for (size_t i = 0; i < ndim; i++) {
        json_t *s = json_array_get(shape_v, i);
        json_int_t dim = json_is_integer(s) ? json_integer_value(s) : -1;
        if (dim < 0)
            return tw_model_error(err, path,
                                  "tensor '%s': shape[%zu] is not a non-negative integer", name, i);
        /* bounded by the data size, so the product cannot overflow */
        if (dim > 0 && (uint64_t)dim > data_len)
            return tw_model_error(err, path, "tensor '%s': shape[%zu] = %lld exceeds the data size",
                                  name, i, (long long)dim);
        t->shape[i] = dim;
        numel *= (uint64_t)dim;
        if (numel > data_len)
            return tw_model_error(err, path, "tensor '%s': shape is larger than the file's data",
                                  name);
    }
    if (ndim == 0) { /* a scalar is kept as a 1-element vector */
        t->shape[0] = 1;
        ndim = 1;
    }
    t->ndim = (int)ndim;
    t->numel = (int64_t)numel;

    json_t *o0 = json_array_get(offs_v, 0), *o1 = json_array_get(offs_v, 1);
    if (!json_is_array(offs_v) || json_array_size(offs_v) != 2 || !json_is_integer(o0) ||
        !json_is_integer(o1))
        return tw_model_error(err, path, "tensor '%s': 'data_offsets' is not [begin, end]", name);
    json_int_t off[2] = {json_integer_value(o0), json_integer_value(o1)};
    if (off[0] < 0 || off[1] < off[0] || (uint64_t)off[1] > data_len)
        return tw_model_error(
            err, path,
            "tensor '%s': data_offsets [%lld, %lld] past the end of the data (%llu bytes)", name,
            (long long)off[0], (long long)off[1], (unsigned long long)data_len);
    e->begin = (uint64_t)off[0];
    e->end = (uint64_t)off[1];
    if (numel * esize != e->end - e->begin)
        return tw_model_error(
            err, path, "tensor '%s': shape holds %llu bytes of %s but data_offsets span %llu", name,
            (unsigned long long)(numel * esize), dtype, (unsigned long long)(e->end - e->begin));
    return TW_OK;
}

/* Metadata values are strings holding JSON; a plain string is accepted for
 * 'arch' and 'stem' too, since writers disagree on whether to quote it. */
static tw_status st_parse_meta_value(tw_model_file *mf, const char *key, const char *val,
                                     tw_error *err)
{
    bool want = strcmp(key, "arch") == 0 || strcmp(key, "stem") == 0 || strcmp(key, "bands") == 0 ||
                strcmp(key, "scale") == 0 || strcmp(key, "mean") == 0 || strcmp(key, "std") == 0 ||
                strcmp(key, "classes") == 0 || strcmp(key, "tile") == 0 ||
                strcmp(key, "stride") == 0;
    if (!want) return TW_OK;
    json_error_t jerr;
    json_t *d = json_loads(val, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &jerr);
    tw_status st = TW_OK;
    if (strcmp(key, "arch") == 0 || strcmp(key, "stem") == 0) {
        char arch[64];
        if (json_is_string(d)) {
            if (json_string_length(d) < sizeof arch)
                memcpy(arch, json_string_value(d), json_string_length(d) + 1);
            else
                arch[0] = '\0';
        } else {
            snprintf(arch, sizeof arch, "%s", val);
        }
        json_decref(d);
        return key[0] == 'a' ? tw_model_set_arch(mf, arch, err) : tw_model_set_stem(mf, arch, err);
    }
    char jwhy[sizeof jerr.text]; /* without jansson's quote of the bytes */
    if (!d)
        return tw_model_error(err, mf->path, "metadata '%s' is not valid JSON (%s)", key,
                              tw_json_error_text(jerr.text, jwhy, sizeof jwhy));
    size_t n = json_is_array(d) ? json_array_size(d) : 0;
    if (strcmp(key, "scale") == 0) {
        st = json_is_number(d) && isfinite(json_number_value(d))
                 ? tw_model_set_scale(mf, json_number_value(d), err)
                 : tw_model_error(err, mf->path, "metadata 'scale' is not a number");
    } else if (strcmp(key, "tile") == 0) {
        st = json_is_integer(d)
                 ? tw_model_set_tile(mf, json_integer_value(d), err)
                 : tw_model_error(err, mf->path, "metadata 'tile' is not an integer");
    } else if (strcmp(key, "stride") == 0) {
        st = json_is_integer(d)
                 ? tw_model_set_stride(mf, json_integer_value(d), err)
                 : tw_model_error(err, mf->path, "metadata 'stride' is not an integer");
    } else if (!json_is_array(d) || n > TW_MAX_CLASSES) {
        st = tw_model_error(err, mf->path, "metadata '%s' is not an array (or too long)", key);
    } else if (strcmp(key, "classes") == 0) {
        if (n < 1) st = tw_model_error(err, mf->path, "metadata 'classes' is empty");
        for (size_t i = 0; i < n && st == TW_OK; i++) {
            json_t *c = json_array_get(d, i);
            if (!json_is_string(c) || json_string_length(c) >= TW_NAME_MAX)
                st = tw_model_error(err, mf->path,
                                    "metadata 'classes'[%zu] is not a string of at most %d bytes",
                                    i, TW_NAME_MAX - 1);
            else
                st = tw_model_set_class(mf, (int)i, json_string_value(c), err);
        }
        if (st == TW_OK) mf->n_classes = (int)n;
    } else {
        int64_t iv[TW_MAX_CLASSES];
        double dv[TW_MAX_CLASSES];
        bool ints = strcmp(key, "bands") == 0;
        for (size_t i = 0; i < n && st == TW_OK; i++) {
            json_t *x = json_array_get(d, i);
            if (ints ? !json_is_integer(x) : !json_is_number(x))
                st = tw_model_error(err, mf->path, "metadata '%s'[%zu] is not %s", key, i,
                                    ints ? "an integer" : "a number");
            else if (ints)
                iv[i] = json_integer_value(x);
            else
                dv[i] = json_number_value(x);
        }
        if (st == TW_OK) {
            if (ints)
                st = tw_model_set_bands(mf, iv, (int64_t)n, err);
            else if (strcmp(key, "mean") == 0)
                st = tw_model_set_floats(mf, "mean", dv, (int64_t)n, mf->mean, &mf->n_mean, false,
                                         err);
            else
                st = tw_model_set_floats(mf, "std", dv, (int64_t)n, mf->std, &mf->n_std, true, err);
        }
    }
    json_decref(d);
    return st;
}

static tw_status st_parse_metadata(tw_model_file *mf, json_t *meta, tw_error *err)
{
    if (!json_is_object(meta))
        return tw_model_error(err, mf->path, "header '__metadata__' is not an object");
    const char *key;
    json_t *val;
    json_object_foreach(meta, key, val)
    {
        if (strlen(key) >= 64) continue; /* a long key is none of ours */
        if (!json_is_string(val))
            return tw_model_error(err, mf->path, "metadata '%s' is not a string", key);
        tw_status st = st_parse_meta_value(mf, key, json_string_value(val), err);
        if (st != TW_OK) return st;
    }
    return TW_OK;
}

/* jansson refuses a duplicate key (JSON_REJECT_DUPLICATES) and reports the
 * byte just past it: recover the key and whether it is a top-level one (a
 * tensor name, or a second "__metadata__") for a message that names it. */
static tw_status duplicate_error(tw_model_file *mf, const char *text, size_t pos, tw_error *err)
{
    size_t end = pos; /* the key's closing quote is text[end - 1] */
    while (end > 0 && text[end - 1] != '"') end--;
    size_t begin = end > 0 ? end - 1 : 0;
    while (begin > 0) {
        begin--;
        if (text[begin] != '"') continue;
        size_t bs = 0;
        while (begin > bs && text[begin - 1 - bs] == '\\') bs++;
        if (bs % 2 == 0) break;
    }
    int depth = 0;
    bool in_str = false;
    for (size_t i = 0; i < begin; i++) {
        char c = text[i];
        if (in_str) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_str = false;
        } else if (c == '"') {
            in_str = true;
        } else if (c == '{' || c == '[') {
            depth++;
        } else if (c == '}' || c == ']') {
            depth--;
        }
    }
    json_t *k = end > begin ? json_loadb(text + begin, end - begin, JSON_DECODE_ANY, NULL) : NULL;
    const char *name = json_is_string(k) ? json_string_value(k) : "?";
    tw_status st;
    if (depth == 1 && strcmp(name, "__metadata__") == 0)
        /* found by fuzzing the hand-written parser this replaced */
        st = tw_model_error(err, mf->path, "safetensors header has two '__metadata__' entries");
    else if (depth == 1)
        st = tw_model_error(err, mf->path, "tensor '%.128s' appears twice in the header", name);
    else
        st = tw_model_error(err, mf->path,
                            "safetensors header: key '%.128s' appears twice in an entry", name);
    json_decref(k);
    return st;
}

static tw_status st_read_tensors(tw_model_file *mf, FILE *f, uint64_t data_start,
                                 const st_entry *ents, int n, tw_error *err)
{
    unsigned char *scratch = NULL;
    size_t scratch_cap = 0;
    tw_status st = TW_OK;
    for (int i = 0; i < n && st == TW_OK; i++) {
        const st_entry *e = &ents[i];
        tw_tensor *t = &mf->tensors[e->tensor];
        size_t bytes = (size_t)(e->end - e->begin);
        size_t out_bytes = (size_t)t->numel * sizeof(float);
        t->data = tw_alloc(TW_MEM_WEIGHTS, out_bytes ? out_bytes : sizeof(float));
        if (!t->data) {
            st = tw_model_nomem(err, mf->path, out_bytes);
            break;
        }
        if (bytes > scratch_cap) {
            tw_free(scratch);
            scratch = tw_alloc(TW_MEM_OTHER, bytes);
            scratch_cap = scratch ? bytes : 0;
            if (!scratch) {
                st = tw_model_nomem(err, mf->path, bytes);
                break;
            }
        }
        if (bytes == 0) continue;
        if (fseeko(f, (off_t)(data_start + e->begin), SEEK_SET) != 0 ||
            fread(scratch, 1, bytes, f) != bytes) {
            st = tw_model_error(err, mf->path, "tensor '%s': cannot read %zu bytes at offset %llu",
                                t->name, bytes, (unsigned long long)(data_start + e->begin));
            break;
        }
        convert_le(e->dtype, scratch, t->data, t->numel);
    }
    tw_free(scratch);
    return st;
}

/* The header's length (8 bytes, little-endian) and the header itself, read
 * from f and checked against the file's size; a new, NUL-terminated buffer
 * into *header (the caller frees it, also on error), its length into *hlen. */
static tw_status st_read_header(tw_model_file *mf, FILE *f, uint64_t file_size, char **header,
                                uint64_t *hlen_out, tw_error *err)
{
    const char *path = mf->path;
    unsigned char lenb[8];
    if (fread(lenb, 1, 8, f) != 8)
        return tw_model_error(err, path, "cannot read the safetensors header length");
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | lenb[i];
    int first = fgetc(f);
    if (first != '{') {
        /* not even the start of a JSON header: most likely some other format */
        return tw_model_error(err, path,
                              "neither an HDF5 bundle (no HDF5 signature) nor a safetensors file "
                              "(no JSON header)");
    }
    if (ungetc(first, f) == EOF)
        return tw_model_error(err, path, "cannot read the safetensors header");
    if (hlen > ST_MAX_HEADER)
        return tw_model_error(err, path,
                              "safetensors header length %llu is absurd (limit %u): not a "
                              "safetensors file, or corrupt",
                              (unsigned long long)hlen, ST_MAX_HEADER);
    if (hlen > file_size - 8)
        return tw_model_error(
            err, path, "safetensors header length %llu exceeds the file size %llu (truncated?)",
            (unsigned long long)hlen, (unsigned long long)file_size);
    *header = tw_alloc(TW_MEM_OTHER, hlen + 1);
    if (!*header) return tw_model_nomem(err, path, hlen + 1);
    if (fread(*header, 1, hlen, f) != hlen)
        return tw_model_error(err, path, "cannot read the %llu-byte safetensors header",
                              (unsigned long long)hlen);
    (*header)[hlen] = '\0';
    if (memchr(*header, '\0', hlen))
        return tw_model_error(err, path, "safetensors header contains a NUL byte");
    *hlen_out = hlen;
    return TW_OK;
}

/* The header as a JSON object into *root (the caller releases it). */
static tw_status st_parse_header(tw_model_file *mf, const char *header, uint64_t hlen,
                                 json_t **root, tw_error *err)
{
    const char *path = mf->path;
    json_error_t jerr;
    *root = json_loadb(header, hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!*root) {
        if (json_error_code(&jerr) == json_error_duplicate_key && jerr.position > 0)
            return duplicate_error(mf, header, (size_t)jerr.position, err);
        char jwhy[sizeof jerr.text]; /* without jansson's quote of the bytes */
        return tw_model_error(
            err, path, "safetensors header is not valid JSON: %s (line %d, column %d)",
            tw_json_error_text(jerr.text, jwhy, sizeof jwhy), jerr.line, jerr.column);
    }
    if (!json_is_object(*root))
        return tw_model_error(err, path, "safetensors header is not a JSON object");
    return TW_OK;
}

/* Every entry of the header but meta, in the header's order, as a tensor
 * of mf (without data) and an st_entry in a new array *ents (the caller
 * frees it, also on error) of *n_ents. */
static tw_status st_list_entries(tw_model_file *mf, json_t *root, const json_t *meta,
                                 uint64_t data_len, st_entry **ents, int *n_ents, tw_error *err)
{
    size_t n_tensors = json_object_size(root) - (meta ? 1 : 0);
    mf->tensors = tw_calloc(TW_MEM_OTHER, n_tensors ? n_tensors : 1, sizeof(tw_tensor));
    *ents = calloc(n_tensors ? n_tensors : 1, sizeof **ents);
    if (!mf->tensors || !*ents) return tw_model_nomem(err, mf->path, n_tensors * sizeof(tw_tensor));
    int i = 0;
    const char *key;
    json_t *v;
    tw_status st = TW_OK;
    /* jansson keeps the header's order: tensors are listed as written. */
    json_object_foreach(root, key, v)
    {
        if (v == meta) continue;
        /* Integer entries (BN step counters) get a slot too, so that they take
         * part in the overlap check; they are dropped below. */
        tw_tensor *t = &mf->tensors[mf->n_tensors];
        if (strlen(key) >= sizeof t->name) {
            st = tw_model_error(err, mf->path, "tensor #%d: name is longer than %zu bytes", i,
                                sizeof t->name - 1);
            break;
        }
        snprintf(t->name, sizeof t->name, "%s", key);
        st_entry e = {.tensor = mf->n_tensors};
        st = st_parse_entry(mf, v, t, &e, data_len, err);
        if (st != TW_OK) break;
        mf->n_tensors++;
        (*ents)[(*n_ents)++] = e;
        i++;
    }
    return st;
}

/* ents sorted by where their bytes begin; two that share a byte are refused. */
static tw_status st_check_overlap(tw_model_file *mf, st_entry *ents, int n_ents, tw_error *err)
{
    qsort(ents, (size_t)n_ents, sizeof *ents, cmp_entry_begin);
    uint64_t prev_end = 0;
    int prev = -1;
    for (int k = 0; k < n_ents; k++) {
        if (ents[k].begin == ents[k].end) continue;
        if (prev >= 0 && ents[k].begin < prev_end)
            return tw_model_error(err, mf->path, "tensors '%s' and '%s' overlap in the data",
                                  mf->tensors[ents[prev].tensor].name,
                                  mf->tensors[ents[k].tensor].name);
        prev = k;
        prev_end = ents[k].end;
    }
    return TW_OK;
}

tw_status tw_safetensors_load(tw_model_file *mf, uint64_t file_size, tw_error *err)
{
    const char *path = mf->path;
    if (file_size < 8)
        return tw_model_error(err, path,
                              "neither an HDF5 bundle nor a safetensors file (only %llu bytes)",
                              (unsigned long long)file_size);
    FILE *f = fopen(path, "rb");
    if (!f) return tw_model_error(err, path, "cannot open: %s", strerror(errno));
    char *header = NULL;
    uint64_t hlen = 0;
    json_t *root = NULL;
    st_entry *ents = NULL;
    int n_ents = 0;
    tw_status st = st_read_header(mf, f, file_size, &header, &hlen, err);
    if (st == TW_OK) st = st_parse_header(mf, header, hlen, &root, err);
    json_t *meta = st == TW_OK ? json_object_get(root, "__metadata__") : NULL;
    if (st == TW_OK)
        st = st_list_entries(mf, root, meta, file_size - 8 - hlen, &ents, &n_ents, err);
    if (st == TW_OK) st = st_check_overlap(mf, ents, n_ents, err);
    if (st == TW_OK && meta) st = st_parse_metadata(mf, meta, err);
    if (st == TW_OK) {
        int w = 0;
        for (int k = 0; k < n_ents; k++)
            if (ents[k].dtype != ST_SKIP) ents[w++] = ents[k];
        st = st_read_tensors(mf, f, 8 + hlen, ents, w, err);
    }
    if (st == TW_OK) { /* compact away the skipped slots (they have no data) */
        int kept = 0;
        for (int k = 0; k < mf->n_tensors; k++)
            if (mf->tensors[k].data) mf->tensors[kept++] = mf->tensors[k];
        mf->n_tensors = kept;
    }
    json_decref(root);
    free(ents);
    tw_free(header);
    fclose(f);
    return st;
}

/* fuzz_hdf5_bundle.c - structure-aware libFuzzer harness for the HDF5 bundle
 * reader (tw_model_file_load on a tilewise-resnet bundle).
 *
 * Why not raw bytes: libhdf5 1.10 itself is not hardened against corrupt
 * files (raw-byte fuzzing finds over-reads and bad frees inside the library
 * within seconds; see README.md and fuzz_model_file.c built as
 * fuzz_hdf5_raw). What tilewise owns is what it does with a well-formed HDF5
 * file whose content is wrong, so this harness builds a valid HDF5 file with
 * the HDF5 API, steered by the fuzz input: a full small ResNet-18 state dict,
 * then mutations (drop, reshape, retype, rename, replace by a group or an
 * empty dataset, extra entries, a NaN or -Inf value) and root attributes of
 * every key (tensors_sha256 too: malformed, or well-formed and wrong) with
 * random types, ranks, lengths and values. The loader must load it or reject it with
 * one message naming the file; the counting allocator and HDF5's open objects
 * must be back to zero either way.
 */
#include <hdf5.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/modelfile/model_file.h"
#include "core/alloc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A byte reader that yields zeros once the input runs out. */
typedef struct reader {
    const uint8_t *p;
    size_t n;
} reader;

static unsigned take(reader *r, unsigned below)
{
    unsigned v = 0;
    if (r->n > 0) {
        v = r->p[0];
        r->p++;
        r->n--;
    }
    return below ? v % below : v;
}

static double take_number(reader *r)
{
    static const double special[] = {0.0, -1.0, 1.0, 0.5, 1e300, -1e300, 3e9, -3e9};
    unsigned k = take(r, 16);
    if (k < 8) return special[k];
    return (double)((int)take(r, 0) - 100) / (double)(1 + take(r, 8));
}

#define MAX_T 128

typedef struct tensor_spec {
    char name[96];
    int ndim;
    hsize_t dims[5];
} tensor_spec;

/* The torchvision ResNet-18 names and shapes with 1, 2, 4, 8 channels per
 * stage, `bands` inputs and `classes` outputs. */
static int resnet18_specs(tensor_spec *t, int bands, int classes)
{
    int n = 0;
#define ADD(nd, d0, d1, d2, d3, ...)                                                               \
    do {                                                                                           \
        snprintf(t[n].name, sizeof t[n].name, __VA_ARGS__);                                        \
        t[n].ndim = nd;                                                                            \
        t[n].dims[0] = d0, t[n].dims[1] = d1, t[n].dims[2] = d2, t[n].dims[3] = d3;                \
        n++;                                                                                       \
    } while (0)
#define BN(c, ...)                                                                                 \
    do {                                                                                           \
        char p_[64];                                                                               \
        snprintf(p_, sizeof p_, __VA_ARGS__);                                                      \
        ADD(1, c, 0, 0, 0, "%s.weight", p_);                                                       \
        ADD(1, c, 0, 0, 0, "%s.bias", p_);                                                         \
        ADD(1, c, 0, 0, 0, "%s.running_mean", p_);                                                 \
        ADD(1, c, 0, 0, 0, "%s.running_var", p_);                                                  \
    } while (0)
    ADD(4, 1, bands, 7, 7, "conv1.weight");
    BN(1, "bn1");
    int cin = 1;
    for (int s = 0; s < 4; s++) {
        int cout = 1 << s;
        for (int b = 0; b < 2; b++) {
            int ci = b == 0 ? cin : cout;
            ADD(4, cout, ci, 3, 3, "layer%d.%d.conv1.weight", s + 1, b);
            BN(cout, "layer%d.%d.bn1", s + 1, b);
            ADD(4, cout, cout, 3, 3, "layer%d.%d.conv2.weight", s + 1, b);
            BN(cout, "layer%d.%d.bn2", s + 1, b);
            if (b == 0 && s > 0) {
                ADD(4, cout, ci, 1, 1, "layer%d.%d.downsample.0.weight", s + 1, b);
                BN(cout, "layer%d.%d.downsample.1", s + 1, b);
            }
        }
        cin = cout;
    }
    ADD(2, classes, 8, 0, 0, "fc.weight");
    ADD(1, classes, 0, 0, 0, "fc.bias");
#undef BN
#undef ADD
    return n;
}

/* IEEE half precision, as h5py writes numpy float16 (HDF5 1.10 has no
 * predefined one). The caller closes it. */
static hid_t make_f16(void)
{
    hid_t t = H5Tcopy(H5T_IEEE_F32LE);
    if (t < 0) return t;
    if (H5Tset_fields(t, 15, 10, 5, 0, 10) < 0 || H5Tset_size(t, 2) < 0 ||
        H5Tset_ebias(t, 15) < 0) {
        H5Tclose(t);
        return -1;
    }
    return t;
}

/* A numeric type for an attribute or a tensor (a predefined one: never closed). */
static hid_t pick_type(reader *r)
{
    switch (take(r, 6)) {
    case 0: return H5T_NATIVE_INT32;
    case 1: return H5T_NATIVE_INT64;
    case 2: return H5T_NATIVE_UINT8;
    case 3: return H5T_NATIVE_DOUBLE;
    default: return H5T_NATIVE_FLOAT;
    }
}

/* A dataset or attribute payload: n numbers as doubles, converted by HDF5. */
static void fill(reader *r, double *v, size_t n, int sane)
{
    for (size_t i = 0; i < n; i++)
        v[i] = sane ? 0.5 + (double)(take(r, 0) & 7) * 0.125 : take_number(r);
}

static void write_tensors(reader *r, hid_t file)
{
    tensor_spec t[MAX_T];
    int n = resnet18_specs(t, 1 + (int)take(r, 4), 1 + (int)take(r, 4));
    int n_mut = (int)take(r, 4);
    for (int m = 0; m < n_mut; m++) {
        tensor_spec *x = &t[take(r, (unsigned)n)];
        switch (take(r, 6)) {
        case 0: x->name[0] = '\0'; break;                                      /* drop */
        case 1: x->dims[take(r, 4)] = take(r, 5); break;                       /* reshape (0 too) */
        case 2: x->ndim = (int)take(r, 6); break;                              /* rank 0..5 */
        case 3: x->name[take(r, (unsigned)strlen(x->name) + 1)] = '\0'; break; /* rename */
        case 4: x->name[0] = x->name[0] ? '#' : 'x'; break;                    /* unknown name */
        default: x->ndim = -1; break; /* a group, not a dataset */
        }
    }
    hid_t g =
        H5Gcreate2(file, take(r, 32) ? "tensors" : "tensor", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (g < 0) return;
    static double buf[8 * 8 * 9 * 4 + 64];
    for (int i = 0; i < n; i++) {
        if (!t[i].name[0] || H5Lexists(g, t[i].name, H5P_DEFAULT) != 0) continue;
        if (t[i].ndim < 0) {
            hid_t sub = H5Gcreate2(g, t[i].name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
            if (sub >= 0) H5Gclose(sub);
            continue;
        }
        hsize_t dims[5] = {1, 1, 1, 1, 1}, numel = 1;
        for (int d = 0; d < t[i].ndim; d++) {
            dims[d] = t[i].ndim <= 4 && d < 4 ? t[i].dims[d] : 1;
            numel *= dims[d];
        }
        if (numel > sizeof buf / sizeof buf[0]) continue;
        fill(r, buf, (size_t)numel, 1);
        if (numel && take(r, 8) == 0) /* a non-finite weight, refused naming its index */
            buf[take(r, 0) % numel] = take(r, 2) ? NAN : -INFINITY;
        hid_t space = t[i].ndim ? H5Screate_simple(t[i].ndim, dims, NULL) : H5Screate(H5S_SCALAR);
        unsigned tk = take(r, 16);
        hid_t f16 = tk == 0 ? make_f16() : -1;
        hid_t type = tk == 0 ? f16 : tk == 1 ? pick_type(r) : H5T_NATIVE_FLOAT;
        hid_t ds = H5Dcreate2(g, t[i].name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        if (f16 >= 0) H5Tclose(f16);
        if (ds >= 0) {
            if (numel) H5Dwrite(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
            H5Dclose(ds);
        }
        H5Sclose(space);
    }
    H5Gclose(g);
}

static void write_string_attr(hid_t obj, const char *key, int n, const char *const *s, int vlen,
                              int scalar)
{
    hid_t type = H5Tcopy(H5T_C_S1);
    size_t width = 1;
    for (int i = 0; i < n; i++)
        if (strlen(s[i]) + 1 > width) width = strlen(s[i]) + 1;
    H5Tset_size(type, vlen ? H5T_VARIABLE : width);
    hsize_t dim = (hsize_t)n;
    hid_t space = scalar ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &dim, NULL);
    hid_t a = H5Acreate2(obj, key, type, space, H5P_DEFAULT, H5P_DEFAULT);
    if (a >= 0) {
        if (vlen) {
            H5Awrite(a, type, s);
        } else {
            char *flat = calloc((size_t)n, width);
            if (flat) {
                for (int i = 0; i < n; i++) memcpy(flat + (size_t)i * width, s[i], strlen(s[i]));
                H5Awrite(a, type, flat);
                free(flat);
            }
        }
        H5Aclose(a);
    }
    H5Sclose(space);
    H5Tclose(type);
}

static void write_attrs(reader *r, hid_t file)
{
    static const char *const keys[] = {"format", "format_version", "arch",          "bands",
                                       "scale",  "mean",           "std",           "classes",
                                       "tile",   "extra",          "tensors_sha256"};
    static const char *const words[] = {
        "tilewise-resnet", "resnet18", "resnet50", "water", "",
        "a much longer class name than usual, with , and ;", "resnet1", "\xc3\xa9t\xc3\xa9",
        /* shaped like a checksum: a mismatch */
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        "0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        unsigned how = take(r, 8);
        if (how == 0) continue; /* absent */
        /* the checksum is checked before any tensor: mostly absent, so that
         * the fuzzer still reaches the tensors */
        if (k == 10 && how > 2) continue;
        if (H5Aexists(file, keys[k]) != 0) continue;
        int scalar = take(r, 2);
        int n = scalar ? 1 : (int)take(r, 300) % 40;
        if (how <= 3) { /* strings */
            const char *s[64];
            for (int i = 0; i < n && i < 64; i++)
                s[i] = k == 0 && how != 3 ? "tilewise-resnet"
                                          : words[take(r, sizeof words / sizeof words[0])];
            write_string_attr(file, keys[k], n < 64 ? n : 64, s, how == 2, scalar);
            continue;
        }
        static double v[64];
        n = n < 64 ? n : 64;
        fill(r, v, (size_t)n, 0);
        if (k == 1 && how != 4) v[0] = 1.0; /* format_version mostly right */
        if (k == 3)
            for (int i = 0; i < n; i++) v[i] = (double)(take(r, 0) % 12) - 1.0; /* band numbers */
        hsize_t dim = (hsize_t)n;
        hid_t space = scalar ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &dim, NULL);
        /* format_version is mostly a right integer, to get past the gate. */
        hid_t type = k == 1 && how != 4 ? H5T_NATIVE_INT32 : pick_type(r);
        hid_t a = H5Acreate2(file, keys[k], type, space, H5P_DEFAULT, H5P_DEFAULT);
        if (a >= 0) {
            H5Awrite(a, H5T_NATIVE_DOUBLE, v);
            H5Aclose(a);
        }
        H5Sclose(space);
    }
}

static char scratch[64];

static void remove_scratch(void)
{
    if (scratch[0]) unlink(scratch);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!scratch[0]) {
        snprintf(scratch, sizeof scratch, "/dev/shm/tw_fuzz_bundle_%d.h5", (int)getpid());
        atexit(remove_scratch);
        H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    }
    reader r = {data, size};
    hid_t file = H5Fcreate(scratch, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (file < 0) {
        fprintf(stderr, "cannot create %s\n", scratch);
        __builtin_trap();
    }
    write_attrs(&r, file);
    if (take(&r, 16)) write_tensors(&r, file);
    if (H5Fclose(file) < 0) __builtin_trap();

    tw_error err;
    tw_error_init(&err);
    tw_model_file *mf = NULL;
    tw_status st = tw_model_file_load(scratch, &mf, &err);
    static int verbose = -1;
    if (verbose < 0) verbose = getenv("FUZZ_VERBOSE") != NULL;
    if (verbose) fprintf(stderr, "status %d %s\n", (int)st, st == TW_OK ? "loaded" : err.msg);
    if (st == TW_OK) {
        volatile float sink = 0.0f;
        for (int i = 0; i < mf->n_tensors; i++)
            for (int64_t k = 0; k < mf->tensors[i].numel; k++) sink += mf->tensors[i].data[k];
        (void)sink;
        tw_model_file_destroy(mf);
    } else if (mf != NULL || err.msg[0] == '\0' || strstr(err.msg, scratch) == NULL ||
               strchr(err.msg, '\n') != NULL) {
        fprintf(stderr, "bad error for status %d: '%s'\n", (int)st, err.msg);
        __builtin_trap();
    }
    size_t held = tw_mem_current(TW_MEM_TAG_COUNT);
    ssize_t open_objs = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL);
    if (held != 0 || open_objs != 0) {
        fprintf(stderr, "status %d left %zu bytes allocated, %zd HDF5 objects open\n", (int)st,
                held, open_objs);
        __builtin_trap();
    }
    return 0;
}

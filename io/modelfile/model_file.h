/* model_file.h - read model weights: safetensors, the tilewise HDF5 bundle or
 * an ONNX graph of a ResNet (io/modelfile/onnx.c: the graph is mapped onto the same
 * torchvision-layout tensors, see tw_onnx_info below).
 *
 * Both formats hold a torchvision-layout ResNet state_dict (conv1.weight,
 * bn1.weight/bias/running_mean/running_var, layer1.0.conv1.weight, ...,
 * fc.weight, fc.bias). Tensors are converted to float32 at load (F32, F16 and
 * BF16 accepted). The bundle also carries metadata a user should not retype
 * (arch, stem, bands, scale, mean, std, class names, tile size, stride); a safetensors file
 * may carry the same in its "__metadata__" map (same key names, JSON-encoded
 * values), otherwise those fields are "unset".
 *
 * HDF5 bundle layout (written by tools/export_model.py):
 *   /tensors/<name>     float32/float16 dataset, one per state_dict entry
 *                       (bf16 is stored as float32 by the exporter)
 *   root attributes     format = "tilewise-resnet", format_version = 1,
 *                       arch (string), bands (int array, 1-based),
 *                       scale (double), mean, std (float arrays),
 *                       classes (string array), tile (int),
 *                       stride (int: the default tiling.stride, <= tile;
 *                       segmentation bundles carry it),
 *                       stem (string: standard | small; see tw_stem)
 *                       tensors_sha256 (string, 64 lowercase hex digits)
 *   Every attribute except format/format_version is optional.
 *
 * tensors_sha256 is the checksum of the tensors (bundles carry no other):
 * one line per float dataset under /tensors,
 *   NAME \t DTYPE \t D0,D1,... \t SHA-256 of its data as little-endian bytes \n
 * (DTYPE "F16", "F32", "F64": the stored type; the shape as stored, empty
 * for a scalar; digests in lowercase hex), the lines in ascending byte
 * order of the names, and tensors_sha256 = SHA-256 of those lines. It
 * covers what the computation uses (names, shapes, types, values), not the
 * attributes, which are checked as metadata. tools/export_model.py writes
 * it (tensors_checksum there); the loader verifies it, and a mismatch is an
 * error. A bundle without one (written before it existed) loads, with
 * checksum TW_CHECKSUM_ABSENT for the caller to report
 * (tw_model_file_notice).
 *
 * Whatever the format, a tensor holding NaN or Inf is refused, naming the
 * tensor and the index of the first such value.
 */
#ifndef TW_MODEL_FILE_H
#define TW_MODEL_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "core/params.h"

typedef struct tw_tensor {
    char name[128];
    int ndim; /* 1..4 */
    int64_t shape[4];
    int64_t numel;
    float *data; /* owned by the tw_model_file (tw_alloc, TW_MEM_WEIGHTS) */
} tw_tensor;

/* What the loader could check of the tensors' integrity. */
typedef enum tw_model_checksum {
    TW_CHECKSUM_NONE = 0, /* the format carries none (safetensors) */
    TW_CHECKSUM_ABSENT,   /* an HDF5 bundle written before tensors_sha256 */
    TW_CHECKSUM_VERIFIED, /* the bundle's tensors_sha256 matched its tensors */
} tw_model_checksum;

/* The file's format, as detected from its content (and a .onnx name). */
typedef enum tw_model_format {
    TW_MODEL_FORMAT_SAFETENSORS = 0,
    TW_MODEL_FORMAT_HDF5,
    TW_MODEL_FORMAT_ONNX,
} tw_model_format;

/* What an ONNX file said besides its weights (io/modelfile/onnx.c), for `info`.
 * The graph is recognised by data flow, not by names, and mapped onto the
 * tensors of a torchvision ResNet state_dict: conv1.weight, bn1.*, ...,
 * fc.weight, fc.bias. Batch norm (a BatchNormalization node with its own
 * epsilon, or already folded into a Conv's bias by the exporter) is folded
 * at load; each bn*.* of the result is then an exact identity (weight 2^20,
 * running_var 2^40, running_mean 0, bias = the folded bias), so that
 * model/resnet.c's fold returns the folded convolution bit for bit. */
typedef struct tw_onnx_info {
    int64_t ir_version;
    int64_t opset;       /* of the default domain */
    char producer[64];   /* producer_name and producer_version */
    int n_nodes;         /* nodes in the graph */
    int n_bn;            /* BatchNormalization nodes folded at load (0: folded by the exporter) */
    int n_external;      /* tensors read from external data files */
    int input_size;      /* the graph input's fixed height = width, 0 when not fixed */
    char head[64];       /* the pooling and head ops, e.g. "GlobalAveragePool, Flatten, Gemm" */
    bool softmax;        /* the graph ends in Softmax (tilewise applies one either way) */
    char metadata[160];  /* metadata_props keys used, comma-separated ("" when none) */
    double resolution;   /* Deepness's 'resolution' (cm/px), NaN when absent: shown, not used */
    char model_type[32]; /* Deepness's 'model_type', "" when absent */
    int tiles_overlap;   /* Deepness's 'tiles_overlap' (percent of the tile), -1 when
                            absent: shown, not applied (tiling.stride says the stride) */
} tw_onnx_info;

typedef struct tw_model_file {
    char path[TW_PATH_MAX];
    tw_tensor *tensors;
    int n_tensors;
    /* metadata; n_* == 0 / empty / NaN / 0 means "not in the file" */
    char arch[32];
    tw_stem stem; /* TW_STEM_AUTO: not in the file (conv1's kernel says) */
    int bands[TW_MAX_BANDS];
    int n_bands;
    double scale;
    float mean[TW_MAX_BANDS];
    int n_mean;
    float std[TW_MAX_BANDS];
    int n_std;
    char classes[TW_MAX_CLASSES][TW_NAME_MAX];
    int n_classes;
    int tile;
    int stride;      /* the default tiling.stride (<= tile when both are set) */
    char sha256[65]; /* hex digest of the whole file (ONNX with external data: of the
                        file's digest followed by every external tensor's bytes) */
    tw_model_checksum checksum;
    tw_model_format format;
    tw_onnx_info onnx; /* format == TW_MODEL_FORMAT_ONNX only */
} tw_model_file;

/* Load a model file; the format is detected from its content (HDF5 signature;
 * ONNX: a name ending in .onnx, or a protobuf that starts with ir_version;
 * else safetensors). On success *out owns everything and must be released
 * with tw_model_file_destroy. On error *out is NULL and err names the file
 * and what is wrong (TW_ERR_MODEL; TW_ERR_NOMEM for allocation failures):
 * also a non-finite tensor value or a bundle whose tensors_sha256 does not
 * match (the message says "checksum").
 * Hostile files (bad header length, offsets past the end, overlapping
 * tensors, wrong dtypes) are errors, never crashes. Thread-safe. */
tw_status tw_model_file_load(const char *path, tw_model_file **out, tw_error *err);

/* The notice a caller should log about a loaded model file (the library
 * prints nothing): today, an HDF5 bundle without a checksum. Writes one
 * line into buf (cap bytes) and returns true, or returns false when there
 * is nothing to say. Thread-safe. */
bool tw_model_file_notice(const tw_model_file *mf, char *buf, size_t cap);

/* "verified", "absent" or "none" (the format has none), for info/JSON. */
const char *tw_model_checksum_name(tw_model_checksum c);

/* Release; accepts NULL. */
void tw_model_file_destroy(tw_model_file *mf);

/* The tensor called name, or NULL. Borrowed: valid until destroy.
 * (io/modelfile/model_file_impl.c: the readers look tensors up too.) */
const tw_tensor *tw_model_file_find(const tw_model_file *mf, const char *name);

#endif

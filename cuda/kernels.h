/* kernels.h - private to cuda/: the small device kernels of the CUDA backend.
 *
 * cuDNN does the convolutions and the max pool; these kernels do the rest:
 * raw pixels -> normalized NHWC input, the conv epilogue used when cuDNN has
 * no fused kernel for a layer, global average pooling, and fc + softmax.
 * Each launcher enqueues on the given stream, does not synchronize, and
 * returns the launch status (cudaGetLastError); the caller checks it with
 * TW_CUDA_CHECK. Callable from C (cuda_infer.c) and defined in kernels.cu.
 */
#ifndef TW_CUDA_KERNELS_H
#define TW_CUDA_KERNELS_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#include "core/params.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Element type of the network's activations and weights on the device. */
typedef enum tw_cuda_dtype {
    TW_CUDA_F32 = 0,
    TW_CUDA_F16,
    TW_CUDA_BF16,
} tw_cuda_dtype;

/* Raw pixel types, numbered as io/input/raster.h's tw_dtype (checked in cuda_infer.c). */
enum {
    TW_CUDA_RAW_U8 = 0,
    TW_CUDA_RAW_U16,
    TW_CUDA_RAW_I16,
    TW_CUDA_RAW_U32,
    TW_CUDA_RAW_I32,
    TW_CUDA_RAW_F32,
    TW_CUDA_RAW_F64,
    TW_CUDA_RAW_I8,
};

/* Per-band affine map x = v * a[c] + b[c] (a = scale/std, b = -mean/std).
 * Passed by value as a kernel argument, so no upload is needed per batch. */
typedef struct tw_cuda_affine {
    float a[TW_MAX_BANDS];
    float b[TW_MAX_BANDS];
} tw_cuda_affine;

/* raw [n][bands][hw] of raw_type and valid [n][hw] (NULL: all valid) ->
 * x [n_pad][hw][c_pad] NHWC of out_type. Channels >= bands, tiles >= n and
 * invalid pixels are written as 0, so padded tiles and channels are defined. */
cudaError_t tw_cuda_launch_normalize(const void *raw, int raw_type, const uint8_t *valid, int n,
                                     int n_pad, int bands, int hw, int c_pad,
                                     const tw_cuda_affine *aff, void *x, tw_cuda_dtype out_type,
                                     cudaStream_t stream);

/* y [count] NHWC with cout channels: y = act(y + bias[c] + z), z may be NULL,
 * act is ReLU when relu != 0 else identity. bias has the type of y. */
cudaError_t tw_cuda_launch_epilogue(void *y, const void *bias, const void *z, int64_t count,
                                    int cout, int relu, tw_cuda_dtype type, cudaStream_t stream);

/* x [n][hw][c] NHWC of type -> out [n][c] float32 means over hw. */
cudaError_t tw_cuda_launch_global_avg(const void *x, int n, int hw, int c, tw_cuda_dtype type,
                                      float *out, cudaStream_t stream);

/* f [n][feat] float32 -> probs [n][classes] = softmax(w f + b), with
 * w [classes][feat] and b [classes] float32. classes <= TW_MAX_CLASSES. */
cudaError_t tw_cuda_launch_fc_softmax(const float *f, const float *w, const float *b, int n,
                                      int feat, int classes, float *probs, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif

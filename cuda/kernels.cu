/* kernels.cu - see kernels.h. Simple grid-stride kernels: none of them is on
 * the critical path next to the convolutions, so clarity wins over tuning. */
#include "cuda/kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace {

const int kThreads = 256;
/* Grid-stride loops cover any count; more blocks than this only adds
 * scheduling overhead. */
const int64_t kMaxBlocks = 1 << 16;

int blocks_for(int64_t count)
{
    int64_t b = (count + kThreads - 1) / kThreads;
    if (b < 1) b = 1;
    return (int)(b < kMaxBlocks ? b : kMaxBlocks);
}

__device__ inline float to_float(float v) { return v; }
__device__ inline float to_float(__half v) { return __half2float(v); }
__device__ inline float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ inline T from_float(float v);
template <> __device__ inline float from_float<float>(float v) { return v; }
template <> __device__ inline __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float v)
{
    return __float2bfloat16_rn(v);
}

template <typename In, typename Out>
__global__ void normalize_kernel(const In *raw, const uint8_t *valid, int n, int64_t total,
                                 int bands, int hw, int c_pad, tw_cuda_affine aff, Out *x)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        int c = (int)(i % c_pad);
        int64_t pix = i / c_pad; /* tile * hw + p */
        int64_t t = pix / hw;
        int64_t p = pix - t * hw;
        float v = 0.0f;
        if (t < n && c < bands && (!valid || valid[pix]))
            v = (float)raw[(t * bands + c) * hw + p] * aff.a[c] + aff.b[c];
        x[i] = from_float<Out>(v);
    }
}

template <typename In>
cudaError_t normalize_to(const In *raw, const uint8_t *valid, int n, int n_pad, int bands, int hw,
                         int c_pad, const tw_cuda_affine *aff, void *x, tw_cuda_dtype out_type,
                         cudaStream_t s)
{
    int64_t total = (int64_t)n_pad * hw * c_pad;
    int g = blocks_for(total);
    switch (out_type) {
    case TW_CUDA_F32:
        normalize_kernel<<<g, kThreads, 0, s>>>(raw, valid, n, total, bands, hw, c_pad, *aff,
                                                (float *)x);
        break;
    case TW_CUDA_F16:
        normalize_kernel<<<g, kThreads, 0, s>>>(raw, valid, n, total, bands, hw, c_pad, *aff,
                                                (__half *)x);
        break;
    case TW_CUDA_BF16:
        normalize_kernel<<<g, kThreads, 0, s>>>(raw, valid, n, total, bands, hw, c_pad, *aff,
                                                (__nv_bfloat16 *)x);
        break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

template <typename T>
__global__ void epilogue_kernel(T *y, const T *bias, const T *z, int64_t count, int cout, int relu)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x) {
        float v = to_float(y[i]) + to_float(bias[i % cout]);
        if (z) v += to_float(z[i]);
        if (relu && v < 0.0f) v = 0.0f;
        y[i] = from_float<T>(v);
    }
}

template <typename T>
__global__ void global_avg_kernel(const T *x, int n, int hw, int c, float *out)
{
    int64_t total = (int64_t)n * c;
    float inv = 1.0f / (float)hw;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = i / c;
        int64_t ch = i - t * c;
        const T *p = x + t * hw * c + ch;
        float sum = 0.0f;
        for (int k = 0; k < hw; k++) sum += to_float(p[(int64_t)k * c]);
        out[i] = sum * inv;
    }
}

/* One block per tile: each warp computes whole logits (lanes split the dot
 * product, coalesced over feat), then one thread does the softmax over at
 * most TW_MAX_CLASSES values. */
__global__ void fc_softmax_kernel(const float *f, const float *w, const float *b, int feat,
                                  int classes, float *probs)
{
    __shared__ float logits[TW_MAX_CLASSES];
    const float *ft = f + (int64_t)blockIdx.x * feat;
    int lane = threadIdx.x & 31;
    int warp = threadIdx.x >> 5;
    int n_warps = blockDim.x >> 5;
    for (int k = warp; k < classes; k += n_warps) {
        const float *wk = w + (int64_t)k * feat;
        float sum = 0.0f;
        for (int i = lane; i < feat; i += 32) sum += wk[i] * ft[i];
        for (int off = 16; off > 0; off >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, off);
        if (lane == 0) logits[k] = sum + b[k];
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float mx = logits[0];
        for (int k = 1; k < classes; k++) mx = fmaxf(mx, logits[k]);
        float total = 0.0f;
        for (int k = 0; k < classes; k++) {
            logits[k] = expf(logits[k] - mx);
            total += logits[k];
        }
        float *pt = probs + (int64_t)blockIdx.x * classes;
        for (int k = 0; k < classes; k++) pt[k] = logits[k] / total;
    }
}

} // namespace

extern "C" cudaError_t tw_cuda_launch_normalize(const void *raw, int raw_type,
                                                const uint8_t *valid, int n, int n_pad, int bands,
                                                int hw, int c_pad, const tw_cuda_affine *aff,
                                                void *x, tw_cuda_dtype out_type,
                                                cudaStream_t stream)
{
    if (bands > TW_MAX_BANDS || bands > c_pad || n > n_pad) return cudaErrorInvalidValue;
    switch (raw_type) {
    case TW_CUDA_RAW_U8:
        return normalize_to((const uint8_t *)raw, valid, n, n_pad, bands, hw, c_pad, aff, x,
                            out_type, stream);
    case TW_CUDA_RAW_U16:
        return normalize_to((const uint16_t *)raw, valid, n, n_pad, bands, hw, c_pad, aff, x,
                            out_type, stream);
    case TW_CUDA_RAW_I16:
        return normalize_to((const int16_t *)raw, valid, n, n_pad, bands, hw, c_pad, aff, x,
                            out_type, stream);
    case TW_CUDA_RAW_U32:
        return normalize_to((const uint32_t *)raw, valid, n, n_pad, bands, hw, c_pad, aff, x,
                            out_type, stream);
    case TW_CUDA_RAW_I32:
        return normalize_to((const int32_t *)raw, valid, n, n_pad, bands, hw, c_pad, aff, x,
                            out_type, stream);
    case TW_CUDA_RAW_F32:
        return normalize_to((const float *)raw, valid, n, n_pad, bands, hw, c_pad, aff, x,
                            out_type, stream);
    case TW_CUDA_RAW_F64:
        return normalize_to((const double *)raw, valid, n, n_pad, bands, hw, c_pad, aff, x,
                            out_type, stream);
    case TW_CUDA_RAW_I8:
        return normalize_to((const int8_t *)raw, valid, n, n_pad, bands, hw, c_pad, aff, x,
                            out_type, stream);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t tw_cuda_launch_epilogue(void *y, const void *bias, const void *z,
                                               int64_t count, int cout, int relu,
                                               tw_cuda_dtype type, cudaStream_t stream)
{
    int g = blocks_for(count);
    switch (type) {
    case TW_CUDA_F32:
        epilogue_kernel<<<g, kThreads, 0, stream>>>((float *)y, (const float *)bias,
                                                    (const float *)z, count, cout, relu);
        break;
    case TW_CUDA_F16:
        epilogue_kernel<<<g, kThreads, 0, stream>>>((__half *)y, (const __half *)bias,
                                                    (const __half *)z, count, cout, relu);
        break;
    case TW_CUDA_BF16:
        epilogue_kernel<<<g, kThreads, 0, stream>>>((__nv_bfloat16 *)y,
                                                    (const __nv_bfloat16 *)bias,
                                                    (const __nv_bfloat16 *)z, count, cout, relu);
        break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

extern "C" cudaError_t tw_cuda_launch_global_avg(const void *x, int n, int hw, int c,
                                                 tw_cuda_dtype type, float *out,
                                                 cudaStream_t stream)
{
    int g = blocks_for((int64_t)n * c);
    switch (type) {
    case TW_CUDA_F32:
        global_avg_kernel<<<g, kThreads, 0, stream>>>((const float *)x, n, hw, c, out);
        break;
    case TW_CUDA_F16:
        global_avg_kernel<<<g, kThreads, 0, stream>>>((const __half *)x, n, hw, c, out);
        break;
    case TW_CUDA_BF16:
        global_avg_kernel<<<g, kThreads, 0, stream>>>((const __nv_bfloat16 *)x, n, hw, c, out);
        break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

extern "C" cudaError_t tw_cuda_launch_fc_softmax(const float *f, const float *w, const float *b,
                                                 int n, int feat, int classes, float *probs,
                                                 cudaStream_t stream)
{
    if (classes < 1 || classes > TW_MAX_CLASSES || n < 1) return cudaErrorInvalidValue;
    fc_softmax_kernel<<<n, kThreads, 0, stream>>>(f, w, b, feat, classes, probs);
    return cudaGetLastError();
}

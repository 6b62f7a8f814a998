/* cuda_check.h - private to cuda/: turn failed CUDA and cuDNN calls into statuses.
 *
 * Every CUDA runtime and cuDNN call in the backend goes through one of these
 * macros. A failure records "call, file:line, library message" once into the
 * run's tw_error (STYLE.md rule 7) and makes the enclosing function return
 * TW_ERR_DEVICE, so callers only pass the status up. The enclosing function
 * must return tw_status and have a `tw_error *err` in scope.
 *
 * Allocation failures that reserve() answers by halving the batch do NOT go
 * through these macros (see cuda_reserve.c): recording them would leave a
 * stale message behind after a successful retry.
 */
#ifndef TW_CUDA_CHECK_H
#define TW_CUDA_CHECK_H

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "core/error.h"

/* Record a failed CUDA runtime call. Returns TW_ERR_DEVICE. */
tw_status tw_cuda_fail(tw_error *err, const char *call, cudaError_t e, const char *file, int line);
/* Record a failed cuDNN call. Returns TW_ERR_DEVICE. */
tw_status tw_cudnn_fail(tw_error *err, const char *call, cudnnStatus_t s, const char *file,
                        int line);

#define TW_CUDA_CHECK(call)                                                                        \
    do {                                                                                           \
        cudaError_t tw_e_ = (call);                                                                \
        if (tw_e_ != cudaSuccess) return tw_cuda_fail(err, #call, tw_e_, __FILE__, __LINE__);      \
    } while (0)

#define TW_CUDNN_CHECK(call)                                                                       \
    do {                                                                                           \
        cudnnStatus_t tw_s_ = (call);                                                              \
        if (tw_s_ != CUDNN_STATUS_SUCCESS)                                                         \
            return tw_cudnn_fail(err, #call, tw_s_, __FILE__, __LINE__);                           \
    } while (0)

#endif

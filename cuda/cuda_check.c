/* cuda_check.c - the error helpers of cuda_check.h: a failed CUDA or cuDNN
 * call as one message in the run's tw_error. */
#include <string.h>

#include "cuda/cuda_check.h"

/* Length of the function name at the start of a stringified call: the
 * argument list adds nothing to the message but length. */
static int call_name_len(const char *call)
{
    const char *paren = strchr(call, '(');
    return paren ? (int)(paren - call) : (int)strlen(call);
}

tw_status tw_cuda_fail(tw_error *err, const char *call, cudaError_t e, const char *file, int line)
{
    return tw_error_set(err, TW_ERR_DEVICE, "CUDA call %.*s failed at %s:%d: %s (%s)",
                        call_name_len(call), call, file, line, cudaGetErrorString(e),
                        cudaGetErrorName(e));
}

tw_status tw_cudnn_fail(tw_error *err, const char *call, cudnnStatus_t s, const char *file,
                        int line)
{
    return tw_error_set(err, TW_ERR_DEVICE, "cuDNN call %.*s failed at %s:%d: %s (%d)",
                        call_name_len(call), call, file, line, cudnnGetErrorString(s), (int)s);
}

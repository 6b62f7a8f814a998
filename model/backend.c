/* backend.c - the backend registry: runtime.device to a backend (see backend.h).
 * The only place outside cuda/ that knows whether CUDA was compiled in. */
#include "model/backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static tw_status parse_cuda_index(const char *device, int *index, tw_error *err)
{
    *index = 0;
    if (strcmp(device, "cuda") == 0) return TW_OK;
    const char *num = device + 5; /* after "cuda:" */
    char *end = NULL;
    long v = strtol(num, &end, 10);
    if (*num == '\0' || *end != '\0' || v < 0 || v > 1024)
        return tw_error_set(err, TW_ERR_CONFIG,
                            "runtime.device: '%s' is not auto, cpu, cuda or cuda:N", device);
    *index = (int)v;
    return TW_OK;
}

#define MAX_REGISTERED 4

static struct {
    char device[16];
    tw_backend_create_fn create;
} g_registered[MAX_REGISTERED];
static int g_n_registered;

tw_status tw_backend_register(const char *device, tw_backend_create_fn create, tw_error *err)
{
    if (!device || !*device || strlen(device) >= sizeof g_registered[0].device || !create)
        return tw_error_set(err, TW_ERR_INTERNAL, "backend registration: bad device name");
    if (g_n_registered == MAX_REGISTERED)
        return tw_error_set(err, TW_ERR_INTERNAL, "backend registration: at most %d backends",
                            MAX_REGISTERED);
    snprintf(g_registered[g_n_registered].device, sizeof g_registered[0].device, "%s", device);
    g_registered[g_n_registered++].create = create;
    return TW_OK;
}

tw_status tw_backend_create(const char *device, int threads, bool quiet, tw_backend *out,
                            tw_error *err)
{
    memset(out, 0, sizeof *out);
    for (int i = 0; i < g_n_registered; i++)
        if (strcmp(device, g_registered[i].device) == 0)
            return g_registered[i].create(threads, out, err);
    if (strcmp(device, "cpu") == 0) return tw_cpu_backend_create(threads, out, err);
    if (strcmp(device, "auto") == 0) {
#ifdef TW_WITH_CUDA
        if (tw_cuda_device_count() > 0) return tw_cuda_backend_create(0, out, err);
        if (!quiet) fprintf(stderr, "tilewise: no CUDA device found; running on the CPU\n");
#else
        if (!quiet)
            fprintf(stderr, "tilewise: built without the CUDA backend; running on the CPU\n");
#endif
        return tw_cpu_backend_create(threads, out, err);
    }
    if (strcmp(device, "cuda") == 0 || strncmp(device, "cuda:", 5) == 0) {
        int index;
        tw_status st = parse_cuda_index(device, &index, err);
        if (st != TW_OK) return st;
#ifdef TW_WITH_CUDA
        int count = tw_cuda_device_count();
        if (count <= 0)
            return tw_error_set(err, TW_ERR_DEVICE,
                                "runtime.device %s: no CUDA device is available on this machine "
                                "(use device: auto or cpu)",
                                device);
        if (index >= count)
            return tw_error_set(err, TW_ERR_DEVICE,
                                "runtime.device %s: this machine has %d CUDA device%s (cuda:0..%d)",
                                device, count, count == 1 ? "" : "s", count - 1);
        return tw_cuda_backend_create(index, out, err);
#else
        return tw_error_set(err, TW_ERR_DEVICE,
                            "runtime.device %s: this tilewise was built without the CUDA backend",
                            device);
#endif
    }
    return tw_error_set(err, TW_ERR_CONFIG, "runtime.device: '%s' is not auto, cpu, cuda or cuda:N",
                        device);
}

void tw_backend_destroy(tw_backend *b)
{
    if (!b || !b->i) return;
    b->i->destroy(b->ctx);
    b->i = NULL;
    b->ctx = NULL;
}

/* fuzz_model_file.c - libFuzzer harness for the model-file readers.
 *
 * tw_model_file_load takes a path, so each input is written to one scratch
 * file in /dev/shm (memory, no disk traffic) and loaded from there: no change
 * to the library's API. (A memfd seen through /proc/self/fd/N would be
 * simpler, but HDF5 resolves the link to "/memfd:... (deleted)" and refuses
 * it.) The same harness serves both formats: the
 * reader picks HDF5 from the file's signature, else safetensors. Built twice
 * (fuzz_safetensors, fuzz_hdf5) with different seed corpora; FUZZ_FORCE_HDF5
 * makes the HDF5 build put the signature in front of inputs that lack it, so
 * that its time is spent in the bundle reader. FUZZ_ONNX (fuzz_onnx) names the
 * scratch file *.onnx, which sends every input to the ONNX reader.
 *
 * Checked besides crashes and sanitizer reports: an error leaves no result
 * and a message naming the file; the counting allocator is back to zero; no
 * HDF5 object stays open.
 */
#include <hdf5.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include "io/modelfile/model_file.h"
#include "core/alloc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int write_all(int fd, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static char scratch[64];

static void remove_scratch(void)
{
    if (scratch[0]) unlink(scratch);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const uint8_t sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    if (!scratch[0]) {
#ifdef FUZZ_ONNX
        snprintf(scratch, sizeof scratch, "/dev/shm/tw_fuzz_model_%d.onnx", (int)getpid());
#else
        snprintf(scratch, sizeof scratch, "/dev/shm/tw_fuzz_model_%d", (int)getpid());
#endif
        atexit(remove_scratch);
    }
    int fd = open(scratch, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) {
        perror(scratch);
        __builtin_trap(); /* the harness cannot work: say so, do not fuzz nothing */
    }
    int bad = 0;
#ifdef FUZZ_FORCE_HDF5
    if (size < sizeof sig || memcmp(data, sig, sizeof sig) != 0)
        bad |= write_all(fd, sig, sizeof sig);
#else
    (void)sig;
#endif
    bad |= write_all(fd, data, size);
    if (close(fd) != 0 || bad) {
        perror(scratch);
        __builtin_trap();
    }
    const char *path = scratch;

    tw_error err;
    tw_error_init(&err);
    tw_model_file *mf = NULL;
    tw_status st = tw_model_file_load(path, &mf, &err);
    if (st == TW_OK) {
        /* Touch every tensor: a wrong numel would show up under ASan here. */
        volatile float sink = 0.0f;
        for (int i = 0; i < mf->n_tensors; i++)
            for (int64_t k = 0; k < mf->tensors[i].numel; k++) sink += mf->tensors[i].data[k];
        (void)sink;
        tw_model_file_destroy(mf);
    } else if (mf != NULL || err.msg[0] == '\0' || strstr(err.msg, path) == NULL) {
        fprintf(stderr, "error without the file name or with a result: '%s'\n", err.msg);
        __builtin_trap();
    }
    /* Every byte the reader took from the counting allocator is given back,
     * on error paths too (a leak LeakSanitizer would also see, but this
     * names the tag at once). */
    size_t held = tw_mem_current(TW_MEM_TAG_COUNT);
    if (held != 0) {
        fprintf(stderr, "%zu bytes still allocated after status %d\n", held, (int)st);
        __builtin_trap();
    }
    /* Every HDF5 object opened by the reader must be closed again, error
     * paths included (LeakSanitizer cannot see HDF5's own free lists). */
    ssize_t open_objs = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL);
    if (open_objs != 0) {
        fprintf(stderr, "%zd HDF5 objects left open after status %d\n", open_objs, (int)st);
        __builtin_trap();
    }
    return 0;
}

/* seg_forward.c - run a segmentation model file on raw float tiles (for
 * tests/e2e_seg_parity.py; built for the tests only, not installed).
 *
 *   seg_forward MODEL TILE N IN OUT [ARCH]
 *
 * IN: N tiles of float32 [bands][TILE][TILE] (native order); OUT gets N x
 * [classes][TILE][TILE] probabilities. Prints "arch classes bands arena
 * total same" on success (arena: tw_seg_cpu_batch_bytes' activation arena;
 * total: tw_seg_cpu_bytes; same: "same" when every tile run alone gave the
 * bits it got in the batch, "-" for N = 1); on error the library's message
 * on stderr, exit 1. N = 0: the line without running (IN and OUT unread),
 * then the model file's facts: "tile T classes K FIRST_CLASS mean M0 std S0
 * scale X overlap O type TYPE" (0 / - / nan / -1 when the file has none;
 * overlap and type: an ONNX file's Deepness tiles_overlap and model_type).
 */
#include <math.h>
#include <string.h>
#include <stdio.h>
#include <stdlib.h>

#include "io/modelfile/model_file.h"
#include "model/seg_cpu.h"
#include "model/segnet.h"
#include "core/error.h"

static int fail(const tw_error *err)
{
    fprintf(stderr, "error: %s\n", err->msg);
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 6 || argc > 7) {
        fprintf(stderr, "usage: seg_forward MODEL TILE N IN OUT [ARCH]\n");
        return 2;
    }
    int tile = atoi(argv[2]), n = atoi(argv[3]);
    tw_error err;
    tw_error_init(&err);
    tw_model_file *mf = NULL;
    if (tw_model_file_load(argv[1], &mf, &err) != TW_OK) return fail(&err);
    tw_segnet *net = NULL;
    tw_status st = tw_segnet_create(mf, argc == 7 ? argv[6] : "", &net, &err);
    char facts[512];
    snprintf(
        facts, sizeof facts, "tile %d classes %d %s mean %g std %g scale %g overlap %d type %s",
        mf->tile, mf->n_classes, mf->n_classes ? mf->classes[0] : "-",
        mf->n_mean ? (double)mf->mean[0] : NAN, mf->n_std ? (double)mf->std[0] : NAN, mf->scale,
        mf->format == TW_MODEL_FORMAT_ONNX ? mf->onnx.tiles_overlap : -1,
        mf->format == TW_MODEL_FORMAT_ONNX && mf->onnx.model_type[0] ? mf->onnx.model_type : "-");
    tw_model_file_destroy(mf);
    if (st != TW_OK) return fail(&err);
    tw_seg_cpu *cpu = NULL;
    if (tw_seg_cpu_create(net, tile, &cpu, &err) != TW_OK) return fail(&err);
    size_t px = (size_t)tile * (size_t)tile, total = 0, arena = 0;
    if (tw_seg_cpu_batch_bytes(net, tile, n, &total, &arena, &err) != TW_OK) return fail(&err);
    if (n == 0) {
        printf("%s %d %d %zu %zu -\n%s\n", net->arch, net->n_classes, net->in_bands, arena,
               tw_seg_cpu_bytes(cpu), facts);
        tw_seg_cpu_destroy(cpu);
        tw_segnet_destroy(net);
        return 0;
    }
    size_t nin = (size_t)n * px * (size_t)net->in_bands;
    size_t nout = (size_t)n * px * (size_t)net->n_classes;
    float *in = malloc(nin * sizeof *in), *out = malloc(nout * sizeof *out);
    FILE *f = fopen(argv[4], "rb");
    if (!in || !out || !f || fread(in, sizeof *in, nin, f) != nin) {
        fprintf(stderr, "error: cannot read %zu floats from %s\n", nin, argv[4]);
        return 1;
    }
    fclose(f);
    if (tw_seg_cpu_run(cpu, in, n, out, &err) != TW_OK) return fail(&err);
    f = fopen(argv[5], "wb");
    if (!f || fwrite(out, sizeof *out, nout, f) != nout || fclose(f) != 0) {
        fprintf(stderr, "error: cannot write %s\n", argv[5]);
        return 1;
    }
    /* a tile's bits must not depend on the batch it ran in */
    const char *same = n > 1 ? "same" : "-";
    size_t one = px * (size_t)net->n_classes;
    float *alone = malloc(one * sizeof *alone);
    for (int t = 0; n > 1 && t < n; t++) {
        if (!alone || tw_seg_cpu_run(cpu, in + (size_t)t * px * (size_t)net->in_bands, 1, alone,
                                     &err) != TW_OK)
            return fail(&err);
        if (memcmp(alone, out + (size_t)t * one, one * sizeof *alone) != 0) same = "differ";
    }
    free(alone);
    printf("%s %d %d %zu %zu %s\n", net->arch, net->n_classes, net->in_bands, arena,
           tw_seg_cpu_bytes(cpu), same);
    free(in);
    free(out);
    tw_seg_cpu_destroy(cpu);
    tw_segnet_destroy(net);
    return 0;
}

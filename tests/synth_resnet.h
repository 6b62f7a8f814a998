/* synth_resnet.h - in-memory torchvision-layout ResNet state_dicts for tests.
 *
 * Builds a tw_model_file by hand (no file, no loader) with any block layout,
 * width, band and class count, and deterministic pseudo-random values, so
 * tests can check depth inference for every depth, the BN fold by hand, and
 * the error messages for missing or misshapen tensors. The caller owns the
 * struct; release it with synth_free(). Header-only: test_resnet.c and
 * test_cpu_backend.c both include it.
 */
#ifndef TW_SYNTH_RESNET_H
#define TW_SYNTH_RESNET_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/modelfile/model_file.h"

#define SYNTH_MAX_TENSORS 1200

typedef struct synth {
    tw_model_file mf;
    uint64_t rng;
} synth;

static inline float synth_uniform(synth *s)
{
    s->rng = s->rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((s->rng >> 40) & 0xFFFFFF) / (float)0x1000000; /* [0, 1) */
}

/* A tensor with values uniform in [lo, hi). */
static inline tw_tensor *synth_add(synth *s, const char *name, int ndim, const int64_t *shape,
                                   float lo, float hi)
{
    if (s->mf.n_tensors >= SYNTH_MAX_TENSORS) return NULL;
    tw_tensor *t = &s->mf.tensors[s->mf.n_tensors++];
    memset(t, 0, sizeof *t);
    size_t len = strlen(name);
    if (len >= sizeof t->name) len = sizeof t->name - 1;
    memcpy(t->name, name, len);
    t->ndim = ndim;
    t->numel = 1;
    for (int d = 0; d < ndim; d++) {
        t->shape[d] = shape[d];
        t->numel *= shape[d];
    }
    t->data = malloc((size_t)t->numel * sizeof(float));
    for (int64_t i = 0; t->data && i < t->numel; i++)
        t->data[i] = lo + (hi - lo) * synth_uniform(s);
    return t;
}

static inline tw_tensor *synth_find(synth *s, const char *name)
{
    for (int i = 0; i < s->mf.n_tensors; i++)
        if (strcmp(s->mf.tensors[i].name, name) == 0) return &s->mf.tensors[i];
    return NULL;
}

static inline void synth_remove(synth *s, const char *name)
{
    tw_tensor *t = synth_find(s, name);
    if (!t) return;
    free(t->data);
    *t = s->mf.tensors[--s->mf.n_tensors];
}

/* Give tensor name a new shape (fresh values). */
static inline void synth_reshape(synth *s, const char *name, int ndim, const int64_t *shape)
{
    tw_tensor *t = synth_find(s, name);
    if (!t) return;
    char keep[128];
    snprintf(keep, sizeof keep, "%s", t->name);
    synth_remove(s, name);
    synth_add(s, keep, ndim, shape, -0.1f, 0.1f);
}

static inline void synth_conv_bn(synth *s, const char *conv, const char *bn, int cout, int cin,
                                 int k)
{
    char n[160];
    float r = sqrtf(3.0f / (float)(cin * k * k)); /* keeps activations near unit scale */
    snprintf(n, sizeof n, "%s.weight", conv);
    synth_add(s, n, 4, (int64_t[]){cout, cin, k, k}, -r, r);
    snprintf(n, sizeof n, "%s.weight", bn);
    synth_add(s, n, 1, (int64_t[]){cout}, 0.5f, 1.5f);
    snprintf(n, sizeof n, "%s.bias", bn);
    synth_add(s, n, 1, (int64_t[]){cout}, -0.1f, 0.1f);
    snprintf(n, sizeof n, "%s.running_mean", bn);
    synth_add(s, n, 1, (int64_t[]){cout}, -0.1f, 0.1f);
    snprintf(n, sizeof n, "%s.running_var", bn);
    synth_add(s, n, 1, (int64_t[]){cout}, 0.5f, 1.5f);
}

/* The torchvision family's shapes beyond a plain ResNet (synth_resnet_ex). */
typedef struct synth_family {
    int groups;   /* a bottleneck's conv2 groups (ResNeXt); 0 or 1: none */
    int mid_mult; /* a bottleneck's inner width = mid_mult x its planes (0: 1; ResNeXt
                     32x4d and Wide-50-2: 2) */
    int small;    /* 1: the small stem, conv1 3x3 (stride 1, no max pool) */
} synth_family;

static inline int synth_resnet_ex(synth *s, const int blocks[4], int bottleneck, int in_bands,
                                  int width, int n_classes, uint64_t seed, synth_family fam);

/* A torchvision ResNet state_dict: stage s has blocks[s] blocks of width
 * width << s (bottleneck: expansion 4). Returns 0, or -1 on allocation failure. */
static inline int synth_resnet(synth *s, const int blocks[4], int bottleneck, int in_bands,
                               int width, int n_classes, uint64_t seed)
{
    return synth_resnet_ex(s, blocks, bottleneck, in_bands, width, n_classes, seed,
                           (synth_family){0, 0, 0});
}

/* synth_resnet with fam's groups, inner width and stem. */
static inline int synth_resnet_ex(synth *s, const int blocks[4], int bottleneck, int in_bands,
                                  int width, int n_classes, uint64_t seed, synth_family fam)
{
    int groups = fam.groups > 1 ? fam.groups : 1, mult = fam.mid_mult > 0 ? fam.mid_mult : 1;
    memset(s, 0, sizeof *s);
    s->rng = seed;
    snprintf(s->mf.path, sizeof s->mf.path, "synthetic.safetensors");
    s->mf.tensors = calloc(SYNTH_MAX_TENSORS, sizeof *s->mf.tensors);
    if (!s->mf.tensors) return -1;
    synth_conv_bn(s, "conv1", "bn1", width, in_bands, fam.small ? 3 : 7);
    int ch = width;
    char p[96], q[96];
    for (int st = 0; st < 4; st++) {
        int planes = width << st, out = bottleneck ? 4 * planes : planes;
        int w = bottleneck ? mult * planes : planes;
        for (int i = 0; i < blocks[st]; i++) {
            int stride = (st > 0 && i == 0) ? 2 : 1;
            snprintf(p, sizeof p, "layer%d.%d.conv1", st + 1, i);
            snprintf(q, sizeof q, "layer%d.%d.bn1", st + 1, i);
            synth_conv_bn(s, p, q, w, ch, bottleneck ? 1 : 3);
            snprintf(p, sizeof p, "layer%d.%d.conv2", st + 1, i);
            snprintf(q, sizeof q, "layer%d.%d.bn2", st + 1, i);
            synth_conv_bn(s, p, q, w, bottleneck ? w / groups : w, 3);
            if (bottleneck) {
                snprintf(p, sizeof p, "layer%d.%d.conv3", st + 1, i);
                snprintf(q, sizeof q, "layer%d.%d.bn3", st + 1, i);
                synth_conv_bn(s, p, q, out, w, 1);
            }
            if (stride != 1 || ch != out) {
                snprintf(p, sizeof p, "layer%d.%d.downsample.0", st + 1, i);
                snprintf(q, sizeof q, "layer%d.%d.downsample.1", st + 1, i);
                synth_conv_bn(s, p, q, out, ch, 1);
            }
            ch = out;
        }
    }
    float r = 1.0f / sqrtf((float)ch);
    synth_add(s, "fc.weight", 2, (int64_t[]){n_classes, ch}, -r, r);
    synth_add(s, "fc.bias", 1, (int64_t[]){n_classes}, -0.1f, 0.1f);
    for (int i = 0; i < s->mf.n_tensors; i++)
        if (!s->mf.tensors[i].data) return -1;
    return 0;
}

static inline void synth_free(synth *s)
{
    for (int i = 0; s->mf.tensors && i < s->mf.n_tensors; i++) free(s->mf.tensors[i].data);
    free(s->mf.tensors);
    s->mf.tensors = NULL;
    s->mf.n_tensors = 0;
}

#endif

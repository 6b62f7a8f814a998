/* forward_ref.c - the plain C reference forward pass (see backend.h, resnet.h).
 *
 * Plain loops, one image at a time, NCHW: each convolution output is one dot
 * product of the weights with the gathered receptive field. It is the
 * definition of what the fast backends must compute, so it favours being
 * obviously right over being fast; images run in parallel (OpenMP). The
 * graph is tw_resnet_walk's (resnet.h), as in the backends.
 */
#include <float.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "model/backend.h"
#include "core/alloc.h"

/* out[o][p] = b[o] + w[o] . col[p] (rows of klen floats) for c's cout
 * outputs over np pixels; optional relu. */
static void conv_rows(const tw_conv *c, const float *col, int np, size_t klen, bool relu,
                      float *out)
{
    for (int o = 0; o < c->cout; o++) {
        const float *w = c->w + (size_t)o * klen;
        for (int p = 0; p < np; p++) {
            const float *r = col + (size_t)p * klen;
            /* four partial sums: independent chains, no reliance on the
             * compiler reassociating float adds */
            float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
            size_t j = 0;
            for (; j + 4 <= klen; j += 4) {
                a0 += w[j] * r[j];
                a1 += w[j + 1] * r[j + 1];
                a2 += w[j + 2] * r[j + 2];
                a3 += w[j + 3] * r[j + 3];
            }
            for (; j < klen; j++) a0 += w[j] * r[j];
            float v = c->b[o] + ((a0 + a1) + (a2 + a3));
            out[(size_t)o * np + p] = (relu && v < 0.0f) ? 0.0f : v;
        }
    }
}

/* out[cout][oh][ow] = b + sum w * in (zero padding); optional relu.
 * col is scratch of oh*ow*cin*k*k floats: each output pixel's receptive field
 * is gathered into one row, so every output value is a single dot product
 * of two contiguous vectors (late stages have planes of 2x2 pixels, where
 * loops over the plane would be all overhead). A grouped conv runs group
 * by group: output channel o of group g = o / (cout / groups) reads input
 * channels [g cin / groups, (g + 1) cin / groups) with its weights. */
static void conv2d(const tw_conv *c, const float *in, int ih, int iw, float *out, int oh, int ow,
                   bool relu, float *col)
{
    int groups = c->groups > 0 ? c->groups : 1;
    int cin_g = c->cin / groups, cout_g = c->cout / groups;
    for (int g = 0; g < groups; g++) {
        tw_conv part = *c;
        part.cin = cin_g;
        part.cout = cout_g;
        part.w = c->w + (size_t)g * cout_g * cin_g * c->k * c->k;
        part.b = c->b + (size_t)g * cout_g;
        const float *pin = in + (size_t)g * cin_g * ih * iw;
        float *pout = out + (size_t)g * cout_g * oh * ow;
        int kk = c->k * c->k, np = oh * ow;
        size_t klen = (size_t)cin_g * kk;
        for (int p = 0; p < np; p++) {
            int y = p / ow, x = p % ow;
            float *row = col + (size_t)p * klen;
            for (int ci = 0; ci < cin_g; ci++)
                for (int ky = 0; ky < c->k; ky++) {
                    int sy = y * c->stride - c->pad + ky;
                    for (int kx = 0; kx < c->k; kx++) {
                        int sx = x * c->stride - c->pad + kx;
                        bool inside = sy >= 0 && sy < ih && sx >= 0 && sx < iw;
                        *row++ = inside ? pin[((size_t)ci * ih + sy) * iw + sx] : 0.0f;
                    }
                }
        }
        conv_rows(&part, col, np, klen, relu, pout);
    }
}

static void maxpool3s2p1(const float *in, int ch, int ih, int iw, float *out, int oh, int ow)
{
    for (int c = 0; c < ch; c++)
        for (int y = 0; y < oh; y++)
            for (int x = 0; x < ow; x++) {
                float m = -FLT_MAX;
                for (int ky = 0; ky < 3; ky++)
                    for (int kx = 0; kx < 3; kx++) {
                        int sy = 2 * y - 1 + ky, sx = 2 * x - 1 + kx;
                        if (sy < 0 || sy >= ih || sx < 0 || sx >= iw) continue;
                        float v = in[((size_t)c * ih + sy) * iw + sx];
                        if (v > m) m = v;
                    }
                out[((size_t)c * oh + y) * ow + x] = m;
            }
}

/* Sizes the walk needs: the largest activation and the largest gathered
 * receptive-field matrix (elements, one image). */
typedef struct ref_sizes {
    size_t act, col;
} ref_sizes;

static tw_status size_op(void *user, const tw_resnet_op *op, tw_error *err)
{
    (void)err;
    ref_sizes *s = user;
    if (!op->conv && op->kind != TW_RESNET_OP_MAXPOOL) return TW_OK;
    size_t plane = (size_t)op->h_out * (size_t)op->h_out;
    size_t e = (size_t)op->c_out * plane;
    if (e > s->act) s->act = e;
    if (op->conv) {
        size_t ce = plane * (size_t)(op->c_in / op->conv->groups) * (size_t)op->conv->k *
                    (size_t)op->conv->k;
        if (ce > s->col) s->col = ce;
    }
    return TW_OK;
}

/* One image on its way through the walk. */
typedef struct ref_image {
    const tw_resnet *net;
    const float *x; /* [bands][tile][tile] */
    float *buf[3];  /* the walk's three activation buffers */
    float *col, *feat;
    float *probs, *emb; /* [classes], [feat_dim] or NULL */
} ref_image;

static tw_status forward_op(void *user, const tw_resnet_op *op, tw_error *err)
{
    (void)err;
    ref_image *im = user;
    const float *src = op->buf_src >= 0 ? im->buf[op->buf_src] : im->x;
    float *dst = op->buf_dst >= 0 ? im->buf[op->buf_dst] : NULL;
    switch (op->kind) {
    case TW_RESNET_OP_STEM:
    case TW_RESNET_OP_SHORTCUT:
    case TW_RESNET_OP_CONV:
        conv2d(op->conv, src, op->h_in, op->h_in, dst, op->h_out, op->h_out, op->relu, im->col);
        break;
    case TW_RESNET_OP_RESIDUAL: {
        /* the conv, then the shortcut added, then the ReLU */
        conv2d(op->conv, src, op->h_in, op->h_in, dst, op->h_out, op->h_out, false, im->col);
        const float *s = im->buf[op->buf_add];
        size_t e = (size_t)op->c_out * op->h_out * op->h_out;
        for (size_t i = 0; i < e; i++) {
            float v = dst[i] + s[i];
            dst[i] = v > 0.0f ? v : 0.0f;
        }
        break;
    }
    case TW_RESNET_OP_MAXPOOL:
        maxpool3s2p1(src, op->c_in, op->h_in, op->h_in, dst, op->h_out, op->h_out);
        break;
    case TW_RESNET_OP_AVGPOOL: {
        /* in double, then the head every backend shares */
        size_t hw = (size_t)op->h_in * op->h_in;
        for (int c = 0; c < op->c_in; c++) {
            double acc = 0.0;
            for (size_t i = 0; i < hw; i++) acc += src[(size_t)c * hw + i];
            im->feat[c] = (float)(acc / (double)hw);
            if (im->emb) im->emb[c] = im->feat[c];
        }
        break;
    }
    case TW_RESNET_OP_FC:
        tw_resnet_head(im->net->fc_w, im->net->fc_b, op->c_out, op->c_in, im->feat, 1, im->probs);
        break;
    }
    return TW_OK;
}

tw_status tw_resnet_forward_ref(const tw_resnet *net, const float *x, int n, int tile, float *probs,
                                float *emb, tw_error *err)
{
    int h_stem = tw_resnet_out_size(tile, net->stem.k, net->stem.stride, net->stem.pad);
    if (tile < 1 || h_stem < 1 ||
        (net->stem_kind != TW_STEM_SMALL && tw_resnet_out_size(h_stem, 3, 2, 1) < 1))
        return tw_error_set(err, TW_ERR_INPUT, "tile size %d is too small for a ResNet", tile);
    if (n < 1) return TW_OK;
    ref_sizes sz = {0, 0};
    (void)tw_resnet_walk(net, tile, size_op, &sz, err); /* size_op cannot fail */
    size_t cap = sz.act, col_cap = sz.col;
    /* images are independent: one per thread, each with its own scratch (one
     * parallel region, rather than a barrier after every small layer) */
    int nt = omp_get_max_threads();
    if (nt > n) nt = n;
    size_t per_thread =
        (3 * cap + col_cap) * sizeof(float) + (size_t)net->feat_dim * sizeof(double);
    per_thread = (per_thread + 63) & ~(size_t)63; /* each thread's part starts aligned */
    char *scratch = tw_alloc(TW_MEM_WORKSPACE, (size_t)nt * per_thread);
    if (!scratch)
        return tw_error_set(err, TW_ERR_NOMEM, "out of memory for the reference forward pass");

    size_t in_elems = (size_t)net->in_bands * tile * tile;
#pragma omp parallel for num_threads(nt) schedule(dynamic)
    for (int img = 0; img < n; img++) {
        /* feat first (sized in doubles: keeps every part 8-byte aligned) */
        char *mine = scratch + (size_t)omp_get_thread_num() * per_thread;
        float *feat = (float *)mine;
        float *f = (float *)(mine + (size_t)net->feat_dim * sizeof(double));
        ref_image im = {.net = net,
                        .x = x + (size_t)img * in_elems,
                        .buf = {f, f + cap, f + 2 * cap},
                        .col = f + 3 * cap,
                        .feat = feat,
                        .probs = probs + (size_t)img * net->n_classes,
                        .emb = emb ? emb + (size_t)img * net->feat_dim : NULL};
        (void)tw_resnet_walk(net, tile, forward_op, &im, NULL); /* forward_op cannot fail */
    }
    tw_free(scratch);
    return TW_OK;
}

/* forward_ref.c - the plain C reference forward pass (see backend.h, resnet.h).
 *
 * Plain loops, one image at a time, NCHW: each convolution output is one dot
 * product of the weights with the gathered receptive field. It is the
 * definition of what the fast backends must compute, so it favours being
 * obviously right over being fast; images run in parallel (OpenMP).
 */
#include <float.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "model/backend.h"
#include "core/alloc.h"

/* out[cout][oh][ow] = b + sum w * in (zero padding); optional relu.
 * col is scratch of oh*ow*cin*k*k floats: each output pixel's receptive field
 * is gathered into one row, so every output value is a single dot product
 * of two contiguous vectors (late stages have planes of 2x2 pixels, where
 * loops over the plane would be all overhead). */
static void conv2d(const tw_conv *c, const float *in, int ih, int iw, float *out, int oh, int ow,
                   bool relu, float *col)
{
    int kk = c->k * c->k, np = oh * ow;
    size_t klen = (size_t)c->cin * kk;
    for (int p = 0; p < np; p++) {
        int y = p / ow, x = p % ow;
        float *row = col + (size_t)p * klen;
        for (int ci = 0; ci < c->cin; ci++)
            for (int ky = 0; ky < c->k; ky++) {
                int sy = y * c->stride - c->pad + ky;
                for (int kx = 0; kx < c->k; kx++) {
                    int sx = x * c->stride - c->pad + kx;
                    bool inside = sy >= 0 && sy < ih && sx >= 0 && sx < iw;
                    *row++ = inside ? in[((size_t)ci * ih + sy) * iw + sx] : 0.0f;
                }
            }
    }
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

/* Largest activation and largest gathered receptive-field matrix (elements,
 * one image) of the whole graph. */
static size_t max_activation(const tw_resnet *net, int tile, size_t *max_col)
{
    int h = tw_resnet_out_size(tile, 7, 2, 3);
    size_t m = (size_t)net->stem.cout * h * h;
    *max_col = (size_t)h * h * net->stem.cin * 49;
    h = tw_resnet_out_size(h, 3, 2, 1);
    for (int i = 0; i < net->n_blocks; i++) {
        const tw_block *b = &net->blocks[i];
        const tw_conv *cs[4] = {&b->c1, &b->c2, net->bottleneck ? &b->c3 : NULL,
                                b->has_down ? &b->down : NULL};
        int hin = h;
        for (int j = 0; j < 4; j++) {
            if (!cs[j]) continue;
            int src_h = (j == 3) ? hin : h;
            int oh = tw_resnet_out_size(src_h, cs[j]->k, cs[j]->stride, cs[j]->pad);
            size_t e = (size_t)cs[j]->cout * oh * oh;
            if (e > m) m = e;
            size_t ce = (size_t)oh * oh * cs[j]->cin * cs[j]->k * cs[j]->k;
            if (ce > *max_col) *max_col = ce;
            if (j < 3) h = oh;
        }
    }
    return m;
}

/* One image: x [bands][tile][tile] -> probs [classes], emb [feat_dim] or NULL.
 * buf: four activation buffers of cap floats; col and feat as sized by the caller. */
static void forward_one(const tw_resnet *net, const float *x, int tile, float *buf[4], float *col,
                        float *feat, float *probs, float *emb)
{
    /* buffers: cur = block input, t1/t2 = inner results, sc = shortcut */
    float *cur = buf[0], *t1 = buf[1], *t2 = buf[2], *sc = buf[3];
    int h = tw_resnet_out_size(tile, 7, 2, 3);
    conv2d(&net->stem, x, tile, tile, t1, h, h, true, col);
    int hp = tw_resnet_out_size(h, 3, 2, 1);
    maxpool3s2p1(t1, net->stem.cout, h, h, cur, hp, hp);
    h = hp;
    int ch = net->stem.cout;

    for (int bi = 0; bi < net->n_blocks; bi++) {
        const tw_block *b = &net->blocks[bi];
        const tw_conv *last = net->bottleneck ? &b->c3 : &b->c2;
        int h1 = tw_resnet_out_size(h, b->c1.k, b->c1.stride, b->c1.pad);
        conv2d(&b->c1, cur, h, h, t1, h1, h1, true, col);
        int h2 = tw_resnet_out_size(h1, b->c2.k, b->c2.stride, b->c2.pad);
        float *y;
        if (net->bottleneck) {
            conv2d(&b->c2, t1, h1, h1, t2, h2, h2, true, col);
            conv2d(&b->c3, t2, h2, h2, t1, h2, h2, false, col);
            y = t1;
        } else {
            conv2d(&b->c2, t1, h1, h1, t2, h2, h2, false, col);
            y = t2;
        }
        const float *s = cur;
        if (b->has_down) {
            conv2d(&b->down, cur, h, h, sc, h2, h2, false, col);
            s = sc;
        }
        size_t e = (size_t)last->cout * h2 * h2;
        for (size_t i = 0; i < e; i++) {
            float v = y[i] + s[i];
            y[i] = v > 0.0f ? v : 0.0f;
        }
        /* the block output becomes the next block's input */
        float *old = cur;
        cur = y;
        if (y == t1)
            t1 = old;
        else
            t2 = old;
        h = h2;
        ch = last->cout;
    }

    /* global average pool in double, then the head every backend shares */
    size_t hw = (size_t)h * h;
    for (int c = 0; c < ch; c++) {
        double acc = 0.0;
        for (size_t i = 0; i < hw; i++) acc += cur[(size_t)c * hw + i];
        feat[c] = (float)(acc / (double)hw);
        if (emb) emb[c] = feat[c];
    }
    tw_resnet_head(net->fc_w, net->fc_b, net->n_classes, ch, feat, 1, probs);
}

tw_status tw_resnet_forward_ref(const tw_resnet *net, const float *x, int n, int tile, float *probs,
                                float *emb, tw_error *err)
{
    int h_stem = tw_resnet_out_size(tile, 7, 2, 3);
    if (tile < 1 || h_stem < 1 || tw_resnet_out_size(h_stem, 3, 2, 1) < 1)
        return tw_error_set(err, TW_ERR_INPUT, "tile size %d is too small for a ResNet", tile);
    if (n < 1) return TW_OK;
    size_t col_cap;
    size_t cap = max_activation(net, tile, &col_cap);
    /* images are independent: one per thread, each with its own scratch (one
     * parallel region, rather than a barrier after every small layer) */
    int nt = omp_get_max_threads();
    if (nt > n) nt = n;
    size_t per_thread =
        (4 * cap + col_cap) * sizeof(float) + (size_t)net->feat_dim * sizeof(double);
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
        float *buf[4] = {f, f + cap, f + 2 * cap, f + 3 * cap};
        forward_one(net, x + (size_t)img * in_elems, tile, buf, f + 4 * cap, feat,
                    probs + (size_t)img * net->n_classes,
                    emb ? emb + (size_t)img * net->feat_dim : NULL);
    }
    tw_free(scratch);
    return TW_OK;
}

/* forward_ref.c - the plain C reference forward pass (see backend.h, resnet.h).
 *
 * Direct convolution loops, one image at a time, NCHW. It is the definition
 * of what the fast backends must compute, so it favours being obviously
 * right over being fast; OpenMP over output channels keeps the tests quick.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "model/backend.h"
#include "pipeline/alloc.h"

/* out[cout][oh][ow] = b + sum w * in (zero padding); optional relu. */
static void conv2d(const tw_conv *c, const float *in, int ih, int iw, float *out, int oh, int ow,
                   bool relu)
{
#pragma omp parallel for schedule(static)
    for (int o = 0; o < c->cout; o++) {
        float *dst = out + (size_t)o * oh * ow;
        for (int i = 0; i < oh * ow; i++) dst[i] = c->b[o];
        for (int ci = 0; ci < c->cin; ci++) {
            const float *src = in + (size_t)ci * ih * iw;
            const float *w = c->w + ((size_t)o * c->cin + ci) * c->k * c->k;
            for (int ky = 0; ky < c->k; ky++)
                for (int kx = 0; kx < c->k; kx++) {
                    float wv = w[ky * c->k + kx];
                    for (int y = 0; y < oh; y++) {
                        int sy = y * c->stride - c->pad + ky;
                        if (sy < 0 || sy >= ih) continue;
                        const float *srow = src + (size_t)sy * iw;
                        float *drow = dst + (size_t)y * ow;
                        for (int x = 0; x < ow; x++) {
                            int sx = x * c->stride - c->pad + kx;
                            if (sx >= 0 && sx < iw) drow[x] += wv * srow[sx];
                        }
                    }
                }
        }
        if (relu)
            for (int i = 0; i < oh * ow; i++) dst[i] = dst[i] > 0.0f ? dst[i] : 0.0f;
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

/* Largest activation (elements, one image) of the whole graph. */
static size_t max_activation(const tw_resnet *net, int tile)
{
    int h = tw_resnet_out_size(tile, 7, 2, 3);
    size_t m = (size_t)net->stem.cout * h * h;
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
            if (j < 3) h = oh;
        }
    }
    return m;
}

tw_status tw_resnet_forward_ref(const tw_resnet *net, const float *x, int n, int tile,
                                float *probs, float *emb, tw_error *err)
{
    int h_stem = tw_resnet_out_size(tile, 7, 2, 3);
    if (tile < 1 || h_stem < 1 || tw_resnet_out_size(h_stem, 3, 2, 1) < 1)
        return tw_error_set(err, TW_ERR_INPUT, "tile size %d is too small for a ResNet", tile);
    size_t cap = max_activation(net, tile);
    float *buf[4];
    bool ok = true;
    for (int i = 0; i < 4; i++) {
        buf[i] = tw_alloc(TW_MEM_WORKSPACE, cap * sizeof(float));
        ok = ok && buf[i];
    }
    double *feat = tw_alloc(TW_MEM_WORKSPACE, (size_t)net->feat_dim * sizeof(double));
    if (!ok || !feat) {
        for (int i = 0; i < 4; i++) tw_free(buf[i]);
        tw_free(feat);
        return tw_error_set(err, TW_ERR_NOMEM, "out of memory for the reference forward pass");
    }

    size_t in_elems = (size_t)net->in_bands * tile * tile;
    for (int img = 0; img < n; img++) {
        /* buffers: cur = block input, t1/t2 = inner results, sc = shortcut */
        float *cur = buf[0], *t1 = buf[1], *t2 = buf[2], *sc = buf[3];
        int h = h_stem;
        conv2d(&net->stem, x + (size_t)img * in_elems, tile, tile, t1, h, h, true);
        int hp = tw_resnet_out_size(h, 3, 2, 1);
        maxpool3s2p1(t1, net->stem.cout, h, h, cur, hp, hp);
        h = hp;
        int ch = net->stem.cout;

        for (int bi = 0; bi < net->n_blocks; bi++) {
            const tw_block *b = &net->blocks[bi];
            const tw_conv *last = net->bottleneck ? &b->c3 : &b->c2;
            int h1 = tw_resnet_out_size(h, b->c1.k, b->c1.stride, b->c1.pad);
            conv2d(&b->c1, cur, h, h, t1, h1, h1, true);
            int h2 = tw_resnet_out_size(h1, b->c2.k, b->c2.stride, b->c2.pad);
            float *y;
            if (net->bottleneck) {
                conv2d(&b->c2, t1, h1, h1, t2, h2, h2, true);
                conv2d(&b->c3, t2, h2, h2, t1, h2, h2, false);
                y = t1;
            } else {
                conv2d(&b->c2, t1, h1, h1, t2, h2, h2, false);
                y = t2;
            }
            const float *s = cur;
            if (b->has_down) {
                conv2d(&b->down, cur, h, h, sc, h2, h2, false);
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

        size_t hw = (size_t)h * h;
        for (int c = 0; c < ch; c++) {
            double acc = 0.0;
            for (size_t i = 0; i < hw; i++) acc += cur[(size_t)c * hw + i];
            feat[c] = acc / (double)hw;
            if (emb) emb[(size_t)img * ch + c] = (float)feat[c];
        }
        double logits[TW_MAX_CLASSES], mx = -INFINITY, sum = 0.0;
        for (int k = 0; k < net->n_classes; k++) {
            double acc = net->fc_b[k];
            const float *w = net->fc_w + (size_t)k * ch;
            for (int c = 0; c < ch; c++) acc += (double)w[c] * feat[c];
            logits[k] = acc;
            if (acc > mx) mx = acc;
        }
        for (int k = 0; k < net->n_classes; k++) {
            logits[k] = exp(logits[k] - mx);
            sum += logits[k];
        }
        for (int k = 0; k < net->n_classes; k++)
            probs[(size_t)img * net->n_classes + k] = (float)(logits[k] / sum);
    }
    for (int i = 0; i < 4; i++) tw_free(buf[i]);
    tw_free(feat);
    return TW_OK;
}

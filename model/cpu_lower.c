/* cpu_lower.c - the CPU backend's lowerings: fp32 convolutions run as
 * one oneDNN matrix product (LOWER_DENSE, LOWER_ROWS) or as Winograd F(4,3)
 * around one (LOWER_WINO), which of them a conv takes, and the check that
 * keeps a lowering only where a tile gets the same bits anywhere in a batch.
 *
 * GEMM lowerings:
 *
 * oneDNN's direct kernels block over the output width: on the last stage's
 * 2x2 maps (64-px tiles) they run at a third to a half of the machine's
 * SGEMM rate (bench/RESULTS.md, "CPU on AVX2 (issue 20)"). Two layers there
 * are GEMMs in another form, run as one oneDNN inner product:
 *  - LOWER_DENSE: a tile's whole input map times the conv's Toeplitz matrix
 *    ([Hout Wout Cout] x [H W Cin], built at reserve in the activations' own
 *    layouts, so no reorder appears), the tiles of the batch as rows; for a
 *    3x3 stride-1 conv on a 2x2 map it needs 16 / 36 of the direct
 *    multiply-adds (the padding taps vanish);
 *  - LOWER_ROWS: a 1x1 conv on nhwc activations, the batch's pixels as
 *    rows: [N H W] x [Cin] times [Cin] x [Cout]; for a stride-2 one (the
 *    last stage's projection) a oneDNN reorder first copies every other
 *    pixel of every other row into BUF_SUB (the source's bytes / 4).
 * The rule (cpu_gemm -1) is fixed, from the measurements: dense for 3x3
 * stride-1 convs on maps of at most 2x2, rows for 1x1 convs there (the
 * stride-2 projection from 4x4 to 2x2 ran at 44 % of the SGEMM peak direct,
 * 2x faster as its reorder and rows; bench/RESULTS.md).
 * A choice timed at reserve would vary with the machine's load from run to
 * run, and with it the last bits of the outputs (shards and resumed runs
 * must agree byte for byte).
 */
#include <stdint.h>
#include <string.h>

#include <dnnl.h>

#include "model/cpu_internal.h"
#include "model/winograd.h"
#include "core/alloc.h"

/* Whether md is a 4-d fp32 activation in plain nhwc order. */
bool cpu_is_nhwc(const dnnl_memory_desc_t *md)
{
    const dnnl_blocking_desc_t *bd = &md->format_desc.blocking;
    return md->ndims == 4 && md->format_kind == dnnl_blocked && md->offset0 == 0 &&
           bd->inner_nblks == 0 && bd->strides[1] == 1 && bd->strides[3] == md->padded_dims[1] &&
           bd->strides[2] == md->dims[3] * bd->strides[3] &&
           bd->strides[0] == md->dims[2] * bd->strides[2];
}

/* Elements of one tile in activation layout md (the batch dimension outermost
 * and dense), or -1 for a layout the lowerings do not handle (two blocks on
 * one dimension, a blocked batch). */
dnnl_dim_t cpu_tile_elems(const dnnl_memory_desc_t *md)
{
    const dnnl_blocking_desc_t *bd = &md->format_desc.blocking;
    if (md->ndims != 4 || md->format_kind != dnnl_blocked || md->offset0 != 0) return -1;
    int seen = 0;
    for (int i = 0; i < bd->inner_nblks; i++) {
        if (bd->inner_idxs[i] == 0 || (seen & (1 << bd->inner_idxs[i]))) return -1;
        seen |= 1 << bd->inner_idxs[i];
    }
    size_t esz = md->data_type == dnnl_f32 ? 4 : 0;
    if (!esz || dnnl_memory_desc_get_size(md) != (size_t)md->dims[0] * bd->strides[0] * esz)
        return -1;
    return bd->strides[0];
}

/* Offset of element (0, c, h, w) in layout md (cpu_tile_elems(md) > 0). */
static dnnl_dim_t act_offset(const dnnl_memory_desc_t *md, dnnl_dim_t c, dnnl_dim_t h, dnnl_dim_t w)
{
    const dnnl_blocking_desc_t *bd = &md->format_desc.blocking;
    dnnl_dim_t idx[4] = {0, c, h, w}, blk[4] = {1, 1, 1, 1}, off = 0, inner = 0;
    for (int i = 0; i < bd->inner_nblks; i++) blk[bd->inner_idxs[i]] *= bd->inner_blks[i];
    for (int d = 0; d < 4; d++) off += idx[d] / blk[d] * bd->strides[d];
    for (int i = 0; i < bd->inner_nblks; i++)
        inner = inner * bd->inner_blks[i] + idx[bd->inner_idxs[i]] % blk[bd->inner_idxs[i]];
    return off + inner;
}

/* The rows of lowering lw's GEMM before padding: a row per tile (dense),
 * per pixel (rows) or per 4x4 output tile (Winograd). */
size_t cpu_lowering_rows(const plan *p, lowering lw, int h)
{
    return lw == LOWER_WINO   ? tw_wino_rows(p->batch, h)
           : lw == LOWER_ROWS ? (size_t)p->batch * h * h
                              : (size_t)p->batch;
}

/* The next row count to try after r: oneDNN 2.6's AVX2 GEMM computes the
 * last rows of some products (8, 32 or 56 rows with 2 threads) with another
 * kernel, whose sums differ in the last bit (see rows_independent), while
 * the multiples of 8 around them compute every row alike (measured at 16,
 * 24, 40, 48, 64-128 rows on six shapes). Padding rows are computed and
 * ignored: a GEMM row depends on its own source row only. */
size_t cpu_next_rows(size_t r)
{
    return (r / 8 + 1) * 8;
}

/* Whether LOWER_WINO takes a 3x3 conv on oh x oh maps: from 4x4, except
 * the 5x5 to 7x7 maps its 4x4 output tiles fit badly (224 px tiles' last
 * stage: 1.1x the direct kernels' speed for 80 MB more of U, 36 Cin Cout
 * floats, at ResNet-50's widths). Never by batch size: a lowering chosen
 * by batch gave a tile other bits in a batch of 16 than in one of 32, and
 * the CLI's auto batch and the Python API's differed once their processes'
 * sizes did (CI saw it; tiling.batch changes no output byte). */
static bool wino_map(int oh)
{
    return oh % TW_WINO_OUT == 0 || oh >= 2 * TW_WINO_OUT;
}

/* The lowering of conv c (input `in`, output layout out4, oh x oh) in plan p. */
lowering cpu_choose_lowering(const plan *p, const tw_conv *c, const act *in,
                             const dnnl_memory_desc_t *out4, int oh)
{
    /* grouped convs (ResNeXt) run as oneDNN's grouped convolutions only */
    if (p->mode != NUM_F32 || c->groups > 1) return LOWER_NONE;
    /* Winograd wherever it has a whole 4x4 output tile to fill: on AVX2,
     * 1.9-2.6x faster than oneDNN's direct kernels from 4x4 to 56x56 maps,
     * 1.1x on 7x7 (bench/RESULTS.md, issue 20); on 2x2 maps the dense
     * GEMM below does fewer multiply-adds */
    if (p->wino_own && c->k == 3 && c->stride == 1 && c->pad == 1 && wino_map(oh) && in->h == oh &&
        cpu_is_nhwc(&in->md) && cpu_is_nhwc(out4))
        return LOWER_WINO;
    if (p->gemm == 0) return LOWER_NONE;
    /* (a stride picks the pixels first, plan_conv: on maps it divides,
     * whose views of every other pixel oneDNN takes) */
    if (c->k == 1 && c->pad == 0 && (c->stride == 1 || in->h == c->stride * oh) &&
        cpu_is_nhwc(&in->md) && cpu_is_nhwc(out4) && (p->gemm == 1 || oh <= 2))
        return LOWER_ROWS;
    dnnl_dim_t ks = cpu_tile_elems(&in->md), kd = cpu_tile_elems(out4);
    if (ks < 0 || kd < 0) return LOWER_NONE;
    double elems = (double)ks * (double)kd; /* the Toeplitz matrix */
    if (p->gemm == 1) return elems <= (double)(1 << 22) ? LOWER_DENSE : LOWER_NONE;
    return c->k == 3 && c->stride == 1 && oh <= 2 && elems <= (double)(1 << 24) ? LOWER_DENSE
                                                                                : LOWER_NONE;
}

/* The matmul of lowering lw for conv c with `rows` rows (padding
 * included), writing layout out4 with the conv's attributes;
 * dnnl_unimplemented when oneDNN has none. */
dnnl_status_t cpu_lowered_pd(dnnl_engine_t eng, const tw_conv *c, lowering lw, const act *in,
                             const dnnl_memory_desc_t *out4, const_dnnl_primitive_attr_t attr,
                             dnnl_dim_t rows, dnnl_primitive_desc_t *pd)
{
    if (lw == LOWER_WINO) {
        /* [36][rows][Cin] . [36][Cin][Cout], weights in the layout oneDNN
         * picks; bias, residual and ReLU are the output transform's */
        dnnl_memory_desc_t a, w, d;
        dnnl_dims_t ad = {TW_WINO_POINTS, rows, c->cin}, wd = {TW_WINO_POINTS, c->cin, c->cout},
                    dd = {TW_WINO_POINTS, rows, c->cout};
        dnnl_primitive_attr_t plain;
        dnnl_status_t s = dnnl_primitive_attr_create(&plain);
        if (s != dnnl_success) return s;
        s = dnnl_primitive_attr_set_scratchpad_mode(plain, dnnl_scratchpad_mode_user);
        if (s == dnnl_success) s = dnnl_memory_desc_init_by_tag(&a, 3, ad, dnnl_f32, dnnl_abc);
        if (s == dnnl_success)
            s = dnnl_memory_desc_init_by_tag(&w, 3, wd, dnnl_f32, dnnl_format_tag_any);
        if (s == dnnl_success) s = dnnl_memory_desc_init_by_tag(&d, 3, dd, dnnl_f32, dnnl_abc);
        dnnl_matmul_desc_t md;
        if (s == dnnl_success) s = dnnl_matmul_desc_init(&md, &a, &w, NULL, &d);
        if (s == dnnl_success) s = dnnl_primitive_desc_create(pd, &md, plain, eng, NULL);
        dnnl_primitive_attr_destroy(plain);
        return s;
    }
    dnnl_dim_t ks = cpu_tile_elems(&in->md), kd = cpu_tile_elems(out4);
    if (lw == LOWER_ROWS) {
        ks = c->cin;
        kd = c->cout;
    }
    /* a matmul [rows][ks] . [ks][kd] + bias[1][kd] (weights made from the
     * plain [kd][ks] matrix: the ba layout of [ks][kd]) */
    dnnl_memory_desc_t src, w, b, dst;
    dnnl_dims_t sd = {rows, ks}, wd = {ks, kd}, bd = {1, kd}, dd = {rows, kd};
    dnnl_status_t s = dnnl_memory_desc_init_by_tag(&src, 2, sd, dnnl_f32, dnnl_ab);
    if (s == dnnl_success)
        s = dnnl_memory_desc_init_by_tag(&w, 2, wd, dnnl_f32, dnnl_format_tag_any);
    if (s == dnnl_success) s = dnnl_memory_desc_init_by_tag(&b, 2, bd, dnnl_f32, dnnl_ab);
    if (s == dnnl_success) s = dnnl_memory_desc_init_by_tag(&dst, 2, dd, dnnl_f32, dnnl_ab);
    dnnl_matmul_desc_t d;
    if (s == dnnl_success) s = dnnl_matmul_desc_init(&d, &src, &w, &b, &dst);
    if (s == dnnl_success) s = dnnl_primitive_desc_create(pd, &d, attr, eng, NULL);
    return s;
}

/* Whether the GEMM of lowering primitive pd ([batch][rows][k] . weights ->
 * [batch][rows][n], or the same without the batch dimension) gives each row
 * the same bits wherever it sits among the rows. A tile's place in a batch
 * differs between one run, its shards and a resumed run, which must all
 * write the same bytes; oneDNN's AVX2 GEMM (gemm:jit) computes some rows
 * with a kernel that orders the sums differently (e.g. the last 2 of 8 or
 * of 32 rows: seen with [36][8][256] . [36][256][256]). Checked once at
 * reserve on a probe: every row is moved down by one, which brings rows
 * across any boundary between such kernels, and the outputs are compared
 * bit for bit. False also when the probe cannot run (no memory). */
static bool rows_independent(dnnl_engine_t eng, const_dnnl_primitive_desc_t pd)
{
    /* src, weights, dst (both passes), scratchpad, bias (the inner
     * products have one; the matmul a zero-sized md) */
    const dnnl_query_t q[6] = {dnnl_query_src_md, dnnl_query_weights_md,    dnnl_query_dst_md,
                               dnnl_query_dst_md, dnnl_query_scratchpad_md, dnnl_query_weights_md};
    const int qi[6] = {0, 0, 0, 0, 0, 1};
    const int argk[6] = {DNNL_ARG_SRC,        DNNL_ARG_WEIGHTS, DNNL_ARG_DST, 0,
                         DNNL_ARG_SCRATCHPAD, DNNL_ARG_BIAS};
    const dnnl_memory_desc_t *md[6];
    size_t bytes[6];
    for (int i = 0; i < 6; i++) {
        md[i] = dnnl_primitive_desc_query_md(pd, q[i], qi[i]);
        bytes[i] = md[i] ? dnnl_memory_desc_get_size(md[i]) : 0;
    }
    if (!bytes[0] || !bytes[1] || !bytes[2] || md[0]->ndims < 2) return false;
    int nd = md[0]->ndims;
    size_t rows = (size_t)md[0]->dims[nd - 2], k = (size_t)md[0]->dims[nd - 1];
    size_t n = (size_t)md[2]->dims[nd - 1], mats = 1;
    for (int i = 0; i < nd - 2; i++) mats *= (size_t)md[0]->dims[i];
    float *buf[6] = {NULL}, *row = tw_alloc(TW_MEM_OTHER, k * sizeof(float));
    dnnl_memory_t mem[6] = {NULL};
    dnnl_primitive_t prim = NULL;
    dnnl_stream_t strm = NULL;
    bool same = false, ok = rows >= 2 && row;
    for (int i = 0; i < 6 && ok; i++) {
        if (!bytes[i]) continue;
        ok = (buf[i] = tw_alloc(TW_MEM_OTHER, bytes[i])) != NULL;
        /* dst zeroed (a residual lowering adds the old one), bias zero */
        if (ok) memset(buf[i], 0, bytes[i]);
        if (ok && i != 3) ok = dnnl_memory_create(&mem[i], md[i], eng, buf[i]) == dnnl_success;
    }
    if (ok) {
        uint32_t r = 12345;
        for (int i = 0; i < 2; i++)
            for (size_t j = 0; j < bytes[i] / sizeof(float); j++) {
                r = r * 1664525u + 1013904223u;
                buf[i][j] = (float)(r >> 8) * (1.0f / 16777216.0f) - 0.5f;
            }
        ok = dnnl_primitive_create(&prim, pd) == dnnl_success &&
             dnnl_stream_create(&strm, eng, dnnl_stream_default_flags) == dnnl_success;
    }
    dnnl_exec_arg_t args[6];
    int nargs = 0;
    for (int i = 0; i < 6 && ok; i++)
        if (mem[i]) args[nargs++] = (dnnl_exec_arg_t){argk[i], mem[i]};
    for (int pass = 0; pass < 2 && ok; pass++) {
        if (pass == 1) {
            /* rows down by one in each matrix: row i -> i + 1, the last -> 0 */
            for (size_t m = 0; m < mats; m++) {
                float *a = buf[0] + m * rows * k;
                memcpy(row, a + (rows - 1) * k, k * sizeof(float));
                memmove(a + k, a, (rows - 1) * k * sizeof(float));
                memcpy(a, row, k * sizeof(float));
            }
            ok = dnnl_memory_set_data_handle(mem[2], buf[3]) == dnnl_success;
        }
        ok = ok && dnnl_primitive_execute(prim, strm, nargs, args) == dnnl_success &&
             dnnl_stream_wait(strm) == dnnl_success;
    }
    if (ok) {
        same = true;
        for (size_t m = 0; m < mats && same; m++)
            for (size_t i = 0; i < rows && same; i++)
                same = memcmp(buf[2] + (m * rows + i) * n, buf[3] + (m * rows + (i + 1) % rows) * n,
                              n * sizeof(float)) == 0;
    }
    for (int i = 0; i < 6; i++) {
        if (mem[i]) dnnl_memory_destroy(mem[i]);
        tw_free(buf[i]);
    }
    if (prim) dnnl_primitive_destroy(prim);
    if (strm) dnnl_stream_destroy(strm);
    tw_free(row);
    return same;
}

/* rows_independent(pd), remembered by shape in memo (may be NULL). */
bool cpu_gemm_kept(gemm_memo *memo, dnnl_engine_t eng, const_dnnl_primitive_desc_t pd, int lw,
                   bool sum)
{
    const dnnl_memory_desc_t *s = dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0);
    const dnnl_memory_desc_t *d = dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
    if (!s || !d || s->ndims < 2) return false;
    int nd = s->ndims;
    dnnl_dim_t mats = nd == 3 ? s->dims[0] : 1, rows = s->dims[nd - 2], k = s->dims[nd - 1],
               cols = d->dims[nd - 1];
    for (int i = 0; memo && i < memo->n; i++)
        if (memo->e[i].lw == lw && memo->e[i].sum == sum && memo->e[i].mats == mats &&
            memo->e[i].rows == rows && memo->e[i].k == k && memo->e[i].cols == cols)
            return memo->e[i].ok;
    bool ok = rows_independent(eng, pd);
    if (memo && memo->n < MEMO_MAX)
        memo->e[memo->n++] = (gemm_shape){lw, sum, mats, rows, k, cols, ok};
    return ok;
}

/* The Toeplitz matrix [kd][ks] and bias [kd] of conv c between layouts in4
 * and out4 (LOWER_DENSE): row act_offset(out4, co, oy, ox) holds, at column
 * act_offset(in4, ci, iy, ix), the tap of w that joins them; rows and
 * columns of padded channels stay zero. */
void cpu_dense_matrix(const tw_conv *c, const dnnl_memory_desc_t *in4,
                      const dnnl_memory_desc_t *out4, float *m, float *bias)
{
    dnnl_dim_t ks = cpu_tile_elems(in4), kd = cpu_tile_elems(out4);
    int ih = (int)in4->dims[2], oh = (int)out4->dims[2], k = c->k;
    memset(m, 0, (size_t)kd * ks * sizeof *m);
    memset(bias, 0, (size_t)kd * sizeof *bias);
    for (int co = 0; co < c->cout; co++)
        for (int oy = 0; oy < oh; oy++)
            for (int ox = 0; ox < oh; ox++) {
                dnnl_dim_t r = act_offset(out4, co, oy, ox);
                bias[r] = c->b[co];
                for (int ci = 0; ci < c->cin; ci++)
                    for (int ky = 0; ky < k; ky++) {
                        int iy = oy * c->stride - c->pad + ky;
                        if (iy < 0 || iy >= ih) continue;
                        for (int kx = 0; kx < k; kx++) {
                            int ix = ox * c->stride - c->pad + kx;
                            if (ix < 0 || ix >= ih) continue;
                            m[r * ks + act_offset(in4, ci, iy, ix)] =
                                c->w[(((size_t)co * c->cin + ci) * k + ky) * k + kx];
                        }
                    }
            }
}

/* cpu_plan.c - the CPU backend's plan: the net walked (tw_resnet_walk)
 * into a list of oneDNN primitive descriptors and the storage each reads
 * and writes, sized without allocating anything.
 *
 * Plan, then build. cpu_plan_build() turns the net into a list of oneDNN
 * primitive descriptors (convolutions with bias and fused sum/relu post-ops,
 * max pooling, global average pooling, a reorder of the input when the stem
 * wants another layout and one of the pooled features back to plain [n][C]).
 * oneDNN chooses the activation and weight layouts (format_tag any), except
 * in fp32 on AVX-512 CPUs: there the 3x3 stride-1 convs run as Winograd
 * F(4,3), which reads and writes only nChw16c, so every conv writes that
 * layout (oneDNN's direct kernels are as fast on it; see use_winograd); each
 * layer's source is the previous layer's chosen destination, so no reorders
 * appear between layers. Where oneDNN has no Winograd kernel (AVX2), fp32
 * keeps activations in nhwc and runs those convs as model/winograd.c's
 * F(4,3) transforms around one oneDNN batched matmul (LOWER_WINO); with the
 * GEMM lowerings (model/cpu_lower.c), each such lowering is kept only when its matrix
 * product gives a tile the same bits wherever it sits in the batch
 * (rows_independent: shards and resumed runs must write one run's bytes).
 * The same plan
 * gives workspace_bytes() its number (sizes queried from oneDNN, nothing
 * allocated) and reserve() its primitives (model/cpu_build.c), so the two
 * cannot drift apart.
 *
 * The family (model/resnet.h): ResNeXt's grouped 3x3 convs are oneDNN's
 * grouped convolutions (5-d goihw weights) in every mode, never lowered;
 * where oneDNN's kernels would run its reference loops on the plan's layout
 * (nChw16c with 4 or 8 channels per group) the conv takes the layouts
 * oneDNN picks, between two reorders (plan_conv). A small stem has no max
 * pool: its conv's output is the first block's input (first_block_input).
 */
#include <string.h>

#include <dnnl.h>

#include "model/cpu_internal.h"
#include "model/maxpool.h"
#include "model/winograd.h"
#include "core/alloc.h"

static size_t alloc_size(size_t bytes)
{
    /* what tw_alloc really takes: 64-byte header + size rounded up to 64 */
    return bytes ? 64 + ((bytes + 63) & ~(size_t)63) : 0;
}

void cpu_plan_free(plan *p)
{
    for (int i = 0; i < p->n_layers; i++) {
        if (p->layers[i].pd) dnnl_primitive_desc_destroy(p->layers[i].pd);
        tw_free(p->layers[i].w_scale);
    }
    tw_free(p->layers);
    memset(p, 0, sizeof *p);
}

static tw_status plan_push(plan *p, layer_kind kind, dnnl_primitive_desc_t pd, int src, int dst,
                           const tw_conv *conv, tw_error *err)
{
    if (!pd && kind != L_MAXPOOL_NHWC)
        return tw_error_set(err, TW_ERR_INTERNAL, "oneDNN: no primitive descriptor");
    if (p->n_layers == p->cap) {
        int cap = p->cap ? 2 * p->cap : 64;
        layer *l = tw_alloc(TW_MEM_OTHER, (size_t)cap * sizeof *l);
        if (!l) {
            if (pd) dnnl_primitive_desc_destroy(pd);
            return tw_error_set(err, TW_ERR_NOMEM, "out of memory planning the CPU backend");
        }
        if (p->n_layers) memcpy(l, p->layers, (size_t)p->n_layers * sizeof *l);
        tw_free(p->layers);
        p->layers = l;
        p->cap = cap;
    }
    p->layers[p->n_layers++] =
        (layer){.kind = kind, .pd = pd, .src = src, .dst = dst, .conv = conv, .src_scale = 1.0f};
    const dnnl_memory_desc_t *sp =
        pd ? dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0) : NULL;
    size_t sb = sp ? dnnl_memory_desc_get_size(sp) : 0;
    if (sb > p->scratch_bytes) p->scratch_bytes = sb;
    return TW_OK;
}

static void note_size(plan *p, int buf, const dnnl_memory_desc_t *md)
{
    /* each storage is sized for the largest thing it ever holds */
    size_t b = dnnl_memory_desc_get_size(md);
    if (b > p->buf_bytes[buf]) p->buf_bytes[buf] = b;
}

tw_status cpu_make_attr(const attr_spec *a, dnnl_primitive_attr_t *attr, tw_error *err)
{
    DNNL_TRY(dnnl_primitive_attr_create(attr), "attr create");
    dnnl_status_t s = dnnl_primitive_attr_set_scratchpad_mode(
        *attr, a->own_scratch ? dnnl_scratchpad_mode_library : dnnl_scratchpad_mode_user);
    if (s == dnnl_success && a->n_oscale)
        s = dnnl_primitive_attr_set_output_scales(*attr, a->n_oscale, a->oscale_mask, a->oscale);
    if (s == dnnl_success && (a->sum || a->relu)) {
        dnnl_post_ops_t po;
        s = dnnl_post_ops_create(&po);
        if (s == dnnl_success) {
            if (a->sum) s = dnnl_post_ops_append_sum_v2(po, a->sum_scale, a->sum_dt);
            if (s == dnnl_success && a->relu)
                s = dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, 0.0f, 0.0f);
            if (s == dnnl_success) s = dnnl_primitive_attr_set_post_ops(*attr, po);
            dnnl_post_ops_destroy(po);
        }
    }
    if (s != dnnl_success) {
        dnnl_primitive_attr_destroy(*attr);
        return dnnl_fail(err, s, "attr setup");
    }
    return TW_OK;
}

/* The type of an activation in mode m (nonneg: it follows a ReLU). */
static dnnl_data_type_t act_dt(num_mode m, bool nonneg)
{
    if (m == NUM_BF16) return dnnl_bf16;
    if (m == NUM_INT8) return nonneg ? dnnl_u8 : dnnl_s8;
    return dnnl_f32;
}

static tw_status plan_reorder(plan *p, dnnl_engine_t eng, const dnnl_memory_desc_t *from, int src,
                              const dnnl_memory_desc_t *to, int dst, float scale, tw_error *err);

/* A 4-d activation descriptor of dims in the layout of `like` (nhwc,
 * nchw, or nChw4c/8c/16c), or nhwc for any other layout. */
static dnnl_status_t like_layout(const dnnl_memory_desc_t *like, const dnnl_dims_t dims,
                                 dnnl_data_type_t dt, dnnl_memory_desc_t *out)
{
    const dnnl_blocking_desc_t *bd = &like->format_desc.blocking;
    dnnl_format_tag_t tag = dnnl_nhwc;
    if (like->format_kind == dnnl_blocked && bd->inner_nblks == 1 && bd->inner_idxs[0] == 1)
        tag = bd->inner_blks[0] == 16  ? dnnl_aBcd16b
              : bd->inner_blks[0] == 8 ? dnnl_aBcd8b
              : bd->inner_blks[0] == 4 ? dnnl_aBcd4b
                                       : dnnl_nhwc;
    else if (like->format_kind == dnnl_blocked && bd->inner_nblks == 0 && bd->strides[3] == 1)
        tag = dnnl_nchw;
    return dnnl_memory_desc_init_by_tag(out, 4, dims, dt, tag);
}

/* md cut to its first `tiles` tiles (a batch-outermost layout: a tile's
 * values are contiguous, the same strides); format any stays any. */
static void first_tiles(dnnl_memory_desc_t *md, int tiles)
{
    md->dims[0] = tiles;
    if (md->format_kind != dnnl_format_kind_any) md->padded_dims[0] = tiles;
}

/* Whether oneDNN picked its reference code (plain loops) for pd. */
static bool is_ref_impl(const_dnnl_primitive_desc_t pd)
{
    const char *impl = NULL;
    return dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success &&
           impl && strncmp(impl, "ref", 3) == 0;
}

/* One conv being planned (plan_conv): the call, then what each step
 * decides for the next. */
typedef struct conv_job {
    /* the call */
    plan *p;
    dnnl_engine_t eng;
    const tw_conv *c;
    const act *in, *into;
    bool in_any, relu;
    int dst_buf;
    /* conv_descs: types, sizes and memory descriptors */
    int n, ci, oh, g;
    num_mode mode;
    dnnl_data_type_t ddt;
    dnnl_dims_t sd, dd;
    dnnl_memory_desc_t src_md, w_md, b_md, dst_md;
    /* conv_lowering: the lowering and the layout it writes */
    dnnl_memory_desc_t out4;
    lowering lw;
    /* conv_desc: the convolution, and oneDNN's Winograd groups */
    dnnl_dims_t strides, pl, prr;
    bool wino;
    int groups;
    dnnl_convolution_desc_t cd;
    /* conv_attr: int8's scales (w_scale: the plan's once pushed) */
    float src_scale, dst_scale, *w_scale;
    dnnl_primitive_attr_t attr;
    /* conv_rows_source and conv_pd: the primitive and what it reads */
    dnnl_primitive_desc_t pd;
    size_t rows;
    act picked, grp_src;
    dnnl_memory_desc_t every, plan_dst;
    const act *src;
    bool grp_in, grp_out;
    const dnnl_memory_desc_t *gq, *dq;
    int dst; /* conv_push: the storage it writes */
} conv_job;

/* The conv's types (int8 plans keep the stem in fp32), output size and
 * memory descriptors: the source's, the weights', the bias's and the
 * destination's (the shortcut's for a residual conv). */
static tw_status conv_descs(conv_job *j, tw_error *err)
{
    plan *p = j->p;
    const tw_conv *c = j->c;
    const act *in = j->in;
    int n = j->n = p->batch;
    j->ci = ++p->n_conv; /* this conv's output range in p->amax */
    /* int8 plans keep the stem (in_any) in fp32: its input is the normalized
     * raster, which 127 steps quantize coarsely (alone, that changed the class
     * of 3 of e2e_precision's 361 ResNet-50 tiles, half of int8's error); the
     * pooled map is quantized after the max pooling (plan_op) */
    num_mode mode = j->mode = j->in_any && p->mode == NUM_INT8 ? NUM_F32 : p->mode;
    dnnl_data_type_t wdt = mode == NUM_INT8 ? dnnl_s8 : act_dt(mode, false);
    /* a residual conv always ends in a ReLU: its int8 output is u8 */
    dnnl_data_type_t ddt = j->ddt = act_dt(mode, j->relu);
    int oh = j->oh = tw_resnet_out_size(in->h, c->k, c->stride, c->pad);
    if (oh < 1)
        return tw_error_set(err, TW_ERR_INPUT,
                            "tile %d is too small: a %dx%d convolution gets a %dx%d input", p->tile,
                            c->k, c->k, in->h, in->h);
    /* grouped (ResNeXt's conv2): weights [groups][cout/g][cin/g][k][k] */
    int g = j->g = c->groups;
    dnnl_dims_t sd = {n, c->cin, in->h, in->h}, wd = {c->cout, c->cin, c->k, c->k};
    dnnl_dims_t gwd = {g, c->cout / g, c->cin / g, c->k, c->k};
    dnnl_dims_t bd = {c->cout}, dd = {n, c->cout, oh, oh};
    memcpy(j->sd, sd, sizeof sd);
    memcpy(j->dd, dd, sizeof dd);
    if (j->in_any)
        DNNL_TRY(dnnl_memory_desc_init_by_tag(&j->src_md, 4, sd, act_dt(mode, false),
                                              dnnl_format_tag_any),
                 "src md");
    else
        j->src_md = in->md;
    if (g > 1)
        DNNL_TRY(dnnl_memory_desc_init_by_tag(&j->w_md, 5, gwd, wdt, dnnl_format_tag_any), "w md");
    else
        DNNL_TRY(dnnl_memory_desc_init_by_tag(&j->w_md, 4, wd, wdt, dnnl_format_tag_any), "w md");
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&j->b_md, 1, bd, dnnl_f32, dnnl_x), "bias md");
    if (j->into) {
        /* the shortcut's storage and layout, read as the output's type: the
         * sum post-op reads the old values as the shortcut's type (s8 and u8
         * have one size, so the reinterpretation is exact) */
        j->dst_md = j->into->md;
        j->dst_md.data_type = ddt;
    } else if (g > 1) {
        /* a grouped conv writes its input's layout (same channels); see below
         * for when its kernel wants others */
        DNNL_TRY(like_layout(&in->md, dd, ddt, &j->dst_md), "dst md");
    } else {
        /* Winograd reads and writes only nChw16c: keep every activation there */
        dnnl_format_tag_t tag = p->wino && c->cout % 16 == 0 ? dnnl_aBcd16b
                                : p->nhwc && !j->in_any      ? dnnl_nhwc
                                                             : dnnl_format_tag_any;
        DNNL_TRY(dnnl_memory_desc_init_by_tag(&j->dst_md, 4, dd, ddt, tag), "dst md");
    }
    return TW_OK;
}

/* Whether the conv is lowered to a GEMM (fp32 only; model/cpu_lower.c),
 * and the layout a lowering writes. */
static tw_status conv_lowering(conv_job *j, tw_error *err)
{
    plan *p = j->p;
    const tw_conv *c = j->c;
    const act *in = j->in;
    /* a lowering writes a layout fixed here: the shortcut's, else nhwc, or
     * nChw16c / nChw8c like its input where the channels fill the blocks */
    j->out4 = j->dst_md;
    j->lw = LOWER_NONE;
    if (!j->in_any && p->mode == NUM_F32 && (p->gemm != 0 || p->wino_own)) {
        if (!j->into && j->dst_md.format_kind == dnnl_format_kind_any) {
            const dnnl_blocking_desc_t *ib = &in->md.format_desc.blocking;
            int blk = ib->inner_nblks == 1 && ib->inner_idxs[0] == 1 ? (int)ib->inner_blks[0] : 0;
            dnnl_format_tag_t t = blk == 16 && c->cout % 16 == 0 ? dnnl_aBcd16b
                                  : blk == 8 && c->cout % 8 == 0 ? dnnl_aBcd8b
                                                                 : dnnl_nhwc;
            DNNL_TRY(dnnl_memory_desc_init_by_tag(&j->out4, 4, j->dd, j->ddt, t), "dst md");
        }
        j->lw = cpu_choose_lowering(p, c, in, &j->out4, j->oh);
    }
    return TW_OK;
}

/* The convolution's descriptor: padding, Winograd or direct, and the
 * groups of tiles oneDNN's Winograd runs it in. */
static tw_status conv_desc(conv_job *j, tw_error *err)
{
    plan *p = j->p;
    const tw_conv *c = j->c;
    const act *in = j->in;
    int n = j->n, oh = j->oh;
    /* right padding so that oneDNN's output size is PyTorch's floor formula */
    dnnl_dim_t pr = (dnnl_dim_t)(oh - 1) * c->stride + c->k - in->h - c->pad;
    dnnl_dims_t strides = {c->stride, c->stride}, pl = {c->pad, c->pad}, prr = {pr, pr};
    memcpy(j->strides, strides, sizeof strides);
    memcpy(j->pl, pl, sizeof pl);
    memcpy(j->prr, prr, sizeof prr);
    /* Winograd F(4,3) computes 4x4 output tiles: on maps under 4x4 most of
     * each tile is padding and direct is faster (bench/RESULTS.md) */
    bool wino = j->wino = p->wino && c->k == 3 && c->stride == 1 && oh >= 4 && j->g == 1;
    /* oneDNN's Winograd: planned for CPU_WINO_GROUP tiles (cpu_internal.h),
     * run group after group over the batch */
    int groups = j->groups =
        wino && j->lw == LOWER_NONE && !j->in_any && n > CPU_WINO_GROUP && n % CPU_WINO_GROUP == 0
            ? n / CPU_WINO_GROUP
            : 1;
    if (groups > 1) {
        first_tiles(&j->src_md, CPU_WINO_GROUP);
        first_tiles(&j->dst_md, CPU_WINO_GROUP);
    }
    DNNL_TRY(dnnl_convolution_forward_desc_init(
                 &j->cd, dnnl_forward_inference,
                 wino ? dnnl_convolution_winograd : dnnl_convolution_direct, &j->src_md, &j->w_md,
                 &j->b_md, &j->dst_md, strides, pl, prr),
             "convolution desc");
    return TW_OK;
}

/* The primitive's attributes: the sum and ReLU post-ops and, in int8, the
 * output scales (j->w_scale: the weights' scales, freed by the caller on
 * an error). */
static tw_status conv_attr(conv_job *j, tw_error *err)
{
    plan *p = j->p;
    const tw_conv *c = j->c;
    const act *into = j->into;
    j->src_scale = j->in->scale;
    j->dst_scale = 1.0f;
    float *oscale = NULL;
    attr_spec as = {
        .sum = into != NULL, .relu = j->relu, .sum_scale = 1.0f, .sum_dt = dnnl_data_type_undef};
    if (j->mode == NUM_INT8) {
        j->dst_scale = cpu_q_scale(p, j->ci, j->relu);
        j->w_scale = cpu_weight_scales(c, p->w_levels);
        oscale = tw_alloc(TW_MEM_OTHER, (size_t)c->cout * sizeof *oscale);
        if (!j->w_scale || !oscale) {
            tw_free(oscale);
            return tw_error_set(err, TW_ERR_NOMEM, "out of memory planning the CPU backend");
        }
        /* oneDNN 2.x: dst = oscale * (acc + bias), acc in src*w units */
        for (int o = 0; o < c->cout; o++) oscale[o] = j->dst_scale / (j->src_scale * j->w_scale[o]);
        as.n_oscale = c->cout;
        as.oscale_mask = 1 << 1;
        as.oscale = oscale;
        if (into) {
            as.sum_scale = j->dst_scale / into->scale;
            as.sum_dt = into->md.data_type;
        }
    }
    tw_status st = cpu_make_attr(&as, &j->attr, err);
    tw_free(oscale); /* the attributes hold a copy */
    return st;
}

/* A strided 1x1 conv as rows reads the pixels it keeps, copied out by a
 * reorder (pushed by conv_push, once the lowering is kept) into BUF_SUB:
 * j->every, the view of them in the source, and j->picked, their copy. */
static void conv_rows_source(conv_job *j)
{
    const tw_conv *c = j->c;
    const act *in = j->in;
    if (j->lw == LOWER_ROWS && c->stride != 1) {
        dnnl_dims_t pdims = {j->n, c->cin, j->oh, j->oh};
        dnnl_dims_t pstr = {(dnnl_dim_t)in->h * in->h * c->cin, 1,
                            (dnnl_dim_t)c->stride * in->h * c->cin, (dnnl_dim_t)c->stride * c->cin};
        if (dnnl_memory_desc_init_by_strides(&j->every, 4, pdims, dnnl_f32, pstr) != dnnl_success ||
            dnnl_memory_desc_init_by_tag(&j->picked.md, 4, pdims, dnnl_f32, dnnl_nhwc) !=
                dnnl_success)
            j->lw = LOWER_NONE; /* a view oneDNN declines: the convolution */
        j->picked.buf = BUF_SUB;
        j->picked.c = c->cin;
        j->picked.h = j->oh;
        j->picked.scale = in->scale;
    }
    j->src = j->lw == LOWER_ROWS && c->stride != 1 ? &j->picked : in;
}

/* The lowering's GEMM: the first row count from the lowering's own up to
 * twice it (more would cost what the lowering saves) whose rows all compute
 * alike (cpu_gemm_kept); none: the lowering is dropped (LOWER_NONE). */
static dnnl_status_t conv_lowered_pd(conv_job *j)
{
    plan *p = j->p;
    dnnl_status_t s = dnnl_unimplemented;
    size_t need = cpu_lowering_rows(p, j->lw, j->oh);
    size_t first = need < GEMM_MIN_ROWS ? GEMM_MIN_ROWS : need;
    bool refused = false;
    for (size_t r = first; r <= 2 * first; r = cpu_next_rows(r)) {
        s = cpu_lowered_pd(j->eng, j->c, j->lw, j->src, &j->out4, j->attr, (dnnl_dim_t)r, &j->pd);
        if (s != dnnl_success) break;
        if (cpu_gemm_kept(p->memo, j->eng, j->pd, j->lw, j->into != NULL)) {
            j->rows = r;
            break;
        }
        dnnl_primitive_desc_destroy(j->pd);
        s = dnnl_unimplemented;
        refused = true;
    }
    if (s != dnnl_success) {
        p->n_refused += refused;
        j->lw = LOWER_NONE; /* none here: the convolution */
    }
    return s;
}

/* Grouped: oneDNN 2.6's AVX-512 kernels take nChw16c only when each group
 * has a multiple of 16 channels; for ResNeXt's 4 or 8 it runs its reference
 * loops there (1000x slower, measured). Then the conv is planned in the
 * layouts oneDNN picks (format any), between reorders from and back to the
 * plan's layout (BUF_GRP_IN / _OUT). */
static dnnl_status_t conv_grouped_pd(conv_job *j)
{
    const act *in = j->in;
    dnnl_primitive_desc_destroy(j->pd);
    dnnl_memory_desc_t any_src, any_dst;
    dnnl_status_t s =
        dnnl_memory_desc_init_by_tag(&any_src, 4, j->sd, in->md.data_type, dnnl_format_tag_any);
    if (s == dnnl_success)
        s = dnnl_memory_desc_init_by_tag(&any_dst, 4, j->dd, j->ddt, dnnl_format_tag_any);
    if (s == dnnl_success)
        s = dnnl_convolution_forward_desc_init(&j->cd, dnnl_forward_inference,
                                               dnnl_convolution_direct, &any_src, &j->w_md,
                                               &j->b_md, &any_dst, j->strides, j->pl, j->prr);
    if (s == dnnl_success) s = dnnl_primitive_desc_create(&j->pd, &j->cd, j->attr, j->eng, NULL);
    if (s == dnnl_success && (j->gq = dnnl_primitive_desc_query_md(j->pd, dnnl_query_src_md, 0)))
        j->grp_in = !dnnl_memory_desc_equal(j->gq, &in->md);
    const dnnl_memory_desc_t *dq0 =
        s == dnnl_success ? dnnl_primitive_desc_query_md(j->pd, dnnl_query_dst_md, 0) : NULL;
    j->grp_out = dq0 && !dnnl_memory_desc_equal(dq0, &j->plan_dst);
    return s;
}

/* The primitive: the lowering's GEMM, else the convolution (Winograd, or
 * direct where Winograd declines the shape; a grouped conv that would run
 * oneDNN's reference code in the plan's layouts, in its own). The
 * attributes are destroyed. */
static tw_status conv_pd(conv_job *j, tw_error *err)
{
    dnnl_status_t s = dnnl_unimplemented;
    j->rows = 0;
    if (j->lw != LOWER_NONE) s = conv_lowered_pd(j);
    if (j->lw == LOWER_NONE) s = dnnl_primitive_desc_create(&j->pd, &j->cd, j->attr, j->eng, NULL);
    if (s == dnnl_unimplemented && j->wino && j->lw == LOWER_NONE) {
        /* a shape the Winograd kernel declines: the same conv, direct */
        j->cd.alg_kind = dnnl_convolution_direct;
        s = dnnl_primitive_desc_create(&j->pd, &j->cd, j->attr, j->eng, NULL);
    }
    j->grp_in = j->grp_out = false;
    j->gq = NULL;
    j->plan_dst = j->dst_md;
    if (s == dnnl_success && j->g > 1 && !j->into && is_ref_impl(j->pd)) s = conv_grouped_pd(j);
    dnnl_primitive_attr_destroy(j->attr);
    if (s != dnnl_success) return dnnl_fail(err, s, "convolution primitive desc");
    return TW_OK;
}

/* The reorders the conv reads from (a grouped conv's source in its layout,
 * a strided rows conv's kept pixels), then the conv itself. On an error
 * the pd is gone and the weights' scales are still the caller's. */
static tw_status conv_push(conv_job *j, tw_error *err)
{
    plan *p = j->p;
    const act *in = j->in;
    tw_status st;
    j->dst = j->into ? j->into->buf : j->grp_out ? BUF_GRP_OUT : j->dst_buf;
    if (j->lw != LOWER_ROWS) j->src = in; /* the lowering was refused: the convolution reads in */
    if (j->grp_in) {
        j->grp_src = *in;
        j->grp_src.md = *j->gq;
        j->grp_src.buf = BUF_GRP_IN;
        st = plan_reorder(p, j->eng, &in->md, in->buf, j->gq, BUF_GRP_IN, 1.0f, err);
        if (st != TW_OK) {
            dnnl_primitive_desc_destroy(j->pd);
            return st;
        }
        j->src = &j->grp_src;
    }
    if (j->src == &j->picked) {
        st = plan_reorder(p, j->eng, &j->every, in->buf, &j->picked.md, BUF_SUB, 1.0f, err);
        if (st != TW_OK) {
            dnnl_primitive_desc_destroy(j->pd);
            return st;
        }
    }
    return plan_push(p, L_CONV, j->pd, j->src->buf, j->dst, j->c, err);
}

/* The conv's layer, just pushed: how it runs (the plan owns w_scale from
 * here on). */
static tw_status conv_record(conv_job *j, tw_error *err)
{
    plan *p = j->p;
    layer *l = &p->layers[p->n_layers - 1];
    l->src_scale = j->src_scale;
    l->relu = j->relu;
    l->sum = j->into != NULL;
    l->w_scale = j->w_scale;
    l->lower = j->lw;
    l->rows = j->rows;
    l->in4 = j->src->md;
    l->out4 = j->out4;
    l->groups = j->groups;
    if (j->groups > 1) { /* the group's layouts as the primitive took them */
        const dnnl_memory_desc_t *gs = dnnl_primitive_desc_query_md(j->pd, dnnl_query_src_md, 0);
        const dnnl_memory_desc_t *gd = dnnl_primitive_desc_query_md(j->pd, dnnl_query_dst_md, 0);
        if (!gs || !gd) return tw_error_set(err, TW_ERR_INTERNAL, "oneDNN: no group layout");
        l->src_step = dnnl_memory_desc_get_size(gs);
        l->dst_step = dnnl_memory_desc_get_size(gd);
    }
    return TW_OK;
}

/* What the conv adds to the plan's bytes: its reordered weights (LOWER_WINO:
 * U and the bias), the Winograd domain's buffers, a lowering's padding rows
 * and dense matrix. */
static tw_status conv_account(conv_job *j, tw_error *err)
{
    plan *p = j->p;
    const tw_conv *c = j->c;
    const act *in = j->in;
    const size_t rows = j->rows;
    const lowering lw = j->lw;
    const dnnl_memory_desc_t *wq, *bq;
    tw_status st;
    j->dq = NULL;
    if (lw == LOWER_WINO) {
        /* U, the bias (kept by the output transform), the two Winograd
         * domain buffers; U is made in activation buffer 0 (unused until
         * the first batch), then reordered, as the dense matrix below */
        if ((st = query_md(j->pd, dnnl_query_weights_md, 0, &wq, err)) != TW_OK) return st;
        size_t ub = dnnl_memory_desc_get_size(wq);
        p->weight_bytes += alloc_size(ub) + alloc_size((size_t)c->cout * sizeof(float));
        size_t vb = TW_WINO_POINTS * rows * (size_t)c->cin * sizeof(float);
        size_t mb = TW_WINO_POINTS * rows * (size_t)c->cout * sizeof(float);
        size_t plain = TW_WINO_POINTS * (size_t)c->cin * c->cout * sizeof(float);
        if (vb > p->buf_bytes[BUF_WINO_V]) p->buf_bytes[BUF_WINO_V] = vb;
        if (mb > p->buf_bytes[BUF_WINO_M]) p->buf_bytes[BUF_WINO_M] = mb;
        if (plain > p->buf_bytes[0]) p->buf_bytes[0] = plain;
        p->n_wino++;
        return TW_OK;
    }
    if ((st = query_md(j->pd, dnnl_query_weights_md, 0, &wq, err)) != TW_OK ||
        (st = query_md(j->pd, dnnl_query_weights_md, 1, &bq, err)) != TW_OK ||
        (st = query_md(j->pd, dnnl_query_dst_md, 0, &j->dq, err)) != TW_OK)
        return st;
    p->weight_bytes += alloc_size(dnnl_memory_desc_get_size(wq));
    p->weight_bytes += alloc_size(dnnl_memory_desc_get_size(bq));
    if (lw != LOWER_NONE) {
        /* the padding rows live past the batch in the source's and the
         * destination's storage */
        size_t ks = lw == LOWER_ROWS ? (size_t)c->cin : (size_t)cpu_tile_elems(&in->md);
        size_t kd = lw == LOWER_ROWS ? (size_t)c->cout : (size_t)cpu_tile_elems(&j->out4);
        size_t sb = rows * ks * sizeof(float), db = rows * kd * sizeof(float);
        if (sb > p->buf_bytes[j->src->buf]) p->buf_bytes[j->src->buf] = sb;
        if (db > p->buf_bytes[j->dst]) p->buf_bytes[j->dst] = db;
    }
    if (lw == LOWER_DENSE) {
        /* reserve builds the Toeplitz matrix in plain [kd][ks] order in
         * activation buffer 0 (unused until the first batch), then
         * reorders it into the layout the matmul chose */
        size_t mb =
            (size_t)cpu_tile_elems(&in->md) * (size_t)cpu_tile_elems(&j->out4) * sizeof(float);
        if (mb > p->buf_bytes[0]) p->buf_bytes[0] = mb;
    }
    if (lw != LOWER_NONE) p->n_gemm++;
    return TW_OK;
}

/* *out: the conv's result as the next layers read it (a grouped conv's
 * reordered back into the plan's layout). */
static tw_status conv_output(conv_job *j, act *out, tw_error *err)
{
    plan *p = j->p;
    out->md = j->lw == LOWER_NONE ? *j->dq : j->out4;
    if (j->groups > 1) { /* the whole batch's, as the next layers read it */
        out->md.dims[0] = j->n;
        out->md.padded_dims[0] = j->n;
    }
    out->buf = j->dst;
    out->c = j->c->cout;
    out->h = j->oh;
    out->scale = j->dst_scale;
    note_size(p, j->dst, &out->md);
    if (j->grp_out) {
        /* back into the plan's layout, where the next conv reads it */
        tw_status st =
            plan_reorder(p, j->eng, &out->md, BUF_GRP_OUT, &j->plan_dst, j->dst_buf, 1.0f, err);
        if (st != TW_OK) return st;
        out->md = j->plan_dst;
        out->buf = j->dst_buf;
    }
    return TW_OK;
}

/* Add conv c reading `in`; dst: when `into` is given, write into it with a
 * sum post-op (residual), else into storage dst_buf with a layout oneDNN
 * picks. *out describes the result. `in_any`: let oneDNN choose the source
 * layout too (the stem; the caller reads the choice back from the pd). */
static tw_status plan_conv(plan *p, dnnl_engine_t eng, const tw_conv *c, const act *in, bool in_any,
                           const act *into, int dst_buf, bool relu, act *out, tw_error *err)
{
    conv_job j = {.p = p,
                  .eng = eng,
                  .c = c,
                  .in = in,
                  .into = into,
                  .in_any = in_any,
                  .relu = relu,
                  .dst_buf = dst_buf};
    tw_status st;
    if ((st = conv_descs(&j, err)) != TW_OK || (st = conv_lowering(&j, err)) != TW_OK ||
        (st = conv_desc(&j, err)) != TW_OK)
        return st;
    if ((st = conv_attr(&j, err)) != TW_OK) goto fail;
    conv_rows_source(&j);
    if ((st = conv_pd(&j, err)) != TW_OK || (st = conv_push(&j, err)) != TW_OK) goto fail;
    if ((st = conv_record(&j, err)) != TW_OK || (st = conv_account(&j, err)) != TW_OK) return st;
    return conv_output(&j, out, err);
fail:
    tw_free(j.w_scale); /* not yet the plan's */
    return st;
}

static tw_status plan_pool(plan *p, dnnl_engine_t eng, const act *in, bool global, int dst_buf,
                           act *out, tw_error *err)
{
    int k = global ? in->h : 3, stride = global ? 1 : 2, pad = global ? 0 : 1;
    int oh = tw_resnet_out_size(in->h, k, stride, pad);
    if (oh < 1)
        return tw_error_set(err, TW_ERR_INPUT, "tile %d is too small for the max pooling", p->tile);
    dnnl_dims_t dd = {p->batch, in->c, oh, oh};
    dnnl_memory_desc_t dst_md;
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&dst_md, 4, dd, in->md.data_type, dnnl_format_tag_any),
             "pool dst md");
    dnnl_dim_t pr = (dnnl_dim_t)(oh - 1) * stride + k - in->h - pad;
    dnnl_dims_t strides = {stride, stride}, kernel = {k, k}, dil = {0, 0}, pl = {pad, pad},
                prr = {pr, pr};
    dnnl_pooling_v2_desc_t pdsc;
    DNNL_TRY(dnnl_pooling_v2_forward_desc_init(&pdsc, dnnl_forward_inference,
                                               global ? dnnl_pooling_avg_exclude_padding
                                                      : dnnl_pooling_max,
                                               &in->md, &dst_md, strides, kernel, dil, pl, prr),
             "pooling desc");
    dnnl_primitive_attr_t attr;
    tw_status st = cpu_make_attr(&(attr_spec){0}, &attr, err);
    if (st != TW_OK) return st;
    dnnl_primitive_desc_t pd;
    dnnl_status_t s = dnnl_primitive_desc_create(&pd, &pdsc, attr, eng, NULL);
    dnnl_primitive_attr_destroy(attr);
    if (s != dnnl_success) return dnnl_fail(err, s, "pooling primitive desc");
    st = plan_push(p, L_POOL, pd, in->buf, dst_buf, NULL, err);
    if (st != TW_OK) return st;
    const dnnl_memory_desc_t *dq;
    if ((st = query_md(pd, dnnl_query_dst_md, 0, &dq, err)) != TW_OK) return st;
    out->md = *dq;
    out->buf = dst_buf;
    out->c = in->c;
    out->h = oh;
    out->scale = in->scale; /* max pooling keeps the scale; averages are fp32 */
    note_size(p, dst_buf, &out->md);
    return TW_OK;
}

/* The channel block of md when it is fp32 nChw8c or nChw16c (the layouts
 * the stem writes on nhwc plans), else 0. */
int cpu_pool_blocked(const dnnl_memory_desc_t *md)
{
    const dnnl_blocking_desc_t *bd = &md->format_desc.blocking;
    if (md->ndims != 4 || md->format_kind != dnnl_blocked || md->data_type != dnnl_f32 ||
        md->offset0 != 0 || bd->inner_nblks != 1 || bd->inner_idxs[0] != 1 ||
        (bd->inner_blks[0] != 8 && bd->inner_blks[0] != 16))
        return 0;
    dnnl_dim_t blk = bd->inner_blks[0], h = md->dims[2];
    /* dense: [n][C / blk][h][w][blk] */
    if (md->dims[3] != h || bd->strides[3] != blk || bd->strides[2] != h * blk ||
        bd->strides[1] != h * h * blk || bd->strides[0] != md->padded_dims[1] * h * h)
        return 0;
    return (int)blk;
}

/* The stem's 3x3 stride-2 max pooling as model/maxpool.c's one pass from
 * its blocked layout into nhwc (storage dst_buf): oneDNN's pooling and the
 * reorder after it took 2.6-3.8x longer on AVX2 (bench/RESULTS.md). */
static tw_status plan_maxpool_nhwc(plan *p, const act *in, int dst_buf, act *out, tw_error *err)
{
    int oh = tw_maxpool_out(in->h);
    dnnl_dims_t dd = {p->batch, in->c, oh, oh};
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&out->md, 4, dd, dnnl_f32, dnnl_nhwc), "pool dst md");
    tw_status st = plan_push(p, L_MAXPOOL_NHWC, NULL, in->buf, dst_buf, NULL, err);
    if (st != TW_OK) return st;
    layer *l = &p->layers[p->n_layers - 1];
    l->in4 = in->md;
    l->out4 = out->md;
    out->buf = dst_buf;
    out->c = in->c;
    out->h = oh;
    out->scale = in->scale;
    note_size(p, dst_buf, &out->md);
    return TW_OK;
}

/* A reorder from `from` (storage src) to `to` (storage dst), multiplying
 * by scale when it is not 1 (quantizing or dequantizing). */
static tw_status plan_reorder(plan *p, dnnl_engine_t eng, const dnnl_memory_desc_t *from, int src,
                              const dnnl_memory_desc_t *to, int dst, float scale, tw_error *err)
{
    dnnl_primitive_attr_t attr;
    attr_spec as = {.n_oscale = scale != 1.0f, .oscale = &scale};
    tw_status st = cpu_make_attr(&as, &attr, err);
    if (st != TW_OK) return st;
    dnnl_primitive_desc_t rpd;
    dnnl_status_t s = dnnl_reorder_primitive_desc_create(&rpd, from, eng, to, eng, attr);
    dnnl_primitive_attr_destroy(attr);
    if (s != dnnl_success) return dnnl_fail(err, s, "reorder primitive desc");
    note_size(p, dst, to);
    return plan_push(p, L_REORDER, rpd, src, dst, NULL, err);
}

/* Lowest activation buffer not in busy (a bit mask). */
static int free_buf(unsigned busy)
{
    for (int i = 0; i < N_ACT; i++)
        if (!(busy & (1u << i))) return i;
    return -1;
}

/* cpu_plan_build's walk (tw_resnet_walk): the activations by value, and the
 * activation buffers a block's values hold so far. */
typedef struct plan_walk {
    plan *p;
    dnnl_engine_t eng;
    act v[TW_RESNET_VAL_COUNT];
    unsigned busy;
} plan_walk;

/* x, the stem's output (after the max pool, or a small stem's conv), as the
 * first block's input: reordered into storage to_buf when it must be. */
static tw_status first_block_input(plan_walk *w, act *x, int to_buf, tw_error *err)
{
    plan *p = w->p;
    if ((p->nhwc && !cpu_is_nhwc(&x->md)) || p->mode == NUM_INT8) {
        /* the stem has no nhwc kernel for a few input bands (oneDNN would
         * run its reference code): it writes its blocked layout, and the
         * pooled map is reordered once (counted in bench/RESULTS.md).
         * int8: the stem ran in fp32 (plan_conv), and this reorder
         * quantizes its pooled map to u8 by the stem's range (max pooling
         * keeps the largest values of that range) */
        bool q = p->mode == NUM_INT8;
        float scale = q ? cpu_q_scale(p, 1, true) : 1.0f;
        dnnl_memory_desc_t nhwc;
        dnnl_dims_t xd = {p->batch, x->c, x->h, x->h};
        DNNL_TRY(dnnl_memory_desc_init_by_tag(&nhwc, 4, xd, q ? dnnl_u8 : dnnl_f32, dnnl_nhwc),
                 "nhwc md");
        tw_status st = plan_reorder(p, w->eng, &x->md, x->buf, &nhwc, to_buf, scale, err);
        if (st != TW_OK) return st;
        x->md = nhwc;
        x->buf = to_buf;
        x->scale = scale;
    }
    w->busy = 1u << x->buf; /* the first block's input */
    return TW_OK;
}

static tw_status plan_op(void *user, const tw_resnet_op *op, tw_error *err)
{
    plan_walk *w = user;
    plan *p = w->p;
    dnnl_engine_t eng = w->eng;
    int batch = p->batch;
    act *x = &w->v[op->dst];
    tw_status st;
    switch (op->kind) {
    case TW_RESNET_OP_STEM: {
        st = plan_conv(p, eng, op->conv, &w->v[op->src], true, NULL, 0, op->relu, x, err);
        if (st != TW_OK) return st;
        /* the stem chose its input layout; convert the caller's NCHW when it differs */
        layer *stem = &p->layers[p->n_layers - 1];
        const dnnl_memory_desc_t *want;
        if ((st = query_md(stem->pd, dnnl_query_src_md, 0, &want, err)) != TW_OK) return st;
        if (!dnnl_memory_desc_equal(want, &p->in_md)) {
            stem->src = BUF_IN_BLK;
            /* the reorder runs first: swap it in front of the stem */
            st = plan_reorder(p, eng, &p->in_md, BUF_IN_USER, want, BUF_IN_BLK, 1.0f, err);
            if (st != TW_OK) return st;
            layer t = p->layers[p->n_layers - 1];
            p->layers[p->n_layers - 1] = p->layers[p->n_layers - 2];
            p->layers[p->n_layers - 2] = t;
        }
        /* a small stem (no max pool) writes the first block's input */
        if (op->dst == TW_RESNET_VAL_X) return first_block_input(w, x, 1, err);
        return TW_OK;
    }
    case TW_RESNET_OP_MAXPOOL:
        if (p->nhwc && cpu_pool_blocked(&w->v[op->src].md) > 0) { /* (nhwc: fp32 plans) */
            st = plan_maxpool_nhwc(p, &w->v[op->src], 1, x, err);
            if (st != TW_OK) return st;
            w->busy = 1u << x->buf; /* the first block's input */
            return TW_OK;
        }
        st = plan_pool(p, eng, &w->v[op->src], false, 1, x, err);
        if (st != TW_OK) return st;
        return first_block_input(w, x, 0, err);
    case TW_RESNET_OP_SHORTCUT:
    case TW_RESNET_OP_CONV:
        st = plan_conv(p, eng, op->conv, &w->v[op->src], false, NULL, free_buf(w->busy), op->relu,
                       x, err);
        if (st != TW_OK) return st;
        w->busy |= 1u << x->buf;
        return TW_OK;
    case TW_RESNET_OP_RESIDUAL: {
        /* the sum post-op adds into the shortcut's storage: the block's output */
        act into = w->v[op->add];
        st = plan_conv(p, eng, op->conv, &w->v[op->src], false, &into, 0, op->relu, x, err);
        if (st != TW_OK) return st;
        w->busy = 1u << x->buf; /* the next block's input */
        return TW_OK;
    }
    case TW_RESNET_OP_AVGPOOL: {
        act in = w->v[op->src];
        if (p->mode == NUM_INT8) {
            /* average in fp32: dequantize the last activation first (channels
             * last, which oneDNN's pooling handles without its reference code) */
            dnnl_memory_desc_t deq;
            dnnl_dims_t xd = {batch, in.c, in.h, in.h};
            DNNL_TRY(dnnl_memory_desc_init_by_tag(&deq, 4, xd, dnnl_f32, dnnl_nhwc), "deq md");
            st = plan_reorder(p, eng, &in.md, in.buf, &deq, BUF_DEQ, 1.0f / in.scale, err);
            if (st != TW_OK) return st;
            in.md = deq;
            in.buf = BUF_DEQ;
        }
        /* global average pool in the blocked layout (a plain-layout destination
         * would send oneDNN to its slow reference pooling), then a small reorder
         * brings the features back as plain fp32 [n][C] (nchw with 1x1) */
        act pooled;
        st =
            plan_pool(p, eng, &in, true, free_buf(in.buf < N_ACT ? 1u << in.buf : 0), &pooled, err);
        if (st != TW_OK) return st;
        dnnl_memory_desc_t feat_md;
        dnnl_dims_t fdims = {batch, pooled.c, 1, 1};
        DNNL_TRY(dnnl_memory_desc_init_by_tag(&feat_md, 4, fdims, dnnl_f32, dnnl_nchw), "feat md");
        return plan_reorder(p, eng, &pooled.md, pooled.buf, &feat_md, BUF_FEAT, 1.0f, err);
    }
    case TW_RESNET_OP_FC:
        return TW_OK; /* the head runs on the host after the plan (tw_resnet_head) */
    }
    return TW_OK;
}

tw_status cpu_plan_build(plan *p, cpu_ctx *c, const tw_resnet *net, int tile, int batch,
                         num_mode mode, const float *amax, tw_error *err)
{
    memset(p, 0, sizeof *p);
    p->mode = mode;
    p->memo = &c->memo;
    p->wino = mode == NUM_F32 && c->wino;
    p->nhwc = mode == NUM_F32 && !p->wino && c->nhwc;
    p->wino_own = p->nhwc && c->wino_own;
    p->gemm = mode == NUM_F32 ? c->gemm : 0;
    p->amax = amax;
    p->w_levels = c->int8_levels;
    p->batch = batch;
    p->tile = tile;
    p->feat_dim = net->feat_dim;
    dnnl_dims_t id = {batch, net->in_bands, tile, tile};
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&p->in_md, 4, id, dnnl_f32, dnnl_nchw), "input md");
    p->buf_bytes[BUF_IN_USER] = dnnl_memory_desc_get_size(&p->in_md);

    plan_walk w = {.p = p, .eng = c->eng};
    w.v[TW_RESNET_VAL_IN] =
        (act){.md = p->in_md, .buf = BUF_IN_USER, .c = net->in_bands, .h = tile, .scale = 1};
    return tw_resnet_walk(net, tile, plan_op, &w, err);
}

/* Total bytes reserve() takes for this plan (all through tw_alloc). */
size_t cpu_plan_bytes(const plan *p, const tw_resnet *net)
{
    size_t total = 0;
    for (int b = 0; b < BUF_COUNT; b++) total += alloc_size(p->buf_bytes[b]);
    total += alloc_size(p->scratch_bytes) + p->weight_bytes;
    total += alloc_size((size_t)net->n_classes * net->feat_dim * sizeof(float));
    total += alloc_size((size_t)net->n_classes * sizeof(float));
    return total;
}

/* cpu_build.c - the CPU backend's built plan: the buffers a plan asks for
 * allocated once, a oneDNN primitive (or a transform of our own) per
 * layer, each conv's weights reordered once into the layout its primitive
 * chose; then running those ops on a batch, which allocates nothing: it
 * moves the input's handle (or copies a short batch in). int8's
 * calibration builds again (model/cpu_int8.c).
 */
#include <string.h>

#include <dnnl.h>

#include "model/cpu_internal.h"
#include "model/maxpool.h"
#include "model/winograd.h"
#include "core/alloc.h"

void cpu_release(cpu_ctx *c)
{
    for (int i = 0; i < c->n_ops; i++)
        if (c->ops[i].prim) dnnl_primitive_destroy(c->ops[i].prim);
    for (int i = 0; i < c->n_mems; i++) dnnl_memory_destroy(c->mems[i]);
    for (int i = 0; i < c->n_allocs; i++) tw_free(c->allocs[i]);
    tw_free(c->ops);
    tw_free(c->mems);
    tw_free(c->allocs);
    c->ops = NULL;
    c->mems = NULL;
    c->allocs = NULL;
    c->n_ops = c->n_mems = c->n_allocs = c->cap_mems = c->cap_allocs = 0;
    memset(c->buf, 0, sizeof c->buf);
    c->scratch = NULL;
    c->in_mem = NULL;
    c->fc_w = c->fc_b = NULL;
    tw_seg_cpu_destroy(c->seg);
    c->seg = NULL;
    c->reserved = false;
}

static void *ws_alloc(cpu_ctx *c, size_t bytes)
{
    if (c->n_allocs == c->cap_allocs) return NULL;
    void *p = tw_alloc(TW_MEM_WORKSPACE, bytes);
    if (p) c->allocs[c->n_allocs++] = p;
    return p;
}

static tw_status new_mem(cpu_ctx *c, const dnnl_memory_desc_t *md, void *handle, dnnl_memory_t *out,
                         tw_error *err)
{
    if (c->n_mems == c->cap_mems)
        return tw_error_set(err, TW_ERR_INTERNAL, "CPU backend: memory table full");
    DNNL_TRY(dnnl_memory_create(out, md, c->eng, handle), "memory create");
    c->mems[c->n_mems++] = *out;
    return TW_OK;
}

/* A conv whose weights the net no longer holds: an earlier reserve
 * consumed them (see build) and a retry cannot make them again. */
static tw_status weights_gone(tw_error *err)
{
    return tw_error_set(err, TW_ERR_NOMEM,
                        "out of memory for the CPU weights (the model's own copy was "
                        "already released: give the run a smaller tiling.batch)");
}

/* Reorder memory `from` (layout from_md) into `to` (to_md) now, scaling
 * output channel o by oscale[o] when n_oscale > 0 (int8 weights). */
static tw_status reorder_once(cpu_ctx *c, dnnl_memory_t from, const dnnl_memory_desc_t *from_md,
                              dnnl_memory_t to, const dnnl_memory_desc_t *to_md,
                              const float *oscale, int n_oscale, int oscale_mask, tw_error *err)
{
    dnnl_primitive_desc_t rpd = NULL;
    dnnl_primitive_t r = NULL;
    dnnl_primitive_attr_t attr;
    attr_spec as = {
        .n_oscale = n_oscale, .oscale_mask = oscale_mask, .oscale = oscale, .own_scratch = true};
    tw_status st = cpu_make_attr(&as, &attr, err);
    if (st != TW_OK) return st;
    dnnl_status_t s =
        dnnl_reorder_primitive_desc_create(&rpd, from_md, c->eng, to_md, c->eng, attr);
    dnnl_primitive_attr_destroy(attr);
    if (s == dnnl_success) s = dnnl_primitive_create(&r, rpd);
    if (s == dnnl_success) {
        dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
        s = dnnl_primitive_execute(r, c->stream, 2, args);
    }
    if (s == dnnl_success) s = dnnl_stream_wait(c->stream);
    if (r) dnnl_primitive_destroy(r);
    if (rpd) dnnl_primitive_desc_destroy(rpd);
    if (s != dnnl_success) return dnnl_fail(err, s, "weights reorder");
    return TW_OK;
}

/* Reorder the folded OIHW weights of conv into the layout of its primitive
 * and keep them; the bias is copied as is. */
static tw_status prepare_weights(cpu_ctx *c, const layer *l, dnnl_memory_t *wm, dnnl_memory_t *bm,
                                 tw_error *err)
{
    /* the weights as the net holds them: OIHW, or for the lowerings a plain
     * [kd][ks] matrix ([Cout][Cin] for LOWER_ROWS: OIHW with k = 1) */
    const tw_conv *cv0 = l->conv;
    dnnl_dims_t wd = {cv0->cout, cv0->cin, cv0->k, cv0->k};
    int wnd = 4;
    dnnl_format_tag_t wtag = dnnl_oihw;
    if (cv0->groups > 1) {
        /* grouped: [g][cout/g][cin/g][k][k], the OIHW bytes as they are */
        int g = cv0->groups;
        dnnl_dims_t gd = {g, cv0->cout / g, cv0->cin / g, cv0->k, cv0->k};
        memcpy(wd, gd, sizeof gd);
        wnd = 5;
        wtag = dnnl_goihw;
    }
    const float *wsrc = cv0->w;
    if (l->lower != LOWER_NONE) {
        /* [kd][ks] in memory: the matmul's [ks][kd] weights in layout ba */
        wnd = 2;
        wtag = dnnl_ba;
        wd[1] = l->lower == LOWER_ROWS ? cv0->cout : cpu_tile_elems(&l->out4);
        wd[0] = l->lower == LOWER_ROWS ? cv0->cin : cpu_tile_elems(&l->in4);
        if (l->lower == LOWER_DENSE) wsrc = c->buf[0]; /* filled below, sized by the plan */
    }
    const tw_conv *cv = l->conv;
    if (!cv->w || !cv->b) return weights_gone(err);
    const dnnl_memory_desc_t *wmd, *bmd;
    tw_status st;
    if ((st = query_md(l->pd, dnnl_query_weights_md, 0, &wmd, err)) != TW_OK ||
        (st = query_md(l->pd, dnnl_query_weights_md, 1, &bmd, err)) != TW_OK)
        return st;
    void *w = ws_alloc(c, dnnl_memory_desc_get_size(wmd));
    float *b = ws_alloc(c, dnnl_memory_desc_get_size(bmd));
    if (!w || !b) return tw_error_set(err, TW_ERR_NOMEM, "out of memory for the CPU weights");
    if (l->lower == LOWER_DENSE)
        cpu_dense_matrix(cv, &l->in4, &l->out4, c->buf[0], b);
    else
        memcpy(b, cv->b, (size_t)cv->cout * sizeof(float));
    /* int8: the bias joins the accumulator, which counts in src*w units */
    if (l->w_scale)
        for (int o = 0; o < cv->cout; o++) b[o] *= l->src_scale * l->w_scale[o];
    st = new_mem(c, wmd, w, wm, err);
    if (st == TW_OK) st = new_mem(c, bmd, b, bm, err);
    if (st != TW_OK) return st;

    dnnl_memory_desc_t umd;
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&umd, wnd, wd, dnnl_f32, wtag), "weights md");
    dnnl_memory_t um;
    /* the reorder only reads the source: the cast drops const for the C API */
    DNNL_TRY(dnnl_memory_create(&um, &umd, c->eng, (void *)wsrc), "weights memory");
    st = reorder_once(c, um, &umd, *wm, wmd, l->w_scale, l->w_scale ? cv->cout : 0,
                      cv->groups > 1 ? 3 : 1, err);
    dnnl_memory_destroy(um);
    return st;
}

/* The scratchpad argument of pd's primitive, when it has one. */
static tw_status scratch_arg(cpu_ctx *c, const_dnnl_primitive_desc_t pd, op *o, tw_error *err)
{
    const dnnl_memory_desc_t *spmd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    if (!spmd || dnnl_memory_desc_get_size(spmd) == 0) return TW_OK;
    dnnl_memory_t spm;
    tw_status st = new_mem(c, spmd, c->scratch, &spm, err);
    if (st == TW_OK) o->args[o->nargs++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, spm};
    return st;
}

/* The three ops of LOWER_WINO layer l: V from the source activation, the
 * matmul with U (made here: plain [36][Cin][Cout] in buffer 0, reordered
 * into the layout the matmul chose), y from M with bias, sum and ReLU. */
static tw_status build_wino(cpu_ctx *c, const layer *l, tw_resnet *consume, tw_error *err)
{
    const tw_conv *cv = l->conv;
    if (!cv->w || !cv->b) return weights_gone(err);
    int n = (int)l->in4.dims[0], h = (int)l->in4.dims[2];
    size_t stride = l->rows;
    const dnnl_memory_desc_t *vmd, *wmd, *mmd;
    tw_status st;
    if ((st = query_md(l->pd, dnnl_query_src_md, 0, &vmd, err)) != TW_OK ||
        (st = query_md(l->pd, dnnl_query_weights_md, 0, &wmd, err)) != TW_OK ||
        (st = query_md(l->pd, dnnl_query_dst_md, 0, &mmd, err)) != TW_OK)
        return st;
    float *bias = ws_alloc(c, (size_t)cv->cout * sizeof *bias);
    void *w = ws_alloc(c, dnnl_memory_desc_get_size(wmd));
    if (!bias || !w) return tw_error_set(err, TW_ERR_NOMEM, "out of memory for the CPU weights");
    memcpy(bias, cv->b, (size_t)cv->cout * sizeof *bias);
    tw_wino_weights(cv->w, cv->cout, cv->cin, c->buf[0]);
    dnnl_memory_t um, wm, vm, mm;
    dnnl_memory_desc_t umd;
    dnnl_dims_t ud = {TW_WINO_POINTS, cv->cin, cv->cout};
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&umd, 3, ud, dnnl_f32, dnnl_abc), "U md");
    if ((st = new_mem(c, &umd, c->buf[0], &um, err)) != TW_OK ||
        (st = new_mem(c, wmd, w, &wm, err)) != TW_OK ||
        (st = reorder_once(c, um, &umd, wm, wmd, NULL, 0, 1, err)) != TW_OK)
        return st;
    if (consume) tw_resnet_release_conv(consume, cv);
    if ((st = new_mem(c, vmd, c->buf[BUF_WINO_V], &vm, err)) != TW_OK ||
        (st = new_mem(c, mmd, c->buf[BUF_WINO_M], &mm, err)) != TW_OK)
        return st;

    op *in = &c->ops[c->n_ops++];
    *in = (op){.kind = OP_WINO_IN,
               .from = c->buf[l->src],
               .to = c->buf[BUF_WINO_V],
               .n = n,
               .stride = stride,
               .h = h,
               .ch = cv->cin};
    op *mul = &c->ops[c->n_ops];
    DNNL_TRY(dnnl_primitive_create(&mul->prim, l->pd), "primitive create");
    c->n_ops++;
    mul->args[mul->nargs++] = (dnnl_exec_arg_t){DNNL_ARG_SRC, vm};
    mul->args[mul->nargs++] = (dnnl_exec_arg_t){DNNL_ARG_WEIGHTS, wm};
    mul->args[mul->nargs++] = (dnnl_exec_arg_t){DNNL_ARG_DST, mm};
    if ((st = scratch_arg(c, l->pd, mul, err)) != TW_OK) return st;
    op *out = &c->ops[c->n_ops++];
    *out = (op){.kind = OP_WINO_OUT,
                .from = c->buf[BUF_WINO_M],
                .to = c->buf[l->dst],
                .bias = bias,
                .n = n,
                .stride = stride,
                .h = h,
                .ch = cv->cout,
                .sum = l->sum,
                .relu = l->relu,
                .conv = true,
                .levels = l->relu ? 255 : 127,
                .dst = c->buf[l->dst],
                .dst_floats = (size_t)n * h * h * cv->cout};
    return TW_OK;
}

/* Allocate the plan's buffers, then reorder each conv's weights; with
 * consume (the net's owner will not need its conv weights again), free
 * each one from the net right after its copy is made, so that the two
 * copies never coexist in full. */
static tw_status build(cpu_ctx *c, const tw_resnet *net, tw_resnet *consume, const plan *p,
                       tw_error *err)
{
    /* a LOWER_WINO layer is three ops: transform, matmul, transform */
    c->ops = tw_calloc(TW_MEM_OTHER, (size_t)p->n_layers * 3, sizeof *c->ops);
    c->stats.winograd_convs = 0;
    c->cap_mems = p->n_layers * 6 + 4;
    c->mems = tw_calloc(TW_MEM_OTHER, (size_t)c->cap_mems, sizeof *c->mems);
    c->cap_allocs = 2 * p->n_layers + BUF_COUNT + 4;
    c->allocs = tw_calloc(TW_MEM_OTHER, (size_t)c->cap_allocs, sizeof *c->allocs);
    if (!c->ops || !c->mems || !c->allocs)
        return tw_error_set(err, TW_ERR_NOMEM, "out of memory for the CPU backend");

    for (int b = 0; b < BUF_COUNT; b++) {
        size_t bytes = p->buf_bytes[b];
        if (bytes == 0) continue;
        /* zeroed once, so that the unused tail of a short batch is finite */
        c->buf[b] = ws_alloc(c, bytes);
        if (!c->buf[b]) goto nomem;
        memset(c->buf[b], 0, bytes);
    }
    if (p->scratch_bytes && !(c->scratch = ws_alloc(c, p->scratch_bytes))) goto nomem;
    size_t fc_n = (size_t)net->n_classes * net->feat_dim;
    c->fc_w = ws_alloc(c, fc_n * sizeof(float));
    c->fc_b = ws_alloc(c, (size_t)net->n_classes * sizeof(float));
    if (!c->fc_w || !c->fc_b) goto nomem;
    memcpy(c->fc_w, net->fc_w, fc_n * sizeof(float));
    memcpy(c->fc_b, net->fc_b, (size_t)net->n_classes * sizeof(float));

    tw_status st;
    for (int i = 0; i < p->n_layers; i++) {
        const layer *l = &p->layers[i];
        if (l->lower == LOWER_WINO) {
            if ((st = build_wino(c, l, consume, err)) != TW_OK) return st;
            continue;
        }
        if (l->kind == L_MAXPOOL_NHWC) {
            c->ops[c->n_ops++] = (op){.kind = OP_MAXPOOL,
                                      .from = c->buf[l->src],
                                      .to = c->buf[l->dst],
                                      .n = (int)l->in4.dims[0],
                                      .h = (int)l->in4.dims[2],
                                      .ch = (int)l->in4.dims[1],
                                      .blk = cpu_pool_blocked(&l->in4)};
            continue;
        }
        op *o = &c->ops[c->n_ops];
        DNNL_TRY(dnnl_primitive_create(&o->prim, l->pd), "primitive create");
        c->n_ops++;
        bool reorder = l->kind == L_REORDER;
        const dnnl_memory_desc_t *smd, *dmd;
        dnnl_memory_t sm, dm;
        if ((st = query_md(l->pd, dnnl_query_src_md, 0, &smd, err)) != TW_OK ||
            (st = query_md(l->pd, dnnl_query_dst_md, 0, &dmd, err)) != TW_OK)
            return st;
        st = new_mem(c, smd, c->buf[l->src], &sm, err);
        if (st == TW_OK) st = new_mem(c, dmd, c->buf[l->dst], &dm, err);
        if (st != TW_OK) return st;
        if (l->src == BUF_IN_USER) c->in_mem = sm;
        o->conv = l->kind == L_CONV;
        o->levels = l->relu ? 255 : 127;
        o->dst = c->buf[l->dst];
        /* (a lowering's padding rows are not the output's) */
        o->dst_floats =
            dnnl_memory_desc_get_size(l->lower != LOWER_NONE ? &l->out4 : dmd) / sizeof(float);
        o->groups = l->groups > 1 ? l->groups : 1;
        if (o->groups > 1) { /* a group's layouts: the batch's is groups of them */
            o->dst_floats *= (size_t)o->groups;
            o->src_step = l->src_step;
            o->dst_step = l->dst_step;
            o->src0 = c->buf[l->src];
            o->dst0 = c->buf[l->dst];
        }
        o->args[o->nargs++] = (dnnl_exec_arg_t){reorder ? DNNL_ARG_FROM : DNNL_ARG_SRC, sm};
        o->args[o->nargs++] = (dnnl_exec_arg_t){reorder ? DNNL_ARG_TO : DNNL_ARG_DST, dm};
        if (l->kind == L_CONV) {
            const dnnl_convolution_desc_t *cd = NULL;
            if (dnnl_primitive_desc_query(l->pd, dnnl_query_convolution_d, 0, &cd) ==
                    dnnl_success &&
                cd->alg_kind == dnnl_convolution_winograd)
                c->stats.winograd_convs++;
            dnnl_memory_t wm, bm;
            st = prepare_weights(c, l, &wm, &bm, err);
            if (st != TW_OK) return st;
            if (consume) tw_resnet_release_conv(consume, l->conv);
            o->args[o->nargs++] = (dnnl_exec_arg_t){DNNL_ARG_WEIGHTS, wm};
            o->args[o->nargs++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, bm};
        }
        if ((st = scratch_arg(c, l->pd, o, err)) != TW_OK) return st;
    }
    if (!c->in_mem) return tw_error_set(err, TW_ERR_INTERNAL, "CPU backend: no input layer");
    /* buffer 0 held the dense matrices or U: zero again */
    if ((p->n_gemm || p->n_wino) && c->buf[0]) memset(c->buf[0], 0, p->buf_bytes[0]);
    c->stats.gemm_convs = p->n_gemm;
    c->stats.winograd_convs += p->n_wino;
    return TW_OK;
nomem:
    return tw_error_set(err, TW_ERR_NOMEM, "out of memory for the CPU backend workspace");
}

/* Plan and build the net in mode for batches of `batch` tiles. On failure
 * nothing stays built. consume: see build(). */
tw_status cpu_build_mode(cpu_ctx *c, const tw_resnet *net, tw_resnet *consume, int tile, int batch,
                         num_mode mode, const float *amax, tw_error *err)
{
    plan p;
    tw_status st = cpu_plan_build(&p, c, net, tile, batch, mode, amax, err);
    if (st == TW_OK) st = build(c, net, consume, &p, err);
    int n_conv = p.n_conv, n_refused = p.n_refused;
    cpu_plan_free(&p);
    if (st != TW_OK) {
        cpu_release(c);
        return st;
    }
    c->mode = mode;
    c->n_conv = n_conv;
    c->n_refused = n_refused;
    c->stats.lowerings_refused = n_refused;
    c->reserved = true;
    return TW_OK;
}

/* Point the first layer at this batch's input: in place for a full batch
 * (oneDNN never writes its source), else copied into the backend's own. */
static tw_status set_input(cpu_ctx *c, const tw_infer_batch *b, tw_error *err)
{
    void *src = c->buf[BUF_IN_USER];
    if (b->n == c->max_batch)
        src = (void *)b->x;
    else if (b->x != src)
        memcpy(src, b->x, (size_t)b->n * c->in_bands * c->tile * c->tile * sizeof(float));
    DNNL_TRY(dnnl_memory_set_data_handle(c->in_mem, src), "set input");
    return TW_OK;
}

/* Run every op on batch b; rec (fp32 plans only): record each conv's output. */
tw_status cpu_run_ops(cpu_ctx *c, const tw_infer_batch *b, calib_rec *rec, tw_error *err)
{
    tw_status st = set_input(c, b, err);
    if (st != TW_OK) return st;
    for (int i = 0, k = 0; i < c->n_ops; i++) {
        const op *o = &c->ops[i];
        if (o->kind == OP_PRIM && o->groups > 1) {
            for (int g = 0; g < o->groups; g++) {
                DNNL_TRY(dnnl_memory_set_data_handle(o->args[0].memory,
                                                     o->src0 + (size_t)g * o->src_step),
                         "set group source");
                DNNL_TRY(dnnl_memory_set_data_handle(o->args[1].memory,
                                                     o->dst0 + (size_t)g * o->dst_step),
                         "set group destination");
                DNNL_TRY(dnnl_primitive_execute(o->prim, c->stream, o->nargs, o->args), "execute");
            }
        } else if (o->kind == OP_PRIM) {
            DNNL_TRY(dnnl_primitive_execute(o->prim, c->stream, o->nargs, o->args), "execute");
        } else {
            DNNL_TRY(dnnl_stream_wait(c->stream), "stream wait");
            if (o->kind == OP_WINO_IN)
                tw_wino_input(o->from, o->n, o->h, o->ch, o->stride, o->to);
            else if (o->kind == OP_MAXPOOL)
                tw_maxpool_blocked_to_nhwc(o->from, o->n, o->ch, o->h, o->blk, o->to);
            else
                tw_wino_output(o->from, o->n, o->h, o->ch, o->stride, o->bias, o->sum, o->relu,
                               o->to);
        }
        if (rec && o->conv) {
            DNNL_TRY(dnnl_stream_wait(c->stream), "stream wait");
            cpu_record(c, o, k++, rec);
        }
    }
    DNNL_TRY(dnnl_stream_wait(c->stream), "stream wait");
    return TW_OK;
}

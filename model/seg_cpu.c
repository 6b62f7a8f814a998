/* seg_cpu.c - see seg_cpu.h
 *
 * Planning (plan_memory, no oneDNN): every value gets a root (the value
 * whose storage it lives in) and a float offset there. A concatenation's
 * inputs become views of its result (in op order, so an encoder's skip is
 * written into the decoder's concat buffer by the op that makes it); a
 * residual conv whose shortcut dies with it writes into the shortcut's
 * storage (the sum post-op reads it there), else the shortcut is copied in
 * first. Roots then get arena offsets, first fit, largest first, over
 * their lifetimes (first definition to last read of any value they hold).
 */
#include "model/seg_cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <dnnl.h>

#include "model/cpu_internal.h"
#include "core/alloc.h"

enum { BLK = 16 };

typedef struct mplan {
    int *c, *h;
    int *root;   /* the value whose storage v lives in */
    size_t *off; /* floats from the root's start */
    size_t *bytes;
    bool *copy;     /* CONCAT inputs: copied in (not a view); indexed by value */
    bool *res_copy; /* CONV ops with add: the shortcut is copied into dst first */
    size_t *base;   /* root values: byte offset in the arena */
    size_t arena;
} mplan;

static void mplan_free(mplan *m)
{
    tw_free(m->c);
    tw_free(m->h);
    tw_free(m->root);
    tw_free(m->off);
    tw_free(m->bytes);
    tw_free(m->copy);
    tw_free(m->res_copy);
    tw_free(m->base);
    memset(m, 0, sizeof *m);
}

static size_t pad16(int c)
{
    return (size_t)((c + BLK - 1) / BLK * BLK);
}

/* Concatenations written in place: each input of a concat whose channel
 * offset allows it becomes a view into the concat's storage (held: another
 * value lives in it), else it is copied in. */
static void plan_views(const tw_segnet *net, mplan *m, bool *held)
{
    int no = net->n_ops;
    for (int i = 0; i < no; i++) {
        const tw_seg_op *op = &net->ops[i];
        if (op->kind != TW_SEG_OP_CONCAT) continue;
        size_t ch = 0;
        for (int j = 0; j < op->n_src; j++) {
            int v = op->src[j];
            bool view = v != TW_SEG_VAL_IN && m->root[v] == v && !held[v] &&
                        (j == op->n_src - 1 || m->c[v] % BLK == 0) && ch % BLK == 0;
            if (view) {
                m->root[v] = op->dst;
                m->off[v] = ch * (size_t)m->h[v] * (size_t)m->h[v];
                held[op->dst] = true;
            } else {
                m->copy[v] = true;
            }
            ch += (size_t)m->c[v];
        }
    }
}

/* Residual adds summed in place: a conv's sum post-op reads the shortcut
 * where it lies when the shortcut's storage group dies with the op, else
 * the shortcut is copied into dst first (res_copy). */
static void plan_residuals(const tw_segnet *net, mplan *m, const int *last, bool *held)
{
    int nv = net->n_values, no = net->n_ops;
    for (int i = 0; i < no; i++) {
        const tw_seg_op *op = &net->ops[i];
        if (op->kind != TW_SEG_OP_CONV || op->add < 0) continue;
        int a = op->add, d = op->dst, r = m->root[a];
        /* the storage group of the shortcut (a block chain: each block's
         * output summed into its shortcut's storage) is free after this op */
        bool dies = a != TW_SEG_VAL_IN && last[a] == i && m->bytes[a] == m->bytes[d];
        for (int v = 1; dies && v < nv; v++)
            if (m->root[v] == r && (last[v] > i || m->bytes[v] != m->bytes[d] || v == net->out))
                dies = false;
        if (dies && m->root[d] == d && !held[d]) {
            m->root[d] = r; /* the sum post-op reads the shortcut where it lies */
            m->off[d] = m->off[a];
            held[r] = true;
        } else if (dies && m->root[d] != d && r != d) {
            /* d is a view (a stage's output a decoder concatenates): the
             * group moves into the view, so the shortcut is summed there */
            int to = m->root[d];
            size_t off = m->off[d];
            for (int v = 1; v < nv; v++)
                if (m->root[v] == r) {
                    m->root[v] = to;
                    m->off[v] = off;
                }
            held[to] = true;
        } else {
            m->res_copy[i] = true;
        }
    }
}

/* Every root value's place in the arena: lifetimes from def/last, largest
 * first, each at the lowest offset clear of the roots alive with it. */
static void place_roots(const tw_segnet *net, mplan *m, const int *last, const int *def, int *start,
                        int *end, int *order)
{
    int nv = net->n_values, no = net->n_ops;
    /* lifetimes of roots; the input and the probabilities are the caller's */
    for (int v = 0; v < nv; v++) {
        start[v] = no + 1;
        end[v] = -1;
    }
    for (int v = 1; v < nv; v++) {
        if (v == net->out) continue;
        int r = m->root[v];
        int e = last[v] > def[v] ? last[v] : def[v];
        if (def[v] < start[r]) start[r] = def[v];
        if (e > end[r]) end[r] = e;
    }
    int nr = 0;
    for (int v = 1; v < nv; v++)
        if (m->root[v] == v && v != net->out) order[nr++] = v;
    /* largest first (insertion sort: a few hundred values) */
    for (int i = 1; i < nr; i++) {
        int v = order[i], j = i;
        while (j > 0 && m->bytes[order[j - 1]] < m->bytes[v]) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = v;
    }
    m->arena = 0;
    for (int i = 0; i < nr; i++) {
        int v = order[i];
        size_t at = 0;
        /* the lowest offset clear of every placed root alive at the same time */
        for (bool moved = true; moved;) {
            moved = false;
            for (int j = 0; j < i; j++) {
                int u = order[j];
                if (end[u] < start[v] || end[v] < start[u]) continue;
                if (at < m->base[u] + m->bytes[u] && m->base[u] < at + m->bytes[v]) {
                    at = m->base[u] + m->bytes[u];
                    moved = true;
                }
            }
        }
        m->base[v] = at;
        if (at + m->bytes[v] > m->arena) m->arena = at + m->bytes[v];
    }
}

static tw_status plan_memory(const tw_segnet *net, int tile, mplan *m, tw_error *err)
{
    int nv = net->n_values, no = net->n_ops;
    memset(m, 0, sizeof *m);
    m->c = tw_calloc(TW_MEM_OTHER, (size_t)nv, sizeof(int));
    m->h = tw_calloc(TW_MEM_OTHER, (size_t)nv, sizeof(int));
    m->root = tw_calloc(TW_MEM_OTHER, (size_t)nv, sizeof(int));
    m->off = tw_calloc(TW_MEM_OTHER, (size_t)nv, sizeof(size_t));
    m->bytes = tw_calloc(TW_MEM_OTHER, (size_t)nv, sizeof(size_t));
    m->copy = tw_calloc(TW_MEM_OTHER, (size_t)nv, sizeof(bool));
    m->res_copy = tw_calloc(TW_MEM_OTHER, (size_t)no, sizeof(bool));
    m->base = tw_calloc(TW_MEM_OTHER, (size_t)nv, sizeof(size_t));
    int *last = tw_calloc(TW_MEM_OTHER, (size_t)nv, sizeof(int));
    int *def = tw_calloc(TW_MEM_OTHER, (size_t)nv, sizeof(int));
    int *start = tw_calloc(TW_MEM_OTHER, (size_t)nv, sizeof(int));
    int *end = tw_calloc(TW_MEM_OTHER, (size_t)nv, sizeof(int));
    int *order = tw_calloc(TW_MEM_OTHER, (size_t)nv, sizeof(int));
    bool *held = tw_calloc(TW_MEM_OTHER, (size_t)nv, sizeof(bool)); /* another value lives in it */
    tw_status st = TW_OK;
    if (!m->c || !m->h || !m->root || !m->off || !m->bytes || !m->copy || !m->res_copy ||
        !m->base || !last || !def || !start || !end || !order || !held) {
        st = tw_error_set(err, TW_ERR_NOMEM, "out of memory planning %s", net->arch);
        goto done;
    }
    if ((st = tw_segnet_shapes(net, tile, m->c, m->h, err)) != TW_OK) goto done;
    tw_segnet_last_use(net, last);
    for (int v = 0; v < nv; v++) {
        m->root[v] = v;
        m->bytes[v] = pad16(m->c[v]) * (size_t)m->h[v] * (size_t)m->h[v] * sizeof(float);
        def[v] = -1;
    }
    for (int i = 0; i < no; i++) def[net->ops[i].dst] = i;

    plan_views(net, m, held);
    plan_residuals(net, m, last, held);
    place_roots(net, m, last, def, start, end, order);
done:
    tw_free(last);
    tw_free(def);
    tw_free(start);
    tw_free(end);
    tw_free(order);
    tw_free(held);
    if (st != TW_OK) mplan_free(m);
    return st;
}

tw_status tw_seg_cpu_batch_bytes(const tw_segnet *net, int tile, int n, size_t *bytes,
                                 size_t *arena, tw_error *err)
{
    mplan m;
    tw_status st = plan_memory(net, tile, &m, err);
    if (st != TW_OK) return st;
    size_t px = (size_t)tile * (size_t)tile;
    *bytes = m.arena + (size_t)n * px * (size_t)(net->in_bands + net->n_classes) * sizeof(float);
    if (arena) *arena = m.arena;
    mplan_free(&m);
    return TW_OK;
}

/* ---- the built forward ---- */

/* X_COPY_CH: a concatenation's input copied to its channels (blocked to
 * blocked at any channel offset; oneDNN's submemories need offsets that are
 * multiples of the block) */
typedef enum { X_PRIM, X_SOFTMAX, X_COPY_CH, X_ZERO } xkind;

typedef struct xop {
    xkind kind;
    dnnl_primitive_t prim;
    int nargs;
    dnnl_exec_arg_t args[6];
    int in_arg; /* index in args of the memory reading the caller's input, or -1 */
    /* X_SOFTMAX: blocked logits -> the caller's [classes][h][h] */
    const float *src;
    int classes, h;
    /* X_COPY_CH: src's `classes` channels to dst's from channel `at` on, of
     * dst_c in all (pad: zero dst's padding channels after them) */
    float *dst;
    int at, dst_c;
    bool pad;
    size_t zero_bytes; /* X_ZERO: dst's first zero_bytes bytes */
} xop;

struct tw_seg_cpu {
    const tw_segnet *net;
    int tile;
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    mplan m;
    char *arena;
    void *scratch;
    size_t scratch_bytes, weight_bytes;
    /* the zero-padded copy of a dilated conv's source (build_conv_wpad):
     * pad_cap bytes would do for any; pad_bytes, those allocated (0 or pad_cap) */
    void *padbuf;
    size_t pad_cap, pad_bytes;
    xop *ops;
    int n_ops;
    dnnl_memory_t *mems;
    int n_mems, cap_mems;
    void **allocs;
    int n_allocs, cap_allocs;
    dnnl_primitive_desc_t *pds; /* kept until the scratchpad is sized */
    int n_pds;
};

static tw_status keep_mem(tw_seg_cpu *c, const dnnl_memory_desc_t *md, void *handle,
                          dnnl_memory_t *out, tw_error *err)
{
    if (c->n_mems == c->cap_mems)
        return tw_error_set(err, TW_ERR_INTERNAL, "seg CPU: memory table full");
    DNNL_TRY(dnnl_memory_create(out, md, c->eng, handle), "memory create");
    c->mems[c->n_mems++] = *out;
    return TW_OK;
}

static void *keep_alloc(tw_seg_cpu *c, size_t bytes)
{
    if (c->n_allocs == c->cap_allocs) return NULL;
    void *p = tw_alloc(TW_MEM_WEIGHTS, bytes ? bytes : 1);
    if (p) c->allocs[c->n_allocs++] = p;
    return p;
}

static tw_status act_md(const tw_seg_cpu *c, int v, dnnl_memory_desc_t *md, tw_error *err)
{
    dnnl_dims_t d = {1, c->m.c[v], c->m.h[v], c->m.h[v]};
    DNNL_TRY(dnnl_memory_desc_init_by_tag(md, 4, d, dnnl_f32,
                                          v == TW_SEG_VAL_IN ? dnnl_nchw : dnnl_nChw16c),
             "activation md");
    return TW_OK;
}

static void *act_ptr(const tw_seg_cpu *c, int v)
{
    if (v == TW_SEG_VAL_IN) return NULL; /* set per tile */
    int r = c->m.root[v];
    return c->arena + c->m.base[r] + c->m.off[v] * sizeof(float);
}

/* A new op running pd from value s (or the handle src_at) into the handle
 * dst_at, with a user scratchpad; more args may follow. */
static tw_status add_prim_at(tw_seg_cpu *c, dnnl_primitive_desc_t pd, int s,
                             const dnnl_memory_desc_t *smd, void *src_at,
                             const dnnl_memory_desc_t *dmd, void *dst_at, xop **out, tw_error *err)
{
    xop *o = &c->ops[c->n_ops];
    memset(o, 0, sizeof *o);
    o->kind = X_PRIM;
    o->in_arg = -1;
    c->pds[c->n_pds++] = pd;
    DNNL_TRY(dnnl_primitive_create(&o->prim, pd), "primitive create");
    c->n_ops++;
    dnnl_memory_t sm, dm;
    tw_status st;
    if ((st = keep_mem(c, smd, src_at ? src_at : act_ptr(c, s), &sm, err)) != TW_OK ||
        (st = keep_mem(c, dmd, dst_at, &dm, err)) != TW_OK)
        return st;
    if (s == TW_SEG_VAL_IN && !src_at) o->in_arg = 0;
    /* DNNL_ARG_SRC and DNNL_ARG_DST are also a reorder's FROM and TO */
    o->args[o->nargs++] = (dnnl_exec_arg_t){DNNL_ARG_SRC, sm};
    o->args[o->nargs++] = (dnnl_exec_arg_t){DNNL_ARG_DST, dm};
    *out = o;
    return TW_OK;
}

/* The same into value d. */
static tw_status add_prim(tw_seg_cpu *c, dnnl_primitive_desc_t pd, int s,
                          const dnnl_memory_desc_t *smd, void *src_at, int d,
                          const dnnl_memory_desc_t *dmd, xop **out, tw_error *err)
{
    return add_prim_at(c, pd, s, smd, src_at, dmd, act_ptr(c, d), out, err);
}

static dnnl_primitive_attr_t scratch_attr(void)
{
    dnnl_primitive_attr_t a = NULL;
    if (dnnl_primitive_attr_create(&a) != dnnl_success) return NULL;
    if (dnnl_primitive_attr_set_scratchpad_mode(a, dnnl_scratchpad_mode_user) != dnnl_success) {
        dnnl_primitive_attr_destroy(a);
        return NULL;
    }
    return a;
}

/* A copy of value s (layout smd) into dmd at handle dst, as an op. */
static tw_status add_copy(tw_seg_cpu *c, int s, const dnnl_memory_desc_t *smd, void *dst,
                          const dnnl_memory_desc_t *dmd, tw_error *err)
{
    dnnl_primitive_attr_t a = scratch_attr();
    if (!a) return tw_error_set(err, TW_ERR_NOMEM, "oneDNN: attr create failed");
    dnnl_primitive_desc_t pd;
    dnnl_status_t s_ = dnnl_reorder_primitive_desc_create(&pd, smd, c->eng, dmd, c->eng, a);
    dnnl_primitive_attr_destroy(a);
    if (s_ != dnnl_success) return dnnl_fail(err, s_, "copy reorder");
    xop *o;
    return add_prim_at(c, pd, s, smd, NULL, dmd, dst, &o, err);
}

/* The primitive of op's conv as k x k, padding pad_l, dilation dl, from
 * weights w_user ([cout][cin][k][k]), reading smd (side ih; wpad > 0: a copy
 * at src_at, wpad zero columns either side, padded in H only), writing dmd
 * (side oh). jit_only: *refused (and nothing built) when oneDNN offers only
 * its reference kernel. */
static tw_status build_conv_k(tw_seg_cpu *c, const tw_seg_op *op, const dnnl_memory_desc_t *smd,
                              void *src_at, int wpad, const dnnl_memory_desc_t *dmd,
                              const float *w_user, int k, int pad_l, int dl, int ih, int oh,
                              bool jit_only, bool *refused, tw_error *err)
{
    const tw_conv *cv = &op->conv;
    dnnl_memory_desc_t wmd, bmd, wuser;
    tw_status st;
    dnnl_dims_t wd = {cv->cout, cv->cin, k, k}, bd = {cv->cout};
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&wmd, 4, wd, dnnl_f32, dnnl_format_tag_any), "w md");
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&wuser, 4, wd, dnnl_f32, dnnl_oihw), "w md");
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&bmd, 1, bd, dnnl_f32, dnnl_x), "b md");
    /* the right padding that makes oneDNN's output side the graph's */
    dnnl_dim_t pr = (dnnl_dim_t)(oh - 1) * cv->stride + (dnnl_dim_t)dl * (k - 1) + 1 - ih - pad_l;
    dnnl_dims_t strides = {cv->stride, cv->stride}, dil = {dl - 1, dl - 1},
                pad = {pad_l, wpad ? 0 : pad_l}, padr = {pr, wpad ? 0 : pr};
    dnnl_convolution_desc_t cd;
    DNNL_TRY(dnnl_dilated_convolution_forward_desc_init(&cd, dnnl_forward_inference,
                                                        dnnl_convolution_direct, smd, &wmd, &bmd,
                                                        dmd, strides, dil, pad, padr),
             "conv desc");
    attr_spec as = {
        .sum = op->add >= 0, .relu = op->relu, .sum_scale = 1.0f, .sum_dt = dnnl_data_type_undef};
    dnnl_primitive_attr_t attr;
    if ((st = cpu_make_attr(&as, &attr, err)) != TW_OK) return st;
    dnnl_primitive_desc_t pd;
    dnnl_status_t s_ = dnnl_primitive_desc_create(&pd, &cd, attr, c->eng, NULL);
    dnnl_primitive_attr_destroy(attr);
    if (s_ != dnnl_success) return dnnl_fail(err, s_, op->name);
    const char *impl = NULL;
    if (jit_only &&
        dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl &&
        !strncmp(impl, "ref", 3)) {
        dnnl_primitive_desc_destroy(pd);
        *refused = true;
        return TW_OK;
    }
    xop *o;
    if ((st = add_prim(c, pd, op->src[0], smd, src_at, op->dst, dmd, &o, err)) != TW_OK) return st;
    /* the weights once, in the layout the primitive chose */
    const dnnl_memory_desc_t *pwmd;
    if ((st = query_md(pd, dnnl_query_weights_md, 0, &pwmd, err)) != TW_OK) return st;
    size_t wbytes = dnnl_memory_desc_get_size(pwmd);
    void *w = keep_alloc(c, wbytes);
    float *b = keep_alloc(c, (size_t)cv->cout * sizeof(float));
    if (!w || !b) return tw_error_set(err, TW_ERR_NOMEM, "out of memory for %s", op->name);
    c->weight_bytes += wbytes + (size_t)cv->cout * sizeof(float);
    memcpy(b, cv->b, (size_t)cv->cout * sizeof(float));
    dnnl_memory_t um, wm, bm;
    if ((st = keep_mem(c, pwmd, w, &wm, err)) != TW_OK ||
        (st = keep_mem(c, &bmd, b, &bm, err)) != TW_OK ||
        (st = keep_mem(c, &wuser, (void *)w_user, &um, err)) != TW_OK)
        return st;
    dnnl_primitive_desc_t rpd;
    DNNL_TRY(dnnl_reorder_primitive_desc_create(&rpd, &wuser, c->eng, pwmd, c->eng, NULL),
             "weights reorder");
    dnnl_primitive_t r;
    s_ = dnnl_primitive_create(&r, rpd);
    dnnl_primitive_desc_destroy(rpd);
    if (s_ != dnnl_success) return dnnl_fail(err, s_, "weights reorder");
    dnnl_exec_arg_t ra[2] = {{DNNL_ARG_FROM, um}, {DNNL_ARG_TO, wm}};
    s_ = dnnl_primitive_execute(r, c->stream, 2, ra);
    if (s_ == dnnl_success) s_ = dnnl_stream_wait(c->stream);
    dnnl_primitive_destroy(r);
    if (s_ != dnnl_success) return dnnl_fail(err, s_, "weights reorder");
    o->args[o->nargs++] = (dnnl_exec_arg_t){DNNL_ARG_WEIGHTS, wm};
    o->args[o->nargs++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, bm};
    return TW_OK;
}

/* The bytes of op's source with its width padding written out (nChw16c). */
static size_t wpad_bytes(const tw_seg_cpu *c, const tw_seg_op *op)
{
    int ih = c->m.h[op->src[0]];
    return pad16(op->conv.cin) * (size_t)ih * (size_t)(ih + 2 * op->conv.pad) * sizeof(float);
}

/* A dilated conv oneDNN's JIT kernel refuses for its width padding (its
 * register block along a row is narrower than the padding: ASPP rates
 * 12/24 on a 32 px map) reads a copy of its source with the padding
 * columns written out as zeros, padded in H only. Such convs share one
 * buffer (sized for the largest that might need it, c->pad_cap), zeroed
 * before each copy. */
static tw_status build_conv_wpad(tw_seg_cpu *c, const tw_seg_op *op, const dnnl_memory_desc_t *smd,
                                 const dnnl_memory_desc_t *dmd, int ih, int oh, tw_error *err)
{
    const tw_conv *cv = &op->conv;
    int wpad = cv->pad;
    dnnl_memory_desc_t padded, sub;
    dnnl_dims_t d = {1, cv->cin, ih, ih + 2 * wpad}, in = {1, cv->cin, ih, ih},
                offs = {0, 0, 0, wpad};
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&padded, 4, d, dnnl_f32, dnnl_nChw16c), "padded md");
    DNNL_TRY(dnnl_memory_desc_init_submemory(&sub, &padded, in, offs), "padded submemory");
    size_t bytes = dnnl_memory_desc_get_size(&padded);
    if (!c->padbuf) {
        c->padbuf = keep_alloc(c, c->pad_cap);
        if (!c->padbuf) return tw_error_set(err, TW_ERR_NOMEM, "out of memory for %s", op->name);
        c->pad_bytes = c->pad_cap;
    }
    if (bytes > c->pad_cap)
        return tw_error_set(err, TW_ERR_INTERNAL, "seg CPU: %s: padded source of %zu bytes",
                            op->name, bytes);
    xop *z = &c->ops[c->n_ops++];
    memset(z, 0, sizeof *z);
    z->kind = X_ZERO;
    z->in_arg = -1;
    z->dst = c->padbuf;
    z->zero_bytes = bytes;
    tw_status st = add_copy(c, op->src[0], smd, c->padbuf, &sub, err);
    if (st != TW_OK) return st;
    return build_conv_k(c, op, &padded, c->padbuf, wpad, dmd, cv->w, cv->k, cv->pad, op->dil, ih,
                        oh, false, NULL, err);
}

static tw_status build_conv(tw_seg_cpu *c, const tw_seg_op *op, int idx, tw_error *err)
{
    const tw_conv *cv = &op->conv;
    dnnl_memory_desc_t smd, dmd;
    tw_status st;
    if ((st = act_md(c, op->src[0], &smd, err)) != TW_OK ||
        (st = act_md(c, op->dst, &dmd, err)) != TW_OK)
        return st;
    if (op->add >= 0 && c->m.res_copy[idx]) {
        dnnl_memory_desc_t amd;
        if ((st = act_md(c, op->add, &amd, err)) != TW_OK ||
            (st = add_copy(c, op->add, &amd, act_ptr(c, op->dst), &dmd, err)) != TW_OK)
            return st;
    }
    /* A dilated conv whose off-centre taps all land in the padding (DeepLab's
     * ASPP rates 24 and 36 on a map of fewer pixels) is its centre tap: a 1x1
     * conv, which oneDNN's JIT kernels take (they refuse such a dilation, and
     * the reference kernel they leave it to is a hundred times slower). The
     * products are the same; only the zeros are skipped. */
    int ih = c->m.h[op->src[0]], oh = c->m.h[op->dst];
    if (cv->k > 1 && cv->stride == 1 && op->dil >= ih && cv->pad == op->dil * (cv->k / 2)) {
        size_t kk = (size_t)cv->k * (size_t)cv->k, n = (size_t)cv->cout * (size_t)cv->cin;
        float *centre = tw_alloc(TW_MEM_WORKSPACE, n * sizeof(float));
        if (!centre) return tw_error_set(err, TW_ERR_NOMEM, "out of memory for %s", op->name);
        for (size_t i = 0; i < n; i++) centre[i] = cv->w[i * kk + kk / 2];
        st = build_conv_k(c, op, &smd, NULL, 0, &dmd, centre, 1, 0, 1, ih, oh, false, NULL, err);
        tw_free(centre);
        return st;
    }
    bool refused = false;
    bool dilated = op->dil > 1 && op->src[0] != TW_SEG_VAL_IN;
    st = build_conv_k(c, op, &smd, NULL, 0, &dmd, cv->w, cv->k, cv->pad, op->dil, ih, oh, dilated,
                      &refused, err);
    if (st != TW_OK || !refused) return st;
    return build_conv_wpad(c, op, &smd, &dmd, ih, oh, err);
}

static tw_status build_op(tw_seg_cpu *c, const tw_seg_op *op, int idx, tw_error *err)
{
    dnnl_memory_desc_t smd, dmd;
    tw_status st;
    if (op->kind == TW_SEG_OP_CONV) return build_conv(c, op, idx, err);
    if (op->kind == TW_SEG_OP_SOFTMAX) {
        xop *o = &c->ops[c->n_ops++];
        memset(o, 0, sizeof *o);
        o->kind = X_SOFTMAX;
        o->in_arg = -1;
        o->src = act_ptr(c, op->src[0]);
        o->classes = c->m.c[op->src[0]];
        o->h = c->m.h[op->src[0]];
        return TW_OK;
    }
    if (op->kind == TW_SEG_OP_CONCAT) {
        /* the views were written in place; copy the rest to their channels */
        if ((st = act_md(c, op->dst, &dmd, err)) != TW_OK) return st;
        int ch = 0;
        for (int j = 0; j < op->n_src; j++) {
            int v = op->src[j];
            if (c->m.copy[v]) {
                xop *o = &c->ops[c->n_ops++];
                memset(o, 0, sizeof *o);
                o->kind = X_COPY_CH;
                o->in_arg = -1;
                o->src = act_ptr(c, v);
                o->dst = act_ptr(c, op->dst);
                o->classes = c->m.c[v];
                o->h = c->m.h[v];
                o->at = (int)ch;
                o->dst_c = c->m.c[op->dst];
                o->pad = j == op->n_src - 1;
            }
            ch += c->m.c[v];
        }
        return TW_OK;
    }
    if ((st = act_md(c, op->src[0], &smd, err)) != TW_OK ||
        (st = act_md(c, op->dst, &dmd, err)) != TW_OK)
        return st;
    dnnl_primitive_attr_t a = scratch_attr();
    if (!a) return tw_error_set(err, TW_ERR_NOMEM, "oneDNN: attr create failed");
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t s_;
    if (op->kind == TW_SEG_OP_MAXPOOL || op->kind == TW_SEG_OP_AVGPOOL) {
        bool mx = op->kind == TW_SEG_OP_MAXPOOL;
        dnnl_dim_t k = mx ? 3 : c->m.h[op->src[0]], s = mx ? 2 : 1, p = mx ? 1 : 0;
        int ih = c->m.h[op->src[0]], oh = c->m.h[op->dst];
        dnnl_dim_t pr = mx ? (dnnl_dim_t)(oh - 1) * 2 + 3 - ih - 1 : 0;
        dnnl_dims_t strides = {s, s}, kernel = {k, k}, dil = {0, 0}, pl = {p, p}, prr = {pr, pr};
        dnnl_pooling_v2_desc_t pdsc;
        s_ = dnnl_pooling_v2_forward_desc_init(
            &pdsc, dnnl_forward_inference, mx ? dnnl_pooling_max : dnnl_pooling_avg_exclude_padding,
            &smd, &dmd, strides, kernel, dil, pl, prr);
        if (s_ == dnnl_success) s_ = dnnl_primitive_desc_create(&pd, &pdsc, a, c->eng, NULL);
    } else {
        dnnl_resampling_desc_t rd;
        s_ = dnnl_resampling_forward_desc_init(
            &rd, dnnl_forward_inference,
            op->kind == TW_SEG_OP_NEAREST2 ? dnnl_resampling_nearest : dnnl_resampling_linear, NULL,
            &smd, &dmd);
        if (s_ == dnnl_success) s_ = dnnl_primitive_desc_create(&pd, &rd, a, c->eng, NULL);
    }
    dnnl_primitive_attr_destroy(a);
    if (s_ != dnnl_success) return dnnl_fail(err, s_, op->name);
    xop *o;
    return add_prim(c, pd, op->src[0], &smd, NULL, op->dst, &dmd, &o, err);
}

void tw_seg_cpu_destroy(tw_seg_cpu *c)
{
    if (!c) return;
    for (int i = 0; i < c->n_ops; i++)
        if (c->ops[i].prim) dnnl_primitive_destroy(c->ops[i].prim);
    for (int i = 0; i < c->n_pds; i++) dnnl_primitive_desc_destroy(c->pds[i]);
    for (int i = 0; i < c->n_mems; i++) dnnl_memory_destroy(c->mems[i]);
    for (int i = 0; i < c->n_allocs; i++) tw_free(c->allocs[i]);
    tw_free(c->ops);
    tw_free(c->pds);
    tw_free(c->mems);
    tw_free(c->allocs);
    tw_free(c->arena);
    tw_free(c->scratch);
    mplan_free(&c->m);
    if (c->stream) dnnl_stream_destroy(c->stream);
    if (c->eng) dnnl_engine_destroy(c->eng);
    tw_free(c);
}

tw_status tw_seg_cpu_create(const tw_segnet *net, int tile, tw_seg_cpu **out, tw_error *err)
{
    *out = NULL;
    tw_seg_cpu *c = tw_calloc(TW_MEM_OTHER, 1, sizeof *c);
    if (!c) return tw_error_set(err, TW_ERR_NOMEM, "out of memory building %s", net->arch);
    c->net = net;
    c->tile = tile;
    tw_status st = plan_memory(net, tile, &c->m, err);
    if (st != TW_OK) goto fail;
    int cap_ops = 4 * net->n_ops + 8;
    c->ops = tw_calloc(TW_MEM_OTHER, (size_t)cap_ops, sizeof *c->ops);
    c->pds = tw_calloc(TW_MEM_OTHER, (size_t)cap_ops, sizeof *c->pds);
    c->cap_mems = 8 * cap_ops;
    c->mems = tw_calloc(TW_MEM_OTHER, (size_t)c->cap_mems, sizeof *c->mems);
    c->cap_allocs = 3 * net->n_ops + 2;
    c->allocs = tw_calloc(TW_MEM_OTHER, (size_t)c->cap_allocs, sizeof *c->allocs);
    c->arena = tw_alloc(TW_MEM_WORKSPACE, c->m.arena ? c->m.arena : 64);
    if (!c->ops || !c->pds || !c->mems || !c->allocs || !c->arena) {
        st = tw_error_set(err, TW_ERR_NOMEM, "out of memory building %s", net->arch);
        goto fail;
    }
    if (dnnl_engine_create(&c->eng, dnnl_cpu, 0) != dnnl_success ||
        dnnl_stream_create(&c->stream, c->eng, dnnl_stream_default_flags) != dnnl_success) {
        st = tw_error_set(err, TW_ERR_INTERNAL, "oneDNN: CPU engine create failed");
        goto fail;
    }
    for (int i = 0; i < net->n_ops; i++) {
        const tw_seg_op *op = &net->ops[i];
        if (op->kind == TW_SEG_OP_CONV && op->dil > 1 && op->dil < c->m.h[op->src[0]] &&
            wpad_bytes(c, op) > c->pad_cap)
            c->pad_cap = wpad_bytes(c, op);
    }
    for (int i = 0; i < net->n_ops; i++)
        if ((st = build_op(c, &net->ops[i], i, err)) != TW_OK) goto fail;
    /* one scratchpad for every primitive (they run one at a time) */
    for (int i = 0; i < c->n_pds; i++) {
        const dnnl_memory_desc_t *sp =
            dnnl_primitive_desc_query_md(c->pds[i], dnnl_query_scratchpad_md, 0);
        size_t b = sp ? dnnl_memory_desc_get_size(sp) : 0;
        if (b > c->scratch_bytes) c->scratch_bytes = b;
    }
    if (c->scratch_bytes) {
        c->scratch = tw_alloc(TW_MEM_WORKSPACE, c->scratch_bytes);
        if (!c->scratch) {
            st = tw_error_set(err, TW_ERR_NOMEM, "out of memory building %s", net->arch);
            goto fail;
        }
    }
    for (int i = 0, p = 0; i < c->n_ops; i++) {
        xop *o = &c->ops[i];
        if (o->kind != X_PRIM) continue;
        const dnnl_memory_desc_t *sp =
            dnnl_primitive_desc_query_md(c->pds[p++], dnnl_query_scratchpad_md, 0);
        if (sp && dnnl_memory_desc_get_size(sp) > 0) {
            dnnl_memory_t sm;
            if ((st = keep_mem(c, sp, c->scratch, &sm, err)) != TW_OK) goto fail;
            o->args[o->nargs++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, sm};
        }
    }
    *out = c;
    return TW_OK;
fail:
    tw_seg_cpu_destroy(c);
    return st;
}

size_t tw_seg_cpu_bytes(const tw_seg_cpu *c)
{
    return c->m.arena + c->scratch_bytes + c->weight_bytes + c->pad_bytes;
}

/* Softmax over channels of a blocked [classes/16][h][h][16] map into
 * [classes][h][h]; the sum in double, the maximum subtracted. */
static void softmax_blocked(const float *src, int classes, int h, float *dst)
{
    size_t px = (size_t)h * (size_t)h;
    for (size_t p = 0; p < px; p++) {
        float mx = -INFINITY;
        for (int k = 0; k < classes; k++) {
            float v = src[((size_t)(k / BLK) * px + p) * BLK + (size_t)(k % BLK)];
            if (v > mx) mx = v;
        }
        double sum = 0.0;
        for (int k = 0; k < classes; k++) {
            float e = expf(src[((size_t)(k / BLK) * px + p) * BLK + (size_t)(k % BLK)] - mx);
            dst[(size_t)k * px + p] = e;
            sum += e;
        }
        float inv = (float)(1.0 / sum);
        for (int k = 0; k < classes; k++) dst[(size_t)k * px + p] *= inv;
    }
}

/* o's input into its channels of the concatenation, both nChw16c. */
static void copy_channels(const xop *o)
{
    size_t px = (size_t)o->h * (size_t)o->h;
    for (int k = 0; k < o->classes; k++) {
        const float *s = o->src + (size_t)(k / BLK) * px * BLK + (size_t)(k % BLK);
        int t = o->at + k;
        float *d = o->dst + (size_t)(t / BLK) * px * BLK + (size_t)(t % BLK);
        for (size_t p = 0; p < px; p++) d[p * BLK] = s[p * BLK];
    }
    /* the block's padding channels are read by the next conv: zeros */
    for (int t = o->dst_c; o->pad && t % BLK != 0; t++) {
        float *d = o->dst + (size_t)(t / BLK) * px * BLK + (size_t)(t % BLK);
        for (size_t p = 0; p < px; p++) d[p * BLK] = 0.0f;
    }
}

tw_status tw_seg_cpu_run(tw_seg_cpu *c, const float *in, int n, float *probs, tw_error *err)
{
    size_t px = (size_t)c->tile * (size_t)c->tile;
    for (int t = 0; t < n; t++) {
        const float *tin = in + (size_t)t * px * (size_t)c->net->in_bands;
        float *tout = probs + (size_t)t * px * (size_t)c->net->n_classes;
        for (int i = 0; i < c->n_ops; i++) {
            xop *o = &c->ops[i];
            if (o->kind == X_ZERO) {
                DNNL_TRY(dnnl_stream_wait(c->stream), "stream wait");
                memset(o->dst, 0, o->zero_bytes);
                continue;
            }
            if (o->kind == X_COPY_CH) {
                DNNL_TRY(dnnl_stream_wait(c->stream), "stream wait");
                copy_channels(o);
                continue;
            }
            if (o->kind == X_SOFTMAX) {
                DNNL_TRY(dnnl_stream_wait(c->stream), "stream wait");
                softmax_blocked(o->src, o->classes, o->h, tout);
                continue;
            }
            if (o->in_arg >= 0)
                DNNL_TRY(dnnl_memory_set_data_handle(o->args[o->in_arg].memory, (void *)tin),
                         "input handle");
            DNNL_TRY(dnnl_primitive_execute(o->prim, c->stream, o->nargs, o->args), "execute");
        }
        DNNL_TRY(dnnl_stream_wait(c->stream), "stream wait");
    }
    return TW_OK;
}

void tw_seg_cpu_copies(const tw_seg_cpu *c, int *concat, int *residual)
{
    *concat = *residual = 0;
    for (int v = 0; v < c->net->n_values; v++) *concat += c->m.copy[v];
    for (int i = 0; i < c->net->n_ops; i++) *residual += c->m.res_copy[i];
}

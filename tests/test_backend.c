/* test_backend.c - the backend registry (model/backend.c): which device
 * strings it accepts, the message and status of each refusal (config error
 * for a string that is no device, device error for one this machine or
 * build does not have), and that what it returns is a complete backend. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "model/backend.h"

static tw_status create(const char *device, tw_backend *be, tw_error *err)
{
    tw_error_init(err);
    return tw_backend_create(device, 1, true, be, err);
}

/* The first member a backend's vtable lacks (backend.h: every member but
 * calibrate, infer_begin/infer_end and host_alloc/host_free is required;
 * those come in pairs), or NULL when complete. */
static const char *missing_member(const struct tw_backend_i *i)
{
    if (!i) return "vtable";
    if (!i->name || !i->name[0]) return "name";
    if (!i->workspace_bytes) return "workspace_bytes";
    if (!i->auto_batch) return "auto_batch";
    if (!i->supports) return "supports";
    if (!i->reserve) return "reserve";
    if (!i->consumes_weights) return "consumes_weights";
    if (!i->infer) return "infer";
    if (!i->infer_begin != !i->infer_end) return i->infer_begin ? "infer_end" : "infer_begin";
    if (!i->wants_raw) return "wants_raw";
    if (!i->host_alloc != !i->host_free) return i->host_alloc ? "host_free" : "host_alloc";
    if (!i->get_stats) return "get_stats";
    if (!i->destroy) return "destroy";
    return NULL;
}

static void assert_complete(const tw_backend *be)
{
    const char *missing = missing_member(be->i);
    if (missing) fail_msg("backend %s: no %s", be->i ? be->i->name : "?", missing);
    assert_true(be->i->auto_batch(be->ctx, NULL, 64) >= 1);
}

static void test_cpu_and_auto(void **state)
{
    (void)state;
    tw_backend be;
    tw_error err;
    assert_int_equal(create("cpu", &be, &err), TW_OK);
    assert_complete(&be);
    assert_string_equal(be.i->name, "cpu");
    assert_false(be.i->wants_raw(be.ctx)); /* the CPU reads normalized floats */
    tw_backend_stats st;
    memset(&st, 0xff, sizeof st);
    be.i->get_stats(be.ctx, &st);
    assert_int_equal(st.batch_halvings, 0);
    assert_int_equal(st.device_peak_bytes, 0);
    tw_backend_destroy(&be);
    assert_null(be.i);       /* destroy clears the handle ... */
    tw_backend_destroy(&be); /* ... so a second destroy is harmless */
    tw_backend_destroy(NULL);

    /* auto: CUDA when built and present, else the CPU; never an error. */
    assert_int_equal(create("auto", &be, &err), TW_OK);
    assert_complete(&be);
    assert_true(strcmp(be.i->name, "cpu") == 0 || strcmp(be.i->name, "cuda") == 0);
    tw_backend_destroy(&be);
}

static void test_not_a_device(void **state)
{
    (void)state;
    static const char *bad[] = {"gpu",     "CPU",       "",        "cuda:", "cuda:x",
                                "cuda:-1", "cuda:1025", "cuda:1 ", "cuda0", "auto "};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tw_backend be;
        tw_error err;
        memset(&be, 0x5a, sizeof be);
        tw_status st = create(bad[i], &be, &err);
        if (st != TW_ERR_CONFIG || !strstr(err.msg, "is not auto, cpu, cuda or cuda:N"))
            fail_msg("'%s': status %d, '%s'", bad[i], st, err.msg);
        char quoted[64];
        snprintf(quoted, sizeof quoted, "'%s'", bad[i]);
        assert_non_null(strstr(err.msg, quoted));
        assert_null(be.i); /* nothing to destroy */
        assert_int_equal(tw_status_exit_code(st), 2);
    }
}

/* cuda:1000 is a well-formed device that no machine has: a device error
 * (exit 4) naming it, whether or not CUDA was built in. */
static void test_missing_gpu(void **state)
{
    (void)state;
    tw_backend be;
    tw_error err;
    tw_status st = create("cuda:1000", &be, &err);
    assert_int_equal(st, TW_ERR_DEVICE);
    assert_non_null(strstr(err.msg, "runtime.device cuda:1000"));
    assert_int_equal(tw_status_exit_code(st), 4);
    /* "cuda" works only where a GPU is; elsewhere the same kind of error. */
    st = create("cuda", &be, &err);
    if (st == TW_OK) {
        assert_complete(&be);
        assert_string_equal(be.i->name, "cuda");
        assert_true(be.i->wants_raw(be.ctx));
        tw_backend_destroy(&be);
    } else {
        assert_int_equal(st, TW_ERR_DEVICE);
        assert_non_null(strstr(err.msg, "runtime.device cuda:"));
    }
}

static void drop_workspace_bytes(struct tw_backend_i *i)
{
    i->workspace_bytes = NULL;
}
static void drop_auto_batch(struct tw_backend_i *i)
{
    i->auto_batch = NULL;
}
static void drop_supports(struct tw_backend_i *i)
{
    i->supports = NULL;
}
static void drop_reserve(struct tw_backend_i *i)
{
    i->reserve = NULL;
}
static void drop_consumes_weights(struct tw_backend_i *i)
{
    i->consumes_weights = NULL;
}
static void drop_infer(struct tw_backend_i *i)
{
    i->infer = NULL;
}
static void drop_wants_raw(struct tw_backend_i *i)
{
    i->wants_raw = NULL;
}
static void drop_get_stats(struct tw_backend_i *i)
{
    i->get_stats = NULL;
}
static void drop_destroy(struct tw_backend_i *i)
{
    i->destroy = NULL;
}
static void drop_name(struct tw_backend_i *i)
{
    i->name = NULL;
}

/* A backend registered with a vtable that lacks a member is caught, for
 * every member (assert_complete checked none of supports, nor the pairs,
 * before: an incomplete vtable passed). */
static tw_backend g_cpu;
static struct tw_backend_i g_partial;
static tw_status partial_create(const tw_backend_params *params, tw_backend *out, tw_error *err)
{
    (void)params;
    (void)err;
    out->i = &g_partial;
    out->ctx = g_cpu.ctx;
    return TW_OK;
}

static tw_status dummy_begin(void *ctx, const tw_infer_batch *b, int lane, tw_error *err)
{
    (void)ctx, (void)b, (void)lane, (void)err;
    return TW_OK;
}
static void dummy_free(void *ctx, void *p)
{
    (void)ctx, (void)p;
}

static void test_incomplete_vtable(void **state)
{
    (void)state;
    tw_backend be;
    tw_error err;
    assert_int_equal(create("cpu", &be, &err), TW_OK);
    g_cpu = be;
    assert_null(missing_member(be.i));
    const struct tw_backend_i full = *be.i;
    static const struct {
        const char *member;
        void (*drop)(struct tw_backend_i *);
    } cases[] = {
#define DROP(m) {#m, drop_##m}
        DROP(workspace_bytes),  DROP(auto_batch), DROP(supports),  DROP(reserve),
        DROP(consumes_weights), DROP(infer),      DROP(wants_raw), DROP(get_stats),
        DROP(destroy),          DROP(name),
#undef DROP
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        g_partial = full;
        cases[k].drop(&g_partial);
        assert_int_equal(tw_backend_create_ex("partial", &(tw_backend_params){0}, &be, &err),
                         TW_OK);
        const char *m = missing_member(be.i);
        if (!m || strcmp(m, cases[k].member) != 0)
            fail_msg("no %s: found %s", cases[k].member, m ? m : "nothing missing");
    }
    /* half a pair */
    g_partial = full;
    g_partial.infer_begin = g_partial.infer_end = NULL;
    assert_null(missing_member(&g_partial)); /* neither: infer only */
    g_partial.infer_begin = dummy_begin;
    assert_string_equal(missing_member(&g_partial), "infer_end");
    g_partial = full;
    g_partial.host_alloc = NULL;
    g_partial.host_free = dummy_free;
    assert_string_equal(missing_member(&g_partial), "host_alloc");
    tw_backend_destroy(&g_cpu);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_and_auto),
        cmocka_unit_test(test_not_a_device),
        cmocka_unit_test(test_missing_gpu),
        cmocka_unit_test(test_incomplete_vtable),
    };
    tw_error err;
    tw_error_init(&err);
    if (tw_backend_register("partial", partial_create, &err) != TW_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    return cmocka_run_group_tests(tests, NULL, NULL);
}

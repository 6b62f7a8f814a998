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

static void assert_complete(const tw_backend *be)
{
    assert_non_null(be->i);
    assert_non_null(be->i->name);
    assert_non_null(be->i->workspace_bytes);
    assert_non_null(be->i->auto_batch);
    assert_non_null(be->i->reserve);
    assert_non_null(be->i->consumes_weights);
    assert_non_null(be->i->infer);
    assert_non_null(be->i->wants_raw);
    assert_non_null(be->i->get_stats);
    assert_non_null(be->i->destroy);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_and_auto),
        cmocka_unit_test(test_not_a_device),
        cmocka_unit_test(test_missing_gpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

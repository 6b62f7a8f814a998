/* fuzz_manifest.c - libFuzzer harness for the shard/merge manifest reader
 * (pipeline/store/manifest.c).
 *
 * The input is a manifest file's bytes. Any status is fine; a crash, a
 * sanitizer report or a broken contract is not:
 * - an error leaves one non-empty, NUL-terminated, single-line message that
 *   names the file;
 * - an accepted manifest formats back to text that is accepted again and
 *   formats to the same bytes (what merge reads is what the shard meant).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/store/manifest.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void bad_message(tw_status st, const tw_error *err)
{
    size_t n = strnlen(err->msg, sizeof err->msg);
    if (n == 0 || n == sizeof err->msg || memchr(err->msg, '\n', n) ||
        strncmp(err->msg, "fuzz.manifest", 13) != 0) {
        fprintf(stderr, "bad error message for status %d: '%.*s'\n", (int)st, (int)n, err->msg);
        __builtin_trap();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static tw_manifest a, b; /* large: keep them off the fuzzer's stack */
    tw_error err;
    tw_error_init(&err);
    /* No terminator is promised: ASan catches any read past size. */
    char *text = malloc(size ? size : 1);
    if (!text) return 0;
    memcpy(text, data, size);
    tw_status st = tw_manifest_parse(text, size, "fuzz.manifest", &a, &err);
    free(text);
    if (st != TW_OK) {
        bad_message(st, &err);
        return 0;
    }
    char *t1 = NULL, *t2 = NULL;
    size_t n1 = 0, n2 = 0;
    if (tw_manifest_format(&a, &t1, &n1, &err) != TW_OK) __builtin_trap();
    tw_error_init(&err);
    if (tw_manifest_parse(t1, n1, "fuzz.manifest", &b, &err) != TW_OK) {
        fprintf(stderr, "formatted manifest refused: %s\n", err.msg);
        __builtin_trap();
    }
    if (tw_manifest_format(&b, &t2, &n2, &err) != TW_OK) __builtin_trap();
    if (n1 != n2 || memcmp(t1, t2, n1) != 0) {
        fprintf(stderr, "round trip differs:\n%s\n---\n%s\n", t1, t2);
        __builtin_trap();
    }
    free(t1);
    free(t2);
    return 0;
}

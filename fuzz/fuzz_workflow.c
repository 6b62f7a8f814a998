/* fuzz_workflow.c - libFuzzer harness for the YAML workflow parser.
 *
 * The input is a workflow text. Half of the time the last line is also used as
 * a --set override, so that the override path (key lookup, YAML value parse)
 * sees hostile text too. Any status is fine; a crash, a sanitizer report or a
 * message without a key or line is not: an error must leave a non-empty,
 * NUL-terminated, single-line message.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/workflow.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static tw_run_params params; /* large: keep it off the fuzzer's stack */
    tw_error err;
    tw_error_init(&err);

    /* The parser is given (text, len): no terminator is promised, so none is
     * added; ASan then catches any read past len. */
    char *text = malloc(size ? size : 1);
    if (!text) return 0;
    memcpy(text, data, size);

    const char *sets[1];
    int n_sets = 0;
    char *set_copy = NULL;
    const void *nl = size ? memrchr(data, '\n', size) : NULL;
    if (nl && (data[0] & 1)) {
        size_t off = (size_t)((const uint8_t *)nl - data) + 1;
        set_copy = strndup((const char *)data + off, size - off);
        if (set_copy) {
            sets[0] = set_copy;
            n_sets = 1;
        }
    }

    tw_status st = tw_workflow_parse("fuzz.yaml", text, size, sets, n_sets, &params, &err);
    if (st != TW_OK) {
        size_t n = strnlen(err.msg, sizeof err.msg);
        if (n == 0 || n == sizeof err.msg || memchr(err.msg, '\n', n)) {
            fprintf(stderr, "bad error message for status %d: '%.*s'\n", (int)st, (int)n, err.msg);
            __builtin_trap();
        }
    }
    free(set_copy);
    free(text);
    return 0;
}

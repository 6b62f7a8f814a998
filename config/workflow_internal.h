/* workflow_internal.h - what the three files of the workflow parser share
 * (config/): workflow.c walks the document and runs the checks of more than
 * one key, workflow_values.c reads one YAML value (scalars, lists) and
 * writes the messages about it, workflow_setters.c holds the setter of
 * each key. Private to config/ (scripts/check_layers.sh). */
#ifndef TW_CONFIG_WORKFLOW_INTERNAL_H
#define TW_CONFIG_WORKFLOW_INTERNAL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

#include <yaml.h>

#include "config/workflow.h"
#include "core/keys.h"

#define WF_MEMORY_MIN ((size_t)16 << 20)
#define WF_SHOW_MAX 40

/* Where a key's current value came from, for messages about it. */
typedef struct wf_origin {
    int line;    /* 1-based line in the file; 0: not given */
    bool by_set; /* given (last) by --set */
} wf_origin;

typedef struct wf_ctx {
    const char *name; /* file name for messages */
    tw_error *err;
    yaml_document_t *doc; /* the document the current node belongs to */
    bool in_set;          /* the current value comes from --set */
    int key;              /* the key being set (tw_key_id) */
    wf_origin origin[TW_KEY_COUNT];
} wf_ctx;

typedef tw_status (*wf_setter)(wf_ctx *c, const yaml_node_t *v, tw_run_params *p);

/* Copy at most WF_SHOW_MAX bytes of user text into buf for a message, with
 * control bytes replaced so that the message stays one readable line. */
const char *wf_show(const char *s, size_t len, char *buf, size_t cap);

/* The 1-based line of n, 0 for none. */
int wf_node_line(const yaml_node_t *n);

/* Record "WHERE: KEY: what" where WHERE is "file:line", "file" or "--set". */
tw_status wf_fail_v(const wf_ctx *c, bool by_set, int line, const char *key, const char *fmt,
                    va_list ap);

/* An error about the value of the key being set, at node n. */
__attribute__((format(printf, 3, 4))) tw_status wf_fail(const wf_ctx *c, const yaml_node_t *n,
                                                        const char *fmt, ...);

/* YAML's null: no node, "", "~" or "null" written plain. */
bool wf_is_null(const yaml_node_t *n);

/* "a list", "a mapping", "nothing" or 'text', for "expected X, got Y". */
const char *wf_describe(const yaml_node_t *n, char *buf, size_t cap);

/* The text of a non-null scalar, or an error "expected <what>, got ...". */
tw_status wf_get_text(wf_ctx *c, const yaml_node_t *n, const char *what, const char **s,
                      size_t *len);

/* A decimal integer with nothing else around it. */
bool wf_parse_int(const char *s, long long *v);

typedef enum { NUM_OK = 0, NUM_BAD, NUM_RANGE } wf_num;

/* A finite decimal number (no hex, no inf/nan) with nothing around it;
 * NUM_RANGE for a well-formed one that a double cannot hold ("1e400"). */
wf_num wf_parse_number(const char *s, double *v);

/* The message for a failed wf_parse_number. */
tw_status wf_fail_number(wf_ctx *c, const yaml_node_t *n, wf_num r, const char *what, const char *s,
                         size_t len);

/* An integer lo..hi. */
tw_status wf_get_int(wf_ctx *c, const yaml_node_t *n, long long lo, long long hi, int *out);

/* "auto" (-> 0) or an integer lo..hi. */
tw_status wf_get_auto_int(wf_ctx *c, const yaml_node_t *n, long long lo, long long hi, int *out);

/* A finite number. */
tw_status wf_get_number(wf_ctx *c, const yaml_node_t *n, double *out);

/* One of choices[] (case-insensitive); *idx is its index. */
tw_status wf_get_choice(wf_ctx *c, const yaml_node_t *n, const char *const *choices, int n_choices,
                        int *idx);

/* A non-empty string that fits dst[cap] with its terminator. */
tw_status wf_get_string(wf_ctx *c, const yaml_node_t *n, const char *what, char *dst, size_t cap);

/* Lists: a sequence of scalars, or one scalar standing for a list of one. */
int wf_list_len(const yaml_node_t *n);
const yaml_node_t *wf_list_item(const wf_ctx *c, const yaml_node_t *n, int i);

/* Checks that n is a list of 1..max items (or a single scalar). */
tw_status wf_check_list(wf_ctx *c, const yaml_node_t *n, const char *what, int max, int *count);

/* One setter per key of the table (core/keys.h), in workflow_setters.c;
 * tests/test_keys.c checks that none is missing through
 * tw_workflow_key_parsed. */
extern const wf_setter wf_setters[TW_KEY_COUNT];

#endif

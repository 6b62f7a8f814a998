/* testutil.h - helpers shared by the cmocka tests. */
#ifndef TW_TESTUTIL_H
#define TW_TESTUTIL_H

#include <stdbool.h>
#include <stddef.h>

/* Directory of generated fixtures ($TW_FIXTURES), or NULL. */
const char *tw_test_fixtures(void);
/* Path join into a static buffer rotating over 8 slots. */
const char *tw_test_path(const char *dir, const char *name);
/* ../shared/data/rasters directory if present, else NULL (tests then skip()). */
const char *tw_test_shared_rasters(void);
/* Read a whole file of float32 values; returns count or -1. *out malloc'ed. */
long tw_test_read_f32(const char *path, float **out);
/* A whole file, NUL-terminated (*len: its bytes; may be NULL); NULL when it
 * cannot be read. malloc'ed. */
char *tw_test_read_file(const char *path, size_t *len);
/* A fresh empty temporary directory (mkdtemp under $TMPDIR or /tmp). */
const char *tw_test_tmpdir(void);
bool tw_test_file_exists(const char *path);
/* The fixture `name` in $TW_FIXTURES, or NULL when it (or the folder) is
 * absent. */
const char *tw_test_fixture(const char *name);
/* const char *var = the fixture `name`, else the test is skipped with a
 * message (cmocka's skip and print_message, in the test file's scope). */
#define TW_NEED_FIXTURE(var, name)                                                                 \
    const char *var = tw_test_fixture(name);                                                       \
    if (!var) {                                                                                    \
        print_message("fixture %s missing ($TW_FIXTURES)\n", name);                                \
        skip();                                                                                    \
    }
/* The model file at path, loaded (io/modelfile/model_file.h); NULL, the message on
 * stderr, when it cannot be. Free it with tw_model_file_destroy. */
struct tw_model_file *tw_test_load_model(const char *path);

#endif

/* names.c - see names.h */
#include "pipeline/store/names.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/keys.h"
#include "io/url.h"

/* The name of the folder holding path: a URL's segment before the file,
 * or (a bare file name) the current directory's. */
static void parent_name(const char *path, char *out, size_t size)
{
    char buf[TW_PATH_MAX];
    snprintf(buf, sizeof buf, "%s", path);
    if (tw_url_is_remote(buf)) buf[strcspn(buf, "?#")] = '\0';
    size_t n = strlen(buf);
    while (n > 1 && buf[n - 1] == '/') buf[--n] = '\0';
    char *slash = strrchr(buf, '/');
    if (slash) {
        *slash = '\0';
        n = strlen(buf);
        while (n > 1 && buf[n - 1] == '/') buf[--n] = '\0';
    }
    char cwd[TW_PATH_MAX];
    const char *dir = slash && buf[0] ? buf : getcwd(cwd, sizeof cwd);
    const char *base = dir ? strrchr(dir, '/') : NULL;
    base = base ? base + 1 : (dir ? dir : "");
    snprintf(out, size, "%s", *base ? base : "root");
}

tw_status tw_output_name(const tw_run_params *p, int i, char *out, size_t size, tw_error *err)
{
    char stem[256], parent[256], why[300];
    tw_url_stem(p->input.paths[i], stem, sizeof stem);
    parent_name(p->input.paths[i], parent, sizeof parent);
    if (tw_output_name_expand(p->output.name, stem, parent, i + 1, out, size, why, sizeof why) !=
        0) {
        char shown[TW_URL_SHOWN_MAX];
        tw_url_redact(p->input.paths[i], shown, sizeof shown);
        return tw_error_set(err, TW_ERR_CONFIG, "output.name: %s for input %s", why, shown);
    }
    return TW_OK;
}

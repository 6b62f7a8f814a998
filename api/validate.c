/* validate.c - what `tilewise validate` prints: the plan (tw_validate) and
 * the advice every run also gives (pipeline/advice.h), as text (validate.h). */
#include "api/validate.h"

#include <stdio.h>
#include <stdlib.h>

#include <gdal.h>

#include "pipeline/advice.h"
#include "pipeline/run.h"

tw_status tw_validate_report(const tw_run_params *p, FILE *out, int *warnings, tw_error *err)
{
    int n = 0;
    /* tw_validate sets GDAL's block cache to the run's budget for the
     * advice's reads; the caller's (process-wide) setting comes back after. */
    GIntBig cache = GDALGetCacheMax64();
    tw_status st = tw_validate(p, out, err);
    tw_resolved m;
    tw_error e;
    tw_error_init(&e);
    tw_advice *a = st == TW_OK ? malloc(sizeof *a) : NULL;
    if (a && tw_resolve(p, &m, &e) == TW_OK) { /* tw_validate already accepted it */
        tw_advice_collect(p, &m, a);
        for (int i = 0; i < a->n; i++)
            fprintf(out, "%-9s %s\n", a->items[i].warning ? "warning" : a->items[i].code,
                    a->items[i].text);
        n = a->n_warnings;
    }
    free(a);
    if (st == TW_OK) fprintf(out, "advice    %d warning%s\n", n, n == 1 ? "" : "s");
    GDALSetCacheMax64(cache);
    if (warnings) *warnings = n;
    return st;
}

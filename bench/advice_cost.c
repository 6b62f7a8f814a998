/* advice_cost.c - what the advice before the first tile costs (issue 29.1).
 *
 *   advice_cost WORKFLOW.yaml [REPEAT]
 *
 * Loads the workflow and the model as a run does, then times
 * tw_advice_collect (pipeline/run/advice.h: the raster headers, approximate band
 * statistics and up to 128 output cells' tiles) REPEAT times (default 3),
 * printing each time and the warnings, so that bench/RESULTS.md can set it
 * against the run's own time. The first repeat reads from disk (or the page
 * cache); later ones may find GDAL's block cache warm.
 */
#include <stdio.h>
#include <stdlib.h>

#include "config/workflow.h"
#include "core/clock.h"
#include "pipeline/run/advice.h"
#include "pipeline/run/run.h"

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: advice_cost WORKFLOW.yaml [REPEAT]\n");
        return 2;
    }
    int repeat = argc > 2 ? atoi(argv[2]) : 3;
    tw_run_params *p = malloc(sizeof *p);
    tw_advice *a = malloc(sizeof *a);
    tw_resolved m;
    tw_error err;
    tw_error_init(&err);
    if (!p || !a || tw_workflow_load(argv[1], NULL, 0, p, &err) != TW_OK ||
        tw_resolve(p, &m, &err) != TW_OK) {
        fprintf(stderr, "advice_cost: %s\n", err.msg);
        return 1;
    }
    for (int r = 0; r < repeat; r++) {
        double t0 = tw_clock_now();
        tw_advice_collect(p, &m, a);
        printf("advice: %.3f s, %d warnings, %d notes\n", tw_clock_now() - t0, a->n_warnings,
               a->n - a->n_warnings);
    }
    for (int i = 0; i < a->n; i++)
        printf("  %-9s %s\n", a->items[i].warning ? "warning" : a->items[i].code, a->items[i].text);
    free(a);
    free(p);
    return 0;
}

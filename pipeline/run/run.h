/* run.h - the run driver: a workflow's params in, output rasters and a report out.
 *
 * tw_run loads the model once, checks every input against it before any
 * work, fixes the memory budget, then for each input runs four stage workers
 * joined by bounded queues of preallocated batch slots:
 *
 *   read (GDAL windows, nodata mask) -> normalize (OpenMP) -> infer (backend)
 *        -> stitch + write (strip buffer, output rasters, tile table)
 *
 * Slots circulate through a free queue, so nothing is allocated once the
 * first batch is under way. Errors stop every stage; outputs of an input that
 * did not finish are removed (they only ever exist under temporary names).
 *
 * The rest of what the run drivers offer has its own header: validate.h,
 * merge.h; the result and run.json are pipeline/report/report.h's.
 */
#ifndef TW_RUN_H
#define TW_RUN_H

#include "core/error.h"
#include "core/params.h"
#include "io/modelfile/model_file.h"
#include "model/backend.h"
#include "model/resnet.h"
#include "model/segnet.h"
#include "pipeline/report/report.h"
#include "pipeline/resolved.h"
#include "pipeline/result.h"

/* Run the workflow. *result (may be NULL to not ask) receives what happened,
 * also on failure (as far as it got); free it with tw_run_result_destroy.
 * Returns TW_CANCELLED when stopped through hooks (progress returned 0 or
 * *stop was set). */
tw_status tw_run(const tw_run_params *p, const tw_run_hooks *hooks, tw_run_result **result,
                 tw_error *err);

/* Load the model file and resolve what the run would use (bundle values,
 * config overrides, defaults: bands, scale, mean, std, classes, tile) into
 * *m, with the same checks and messages as tw_run; nothing else is opened.
 * For the CLI's extra validation. */
tw_status tw_resolve(const tw_run_params *p, tw_resolved *m, tw_error *err);
/* The same resolution for a model file the caller has loaded and built (the
 * public API keeps the net to classify tiles in memory): a classifier (net)
 * or a segmentation model (seg), the other NULL. Borrows mf, net and seg. */
tw_status tw_resolve_loaded(const tw_run_params *p, const tw_model_file *mf, const tw_resnet *net,
                            const tw_segnet *seg, tw_resolved *m, tw_error *err);
/* Build the network mf holds: a segmentation model (model.arch names one,
 * or the tensors are one: tw_segnet_detect) into *seg, else a classifier
 * into *net; the other stays NULL. The errors of tw_segnet_create and
 * tw_resnet_create. */
tw_status tw_load_net(const tw_run_params *p, const tw_model_file *mf, tw_resnet **net,
                      tw_segnet **seg, tw_error *err);

/* Reader workers a run uses: runtime.readers, or for auto: 1 with a backend
 * that normalizes on the host (the CPU: inference owns the cores), else the
 * cores less two (infer, write), 1..8. Cores: those the process may run on. */
int tw_run_readers(const tw_run_params *p, const tw_backend *be);

/* OpenMP threads of the normalize stage: with a backend that computes on
 * the host, the cores its runtime.threads leave, at least 1 (1: no team of
 * its own); else 0 (OpenMP's default). */
int tw_run_normalize_threads(const tw_run_params *p, const tw_backend *be);

#endif

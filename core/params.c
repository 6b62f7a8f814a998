/* params.c - defaults for tw_run_params (see params.h) */
#include "core/params.h"

#include <math.h>
#include <string.h>

const char *const tw_edge_names[3] = {"pad", "shift", "skip"};
const char *const tw_blend_names[3] = {"mean", "linear", "cosine"};
const char *const tw_prob_type_names[2] = {"float32", "uint8"};
const char *const tw_format_names[2] = {"GTiff", "COG"};
const char *const tw_emb_type_names[3] = {"float32", "float16", "int8"};
const char *const tw_vector_format_names[2] = {"gpkg", "fgb"};
const char *const tw_stem_names[3] = {"auto", "standard", "small"};

tw_run_params tw_run_default_params(void)
{
    tw_run_params p;
    memset(&p, 0, sizeof p);
    p.input.scale = NAN;
    p.input.nodata_auto = true;
    p.input.on_error = TW_ON_ERROR_FAIL;
    p.input.tiff_direct = true;
    p.runtime.cpu_winograd = 1;
    /* GDAL waits 0.5 s, then 2-2.5x longer after each retry: 8 retries span
     * 2-8 minutes of outage before a tile gives up. */
    p.input.retries = 8;
    p.input.retry_delay = 0.5;
    /* A request that receives nothing for 5 s fails and is retried like a
     * dropped connection: a silent server never hangs a run, and a stop
     * (SIGTERM) waits at most this long for a request under way. */
    p.input.timeout = 4.0;
    p.runtime.cpu_gemm = -1;
    p.runtime.cpu_nhwc = -1;
    p.tiling.edge = TW_EDGE_PAD;
    p.tiling.max_nodata_fraction = 0.5;
    p.tiling.blend = TW_BLEND_DEFAULT;
    p.tiling.margin = 0;
    strcpy(p.runtime.device, "auto");
    p.runtime.precision = TW_PREC_FP32;
    p.runtime.memory = (size_t)2 << 30;
    strcpy(p.output.dir, "out");
    strcpy(p.output.name, "{stem}");
    p.output.products = TW_PRODUCT_CLASS | TW_PRODUCT_PROB;
    p.output.prob_type = TW_PROB_FLOAT32;
    p.output.format = TW_FORMAT_GTIFF;
    p.shard_index = 0;
    p.shard_count = 1;
    return p;
}

const char *tw_precision_name(tw_precision p)
{
    static const char *names[] = {"fp32", "tf32", "fp16", "bf16", "int8"};
    return (unsigned)p < sizeof names / sizeof names[0] ? names[p] : "?";
}

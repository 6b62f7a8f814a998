/* params.h - the resolved parameters of one run.
 *
 * workflows/workflow.c fills a tw_run_params from YAML and --set overrides;
 * library code only ever reads these structs, never YAML or the environment.
 * Fixed-size arrays keep the structs self-contained (no ownership questions);
 * the limits below are checked by the parser with a clear message.
 * "Unset" values (0, NaN, empty string) mean: take it from the model bundle,
 * else the documented default.
 */
#ifndef TW_PARAMS_H
#define TW_PARAMS_H

#include <stdbool.h>
#include <stddef.h>

#include "core/products.h"

#define TW_PATH_MAX 1024
#define TW_MAX_INPUTS 64
#define TW_MAX_BANDS 64
#define TW_MAX_CLASSES 255 /* class map is Byte with 255 as nodata */
#define TW_NAME_MAX 64
#define TW_MAX_CREATION_OPTIONS 16

typedef enum { TW_EDGE_PAD = 0, TW_EDGE_SHIFT, TW_EDGE_SKIP } tw_edge_mode;
typedef enum { TW_ON_ERROR_FAIL = 0, TW_ON_ERROR_SKIP } tw_on_error;
/* tiling.blend: how a segmentation model's overlapping tiles are weighted
 * (pipeline/engine/blend.h has the formulas) */
typedef enum tw_blend_mode { TW_BLEND_MEAN = 0, TW_BLEND_LINEAR, TW_BLEND_COSINE } tw_blend_mode;
/* tiling.blend's default, chosen by the seams measured in bench/RESULTS.md */
#define TW_BLEND_DEFAULT TW_BLEND_LINEAR
#define TW_BLEND_DEFAULT_NAME "linear"
typedef enum {
    TW_PREC_FP32 = 0,
    TW_PREC_TF32,
    TW_PREC_FP16,
    TW_PREC_BF16,
    TW_PREC_INT8,
} tw_precision;
typedef enum { TW_PROB_FLOAT32 = 0, TW_PROB_UINT8 } tw_prob_type;
/* model.stem: the ResNet's first layers. standard: conv1 7x7 stride 2 and a
 * 3x3 stride-2 max pool; small (small patches, 32-64 px): conv1 3x3 stride 1,
 * no max pool. auto: conv1's kernel decides. */
typedef enum { TW_STEM_AUTO = 0, TW_STEM_STANDARD, TW_STEM_SMALL } tw_stem;
typedef enum { TW_FORMAT_GTIFF = 0, TW_FORMAT_COG } tw_format;
/* output.embedding_type: the embedding raster's pixels */
typedef enum { TW_EMB_FLOAT32 = 0, TW_EMB_FLOAT16, TW_EMB_INT8 } tw_emb_type;
typedef enum { TW_VECTOR_GPKG = 0, TW_VECTOR_FGB } tw_vector_format;
typedef enum {
    TW_RESOLUTION_CELLS = 0, /* a pixel per output cell (stride x the input's pixel) */
    TW_RESOLUTION_INPUT,     /* the input's pixel grid (bilinear probabilities) */
} tw_resolution;

/* output.products: the TW_PRODUCT_* bits and their table are core/products.h's.
 * The names the workflow file (KEYS.md), run.json and the merge manifest use
 * for the other enums, by enum value: */
extern const char *const tw_edge_names[3];          /* pad, shift, skip */
extern const char *const tw_prob_type_names[2];     /* float32, uint8 */
extern const char *const tw_format_names[2];        /* GTiff, COG */
extern const char *const tw_emb_type_names[3];      /* float32, float16, int8 */
extern const char *const tw_vector_format_names[2]; /* gpkg, fgb */
extern const char *const tw_stem_names[3];          /* auto, standard, small */
extern const char *const tw_blend_names[3];         /* mean, linear, cosine */

typedef struct tw_input_params {
    char paths[TW_MAX_INPUTS][TW_PATH_MAX];
    int n_paths;
    int bands[TW_MAX_BANDS]; /* 1-based; n_bands == 0: bundle's, else all */
    int n_bands;
    double scale;     /* NaN: bundle's, else 1.0 */
    bool nodata_auto; /* true: the raster's own nodata (if any) */
    double nodata;    /* used when !nodata_auto */
    tw_on_error on_error;
    char aoi[TW_PATH_MAX]; /* "" : none; else a vector file limiting the tiles computed */
    char datetime[40];     /* input.datetime: RFC 3339 acquisition time for STAC items; "" none */
    bool tiff_direct; /* plain tiled GeoTIFFs through libtiff (CLI: TILEWISE_TIFF_DIRECT=0 off) */
    /* STAC items (url.h, stac.h): the assets that become the bands, in order;
     * n_assets == 0: the paths are rasters. */
    char assets[TW_MAX_BANDS][TW_NAME_MAX];
    int n_assets;
    int retries;        /* remote inputs: GDAL's HTTP retries and tile-level retries; default 8 */
    double retry_delay; /* seconds before the first retry, doubled after each; default 0.5 */
    double timeout;     /* remote inputs: seconds a request may receive (almost) nothing; 5 */
} tw_input_params;

typedef struct tw_model_params {
    char weights[TW_PATH_MAX];
    char arch[32]; /* "" : from the file / the tensor shapes */
    tw_stem stem;  /* TW_STEM_AUTO: the file's, else conv1's kernel */
    float mean[TW_MAX_BANDS];
    int n_mean; /* 0: bundle's, else 0.0 */
    float std[TW_MAX_BANDS];
    int n_std; /* 0: bundle's, else 1.0 */
    char classes[TW_MAX_CLASSES][TW_NAME_MAX];
    int n_classes;                           /* 0: bundle's, else class_0.. */
    unsigned char colors[TW_MAX_CLASSES][3]; /* RGB per class, for the class map */
    int n_colors;                            /* 0: the built-in palette */
} tw_model_params;

typedef struct tw_tiling_params {
    int tile;   /* 0: bundle's, else 64 */
    int stride; /* 0: = tile (a classifier: tile % stride must be 0; segmentation: 1..tile) */
    int batch;  /* 0: auto */
    tw_edge_mode edge;
    double max_nodata_fraction; /* default 0.5 */
    /* segmentation models only (a classifier refuses them when set) */
    tw_blend_mode blend; /* default TW_BLEND_DEFAULT */
    int margin;          /* pixels dropped at each tile edge with a neighbour; default 0 */
} tw_tiling_params;

typedef struct tw_runtime_params {
    char device[16]; /* auto | cpu | cuda | cuda:N */
    tw_precision precision;
    size_t memory; /* bytes; default 2 GiB */
    int threads;   /* 0: auto (all cores) */
    int readers;   /* reader workers; 0: auto (tw_run_readers) */
    /* knobs the CLI fills from its environment (tilewise.1 ENVIRONMENT) */
    int cpu_winograd;       /* TILEWISE_CPU_WINOGRAD=0|1|own (tw_backend_params); 1 auto */
    int cpu_gemm;           /* TILEWISE_CPU_GEMM=0|1 (tw_backend_params.cpu_gemm); -1 auto */
    int cpu_nhwc;           /* TILEWISE_CPU_NHWC=0|1 (tw_backend_params.cpu_nhwc); -1 auto */
    size_t cuda_fail_above; /* a test hook (bench/run_hooked, cuda/README.md), 0 off */
} tw_runtime_params;

#define TW_OUTPUT_NAME_MAX 200

typedef struct tw_output_params {
    char dir[TW_PATH_MAX];
    char name[TW_OUTPUT_NAME_MAX]; /* output.name: the template of an input's output names
                                      ({stem}, {parent}, {index}; keys.h) */
    unsigned products;             /* TW_PRODUCT_* bits; default class|prob */
    tw_prob_type prob_type;
    tw_emb_type emb_type; /* output.embedding_type */
    tw_resolution resolution;
    tw_format format;
    char creation_options[TW_MAX_CREATION_OPTIONS][128];
    int n_creation_options;
    bool stac; /* output.stac: a STAC Item per input (pipeline/report/stac_run.h) */
    tw_vector_format vector_format; /* polygons: GeoPackage or FlatGeobuf */
    double min_area;                /* polygons: smaller regions are sieved (CRS units^2) */
    double simplify;                /* polygons: tolerance in CRS units, 0 none */
} tw_output_params;

/* The per-band map from raw pixels to the model's input: x = (v * scale -
 * mean) / std (pipeline/engine/normalize.h; the GPU does it on the device). */
typedef struct tw_norm {
    int bands;
    double scale;
    float mean[TW_MAX_BANDS];
    float std[TW_MAX_BANDS];
} tw_norm;

typedef struct tw_run_params {
    tw_input_params input;
    tw_model_params model;
    tw_tiling_params tiling;
    tw_runtime_params runtime;
    tw_output_params output;
    int shard_index; /* 0-based; shard_count 1 = unsharded */
    int shard_count;
    char shard_from[160]; /* run.json's "sharding": where the shard came from */
    int chunk_rows;       /* output rows per committed chunk; 0: about 1024 tiles */
    bool quiet;
    bool strict;  /* --strict: a warning before the first tile (advice.h) is an error */
    bool restart; /* --restart: discard parts made with another configuration instead of
                     refusing (parts of this configuration are still resumed) */
    char report_path[TW_PATH_MAX];   /* "" : <output.dir>/run.json only */
    char workflow_path[TW_PATH_MAX]; /* for messages and the report */
} tw_run_params;

/* The documented defaults (see DESIGN.md). Cannot fail. */
tw_run_params tw_run_default_params(void);

/* "fp32", "tf32", "fp16", "bf16", "int8"; "?" outside the enum. */
const char *tw_precision_name(tw_precision p);

#endif

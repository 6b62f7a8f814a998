/* products.h - the one table of output products.
 *
 * One row per output.products word, in the order the workflow file
 * (KEYS.md), run.json and the merge manifest list them: row i is the
 * product with bit 1 << i. Every place that lists products walks this
 * table: the workflow parser and the key table (config/workflow.c,
 * core/keys.c), the writer (io/output/writer.c), the STAC item's assets
 * (io/output/stac_out.c), preflight's output paths (pipeline/run/
 * preflight.c), merge's outputs and stale files (pipeline/run/merge.c), the
 * run report and the manifest. Adding a product is a row here, and the code
 * that computes it.
 *
 * The files of a run come in "file order": the rasters, then the tile
 * table, then the vector files, each in table order (run.json's outputs and
 * the STAC item's assets list them so); tw_product_files gives it.
 */
#ifndef TW_PRODUCTS_H
#define TW_PRODUCTS_H

#include <stdbool.h>

/* output.products, as bits (bit i: tw_products[i]) */
enum {
    TW_PRODUCT_CLASS = 1u << 0,
    TW_PRODUCT_PROB = 1u << 1,
    TW_PRODUCT_CONF = 1u << 2,
    TW_PRODUCT_EMB = 1u << 3,        /* embeddings into the HDF5 tile table */
    TW_PRODUCT_TILES = 1u << 4,      /* the HDF5 tile table (probabilities per tile) */
    TW_PRODUCT_TILES_GPKG = 1u << 5, /* GeoPackage of tile polygons */
    TW_PRODUCT_POLYGONS = 1u << 6,   /* class regions as polygons (io/output/polygons.h) */
    TW_PRODUCT_EMB_RASTER = 1u << 7, /* pooled features per output cell (scene.emb.tif) */
};
#define TW_PRODUCT_COUNT 8

/* What a product's file is. */
typedef enum {
    TW_PRODUCT_RASTER = 0, /* a GeoTIFF on the output grid, written by io/output/writer */
    TW_PRODUCT_TABLE,      /* the HDF5 tile table (io/output/tiletable) */
    TW_PRODUCT_VECTOR,     /* a vector file (io/output/gpkg, io/output/polygons) */
    TW_PRODUCT_IN_TABLE,   /* no file of its own: columns of the tile table's */
} tw_product_kind;

/* A raster product's bands and pixels. */
typedef enum {
    TW_BANDS_ONE = 0,  /* one band */
    TW_BANDS_CLASSES,  /* one band per class */
    TW_BANDS_FEATURES, /* one band per feature (the embedding width) */
} tw_product_bands;
typedef enum {
    TW_PIXELS_BYTE = 0,   /* Byte, 255 nodata (the class map) */
    TW_PIXELS_FLOAT32,    /* Float32, -1 nodata */
    TW_PIXELS_PROB_TYPE,  /* output.prob_type's: Float32, or Byte 0..255 with a mask */
    TW_PIXELS_EMBED_TYPE, /* output.embedding_type's: Float32, Float16 or Int8 */
} tw_product_pixels;

typedef struct tw_product {
    unsigned bit;         /* TW_PRODUCT_* */
    const char *word;     /* output.products, run.json, the manifest; the STAC asset key */
    tw_product_kind kind; /* what its file is */
    /* its file's name after "<stem>": ".class.tif"; NULL: none (TW_PRODUCT_IN_TABLE);
     * vectors: the GeoPackage's, suffix_fgb the FlatGeobuf's (else NULL) */
    const char *suffix, *suffix_fgb;
    unsigned implies;          /* products it brings along (embeddings: the tile table) */
    bool needs_head;           /* a headless backbone cannot give it */
    tw_product_bands bands;    /* rasters */
    tw_product_pixels pixels;  /* rasters */
    const char *what;          /* "the class product of" (preflight: "... <file> of <input>") */
    const char *stac_title;    /* the STAC asset's title */
    const char *stac_type;     /* its media type; NULL: GeoTIFF (COG when its layout says) */
    const char *stac_type_fgb; /* the FlatGeobuf's media type */
    bool stac_classes;         /* the asset carries classification:classes */
} tw_product;

extern const tw_product tw_products[TW_PRODUCT_COUNT];

/* The row of a product bit, or NULL when bit is not one product's. */
const tw_product *tw_product_of(unsigned bit);

/* The products whose file a run with `products` writes: products plus what
 * they imply (embeddings: the tile table). */
unsigned tw_products_with_implied(unsigned products);

/* The products a headless backbone cannot give (the needs_head rows). */
unsigned tw_products_needing_head(void);

/* The rows that have a file of their own, in file order (see above): fills
 * rows[TW_PRODUCT_COUNT], returns how many. */
int tw_product_files(const tw_product *rows[TW_PRODUCT_COUNT]);

/* The file's name after "<stem>" of a row: suffix, or suffix_fgb for a
 * FlatGeobuf vector (fgb true) that has one. NULL: the row has no file. */
const char *tw_product_suffix(const tw_product *row, bool fgb);

#endif

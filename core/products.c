/* products.c - the one table of output products (see products.h) */
#include "core/products.h"

#include <stddef.h>

#define GPKG "application/geopackage+sqlite3"

/* Row i: bit 1 << i (tests/test_keys.c checks it). */
const tw_product tw_products[TW_PRODUCT_COUNT] = {
    {TW_PRODUCT_CLASS, "class", TW_PRODUCT_RASTER, ".class.tif", .needs_head = true,
     .bands = TW_BANDS_ONE, .pixels = TW_PIXELS_BYTE, .what = "the class product of",
     .stac_title = "Class map (argmax class)", .stac_classes = true},
    {TW_PRODUCT_PROB, "prob", TW_PRODUCT_RASTER, ".prob.tif", .needs_head = true,
     .bands = TW_BANDS_CLASSES, .pixels = TW_PIXELS_PROB_TYPE, .what = "the prob product of",
     .stac_title = "Class probabilities (one band per class)"},
    {TW_PRODUCT_CONF, "confidence", TW_PRODUCT_RASTER, ".conf.tif", .needs_head = true,
     .bands = TW_BANDS_ONE, .pixels = TW_PIXELS_FLOAT32, .what = "the confidence product of",
     .stac_title = "Confidence (maximum probability)"},
    {TW_PRODUCT_EMB, "embeddings", TW_PRODUCT_IN_TABLE, NULL, .implies = TW_PRODUCT_TILES},
    {TW_PRODUCT_TILES, "tiles", TW_PRODUCT_TABLE, ".tiles.h5", .needs_head = true,
     .what = "the tile table of", .stac_title = "Tile table (HDF5)",
     .stac_type = "application/x-hdf5"},
    {TW_PRODUCT_TILES_GPKG, "tiles_gpkg", TW_PRODUCT_VECTOR, ".tiles.gpkg", .needs_head = true,
     .what = "the tiles_gpkg product of", .stac_title = "Tile footprints", .stac_type = GPKG},
    {TW_PRODUCT_POLYGONS, "polygons", TW_PRODUCT_VECTOR, ".class.gpkg", ".class.fgb",
     .needs_head = true, .what = "the polygons product of", .stac_title = "Class polygons",
     .stac_type = GPKG, .stac_type_fgb = "application/vnd.flatgeobuf", .stac_classes = true},
    {TW_PRODUCT_EMB_RASTER, "embedding_raster", TW_PRODUCT_RASTER, ".emb.tif",
     .bands = TW_BANDS_FEATURES, .pixels = TW_PIXELS_EMBED_TYPE,
     .what = "the embedding_raster product of",
     .stac_title = "Embeddings (pooled features per cell)"},
};

const tw_product *tw_product_of(unsigned bit)
{
    for (int i = 0; i < TW_PRODUCT_COUNT; i++)
        if (tw_products[i].bit == bit) return &tw_products[i];
    return NULL;
}

unsigned tw_products_with_implied(unsigned products)
{
    unsigned all = products;
    for (int i = 0; i < TW_PRODUCT_COUNT; i++)
        if (products & tw_products[i].bit) all |= tw_products[i].implies;
    return all;
}

unsigned tw_products_needing_head(void)
{
    unsigned bits = 0;
    for (int i = 0; i < TW_PRODUCT_COUNT; i++)
        if (tw_products[i].needs_head) bits |= tw_products[i].bit;
    return bits;
}

int tw_product_files(const tw_product *rows[TW_PRODUCT_COUNT])
{
    static const tw_product_kind order[] = {TW_PRODUCT_RASTER, TW_PRODUCT_TABLE, TW_PRODUCT_VECTOR};
    int n = 0;
    for (size_t k = 0; k < sizeof order / sizeof order[0]; k++)
        for (int i = 0; i < TW_PRODUCT_COUNT; i++)
            if (tw_products[i].kind == order[k]) rows[n++] = &tw_products[i];
    return n;
}

const char *tw_product_suffix(const tw_product *row, bool fgb)
{
    return fgb && row->suffix_fgb ? row->suffix_fgb : row->suffix;
}

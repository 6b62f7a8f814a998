/* dtype.h - the pixel types tilewise reads (GDAL's data types, as far as a
 * raster of satellite measurements uses them).
 */
#ifndef TW_DTYPE_H
#define TW_DTYPE_H

#include <stddef.h>

typedef enum tw_dtype {
    TW_DT_BYTE = 0,
    TW_DT_UINT16,
    TW_DT_INT16,
    TW_DT_UINT32,
    TW_DT_INT32,
    TW_DT_FLOAT32,
    TW_DT_FLOAT64,
    TW_DT_INT8,
} tw_dtype;

/* Bytes per sample of a dtype (inline: the CUDA backend, a separate static
 * library, uses it too); 0 for a value outside the enum. */
static inline size_t tw_dtype_size(tw_dtype t)
{
    switch (t) {
    case TW_DT_BYTE:
    case TW_DT_INT8: return 1;
    case TW_DT_UINT16:
    case TW_DT_INT16: return 2;
    case TW_DT_UINT32:
    case TW_DT_INT32:
    case TW_DT_FLOAT32: return 4;
    case TW_DT_FLOAT64: return 8;
    }
    return 0;
}

/* Its name as GDAL says it ("Byte", "UInt16", ...); "unknown" outside the
 * enum. Static storage, never NULL. */
const char *tw_dtype_name(tw_dtype t);

#endif

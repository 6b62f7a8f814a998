/* dtype.c - see dtype.h */
#include "core/dtype.h"

const char *tw_dtype_name(tw_dtype t)
{
    switch (t) {
    case TW_DT_BYTE: return "Byte";
    case TW_DT_INT8: return "Int8";
    case TW_DT_UINT16: return "UInt16";
    case TW_DT_INT16: return "Int16";
    case TW_DT_UINT32: return "UInt32";
    case TW_DT_INT32: return "Int32";
    case TW_DT_FLOAT32: return "Float32";
    case TW_DT_FLOAT64: return "Float64";
    }
    return "unknown";
}

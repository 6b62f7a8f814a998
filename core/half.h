/* half.h - IEEE 754 half precision (binary16) to float, exactly: the model
 * readers convert F16 tensors with it (io/modelfile/safetensors.c,
 * io/modelfile/onnx.c). Pure; thread-safe.
 */
#ifndef TW_HALF_H
#define TW_HALF_H

#include <stdint.h>

/* The float of half h: exact (every half is a float), NaN and Inf kept,
 * subnormals included. */
float tw_half_to_float(uint16_t h);

#endif

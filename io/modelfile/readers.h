/* readers.h - the model-file readers, one per format, which the front
 * (io/modelfile/model_file.c: format detection) dispatches to. Each reads
 * mf->path into mf through the shared checks of model_file_impl.h; none
 * calls the front or another reader. Not for use outside io/modelfile/. */
#ifndef TW_MODEL_READERS_H
#define TW_MODEL_READERS_H

#include <stdint.h>

#include "core/error.h"
#include "io/modelfile/model_file.h"

/* Read the tensors and metadata of a safetensors file of file_size bytes at
 * mf->path into mf (io/modelfile/safetensors.c). */
tw_status tw_safetensors_load(tw_model_file *mf, uint64_t file_size, tw_error *err);

/* Read an ONNX model of file_size bytes at mf->path (io/modelfile/onnx.c): recognise
 * the ResNet in its graph and fill mf's tensors (torchvision names) and the
 * metadata Deepness's keys carry. mf->sha256 holds the file's digest on
 * entry; it is extended when tensors live in external data files. */
tw_status tw_onnx_load(tw_model_file *mf, uint64_t file_size, tw_error *err);

/* Read the tensors and metadata of an HDF5 bundle at mf->path into mf
 * (io/modelfile/h5bundle.c). */
tw_status tw_h5bundle_load(tw_model_file *mf, tw_error *err);

#endif

/* model_file_impl.h - what the model-file readers share, below them all
 * (io/modelfile/model_file_impl.c): the messages naming the file and the
 * metadata checks every format ends in. The readers (safetensors.c,
 * h5bundle.c, onnx.c) and the front (model_file.c: format detection, hash,
 * the ResNet and finiteness checks) include it; it calls none of them.
 * tw_model_file_find (model_file.h) lives in model_file_impl.c too.
 * Not for use outside io/modelfile/. */
#ifndef TW_MODEL_FILE_IMPL_H
#define TW_MODEL_FILE_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "io/modelfile/model_file.h"

/* Record a TW_ERR_MODEL message prefixed with "model file <path>: ". */
tw_status tw_model_error(tw_error *err, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* TW_ERR_NOMEM naming the file and the bytes. */
tw_status tw_model_nomem(tw_error *err, const char *path, size_t bytes);

/* Metadata shared by both formats, checked the same way whichever format
 * carried it: each sets the field of mf or returns TW_ERR_MODEL naming the
 * key (v and n as read from the file). */
tw_status tw_model_set_arch(tw_model_file *mf, const char *arch, tw_error *err);
tw_status tw_model_set_stem(tw_model_file *mf, const char *stem, tw_error *err);
tw_status tw_model_set_bands(tw_model_file *mf, const int64_t *v, int64_t n, tw_error *err);
tw_status tw_model_set_floats(tw_model_file *mf, const char *key, const double *v, int64_t n,
                              float *dst, int *n_dst, bool positive, tw_error *err);
tw_status tw_model_set_scale(tw_model_file *mf, double v, tw_error *err);
tw_status tw_model_set_tile(tw_model_file *mf, int64_t v, tw_error *err);
tw_status tw_model_set_stride(tw_model_file *mf, int64_t v, tw_error *err);
tw_status tw_model_set_class(tw_model_file *mf, int i, const char *name, tw_error *err);

#endif

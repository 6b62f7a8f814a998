/* fileio.h - small durable-file helpers shared by the report, the parts and
 * the run driver: nothing half-written may ever carry a final name. */
#ifndef TW_FILEIO_H
#define TW_FILEIO_H

#include <stddef.h>

#include "core/error.h"

/* Write data to path atomically: "<path>.<pid>.part", fsync, rename, so a
 * reader sees the old file or the whole new one. TW_ERR_OUTPUT naming the
 * path on failure (the temporary is removed). */
tw_status tw_write_file_atomic(const char *path, const void *data, size_t n, tw_error *err);

/* mkdir -p. TW_ERR_OUTPUT naming the component that could not be made. */
tw_status tw_mkdir_p(const char *path, tw_error *err);

/* fsync a directory so renames in it are durable (file systems that refuse
 * it with EINVAL are accepted). */
tw_status tw_fsync_dir(const char *dir, tw_error *err);

#endif

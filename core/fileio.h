/* fileio.h - small durable-file helpers shared by the report, the parts and
 * the run driver: nothing half-written may ever carry a final name. */
#ifndef TW_FILEIO_H
#define TW_FILEIO_H

#include <stdbool.h>
#include <stddef.h>

#include "core/error.h"

/* Write data to path atomically: "<path>.<pid>.part", fsync, rename, so a
 * reader sees the old file or the whole new one. TW_ERR_OUTPUT naming the
 * path on failure (the temporary is removed). */
tw_status tw_write_file_atomic(const char *path, const void *data, size_t n, tw_error *err);

/* mkdir -p. TW_ERR_OUTPUT naming the component that could not be made. */
tw_status tw_mkdir_p(const char *path, tw_error *err);

/* fsync a file or directory by its path, so that what was written to it,
 * or renamed in it, is durable (file systems that refuse it with EINVAL or
 * EROFS are accepted). missing_ok: a path that does not exist is TW_OK.
 * TW_ERR_OUTPUT naming the path otherwise. */
tw_status tw_fsync_path(const char *path, bool missing_ok, tw_error *err);

/* tw_fsync_path of a directory, so renames in it are durable. */
tw_status tw_fsync_dir(const char *dir, tw_error *err);

#endif

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

/* Before a file is opened for reading: is path (symbolic links followed) a
 * regular file (or, with dir_ok, a directory: GDAL and OGR open some as
 * datasets)? TW_OK when it is, and when it does not exist or cannot be
 * stat'ed (the caller's own open then says why). Else status st with the
 * message "<what> <path> is a FIFO (named pipe), not a regular file" (or
 * a socket, a character device, a block device, a directory): a FIFO's
 * open would wait for a writer forever, a character device may never end.
 * Never opens path. what names the role ("workflow file", "model file",
 * "raster", ...). Thread-safe. */
tw_status tw_path_check_regular(const char *path, const char *what, bool dir_ok, tw_status st,
                                tw_error *err);

/* A JSON parser's error text (jansson's json_error_t.text) without the
 * quote of the file's own bytes it ends with (" near 'machine login bob
 * password ...'"): messages name a file's line and column, never its
 * content. Writes at most size bytes to out, always terminated; returns out. */
const char *tw_json_error_text(const char *text, char *out, size_t size);

#endif

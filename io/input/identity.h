/* identity.h - what an input is, for the resume fingerprint: one place for
 * both kinds (identity.c; it calls down into url.h for paths, never the
 * other way).
 *
 * A remote object: its size, ETag and Last-Modified (a HEAD request through
 * GDAL). A local raster: every file of the dataset (GDAL's file list: the raster, a VRT's sources,
 * sidecars such as .aux.xml, .ovr, .msk, .hdr) by size, modification time
 * and a SHA-256 of what can be read cheaply and still tells a replaced file
 * from the original.
 *
 * The content hash of a file covers its size, its first and last 64 KiB,
 * blocks spread evenly in between, and, for a TIFF, every IFD's strip or
 * tile offsets and byte counts (so that a compressed block rewritten
 * anywhere changes the hash through its byte count). It is a sample: an
 * uncompressed file changed in place only between the sampled blocks keeps
 * its hash, which is why the modification time is part of the identity
 * too (a copy with `cp` is refused, one with `cp -p` resumes).
 *
 * Bounds: at most TW_IDENTITY_MAX_FILES files are looked at (the others
 * are counted), each read for at most 1 MiB plus its TIFF block index, and
 * TW_IDENTITY_MAX_BYTES sampled in all (a large list samples less of each
 * file). Remote files of the list (a local VRT of URLs) get their size,
 * ETag and date, the first TW_IDENTITY_MAX_REMOTE of them.
 *
 * Thread-safety: reentrant (GDAL's and libtiff's per-call handles only).
 */
#ifndef TW_IDENTITY_H
#define TW_IDENTITY_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

#define TW_IDENTITY_MAX_FILES 1024
#define TW_IDENTITY_MAX_REMOTE 8
#define TW_IDENTITY_MAX_BYTES ((int64_t)64 << 20)

/* What producing an identity cost (for benchmarks and tests). */
typedef struct tw_identity_stats {
    int files;          /* files in GDAL's list */
    int files_hashed;   /* of them, content-hashed */
    int64_t bytes_read; /* sampled bytes and TIFF block-index bytes read */
} tw_identity_stats;

/* The identity of the dataset at gdal_path (a local path or a local /vsi
 * path GDAL opens) as "key value" lines, each key naming its file, so that
 * a refusal says which file changed and how:
 *     size[PATH] BYTES
 *     mtime[PATH] 2026-11-27T10:01:02.123456789Z
 *     content[PATH] sha256:<32 hex digits>
 * (a blank in PATH is written %20), then, for files beyond what fits in
 * size bytes, one line "files[+N] sha256:..." over theirs. out holds size
 * bytes; stats may be NULL. TW_ERR_INPUT (naming the file) when a file of
 * the list exists but cannot be read; a listed file that does not exist
 * (GDAL lists some sidecars it only guessed) has the line "size[PATH]
 * none". */
tw_status tw_identity_local(const char *gdal_path, char *out, size_t size, tw_identity_stats *stats,
                            tw_error *err);

/* The lines identifying an input's version for the resume fingerprint,
 * "key value" each, the key naming the object or file:
 * * remote: "object[URL] etag=E size=N modified=M" (URL the redacted GDAL
 *   path; fields GDAL cannot tell are "-"), from a fresh HEAD request
 *   (GDAL's cache of the object is dropped first); TW_ERR_REMOTE when the
 *   object cannot be reached;
 * * local: every file of the dataset by size, mtime and sampled content
 *   (tw_identity_local below). */
tw_status tw_identity(const char *path, char *out, size_t size, tw_error *err);

#endif

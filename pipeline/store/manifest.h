/* resume.h - the shard/merge manifest: what `tilewise merge` needs to
 * assemble an input's committed chunks without the workflow.
 *
 * Every run writes OUTPUT_DIR/.tilewise/<stem>/manifest (shards of one job
 * write the same content). It is text: a JSON object with a format name and
 * version, the resolved configuration assemble() uses (input paths, edge
 * mode, output options, the resolved model, the raster's geometry), the
 * config JSON that goes into the products' metadata, and the parts
 * fingerprint. It is read back key by key with type, range and length checks,
 * so a build that reorders or resizes a struct reads an older job's manifest
 * exactly as it was meant, or refuses it; it is never reinterpreted as bytes.
 *
 * Versions: 1 was the binary "TWMANIF1" layout (the structs' bytes; it cannot
 * be migrated because its layout depends on the build that wrote it); 2 is
 * this text format. A manifest of any other version is refused with one
 * message naming both versions (TW_ERR_INPUT: exit code 3).
 */
#ifndef TW_RESUME_H
#define TW_RESUME_H

#include <stddef.h>

#include "core/error.h"
#include "core/params.h"
#include "pipeline/store/parts.h"
#include "io/input/raster.h"
#include "pipeline/resolved.h"

#define TW_MANIFEST_VERSION 2
#define TW_MANIFEST_MAX_BYTES ((size_t)4 << 20) /* larger files are refused as damaged */

/* The manifest's content. Of p, what a merge needs to write the products
 * (the rest stay at tw_run_default_params()): every key an output byte
 * depends on (TW_KEY_BYTES in core/keys.c) except those a merge takes from
 * m, the chunks or the fingerprint - input.path, input.nodata, tiling.edge,
 * output.products, prob_type, embedding_type, resolution, format,
 * creation_options, vector_format, min_area, simplify, model.colors
 * (tests/test_resume.c test_every_byte_key_carried walks the table) - and
 * output.dir, output.name; with output.stac (key "stac", absent without):
 * output.stac, model.weights, input.assets and the input's STAC facts
 * (stac). m and info are carried whole. */
typedef struct tw_manifest {
    tw_run_params p;
    tw_resolved m;
    tw_raster_info info;
    char config_json[TW_CONFIG_JSON_MAX];
    char fingerprint[TW_FINGERPRINT_MAX];
    tw_stac_input stac; /* with p.output.stac: what the merged item says */
} tw_manifest;

/* "<out_dir>/.tilewise/<stem>/manifest" into buf. TW_ERR_OUTPUT when it
 * does not fit. */
tw_status tw_manifest_path(const char *out_dir, const char *stem, char *buf, size_t size,
                           tw_error *err);

/* The manifest as text (a JSON object and a newline). *out is malloc'ed
 * (free() it); *len its length without the terminating NUL. TW_ERR_NOMEM,
 * or TW_ERR_INTERNAL for a value that cannot be written (non-finite mean). */
tw_status tw_manifest_format(const tw_manifest *mf, char **out, size_t *len, tw_error *err);

/* Parse text (len bytes, need not be NUL-terminated) into *mf. name is the
 * file named in messages. TW_ERR_INPUT with one message: naming both
 * versions for another format version (the binary "TWMANIF1" included);
 * naming the key for a missing, mistyped, out-of-range or unknown field;
 * "damaged" for anything that is not a manifest. *mf is unspecified on
 * error. Allocates only transiently; thread-safe. */
tw_status tw_manifest_parse(const char *text, size_t len, const char *name, tw_manifest *mf,
                            tw_error *err);

/* Format and write atomically (temp + fsync + rename) to path. */
tw_status tw_manifest_write(const tw_manifest *mf, const char *path, tw_error *err);

/* Read and parse path. A missing file is TW_ERR_INPUT naming stem (the
 * input) and the system's reason. */
tw_status tw_manifest_read(const char *path, const char *stem, tw_manifest *mf, tw_error *err);

#endif

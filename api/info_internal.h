/* info_internal.h - what api/info*.c share (private to api/): `tilewise
 * info`'s facts about one file gathered once into a jansson tree, which
 * info.c writes as the JSON form and one renderer per kind as the text.
 *
 * The tree is the JSON form, member for member and in its order, plus a few
 * facts only the text shows, named "_..." (the JSON form leaves them out so
 * that it stays what it was). A number that is not finite is null (JSON has
 * no NaN); where the text shows one anyway (a band's nodata, min, max), a
 * "_KEY" member beside it holds its printf %g ("nan", "-inf").
 */
#ifndef TW_INFO_INTERNAL_H
#define TW_INFO_INTERNAL_H

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>

#include "core/error.h"
#include "io/modelfile/model_file.h"
#include "model/segnet.h"

/* (info_tree.c) Building: a member or an element; v or o NULL (jansson could not
 * allocate) or a failed insertion turns *ok false (v is released either
 * way), so a builder that could not allocate its tree is caught where the
 * tree is put. */
void tw_info_put(json_t *o, const char *key, json_t *v, bool *ok);
void tw_info_push(json_t *a, json_t *v, bool *ok);
/* A string of the bytes as they are (NULL: ""); a number, null when not
 * finite; a number the text shows also when not finite (see above). */
json_t *tw_info_str(const char *s);
json_t *tw_info_num(double v);
void tw_info_put_shown(json_t *o, const char *key, double v, bool *ok);

/* Reading for the text: a member of o (absent or of another type: "", 0,
 * NaN, false); tw_info_shown: a number as fmt prints it, or its "_KEY"
 * text, into buf (false when neither is there). */
const char *tw_info_get_str(const json_t *o, const char *key);
long long tw_info_get_int(const json_t *o, const char *key);
double tw_info_get_num(const json_t *o, const char *key);
bool tw_info_get_bool(const json_t *o, const char *key);
bool tw_info_shown(const json_t *o, const char *key, const char *fmt, char *buf, size_t size);
/* A model's text lines from "scale" to "sha256" (scale, mean, std or that
 * the file has none, tile, sha256): a classifier's and a segmentation
 * model's alike. */
void tw_info_norm_text(const json_t *f, FILE *out);

/* (info_stac.c) Whether path names a STAC item or collection a run writes
 * (*.stac.json, collection.json); its facts (*facts: the caller's, to
 * json_decref): id, datetime (a collection's time span), bbox, CRS and grid,
 * every asset with its href, size and type, the model (mlm), the links
 * (TW_ERR_INPUT for a file that is not JSON or not a STAC Item/Collection);
 * and their text onto out. */
bool tw_info_is_stac(const char *path);
tw_status tw_info_stac_facts(const char *path, json_t **facts, tw_error *err);
void tw_info_stac_text(const json_t *f, FILE *out);

/* (info_seg.c) A segmentation model's facts (task "segmentation", arch,
 * network, encoder, output stride, the tile sides it takes, bands,
 * classes, normalisation, checksum) from its file and built net; and their
 * text onto out. */
json_t *tw_info_seg_facts(const char *path, const tw_model_file *mf, const tw_segnet *net,
                          bool *ok);
void tw_info_seg_text(const json_t *f, FILE *out);

#endif

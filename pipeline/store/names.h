/* names.h - the names of an input's products: OUT/name.* and its parts
 * under OUT/.tilewise/name/. The run, validate and `tilewise merge` name
 * them here alike (a merge finds the input of a parts directory by its
 * name). Pure: it reads the path, and the current directory's name for a
 * bare file name. */
#ifndef TW_NAMES_H
#define TW_NAMES_H

#include <stddef.h>

#include "core/error.h"
#include "core/params.h"

/* The output name of input i of p (its files are OUT/name.*, its parts
 * OUT/.tilewise/name/): output.name's template (core/keys.h,
 * tw_output_name_expand) over the input's stem (its file name without the
 * extension, nor a URL's query: url.h), the name of the folder holding it
 * and its 1-based index. TW_ERR_CONFIG naming output.name when the name
 * cannot be made (too long, a '/'). */
tw_status tw_output_name(const tw_run_params *p, int i, char *out, size_t size, tw_error *err);

#endif

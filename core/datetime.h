/* datetime.h - RFC 3339 date-times, as STAC items and input.datetime
 * write them (the workflow parser checks the key, io/output/stac_out.c the
 * metadata it reads).
 */
#ifndef TW_DATETIME_H
#define TW_DATETIME_H

#include <stdbool.h>
#include <stddef.h>

/* Whether s is an RFC 3339 date-time (YYYY-MM-DDTHH:MM:SS[.frac](Z|+hh:mm|
 * -hh:mm), 'T'/'Z' in either case), with real calendar dates (leap years)
 * and times (second 60 allowed). When not, why (may be NULL with why_size
 * 0) says what is wrong. Cannot fail; thread-safe. */
bool tw_rfc3339_check(const char *s, char *why, size_t why_size);

#endif

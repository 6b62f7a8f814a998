/* gdal_msgs.h - the one way tilewise hears GDAL's messages.
 *
 * GDAL reports through a per-thread handler stack (and a last-error global
 * we do not rely on). Around a group of GDAL calls, capture_begin pushes a
 * handler that records into the caller's tw_gdal_msgs; capture_end pops it.
 * The caller then turns what was recorded into one tw_error message, naming
 * its own file and window (STYLE.md rule 11). Nothing is printed, and
 * credentials in the URLs GDAL names are redacted (io/url.h) before they
 * are kept. Captures nest (the handler stack is GDAL's) and are per thread.
 */
#ifndef TW_GDAL_MSGS_H
#define TW_GDAL_MSGS_H

typedef struct tw_gdal_msgs {
    int failures;            /* CE_Failure and CE_Fatal messages seen */
    char failure[512];       /* the first of them: later ones are usually knock-on effects */
    char first_warning[512]; /* creation-option validation speaks in warnings */
    char last_warning[512];  /* the best clue when a call fails without a failure message */
} tw_gdal_msgs;

/* Reset m and route this thread's GDAL messages into it until capture_end.
 * m must outlive the capture. */
void tw_gdal_capture_begin(tw_gdal_msgs *m);
void tw_gdal_capture_end(void);

/* The first failure, else the last warning, else fallback. Borrowed from m. */
const char *tw_gdal_capture_text(const tw_gdal_msgs *m, const char *fallback);

#endif

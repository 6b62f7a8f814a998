/* url.h - io/'s path glue, shared by input/, output/ and gdal_msgs: remote
 * inputs: what a user writes as input.path, what GDAL opens,
 * what may be shown of it, and GDAL's network settings for a run.
 *
 * * Paths: https://... and http://... open through /vsicurl/, s3://bucket/key
 *   through /vsis3/; a /vsi.../ path is GDAL's own and is passed unchanged.
 *   Credentials come only from GDAL's configuration (environment, --config,
 *   the AWS files): tilewise never reads or stores them.
 * * Redaction: tw_url_redact() is the one place that makes a path (or any
 *   message holding URLs) fit to print or store: the values of presigned-URL
 *   parameters (X-Amz-Signature, X-Amz-Credential, X-Amz-Security-Token,
 *   sig, token, signature, key, ...) and user:password@ parts are replaced.
 *   Every log line, error message, run.json and the TILEWISE_RUN metadata
 *   goes through it.
 * * Identity (what resume compares) is identity.h's: it builds on these
 *   paths; nothing here calls it.
 * * Network settings: input.retries and the read-ahead defaults become GDAL
 *   configuration options for the run (set from params, never from the
 *   environment by tilewise itself) and are restored afterwards.
 *
 * Thread-safety: every function here is reentrant;
 * tw_url_settings_apply / _restore change GDAL's process-wide
 * configuration (under a mutex, shared by the runs between them) and
 * belong at the start and end of a run.
 */
#ifndef TW_URL_H
#define TW_URL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

/* Room for a redacted path in a message buffer. */
#define TW_URL_SHOWN_MAX 2048

/* Does path name a network object (http(s)://, s3://, /vsicurl/, /vsis3/,
 * /vsigs/, /vsiaz/, /vsiadls/, /vsioss/, /vsiswift/, /vsiwebhdfs/)? */
bool tw_url_is_remote(const char *path);

/* The path GDAL opens for a user's path (see above); out holds size bytes.
 * TW_ERR_INPUT when it does not fit, or for an s3:// URL without a key. */
tw_status tw_url_to_gdal(const char *path, char *out, size_t size, tw_error *err);

/* Copy text into out (size bytes, always terminated) with credentials
 * replaced by "REDACTED": values of the query parameters named in url.c's
 * list, case-insensitive, wherever a '?', '&' or ';' precedes them, and the
 * user-info part of scheme://user:pass@host. Safe on any text (a GDAL
 * message holding a URL, a local path: unchanged). */
void tw_url_redact(const char *text, char *out, size_t size);

/* Does text hold something tw_url_redact would replace? */
bool tw_url_has_secret(const char *text);

/* The output stem of an input: its last path component without a query
 * string or fragment (remote paths) and without the extension. */
void tw_url_stem(const char *path, char *out, size_t size);

/* Is a GDAL failure message one of a network outage or a dropped
 * connection (5xx, 429, a refused, reset or timed-out connection, libtiff's
 * "Read error at ...; got 0 bytes" of a short read) rather than of a bad or
 * missing object (403, 404, a decoding error)? */
bool tw_url_transient(const char *gdal_msg);

/* Is a GDAL failure message the server's final answer about the object
 * (an HTTP 4xx other than 408 and 429: 404 missing, 403 denied, 401, ...;
 * S3's NoSuchKey, NoSuchBucket, AccessDenied, InvalidAccessKeyId,
 * SignatureDoesNotMatch), which no retry can change? */
bool tw_url_definitive(const char *gdal_msg);

/* GDAL's HTTP settings for a run. */
typedef struct tw_url_settings {
    int retries;           /* GDAL_HTTP_MAX_RETRY, and tile-level retries */
    double retry_delay;    /* GDAL_HTTP_RETRY_DELAY: first delay, s (GDAL doubles it) */
    size_t vsi_cache;      /* VSI_CACHE=TRUE, VSI_CACHE_SIZE per open file; 0: GDAL default (off) */
    size_t chunk_size;     /* CPL_VSIL_CURL_CHUNK_SIZE; 0: GDAL's default (16 KiB) */
    size_t ingested_bytes; /* GDAL_INGESTED_BYTES_AT_OPEN; 0: GDAL's default */
    int merge_ranges;      /* GDAL_HTTP_MERGE_CONSECUTIVE_RANGES: 1 YES, 0 NO, -1 GDAL's default */
    const char *multirange; /* GDAL_HTTP_MULTIRANGE: "PARALLEL", "SERIAL", "SINGLE_GET" or NULL */
    bool no_listing; /* GDAL_DISABLE_READDIR_ON_OPEN=EMPTY_DIR (process-wide: hides sidecars) */
    /* input.timeout, s: a request that connects in no more, and then never
     * receives less than TW_URL_LOW_SPEED bytes/s for this long
     * (GDAL_HTTP_CONNECTTIMEOUT, GDAL_HTTP_LOW_SPEED_TIME/_LIMIT); else it
     * fails (curl: "Operation too slow", a transient failure, retried). */
    double timeout;
} tw_url_settings;

/* input.timeout's default, s, and the speed below which a request counts
 * as silent, bytes/s: a server that accepts and never answers, or drips a
 * few bytes a second, fails the request after timeout seconds. */
#define TW_URL_TIMEOUT_DEFAULT 4.0
#define TW_URL_LOW_SPEED 1024

/* The defaults measured best against a 50 ms server (bench/RESULTS.md,
 * "Remote inputs"), with retries/retry_delay given, timeout
 * TW_URL_TIMEOUT_DEFAULT. Cannot fail. */
tw_url_settings tw_url_default_settings(int retries, double retry_delay);

/* tw_url_default_settings with the retries GDAL's configuration holds now
 * (GDAL_HTTP_MAX_RETRY, GDAL_HTTP_RETRY_DELAY; 0 and 0.5 when unset): for
 * what opens a remote path outside a run (tilewise info). Cannot fail. */
tw_url_settings tw_url_gdal_settings(void);

/* Tile-level retry schedule of a read that failed after GDAL's own retries
 * (a dropped connection or a truncated body, which GDAL 3.6 does not retry):
 * the delay before attempt k (1-based) in seconds. */
double tw_url_retry_delay(const tw_url_settings *s, int attempt);

/* Total seconds GDAL's retries of one request may wait (for messages). */
double tw_url_retry_span(int retries, double retry_delay);

typedef struct tw_url_saved tw_url_saved;

/* Set GDAL's configuration options from s, process-wide; an option the
 * user already set (environment or --config) for the read-ahead knobs is
 * left alone, retries always follow s. *saved is what
 * tw_url_settings_restore takes back (it accepts NULL; neither can fail).
 * Runs at once share the options: one started while another reads sets
 * its own on top, and the last to restore puts back the values the first
 * replaced (one mutex, a count of the runs between apply and restore). */
void tw_url_settings_apply(const tw_url_settings *s, tw_url_saved **saved);
void tw_url_settings_restore(tw_url_saved *saved);

/* What reading rows [row0, row1) of every band of a tiled or striped
 * GeoTIFF (a COG) costs: *bytes, the sum of its blocks' byte counts (from
 * the file's block index), and *requests, the number of contiguous spans
 * of the file they make (blocks less than 16 KiB apart, one GDAL chunk,
 * count as one span), at least one request per chunk_size bytes (0: no
 * minimum). A lower bound: each open adds a HEAD and a header read, and
 * GDAL may split a long span. Both -1 for other formats. Opens path itself (GDAL
 * path, remote or not). TW_ERR_INPUT when it cannot be opened. */
tw_status tw_url_read_cost(const char *gdal_path, int row0, int row1, size_t chunk_size,
                           int64_t *bytes, int64_t *requests, tw_error *err);

#endif

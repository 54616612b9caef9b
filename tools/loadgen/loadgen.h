/* SPDX-License-Identifier: Apache-2.0 */
/* kvgate-loadgen's internal interface: wire format, statistics, reports and the runner. */
#ifndef KVG_LOADGEN_H
#define KVG_LOADGEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "workload.h"

#define LG_WORKER_NAME_MAX 63     /* longer x-kvgate-worker values are cut */
#define LG_MAX_WORKERS 64         /* distinct worker names tracked; the rest are "(other)" */
#define LG_MAX_SAMPLES (4u << 20) /* latency samples kept per series (32 MiB each) */
#define LG_ERROR_SAMPLE_MAX 160   /* bytes of the first error kept for the report */
#define LG_MAX_URLS 64            /* --url may be given this many times */

/* ---- wire format (proto.c) ------------------------------------------------------------------ */

typedef struct lg_body_opts {
    const char *model;
    uint32_t max_tokens;
    bool stream; /* adds stream_options.include_usage so the last chunk carries usage */
} lg_body_opts;

/** Append the JSON body of an OpenAI chat-completions request for item to out. Check
 *  out->failed for allocation failure. */
void lg_body_build(kvg_buf *out, const lg_item *item, const lg_body_opts *opts);

/* What a response reported in its `usage` object. */
typedef struct lg_usage {
    bool present;        /* a usage object was seen */
    bool cached_present; /* usage.prompt_tokens_details.cached_tokens was a number */
    uint64_t prompt_tokens;
    uint64_t completion_tokens;
    uint64_t cached_tokens;
} lg_usage;

/** Read a `usage` member (borrowed). A JSON null leaves *out untouched and returns 0. Missing
 *  counters read as 0; returns KVG_ETYPE when usage or a counter has the wrong type. */
int lg_usage_read(const kvg_json *usage, lg_usage *out);

/** Check a complete non-streaming chat-completions body and read its usage into *usage.
 *  Returns 0 for a completion object with a `choices` array, KVG_EPARSE for text that is not
 *  JSON, KVG_EPROTO for JSON that is not a completion (an `error` object, no choices),
 *  KVG_ETYPE for a malformed usage, -ENOMEM. */
int lg_response_parse(const char *body, size_t len, lg_usage *usage);

/* Incremental parser of text/event-stream (the WHATWG "server-sent events" rules): any split
 * of the input gives the same events. Only `data` fields matter to OpenAI streams; comments
 * and other fields are skipped. */
typedef struct lg_sse {
    kvg_buf line;     /* an incomplete line carried to the next feed */
    kvg_buf data;     /* data lines of the event being assembled */
    size_t max_event; /* bytes of one line or one event's data; more is KVG_ELIMIT */
    bool has_data;
    bool after_cr; /* the last line ended in CR: a leading LF of the next feed ends nothing */
} lg_sse;

/* Called once per complete event with its data (NUL-terminated; len excludes the NUL);
 * a negative return stops lg_sse_feed, which returns it. */
typedef int (*lg_sse_cb)(void *arg, const char *data, size_t len);

/** Initialise a parser; max_event bounds one line and one event's data. Allocates nothing. */
void lg_sse_init(lg_sse *p, size_t max_event);
/** Release a parser's buffers; it may be initialised again. */
void lg_sse_done(lg_sse *p);
/** Feed bytes; cb runs for each event they complete. Returns 0, KVG_ELIMIT, -ENOMEM, or the
 *  callback's negative value. After an error the parser must not be fed again. */
int lg_sse_feed(lg_sse *p, const char *buf, size_t len, lg_sse_cb cb, void *arg);

/* What a chat.completion.chunk stream has shown so far. */
typedef struct lg_stream {
    uint64_t events;
    bool content_seen; /* a chunk carried generated text */
    bool done;         /* `data: [DONE]` arrived */
    lg_usage usage;    /* from the final usage chunk (stream_options.include_usage) */
} lg_stream;

/** Account one SSE event of an OpenAI stream. Returns 1 when this event carried the first
 *  generated text (the caller stamps time to first token), 0 for other valid events,
 *  KVG_EPARSE for data that is not JSON, KVG_EPROTO for an `error` event or data after
 *  [DONE], KVG_ETYPE for a malformed usage, -ENOMEM. */
int lg_stream_event(lg_stream *s, const char *data, size_t len);

/* ---- results and statistics (stats.c) ------------------------------------------------------ */

/* How one request ended. */
typedef enum lg_outcome {
    LG_OK = 0,       /* 2xx and a complete body */
    LG_HTTP_STATUS,  /* a status other than 2xx */
    LG_TIMEOUT,      /* --timeout-ms passed */
    LG_CONNECTION,   /* connect failed or the connection closed early */
    LG_TOO_LARGE,    /* the response passed --max-response-bytes */
    LG_BAD_HEADERS,  /* unparsable status line or headers */
    LG_INCOMPLETE,   /* 2xx stream that ended without [DONE] */
    LG_BAD_BODY,     /* 2xx body that is not a completion (or not JSON) */
    LG_STREAM_ERROR, /* an error event inside a 2xx stream */
    LG_CANCELLED,    /* interrupted by a signal */
    LG_LOCAL_ERROR,  /* the load generator itself failed (memory) */
    LG_OUTCOME_COUNT,
} lg_outcome;

/** Short name of an outcome for reports ("ok", "timeout", ...). */
const char *lg_outcome_str(lg_outcome o);

typedef struct lg_result {
    lg_outcome outcome;
    int status;          /* HTTP status, 0 when no response arrived */
    uint64_t latency_us; /* request sent to response complete */
    uint64_t ttft_us;    /* request sent to first generated text (streams) */
    bool has_ttft;
    char worker[LG_WORKER_NAME_MAX + 1]; /* "" when the response named none */
    size_t url;                          /* index of the --url its connection goes to */
    lg_usage usage;
    const char *detail; /* borrowed, may be NULL: error text for the report */
    size_t detail_len;
} lg_result;

typedef struct lg_samples {
    uint64_t *v;
    size_t n, cap;
    uint64_t dropped; /* samples past LG_MAX_SAMPLES or lost to allocation failure */
    bool sorted;
} lg_samples;

typedef struct lg_worker_stat {
    char name[LG_WORKER_NAME_MAX + 1];
    uint64_t requests; /* responses that named this worker */
    uint64_t ok;
    uint64_t prompt_tokens;
    uint64_t cached_tokens;
} lg_worker_stat;

typedef struct lg_stats {
    uint64_t requests; /* finished, whatever the outcome */
    uint64_t by_outcome[LG_OUTCOME_COUNT];
    uint64_t by_status[600]; /* responses by HTTP status, 2xx included */
    lg_samples latency;      /* successful requests only */
    lg_samples ttft;
    lg_worker_stat workers[LG_MAX_WORKERS];
    size_t n_workers;
    lg_worker_stat other;   /* names past LG_MAX_WORKERS */
    lg_worker_stat unnamed; /* responses without a worker header */
    uint64_t prompt_tokens, cached_tokens, completion_tokens;
    uint64_t usage_missing;  /* successes that reported no usage */
    uint64_t cached_missing; /* usage without prompt_tokens_details.cached_tokens */
    char first_error[LG_ERROR_SAMPLE_MAX + 1];
    uint64_t url_requests[LG_MAX_URLS]; /* finished requests by --url index */
    uint64_t url_ok[LG_MAX_URLS];
} lg_stats;

/** Initialise empty statistics (allocates nothing until samples arrive). */
void lg_stats_init(lg_stats *s);
/** Free the samples; the statistics may be initialised again. */
void lg_stats_done(lg_stats *s);
/** Account one finished request. Never fails: samples that cannot be stored are counted in
 *  lg_samples.dropped. */
void lg_stats_add(lg_stats *s, const lg_result *r);
/** Sort the samples so percentiles can be read; call once before reporting. */
void lg_stats_finish(lg_stats *s);

/** Nearest-rank percentile p (0 < p <= 100) of n sorted values: the smallest value with at
 *  least p% of the values at or below it. 0 when n is 0. */
uint64_t lg_percentile(const uint64_t *sorted, size_t n, double p);

/* ---- reports (report.c) --------------------------------------------------------------------- */

typedef struct lg_report_meta {
    const char *url;         /* the first --url */
    const char *const *urls; /* every --url in order; NULL (n_urls 0): just url */
    size_t n_urls;
    const char *model;
    const char *workload;
    uint64_t seed;
    uint32_t tenants;  /* tenants the workload's requests name */
    size_t n_api_keys; /* keys they are spread over (0: no key) */
    uint32_t concurrency;
    uint32_t max_tokens;
    bool stream;
    uint64_t requests_planned; /* 0 when the run was bounded by duration only */
    double duration_planned_s; /* 0 when bounded by requests only */
    uint64_t elapsed_ns;       /* first request sent to last one finished */
    bool interrupted;
} lg_report_meta;

/** Append a one-screen, human-readable summary. s must have been through lg_stats_finish. */
void lg_report_text(kvg_buf *out, const lg_stats *s, const lg_report_meta *m);
/** Append the same summary as one JSON object and a newline (schema in docs/loadgen.md). */
void lg_report_json(kvg_buf *out, const lg_stats *s, const lg_report_meta *m);

/* ---- the runner (client.c) ------------------------------------------------------------------ */

typedef struct lg_config {
    /* Base URLs (1 to LG_MAX_URLS): connection i goes to urls[i % n_urls] and keeps all its
     * requests there, as behind an L4 balancer that spreads connections round robin. */
    const char *const *urls;
    size_t n_urls;
    uint64_t requests; /* 0 = no count limit (then duration_s is set) */
    double duration_s; /* 0 = no time limit */
    uint32_t concurrency;
    const char *model;
    /* API keys: request of tenant t sends Authorization: Bearer api_keys[t % n_api_keys];
     * none (n_api_keys 0): no Authorization header. */
    const char *const *api_keys;
    size_t n_api_keys;
    uint32_t max_tokens;
    bool stream;
    uint32_t timeout_ms; /* whole request, connect to last byte */
    size_t max_response_bytes;
} lg_config;

/** Connections of a run that go to --url index i of n_urls, when it opens `slots` connections
 *  (min(concurrency, requests) or concurrency): slot j goes to URL j mod n_urls. */
uint32_t lg_url_connections(size_t i, size_t n_urls, uint64_t slots);

/** Run the load described by cfg with requests from wl against cfg->urls, accounting every
 *  finished request in stats. Blocks until done, the duration passed, or SIGINT/SIGTERM (then
 *  requests in flight are cancelled and *interrupted is set). Returns 0 (whatever the
 *  requests' outcomes), KVG_ECONFIG for a URL it cannot use (or none), -ENOMEM, or another negative
 *  code when the event loop cannot be set up; *elapsed_ns is written on success. */
int lg_run(const lg_config *cfg, const lg_workload *wl, lg_stats *stats, uint64_t *elapsed_ns,
           bool *interrupted);

#endif

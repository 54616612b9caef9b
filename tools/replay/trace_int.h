/* SPDX-License-Identifier: Apache-2.0 */
/* Between the trace reader (trace.c) and its kvgate-format line parser (trace_kvgate.c): the
 * trace being built and what a bad line reports. */
#ifndef KVG_REPLAY_TRACE_INT_H
#define KVG_REPLAY_TRACE_INT_H

#include "common.h"
#include "replay.h"

/* A trace being read. Requests' keys hold offsets into the pool until the read ends (the pool
 * moves as it grows); the reader turns them into pointers. */
typedef struct trace_builder {
    replay_trace t;
    size_t poolcap, npool;
    size_t tenantcap;
} trace_builder;

/* What is wrong with a line: "FILE:LINE: field: why" (field NULL: "FILE:LINE: why"). why may
 * point into buf. */
typedef struct line_error {
    const char *field;
    const char *why;
    char buf[160];
} line_error;

/** A line that must be a JSON object with a "timestamp" (ms, 0..1e15): the object in *root (in
 *  arena) and the arrival, timestamp x scale, in us. 0, KVG_EPARSE (le says what), -ENOMEM. */
int trace_line_open(const char *line, size_t len, kvg_arena *arena, double scale,
                    const kvg_json **root, uint64_t *arrival_us, line_error *le);
/** A non-negative integer member that fits in max: NULL, or what is wrong ("missing", ...). */
const char *trace_get_uint(const kvg_json *obj, const char *key, uint64_t max, uint64_t *out);

/** Room for n more keys at the end of the pool: *at is where to write them (they count once
 *  trace_pool_commit is called). 0, -ENOMEM. */
int trace_pool_reserve(trace_builder *b, size_t n, uint64_t **at);
/** The n keys reserved last are the request's: r->keys gets their offset, the pool grows. */
void trace_pool_commit(trace_builder *b, replay_request *r, size_t n);

/* The kvgate format's parser: the gateway's body scanner, scope salts and block hashing, and
 * the tenants seen so far. */
typedef struct kvgate_reader kvgate_reader;

/** A parser for one read. 0, -ENOMEM. */
int kvgate_reader_new(const replay_read_options *opt, kvgate_reader **out);
/** NULL is a no-op. */
void kvgate_reader_free(kvgate_reader *k);
/** One line (without its line feed) into *r; keys go to b's pool, a new tenant to b's table.
 *  The arena is the caller's scratch, reset between lines. 0, KVG_EPARSE (le says what is
 *  wrong; nothing was added to b), -ENOMEM. */
int kvgate_parse_line(kvgate_reader *k, const char *line, size_t len, kvg_arena *arena,
                      double time_scale, trace_builder *b, replay_request *r, line_error *le);

#endif

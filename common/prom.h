/* SPDX-License-Identifier: Apache-2.0 */
/* The one writer of Prometheus text exposition (format 0.0.4) every module's /metrics section
 * uses: family headers, escaped label values, samples, and a lock-free latency histogram. */
#ifndef KVG_PROM_H
#define KVG_PROM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"

typedef enum kvg_prom_type {
    KVG_PROM_COUNTER = 0,
    KVG_PROM_GAUGE,
    KVG_PROM_HISTOGRAM,
    KVG_PROM_TYPE_COUNT,
} kvg_prom_type;

/** The name the "# TYPE" line uses ("counter", "gauge", "histogram"); "untyped" when out of
 *  range. */
const char *kvg_prom_type_str(kvg_prom_type type);

/* One label of a sample. The name is a constant of the caller and written as it is; the value
 * is escaped. */
typedef struct kvg_prom_label {
    const char *name;
    const char *value;
} kvg_prom_label;

/* The (labels, count) argument pair of the sample writers from a list of {name, value}:
 *     kvg_prom_put_u64(out, "kvgate_x_total", KVG_PROM_LABELS({"worker", w}, {"code", c}), v);
 * Samples without labels pass NULL, 0. */
#define KVG_PROM_LABELS(...)                                                                       \
    ((const kvg_prom_label[]){__VA_ARGS__}),                                                       \
        (sizeof((const kvg_prom_label[]){__VA_ARGS__}) / sizeof(kvg_prom_label))

/** Append "# HELP name help" and "# TYPE name type" lines. help is written as it is: a
 *  constant of the caller without backslashes or line feeds (which would need escaping). */
void kvg_prom_put_header(kvg_buf *out, const char *name, kvg_prom_type type, const char *help);

/** Append a label value (NUL-terminated), escaping backslash, double quote and line feed as
 *  the format requires; every other byte is written as it is. */
void kvg_prom_put_label_value(kvg_buf *out, const char *value);

/** Append one sample line: name, the labels in the order given (name{a="x",b="y"}, no braces
 *  when nlabels is 0), a space, the value in decimal, a line feed. */
void kvg_prom_put_u64(kvg_buf *out, const char *name, const kvg_prom_label *labels, size_t nlabels,
                      uint64_t value);
/** kvg_prom_put_u64 for a signed value. */
void kvg_prom_put_i64(kvg_buf *out, const char *name, const kvg_prom_label *labels, size_t nlabels,
                      int64_t value);
/** kvg_prom_put_u64 for a float, written as printf's "%.6g" (NaN, +Inf and -Inf as the format
 *  spells them). */
void kvg_prom_put_f64(kvg_buf *out, const char *name, const kvg_prom_label *labels, size_t nlabels,
                      double value);

/** A family with one unlabelled sample: kvg_prom_put_header then kvg_prom_put_u64. */
void kvg_prom_put_scalar_u64(kvg_buf *out, const char *name, kvg_prom_type type, const char *help,
                             uint64_t value);
/** kvg_prom_put_scalar_u64 for a signed value. */
void kvg_prom_put_scalar_i64(kvg_buf *out, const char *name, kvg_prom_type type, const char *help,
                             int64_t value);

/** A family with one label and a sample for each of its n values: the header, then
 *  name{label="label_values[i]"} counts[i] for i < n, each count read once (relaxed). For the
 *  counters kept as an array indexed by an enum, whose names are a table of the same size. */
void kvg_prom_put_by_label(kvg_buf *out, const char *name, kvg_prom_type type, const char *help,
                           const char *label, const char *const *label_values,
                           const _Atomic uint64_t *counts, size_t n);

/* ---- histograms of durations --------------------------------------------------------------- */

/* The most finite buckets a histogram has: the largest set in use (+Inf comes on top). */
#define KVG_PROM_BUCKETS_MAX 15

/* A histogram's layout, shared by all its series: inclusive upper bounds in nanoseconds,
 * ascending (+Inf is implicit), written as le="%g" of the bound in seconds, so that the le values
 * cannot drift from the bounds compared (a bound needs at most 6 significant digits); and the
 * resolution of _sum, a power of ten of nanoseconds (1: _sum has 9 decimals; 1000: 6). A coarser
 * sum wraps later: 2^64 microseconds of request time is 584,000 years, 2^64 ns only 584. */
typedef struct kvg_prom_buckets {
    const uint64_t *bounds_ns;
    size_t count; /* <= KVG_PROM_BUCKETS_MAX */
    uint64_t sum_unit_ns;
} kvg_prom_buckets;

/* Counts of one histogram series. Buckets are per bucket, not cumulative, so an observation
 * is two relaxed atomic adds from any thread; the writer cumulates. */
typedef struct kvg_prom_hist {
    _Atomic uint64_t buckets[KVG_PROM_BUCKETS_MAX + 1]; /* last one: above every bound */
    _Atomic uint64_t sum;                               /* in sum_unit_ns, rounded */
} kvg_prom_hist;

/** Which stripe of striped counts the calling thread adds to: 0 on every thread but the
 *  gateway's event loops, which set their own (kvg_prom_stripe_set: loop i takes i + 1). Counts
 *  that every request of every loop adds to (a worker's requests, latencies, usage) are kept
 *  once per stripe and summed when read: with one copy, two loops added to the same cache lines
 *  ~40 times a request, and kvgate's CPU per request grew 25% from one loop to two where
 *  nginx's grew 4% (bench/proxy --scaling, 2026-12-02). Stripe 0 is shared, so every add stays
 *  atomic; on a loop's own stripe it never waits for another core. */
extern _Thread_local unsigned kvg_prom_stripe;
static inline void kvg_prom_stripe_set(unsigned stripe)
{
    kvg_prom_stripe = stripe;
}

/** Set every count of h to 0 (for memory not zeroed by calloc or a static initialiser). */
void kvg_prom_hist_init(kvg_prom_hist *h);

/** Count one observation of ns nanoseconds in h (laid out by b); safe from any thread.
 *  Inline so that, given the address of a const layout whose initialiser the calling file
 *  sees, the bucket search runs over constants and the unit conversion is a multiply: as cheap
 *  as a histogram written by hand for that layout (this is on the request path). */
static inline void kvg_prom_hist_observe(kvg_prom_hist *h, const kvg_prom_buckets *b, uint64_t ns)
{
    size_t i = 0;
    while (i < b->count && ns > b->bounds_ns[i])
        i++;
    atomic_fetch_add_explicit(&h->buckets[i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum, (ns + b->sum_unit_ns / 2) / b->sum_unit_ns,
                              memory_order_relaxed);
}

/** Add src's counts to dst (a copy the caller owns, for summing stripes before
 *  kvg_prom_put_hist). */
void kvg_prom_hist_add(kvg_prom_hist *dst, const kvg_prom_hist *src);

/** Append one series of a histogram family (its header is the caller's, type
 *  KVG_PROM_HISTOGRAM): name_bucket with the labels and le, cumulative, ending with le="+Inf";
 *  name_sum in seconds with the layout's resolution; name_count, equal to the +Inf bucket.
 *  Each count is read once, so the series is consistent (monotonic buckets, count = +Inf)
 *  even while other threads observe. */
void kvg_prom_put_hist(kvg_buf *out, const char *name, const kvg_prom_label *labels, size_t nlabels,
                       const kvg_prom_hist *h, const kvg_prom_buckets *b);

#endif

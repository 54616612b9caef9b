/* SPDX-License-Identifier: Apache-2.0 */
/* The engines' own load: a parser for the two vLLM series kvgate routes on, read out of a
 * Prometheus text page, and the per-worker storage of the last values scraped. */
#include "router_int.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NAME_WAITING "vllm:num_requests_waiting"
#define NAME_KV_USAGE "vllm:kv_cache_usage_perc"
/* Longer numbers than this are not something an exporter writes: the sample is skipped. */
#define VALUE_MAX 64

static bool is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\r';
}

static bool is_name_char(char c, bool first)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
           (!first && c >= '0' && c <= '9');
}

/* The value of the sample on line [p, end) after the metric name, or false when the rest of
 * the line is not "[{labels}] value [timestamp]". */
static bool sample_value(const char *p, const char *end, double *out)
{
    bool labels = false;
    const char *q = p;
    while (q < end && is_blank(*q))
        q++;
    if (q < end && *q == '{') {
        labels = true;
        p = q;
        /* Label values are quoted strings in which a backslash escapes the next byte, so
         * braces, quotes and spaces inside them do not end the set. */
        bool quoted = false;
        for (p++;; p++) {
            if (p == end)
                return false;
            if (quoted) {
                if (*p == '\\') {
                    if (++p == end)
                        return false;
                } else if (*p == '"') {
                    quoted = false;
                }
            } else if (*p == '"') {
                quoted = true;
            } else if (*p == '}') {
                p++;
                break;
            }
        }
    }
    const char *v = p;
    while (v < end && is_blank(*v))
        v++;
    if (v == p && !labels)
        return false; /* the name runs into something else, or no value */
    const char *ve = v;
    while (ve < end && !is_blank(*ve))
        ve++;
    size_t n = (size_t)(ve - v);
    if (n == 0 || n >= VALUE_MAX)
        return false;
    char buf[VALUE_MAX];
    memcpy(buf, v, n);
    buf[n] = '\0';
    /* strtod takes what Go's ParseFloat (Prometheus) does: decimals, exponents, NaN, +Inf,
     * -Inf. A NUL inside the token stops it short of the end, which rejects the token. */
    char *e;
    double d = strtod(buf, &e);
    if (e != buf + n)
        return false;
    *out = d;
    return true;
}

static void parse_line(const char *p, const char *end, double *waiting, kvg_engine_load *out)
{
    while (p < end && is_blank(*p))
        p++;
    if (p == end || *p == '#' || !is_name_char(*p, true))
        return;
    const char *name = p;
    while (p < end && is_name_char(*p, p == name))
        p++;
    size_t len = (size_t)(p - name);
    bool is_waiting = len == sizeof(NAME_WAITING) - 1 && memcmp(name, NAME_WAITING, len) == 0;
    bool is_kv = len == sizeof(NAME_KV_USAGE) - 1 && memcmp(name, NAME_KV_USAGE, len) == 0;
    if (!is_waiting && !is_kv)
        return;
    double v;
    if (!sample_value(p, end, &v) || isnan(v))
        return;
    if (is_waiting) {
        /* A sum over engines (data-parallel ranks each export a label set); +Inf saturates. */
        *waiting += v > 0 ? v : 0;
        out->have_waiting = true;
    } else {
        /* The fullest engine decides: a request may land on it. */
        float f = v > 1 ? 1.0f : v > 0 ? (float)v : 0.0f;
        if (!out->have_kv_usage || f > out->kv_usage)
            out->kv_usage = f;
        out->have_kv_usage = true;
    }
}

int kvg_engine_metrics_parse(const char *text, size_t len, kvg_engine_load *out)
{
    if (!out || (!text && len))
        return -EINVAL;
    kvg_engine_load load = {0};
    double waiting = 0;
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        if ((size_t)(le - p) <= KVG_ENGINE_METRICS_LINE_MAX)
            parse_line(p, le, &waiting, &load);
        p = nl ? nl + 1 : end;
    }
    load.waiting = waiting >= (double)UINT32_MAX ? UINT32_MAX : (uint32_t)(waiting + 0.5);
    *out = load;
    return 0;
}

/* ---- per-worker storage -------------------------------------------------------------------- */

void kvg_worker_set_engine_load(kvg_worker *w, uint32_t waiting, float kv_usage, uint64_t now_ns)
{
    if (!(kv_usage > 0)) /* NaN too */
        kv_usage = 0;
    else if (kv_usage > 1)
        kv_usage = 1;
    uint32_t bits;
    memcpy(&bits, &kv_usage, sizeof(bits));
    atomic_store_explicit(&w->engine_waiting, waiting, memory_order_relaxed);
    atomic_store_explicit(&w->engine_kv_usage, bits, memory_order_relaxed);
    /* Release: a reader that sees this time sees values at least this recent. */
    atomic_store_explicit(&w->engine_load_ns, now_ns ? now_ns : 1, memory_order_release);
}

bool kvg_worker_engine_load(const kvg_worker *w, uint64_t now_ns, uint64_t max_age_ns,
                            uint32_t *waiting, float *kv_usage)
{
    kvg_worker *mw = (kvg_worker *)w;
    uint64_t at = atomic_load_explicit(&mw->engine_load_ns, memory_order_acquire);
    if (!at || (now_ns > at && now_ns - at > max_age_ns))
        return false;
    uint32_t bits = atomic_load_explicit(&mw->engine_kv_usage, memory_order_relaxed);
    if (waiting)
        *waiting = atomic_load_explicit(&mw->engine_waiting, memory_order_relaxed);
    if (kv_usage)
        memcpy(kv_usage, &bits, sizeof(*kv_usage));
    return true;
}

void kvg_worker_record_scrape_error(kvg_worker *w)
{
    atomic_fetch_add_explicit(&w->scrape_errors, 1, memory_order_relaxed);
}

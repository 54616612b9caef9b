/* SPDX-License-Identifier: Apache-2.0 */
/* Prometheus text exposition (format 0.0.4): the writer behind every /metrics section. */
#include "prom.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *const type_names[KVG_PROM_TYPE_COUNT] = {
    [KVG_PROM_COUNTER] = "counter",
    [KVG_PROM_GAUGE] = "gauge",
    [KVG_PROM_HISTOGRAM] = "histogram",
};

const char *kvg_prom_type_str(kvg_prom_type type)
{
    return (unsigned)type < KVG_PROM_TYPE_COUNT ? type_names[type] : "untyped";
}

void kvg_prom_put_header(kvg_buf *out, const char *name, kvg_prom_type type, const char *help)
{
    kvg_buf_printf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, kvg_prom_type_str(type));
}

void kvg_prom_put_label_value(kvg_buf *out, const char *value)
{
    /* Copy runs of plain bytes at once: values rarely hold anything to escape. */
    const char *run = value;
    for (const char *p = value; *p; p++) {
        const char *esc = *p == '\\' ? "\\\\" : *p == '"' ? "\\\"" : *p == '\n' ? "\\n" : NULL;
        if (!esc)
            continue;
        kvg_buf_append(out, run, (size_t)(p - run));
        kvg_buf_puts(out, esc);
        run = p + 1;
    }
    kvg_buf_puts(out, run);
}

/* name suffix{labels,le="..."} and the space before the value; the braces only when there is a
 * label. suffix and le may be NULL. */
static void put_series(kvg_buf *out, const char *name, const char *suffix,
                       const kvg_prom_label *labels, size_t nlabels, const char *le)
{
    kvg_buf_puts(out, name);
    if (suffix)
        kvg_buf_puts(out, suffix);
    if (nlabels || le) {
        kvg_buf_putc(out, '{');
        for (size_t i = 0; i < nlabels; i++) {
            if (i)
                kvg_buf_putc(out, ',');
            kvg_buf_puts(out, labels[i].name);
            kvg_buf_puts(out, "=\"");
            kvg_prom_put_label_value(out, labels[i].value);
            kvg_buf_putc(out, '"');
        }
        if (le) {
            if (nlabels)
                kvg_buf_putc(out, ',');
            kvg_buf_puts(out, "le=\"");
            kvg_buf_puts(out, le);
            kvg_buf_putc(out, '"');
        }
        kvg_buf_putc(out, '}');
    }
    kvg_buf_putc(out, ' ');
}

static void put_u64_line(kvg_buf *out, uint64_t v)
{
    char digits[24];
    size_t n = kvg_fmt_u64(digits, v);
    digits[n++] = '\n';
    kvg_buf_append(out, digits, n);
}

void kvg_prom_put_u64(kvg_buf *out, const char *name, const kvg_prom_label *labels, size_t nlabels,
                      uint64_t value)
{
    put_series(out, name, NULL, labels, nlabels, NULL);
    put_u64_line(out, value);
}

void kvg_prom_put_i64(kvg_buf *out, const char *name, const kvg_prom_label *labels, size_t nlabels,
                      int64_t value)
{
    put_series(out, name, NULL, labels, nlabels, NULL);
    if (value < 0)
        kvg_buf_putc(out, '-');
    /* Negate in unsigned arithmetic: -INT64_MIN does not fit in int64_t. */
    put_u64_line(out, value < 0 ? -(uint64_t)value : (uint64_t)value);
}

void kvg_prom_put_f64(kvg_buf *out, const char *name, const kvg_prom_label *labels, size_t nlabels,
                      double value)
{
    put_series(out, name, NULL, labels, nlabels, NULL);
    /* printf would write "nan" and "inf", which the format does not accept. */
    if (isnan(value))
        kvg_buf_puts(out, "NaN\n");
    else if (isinf(value))
        kvg_buf_puts(out, value > 0 ? "+Inf\n" : "-Inf\n");
    else
        kvg_buf_printf(out, "%.6g\n", value);
}

void kvg_prom_put_scalar_u64(kvg_buf *out, const char *name, kvg_prom_type type, const char *help,
                             uint64_t value)
{
    kvg_prom_put_header(out, name, type, help);
    kvg_prom_put_u64(out, name, NULL, 0, value);
}

void kvg_prom_put_scalar_i64(kvg_buf *out, const char *name, kvg_prom_type type, const char *help,
                             int64_t value)
{
    kvg_prom_put_header(out, name, type, help);
    kvg_prom_put_i64(out, name, NULL, 0, value);
}

void kvg_prom_put_by_label(kvg_buf *out, const char *name, kvg_prom_type type, const char *help,
                           const char *label, const char *const *label_values,
                           const _Atomic uint64_t *counts, size_t n)
{
    kvg_prom_put_header(out, name, type, help);
    for (size_t i = 0; i < n; i++)
        kvg_prom_put_u64(
            out, name, KVG_PROM_LABELS({label, label_values[i]}),
            atomic_load_explicit((_Atomic uint64_t *)&counts[i], memory_order_relaxed));
}

void kvg_prom_hist_init(kvg_prom_hist *h)
{
    for (size_t i = 0; i <= KVG_PROM_BUCKETS_MAX; i++)
        atomic_init(&h->buckets[i], 0u);
    atomic_init(&h->sum, 0u);
}

_Thread_local unsigned kvg_prom_stripe;

void kvg_prom_hist_add(kvg_prom_hist *dst, const kvg_prom_hist *src)
{
    kvg_prom_hist *from = (kvg_prom_hist *)src; /* atomic loads take non-const pointers */
    for (size_t i = 0; i <= KVG_PROM_BUCKETS_MAX; i++)
        atomic_fetch_add_explicit(&dst->buckets[i],
                                  atomic_load_explicit(&from->buckets[i], memory_order_relaxed),
                                  memory_order_relaxed);
    atomic_fetch_add_explicit(&dst->sum, atomic_load_explicit(&from->sum, memory_order_relaxed),
                              memory_order_relaxed);
}

void kvg_prom_put_hist(kvg_buf *out, const char *name, const kvg_prom_label *labels, size_t nlabels,
                       const kvg_prom_hist *h, const kvg_prom_buckets *b)
{
    assert(b->count <= KVG_PROM_BUCKETS_MAX && b->sum_unit_ns >= 1 &&
           b->sum_unit_ns <= 1000000000u);
    kvg_prom_hist *counts = (kvg_prom_hist *)h; /* atomic loads take non-const pointers */
    size_t nb = b->count;
    uint64_t cum = 0;
    for (size_t i = 0; i <= nb; i++) {
        char le[32];
        if (i < nb)
            snprintf(le, sizeof(le), "%g", (double)b->bounds_ns[i] / 1e9);
        else
            memcpy(le, "+Inf", sizeof("+Inf"));
        /* Read each bucket once and cumulate the copy: the le series stays monotonic while
         * other threads observe. */
        cum += atomic_load_explicit(&counts->buckets[i], memory_order_relaxed);
        put_series(out, name, "_bucket", labels, nlabels, le);
        put_u64_line(out, cum);
    }

    /* Seconds with as many decimals as the unit has below one second: a fixed-point sum
     * printed exactly, never through a double's rounding. */
    uint64_t per_second = 1000000000u / b->sum_unit_ns;
    int decimals = 0;
    uint64_t scale = 1;
    for (; scale < per_second; scale *= 10)
        decimals++;
    assert(scale * b->sum_unit_ns == 1000000000u); /* a power of ten of nanoseconds */
    uint64_t sum = atomic_load_explicit(&counts->sum, memory_order_relaxed);
    put_series(out, name, "_sum", labels, nlabels, NULL);
    if (decimals)
        kvg_buf_printf(out, "%llu.%0*llu\n", (unsigned long long)(sum / per_second), decimals,
                       (unsigned long long)(sum % per_second));
    else
        put_u64_line(out, sum);

    put_series(out, name, "_count", labels, nlabels, NULL);
    put_u64_line(out, cum);
}

/* SPDX-License-Identifier: Apache-2.0 */
/* Histogram layouts of what users of a language model feel: time to first token and the time
 * between output events. Shared by the per-worker (router/) and per-tenant (tenancy/) series so
 * that their buckets agree; include it only where a histogram is observed or written (the
 * layouts are static, so the bucket search in kvg_prom_hist_observe runs over constants). */
#ifndef KVG_COMMON_PROM_LLM_H
#define KVG_COMMON_PROM_LLM_H

#include "common.h"
#include "prom.h"

#define KVG_MS(x) ((uint64_t)((x)*1000000.0))

/* Time to first token: a cached short prompt answers in tens of milliseconds, a long uncached
 * one or a queue in seconds. _sum in microseconds. */
static const uint64_t kvg_prom_ttft_bounds_ns[] = {
    KVG_MS(10),    KVG_MS(25),    KVG_MS(50),    KVG_MS(100),  KVG_MS(250),
    KVG_MS(500),   KVG_MS(1000),  KVG_MS(2500),  KVG_MS(5000), KVG_MS(10000),
    KVG_MS(20000), KVG_MS(30000), KVG_MS(60000),
};
static const kvg_prom_buckets kvg_prom_ttft_buckets = {
    .bounds_ns = kvg_prom_ttft_bounds_ns,
    .count = KVG_ARRAY_LEN(kvg_prom_ttft_bounds_ns),
    .sum_unit_ns = 1000,
};

/* Inter-token latency: decode steps take 5 to 100 ms on GPUs; the top catches stalls. */
static const uint64_t kvg_prom_itl_bounds_ns[] = {
    KVG_MS(1),  KVG_MS(2.5), KVG_MS(5),   KVG_MS(10),  KVG_MS(20),   KVG_MS(30),   KVG_MS(50),
    KVG_MS(75), KVG_MS(100), KVG_MS(250), KVG_MS(500), KVG_MS(1000), KVG_MS(2500), KVG_MS(5000),
};
static const kvg_prom_buckets kvg_prom_itl_buckets = {
    .bounds_ns = kvg_prom_itl_bounds_ns,
    .count = KVG_ARRAY_LEN(kvg_prom_itl_bounds_ns),
    .sum_unit_ns = 1000,
};

#endif

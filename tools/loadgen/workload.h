/* SPDX-License-Identifier: Apache-2.0 */
/* Workloads of kvgate-loadgen: deterministic chat requests as a function of (seed, index). */
#ifndef KVG_LOADGEN_WORKLOAD_H
#define KVG_LOADGEN_WORKLOAD_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"

/* Bytes of text per simulated token: engines' BPE tokenizers and the simulated worker's
 * approximation both average about 4 bytes of English per token. */
#define LG_BYTES_PER_TOKEN 4

/* lg_item.prefix when the request shares no prefix with any other. */
#define LG_NO_PREFIX UINT32_MAX

/* One chat message; content is not NUL-terminated necessarily, len counts its bytes. */
typedef struct lg_message {
    const char *role; /* "system", "user", "assistant" */
    const char *content;
    size_t len;
} lg_message;

/* One request of a workload. Memory belongs to the arena passed to lg_workload_item or to the
 * workload itself; it stays valid until the arena is reset or the workload freed. */
typedef struct lg_item {
    const lg_message *messages;
    size_t n_messages;
    /* Which tenant sends it (0 .. lg_workload_tenants()-1). Single-tenant workloads say 0; a
     * multi-tenant workload names one here and the runner maps it to that tenant's API key. */
    uint32_t tenant;
    /* The shared opening (system prompt, document) the request starts with, LG_NO_PREFIX for
     * none: lets reports break down hits by prefix. */
    uint32_t prefix;
} lg_item;

typedef struct lg_workload lg_workload;

/** Create the workload called name, seeded with seed. Shared texts (system prompts) are
 *  generated here once, so lg_workload_item only assembles. Returns 0 and *out, KVG_ENOTFOUND
 *  for an unknown name, or -ENOMEM. */
int lg_workload_new(const char *name, uint64_t seed, lg_workload **out);
/** Free a workload; NULL is a no-op. Items it produced must no longer be used. */
void lg_workload_free(lg_workload *wl);
/** The workload's name, as passed to lg_workload_new. */
const char *lg_workload_name(const lg_workload *wl);
/** How many tenants the workload's items name (1 for single-tenant workloads). */
uint32_t lg_workload_tenants(const lg_workload *wl);
/** How many shared prefixes the workload has (0 when none). */
uint32_t lg_workload_prefixes(const lg_workload *wl);
/** Build request number index. The result depends only on (name, seed, index), never on the
 *  order of calls, so runs are reproducible at any concurrency. Allocates from arena; returns
 *  0 and *out, or -ENOMEM (out untouched). Thread-safe: the workload is only read. */
int lg_workload_item(const lg_workload *wl, uint64_t index, kvg_arena *arena, lg_item *out);

/** Number of built-in workloads, for listing them. */
size_t lg_workload_count(void);
/** Name of built-in workload i (< lg_workload_count()), NULL past the end. */
const char *lg_workload_list_name(size_t i);
/** One-line description of built-in workload i, NULL past the end. */
const char *lg_workload_list_help(size_t i);

#endif

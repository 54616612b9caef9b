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

/* Tenants of the multi-tenant workload when lg_workload_opts.tenants is 0, and the most. */
#define LG_MT_DEFAULT_TENANTS 8
#define LG_MT_MAX_TENANTS 1024
/* Tenants per sharing group in the multi-tenant workload: tenant t is in group
 * t / LG_MT_GROUP_SIZE (the last group is smaller when the count does not divide). */
#define LG_MT_GROUP_SIZE 2
/* max_tokens assumed when lg_workload_opts.max_tokens is 0 (the loadgen's default). */
#define LG_DEFAULT_MAX_TOKENS 16

/* Parameters of a workload beyond its name and seed; zero fields take the defaults. Each is
 * part of what a request depends on: same name, seed and options, same requests. */
typedef struct lg_workload_opts {
    uint32_t tenants; /* multi-tenant: tenants (1..LG_MT_MAX_TENANTS); others ignore it */
    /* max_tokens every request carries. Chat histories replay the replies the simulated
     * worker generates for it (docs/simworker.md "Generated text"), so a follow-up turn
     * repeats its previous turn's prompt and output token for token. */
    uint32_t max_tokens;
} lg_workload_opts;

/** Create the workload called name, seeded with seed, with default options. Shared texts
 *  (system prompts, documents) are generated here once, so lg_workload_item only assembles.
 *  Returns 0 and *out, KVG_ENOTFOUND for an unknown name, or -ENOMEM. */
int lg_workload_new(const char *name, uint64_t seed, lg_workload **out);
/** Same with options (NULL: defaults). Also -EINVAL for tenants above LG_MT_MAX_TENANTS. */
int lg_workload_new_opts(const char *name, uint64_t seed, const lg_workload_opts *opts,
                         lg_workload **out);
/** Free a workload; NULL is a no-op. Items it produced must no longer be used. */
void lg_workload_free(lg_workload *wl);
/** The workload's name, as passed to lg_workload_new. */
const char *lg_workload_name(const lg_workload *wl);
/** How many tenants the workload's items name (1 for single-tenant workloads). */
uint32_t lg_workload_tenants(const lg_workload *wl);
/** The sharing group of a tenant (0 for single-tenant workloads): multi-tenant tenants of one
 *  group quote the same documents and open with the same preamble. */
uint32_t lg_workload_group(const lg_workload *wl, uint32_t tenant);
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

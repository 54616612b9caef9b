/* SPDX-License-Identifier: Apache-2.0 */
/* Response affinity: which worker made a stored response, learned from the answers the gateway
 * relays, so that what depends on it (previous_response_id, GET /v1/responses/{id}) goes back
 * to the engine that holds it (docs/api.md, "Responses and their worker"). */
#ifndef KVG_RESP_AFFINITY_H
#define KVG_RESP_AFFINITY_H

#include <stdbool.h>
#include <stddef.h>

/* Longest response id remembered; longer ones are not (vLLM's are "resp_" + 32 hex). */
#define KVG_RESP_ID_MAX 128
/* How many ids the map holds at most. */
#define KVG_RESP_AFFINITY_SLOTS 8192

/* Longest sharing scope name an entry is kept for ("tenant:<id>", "group:<name>", "global"). */
#define KVG_RESP_SCOPE_MAX 127

/** Remember that response `id` (len bytes), made for a request of sharing scope `scope`, was
 *  made by worker `worker` (NUL-terminated, at most KVG_WORKER_NAME_MAX bytes). Entries are per
 *  scope: a tenant that presents another scope's id is not sent to the engine that holds it.
 *  The map is bounded and shared by every thread: an entry replaces the one in its slot (an
 *  older one may be forgotten before the map is full). Ids over KVG_RESP_ID_MAX bytes or
 *  holding a NUL, scopes over KVG_RESP_SCOPE_MAX bytes, are ignored. Thread-safe. */
void kvg_resp_affinity_learn(const char *scope, const char *id, size_t len, const char *worker);

/** The worker remembered for response `id` in `scope` into out (out_len bytes, NUL-terminated):
 *  true, or false when unknown (or forgotten). Thread-safe. */
bool kvg_resp_affinity_find(const char *scope, const char *id, size_t len, char *out,
                            size_t out_len);

/* Looks for the id of a response in the first bytes of an answer: the first "id":"resp_..." of
 * a JSON body or of the first SSE event (within KVG_RESP_ID_SCAN_BYTES). Zero-initialised. */
#define KVG_RESP_ID_SCAN_BYTES 1024
typedef struct kvg_resp_id_scan {
    char buf[KVG_RESP_ID_SCAN_BYTES];
    size_t len;
    bool done; /* found, or given up */
} kvg_resp_id_scan;

/** Feed the next answer bytes. Returns true once, when the id is complete: *id (inside s,
 *  valid until s changes) and *id_len are set and s->done. After that, or once the first
 *  KVG_RESP_ID_SCAN_BYTES bytes held none, it returns false without looking. */
bool kvg_resp_id_scan_feed(kvg_resp_id_scan *s, const char *data, size_t len, const char **id,
                           size_t *id_len);

#endif

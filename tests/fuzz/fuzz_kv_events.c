/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target: kvg_kv_decode on any bytes, then the decoded batch applied to a small index.
 * Decoding either fails with KVG_EPARSE or KVG_ELIMIT and a message, or gives a batch whose
 * events and hashes add up; the same bytes decode the same way again with the decoder reused;
 * a decoder with tight limits accepts nothing the default one refuses; applying the batch keeps
 * the index's invariants (tiers, speculative entries and their ring included: the worker's
 * source and a record of the batch's first keys, as the gateway's decision, come from the input,
 * and a clock moves on between inputs), and its tiers agree with the batch's last word on each
 * key. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "index_int.h"
#include "router.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static kvg_kv_decoder *dec, *tight;
static kvg_prefix_index *idx;
static uint64_t now_ms;

static uint64_t fuzz_clock(void *arg)
{
    (void)arg;
    return now_ms;
}

static void init(void)
{
    kvg_kv_limits lim = {.max_events = 8, .max_hashes = 16, .max_total_hashes = 32, .max_depth = 4};
    kvg_index_config cfg = {.max_entries = 64, .speculative_ttl_ms = 1000, .clock_ms = fuzz_clock};
    kvg_index_worker w[] = {{.id = 1, .name = "a", .capacity = 40}, {.id = 2, .name = "b"}};
    if (kvg_kv_decoder_new(NULL, &dec) || kvg_kv_decoder_new(&lim, &tight) ||
        kvg_index_new(&cfg, &idx) || kvg_index_set_workers(idx, w, 2))
        abort();
}

static void check_batch(const kvg_kv_batch *b)
{
    size_t total = 0;
    for (size_t i = 0; i < b->nevents; i++) {
        const kvg_kv_event *e = &b->events[i];
        if ((unsigned)e->kind >= KVG_KV_EVENT_KIND_COUNT ||
            (unsigned)e->medium >= KVG_KV_MEDIUM_COUNT)
            abort();
        if (e->kind == KVG_KV_ALL_BLOCKS_CLEARED && e->nhashes)
            abort();
        if (e->nhashes && e->hashes != b->events[0].hashes + total)
            abort();
        total += e->nhashes;
    }
    if (total != b->nhashes)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!dec)
        init();
    /* An exact-size copy, so a read past the end is seen. */
    uint8_t *p = malloc(size ? size : 1);
    if (!p)
        return 0;
    memcpy(p, data, size);
    kvg_kv_batch b;
    int rc = kvg_kv_decode(dec, p, size, &b);
    if (rc != 0) {
        if (rc != KVG_EPARSE && rc != KVG_ELIMIT && rc != -ENOMEM)
            abort();
        if (!kvg_kv_decoder_error(dec)[0])
            abort();
        kvg_kv_batch t;
        if (kvg_kv_decode(tight, p, size, &t) == 0)
            abort();
        free(p);
        return 0;
    }
    check_batch(&b);
    size_t nevents = b.nevents, nhashes = b.nhashes;
    uint64_t first = nhashes ? b.events[0].hashes[0] : 0;

    kvg_kv_batch t;
    if (kvg_kv_decode(tight, p, size, &t) == 0) {
        check_batch(&t);
        if (t.nevents != nevents || t.nhashes != nhashes)
            abort();
    }
    /* Decoding again with the same decoder gives the same batch. */
    if (kvg_kv_decode(dec, p, size, &b) != 0 || b.nevents != nevents || b.nhashes != nhashes ||
        (nhashes && b.events[0].hashes[0] != first))
        abort();

    uint64_t worker = 1 + (size & 1);
    /* The worker's source, a decision's record of the batch's first keys, time passing. */
    kvg_index_source src = (kvg_index_source)(size / 2 % KVG_INDEX_SOURCE_COUNT);
    if (kvg_index_set_source(idx, worker, src) != 0)
        abort();
    if (nhashes) {
        int rrc = kvg_index_record(idx, worker, b.events[0].hashes, KVG_MIN(nhashes, (size_t)8));
        if (rrc != 0 && rrc != -ENOMEM)
            abort();
    }
    now_ms += size * 37 % 1500;
    kvg_index_expire(idx, 0);

    int arc = kvg_index_apply_events(idx, worker, &b, NULL);
    if (arc != 0 && arc != -ENOMEM)
        abort();
    if (kvg_index_check(idx) != 0)
        abort();
    /* Tiers, key by key (the first 64 of the batch): never deeper on the GPU than on any tier;
     * a key whose last event in the batch removed it from the GPU is not on the GPU; a batch
     * ending with AllBlocksCleared leaves the worker nothing. */
    if (arc == 0) {
        for (size_t e = 0; e < nevents; e++) {
            const kvg_kv_event *ev = &b.events[e];
            for (size_t i = 0; i < ev->nhashes && i < 64; i++) {
                uint64_t k = ev->hashes[i];
                uint32_t any = 0, gpu = 0;
                if (!kvg_index_match_tiers(idx, &k, 1, &worker, 1, &any, &gpu))
                    gpu = any;
                if (gpu > any)
                    abort();
                bool last = true, cleared = false;
                for (size_t f = e + 1; f < nevents && last; f++) {
                    cleared |= b.events[f].kind == KVG_KV_ALL_BLOCKS_CLEARED;
                    for (size_t j = 0; j < b.events[f].nhashes && last; j++)
                        last = b.events[f].hashes[j] != k;
                }
                bool gpu_medium =
                    ev->medium == KVG_KV_MEDIUM_GPU || ev->medium == KVG_KV_MEDIUM_ABSENT;
                if (last && !cleared && ev->kind == KVG_KV_BLOCK_REMOVED && gpu_medium && gpu)
                    abort();
                /* a later key of the same removal event may be the same key: only the event's
                 * last mention counts, which the check above already is for removals */
                if (last && cleared && any)
                    abort();
            }
        }
        if (nevents && b.events[nevents - 1].kind == KVG_KV_ALL_BLOCKS_CLEARED &&
            kvg_index_worker_entries(idx, worker) != 0)
            abort();
    }
    free(p);
    return 0;
}

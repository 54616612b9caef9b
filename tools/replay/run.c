/* SPDX-License-Identifier: Apache-2.0 */
/* The policies by name, and one configuration's rows: every policy, then the references. */
#include "replay.h"

#include <errno.h>
#include <math.h>
#include <string.h>

#include "common.h"

static const struct {
    const char *name;
    replay_peer peer;
} peers[] = {
    {"sglang", REPLAY_PEER_SGLANG}, {"dynamo", REPLAY_PEER_DYNAMO}, {"llmd", REPLAY_PEER_LLMD},
    {"aibrix", REPLAY_PEER_AIBRIX}, {"chwbl", REPLAY_PEER_CHWBL},
};

int replay_policy_parse(const char *name, replay_policy *out)
{
    memset(out, 0, sizeof(*out));
    if (strlen(name) >= sizeof(out->name))
        return -EINVAL;
    for (size_t i = 0; i < KVG_ARRAY_LEN(peers); i++) {
        if (strcmp(name, peers[i].name) == 0) {
            out->peer = peers[i].peer;
            strcpy(out->name, name);
            return 0;
        }
    }
    kvg_policy_kind kind;
    if (kvg_policy_kind_parse(name, &kind) < 0)
        return -EINVAL;
    out->peer = REPLAY_PEER_NONE;
    kvg_policy_config_init(&out->cfg);
    out->cfg.kind = kind;
    strcpy(out->name, name);
    return 0;
}

/* The report's order: kvgate's default first, then its other policies, then the peers. */
static const char *const all_policies[] = {
    "cost",   "prefix_only", "least_loaded", "round_robin", "random",
    "sglang", "dynamo",      "llmd",         "aibrix",      "chwbl",
};

size_t replay_policy_all(replay_policy *out, size_t cap)
{
    size_t n = 0;
    for (size_t i = 0; i < KVG_ARRAY_LEN(all_policies) && n < cap; i++)
        if (replay_policy_parse(all_policies[i], &out[n]) == 0)
            n++;
    return n;
}

uint32_t replay_capacity_for(uint64_t distinct, double fraction, unsigned workers)
{
    double per = floor(fraction * (double)distinct / (workers ? workers : 1));
    return per < 1 ? 1 : per > UINT32_MAX / 2 ? UINT32_MAX / 2 : (uint32_t)per;
}

int replay_run(const replay_trace *t, replay_engine_config *ec, double fraction,
               const replay_policy *policies, size_t npolicies, replay_row *rows,
               uint64_t *distinct)
{
    memset(rows, 0, (npolicies + REPLAY_REFERENCE_ROWS) * sizeof(*rows));
    replay_row *refs = rows + npolicies;
    int rc = replay_ceiling(t, &refs[0], distinct);
    if (rc < 0)
        return rc;
    if (!ec->capacity)
        ec->capacity = replay_capacity_for(*distinct, fraction, ec->workers);
    uint64_t pooled = (uint64_t)ec->capacity * ec->workers;
    rc = replay_pooled_lru(t, pooled, &refs[1]);
    if (rc == 0)
        rc = replay_min(t, pooled, &refs[2]);
    for (size_t i = 0; rc == 0 && i < npolicies; i++)
        rc = replay_simulate(t, ec, &policies[i], &rows[i]);
    return rc;
}

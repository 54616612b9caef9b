/* SPDX-License-Identifier: Apache-2.0 */
/* The prefix map in Redis: key names, the chain as the scripts take it, and the lookup's reply.
 * The scripts themselves are redis_map_lookup.lua and redis_map_record.lua, embedded at build
 * time with their SHA-1 (embed_lua.py); docs/redis.md has the schema. */
#include "redis_int.h"

#include <string.h>

#include <hiredis/hiredis.h>

/* Room left in a key for what follows the prefix: ":m:{" 16 "}:" 16 and the NUL. */
#define KEY_TAIL_MAX 40

size_t redis_map_key(char *out, const char *prefix, kvg_redis_mode mode, uint64_t root,
                     uint64_t map_id)
{
    /* The configured prefix is at most 64 bytes (kvg_redis_new checks); a longer one is cut
     * rather than the worker's id. Written without snprintf: a lookup names every candidate. */
    size_t n = strnlen(prefix, REDIS_MAP_KEY_MAX - KEY_TAIL_MAX);
    memcpy(out, prefix, n);
    memcpy(out + n, ":m:", 3);
    n += 3;
    if (mode == KVG_REDIS_CLUSTER) {
        /* The hash tag is the root alone: every worker's set for one chain sits in one slot,
         * so a lookup of all candidates is one script on one node. */
        out[n++] = '{';
        kvg_fmt_hex64(out + n, root);
        n += 16;
        out[n++] = '}';
        out[n++] = ':';
    }
    kvg_fmt_hex64(out + n, map_id);
    n += 16;
    out[n] = '\0';
    return n;
}

void redis_map_pack_keys(const uint64_t *keys, size_t nkeys, unsigned char *out)
{
    for (size_t i = 0; i < nkeys; i++) {
        uint64_t k = keys[i];
        for (int b = 0; b < 8; b++)
            out[8 * i + (size_t)b] = (unsigned char)(k >> (8 * b));
    }
}

int redis_map_parse_lookup(const struct redisReply *reply, size_t nworkers, uint32_t *matched)
{
    if (!reply || reply->type != REDIS_REPLY_ARRAY || reply->elements != nworkers)
        return KVG_EPROTO;
    /* Everything is checked before matched is written. */
    for (size_t i = 0; i < nworkers; i++) {
        const redisReply *e = reply->element[i];
        if (!e || e->type != REDIS_REPLY_INTEGER || e->integer < 0 ||
            (unsigned long long)e->integer > UINT32_MAX)
            return KVG_EPROTO;
    }
    for (size_t i = 0; i < nworkers; i++)
        matched[i] = (uint32_t)reply->element[i]->integer;
    return 0;
}

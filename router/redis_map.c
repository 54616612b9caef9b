/* SPDX-License-Identifier: Apache-2.0 */
/* PROVISIONAL (the lead's stand-in until the i11-map branch lands with the real scripts, their
 * embedding and their differential test): the prefix map's scripts and arguments. */
#include "redis_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <hiredis/hiredis.h>

const redis_script redis_map_lookup_script = {
    .name = "lookup",
    .body = "local chain = ARGV[1]\n"
            "local n = #chain / 8\n"
            "local out = {}\n"
            "for w = 1, #KEYS do\n"
            "  local key = KEYS[w]\n"
            "  local depth = 0\n"
            "  local function held(i)\n"
            "    return redis.call('ZSCORE', key, string.sub(chain, i * 8 + 1, i * 8 + 8))\n"
            "  end\n"
            "  if n > 0 and held(0) then\n"
            "    local lo, hi = 1, n\n"
            "    local step = 1\n"
            "    while lo < n do\n"
            "      local probe = math.min(lo + step, n) - 1\n"
            "      if not held(probe) then hi = probe break end\n"
            "      lo = probe + 1\n"
            "      step = step * 2\n"
            "    end\n"
            "    while lo < hi do\n"
            "      local mid = lo + math.floor((hi - lo) / 2)\n"
            "      if held(mid) then lo = mid + 1 else hi = mid end\n"
            "    end\n"
            "    depth = lo\n"
            "  end\n"
            "  out[w] = depth\n"
            "end\n"
            "return out\n",
    .sha = "",
};

const redis_script redis_map_record_script = {
    .name = "record",
    .body = "local key = KEYS[1]\n"
            "local cap = tonumber(ARGV[1])\n"
            "local chain = ARGV[3]\n"
            "local n = #chain / 8\n"
            "local top = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')\n"
            "local base = top[2] and tonumber(top[2]) or 0\n"
            "local args = {}\n"
            "for i = n - 1, 0, -1 do\n"
            "  args[#args + 1] = string.format('%d', base + (n - i))\n"
            "  args[#args + 1] = string.sub(chain, i * 8 + 1, i * 8 + 8)\n"
            "  if #args >= 4000 then redis.call('ZADD', key, unpack(args)) args = {} end\n"
            "end\n"
            "if #args > 0 then redis.call('ZADD', key, unpack(args)) end\n"
            "local evicted = 0\n"
            "local card = redis.call('ZCARD', key)\n"
            "if card > cap then evicted = card - cap redis.call('ZPOPMIN', key, evicted) end\n"
            "if n > 0 then redis.call('PEXPIRE', key, ARGV[2]) end\n"
            "return evicted\n",
    .sha = "",
};

size_t redis_map_key(char *out, const char *prefix, kvg_redis_mode mode, uint64_t root,
                     uint64_t map_id)
{
    int n = mode == KVG_REDIS_CLUSTER
                ? snprintf(out, REDIS_MAP_KEY_MAX, "%s:m:{%016" PRIx64 "}:%016" PRIx64, prefix,
                           root, map_id)
                : snprintf(out, REDIS_MAP_KEY_MAX, "%s:m:%016" PRIx64, prefix, map_id);
    return n < 0 ? 0 : KVG_MIN((size_t)n, (size_t)REDIS_MAP_KEY_MAX - 1);
}

void redis_map_pack_keys(const uint64_t *keys, size_t nkeys, unsigned char *out)
{
    for (size_t i = 0; i < nkeys; i++)
        for (int b = 0; b < 8; b++)
            out[i * 8 + (size_t)b] = (unsigned char)(keys[i] >> (8 * b));
}

int redis_map_parse_lookup(const struct redisReply *reply, size_t nworkers, uint32_t *matched)
{
    if (!reply || reply->type != REDIS_REPLY_ARRAY || reply->elements != nworkers)
        return KVG_EPROTO;
    for (size_t i = 0; i < nworkers; i++) {
        const redisReply *e = reply->element[i];
        if (e->type != REDIS_REPLY_INTEGER || e->integer < 0 || e->integer > UINT32_MAX)
            return KVG_EPROTO;
        matched[i] = (uint32_t)e->integer;
    }
    return 0;
}

-- SPDX-License-Identifier: Apache-2.0
-- The prefix map's lookup (router/redis_map.c, docs/redis.md): for each worker, how many leading
-- keys of a chain it holds.
--
-- KEYS: one sorted set per worker (member: an 8-byte block key; score: its recency).
-- ARGV[1]: the chain, 8 bytes per block key.
-- Returns one integer per KEYS entry: the depth, found as kvg_index_match's depth_of finds it.
-- What a worker holds of a chain is a prefix of it (recording touches a chain tail first, so its
-- head is always more recent than its tail and eviction takes the tail first): the first key,
-- then steps of 1, 2, 4... keys until one is missing, then bisection of the last step, about
-- 2 log2(n) ZSCOREs per holder (22 for 2048 keys) and one for a worker that lacks the first
-- key or has no set at all. Read-only: recency is not refreshed (as in the embedded index).
local chain = ARGV[1]
if not chain or #chain % 8 ~= 0 then
    return redis.error_reply('ERR kvgate map lookup: the chain is not 8-byte keys')
end
local n = #chain / 8
local sub, zscore = string.sub, 'ZSCORE'
local call = redis.call

local depths = {}
local seen = {} -- a worker listed twice is probed once
for w = 1, #KEYS do
    local set = KEYS[w]
    local depth = seen[set]
    if not depth then
        depth = 0
        -- Positions are 0-based as in index.c; key i is chain bytes 8i+1 .. 8i+8.
        if n > 0 and call(zscore, set, sub(chain, 1, 8)) then
            local lo, hi = 1, n -- keys[0..lo) held; keys[hi] not (when hi < n)
            local step = 1
            while lo < n do
                local probe = math.min(lo + step, n) - 1
                if not call(zscore, set, sub(chain, 8 * probe + 1, 8 * probe + 8)) then
                    hi = probe
                    break
                end
                lo = probe + 1
                step = step * 2
            end
            while lo < hi do
                local mid = lo + math.floor((hi - lo) / 2)
                if call(zscore, set, sub(chain, 8 * mid + 1, 8 * mid + 8)) then
                    lo = mid + 1
                else
                    hi = mid
                end
            end
            depth = lo
        end
        seen[set] = depth
    end
    depths[w] = depth
end
return depths

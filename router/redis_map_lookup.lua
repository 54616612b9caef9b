-- SPDX-License-Identifier: Apache-2.0
-- The prefix map's lookup (router/redis_map.c, docs/redis.md): for each worker, how many leading
-- keys of a chain it holds.
--
-- KEYS: one sorted set per worker (member: an 8-byte block key; score: its recency).
-- ARGV[1]: the chain, 8 bytes per block key.
-- Returns one integer per KEYS entry: the depth, as kvg_index_match's depth_of finds it.
--
-- What a worker holds of a chain is a prefix of it (recording touches a chain tail first, so
-- its head is always more recent than its tail and eviction takes the tail first). depth_of
-- tests key 0, then keys 1, 3, 7, 15 ... (steps doubling) until one is missing, then bisects
-- the last step: about 2 log2(n) probes, never a read of every key. Here the same probes make
-- the same decisions, but are asked in batches, since a redis.call costs more than a member
-- more in one ZMSCORE: the doubling positions in one call, then BATCH_LEVELS levels of the
-- bisection at a time (every position those levels could visit). A chain of 2048 keys costs a
-- worker 3 calls (1 for one without the first key, or with no set at all). Read-only: recency
-- is not refreshed, as in the embedded index.
local chain = ARGV[1]
if not chain or #chain % 8 ~= 0 then
    return redis.error_reply('ERR kvgate map lookup: the chain is not 8-byte keys')
end
local n = #chain / 8
local call, sub, floor = redis.call, string.sub, math.floor
local BATCH_LEVELS = 4

-- Key i (0-based, as in index.c) is chain bytes 8i+1 .. 8i+8.
local function member(i)
    return sub(chain, 8 * i + 1, 8 * i + 8)
end

-- depth_of's doubling probes: 0, then lo + step - 1 for lo = 1, 2, 4 ... (the last one n - 1).
local doubling, doubling_members = {0}, {member(0)}
do
    local lo, step = 1, 1
    while lo < n do
        local probe = math.min(lo + step, n) - 1
        doubling[#doubling + 1] = probe
        doubling_members[#doubling_members + 1] = member(probe)
        lo = probe + 1
        step = step * 2
    end
end

-- The positions the bisection of [lo, hi) visits in its next `levels` steps, whatever it finds.
local function bisection_positions(lo, hi, levels, out)
    if lo >= hi or levels == 0 then
        return
    end
    local mid = lo + floor((hi - lo) / 2)
    out[#out + 1] = mid
    bisection_positions(lo, mid, levels - 1, out)
    bisection_positions(mid + 1, hi, levels - 1, out)
end

local function depth_of(set)
    local got = call('ZMSCORE', set, unpack(doubling_members))
    if not got[1] then
        return 0
    end
    local lo, hi = 1, n -- keys[0..lo) held; keys[hi] not (when hi < n)
    for j = 2, #doubling do
        if not got[j] then
            hi = doubling[j]
            break
        end
        lo = doubling[j] + 1
    end
    local held = {} -- position -> probe answer
    while lo < hi do
        local mid = lo + floor((hi - lo) / 2)
        if held[mid] == nil then
            local pos, mem = {}, {}
            bisection_positions(lo, hi, BATCH_LEVELS, pos)
            for i = 1, #pos do
                mem[i] = member(pos[i])
            end
            local r = call('ZMSCORE', set, unpack(mem))
            for i = 1, #pos do
                held[pos[i]] = r[i] ~= false
            end
        end
        if held[mid] then
            lo = mid + 1
        else
            hi = mid
        end
    end
    return lo
end

local depths = {}
local seen = {} -- a worker listed twice is probed once
for w = 1, #KEYS do
    local set = KEYS[w]
    local depth = seen[set]
    if not depth then
        depth = n > 0 and depth_of(set) or 0
        seen[set] = depth
    end
    depths[w] = depth
end
return depths

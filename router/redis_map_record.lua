-- SPDX-License-Identifier: Apache-2.0
-- The prefix map's record (router/redis_map.c, docs/redis.md): a worker now holds a chain, with
-- its capacity modelled by LRU exactly as kvg_index_record models it.
--
-- KEYS[1]: the worker's sorted set (member: an 8-byte block key; score: its recency, an integer
-- counter that only grows: the set's highest score + 1 for the chain's last key ... + n for its
-- first, so keys[0] ends the most recent of all).
-- ARGV[1]: capacity in blocks (> 0); ARGV[2]: TTL of the set in ms (0: none);
-- ARGV[3]: the chain, 8 bytes per block key.
-- Returns the number of entries evicted.
--
-- kvg_index_record touches the keys from last to first, and when a key is new and the worker
-- is full, evicts its least recent entry first. The set that results is the capacity most
-- recent keys of the recency order after the call (an LRU cache always holds the top of its
-- recency stack), which one ZADD of every key and one ZPOPMIN of the excess reproduce. The
-- eviction count can be larger than that ZPOPMIN: a key the worker held near the LRU end can be
-- evicted for one of the chain's new keys and then come back as a new key itself. That needs a
-- held key of the chain among the oldest entries, which one look at the score of the last entry
-- the ZPOPMIN would take rules out in the common case (a conversation's next turn: its held
-- keys are recent). Otherwise the count comes from replaying the embedded index's steps on the
-- chain and the bottom of the old recency order (at most n entries of it can matter: each
-- eviction and each key found held consumes one), in Lua, without touching the set.
local set = KEYS[1]
local cap = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local chain = ARGV[3]
if not cap or cap < 1 or cap % 1 ~= 0 or not ttl or ttl < 0 or ttl % 1 ~= 0 then
    return redis.error_reply('ERR kvgate map record: bad capacity or TTL')
end
if not chain or #chain % 8 ~= 0 then
    return redis.error_reply('ERR kvgate map record: the chain is not 8-byte keys')
end
local n = #chain / 8
if n == 0 then
    return 0
end
local call, sub, fmt, min = redis.call, string.sub, string.format, math.min
-- Lua's unpack and Redis's argument vector: a few thousand values per call at most.
local CHUNK = 2000

-- Counts and indices go to Redis as integers (a Lua number goes out as %.17g, or as the
-- shortest form, 1e+06, in some versions).
local function int(x)
    return fmt('%d', x)
end

local keys = {}
for i = 1, n do
    keys[i] = sub(chain, 8 * i - 7, 8 * i)
end

-- The evictions of kvg_index_record on this chain, step by step: keys from last to first; a
-- key not cached is added, after evicting the least recent entry when the set is full. The
-- least recent is the oldest entry the replay has not touched (from the bottom of the old
-- order), or once none is left, the earliest touched key (a queue of touches, an entry of
-- which is stale when its key was touched again since). held: member -> cached (the chain's
-- keys); card: entries before the call.
local function replay(held, card)
    local bottom = call('ZRANGE', set, 0, int(min(n, card) - 1))
    local bi, nb = 1, #bottom
    local touched = {} -- member -> step of its latest touch
    local queue, qhead = {}, 1
    local size, count = card, 0
    for step = 1, n do
        local k = keys[n - step + 1]
        if not held[k] then
            if size >= cap then
                local done = false
                while bi <= nb do
                    local x = bottom[bi]
                    bi = bi + 1
                    if not touched[x] then
                        held[x] = false
                        done = true
                        break
                    end
                end
                -- (qhead < step always holds here: cap >= 1, so something was touched.)
                while not done and qhead < step do
                    local x = queue[qhead]
                    if touched[x] == qhead and held[x] then
                        held[x] = false
                        done = true
                    end
                    qhead = qhead + 1
                end
                size = size - 1
                count = count + 1
            end
            held[k] = true
            size = size + 1
        end
        queue[step] = k
        touched[k] = step
    end
    return count
end

local evicted = 0
local card = call('ZCARD', set)
if card > cap then
    -- A lowered capacity: the embedded index evicts down to it when the worker changes.
    evicted = #call('ZPOPMIN', set, int(card - cap)) / 2
    card = cap
end
local top = 0
if card > 0 then
    top = tonumber(call('ZRANGE', set, -1, -1, 'WITHSCORES')[2])
end

-- Only a call that adds more than the room left can evict.
if card + n > cap then
    local held = {} -- member -> held before the call
    local fresh = 0 -- distinct keys not held
    local min_held -- the oldest score among the held keys of the chain
    for a = 1, n, CHUNK do
        local b = min(a + CHUNK - 1, n)
        local scores = call('ZMSCORE', set, unpack(keys, a, b))
        for i = a, b do
            local k, sc = keys[i], scores[i - a + 1]
            if held[k] == nil then
                held[k] = sc ~= false
                if sc then
                    sc = tonumber(sc)
                    if not min_held or sc < min_held then
                        min_held = sc
                    end
                else
                    fresh = fresh + 1
                end
            end
        end
    end
    local over = card + fresh - cap -- what the ZPOPMIN below takes
    if over > 0 then
        -- The chain's new keys evict exactly the `over` oldest entries when none of those is a
        -- key of the chain (then nothing is evicted and touched again): one probe of the score
        -- of the last of them decides it.
        local fast = over <= card
        if fast and min_held then
            fast = tonumber(call('ZRANGE', set, int(over - 1), int(over - 1), 'WITHSCORES')[2]) <
                       min_held
        end
        evicted = evicted + (fast and over or replay(held, card))
    end
end

-- Scores: tail first, so that a key listed twice keeps the score of its first position. Passed
-- as integer strings (exact below 2^53): a Lua number would go to Redis through printf's
-- floating-point path (%.17g), which was 8% of this script's Redis CPU for a 64-key chain
-- (perf, 2026-12-01).
local args, m = {}, 0
local added = 0
for i = n, 1, -1 do
    args[m + 1] = int(top + (n - i + 1))
    args[m + 2] = keys[i]
    m = m + 2
    if m == 2 * CHUNK or i == 1 then
        added = added + call('ZADD', set, unpack(args, 1, m))
        m = 0
    end
end
if card + added > cap then
    call('ZPOPMIN', set, int(card + added - cap))
end
if ttl > 0 then
    call('PEXPIRE', set, ARGV[2])
else
    call('PERSIST', set)
end
return evicted

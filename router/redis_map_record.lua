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
-- evicted for one of the chain's new keys and then come back as a new key itself. So when the
-- call evicts, the count is found by replaying the embedded index's steps on the chain and the
-- bottom of the old recency order (at most n entries of it can matter: each eviction and each
-- key found held consumes one), in Lua, without touching the set.
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
local call, sub, fmt = redis.call, string.sub, string.format
-- Lua's unpack and Redis's argument vector: a few thousand values per call at most.
local CHUNK = 2000

local keys = {}
for i = 1, n do
    keys[i] = sub(chain, 8 * i - 7, 8 * i)
end

local evicted = 0
local card = call('ZCARD', set)
if card > cap then
    -- A lowered capacity: the embedded index evicts down to it when the worker changes.
    local popped = call('ZPOPMIN', set, card - cap)
    evicted = #popped / 2
    card = cap
end
local top = 0
if card > 0 then
    top = tonumber(call('ZRANGE', set, -1, -1, 'WITHSCORES')[2])
end

-- Only a call that adds more than the room left can evict.
if card + n > cap then
    local held = {} -- member -> still cached, as the replay goes
    local fresh = 0 -- distinct keys not held
    for a = 1, n, CHUNK do
        local b = math.min(a + CHUNK - 1, n)
        local scores = call('ZMSCORE', set, unpack(keys, a, b))
        for i = a, b do
            local k = keys[i]
            if held[k] == nil then
                held[k] = scores[i - a + 1] ~= false
                if not held[k] then
                    fresh = fresh + 1
                end
            end
        end
    end
    if card + fresh > cap then
        -- The replay. Old entries leave from the bottom of the old order (skipping those the
        -- chain has touched meanwhile); once none is left, the chain's own keys in the order
        -- they were touched (an entry of that queue is stale when its key was touched again).
        local bottom = call('ZRANGE', set, 0, math.min(n, card) - 1)
        local bi, nb = 1, #bottom
        local touched = {} -- member -> step of its latest touch
        local queue, qhead = {}, 1
        local size = card
        for i = n, 1, -1 do
            local step = n - i + 1
            local k = keys[i]
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
                    -- (qhead <= n always holds here: there is a key to evict, as cap >= 1.)
                    while not done and qhead <= n do
                        local x = queue[qhead]
                        if touched[x] == qhead and held[x] then
                            held[x] = false
                            done = true
                        end
                        qhead = qhead + 1
                    end
                    size = size - 1
                    evicted = evicted + 1
                end
                held[k] = true
                size = size + 1
            end
            queue[step] = k
            touched[k] = step
        end
    end
end

-- Scores: tail first, so that a key listed twice keeps the score of its first position.
-- Formatted as integers (a Lua number would go out as %.14g).
local args, m = {}, 0
local added = 0
for i = n, 1, -1 do
    args[m + 1] = fmt('%d', top + (n - i + 1))
    args[m + 2] = keys[i]
    m = m + 2
    if m == 2 * CHUNK or i == 1 then
        added = added + call('ZADD', set, unpack(args, 1, m))
        m = 0
    end
end
local over = card + added - cap
if over > 0 then
    call('ZPOPMIN', set, over)
end
if ttl > 0 then
    call('PEXPIRE', set, ttl)
else
    call('PERSIST', set)
end
return evicted

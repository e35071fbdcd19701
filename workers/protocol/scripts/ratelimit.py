"""The scripts of provider rate limits (workers/config/ratelimit.py has the model: GCRA buckets per
API key and model, calls in flight, what the provider's answers teach): BOOK, SETTLE, LEARN, RENEW.
KEYS and ARGV at the top of each.
"""

from __future__ import annotations

from workers.protocol.lua import Lua

BOOK = Lua("""
-- KEYS[1] the (key, model) hash, KEYS[2] its calls in flight (zset holder -> expiry ms)
-- ARGV: rpm, itpm, otpm, concurrent, burst_s, input tokens, holder, lease ms, learns (1: the
--       provider's answers carry its limits, `anthropic-ratelimit-*-limit`: LEARN keeps them)
-- Each limit in force is the configured one, or the one the provider's answers taught ('lr', 'li',
-- 'lo'), the lower of the two when both are known.
-- -> {0, ""}: booked, send now; {ms, "rate"}: booked, send after ms; {ms, "busy"}: nothing booked,
--    every concurrent place is taken (ask again after ms); {ms, "learning"}: nothing booked, the
--    requests limit is neither configured nor learned and another call is out to learn it (ask
--    again after ms); {0, "open"}: nothing to book, the provider's answers name no limit and none
--    is configured
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rpm, itpm, otpm = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local concurrent, burst = tonumber(ARGV[4]), tonumber(ARGV[5])
local input, holder, lease = tonumber(ARGV[6]), ARGV[7], tonumber(ARGV[8])
local learns = tonumber(ARGV[9] or '0') == 1
if concurrent > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  if redis.call('ZCARD', KEYS[2]) >= concurrent then
    local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
    return {math.min(250, math.max(10, tonumber(first[2]) - now)), 'busy'}
  end
end
local state = redis.call('HMGET', KEYS[1], 'r', 'i', 'o', 'at', 'blocked', 'lr', 'li', 'lo', 'open',
  'probe', 'probe_until')
local taught = state[6] or state[7] or state[8]
local wait = math.max(0, (tonumber(state[5]) or 0) - now)
if learns and rpm == 0 and not taught then
  if state[9] then
    if itpm == 0 and otpm == 0 and concurrent == 0 and wait == 0 then return {0, 'open'} end
  else
    -- nothing known of the requests limit yet: one call goes first, its answer teaches it; an
    -- answer slower than a second lets one more go each second (nobody waits on a call that
    -- itself waits for another: a first answer never holds the rest longer than that)
    local until_ms = tonumber(state[11]) or 0
    if state[10] ~= holder and until_ms > now then
      return {math.min(100, math.max(10, until_ms - now)), 'learning'}
    end
    redis.call('HSET', KEYS[1], 'probe', holder, 'probe_until', now + math.min(lease, 1000))
  end
end
local at = tonumber(state[4]) or now
local elapsed = math.max(0, now - at)
local function refill(level, limit)
  local cap = limit * burst / 60
  if level == nil then return cap end
  return math.min(cap, level + elapsed * limit / 60000)
end
local function in_force(configured, learned)
  learned = tonumber(learned) or 0
  if configured > 0 and learned > 0 then return math.min(configured, learned) end
  return math.max(configured, learned)
end
local levels = {}
local limits = {in_force(rpm, state[6]), in_force(itpm, state[7]), in_force(otpm, state[8])}
local wants = {1, input, 0}
local names = {'r', 'i', 'o'}
for n = 1, 3 do
  if limits[n] > 0 then
    local level = refill(tonumber(state[n]), limits[n]) - wants[n]
    levels[#levels + 1] = names[n]
    levels[#levels + 1] = level
    if level < 0 then wait = math.max(wait, math.ceil(-level * 60000 / limits[n])) end
  end
end
levels[#levels + 1] = 'at'
levels[#levels + 1] = now
redis.call('HSET', KEYS[1], unpack(levels))
redis.call('PEXPIRE', KEYS[1], 3600000)
if concurrent > 0 then
  redis.call('ZADD', KEYS[2], now + wait + lease, holder)
  redis.call('PEXPIRE', KEYS[2], wait + lease + 60000)
end
if wait > 0 then return {wait, 'rate'} end
return {0, ''}
""")

SETTLE = Lua("""
-- KEYS[1] the (key, model) hash, KEYS[2] its calls in flight
-- ARGV: holder, input tokens beyond the estimate (may be < 0), output tokens
redis.call('ZREM', KEYS[2], ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HINCRBYFLOAT', KEYS[1], 'i', -tonumber(ARGV[2]))
  redis.call('HINCRBYFLOAT', KEYS[1], 'o', -tonumber(ARGV[3]))
  if redis.call('HGET', KEYS[1], 'probe') == ARGV[1] then  -- the call out to learn the limit is back
    redis.call('HDEL', KEYS[1], 'probe', 'probe_until')
  end
end
return 1
""")

LEARN = Lua("""
-- KEYS[1] the (key, model) hash. ARGV: blocked until (ms, epoch; 0: none), open (1: a 2xx answer
-- that names no limit), then field, value pairs: 'r', 'i', 'o' lower that bucket to what the
-- provider says remains (never raise it); 'lr', 'li', 'lo' are the provider's limits per minute
-- (requests, input tokens, output tokens), kept as the limits in force where none is configured
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local until_ms = tonumber(ARGV[1])
if until_ms > now then
  local blocked = tonumber(redis.call('HGET', KEYS[1], 'blocked')) or 0
  if until_ms > blocked then redis.call('HSET', KEYS[1], 'blocked', until_ms) end
end
local i = 3
while i < #ARGV do
  local field, value = ARGV[i], tonumber(ARGV[i + 1])
  if string.sub(field, 1, 1) == 'l' then
    if value > 0 then redis.call('HSET', KEYS[1], field, value) end
  else
    local level = tonumber(redis.call('HGET', KEYS[1], field))
    if level == nil or value < level then redis.call('HSET', KEYS[1], field, value) end
  end
  i = i + 2
end
if ARGV[2] == '1' and redis.call('HEXISTS', KEYS[1], 'lr') == 0 and redis.call('HEXISTS', KEYS[1], 'li') == 0
    and redis.call('HEXISTS', KEYS[1], 'lo') == 0 then
  redis.call('HSET', KEYS[1], 'open', 1)
end
redis.call('PEXPIRE', KEYS[1], 3600000)
return 1
""")

RENEW = Lua("""
-- KEYS: sorted sets of holders -> expiry (ms, Redis clock): a (key, model)'s calls in flight, an
-- account's reservations. ARGV: lease ms, then the member of each key. Each member still held is
-- re-dated a lease from now (never earlier than it was); one gone (expired, settled) stays gone.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
  local score = tonumber(redis.call('ZSCORE', key, ARGV[i + 1]))
  if score ~= nil and score < now + lease then
    redis.call('ZADD', key, now + lease, ARGV[i + 1])
    local ttl = redis.call('PTTL', key)
    if ttl >= 0 and ttl < lease + 60000 then redis.call('PEXPIRE', key, lease + 60000) end
  end
end
return 1
""")

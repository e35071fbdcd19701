"""The scripts of budget accounts (workers/client/accounts.py has what they mean and the keys):
RESERVE holds a call's estimate against an account's periods before the call, SETTLE frees it and
books the real cost. KEYS and ARGV at the top of each.
"""

from __future__ import annotations

from workers.protocol.lua import Lua

RESERVE = Lua("""
-- KEYS[1] the account, KEYS[2] its held zset, KEYS[3] held amounts. ARGV: reservation id, USD,
-- lease ms, the period id of day, of month (the script picks the account's). A reservation id
-- already held is replaced (its amount and expiry) when the new amount fits, kept as it was if not
-- -> {verdict, spent, reserved, limit, period, period id}; verdict: "ok" | "finish" | "stop" (it
--    cannot fit even alone) | "wait" (it fits once reservations in flight settle) | "none" (no limit)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local conf = redis.call('HMGET', KEYS[1], 'limit_usd', 'period', 'finish_at')
if not conf[1] then return {'none', '0', '0', '0'} end
local limit = tonumber(conf[1])
local period = conf[2] or 'total'
local pid = 'total'
if period == 'day' then pid = ARGV[4] elseif period == 'month' then pid = ARGV[5] end
local spent = tonumber(redis.call('GET', KEYS[1] .. ':spent:' .. pid)) or 0
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
if #expired > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  redis.call('HDEL', KEYS[3], unpack(expired))
end
local reserved = 0
for _, v in ipairs(redis.call('HVALS', KEYS[3])) do reserved = reserved + tonumber(v) end
reserved = reserved - (tonumber(redis.call('HGET', KEYS[3], ARGV[1])) or 0)  -- a re-reserve replaces
local amount = tonumber(ARGV[2])
local used = spent + reserved + amount
local verdict = 'ok'
if spent + amount > limit then
  return {'stop', tostring(spent), tostring(reserved), tostring(limit), period, pid}
end
if used > limit then
  return {'wait', tostring(spent), tostring(reserved), tostring(limit), period, pid}
end
if used >= (tonumber(conf[3]) or 0.9) * limit then verdict = 'finish' end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], amount)
return {verdict, tostring(spent), tostring(reserved + amount), tostring(limit), period, pid}
""")

SETTLE = Lua("""
-- KEYS[1] the account, KEYS[2] held, KEYS[3] held amounts. ARGV: reservation id, real USD (below 0:
-- a correction, a two-phase tool's cost below the estimate charged at its start), the period id of
-- day, of month. The cost counts in every period (the day's, the month's and the total), whichever
-- the account's limit uses now: a limit moved to another period finds what was spent in it already.
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
local cost = tonumber(ARGV[2])
if cost ~= 0 then
  redis.call('INCRBYFLOAT', KEYS[1] .. ':spent:total', ARGV[2])
  redis.call('INCRBYFLOAT', KEYS[1] .. ':spent:' .. ARGV[3], ARGV[2])
  redis.call('EXPIRE', KEYS[1] .. ':spent:' .. ARGV[3], 40 * 86400)
  redis.call('INCRBYFLOAT', KEYS[1] .. ':spent:' .. ARGV[4], ARGV[2])
  redis.call('EXPIRE', KEYS[1] .. ':spent:' .. ARGV[4], 40 * 86400)
end
return 1
""")

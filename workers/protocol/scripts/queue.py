"""The scripts of the step queues on kombu's Redis layout (workers/worker/kombu_redis.py reads their
replies): CLAIM pops a message and records it in kombu's `unacked` hash, RESTORE puts one back,
RESTORE_VISIBLE is kombu's visibility timeout. KEYS and ARGV at the top of each.
"""

from __future__ import annotations

from workers.protocol import names
from workers.protocol.lua import Lua

_SEP_LUA = "".join(f"\\{ord(c)}" for c in names.PRIORITY_SEP)

CLAIM = Lua(
    """
-- KEYS[1]=unacked KEYS[2]=unacked_index KEYS[3..]=queue list keys in consume order
-- ARGV[1]=most messages to take ARGV[2]=now ARGV[3]=largest message to decode (bytes)
-- -> {queue key, message, recorded tag or "", ...} (see `claimed`)
-- Pops and records each message as delivered in one atomic call, so a consumer that dies at any
-- point leaves every message either on its queue or in `unacked` (restored after the visibility
-- timeout), never in neither. No message content can make it fail: only a JSON object whose
-- properties.delivery_tag is a string of 1-200 characters is recorded (what the consumer cannot
-- parse it moves to the rejected list, and forgets the record), anything else is just returned.
local out = {}
local left = tonumber(ARGV[1])
local largest = tonumber(ARGV[3])
for i = 3, #KEYS do
  while left > 0 do
    local raw = redis.call('RPOP', KEYS[i])
    if not raw then break end
    local tag = nil
    if #raw <= largest then
      local ok, message = pcall(cjson.decode, raw)
      if ok and type(message) == 'table' and type(message.properties) == 'table' then
        tag = message.properties.delivery_tag
      end
    end
    if type(tag) == 'string' and #tag > 0 and #tag <= 200 then
      local queue = string.match(KEYS[i], '^(.-)SEP') or KEYS[i]
      redis.call('HSET', KEYS[1], tag, '[' .. raw .. ', "", ' .. cjson.encode(queue) .. ']')
      redis.call('ZADD', KEYS[2], ARGV[2], tag)
    else
      tag = ''
    end
    out[#out + 1] = KEYS[i]
    out[#out + 1] = raw
    out[#out + 1] = tag
    left = left - 1
  end
end
return out
""".replace("SEP", _SEP_LUA)
)

RESTORE = Lua("""
-- KEYS[1]=unacked KEYS[2]=unacked_index KEYS[3]=queue; ARGV[1]=delivery tag ARGV[2]=the message
-- Puts a delivered message back at the consuming end of its queue (as kombu's restore does) unless
-- it was acked or restored already -> 1 when restored, else 0.
redis.call('ZREM', KEYS[2], ARGV[1])
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('RPUSH', KEYS[3], ARGV[2])
return 1
""")

RESTORE_VISIBLE = Lua("""
-- KEYS[1]=unacked KEYS[2]=unacked_index; ARGV[1]=delivered before this time ARGV[2]=most to restore
-- kombu's visibility timeout: messages delivered before ARGV[1] and never acked go back to the
-- consuming end of their queue (the routing key: toolloop's queues are direct) -> how many.
local tags = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local restored = 0
for _, tag in ipairs(tags) do
  local value = redis.call('HGET', KEYS[1], tag)
  redis.call('ZREM', KEYS[2], tag)
  redis.call('HDEL', KEYS[1], tag)
  if value then
    local message, _, queue = string.match(value, '^%[(.*),%s*"([^"]*)",%s*"([^"]*)"%]$')
    if message then
      redis.call('RPUSH', queue, message)
      restored = restored + 1
    end
  end
end
return restored
""")

"""The two scripts a worker process's batch (workers/process/redisio.py) sends with its commands:
SEND_MANY carries a loop turn's fire-and-forget writes in one call, RUN_ONE runs a plain command
queued behind a script so that it fails (NOSCRIPT) and runs again with it (workers/protocol/scriptcache.py).
"""

from __future__ import annotations

from workers.protocol.lua import Lua

SEND_MANY = Lua("""
-- ARGV = n1, command, args..., n2, command, args...: the fire-and-forget writes of one loop turn
-- (events, acks, successors). Each runs on its own (pcall): one that fails does not stop the rest.
-- -> the error texts of those that failed.
local failed = {}
local i = 1
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  local reply = redis.pcall(unpack(ARGV, i + 1, i + n))
  if type(reply) == 'table' and reply.err then failed[#failed + 1] = reply.err end
  i = i + n + 1
end
return failed
""")

RUN_ONE = Lua("""
-- ARGV = command, args...: a plain command queued after a script in the same batch, run as a
-- script so that it fails (NOSCRIPT) when the script before it does, and runs again after it.
return redis.call(unpack(ARGV))
""")

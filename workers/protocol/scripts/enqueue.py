"""ENQUEUE: the one script that creates a run. It stores the run and, in the same atomic call,
sends its first step (the clients' path, workers/client/enqueue.py), or leaves the send to its
caller (`workers.runs.lifecycle.create`, which sends through a Celery producer). Redis refuses a
script for OOM at its first write only, so an enqueue under maxmemory stores the whole run or
nothing of it.
"""

from __future__ import annotations

from workers.protocol.lua import Lua

ENQUEUE = Lua("""
-- KEYS: 1 spec 2 state 3 input 4 events 5 outbox 6 live runs 7 all runs 8 the llm queue
-- ARGV: 1 run id 2 spec JSON 3 now 4 first segment's messages 5 queued data 6 outbox score
--       7 the task message ("": the caller sends it, workers/runs/lifecycle.py `create`)
--       8 its task-sent event's channel 9 the event 10 traceparent ("" none)
-- -> 1 stored (and sent), 0 a run with this id exists (nothing written)
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('HSET', KEYS[2], 'status', 'queued', 'segment', 0, 'n', 0, 'queue', 'llm', 'seq', 1,
  'created', ARGV[3], 'touched', ARGV[3])
if ARGV[10] ~= '' then redis.call('HSET', KEYS[2], 'traceparent', ARGV[10]) end
redis.call('HSET', KEYS[3], 's0', ARGV[4])
redis.call('XADD', KEYS[4], '*', 'seq', 1, 'segment', 0, 'kind', 'queued', 'data', ARGV[5])
redis.call('ZADD', KEYS[5], ARGV[6], '1|llm')
redis.call('ZADD', KEYS[6], ARGV[3], ARGV[1])
redis.call('ZADD', KEYS[7], ARGV[3], ARGV[1])
if ARGV[7] ~= '' then
  redis.call('LPUSH', KEYS[8], ARGV[7])
  redis.call('PUBLISH', ARGV[8], ARGV[9])
end
return 1
""")

"""The Lua scripts of the leased journal (`RedisJournal`): its lease and its commit, each one atomic
call. The scripts of a durable run's lifecycle are the worker's (workers/protocol/scripts/).

Invariants the scripts keep (keys in `keys.py`; every key of a call shares the run's hash tag):
- A journal field is written with HSETNX only, and every script that writes one returns the STORED
  value, so a caller always continues with what Redis holds (redis-py 8 retries commands itself: a
  retried write must read back, never trust "I won").
- A lease is "<owner>:<token>", the token drawn from the run's INCR fence. A commit is refused when
  the fence has moved past its token (a newer copy took the lease), so a paused copy never writes.
"""

from __future__ import annotations

LEASE_ACQUIRE = """
-- KEYS[1]=lease KEYS[2]=fence; ARGV[1]=owner ARGV[2]=ttl ms
-- -> {1, token} when this owner holds the lease (again), {0, pttl} when another owner holds it.
local current = redis.call('GET', KEYS[1])
if current then
  local owner, token = string.match(current, '^(.*):(%d+)$')
  if owner == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {1, tonumber(token)}
  end
  return {0, redis.call('PTTL', KEYS[1])}
end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. token, 'PX', ARGV[2])
return {1, token}
"""

LEASE_RELEASE = """
-- KEYS[1]=lease; ARGV[1]=the lease value -> 1 when it was ours and is gone
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

STEP_COMMIT = """
-- KEYS[1]=journal hash KEYS[2]=fence KEYS[3]=lease; ARGV[1]=field ARGV[2]=value ARGV[3]=token
-- ARGV[4]=lease value -> {1, stored} when written (or already stored), {0, stored-or-false} when fenced
local fence = tonumber(redis.call('GET', KEYS[2]) or '0')
if fence ~= tonumber(ARGV[3]) then return {0, redis.call('HGET', KEYS[1], ARGV[1])} end
redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
if redis.call('GET', KEYS[3]) == ARGV[4] then redis.call('DEL', KEYS[3]) end
return {1, redis.call('HGET', KEYS[1], ARGV[1])}
"""

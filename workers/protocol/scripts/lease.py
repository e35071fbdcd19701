"""LEASE_KEEP, what keeps a step's lease (`workers/process/leases.py` `Leases`), and its reply, typed
(`parse_keep`); LEASE_RELEASE, the library's release of a lease (toolloop/journal/scripts.py), as a
`Lua` the worker's batch runs; LOCK_KEEP, what keeps the sweeper's lock while it sweeps."""

from __future__ import annotations

from typing import Literal

from toolloop.journal import scripts as journal_scripts
from workers.protocol.lua import Lua

LEASE_RELEASE = Lua(journal_scripts.LEASE_RELEASE)

LEASE_KEEP = Lua("""
-- Keep a step's lease: renew it, or take it again when it lapsed and nobody began the step since.
-- KEYS: 1 lease 2 fence 3 state; ARGV: 1 the lease value "<owner>:<token>" 2 ttl ms
--       3 n (the commit the step makes)
-- -> 1 renewed | 2 taken again: it had lapsed, the fence is still the step's token (every copy that
--    takes a lease draws a new token: RUN_BEGIN, RUN_COMMIT's go_on), the run's committed n is
--    below n and the run is running | 0 another copy holds it | -1 it lapsed and the run moved on:
--    another copy began the step since, or the step's commit is made, or the run is gone
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if current then return 0 end
local token = string.match(ARGV[1], ':(%d+)$')
if not token or tonumber(redis.call('GET', KEYS[2]) or '0') ~= tonumber(token) then return -1 end
if tonumber(redis.call('HGET', KEYS[3], 'n') or '0') >= tonumber(ARGV[3]) then return -1 end
if redis.call('HGET', KEYS[3], 'status') ~= 'running' then return -1 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 2
""")

LOCK_KEEP = Lua("""
-- Keep a lock its holder still holds. KEYS: 1 the lock; ARGV: 1 the holder's value 2 ttl ms
-- -> 1 kept (its ttl is ARGV[2] again) | 0 it lapsed, or another holder took it
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
""")

Kept = Literal["renewed", "taken again", "held elsewhere", "moved on"]
"""LEASE_KEEP's answer: the lease is the step's (`renewed`, `taken again`), or it is not."""

_KEPT: dict[int, Kept] = {
    1: "renewed",
    2: "taken again",
    0: "held elsewhere",
    -1: "moved on",
}


def parse_keep(reply: object) -> Kept:
    """LEASE_KEEP's reply, parsed once."""
    return _KEPT[int(str(reply))]

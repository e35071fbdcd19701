"""RUN_BEGIN, the start of an `advance` task, and its reply as a typed value (`parse_begin`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from workers.protocol.scripts.prelude import with_prelude

RUN_BEGIN = with_prelude("""
-- Start of an `advance` task: check it is due, take the run's lease, count the delivery, load all.
-- KEYS: 1 state 2 spec 3 lease 4 fence 5 attempts 6 spend 7 input 8 answers 9 outbox
-- ARGV: 1 owner 2 lease ttl ms 3 n (the commit this task makes) 4 now 5 journal key prefix
--       6 the caller's cache tag ("<last commit's lease>|<segment>" it holds the journal of, or '')
-- -> {'missing'} | {'idle', status} | {'stale', n} | {'early', n} | {'busy', pttl}
--    | {'run', token, attempts, state (flat), spec, journal (flat), input, answer to the previous
--       segment's ask or false, outside spend, tag, the compaction the segment starts from (input
--       field 'c<segment>') or false}; spec, journal and input are false when the
--       caller's tag is current: no commit happened since the caller's own (fields are write-once)
if redis.call('EXISTS', KEYS[1]) == 0 then return {'missing'} end
local n = tonumber(ARGV[3])
-- task n was delivered: every successor recorded up to n has reached a worker
for _, member in ipairs(redis.call('ZRANGE', KEYS[9], 0, -1)) do
  local m = tonumber(string.match(member, '^(%d+)|'))
  if m and m <= n then redis.call('ZREM', KEYS[9], member) end
end
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= 'queued' and status ~= 'running' then return {'idle', status} end
local done = tonumber(redis.call('HGET', KEYS[1], 'n') or '0')
if n <= done then return {'stale', tostring(done)} end
if n > done + 1 then return {'early', tostring(done)} end
local token
local current = redis.call('GET', KEYS[3])
if current then
  local owner, held = string.match(current, '^(.*):(%d+)$')
  if owner ~= ARGV[1] then return {'busy', tostring(redis.call('PTTL', KEYS[3]))} end
  token = held
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
else
  token = tostring(redis.call('INCR', KEYS[4]))
  redis.call('SET', KEYS[3], ARGV[1] .. ':' .. token, 'PX', ARGV[2])
end
local attempts = redis.call('HINCRBY', KEYS[5], ARGV[3], 1)
redis.call('HSET', KEYS[1], 'status', 'running', 'touched', ARGV[4])
local segment = tonumber(redis.call('HGET', KEYS[1], 'segment') or '0')
local input = redis.call('HGET', KEYS[7], 's' .. segment)
local compacted = redis.call('HGET', KEYS[7], 'c' .. segment)
local answer = false
if segment > 0 then answer = redis.call('HGET', KEYS[8], 's' .. (segment - 1)) end
local tag = (redis.call('HGET', KEYS[1], 'last_lease') or '') .. '|' .. segment
local spec, journal = false, false
if tag ~= ARGV[6] then
  spec = redis.call('GET', KEYS[2])
  journal = redis.call('HGETALL', ARGV[5] .. 's' .. segment)
else
  input, compacted = false, false
end
return {'run', token, attempts, redis.call('HGETALL', KEYS[1]), spec, journal, input or false,
  answer or false, redis.call('GET', KEYS[6]) or '0', tag, compacted or false}
""")

NotBegun = Literal["missing", "idle", "stale", "early", "busy"]
"""What an `advance` task that did not begin comes to (its step outcome)."""


@dataclass(frozen=True, slots=True)
class Loaded:
    """What RUN_BEGIN loads when the caller holds no current loop of the run: the spec JSON, the
    segment's journal, its input messages (JSON) and the answer to the previous segment's ask."""

    spec: str | None
    journal: dict[str, str]
    input: str | None
    answer: str | None
    compacted: str | None = None
    """The compaction in force when the previous segment ended (`CompactionState` JSON), or None."""


@dataclass(frozen=True, slots=True)
class Started:
    """The task holds the run's lease (`<owner>:<token>`) and makes its commit. `attempts`: this
    task's deliveries so far; `state`: the run's state hash; `outside`: spend recorded outside the
    loop; `tag`: "<last commit's lease>|<segment>", what a kept loop must match to go on;
    `loaded`: None when the caller's kept loop is current (nothing was loaded)."""

    token: int
    attempts: int
    state: dict[str, str]
    outside: float
    tag: str
    loaded: Loaded | None = None


@dataclass(frozen=True, slots=True)
class Refused:
    """The task does not begin: `what` says why (its outcome); `detail` is the run's status (idle),
    its committed `n` (stale, early) or the lease's remaining ms (busy)."""

    what: NotBegun
    detail: str = ""

    @property
    def lease_left_ms(self) -> int:
        """For `busy`: how long the other holder's lease still runs (-1 for any other reply)."""
        return int(self.detail) if self.what == "busy" else -1


Begin = Started | Refused

_REFUSED: dict[str, NotBegun] = {
    "missing": "missing",
    "idle": "idle",
    "stale": "stale",
    "early": "early",
    "busy": "busy",
}


def parse_begin(reply: list[Any]) -> Begin:
    """RUN_BEGIN's reply, parsed once."""
    code = str(reply[0])
    if code != "run":
        return Refused(
            _REFUSED[code], "" if len(reply) < 2 or reply[1] is None else str(reply[1])
        )
    _, token, attempts, state, spec, journal, input_json, answer, outside, tag = reply[
        :10
    ]
    compacted = reply[10] if len(reply) > 10 else None
    loaded = None
    if spec is not None or journal is not None:
        loaded = Loaded(
            _text(spec),
            pairs(journal or []),
            _text(input_json),
            _text(answer),
            _text(compacted),
        )
    return Started(
        int(token), int(attempts), pairs(state), float(outside), str(tag), loaded
    )


def pairs(flat: list[Any]) -> dict[str, str]:
    """A flat [field, value, ...] reply (HGETALL inside a script) as a dict."""
    return {str(flat[i]): str(flat[i + 1]) for i in range(0, len(flat), 2)}


def _text(value: Any) -> str | None:
    return None if value is None else str(value)

"""The scripts of a run you talk to (SPEC 6.1, docs/conversations.md), each with its reply typed:
FOLLOW_UP (`parse_follow_up`: `Client.send`), STEER_SEND (`parse_steer`: `Client.steer`) and
INTERRUPT_SEND (`parse_interrupt`: `Client.interrupt`). Each is the whole transition in one call.

State fields they keep (workers/protocol/keys.py has the rest of the state hash):
    steer:<id>       a steer sent and not taken yet: JSON {content, at, seq}; RUN_COMMIT deletes it
                     when the step `steer:<id>` lands in the journal (workers/protocol/scripts/commit.py)
    steer_seq        steers sent so far (their order)
    steers_waiting   steers sent and not taken yet (RUN_COMMIT will not stop a run `done` while
                     one waits: the run goes on and takes it)
    interrupt        the segment an interrupt was sent to (the next live step of that segment stops)
    budget_added     USD added to RunSpec.budget_usd by follow-ups (HINCRBYFLOAT)
    steps_added      model steps added to RunSpec.max_steps by follow-ups (HINCRBY)
    spend_end        the run's outside spend when its last segment stopped (RUN_COMMIT), so a
                     follow-up carries exactly the spend the run had
    follow_up_segment  the last segment a follow-up began (its trace span says so)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from workers.protocol.scripts.prelude import with_prelude

FOLLOW_UP_BODY = """
-- A follow-up (`Client.send`): continue a run that ended `done` or `interrupted` as its next
-- segment (the history so far and the message as its input, the spend and steps carried, the
-- top-ups added, its first step recorded in the outbox), or answer the ask a parked run holds.
-- With an idempotency key, the first send's outcome is stored and a later one returns it.
-- KEYS: 1 state 2 input 3 history 4 events 5 outbox 6 sends (idempotency) 7 answers 8 inbox
--       9 live-runs index 10 ended-runs index 11 the control queue's list 12 spend
-- ARGV: 1 run id 2 idempotency key ('' = none) 3 the user message (JSON) 4 its text 5 now
--       6 USD to add to the budget 7 steps to add 8 answer id 9 the answer task's message
--       10 task-sent channel 11 task-sent payload
-- -> {'continued', outcome, member} | {'answered', outcome} | {'again', outcome}
--    | {'refused', status, why} | {'missing'}      (outcome: JSON {what, segment})
-- the state's fields it reads, in one call: 1 status 2 segment 3 cancel 4 approvals 5 ask_deadline
-- 6 parent 7 spend_end 8 spent_usd 9 steps 10 n
local state = redis.call('HMGET', KEYS[1], 'status', 'segment', 'cancel', 'approvals',
  'ask_deadline', 'parent', 'spend_end', 'spent_usd', 'steps', 'n')
local status = state[1]
if not status then return {'missing'} end
if ARGV[2] ~= '' then
  local prior = redis.call('HGET', KEYS[6], ARGV[2])
  if prior then return {'again', prior} end
end
local now = ARGV[5]
local segment = tonumber(state[2] or '0')
local function top_up()
  if tonumber(ARGV[6]) > 0 then redis.call('HINCRBYFLOAT', KEYS[1], 'budget_added', ARGV[6]) end
  if tonumber(ARGV[7]) > 0 then redis.call('HINCRBY', KEYS[1], 'steps_added', ARGV[7]) end
end
local function record(outcome)
  if ARGV[2] ~= '' then redis.call('HSET', KEYS[6], ARGV[2], outcome) end
end
if state[3] == '1' then return {'refused', status, 'cancelled'} end
if status == 'asked' then
  if state[4] then return {'refused', status, 'approvals'} end
  local deadline = tonumber(state[5] or '')
  if deadline and tonumber(now) >= deadline then return {'refused', status, 'late'} end
  if redis.call('HSETNX', KEYS[7], 's' .. segment, ARGV[4]) == 0 then
    return {'refused', status, 'answered'}
  end
  top_up()
  redis.call('HSET', KEYS[8], ARGV[8], cjson.encode({segment = segment, content = ARGV[4],
    at = tonumber(now), claimed = true}))
  redis.call('ZADD', KEYS[9], now, ARGV[1])
  redis.call('LPUSH', KEYS[11], ARGV[9])
  redis.call('PUBLISH', ARGV[10], ARGV[11])
  local outcome = cjson.encode({what = 'answered', segment = segment + 1})
  record(outcome)
  return {'answered', outcome}
end
if status ~= 'done' and status ~= 'interrupted' then return {'refused', status, 'status'} end
-- a child's spend rolled up to its parent when it ended: its conversation goes on through the parent
if state[6] then return {'refused', status, 'child'} end
local history = redis.call('GET', KEYS[3])
if not history then return {'refused', status, 'history'} end
local next_segment = segment + 1
local joined = ','
if history == '[]' then joined = '' end
redis.call('HSET', KEYS[2], 's' .. next_segment, string.sub(history, 1, -2) .. joined .. ARGV[3] .. ']')
local outside = state[7] or redis.call('GET', KEYS[12]) or '0'
redis.call('HSET', KEYS[1], 'status', 'queued', 'segment', next_segment, 'queue', 'llm',
  'touched', now, 'carried_usd', state[8] or '0', 'spend_base', outside,
  'steps_base', state[9] or '0', 'follow_up_segment', next_segment)
redis.call('HDEL', KEYS[1], 'final_text', 'interrupt', 'spend_end')
top_up()
local member = (tonumber(state[10] or '0') + 1) .. '|llm'
redis.call('ZADD', KEYS[5], now, member)
emit(KEYS[1], KEYS[4], tostring(next_segment), 'follow_up', cjson.encode({content = ARGV[4],
  add_budget_usd = tonumber(ARGV[6]), add_max_steps = tonumber(ARGV[7])}))
redis.call('ZADD', KEYS[9], now, ARGV[1])
redis.call('ZREM', KEYS[10], ARGV[1])
local outcome = cjson.encode({what = 'continued', segment = next_segment})
record(outcome)
return {'continued', outcome, member}
"""
FOLLOW_UP = with_prelude(FOLLOW_UP_BODY)
"""FOLLOW_UP_BODY with the prelude: workers/protocol/scripts/schedules.py's FIRE_MANY runs the body as a
function of its own (its KEYS and ARGV the function's arguments) under the same prelude."""

STEER_SEND = with_prelude("""
-- A steer (`Client.steer`): a message for a running run, kept in its state until a step takes it
-- (the step `steer:<id>` of the loop: RUN_COMMIT deletes it as that step lands).
-- KEYS: 1 state 2 events; ARGV: 1 steer id 2 content 3 now 4 the run's journal key prefix (its
--       current segment's journal is <prefix>s<segment>: a steer id taken there is refused)
-- -> {'sent', seq} | {'refused', status, why} | {'missing'}
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {'missing'} end
-- a parent parked on its children ('waiting') takes it too: its step after they wake it reads it
if status ~= 'queued' and status ~= 'running' and status ~= 'waiting' then
  return {'refused', status, 'status'}
end
if redis.call('HGET', KEYS[1], 'cancel') == '1' then return {'refused', status, 'cancelled'} end
if redis.call('HEXISTS', KEYS[1], 'interrupt') == 1 then return {'refused', status, 'interrupted'} end
local field = 'steer:' .. ARGV[1]
local segment = redis.call('HGET', KEYS[1], 'segment') or '0'
if redis.call('HEXISTS', KEYS[1], field) == 1
    or redis.call('HEXISTS', ARGV[4] .. 's' .. segment, field) == 1 then
  return {'refused', status, 'duplicate'}
end
local seq = redis.call('HINCRBY', KEYS[1], 'steer_seq', 1)
redis.call('HSET', KEYS[1], field, cjson.encode({content = ARGV[2], at = tonumber(ARGV[3]),
  seq = seq}))
redis.call('HINCRBY', KEYS[1], 'steers_waiting', 1)
emit(KEYS[1], KEYS[2], segment, 'steer_sent',
  cjson.encode({steer_id = ARGV[1], seq = seq}))
return {'sent', seq}
""")

INTERRUPT_SEND = with_prelude("""
-- An interrupt (`Client.interrupt`): the run's live step stops (its abort signal, on the worker
-- that holds it: a message on the interrupt channel), the journal stays, the run ends
-- `interrupted` and waits for a follow-up. KEYS: 1 state; ARGV: 1 channel 2 run id
-- -> {'sent', segment} | {'refused', status} | {'missing'}
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {'missing'} end
if status ~= 'queued' and status ~= 'running' then return {'refused', status} end
local segment = redis.call('HGET', KEYS[1], 'segment') or '0'
redis.call('HSET', KEYS[1], 'interrupt', segment)
redis.call('PUBLISH', ARGV[1], ARGV[2] .. '|' .. segment)
return {'sent', segment}
""")


@dataclass(frozen=True, slots=True)
class FollowedUp:
    """FOLLOW_UP's reply: `continued` (a new segment; send `member`), `answered` (the held ask's
    answer; its task was sent), `again` (a send with this key was applied before: `outcome` is its
    outcome, nothing was done), `refused` (`status`, and `why`: 'status', 'cancelled', 'approvals',
    'late', 'answered', 'history', 'child': an ended child run), or `missing`.
    `outcome`: {"what", "segment"}."""

    what: Literal["continued", "answered", "again", "refused", "missing"]
    outcome: dict[str, Any] | None = None
    member: str | None = None
    status: str = ""
    why: str = ""


def parse_follow_up(reply: list[Any]) -> FollowedUp:
    """FOLLOW_UP's reply, parsed once."""
    what = str(reply[0])
    if what == "continued":
        return FollowedUp("continued", json.loads(reply[1]), member=str(reply[2]))
    if what in ("answered", "again"):
        return FollowedUp(what, json.loads(reply[1]))  # type: ignore[arg-type]
    if what == "refused":
        return FollowedUp("refused", status=str(reply[1]), why=str(reply[2]))
    return FollowedUp("missing")


@dataclass(frozen=True, slots=True)
class Steered:
    """STEER_SEND's reply: `sent` (`seq`: its place among the run's steers), `refused` (`status`,
    `why`: 'status', 'cancelled', 'interrupted', 'duplicate') or `missing`."""

    what: Literal["sent", "refused", "missing"]
    seq: int = 0
    status: str = ""
    why: str = ""


def parse_steer(reply: list[Any]) -> Steered:
    """STEER_SEND's reply, parsed once."""
    what = str(reply[0])
    if what == "sent":
        return Steered("sent", seq=int(reply[1]))
    if what == "refused":
        return Steered("refused", status=str(reply[1]), why=str(reply[2]))
    return Steered("missing")


@dataclass(frozen=True, slots=True)
class Interrupted:
    """INTERRUPT_SEND's reply: `sent` (to `segment`), `refused` (the run's `status`) or `missing`."""

    what: Literal["sent", "refused", "missing"]
    segment: int = 0
    status: str = ""


def parse_interrupt(reply: list[Any]) -> Interrupted:
    """INTERRUPT_SEND's reply, parsed once."""
    what = str(reply[0])
    if what == "sent":
        return Interrupted("sent", segment=int(reply[1]))
    if what == "refused":
        return Interrupted("refused", status=str(reply[1]))
    return Interrupted("missing")

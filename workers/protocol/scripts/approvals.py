"""The scripts of approvals and deadlines (workers/runs/approvals.py): SETTLE applies what is due of a
parked run (early decisions, expired deadlines), DECIDE_SCRIPT records one decision. Both share the
`settle` function of `_SETTLE` and the prelude of the run scripts (`emit`, `terminal`).

KEYS (both): 1 state 2 decisions 3 answers 4 events 5 outbox 6 waits-due.
ARGV (both): 1 run id, 2 DECISIONS_MARK, 3 now; DECIDE_SCRIPT also 4 call id, 5 decision JSON,
6 the most early decisions a segment keeps (TOOLLOOP_MAX_EARLY_DECISIONS).
Both replies are parsed once by `parse_settled`.

DECIDE_SEND is the client's: it stores a decision and sends its `toolloop.decide` message, unless
the call has a decision already (recorded, or queued for a worker), in one step (`parse_decide_sent`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workers.protocol.lua import Lua
from workers.protocol.scripts.children import CHILD_ENDED
from workers.protocol.scripts.prelude import PRELUDE, with_prelude

DECISIONS_MARK = "\x1eapprovals\x1e"
"""How a segment's answer that holds decisions starts (an ask answer cannot: Client.answer refuses it)."""
DEADLINE_REASON = "no decision before the deadline"

_SETTLE = """
-- KEYS: 1 state 2 decisions 3 answers 4 events 5 outbox 6 waits-due; ARGV[1]=run id
local RUN = ARGV[1]
local function expired_child(now)
  -- a child run (workers/runs/children.py) that ends `expired` here ends for its parent as RUN_COMMIT's
  -- stop does: its parent's keys are its own with its last id part dropped (`tl:{root}.a.b:state`
  -- -> `tl:{root}.a:*`, toolloop/journal/keys.py) -> the woken parent's outbox member, or false
  local parent, call = redis.call('HGET', KEYS[1], 'parent'), redis.call('HGET', KEYS[1], 'call')
  if not parent or not call then return false end
  local base = string.match(string.sub(KEYS[1], 1, -7), '^(.*)%.[^.]*$')
  local spent = tonumber(redis.call('HGET', KEYS[1], 'spent_usd') or '0')
  local micros = string.format('%d', math.floor(spent * 1000000 + 0.5))
  local record = cjson.encode({child = RUN, status = 'expired', spent_usd = tonumber(micros) / 1000000,
    spent_micros = micros, final_text = redis.call('HGET', KEYS[1], 'final_text') or ''})
  return child_ended({state = base .. ':state', children = base .. ':children', events = base .. ':events',
    outbox = base .. ':outbox', open = 'open:' .. call, record = record, micros = micros}, RUN, now)
end
local function resume(segment, now, queue)
  queue = queue or 'llm'
  local next_segment = tonumber(segment) + 1
  emit(KEYS[1], KEYS[4], tostring(next_segment), 'resumed', '{}')
  local member = (tonumber(redis.call('HGET', KEYS[1], 'n') or '0') + 1) .. '|' .. queue
  redis.call('HSET', KEYS[1], 'status', 'queued', 'segment', next_segment, 'queue', queue, 'touched', now)
  redis.call('HDEL', KEYS[1], 'asked', 'approvals', 'decided', 'ask_deadline')
  redis.call('ZADD', KEYS[5], now, member)
  redis.call('ZREM', KEYS[6], RUN)
  return member
end
local function settle(now)
  local status = redis.call('HGET', KEYS[1], 'status')
  if status ~= 'asked' then redis.call('ZREM', KEYS[6], RUN) return {'idle'} end
  local segment = redis.call('HGET', KEYS[1], 'segment') or '0'
  local raw = redis.call('HGET', KEYS[1], 'approvals')
  if raw then
    local pending = cjson.decode(raw)
    local decided = {}
    local ids = {}  -- the decided calls, in the held order: the state's `decided` (status hides them)
    local queue = false  -- the first step of the resume: the first held call the tool runs for
    local all = true
    local next_due = false
    for _, p in ipairs(pending) do
      local field = 's' .. segment .. ':' .. p.call_id
      local d = redis.call('HGET', KEYS[2], field)
      if d then
        local dd = cjson.decode(d)
        if type(dd.input_digest) == 'string' and dd.input_digest ~= p.input_digest then
          redis.call('HDEL', KEYS[2], field)  -- an early decision on another input: the call waits
          emit(KEYS[1], KEYS[4], segment, 'approval_refused', cjson.encode({call_id = p.call_id,
            reason = 'the decision was made for another input (stale digest)'}))
          d = false
        end
      end
      local deadline = tonumber(p.deadline)
      if not d and deadline and now >= deadline then
        d = cjson.encode({action = p.default, reason = 'no decision before the deadline', actor = 'deadline'})
        redis.call('HSET', KEYS[2], field, d)
        emit(KEYS[1], KEYS[4], segment, 'approval_expired', cjson.encode({call_id = p.call_id,
          name = p.name, outcome = p.default, deadline = deadline}))
      end
      if d then
        decided[p.call_id] = cjson.decode(d)
        table.insert(ids, p.call_id)
        if not queue and decided[p.call_id].action ~= 'reject' then queue = p.queue end
      else
        all = false
        if deadline and (not next_due or deadline < next_due) then next_due = deadline end
      end
    end
    if not all then
      if #ids > 0 then
        redis.call('HSET', KEYS[1], 'decided', cjson.encode(ids))
      else
        redis.call('HDEL', KEYS[1], 'decided')
      end
      if next_due then redis.call('ZADD', KEYS[6], next_due, RUN) else redis.call('ZREM', KEYS[6], RUN) end
      return {'waiting'}
    end
    if redis.call('HSETNX', KEYS[3], 's' .. segment, ARGV[2] .. cjson.encode(decided)) == 0 then
      redis.call('ZREM', KEYS[6], RUN)
      return {'idle'}  -- answered already (a cancel): that answer resumes the run
    end
    return {'resumed', resume(segment, now, queue or 'llm')}
  end
  local deadline = tonumber(redis.call('HGET', KEYS[1], 'ask_deadline') or '')
  if not deadline then redis.call('ZREM', KEYS[6], RUN) return {'waiting'} end
  if now < deadline then redis.call('ZADD', KEYS[6], deadline, RUN) return {'waiting'} end
  local default = redis.call('HGET', KEYS[1], 'ask_default') or ''
  redis.call('HSET', KEYS[1], 'expired_segment', segment)
  if default ~= '' then
    if redis.call('HSETNX', KEYS[3], 's' .. segment, default) == 0 then
      redis.call('ZREM', KEYS[6], RUN)
      return {'idle'}
    end
    emit(KEYS[1], KEYS[4], segment, 'expired', cjson.encode({what = 'ask', outcome = 'ask_default',
      deadline = deadline}))
    emit(KEYS[1], KEYS[4], segment, 'answered', cjson.encode({content = default}))
    return {'resumed', resume(segment, now)}
  end
  redis.call('HSET', KEYS[1], 'status', 'expired', 'touched', now)
  redis.call('HDEL', KEYS[1], 'asked', 'ask_deadline')
  redis.call('ZREM', KEYS[6], RUN)
  emit(KEYS[1], KEYS[4], segment, 'expired', cjson.encode({what = 'ask', outcome = 'stop',
    deadline = deadline}))
  emit(KEYS[1], KEYS[4], segment, 'finished', cjson.encode({stopped_by = 'expired',
    final_text = redis.call('HGET', KEYS[1], 'final_text') or cjson.null,
    spent_usd = tonumber(redis.call('HGET', KEYS[1], 'spent_usd') or '0'),
    steps = tonumber(redis.call('HGET', KEYS[1], 'steps') or '0')}))
  return {'expired', expired_child(now)}
end
"""

SETTLE = Lua(
    PRELUDE
    + CHILD_ENDED
    + _SETTLE
    + """
-- Apply what is due of a parked run: early decisions, expired deadlines. ARGV[2]=mark ARGV[3]=now
-- -> {'resumed', member} | {'waiting'} | {'expired'} | {'idle'}
return settle(tonumber(ARGV[3]))
"""
)

DECIDE_SCRIPT = Lua(
    PRELUDE
    + CHILD_ENDED
    + _SETTLE
    + """
-- Record one decision. ARGV[2]=mark ARGV[3]=now ARGV[4]=call id ARGV[5]=decision JSON
-- ARGV[6]=the most decisions kept for calls the segment has not made (counted in `early:s<segment>`)
-- -> {'resumed', member} | {'recorded'} | {'kept'} | {'ignored', why} | {'refused', why}
local now = tonumber(ARGV[3])
local call_id = ARGV[4]
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {'refused', 'missing'} end
local segment = tonumber(redis.call('HGET', KEYS[1], 'segment') or '0')
local field = 's' .. segment .. ':' .. call_id
local d = cjson.decode(ARGV[5])
local function earlier()
  if segment == 0 then return false end
  return redis.call('HGET', KEYS[2], 's' .. (segment - 1) .. ':' .. call_id)
end
local function late_or_dup(prior)
  local pd = cjson.decode(prior)
  if pd.actor == 'deadline' then
    return {'refused', 'The deadline for call ' .. call_id .. ' passed before this decision; the call was '
      .. 'answered with its default outcome (' .. tostring(pd.action) .. ').'}
  end
  return {'ignored', 'call ' .. call_id .. ' was decided already (' .. tostring(pd.action) .. ')'}
end
local prior = earlier()
if prior then return late_or_dup(prior) end
if terminal(status) then
  prior = redis.call('HGET', KEYS[2], field)
  if prior then return late_or_dup(prior) end
  return {'refused', 'The run has ended (' .. status .. '); it takes no decision.'}
end
local raw = redis.call('HGET', KEYS[1], 'approvals')
if status == 'asked' and raw then
  local held = false
  local ids = {}
  for _, p in ipairs(cjson.decode(raw)) do
    if p.call_id == call_id then held = p end
    table.insert(ids, p.call_id)
  end
  if not held then
    return {'refused', 'The run does not hold call ' .. call_id .. '; it waits for a decision on: '
      .. table.concat(ids, ', ') .. '.'}
  end
  prior = redis.call('HGET', KEYS[2], field)
  if not prior and tonumber(held.deadline) and now >= tonumber(held.deadline) then
    settle(now)
    prior = redis.call('HGET', KEYS[2], field)
  end
  if prior then return late_or_dup(prior) end
  if type(d.input_digest) == 'string' and d.input_digest ~= held.input_digest then
    return {'refused', 'The decision on call ' .. call_id .. ' was made for another input (digest '
      .. d.input_digest .. '; the held input is ' .. held.input_digest .. ').'}
  end
  redis.call('HSET', KEYS[2], field, ARGV[5])
  emit(KEYS[1], KEYS[4], tostring(segment), 'approval_decided', cjson.encode({call_id = call_id,
    name = held.name, action = d.action, actor = d.actor or cjson.null, reason = d.reason or '',
    input = d.input or cjson.null}))
  local settled = settle(now)
  if settled[1] == 'resumed' then return settled end
  return {'recorded'}
end
if status == 'asked' then
  return {'refused', 'The run waits for an answer to its question, not for a decision on a call.'}
end
prior = redis.call('HGET', KEYS[2], field)
if prior then return late_or_dup(prior) end
local count = 'early:s' .. segment  -- decisions kept for calls the segment has not made (yet)
if tonumber(redis.call('HGET', KEYS[2], count) or '0') >= tonumber(ARGV[6]) then
  return {'refused', 'Run ' .. RUN .. ' keeps ' .. ARGV[6] .. ' decisions already for calls it has not made '
    .. 'yet (TOOLLOOP_MAX_EARLY_DECISIONS); this one on call ' .. call_id .. ' is refused.\\n  Decide a call '
    .. 'once the run holds it (`toolloop status RUN` lists them), or raise the limit on the workers.'}
end
redis.call('HSET', KEYS[2], field, ARGV[5])
redis.call('HINCRBY', KEYS[2], count, 1)
emit(KEYS[1], KEYS[4], tostring(segment), 'approval_decided', cjson.encode({call_id = call_id,
  action = d.action, actor = d.actor or cjson.null, reason = d.reason or '', input = d.input or cjson.null,
  early = true}))
return {'kept'}
"""
)


DECIDE_SEND = with_prelude("""
-- The client's decision, stored and sent in one step, unless the call has one already: recorded
-- (this segment's, or the previous one's when the run has resumed since) or queued in the inbox for
-- a worker. The first decision sent wins here; the worker's DECIDE_SCRIPT still checks the rest.
-- KEYS: 1 state 2 decisions 3 the decide inbox 4 the control queue's list 5 the send order (a list:
-- workers apply the decisions in it in the order they were sent, workers/runs/approvals.py)
-- ARGV: 1 decision id 2 call id 3 the inbox entry (JSON) 4 message 5 task-sent channel 6 payload
-- -> {'sent'} | {'decided', decision JSON} | {'queued', inbox entry JSON} | {'ended', status}
--    | {'missing'}
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {'missing'} end
local segment = tonumber(redis.call('HGET', KEYS[1], 'segment') or '0')
local call_id = ARGV[2]
local prior = redis.call('HGET', KEYS[2], 's' .. segment .. ':' .. call_id)
if not prior and segment > 0 then
  prior = redis.call('HGET', KEYS[2], 's' .. (segment - 1) .. ':' .. call_id)
end
if prior then return {'decided', prior} end
if terminal(status) then return {'ended', status} end
local inbox = redis.call('HGETALL', KEYS[3])
for i = 2, #inbox, 2 do
  local entry = cjson.decode(inbox[i])
  if entry.call_id == call_id then return {'queued', inbox[i]} end
end
redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])
redis.call('RPUSH', KEYS[5], ARGV[1])
redis.call('LPUSH', KEYS[4], ARGV[4])
redis.call('PUBLISH', ARGV[5], ARGV[6])
return {'sent'}
""")


@dataclass(frozen=True, slots=True)
class DecideSent:
    """DECIDE_SEND's reply: `sent` (stored, its message sent), `decided` (`detail`: the decision
    recorded for the call), `queued` (`detail`: the inbox entry of a decision not applied yet),
    `ended` (`detail`: the run's final status) or `missing` (no such run). Nothing is stored unless
    `sent`."""

    what: str
    detail: str = ""


def parse_decide_sent(reply: list[Any]) -> DecideSent:
    """DECIDE_SEND's reply, parsed once."""
    return DecideSent(str(reply[0]), str(reply[1]) if len(reply) > 1 else "")


@dataclass(frozen=True, slots=True)
class Settled:
    """SETTLE's or DECIDE_SCRIPT's reply: what happened (`resumed`, `waiting`, `expired`, `idle`;
    `recorded`, `kept`, `ignored`, `refused`), the outbox member to send when `resumed` (when
    `expired`: the member of the parent run the expired child woke, if any), and why a decision was
    `ignored` or `refused`."""

    what: str
    member: str | None = None
    why: str = ""


def parse_settled(reply: list[Any]) -> Settled:
    """SETTLE's or DECIDE_SCRIPT's reply, parsed once."""
    what = str(reply[0])
    detail = str(reply[1]) if len(reply) > 1 and reply[1] is not None else None
    if what in (
        "resumed",
        "expired",
    ):  # expired: the member of the parent it woke, if any
        return Settled(what, member=detail)
    return Settled(what, why=detail or "")

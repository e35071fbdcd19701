"""The run scripts of clients, control tasks and the sweeper, each with its reply typed:
ANSWER_SEND (`parse_sent`: the client's), RUN_ANSWER (`parse_answer`), RUN_RETRY (`parse_retry`)
and INDEX_DROP (its reply, 1 when dropped, is not read). A cancel is CANCEL_TREE
(workers/protocol/scripts/children.py): the run and every run it spawned."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from workers.protocol.lua import Lua
from workers.protocol.scripts.prelude import with_prelude

ANSWER_SEND = with_prelude("""
-- The client's answer, claimed and sent in one step: the first answer for a segment's question wins
-- here, at send time (HSETNX of the segment's answer slot), so answers sent one after another count
-- in the order they were sent however their `toolloop.answer` messages are handled later; the
-- message only wakes the run (RUN_ANSWER). A run not parked yet keeps the answer for its park.
-- KEYS: 1 state 2 answers 3 inbox 4 live-runs index 5 the control queue's list
-- ARGV: 1 run id 2 answer id 3 segment ('' = the run's current one) 4 content 5 now 6 message
--       7 task-sent channel 8 task-sent payload
-- -> {'sent', segment} | {'ignored', why} | {'ended', status} | {'late', status} | {'waiting'}
--    | {'missing'}
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {'missing'} end
local current = tonumber(redis.call('HGET', KEYS[1], 'segment') or '0')
local pinned = tonumber(ARGV[3])
local now = tonumber(ARGV[5])
local expired = tonumber(redis.call('HGET', KEYS[1], 'expired_segment') or '')
local deadline = tonumber(redis.call('HGET', KEYS[1], 'ask_deadline') or '')
if terminal(status) and status ~= 'expired' then return {'ended', status} end
if status == 'expired' or (pinned and expired == pinned)
    or (status == 'asked' and deadline and now >= deadline) then
  return {'late', status}
end
if status == 'waiting' then return {'waiting'} end  -- on its children: the client asks the one that asks
if pinned and pinned ~= current then return {'ignored', 'that question was already answered'} end
if redis.call('HSETNX', KEYS[2], 's' .. current, ARGV[4]) == 0 then
  return {'ignored', 'that question was already answered'}
end
redis.call('HSET', KEYS[3], ARGV[2], cjson.encode({segment = current, content = ARGV[4], at = now,
  claimed = true}))
redis.call('ZADD', KEYS[4], now, ARGV[1])
redis.call('LPUSH', KEYS[5], ARGV[6])
redis.call('PUBLISH', ARGV[7], ARGV[8])
return {'sent', current}
""")

RUN_ANSWER = with_prelude("""
-- Apply an answer of the run's inbox: the first answer for a segment's ask wins (a client's was
-- claimed when sent: ANSWER_SEND; a cancel's is claimed here); a parked run whose question has an
-- answer resumes at once, a run not parked yet keeps the answer for when it parks.
-- KEYS: 1 state 2 answers 3 inbox 4 events 5 outbox; ARGV: 1 answer id 2 now
-- -> {'resumed', member} | {'kept'} | {'ignored', why} | {'gone'}
local raw = redis.call('HGET', KEYS[3], ARGV[1])
if not raw then return {'gone'} end
redis.call('HDEL', KEYS[3], ARGV[1])
local a = cjson.decode(raw)
local status = redis.call('HGET', KEYS[1], 'status')
local segment = tonumber(redis.call('HGET', KEYS[1], 'segment') or '0')
if terminal(status) then return {'ignored', 'the run has ended (' .. status .. ')'} end
if tonumber(a.segment) ~= segment then return {'ignored', 'that question was already answered'} end
local slot = 's' .. segment
local fresh = a.claimed or redis.call('HSETNX', KEYS[2], slot, a.content) == 1
if status ~= 'asked' then
  if fresh then return {'kept'} end
  return {'ignored', 'that question was already answered'}
end
local content = redis.call('HGET', KEYS[2], slot)  -- the answer that won (this one, or an earlier)
emit(KEYS[1], KEYS[4], tostring(segment), 'answered', cjson.encode({content = content}))
local next_segment = segment + 1
emit(KEYS[1], KEYS[4], tostring(next_segment), 'resumed', '{}')
local member = (tonumber(redis.call('HGET', KEYS[1], 'n') or '0') + 1) .. '|llm'
redis.call('HSET', KEYS[1], 'status', 'queued', 'segment', next_segment, 'queue', 'llm', 'touched', ARGV[2])
redis.call('HDEL', KEYS[1], 'asked', 'approvals', 'decided', 'ask_deadline')
redis.call('ZADD', KEYS[5], ARGV[2], member)
return {'resumed', member}
""")

RUN_RETRY = with_prelude("""
-- Queue a failed run again from its journal. KEYS: 1 state 2 attempts 3 events 4 outbox
-- ARGV: 1 now 2 the queued event's data (JSON: model, toolset, budget_usd, retry)
-- -> {'queued', member} | {'refused', status}
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= 'failed' then return {'refused', status or 'missing'} end
local segment = redis.call('HGET', KEYS[1], 'segment') or '0'
local queue = redis.call('HGET', KEYS[1], 'queue') or 'llm'
local member = (tonumber(redis.call('HGET', KEYS[1], 'n') or '0') + 1) .. '|' .. queue
redis.call('HDEL', KEYS[1], 'error_class', 'error_message')
redis.call('HSET', KEYS[1], 'status', 'queued', 'touched', ARGV[1])
redis.call('DEL', KEYS[2])
emit(KEYS[1], KEYS[3], segment, 'queued', ARGV[2] or cjson.encode({retry = true}))
redis.call('ZADD', KEYS[4], ARGV[1], member)
return {'queued', member}
""")

INDEX_DROP = Lua("""
-- Drop a run from the live-runs index only if its score is still the one the sweeper read.
-- KEYS[1]=the index; ARGV[1]=run id ARGV[2]=score read -> 1 when dropped
if tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1])) == tonumber(ARGV[2]) then
  return redis.call('ZREM', KEYS[1], ARGV[1])
end
return 0
""")


@dataclass(frozen=True, slots=True)
class Sent:
    """ANSWER_SEND's reply: `sent` (claimed for `segment`, its message sent), `ignored` (`why`: the
    question has its answer already), `ended` or `late` (`status`: the run ended, or the question
    passed its deadline), `waiting` (the run waits on its child runs: the question is a child's), or
    `missing` (no such run). Nothing is stored unless `sent`."""

    what: Literal["sent", "ignored", "ended", "late", "waiting", "missing"]
    detail: str = ""


def parse_sent(reply: list[Any]) -> Sent:
    """ANSWER_SEND's reply, parsed once."""
    what = str(reply[0])
    detail = str(reply[1]) if len(reply) > 1 else ""
    if what in ("sent", "ignored", "ended", "late", "waiting"):
        return Sent(what, detail)  # type: ignore[arg-type]
    return Sent("missing")


@dataclass(frozen=True, slots=True)
class Answered:
    """RUN_ANSWER's reply: `resumed` (send `member`, "<n>|llm"), `kept` (the run had not parked
    yet), `ignored` (`why`), or `gone` (no such answer in the inbox: applied already)."""

    what: Literal["resumed", "kept", "ignored", "gone"]
    member: str | None = None
    why: str | None = None


def parse_answer(reply: list[Any]) -> Answered:
    """RUN_ANSWER's reply, parsed once."""
    what = str(reply[0])
    if what == "resumed":
        return Answered("resumed", member=str(reply[1]))
    if what == "ignored":
        return Answered("ignored", why=str(reply[1]))
    return Answered("kept" if what == "kept" else "gone")


@dataclass(frozen=True, slots=True)
class Retried:
    """RUN_RETRY's reply: the outbox member to send when the run was queued again, else the status
    that refused it (`missing` for no run)."""

    member: str | None
    refused: str | None = None


def parse_retry(reply: list[Any]) -> Retried:
    """RUN_RETRY's reply, parsed once."""
    if str(reply[0]) == "queued":
        return Retried(str(reply[1]))
    return Retried(None, str(reply[1]))

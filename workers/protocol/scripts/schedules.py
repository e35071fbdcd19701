"""The schedule scripts (workers/protocol/schedules.py), each with its reply typed: SCHEDULE_ADD and
SCHEDULE_REMOVE (1 or 0), DUE_TAKE (the ids of a sweep's round), FIRE and FIRE_ENQUEUE
(`parse_fire`).

The fence: a tick is claimed by comparing the schedule's `next` (or `held`) field with the tick the
sweeper read, and moving it on, in one script, so of two sweepers that read the same tick one claims
it and the other finds it `taken`. FIRE_ENQUEUE is that claim followed, in the same script, by the
ENQUEUE of workers/protocol/scripts/enqueue.py (the run stored and its first step sent): a tick's
run exists if and only if its claim was made, whatever dies when.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from workers.protocol.lua import Lua
from workers.protocol.scripts.enqueue import ENQUEUE
from workers.protocol.scripts.prelude import PRELUDE, with_prelude
from workers.protocol.scripts.talk import FOLLOW_UP_BODY

SCHEDULE_ADD = Lua("""
-- KEYS: 1 the schedule's hash 2 the due index 3 the index of all schedules 4 its definition
--       5 the state hash of the run a follow-up goes to (a key that never exists: none)
-- ARGV: 1 id 2 definition (JSON) 3 first tick 4 now 5 '1' when KEYS[5] must exist
-- -> 1 added, 0 a schedule with this id exists (an add with the same idempotency key: nothing
--    written), -1 the follow-up's run does not exist (nothing written)
if ARGV[5] == '1' and redis.call('EXISTS', KEYS[5]) == 0 then return -1 end
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('SET', KEYS[4], ARGV[2])
redis.call('HSET', KEYS[1], 'next', ARGV[3], 'fired', 0)
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[1])
return 1
""")

SCHEDULE_REMOVE = Lua("""
-- KEYS: 1 the schedule's hash 2 the due index 3 the index of all schedules 4 its definition
-- ARGV: 1 id -> 1 removed, 0 no such schedule. A fire under way either ran before (its run stays)
-- or finds the hash gone and claims nothing.
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('DEL', KEYS[4])
return redis.call('DEL', KEYS[1])
""")

DUE_TAKE = Lua("""
-- A sweeper's next round of due schedules. KEYS: 1 the due index; ARGV: 1 now 2 the most ids a
-- round takes 3 the most it reads without taking them 4 until when the ids it takes are hidden
-- from other sweepers
-- -> {taken, id...} (`parse_take`): of the n ids due at ARGV[1] (score <= now), ARGV[2] when n is
--    more; half of them (rounded up) when n is more than ARGV[3], so a racing sweeper takes the
--    other half; those are moved to ARGV[4] in the index (taken 1), hidden from racing sweepers
--    until each one's claim (FIRE, FIRE_MANY) moves it on, or until ARGV[4] if its sweeper died.
--    n <= ARGV[3]: all n, as they are (taken 0): racing sweepers read the same ids, and the fence
--    of each claim decides.
local most, least = tonumber(ARGV[2]), tonumber(ARGV[3])
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, most + 1)
if #ids <= least then return {0, unpack(ids)} end
local take = #ids > most and most or math.ceil(#ids / 2)
local out = {1}
for i = 1, take do
  redis.call('ZADD', KEYS[1], 'XX', ARGV[4], ids[i])
  out[i + 1] = ids[i]
end
return out
""")


@dataclass(frozen=True, slots=True)
class Taken:
    """DUE_TAKE's reply: a round's schedule ids, and whether they were taken (hidden from racing
    sweepers: more were due than one FIRE_MANY call fires) or only read."""

    ids: list[str]
    taken: bool


def parse_take(reply: Any) -> Taken:
    return Taken([str(sid) for sid in reply[1:]], int(reply[0]) == 1)


_CLAIM = """
-- claim(sk, dk, lk, o): sk the schedule's hash, dk the due index, lk the state hash of the run that
-- decides whether the target is busy (a key that never exists when none), o the offset of the claim's
-- ARGV: o+1 id, o+2 field read ('next' or 'held'), o+3 the field's value as read (the fence),
-- o+4 now, o+5 the next tick after it ('' none: the schedule ends; with field 'next' only),
-- o+6 ticks missed before it, o+7 what the sweeper asks: 'fire', 'miss' (past its grace, catch_up
-- skip) or 'fail' (the target was refused: o+10 says why), o+8 if_busy (skip, queue, steer),
-- o+9 the run id a fire makes ('' for a follow-up), o+10 the error, o+11 when to look again at a
-- held tick, o+12 what makes lk's run busy: 'unended' (any status but a final one), 'running'
-- (queued or running), or the sweeper's own finding: 'busy' or 'free' (a follow-up's target),
-- o+13 the tick this fires (with catch-up, the latest due: after o+3)
-- -> {'taken'} another sweeper claimed it, or the schedule is gone | {'fire'} | {'steer'}
--    | {'held'} | {'skipped'} | {'missed'} | {'failed'}
local function claim(sk, dk, lk, o)
  local id, field, tick, now = ARGV[o+1], ARGV[o+2], ARGV[o+13], ARGV[o+4]
  local read = redis.call('HMGET', sk, field, 'held', 'next')
  if read[1] ~= ARGV[o+3] then return {'taken'} end
  -- held: the field as read; holding: as this claim leaves it; sets: the fields it writes, in one HSET
  local held, nxt = read[2], read[3]
  local holding, sets = held, {}
  local function set(name, value) sets[#sets + 1] = name; sets[#sets + 1] = value end
  local function unhold()
    if holding then redis.call('HDEL', sk, 'held'); holding = false end
  end
  if field == 'next' then
    nxt = ARGV[o+5]
    set('next', nxt)
    if tonumber(ARGV[o+6]) > 0 then redis.call('HINCRBY', sk, 'missed', ARGV[o+6]) end
  end
  local function settle(outcome, counter)
    if counter then redis.call('HINCRBY', sk, counter, 1) end
    set('last_outcome', outcome == 'fire' and 'fired' or outcome)
    set('last_at', now)
    redis.call('HSET', sk, unpack(sets))
    local score = tonumber(nxt)
    if holding then
      local again = tonumber(ARGV[o+11])
      if not score or again < score then score = again end
    end
    if score then redis.call('ZADD', dk, score, id) else redis.call('ZREM', dk, id) end
    return {outcome}
  end
  local wanted = ARGV[o+7]
  if wanted ~= 'fire' then
    if field == 'held' then unhold() end
    set('last_tick', tick)
    if wanted == 'fail' then
      set('last_error', ARGV[o+10])
      return settle('failed', 'failed')
    end
    return settle('missed', 'missed')
  end
  local busy, mode = false, ARGV[o+12]
  if mode == 'busy' then busy = true
  elseif mode == 'running' then
    local status = redis.call('HGET', lk, 'status')
    busy = status == 'queued' or status == 'running'
  elseif mode == 'unended' then
    local status = redis.call('HGET', lk, 'status')
    busy = status and not terminal(status)
  end
  if busy and ARGV[o+8] == 'queue' then
    if field == 'next' and held then redis.call('HINCRBY', sk, 'skipped', 1) end
    set('held', tick)
    holding = tick
    return settle('held')
  end
  if busy and ARGV[o+8] ~= 'steer' then
    set('last_tick', tick)
    return settle('skipped', 'skipped')
  end
  if held and field == 'next' then redis.call('HINCRBY', sk, 'skipped', 1) end
  unhold()
  set('last_tick', tick)
  set('last_run', ARGV[o+9])
  if busy then return settle('steer', 'fired') end
  return settle('fire', 'fired')
end
"""

FIRE = with_prelude(
    """
-- Claim a tick (or settle it as missed or failed) without a run to store: a follow-up's, or a
-- tick the sweeper will not fire. KEYS: 1 the schedule's hash 2 the due index 3 the state hash
-- that says whether the target is busy; ARGV: the claim's (below), from 1
-- -> the claim's reply
"""
    + _CLAIM
    + "return claim(KEYS[1], KEYS[2], KEYS[3], 0)\n"
)

FIRE_ENQUEUE = with_prelude(
    """
-- Claim a tick and, when it fires, store its run and send the run's first step: ENQUEUE's KEYS
-- 1-8 and ARGV 1-10 (workers/protocol/scripts/enqueue.py), then KEYS 9 the schedule's hash 10 the due index
-- 11 the state hash of the schedule's last run, ARGV 11- the claim's (below).
-- -> the claim's reply when it does not fire | 1 fired: the run stored and sent | 0 fired, and a run
--    with this id existed already (nothing written for it)
"""
    + _CLAIM
    + """
local claimed = claim(KEYS[9], KEYS[10], KEYS[11], 10)
if claimed[1] ~= 'fire' then return claimed end
"""
    + ENQUEUE.source
)
assert PRELUDE in FIRE.source and PRELUDE in FIRE_ENQUEUE.source

FIRE_MANY = with_prelude(
    """
-- Fire a batch of due schedules in one call (workers/runs/scheduler.py), each item on its own:
--   'claim'    FIRE's KEYS (3) and ARGV (13)
--   'enqueue'  FIRE_ENQUEUE's KEYS (11) and ARGV (23)
--   'send'     a follow-up's tick claimed and its follow-up applied together: KEYS 1 the schedule's
--              hash 2 the due index 3-14 FOLLOW_UP's 12 (workers/protocol/scripts/talk.py) 15 the
--              list of the step's queue 16- the run's keys made persistent again (retention had
--              started when it ended); ARGV 1-13 the claim's (mode: see below), 14-24 FOLLOW_UP's
--              11, 25 the run's journal key prefix, 26 the successor member the step message is for
--              ("<n>|llm", n read before), 27 that message 28 its task-sent channel 29 the event
-- ARGV: per item its kind, its count of KEYS, its count of ARGV, then its ARGV; KEYS: the items'
-- KEYS one after the other.
-- -> one reply per item: the claim's or FIRE_ENQUEUE's; for 'send' also {'slow'}: nothing was
--    written (the run is missing, asked, refuses the follow-up, or is steered: the sweeper takes
--    the tick the one-by-one way, which says why), or {'fire', member}: fired, but the step message
--    was made for another member (the run moved meanwhile): the sweeper sends that member's.
-- A 'send' claims the tick only once its fence holds (the schedule's field still reads what the
-- sweeper read), then reads the run: a follow-up already sent with this tick's key (a sweeper
-- that died between its send and its claim) is claimed fired; a queued or running run is claimed
-- busy (held or skipped, its policy says), a steer is left to the slow way; a run that ended done
-- or interrupted is followed up (FOLLOW_UP) and its step sent, and the tick claimed fired.
"""
    + """
local function claim_in(ARGV, sk, dk, lk, o)
"""
    + _CLAIM
    + """
  return claim(sk, dk, lk, o)
end
local function follow_up(KEYS, ARGV)
"""
    + FOLLOW_UP_BODY
    + """
end
local function fire_enqueue(KEYS, ARGV)
  local claimed = claim_in(ARGV, KEYS[9], KEYS[10], KEYS[11], 10)
  if claimed[1] ~= 'fire' then return claimed end
"""
    + ENQUEUE.source
    + """
end
local function fire_send(K, A)
  local sk, dk, state = K[1], K[2], K[3]
  if redis.call('HGET', sk, A[2]) ~= A[3] then return {'taken'} end
  if A[7] ~= 'fire' then return claim_in(A, sk, dk, state, 0) end
  local status = redis.call('HGET', state, 'status')
  if not status then return {'slow'} end
  if redis.call('HEXISTS', K[8], A[15]) == 1 then
    A[12] = 'free'
    return claim_in(A, sk, dk, state, 0)
  end
  if status == 'queued' or status == 'running' then
    if A[8] == 'steer' then return {'slow'} end
    A[12] = 'busy'
    return claim_in(A, sk, dk, state, 0)
  end
  if status ~= 'done' and status ~= 'interrupted' then return {'slow'} end
  local sent = follow_up({unpack(K, 3, 14)}, {unpack(A, 14, 24)})
  if sent[1] ~= 'continued' and sent[1] ~= 'again' then return {'slow'} end
  A[12] = 'free'
  local claimed = claim_in(A, sk, dk, state, 0)
  if sent[1] == 'continued' then
    for i = 16, #K do redis.call('PERSIST', K[i]) end
    local segment = tonumber(redis.call('HGET', state, 'segment') or '0')
    for i = 0, segment do redis.call('PERSIST', A[25] .. 's' .. i) end
    if sent[3] == A[26] then
      redis.call('LPUSH', K[15], A[27])
      redis.call('PUBLISH', A[28], A[29])
    else
      claimed[2] = sent[3]
    end
  end
  return claimed
end
local replies = {}
local ki, ai = 1, 1
while ai <= #ARGV do
  local kind, nk, na = ARGV[ai], tonumber(ARGV[ai + 1]), tonumber(ARGV[ai + 2])
  local k = {unpack(KEYS, ki, ki + nk - 1)}
  local a = {unpack(ARGV, ai + 3, ai + 2 + na)}
  if kind == 'send' then replies[#replies + 1] = fire_send(k, a)
  elseif kind == 'enqueue' then replies[#replies + 1] = fire_enqueue(k, a)
  else replies[#replies + 1] = claim_in(a, k[1], k[2], k[3], 0) end
  ki, ai = ki + nk, ai + 3 + na
end
return replies
"""
)

Outcome = Literal["fired", "steer", "held", "skipped", "missed", "failed", "taken"]


@dataclass(frozen=True, slots=True)
class Fired:
    """FIRE's or FIRE_ENQUEUE's reply: `fired` (the target applied: for FIRE_ENQUEUE the run was
    stored with its first step sent, `new` False when a run with its id existed already), `steer`
    (claimed; the target is running and the policy steers it), `held` (waits for a busy target),
    `skipped` (the target was busy), `missed` (past its grace), `failed` (the target was refused),
    `taken` (another sweeper claimed the tick, or the schedule was removed: nothing written)."""

    what: Outcome
    new: bool = False


def parse_fire(reply: Any) -> Fired:
    if isinstance(reply, int):
        return Fired("fired", new=reply == 1)
    what = str(reply[0])
    if what == "fire":
        return Fired("fired")
    if what not in ("steer", "held", "skipped", "missed", "failed", "taken"):
        raise ValueError(f"unexpected reply of a schedule's fire: {reply!r}")
    return Fired(what)  # type: ignore[arg-type]

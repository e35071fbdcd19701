"""The scripts of child runs (workers/step/children.py, workers/runs/children.py), each with its
reply typed: SPAWN (`parse_spawn`), CANCEL_TREE (`parse_cancel_tree`), TREE (`parse_tree`) and
ASKING (`parse_asking`). The end of a child (its parent's record, and the parent's wake) and a
parent's park on its children are part of RUN_COMMIT (workers/protocol/scripts/commit.py):
`CHILD_ENDED` below is put in it.

Every run of a tree lives on the root's slot (toolloop/journal/keys.py `run_key`), so each script
touches one slot. The scripts that walk a tree build a run's key from its id with the Lua `run_key`,
as toolloop/journal/keys.py `run_key` does (tests/integration/test_children.py checks the two agree).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from workers.protocol.lua import Lua
from workers.protocol.records import RunNode
from workers.protocol.scripts.prelude import with_prelude

RUN_KEY = """
local function run_key(prefix, id, name)
  local root, rest = string.match(id, '^([^.]*)(.*)$')
  return prefix .. '{' .. root .. '}' .. rest .. ':' .. name
end
"""

SPAWN = with_prelude("""
-- Spawn the children of one `spawn` call once: a re-run of the spawning step gets the same ids back
-- and starts nothing. The children's budgets are carved from what the parent has left, or refused.
-- KEYS: 1 parent state 2 parent children 3 parent events 4 live runs 5 all runs 6 the llm queue,
--       then 5 per child: spec state input events outbox
-- ARGV: 1 now 2 call ("<segment>/<call id>") 3 parent id 4 the parent's budget, micro-dollars
--       5 the parent's spend so far, micro-dollars 6 the outbox score of the children's first steps
--       7 the traceparent of the parent's segment span ('' none: the parent's own caller's, if any)
--       then 6 per child: id, spec JSON, first messages JSON, queued data, budget micro-dollars,
--       first step's task message
-- -> {'started', ids} | {'again', ids} (ids: comma-separated) | {'over', remaining micro-dollars}
--    | {'ended', status} | {'cancelled'}
local known = redis.call('HGET', KEYS[2], 'call:' .. ARGV[2])
if known then return {'again', known} end
local status = redis.call('HGET', KEYS[1], 'status')
if not status or terminal(status) then return {'ended', status or 'missing'} end
if redis.call('HGET', KEYS[1], 'cancel') == '1' then return {'cancelled'} end
local count = (#ARGV - 7) / 6
local total = 0
for i = 0, count - 1 do total = total + tonumber(ARGV[8 + i * 6 + 4]) end
local remaining = tonumber(ARGV[4]) - tonumber(ARGV[5])
if total > remaining then return {'over', tostring(remaining)} end
local segment = redis.call('HGET', KEYS[1], 'segment') or '0'
local depth = tonumber(redis.call('HGET', KEYS[1], 'depth') or '0') + 1
local traceparent = ARGV[7] ~= '' and ARGV[7] or redis.call('HGET', KEYS[1], 'traceparent')
local ids = {}
for i = 0, count - 1 do
  local a, k = 8 + i * 6, 7 + i * 5
  local id = ARGV[a]
  ids[#ids + 1] = id
  if redis.call('EXISTS', KEYS[k]) == 0 then
    redis.call('SET', KEYS[k], ARGV[a + 1])
    redis.call('HSET', KEYS[k + 1], 'status', 'queued', 'segment', 0, 'n', 0, 'queue', 'llm', 'seq', 1,
      'created', ARGV[1], 'touched', ARGV[1], 'parent', ARGV[3], 'depth', depth, 'call', ARGV[2],
      'budget_micros', ARGV[a + 4])
    if traceparent then redis.call('HSET', KEYS[k + 1], 'traceparent', traceparent) end
    redis.call('HSET', KEYS[k + 2], 's0', ARGV[a + 2])
    redis.call('XADD', KEYS[k + 3], '*', 'seq', 1, 'segment', 0, 'kind', 'queued', 'data', ARGV[a + 3])
    redis.call('ZADD', KEYS[k + 4], ARGV[6], '1|llm')
    redis.call('ZADD', KEYS[4], ARGV[1], id)
    redis.call('ZADD', KEYS[5], ARGV[1], id)
    redis.call('LPUSH', KEYS[6], ARGV[a + 5])
    emit(KEYS[1], KEYS[3], segment, 'child_started', cjson.encode({child = id, depth = depth,
      budget_usd = tonumber(ARGV[a + 4]) / 1000000, call = ARGV[2]}))
  end
end
local listed = table.concat(ids, ',')
redis.call('HSET', KEYS[2], 'call:' .. ARGV[2], listed, 'open:' .. ARGV[2], count)
local all = redis.call('HGET', KEYS[2], 'ids')
redis.call('HSET', KEYS[2], 'ids', all and (all .. ',' .. listed) or listed)
redis.call('HINCRBY', KEYS[1], 'children', count)
return {'started', listed}
""")

CHILD_ENDED = """
local function child_ended(c, child, now)
  -- a child ended: its record in the parent's children (once), its spend added (integers), and when
  -- it was the last open child of a parent waiting on them, the parent queued again (once: only a
  -- `waiting` parent moves) -> the parent's outbox member to send, or false
  if redis.call('HSETNX', c.children, child, c.record) == 0 then return false end
  redis.call('HINCRBY', c.children, 'spent_micros', c.micros)
  local open = redis.call('HINCRBY', c.children, c.open, -1)
  local seg = redis.call('HGET', c.state, 'segment') or '0'
  emit(c.state, c.events, seg, 'child_finished', c.record)
  if open > 0 or redis.call('HGET', c.state, 'status') ~= 'waiting' then return false end
  local m = redis.call('HGET', c.state, 'wait_member')
  redis.call('HSET', c.state, 'status', 'queued', 'touched', now)
  redis.call('HDEL', c.state, 'wait_member')
  redis.call('ZADD', c.outbox, now, m)
  emit(c.state, c.events, seg, 'woken', cjson.encode({child = child}))
  return m
end
"""

CANCEL_TREE = with_prelude(
    """
-- Cancel a run and every descendant it has spawned, in one atomic walk of the tree (a child spawned
-- later is refused: SPAWN reads its parent's cancel mark). Each run not ended is marked (kept
-- across restarts) and its id published on the cancel channel (its live step aborts).
-- KEYS: 1 state of the run; ARGV: 1 channel 2 run id 3 key prefix ("tl:")
-- -> false (no such run) | {status of the run, {id, status, id, status, ...} of the runs marked}
"""
    + RUN_KEY
    + """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return false end
if terminal(status) then return {status, {}} end
local marked, queue, i = {}, {ARGV[2]}, 1
while i <= #queue do
  local id = queue[i]
  i = i + 1
  local state = run_key(ARGV[3], id, 'state')
  local st = redis.call('HGET', state, 'status')
  if st and not terminal(st) then
    redis.call('HSET', state, 'cancel', '1')
    redis.call('PUBLISH', ARGV[1], id)
    marked[#marked + 1] = id
    marked[#marked + 1] = st
  end
  local ids = redis.call('HGET', run_key(ARGV[3], id, 'children'), 'ids')
  if ids then
    for child in string.gmatch(ids, '[^,]+') do queue[#queue + 1] = child end
  end
end
return {status, marked}
"""
)

TREE = Lua(
    """
-- The runs of a tree under a run, breadth first (each after its parent, children in spawn order).
-- KEYS: 1 state of the run; ARGV: 1 run id 2 key prefix ("tl:") 3 most runs to list
-- -> {} (no such run) | {id, parent, status, spent_usd, steps, budget_micros, asked, final_text, ...}
"""
    + RUN_KEY
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return {} end
local found, queue, i = {}, {{ARGV[1], ''}}, 1
while i <= #queue and i <= tonumber(ARGV[3]) do
  local id, parent = queue[i][1], queue[i][2]
  i = i + 1
  local f = redis.call('HMGET', run_key(ARGV[2], id, 'state'), 'status', 'spent_usd', 'steps',
    'budget_micros', 'asked', 'final_text')
  found[#found + 1] = id
  found[#found + 1] = parent
  for j = 1, 6 do found[#found + 1] = f[j] or '' end
  local ids = redis.call('HGET', run_key(ARGV[2], id, 'children'), 'ids')
  if ids then
    for child in string.gmatch(ids, '[^,]+') do queue[#queue + 1] = {child, id} end
  end
end
return found
"""
)

ASKING = Lua(
    """
-- The first run under a run (breadth first, spawn order) that is parked on a question (an `ask`,
-- not held approvals) with no answer on its way (its inbox empty, no cancel).
-- KEYS: 1 state of the run; ARGV: 1 run id 2 key prefix ("tl:")
-- -> {the asking run's id, its question (JSON)}, or false
"""
    + RUN_KEY
    + """
local queue, i = {ARGV[1]}, 1
while i <= #queue do
  local id = queue[i]
  i = i + 1
  local f = redis.call('HMGET', run_key(ARGV[2], id, 'state'), 'status', 'asked', 'approvals', 'cancel')
  if i > 2 and f[1] == 'asked' and f[2] and not f[3] and f[4] ~= '1'
      and redis.call('HLEN', run_key(ARGV[2], id, 'inbox')) == 0 then
    return {id, f[2]}
  end
  local ids = redis.call('HGET', run_key(ARGV[2], id, 'children'), 'ids')
  if ids then
    for child in string.gmatch(ids, '[^,]+') do queue[#queue + 1] = child end
  end
end
return false
"""
)


@dataclass(frozen=True, slots=True)
class Spawned:
    """SPAWN's reply: `started` (the children were stored and their first steps queued), `again` (a
    re-run of the spawning step: the children it started before), `over` (`remaining_micros` is
    what the parent has left, less than the children asked for: nothing stored), `ended` (the
    parent has ended: `status`) or `cancelled` (the parent is being cancelled: nothing stored)."""

    what: Literal["started", "again", "over", "ended", "cancelled"]
    ids: list[str]
    remaining_micros: int = 0
    status: str = ""


def parse_spawn(reply: list[Any]) -> Spawned:
    """SPAWN's reply, parsed once."""
    what = str(reply[0])
    if what in ("started", "again"):
        return Spawned(what, [one for one in str(reply[1]).split(",") if one])  # type: ignore[arg-type]
    if what == "over":
        return Spawned("over", [], remaining_micros=int(float(reply[1])))
    if what == "ended":
        return Spawned("ended", [], status=str(reply[1]))
    return Spawned("cancelled", [])


def parse_cancel_tree(reply: Any) -> tuple[str, list[tuple[str, str]]] | None:
    """CANCEL_TREE's reply: (the run's status before, [(run id, its status before)] of every run it
    marked, the run first), or None when there is no such run."""
    if reply is None:
        return None
    status, flat = reply
    pairs = [(str(flat[i]), str(flat[i + 1])) for i in range(0, len(flat), 2)]
    return str(status), pairs


def parse_tree(reply: list[Any]) -> list[RunNode]:
    """TREE's reply, parsed once."""
    rows = []
    for i in range(0, len(reply), 8):
        run_id, parent, status, spent, steps, budget, asked, final = (
            str(v) for v in reply[i : i + 8]
        )
        rows.append(
            RunNode(
                run_id=run_id,
                parent=parent or None,
                status=status,
                spent_usd=float(spent or 0),
                steps=int(steps or 0),
                budget_usd=int(budget) / 1_000_000 if budget else None,
                asked=json.loads(asked) if asked and status == "asked" else None,
                final_text=final or None,
            )
        )
    return rows


def parse_asking(reply: Any) -> tuple[str, dict[str, Any]] | None:
    """ASKING's reply: (the id of the run that asks, its question), or None."""
    if not reply:
        return None
    return str(reply[0]), json.loads(reply[1])

"""RUN_COMMIT, the end of an `advance` task: its payload (`Commit`, one encoder) and its reply
(`parse_commit`), typed."""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field as _default
from typing import Any, Literal

from toolloop.fastjson import dumps
from workers.protocol.scripts.begin import NotBegun, Started, pairs
from workers.protocol.scripts.children import CHILD_ENDED
from workers.protocol.scripts.prelude import with_prelude

RUN_COMMIT = with_prelude(
    """
-- End of an `advance` task: the step's value, its events, and what comes next, in one write.
-- KEYS: 1 state 2 fence 3 lease 4 events 5 outbox 6 history 7 input 8 answers 9 journal (segment)
--       10 attempts 11 spend 12 unacked 13 unacked_index (kombu's: only with go_on)
--       14 the waits-due zset (a park with a deadline or held approvals: p.due, p.run)
--       15 the run's children hash (child runs, below)
-- ARGV[1]: JSON {token, lease, n, segment, field, value, events: [[index, kind, data]...],
--   outcome: 'next'|'park'|'stop'|'fail', queue, now, state: {field: text}, history,
--   final: [kind, data] (the run event of a stop or a failure), parked (data), cancel_text,
--   requested (optional): [data...] an `approval_requested` event each, due/run (optional),
--   go_on (optional): {owner, lease_ms, tag, unacked}: the caller runs the successor itself, now,
--   streamed (optional): "<segment>|<step>|<attempt>", the streamed step whose model event this
--   commit carries (workers/process/deltas.py); any other streamed attempt gets a `discarded` marker,
--   steerable (optional): a `done` stop that becomes a 'next' (model step on llm) while a steer waits
--   in the state (workers/protocol/scripts/talk.py): the run goes on and takes it,
--   compacted (optional): a park's or a stop's compaction state, input field 'c<next segment>'}
--   (`Commit.encode` in workers/protocol/scripts/commit.py writes it)
-- A step `steer:<id>` that lands deletes the steer from the state (it is the journal's now).
-- -> {1, stored value or false, outbox member to send or false, begun or false}
--    | {0, stored or false, false, false} (fenced)
-- With go_on, a 'next' commit also does what RUN_BEGIN of the successor would do, as if that task
-- began the moment this one committed: the successor's message is recorded as delivered to the
-- caller (kombu's unacked, restored from there if the caller dies), its outbox entry is dropped,
-- the run's lease goes to go_on.owner with a new token, and the delivery is counted.
-- begun = {token, attempts, state (flat), outside spend, tag}, as RUN_BEGIN's 'run' reply has them.
-- went_on (optional): a retried commit whose first attempt had go_on with that owner; when that
-- attempt landed (the lease is the owner's, `n` this commit's), the reply is its begun again.
-- Child runs (workers/step/children.py, workers/runs/children.py; KEYS 15 the run's children hash):
-- a 'next' commit with wait_open (the children field of the `spawn` call whose wait runs next) parks
-- the run `waiting` instead, while that call has children open: no successor, no lease (the last
-- child's end wakes it); a child's stop or failure (parent: its parent's keys, its record and spend)
-- runs `child_ended`; a child's park on a question tells its ancestors (`child_asked` on each one's
-- events). The reply
-- then ends with {waiting (1 or 0), the woken parent's outbox member or false}.
"""
    + CHILD_ENDED
    + """
local p = cjson.decode(ARGV[1])
local segment = tostring(p.segment)
local function stored()
  if p.field == '' then return false end
  return redis.call('HGET', KEYS[9], p.field)
end
local fence = tonumber(redis.call('GET', KEYS[2]) or '0')
if fence ~= tonumber(p.token) then
  -- a retry (went_on: the owner its first attempt's go_on named) whose first attempt landed and
  -- began the successor for the caller, its reply lost (a connection cut, a WAIT not confirmed):
  -- the same begun again, nothing written, so the caller runs the successor it holds the lease of
  if p.went_on and tonumber(redis.call('HGET', KEYS[1], 'n') or '0') == p.n
      and redis.call('GET', KEYS[3]) == p.went_on .. ':' .. fence then
    return {1, stored(), false,
      {fence, tonumber(redis.call('HGET', KEYS[10], tostring(p.n + 1)) or 1),
       redis.call('HGETALL', KEYS[1]), redis.call('GET', KEYS[11]) or '0', p.lease .. '|' .. segment}}
  end
  return {0, stored(), false, false}
end
if tonumber(redis.call('HGET', KEYS[1], 'n') or '0') >= p.n then
  local pending = redis.call('ZRANGE', KEYS[5], 0, 0)
  return {1, stored(), pending[1] or false, false}
end
if p.field ~= '' then redis.call('HSETNX', KEYS[9], p.field, p.value) end
local steer = string.match(p.field, '^steer:(.+)$')
if steer and redis.call('HDEL', KEYS[1], 'steer:' .. steer) == 1 then
  redis.call('HINCRBY', KEYS[1], 'steers_waiting', -1)
end
if p.steerable and p.outcome == 'stop'
    and tonumber(redis.call('HGET', KEYS[1], 'steers_waiting') or '0') > 0 then
  p.outcome, p.queue, p.state.status = 'next', 'llm', nil
end
discard_stream(KEYS[1], KEYS[4], p.streamed or '')  -- before the events: a page drops the text first
local count_field = 'events:' .. segment
local count = tonumber(redis.call('HGET', KEYS[1], count_field) or '0')
for _, e in ipairs(p.events) do
  if e[1] > count then
    emit(KEYS[1], KEYS[4], segment, e[2], e[3])
    count = e[1]
  end
end
redis.call('HSET', KEYS[1], count_field, count, 'n', p.n, 'touched', p.now, 'last_lease', p.lease)
for field, text in pairs(p.state) do redis.call('HSET', KEYS[1], field, text) end
local member = false
local function resume(next_segment)
  redis.call('HSET', KEYS[1], 'status', 'queued', 'segment', next_segment, 'queue', 'llm')
  redis.call('HDEL', KEYS[1], 'asked', 'approvals', 'decided', 'ask_deadline')
  member = (p.n + 1) .. '|llm'
  redis.call('ZADD', KEYS[5], p.now, member)
end
local waiting, woke = 0, false
if p.outcome == 'next' then
  member = (p.n + 1) .. '|' .. p.queue
  redis.call('HSET', KEYS[1], 'queue', p.queue)
  if p.wait_open and tonumber(redis.call('HGET', KEYS[15], p.wait_open) or '0') > 0 then
    redis.call('HSET', KEYS[1], 'status', 'waiting', 'wait_member', member)
    emit(KEYS[1], KEYS[4], segment, 'waiting', p.waiting)
    member, waiting = false, 1
  elseif p.go_on then
    local g = p.go_on
    for _, old in ipairs(redis.call('ZRANGE', KEYS[5], 0, -1)) do
      local m = tonumber(string.match(old, '^(%d+)|'))
      if m and m <= p.n + 1 then redis.call('ZREM', KEYS[5], old) end
    end
    redis.call('HSET', KEYS[12], g.tag, g.unacked)
    redis.call('ZADD', KEYS[13], p.now, g.tag)
    redis.call('DEL', KEYS[3])  -- ours: the fence check above shows nobody took it since
    local token = redis.call('INCR', KEYS[2])
    redis.call('SET', KEYS[3], g.owner .. ':' .. token, 'PX', g.lease_ms)
    local attempts = redis.call('HINCRBY', KEYS[10], tostring(p.n + 1), 1)
    redis.call('HSET', KEYS[1], 'status', 'running', 'touched', p.now)
    return {1, stored(), false,
      {token, attempts, redis.call('HGETALL', KEYS[1]), redis.call('GET', KEYS[11]) or '0',
       p.lease .. '|' .. segment}}
  end
  if member then redis.call('ZADD', KEYS[5], p.now, member) end
elseif p.outcome == 'park' then
  local next_segment = p.segment + 1
  redis.call('HSET', KEYS[7], 's' .. next_segment, p.history)
  if p.compacted then redis.call('HSET', KEYS[7], 'c' .. next_segment, p.compacted) end
  redis.call('SET', KEYS[6], p.history)
  emit(KEYS[1], KEYS[4], segment, 'parked', p.parked)
  for _, requested in ipairs(p.requested or {}) do
    emit(KEYS[1], KEYS[4], segment, 'approval_requested', requested)
  end
  if p.due then redis.call('ZADD', KEYS[14], p.due, p.run) end
  for _, a in ipairs(p.ancestors or {}) do
    emit(a[1], a[2], redis.call('HGET', a[1], 'segment') or '0', 'child_asked', p.parked_child)
  end
  local answer = redis.call('HGET', KEYS[8], 's' .. segment)
  if not answer and redis.call('HGET', KEYS[1], 'cancel') == '1' then
    answer = p.cancel_text
    redis.call('HSET', KEYS[8], 's' .. segment, answer)
  end
  if answer then
    emit(KEYS[1], KEYS[4], segment, 'answered', cjson.encode({content = answer}))
    emit(KEYS[1], KEYS[4], tostring(next_segment), 'resumed', '{}')
    resume(next_segment)
  else
    redis.call('HSET', KEYS[1], 'status', 'asked')
  end
else
  if p.history then redis.call('SET', KEYS[6], p.history) end
  -- a follow-up's segment (workers/protocol/scripts/talk.py) starts from this compaction
  if p.compacted and p.outcome == 'stop' then
    redis.call('HSET', KEYS[7], 'c' .. (p.segment + 1), p.compacted)
  end
  emit(KEYS[1], KEYS[4], segment, p.final[1], p.final[2])
  if p.parent then woke = child_ended(p.parent, p.run, p.now) end
end
if redis.call('GET', KEYS[3]) == p.lease then redis.call('DEL', KEYS[3]) end
return {1, stored(), member, false, waiting, woke}
"""
)

CommitOutcome = Literal["next", "park", "stop", "fail"]
"""What a commit records: a successor, a park, the run's stop, or its failure."""
StepOutcome = CommitOutcome | NotBegun | Literal["fenced", "wait"]
"""What one `advance` task came to (`fenced`: a newer copy holds the run; it re-drives; `wait`: it
parked waiting on its child runs, its segment going on when they end)."""
CANCEL_TEXT = "Not run: cancel."


@dataclass(frozen=True, slots=True)
class GoOn:
    """The successor runs in the committing process: its lease's owner and ttl, its delivery tag
    and kombu `unacked` value (workers/worker/kombu_redis.py `unacked_value`)."""

    owner: str
    lease_ms: int
    tag: str
    unacked: str


@dataclass(frozen=True, slots=True)
class Children:
    """The child-run part of a commit: `wait_open` / `waiting` (a 'next' commit whose next step is a
    `spawn` wait: the children field to check, the `waiting` event's data); `parent` (a child's stop
    or failure: its parent's state, children, events and outbox keys, the open field of its call,
    its record JSON and its spend in micro-dollars as text); `ancestors` / `parked_child` (a child's
    park: each ancestor's [state, events] keys and the `child_asked` event's data)."""

    wait_open: str | None = None
    waiting: str | None = None
    parent: dict[str, str] | None = None
    ancestors: list[list[str]] | None = None
    parked_child: str | None = None

    def payload(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        if self.wait_open is not None:
            found |= {"wait_open": self.wait_open, "waiting": self.waiting or "{}"}
        if self.parent is not None:
            found["parent"] = self.parent
        if self.ancestors:
            found |= {
                "ancestors": self.ancestors,
                "parked_child": self.parked_child or "{}",
            }
        return found


@dataclass(frozen=True, slots=True)
class Commit:
    """RUN_COMMIT's payload (ARGV[1]); `encode` is its one encoder. `field`/`value`: the step's
    journal entry ("" when the commit stores none); `events`: (index in the segment, kind, data
    JSON) of each loop event; `state`: fields of the run's state hash to set. A park carries
    `history`, `parked` (its event's data), `requested` (the approval events) and `due` (when the
    waits sweeper looks at it); a stop or failure carries `final` (the run event) and `history`."""

    token: int
    lease: str
    n: int
    segment: int
    run: str
    outcome: CommitOutcome
    now: float
    field: str = ""
    value: str = ""
    queue: str = "llm"
    state: dict[str, str] = _default(default_factory=dict)
    events: list[tuple[int, str, str]] = _default(default_factory=list)
    history: str | None = None
    final: tuple[str, str] | None = None
    parked: str | None = None
    requested: list[str] = _default(default_factory=list)
    due: float | None = None
    go_on: GoOn | None = None
    went_on: str | None = None
    """A retry of a commit whose first attempt had `go_on`: that attempt's lease owner (the first
    attempt may have landed with its reply lost; RUN_COMMIT then answers its `begun` again)."""
    streamed: str = ""
    """The attempt mark of the streamed model step whose event this commit carries
    (workers/process/deltas.py)."""
    steerable: bool = False
    """A `done` stop that goes on instead while a steer waits (the reply then has a member)."""
    children: Children | None = None
    """What a run with child runs adds to its commit (workers/step/children.py, workers/runs/children.py)."""
    compacted: str | None = None
    """A park or a stop: the compaction in force at the segment's end (`CompactionState` JSON),
    kept as the input field `c<next segment>` so the next segment starts from it (docs/context.md)."""

    def encode(self) -> bytes:
        """The JSON RUN_COMMIT decodes (absent fields are left out: Lua reads a JSON null as true)."""
        payload: dict[str, Any] = {
            "token": self.token,
            "lease": self.lease,
            "n": self.n,
            "segment": self.segment,
            "run": self.run,
            "outcome": self.outcome,
            "now": self.now,
            "field": self.field,
            "value": self.value,
            "queue": self.queue,
            "state": self.state,
            "events": self.events,
            "cancel_text": CANCEL_TEXT,
        }
        optional = {
            "history": self.history,
            "final": self.final,
            "parked": self.parked,
            "due": self.due,
            "compacted": self.compacted,
            "went_on": self.went_on,
        }
        payload.update((k, v) for k, v in optional.items() if v is not None)
        if self.requested:
            payload["requested"] = self.requested
        if self.streamed:
            payload["streamed"] = self.streamed
        if self.steerable:
            payload["steerable"] = True
        if self.children is not None:
            payload.update(self.children.payload())
        if self.go_on is not None:
            g = self.go_on
            payload["go_on"] = {
                "owner": g.owner,
                "lease_ms": g.lease_ms,
                "tag": g.tag,
                "unacked": g.unacked,
            }
        return dumps(payload)


@dataclass(frozen=True, slots=True)
class Committed:
    """RUN_COMMIT's reply: `landed` False when fenced; `stored` the journal value Redis holds (None:
    none); `member` the outbox member ("<n>|<queue>") to send; `begun` the successor its go_on began."""

    landed: bool
    stored: str | None
    member: str | None
    begun: Started | None
    waiting: bool = False
    """The run parked `waiting` on its children (no successor recorded)."""
    woke: str | None = None
    """A child's end woke its parent: the parent's outbox member ("<n>|<queue>") to send."""


def parse_commit(reply: list[Any]) -> Committed:
    """RUN_COMMIT's reply, parsed once."""
    ok, stored, member, begun, *rest = reply
    waiting = bool(rest and int(rest[0] or 0))
    woke = str(rest[1]) if len(rest) > 1 and rest[1] else None
    started = None
    if begun:
        token, attempts, state, outside, tag = begun
        started = Started(
            int(token), int(attempts), pairs(state), float(outside), str(tag)
        )
    return Committed(
        int(ok) == 1,
        None if stored is None else str(stored),
        str(member) if member else None,
        started,
        waiting,
        woke,
    )

"""The Lua scripts of the journal and of durable runs: every multi-key write is one atomic call.

Invariants the scripts keep (keys in `keys.py`; every key of a call shares the run's hash tag):
- A journal field is written with HSETNX only, and every script that writes one returns the STORED
  value, so a caller always continues with what Redis holds (redis-py 8 retries commands itself: a
  retried write must read back, never trust "I won").
- A lease is "<owner>:<token>", the token drawn from the run's INCR fence. A commit is refused when
  the fence has moved past its token (a newer copy took the lease), so a paused copy never writes.
- Run commits are idempotent: a retry of a commit that already landed (state `n` >= its `n`) writes
  nothing again; loop events are appended only beyond the segment's committed count, so each event
  is in the stream once and in order although a replay emits them again in memory.
"""

from __future__ import annotations

# Shared Lua helpers, prepended to the run scripts. KEYS[1] is always the state hash and the events
# stream is passed as `events_key`.
_PRELUDE = """
local function emit(state, events_key, segment, kind, data)
  local seq = redis.call('HINCRBY', state, 'seq', 1)
  redis.call('XADD', events_key, '*', 'seq', seq, 'segment', segment, 'kind', kind, 'data', data)
end
local function discard_stream(state, events_key, backed)
  -- the deltas of the attempt that streamed last (state `streaming` = "<segment>|<step>|<attempt>")
  -- are not what the journal holds unless `backed` names that attempt: mark them discarded
  local streaming = redis.call('HGET', state, 'streaming')
  if not streaming then return end
  if streaming ~= backed then
    local segment, step, attempt = string.match(streaming, '^(%d+)|(%d+)|(.*)$')
    redis.call('XADD', events_key, '*', 'kind', 'discarded', 'segment', segment, 'step', step,
      'attempt', attempt)
  end
  redis.call('HDEL', state, 'streaming')
end
local function terminal(status)
  return status == 'done' or status == 'budget' or status == 'steps' or status == 'cancel'
    or status == 'refused' or status == 'failed' or status == 'expired'
end
"""

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

LEASE_RENEW = """
-- KEYS[1]=lease; ARGV[1]=the lease value; ARGV[2]=ttl ms -> 1 when still held and renewed
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
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

RUN_BEGIN = (
    _PRELUDE
    + """
-- Start of an `advance` task: check it is due, take the run's lease, count the delivery, load all.
-- KEYS: 1 state 2 spec 3 lease 4 fence 5 attempts 6 spend 7 input 8 answers 9 outbox
-- ARGV: 1 owner 2 lease ttl ms 3 n (the commit this task makes) 4 now 5 journal key prefix
--       6 the caller's cache tag ("<last commit's lease>|<segment>" it holds the journal of, or '')
-- -> {'missing'} | {'idle', status} | {'stale', n} | {'early', n} | {'busy', pttl}
--    | {'run', token, attempts, state (flat), spec, journal (flat), input, answer to the previous
--       segment's ask or false, outside spend, tag}; spec, journal and input are false when the
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
local answer = false
if segment > 0 then answer = redis.call('HGET', KEYS[8], 's' .. (segment - 1)) end
local tag = (redis.call('HGET', KEYS[1], 'last_lease') or '') .. '|' .. segment
local spec, journal = false, false
if tag ~= ARGV[6] then
  spec = redis.call('GET', KEYS[2])
  journal = redis.call('HGETALL', ARGV[5] .. 's' .. segment)
else
  input = false
end
return {'run', token, attempts, redis.call('HGETALL', KEYS[1]), spec, journal, input or false,
  answer or false, redis.call('GET', KEYS[6]) or '0', tag}
"""
)

RUN_COMMIT = (
    _PRELUDE
    + """
-- End of an `advance` task: the step's value, its events, and what comes next, in one write.
-- KEYS: 1 state 2 fence 3 lease 4 events 5 outbox 6 history 7 input 8 answers 9 journal (segment)
--       10 attempts 11 spend 12 unacked 13 unacked_index (kombu's: only with go_on)
--       14 the waits-due zset (a park with a deadline or held approvals: p.due, p.run)
-- ARGV[1]: JSON {token, lease, n, segment, field, value, events: [[index, kind, data]...],
--   outcome: 'next'|'park'|'stop'|'fail', queue, now, state: {field: text}, history,
--   final: [kind, data] (the run event of a stop or a failure), parked (data), cancel_text,
--   requested (optional): [data...] an `approval_requested` event each, due/run (optional),
--   go_on (optional): {owner, lease_ms, tag, unacked}: the caller runs the successor itself, now,
--   streamed (optional): "<segment>|<step>|<attempt>", the streamed step whose model event this
--   commit carries (workers/deltas.py); any other streamed attempt gets a `discarded` marker}
-- -> {1, stored value or false, outbox member to send or false, begun or false}
--    | {0, stored or false, false, false} (fenced)
-- With go_on, a 'next' commit also does what RUN_BEGIN of the successor would do, as if that task
-- began the moment this one committed: the successor's message is recorded as delivered to the
-- caller (kombu's unacked, restored from there if the caller dies), its outbox entry is dropped,
-- the run's lease goes to go_on.owner with a new token, and the delivery is counted.
-- begun = {token, attempts, state (flat), outside spend}, as RUN_BEGIN's 'run' reply has them.
local p = cjson.decode(ARGV[1])
local segment = tostring(p.segment)
local function stored()
  if p.field == '' then return false end
  return redis.call('HGET', KEYS[9], p.field)
end
if tonumber(redis.call('GET', KEYS[2]) or '0') ~= tonumber(p.token) then
  return {0, stored(), false, false}
end
if tonumber(redis.call('HGET', KEYS[1], 'n') or '0') >= p.n then
  local pending = redis.call('ZRANGE', KEYS[5], 0, 0)
  return {1, stored(), pending[1] or false, false}
end
if p.field ~= '' then redis.call('HSETNX', KEYS[9], p.field, p.value) end
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
  redis.call('HDEL', KEYS[1], 'asked', 'approvals', 'ask_deadline')
  member = (p.n + 1) .. '|llm'
  redis.call('ZADD', KEYS[5], p.now, member)
end
if p.outcome == 'next' then
  member = (p.n + 1) .. '|' .. p.queue
  redis.call('HSET', KEYS[1], 'queue', p.queue)
  if p.go_on then
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
      {token, attempts, redis.call('HGETALL', KEYS[1]), redis.call('GET', KEYS[11]) or '0'}}
  end
  redis.call('ZADD', KEYS[5], p.now, member)
elseif p.outcome == 'park' then
  local next_segment = p.segment + 1
  redis.call('HSET', KEYS[7], 's' .. next_segment, p.history)
  redis.call('SET', KEYS[6], p.history)
  emit(KEYS[1], KEYS[4], segment, 'parked', p.parked)
  for _, requested in ipairs(p.requested or {}) do
    emit(KEYS[1], KEYS[4], segment, 'approval_requested', requested)
  end
  if p.due then redis.call('ZADD', KEYS[14], p.due, p.run) end
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
  emit(KEYS[1], KEYS[4], segment, p.final[1], p.final[2])
end
if redis.call('GET', KEYS[3]) == p.lease then redis.call('DEL', KEYS[3]) end
return {1, stored(), member, false}
"""
)

RUN_ANSWER = (
    _PRELUDE
    + """
-- Store an answer: the first answer for a segment's ask wins; a parked run resumes at once, a run
-- not parked yet keeps the answer for when it parks.
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
if redis.call('HSETNX', KEYS[2], 's' .. segment, a.content) == 0 then
  return {'ignored', 'that question was already answered'}
end
if status ~= 'asked' then return {'kept'} end
emit(KEYS[1], KEYS[4], tostring(segment), 'answered', cjson.encode({content = a.content}))
local next_segment = segment + 1
emit(KEYS[1], KEYS[4], tostring(next_segment), 'resumed', '{}')
local member = (tonumber(redis.call('HGET', KEYS[1], 'n') or '0') + 1) .. '|llm'
redis.call('HSET', KEYS[1], 'status', 'queued', 'segment', next_segment, 'queue', 'llm', 'touched', ARGV[2])
redis.call('HDEL', KEYS[1], 'asked', 'approvals', 'ask_deadline')
redis.call('ZADD', KEYS[5], ARGV[2], member)
return {'resumed', member}
"""
)

RUN_RETRY = (
    _PRELUDE
    + """
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
"""
)

INDEX_DROP = """
-- Drop a run from the live-runs index only if its score is still the one the sweeper read.
-- KEYS[1]=the index; ARGV[1]=run id ARGV[2]=score read -> 1 when dropped
if tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1])) == tonumber(ARGV[2]) then
  return redis.call('ZREM', KEYS[1], ARGV[1])
end
return 0
"""

RUN_CANCEL = (
    _PRELUDE
    + """
-- Mark a run cancelled (kept across restarts). KEYS: 1 state; ARGV: 1 channel 2 run id
-- -> the status, or false when the run does not exist (an ended run is left as it is)
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return false end
if terminal(status) then return status end
redis.call('HSET', KEYS[1], 'cancel', '1')
redis.call('PUBLISH', ARGV[1], ARGV[2])
return status
"""
)


DELTA_FLUSH = (
    _PRELUDE
    + """
-- A batch of model text deltas of a live step (workers/deltas.py), written only by the copy that
-- holds the run: KEYS[1]=state KEYS[2]=fence KEYS[3]=events
-- ARGV[1]=the lease's fencing token ARGV[2]=attempt ("<token>" or "<token>.<k>": the k-th answer
-- the provider began again within the step) ARGV[3]=segment ARGV[4]=step ARGV[5]=text ('': only
-- the marker of an earlier attempt) ARGV[6]=thinking ('1' or '') -> 1 written, 0 fenced.
-- Another attempt's deltas (a crash, a lost lease, a retried answer) get their `discarded` marker
-- first; state `streaming` names this attempt until a commit clears it (RUN_COMMIT).
if tonumber(redis.call('GET', KEYS[2]) or '0') ~= tonumber(ARGV[1]) then return 0 end
local mark = ARGV[3] .. '|' .. ARGV[4] .. '|' .. ARGV[2]
if redis.call('HGET', KEYS[1], 'streaming') ~= mark then
  discard_stream(KEYS[1], KEYS[3], mark)
  if ARGV[5] == '' then return 1 end
  redis.call('HSET', KEYS[1], 'streaming', mark)
end
if ARGV[6] == '1' then
  redis.call('XADD', KEYS[3], '*', 'kind', 'delta', 'segment', ARGV[3], 'step', ARGV[4],
    'attempt', ARGV[2], 'text', ARGV[5], 'thinking', '1')
else
  redis.call('XADD', KEYS[3], '*', 'kind', 'delta', 'segment', ARGV[3], 'step', ARGV[4],
    'attempt', ARGV[2], 'text', ARGV[5])
end
return 1
"""
)

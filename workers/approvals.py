"""Approvals and deadlines of durable runs (SPEC.md 4.4, 4.5).

A run whose loop stops with `stopped_by="approval"` parks like an ask (status "asked"), with its held
calls in the state field `approvals` (call id, name, input, digest, estimate, deadline, default).
Decisions reach it over the control queue, like ask answers: `Client.approve/reject/edit` stores the
decision in `tl:{run}:decide` and sends `toolloop.decide`; the worker validates an edit against the
tool's schema, then one script (DECIDE) records it (first decision per call wins, in
`tl:{run}:decisions`), emits `approval_decided`, and once every held call is decided resumes the run
(the next segment's answer is the decisions, which the loop applies as its first steps). The client
reads the outcome back from a reply list, so a refusal (stale digest, bad edit, a decision after the
deadline) reaches the caller as an `ApprovalError` with the reason.

A decision sent before the run parks is kept (for the segment running then) and applied when the
park commits. Deadlines: a park with a deadline (or with decisions to apply) is in the zset
`tl:waits:due`; the workers' sweeper settles what is due (SETTLE): an expired approval gets its
tool's default outcome, an expired ask its `ask_default` answer or the stop `stopped_by="expired"`.
The zset lives in Redis, so a deadline that passes while no worker runs is settled by the first
sweep of the next worker.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import redis as redis_lib
from celery import Celery

from toolloop.contract import AssistantMessage, ChatMessage
from toolloop.journal import keys
from toolloop.loop.approvals import ApprovalError
from toolloop.loop.tools import validate_input
from toolloop.loop.types import Decision, ToolSpec
from workers import app as celery_app
from workers.scripts.prelude import PRELUDE
from workers.spec import RunSpec

DECISIONS_MARK = "\x1eapprovals\x1e"
"""How a segment's answer that holds decisions starts (an ask answer cannot: Client.answer refuses it)."""
DEADLINE_REASON = "no decision before the deadline"

_SETTLE = """
-- KEYS: 1 state 2 decisions 3 answers 4 events 5 outbox 6 waits-due; ARGV[1]=run id
local RUN = ARGV[1]
local function resume(segment, now, queue)
  queue = queue or 'llm'
  local next_segment = tonumber(segment) + 1
  emit(KEYS[1], KEYS[4], tostring(next_segment), 'resumed', '{}')
  local member = (tonumber(redis.call('HGET', KEYS[1], 'n') or '0') + 1) .. '|' .. queue
  redis.call('HSET', KEYS[1], 'status', 'queued', 'segment', next_segment, 'queue', queue, 'touched', now)
  redis.call('HDEL', KEYS[1], 'asked', 'approvals', 'ask_deadline')
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
        if not queue and decided[p.call_id].action ~= 'reject' then queue = p.queue end
      else
        all = false
        if deadline and (not next_due or deadline < next_due) then next_due = deadline end
      end
    end
    if not all then
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
  return {'expired'}
end
"""

SETTLE = (
    PRELUDE
    + _SETTLE
    + """
-- Apply what is due of a parked run: early decisions, expired deadlines. ARGV[2]=mark ARGV[3]=now
-- -> {'resumed', member} | {'waiting'} | {'expired'} | {'idle'}
return settle(tonumber(ARGV[3]))
"""
)

DECIDE_SCRIPT = (
    PRELUDE
    + _SETTLE
    + """
-- Record one decision. ARGV[2]=mark ARGV[3]=now ARGV[4]=call id ARGV[5]=decision JSON
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
if redis.call('HSETNX', KEYS[2], field, ARGV[5]) == 0 then
  return late_or_dup(redis.call('HGET', KEYS[2], field))
end
emit(KEYS[1], KEYS[4], tostring(segment), 'approval_decided', cjson.encode({call_id = call_id,
  action = d.action, actor = d.actor or cjson.null, reason = d.reason or '', input = d.input or cjson.null,
  early = true}))
return {'kept'}
"""
)


def _script_keys(run_id: str) -> list[str]:
    return [keys.state(run_id), keys.decisions(run_id), keys.answers(run_id), keys.events(run_id),
            keys.outbox(run_id), keys.WAITS_DUE]  # fmt: skip


# -- the client side --------------------------------------------------------------------------------


def send_decision(
    client: redis_lib.Redis,
    blocking: redis_lib.Redis,
    celery: Celery,
    run_id: str,
    call_id: str,
    decision: Decision,
    wait_s: float,
) -> str:
    """Store a decision, send `toolloop.decide`, and wait up to `wait_s` for a worker's outcome:
    "resumed", "recorded" (others still wait), "kept" (the run had not parked yet), "ignored" (a
    duplicate). `blocking`: a client with no socket timeout, for the wait. A refusal raises
    ApprovalError; no worker within `wait_s` raises TimeoutError (the decision stays queued and is
    applied when a worker takes it)."""
    decision_id = uuid.uuid4().hex
    entry = {"call_id": call_id, "decision": decision.model_dump(mode="json"), "at": time.time()}
    client.hset(keys.decide_inbox(run_id), decision_id, json.dumps(entry))
    celery_app.send(
        celery,
        celery_app.DECIDE,
        [run_id, decision_id],
        queue="control",
        task_id=f"{run_id}:decide:{decision_id}",
    )
    reply: Any = blocking.blpop([keys.decided(run_id, decision_id)], timeout=max(1, round(wait_s)))
    if reply is None:
        raise TimeoutError(
            f"No worker applied the decision on call {call_id!r} of run {run_id!r} within {wait_s:g} s.\n"
            "  It stays queued on the control queue; start a worker (`toolloop worker`) to apply it."
        )
    outcome, _, why = str(reply[1]).partition("|")
    if outcome == "refused":
        raise ApprovalError(why)
    return outcome


# -- the worker side --------------------------------------------------------------------------------


def apply(client: redis_lib.Redis, celery: Celery, run_id: str, decision_id: str, tools: Any) -> str:
    """The `toolloop.decide` task: check an edit against the tool's schema, record the decision
    (DECIDE), resume the run when every held call is decided, and tell the client. `tools(toolset)`
    gives the worker's tools of a toolset."""
    raw = client.hget(keys.decide_inbox(run_id), decision_id)
    if raw is None:
        return "gone"  # applied already (a redelivered task)
    entry = json.loads(str(raw))
    call_id = str(entry["call_id"])
    decision = Decision.model_validate(entry["decision"])
    try:
        decision = checked_edit(client, run_id, call_id, decision, tools)
        result = _run_script(client, DECIDE_SCRIPT, run_id, [call_id, decision.model_dump_json()])
    except ApprovalError as error:
        result = ["refused", str(error)]
    outcome = str(result[0])
    if outcome == "resumed":
        _send_member(client, celery, run_id, str(result[1]))
    why = str(result[1]) if len(result) > 1 and outcome != "resumed" else ""
    pipe = client.pipeline(transaction=True)
    pipe.rpush(keys.decided(run_id, decision_id), f"{outcome}|{why}")
    pipe.expire(keys.decided(run_id, decision_id), 300)
    pipe.hdel(keys.decide_inbox(run_id), decision_id)
    pipe.execute()
    return outcome


def checked_edit(
    client: redis_lib.Redis, run_id: str, call_id: str, decision: Decision, tools: Any
) -> Decision:
    """An edit's input validated against the tool's schema (and normalized to its JSON dump)."""
    if decision.action != "edit":
        return decision
    name = held_name(client, run_id, call_id)
    if name is None:
        raise ApprovalError(
            f"Run {run_id!r} has no call {call_id!r} to edit.\n  Read the run's pending approvals "
            "(`toolloop status RUN`) for the call ids."
        )
    spec = RunSpec.model_validate_json(str(client.get(keys.spec(run_id))))
    by_name: dict[str, ToolSpec] = {tool.name: tool for tool in tools(spec.toolset)}
    tool = by_name.get(name)
    if tool is None:
        raise ApprovalError(
            f"The worker's toolset has no tool {name!r} to check the edit of call {call_id!r}."
        )
    checked = validate_input(tool, decision.input)
    if isinstance(checked, str):
        raise ApprovalError(f"The edit of call {call_id!r} is refused; the call still waits. {checked}")
    return decision.model_copy(update={"input": checked.model_dump(mode="json")})


def held_name(client: redis_lib.Redis, run_id: str, call_id: str) -> str | None:
    """The tool name of call `call_id`: from the held approvals, else from the current segment's
    model steps (an early decision)."""
    _status, segment, pending = client.hmget(keys.state(run_id), "status", "segment", "approvals")
    for held in json.loads(str(pending)) if pending else []:
        if held["call_id"] == call_id:
            return str(held["name"])
    prefix = f"{keys.segment_name(int(segment or 0))}/"
    entries: dict[str, str] = client.hgetall(keys.journal(run_id, prefix))  # type: ignore[assignment]
    for key, stored in entries.items():
        if key.startswith("model:"):
            for call in json.loads(stored)["value"]["result"].get("tool_calls", []):
                if call["id"] == call_id:
                    return str(call["name"])
    return None


def settle(client: redis_lib.Redis, celery: Celery, run_id: str) -> str:
    """Apply early decisions and passed deadlines of a parked run; resume it when that decides it."""
    result = _run_script(client, SETTLE, run_id, [])
    if result[0] == "resumed":
        _send_member(client, celery, run_id, str(result[1]))
    return str(result[0])


def sweep_due(client: redis_lib.Redis, celery: Celery) -> int:
    """Settle every run whose deadline (or early decision) is due; how many were settled."""
    due: list[str] = client.zrangebyscore(keys.WAITS_DUE, "-inf", time.time())  # type: ignore[assignment]
    for run_id in due:
        settle(client, celery, str(run_id))
    return len(due)


def _run_script(client: redis_lib.Redis, source: str, run_id: str, args: list[str]) -> list[Any]:
    from workers.runs import script

    result: list[Any] = script(client, source)(
        keys=_script_keys(run_id), args=[run_id, DECISIONS_MARK, time.time(), *args]
    )
    return result


def _send_member(client: redis_lib.Redis, celery: Celery, run_id: str, member: str) -> None:
    from workers.runs import send_member

    client.zadd(keys.LIVE_RUNS, {run_id: time.time()})
    send_member(client, celery, run_id, member)


# -- the resumed segment -----------------------------------------------------------------------------


def decisions_of(answer: str | None) -> dict[str, Decision] | None:
    """The decisions a segment's answer carries (None for an ask answer or no answer)."""
    if not answer or not answer.startswith(DECISIONS_MARK):
        return None
    data = json.loads(answer.removeprefix(DECISIONS_MARK))
    return {call_id: Decision.model_validate(value) for call_id, value in data.items()}


def held_names(messages: list[ChatMessage], decisions: dict[str, Decision] | None) -> dict[str, str]:
    """The tool names of the decided calls (the last assistant turn's), by call id."""
    if not decisions:
        return {}
    for message in reversed(messages):
        if isinstance(message, AssistantMessage):
            return {call.id: call.name for call in message.tool_calls or [] if call.id in decisions}
    return {}


def pending_approvals(
    approvals: list[Any], tools: dict[str, ToolSpec], spec: RunSpec, now: float
) -> list[dict[str, Any]]:
    """The held calls as the state stores them: the loop's fields plus deadline and default."""
    held = []
    for approval in approvals:
        tool = tools.get(approval.name)
        timeout = tool.approval_timeout_s if tool and tool.approval_timeout_s is not None else None
        if timeout is None:
            timeout = spec.approval_timeout_s
        deadline = None if timeout is None else now + timeout
        default = tool.approval_default if tool else "reject"
        queue = (tool.queue if tool else None) or "tools"
        held.append({**approval.model_dump(mode="json"), "deadline": deadline, "default": default,
                     "queue": queue})  # fmt: skip
    return held

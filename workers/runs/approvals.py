"""Approvals and deadlines of durable runs (SPEC.md 4.4, 4.5).

A run whose loop stops with `stopped_by="approval"` parks like an ask (status "asked"), with its held
calls in the state field `approvals` (call id, name, input, digest, estimate, deadline, default).
Decisions reach it over the control queue, like ask answers: `Client.approve/reject/edit` stores the
decision in `tl:{run}:decide` and sends `toolloop.decide`; the worker validates an edit against the
tool's schema, then one script (DECIDE) records it (first decision per call wins, in
`tl:{run}:decisions`), emits `approval_decided`, and once every held call is decided resumes the run
(the next segment's answer is the decisions, which the loop applies as its first steps). The client
(`workers/client/ops.py`'s `decide`, for both clients) reads the outcome back from a reply list, so a
refusal (stale digest, bad edit, a decision after the deadline) reaches the caller as an
`ApprovalError` with the reason.

A decision sent before the run parks is kept (for the segment running then) and applied when the
park commits; a segment keeps at most TOOLLOOP_MAX_EARLY_DECISIONS of them (the next is refused).
Deadlines: a park with a deadline (or with decisions to apply) is in the zset
`tl:waits:due`; the workers' sweeper settles what is due (SETTLE): an expired approval gets its
tool's default outcome, an expired ask its `ask_default` answer or the stop `stopped_by="expired"`.
The zset lives in Redis, so a deadline that passes while no worker runs is settled by the first
sweep of the next worker.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import redis as redis_lib
from celery import Celery

from toolloop.contract import AssistantMessage, ChatMessage
from toolloop.loop.approvals import ApprovalError
from toolloop.loop.tools import validate_input
from toolloop.loop.types import Decision, ToolSpec
from workers.client import runlist
from workers.protocol import keys, lua, names
from workers.protocol.lua import Lua
from workers.protocol.scripts.approvals import (
    DECIDE_SCRIPT,
    DECISIONS_MARK,
    SETTLE,
    Settled,
    parse_settled,
)
from workers.protocol.spec import RunSpec
from workers.runs.lifecycle import send_member


def _script_keys(run_id: str) -> list[str]:
    return [
        keys.state(run_id),
        keys.decisions(run_id),
        keys.answers(run_id),
        keys.events(run_id),
        keys.outbox(run_id),
        keys.WAITS_DUE,
    ]


# -- the worker side --------------------------------------------------------------------------------


def apply(
    client: redis_lib.Redis,
    celery: Celery,
    run_id: str,
    decision_id: str,
    tools: Any,
    retention: float,
    early: int = 100,
) -> str:
    """The `toolloop.decide` task: apply the run's decisions in the order they were sent, up to and
    including this one (its own first when it has no earlier one pending), so the first decision
    sent wins however the control tasks' threads run (`tests/unit/test_races.py`). `tools(toolset)`
    gives the worker's tools of a toolset; a run that ends `expired` meanwhile starts its retention;
    `early`: the most decisions a segment keeps for calls it has not made yet
    (TOOLLOOP_MAX_EARLY_DECISIONS; the next is refused)."""
    order: list[str] = client.lrange(keys.decide_order(run_id), 0, -1)  # type: ignore[assignment]
    earlier = order[: order.index(decision_id)] if decision_id in order else []
    for sent_before in earlier:
        _apply_one(client, celery, run_id, sent_before, _Apply(tools, retention, early))
    return _apply_one(
        client, celery, run_id, decision_id, _Apply(tools, retention, early)
    )


@dataclass(frozen=True, slots=True)
class _Apply:
    """What applying a decision needs besides the run: the worker's tools, the retention, the early cap."""

    tools: Any
    retention: float
    early: int


_CLAIM_S = 30
"""How long the task applying a decision holds it (it takes milliseconds; a dead worker's frees)."""


def _apply_one(
    client: redis_lib.Redis, celery: Celery, run_id: str, decision_id: str, how: _Apply
) -> str:
    """Apply one decision, once: the task that claims it applies it; another (a later decision's
    task applying it first, or this decision's own) waits until it is applied, then says "gone" (or
    takes the claim when its holder died and the claim expired)."""
    claim = keys.decide_claim(run_id, decision_id)
    while not client.set(claim, "1", nx=True, ex=_CLAIM_S):
        if not client.hexists(keys.decide_inbox(run_id), decision_id):
            return "gone"
        time.sleep(0.02)
    try:
        return _decide(client, celery, run_id, decision_id, how)
    finally:
        client.delete(claim)


def _decide(
    client: redis_lib.Redis, celery: Celery, run_id: str, decision_id: str, how: _Apply
) -> str:
    """Check an edit against the tool's schema, record the decision (DECIDE), resume the run when
    every held call is decided, and tell the client."""
    tools, retention, early = how.tools, how.retention, how.early
    raw = client.hget(keys.decide_inbox(run_id), decision_id)
    if raw is None:
        client.lrem(keys.decide_order(run_id), 0, decision_id)
        return "gone"  # applied already (a redelivered task)
    entry = json.loads(str(raw))
    call_id = str(entry["call_id"])
    decision = Decision.model_validate(entry["decision"])
    try:
        decision = checked_edit(client, run_id, call_id, decision, tools)
        result = parse_settled(
            _run_script(
                client,
                DECIDE_SCRIPT,
                run_id,
                [call_id, decision.model_dump_json(), str(early)],
            )
        )
    except ApprovalError as error:
        result = Settled("refused", why=str(error))
    outcome = result.what
    parent = keys.parent_of(run_id)
    if outcome == "expired" and result.member is not None and parent is not None:
        # the expired child woke its parent
        send_member(client, celery, parent, result.member)
    elif result.member is not None:
        _send_member(client, celery, run_id, result.member)
    kept = json.dumps(
        {"call_id": call_id, "outcome": outcome, "why": result.why, "at": time.time()}
    )
    if outcome == "expired":
        _ended(client, run_id, retention)
    pipe = client.pipeline(transaction=True)
    pipe.rpush(keys.decided(run_id, decision_id), f"{outcome}|{result.why}")
    pipe.expire(keys.decided(run_id, decision_id), 300)
    # readable later (Client.decision)
    pipe.hset(keys.decide_outcomes(run_id), decision_id, kept)
    pipe.hdel(keys.decide_inbox(run_id), decision_id)
    pipe.lrem(keys.decide_order(run_id), 0, decision_id)
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
        raise ApprovalError(
            f"The edit of call {call_id!r} is refused; the call still waits. {checked}"
        )
    return decision.model_copy(update={"input": checked.model_dump(mode="json")})


def held_name(client: redis_lib.Redis, run_id: str, call_id: str) -> str | None:
    """The tool name of call `call_id`: from the held approvals, else from the current segment's
    model steps (an early decision)."""
    _status, segment, pending = client.hmget(
        keys.state(run_id), "status", "segment", "approvals"
    )
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


def settle(
    client: redis_lib.Redis, celery: Celery, run_id: str, retention: float
) -> str:
    """Apply early decisions and passed deadlines of a parked run; resume it when that decides it. A
    run that ends `expired` here starts its retention (`retention` s, TOOLLOOP_RETENTION)."""
    result = parse_settled(_run_script(client, SETTLE, run_id, []))
    if result.what == "expired":
        _ended(client, run_id, retention)
        parent = keys.parent_of(run_id)
        if (
            result.member is not None and parent is not None
        ):  # its end woke its parent (a child run)
            send_member(client, celery, parent, result.member)
    elif result.member is not None:
        _send_member(client, celery, run_id, result.member)
    return result.what


def sweep_due(client: redis_lib.Redis, celery: Celery, retention: float) -> int:
    """Settle every run whose deadline (or early decision) is due; how many were settled."""
    due: list[str] = client.zrangebyscore(keys.WAITS_DUE, "-inf", time.time())  # type: ignore[assignment]
    for run_id in due:
        settle(client, celery, str(run_id), retention)
    return len(due)


def _ended(client: redis_lib.Redis, run_id: str, retention: float) -> None:
    """A run a script ended (`expired`): out of the live index, and its keys' retention starts, as a
    step's commit does for a run that ends there (workers/step/commit.py)."""
    segment = int(client.hget(keys.state(run_id), "segment") or 0)
    pipe = client.pipeline(transaction=False)
    pipe.zrem(keys.LIVE_RUNS, run_id)
    for command in runlist.expire_commands(run_id, segment, retention):
        pipe.execute_command(*command)  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
    pipe.execute()


def _run_script(
    client: redis_lib.Redis, script: Lua, run_id: str, args: list[Any]
) -> list[Any]:
    args = [run_id, DECISIONS_MARK, time.time(), *args]
    result: list[Any] = lua.run(client, script, _script_keys(run_id), args)
    return result


def _send_member(
    client: redis_lib.Redis, celery: Celery, run_id: str, member: str
) -> None:
    client.zadd(keys.LIVE_RUNS, {run_id: time.time()})
    send_member(client, celery, run_id, member)


# -- the resumed segment -----------------------------------------------------------------------------


def decisions_of(answer: str | None) -> dict[str, Decision] | None:
    """The decisions a segment's answer carries (None for an ask answer or no answer)."""
    if not answer or not answer.startswith(DECISIONS_MARK):
        return None
    data = json.loads(answer.removeprefix(DECISIONS_MARK))
    return {call_id: Decision.model_validate(value) for call_id, value in data.items()}


def held_names(
    messages: list[ChatMessage], decisions: dict[str, Decision] | None
) -> dict[str, str]:
    """The tool names of the decided calls (the last assistant turn's), by call id."""
    if not decisions:
        return {}
    for message in reversed(messages):
        if isinstance(message, AssistantMessage):
            return {
                call.id: call.name
                for call in message.tool_calls or []
                if call.id in decisions
            }
    return {}


def pending_approvals(
    approvals: list[Any], tools: dict[str, ToolSpec], spec: RunSpec, now: float
) -> list[dict[str, Any]]:
    """The held calls as the state stores them: the loop's fields plus deadline and default."""
    held = []
    for approval in approvals:
        tool = tools.get(approval.name)
        timeout = (
            tool.approval_timeout_s
            if tool and tool.approval_timeout_s is not None
            else None
        )
        if timeout is None:
            timeout = spec.approval_timeout_s
        deadline = None if timeout is None else now + timeout
        default = tool.approval_default if tool else "reject"
        queue = (tool.queue if tool else None) or names.TOOLS
        held.append(
            {
                **approval.model_dump(mode="json"),
                "deadline": deadline,
                "default": default,
                "queue": queue,
            }
        )
    return held

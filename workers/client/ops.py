"""What the clients ask Redis, as pure request/reply: every `Client` and `AsyncClient` method is an
operation here, written once, that yields the Redis requests it needs and receives their replies.

    def status(run_id):                           # an operation: a generator
        state = yield Call("HGETALL", keys.state(run_id))
        return status_of(run_id, state)

A driver (workers/client/drive.py) runs an operation: `SyncDriver` with redis-py's blocking client (for
`Client`), `AsyncDriver` with redis.asyncio (for `AsyncClient`). Nothing here does I/O, so both
clients share every check, every key and every error message. The requests:

    Call(*args, blocking=False)   one command; `blocking` goes to the connection with no read timeout
    Pipeline(commands, transaction)  commands (tuples, or Eval) in one round trip (MULTI when asked)
    Eval(script, keys, args)      a Lua script by its SHA1 (loaded once by the driver when missing)
    Sleep(seconds)                wait (a poll loop)
    Emit(value)                   not a request: an item a streaming operation (`events`) yields

Task messages (answers, cancels, decisions, a retried step) are written as Celery protocol-2
messages with `workers.protocol.wire` and LPUSHed to their queue, with the `task-sent` event Flower reads:
no Celery producer is set up per call, and no Celery app exists in a client until `celery` is read.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from toolloop.contract import (
    CHAT_MESSAGES,
    ChatMessage,
    ImagePart,
    ToolMessage,
    UserMessage,
)
from toolloop.loop.approvals import AlreadyDecidedError, ApprovalError, DeadlineError
from toolloop.loop.types import Decision
from workers.client import accounts
from workers.protocol import keys, wire
from workers.protocol.errors import LimitError, RunNotFoundError, RunStateError
from workers.protocol.lua import Lua
from workers.protocol.names import ADVANCE, ANSWER, CANCEL, DECIDE
from workers.protocol.records import (
    FINAL,
    STREAM_KINDS,
    DecisionState,
    RunEventRecord,
    RunNode,
    RunStatus,
)
from workers.protocol.scripts.approvals import (
    DECIDE_SEND,
    DECISIONS_MARK,
    parse_decide_sent,
)
from workers.protocol.scripts.children import (
    ASKING,
    CANCEL_TREE,
    TREE,
    parse_asking,
    parse_cancel_tree,
    parse_tree,
)
from workers.protocol.scripts.control import (
    ANSWER_SEND,
    RUN_RETRY,
    parse_retry,
    parse_sent,
)

T = TypeVar("T")

_TERMINAL_EVENTS = frozenset({"finished", "failed"})


@dataclass(frozen=True, slots=True)
class Eval:
    script: Lua
    keys: list[str]
    args: list[Any]

    def command(self) -> tuple[Any, ...]:
        return ("EVALSHA", self.script.sha, len(self.keys), *self.keys, *self.args)


@dataclass(frozen=True, slots=True)
class Call:
    args: tuple[Any, ...]
    blocking: bool = False

    def __init__(self, *args: Any, blocking: bool = False) -> None:
        object.__setattr__(self, "args", args)
        object.__setattr__(self, "blocking", blocking)


@dataclass(frozen=True, slots=True)
class Pipeline:
    commands: Sequence[tuple[Any, ...] | Eval]
    transaction: bool = False
    durable: bool = False
    """A write that counts once replicated (TOOLLOOP_COMMIT_WAIT; a batch with an `Eval` is one)."""


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


@dataclass(frozen=True, slots=True)
class Emit:
    value: Any


Request = Call | Pipeline | Eval | Sleep
Op = Generator[Request, Any, T]
Stream = Generator[Request | Emit, Any, None]

ANSWER_SCRIPT = ANSWER_SEND
CANCEL_TREE_SCRIPT = CANCEL_TREE
TREE_SCRIPT = TREE
ASKING_SCRIPT = ASKING
RETRY_SCRIPT = RUN_RETRY
DECIDE_SEND_SCRIPT = DECIDE_SEND


@dataclass
class Sender:
    """Task messages and their `task-sent` events, as a Celery producer would send them, as plain
    commands (LPUSH to the queue, PUBLISH of the event). One per client: its event clock counts."""

    db: int
    events: wire.Events = field(init=False)
    ids: wire.Ids = field(init=False, default_factory=wire.Ids)
    """Its messages' delivery tags and a follow-up's answer id."""

    def __post_init__(self) -> None:
        self.events = wire.Events(f"gen{os.getpid()}@{socket.gethostname()}", self.db)

    def message(
        self,
        name: str,
        args: list[Any],
        task_id: str,
        queue: str,
        label: str = "",
        traceparent: str = "",
    ) -> tuple[wire.Delivery, str, bytes]:
        """The message, and the channel and payload of its `task-sent` event."""
        delivery = wire.task_message(
            name, args, task_id, queue, label, traceparent or None, self.ids.new()
        )
        self.events.add(
            "task-sent",
            {
                "uuid": task_id,
                "root_id": task_id,
                "parent_id": None,
                "name": name,
                "args": delivery.argsrepr,
                "kwargs": delivery.kwargsrepr,
                "retries": 0,
                "eta": None,
                "expires": None,
                "queue": queue,
                "exchange": "",
                "routing_key": queue,
            },
        )
        ((channel, payload),) = self.events.drain()
        return delivery, channel, payload

    def commands(
        self, name: str, args: list[Any], task_id: str, queue: str, label: str = ""
    ) -> list[tuple[Any, ...]]:
        delivery, channel, payload = self.message(name, args, task_id, queue, label)
        return [("LPUSH", queue, delivery.raw), ("PUBLISH", channel, payload)]

    def member(self, run_id: str, member: str) -> list[tuple[Any, ...]]:
        """The commands that send the successor recorded as `member` ("<n>|<queue>")."""
        queue, raw, channel, payload = self.member_message(run_id, member)
        return [("LPUSH", queue, raw), ("PUBLISH", channel, payload)]

    def member_message(self, run_id: str, member: str) -> tuple[str, str, str, bytes]:
        """The queue, message, and `task-sent` channel and payload of the successor recorded as
        `member` (a script that sends it itself: workers/protocol/scripts/schedules.py FIRE_MANY)."""
        n, _, queue = member.partition("|")
        label = "model 1" if n == "1" else ("model" if queue == "llm" else "tool")
        delivery, channel, payload = self.message(
            ADVANCE, [run_id, int(n)], f"{run_id}:{n}", queue, label
        )
        return queue, delivery.raw, channel, payload


# -- read -------------------------------------------------------------------------------------------


def status(run_id: str) -> Op[RunStatus]:
    state = yield Call("HGETALL", keys.state(run_id))
    return (yield from with_asking(run_id, status_of(run_id, state)))


def snapshot(run_id: str) -> Op[tuple[RunStatus, int]]:
    """The status and the count of answers not applied yet, read at one instant (MULTI)."""
    state, unapplied = yield Pipeline(
        [("HGETALL", keys.state(run_id)), ("HLEN", keys.inbox(run_id))], True
    )
    return (yield from with_asking(run_id, status_of(run_id, state))), int(unapplied)


def with_asking(run_id: str, current: RunStatus) -> Op[RunStatus]:
    """A run waiting on its children: the first descendant that asks and its question (ASKING)."""
    if current.status != "waiting":
        return current
    asking = parse_asking(
        (yield Eval(ASKING_SCRIPT, [keys.state(run_id)], [run_id, keys.PREFIX]))
    )
    if asking is None:
        return current
    return current.model_copy(update={"asking": asking[0], "asked": asking[1]})


def history(run_id: str) -> Op[list[ChatMessage]]:
    stored, first = yield Pipeline(
        [("GET", keys.history(run_id)), ("HGET", keys.inputs(run_id), "s0")]
    )
    if stored is None and first is None:
        raise RunNotFoundError(run_id)
    return CHAT_MESSAGES.validate_json(stored or first)


@dataclass(frozen=True, slots=True)
class RunImage:
    """An image of a run's conversation: `supplied` when the run's spec (or a person) gave it,
    else a tool result produced it."""

    part: ImagePart
    supplied: bool


def images(run_id: str) -> Op[list[RunImage]]:
    """The run's images in conversation order, each with where it came from: the spec's messages
    are the history's first ones, and only tool messages after them are a tool's."""
    stored, first, spec = yield Pipeline(
        [
            ("GET", keys.history(run_id)),
            ("HGET", keys.inputs(run_id), "s0"),
            ("GET", keys.spec(run_id)),
        ]
    )
    if stored is None and first is None:
        raise RunNotFoundError(run_id)
    messages = CHAT_MESSAGES.validate_json(stored or first)
    given = len(json.loads(spec).get("messages") or []) if spec else len(messages)
    found = []
    for i, message in enumerate(messages):
        if isinstance(message, ToolMessage | UserMessage) and isinstance(
            message.content, list
        ):
            supplied = i < given or isinstance(message, UserMessage)
            found += [
                RunImage(p, supplied)
                for p in message.content
                if isinstance(p, ImagePart)
            ]
    return found


def events(
    run_id: str,
    after: str | None,
    block_ms: int | None,
    follow: bool,
    deltas: bool = True,
) -> Stream:
    """The run's events after stream id `after` (see `Client.events`), each as an `Emit`; without
    `deltas`, a streaming run's `delta` and `discarded` entries are skipped."""
    stream = keys.events(run_id)
    cursor = stream_id(after) if after else "0-0"
    last: Any = ()
    if not after:
        found = yield Call("EXISTS", keys.state(run_id))
    else:  # and the last entry, to refuse an id past it
        last_entry = ("XREVRANGE", stream, "+", "-", "COUNT", 1)
        found, last = yield Pipeline([("EXISTS", keys.state(run_id)), last_entry])
    if not found:
        raise RunNotFoundError(run_id)
    end = last[0][0] if last else "0-0"
    if after and _id_key(cursor) > _id_key(
        end
    ):  # no entry would ever come after it: a follow hangs
        raise EventIdError(
            f"Event id {after!r} is past the end of run {run_id!r}'s events (the last is {end}).\n"
            "  Resume after an id the stream gave, or without one to read from the start."
        )
    while True:
        wait = block_ms if block_ms is not None else (1000 if follow else None)
        block = ("BLOCK", wait) if wait is not None else ()
        reply = yield Call(
            "XREAD", "COUNT", 500, *block, "STREAMS", stream, cursor, blocking=True
        )
        entries: list[tuple[str, dict[str, str]]] = reply[0][1] if reply else []
        for entry_id, fields in entries:
            cursor = entry_id
            if not deltas and fields.get("kind") in STREAM_KINDS:
                continue
            record = record_of(entry_id, fields)
            yield Emit(record)
            if follow and record.kind in _TERMINAL_EVENTS:
                ended = yield Call("HGET", keys.state(run_id), "status")
                if ended in FINAL:
                    return  # (a `failed` that a retry has since moved past does not end it)
        if not follow and (not entries or block_ms is not None):
            return


class EventIdError(ValueError):
    """An `after` (Last-Event-ID) that is not a stream id of the run's events."""


def stream_id(text: str) -> str:
    """`text` as a full stream id ("<ms>-<seq>"; a bare "<ms>" is "<ms>-0"), or EventIdError."""
    ms, _, seq = text.strip().partition("-")
    if not (ms.isdigit() and (seq.isdigit() or not seq) and len(text) <= 41):
        raise EventIdError(
            f"{text[:60]!r} is not an event id.\n"
            "  Pass the `id` of an event the stream gave (like 1700000000000-0)."
        )
    return f"{int(ms)}-{int(seq or 0)}"


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def wait(run_id: str, timeout: float, poll_s: float) -> Op[RunStatus]:
    """The status once the run has ended, or parked on a question that no sent answer or cancel is
    on its way to (its own, or a descendant's while it waits on its children: `asking`);
    TimeoutError after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        current, unapplied = yield from snapshot(run_id)
        if current.status in FINAL:
            return current
        if current.status == "asked" and not (current.cancel_requested or unapplied):
            return current
        if (
            current.asking is not None and not current.cancel_requested
        ):  # a descendant's question
            return current
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"Run {run_id!r} is still {current.status!r} after {timeout:.0f} s.\n"
                "  Check that a worker consumes the llm, tools and control queues, or wait longer."
            )
        yield Sleep(poll_s)


# -- act --------------------------------------------------------------------------------------------


def answer(sender: Sender, run_id: str, content: str, segment: int | None) -> Op[str]:
    """Check the answer (see `Client.answer`), then claim it and send `toolloop.answer` in one script
    (ANSWER_SEND: the first answer to a question wins when it is sent; a later one is ignored and
    nothing is sent): the answer id."""
    if content.startswith(DECISIONS_MARK):
        raise ValueError(
            "An answer may not start with the record separator \\x1e.\n  Strip it."
        )
    status, children = yield Call("HMGET", keys.state(run_id), "status", "children")
    if status not in (None, "asked") and int(
        children or 0
    ):  # a run with children: one of them may ask
        asking = parse_asking(
            (yield Eval(ASKING_SCRIPT, [keys.state(run_id)], [run_id, keys.PREFIX]))
        )
        if (
            asking is not None
        ):  # (also in the moment between its children's start and its park)
            return (yield from answer(sender, asking[0], content, None))
    answer_id = uuid.uuid4().hex
    [(_, queue, message), (_, channel, payload)] = sender.commands(
        ANSWER, [run_id, answer_id], f"{run_id}:answer:{answer_id}", "control"
    )
    pinned = "" if segment is None else segment
    args = [run_id, answer_id, pinned, content, time.time(), message, channel, payload]
    where = [
        keys.state(run_id),
        keys.answers(run_id),
        keys.inbox(run_id),
        keys.LIVE_RUNS,
        queue,
    ]
    sent = parse_sent((yield Eval(ANSWER_SCRIPT, where, args)))
    if (
        sent.what == "waiting"
    ):  # the run waits on its children: the answer goes to the one that asks
        asking = parse_asking(
            (yield Eval(ASKING_SCRIPT, [keys.state(run_id)], [run_id, keys.PREFIX]))
        )
        if asking is None:
            raise RunStateError(
                f"Run {run_id!r} waits on its child runs, and none of them asks a question.\n"
                f"  `toolloop status {run_id}` shows its children; answer when one asks."
            )
        return (yield from answer(sender, asking[0], content, None))
    if sent.what == "missing":
        raise RunNotFoundError(run_id)
    if sent.what == "ended":
        raise RunStateError(
            f"Run {run_id!r} has ended ({sent.detail}); it takes no answer.\n"
            "  Enqueue a new run, or retry it if it failed."
        )
    if sent.what == "late":
        raise DeadlineError(
            f"The question of run {run_id!r} passed its deadline before this answer; the run went on "
            f"with its default ({'stopped, expired' if sent.detail == 'expired' else 'ask_default'}).\n"
            "  Nothing was sent. Give runs a longer ask_timeout_s if answers come later."
        )
    return answer_id


def decide(
    sender: Sender,
    run_id: str,
    call_id: str,
    decision: Decision,
    wait_s: float,
    waiting: int,
) -> Op[str]:
    """Store a decision and send `toolloop.decide` in one script (DECIDE_SEND: refused at once when
    the call has a decision already, recorded or queued), then wait up to `wait_s` for the worker's
    outcome (see `Client.decide`): "queued" when no worker runs, or none answered in time. A run with
    `waiting` decisions already waiting for a worker takes no more (LimitError): the inbox is
    bounded while no worker runs."""
    inbox = yield Call("HLEN", keys.decide_inbox(run_id))
    if inbox >= waiting:
        raise LimitError(
            f"{inbox} decisions on run {run_id!r} wait for a worker already; the limit is {waiting}.\n"
            "  Start a worker (`toolloop worker`) to apply them, or raise TOOLLOOP_MAX_EARLY_DECISIONS.",
            "TOOLLOOP_MAX_EARLY_DECISIONS",
        )
    decision_id = uuid.uuid4().hex
    entry = json.dumps(
        {
            "call_id": call_id,
            "decision": decision.model_dump(mode="json"),
            "at": time.time(),
        }
    )
    [(_, queue, message), (_, channel, payload)] = sender.commands(
        DECIDE, [run_id, decision_id], f"{run_id}:decide:{decision_id}", "control"
    )
    where = [
        keys.state(run_id),
        keys.decisions(run_id),
        keys.decide_inbox(run_id),
        queue,
        keys.decide_order(run_id),
    ]
    args = [decision_id, call_id, entry, message, channel, payload]
    sent = parse_decide_sent((yield Eval(DECIDE_SEND_SCRIPT, where, args)))
    if sent.what == "missing":
        raise RunNotFoundError(run_id)
    if sent.what == "ended":
        raise ApprovalError(
            f"Run {run_id!r} has ended ({sent.detail}); it takes no decision.\n"
            f"  `toolloop status {run_id}` shows how it ended."
        )
    if sent.what in ("decided", "queued"):
        raise already_decided(run_id, call_id, sent.what, json.loads(sent.detail))
    _, listeners = yield Call("PUBSUB", "NUMSUB", keys.CANCEL_CHANNEL)
    if not int(
        listeners
    ):  # no worker runs (each one listens for cancels): it stays queued
        return "queued"
    reply = yield Call(
        "BLPOP", keys.decided(run_id, decision_id), max(1, round(wait_s)), blocking=True
    )
    if reply is None:
        return "queued"  # a worker runs but did not apply it in time: it applies when one does
    outcome, _, why = str(reply[1]).partition("|")
    if outcome == "refused":
        raise ApprovalError(why)
    if (
        outcome == "ignored"
    ):  # decided between this send and its application (a cancel, a deadline)
        raise AlreadyDecidedError(
            f"Run {run_id!r}: {why}; the first decision wins.\n"
            f"  Nothing changed: `toolloop decision {run_id} {call_id}` shows it."
        )
    return outcome


def already_decided(
    run_id: str, call_id: str, what: str, prior: dict[str, Any]
) -> ApprovalError:
    """The refusal of a second decision on a call: the first one's action, who, and its state."""
    if what == "queued":
        first = prior.get("decision") or {}
        by = f" by {first['actor']}" if first.get("actor") else ""
        return AlreadyDecidedError(
            f"Call {call_id!r} of run {run_id!r} has a decision queued already ({first.get('action')}{by}); "
            "it is applied when a worker runs, and the first decision wins.\n"
            f"  Nothing was sent: `toolloop decision {run_id} {call_id}` shows its outcome once applied."
        )
    if prior.get("actor") == "deadline":
        return ApprovalError(
            f"The deadline for call {call_id!r} passed before this decision; the call was answered with its "
            f"default outcome ({prior.get('action')}).\n  Nothing was sent. Give runs a longer "
            "approval_timeout_s if decisions come later."
        )
    by = f" by {prior['actor']}" if prior.get("actor") else ""
    return AlreadyDecidedError(
        f"Call {call_id!r} of run {run_id!r} was decided already ({prior.get('action')}{by}); the first "
        f"decision wins.\n  Nothing was sent: `toolloop decision {run_id} {call_id}` shows it."
    )


def decisions(run_id: str) -> Op[dict[str, DecisionState]]:
    """Where the decision on each call of the run stands, by call id: the calls held now (pending or
    not), and every call with a decision recorded, queued or refused in the current or last segment."""
    state, recorded, inbox, outcomes = yield Pipeline(
        [
            ("HMGET", keys.state(run_id), "status", "segment", "approvals"),
            ("HGETALL", keys.decisions(run_id)),
            ("HGETALL", keys.decide_inbox(run_id)),
            ("HGETALL", keys.decide_outcomes(run_id)),
        ]
    )
    status, segment, held = state
    if status is None:
        raise RunNotFoundError(run_id)
    return decision_states(
        run_id, int(segment or 0), json.loads(held or "[]"), recorded, inbox, outcomes
    )


def decision(run_id: str, call_id: str) -> Op[DecisionState]:
    """Where the decision on call `call_id` stands (see `Client.decision`)."""
    found = (yield from decisions(run_id)).get(call_id)
    if found is None:
        raise ApprovalError(
            f"Run {run_id!r} holds no call {call_id!r} and has no decision on it.\n"
            f"  `toolloop status {run_id}` lists the calls it holds."
        )
    return found


def decision_states(
    run_id: str,
    segment: int,
    held: list[dict[str, Any]],
    recorded: dict[str, str],
    inbox: dict[str, str],
    outcomes: dict[str, str],
) -> dict[str, DecisionState]:
    """What `decisions` returns, from what it read: a queued decision first, then a recorded one, then
    the last refusal, else pending (a held call)."""
    found: dict[str, DecisionState] = {}
    names = {str(h["call_id"]): str(h["name"]) for h in held}
    for call_id in names:
        found[call_id] = DecisionState(
            run_id=run_id, call_id=call_id, state="pending", name=names[call_id]
        )
    for raw in sorted(
        (json.loads(v) for v in outcomes.values()),
        key=lambda o: float(o.get("at") or 0),
    ):
        if raw.get("outcome") == "refused":
            call_id = str(raw["call_id"])
            found[call_id] = DecisionState(
                run_id=run_id,
                call_id=call_id,
                state="refused",
                name=names.get(call_id),
                why=raw.get("why"),
                at=raw.get("at"),
            )
    for field_name in sorted(recorded, key=lambda f: int(f[1:].partition(":")[0] or 0)):
        seg, _, call_id = field_name[1:].partition(":")
        if int(seg or 0) < segment - 1:
            continue
        value = json.loads(recorded[field_name])
        found[call_id] = DecisionState(
            run_id=run_id,
            call_id=call_id,
            state="expired" if value.get("actor") == "deadline" else "decided",
            name=names.get(call_id),
            action=value.get("action"),
            actor=value.get("actor"),
            reason=value.get("reason") or None,
            input=value.get("input"),
        )
    for raw_entry in inbox.values():
        entry = json.loads(raw_entry)
        call_id, sent = str(entry["call_id"]), entry.get("decision") or {}
        found[call_id] = DecisionState(
            run_id=run_id,
            call_id=call_id,
            state="queued",
            name=names.get(call_id),
            action=sent.get("action"),
            actor=sent.get("actor"),
            reason=sent.get("reason") or None,
            input=sent.get("input"),
            at=entry.get("at"),
        )
    return found


def cancel(sender: Sender, run_id: str) -> Op[None]:
    """Cancel the run and every run it spawned (CANCEL_TREE: one atomic walk of its tree); a
    `toolloop.cancel` task finishes the cancel of the run and of each parked descendant."""
    where, args = [keys.state(run_id)], [keys.CANCEL_CHANNEL, run_id, keys.PREFIX]
    found = parse_cancel_tree((yield Eval(CANCEL_TREE_SCRIPT, where, args)))
    if found is None:
        raise RunNotFoundError(run_id)
    status, marked = found
    if status in FINAL:
        raise RunStateError(
            f"Run {run_id!r} has ended ({status}); there is nothing to cancel.\n"
            "  `toolloop status` shows how it ended."
        )
    commands = []
    for one, was in marked:
        if one == run_id or was == "asked":
            commands += sender.commands(CANCEL, [one], f"{one}:cancel", "control")
    yield Pipeline(commands)


def tree(run_id: str, most: int) -> Op[list[RunNode]]:
    """The run and the runs it spawned, breadth first (TREE), at most `most` of them."""
    nodes = parse_tree(
        (yield Eval(TREE_SCRIPT, [keys.state(run_id)], [run_id, keys.PREFIX, most]))
    )
    if not nodes:
        raise RunNotFoundError(run_id)
    return nodes


def retry(sender: Sender, run_id: str) -> Op[None]:
    """Queue a failed run again (RUN_RETRY), make its keys persistent again, send its step."""
    stored, segment = yield Pipeline(
        [("GET", keys.spec(run_id)), ("HGET", keys.state(run_id), "segment")]
    )
    spec = json.loads(stored or "{}")
    queued = {name: spec.get(name) for name in ("model", "toolset", "budget_usd")} | {
        "retry": True
    }
    result = parse_retry(
        (
            yield Eval(
                RETRY_SCRIPT,
                [
                    keys.state(run_id),
                    keys.attempts(run_id),
                    keys.events(run_id),
                    keys.outbox(run_id),
                ],
                [time.time(), json.dumps(queued)],
            )
        )
    )
    if result.member is None:
        if result.refused == "missing":
            raise RunNotFoundError(run_id)
        raise RunStateError(
            f"Run {run_id!r} is {result.refused!r}; only a failed run can be retried.\n"
            "  Wait for it to end, or enqueue a new run."
        )
    persist = [("PERSIST", key) for key in keys.run_keys(run_id, int(segment or 0))]
    yield Pipeline(
        [
            ("ZADD", keys.LIVE_RUNS, time.time(), run_id),
            *persist,
            ("ZREM", keys.ENDED_RUNS, run_id),
            *sender.member(run_id, result.member),
        ]
    )


def add_spend(run_id: str, usd: float) -> Op[float]:
    accounts.check_usd(
        usd, f"The outside spend for run {run_id!r}", least=0.0, zero=True
    )
    if not (yield Call("EXISTS", keys.state(run_id))):
        raise RunNotFoundError(run_id)
    total = yield Call("INCRBYFLOAT", keys.spend(run_id), usd)
    return float(total)


# -- replies ----------------------------------------------------------------------------------------


def status_of(run_id: str, state: dict[str, str]) -> RunStatus:
    if not state:
        raise RunNotFoundError(run_id)
    asked = state.get("asked")
    parked = state["status"] == "asked"
    return RunStatus(
        run_id=run_id,
        status=state["status"],
        segment=int(state.get("segment", 0)),
        steps=int(state.get("steps", 0)),
        spent_usd=float(state.get("spent_usd", 0)),
        final_text=state.get("final_text") or None,
        asked=json.loads(asked) if asked and parked else None,
        approvals=_pending(state) if parked else None,
        ask_deadline=float(state["ask_deadline"])
        if state.get("ask_deadline")
        else None,
        error_class=state.get("error_class") or None,
        error_message=state.get("error_message") or None,
        refusal=json.loads(state["refusal"])
        if state.get("refusal") and state["status"] == "refused"
        else None,
        account_stop=json.loads(state["account_stop"])
        if state.get("account_stop") and state["status"] == "budget"
        else None,
        cancel_requested=state.get("cancel") == "1",
        created_at=float(state["created"]) if "created" in state else None,
        updated_at=float(state["touched"]) if "touched" in state else None,
        parent=state.get("parent") or None,
        depth=int(state.get("depth", 0)),
        children=int(state.get("children", 0)),
    )


def _pending(state: dict[str, str]) -> list[dict[str, Any]] | None:
    """The held calls still waiting for a decision (a decided one leaves the list at once)."""
    if not state.get("approvals"):
        return None
    decided = set(json.loads(state.get("decided") or "[]"))
    return [
        held
        for held in json.loads(state["approvals"])
        if held["call_id"] not in decided
    ] or None


def record_of(entry_id: str, fields: dict[str, str]) -> RunEventRecord:
    if "seq" not in fields:  # a delta or a discarded marker (workers/process/deltas.py)
        return RunEventRecord(
            id=entry_id,
            seq=None,
            segment=int(fields["segment"]),
            kind=fields["kind"],
            step=int(fields["step"]),
            attempt=fields["attempt"],
            **_stream_fields(fields),
        )
    data = json.loads(fields.get("data") or "{}")
    data.pop("kind", None)
    for reserved in ("id", "seq", "segment"):
        if reserved in data:
            data[f"{reserved}_"] = data.pop(reserved)
    return RunEventRecord(
        id=entry_id,
        seq=int(fields["seq"]),
        segment=int(fields["segment"]),
        kind=fields["kind"],
        **data,
    )


def _stream_fields(fields: dict[str, str]) -> dict[str, Any]:
    """A delta's `text`, and `thinking` True when it is reasoning text."""
    found: dict[str, Any] = {"text": fields["text"]} if "text" in fields else {}
    if fields.get("thinking") == "1":
        found["thinking"] = True
    return found

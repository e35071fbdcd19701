"""What the clients ask Redis, as pure request/reply: every `Client` and `AsyncClient` method is an
operation here, written once, that yields the Redis requests it needs and receives their replies.

    def status(run_id):                           # an operation: a generator
        state = yield Call("HGETALL", keys.state(run_id))
        return status_of(run_id, state)

A driver (workers/drive.py) runs an operation: `SyncDriver` with redis-py's blocking client (for
`Client`), `AsyncDriver` with redis.asyncio (for `AsyncClient`). Nothing here does I/O, so both
clients share every check, every key and every error message. The requests:

    Call(*args, blocking=False)   one command; `blocking` goes to the connection with no read timeout
    Batch(commands, transaction)  commands (tuples, or Eval) in one round trip (MULTI when asked)
    Eval(script, keys, args)      a Lua script by its SHA1 (loaded once by the driver when missing)
    Sleep(seconds)                wait (a poll loop)
    Emit(value)                   not a request: an item a streaming operation (`events`) yields

Task messages (answers, cancels, decisions, a retried step) are written as Celery protocol-2
messages with `workers.wire` and LPUSHed to their queue, with the `task-sent` event Flower reads:
no Celery producer is set up per call, and no Celery app exists in a client until `celery` is read.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
import uuid
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from toolloop.contract import CHAT_MESSAGES, ChatMessage
from toolloop.journal import keys
from toolloop.loop.approvals import ApprovalError, DeadlineError
from toolloop.loop.types import Decision
from workers import wire
from workers.approvalscripts import DECISIONS_MARK
from workers.errors import RunNotFoundError, RunStateError
from workers.names import ADVANCE, ANSWER, CANCEL, DECIDE
from workers.records import FINAL, STREAM_KINDS, RunEventRecord, RunStatus
from workers.scripts.control import ANSWER_SEND, RUN_CANCEL, RUN_RETRY, parse_cancel, parse_retry, parse_sent

T = TypeVar("T")

_TERMINAL_EVENTS = frozenset({"finished", "failed"})


@dataclass(frozen=True, slots=True)
class Lua:
    """A Lua script and its SHA1 (what EVALSHA names)."""

    source: str
    sha: str = ""

    @classmethod
    def of(cls, source: str) -> Lua:
        return cls(source, hashlib.sha1(source.encode()).hexdigest())  # (Redis names a script by its SHA1)


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
class Batch:
    commands: Sequence[tuple[Any, ...] | Eval]
    transaction: bool = False


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


@dataclass(frozen=True, slots=True)
class Emit:
    value: Any


Request = Call | Batch | Eval | Sleep
Op = Generator[Request, Any, T]
Stream = Generator[Request | Emit, Any, None]

ANSWER_SCRIPT = Lua.of(ANSWER_SEND)
CANCEL_SCRIPT = Lua.of(RUN_CANCEL)
RETRY_SCRIPT = Lua.of(RUN_RETRY)


@dataclass
class Sender:
    """Task messages and their `task-sent` events, as a Celery producer would send them, as plain
    commands (LPUSH to the queue, PUBLISH of the event). One per client: its event clock counts."""

    db: int
    events: wire.Events = field(init=False)

    def __post_init__(self) -> None:
        self.events = wire.Events(f"gen{os.getpid()}@{socket.gethostname()}", self.db)

    def message(
        self, name: str, args: list[Any], task_id: str, queue: str, label: str = "", traceparent: str = ""
    ) -> tuple[wire.Delivery, str, bytes]:
        """The message, and the channel and payload of its `task-sent` event."""
        delivery = wire.task_message(name, args, task_id, queue, label, traceparent or None)
        self.events.add("task-sent", {
            "uuid": task_id, "root_id": task_id, "parent_id": None, "name": name,
            "args": delivery.argsrepr, "kwargs": delivery.kwargsrepr, "retries": 0, "eta": None,
            "expires": None, "queue": queue, "exchange": "", "routing_key": queue,
        })  # fmt: skip
        ((channel, payload),) = self.events.drain()
        return delivery, channel, payload

    def commands(
        self, name: str, args: list[Any], task_id: str, queue: str, label: str = ""
    ) -> list[tuple[Any, ...]]:
        delivery, channel, payload = self.message(name, args, task_id, queue, label)
        return [("LPUSH", queue, delivery.raw), ("PUBLISH", channel, payload)]

    def member(self, run_id: str, member: str) -> list[tuple[Any, ...]]:
        """The commands that send the successor recorded as `member` ("<n>|<queue>")."""
        n, _, queue = member.partition("|")
        label = "model 1" if n == "1" else ("model" if queue == "llm" else "tool")
        return self.commands(ADVANCE, [run_id, int(n)], f"{run_id}:{n}", queue, label)


# -- read -------------------------------------------------------------------------------------------


def status(run_id: str) -> Op[RunStatus]:
    state = yield Call("HGETALL", keys.state(run_id))
    return status_of(run_id, state)


def snapshot(run_id: str) -> Op[tuple[RunStatus, int]]:
    """The status and the count of answers not applied yet, read at one instant (MULTI)."""
    state, unapplied = yield Batch([("HGETALL", keys.state(run_id)), ("HLEN", keys.inbox(run_id))], True)
    return status_of(run_id, state), int(unapplied)


def history(run_id: str) -> Op[list[ChatMessage]]:
    stored, first = yield Batch([("GET", keys.history(run_id)), ("HGET", keys.inputs(run_id), "s0")])
    if stored is None and first is None:
        raise RunNotFoundError(run_id)
    return CHAT_MESSAGES.validate_json(stored or first)


def events(run_id: str, after: str | None, block_ms: int | None, follow: bool, deltas: bool = True) -> Stream:
    """The run's events after stream id `after` (see `Client.events`), each as an `Emit`; without
    `deltas`, a streaming run's `delta` and `discarded` entries are skipped."""
    if not (yield Call("EXISTS", keys.state(run_id))):
        raise RunNotFoundError(run_id)
    cursor = after or "0-0"
    stream = keys.events(run_id)
    while True:
        wait = block_ms if block_ms is not None else (1000 if follow else None)
        block = ("BLOCK", wait) if wait is not None else ()
        reply = yield Call("XREAD", "COUNT", 500, *block, "STREAMS", stream, cursor, blocking=True)
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


def wait(run_id: str, timeout: float, poll_s: float) -> Op[RunStatus]:
    """The status once the run has ended, or parked on a question that no sent answer or cancel is
    on its way to; TimeoutError after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        current, unapplied = yield from snapshot(run_id)
        if current.status in FINAL:
            return current
        if current.status == "asked" and not (current.cancel_requested or unapplied):
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
        raise ValueError("An answer may not start with the record separator \\x1e.\n  Strip it.")
    answer_id = uuid.uuid4().hex
    [(_, queue, message), (_, channel, payload)] = sender.commands(
        ANSWER, [run_id, answer_id], f"{run_id}:answer:{answer_id}", "control"
    )
    pinned = "" if segment is None else segment
    args = [run_id, answer_id, pinned, content, time.time(), message, channel, payload]
    where = [keys.state(run_id), keys.answers(run_id), keys.inbox(run_id), keys.LIVE_RUNS, queue]
    sent = parse_sent((yield Eval(ANSWER_SCRIPT, where, args)))
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


def decide(sender: Sender, run_id: str, call_id: str, decision: Decision, wait_s: float) -> Op[str]:
    """Store a decision and send `toolloop.decide` (one MULTI), then wait up to `wait_s` for the
    worker's outcome (see `Client.decide`)."""
    if not (yield Call("EXISTS", keys.state(run_id))):
        raise RunNotFoundError(run_id)
    decision_id = uuid.uuid4().hex
    entry = json.dumps({"call_id": call_id, "decision": decision.model_dump(mode="json"), "at": time.time()})
    send = sender.commands(DECIDE, [run_id, decision_id], f"{run_id}:decide:{decision_id}", "control")
    stored = [
        ("HSET", keys.decide_inbox(run_id), decision_id, entry),
        ("RPUSH", keys.decide_order(run_id), decision_id),
    ]  # the send order: workers/approvals.py
    yield Batch([*stored, *send], transaction=True)
    reply = yield Call("BLPOP", keys.decided(run_id, decision_id), max(1, round(wait_s)), blocking=True)
    if reply is None:
        raise TimeoutError(
            f"No worker applied the decision on call {call_id!r} of run {run_id!r} within {wait_s:g} s.\n"
            "  It stays queued on the control queue; start a worker (`toolloop worker`) to apply it."
        )
    outcome, _, why = str(reply[1]).partition("|")
    if outcome == "refused":
        raise ApprovalError(why)
    return outcome


def cancel(sender: Sender, run_id: str) -> Op[None]:
    found = parse_cancel((yield Eval(CANCEL_SCRIPT, [keys.state(run_id)], [keys.CANCEL_CHANNEL, run_id])))
    if found is None:
        raise RunNotFoundError(run_id)
    if found in FINAL:
        raise RunStateError(
            f"Run {run_id!r} has ended ({found}); there is nothing to cancel.\n"
            "  `toolloop status` shows how it ended."
        )
    yield Batch(sender.commands(CANCEL, [run_id], f"{run_id}:cancel", "control"))


def retry(sender: Sender, run_id: str) -> Op[None]:
    """Queue a failed run again (RUN_RETRY), make its keys persistent again, send its step."""
    stored, segment = yield Batch([("GET", keys.spec(run_id)), ("HGET", keys.state(run_id), "segment")])
    spec = json.loads(stored or "{}")
    queued = {name: spec.get(name) for name in ("model", "toolset", "budget_usd")} | {"retry": True}
    result = parse_retry((yield Eval(
        RETRY_SCRIPT,
        [keys.state(run_id), keys.attempts(run_id), keys.events(run_id), keys.outbox(run_id)],
        [time.time(), json.dumps(queued)],
    )))  # fmt: skip
    if result.member is None:
        if result.refused == "missing":
            raise RunNotFoundError(run_id)
        raise RunStateError(
            f"Run {run_id!r} is {result.refused!r}; only a failed run can be retried.\n"
            "  Wait for it to end, or enqueue a new run."
        )
    persist = [("PERSIST", key) for key in keys.run_keys(run_id, int(segment or 0))]
    yield Batch([("ZADD", keys.LIVE_RUNS, time.time(), run_id), *persist, ("ZREM", keys.ENDED_RUNS, run_id),
                 *sender.member(run_id, result.member)])  # fmt: skip


def add_spend(run_id: str, usd: float) -> Op[float]:
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
        approvals=json.loads(state["approvals"]) if state.get("approvals") and parked else None,
        ask_deadline=float(state["ask_deadline"]) if state.get("ask_deadline") else None,
        error_class=state.get("error_class") or None,
        error_message=state.get("error_message") or None,
        refusal=json.loads(state["refusal"])
        if state.get("refusal") and state["status"] == "refused"
        else None,
        cancel_requested=state.get("cancel") == "1",
        created_at=float(state["created"]) if "created" in state else None,
        updated_at=float(state["touched"]) if "touched" in state else None,
    )


def record_of(entry_id: str, fields: dict[str, str]) -> RunEventRecord:
    if "seq" not in fields:  # a delta or a discarded marker (workers/deltas.py)
        return RunEventRecord(
            id=entry_id, seq=None, segment=int(fields["segment"]), kind=fields["kind"],
            step=int(fields["step"]), attempt=fields["attempt"], **_stream_fields(fields),
        )  # fmt: skip
    data = json.loads(fields.get("data") or "{}")
    data.pop("kind", None)
    for reserved in ("id", "seq", "segment"):
        if reserved in data:
            data[f"{reserved}_"] = data.pop(reserved)
    return RunEventRecord(
        id=entry_id, seq=int(fields["seq"]), segment=int(fields["segment"]), kind=fields["kind"], **data
    )


def _stream_fields(fields: dict[str, str]) -> dict[str, Any]:
    """A delta's `text`, and `thinking` True when it is reasoning text."""
    found: dict[str, Any] = {"text": fields["text"]} if "text" in fields else {}
    if fields.get("thinking") == "1":
        found["thinking"] = True
    return found

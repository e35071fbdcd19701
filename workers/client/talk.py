"""Talking to a run (SPEC 6.1, docs/conversations.md): follow-ups, steers and interrupts, as the pure
request/reply operations of workers/client/ops.py (run by `SyncDriver` / `AsyncDriver`), so that `Client`,
`AsyncClient`, the sharded clients, the CLI, the web example and the sweeper's schedules share one
code path:

    send(sender, run_id, content, ...)   a follow-up: the next segment of a run that ended `done`
                                         (or `interrupted`), or the answer of a parked ask
    steer(run_id, content)               a message a running run takes at its next step boundary
    interrupt(run_id)                    the live step stops, the run waits for a follow-up

Each is one script (workers/protocol/scripts/talk.py); what a script refuses is a `RunStateError` (or a
`DeadlineError` for an ask past its deadline) that says what to do instead.
"""

from __future__ import annotations

import math
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from toolloop.contract import UserMessage
from toolloop.loop.approvals import DeadlineError
from workers.client.ops import Eval, Op, Pipeline, Sender
from workers.protocol import keys
from workers.protocol.errors import LimitError, RunNotFoundError, RunStateError
from workers.protocol.names import ANSWER
from workers.protocol.scripts.talk import (
    FOLLOW_UP,
    INTERRUPT_SEND,
    STEER_SEND,
    parse_follow_up,
    parse_interrupt,
    parse_steer,
)

STEER_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""What a caller's own steer id may be (it becomes part of a journal key)."""
MAX_KEY_CHARS = 200
"""The longest idempotency key a follow-up takes."""


@dataclass(frozen=True, slots=True)
class Sent:
    """What a follow-up did: `what` is "continued" (the run goes on as segment `segment`) or
    "answered" (it was the answer of the run's held ask; the run resumes as segment `segment`).
    A send repeated with the same idempotency key returns the first one's `Sent`."""

    run_id: str
    what: Literal["continued", "answered"]
    segment: int


def check_top_ups(add_budget_usd: float, add_max_steps: int) -> None:
    """Refuse a top-up that is not a finite amount of 0 or more (ValueError)."""
    if isinstance(add_budget_usd, bool) or not isinstance(add_budget_usd, int | float):
        raise ValueError(
            f"add_budget_usd must be a number of USD, not {add_budget_usd!r}."
        )
    if not math.isfinite(add_budget_usd) or add_budget_usd < 0:
        raise ValueError(
            f"add_budget_usd must be 0 or more, not {add_budget_usd!r}.\n  Pass the USD to add."
        )
    if (
        isinstance(add_max_steps, bool)
        or not isinstance(add_max_steps, int)
        or add_max_steps < 0
    ):
        raise ValueError(
            f"add_max_steps must be a whole number, 0 or more, not {add_max_steps!r}."
        )


def check_key(idempotency_key: str | None) -> str:
    if idempotency_key is None:
        return ""
    if (
        not isinstance(idempotency_key, str)
        or not idempotency_key
        or len(idempotency_key) > MAX_KEY_CHARS
    ):
        raise ValueError(
            f"An idempotency key is a string of 1 to {MAX_KEY_CHARS} characters."
        )
    return idempotency_key


def follow_up_request(
    sender: Sender,
    run_id: str,
    content: str,
    idempotency_key: str | None,
    add_budget_usd: float,
    add_max_steps: int,
    *,
    answer: bool = True,
) -> tuple[list[str], list[Any]]:
    """FOLLOW_UP's KEYS and ARGV (`send`, and a follow-up schedule's fire: workers/runs/scheduler.py),
    its input checked (ValueError). `answer` False: no answer task is made (the sweeper sends a
    follow-up this way only to a run that ended, and leaves an asked run to `send`)."""
    check_top_ups(add_budget_usd, add_max_steps)
    key = check_key(idempotency_key)
    if not isinstance(content, str) or not content.strip():
        raise ValueError(
            "A follow-up needs some text.\n  Pass what the person says, as a string."
        )
    message = UserMessage(content=content).model_dump_json()
    answer_id = sender.ids.new()
    queue, task, channel, payload = "control", "", "", b""
    if answer:
        [(_, queue, task), (_, channel, payload)] = sender.commands(
            ANSWER, [run_id, answer_id], f"{run_id}:answer:{answer_id}", "control"
        )
    where = [
        keys.state(run_id),
        keys.inputs(run_id),
        keys.history(run_id),
        keys.events(run_id),
        keys.outbox(run_id),
        keys.sends(run_id),
        keys.answers(run_id),
        keys.inbox(run_id),
        keys.LIVE_RUNS,
        keys.ENDED_RUNS,
        queue,
        keys.spend(run_id),
    ]
    args = [
        run_id,
        key,
        message,
        content,
        repr(time.time()),
        repr(float(add_budget_usd)),
        add_max_steps,
        answer_id,
        task,
        channel,
        payload,
    ]
    return where, args


def send(
    sender: Sender,
    run_id: str,
    content: str,
    *,
    idempotency_key: str | None = None,
    add_budget_usd: float = 0.0,
    add_max_steps: int = 0,
) -> Op[Sent]:
    """A follow-up (see `Client.send`): one script (FOLLOW_UP), then the first step of the new
    segment sent and the run's keys made persistent again (its retention had started when it ended)."""
    where, args = follow_up_request(
        sender, run_id, content, idempotency_key, add_budget_usd, add_max_steps
    )
    done = parse_follow_up((yield Eval(FOLLOW_UP, where, args)))
    if done.what == "missing":
        raise RunNotFoundError(run_id)
    if done.what == "refused":
        raise refusal(run_id, done.status, done.why)
    assert done.outcome is not None
    sent = Sent(run_id, done.outcome["what"], int(done.outcome["segment"]))
    if done.what == "continued" and done.member is not None:
        persist = [("PERSIST", k) for k in keys.run_keys(run_id, sent.segment)]
        yield Pipeline([*persist, *sender.member(run_id, done.member)])
    return sent


def refusal(run_id: str, status: str, why: str) -> RunStateError | DeadlineError:
    """What a refused follow-up raises: what the run is, and what to do instead."""
    if why == "late":
        return DeadlineError(
            f"The question of run {run_id!r} passed its deadline before this follow-up; nothing was sent.\n"
            "  Give runs a longer ask_timeout_s if answers come later."
        )
    said = {
        "cancelled": f"Run {run_id!r} was cancelled ({status}); it takes no follow-up.\n"
        "  Enqueue a new run with its history (`history`).",
        "approvals": f"Run {run_id!r} waits for decisions on held tool calls; a follow-up answers no call.\n"
        "  Approve or reject them (`toolloop status` lists them), then send.",
        "answered": f"Run {run_id!r}'s question was answered already; nothing was sent.\n"
        "  Wait for the run to go on (`toolloop events -f`), then send.",
        "history": f"Run {run_id!r} has no stored history to continue.\n  Enqueue a new run.",
        "child": f"Run {run_id!r} is a child run that ended {status!r}: its spend was added to its "
        "parent's when it ended, so it takes no follow-up of its own.\n"
        "  Send the follow-up to its root run (`toolloop status` on the child names its parent);"
        "\n  the parent's model can spawn the child again.",
    }
    if why in said:
        return RunStateError(said[why])
    if status in ("queued", "running"):
        return RunStateError(
            f"Run {run_id!r} is {status}; a follow-up continues a run that ended `done`.\n"
            "  Steer it (`steer`: it reads the message at its next step), or wait for it to end, then send."
        )
    return RunStateError(
        f"Run {run_id!r} ended {status!r}; only a run that ended `done` (or was interrupted), or that "
        "waits on its question, takes a follow-up.\n"
        "  Retry it if it failed (`retry`), or enqueue a new run with its history."
    )


def steer(run_id: str, content: str, steer_id: str | None = None) -> Op[str]:
    """A steer (see `Client.steer`): stored in the run's state for its next step boundary; the
    steer id (its journal step is `steer:<id>`)."""
    if not isinstance(content, str) or not content.strip():
        raise ValueError(
            "A steer needs some text.\n  Pass what the run should read, as a string."
        )
    if steer_id is None:
        steer_id = uuid.uuid4().hex
    elif not (isinstance(steer_id, str) and STEER_ID.fullmatch(steer_id)):
        raise ValueError(
            f"A steer id is 1 to 64 letters, digits, '-' or '_', not {steer_id!r}."
        )
    where = [keys.state(run_id), keys.events(run_id)]
    args = [steer_id, content, repr(time.time()), keys.journal(run_id, "")]
    done = parse_steer((yield Eval(STEER_SEND, where, args)))
    if done.what == "missing":
        raise RunNotFoundError(run_id)
    if done.what == "refused":
        if done.why == "duplicate":
            raise RunStateError(
                f"Run {run_id!r} has a steer {steer_id!r} already (waiting, or taken in this segment).\n"
                "  Give each steer its own id."
            )
        if done.why in ("cancelled", "interrupted"):
            raise RunStateError(
                f"Run {run_id!r} is stopping ({done.why}); it takes no steer.\n"
                "  Wait for it to end; an interrupted run takes a follow-up (`send`)."
            )
        if done.status == "asked":
            raise RunStateError(
                f"Run {run_id!r} waits for an answer; a steer reaches a running run.\n"
                "  Send the message as the answer (`send`, or `answer`)."
            )
        raise RunStateError(
            f"Run {run_id!r} has ended ({done.status}); a steer reaches a running run only.\n"
            "  Send a follow-up (`send`) to a run that ended `done`."
        )
    return steer_id


def interrupt(run_id: str) -> Op[int]:
    """An interrupt (see `Client.interrupt`): the segment it stops."""
    done = parse_interrupt(
        (
            yield Eval(
                INTERRUPT_SEND, [keys.state(run_id)], [keys.INTERRUPT_CHANNEL, run_id]
            )
        )
    )
    if done.what == "missing":
        raise RunNotFoundError(run_id)
    if done.what == "refused":
        raise RunStateError(
            f"Run {run_id!r} is {done.status}; only a queued or running run can be interrupted.\n"
            "  `toolloop status` shows how it stands; a run that ended `done` takes a follow-up (`send`)."
        )
    return done.segment


def check_content(content: str, limit: int, what: str) -> None:
    """Refuse a message longer than `limit` bytes (UTF-8) with the setting that raises it."""
    size = (
        len(content.encode("utf-8", "surrogatepass")) if isinstance(content, str) else 0
    )
    if size > limit:
        raise LimitError(
            f"The {what} is {size:,} bytes; the limit is {limit:,}.\n"
            "  Send less text, or raise TOOLLOOP_MAX_ANSWER_BYTES on the clients.",
            "TOOLLOOP_MAX_ANSWER_BYTES",
        )

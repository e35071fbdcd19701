"""Run lifecycle in Redis: create, answer, cancel, retry, the outbox and the sweeper.

A run moves queued -> running -> (asked -> queued -> running ...) -> done | budget | steps | cancel
| failed; every transition is one Lua script (workers/protocol/scripts/) so two workers, a late
answer and a duplicate task never see half a transition. A successor task is first recorded in the
run's outbox (inside the script that decides it), then sent; it leaves the outbox when that task
begins (RUN_BEGIN). The sweeper re-sends what stayed recorded longer than TOOLLOOP_OUTBOX_AGE, so
neither a crash between a commit and its send nor a lost message strands a run.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis as redis_lib
from celery import Celery
from kombu.exceptions import OperationalError

from toolloop.contract import CHAT_MESSAGES, AssistantMessage, ChatMessage, ToolMessage
from workers.client.enqueue import run_id_for
from workers.config.celery import send
from workers.config.settings import Settings
from workers.observe import tracing
from workers.observe.hooks import NO_HOOKS, Hooks
from workers.protocol import keys, lua, names
from workers.protocol.names import ADVANCE, ANSWER
from workers.protocol.records import FINAL
from workers.protocol.scripts.commit import CANCEL_TEXT
from workers.protocol.scripts.control import INDEX_DROP, RUN_ANSWER, parse_answer
from workers.protocol.scripts.enqueue import ENQUEUE
from workers.protocol.scripts.lease import LOCK_KEEP
from workers.protocol.spec import RunSpec

log = logging.getLogger("toolloop.workers")

CANCEL_ANSWER = CANCEL_TEXT


def create(
    client: redis_lib.Redis,
    celery: Celery,
    spec: RunSpec,
    idempotency_key: str | None = None,
) -> str:
    """Store a new run (spec, state, first segment's input, a `queued` event; one script) and send its
    first step through `celery` (the path `Client.enqueue` took before workers/client/enqueue.py, kept for
    tests that give it a broker that fails); when the broker refuses, the step stays in the outbox
    and the sweeper sends it.
    With `idempotency_key`, a second call finds the first call's run and returns its id (it sends the
    first step again only while that step has not begun: a duplicate the fence makes harmless)."""
    run_id = run_id_for(idempotency_key)
    now = time.time()
    messages = json.dumps([m.model_dump(mode="json") for m in spec.messages])
    queued = json.dumps(
        {"model": spec.model, "toolset": spec.toolset, "budget_usd": spec.budget_usd}
    )
    # the caller's span: the run's trace is part of it
    parent = tracing.current_traceparent()
    lua.run(
        client,
        ENQUEUE,
        [
            keys.spec(run_id),
            keys.state(run_id),
            keys.inputs(run_id),
            keys.events(run_id),
            keys.outbox(run_id),
            keys.LIVE_RUNS,
            keys.ALL_RUNS,
            "llm",
        ],
        [
            run_id,
            spec.model_dump_json(),
            now,
            messages,
            queued,
            now,
            "",
            "",
            "",
            parent or "",
        ],
    )
    try:  # the run is stored: from here a failure is the sweeper's to repair, not the caller's
        flush_outbox(client, celery, run_id)
    except (OSError, redis_lib.RedisError) as error:
        log.warning(
            "run %s: stored, but sending its first step failed (%s); the sweeper will send it",
            run_id,
            type(error).__name__,
        )
    return run_id


def send_member(
    client: redis_lib.Redis,
    celery: Celery,
    run_id: str,
    member: str,
    producer: Any = None,
) -> bool:
    """Send the successor recorded as `member` ("<n>|<queue>"). It stays recorded until task n begins
    (RUN_BEGIN clears it: no extra round trip here), so the sweeper sends again a message that was
    lost, or that failed to send (then this returns False). Inside a `producer.batch()` the send
    happens when the batch flushes (its failure is the caller's to log)."""
    n, queue = names.parse_member(member)
    # the outbox keeps no more than the queue
    label = "model" if queue == names.LLM else "tool"
    try:
        if n == 1:
            label = "model 1"
        elif (
            queue == names.LLM
        ):  # after an answer, a decision or a lost send: the run's next model step
            label = f"model {int(client.hget(keys.state(run_id), 'steps') or 0) + 1}"
        send(
            celery,
            ADVANCE,
            [run_id, n],
            queue=queue,
            task_id=names.step_id(run_id, n),
            producer=producer,
            label=label,
        )
    except (OSError, OperationalError, redis_lib.RedisError) as error:
        log.warning(
            "run %s: sending step %s failed (%s); the sweeper will send it",
            run_id,
            n,
            error,
        )
        return False
    return True


def flush_outbox(
    client: redis_lib.Redis,
    celery: Celery,
    run_id: str,
    older_than: float | None = None,
    redrive_age: float | None = None,
) -> int:
    """Send every successor recorded for `run_id` (only those older than `older_than` s when given:
    the sweeper). A member sent again is dated TOOLLOOP_REDRIVE_AGE ahead, so a step that merely
    waits in a long queue gets one extra copy per that age, not one per sweep.
    The sweeper's own re-drive age decides: a member dated further ahead (a first step, dated by the
    process that enqueued it with that process's TOOLLOOP_REDRIVE_AGE, 300 s by default in a web
    backend) is dated back to `redrive_age` from now, so a first step popped and lost (kombu's BRPOP,
    then Redis died) is sent again after the workers' re-drive age, not the enqueuer's."""
    now = time.time()
    later = now + (
        Settings.from_env().redrive_age if redrive_age is None else redrive_age
    )
    outbox = keys.outbox(run_id)
    if older_than is None:
        members: list[str] = client.zrange(outbox, 0, -1)  # type: ignore[assignment]
    else:
        recorded: list[tuple[str, float]] = client.zrange(
            outbox, 0, -1, withscores=True
        )  # type: ignore[assignment]
        members = [member for member, score in recorded if score <= now - older_than]
        ahead = {member: later for member, score in recorded if score > later}
        if ahead:  # LT: a send or a re-date meanwhile keeps the nearer date; XX: one begun is gone
            client.zadd(outbox, ahead, xx=True, lt=True)
    for member in members:
        if send_member(client, celery, run_id, str(member)):
            client.zadd(outbox, {member: later}, xx=True)
    return len(members)


def answer(
    client: redis_lib.Redis,
    celery: Celery,
    run_id: str,
    answer_id: str,
    hooks: Hooks = NO_HOOKS,
) -> str:
    """Apply the answer stored in the run's inbox: "resumed", "kept" (not parked yet) or "ignored"."""
    # first: the index stays a superset of live runs
    client.zadd(keys.LIVE_RUNS, {run_id: time.time()})
    result = parse_answer(
        lua.run(
            client,
            RUN_ANSWER,
            [
                keys.state(run_id),
                keys.answers(run_id),
                keys.inbox(run_id),
                keys.events(run_id),
                keys.outbox(run_id),
            ],
            [answer_id, time.time()],
        )
    )
    hooks.point("answer:after", run=run_id)
    if result.member is not None:
        send_member(client, celery, run_id, result.member)
    elif result.why is not None:
        log.info("answer to run %s ignored: %s", run_id, result.why)
    return result.what


def store_answer(
    client: redis_lib.Redis, run_id: str, segment: int, content: str
) -> str:
    """Put an answer in the run's inbox (the `toolloop.answer` task applies it); its id. The run goes
    back in the live index too, so the sweeper re-sends the task if its message is lost (a worker
    popped it and its connection died before kombu recorded it: tests/faults/test_lost_messages.py)."""
    answer_id = uuid.uuid4().hex
    now = time.time()
    pipe = client.pipeline(transaction=True)
    pipe.hset(
        keys.inbox(run_id),
        answer_id,
        json.dumps({"segment": segment, "content": content, "at": now}),
    )
    pipe.zadd(keys.LIVE_RUNS, {run_id: now})
    pipe.execute()
    return answer_id


def cancel(
    client: redis_lib.Redis, celery: Celery, run_id: str, hooks: Hooks = NO_HOOKS
) -> str:
    """A parked run is answered `Not run: cancel.` and resumes into a cancel stop; a queued or running
    run was already marked (its live step is aborted, its next step stops)."""
    state: dict[str, str] = client.hgetall(keys.state(run_id))  # type: ignore[assignment]
    if state.get("status") != "asked":
        return str(state.get("status"))
    answer_id = store_answer(client, run_id, int(state["segment"]), CANCEL_ANSWER)
    return answer(client, celery, run_id, answer_id, hooks)


SWEEP_READ = 500
"""Live runs whose state one round trip of a sweep reads (their four reads in one pipeline)."""


def keep_sweep_lock(client: redis_lib.Redis, owner: str, held_ms: int) -> bool:
    """LOCK_KEEP of the sweep lock (keys.SWEEP_LOCK): True while `owner` still holds it, its ttl
    `held_ms` again; False once it lapsed or another worker holds it (`sweep`'s `between`)."""
    return int(lua.run(client, LOCK_KEEP, [keys.SWEEP_LOCK], [owner, held_ms])) == 1


def sweep(
    client: redis_lib.Redis,
    celery: Celery,
    settings: Settings | None = None,
    between: Callable[[], bool] | None = None,
) -> dict[str, int]:
    """Re-send successors recorded longer than TOOLLOOP_OUTBOX_AGE; re-drive runs with no lease and no
    recorded successor that did not move for TOOLLOOP_REDRIVE_AGE (their message was lost, or waits in
    a long queue: then the copy finds its step done and leaves); drop ended and parked runs from the
    live index (an answer puts a parked run back before it resumes it, and a drop only happens while
    the run's index score is the one read before its status, so no resume is lost).
    Re-sends the `toolloop.answer` task of an inbox answer older than TOOLLOOP_OUTBOX_AGE (its message
    was lost). The live runs are read SWEEP_READ at a time, in one round trip each; `between` is
    called after each such chunk (the worker's sweeper keeps its lock): when it answers False (the
    lock lapsed, and another worker may sweep now), the sweep stops there and `lost` is 1. Returns
    counts of what it did; a run whose keys cannot be read is logged and `skipped`, and the sweep
    goes on with the next."""
    settings = settings or Settings.from_env()
    done = {
        "resent": 0,
        "redriven": 0,
        "ended": 0,
        "parked": 0,
        "answers": 0,
        "skipped": 0,
        "lost": 0,
    }
    now = time.time()
    live: list[tuple[str, float]] = client.zrange(
        keys.LIVE_RUNS, 0, -1, withscores=True
    )  # type: ignore[assignment]
    for first in range(0, len(live), SWEEP_READ):
        chunk = live[first : first + SWEEP_READ]
        pipe = client.pipeline(transaction=False)
        for run_id, _ in chunk:
            pipe.hmget(keys.state(run_id), "status", "touched", "n", "queue")
            pipe.zcard(keys.outbox(run_id))
            pipe.exists(keys.lease(run_id))
            pipe.hgetall(keys.inbox(run_id))
        read = pipe.execute(raise_on_error=False)
        for i, (run_id, score) in enumerate(chunk):
            try:
                _sweep_run(
                    client,
                    celery,
                    settings,
                    run_id,
                    score,
                    now,
                    done,
                    read[4 * i : 4 * i + 4],
                )
            except (redis_lib.ResponseError, ValueError, TypeError, KeyError) as error:
                # one run's keys holding what no worker wrote (a WRONGTYPE key, a bad number or
                # answer) must not stop the sweep of every run after it; a lost connection still
                # ends the sweep
                done["skipped"] += 1
                log.warning(
                    "sweep: run %r skipped: %s: %s\n  Its keys tl:{%s}:* hold something the workers did not "
                    "write; look at them (redis-cli --scan --pattern 'tl:{%s}:*'), then delete or fix them.",
                    run_id,
                    type(error).__name__,
                    error,
                    run_id,
                    run_id,
                )
        if between is not None and not between():
            done["lost"] = 1
            log.warning(
                "sweep: the sweep lock lapsed after %d of %d live runs (a sweep outlasted it); "
                "stopped here, the next sweep goes on",
                first + len(chunk),
                len(live),
            )
            break
    return done


def _sweep_run(
    client: redis_lib.Redis,
    celery: Celery,
    settings: Settings,
    run_id: str,
    score: float,
    now: float,
    done: dict[str, int],
    read: list[Any],
) -> None:
    """One run of the sweep (`sweep`), given its four reads (a read Redis refused, a WRONGTYPE key:
    raised here): its counts are added to `done`."""
    refused = next((reply for reply in read if isinstance(reply, Exception)), None)
    if refused is not None:
        raise refused
    (status, touched, n, queue), pending, leased, inbox = read
    if inbox and status is not None and status not in FINAL:
        done["answers"] += resend_answers(
            celery, run_id, inbox, now - settings.outbox_age
        )
    if (
        status is None
        or status in FINAL
        or (status == "asked" and not pending and not inbox)
    ):
        lua.run(client, INDEX_DROP, [keys.LIVE_RUNS], [run_id, repr(score)])
        done["ended" if status != "asked" else "parked"] += 1
        return
    if pending:
        done["resent"] += flush_outbox(
            client, celery, run_id, settings.outbox_age, settings.redrive_age
        )
    elif status in ("queued", "running") and not leased:
        idle = now - float(touched or 0)
        if idle > settings.redrive_age:
            next_n = int(n or 0) + 1
            send(
                celery,
                ADVANCE,
                [run_id, next_n],
                queue=queue or names.LLM,
                task_id=names.step_id(run_id, next_n),
            )
            client.hset(keys.state(run_id), "touched", now)
            done["redriven"] += 1


def resend_answers(
    celery: Celery, run_id: str, inbox: dict[str, str], before: float
) -> int:
    """Send `toolloop.answer` again for inbox answers stored before `before` and still not applied
    (the task deletes its inbox entry; a copy that finds it gone does nothing)."""
    sent = 0
    for answer_id, raw in inbox.items():
        if float(json.loads(raw).get("at", 0)) < before:
            send(
                celery,
                ANSWER,
                [run_id, answer_id],
                queue=names.CONTROL,
                task_id=names.answer_task_id(run_id, answer_id),
            )
            sent += 1
    return sent


def segment_messages(input_json: str | None, answer: str | None) -> list[ChatMessage]:
    """The input of the current segment: the last one's history, the held ask answered."""
    if not input_json:
        raise ValueError(
            "The run has no input messages for its current segment.\n  Enqueue it again."
        )
    messages = CHAT_MESSAGES.validate_json(input_json)
    if answer is None:
        return messages
    answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
    for message in reversed(messages):
        if isinstance(message, AssistantMessage):
            for call in message.tool_calls or []:
                if call.name == "ask" and call.id not in answered:
                    return [
                        *messages,
                        ToolMessage(tool_call_id=call.id, content=answer),
                    ]
            break
    return messages

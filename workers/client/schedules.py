"""The client side of schedules: build and check a schedule (`build`), and the operations of
`Client.schedule`, `list_schedules`, `get_schedule` and `remove_schedule` (pure request/reply, as
workers/client/ops.py; both clients run them).

A schedule is checked before anything is stored: its trigger (workers/protocol/schedules.py), its policies,
and its run spec exactly as `Client.enqueue` checks one (`Preparer.check`: the spec's fields, the
toolset's name, TOOLLOOP_MAX_SPEC_BYTES and the other limits). Adding is one script
(SCHEDULE_ADD); with an idempotency key the schedule's id derives from the key, so an application
that adds its schedules at every start adds each once.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from workers.client import talk
from workers.client.enqueue import Preparer
from workers.client.ops import Call, Eval, Op, Pipeline
from workers.protocol import keys, schedules
from workers.protocol.errors import (
    RunNotFoundError,
    ScheduleError,
    ScheduleNotFoundError,
)
from workers.protocol.schedules import Enqueue, Schedule, ScheduleInfo, Send
from workers.protocol.scripts.schedules import SCHEDULE_ADD, SCHEDULE_REMOVE
from workers.protocol.spec import RunSpec


def schedule_id(prefix: str, idempotency_key: str | None) -> str:
    """A new schedule id (`[s<k>-]sched-<24 hex>`), or the one an idempotency key maps to."""
    if idempotency_key is None:
        return f"{prefix}sched-{uuid.uuid4().hex[:24]}"
    if not isinstance(idempotency_key, str) or not 0 < len(idempotency_key) <= 256:
        raise ScheduleError(
            "The schedule's idempotency key must be text of 1 to 256 characters.\n"
            "  Use a stable name, e.g. 'nightly-report'."
        )
    digest = hashlib.sha256(
        f"toolloop-schedule\x00{idempotency_key}".encode()
    ).hexdigest()[:24]
    return f"{prefix}sched-{digest}"


@dataclass(frozen=True, slots=True)
class Request:
    """What `Client.schedule` was asked, before it is checked."""

    spec: RunSpec | dict[str, Any] | None = None
    cron: str | None = None
    every_s: float | None = None
    at: float | datetime | None = None
    timezone: str = "UTC"
    start: float | None = None
    send_to: str | None = None
    content: str | None = None
    if_busy: str = "skip"
    catch_up: str = "latest"
    grace_s: float = 60.0
    name: str = ""
    idempotency_key: str | None = None
    add_budget_usd: float = 0.0
    add_max_steps: int = 0


def _trigger(
    request: Request, now: float
) -> schedules.Cron | schedules.Every | schedules.Once:
    given = [
        name for name in ("cron", "every_s", "at") if getattr(request, name) is not None
    ]
    if len(given) != 1:
        raise ScheduleError(
            f"A schedule needs exactly one trigger; it was given {', '.join(given) or 'none'}.\n"
            "  Pass one of cron='0 9 * * *', every_s=3600 or at=<unix seconds or aware datetime>."
        )
    if request.cron is not None:
        return schedules.cron(request.cron, request.timezone)
    if request.timezone != "UTC":
        raise ScheduleError(
            "A time zone applies to cron schedules only.\n  Drop timezone=, or use cron=."
        )
    if request.every_s is not None:
        return schedules.every(request.every_s, request.start, now)
    if request.start is not None:
        raise ScheduleError(
            "start= applies to every_s schedules only.\n  Drop it, or use every_s=."
        )
    return schedules.once(request.at, now)


def _target(request: Request, prepare: Preparer) -> Enqueue | Send:
    if (request.spec is None) == (request.send_to is None):
        raise ScheduleError(
            "A schedule needs one target: a run spec to enqueue, or send_to=RUN_ID with content=.\n"
            "  Pass spec={...} (as Client.enqueue takes), or send_to= and content=."
        )
    if request.spec is not None:
        if request.content is not None:
            raise ScheduleError(
                "content= goes with send_to=.\n  Put the message in the spec's messages."
            )
        checked, _ = prepare.check(request.spec)  # exactly as an enqueue checks it
        return Enqueue(kind="enqueue", spec=checked, run_prefix=prepare.run_prefix)
    if not isinstance(request.send_to, str) or not 0 < len(request.send_to) <= 200:
        raise ScheduleError(
            "send_to= names a run by its id.\n  Pass the id Client.enqueue returned."
        )
    if not isinstance(request.content, str) or not request.content.strip():
        raise ScheduleError(
            "A follow-up schedule needs content=, the message each tick sends.\n"
            "  Pass what the run should read, e.g. content='Check the queue again.'"
        )
    talk.check_content(request.content, prepare.settings.max_answer_bytes, "follow-up")
    talk.check_top_ups(request.add_budget_usd, request.add_max_steps)
    return Send(
        kind="send",
        run_id=request.send_to,
        content=request.content,
        add_budget_usd=request.add_budget_usd,
        add_max_steps=request.add_max_steps,
    )


def build(
    request: Request, prepare: Preparer, now: float | None = None
) -> tuple[Schedule, float]:
    """The checked schedule and its first tick; ScheduleError (or the enqueue's own errors for its
    spec) when anything is bad. Nothing is read or stored."""
    now = time.time() if now is None else now
    trigger = _trigger(request, now)
    target = _target(request, prepare)
    grace = schedules.check_policy(
        target, request.if_busy, request.catch_up, request.grace_s
    )
    made = Schedule(
        id=schedule_id(prepare.run_prefix, request.idempotency_key),
        name=schedules.check_name(request.name),
        trigger=trigger,
        target=target,
        if_busy=request.if_busy,  # checked by check_policy
        catch_up=request.catch_up,
        grace_s=grace,
        created=now,
    )
    first = schedules.first_tick(trigger, now)
    if first is None:
        raise ScheduleError(
            f"The schedule {schedules.describe(trigger)} has no tick to come.\n{schedules.HINT}"
        )
    size = len(definition(made))
    if size > schedules.MAX_SCHEDULE_BYTES:
        raise ScheduleError(
            f"The schedule is {size:,} bytes as JSON; the limit is {schedules.MAX_SCHEDULE_BYTES:,}.\n"
            "  Send less text in its spec (large inputs belong in a tool the run calls)."
        )
    return made, first


def definition(schedule: Schedule) -> str:
    """The JSON a schedule is stored as: its own defaults left out (it reads back the same), its run
    spec whole (as the run's own `spec` key holds it)."""
    data = schedule.model_dump(mode="json", exclude_defaults=True, exclude={"kind"})
    if isinstance(schedule.target, Enqueue):
        data["target"]["spec"] = schedule.target.spec.model_dump(mode="json")
    return orjson.dumps(data).decode()


def add(schedule: Schedule, first: float, run_check: str | None = None) -> Op[str]:
    """Store `schedule` (nothing when its id exists: an add with the same idempotency key); its id.
    `run_check`: a run that must exist (a follow-up's target)."""
    sid = schedule.id
    run = keys.state(run_check) if run_check is not None else keys.schedule("-")
    added = yield Eval(
        SCHEDULE_ADD,
        [
            keys.schedule(sid),
            keys.SCHEDULES_DUE,
            keys.SCHEDULES_ALL,
            keys.schedule_def(sid),
            run,
        ],
        [
            sid,
            definition(schedule),
            repr(first),
            repr(schedule.created),
            "1" if run_check else "",
        ],
    )
    if added == -1 and run_check is not None:
        raise RunNotFoundError(run_check)
    return sid


def get(schedule_id: str) -> Op[ScheduleInfo]:
    sid = schedules.check_id(schedule_id)
    state, raw = yield Pipeline(
        [("HGETALL", keys.schedule(sid)), ("GET", keys.schedule_def(sid))]
    )
    if not state or raw is None:
        raise ScheduleNotFoundError(schedule_id)
    return schedules.info_of(_decoded(state), raw)


def listing(limit: int = 1000) -> Op[list[ScheduleInfo]]:
    """Schedules, newest first, at most `limit`."""
    if not isinstance(limit, int) or not 1 <= limit <= 100_000:
        raise ValueError(f"limit={limit!r}: give a whole number from 1 to 100000.")
    ids: list[str] = yield Call("ZREVRANGE", keys.SCHEDULES_ALL, 0, limit - 1)
    if not ids:
        return []
    read = yield Pipeline(
        [
            c
            for sid in ids
            for c in (("HGETALL", keys.schedule(sid)), ("GET", keys.schedule_def(sid)))
        ]
    )
    pairs = zip(read[0::2], read[1::2], strict=True)
    return [
        schedules.info_of(_decoded(state), raw)
        for state, raw in pairs
        if state and raw is not None
    ]


def remove(schedule_id: str) -> Op[None]:
    sid = schedules.check_id(schedule_id)
    removed = yield Eval(
        SCHEDULE_REMOVE,
        [
            keys.schedule(sid),
            keys.SCHEDULES_DUE,
            keys.SCHEDULES_ALL,
            keys.schedule_def(sid),
        ],
        [sid],
    )
    if not removed:
        raise ScheduleNotFoundError(sid)


def _decoded(state: Any) -> dict[str, str]:
    if isinstance(state, dict):
        return {str(k): str(v) for k, v in state.items()}
    items = list(state)  # RESP2 without decoding into a dict: [field, value, ...]
    return {str(items[i]): str(items[i + 1]) for i in range(0, len(items), 2)}

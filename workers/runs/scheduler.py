"""The worker side of schedules: `Scheduler.fire_due`, which a thread of every worker calls once a
second (workers/worker/bootsteps.py `_fire_forever`) and the `toolloop.sweep` task calls too.

Every worker fires: there is no lock to wait for, and the fence is per tick (the fire scripts,
workers/protocol/scripts/schedules.py). A sweep takes the due schedules (`tl:sched:due`, score <=
now) in rounds of `batch` (1,000; DUE_TAKE: when more than `per_script` are due, the round's ids,
half of them when they fit in one round, are hidden from racing sweepers for TAKE_HOLD_S, so two
sweepers of a big tick fire disjoint rounds),
works out each one's tick (the latest due one: workers/protocol/schedules.py `latest_due`), its
next tick and what the catch-up policy says, and fires each round: their reads in one pipeline,
then FIRE_MANY calls of `per_script` (100) schedules each, all in one round trip. FIRE_MANY takes,
per schedule, what FIRE_ENQUEUE does for an `Enqueue` target (claims the tick, stores its run, its id
derived from the schedule and the tick, and sends the run's first step, all or nothing) or FIRE for
a tick that does not fire. Two sweepers that read the same tick send the same claim; one finds the
tick moved on (`taken`) and writes nothing. With a time budget (`budget_s`), a sweep stops after
the round that passes it and sets `more`: its caller comes back at once.

A `Send` target (a follow-up) is claimed and applied in the same FIRE_MANY item: the fence first,
then the run read there: a run that ended `done` or `interrupted` takes FOLLOW_UP (keyed by the
schedule and the tick) and its new segment's first step is sent in the script (its message made
here for the run's next step as read before, the run's keys made persistent again), a queued or
running run is busy (held or skipped by its policy). The rest go the one-by-one way (`_follow_ups`):
a steer (if_busy "steer"), a run parked on its question (the follow-up is its answer), a refusal (it
says why) or a run gone. There, workers/client/talk.py's own operations apply the follow-up, keyed
by the schedule and the tick, BEFORE its tick is claimed: `send(idempotency_key=fire_key)`, or
`steer(steer_id=...)` while it runs and if_busy is "steer"; then FIRE claims the tick. A sweeper
that dies between the two leaves the tick due, and the next sweep sends it again with the same key,
which the run applies once; two sweepers that race both send with that key, one applies it, and one
claims the tick. A sweeper that finds this very tick's follow-up among the run's sends (another
sweeper sent it first) claims the tick as fired, not skipped; FIRE_MANY does the same.

A run a fire makes names the schedule and the tick in its `queued` event (`schedule`, `tick`) and in
its first step's label in Flower (`model 1 (schedule <id>)`); each fire is a span
`toolloop.schedule.fire` (when tracing is on), the parent of the run's trace; the worker's metrics
count `toolloop_schedule_fires_total{outcome}`.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import redis as redis_lib
from opentelemetry import trace
from pydantic import ValidationError

from toolloop.loop.approvals import DeadlineError
from workers.client import ops, talk
from workers.client.drive import SyncDriver
from workers.client.enqueue import Preparer
from workers.client.ops import Call, Eval, Op, Pipeline
from workers.config.settings import Settings
from workers.protocol import keys, lua, schedules
from workers.protocol.errors import WorkersError
from workers.protocol.schedules import Enqueue, Schedule, Send
from workers.protocol.scripts.schedules import (
    DUE_TAKE,
    FIRE,
    FIRE_ENQUEUE,
    FIRE_MANY,
    parse_fire,
    parse_take,
)

log = logging.getLogger("toolloop.workers")

FIRE_SPAN = "toolloop.schedule.fire"
NO_RUN = keys.schedule("-")
"""A key that never exists (no schedule id reads "-"): the busy check of a schedule with no run yet."""
HELD_RETRY_S = 1.0
"""How soon the sweeper looks again at a tick held for a busy target."""
BAD_DEF_RETRY_S = 60.0
TAKE_HOLD_S = 10.0
"""How long the ids of a round one sweeper took stay hidden from the others (DUE_TAKE): longer
than a round of 1,000 takes on a loaded machine (1-2.5 s), shorter than a schedule's default
grace (60 s); a claim moves each one on before then."""
_TRACER = trace.get_tracer("toolloop.workers.scheduler")


@dataclass(frozen=True, slots=True)
class Due:
    """One due schedule as a sweep found it: the field it claims and its value as read (the fence),
    the tick it fires, the ticks before it missed, its next tick, what the catch-up policy says."""

    sid: str
    schedule: Schedule
    field: str
    read: str
    tick: float
    missed: int
    after: float | None
    wanted: str
    last_run: str


@dataclass(slots=True)
class Item:
    """One schedule's part of a FIRE_MANY call: its kind ('claim', 'enqueue', 'send'), KEYS and
    ARGV, its span; a 'send' keeps its `Due` for the slow way (FIRE_MANY's {'slow'})."""

    sid: str
    span: Any
    kind: str
    keys: list[str]
    args: list[Any]
    due: Due | None = None
    run_id: str = ""


@dataclass(slots=True)
class Slow:
    """The follow-up ticks a FIRE_MANY call left to the one-by-one way, with their spans."""

    dues: list[Due] = field(default_factory=list)
    spans: dict[str, Any] = field(default_factory=dict)


class Scheduler:
    """Fires the due schedules of one Redis. Owned by the thread that calls it (a worker's sweeper);
    it keeps the parsed definitions it has seen (a definition never changes under its id)."""

    def __init__(
        self,
        client: redis_lib.Redis,
        settings: Settings,
        metrics: Any = None,
        *,
        batch: int = 1000,
        per_script: int = 100,
        most: int = 20_000,
    ) -> None:
        self.redis = client
        self.settings = settings
        self.metrics = metrics
        self.batch = batch
        """The schedules read and fired in one round of round trips (their reads, one pipeline of
        FIRE_MANY calls)."""
        self.per_script = per_script
        """The schedules one FIRE_MANY call fires (Redis runs nothing else meanwhile: ~10 ms)."""
        self.most = most
        """The most schedules one `fire_due` looks at (the rest: the next second's)."""
        self.more = False
        """Set by `fire_due`: it stopped at its time budget with due schedules left."""
        self.driver = SyncDriver(client, client)
        db = int(client.connection_pool.connection_kwargs.get("db", 0))
        self.sender = ops.Sender(db)
        self.prepare = Preparer(settings, settings.toolset_names(), self.sender)
        self._defs: dict[str, tuple[str, Schedule]] = {}
        self._tick_memo: dict[
            tuple[Any, float, float], tuple[float, int, float | None]
        ] = {}

    def fire_due(
        self, now: float | None = None, *, budget_s: float | None = None
    ) -> dict[str, int]:
        """Fire (or settle) every schedule due at `now`; counts by outcome ("fired", "steer",
        "skipped", "held", "missed", "failed", "taken" by another sweeper, "error": the script failed).
        With `budget_s`, it stops after the batch that passes that many seconds and sets `more`
        (the sweeper calls it again at once, after its other duties)."""
        now = time.time() if now is None else now
        started = time.monotonic()
        self.more = False
        self._tick_memo = {}  # a sweep's own: `now` is part of every key
        done: Counter[str] = Counter()
        looked = 0
        while looked < self.most:
            if (
                looked
                and budget_s is not None
                and time.monotonic() - started >= budget_s
            ):
                self.more = True
                break
            # more than a FIRE_MANY call due: this round's ids are taken (hidden from racing
            # sweepers until TAKE_HOLD_S, or until their claims move them on; half of them when
            # they fit in a round), so two sweepers fire disjoint rounds; fewer are fired as read
            due = parse_take(
                lua.run(
                    self.redis,
                    DUE_TAKE,
                    [keys.SCHEDULES_DUE],
                    [now, self.batch, self.per_script, now + TAKE_HOLD_S],
                )
            )
            if due.ids:
                self._fire_some(due.ids, now, done)
            looked += len(due.ids)
            if not due.taken:
                break
        else:
            self.more = True
        if self.metrics is not None and done:
            self.metrics.fires(done)
        return dict(done)

    def _fire_some(self, ids: list[str], now: float, done: Counter[str]) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for sid in ids:
            pipe.get(keys.schedule_def(sid))
            pipe.hmget(keys.schedule(sid), "next", "held", "last_run")
        read = pipe.execute()
        found = [
            self._due(sid, raw, nxt, held, last_run, now)
            for sid, raw, (nxt, held, last_run) in zip(
                ids, read[0::2], read[1::2], strict=True
            )
        ]
        dues = [due for due in found if due is not None]
        items = [
            self._item(*self._enqueue(due, now))
            for due in dues
            if isinstance(due.schedule.target, Enqueue)
        ]
        slow = Slow()
        items += self._sends(
            [due for due in dues if isinstance(due.schedule.target, Send)], now, slow
        )
        self._fire_many(items, done, slow)
        if slow.dues:  # the one-by-one way: talk's send or steer, then FIRE
            planned = self._follow_ups(slow.dues, now, slow.spans)
            replies = self.driver.batch(
                Pipeline([request for _, request, _ in planned])
            )
            for (sid, _, span), reply in zip(planned, replies, strict=True):
                self._settle(sid, span, reply, done)

    def _settle(self, sid: str, span: Any, reply: Any, done: Counter[str]) -> None:
        """Count one schedule's fire by its reply (an error: its script failed) and end its span."""
        if isinstance(reply, Exception):
            done["error"] += 1
            log.warning(
                "schedule %s: its fire failed: %s: %s", sid, type(reply).__name__, reply
            )
            span.set_attribute("toolloop.schedule.outcome", "error")
        else:
            fired = parse_fire(reply)
            done[fired.what] += 1
            span.set_attribute("toolloop.schedule.outcome", fired.what)
        span.end()

    def _item(self, sid: str, request: Eval, span: Any) -> Item:
        kind = "enqueue" if request.script is FIRE_ENQUEUE else "claim"
        return Item(sid, span, kind, request.keys, request.args)

    def _fire_many(self, items: list[Item], done: Counter[str], slow: Slow) -> None:
        """`items` in FIRE_MANY calls of `per_script` each, all in one round trip; the follow-ups
        it leaves to the slow way go in `slow`, and the step messages it did not send are sent."""
        chunks = [
            items[first : first + self.per_script]
            for first in range(0, len(items), self.per_script)
        ]
        requests: list[tuple[Any, ...] | Eval] = []
        for chunk in chunks:
            where: list[str] = []
            args: list[Any] = []
            for item in chunk:
                where += item.keys
                args += [item.kind, len(item.keys), len(item.args), *item.args]
            requests.append(Eval(FIRE_MANY, where, args))
        if not requests:
            return
        replies = self.driver.batch(Pipeline(requests))
        publish: list[tuple[Any, ...]] = []
        for chunk, reply in zip(chunks, replies, strict=True):
            for i, item in enumerate(chunk):
                got = reply if isinstance(reply, Exception) else reply[i]
                if isinstance(got, list) and got and str(got[0]) == "slow":
                    assert item.due is not None
                    slow.dues.append(item.due)
                    slow.spans[item.sid] = item.span
                    continue
                if item.kind == "send" and isinstance(got, list) and len(got) > 1:
                    # fired, but the run had moved on from the step the message was for
                    publish += self.sender.member(item.run_id, str(got[1]))
                self._settle(item.sid, item.span, got, done)
        if publish:
            self.driver.batch(Pipeline(publish))

    def _sends(self, dues: list[Due], now: float, slow: Slow) -> list[Item]:
        """The FIRE_MANY items of follow-up ticks: each one's claim and, for a tick that fires, its
        FOLLOW_UP with the new segment's step message (made for the run's next step as read here)."""
        if not dues:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for due in dues:
            assert isinstance(due.schedule.target, Send)
            pipe.hget(keys.state(due.schedule.target.run_id), "n")
        steps = pipe.execute()
        items: list[Item] = []
        for due, n in zip(dues, steps, strict=True):
            target = due.schedule.target
            assert isinstance(target, Send)
            span = self._span(due)
            span.set_attribute("toolloop.run_id", target.run_id)
            state = keys.state(target.run_id)
            if due.wanted != "fire":
                claim = self._claim(due, now, mode="free")
                where = [keys.schedule(due.sid), keys.SCHEDULES_DUE, state]
                items.append(Item(due.sid, span, "claim", where, claim))
                continue
            try:
                follow, args = talk.follow_up_request(
                    self.sender,
                    target.run_id,
                    target.content,
                    schedules.fire_key(due.sid, due.tick),
                    target.add_budget_usd,
                    target.add_max_steps,
                    answer=False,
                )
            except ValueError:  # the slow way refuses it, and says why
                slow.dues.append(due)
                slow.spans[due.sid] = span
                continue
            member = f"{int(n or 0) + 1}|llm"
            queue, raw, channel, payload = self.sender.member_message(
                target.run_id, member
            )
            fixed = keys.run_keys(target.run_id, -1)  # its keys but the journals
            items.append(
                Item(
                    due.sid,
                    span,
                    "send",
                    [
                        keys.schedule(due.sid),
                        keys.SCHEDULES_DUE,
                        *follow,
                        queue,
                        *fixed,
                    ],
                    [
                        *self._claim(due, now, mode="free"),
                        *args,
                        keys.journal(target.run_id, ""),
                        member,
                        raw,
                        channel,
                        payload,
                    ],
                    due,
                    target.run_id,
                )
            )
        return items

    def _schedule(self, sid: str, raw: str) -> Schedule | None:
        kept = self._defs.get(sid)
        if kept is not None and kept[0] == raw:
            return kept[1]
        try:
            schedule = schedules.SCHEDULE.validate_json(raw)
        except ValidationError as error:
            log.warning(
                "schedule %r skipped: its definition is not one toolloop wrote (%s)\n  Look at it "
                "(redis-cli GET %s), then remove it: toolloop schedule remove %s",
                sid,
                error.errors()[0]["msg"],
                keys.schedule_def(sid),
                sid,
            )
            self.redis.zadd(
                keys.SCHEDULES_DUE, {sid: time.time() + BAD_DEF_RETRY_S}, xx=True
            )
            return None
        if len(self._defs) > 200_000:
            self._defs.clear()
        self._defs[sid] = (raw, schedule)
        return schedule

    def _due(
        self,
        sid: str,
        raw: str | None,
        nxt: str | None,
        held: str | None,
        last_run: str | None,
        now: float,
    ) -> Due | None:
        """What is due of one schedule; None when nothing is (the index is put right)."""
        if raw is None:  # removed meanwhile: its index entry goes too
            self.redis.zrem(keys.SCHEDULES_DUE, sid)
            return None
        schedule = self._schedule(sid, raw)
        if schedule is None:
            return None
        trigger = schedule.trigger
        if nxt and float(nxt) <= now:
            tick, missed, after = self._ticks(trigger, float(nxt), now)
            late = now - tick > schedule.grace_s
            wanted = "miss" if late and schedule.catch_up == "skip" else "fire"
            return Due(
                sid, schedule, "next", nxt, tick, missed, after, wanted, last_run or ""
            )
        if held:
            return Due(
                sid,
                schedule,
                "held",
                held,
                float(held),
                0,
                None,
                "fire",
                last_run or "",
            )
        if (
            nxt
        ):  # the index is behind the hash (a fire settled it meanwhile): put it right
            self.redis.zadd(keys.SCHEDULES_DUE, {sid: float(nxt)})
        else:
            self.redis.zrem(keys.SCHEDULES_DUE, sid)
        return None

    def _ticks(
        self, trigger: Any, due: float, now: float
    ) -> tuple[float, int, float | None]:
        """The latest due tick, the missed ones and the next tick, the same for every schedule of
        one trigger due at one tick (10,000 schedules on one cron second: one cronsim walk)."""
        key = (trigger, due, now)
        found = self._tick_memo.get(key)
        if found is None:
            tick, missed = schedules.latest_due(trigger, due, now)
            found = (tick, missed, schedules.tick_after(trigger, max(tick, now)))
            self._tick_memo[key] = found
        return found

    def _span(self, due: Due) -> Any:
        return _TRACER.start_span(
            FIRE_SPAN,
            attributes={
                "toolloop.schedule.id": due.sid,
                "toolloop.schedule.tick": due.tick,
            },
        )

    def _claim(
        self,
        due: Due,
        now: float,
        *,
        wanted: str = "",
        run_id: str = "",
        error: str = "",
        mode: str = "unended",
    ) -> list[Any]:
        """FIRE's (and FIRE_ENQUEUE's) claim arguments (workers/protocol/scripts/schedules.py)."""
        after = "" if due.after is None else repr(due.after)
        return [
            due.sid,
            due.field,
            due.read,
            now,
            after,
            due.missed,
            wanted or due.wanted,
            due.schedule.if_busy,
            run_id,
            error,
            now + HELD_RETRY_S,
            mode,
            repr(due.tick),
        ]

    def _fire(self, due: Due, claim: list[Any], span: Any) -> tuple[str, Eval, Any]:
        return (
            due.sid,
            Eval(FIRE, [keys.schedule(due.sid), keys.SCHEDULES_DUE, NO_RUN], claim),
            span,
        )

    def _enqueue(self, due: Due, now: float) -> tuple[str, Eval, Any]:
        """FIRE_ENQUEUE for a tick that fires (its run built here), else FIRE."""
        target = due.schedule.target
        assert isinstance(target, Enqueue)
        span = self._span(due)
        busy_key = keys.state(due.last_run) if due.last_run else NO_RUN
        if due.wanted != "fire":
            return (
                due.sid,
                Eval(
                    FIRE,
                    [keys.schedule(due.sid), keys.SCHEDULES_DUE, busy_key],
                    self._claim(due, now),
                ),
                span,
            )
        try:
            with trace.use_span(
                span, end_on_exit=False
            ):  # the run's trace is the fire's
                made = self.prepare(
                    target.spec,
                    schedules.fire_key(due.sid, due.tick),
                    run_prefix=target.run_prefix,
                    fired={"schedule": due.sid, "tick": due.tick},
                )
        except (
            WorkersError,
            ValidationError,
            ValueError,
        ) as error:  # refused now (a toolset gone)
            first = str(error).splitlines()[0][:300]
            log.warning(
                "schedule %s: tick %s not fired: %s",
                due.sid,
                schedules.iso(due.tick),
                first,
            )
            return self._fire(
                due, self._claim(due, now, wanted="fail", error=first), span
            )
        span.set_attribute("toolloop.run_id", made.run_id)
        request = made.request
        claim = self._claim(due, now, run_id=made.run_id)
        where = [*request.keys, keys.schedule(due.sid), keys.SCHEDULES_DUE, busy_key]
        return due.sid, Eval(FIRE_ENQUEUE, where, [*request.args, *claim]), span

    def _follow_ups(
        self, dues: list[Due], now: float, spans: dict[str, Any] | None = None
    ) -> list[tuple[str, Eval, Any]]:
        """The claims of follow-up ticks, after their sends (or steers) are applied, one by one (the
        ticks FIRE_MANY leaves: a steer, an asked run, a refusal, a run gone). `spans`: theirs."""
        if not dues:
            return []
        # one moment: a send sets both at once
        pipe = self.redis.pipeline(transaction=True)
        for due in dues:
            assert isinstance(due.schedule.target, Send)
            pipe.hget(keys.state(due.schedule.target.run_id), "status")
            pipe.hexists(
                keys.sends(due.schedule.target.run_id),
                schedules.fire_key(due.sid, due.tick),
            )
        read = pipe.execute()
        planned: list[tuple[str, Eval, Any]] = []
        applying: list[tuple[Due, Any, str]] = []
        operations: list[Op[Any]] = []
        for due, status, sent in zip(dues, read[0::2], read[1::2], strict=True):
            target = due.schedule.target
            assert isinstance(target, Send)
            span = (spans or {}).get(due.sid) or self._span(due)
            span.set_attribute("toolloop.run_id", target.run_id)
            if (
                sent and due.wanted == "fire"
            ):  # this tick's follow-up is in (another sweeper sent it, or
                # this one before it died): the run is busy with it, and the tick fired
                planned.append(
                    self._fire(due, self._claim(due, now, mode="free"), span)
                )
                continue
            busy = status in ("queued", "running")
            if due.wanted != "fire" or (busy and due.schedule.if_busy != "steer"):
                planned.append(
                    self._fire(
                        due,
                        self._claim(due, now, mode="busy" if busy else "free"),
                        span,
                    )
                )
                continue
            if busy:
                operations.append(
                    talk.steer(
                        target.run_id,
                        target.content,
                        schedules.steer_id(due.sid, due.tick),
                    )
                )
            else:
                key = schedules.fire_key(due.sid, due.tick)
                operations.append(
                    talk.send(
                        self.sender,
                        target.run_id,
                        target.content,
                        idempotency_key=key,
                        add_budget_usd=target.add_budget_usd,
                        add_max_steps=target.add_max_steps,
                    )
                )
            applying.append((due, span, "busy" if busy else "free"))
        for (due, span, mode), result in zip(
            applying, run_many(self.driver, operations), strict=True
        ):
            if isinstance(result, Exception) and not _steered_already(result):
                first = str(result).splitlines()[0][:300]
                log.warning(
                    "schedule %s: tick %s not sent: %s",
                    due.sid,
                    schedules.iso(due.tick),
                    first,
                )
                planned.append(
                    self._fire(
                        due,
                        self._claim(due, now, wanted="fail", error=first, mode=mode),
                        span,
                    )
                )
            else:
                planned.append(self._fire(due, self._claim(due, now, mode=mode), span))
        return planned


FOLLOW_UP_ERRORS = (WorkersError, ValueError, DeadlineError)
"""What a follow-up or steer is refused with (the run ended, is gone, waits on approvals...)."""


def _steered_already(error: BaseException) -> bool:
    """A steer refused as a duplicate of its id: this tick's steer, sent by another sweeper (or by
    this one before it died)."""
    return "has a steer" in str(error)


def run_many(driver: SyncDriver, operations: list[Op[Any]]) -> list[Any]:
    """Run `operations` (workers/client/ops.py) in lockstep: each round sends the request every one of them
    waits on in one pipeline. Each one's result, or the error it raised (a refusal, or a Redis error
    in its reply)."""
    results: list[Any] = [None] * len(operations)
    waiting: dict[int, Any] = {}
    for i in range(len(operations)):
        _advance(operations, i, None, waiting, results)
    while waiting:
        flat: list[Any] = []
        shape: list[tuple[int, int | None]] = []
        for i, request in waiting.items():
            if isinstance(request, Pipeline):
                shape.append((i, len(request.commands)))
                flat.extend(request.commands)
            else:
                shape.append((i, None))
                flat.append(request.args if isinstance(request, Call) else request)
        replies = driver.batch(Pipeline(flat))
        waiting, at = {}, 0
        for i, size in shape:
            if size is None:
                reply, at = replies[at], at + 1
                failed = reply if isinstance(reply, Exception) else None
            else:
                reply, at = replies[at : at + size], at + size
                failed = next((r for r in reply if isinstance(r, Exception)), None)
            _advance(operations, i, reply, waiting, results, failed)
    return results


def _advance(
    operations: list[Op[Any]],
    i: int,
    reply: Any,
    waiting: dict[int, Any],
    results: list[Any],
    failed: Any = None,
) -> None:
    """Give operation i its reply (or throw its error into it); note its next request or its end."""
    try:
        request = (
            operations[i].throw(failed)
            if failed is not None
            else operations[i].send(reply)
        )
    except StopIteration as stop:
        results[i] = stop.value
        return
    except FOLLOW_UP_ERRORS as error:
        results[i] = error
        return
    except redis_lib.RedisError as error:
        results[i] = error
        return
    if not isinstance(request, Call | Eval | Pipeline) or (
        isinstance(request, Pipeline) and request.transaction
    ):
        results[i] = TypeError(
            f"a schedule's operation asked for {type(request).__name__}"
        )
        return
    waiting[i] = request

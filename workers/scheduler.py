"""The worker side of schedules: `Scheduler.fire_due`, which the sweeper thread of every worker calls
once a second (workers/wiring.py) and the `toolloop.sweep` task calls too.

Every worker fires: there is no lock to wait for, and the fence is per tick (the fire script,
workers/scripts/schedules.py). A sweep reads the due schedules (`tl:sched:due`, score <= now), works
out each one's tick (the latest due one: workers/schedules.py `latest_due`), its next tick and what
the catch-up policy says, and sends one script per schedule, pipelined (500 a round trip): for an
`Enqueue` target FIRE_ENQUEUE, which claims the tick and stores its run (its id derived from the
schedule and the tick) and sends the run's first step, all or nothing. Two sweepers that read the
same tick send the same claim; one finds the tick moved on (`taken`) and writes nothing.

A run a fire makes names the schedule and the tick in its `queued` event (`schedule`, `tick`) and in
its first step's label in Flower (`model 1 (schedule <id>)`); each fire is a span
`toolloop.schedule.fire` (when tracing is on), the parent of the run's trace; the worker's metrics
count `toolloop_schedule_fires_total{outcome}`.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

import redis as redis_lib
from opentelemetry import trace
from pydantic import ValidationError

from toolloop.journal import keys
from workers import ops, schedules
from workers.drive import SyncDriver
from workers.enqueue import Preparer
from workers.errors import WorkersError
from workers.ops import Batch, Eval
from workers.schedules import Enqueue, Schedule
from workers.scripts.schedules import FIRE, FIRE_ENQUEUE, parse_fire
from workers.settings import Settings

log = logging.getLogger("toolloop.workers")

FIRE_SPAN = "toolloop.schedule.fire"
NO_RUN = keys.schedule("-")
"""A key that never exists (no schedule id reads "-"): the busy check of a schedule with no run yet."""
HELD_RETRY_S = 1.0
"""How soon the sweeper looks again at a tick held for a busy target."""
BAD_DEF_RETRY_S = 60.0
_TRACER = trace.get_tracer("toolloop.workers.scheduler")


class Scheduler:
    """Fires the due schedules of one Redis. Owned by the thread that calls it (a worker's sweeper);
    it keeps the parsed definitions it has seen (a definition never changes under its id)."""

    def __init__(
        self,
        client: redis_lib.Redis,
        settings: Settings,
        metrics: Any = None,
        *,
        batch: int = 500,
        most: int = 20_000,
    ) -> None:
        self.redis = client
        self.settings = settings
        self.metrics = metrics
        self.batch = batch
        self.most = most
        """The most schedules one `fire_due` looks at (the rest: the next second's)."""
        self.driver = SyncDriver(client, client)
        db = int(client.connection_pool.connection_kwargs.get("db", 0))
        self.prepare = Preparer(settings, settings.toolset_names(), ops.Sender(db))
        self._defs: dict[str, tuple[str, Schedule]] = {}

    def fire_due(self, now: float | None = None) -> dict[str, int]:
        """Fire (or settle) every schedule due at `now`; counts by outcome ("fired", "skipped",
        "held", "missed", "failed", "taken" by another sweeper, "error": the script failed)."""
        now = time.time() if now is None else now
        due: list[str] = self.redis.zrangebyscore(keys.SCHEDULES_DUE, "-inf", now, start=0, num=self.most)  # type: ignore[assignment]
        done: Counter[str] = Counter()
        for first in range(0, len(due), self.batch):
            self._fire_some([str(sid) for sid in due[first : first + self.batch]], now, done)
        if self.metrics is not None and done:
            self.metrics.fires(done)
        return dict(done)

    def _fire_some(self, ids: list[str], now: float, done: Counter[str]) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for sid in ids:
            pipe.get(keys.schedule_def(sid))
            pipe.hmget(keys.schedule(sid), "next", "held", "last_run")
        read = pipe.execute()
        planned: list[tuple[str, Eval, Any]] = []
        for sid, raw, (nxt, held, last_run) in zip(ids, read[0::2], read[1::2], strict=True):
            plan = self._plan(sid, raw, nxt, held, last_run, now)
            if plan is not None:
                planned.append((sid, *plan))
        if not planned:
            return
        replies = self.driver.batch(Batch([request for _, request, _ in planned]))
        for (sid, _, span), reply in zip(planned, replies, strict=True):
            if isinstance(reply, Exception):
                done["error"] += 1
                log.warning("schedule %s: its fire failed: %s: %s", sid, type(reply).__name__, reply)
                span.set_attribute("toolloop.schedule.outcome", "error")
            else:
                fired = parse_fire(reply)
                done[fired.what] += 1
                span.set_attribute("toolloop.schedule.outcome", fired.what)
            span.end()

    def _schedule(self, sid: str, raw: str) -> Schedule | None:
        kept = self._defs.get(sid)
        if kept is not None and kept[0] == raw:
            return kept[1]
        try:
            schedule = schedules.SCHEDULE.validate_json(raw)
        except ValidationError as error:
            log.warning(
                "schedule %r skipped: its definition is not one toolloop wrote (%s)\n  Look at it "
                "(redis-cli HGETALL %s), then remove it: toolloop schedule remove %s",
                sid,
                error.errors()[0]["msg"],
                keys.schedule(sid),
                sid,
            )
            self.redis.zadd(keys.SCHEDULES_DUE, {sid: time.time() + BAD_DEF_RETRY_S}, xx=True)
            return None
        if len(self._defs) > 200_000:
            self._defs.clear()
        self._defs[sid] = (raw, schedule)
        return schedule

    def _plan(
        self, sid: str, raw: str | None, nxt: str | None, held: str | None, last_run: str | None, now: float
    ) -> tuple[Eval, Any] | None:
        """The fire script of one due schedule and its span; None when there is nothing to send."""
        if raw is None:  # removed meanwhile: its index entry goes too
            self.redis.zrem(keys.SCHEDULES_DUE, sid)
            return None
        schedule = self._schedule(sid, raw)
        if schedule is None:
            return None
        trigger = schedule.trigger
        if nxt and float(nxt) <= now:
            field, read = "next", nxt
            tick, missed = schedules.latest_due(trigger, float(nxt), now)
            after = schedules.tick_after(trigger, max(tick, now))
            late = now - tick > schedule.grace_s
            wanted = "miss" if late and schedule.catch_up == "skip" else "fire"
        elif held:
            field, read, tick, missed, after, wanted = "held", held, float(held), 0, None, "fire"
        else:  # the index is ahead of the hash (a fire settled it meanwhile): put it right
            score = float(nxt) if nxt else None
            if score is None:
                self.redis.zrem(keys.SCHEDULES_DUE, sid)
            else:
                self.redis.zadd(keys.SCHEDULES_DUE, {sid: score})
            return None
        target = schedule.target
        busy_key = keys.state(last_run) if last_run else NO_RUN
        claim = [
            sid,
            field,
            read,
            now,
            "" if after is None else repr(after),
            missed,
            wanted,
            schedule.if_busy,
            "",
            "",
            now + HELD_RETRY_S,
            "unended",
            repr(tick),
        ]
        span = _TRACER.start_span(
            FIRE_SPAN, attributes={"toolloop.schedule.id": sid, "toolloop.schedule.tick": tick}
        )
        if wanted == "fire" and isinstance(target, Enqueue):
            try:
                with trace.use_span(span, end_on_exit=False):  # the run's trace is the fire's
                    made = self.prepare(
                        target.spec,
                        schedules.fire_key(sid, tick),
                        run_prefix=target.run_prefix,
                        fired={"schedule": sid, "tick": tick},
                    )
            except (WorkersError, ValidationError, ValueError) as error:  # refused now (a toolset gone)
                first = str(error).splitlines()[0][:300]
                claim[6], claim[9] = "fail", first
                log.warning("schedule %s: tick %s not fired: %s", sid, schedules.iso(tick), first)
            else:
                claim[8] = made.run_id
                span.set_attribute("toolloop.run_id", made.run_id)
                request = made.request
                return Eval(
                    FIRE_ENQUEUE,
                    [*request.keys, keys.schedule(sid), keys.SCHEDULES_DUE, busy_key],
                    [*request.args, *claim],
                ), span
        elif wanted == "fire":  # a follow-up: not in this build (refused when added, too)
            claim[6], claim[9] = "fail", "follow-up schedules need Client.send, which this build lacks"
        return Eval(FIRE, [keys.schedule(sid), keys.SCHEDULES_DUE, busy_key], claim), span

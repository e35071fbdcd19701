"""`Client`: what a web backend imports to start, watch, answer, cancel and retry durable runs.

    client = Client()                      # REDIS_URL and TOOLLOOP_TOOLSETS, as the workers have them
    run_id = client.enqueue({"model": "claude-sonnet-5-5", "system": "...", "toolset": "review",
                             "messages": [{"role": "user", "content": "Review the storyboard."}]},
                            idempotency_key="order-1234")  # a retry with this key makes no second run
    for event in client.events(run_id, follow=True):
        print(event.seq, event.kind)
    client.wait(run_id, timeout=60)

Every method takes a run id; an unknown one raises `RunNotFoundError`. The client knows the
registered toolsets by name only (TOOLLOOP_TOOLSETS, or `toolsets=`): it never imports one.
Each method is an operation of workers/client/ops.py (pure request/reply) run by `SyncDriver`; an enqueue
is one round trip (workers/client/enqueue.py). `AsyncClient` (workers/client/aio.py) runs the same
operations on redis.asyncio. No Celery app is built unless `celery` is read.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from toolloop import redisurl
from toolloop.contract import ChatMessage
from toolloop.defaults import no_redis_message
from toolloop.loop.types import Decision
from workers.client import accounts, enqueue, ops, runlist, schedules, talk
from workers.client.drive import SyncDriver
from workers.client.limits import check_answer, check_decision
from workers.config.settings import Settings
from workers.protocol.errors import NoRedisError
from workers.protocol.records import DecisionState, RunEventRecord, RunNode, RunStatus
from workers.protocol.schedules import ScheduleInfo
from workers.protocol.spec import RunSpec

if TYPE_CHECKING:
    from celery import Celery


def settings_for(redis_url: str | None) -> Settings:
    """The settings of a client: `redis_url` when given, else the rule of `Client.__init__`."""
    settings = Settings.from_env()
    if redis_url:
        return dataclasses.replace(
            settings, redis_url=redis_url, redis_source="redis_url="
        )
    if not settings.redis_source:
        raise NoRedisError(no_redis_message())
    return settings


class Client:
    def __init__(
        self,
        redis_url: str | None = None,
        *,
        toolsets: Iterable[str] | None = None,
        run_prefix: str = "",
    ) -> None:
        """`redis_url`: when None, REDIS_URL, else the embedded server of $TOOLLOOP_HOME or ./.toolloop
        when it runs (the rule of the CLI and the workers, `toolloop.defaults.find_redis_url`), else
        `NoRedisError`. `toolsets`: the names of the registered toolsets, read
        from TOOLLOOP_TOOLSETS (names only) when None. `run_prefix`: put before every new run id
        (a shard's `s<k>-`: workers/client/shards.py)."""
        self.settings = settings = settings_for(redis_url)
        self.toolsets = sorted(
            settings.toolset_names() if toolsets is None else toolsets
        )
        self._watcher = redisurl.watcher(settings.redis_url)
        self.redis = redisurl.sync_client(
            settings.redis_url, decode_responses=True, watcher=self._watcher
        )
        self._blocking = redisurl.sync_client(
            settings.redis_url,
            decode_responses=True,
            socket_timeout=None,
            watcher=self._watcher,
        )
        self._driver = SyncDriver(
            self.redis,
            self._blocking,
            wait=(settings.commit_wait, settings.commit_wait_ms),
        )
        self._flow = (
            redisurl.sync_client(settings.flow_redis_url, decode_responses=True)
            if settings.flow_redis_url
            else self.redis
        )
        """The Redis of accounts (TOOLLOOP_FLOW_REDIS_URL, else REDIS_URL's)."""
        self._sender = ops.Sender(
            int(self.redis.connection_pool.connection_kwargs.get("db", 0))
        )
        self._prepare = enqueue.Preparer(
            settings, self.toolsets, self._sender, run_prefix=run_prefix
        )
        self.catalog = self._prepare.catalog
        """The model catalogue in force (TOOLLOOP_MODELS laid over the built-in rows), read once."""

    @functools.cached_property
    def celery(self) -> Celery:
        """A Celery app on the same Redis (for `control.inspect` and the like), made when first read:
        the client's own calls need none."""
        from workers.config.celery import (
            make_app,  # Celery is loaded only here: a web backend's Client needs none
        )

        return make_app(self.settings)

    def close(self) -> None:
        """Release the Redis connections (and the broker connection pool, when `celery` was used)."""
        self.redis.close()
        self._blocking.close()
        if self._flow is not self.redis:
            self._flow.close()
        if self._watcher is not None:
            self._watcher.close()
        if "celery" in self.__dict__:
            self.celery.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- start ------------------------------------------------------------------------------------

    def enqueue(
        self, spec: RunSpec | dict[str, Any], *, idempotency_key: str | None = None
    ) -> str:
        """Validate `spec` (pydantic.ValidationError when bad; ToolsetError for a toolset that is not
        registered, nothing imported; LimitError over a limit), store the run and send its first
        step, in one round trip (one script: workers/client/enqueue.py). Returns the run id. With
        `idempotency_key`, enqueueing again with the same key returns the same run id and makes no
        second run (the first spec wins). Redis refusing or losing the write is an `EnqueueError`
        that says what to do; nothing half-written stays behind."""
        made = self._prepare(spec, idempotency_key)
        try:
            self._driver.do(made.request)
        except enqueue.REDIS_ERRORS as error:
            raise enqueue.failure(error, idempotency_key is not None) from None
        return made.run_id

    def enqueue_many(
        self,
        specs: Sequence[RunSpec | dict[str, Any]],
        *,
        idempotency_keys: Sequence[str | None] | None = None,
    ) -> list[str]:
        """`enqueue` for a batch, in one round trip (a pipeline of the same scripts): the run ids, in
        order. Every spec is checked before anything is sent (the first bad one raises, nothing is
        stored); `idempotency_keys`, when given, has one key (or None) per spec. A Redis error that
        hit some runs only is an EnqueueError with `stored=None`: send the batch again with keys."""
        made = enqueue.prepare_all(self._prepare, specs, idempotency_keys)
        try:
            replies = self._driver.batch(ops.Pipeline([m.request for m in made]))
        except enqueue.REDIS_ERRORS as error:
            raise enqueue.failure(error, idempotency_keys is not None) from None
        return enqueue.batch_result(made, replies, idempotency_keys is not None)

    # -- schedules (docs/schedules.md) ------------------------------------------------------------

    def schedule(
        self,
        spec: RunSpec | dict[str, Any] | None = None,
        *,
        cron: str | None = None,
        every_s: float | None = None,
        at: float | datetime | None = None,
        timezone: str = "UTC",
        start: float | None = None,
        send_to: str | None = None,
        content: str | None = None,
        if_busy: str = "skip",
        catch_up: str = "latest",
        grace_s: float = 60.0,
        name: str = "",
        idempotency_key: str | None = None,
        add_budget_usd: float = 0.0,
        add_max_steps: int = 0,
    ) -> str:
        """Add a schedule; its id. One trigger: `cron` (5 fields, or 6 with seconds first, in
        `timezone`), `every_s` (from `start`, default now + every_s) or `at` (unix seconds or an aware
        datetime). One target: `spec`, a run to enqueue at each tick (checked now exactly as
        `enqueue` checks it: ValidationError, ToolsetError, LimitError), or `send_to` a run with
        `content` (a follow-up: `Client.send` at each tick, keyed by the schedule and the tick, its
        budget and step limit topped up by `add_budget_usd` and `add_max_steps`). `if_busy`: "skip",
        "queue" or "steer" (follow-ups: `Client.steer` while the run is queued or running) while the
        target is busy; `catch_up`: "latest" or "skip" for ticks missed past `grace_s`. With
        `idempotency_key`, adding again returns the same id and changes nothing. ScheduleError
        (two lines) for anything bad; nothing is stored then."""
        request = schedules.Request(
            spec,
            cron,
            every_s,
            at,
            timezone,
            start,
            send_to,
            content,
            if_busy,
            catch_up,
            grace_s,
            name,
            idempotency_key,
            add_budget_usd,
            add_max_steps,
        )
        made, first = schedules.build(request, self._prepare)
        return self._driver.run(schedules.add(made, first, send_to))

    def get_schedule(self, schedule_id: str) -> ScheduleInfo:
        """The schedule and where it stands (next tick, counts, its last fire); ScheduleNotFoundError."""
        return self._driver.run(schedules.get(schedule_id))

    def list_schedules(self, *, limit: int = 1000) -> list[ScheduleInfo]:
        """Schedules, newest first (at most `limit`)."""
        return self._driver.run(schedules.listing(limit))

    def remove_schedule(self, schedule_id: str) -> None:
        """Remove the schedule: no tick fires after this returns (the runs it made stay);
        ScheduleNotFoundError."""
        self._driver.run(schedules.remove(schedule_id))

    # -- read -------------------------------------------------------------------------------------

    def status(self, run_id: str) -> RunStatus:
        return self._driver.run(ops.status(run_id))

    def history(self, run_id: str) -> list[ChatMessage]:
        """The run's conversation: its last segment's messages (the input while nothing ran yet)."""
        return self._driver.run(ops.history(run_id))

    def images(self, run_id: str) -> list[ops.RunImage]:
        """The images of the run's conversation, each with `supplied` (the run's spec gave it) or not
        (a tool result produced it): what a viewer may serve (examples/web.py)."""
        return self._driver.run(ops.images(run_id))

    def events(
        self,
        run_id: str,
        after: str | None = None,
        block_ms: int | None = None,
        follow: bool = False,
        *,
        deltas: bool = True,
    ) -> Iterator[RunEventRecord]:
        """The run's events after stream id `after` (from the start when None), each with its stream
        `id`: pass the last one as `after` to read on from there. `block_ms` waits that long for new
        ones when there are none; `follow` keeps reading until the run's terminal event (`finished`,
        or `failed`) has been yielded. A streaming run (RunSpec.stream) has `delta` and `discarded`
        entries among them (seq None; docs/streaming.md); `deltas=False` skips those."""
        return self._driver.stream(ops.events(run_id, after, block_ms, follow, deltas))

    def wait(
        self, run_id: str, timeout: float = 60.0, *, poll_s: float = 0.05
    ) -> RunStatus:
        """The status once the run has ended, or parked on a question that no sent answer or cancel is
        on its way to; TimeoutError after `timeout` s."""
        return self._driver.run(ops.wait(run_id, timeout, poll_s))

    # -- act --------------------------------------------------------------------------------------

    def answer(self, run_id: str, content: str, *, segment: int | None = None) -> str:
        """Answer the run's question (the one it holds, or the next one it asks when it has not parked
        yet). The first answer sent to a question wins; later ones are ignored (nothing is sent).
        Pass the `segment` of the status that showed the question to make a late duplicate (sent
        after the run resumed) count as a duplicate rather than as an early answer to the next
        question. A run that has child runs passes the answer to the first of its descendants that
        asks, if one does (docs/children.md). Returns the answer id."""
        check_answer(content, self.settings)
        return self._driver.run(ops.answer(self._sender, run_id, content, segment))

    def send(
        self,
        run_id: str,
        content: str,
        *,
        idempotency_key: str | None = None,
        add_budget_usd: float = 0.0,
        add_max_steps: int = 0,
    ) -> talk.Sent:
        """A follow-up (SPEC 6.1, docs/conversations.md): the person's next message. A run that ended
        `done` (or `interrupted`) goes on as its next segment, with its whole history, its prompt
        cache and its journal; a run parked on its question takes it as the answer. The run's budget
        and step limit grow by `add_budget_usd` and `add_max_steps` (its spend and steps so far
        carry over). Any other run refuses it (`RunStateError`: queued or running, steer it; budget,
        steps, cancel, refused, failed, expired: nothing continues). With `idempotency_key`, a send
        repeated with the same key returns the first one's `Sent` and does nothing. ValueError for
        an empty text or a bad top-up, LimitError over TOOLLOOP_MAX_ANSWER_BYTES."""
        talk.check_content(content, self.settings.max_answer_bytes, "follow-up")
        op = talk.send(
            self._sender,
            run_id,
            content,
            idempotency_key=idempotency_key,
            add_budget_usd=add_budget_usd,
            add_max_steps=add_max_steps,
        )
        return self._driver.run(op)

    def steer(self, run_id: str, content: str, *, steer_id: str | None = None) -> str:
        """Steer a running run (SPEC 6.1): it reads `content` as a user message at its next step
        boundary, exactly once (journal step `steer:<id>`), placed after the last complete turn.
        Returns the steer id (`steer_id`, 1-64 of [A-Za-z0-9_-], when given: one the run holds or
        took in this segment already is refused). A run that is not queued or running refuses it
        (`RunStateError`)."""
        talk.check_content(content, self.settings.max_answer_bytes, "steer")
        return self._driver.run(talk.steer(run_id, content, steer_id))

    def interrupt(self, run_id: str) -> None:
        """Stop the run's model call (or tool) in flight, as a cancel does, keep its journal, and leave
        it `interrupted`: waiting for a follow-up (`send`) to continue. Only a queued or running run
        can be interrupted (`RunStateError`)."""
        self._driver.run(talk.interrupt(run_id))

    def approve(
        self,
        run_id: str,
        call_id: str,
        *,
        digest: str | None = None,
        actor: str | None = None,
        wait_s: float = 10.0,
    ) -> str:
        """Approve the held call `call_id`: the tool runs with its input. See `decide`."""
        return self.decide(
            run_id,
            call_id,
            Decision(action="approve", input_digest=digest, actor=actor),
            wait_s,
        )

    def reject(
        self,
        run_id: str,
        call_id: str,
        reason: str,
        *,
        digest: str | None = None,
        actor: str | None = None,
        wait_s: float = 10.0,
    ) -> str:
        """Reject the held call: the model reads `Rejected by the person: <reason>.`. See `decide`."""
        decision = Decision(
            action="reject", reason=reason, input_digest=digest, actor=actor
        )
        return self.decide(run_id, call_id, decision, wait_s)

    def edit(
        self,
        run_id: str,
        call_id: str,
        input: dict[str, Any],
        *,
        digest: str | None = None,
        actor: str | None = None,
        wait_s: float = 10.0,
    ) -> str:
        """Run the held call with `input` instead (checked against the tool's schema by a worker; a
        bad edit raises ApprovalError with the validation message and the call still waits)."""
        decision = Decision(
            action="edit", input=input, input_digest=digest, actor=actor
        )
        return self.decide(run_id, call_id, decision, wait_s)

    def decide(
        self, run_id: str, call_id: str, decision: Decision, wait_s: float = 10.0
    ) -> str:
        """Send a decision on a held call over the control queue and wait up to `wait_s` for a
        worker to apply it. Returns "resumed" (every held call decided: the run goes on), "recorded"
        (other calls still wait), "kept" (the run has not parked yet: the decision waits for it) or
        "queued" (no worker runs, or none applied it within `wait_s`: it is stored and applied when
        one runs; `decision(run_id, call_id)` reads its outcome later). A decided call leaves
        `status().approvals` at once. `digest` binds the decision to the input you saw
        (`status().approvals[i]["input_digest"]`). Raises `AlreadyDecidedError` (an ApprovalError)
        when the call has a decision already, recorded or queued (the first one sent wins; nothing is
        sent), ApprovalError when refused (another input, a bad edit, a call the run does not hold,
        past its deadline, an ended run), RunNotFoundError; LimitError past the limits of a decision
        or of the decisions waiting for a worker (TOOLLOOP_MAX_EARLY_DECISIONS)."""
        check_decision(call_id, decision, self.settings)
        waiting = self.settings.max_early_decisions
        return self._driver.run(
            ops.decide(self._sender, run_id, call_id, decision, wait_s, waiting)
        )

    def decision(self, run_id: str, call_id: str) -> DecisionState:
        """Where the decision on call `call_id` stands: `state` is "pending", "queued" (sent, applied
        when a worker runs), "decided" (`action`, `actor`, `reason`, `input`), "expired" (its deadline
        gave it its default) or "refused" (`why`; the call still waits). ApprovalError for a call the
        run neither holds nor has a decision on."""
        return self._driver.run(ops.decision(run_id, call_id))

    def decisions(self, run_id: str) -> dict[str, DecisionState]:
        """`decision` for every call the run holds or has a decision on, by call id."""
        return self._driver.run(ops.decisions(run_id))

    def cancel(self, run_id: str) -> None:
        """Stop the run: its live step is aborted where it runs, open calls are answered
        `Not run: cancel.`, and it ends with status "cancel". Every run it spawned is cancelled with it
        (docs/children.md). Survives worker restarts. A run that has ended already raises `RunStateError`."""
        self._driver.run(ops.cancel(self._sender, run_id))

    def tree(self, run_id: str, *, most: int = 1000) -> list[RunNode]:
        """The run and the child runs it spawned, and theirs, breadth first (each after its parent),
        at most `most` of them (docs/children.md)."""
        return self._driver.run(ops.tree(run_id, most))

    def retry(self, run_id: str) -> None:
        """Run a failed run again from its journal: finished steps replay, the failed one runs again."""
        self._driver.run(ops.retry(self._sender, run_id))

    def list_runs(
        self, *, status: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> runlist.RunPage:
        """Runs newest first, `limit` per page; `status` keeps one status ("asked", "failed", ...);
        pass the page's `next` as `cursor` for the following page (None on the last). Finished runs
        leave the listing when their retention ends (TOOLLOOP_RETENTION)."""
        return self._driver.run(runlist.page(status=status, limit=limit, cursor=cursor))

    def prune(self, older_than: float | None = None) -> runlist.Pruned:
        """Delete the finished runs that ended more than `older_than` s ago (default: the retention)
        and drop expired runs from the index. Parked and running runs are never touched."""
        age = self.settings.retention if older_than is None else older_than
        return runlist.prune(self.redis, age)

    def add_spend(self, run_id: str, usd: float) -> float:
        """Bill `usd` of outside spend (child work, services) to the run's budget; the new total."""
        return self._driver.run(ops.add_spend(run_id, usd))

    def set_account_limit(
        self, account: str, usd: float, *, period: str = "day", finish_at: float = 0.9
    ) -> None:
        """Limit what the runs naming `account` (RunSpec.account) spend together: `usd` per `period`
        ("day", "month" or "total", UTC). At `finish_at` of it their model calls carry the run's
        finish_note; past it their steps stop the run `budget` (docs/flow-control.md)."""
        accounts.set_limit(self._flow, account, usd, period, finish_at)

    def accounts(self) -> list[accounts.AccountSpend]:
        """Every account with a limit: spend in its current period, and what is reserved now."""
        return accounts.spend(self._flow, time.time())

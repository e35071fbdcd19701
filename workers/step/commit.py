"""The commit of a step (`StepCommit`, which workers/step/advance.py calls) and what follows it: the
successor's send, its events.

One script (RUN_COMMIT) writes the step's value, the events not yet in the stream, and what follows:
the successor in the outbox (routed by the next step's kind, workers/step/routing.py), or the run's
final state, or its park. When the successor runs in this process's step consumer and the run's
loop is paused here, the same script begins it (`go_on`): the successor's delivery is recorded and
the lease handed over, with no RUN_BEGIN. A commit Redis refuses (OOM) or cannot take (a lost
connection) is retried with backoff while no other copy took the step (the commit is fenced: it
lands only while the run's fence is still the step's token), within the step timeout. The successor
is sent the same way with or without hooks installed; the hooks only watch (workers/observe/hooks.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from typing import Any

import redis as redis_lib

from toolloop.loop.types import AccountLimit, BudgetEvent, LoopEvent, RunToolLoopResult
from workers.client import runlist
from workers.config.settings import Settings
from workers.observe.metrics import Metrics
from workers.observe.tracing import StepTrace
from workers.process.leases import Held
from workers.process.live import Begun, LiveLoop
from workers.process.redisio import Batch
from workers.process.segment import SegmentJournal
from workers.process.worker_process import WorkerProcess
from workers.protocol import keys, names, wire
from workers.protocol.errors import OOM_HINT, REDIS_LOST
from workers.protocol.scripts.commit import (
    RUN_COMMIT,
    Commit,
    CommitOutcome,
    Committed,
    GoOn,
    StepOutcome,
    parse_commit,
)
from workers.protocol.spec import RunSpec
from workers.runs import approvals
from workers.runs.lifecycle import flush_outbox
from workers.step import children, routing
from workers.step.begin import BegunStep
from workers.step.mcptasks import cancel_open

log = logging.getLogger("toolloop.workers")


class StepCommit:
    """The commit of one step, which the step (workers/step/advance.py) calls: what to commit (the next
    step, the run's end, a park, a failure), the commit script with its retries, and what follows it
    (the successor's send, its events). It reads the step's begun value (`at`), its lease (`held`),
    its trace, and the run's loop once the step has one (`use`); what it tells the step back is in
    `kept`, `stopped`, `failure` and `outcome`."""

    def __init__(
        self,
        process: WorkerProcess,
        task: Any,
        at: BegunStep,
        held: Held | None,
        trace: StepTrace | None,
        started: float,
    ) -> None:
        self.process = process
        self.batch: Batch = process.batch
        self.settings: Settings = process.settings
        self.metrics: Metrics | None = process.metrics
        self.task = task
        self.at = at
        self.run_id = at.run_id
        self.n = at.n
        self.held = held
        self.trace = trace
        self.started = started
        self.live: LiveLoop | None = None
        """The run's loop, once the step has one (`use`)."""
        self.spec: RunSpec | None = None
        """The run's spec: the step's, or read at the commit on a kept loop's path (`run_spec`)."""
        self.replayed_before = 0
        """The journal's replayed steps when this step took the loop (a kept loop replayed before)."""
        self.kept = False
        """True once `live` was kept for the run's next step (it then outlives this step)."""
        self.stopped: str | None = None
        """How the run stopped when this step ended it (`refused (cyber)`), for the task's result."""
        self.failure: tuple[str, str] | None = None
        """(error class, message) when this step ended its run `failed`."""
        self.outcome: StepOutcome | None = None
        """What the landed commit did, for the step's trace (set only with metrics)."""
        self.compacted: str | None = None
        """The compaction state a park or a stop of this step hands to the next segment (JSON)."""

    def use(self, live: LiveLoop, spec: RunSpec | None, replayed_before: int) -> None:
        """The step has the run's loop: commit from it."""
        self.live, self.spec, self.replayed_before = live, spec, replayed_before

    @property
    def state(self) -> dict[str, str]:
        """The run's state as the step began (never written here)."""
        return self.at.state

    @property
    def segment(self) -> int:
        return self.at.segment

    @property
    def events(self) -> list[LoopEvent]:
        return self.live.events if self.live is not None else []

    @property
    def journal(self) -> SegmentJournal:
        assert self.live is not None
        return self.live.journal

    # -- what to commit -------------------------------------------------------------------------

    async def commit_next(self, next_key: str) -> StepOutcome:
        queue = routing.route(self.live, next_key)
        return await self.commit(
            "next", queue=queue, state=self.totals(), next_key=next_key
        )

    async def commit_result(self, result: RunToolLoopResult) -> StepOutcome:
        history = json.dumps([m.model_dump(mode="json") for m in result.messages])
        # the compaction in force at the segment's end: the next segment starts from it
        self.compacted = (
            result.compacted.model_dump_json() if result.compacted is not None else None
        )
        steps = self.at.steps_base + result.steps
        state: dict[str, Any] = {
            "spent_usd": result.spent_usd,
            "steps": steps,
            "final_text": result.final_text or "",
        }
        if result.stopped_by == "asked":
            asked = result.asked.input if result.asked else {}
            state |= {
                "asked": json.dumps(asked),
                "carried_usd": result.spent_usd,
                "spend_base": self.at.outside,
                "steps_base": steps,
            }
            parked = json.dumps(
                {"asked": asked, "spent_usd": result.spent_usd, "steps": steps}
            )
            spec = self.run_spec()
            due: float | None = None
            if spec is not None and spec.ask_timeout_s is not None:
                due = time.time() + spec.ask_timeout_s
                state |= {
                    "ask_deadline": repr(due),
                    "ask_default": spec.ask_default or "",
                }
            return await self.commit(
                "park", state=state, history=history, parked=parked, due=due
            )
        if result.stopped_by == "approval":
            return await self.park_for_approval(result, state, history, steps)
        stopped_by = interrupted_or(result.stopped_by, self.live)
        state |= {"status": stopped_by, "spend_end": self.at.outside}
        if (
            result.stopped_by == "cancel"
        ):  # a cancel or an interrupt: the MCP tasks its waits left open
            await cancel_open(self.process, self.run_id)  # (workers/step/mcptasks.py)
        final: dict[str, Any] = {
            "stopped_by": stopped_by,
            "final_text": result.final_text,
            "spent_usd": result.spent_usd,
            "steps": steps,
        }
        self.stopped = stopped_by
        if result.refusal is not None:
            state["refusal"] = result.refusal.model_dump_json()
            final["refusal"] = result.refusal.model_dump(mode="json")
            self.stopped += f" ({result.refusal.category or 'no category'})"
        account = self.account_stop() if result.stopped_by == "budget" else None
        if (
            account is not None
        ):  # the account's limit stopped it, not the run's: say which and how
            state["account_stop"] = account.model_dump_json()
            final["account"] = account.model_dump(mode="json")
            self.stopped += f" (account {account.name})"
        return await self.commit(
            "stop",
            state=state,
            history=history,
            final=("finished", json.dumps(final)),
            steerable=self.steerable(result),
        )

    def steerable(self, result: RunToolLoopResult) -> bool:
        """Whether a `done` stop may go on for a steer that waits (RUN_COMMIT's `steerable`): only
        while a model call could follow (steps left), so a held stop always leads to a model call."""
        live = self.live
        return (
            result.stopped_by == "done"
            and live is not None
            and result.steps < live.max_steps
        )

    def account_stop(self) -> AccountLimit | None:
        """The shared account whose limit stopped the run in this step (its `budget` stop event's)."""
        committed = int(self.state.get(f"events:{self.segment}", 0))
        fresh = self.live.events_past(committed) if self.live is not None else []
        stops = [
            e.account
            for e in fresh
            if isinstance(e, BudgetEvent) and e.account is not None
        ]
        return stops[-1] if stops else None

    def run_spec(self) -> RunSpec | None:
        """The run's spec (None on a kept loop's path, which did not load it: read it then)."""
        spec = self.spec
        if spec is None and self.live is not None:
            raw = self.process.redis.get(keys.spec(self.run_id))
            spec = RunSpec.model_validate_json(str(raw)) if raw else None
            self.spec = spec
        return spec

    async def park_for_approval(
        self, result: RunToolLoopResult, state: dict[str, Any], history: str, steps: int
    ) -> StepOutcome:
        """Park with the held calls (status "asked", state `approvals`), an `approval_requested`
        event each; then apply decisions sent before the park (settle)."""
        spec = self.run_spec()
        assert spec is not None and self.live is not None
        held = approvals.pending_approvals(
            result.approvals or [], self.live.tools, spec, time.time()
        )
        state |= {
            "approvals": json.dumps(held),
            "carried_usd": result.spent_usd,
            "spend_base": self.at.outside,
            "steps_base": steps,
        }
        parked = json.dumps(
            {"approvals": held, "spent_usd": result.spent_usd, "steps": steps}
        )
        requested = [
            json.dumps(
                {
                    k: h[k]
                    for k in (
                        "call_id",
                        "name",
                        "input",
                        "input_digest",
                        "estimate_usd",
                        "deadline",
                    )
                }
            )
            for h in held
        ]
        deadlines = [h["deadline"] for h in held if h["deadline"] is not None]
        # the sweeper looks at once: decisions sent early apply
        due = min([time.time(), *deadlines])
        outcome = await self.commit(
            "park",
            state=state,
            history=history,
            parked=parked,
            requested=requested,
            due=due,
        )
        if outcome == "park":
            await asyncio.to_thread(
                approvals.settle,
                self.process.redis,
                self.process.celery,
                self.run_id,
                self.settings.retention,
            )
        return outcome

    async def commit_failure(self, error: BaseException) -> StepOutcome:
        log.warning(
            "run %s failed at commit %s: %s: %s",
            self.run_id,
            self.n,
            type(error).__name__,
            error,
        )
        message = str(error)
        self.failure = (type(error).__name__, message)
        state = {
            "status": "failed",
            "error_class": type(error).__name__,
            "error_message": message,
        }
        data = json.dumps(
            {"error_class": type(error).__name__, "error_message": message}
        )
        return await self.commit("fail", state=state, final=("failed", data))

    # -- the commit script ----------------------------------------------------------------------

    async def commit(
        self,
        outcome: CommitOutcome,
        *,
        state: dict[str, Any],
        next_key: str | None = None,
        queue: str = names.LLM,
        history: str | None = None,
        final: tuple[str, str] | None = None,
        parked: str | None = None,
        requested: list[str] | None = None,
        due: float | None = None,
        steerable: bool = False,
    ) -> StepOutcome:
        pending = self.live.journal.pending if self.live is not None else []
        field, value = (pending[0][0], pending[0][1]) if pending else ("", "")
        cost = pending[0][2] if pending else 0.0
        committed = int(self.state.get(f"events:{self.segment}", 0))
        successor, go_on = self._go_on(outcome, queue, next_key)
        part = children.commit_part(self, outcome, next_key, state)
        if part is not None and part.wait_open is not None:
            # the run may park waiting on its children: nothing runs here
            successor, go_on = (
                None,
                None,
            )
        streamed = ""
        if self.live and self.live.deltas:
            streamed = self.live.deltas.settle()
            await self.live.deltas.landed()  # its deltas before its commit's events
        payload = Commit(
            token=self.at.token,
            lease=self.at.lease,
            n=self.n,
            segment=self.segment,
            run=self.run_id,
            outcome=outcome,
            now=time.time(),
            field=field,
            value=value,
            queue=queue,
            state=self._state(state),
            events=self._fresh_events(committed),
            history=history,
            final=final,
            parked=parked,
            requested=requested or [],
            due=due,
            go_on=go_on,
            streamed=streamed,
            steerable=steerable,
            children=part,
            compacted=self.compacted if outcome in ("park", "stop") else None,
        )
        where = self.at.prefix + (field or "-")
        r = self.run_id
        self.process.hooks.point("commit:before", run=r, key=where)
        sent_at = time.monotonic()
        reply = await self._run_commit(payload, where, cost)
        if reply.begun is None:  # a retried commit (go_on dropped) sends its successor
            successor = None
        if not reply.landed:
            log.info(
                "run %s: commit %s fenced (another copy holds the run); re-driving",
                r,
                self.n,
            )
            return "fenced"
        self.process.hooks.point("commit:after", run=r, key=where)
        if (
            outcome == "stop" and reply.member
        ):  # a steer waited: the run goes on to take it (RUN_COMMIT)
            outcome, next_key, self.stopped = "next", "steer:", None
        if (
            self.metrics is not None
        ):  # a spawn wait's cost is its children's, counted as they spent
            spent_here = 0.0 if children.collects(self.live, field) else cost
            self.count_commit(
                outcome, field, spent_here, committed, state.get("status")
            )
        live = self.live
        if live is not None:
            live.committed_events()  # before the successor may resume the loop (go_on)
        here = self.process.consumer
        if (
            reply.begun
            and go_on
            and successor is not None
            and live is not None
            and here is not None
        ):
            live.tag = reply.begun.tag  # the run's tag now
            self.kept = True
            here.run_begun(
                queue, successor, Begun(go_on.owner, reply.begun, live, sent_at)
            )
            await self.publish(
                None,
                successor=(queue, successor),
                key=where,
                phase=outcome,
                next=next_key,
            )
            return outcome
        # our value is the one stored: the loop is current
        fresh = not field or reply.stored == value
        if outcome == "next" and fresh and live is not None and live.keepable():
            live.tag = f"{self.at.lease}|{self.segment}"  # the run's tag now (RUN_BEGIN of the next step)
            self.process.kept.keep(r, live)
            self.kept = True
        await self.publish(reply.member, key=where, phase=outcome, next=next_key)
        return self._settled(reply, outcome)

    def _settled(self, reply: Committed, outcome: CommitOutcome) -> StepOutcome:
        """After a landed commit was published: the parent a child's end woke, a park `waiting` on
        children, or the retention an ended run starts."""
        if reply.woke is not None:
            children.wake_parent(self, reply.woke)
        if reply.waiting:
            return "wait"
        if outcome in ("stop", "fail"):
            self.batch.send("ZREM", keys.LIVE_RUNS, self.run_id)
            for command in runlist.expire_commands(
                self.run_id, self.segment, self.settings.retention
            ):
                # retention starts (a lost EXPIRE: `toolloop prune`)
                self.batch.send(*command)
        return outcome

    def _state(self, state: dict[str, Any]) -> dict[str, str]:
        """The state fields a commit sets, as text (with the segment's trace record:
        workers/observe/tracing.py)."""
        trace = self.trace
        if (
            trace is not None
        ):  # the segment's start, at its first commit (workers/observe/tracing.py)
            state = {**state, **trace.record()}
        return {k: str(v) for k, v in state.items()}

    def _fresh_events(self, committed: int) -> list[tuple[int, str, str]]:
        """(index, kind, data) of the segment's loop events past the `committed` first."""
        fresh = self.live.events_past(committed) if self.live is not None else []
        return [
            (committed + i + 1, event.kind, event.model_dump_json())
            for i, event in enumerate(fresh)
        ]

    def _go_on(
        self, outcome: CommitOutcome, queue: str, next_key: str | None
    ) -> tuple[wire.Delivery | None, GoOn | None]:
        """When the successor can run here on the paused loop, the commit begins it (`go_on`: its
        delivery record and its lease): its message and that `GoOn`, else (None, None)."""
        live, here = self.live, self.process.consumer
        if (
            outcome != "next"
            or live is None
            or not live.keepable()
            or here is None
            or not here.can_go_on(queue)
        ):
            return None, None
        successor = wire.task_message(
            names.ADVANCE,
            [self.run_id, self.n + 1],
            names.step_id(self.run_id, self.n + 1),
            queue,
            routing.describe(live, next_key or "", self.at.steps_base),
            traceparent=self.run_traceparent(),
            tag=self.process.new_owner(),
        )
        go_on = GoOn(
            self.process.new_owner(),
            self.settings.lease_ms,
            successor.tag,
            wire.unacked_value(successor.raw, queue),
        )
        return successor, go_on

    async def _run_commit(self, payload: Commit, where: str, cost: float) -> Committed:
        """RUN_COMMIT, retried with backoff while the lease holds when Redis refuses it (OOM), the
        connection drops or the WAIT is not confirmed. A retry drops `go_on` (it sends the successor)
        and names its owner (`went_on`): when the first attempt did land (its reply lost), its `begun`
        comes back and the successor runs here, instead of the retry finding the fence moved by its own
        begin and leaving the run to the visibility timeout."""
        r = self.run_id
        attempt = 0
        past = False  # the lease's deadline passed while the commit was retried (said once)
        while True:
            try:
                reply = await self.batch.script(
                    RUN_COMMIT,
                    [
                        keys.state(r),
                        keys.fence(r),
                        keys.lease(r),
                        keys.events(r),
                        keys.outbox(r),
                        keys.history(r),
                        keys.inputs(r),
                        keys.answers(r),
                        keys.journal(r, self.at.prefix),
                        keys.attempts(r),
                        keys.spend(r),
                        names.UNACKED,
                        names.UNACKED_INDEX,
                        keys.WAITS_DUE,
                        keys.children(r),
                    ],
                    [payload.encode()],
                    durable=True,
                )
                return parse_commit(reply)
            except (
                REDIS_LOST
            ) as error:  # refused (OOM) or not taken (connection): nothing was written
                if not self.may_retry_commit():
                    log.error(
                        "run %s: step %s (%s, cost $%.6f) could not be committed before its lease ended "
                        "(%s: %s); its result is lost and the step runs again.%s",
                        r,
                        self.n,
                        where,
                        cost,
                        type(error).__name__,
                        error,
                        _hint(error),
                    )
                    raise
                attempt += 1
                if attempt == 1:
                    log.warning(
                        "run %s: Redis did not take the commit of step %s (%s, cost $%.6f): %s: %s; "
                        "the result is kept and the commit retried while the lease holds.%s",
                        r,
                        self.n,
                        where,
                        cost,
                        type(error).__name__,
                        error,
                        _hint(error),
                    )
                elif not past and not self.held_now():
                    past = True
                    log.warning(
                        "run %s: step %s (%s, cost $%.6f): its lease passed its deadline before Redis took "
                        "the commit; nobody else took the step, so the result is kept and the commit "
                        "retried while the fence holds",
                        r,
                        self.n,
                        where,
                        cost,
                    )
                went_on = payload.go_on.owner if payload.go_on else payload.went_on
                payload = dataclasses.replace(payload, go_on=None, went_on=went_on)
                await asyncio.sleep(min(1.0, 0.05 * 2**attempt))

    # -- after the commit -----------------------------------------------------------------------

    async def publish(
        self,
        member: str | None,
        successor: tuple[str, wire.Delivery] | None = None,
        **progress: Any,
    ) -> None:
        """Send the successor (`member` "<n>|<queue>", recorded in the outbox), its `task-sent` event and
        this step's `task-progress` event in the process's next Redis batch, without waiting for it: a
        failed send leaves the successor in the outbox (the sweeper sends it); RUN_BEGIN of that task
        clears it. The commit came first, so the step is safe whatever happens to the send.
        `successor`: (queue, delivery) of a successor the commit began here already (nothing to send
        but its event)."""
        events = self.process.events(self.task.hostname)
        if member:
            n, queue = names.parse_member(member)
            message = wire.task_message(
                names.ADVANCE,
                [self.run_id, n],
                names.step_id(self.run_id, n),
                queue,
                routing.describe(
                    self.live, str(progress.get("next") or ""), self.at.steps_base
                ),
                traceparent=self.run_traceparent(),
                tag=self.process.new_owner(),
            )
            here = self.process.consumer
            if (
                here is None or here.hand_off(queue, message) is None
            ):  # it runs here next, if it can
                # a failed send: the outbox repairs it
                self.batch.send("LPUSH", queue, message.raw)
            successor = (queue, message)
        if successor is not None:
            queue, message = successor
            events.send(
                "task-sent",
                {
                    "uuid": message.task_id,
                    "root_id": message.task_id,
                    "parent_id": None,
                    "name": names.ADVANCE,
                    "args": message.argsrepr,
                    "kwargs": message.kwargsrepr,
                    "retries": 0,
                    "eta": None,
                    "expires": None,
                    "queue": queue,
                    "exchange": "",
                    "routing_key": queue,
                },
            )
        replayed = self.live.journal.replayed - self.replayed_before if self.live else 0
        fields = {
            "uuid": self.task.task_id,
            "run_id": self.run_id,
            "n": self.n,
            "replayed": replayed,
            **progress,
        }
        events.send("task-progress", fields)
        if member:  # sent through the batch: a watcher may wait for the write
            watching = self.process.hooks.sent(
                "enqueue:after", self._flushed, run=self.run_id, key=progress["key"]
            )
            if watching is not None:
                await watching
        elif (
            successor is not None
        ):  # begun by the commit, its delivery recorded there: nothing to wait for
            self.process.hooks.point(
                "enqueue:after", run=self.run_id, key=progress["key"]
            )

    def _flushed(self) -> asyncio.Future[Any]:
        """A future that resolves once the batch queued so far was written."""
        return self.batch.call("PING")

    def run_traceparent(self) -> str | None:
        """The run's trace context for its successors' message headers (None when not traced)."""
        trace = self.trace
        if trace is None or not trace.valid:
            return None
        return trace.traceparent()

    def count_commit(
        self,
        outcome: CommitOutcome,
        field: str,
        cost: float,
        committed: int,
        status: Any,
    ) -> None:
        """The metrics of a commit that landed (workers/observe/metrics.py)."""
        metrics = self.metrics
        assert metrics is not None
        replayed = self.live.journal.replayed - self.replayed_before if self.live else 0
        fresh = self.live.events_past(committed) if self.live is not None else []
        metrics.committed_step(
            field, self.at.queue, cost, self.started, replayed, fresh
        )
        self.outcome = outcome
        if outcome == "park":
            metrics.parked.inc()
        elif outcome in ("stop", "fail"):
            metrics.run_ended(str(status))

    def may_retry_commit(self) -> bool:
        """A refused commit is tried again, within the step timeout, until another copy is known to
        have taken the step: past the lease's deadline too (a Redis outage longer than the lease),
        since RUN_COMMIT lands only while the run's fence is still this step's token. So a paid
        result is kept whenever nobody else began the step (tests/faults/test_lease_after_work.py)."""
        held = self.held
        if held is None or held.elsewhere:
            return False
        return time.monotonic() - self.started < self.settings.step_timeout

    def held_now(self) -> bool:
        return self.held is not None and self.held.holds

    def totals(self) -> dict[str, Any]:
        """Spend and steps so far, for the status of a run between two steps."""
        models = sum(1 for key in self.journal.entries if key.startswith("model:"))
        spent = float(self.state.get("carried_usd", 0)) + self.journal.cost_usd
        spent += self.at.outside - float(self.state.get("spend_base", 0))
        return {"spent_usd": spent, "steps": self.at.steps_base + models}

    def flush_outbox(self) -> None:
        """Send again the run's successors older than TOOLLOOP_OUTBOX_AGE (a thread: sync Redis)."""
        flush_outbox(
            self.process.redis,
            self.process.celery,
            self.run_id,
            self.settings.outbox_age,
            self.settings.redrive_age,
        )


def interrupted_or(stopped_by: str, live: LiveLoop | None) -> str:
    """The status a stop gives the run: `interrupted` for a cancel stop that an interrupt caused
    (the step's abort reason; workers/client/talk.py), else the loop's `stopped_by`."""
    if (
        stopped_by == "cancel"
        and live is not None
        and live.controller.signal.reason == "interrupt"
    ):
        return "interrupted"
    return stopped_by


def _hint(error: BaseException) -> str:
    return (
        "\n  " + OOM_HINT
        if isinstance(error, redis_lib.exceptions.OutOfMemoryError)
        else ""
    )

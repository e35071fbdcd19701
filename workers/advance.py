"""One step of a durable run: the body of the `toolloop.advance` task.

Invariant: task `n` of a run makes the run's n-th commit and nothing else. It loads the run and the
current segment's journal in one script (which also takes the run's lease and counts the delivery),
replays `run_tool_loop` over the journal in memory, runs the FIRST step that is not stored, and stops
at the next one (`StepBoundary`). Then one commit script writes the step's value, the events not yet
in the stream, and what follows: the successor task in the outbox (routed by the next step's kind),
or the run's final state, or its park. A copy whose commit is fenced (a newer copy took the lease)
discards its work and re-drives from storage.

Leases (workers/redisio.py `Leases`): no work begins without a live lease. Just before a model call
or a tool's `run` / `start`, the step's abort signal takes the lease's local deadline (the last
confirmed renewal, on the monotonic clock; a renewal first when it is near), so a process frozen
past its lease finds the signal aborted the moment it runs again. A lease lost while work runs stops
the step: nothing of it is committed, and the step runs again under a live lease (ours, or the
copy's that took it over). A commit that Redis refuses (out of memory) or cannot take (a lost
connection) keeps the step's value and is retried with backoff while the lease holds; only a step
that cannot commit before its lease ends loses its work, and says so in the log.

The loop stopped at the boundary is not thrown away: it waits there (workers/live.py), and when this process
runs the run's next task and the run's state shows that no commit came after its own, the loop goes
on from there; RUN_BEGIN then loads nothing but the state. Replay is what a step costs elsewhere:
after a crash, a redelivery to another worker, or a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

import redis as redis_lib

from toolloop.fastjson import dumps
from toolloop.journal import keys, scripts
from toolloop.journal.redis import RedisJournal, StepBoundary
from toolloop.loop.types import Budget, LoopEvent, RunToolLoopOptions, RunToolLoopResult, ToolSpec
from workers import approvals, consumer, flow, killpoints, runlist, runtime, wire
from workers.app import ADVANCE
from workers.deltas import DeltaStream, bind, streaming
from workers.errors import OOM_HINT, REDIS_LOST, DeliveryLimitError, LeaseLostError
from workers.killpoints import kill_point
from workers.live import Begun, LiveLoop, keep, take
from workers.metrics import counted
from workers.redisio import Held
from workers.runs import flush_outbox, segment_messages
from workers.spec import RunSpec
from workers.tracing import StepTrace

log = logging.getLogger("toolloop.workers")

_WAIT_FOR_LEASE_MS = 5000


@dataclass(frozen=True)
class Task:
    """The Celery task a step runs as: its id and the worker's hostname (for its events)."""

    task_id: str
    hostname: str


@dataclass(frozen=True)
class Outcome:
    """What a step did: `what` ("next", "park", "stop", "fail", "stale", "busy", "fenced"); when the
    step ended its run `failed`, `failure` is (error class, message): the task is then reported
    failed (`task-failed` in Flower), though it is acked like any step (the failure is committed)."""

    what: str
    failure: tuple[str, str] | None = None

    def __str__(self) -> str:
        return self.what

    def __repr__(self) -> str:  # what Celery's log line and Flower's result column show
        return repr(self.what)


async def advance(run_id: str, n: int, task: Task, begun: Begun | None = None) -> Outcome:
    """Make commit `n` of the run (see the module docstring). Returns what happened, for logs.
    Runs on the process's asyncio loop (workers/runtime.py), from a Celery task or the step consumer.

    A run's last step returns `stop: <stopped_by>` (`stop: refused (cyber)`): Flower shows it as the
    task's result. A copy fenced at its commit re-drives from storage. A copy that finds the lease
    about to lapse (a dead holder: a redelivery after a crash) waits for it rather than leave the run
    to the sweeper.
    `begun`: the predecessor's commit began this task already (RUN_COMMIT's go_on).
    """
    kill_point("advance:begin", run=run_id, n=n)
    outcome = "fenced"
    for _ in range(3):
        step = _Step(run_id, n, task, begun)
        begun = None
        try:
            outcome = await step.run()
        except (Exception, asyncio.CancelledError):  # Redis unreachable, or a shutdown: free the run
            await step.release()
            raise
        finally:
            step.drop_lease()
            if step.trace is not None:
                step.trace.end(outcome if step.outcome is None else step.outcome)
            if step.live is not None and not step.kept:
                step.live.close()
        if outcome == "busy" and 0 <= step.lease_left_ms <= _WAIT_FOR_LEASE_MS:
            await asyncio.sleep(step.lease_left_ms / 1000 + 0.05)
            continue
        if outcome != "fenced":
            break
    what = f"{outcome}: {step.stopped}" if outcome == "stop" and step.stopped else outcome
    return Outcome(what, step.failure if outcome == "fail" else None)


class _Step:
    def __init__(self, run_id: str, n: int, task: Task, begun: Begun | None = None) -> None:
        self.run_id = run_id
        self.n = n
        self.task = task
        self.begun = begun
        self.batch = runtime.batch()
        self.settings = runtime.settings
        self.owner = begun.owner if begun is not None else uuid.uuid4().hex
        self.live: LiveLoop | None = None
        self.kept = False
        """True once `live` was kept for the run's next step (it then outlives this step)."""
        self.lease_left_ms = -1
        self.replayed_before = 0
        self.failure: tuple[str, str] | None = None
        self.stopped: str | None = None
        """How the run stopped when this step ended it (`refused (cyber)`), for the task's result."""
        self.held: Held | None = None
        self.started = time.monotonic()
        self.trace: StepTrace | None = None
        self.outcome: str | None = None
        self.delivered = 1
        self.metrics = runtime.metrics()

    async def run(self) -> str:
        r = self.run_id
        kept: LiveLoop | None
        if self.begun is not None:
            kept, begin, sent_at = self.begun.loop, self.begun.reply, self.begun.sent_at
        else:
            kept = take(r)
            sent_at = time.monotonic()
            begin = await self.batch.script(
                scripts.RUN_BEGIN,
                [keys.state(r), keys.spec(r), keys.lease(r), keys.fence(r), keys.attempts(r),
                 keys.spend(r), keys.inputs(r), keys.answers(r), keys.outbox(r)],
                [self.owner, self.settings.lease_ms, self.n, time.time(), keys.journal(r, ""),
                 kept.tag if kept else ""],
            )  # fmt: skip
        code = begin[0]
        if code != "run" or begin[4] is not None:  # the kept loop is not where the run is
            if kept is not None:
                kept.close()
            kept = None
        if code == "stale":  # committed already: send its successor again if it seems lost
            await asyncio.to_thread(_flush_outbox, r, self.settings.outbox_age)
            return "stale"
        if code == "busy":
            self.lease_left_ms = int(begin[1])
        if code != "run":
            return str(code)
        _, token, attempts, state_flat, spec_json, journal_flat, input_json, answer, outside, _tag = begin
        self.token = int(token)
        self.delivered = int(attempts)
        self.lease = f"{self.owner}:{token}"
        self.held = runtime.leases().hold(keys.lease(r), self.lease, sent_at, self.on_lost)
        self.state = _pairs(state_flat)
        self.trace = StepTrace(r, self.n, self.state, self.task.task_id)
        self.segment = int(self.state.get("segment", 0))
        self.prefix = f"{keys.segment_name(self.segment)}/"
        self.outside = float(outside)
        if int(attempts) > self.settings.max_deliveries:
            error = DeliveryLimitError(
                f"Step {self.n} of run {self.run_id!r} was delivered {attempts} times without finishing.\n"
                "  Its worker keeps dying (memory? a crash in a tool?); fix that, then retry the run."
            )
            if kept is not None:
                kept.close()
            return await self.commit_failure(error)
        if kept is not None:
            self.live = kept
            self.replayed_before = kept.journal.replayed
            bind(kept.deltas, self.batch, self.token, self.segment)
            outcome_future = kept.go_on(self)
        else:
            try:
                spec = RunSpec.model_validate_json(spec_json)
                tools = flow.wrap_tools(runtime.toolsets().for_worker(spec.toolset), spec)
                decisions = approvals.decisions_of(answer)
                messages = segment_messages(input_json, None if decisions else answer)
            except Exception as error:
                return await self.commit_failure(error)
            self.live = live = LiveLoop({tool.name: tool for tool in tools})
            live.held_names = approvals.held_names(messages, decisions)
            live.journal = RedisJournal(
                runtime.redis(), r, self.prefix, signal=live.controller.signal,
                entries=_pairs(journal_flat), live_steps=1, before_live=live.before_live,
                after_live=live.after_live, owner=self.owner, pause=live.pause,
            )  # fmt: skip
            steps_base = int(self.state.get("steps_base", 0))
            live.deltas = DeltaStream.of(spec.stream, r, live.events.append)  # None unless it streams
            bind(live.deltas, self.batch, self.token, self.segment)
            generate = runtime.generate_for(spec.provider, spec.fallback, stream=spec.stream)
            generate = flow.wrap_generate(
                generate if self.metrics is None else counted(generate, spec.provider, self.metrics), spec
            )
            options = RunToolLoopOptions(
                generate=generate if live.deltas is None else streaming(generate),
                model=spec.model,
                system=spec.system,
                messages=messages,
                tools=tools,
                budget=Budget(
                    usd=spec.budget_usd,
                    finish_at=spec.finish_at,
                    spent_usd=float(self.state.get("carried_usd", 0)),
                    spent=live.spent_outside,
                ),
                max_steps=max(0, spec.max_steps - steps_base),
                step=live.journal.step,
                signal=live.controller.signal,
                reasoning=spec.reasoning,
                on_step=live.events.append if live.deltas is None else live.deltas.on_step,
                finish_note=spec.finish_note,
                keep_images=spec.keep_images,
                cache=spec.cache,
                cache_ttl=spec.cache_ttl,
                max_tool_result_bytes=self.settings.max_tool_result_bytes,
                max_image_bytes=self.settings.max_image_bytes,
                decisions=decisions,
            )
            self.spec: RunSpec | None = spec
            outcome_future = live.start(self, options)
        timeout = self.settings.step_timeout
        try:
            async with asyncio.timeout(timeout):  # no task of its own, unlike wait_for in 3.11
                outcome = await outcome_future
        except TimeoutError:
            return await self.commit_failure(TimeoutError(
                f"The step ran longer than {timeout:g} s (TOOLLOOP_STEP_TIMEOUT) and was stopped.\n"
                "  Give the tool or model call a shorter timeout of its own, or raise the limit; "
                "then retry the run."
            ))  # fmt: skip
        except LeaseLostError as error:
            return await self.lost_lease(error)
        except Exception as error:
            if isinstance(self.live.controller.signal.reason, LeaseLostError):
                return await self.lost_lease(self.live.controller.signal.reason)
            return await self.commit_failure(error)
        finally:
            runtime.disarm(r, self.live.controller)
            if not outcome_future.done() or outcome_future.cancelled():
                self.live.close()  # stopped waiting (timeout, shutdown): the loop's work stops too
        if isinstance(self.live.controller.signal.reason, LeaseLostError):
            return await self.lost_lease(self.live.controller.signal.reason)
        if isinstance(outcome, StepBoundary):
            return await self.commit_next(outcome.key)
        return await self.commit_result(outcome)

    @property
    def journal(self) -> RedisJournal:
        assert self.live is not None
        return self.live.journal

    @property
    def events(self) -> list[LoopEvent]:
        return self.live.events if self.live is not None else []

    @property
    def steps_base(self) -> int:
        return int(self.state.get("steps_base", 0))

    # -- during the step ------------------------------------------------------------------------

    def before_live(self, key: str) -> Awaitable[None] | None:
        """Just before the step's work: cancellation armed, and the lease checked (no round trip
        unless its deadline is near; an awaitable then, which the journal awaits)."""
        assert self.live is not None
        runtime.arm(self.run_id, self.live.controller)
        if self.trace is not None:
            self.trace.enter()
        if self.metrics is not None:
            self.metrics.work_began(key, self.queue, self.delivered)
        if self.state.get("cancel") == "1":
            self.live.controller.abort("cancel")
        if self.held is None:
            return None
        return runtime.leases().begin_work(self.held, self.live.controller)

    def after_live(self, key: str) -> None:
        if self.held is not None:
            runtime.leases().end_work(self.held)

    def on_lost(self, error: LeaseLostError) -> None:
        """The lease was lost while the step's work ran: abort the work and stop waiting for it."""
        live = self.live
        if live is None:
            return
        live.controller.abort(error)
        if live.outcome is not None and not live.outcome.done():
            live.outcome.set_exception(error)

    async def lost_lease(self, error: LeaseLostError) -> str:
        """The step's work was stopped for a lost lease: commit nothing, free the lease if it is
        still ours, and re-drive (the copy holding the lease goes on, or this one takes it anew)."""
        pending = self.live.journal.pending if self.live is not None else []
        what = ", ".join(f"{self.prefix}{key} (${cost:.6f})" for key, _, cost in pending)
        log.warning(
            "run %s: step %s stopped: %s.\n  Not committed: %s; the step runs again under a live lease.",
            self.run_id, self.n, error, what or "no finished work",
        )  # fmt: skip
        if self.live is not None and self.live.deltas is not None:
            self.live.deltas.drop()
        await self.release()
        if self.metrics is not None:
            self.metrics.leases_lost.inc()
        return "fenced"

    async def release(self) -> None:
        if getattr(self, "lease", None):
            with contextlib.suppress(Exception):
                await self.batch.script(scripts.LEASE_RELEASE, [keys.lease(self.run_id)], [self.lease])

    def drop_lease(self) -> None:
        if self.held is not None:
            runtime.leases().drop(self.held)

    # -- the commit ------------------------------------------------------------------------------

    async def commit_next(self, next_key: str) -> str:
        return await self.commit("next", queue=self.route(next_key), state=self.totals(), next_key=next_key)

    async def commit_result(self, result: RunToolLoopResult) -> str:
        history = json.dumps([m.model_dump(mode="json") for m in result.messages])
        steps = self.steps_base + result.steps
        state: dict[str, Any] = {
            "spent_usd": result.spent_usd,
            "steps": steps,
            "final_text": result.final_text or "",
        }
        if result.stopped_by == "asked":
            asked = result.asked.input if result.asked else {}
            state |= {"asked": json.dumps(asked), "carried_usd": result.spent_usd,
                      "spend_base": self.outside, "steps_base": steps}  # fmt: skip
            parked = json.dumps({"asked": asked, "spent_usd": result.spent_usd, "steps": steps})
            spec = self.run_spec()
            due: dict[str, Any] = {}
            if spec is not None and spec.ask_timeout_s is not None:
                deadline = time.time() + spec.ask_timeout_s
                state |= {"ask_deadline": repr(deadline), "ask_default": spec.ask_default or ""}
                due = {"due": deadline, "run": self.run_id}
            return await self.commit("park", state=state, history=history, parked=parked, **due)
        if result.stopped_by == "approval":
            return await self.park_for_approval(result, state, history, steps)
        state["status"] = result.stopped_by
        final: dict[str, Any] = {"stopped_by": result.stopped_by, "final_text": result.final_text,
                                 "spent_usd": result.spent_usd, "steps": steps}  # fmt: skip
        self.stopped = result.stopped_by
        if result.refusal is not None:
            state["refusal"] = result.refusal.model_dump_json()
            final["refusal"] = result.refusal.model_dump(mode="json")
            self.stopped += f" ({result.refusal.category or 'no category'})"
        return await self.commit("stop", state=state, history=history, final=["finished", json.dumps(final)])

    def run_spec(self) -> RunSpec | None:
        """The run's spec (None on a kept loop's path, which did not load it: read it then)."""
        spec: RunSpec | None = getattr(self, "spec", None)
        if spec is None and self.live is not None:
            raw = runtime.redis().get(keys.spec(self.run_id))
            spec = RunSpec.model_validate_json(str(raw)) if raw else None
            self.spec = spec
        return spec

    async def park_for_approval(
        self, result: RunToolLoopResult, state: dict[str, Any], history: str, steps: int
    ) -> str:
        """Park with the held calls (status "asked", state `approvals`), an `approval_requested`
        event each; then apply decisions sent before the park (settle)."""
        spec = self.run_spec()
        assert spec is not None and self.live is not None
        held = approvals.pending_approvals(result.approvals or [], self.live.tools, spec, time.time())
        state |= {"approvals": json.dumps(held), "carried_usd": result.spent_usd,
                  "spend_base": self.outside, "steps_base": steps}  # fmt: skip
        parked = json.dumps({"approvals": held, "spent_usd": result.spent_usd, "steps": steps})
        requested = [json.dumps({k: h[k] for k in ("call_id", "name", "input", "input_digest", "estimate_usd",
                                                    "deadline")}) for h in held]  # fmt: skip
        deadlines = [h["deadline"] for h in held if h["deadline"] is not None]
        due = min([time.time(), *deadlines])  # the sweeper looks at once: decisions sent early apply
        outcome = await self.commit("park", state=state, history=history, parked=parked,
                                    requested=requested, due=due, run=self.run_id)  # fmt: skip
        if outcome == "park":
            await asyncio.to_thread(_settle, self.run_id)
        return outcome

    async def commit_failure(self, error: BaseException) -> str:
        log.warning("run %s failed at commit %s: %s: %s", self.run_id, self.n, type(error).__name__, error)
        message = str(error)
        self.failure = (type(error).__name__, message)
        state = {"status": "failed", "error_class": type(error).__name__, "error_message": message}
        data = json.dumps({"error_class": type(error).__name__, "error_message": message})
        return await self.commit("fail", state=state, final=["failed", data])

    async def commit(
        self, outcome: str, *, state: dict[str, Any], next_key: str | None = None, **extra: Any
    ) -> str:
        pending = self.live is not None and self.live.journal.pending
        field, value = (pending[0][0], pending[0][1]) if pending else ("", "")
        committed = int(self.state.get(f"events:{self.segment}", 0))
        events = [[i + 1, e.kind, e.model_dump_json()] for i, e in enumerate(self.events) if i >= committed]
        queue = extra.pop("queue", "llm")
        if self.trace is not None:  # the segment's start, at its first commit (workers/tracing.py)
            state = {**state, **self.trace.record()}
        payload = {
            "token": self.token, "lease": self.lease, "n": self.n, "segment": self.segment,
            "field": field, "value": value, "outcome": outcome, "queue": queue,
            "now": time.time(), "state": {k: str(v) for k, v in state.items()},
            "events": events,
            "cancel_text": "Not run: cancel.", **extra,
            "streamed": self.live.deltas.settle() if self.live and self.live.deltas else "",
        }  # fmt: skip
        r = self.run_id
        live = self.live
        here = consumer.current()
        successor: wire.Delivery | None = None
        if outcome == "next" and live is not None and live.keepable() and here and here.can_go_on(queue):
            # the successor runs here: this commit records its delivery and begins it (no RUN_BEGIN)
            label = self.describe(next_key or "")
            successor = wire.task_message(
                ADVANCE,
                [r, self.n + 1],
                f"{r}:{self.n + 1}",
                queue,
                label,
                traceparent=self.run_traceparent(),
            )
            payload["go_on"] = {
                "owner": uuid.uuid4().hex, "lease_ms": self.settings.lease_ms, "tag": successor.tag,
                "unacked": wire.unacked_value(successor.raw, queue),
            }  # fmt: skip
        where = self.prefix + (field or "-")
        kill_point("commit:before", run=self.run_id, key=where)
        sent_at = time.monotonic()
        attempt = 0
        while True:
            try:
                ok, stored, member, begun = await self.batch.script(
                    scripts.RUN_COMMIT,
                    [keys.state(r), keys.fence(r), keys.lease(r), keys.events(r), keys.outbox(r),
                     keys.history(r), keys.inputs(r), keys.answers(r), keys.journal(r, self.prefix),
                     keys.attempts(r), keys.spend(r), wire.UNACKED, wire.UNACKED_INDEX, keys.WAITS_DUE],
                    [dumps(payload)],
                )  # fmt: skip
                break
            except REDIS_LOST as error:  # refused (OOM) or not taken (connection): nothing was written
                cost = pending[0][2] if pending else 0.0
                if not self.may_retry_commit():
                    log.error(
                        "run %s: step %s (%s, cost $%.6f) could not be committed before its lease ended "
                        "(%s: %s); its result is lost and the step runs again.%s", r, self.n, where, cost,
                        type(error).__name__, error, _hint(error),
                    )  # fmt: skip
                    raise
                attempt += 1
                if attempt == 1:
                    log.warning(
                        "run %s: Redis did not take the commit of step %s (%s, cost $%.6f): %s: %s; "
                        "the result is kept and the commit retried while the lease holds.%s", r, self.n,
                        where, cost, type(error).__name__, error, _hint(error),
                    )  # fmt: skip
                if payload.pop("go_on", None) is not None:  # a retried commit sends its successor
                    successor = None
                await asyncio.sleep(min(1.0, 0.05 * 2**attempt))
        if int(ok) != 1:
            log.info("run %s: commit %s fenced (another copy holds the run); re-driving", r, self.n)
            return "fenced"
        kill_point("commit:after", run=r, key=where)
        if self.metrics is not None:
            self.count_commit(
                outcome, field, pending[0][2] if pending else 0.0, committed, state.get("status")
            )
        if begun and here is not None and successor is not None and live is not None:
            live.tag = f"{self.lease}|{self.segment}"  # the run's tag now
            token, attempts, state_flat, outside = begun
            reply = ["run", token, attempts, state_flat, None, None, None, None, outside, live.tag]
            self.kept = True
            here.run_begun(queue, successor, Begun(payload["go_on"]["owner"], reply, live, sent_at))
            await self.publish(None, successor=(queue, successor), key=where, phase=outcome, next=next_key)
            kill_point("enqueue:after", run=r, key=where)
            return outcome
        if outcome == "next" and (not field or stored == value) and live is not None and live.keepable():
            live.tag = f"{self.lease}|{self.segment}"  # the run's tag now (RUN_BEGIN of the next step)
            keep(r, live)
            self.kept = True
        await self.publish(str(member) if member else None, key=where, phase=outcome, next=next_key)
        if member:
            kill_point("enqueue:after", run=r, key=where)
        if outcome in ("stop", "fail"):
            self.batch.send("ZREM", keys.LIVE_RUNS, r)
            for command in runlist.expire_commands(r, self.segment, self.settings.retention):
                self.batch.send(*command)  # retention starts (a lost EXPIRE: `toolloop prune`)
        return outcome

    async def publish(
        self, member: str | None, successor: tuple[str, wire.Delivery] | None = None, **progress: Any
    ) -> None:
        """Send the successor (`member` "<n>|<queue>", recorded in the outbox), its `task-sent` event and
        this step's `task-progress` event in the process's next Redis batch, without waiting for it: a
        failed send leaves the successor in the outbox (the sweeper sends it); RUN_BEGIN of that task
        clears it. The commit came first, so the step is safe whatever happens to the send.
        `successor`: (queue, delivery) of a successor the commit began here already (nothing to send
        but its event)."""
        events = runtime.events(self.task.hostname)
        waiting = killpoints.active()  # a kill at "enqueue:after" must follow the send: wait for it
        sent: asyncio.Future[Any] | None = None
        if member:
            n, _, queue = member.partition("|")
            label = self.describe(str(progress.get("next") or ""))
            message = wire.task_message(
                ADVANCE,
                [self.run_id, int(n)],
                f"{self.run_id}:{n}",
                queue,
                label,
                traceparent=self.run_traceparent(),
            )
            sent = consumer.hand_off(queue, message)  # this process runs it next, if it can
            if sent is None and waiting:
                sent = self.batch.call("LPUSH", queue, message.raw)
            elif sent is None:  # a failed send is logged by the batch and repaired from the outbox
                self.batch.send("LPUSH", queue, message.raw)
            successor = (queue, message)
        if successor is not None:
            queue, message = successor
            events.send("task-sent", {
                "uuid": message.task_id, "root_id": message.task_id, "parent_id": None,
                "name": ADVANCE, "args": message.argsrepr, "kwargs": message.kwargsrepr, "retries": 0,
                "eta": None, "expires": None, "queue": queue, "exchange": "", "routing_key": queue,
            })  # fmt: skip
        replayed = self.live.journal.replayed - self.replayed_before if self.live else 0
        fields = {"uuid": self.task.task_id, "run_id": self.run_id, "n": self.n, "replayed": replayed,
                  **progress}  # fmt: skip
        events.send("task-progress", fields)
        if sent is not None and waiting:
            with contextlib.suppress(OSError, redis_lib.RedisError):
                await sent

    @property
    def queue(self) -> str:
        """The queue this step's task came from (as the run's state records it)."""
        return self.state.get("queue") or "llm"

    def run_traceparent(self) -> str | None:
        """The run's trace context for its successors' message headers (None when not traced)."""
        trace = self.trace
        if trace is None or not trace.valid:
            return None
        return trace.traceparent()

    def count_commit(self, outcome: str, field: str, cost: float, committed: int, status: Any) -> None:
        """The metrics of a commit that landed (workers/metrics.py)."""
        metrics = self.metrics
        assert metrics is not None
        replayed = self.live.journal.replayed - self.replayed_before if self.live else 0
        fresh = self.events[committed:]
        metrics.committed_step(field, self.queue, cost, self.started, replayed, fresh)
        self.outcome = outcome
        if outcome == "park":
            metrics.parked.inc()
        elif outcome in ("stop", "fail"):
            metrics.run_ended(str(status))

    def may_retry_commit(self) -> bool:
        """A refused commit is tried again while the lease is certainly ours, within the step timeout."""
        held = self.held
        if held is None or not held.holds:
            return False
        return time.monotonic() - self.started < self.settings.step_timeout

    def totals(self) -> dict[str, Any]:
        """Spend and steps so far, for the status of a run between two steps."""
        models = sum(1 for key in self.journal.entries if key.startswith("model:"))
        spent = float(self.state.get("carried_usd", 0)) + self.journal.cost_usd
        spent += self.outside - float(self.state.get("spend_base", 0))
        return {"spent_usd": spent, "steps": self.steps_base + models}

    def route(self, key: str) -> str:
        """The queue of step `key`: model steps on "llm", tool steps on the tool's own queue or "tools"."""
        if key.startswith("model:"):
            return "llm"
        tool = self.tool_of(key)
        return (tool.queue if tool else None) or "tools"

    def describe(self, key: str) -> str:
        """What step `key` is, for Flower and `celery inspect`: "model 3" (the model turn of its
        segment) or "tool read_frame" (a registered tool's name; "tool" alone for any other)."""
        if key.startswith("model:"):
            return f"model {key.removeprefix('model:')}"
        if not key.startswith("tool:"):
            return ""
        tool = self.tool_of(key)
        return f"tool {tool.name}" if tool else "tool"

    def tool_of(self, key: str) -> ToolSpec | None:
        """The registered tool that step `key` ("tool:<call id>[:start|:wait]") calls, if any."""
        call_id = key.removeprefix("tool:")
        if call_id.endswith((":start", ":wait")):
            call_id = call_id.rsplit(":", 1)[0]
        turns = [int(k.removeprefix("model:")) for k in self.journal.entries if k.startswith("model:")]
        if turns:  # the next tool step answers a call of the latest model turn (decoded by replay)
            key = f"model:{max(turns)}"
            memo = self.journal.parsed.get(key)
            value = memo[1] if memo is not None else json.loads(self.journal.entries[key])["value"]
            for call in value["result"].get("tool_calls", []):
                if call["id"] == call_id:
                    return self.live.tools.get(call["name"]) if self.live else None
        held = self.live.held_names.get(call_id) if self.live else None
        if held is not None and self.live is not None:  # a decided call of an approval resume
            return self.live.tools.get(held)
        return None


def _flush_outbox(run_id: str, older_than: float) -> None:
    from workers.app import app

    flush_outbox(runtime.redis(), app, run_id, older_than=older_than)


def _settle(run_id: str) -> None:
    from workers.app import app

    approvals.settle(runtime.redis(), app, run_id)


def _hint(error: BaseException) -> str:
    return "\n  " + OOM_HINT if isinstance(error, redis_lib.exceptions.OutOfMemoryError) else ""


def _pairs(flat: list[Any]) -> dict[str, str]:
    return {str(flat[i]): str(flat[i + 1]) for i in range(0, len(flat), 2)}

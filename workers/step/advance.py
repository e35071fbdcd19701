"""One step of a durable run: the body of the `toolloop.advance` task.

Invariant: task `n` of a run makes the run's n-th commit and nothing else. It loads the run and the
current segment's journal in one script (which also takes the run's lease and counts the delivery),
replays `run_tool_loop` over the journal in memory, runs the FIRST step that is not stored, and stops
at the next one (`StepBoundary`). Then one commit script writes the step's value, the events not yet
in the stream, and what follows: the successor task in the outbox (routed by the next step's kind),
or the run's final state, or its park. A copy whose commit is fenced (a newer copy took the lease)
discards its work and re-drives from storage.

Leases (workers/process/leases.py `Leases`): no work begins without a live lease. Just before a model call
or a tool's `run` / `start`, the step's abort signal takes the lease's local deadline (the last
confirmed renewal, on the monotonic clock; a renewal first when it is near), so a process frozen
past its lease finds the signal aborted the moment it runs again. A lapsed lease that nobody took
since is taken again and the work in flight goes on; a lease another copy took stops the step:
nothing of it is committed, and the step runs again under a live lease. A commit that Redis refuses
(out of memory) or cannot take (a lost connection) keeps the step's value and is retried with
backoff while the lease holds; only a step that cannot commit before its lease ends loses its work,
and says so in the log.

The loop stopped at the boundary is not thrown away: it waits there (workers/process/live.py, kept by the
process's `WorkerProcess.kept`), and when this process runs the run's next task and the run's state
shows that no commit came after its own, the loop goes on from there; RUN_BEGIN then loads nothing
but the state. Replay is what a step costs elsewhere: after a crash, a redelivery to another worker,
or a restart. The commit, the successor's send and its routing are in workers/step/commit.py and
workers/step/routing.py; everything the step uses of its process comes from the `WorkerProcess` it is
given, and its observation points are the process's hooks (workers/observe/hooks.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from toolloop.abort import AbortSignal
from toolloop.contract import PromptGenRequest
from toolloop.loop.context import CompactionState
from toolloop.loop.types import Budget, LoopEvent, RunToolLoopOptions, ToolSpec
from workers.flow import limiter as flow
from workers.observe.metrics import counted
from workers.observe.tracing import StepTrace
from workers.process.deadlines import StepTimedOut
from workers.process.deltas import DeltaStream, bind, streaming
from workers.process.leases import Held
from workers.process.live import Begun, LiveLoop
from workers.process.live import Outcome as LoopOutcome
from workers.process.segment import SegmentJournal, StepBoundary
from workers.process.suspects import limit_error
from workers.process.worker_process import WorkerProcess
from workers.protocol import keys
from workers.protocol.errors import LeaseLostError
from workers.protocol.scripts.begin import (
    RUN_BEGIN,
    Begin,
    Refused,
    Started,
    parse_begin,
)
from workers.protocol.scripts.commit import StepOutcome
from workers.protocol.scripts.lease import LEASE_RELEASE
from workers.protocol.spec import RunSpec
from workers.runs import approvals
from workers.runs.lifecycle import segment_messages
from workers.step import children
from workers.step.children import Spawner
from workers.step.commit import Commits, log
from workers.step.mcptools import run_tools
from workers.step.steering import Steering, talk_attributes

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


async def advance(
    process: WorkerProcess, run_id: str, n: int, task: Task, begun: Begun | None = None
) -> Outcome:
    """Make commit `n` of the run (see the module docstring). Returns what happened, for logs.
    Runs on the process's asyncio loop, from a Celery task or the step consumer.

    A run's last step returns `stop: <stopped_by>` (`stop: refused (cyber)`): Flower shows it as the
    task's result. A copy fenced at its commit re-drives from storage. A copy that finds the lease
    about to lapse (a dead holder: a redelivery after a crash) waits for it rather than leave the run
    to the sweeper.
    `begun`: the predecessor's commit began this task already (RUN_COMMIT's go_on).
    """
    process.hooks.point("advance:begin", run=run_id, n=n)
    outcome: StepOutcome = "fenced"
    for _ in range(3):
        step = _Step(process, run_id, n, task, begun)
        begun = None
        try:
            outcome = await step.run()
        except (
            Exception,
            asyncio.CancelledError,
        ):  # Redis unreachable, or a shutdown: free the run
            await step.release()
            raise
        finally:
            step.end(outcome)
        if outcome == "busy" and 0 <= step.lease_left_ms <= _WAIT_FOR_LEASE_MS:
            await asyncio.sleep(step.lease_left_ms / 1000 + 0.05)
            continue
        if outcome != "fenced":
            break
    what = (
        f"{outcome}: {step.stopped}" if outcome == "stop" and step.stopped else outcome
    )
    return Outcome(what, step.failure if outcome == "fail" else None)


class _Step(Commits):
    def __init__(
        self,
        process: WorkerProcess,
        run_id: str,
        n: int,
        task: Task,
        begun: Begun | None = None,
    ) -> None:
        self.process = process
        self.run_id = run_id
        self.n = n
        self.task = task
        self.begun = begun
        self.batch = process.batch
        self.settings = process.settings
        self.owner = begun.owner if begun is not None else process.new_owner()
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
        self.outcome: StepOutcome | None = None
        self.delivered = 1
        self.end_turn: Callable[[], None] | None = None
        """Ends this suspect's turn (workers/process/suspects.py) when the step ends; None unless a
        suspect."""
        self.metrics = process.metrics
        self.spec: RunSpec | None = None
        self.compacted: str | None = None
        """The compaction state a park or a stop of this step hands to the next segment (JSON)."""

    async def run(self) -> StepOutcome:
        kept, begin, sent_at = await self._begin()
        # a kept loop is not where the run is when RUN_BEGIN loaded the run (it moved on elsewhere)
        if (
            isinstance(begin, Refused) or begin.loaded is not None
        ) and kept is not None:
            kept.close()
            kept = None
        if isinstance(begin, Refused):
            return await self._not_begun(begin)
        self._took_lease(begin, sent_at)
        if (
            self.delivered > 1
        ):  # a suspect (workers/process/suspects.py): its turn, then its charge
            counted = await self._suspect_turn()
            if counted > self.settings.max_deliveries:
                if kept is not None:
                    kept.close()
                return await self.commit_failure(
                    limit_error(self.run_id, self.n, self.delivered, counted)
                )
        if kept is not None:
            self.live = kept
            self.replayed_before = kept.journal.replayed
            bind(kept.deltas, self.batch, self.token, self.segment, self.process.hooks)
            return await self._until_boundary(kept.go_on(self))
        loaded = begin.loaded
        try:
            if loaded is None or loaded.spec is None:
                raise LookupError(
                    f"Run {self.run_id!r} has no spec in Redis.\n  Enqueue it again."
                )
            spec, answer = RunSpec.model_validate_json(loaded.spec), loaded.answer
            # `spawn`, bound to this run (its loop's step names it)
            spawner = Spawner(self.process, spec)
            tools = spawner.bind(
                flow.wrap_tools(
                    self.process,
                    await run_tools(self.process, self.run_id, spec.toolset),
                    spec,
                )
            )
            decisions = approvals.decisions_of(answer)
            messages = segment_messages(loaded.input, None if decisions else answer)
        except Exception as error:
            return await self.commit_failure(error)
        live = self.live = spawner.live = LiveLoop({tool.name: tool for tool in tools})
        live.held_names = approvals.held_names(messages, decisions)
        live.journal = SegmentJournal(
            self.run_id,
            self.prefix,
            loaded.journal,
            signal=live.controller.signal,
            live_steps=1,
            before_live=live.before_live,
            after_live=live.after_live,
            pause=live.pause,
        )
        live.deltas = DeltaStream.of(  # None unless it streams
            spec.stream, self.run_id, live.events.append, self.settings.delta_interval
        )
        bind(live.deltas, self.batch, self.token, self.segment, self.process.hooks)
        self.spec = spec
        options = self._options(spec, live, tools, messages, decisions)
        if loaded.compacted and spec.context is not None:
            # the previous segment compacted: this one starts from its summary (docs/context.md)
            carried = CompactionState.model_validate_json(loaded.compacted)
            options = options.model_copy(update={"compacted": carried})
        live.max_steps = options.max_steps
        return await self._until_boundary(live.start(self, options))

    async def _begin(self) -> tuple[LiveLoop | None, Begin, float]:
        """RUN_BEGIN (lease, delivery count, and what of the run a kept loop lacks), or what the
        predecessor's commit began for this task (go_on)."""
        if self.begun is not None:
            return self.begun.loop, self.begun.started, self.begun.sent_at
        r = self.run_id
        kept = self.process.kept.take(r)
        sent_at = time.monotonic()
        begin = parse_begin(
            await self.batch.script(
                RUN_BEGIN,
                [
                    keys.state(r),
                    keys.spec(r),
                    keys.lease(r),
                    keys.fence(r),
                    keys.attempts(r),
                    keys.spend(r),
                    keys.inputs(r),
                    keys.answers(r),
                    keys.outbox(r),
                ],
                [
                    self.owner,
                    self.settings.lease_ms,
                    self.n,
                    time.time(),
                    keys.journal(r, ""),
                    kept.tag if kept else "",
                ],
            )
        )
        return kept, begin, sent_at

    async def _suspect_turn(self) -> int:
        """Wait for the process's suspect turn (held until the step ends), then charge this delivery:
        how many deliveries of the step count, this one included."""
        self.end_turn = await self.process.suspects.turn()
        alone = await self.batch.call(
            "HINCRBY", keys.attempts(self.run_id), keys.alone_field(self.n), 1
        )
        return 1 + int(alone)

    async def _not_begun(self, refused: Refused) -> StepOutcome:
        """The task did not begin (RUN_BEGIN's reply): a stale one sends its successor again if it
        seems lost; a busy one notes how long the other holder's lease still runs."""
        if refused.what == "stale":  # committed already
            await asyncio.to_thread(self.flush_outbox)
        self.lease_left_ms = refused.lease_left_ms
        return refused.what

    def _took_lease(self, begin: Started, sent_at: float) -> None:
        """The step holds the run's lease now (RUN_BEGIN's 'run' reply): note what it says."""
        r = self.run_id
        self.token = begin.token
        self.delivered = begin.attempts
        self.lease = f"{self.owner}:{begin.token}"
        self.held = self.process.leases.hold(
            r, self.n, self.lease, sent_at, self.on_lost
        )
        self.state = begin.state
        self.trace = StepTrace(r, self.n, self.state, self.task.task_id)
        self.segment = int(self.state.get("segment", 0))
        self.prefix = f"{keys.segment_name(self.segment)}/"
        self.outside = begin.outside

    def _options(
        self,
        spec: RunSpec,
        live: LiveLoop,
        tools: list[ToolSpec],
        messages: Any,
        decisions: Any,
    ) -> RunToolLoopOptions:
        generate = self.process.generate_for(
            spec.provider, spec.fallback, stream=spec.stream
        )
        if self.metrics is not None:
            generate = counted(generate, spec.provider, self.metrics)
        generate = flow.wrap_generate(self.process, generate, spec)
        return RunToolLoopOptions(
            generate=generate
            if live.deltas is None
            else streaming(generate, live.deltas.interval),
            model=spec.model,
            system=spec.system,
            messages=messages,
            tools=tools,
            budget=Budget(
                usd=spec.budget_usd
                + float(self.state.get("budget_added", 0)),  # follow-ups' top-ups
                finish_at=spec.finish_at,
                spent_usd=float(self.state.get("carried_usd", 0)),
                spent=live.spent_outside,
            ),
            max_steps=max(
                0,
                spec.max_steps
                + int(self.state.get("steps_added", 0))
                - self.steps_base,
            ),
            step=live.journal.step,
            signal=live.controller.signal,
            reasoning=spec.reasoning,
            on_step=live.events.append if live.deltas is None else live.deltas.on_step,
            finish_note=spec.finish_note,
            keep_images=spec.keep_images,
            cache=spec.cache,
            cache_ttl=spec.cache_ttl,
            context=spec.context,
            max_tool_result_bytes=self.settings.max_tool_result_bytes,
            max_image_bytes=self.settings.max_image_bytes,
            decisions=decisions,
            steers=Steering(live),
            supports=self._supports(spec),
            count_tokens=self._count_tokens(spec),
        )

    def _supports(self, spec: RunSpec) -> Callable[[str, str], bool] | None:
        """What the run's model has on the head of its provider chain (`PromptGen.supports`, from
        the model catalogue): how a context policy compacts (docs/context.md)."""
        asks = getattr(self.process.prompt_gen, "supports", None)
        if not callable(asks):
            return None

        def supports(feature: str, model: str) -> bool:
            return bool(asks(feature, model, provider=spec.provider))

        return supports

    def _count_tokens(
        self, spec: RunSpec
    ) -> Callable[[PromptGenRequest, AbortSignal], Awaitable[int | None]] | None:
        """The provider's token count of a request (`PromptGen.count_tokens`, the run's provider),
        asked by a context policy near its threshold (docs/context.md)."""
        counts = getattr(self.process.prompt_gen, "count_tokens", None)
        if not callable(counts):
            return None

        async def count_tokens(
            request: PromptGenRequest, signal: AbortSignal
        ) -> int | None:
            found = await counts(request, signal=signal, provider=spec.provider)
            return None if found is None else int(found)

        return count_tokens

    async def _until_boundary(self, outcome_future: LoopOutcome) -> StepOutcome:
        """Wait for the loop to reach the next step's boundary (or its end), then commit."""
        assert self.live is not None
        live = self.live
        timeout = self.settings.step_timeout
        deadlines = self.process.deadlines
        # one timer for every step of the process, not one per step
        deadlines.watch(outcome_future)
        timed_out = False
        try:
            outcome = await outcome_future
        except StepTimedOut:
            timed_out = True
            return await self.commit_failure(
                TimeoutError(
                    f"The step ran longer than {timeout:g} s (TOOLLOOP_STEP_TIMEOUT) and was stopped.\n"
                    "  Give the tool or model call a shorter timeout of its own, or raise the limit; "
                    "then retry the run."
                )
            )
        except LeaseLostError as error:
            return await self.lost_lease(error)
        except Exception as error:
            if isinstance(live.controller.signal.reason, LeaseLostError):
                return await self.lost_lease(live.controller.signal.reason)
            return await self.commit_failure(error)
        finally:
            deadlines.forget(outcome_future)
            self.process.disarm(self.run_id, live.controller)
            if timed_out or not outcome_future.done() or outcome_future.cancelled():
                live.close()  # stopped waiting (timeout, shutdown): the loop's work stops too
        if isinstance(live.controller.signal.reason, LeaseLostError):
            return await self.lost_lease(live.controller.signal.reason)
        if isinstance(outcome, StepBoundary):
            return await self.commit_next(outcome.key)
        return await self.commit_result(outcome)

    @property
    def events(self) -> list[LoopEvent]:
        return self.live.events if self.live is not None else []

    # -- during the step ------------------------------------------------------------------------

    def before_live(self, key: str) -> Awaitable[None] | None:
        """Just before the step's work: cancellation armed, and the lease checked (no round trip
        unless its deadline is near; an awaitable then, which the journal awaits)."""
        assert self.live is not None
        self.process.hooks.point("work:before", run=self.run_id, key=key)
        # a `spawn` wait only reads how its children ended: a cancel does not skip it (the children's
        # spend is counted), the next step stops the run
        collects = children.collects(self.live, key)
        if not collects:
            self.process.arm(self.run_id, self.live.controller)
        if self.trace is not None:
            self.trace.enter()
        if self.metrics is not None:
            self.metrics.work_began(key, self.queue, self.delivered)
        if self.state.get("cancel") == "1" and not collects:
            self.live.controller.abort("cancel")
        elif self.process.interrupt_heard(self.run_id, self.segment, self.state):
            # the run ends `interrupted` (workers/client/talk.py)
            self.live.controller.abort("interrupt")
        if self.held is None:
            return None
        return self.process.leases.begin_work(self.held, self.live.controller)

    def after_live(self, key: str) -> None:
        if self.held is not None:
            self.process.leases.end_work(self.held)

    def on_lost(self, error: LeaseLostError) -> None:
        """The lease was lost while the step's work ran: abort the work and stop waiting for it."""
        live = self.live
        if live is None:
            return
        live.controller.abort(error)
        if live.outcome is not None and not live.outcome.done():
            live.outcome.set_exception(error)

    async def lost_lease(self, error: LeaseLostError) -> StepOutcome:
        """The step's work was stopped for a lost lease: commit nothing, free the lease if it is
        still ours, and re-drive (the copy holding the lease goes on, or this one takes it anew)."""
        pending = self.live.journal.pending if self.live is not None else []
        what = ", ".join(
            f"{self.prefix}{key} (${cost:.6f})" for key, _, cost in pending
        )
        log.warning(
            "run %s: step %s stopped: %s.\n  Not committed: %s; the step runs again under a live lease.",
            self.run_id,
            self.n,
            error,
            what or "no finished work",
        )
        if self.live is not None and self.live.deltas is not None:
            self.live.deltas.drop()
        await self.release()
        if self.metrics is not None:
            self.metrics.leases_lost.inc()
        return "fenced"

    async def release(self) -> None:
        self.drop_lease()  # first: no renewal takes the lease again once it is freed
        if getattr(self, "lease", None):
            with contextlib.suppress(Exception):
                await self.batch.script(
                    LEASE_RELEASE, [keys.lease(self.run_id)], [self.lease]
                )

    def drop_lease(self) -> None:
        if self.held is not None:
            self.process.leases.drop(self.held)

    def end(self, outcome: StepOutcome) -> None:
        """The step is over: its lease dropped, its trace ended, its loop closed unless kept for the
        run's next step. Then the step lets go of the loop, the lease, the trace and what its
        predecessor began (`Begun.loop`), so that none of them is left in a reference cycle with it
        (they die by refcount; the worker's collector thresholds rarely reach old cycles)."""
        self.drop_lease()
        if self.end_turn is not None:
            self.end_turn()
            self.end_turn = None
        if self.trace is not None:
            self.trace.end(
                outcome if self.outcome is None else self.outcome,
                **talk_attributes(self),
            )
        if self.live is not None and not self.kept:
            self.live.close()
        self.live = self.held = self.begun = self.trace = None

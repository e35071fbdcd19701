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
import dataclasses
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from toolloop.loop.context import CompactionState
from toolloop.loop.types import Budget, RunToolLoopOptions, ToolSpec
from workers.flow import limiter as flow
from workers.observe.tracing import StepTrace
from workers.process.deadlines import StepTimedOut
from workers.process.deltas import DeltaStream, bind
from workers.process.leases import Held
from workers.process.live import Begun, LiveLoop
from workers.process.live import Outcome as LoopOutcome
from workers.process.segment import SegmentJournal, StepBoundary
from workers.process.suspects import limit_error
from workers.process.worker_process import WorkerProcess
from workers.protocol import keys
from workers.protocol.errors import REDIS_AWAY, LeaseLostError
from workers.protocol.scripts.begin import Refused
from workers.protocol.scripts.commit import StepOutcome
from workers.protocol.scripts.lease import LEASE_RELEASE
from workers.protocol.spec import RunSpec
from workers.runs import approvals
from workers.runs.lifecycle import flush_outbox, segment_messages
from workers.step import children
from workers.step.begin import BegunStep, begin
from workers.step.children import Spawner
from workers.step.commit import StepCommit, log
from workers.step.mcptools import run_tools
from workers.step.model import model_call, model_count_tokens, model_supports
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
    commits: StepCommit | None = None
    for _ in range(3):
        started = time.monotonic()
        at = await begin(process, run_id, n, begun)
        begun = None
        if isinstance(at, Refused):
            outcome = await _not_begun(process, run_id, at)
            if outcome == "busy" and 0 <= at.lease_left_ms <= _WAIT_FOR_LEASE_MS:
                await asyncio.sleep(at.lease_left_ms / 1000 + 0.05)
                continue
            break
        step = _Step(process, task, at, started)
        commits = step.commits
        try:
            outcome = await step.run(at)
        except (
            Exception,
            asyncio.CancelledError,
        ):  # Redis unreachable, or a shutdown: free the run
            await step.release()
            raise
        finally:
            step.end(outcome)
        if outcome != "fenced":
            break
    stopped = commits.stopped if commits is not None else None
    what = f"{outcome}: {stopped}" if outcome == "stop" and stopped else outcome
    failure = commits.failure if commits is not None and outcome == "fail" else None
    return Outcome(what, failure)


async def _not_begun(
    process: WorkerProcess, run_id: str, refused: Refused
) -> StepOutcome:
    """The task did not begin (RUN_BEGIN's reply): a stale one (committed already) sends its successor
    again if it seems lost."""
    if refused.what == "stale":
        await asyncio.to_thread(
            flush_outbox,
            process.redis,
            process.celery,
            run_id,
            process.settings.outbox_age,
            process.settings.redrive_age,
        )
    return refused.what


class _Step:
    """One step of a run, holding the run's lease (`at`): the loop run to the next boundary (or its
    end), then committed by `commits`. The loop reads the step through `state`, `outside`,
    `before_live` and `after_live` (workers/process/live.py's StepContext)."""

    def __init__(
        self, process: WorkerProcess, task: Task, at: BegunStep, started: float
    ) -> None:
        # what the step keeps of its begun value: not the loaded run nor the kept loop (`run` takes
        # those), which a loop kept for the next step would otherwise hold on to through it
        self.at = dataclasses.replace(at, loaded=None, kept=None)
        self.process = process
        self.task = task
        self.run_id = at.run_id
        self.n = at.n
        self.settings = process.settings
        self.metrics = process.metrics
        self.live: LiveLoop | None = None
        self.end_turn: Callable[[], None] | None = None
        """Ends this suspect's turn (workers/process/suspects.py) when the step ends; None unless a
        suspect."""
        self.held: Held | None = process.leases.hold(
            at.run_id, at.n, at.lease, at.sent_at, self.on_lost
        )
        self.trace: StepTrace | None = StepTrace(
            at.run_id, at.n, at.state, task.task_id
        )
        self.commits = StepCommit(
            process, task, self.at, self.held, self.trace, started
        )

    @property
    def state(self) -> dict[str, str]:
        """The run's state as the step began."""
        return self.at.state

    @property
    def outside(self) -> float:
        """Spend recorded outside the loop, as the step began."""
        return self.at.outside

    @property
    def segment(self) -> int:
        return self.at.segment

    def totals(self) -> dict[str, Any]:
        return self.commits.totals()

    async def run(self, at: BegunStep) -> StepOutcome:
        """Run the step `at` began: go on with the loop this process kept, or build it from what
        RUN_BEGIN loaded; then wait for the next boundary and commit."""
        kept, commits = at.kept, self.commits
        if (
            at.delivered > 1
        ):  # a suspect (workers/process/suspects.py): its turn, then its charge
            counted = await self._suspect_turn()
            if counted > self.settings.max_deliveries:
                if kept is not None:
                    kept.close()
                return await commits.commit_failure(
                    limit_error(self.run_id, self.n, at.delivered, counted)
                )
        if kept is not None:
            self.live = kept
            commits.use(kept, None, kept.journal.replayed)
            bind(
                kept.deltas,
                self.process.batch,
                at.token,
                at.segment,
                self.process.hooks,
            )
            return await self._until_boundary(kept.go_on(self))
        loaded = at.loaded
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
        except REDIS_AWAY:
            raise  # the toolset's Redis reads: the step runs again
        except Exception as error:
            return await commits.commit_failure(error)
        live = self.live = spawner.live = LiveLoop({tool.name: tool for tool in tools})
        live.held_names = approvals.held_names(messages, decisions)
        live.journal = SegmentJournal(
            self.run_id,
            at.prefix,
            loaded.journal,
            signal=live.controller.signal,
            live_steps=1,
            before_live=live.before_live,
            after_live=live.after_live,
            pause=live.pause,
        )
        live.deltas = DeltaStream.of(
            spec.stream, self.run_id, live.events.append, self.settings.delta_interval
        )
        bind(live.deltas, self.process.batch, at.token, at.segment, self.process.hooks)
        commits.use(live, spec, 0)
        options = self._options(spec, live, tools, messages, decisions)
        if loaded.compacted and spec.context is not None:
            # the previous segment compacted: this one starts from its summary (docs/context.md)
            carried = CompactionState.model_validate_json(loaded.compacted)
            options = options.model_copy(update={"compacted": carried})
        live.max_steps = options.max_steps
        return await self._until_boundary(live.start(self, options))

    async def _suspect_turn(self) -> int:
        """Wait for the process's suspect turn (held until the step ends), then charge this delivery:
        how many deliveries of the step count, this one included."""
        self.end_turn = await self.process.suspects.turn()
        alone = await self.process.batch.call(
            "HINCRBY", keys.attempts(self.run_id), keys.alone_field(self.n), 1
        )
        return 1 + int(alone)

    def _options(
        self,
        spec: RunSpec,
        live: LiveLoop,
        tools: list[ToolSpec],
        messages: Any,
        decisions: Any,
    ) -> RunToolLoopOptions:
        return RunToolLoopOptions(
            generate=model_call(self.process, spec, self.metrics, live.deltas),
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
                - self.at.steps_base,
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
            supports=model_supports(self.process, spec),
            count_tokens=model_count_tokens(self.process, spec),
        )

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
            return await self.commits.commit_failure(
                TimeoutError(
                    f"The step ran longer than {timeout:g} s (TOOLLOOP_STEP_TIMEOUT) and was stopped.\n"
                    "  Give the tool or model call a shorter timeout of its own, or raise the limit; "
                    "then retry the run."
                )
            )
        except LeaseLostError as error:
            return await self.lost_lease(error)
        except REDIS_AWAY:
            # Redis went away under the step's work (a flow-control booking, a lease round trip):
            # nothing is committed and the step runs again (workers/worker/consumer.py), as
            # workers/protocol/errors.py says (REDIS_AWAY); the run does not fail for it
            raise
        except Exception as error:
            if isinstance(live.controller.signal.reason, LeaseLostError):
                return await self.lost_lease(live.controller.signal.reason)
            return await self.commits.commit_failure(error)
        finally:
            deadlines.forget(outcome_future)
            self.process.disarm(self.run_id, live.controller)
            if timed_out or not outcome_future.done() or outcome_future.cancelled():
                live.close()  # stopped waiting (timeout, shutdown): the loop's work stops too
        if isinstance(live.controller.signal.reason, LeaseLostError):
            return await self.lost_lease(live.controller.signal.reason)
        if isinstance(outcome, StepBoundary):
            return await self.commits.commit_next(outcome.key)
        return await self.commits.commit_result(outcome)

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
            self.metrics.work_began(key, self.at.queue, self.at.delivered)
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
            f"{self.at.prefix}{key} (${cost:.6f})" for key, _, cost in pending
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
        with contextlib.suppress(Exception):
            await self.process.batch.script(
                LEASE_RELEASE, [keys.lease(self.run_id)], [self.at.lease]
            )

    def drop_lease(self) -> None:
        if self.held is not None:
            self.process.leases.drop(self.held)

    def end(self, outcome: StepOutcome) -> None:
        """The step is over: its lease dropped, its trace ended, its loop closed unless kept for the
        run's next step. Then the step and its commit let go of the loop, the lease and the trace,
        so that none of them is left in a reference cycle with it (they die by refcount; the
        worker's collector thresholds rarely reach old cycles)."""
        self.drop_lease()
        if self.end_turn is not None:
            self.end_turn()
            self.end_turn = None
        commits = self.commits
        if self.trace is not None:
            self.trace.end(
                outcome if commits.outcome is None else commits.outcome,
                **talk_attributes(self),
            )
        if self.live is not None and not commits.kept:
            self.live.close()
        self.live = self.held = self.trace = None
        commits.live = commits.held = commits.trace = None

"""A durable run's model text, published to its event stream as it arrives (RunSpec.stream).

The loop hands each text delta of the live model call to `on_step` as a `DeltaEvent`
(SPEC 4.3). `DeltaStream.on_step` keeps the run's other events (journaled, committed with the step)
and buffers the deltas: the first one is written at once, later ones at most one write per
`interval` (TOOLLOOP_DELTA_INTERVAL_MS, 50 ms) per run, each write one `DELTA_FLUSH` script queued
on the process's Redis batch (workers/process/redisio.py: the step never waits for it; it travels in the
loop turn's pipeline). The model call reads its stream at the same pace once text flows
(`streaming` sets toolloop.deltas.READ_HOLD): one socket read, one parse and one delta per interval
and answer, not one per TCP segment.

Stream entries (beside the committed events, which carry `seq`; these carry none):

    kind=delta      segment step attempt text   text of model step `step` (ModelEvent.step) of
                    [thinking=1]                `segment`, from attempt `attempt` ("<token>": the
                                                lease's fencing token, one per try of the step;
                                                "<token>.<k>" after the provider began its answer
                                                again k times within the try); `thinking`: reasoning
    kind=discarded  segment step attempt        every delta of that attempt is text the journal
                                                does not hold: drop it (the step runs again, or
                                                the run was cancelled / failed mid-answer)

The step's `model` event follows its deltas. When a step is tried again (a crash, a lost lease) or
stops mid-answer (cancel, a timeout), the marker is written before any later delta of the run and
before the commit's events: DELTA_FLUSH writes it when the state's `streaming` field names another
attempt, RUN_COMMIT when the commit does not carry the model event of the attempt that streamed
last (`backed`). Only the copy holding the run's fence writes deltas.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable
from typing import Any

from toolloop.contract import OnDelta, PromptGenRequest, PromptGenResult
from toolloop.deltas import READ_HOLD, takes_on_delta
from toolloop.loop.tools import call
from workers.observe.hooks import NO_HOOKS, Hooks
from workers.process.redisio import Batch
from workers.protocol import keys
from workers.protocol.scripts.deltas import DELTA_FLUSH

log = logging.getLogger("toolloop.workers")

INTERVAL = 0.05
"""Seconds between two delta writes of one run (the first delta of a burst goes at once): the
default of TOOLLOOP_DELTA_INTERVAL_MS (workers/config/settings.py)."""

_SLACK = 0.1
"""A delta that comes this share of the interval early is written at once, not on a timer of its
own: the provider's held reads (READ_HOLD) come once an interval, give or take the timers' 1 ms."""

ON_DELTA: contextvars.ContextVar[OnDelta | None] = contextvars.ContextVar(
    "toolloop_on_delta", default=None
)
"""The `on_delta` of the model call running in this task (set by `streaming`, read by the worker's
innermost generate, WorkerProcess.generate_for): the rate-limit, account and metrics wrappers between
them stay as they are."""

Generate = Callable[[PromptGenRequest, Any], Any]


def streaming(generate: Generate, interval: float = INTERVAL) -> Callable[..., Any]:
    """`generate` as a callable that takes `on_delta` (so the loop streams into it), handing the
    callback down through ON_DELTA, and the delta interval as the call's READ_HOLD (its deltas are
    written that often anyway: the provider need not read more often once text flows)."""

    async def streamed(
        request: PromptGenRequest, signal: Any, on_delta: OnDelta | None = None
    ) -> PromptGenResult:
        token = ON_DELTA.set(on_delta)
        hold = READ_HOLD.set(interval if on_delta is not None else 0.0)
        try:
            result: PromptGenResult = await generate(request, signal)
            return result
        finally:
            READ_HOLD.reset(hold)
            ON_DELTA.reset(token)

    return streamed


def without_deltas(generate: Any) -> Generate:
    """A plain generate of a run that does not stream: as is, or without its `on_delta` (the loop
    gives `on_delta` to any generate that takes one, and the worker's `on_step` keeps every event)."""
    if not takes_on_delta(generate):
        return generate  # type: ignore[no-any-return]

    async def plain(request: PromptGenRequest, signal: Any) -> PromptGenResult:
        return await call(generate, request, signal)  # type: ignore[no-any-return]

    return plain


def with_fallback(prompt_gen: Any, provider: str | None, fallback: list[str]) -> Any:
    """`prompt_gen` (a PromptGen) as it is, or, with a `fallback` list, a PromptGen of the same handlers
    that starts at `provider` (its default when None) and falls back in that order."""
    if not fallback:
        return prompt_gen
    handlers = {name: prompt_gen.handler(name) for name in prompt_gen.providers()}
    return type(prompt_gen)(handlers, provider or prompt_gen.default_provider, fallback)


def streamed_from(
    prompt_gen: Any, provider: str | None, fallback: list[str]
) -> Generate:
    """The innermost generate of a streaming run: the process's PromptGen (or plain generate, when it
    takes `on_delta`), called with the ON_DELTA of the running model call."""
    if not hasattr(prompt_gen, "generate"):
        if not takes_on_delta(prompt_gen):
            return prompt_gen  # type: ignore[no-any-return]  # a model that does not stream

        async def plain(request: PromptGenRequest, signal: Any) -> PromptGenResult:
            on_delta = ON_DELTA.get()
            if on_delta is None:
                return await call(prompt_gen, request, signal)  # type: ignore[no-any-return]
            return await call(prompt_gen, request, signal, on_delta=on_delta)  # type: ignore[no-any-return]

        return plain
    prompt_gen = with_fallback(prompt_gen, provider, fallback)

    async def generate(request: PromptGenRequest, signal: Any) -> PromptGenResult:
        result: PromptGenResult = await prompt_gen.generate(
            request, signal=signal, provider=provider, on_delta=ON_DELTA.get()
        )
        return result

    return generate


class DeltaStream:
    """One run's deltas, kept with its loop across the steps this process runs (`bind` each step)."""

    __slots__ = (
        "attempt",
        "backed",
        "batch",
        "hooks",
        "interval",
        "keep",
        "last",
        "last_write",
        "parts",
        "redo",
        "run_id",
        "segment",
        "step",
        "thinking",
        "timer",
        "token",
        "writes",
    )

    def __init__(
        self, run_id: str, keep: Callable[[Any], Any], interval: float = INTERVAL
    ) -> None:
        self.run_id = run_id
        self.keep = keep
        self.interval = interval
        """Seconds between two writes (TOOLLOOP_DELTA_INTERVAL_MS)."""
        """Where the other events go (the loop's event list)."""
        self.batch: Batch | None = None
        self.hooks: Hooks = NO_HOOKS
        self.token = 0
        self.attempt = "0"
        self.redo = 0
        self.segment = 0
        self.parts: list[str] = []
        self.thinking = False
        self.step = 0
        """The step of the buffered (or last written) text."""
        self.last = -1.0
        """When this attempt last wrote (loop time), -1 before its first write."""
        self.timer: asyncio.TimerHandle | None = None
        self.backed = ""
        """The attempt mark ("<segment>|<step>|<attempt>") whose model event came after its deltas."""
        self.last_write: asyncio.Future[Any] | None = None
        """The reply of the last delta write queued: the commit waits for it (`landed`)."""

    @classmethod
    def of(
        cls,
        stream: bool,
        run_id: str,
        keep: Callable[[Any], Any],
        interval: float = INTERVAL,
    ) -> DeltaStream | None:
        """The run's delta stream when its spec says `stream`, else None (nothing changes)."""
        return cls(run_id, keep, interval) if stream else None

    def bind(
        self, batch: Batch, token: int, segment: int, hooks: Hooks = NO_HOOKS
    ) -> None:
        """The step (attempt) that runs the loop now: its batch, fencing token, segment, and the
        process's hooks (the point `stream:write`)."""
        self.batch, self.token, self.segment, self.hooks = batch, token, segment, hooks
        self.attempt, self.redo, self.backed, self.last = str(token), 0, "", -1.0
        self.writes = 0
        """Delta writes of this step (the kill point `stream:write` counts them)."""

    def on_step(self, event: Any) -> None:
        """`RunToolLoopOptions.on_step`: deltas to the stream, the rest to `keep`."""
        if event.kind != "delta":
            if event.kind == "model" and event.step == self.step and self.last >= 0:
                self.flush()  # its deltas go before the commit that carries it
                self.backed = f"{self.segment}|{self.step}|{self.attempt}"
            self.keep(event)
            return
        if event.discard:
            self.discard(event.step)
            return
        if not event.text:
            return
        if self.parts and (event.step != self.step or event.thinking != self.thinking):
            self.flush()
        self.step, self.thinking = event.step, event.thinking
        self.parts.append(event.text)
        if self.timer is None:
            loop = asyncio.get_running_loop()
            due = self.last + self.interval
            if self.last < 0 or loop.time() >= due - self.interval * _SLACK:
                self.flush()
            else:
                self.timer = loop.call_at(due, self.flush)

    def flush(self) -> None:
        """Queue the buffered text as one delta entry (no wait: it goes out with the loop turn)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if not self.parts:
            return
        text = "".join(self.parts)
        self.parts.clear()
        self.last = asyncio.get_running_loop().time()
        self._write(text)

    def discard(self, step: int) -> None:
        """The provider began the step's answer again (a retry, a fallback) or the call failed: what
        this attempt wrote is void. The marker goes now; later deltas are a new attempt `<token>.<k>`."""
        self.drop()
        self.step = step
        wrote = self.last >= 0
        self.redo += 1
        self.attempt, self.last = f"{self.token}.{self.redo}", -1.0
        if wrote:
            self._write("")

    def settle(self) -> str:
        """Before the step's commit: drop text not written yet (a step that stopped mid-answer: its
        deltas are discarded anyway); the mark RUN_COMMIT keeps ('' when no streamed model event)."""
        self.drop()
        backed, self.backed, self.last = self.backed, "", -1.0
        return backed

    async def landed(self) -> None:
        """Once the last delta write queued has run: the commit comes after it in the stream. Two
        loop turns' batches travel on two connections when the first is still out, and Redis may
        run the second first (it reads both sockets in one pass): a step's deltas would then follow
        its commit's `finished`."""
        last, self.last_write = self.last_write, None
        if last is not None:
            await asyncio.wait((last,))  # its failure is logged by `_written`

    def drop(self) -> None:
        """Write nothing more of what is buffered (a lost lease, a commit)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.parts.clear()

    def _write(self, text: str) -> None:
        if self.batch is None:
            return
        r = self.run_id
        self.writes += 1
        self.hooks.point(
            "stream:write",
            run=r,
            key=f"s{self.segment}/model:{self.step}",
            write=self.writes,
        )
        written = self.batch.script(
            DELTA_FLUSH,
            [keys.state(r), keys.fence(r), keys.events(r)],
            [
                self.token,
                self.attempt,
                self.segment,
                self.step,
                text,
                "1" if self.thinking else "",
            ],
        )
        written.add_done_callback(self._written)
        self.last_write = written

    def _written(self, future: asyncio.Future[Any]) -> None:
        error = None if future.cancelled() else future.exception()
        if (
            error is not None
        ):  # the text is in the model event all the same: only the live view lost it
            log.warning(
                "run %s: deltas of step %s not written: %s",
                self.run_id,
                self.step,
                error,
            )


def bind(
    stream: DeltaStream | None,
    batch: Batch,
    token: int,
    segment: int,
    hooks: Hooks = NO_HOOKS,
) -> None:
    """`stream.bind(...)` for a run that streams; nothing for one that does not."""
    if stream is not None:
        stream.bind(batch, token, segment, hooks)

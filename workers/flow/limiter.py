"""Flow control around a durable run's model calls and tools (docs/flow-control.md):

- provider rate limits per key and model (workers/config/ratelimit.py): a model call books its request
  and input-token estimate first and, when the limiter says so, waits on the process's loop (its
  step-consumer slot lent to other steps meanwhile) before it sends; the answer's usage settles
  the booking, and its `anthropic-ratelimit-*` / `retry-after` headers teach the limiter;
- a shared budget account (workers/client/accounts.py, `RunSpec.account`): a model call or a tool reserves
  its estimate first; near the account's limit the request carries the run's `finish_note`, past it
  the step raises the loop's budget stop (the run stops `budget`); the real cost settles the
  reservation when the work returns.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from toolloop.abort import AbortSignal, race
from toolloop.contract import PromptGenRequest, PromptGenResult, UserMessage
from toolloop.loop.run import BudgetStop
from toolloop.loop.tools import as_output, as_started, call
from toolloop.loop.types import AccountLimit, Started, ToolSpec
from toolloop.providers.call import before_retry, observe_responses
from toolloop.providers.common import estimate_input_tokens
from toolloop.providers.facade import AROUND_ATTEMPT, PromptGen, Send
from workers.client import accounts
from workers.config import ratelimit
from workers.process.worker_process import WorkerProcess
from workers.protocol.lua import Lua
from workers.protocol.scripts import accounts as account_scripts
from workers.protocol.scripts import ratelimit as rate_scripts
from workers.protocol.spec import RunSpec
from workers.runs.children import is_spawn

log = logging.getLogger("toolloop.workers")

Generate = Callable[[PromptGenRequest, AbortSignal], Awaitable[PromptGenResult]]


def wrap_generate(
    process: WorkerProcess, generate: Generate, spec: RunSpec
) -> Generate:
    """`generate` under the worker's rate limits and the run's account (as is when neither applies).
    Through the process's PromptGen, each provider attempt (the head, then each fallback it moves to)
    is booked against that provider's own limits (`AROUND_ATTEMPT`); a plain generate is booked
    against the run's provider."""
    head = str(
        spec.provider or getattr(process.prompt_gen, "default_provider", "anthropic")
    )
    # TOOLLOOP_FALLBACK's
    chain = [
        head,
        *(spec.fallback or getattr(process.prompt_gen, "fallback", [])),
    ]
    learned = ratelimit.LEARNS.intersection(chain)
    if spec.account is None and not process.settings.rate_limits and not learned:
        return generate
    per_attempt = isinstance(process.prompt_gen, PromptGen)

    async def flowing(
        request: PromptGenRequest, signal: AbortSignal
    ) -> PromptGenResult:
        flow = _Flow(process, spec, signal)
        try:
            if not per_attempt:
                result = await flow.attempt(
                    head, request, lambda sent: generate(sent, signal)
                )
            else:
                token = AROUND_ATTEMPT.set(flow.attempt)
                try:
                    result = await generate(request, signal)
                finally:
                    AROUND_ATTEMPT.reset(token)
            flow.cost = result.cost_usd
            return result
        finally:
            flow.settle()
            flow.release()

    return flowing


class _Flow:
    """One model call's flow control: each provider attempt booked against its own (key, model)
    limits; the account reserved once (at the first attempt given room), raised when a fallback's
    estimate is higher, settled with the call's cost."""

    def __init__(
        self, process: WorkerProcess, spec: RunSpec, signal: AbortSignal
    ) -> None:
        self.process, self.spec, self.signal = process, spec, signal
        self.reservation: str | None = None
        self.reserved_usd = 0.0
        self.finish = False
        self.cost = 0.0
        self.held: dict[str, str] = {}
        """What the call holds for a lease at a time (a sorted set -> its member: the account's
        reservation, the attempt's `concurrent` place), re-dated every third of a lease while the
        call runs (`renewing`): a long call keeps them, a killed worker frees them within a lease."""
        self.renewal: asyncio.Task[None] | None = None

    def hold(self, zset: str, member: str) -> None:
        self.held[zset] = member
        if self.renewal is None:
            self.renewal = asyncio.get_running_loop().create_task(self.renewing())

    async def renewing(self) -> None:
        lease_ms = self.process.settings.lease_ms
        while True:
            await asyncio.sleep(lease_ms / 3000)
            if self.held:
                zsets = list(self.held)
                _fire(
                    self.process,
                    rate_scripts.RENEW,
                    zsets,
                    [lease_ms, *(self.held[z] for z in zsets)],
                )

    def release(self) -> None:
        if self.renewal is not None:
            self.renewal.cancel()

    async def attempt(
        self, provider: str, request: PromptGenRequest, send: Send
    ) -> PromptGenResult:
        """`send(request)` to `provider` once its limits give room (facade.AroundAttempt)."""
        model = request.model or self.spec.model
        limits = ratelimit.limits_for(
            self.process.settings.rate_limits, provider, model
        )
        learns = provider in ratelimit.LEARNS
        if limits is None and not learns:
            return await send(await self.reserved(provider, request))
        return await _limited(
            self,
            send,
            request,
            lambda: self.reserved(provider, request),
            provider,
            model,
            limits or ratelimit.Limits(),
            learns,
        )

    async def reserved(
        self, provider: str, request: PromptGenRequest
    ) -> PromptGenRequest:
        """`request` once the account holds its estimate at `provider`'s price (reserved after the
        rate limiter gave room, so a long wait for room does not eat into the reservation's lease).
        A fallback dearer than what is held reserves its estimate again under the same id (the
        script replaces the amount: the call does not wait on its own reservation)."""
        account = self.spec.account
        if account is None:
            return request
        estimate = _estimate(self.process, request, provider)
        if self.reservation is None or estimate > self.reserved_usd:
            self.reservation, verdict = await reserve(
                self.process, account, estimate, self.signal, self.reservation
            )
            self.reserved_usd = estimate
            self.hold(accounts.keys_of(account)[1], self.reservation)
            self.finish = self.finish or verdict.verdict == "finish"
        if self.finish and self.spec.finish_note:
            return _with_note(request, self.spec.finish_note)
        return request

    def settle(self) -> None:
        if self.reservation is not None:
            settle(self.process, self.spec.account or "", self.reservation, self.cost)


def wrap_tools(
    process: WorkerProcess, tools: list[ToolSpec], spec: RunSpec
) -> list[ToolSpec]:
    """The run's tools, each reserving its estimate (`estimate_usd`, else 0) from the run's account
    before it runs: a one-phase tool settles its output's cost after `run`; a two-phase tool
    (`reserved_two_phase`) is charged its estimate once `start` returned and corrected to its
    output's cost when `wait` returns."""
    account = spec.account
    if account is None:
        return tools

    def wrapped(tool: ToolSpec) -> ToolSpec:
        run, estimate_usd = tool.run, tool.estimate_usd
        if is_spawn(
            tool
        ):  # its children reserve from the account themselves, as they spend
            return tool
        if tool.start is not None and tool.wait is not None:
            return reserved_two_phase(process, account, tool)
        if run is None:
            return tool

        async def reserved_run(checked: Any, signal: AbortSignal) -> Any:
            estimate = (
                float(await call(estimate_usd, checked))
                if estimate_usd is not None
                else 0.0
            )
            reservation, _ = await reserve(process, account, estimate, signal)
            cost = 0.0
            try:
                returned = await call(run, checked, signal)
                cost = as_output(returned, tool.name).cost_usd
                return returned
            finally:
                settle(process, account, reservation, cost)

        return tool.model_copy(update={"run": reserved_run})

    return [wrapped(tool) for tool in tools]


_CHARGED = "toolloop_account_usd"
"""The key of a two-phase tool's journaled handle that holds what `start` charged its account."""


def reserved_two_phase(
    process: WorkerProcess, account: str, tool: ToolSpec
) -> ToolSpec:
    """A two-phase tool under the run's account. Its start and wait are two steps (a wait may outlast
    any lease and run in another worker), so nothing is held between them: `start` reserves the
    estimate first (past the limit the run stops `budget` and the start never runs; it waits for
    room like any reservation), and once it returned the estimate is settled as spent, the job being
    under way; `wait` settles the difference to its output's cost (below the estimate: given back).
    The handle `wait` receives is the tool's own: what was charged travels beside it in the
    journaled handle (`_CHARGED`)."""
    start, wait, estimate_usd = tool.start, tool.wait, tool.estimate_usd
    assert start is not None and wait is not None

    async def reserved_start(checked: Any, signal: AbortSignal) -> Started:
        estimate = (
            float(await call(estimate_usd, checked))
            if estimate_usd is not None
            else 0.0
        )
        reservation, _ = await reserve(process, account, estimate, signal)
        charged = 0.0
        try:
            started = as_started(await call(start, checked, signal), tool.name)
            charged = estimate
        finally:
            settle(process, account, reservation, charged)
        return Started(
            started={_CHARGED: charged, "started": started.started}, rows=started.rows
        )

    async def reserved_wait(handle: Any, signal: AbortSignal) -> Any:
        charged = 0.0
        if isinstance(handle, dict) and set(handle) == {_CHARGED, "started"}:
            charged, handle = float(handle[_CHARGED]), handle["started"]
        returned = await call(wait, handle, signal)
        cost = as_output(returned, tool.name).cost_usd
        if cost != charged:
            settle(process, account, process.new_owner(), cost - charged)
        return returned

    return tool.model_copy(update={"start": reserved_start, "wait": reserved_wait})


async def reserve(
    process: WorkerProcess,
    account: str,
    usd: float,
    signal: AbortSignal,
    reservation: str | None = None,
) -> tuple[str, accounts.Verdict]:
    """Reserve `usd` from `account` for a lease (under `reservation`, replacing what it holds, else
    a new id); raise the loop's budget stop past its limit. While it fits only once reservations in
    flight settle, wait (the step's slot lent meanwhile)."""
    reservation = reservation or process.new_owner()
    while True:
        reply = await process.flow_batch.script(
            account_scripts.RESERVE,
            accounts.keys_of(account),
            [
                reservation,
                repr(float(usd)),
                process.settings.lease_ms,
                *accounts.periods(time.time()),
            ],
        )
        verdict = accounts.Verdict.of(reply)
        if verdict.verdict != "wait":
            break
        await _wait(process, random.uniform(0.05, 0.25), signal)
    if verdict.verdict == "stop":
        spent = verdict.spent_usd + verdict.reserved_usd
        limit = AccountLimit(
            name=account,
            period=verdict.period,
            period_id=verdict.period_id,
            limit_usd=verdict.limit_usd,
            spent_usd=spent,
        )
        raise BudgetStop(spent, account=limit)
    return reservation, verdict


def settle(process: WorkerProcess, account: str, reservation: str, usd: float) -> None:
    _fire(
        process,
        account_scripts.SETTLE,
        accounts.keys_of(account),
        [reservation, repr(float(usd)), *accounts.periods(time.time())],
    )


def _fire(
    process: WorkerProcess, script: Lua, keys: list[str], args: list[Any]
) -> None:
    """Run a script in this turn's batch without waiting for it (a failure is logged). Not
    `Batch.send`: its writes run inside one script, where a script cannot be called."""
    done = process.flow_batch.script(script, keys, args)
    done.add_done_callback(_logged)


def _logged(done: asyncio.Future[Any]) -> None:
    if not done.cancelled() and done.exception() is not None:
        log.warning(
            "flow control: a settle failed (%s); what it held frees after a lease",
            done.exception(),
        )


def _estimate(
    process: WorkerProcess, request: PromptGenRequest, provider: str
) -> float:
    prompt_gen = process.prompt_gen
    estimate = getattr(prompt_gen, "estimate", None)
    if estimate is None:
        return 0.0
    try:
        return float(estimate(request, provider=provider))
    except Exception:  # an unknown model: the call itself says so
        return 0.0


def _with_note(request: PromptGenRequest, note: str) -> PromptGenRequest:
    messages = list(request.messages or [])
    if any(isinstance(m, UserMessage) and m.content == note for m in messages):
        return request
    return request.model_copy(
        update={"messages": [*messages, UserMessage(content=note)]}
    )


async def _limited(
    flow: _Flow,
    send: Send,
    request: PromptGenRequest,
    reserved: Callable[[], Awaitable[PromptGenRequest]],
    provider: str,
    model: str,
    limits: ratelimit.Limits,
    learns: bool,
) -> PromptGenResult:
    """`send` once the (key, model) bucket gives room, under `limits` and, for a provider whose
    answers name its limits (`learns`), the limits learned from them: until an answer has taught the
    requests limit, one call goes first and the others wait for its answer ("learning"). Each retry
    the provider makes of the call is booked as one more request (`before_retry`)."""
    process, signal = flow.process, flow.signal
    hashed = ratelimit.key_hash(provider, limits)
    bucket = ratelimit.bucket_key(hashed, model)
    keys = [bucket, f"{bucket}:inflight"]
    opened = process.open_buckets
    open_here = (
        learns and limits == _NONE and opened.get(bucket, 0.0) > time.monotonic()
    )
    holder = "" if open_here else process.new_owner()
    # not counted when nothing is booked
    estimate = 0 if open_here else estimate_input_tokens(request)
    batch = process.flow_batch
    booked = not open_here and await _book(flow, keys, limits, estimate, holder, learns)
    if booked and limits.concurrent > 0:
        flow.hold(keys[1], holder)

    heard: list[bool] = []  # an HTTP answer was observed

    def learn(status: int, headers: Mapping[str, str]) -> None:
        heard.append(True)
        lessons = ratelimit.lessons(
            status, headers, time.time(), process.settings.max_retry_after
        )
        if lessons.limits or lessons.blocked:
            opened.pop(bucket, None)
        if lessons and (booked or lessons.limits or lessons.blocked):
            _fire(process, rate_scripts.LEARN, [bucket], lessons.args())

    async def book_retry() -> None:
        """One more request of this call (a provider retry), booked before it is sent."""
        if limits == _NONE and opened.get(bucket, 0.0) > time.monotonic():
            return
        retry = [
            limits.rpm,
            limits.itpm,
            limits.otpm,
            0,
            limits.burst_s,
            0,
            holder,
            0,
            0,
        ]
        wait_ms, _ = await batch.script(rate_scripts.BOOK, keys, retry)
        if int(wait_ms) > 0:
            await _wait(process, int(wait_ms) / 1000, signal)

    token = observe_responses.set(learn)
    retrying = before_retry.set(book_retry)
    used_in, used_out = estimate, 0
    try:
        result = await send(await reserved())
        usage = result.usage
        used_in = max(0, usage.prompt_tokens - usage.cached_tokens)
        used_out = usage.completion_tokens
        if (
            learns and booked and not heard
        ):  # answered with no HTTP answer seen (a scripted model,
            # another client): it names no limit
            _fire(process, rate_scripts.LEARN, [bucket], [0, 1])
        return result
    finally:
        before_retry.reset(retrying)
        observe_responses.reset(token)
        flow.held.pop(keys[1], None)
        if booked:
            _fire(
                process,
                rate_scripts.SETTLE,
                keys,
                [holder, used_in - estimate, used_out],
            )


async def _book(
    flow: _Flow,
    keys: list[str],
    limits: ratelimit.Limits,
    estimate: int,
    holder: str,
    learns: bool,
) -> bool:
    """BOOK until the bucket gives room (waiting as it says, the slot lent); False when nothing was
    booked: the provider names no limit for the key and none is configured (`open`)."""
    process, bucket = flow.process, keys[0]
    while True:
        wait_ms, why = await process.flow_batch.script(
            rate_scripts.BOOK,
            keys,
            [
                limits.rpm,
                limits.itpm,
                limits.otpm,
                limits.concurrent,
                limits.burst_s,
                estimate,
                holder,
                process.settings.lease_ms,
                int(learns),
            ],
        )
        if why == "open":  # not booked for a while
            process.open_buckets[bucket] = time.monotonic() + _OPEN_S
            return False
        if int(wait_ms) > 0:
            await _wait(process, int(wait_ms) / 1000, flow.signal)
        if why not in ("busy", "learning"):
            return True


_NONE = ratelimit.Limits()
_OPEN_S = 60.0
"""How long a process books nothing for a (key, model) whose provider's answers name no limit (and
none is configured); an answer that names one, or a 429, ends it at once."""


async def _wait(process: WorkerProcess, seconds: float, signal: AbortSignal) -> None:
    """Sleep on the loop, the step's consumer slot lent to other steps meanwhile."""
    steps = process.consumer
    if steps is None:
        await race(asyncio.sleep(seconds), signal)
        return
    async with steps.lend():
        await race(asyncio.sleep(seconds), signal)

"""Flow control around a durable run's model calls and tools (docs/flow-control.md):

- provider rate limits per key and model (workers/ratelimit.py): a model call books its request
  and input-token estimate first and, when the limiter says so, waits on the process's loop (its
  step-consumer slot lent to other steps meanwhile) before it sends; the answer's usage settles
  the booking, and its `anthropic-ratelimit-*` / `retry-after` headers teach the limiter;
- a shared budget account (workers/accounts.py, `RunSpec.account`): a model call or a tool reserves
  its estimate first; near the account's limit the request carries the run's `finish_note`, past it
  the step raises the loop's budget stop (the run stops `budget`); the real cost settles the
  reservation when the work returns.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from toolloop.abort import AbortSignal
from toolloop.contract import PromptGenRequest, PromptGenResult, UserMessage
from toolloop.loop.run import BudgetStop
from toolloop.loop.tools import as_output, call
from toolloop.loop.types import ToolSpec
from toolloop.providers.common import estimate_input_tokens
from toolloop.providers.http import observe_responses, race
from workers import accounts, ratelimit
from workers.process import WorkerProcess
from workers.spec import RunSpec

log = logging.getLogger("toolloop.workers")

Generate = Callable[[PromptGenRequest, AbortSignal], Awaitable[PromptGenResult]]


def wrap_generate(process: WorkerProcess, generate: Generate, spec: RunSpec) -> Generate:
    """`generate` under the worker's rate limits and the run's account (as is when neither applies)."""
    provider = str(spec.provider or getattr(process.prompt_gen, "default_provider", "anthropic"))
    config = process.settings.rate_limits
    if spec.account is None and not config.get(provider):
        return generate

    async def flowing(request: PromptGenRequest, signal: AbortSignal) -> PromptGenResult:
        model = request.model or spec.model
        limits = ratelimit.limits_for(config, provider, model)
        reservation: str | None = None

        async def reserved() -> PromptGenRequest:
            """Reserve from the account once the rate limiter gave room (a long wait for room does
            not eat into the reservation's lease)."""
            nonlocal reservation
            if spec.account is None:
                return request
            reservation, verdict = await reserve(
                process, spec.account, _estimate(process, request, provider), signal
            )
            if verdict.verdict == "finish" and spec.finish_note:
                return _with_note(request, spec.finish_note)
            return request

        cost = 0.0
        try:
            if limits is None:
                result = await generate(await reserved(), signal)
            else:
                result = await _limited(process, generate, request, reserved, signal, provider, model, limits)
            cost = result.cost_usd
            return result
        finally:
            if reservation is not None:
                settle(process, spec.account or "", reservation, cost)

    return flowing


def wrap_tools(process: WorkerProcess, tools: list[ToolSpec], spec: RunSpec) -> list[ToolSpec]:
    """The run's tools, each one-phase tool reserving its estimate (`estimate_usd`, else 0) from the
    run's account before it runs and settling its output's cost after."""
    account = spec.account
    if account is None:
        return tools

    def wrapped(tool: ToolSpec) -> ToolSpec:
        run, estimate_usd = tool.run, tool.estimate_usd
        if run is None or tool.start is not None:
            return tool

        async def reserved_run(checked: Any, signal: AbortSignal) -> Any:
            estimate = float(await call(estimate_usd, checked)) if estimate_usd is not None else 0.0
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


async def reserve(
    process: WorkerProcess, account: str, usd: float, signal: AbortSignal
) -> tuple[str, accounts.Verdict]:
    """Reserve `usd` from `account` for a lease; raise the loop's budget stop past its limit. While
    it fits only once reservations in flight settle, wait (the step's slot lent meanwhile)."""
    reservation = uuid.uuid4().hex
    while True:
        reply = await process.batch.script(
            accounts.RESERVE, accounts.keys_of(account),
            [reservation, repr(float(usd)), process.settings.lease_ms, *accounts.periods(time.time())],
        )  # fmt: skip
        verdict = accounts.Verdict.of(reply)
        if verdict.verdict != "wait":
            break
        await _wait(process, random.uniform(0.05, 0.25), signal)
    if verdict.verdict == "stop":
        raise BudgetStop(verdict.spent_usd + verdict.reserved_usd)
    return reservation, verdict


def settle(process: WorkerProcess, account: str, reservation: str, usd: float) -> None:
    _fire(process, accounts.SETTLE, accounts.keys_of(account),
          [reservation, repr(float(usd)), *accounts.periods(time.time())])  # fmt: skip


def _fire(process: WorkerProcess, source: str, keys: list[str], args: list[Any]) -> None:
    """Run a script in this turn's batch without waiting for it (a failure is logged). Not
    `Batch.send`: its writes run inside one script, where a script cannot be called."""
    done = process.batch.script(source, keys, args)
    done.add_done_callback(_logged)


def _logged(done: asyncio.Future[Any]) -> None:
    if not done.cancelled() and done.exception() is not None:
        log.warning("flow control: a settle failed (%s); what it held frees after a lease", done.exception())


def _estimate(process: WorkerProcess, request: PromptGenRequest, provider: str) -> float:
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
    return request.model_copy(update={"messages": [*messages, UserMessage(content=note)]})


async def _limited(
    process: WorkerProcess,
    generate: Generate,
    request: PromptGenRequest,
    reserved: Callable[[], Awaitable[PromptGenRequest]],
    signal: AbortSignal,
    provider: str,
    model: str,
    limits: ratelimit.Limits,
) -> PromptGenResult:
    hashed = ratelimit.key_hash(provider, limits)
    bucket = ratelimit.bucket_key(hashed, model)
    keys = [bucket, f"{bucket}:inflight"]
    holder = uuid.uuid4().hex
    estimate = estimate_input_tokens(request)
    batch = process.batch
    while True:
        wait_ms, why = await batch.script(
            ratelimit.BOOK, keys,
            [limits.rpm, limits.itpm, limits.otpm, limits.concurrent, limits.burst_s, estimate, holder,
             process.settings.lease_ms],
        )  # fmt: skip
        if int(wait_ms) > 0:
            await _wait(process, int(wait_ms) / 1000, signal)
        if why != "busy":
            break

    def learn(status: int, headers: Mapping[str, str]) -> None:
        blocked, remaining = ratelimit.lessons(status, headers, time.time())
        if blocked or remaining:
            flat = [x for pair in remaining for x in pair]
            _fire(process, ratelimit.LEARN, [bucket], [int(blocked * 1000), *flat])

    token = observe_responses.set(learn)
    used_in, used_out = estimate, 0
    try:
        result = await generate(await reserved(), signal)
        usage = result.usage
        used_in = max(0, usage.prompt_tokens - usage.cached_tokens)
        used_out = usage.completion_tokens
        return result
    finally:
        observe_responses.reset(token)
        _fire(process, ratelimit.SETTLE, keys, [holder, used_in - estimate, used_out])


async def _wait(process: WorkerProcess, seconds: float, signal: AbortSignal) -> None:
    """Sleep on the loop, the step's consumer slot lent to other steps meanwhile."""
    steps = process.consumer
    if steps is None:
        await race(asyncio.sleep(seconds), signal)
        return
    async with steps.lend():
        await race(asyncio.sleep(seconds), signal)

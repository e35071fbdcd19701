"""`PromptGen`: named handlers behind one `generate`, with fallback (SPEC 3.1).

`generate` walks `[provider or default_provider, *fallback]`, each name once. It moves on when the
error is unavailable (`is_prompt_gen_unavailable`: auth, limit, missing, unsupported, or HTTP
401/402/403/429) or a capacity error (`is_capacity`: HTTP 5xx or 529 after the handler's own retries
ran out, or a `PromptGenTimeoutError`: the call timed out on its attempt and its one retry), and the
caller's signal is not aborted; any other error (a spend limit, a retired model,
a bad request), and the caller's abort, is raised at once. When every provider fails so, the last
error is raised. Each switch logs a warning (`from`, `to`, `reason`); the answer of a provider after
a switch carries `meta["fallback_from"]`: the providers that failed before it, in order, each with
its reason, so the run's `ModelEvent` shows the switch. A provider that failed after streamed
attempts cut mid-answer hands their possible cost on its error (`cut_attempts`): it is added to the
answer that follows (toolloop/providers/cutcost.py), or carried on the last error raised.

Streaming (SPEC 4.3): `on_delta` is passed to each handler whose `execute` takes it; before moving
to the next provider after deltas went out, a discard delta (`DeltaEvent(discard=True)`) says
they are void.

Flow control (workers/flow/limiter.py): while `AROUND_ATTEMPT` holds a hook, each provider the walk tries is
called through it, `await hook(provider, request, send)`, where `send(request)` makes that
provider's call (with its own retries); the hook may wait before it sends, send a changed request
(a finish note) and raise (a budget stop is raised at once, as any error that is not unavailable or
capacity). So a worker books each attempt against the limits of the provider it goes to. No hook
(the default): each handler is called directly.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar

from toolloop.abort import NEVER_ABORTED, AbortSignal
from toolloop.contract import OnDelta, PromptGenRequest, PromptGenResult
from toolloop.deltas import Relay, takes_on_delta
from toolloop.deltas import relay as as_relay
from toolloop.errors import (
    PromptGenError,
    PromptGenTimeoutError,
    is_prompt_gen_unavailable,
)
from toolloop.providers.base import PromptGenHandler
from toolloop.providers.cutcost import Cut, with_cuts

log = logging.getLogger("toolloop.providers")

Generate = Callable[..., Awaitable[PromptGenResult]]
"""`async (request, signal, on_delta=None) -> PromptGenResult`."""

Send = Callable[[PromptGenRequest], Awaitable[PromptGenResult]]
AroundAttempt = Callable[[str, PromptGenRequest, Send], Awaitable[PromptGenResult]]
AROUND_ATTEMPT: ContextVar[AroundAttempt | None] = ContextVar(
    "around_attempt", default=None
)
"""The hook every provider attempt of `PromptGen.generate` goes through in this context (None: none)."""


def is_capacity(error: BaseException) -> bool:
    """A provider out of capacity: HTTP 5xx (529 overloaded included) raised after its retries, or
    a call that timed out on each attempt it was allowed (`PromptGenTimeoutError`)."""
    if isinstance(error, PromptGenTimeoutError):
        return True
    status = getattr(error, "status", None)
    return (
        isinstance(error, PromptGenError) and isinstance(status, int) and status >= 500
    )


def _reason(error: BaseException) -> str:
    reason = getattr(error, "reason", None)
    status = getattr(error, "status", None)
    if isinstance(reason, str):
        return f"{reason} (HTTP {status})" if status else reason
    if isinstance(error, PromptGenTimeoutError):
        return "timeout"
    return f"HTTP {status}" if status else type(error).__name__


class PromptGen:
    """Model calls through named providers: `generate`, `estimate`, `providers`, `as_generate`."""

    def __init__(
        self,
        handlers: Mapping[str, PromptGenHandler],
        default_provider: str,
        fallback: Sequence[str] = (),
    ) -> None:
        self._handlers: dict[str, PromptGenHandler] = dict(handlers)
        self._streams = {
            name: takes_on_delta(h.execute) for name, h in self._handlers.items()
        }
        """Which handlers take `on_delta` (a handler written before streaming does not)."""
        self.default_provider = default_provider
        self.fallback: list[str] = list(fallback)

    def __repr__(self) -> str:
        return (
            f"PromptGen(providers={self.providers()!r}, default_provider={self.default_provider!r}, "
            f"fallback={self.fallback!r})"
        )

    def providers(self) -> list[str]:
        """The registered provider names, in registration order."""
        return list(self._handlers)

    def handler(self, name: str) -> PromptGenHandler:
        """The handler registered as `name`; an error naming the registered ones otherwise."""
        found = self._handlers.get(name)
        if found is None:
            known = ", ".join(repr(n) for n in self._handlers) or "none"
            raise PromptGenError(
                f"prompt-gen provider {name!r} is not registered; registered: {known}.\n"
                f"  Pass one of them as provider=, or register a handler named {name!r}."
            )
        return found

    def supports(
        self, feature: str, model: str, *, provider: str | None = None
    ) -> bool:
        """Whether `model` has `feature` on the head of the chain (`provider` or the default): its
        handler's `supports(feature, model)`, False for a handler without one (fal: none). Read by
        `run_tool_loop` (`options.supports`) to pick on-demand compaction (docs/context.md)."""
        handler = self._handlers.get(provider or self.default_provider)
        asks = getattr(handler, "supports", None)
        return bool(asks(feature, model)) if callable(asks) else False

    async def count_tokens(
        self,
        request: PromptGenRequest,
        *,
        signal: AbortSignal | None = None,
        provider: str | None = None,
    ) -> int | None:
        """The input tokens of `request` as the head of the chain counts them (its handler's
        `count_tokens`: Anthropic's token counting), or None when that handler cannot count (fal:
        no counting endpoint). Errors are raised: the caller falls back to its estimate."""
        handler = self._handlers.get(provider or self.default_provider)
        counts = getattr(handler, "count_tokens", None)
        if not callable(counts):
            return None
        return int(await counts(request, signal or NEVER_ABORTED))

    def estimate(
        self, request: PromptGenRequest, *, provider: str | None = None
    ) -> float:
        """USD estimate of `request` by the head of the chain only; no network."""
        return self.handler(provider or self.default_provider).estimate(request)

    async def generate(
        self,
        request: PromptGenRequest,
        *,
        signal: AbortSignal | None = None,
        provider: str | None = None,
        on_delta: OnDelta | None = None,
    ) -> PromptGenResult:
        """One model call; `result.meta["provider"]` names the provider that answered. `on_delta`
        receives the answer's deltas as they stream in (handlers that stream; SPEC 4.3)."""
        signal = signal or NEVER_ABORTED
        relay = None if on_delta is None else as_relay(on_delta)
        head = provider or self.default_provider
        self.handler(head)
        chain = list(dict.fromkeys([head, *self.fallback]))
        last: BaseException | None = None
        failed: list[dict[str, str]] = []
        cuts: list[Cut] = []  # the failed providers' streamed attempts cut mid-answer
        around = AROUND_ATTEMPT.get()
        for index, name in enumerate(chain):
            handler = self._handlers.get(name)
            if handler is None:
                log.warning("prompt-gen fallback %r is not registered; skipped", name)
                continue
            send = self._sender(name, handler, signal, relay)
            try:
                result = await (
                    send(request) if around is None else around(name, request, send)
                )
            except Exception as error:
                if signal.aborted or not (
                    is_prompt_gen_unavailable(error) or is_capacity(error)
                ):
                    raise
                if relay is not None:
                    relay.discard()
                cuts += getattr(error, "cut_attempts", ())
                last = error
                reason = _reason(error)
                failed.append({"provider": name, "reason": reason})
                following = next(
                    (n for n in chain[index + 1 :] if n in self._handlers), None
                )
                if following is not None:
                    log.warning(
                        "prompt-gen falls back from %s to %s: %s",
                        name,
                        following,
                        reason,
                        extra={"from": name, "to": following, "reason": reason},
                    )
                continue
            meta = {**(result.meta or {}), "provider": name}
            if failed:
                meta["fallback_from"] = failed
            return with_cuts(result.model_copy(update={"meta": meta}), cuts)
        assert last is not None  # the head is registered, so it ran and failed
        if isinstance(last, PromptGenError) and cuts:
            last.cut_attempts = tuple(cuts)  # every provider's, in order
        raise last

    def _sender(
        self,
        name: str,
        handler: PromptGenHandler,
        signal: AbortSignal,
        relay: Relay | None,
    ) -> Send:
        """The call of one provider: `handler.execute`, with the deltas' relay when it streams."""

        async def send(request: PromptGenRequest) -> PromptGenResult:
            if relay is not None and self._streams.get(name, False):
                return await handler.execute(request, signal, on_delta=relay)
            return await handler.execute(request, signal)

        return send

    def as_generate(self, provider: str | None = None) -> Generate:
        """The `async (request, signal, on_delta=None) -> PromptGenResult` callable that
        `run_tool_loop` takes."""

        async def generate(
            request: PromptGenRequest,
            signal: AbortSignal,
            on_delta: OnDelta | None = None,
        ) -> PromptGenResult:
            return await self.generate(
                request, signal=signal, provider=provider, on_delta=on_delta
            )

        def supports(feature: str, model: str) -> bool:
            return self.supports(feature, model, provider=provider)

        async def count_tokens(
            request: PromptGenRequest, signal: AbortSignal
        ) -> int | None:
            return await self.count_tokens(request, signal=signal, provider=provider)

        # what run_tool_loop reads when options.supports / options.count_tokens are unset
        generate.supports = supports  # type: ignore[attr-defined]
        generate.count_tokens = count_tokens  # type: ignore[attr-defined]
        return generate

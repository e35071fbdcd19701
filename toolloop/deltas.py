"""Passing streaming deltas along (SPEC 4.3): which callables take `on_delta`, and a relay that knows
whether it passed any (so a retry, a fallback or a failure can say the ones passed are void).

`generate` callables and handlers written before streaming take `(request, signal)` only; they are
called as before (no `on_delta`), and their answers reach the loop whole, with no deltas.
"""

from __future__ import annotations

import inspect
from contextvars import ContextVar
from types import CodeType
from typing import Any

from toolloop.contract import DeltaEvent, OnDelta

DISCARD = DeltaEvent(discard=True)

READ_HOLD: ContextVar[float] = ContextVar("toolloop_read_hold", default=0.0)
"""Seconds a streamed model call in this context reads nothing after a read that passed text on
(0: it reads each piece as it arrives). What the server sends meanwhile waits in the socket and
comes as one read, parsed at once and passed on as one delta: a reader that publishes deltas every
N ms anyway (a durable worker, TOOLLOOP_DELTA_INTERVAL_MS) loses nothing by it, and the process
wakes once per N ms per answer instead of once per TCP segment. The first text is passed on as it
arrives; the answer's end comes up to one hold late. Only the keep-alive client
(toolloop/http/pool.py) can hold its reads; httpx reads as before."""

_CO_VARKEYWORDS = inspect.CO_VARKEYWORDS


def takes_on_delta(fn: Any) -> bool:
    """True when `fn` accepts an `on_delta=` keyword (named, or through `**kwargs`). A plain
    function's (or method's) answer comes from its code object (a closure made per call, as the
    worker's are, costs no `inspect.signature`)."""
    code = getattr(fn, "__code__", None)
    if (
        isinstance(code, CodeType)
        and not hasattr(fn, "__wrapped__")
        and not hasattr(fn, "__signature__")
    ):
        return _code_takes_on_delta(code)
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        (p.name == "on_delta" and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))
        or p.kind is p.VAR_KEYWORD
        for p in parameters
    )


def _code_takes_on_delta(code: CodeType) -> bool:
    named = code.co_varnames[
        code.co_posonlyargcount : code.co_argcount + code.co_kwonlyargcount
    ]
    return "on_delta" in named or bool(code.co_flags & _CO_VARKEYWORDS)


def relay(on_delta: OnDelta) -> Relay:
    """`on_delta` as a `Relay` (itself when it is one already: one relay per chain is enough, as
    each level only needs to know whether a delta went out since the last discard)."""
    return on_delta if isinstance(on_delta, Relay) else Relay(on_delta)


class Relay:
    """`on_delta` for one attempt chain: passes each delta to `target` and remembers that it did;
    `discard()` sends the discard marker when any delta went out since the last one."""

    __slots__ = ("sent", "target")

    def __init__(self, target: OnDelta) -> None:
        self.target = target
        self.sent = False

    def __call__(self, event: DeltaEvent) -> None:
        if event.discard:
            self.discard()
            return
        self.sent = True
        self.target(event)

    def discard(self) -> None:
        if self.sent:
            self.sent = False
            self.target(DISCARD)

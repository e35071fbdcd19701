"""Passing streaming deltas along (SPEC 4.3): which callables take `on_delta`, and a relay that knows
whether it passed any (so a retry, a fallback or a failure can say the ones passed are void).

`generate` callables and handlers written before streaming take `(request, signal)` only; they are
called as before (no `on_delta`), and their answers reach the loop whole, with no deltas.
"""

from __future__ import annotations

import inspect
from typing import Any

from toolloop.contract import DeltaEvent, OnDelta

DISCARD = DeltaEvent(discard=True)


def takes_on_delta(fn: Any) -> bool:
    """True when `fn` accepts an `on_delta=` keyword (named, or through `**kwargs`)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        (p.name == "on_delta" and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))
        or p.kind is p.VAR_KEYWORD
        for p in parameters
    )


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

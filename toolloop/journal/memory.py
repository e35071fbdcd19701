"""`MemoryJournal`: the journal of SPEC.md 2.5 in a dict, for scripts and tests.

Values round-trip through JSON on the way in, so what would not survive Redis fails here too, and a
first run returns exactly what a replay will.
"""

from __future__ import annotations

import json
from typing import Any

from toolloop.abort import NEVER_ABORTED, AbortSignal
from toolloop.loop.types import StepWork


class MemoryJournal:
    """An in-process journal. `entries` maps each full key to its stored JSON text.

    `prefix` is put before every key; `segment(prefix)` gives a journal over the same entries with
    another prefix (a continued conversation after an ask). `signal` is passed to every step's work.
    """

    def __init__(
        self,
        prefix: str = "",
        *,
        signal: AbortSignal = NEVER_ABORTED,
        entries: dict[str, str] | None = None,
    ) -> None:
        self.prefix = prefix
        self.signal = signal
        self.entries: dict[str, str] = {} if entries is None else entries

    def segment(self, prefix: str) -> MemoryJournal:
        return MemoryJournal(prefix, signal=self.signal, entries=self.entries)

    async def step(self, key: str, work: StepWork) -> Any:
        full = self.prefix + key
        stored = self.entries.get(full)
        if stored is None:
            result = await work(self.signal)
            stored = json.dumps(
                {"value": result.value, "cost_usd": result.cost_usd},
                ensure_ascii=False,
                allow_nan=False,
            )
            self.entries[full] = stored
        return json.loads(stored)["value"]

    def keys(self) -> list[str]:
        return list(self.entries)

"""`RunMemo`: what one run's loop and its provider calls keep so as not to build it again, owned by
the run (no process-wide state), and ending with it.

- `validated`, `derived` (toolloop/loop/records.py): the frozen model validated from a step's stored
  value, and the history message and event made from it, by the identity of that stored value
  (a journal hands back the same decoded object for a stored step every time it replays it).
- `marked` (toolloop/loop/cache.py): the copy of a history message carrying a cache mark, so the
  message that keeps its mark from one request to the next is the same object in both.
- `wire` (toolloop/providers/anthropic/encode.py): the last request's messages and the JSON bytes
  it sent for them, so a call encodes only the messages it has not sent before.

Every entry holds the object it is keyed by (by `id`), so an identity is never reused while its
entry lives. `marked` and `wire` keep only what the last request used; `validated` and `derived`
are emptied when they reach `MAX` entries.

A run's loop makes its memo (or takes the one of its journal, `memo` of the object whose bound
method `step` is, so the memo lives as long as the journal's decoded entries) and sets `run_memo`
for the calls it makes: a provider reads `run_memo.get()` and builds everything afresh without one.
A memo the loop makes for itself has `replays` False: within one loop every stored step is read
once, so `validated` and `derived` could never hit and are not kept (what they would hold, each
step's decoded value, validated model and records, would only add to what the garbage collector
walks for the run's whole life); only a journal's memo, which outlives one loop, keeps them.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

MAX = 20_000
"""Most entries of `validated` and of `derived` before each is emptied."""


class RunMemo:
    __slots__ = ("derived", "marked", "replays", "validated", "wire")

    def __init__(self, replays: bool = True) -> None:
        self.replays = replays
        """Whether `validated` and `derived` are kept (a journal's memo, read again by later loops)."""
        self.validated: dict[int, tuple[Any, Any]] = {}
        self.derived: dict[tuple[int, Any], tuple[Any, Any]] = {}
        self.marked: dict[int, tuple[Any, Any]] = {}
        self.wire: Any = None


run_memo: ContextVar[RunMemo | None] = ContextVar("toolloop_run_memo", default=None)
"""The memo of the run whose model call this is (set by `run_tool_loop` for its calls)."""


def memo_of(step: Any) -> RunMemo:
    """The journal's memo when `step` is a bound method of a journal that keeps one, else a new one."""
    found = getattr(getattr(step, "__self__", None), "memo", None)
    return found if isinstance(found, RunMemo) else RunMemo(replays=False)

"""How the `toolloop` command shows runs: one line per event, a status block, a progress line.

Events and statuses arrive from `workers.client.sync` as pydantic models or dicts; `field()` reads
either, so the renderer does not care which.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Any, TextIO

from toolloop.providers.catalog import Catalog, ModelPrice
from toolloop.providers.models_file import catalog_from_env


def field(obj: Any, name: str, default: Any = None) -> Any:
    """`obj.name` or `obj[name]`, else `default`."""
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def as_dict(obj: Any) -> Any:
    dump = getattr(obj, "model_dump", None)
    return dump(mode="json") if callable(dump) else obj


def _short(text: Any, width: int = 72) -> str:
    flat = " ".join(str(text or "").split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def _call(call: Any) -> str:
    args = field(call, "input") or {}
    inner = (
        ", ".join(f"{k}={v!r}" for k, v in args.items())
        if isinstance(args, dict)
        else repr(args)
    )
    return f"{field(call, 'name')}({_short(inner, 40)})"


@dataclass
class Totals:
    """What the events of a run add up to: tokens, cache reads and writes, model cost."""

    steps: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cache_read: int = 0
    cache_write: int = 0
    cost_usd: float = 0.0
    models: set[str] = dc_field(default_factory=set)

    def add_model(self, event: Any) -> None:
        usage = field(event, "usage") or {}
        self.steps += 1
        self.cost_usd += float(field(event, "cost_usd", 0) or 0)
        self.prompt_tokens += int(field(usage, "prompt_tokens", 0) or 0)
        self.completion_tokens += int(field(usage, "completion_tokens", 0) or 0)
        self.cache_read += cache_read_tokens(usage)
        self.cache_write += cache_write_tokens(usage)

    def cache_savings_usd(
        self, model: str, catalog: Catalog | None = None
    ) -> float | None:
        """Money the cache saved vs the same prompts uncached: reads at their discount, minus the
        write premium, at the prices of `catalog` (default: the catalogue in force, TOOLLOOP_MODELS
        included). None when the model has no price row."""
        price: ModelPrice | None = (catalog or catalog_from_env()).price(model)
        if price is None:
            return None
        saved = self.cache_read * (price.input - price.cache_read)
        premium = self.cache_write * (price.cache_write - price.input)
        return (saved - premium) / 1e6


class StepNumbers:
    """The run-wide number of a step, from an event's own `segment` and `step` (the journal's: the
    step restarts at 1 in every segment): the model steps of the run's earlier segments plus `step`.
    The text, model and tool lines of one step get the same number, in whatever order their
    entries arrive (a delta written after its step's commit, docs/streaming.md)."""

    def __init__(self) -> None:
        self.last: dict[int, int] = {}
        """segment -> its highest model step seen."""

    def number(self, event: Any) -> int:
        segment, step = (
            int(field(event, "segment", 0) or 0),
            int(field(event, "step", 0) or 0),
        )
        if field(event, "kind") == "model":
            self.last[segment] = max(self.last.get(segment, 0), step)
        return (
            sum(last for earlier, last in self.last.items() if earlier < segment) + step
        )


def cache_read_tokens(usage: Any) -> int:
    read = field(usage, "cached_read_tokens")
    return int(read if read is not None else field(usage, "cached_tokens", 0) or 0)


def cache_write_tokens(usage: Any) -> int:
    write = field(usage, "cached_write_tokens")
    return int(
        write if write is not None else field(usage, "cache_write_tokens", 0) or 0
    )


HIDDEN = frozenset({"kind", "type", "id", "seq", "segment", "run_id"})


def event_line(event: Any, step: int | None = None) -> str:
    """One human line for a loop event or a run event. `step` replaces the event's own step (which
    restarts at 1 in every segment of a run)."""
    kind = field(event, "kind") or field(event, "type") or "event"
    if step is not None and kind in ("model", "tool"):
        event = {**as_dict(event), "step": step}
    if kind == "model":
        usage = field(event, "usage") or {}
        tokens = (
            f"{int(field(usage, 'prompt_tokens', 0) or 0):>6,} in"
            f" ({cache_read_tokens(usage):,} cached) {int(field(usage, 'completion_tokens', 0) or 0):>5,} out"
        )
        calls = field(event, "tool_calls") or []
        what = (
            "→ " + ", ".join(_call(c) for c in calls)
            if calls
            else _short(field(event, "text"))
        )
        finish = field(event, "finish_reason")
        if finish == "refusal":
            what = f"refused ({refusal_text(field(event, 'refusal'))})"
        elif finish in ("paused", "length"):
            what = f"[{'paused: sent back' if finish == 'paused' else 'cut at max_tokens'}] {what}"
        cost = float(field(event, "cost_usd", 0) or 0)
        failed = field(event, "fallback_from") or []
        via = ""
        if failed:  # the provider that answered after others failed (facade fallback)
            before = ", ".join(
                f"{field(f, 'provider')} {field(f, 'reason')}" for f in failed
            )
            via = f"  [via {field(event, 'provider')}: {before}]"
        return (
            f"step {field(event, 'step'):>2}  model  {tokens}  ${cost:.4f}  {what}{via}"
        )
    if kind == "tool":
        name = str(field(event, "name"))
        cost = float(field(event, "cost_usd", 0) or 0)
        summary = _short(field(event, "summary"), 60)
        return (
            f"step {field(event, 'step'):>2}  tool   {name:<16} ${cost:.4f}  {summary}"
        )
    if kind == "budget":
        spent, limit = (
            float(field(event, "spent_usd", 0)),
            float(field(event, "limit_usd", 0)),
        )
        account = field(event, "account")
        if account:  # the shared account's limit stopped it, not the run's own budget
            run = f"the run spent ${spent:.4f} of its ${limit:.2f}"
            return f"budget   budget stop: {account_text(account)} ({run})"
        what = (
            "finish mode starts" if field(event, "mode") == "finish" else "budget stop"
        )
        return f"budget   {what} at ${spent:.4f} of ${limit:.2f}"
    data = as_dict(event) or {}
    if kind in TALK_EVENTS:
        return f"run      {talk_text(str(kind), data)}"
    return f"run      {run_event_text(str(kind), data)}"


TALK_EVENTS = frozenset({"follow_up", "steer_sent", "steer"})
"""The events of a run you talk to (docs/conversations.md)."""


def talk_text(kind: str, data: dict[str, Any]) -> str:
    """A follow-up, a steer sent, a steer taken, in a few words."""
    if kind == "follow_up":
        return f"follow-up: {_short(data.get('content'), 60)}"
    if kind == "steer_sent":
        return f"steer sent ({data.get('steer_id')}): read before the next model call"
    return f"steer taken before model turn {data.get('step')}: {_short(data.get('content'), 60)}"


def run_event_text(kind: str, data: dict[str, Any]) -> str:
    """The run-level events (queued, parked, answered, resumed, finished, failed) in a few words."""
    if kind == "queued":
        return f"queued (model {data.get('model')}, toolset {data.get('toolset')})"
    if kind == "parked":
        held = data.get("approvals")
        if held:
            calls = "call" if len(held) == 1 else f"{len(held)} calls"
            return (
                f"parked: no worker holds it while it waits for a decision on {calls}"
            )
        return "parked: no worker holds it while it waits for the answer"
    if kind == "answered":
        return f"answered: {_short(data.get('content'), 60)}"
    if kind == "approval_requested":
        held = json.dumps(data.get("input"), sort_keys=True)
        return f"approval requested: {data.get('name')} {_short(held, 60)} (call {data.get('call_id')})"
    if kind == "approval_decided":
        by = f" by {data['actor']}" if data.get("actor") else ""
        why = f": {_short(data.get('reason'), 40)}" if data.get("reason") else ""
        early = " (before the run parked)" if data.get("early") else ""
        return f"approval decided: {data.get('action')}{why}{by} (call {data.get('call_id')}){early}"
    if kind == "approval_expired":
        return f"approval expired: {data.get('outcome')} by default (call {data.get('call_id')})"
    if kind == "finished":
        stopped = data.get("stopped_by") or data.get("status") or "done"
        if stopped == "refused":
            return f"finished: refused ({refusal_text(data.get('refusal'))})"
        if data.get("account"):
            return f"finished: {stopped} ({account_text(data['account'])})"
        return f"finished: {stopped}"
    if kind == "failed":
        error = (
            data.get("error_message") or data.get("message") or data.get("error") or ""
        )
        return f"failed: {data.get('error_class') or ''} {_short(error, 80)}".rstrip()
    rest = {k: v for k, v in data.items() if k not in HIDDEN and v not in (None, "")}
    return kind + ("  " + _short(json.dumps(rest, default=str), 90) if rest else "")


def account_text(account: Any) -> str:
    """`account tenant-1 reached its limit of $1.00 per day (2026-12-02: $0.9900 spent)`."""
    name, period, period_id = (
        field(account, k) for k in ("name", "period", "period_id")
    )
    limit, spent = (
        float(field(account, "limit_usd", 0) or 0),
        float(field(account, "spent_usd", 0) or 0),
    )
    per = "in total" if period == "total" else f"per {period}"
    when = "" if period == "total" else f"{period_id}: "
    return f"account {name} reached its limit of ${limit:.2f} {per} ({when}${spent:.4f} spent)"


def refusal_text(refusal: Any) -> str:
    """`category cyber: <explanation>` of a refusal's details (either may be missing)."""
    category = field(refusal, "category") if refusal else None
    explanation = field(refusal, "explanation") if refusal else None
    text = f"category {category}" if category else "no category"
    return f"{text}: {_short(explanation, 80)}" if explanation else text


class Progress:
    """A status line kept at the bottom of a terminal, redrawn after each event line. On a pipe it
    prints nothing but the event lines."""

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out or sys.stdout
        self.live = self.out.isatty()
        self.status = ""

    def line(self, text: str) -> None:
        """An event line; the status line is drawn again by the next `set` (with fresh figures)."""
        if self.live and self.status:
            self.out.write("\r\x1b[K")
        self.out.write(text + "\n")
        self.out.flush()

    def set(self, status: str) -> None:
        self.status = status
        self.redraw()

    def redraw(self) -> None:
        if self.live and self.status:
            self.out.write("\r\x1b[K" + self.status)
        self.out.flush()

    def clear(self) -> None:
        if self.live and self.status:
            self.out.write("\r\x1b[K")
            self.out.flush()
        self.status = ""

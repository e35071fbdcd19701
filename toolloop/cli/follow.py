"""Watch a run: print its events as lines (or JSON), keep a progress line on a terminal, answer its
questions when asked to, and stop when it stops."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

from toolloop.cli.render import (
    Progress,
    StepNumbers,
    Totals,
    account_text,
    as_dict,
    event_line,
    field,
)
from toolloop.cli.stream import STREAM_KINDS, TextView
from workers.client import Client, ShardedClient

FINAL = frozenset(
    {"done", "budget", "steps", "cancel", "refused", "failed", "interrupted"}
)
Runs = Client | ShardedClient
"""A client of the runs: one Redis, or every shard of TOOLLOOP_REDIS_SHARDS (commands.connect_runs)."""
Answerer = Callable[[dict[str, Any]], str | None]
"""Given the held ask's input, the answer text; None to stop following instead."""


def print_status(client: Runs, run_id: str, *, as_json: bool = False) -> None:
    status = as_dict(client.status(run_id))
    if as_json:
        print(json.dumps(status, default=str, indent=2))
        return
    held = status.pop("approvals", None) or []
    for tree_field in ("depth", "children"):  # a root without children shows neither
        if not status.get(tree_field):
            status.pop(tree_field, None)
    shown = {
        key: _shown(key, value) for key, value in status.items() if not _empty(value)
    }
    if status.get("account_stop"):
        shown["account_stop"] = account_text(status["account_stop"])
    width = max(map(len, shown), default=0)
    for key, value in shown.items():
        print(f"{key:<{width}}  {value}")
    if status.get("children"):
        print_tree(client.tree(run_id), run_id)
    states = client.decisions(run_id) if held else {}
    waiting = []
    for approval in held:
        print(approval_text(approval))
        state = states.get(approval["call_id"])
        if state is not None and state.state in ("queued", "refused"):
            print("  " + decision_text(state.model_dump(mode="json")))
        if state is None or state.state != "queued":
            waiting.append(approval["call_id"])
    if waiting:
        call = waiting[0]
        print(
            f"decide with: toolloop approve {run_id} {call} | toolloop reject {run_id} {call} 'REASON' | "
            f"toolloop edit {run_id} {call} '{{JSON}}'"
        )


def decision_text(state: dict[str, Any]) -> str:
    """Where one decision stands, in a line: queued, decided, expired, refused or pending."""
    what = state["state"]
    action = state.get("action") or ""
    by = (
        f" by {state['actor']}"
        if state.get("actor") and state.get("actor") != "deadline"
        else ""
    )
    why = f" ({state['reason']})" if state.get("reason") else ""
    if what == "queued":
        return f"decision {action}{by}{why}: queued, applied when a worker runs"
    if what == "decided":
        return f"decision {action}{by}{why}: decided (call {state['call_id']})"
    if what == "expired":
        return (
            f"decision {action}: no decision before the deadline, its default applied"
        )
    if what == "refused":
        return f"decision refused: {state.get('why')} (the call still waits)"
    return f"decision pending: call {state['call_id']} waits for a decision"


def approval_text(approval: dict[str, Any]) -> str:
    """One pending approval: call id, tool, input, digest, estimate and deadline."""
    lines = [
        f"approval  {approval['call_id']}  {approval['name']}",
        f"  input   {json.dumps(approval['input'], sort_keys=True)}",
        f"  digest  {approval['input_digest']}",
    ]
    if approval.get("estimate_usd") is not None:
        lines.append(f"  estimate ${approval['estimate_usd']:.4f}")
    if approval.get("deadline"):
        when = _shown("deadline_at", approval["deadline"])
        lines.append(f"  deadline {when} (then: {approval.get('default', 'reject')})")
    return "\n".join(lines)


def print_tree(nodes: list[Any], run_id: str) -> None:
    """The run's tree (docs/children.md): each run under its parent, its status, spend and budget
    slice, the question of one that asks, and how to answer it through `run_id`."""
    depth: dict[str | None, int] = {None: -1}
    print("tree")
    asking = None
    for node in nodes:
        depth[node.run_id] = depth.get(node.parent, 0) + 1
        budget = f" of ${node.budget_usd:.4f}" if node.budget_usd is not None else ""
        indent = "  " * (depth[node.run_id] + 1)
        line = f"{indent}{node.run_id}  {node.status:<8} ${node.spent_usd:.4f}{budget}"
        if node.asked is not None:
            line += f"  asks: {_short(json.dumps(node.asked), 60)}"
            asking = asking or node.run_id
        print(line)
    if asking is not None and asking != run_id:
        print(
            f"answer with: toolloop answer {run_id} 'TEXT'   (it goes to {asking}, the first that asks)"
        )


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _empty(value: Any) -> bool:
    return (
        value is None
        or value is False
        or (isinstance(value, str | list | dict) and not value)
    )


def _shown(key: str, value: Any) -> str:
    if key.endswith("_at") and isinstance(value, int | float):
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(value))
    if key.endswith("_usd") and isinstance(value, int | float):
        return f"${value:.4f}"
    return json.dumps(value) if isinstance(value, dict | list) else str(value)


def question_of(status: Any) -> dict[str, Any]:
    asked = field(status, "asked") or {}
    asked = field(asked, "input", asked)
    return dict(asked) if isinstance(asked, dict) else {"question": str(asked)}


def follow(
    client: Runs,
    run_id: str,
    *,
    keep_following: bool = True,
    as_json: bool = False,
    answerer: Answerer | None = None,
    totals: Totals | None = None,
    check: Callable[[], None] | None = None,
    after: str | None = None,
) -> int:
    """Print the run's events; with `keep_following`, until it reaches a final state. Exit code 1
    when it followed the run to a failure, else 0 (a budget, steps, cancel or refused stop is an outcome).
    `check` is called before every read (the demo raises from it when its worker died). A streaming
    run's text is printed as it arrives (toolloop/cli/stream.py)."""
    watch = _Watch(
        client, run_id, as_json, answerer, totals if totals is not None else Totals()
    )
    watch.after = after  # the events after this id only (`toolloop send -f`: from the follow-up on)
    while True:
        if check is not None:
            check()
        watch.show(500 if keep_following else None)
        status = client.status(run_id)
        state = str(field(status, "status"))
        watch.status_line(state, float(field(status, "spent_usd", 0) or 0))
        if state in FINAL and keep_following:
            # the run ended between the read and the status: its last events, `finished` too
            watch.show(None)
        if state in FINAL or not keep_following:
            watch.end()
            return 1 if state == "failed" and keep_following else 0
        if state == "asked" and watch.held(status) is not None:
            return 0


class _Watch:
    """What `follow` keeps between reads: the last stream id, the totals, what it answered."""

    def __init__(
        self,
        client: Runs,
        run_id: str,
        as_json: bool,
        answerer: Answerer | None,
        totals: Totals,
    ) -> None:
        self.client, self.run_id, self.as_json, self.answerer = (
            client,
            run_id,
            as_json,
            answerer,
        )
        self.totals = totals
        self.steps = StepNumbers()
        self.progress = Progress()
        self.text = TextView(self.progress.out)
        self.after: Any = None
        self.answered: set[str] = set()

    def show(self, block_ms: int | None) -> None:
        for event in self.client.events(
            self.run_id, after=self.after, block_ms=block_ms
        ):
            self.after = field(event, "id", self.after)
            kind = field(event, "kind")
            if kind == "model":
                self.totals.add_model(event)
            if self.as_json:
                print(json.dumps(as_dict(event), default=str), flush=True)
            elif kind in STREAM_KINDS:
                self.progress.clear()
                self.text.add(event, self.steps.number(event))
            else:  # number steps across the run's segments, tools by the turn that called them
                self.text.end()
                self.progress.line(event_line(event, step=self.steps.number(event)))

    def status_line(self, state: str, spent: float) -> None:
        if not self.text.open:  # never over text still streaming on its line
            self.progress.set(
                f"⟳ {self.run_id}  {state}  step {self.totals.steps}  ${spent:.4f}"
            )

    def end(self) -> None:
        self.text.end()
        self.progress.clear()

    def held(self, status: Any) -> int | None:
        """Show a held question or approvals once (answering a question when it can); 0 to stop."""
        self.end()
        if field(status, "approvals"):
            return self.approvals(status)
        held = question_of(status)
        key = json.dumps(held, sort_keys=True)
        if key in self.answered:
            return None
        self.answered.add(key)
        print(f"asked    {held.get('question', held)}", flush=True)
        text = self.answerer(held) if self.answerer else None
        if text is None:
            print(
                f"The run waits for an answer: toolloop answer {self.run_id} 'TEXT'",
                file=sys.stderr,
            )
            # keep following: another terminal may answer
            return None if self.answerer is None else 0
        print(f"answer   {text}", flush=True)
        self.client.answer(self.run_id, text)
        return None

    def approvals(self, status: Any) -> int | None:
        key = json.dumps(field(status, "approvals"), sort_keys=True)
        if key in self.answered:
            return None
        self.answered.add(key)
        for approval in field(status, "approvals"):
            print(approval_text(approval), flush=True)
        print(
            f"The run waits for a decision: toolloop approve|reject|edit {self.run_id} CALL",
            file=sys.stderr,
        )
        return 0 if self.answerer is not None else None

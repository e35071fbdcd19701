"""Child runs (SPEC 6.2, docs/children.md): the built-in two-phase tool `spawn`, bound to a durable
run (its definition, `spawn_tool()`, and what a child's end adds to a commit are
workers/runs/children.py), and the part of a step's commit that parks a run on its children.

A toolset that wants it lists `spawn_tool()` among its tools (the operator registers toolsets,
workers/config/toolsets.py; a run never names code). In a durable worker its two phases are bound to the
run (`bind`):

- `start` stores the call's children and queues their first steps in one script (SPAWN,
  workers/protocol/scripts/children.py). A child's id is `<parent id>.<digest of the call>-<i>`: a re-run of
  the spawning step (a redelivery after a crash) finds the call's children stored and starts none.
  A child's id begins with its parent's, so it lands on its parent's shard (workers/client/shards.py) and
  its keys on its root's slot (toolloop/journal/keys.py `run_key`). Each child holds a budget carved from
  what the parent has left (its own `budget_usd`, or an even share of what is left, one share kept
  for the parent); SPAWN refuses children that ask for more, and a parent being cancelled. With a
  shared account, the children's budgets are held in it while they are stored (refused when it has
  no room); each child then reserves from it as it spends, so its limit holds for the tree. A child
  inherits the parent's spec (model, toolset, account, limits) but its messages, budget and, when
  given, its system text and step limit; it is one level deeper (`max_depth` bounds the tree).
- After `start` commits, the run does not send its wait step: RUN_COMMIT parks it `waiting` while
  the call has children open, with no lease and no worker. The last child's end (RUN_COMMIT of its
  stop, `child_ended`) records it in the parent, adds its spend in micro-dollars (integers, so the
  rollup has no float drift) and queues the parent again, once: only a `waiting` parent moves.
- `wait` then reads how each child ended: the model gets each child's status, spend and final text;
  the step's cost is the children's spend, so the parent's spend includes its children's exactly
  and what a child did not spend is the parent's again. A cancelled parent still runs this step
  (it is not armed for the cancel: it only reads), so its children's spend is counted.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, Protocol, cast

from toolloop.abort import AbortSignal
from toolloop.contract import CHAT_MESSAGES, TextPart, UserMessage
from toolloop.journal import idempotency_key
from toolloop.loop.types import Started, ToolOutput, ToolSpec
from workers.client import accounts
from workers.observe.metrics import Metrics
from workers.observe.tracing import StepTrace
from workers.process.live import LiveLoop
from workers.process.redisio import Batch
from workers.process.worker_process import WorkerProcess
from workers.protocol import keys, names, wire
from workers.protocol.scripts import accounts as account_scripts
from workers.protocol.scripts.children import SPAWN, parse_spawn
from workers.protocol.scripts.commit import Children, CommitOutcome
from workers.protocol.spec import RunSpec
from workers.runs.children import (
    MICROS,
    ChildTask,
    SpawnInput,
    SpawnOptions,
    ended,
    is_spawn,
    options_of,
    parked,
    refused,
    wake_message,
)
from workers.step import routing


class Step(Protocol):
    """What `spawn` and a commit's child-run part read of the step running them (workers/step/
    advance.py's step, and its `StepCommit`)."""

    process: WorkerProcess
    batch: Batch
    metrics: Metrics | None
    run_id: str
    live: LiveLoop | None
    task: Any
    trace: StepTrace | None

    @property
    def state(self) -> dict[str, str]: ...

    @property
    def segment(self) -> int: ...

    def totals(self) -> dict[str, Any]: ...


@dataclass
class Spawner:
    """A run's `spawn`, bound to its process and spec; `live` is set once the run's loop exists, and
    its step (the one running now: a kept loop serves the run's next tasks too) names the run."""

    process: WorkerProcess
    spec: RunSpec
    live: LiveLoop | None = None

    def bind(self, tools: list[ToolSpec]) -> list[ToolSpec]:
        """`tools` with each `spawn_tool()` bound to this run."""
        bound = []
        for tool in tools:
            options = options_of(tool)
            if options is None:
                bound.append(tool)
                continue
            start, wait = self._start(options), self._wait
            start.__dict__["toolloop_spawn"] = options
            bound.append(tool.model_copy(update={"start": start, "wait": wait}))
        return bound

    def _start(self, options: SpawnOptions) -> Any:
        async def start(checked: SpawnInput, signal: AbortSignal) -> Started:
            return await self.start(options, checked)

        return start

    @property
    def step(self) -> Step:
        assert self.live is not None
        return cast(Step, self.live.step)

    @property
    def run_id(self) -> str:
        return self.step.run_id

    async def start(self, options: SpawnOptions, checked: SpawnInput) -> Started:
        call = _call_of(self.run_id, idempotency_key())
        state = self.step.state
        depth = int(state.get("depth", 0)) + 1
        if depth > options.max_depth:
            return _refusal(
                f"This run is at depth {depth - 1}, the deepest that may spawn children is "
                f"{options.max_depth - 1}. Do the work yourself."
            )
        if len(checked.children) > options.max_children:
            return _refusal(
                f"{len(checked.children)} children asked for; one call starts at most "
                f"{options.max_children}. Ask for fewer."
            )
        budget = round(self.spec.budget_usd * MICROS)
        spent = round(float(self.step.totals()["spent_usd"]) * MICROS)
        slices = _slices([c.budget_usd for c in checked.children], budget - spent)
        if slices is None or min(slices) <= 0:
            return _refusal(
                f"Your budget has ${max(0, budget - spent) / MICROS:.4f} left; the children ask for "
                "more. Give them smaller budgets, or fewer children."
            )
        again = await self.process.batch.call(
            "HEXISTS", keys.children(self.run_id), f"call:{call}"
        )
        # a re-run: they exist
        held = None if int(again) else await self._account_room(sum(slices))
        if isinstance(held, Started):
            return held
        try:
            return await self._spawned(call, checked, slices, budget, spent, depth)
        finally:
            if (
                held is not None
            ):  # the children reserve from the account themselves, as they spend
                settle_reservation(self.process, self.spec.account or "", held)

    async def _account_room(self, micros: int) -> str | Started | None:
        """With a shared account (RunSpec.account): hold the children's budgets in it while they are
        stored (RESERVE, atomically against every run of the account) -> the reservation id; a
        refusal when the account has no room for them; None without an account."""
        account = self.spec.account
        if account is None:
            return None
        reservation = uuid.uuid4().hex
        args = [
            reservation,
            repr(micros / MICROS),
            self.process.settings.lease_ms,
            *accounts.periods(time.time()),
        ]
        verdict = accounts.Verdict.of(
            await self.process.batch.script(
                account_scripts.RESERVE, accounts.keys_of(account), args
            )
        )
        if verdict.verdict in ("stop", "wait"):
            left = max(
                0.0, verdict.limit_usd - verdict.spent_usd - verdict.reserved_usd
            )
            return _refusal(
                f"The account {account!r} has ${left:.4f} left now; the children ask for "
                f"${micros / MICROS:.4f}. Give them smaller budgets, or fewer children."
            )
        return reservation

    async def _spawned(
        self,
        call: str,
        checked: SpawnInput,
        slices: list[int],
        budget: int,
        spent: int,
        depth: int,
    ) -> Started:
        digest = hashlib.sha256(call.encode()).hexdigest()[:8]
        ids = [
            f"{self.run_id}{keys.CHILD_SEP}{digest}-{i}"
            for i in range(len(checked.children))
        ]
        now = time.time()
        script_keys = [
            keys.state(self.run_id),
            keys.children(self.run_id),
            keys.events(self.run_id),
            keys.LIVE_RUNS,
            keys.ALL_RUNS,
            names.LLM,
        ]
        # the parent's segment span: the children's parent span
        trace = self.step.trace
        traceparent = trace.traceparent() if trace is not None and trace.valid else ""
        args: list[Any] = [
            now,
            call,
            self.run_id,
            budget,
            spent,
            now + self.process.settings.redrive_age,
            traceparent,
        ]
        for child_id, task, micros in zip(ids, checked.children, slices, strict=True):
            child = self._child_spec(task, micros)
            message = wire.task_message(
                names.ADVANCE,
                [child_id, 1],
                names.step_id(child_id, 1),
                names.LLM,
                "model 1",
            )
            queued = {
                "model": child.model,
                "toolset": child.toolset,
                "budget_usd": child.budget_usd,
                "parent": self.run_id,
                "depth": depth,
            }
            script_keys += [
                keys.spec(child_id),
                keys.state(child_id),
                keys.inputs(child_id),
                keys.events(child_id),
                keys.outbox(child_id),
            ]
            args += [
                child_id,
                child.model_dump_json(),
                CHAT_MESSAGES.dump_json(child.messages).decode(),
                json.dumps(queued),
                micros,
                message.raw,
            ]
        spawned = parse_spawn(await self.process.batch.script(SPAWN, script_keys, args))
        self.process.hooks.point("spawn:after", run=self.run_id, key=call)
        if spawned.what == "over":
            return _refusal(
                f"Your budget has ${spawned.remaining_micros / MICROS:.4f} left; the children ask "
                "for more. Give them smaller budgets, or fewer children."
            )
        if spawned.what in ("ended", "cancelled"):
            return _refusal(
                f"Not run: the run is {'cancelled' if spawned.what == 'cancelled' else 'ended'}."
            )
        if spawned.what == "started" and self.process.metrics is not None:
            self.process.metrics.children_started(len(spawned.ids))
        self._sent_events(spawned.ids)
        rows = [
            f"child {child_id}: ${micros / MICROS:.4f}"
            for child_id, micros in zip(spawned.ids, slices, strict=False)
        ]
        return Started(started={"call": call, "children": spawned.ids}, rows=rows)

    def _child_spec(self, task: ChildTask, micros: int) -> RunSpec:
        update: dict[str, Any] = {
            "messages": [UserMessage(content=task.prompt)],
            "budget_usd": micros / MICROS,
        }
        if task.system is not None:
            update["system"] = task.system
        if task.max_steps is not None:
            update["max_steps"] = task.max_steps
        return self.spec.model_copy(update=update)

    def _sent_events(self, ids: list[str]) -> None:
        """The children's first steps' `task-sent` events (Flower shows each child from its queue)."""
        hostname = str(self.step.task.hostname or "")
        if not hostname:
            return
        events = self.process.events(hostname)
        for child_id in ids:
            task_id = names.step_id(child_id, 1)
            events.send(
                "task-sent",
                {
                    "uuid": task_id,
                    "root_id": task_id,
                    "parent_id": None,
                    "name": names.ADVANCE,
                    "args": repr([child_id, 1]),
                    "kwargs": "'model 1'",
                    "retries": 0,
                    "eta": None,
                    "expires": None,
                    "queue": names.LLM,
                    "exchange": "",
                    "routing_key": names.LLM,
                },
            )

    async def _wait(self, handle: Any, signal: AbortSignal) -> ToolOutput:
        if not isinstance(handle, dict) or "children" not in handle:
            return refused(
                str((handle or {}).get("refused") if isinstance(handle, dict) else "")
                or "spawn started nothing."
            )
        ids = [str(one) for one in handle["children"]]
        records: list[Any] = []
        for _ in range(
            50
        ):  # woken by the last child's end: every record is there (a short grace else)
            records = await self.process.batch.call(
                "HMGET", keys.children(self.run_id), *ids
            )
            if all(records):
                break
            await asyncio.sleep(0.1)
        ended = [
            json.loads(r) if r else {"child": i, "status": "running"}
            for i, r in zip(ids, records, strict=True)
        ]
        micros = sum(int(e.get("spent_micros") or 0) for e in ended)
        return ToolOutput(
            value=ended,
            content=[TextPart(text=_summary(ended))],
            cost_usd=micros / MICROS,
        )


def _call_of(run_id: str, scope: str | None) -> str:
    """The spawning step of a start's journal scope ("<run>/<segment>/tool:<call id>:start"), as
    "<segment>/<call id>"."""
    if not scope or not scope.startswith(f"{run_id}/"):
        raise RuntimeError(
            "spawn's start ran outside its journal step.\n  Run it as a tool of a durable run."
        )
    segment, _, key = scope[len(run_id) + 1 :].partition("/")
    return f"{segment}/{key.removeprefix('tool:').removesuffix(':start')}"


def _slices(asked: list[float | None], remaining: int) -> list[int] | None:
    """Each child's budget in micro-dollars: its own, or an even share of what is left once the given
    ones are taken (one share kept for the parent). None when the given ones exceed `remaining`."""
    given = [round(usd * MICROS) for usd in asked if usd is not None]
    if sum(given) > remaining:
        return None
    unset = sum(1 for usd in asked if usd is None)
    share = (remaining - sum(given)) // (unset + 1) if unset else 0
    return [round(usd * MICROS) if usd is not None else share for usd in asked]


def _refusal(text: str) -> Started:
    return Started(started={"refused": text})


def _summary(ended: list[dict[str, Any]]) -> str:
    lines = [f"{len(ended)} child run{'s' if len(ended) != 1 else ''} finished:"]
    for e in ended:
        head = f"- {e.get('child')}: {e.get('status')}, ${float(e.get('spent_usd') or 0):.4f}"
        body = e.get("final_text") or e.get("error") or ""
        lines.append(f"{head}\n{body}" if body else head)
    return "\n".join(lines)


def waits_on(
    live: LiveLoop | None, next_key: str | None, segment: int
) -> Children | None:
    """A 'next' commit whose next step is a `spawn` wait: the children field RUN_COMMIT checks."""
    if (
        not next_key
        or not next_key.endswith(":wait")
        or not is_spawn(routing.tool_of(live, next_key))
    ):
        return None
    call_id = next_key.removeprefix("tool:").removesuffix(":wait")
    call = f"{keys.segment_name(segment)}/{call_id}"
    return Children(wait_open=f"open:{call}", waiting=json.dumps({"call": call}))


def settle_reservation(process: WorkerProcess, account: str, reservation: str) -> None:
    """Free an account reservation at no cost (SETTLE, in the process's next batch)."""
    args = [reservation, "0.0", *accounts.periods(time.time())]
    done = process.batch.script(account_scripts.SETTLE, accounts.keys_of(account), args)
    # a lost one expires
    done.add_done_callback(lambda settled: settled.cancelled() or settled.exception())


# -- what a step's commit adds (workers/step/commit.py) ----------------------------------------------


def collects(live: LiveLoop | None, key: str) -> bool:
    """Step `key` is a `spawn` wait: it only reads how the children ended (a cancel does not skip it,
    so their spend is counted; its cost is theirs, counted as they spent)."""
    return key.endswith(":wait") and is_spawn(routing.tool_of(live, key))


def commit_part(
    step: Step, outcome: CommitOutcome, next_key: str | None, state: dict[str, Any]
) -> Children | None:
    """What child runs add to `step`'s commit (RUN_COMMIT's `children`): a park on the children of a
    `spawn` whose wait runs next; a child's end, for its parent; a child's question, for its
    ancestors. `state` is what the commit sets (`step.state`: the run's state as the step began)."""
    if outcome == "next":
        return waits_on(step.live, next_key, step.segment)
    if outcome in ("stop", "fail"):
        part = ended(step.run_id, step.state, str(state.get("status")), state)
        if part is not None and step.metrics is not None:
            step.metrics.child_ended(str(state.get("status")))
        return part
    if "asked" in state:
        return parked(step.run_id, json.loads(state["asked"]))
    return None


def wake_parent(step: Step, member: str) -> None:
    """Send the step of the parent `step`'s child run woke by ending (its outbox holds it: a lost send
    is the sweeper's), with its `task-sent` event."""
    parent = keys.parent_of(step.run_id)
    assert parent is not None
    queue, message = wake_message(parent, member)
    step.batch.send("LPUSH", queue, message.raw)
    step.process.events(step.task.hostname).send(
        "task-sent",
        {
            "uuid": message.task_id,
            "root_id": message.task_id,
            "parent_id": None,
            "name": names.ADVANCE,
            "args": message.argsrepr,
            "kwargs": message.kwargsrepr,
            "retries": 0,
            "eta": None,
            "expires": None,
            "queue": queue,
            "exchange": "",
            "routing_key": queue,
        },
    )

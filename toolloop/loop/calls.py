"""Answering the tool calls of a turn (SPEC 2.4, 4.4): each call one journal step, in order; an
ask and calls that need approval are held; a decided call (a resume) is answered as decided. A
mixin of the loop's run (`toolloop/loop/run.py`), which owns the state it reads.

A tool whose `run`, `start` or `wait` raised what only stops a process (`ToolCrashed`,
toolloop/loop/tools.py) is answered with a tool error the model reads, journaled as its step's value
(a replay gives the same answer); a `start` that crashed journals the error in its handle and its
wait step answers with it, calling no `wait`. Any `Exception` still ends the loop (SPEC 2.4)."""

from __future__ import annotations

from pydantic import BaseModel

from toolloop import telemetry
from toolloop.abort import NEVER_ABORTED, AbortSignal
from toolloop.contract import ToolCall
from toolloop.loop.approvals import (
    ApprovalError,
    check_digest,
    edited_output,
    input_digest,
    rejected_text,
)
from toolloop.loop.history import History
from toolloop.loop.records import derived, tool_records, validated
from toolloop.loop.tools import (
    ToolCrashed,
    as_output,
    as_started,
    bounded,
    call,
    call_tool,
    text_answer,
    validate_input,
)
from toolloop.loop.types import (
    AccountLimit,
    Approval,
    Asked,
    Decision,
    LoopEvent,
    RunToolLoopOptions,
    StepResult,
    ToolOutput,
    ToolSpec,
)
from toolloop.memo import RunMemo

ASK = "ask"
SECOND_ASK = "Ask one question at a time."


class _BudgetStop(Exception):
    """The breaker tripped inside a step's work: nothing is journaled, the loop stops. `account`: the
    shared account whose limit tripped it, when it was not the run's own budget."""

    def __init__(self, spent_usd: float, account: AccountLimit | None = None) -> None:
        super().__init__(spent_usd)
        self.spent_usd = spent_usd
        self.account = account


BudgetStop = _BudgetStop
"""Raised by a model call or a tool's work (a durable worker's shared budget account, workers/flow/limiter.py)
to stop the run `budget` as the breaker would: nothing is journaled."""


class _Cancel(Exception):
    """The abort signal was seen between two steps."""


class CallAnswers:
    """The tool-call half of a run: it needs `options`, `history`, `tools` and `cost`."""

    options: RunToolLoopOptions
    history: History
    tools: dict[str, ToolSpec]
    cost: float
    memo: RunMemo

    async def answer_calls(
        self, turn: int, calls: list[ToolCall], approvals: list[Approval]
    ) -> Asked | None:
        """Answer the calls of one turn in order; the held ask, if any. Held approvals join
        `approvals`; a call with a decision (a resume) is answered as the decision says."""
        decisions = self.options.decisions or {}
        held: Asked | None = None
        signal = self.options.signal
        for tool_call in calls:
            spec = self.tools.get(tool_call.name)
            rows: list[str] = []
            if spec is None:
                output = await self.own_answer(
                    tool_call, f'Unknown tool "{tool_call.name}".', is_error=True
                )
            else:
                checked = validate_input(spec, tool_call.input)
                if isinstance(checked, str):
                    output = await self.own_answer(tool_call, checked, is_error=True)
                elif spec.name == ASK:
                    if held is None:
                        held = Asked(input=checked.model_dump(mode="json"))
                        continue
                    output = await self.own_answer(tool_call, SECOND_ASK)
                elif turn == 0 or await self.needs_approval(spec, checked):
                    decision = decisions.get(tool_call.id)
                    if decision is None:
                        approvals.append(await self.approval(spec, tool_call, checked))
                        continue
                    output, rows = await self.decided(
                        spec, tool_call, checked, decision
                    )
                elif spec.two_phase:
                    output, rows = await self.run_two_phase(spec, tool_call, checked)
                else:
                    output = await self.run_one_phase(spec, tool_call, checked)
            key = (turn, tool_call.name, tool_call.id, tuple(rows))
            message, event = derived(
                self.memo, output, key, tool_records, turn, tool_call, output, rows
            )
            self.history.append(message)
            self.cost += output.cost_usd
            if self.options.on_step is not None:
                self.emit(event)
            if signal.aborted:
                raise _Cancel
        return held

    async def needs_approval(self, spec: ToolSpec, checked: BaseModel) -> bool:
        needs = spec.needs_approval
        if isinstance(needs, bool):
            return needs
        return bool(await call(needs, checked))

    async def approval(
        self, spec: ToolSpec, tool_call: ToolCall, checked: BaseModel
    ) -> Approval:
        estimate = (
            None
            if spec.estimate_usd is None
            else float(await call(spec.estimate_usd, checked))
        )
        return Approval(
            call_id=tool_call.id,
            name=spec.name,
            input=checked.model_dump(mode="json"),
            input_digest=input_digest(checked),
            estimate_usd=estimate,
        )

    async def decided(
        self,
        spec: ToolSpec,
        tool_call: ToolCall,
        checked: BaseModel,
        decision: Decision,
    ) -> tuple[ToolOutput, list[str]]:
        """A held call's answer by its decision: one journal step, `tool:<id>` (as any call's). A
        decision that does not fit is refused before any work (ApprovalError)."""
        check_digest(decision, tool_call.id, checked)
        if decision.action == "reject":
            return await self.own_answer(tool_call, rejected_text(decision.reason)), []
        run_with = checked
        if decision.action == "edit":
            checked_edit = validate_input(spec, decision.input)
            if isinstance(checked_edit, str):
                raise ApprovalError(
                    f"The edited input of call {tool_call.id!r} is refused. {checked_edit}"
                )
            run_with = checked_edit
        edited = run_with if decision.action == "edit" else None
        if spec.two_phase:
            return await self.run_two_phase(spec, tool_call, run_with, edited)
        return await self.run_one_phase(spec, tool_call, run_with, edited), []

    async def own_answer(
        self, tool_call: ToolCall, text: str, *, is_error: bool = False
    ) -> ToolOutput:
        async def work(signal: AbortSignal) -> StepResult:
            answer = text_answer(text, is_error=is_error)
            return StepResult(value=answer.model_dump(mode="json"), cost_usd=0.0)

        return validated(
            self.memo, ToolOutput, await self.options.step(f"tool:{tool_call.id}", work)
        )

    async def run_one_phase(
        self,
        spec: ToolSpec,
        tool_call: ToolCall,
        checked: BaseModel,
        edited: BaseModel | None = None,
    ) -> ToolOutput:
        async def work(signal: AbortSignal) -> StepResult:
            await self.breaker(spec, checked)
            with telemetry.tool_span(
                spec.name, tool_call.id, f"tool:{tool_call.id}"
            ) as span:
                try:
                    returned = await call_tool(
                        spec.run,
                        spec.name,
                        tool_call.id,
                        checked,
                        self.signal_for(signal),
                    )
                except ToolCrashed as crashed:
                    return StepResult(
                        value=text_answer(crashed.text).model_dump(mode="json"),
                        cost_usd=0.0,
                    )
                output = self.bounded(as_output(returned, spec.name), spec.name)
                telemetry.tool_result(span, output.cost_usd)
            if edited is not None:
                output = edited_output(output, edited)
            return StepResult(
                value=output.model_dump(mode="json"), cost_usd=output.cost_usd
            )

        return validated(
            self.memo, ToolOutput, await self.options.step(f"tool:{tool_call.id}", work)
        )

    async def run_two_phase(
        self,
        spec: ToolSpec,
        tool_call: ToolCall,
        checked: BaseModel,
        edited: BaseModel | None = None,
    ) -> tuple[ToolOutput, list[str]]:
        async def start(signal: AbortSignal) -> StepResult:
            await self.breaker(spec, checked)
            with telemetry.tool_span(
                spec.name, tool_call.id, f"tool:{tool_call.id}:start"
            ):
                try:
                    returned = await call_tool(
                        spec.start,
                        spec.name,
                        tool_call.id,
                        checked,
                        self.signal_for(signal),
                    )
                except ToolCrashed as crashed:
                    return StepResult(
                        value={"started": None, "rows": [], "crashed": crashed.text}
                    )
                started = as_started(returned, spec.name)
            return StepResult(
                value={"started": started.started, "rows": started.rows or []}
            )

        handle = await self.options.step(f"tool:{tool_call.id}:start", start)
        if self.options.signal.aborted:
            raise _Cancel

        async def wait(signal: AbortSignal) -> StepResult:
            crashed = handle.get("crashed")
            if crashed is not None:  # the start crashed: its error is the call's answer
                return StepResult(
                    value=text_answer(str(crashed)).model_dump(mode="json"),
                    cost_usd=0.0,
                )
            with telemetry.tool_span(
                spec.name, tool_call.id, f"tool:{tool_call.id}:wait"
            ) as span:
                try:
                    returned = await call_tool(
                        spec.wait,
                        spec.name,
                        tool_call.id,
                        handle["started"],
                        self.signal_for(signal),
                    )
                except ToolCrashed as crashed_wait:
                    return StepResult(
                        value=text_answer(crashed_wait.text).model_dump(mode="json"),
                        cost_usd=0.0,
                    )
                output = self.bounded(as_output(returned, spec.name), spec.name)
                telemetry.tool_result(span, output.cost_usd)
            if edited is not None:
                output = edited_output(output, edited)
            return StepResult(
                value=output.model_dump(mode="json"), cost_usd=output.cost_usd
            )

        output = validated(
            self.memo,
            ToolOutput,
            await self.options.step(f"tool:{tool_call.id}:wait", wait),
        )
        return output, list(handle.get("rows") or [])

    def bounded(self, output: ToolOutput, tool: str) -> ToolOutput:
        return bounded(
            output,
            tool,
            self.options.max_tool_result_bytes,
            self.options.max_image_bytes,
        )

    async def breaker(self, spec: ToolSpec, checked: BaseModel) -> None:
        """Stop before a tool whose estimate would take the spend past the limit."""
        if spec.estimate_usd is None:
            return
        estimate = float(await call(spec.estimate_usd, checked))
        spent = await self.spent()
        if spent + estimate > self.options.budget.usd:
            raise _BudgetStop(spent)

    # -- spend, stops, events ----------------------------------------------------------------------

    async def spent(self) -> float:
        budget = self.options.budget
        total = budget.spent_usd + self.cost
        if budget.spent is not None:
            total += float(await call(budget.spent))
        return total

    def signal_for(self, journal_signal: AbortSignal) -> AbortSignal:
        """The signal `generate` and tools receive: the journal's, else the run's own."""
        return (
            self.options.signal if journal_signal is NEVER_ABORTED else journal_signal
        )

    def emit(self, event: LoopEvent) -> None:
        if self.options.on_step is not None:
            self.options.on_step(event)

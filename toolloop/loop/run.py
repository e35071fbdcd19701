"""`run_tool_loop` (SPEC.md section 2): the model answers, tools run, until a turn makes no call.

Stops the model asks for (SPEC 4.2), each decided from the stored answer, so a replay decides the same:
- `refusal`: the loop stops `"refused"`; open calls of the turn are answered `Not run: refused.`.
- `paused`: the answer joins the history and the next model call sends it back; no tool runs.
- `length` with a cut-off tool call (`meta["cut_off"]`, else the last call): nothing of that answer
  runs and it stays out of the history; the turn is asked again once with `params["max_tokens"]`
  doubled (`retry_max_tokens`); cut off again, the loop raises `PromptGenError`.

Replay contract: the loop keeps no state of its own. Every model call and every tool call is one step
of the caller's journal (`model:<n>`, `tool:<id>`, `tool:<id>:start`, `tool:<id>:wait`); what a step
stores is JSON and every decision after it is made from that stored value, so a rerun with the same
journal replays finished steps without calling anything and rebuilds the same history, spend and
events. Budget checks run inside the step they guard, so a replayed step is never checked again.

Streaming (SPEC 4.3): with an `on_step` and a `generate` that takes `on_delta`, the deltas of a model
step reach `on_step` as `DeltaEvent`s stamped with the step, as they arrive, before the step's
`ModelEvent`. They are not part of the step's stored value, so a replayed step emits none. When the
call fails after deltas went out, a discard delta follows them (the step will be made again or the
run fails: either way what they said is not in the journal).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from pydantic import BaseModel

from toolloop import telemetry
from toolloop.abort import NEVER_ABORTED, AbortSignal
from toolloop.contract import (
    AssistantMessage,
    DeltaEvent,
    FinishReason,
    PromptGenRequest,
    PromptGenResult,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from toolloop.deltas import Relay, takes_on_delta
from toolloop.errors import PromptGenError
from toolloop.loop.approvals import (
    NOT_RUN_ASKED,
    ApprovalError,
    check_digest,
    edited_output,
    input_digest,
    rejected_text,
)
from toolloop.loop.cache import request_messages
from toolloop.loop.history import History
from toolloop.loop.tools import (
    as_output,
    as_started,
    bounded,
    call,
    message_content,
    summary,
    text_answer,
    tool_definitions,
    validate_input,
)
from toolloop.loop.types import (
    Approval,
    Asked,
    BudgetEvent,
    Decision,
    LoopEvent,
    ModelEvent,
    Refusal,
    RunToolLoopOptions,
    RunToolLoopResult,
    StepResult,
    StepWork,
    StoppedBy,
    ToolEvent,
    ToolOutput,
    ToolSpec,
)

ASK = "ask"
SECOND_ASK = "Ask one question at a time."
MIN_RETRY_MAX_TOKENS = 1024


async def run_tool_loop(options: RunToolLoopOptions | Mapping[str, Any]) -> RunToolLoopResult:
    """Run a tool-calling conversation to its end (SPEC.md 2). Plain dicts are validated first."""
    if not isinstance(options, RunToolLoopOptions):
        options = RunToolLoopOptions.model_validate(options)
    return await _Run(options).run()


class _BudgetStop(Exception):
    """The breaker tripped inside a step's work: nothing is journaled, the loop stops."""

    def __init__(self, spent_usd: float) -> None:
        super().__init__(spent_usd)
        self.spent_usd = spent_usd


BudgetStop = _BudgetStop
"""Raised by a model call or a tool's work (a durable worker's shared budget account, workers/flow.py)
to stop the run `budget` as the breaker would: nothing is journaled."""


class _Cancel(Exception):
    """The abort signal was seen between two steps."""


class _Run:
    def __init__(self, options: RunToolLoopOptions) -> None:
        self.options = options
        self.history = History(options.messages, options.keep_images)
        self.tools = {spec.name: spec for spec in options.tools}
        self.definitions = tool_definitions(options.tools)
        self.max_assistants = self.history.assistants + options.max_steps - 1
        params: dict[str, Any] = {} if options.reasoning is None else {"reasoning": options.reasoning}
        if options.cache_ttl != "5m":
            params["cache_ttl"] = options.cache_ttl
        self.params = params or None
        fields = {"prompt", "system", "model", "messages", "tools"} | ({"params"} if self.params else set())
        self.request_fields = fields
        self.cost = 0.0
        """Cost of every step of this run so far, replayed ones included."""
        self.steps = 0
        self.final_text: str | None = None
        self.finish_started = False
        self.retry_max_tokens: int | None = None
        """Set after an answer whose tool call was cut off: the output room of the repeated turn."""
        self.streams = options.on_step is not None and takes_on_delta(options.generate)
        """Whether model calls get an `on_delta` (only a generate that takes one, only with on_step)."""

    # -- the turn ----------------------------------------------------------------------------------

    async def run(self) -> RunToolLoopResult:
        options = self.options
        signal = options.signal
        if options.decisions:  # a resume after an approval stop: the held calls are answered first
            stopped = await self.answer_turn(0, self.decided_calls())
            if stopped is not None:
                return stopped
        while True:
            if signal.aborted:
                return await self.stop("cancel")
            if self.steps >= options.max_steps:
                return await self.stop("steps")
            turn = self.steps + 1
            try:
                value = await options.step(f"model:{turn}", self.model_work())
            except _BudgetStop as stop:
                return await self.budget_stop(stop.spent_usd)
            except Exception:
                if signal.aborted:
                    return await self.stop("cancel")
                raise
            result = self.record_model(turn, value)
            if signal.aborted:
                return await self.stop("cancel")
            if result.finish_reason == "refusal":
                return await self.stop("refused", refusal_of(result))
            if result.finish_reason == "paused" or self.retry_max_tokens is not None:
                continue  # sent back as the next model call / the cut-off turn asked again
            if not result.tool_calls:
                return await self.finish("done")
            stopped = await self.answer_turn(turn, result.tool_calls)
            if stopped is not None:
                return stopped

    async def answer_turn(self, turn: int, calls: list[ToolCall]) -> RunToolLoopResult | None:
        """Answer a turn's calls; the result when the loop stops there (a held ask or approval, the
        breaker, a cancel), else None."""
        signal = self.options.signal
        approvals: list[Approval] = []
        try:
            asked = await self.answer_calls(turn, calls, approvals)
        except _BudgetStop as stop:
            return await self.budget_stop(stop.spent_usd)
        except _Cancel:
            return await self.stop("cancel")
        except Exception:
            if signal.aborted:
                return await self.stop("cancel")
            raise
        if asked is not None:
            for approval in approvals:  # the ask wins; the model may call the tool again
                self.history.append(ToolMessage(tool_call_id=approval.call_id, content=NOT_RUN_ASKED))
            return await self.finish("asked", asked)
        if approvals:
            return await self.finish("approval", approvals=approvals)
        return None

    def decided_calls(self) -> list[ToolCall]:
        """The open calls of the last assistant turn, each of which must have a decision."""
        decisions = self.options.decisions or {}
        open_ids = self.history.open_calls()
        missing = [call_id for call_id in open_ids if call_id not in decisions]
        unknown = [call_id for call_id in decisions if call_id not in open_ids]
        if missing or unknown:
            raise ApprovalError(
                f"The decisions do not match the held calls (open: {open_ids}; no decision for "
                f"{missing}; decided but not held: {unknown}).\n"
                "  Pass one decision per call of the previous result's approvals, with its messages."
            )
        message = self.history.messages[self.history.assistant_at[-1]]
        assert isinstance(message, AssistantMessage)
        return [c for c in message.tool_calls or [] if c.id in decisions]

    def model_work(self) -> StepWork:
        async def work(signal: AbortSignal) -> StepResult:
            options = self.options
            budget = options.budget
            spent = await self.spent()
            if spent >= budget.usd:
                raise _BudgetStop(spent)
            finish = not self.finish_started and spent >= budget.finish_at * budget.usd
            params: dict[str, Any] | None = None if self.params is None else dict(self.params)
            fields = self.request_fields
            if self.retry_max_tokens is not None:
                params = {**(params or {}), "max_tokens": self.retry_max_tokens}
                fields = fields | {"params"}
            length = len(self.history.messages)
            try:
                if finish and self.note_applies():
                    self.history.append(UserMessage(content=str(options.finish_note)))
                messages, cache_system = request_messages(self.history, options.cache, self.max_assistants)
            finally:
                self.history.truncate(length)
            # Every field is built from validated values: the history is not validated again.
            request = PromptGenRequest.model_construct(
                _fields_set=fields | {"cache_system"} if cache_system is not None else fields,
                prompt="",
                system=options.system,
                model=options.model,
                temperature=None,
                params=params,
                messages=messages,
                tools=self.definitions,
                tool_choice=None,
                cache_system=cache_system,
            )
            with telemetry.chat_span(request, f"model:{self.steps + 1}") as span:
                result = await self.generate(request, self.signal_for(signal), self.steps + 1)
                if not isinstance(result, PromptGenResult):
                    result = PromptGenResult.model_validate(result)
                telemetry.chat_result(span, request, result)
            value: dict[str, Any] = {"result": result.model_dump(mode="json")}
            if finish:
                value["finish"] = {"spent_usd": spent}
            return StepResult(value=value, cost_usd=result.cost_usd)

        return work

    async def generate(self, request: PromptGenRequest, signal: AbortSignal, turn: int) -> Any:
        """The model call of step `turn`; its deltas go to on_step stamped with the step."""
        if not self.streams:
            return await call(self.options.generate, request, signal)

        def stamped(event: DeltaEvent) -> None:
            self.emit(event if event.step == turn else event.model_copy(update={"step": turn}))

        relay = Relay(stamped)
        try:
            return await call(self.options.generate, request, signal, on_delta=relay)
        except BaseException:
            relay.discard()
            raise

    def record_model(self, turn: int, value: Any) -> PromptGenResult:
        result = validated(PromptGenResult, value["result"])
        finish = value.get("finish")
        if finish is not None:
            self.finish_started = True
            if self.note_applies():
                self.history.append(UserMessage(content=str(self.options.finish_note)))
        self.steps += 1
        self.cost += result.cost_usd
        text = result.text or None
        message, event = derived(result, turn, _model_records, turn, result)
        retried, self.retry_max_tokens = self.retry_max_tokens, None
        if not cut_off(result):
            self.history.append(message)
            self.final_text = text
        elif retried is None:
            self.retry_max_tokens = retry_room(result)
        if finish is not None:
            budget = self.options.budget
            self.emit(BudgetEvent(spent_usd=finish["spent_usd"], limit_usd=budget.usd, mode="finish"))
        if self.options.on_step is not None:
            self.emit(event)
        if retried is not None and cut_off(result):
            raise PromptGenError(
                f"The model's answer did not fit in {retried} output tokens: a tool call was cut off "
                f"at step {turn - 1} and again when the turn was asked again with twice the room.\n"
                "  Ask for smaller tool inputs (split the work), or pick a model with more output room."
            )
        return result

    def note_applies(self) -> bool:
        note = self.options.finish_note
        if note is None:
            return False
        return not any(isinstance(m, UserMessage) and m.content == note for m in self.history.messages)

    # -- tool calls --------------------------------------------------------------------------------

    async def answer_calls(self, turn: int, calls: list[ToolCall], approvals: list[Approval]) -> Asked | None:
        """Answer the calls of one turn in order; the held ask, if any. Held approvals join
        `approvals`; a call with a decision (a resume) is answered as the decision says."""
        decisions = self.options.decisions or {}
        held: Asked | None = None
        signal = self.options.signal
        for tool_call in calls:
            spec = self.tools.get(tool_call.name)
            rows: list[str] = []
            if spec is None:
                output = await self.own_answer(tool_call, f'Unknown tool "{tool_call.name}".')
            else:
                checked = validate_input(spec, tool_call.input)
                if isinstance(checked, str):
                    output = await self.own_answer(tool_call, checked)
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
                    output, rows = await self.decided(spec, tool_call, checked, decision)
                elif spec.two_phase:
                    output, rows = await self.run_two_phase(spec, tool_call, checked)
                else:
                    output = await self.run_one_phase(spec, tool_call, checked)
            key = (turn, tool_call.name, tool_call.id, tuple(rows))
            message, event = derived(output, key, _tool_records, turn, tool_call, output, rows)
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

    async def approval(self, spec: ToolSpec, tool_call: ToolCall, checked: BaseModel) -> Approval:
        estimate = None if spec.estimate_usd is None else float(await call(spec.estimate_usd, checked))
        return Approval(call_id=tool_call.id, name=spec.name, input=checked.model_dump(mode="json"),
                        input_digest=input_digest(checked), estimate_usd=estimate)  # fmt: skip

    async def decided(
        self, spec: ToolSpec, tool_call: ToolCall, checked: BaseModel, decision: Decision
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
                raise ApprovalError(f"The edited input of call {tool_call.id!r} is refused. {checked_edit}")
            run_with = checked_edit
        edited = run_with if decision.action == "edit" else None
        if spec.two_phase:
            return await self.run_two_phase(spec, tool_call, run_with, edited)
        return await self.run_one_phase(spec, tool_call, run_with, edited), []

    async def own_answer(self, tool_call: ToolCall, text: str) -> ToolOutput:
        async def work(signal: AbortSignal) -> StepResult:
            return StepResult(value=text_answer(text).model_dump(mode="json"), cost_usd=0.0)

        return validated(ToolOutput, await self.options.step(f"tool:{tool_call.id}", work))

    async def run_one_phase(
        self, spec: ToolSpec, tool_call: ToolCall, checked: BaseModel, edited: BaseModel | None = None
    ) -> ToolOutput:
        async def work(signal: AbortSignal) -> StepResult:
            await self.breaker(spec, checked)
            with telemetry.tool_span(spec.name, tool_call.id, f"tool:{tool_call.id}") as span:
                output = self.bounded(
                    as_output(await call(spec.run, checked, self.signal_for(signal)), spec.name), spec.name
                )
                telemetry.tool_result(span, output.cost_usd)
            if edited is not None:
                output = edited_output(output, edited)
            return StepResult(value=output.model_dump(mode="json"), cost_usd=output.cost_usd)

        return validated(ToolOutput, await self.options.step(f"tool:{tool_call.id}", work))

    async def run_two_phase(
        self, spec: ToolSpec, tool_call: ToolCall, checked: BaseModel, edited: BaseModel | None = None
    ) -> tuple[ToolOutput, list[str]]:
        async def start(signal: AbortSignal) -> StepResult:
            await self.breaker(spec, checked)
            with telemetry.tool_span(spec.name, tool_call.id, f"tool:{tool_call.id}:start"):
                started = as_started(await call(spec.start, checked, self.signal_for(signal)), spec.name)
            return StepResult(value={"started": started.started, "rows": started.rows or []})

        handle = await self.options.step(f"tool:{tool_call.id}:start", start)
        if self.options.signal.aborted:
            raise _Cancel

        async def wait(signal: AbortSignal) -> StepResult:
            with telemetry.tool_span(spec.name, tool_call.id, f"tool:{tool_call.id}:wait") as span:
                returned = await call(spec.wait, handle["started"], self.signal_for(signal))
                output = self.bounded(as_output(returned, spec.name), spec.name)
                telemetry.tool_result(span, output.cost_usd)
            if edited is not None:
                output = edited_output(output, edited)
            return StepResult(value=output.model_dump(mode="json"), cost_usd=output.cost_usd)

        output = validated(ToolOutput, await self.options.step(f"tool:{tool_call.id}:wait", wait))
        return output, list(handle.get("rows") or [])

    def bounded(self, output: ToolOutput, tool: str) -> ToolOutput:
        return bounded(output, tool, self.options.max_tool_result_bytes, self.options.max_image_bytes)

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
        return self.options.signal if journal_signal is NEVER_ABORTED else journal_signal

    def emit(self, event: LoopEvent) -> None:
        if self.options.on_step is not None:
            self.options.on_step(event)

    async def budget_stop(self, spent_usd: float) -> RunToolLoopResult:
        self.emit(BudgetEvent(spent_usd=spent_usd, limit_usd=self.options.budget.usd, mode="stop"))
        return await self.stop("budget")

    async def stop(self, reason: StoppedBy, refusal: Refusal | None = None) -> RunToolLoopResult:
        """A budget, steps, cancel or refused stop: answer every open call with `Not run: <reason>.`."""
        for call_id in self.history.open_calls():
            self.history.append(ToolMessage(tool_call_id=call_id, content=f"Not run: {reason}."))
        return await self.finish(reason, refusal=refusal)

    async def finish(
        self,
        stopped_by: StoppedBy,
        asked: Asked | None = None,
        refusal: Refusal | None = None,
        approvals: list[Approval] | None = None,
    ) -> RunToolLoopResult:
        return RunToolLoopResult.model_construct(
            stopped_by=stopped_by,
            spent_usd=await self.spent(),
            steps=self.steps,
            messages=list(self.history.messages),
            final_text=self.final_text,
            asked=asked,
            approvals=approvals,
            refusal=refusal,
        )


def refusal_of(result: PromptGenResult) -> Refusal:
    meta = result.meta or {}
    category, explanation = meta.get("category"), meta.get("explanation")
    return Refusal(
        category=category if isinstance(category, str) else None,
        explanation=explanation if isinstance(explanation, str) else None,
    )


def cut_off(result: PromptGenResult) -> list[str]:
    """Ids of the answer's tool calls whose input was cut at the output limit: what the provider
    names in `meta["cut_off"]`, else the last call of a `length` answer (where a cut falls)."""
    if result.finish_reason != "length" or not result.tool_calls:
        return []
    named = (result.meta or {}).get("cut_off")
    if isinstance(named, list):
        ids = {call.id for call in result.tool_calls}
        return [call_id for call_id in named if call_id in ids]
    return [result.tool_calls[-1].id]


def retry_room(result: PromptGenResult) -> int:
    """The output room of a cut-off turn asked again: twice what the cut answer had (the provider's
    `meta["max_tokens"]`, else its output tokens), at least MIN_RETRY_MAX_TOKENS. The provider keeps
    it within what the model allows."""
    sent = (result.meta or {}).get("max_tokens")
    room = sent if isinstance(sent, int) and not isinstance(sent, bool) and sent > 0 else 0
    return max(2 * (room or result.usage.completion_tokens), MIN_RETRY_MAX_TOKENS)


_Model = TypeVar("_Model", PromptGenResult, ToolOutput)
_VALIDATED: dict[int, tuple[Any, BaseModel]] = {}
_VALIDATED_MAX = 20_000


def validated(model: type[_Model], value: Any) -> _Model:
    """`model.model_validate(value)`, memoized by the identity of `value`.

    A journal that hands back the same decoded object for a stored step every time it replays it
    (MemoryJournal; RedisJournal in a worker, whose decoded entries live across a run's steps) gets
    the same frozen model back without validating it again: replay re-reads every stored step of the
    segment at every step, so this is most of what a long segment costs. The memo holds `value`
    itself, so its identity cannot be reused while the entry lives; it is emptied when full.
    """
    key = id(value)
    hit = _VALIDATED.get(key)
    if hit is not None and hit[0] is value and type(hit[1]) is model:
        return hit[1]
    result = model.model_validate(value)
    if len(_VALIDATED) >= _VALIDATED_MAX:
        _VALIDATED.clear()
    _VALIDATED[key] = (value, result)
    return result


_DERIVED: dict[tuple[int, Any], tuple[BaseModel, Any]] = {}


def derived(source: BaseModel, key: Any, make: Callable[..., tuple[Any, Any]], *args: Any) -> tuple[Any, Any]:
    """`make(*args)`: the history message and event the loop makes from a step's validated value,
    memoized like `validated`: a value replayed again (the same frozen object) under the same `key`
    gives the same frozen message and event without building them again."""
    memo_key = (id(source), key)
    hit = _DERIVED.get(memo_key)
    if hit is not None and hit[0] is source:
        return hit[1]  # type: ignore[no-any-return]
    made = make(*args)
    if len(_DERIVED) >= _VALIDATED_MAX:
        _DERIVED.clear()
    _DERIVED[memo_key] = (source, made)
    return made


def _model_records(turn: int, result: PromptGenResult) -> tuple[AssistantMessage, ModelEvent]:
    text = result.text or None
    message = AssistantMessage(
        content=text, tool_calls=list(result.tool_calls) or None, reasoning=result.reasoning or None
    )
    meta = result.meta or {}
    provider = meta.get("provider") if isinstance(meta.get("provider"), str) else None
    fallback = meta.get("fallback_from") if isinstance(meta.get("fallback_from"), list) else None
    finish: FinishReason = result.finish_reason
    event = ModelEvent(step=turn, text=text, tool_calls=result.tool_calls, cost_usd=result.cost_usd,
                       usage=result.usage, finish_reason=finish,
                       refusal=refusal_of(result) if finish == "refusal" else None,
                       provider=provider, fallback_from=fallback or None)  # fmt: skip
    return message, event


def _tool_records(
    turn: int, tool_call: ToolCall, output: ToolOutput, rows: list[str]
) -> tuple[ToolMessage, ToolEvent]:
    message = ToolMessage(tool_call_id=tool_call.id, content=message_content(output))
    event = ToolEvent(step=turn, name=tool_call.name, call_id=tool_call.id, cost_usd=output.cost_usd,
                      summary=summary(output), rows=rows or output.rows or [])  # fmt: skip
    return message, event

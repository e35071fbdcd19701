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

from collections.abc import Mapping
from typing import Any

from toolloop import telemetry
from toolloop.abort import AbortSignal
from toolloop.contract import (
    AssistantMessage,
    DeltaEvent,
    PromptGenRequest,
    PromptGenResult,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from toolloop.deltas import Relay, takes_on_delta
from toolloop.errors import PromptGenError
from toolloop.loop.approvals import NOT_RUN_ASKED, ApprovalError
from toolloop.loop.cache import request_messages
from toolloop.loop.calls import BudgetStop, CallAnswers, _BudgetStop, _Cancel
from toolloop.loop.compaction import Compaction
from toolloop.loop.history import History
from toolloop.loop.records import (
    cut_off,
    derived,
    model_records,
    refusal_of,
    retry_room,
    validated,
)
from toolloop.loop.tools import call, tool_definitions
from toolloop.loop.types import (
    AccountLimit,
    Approval,
    Asked,
    BudgetEvent,
    Refusal,
    RunToolLoopOptions,
    RunToolLoopResult,
    Steer,
    SteerEvent,
    StepResult,
    StepWork,
    StoppedBy,
)
from toolloop.memo import memo_of, run_memo

__all__ = ["BudgetStop", "run_tool_loop"]


def _steer_work(steer: Steer, turn: int, index: int) -> StepWork:
    """The work of step `steer:<id>`: the message as taken, before model turn `turn`, the `index`-th
    taken at that boundary (what a replay orders by). Costs nothing."""

    async def work(signal: AbortSignal) -> StepResult:
        return StepResult(
            value={"content": steer.content, "turn": turn, "index": index}, cost_usd=0.0
        )

    return work


async def run_tool_loop(
    options: RunToolLoopOptions | Mapping[str, Any],
) -> RunToolLoopResult:
    """Run a tool-calling conversation to its end (SPEC.md 2). Plain dicts are validated first."""
    if not isinstance(options, RunToolLoopOptions):
        options = RunToolLoopOptions.model_validate(options)
    return await _Run(options).run()


class _Run(CallAnswers):
    def __init__(self, options: RunToolLoopOptions) -> None:
        self.options = options
        self.memo = memo_of(options.step)
        """What this run does not build twice (toolloop/memo.py); its model calls see it as `run_memo`."""
        self.history = History(options.messages, options.keep_images)
        self.tools = {spec.name: spec for spec in options.tools}
        self.definitions = tool_definitions(options.tools)
        self.max_assistants = self.history.assistants + options.max_steps - 1
        params: dict[str, Any] = (
            {} if options.reasoning is None else {"reasoning": options.reasoning}
        )
        if options.cache_ttl != "5m":
            params["cache_ttl"] = options.cache_ttl
        edits = options.context.edits() if options.context is not None else []
        if edits:
            params["context_management"] = {"edits": edits}
        self.params = params or None
        fields = {"prompt", "system", "model", "messages", "tools"} | (
            {"params"} if self.params else set()
        )
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
        if options.compacted is not None and options.context is None:
            raise ValueError(
                "options.compacted is set without a context policy: nothing would read it.\n"
                "  Pass the context policy the previous call had, or leave compacted unset."
            )
        self.compaction = Compaction(self) if options.context is not None else None
        """Context management (SPEC 5; toolloop/loop/compaction.py); None without a policy."""
        self.steered: set[str] = set()
        """The ids of the steers this loop took (SPEC 6.1), replayed ones included."""

    # -- the turn ----------------------------------------------------------------------------------

    async def run(self) -> RunToolLoopResult:
        token = run_memo.set(self.memo)
        try:
            return await self.turns()
        finally:
            run_memo.reset(token)

    async def turns(self) -> RunToolLoopResult:
        if (
            self.options.decisions
        ):  # a resume after an approval stop: the held calls are answered first
            stopped = await self.answer_turn(0, self.decided_calls())
            if stopped is not None:
                return stopped
        while True:
            stopped = await self.turn()
            if stopped is not None:
                return stopped

    async def turn(self) -> RunToolLoopResult | None:
        """One model step, and the answers to its calls; the result when the loop stops there."""
        options = self.options
        signal = options.signal
        if signal.aborted:
            return await self.stop("cancel")
        if self.steps >= options.max_steps:
            return await self.stop("steps")
        turn = self.steps + 1
        try:
            if self.compaction is not None:
                await self.compaction.before(turn)
            # after a compaction step: the steer's boundary is the model call's
            await self.take_steers(turn)
            value = await options.step(f"model:{turn}", self.model_work())
        except _BudgetStop as stop:
            return await self.budget_stop(stop.spent_usd, stop.account)
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
            return (
                None  # sent back as the next model call / the cut-off turn asked again
            )
        if not result.tool_calls:
            if await self.steered_before_done(turn + 1):
                return None  # a steer came: the model answers it in the next turn
            return await self.finish("done")
        return await self.answer_turn(turn, result.tool_calls)

    # -- steering (SPEC 6.1) ---------------------------------------------------------------------

    async def take_steers(self, turn: int, ending: bool = False) -> int:
        """Take what `options.steers` has for the boundary before model turn `turn`: each one a
        journal step `steer:<id>`, then a user message at the end of the history (every call of the
        last turn is answered by now) and a `SteerEvent`. Asks again until nothing new comes."""
        steers = self.options.steers
        if steers is None:
            return 0
        taken = 0
        while True:
            fresh = [
                steer
                for steer in await steers(turn, ending)
                if steer.id not in self.steered
            ]
            if not fresh:
                return taken
            for steer in fresh:
                value = await self.options.step(
                    f"steer:{steer.id}", _steer_work(steer, turn, taken)
                )
                self.steered.add(steer.id)
                content = str(value["content"])
                self.history.append(UserMessage(content=content))
                self.emit(SteerEvent(step=turn, id=steer.id, content=content))
                taken += 1

    async def steered_before_done(self, turn: int) -> bool:
        """Before a `done` stop: True when steers were taken (the loop goes on to model turn `turn`).
        None are taken when no model call could follow (aborted, or no step left)."""
        if (
            self.options.steers is None
            or self.options.signal.aborted
            or self.steps >= self.options.max_steps
        ):
            return False
        try:
            return await self.take_steers(turn, ending=True) > 0
        except Exception:
            if self.options.signal.aborted:
                return False
            raise

    async def answer_turn(
        self, turn: int, calls: list[ToolCall]
    ) -> RunToolLoopResult | None:
        """Answer a turn's calls; the result when the loop stops there (a held ask or approval, the
        breaker, a cancel), else None."""
        signal = self.options.signal
        approvals: list[Approval] = []
        try:
            asked = await self.answer_calls(turn, calls, approvals)
        except _BudgetStop as stop:
            return await self.budget_stop(stop.spent_usd, stop.account)
        except _Cancel:
            return await self.stop("cancel")
        except Exception:
            if signal.aborted:
                return await self.stop("cancel")
            raise
        if asked is not None:
            for (
                approval
            ) in approvals:  # the ask wins; the model may call the tool again
                self.history.append(
                    ToolMessage(tool_call_id=approval.call_id, content=NOT_RUN_ASKED)
                )
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
            params: dict[str, Any] | None = (
                None if self.params is None else dict(self.params)
            )
            fields = self.request_fields
            if self.retry_max_tokens is not None:
                params = {**(params or {}), "max_tokens": self.retry_max_tokens}
                fields = fields | {"params"}
            length = len(self.history.messages)
            try:
                if finish and self.note_applies():
                    self.history.append(UserMessage(content=str(options.finish_note)))
                messages, cache_system = request_messages(
                    self.history, options.cache, self.max_assistants, self.memo
                )
            finally:
                self.history.truncate(length)
            if self.compaction is not None:
                messages = self.compaction.view(messages)
            # Every field is built from validated values: the history is not validated again.
            request = PromptGenRequest.model_construct(
                _fields_set=fields | {"cache_system"}
                if cache_system is not None
                else fields,
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
                result = await self.generate(
                    request, self.signal_for(signal), self.steps + 1
                )
                if not isinstance(result, PromptGenResult):
                    result = PromptGenResult.model_validate(result)
                telemetry.chat_result(span, request, result)
            value: dict[str, Any] = {"result": result.model_dump(mode="json")}
            if finish:
                value["finish"] = {"spent_usd": spent}
            return StepResult(value=value, cost_usd=result.cost_usd)

        return work

    async def generate(
        self, request: PromptGenRequest, signal: AbortSignal, turn: int
    ) -> Any:
        """The model call of step `turn`; its deltas go to on_step stamped with the step."""
        if not self.streams:
            return await call(self.options.generate, request, signal)

        def stamped(event: DeltaEvent) -> None:
            if event.step != turn:
                event = DeltaEvent(
                    step=turn,
                    text=event.text,
                    thinking=event.thinking,
                    discard=event.discard,
                )
            self.emit(event)

        relay = Relay(stamped)
        try:
            return await call(self.options.generate, request, signal, on_delta=relay)
        except BaseException:
            relay.discard()
            raise

    def record_model(self, turn: int, value: Any) -> PromptGenResult:
        result = validated(self.memo, PromptGenResult, value["result"])
        finish = value.get("finish")
        if finish is not None:
            self.finish_started = True
            if self.note_applies():
                self.history.append(UserMessage(content=str(self.options.finish_note)))
        self.steps += 1
        self.cost += result.cost_usd
        if self.compaction is not None:
            self.compaction.sized(result, turn)
        text = result.text or None
        message, event = derived(self.memo, result, turn, model_records, turn, result)
        retried, self.retry_max_tokens = self.retry_max_tokens, None
        if not cut_off(result):
            self.history.append(message)
            self.final_text = text
        elif retried is None:
            self.retry_max_tokens = retry_room(result)
        if finish is not None:
            budget = self.options.budget
            self.emit(
                BudgetEvent(
                    spent_usd=finish["spent_usd"], limit_usd=budget.usd, mode="finish"
                )
            )
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
        return not any(
            isinstance(m, UserMessage) and m.content == note
            for m in self.history.messages
        )

    async def budget_stop(
        self, spent_usd: float, account: AccountLimit | None = None
    ) -> RunToolLoopResult:
        """Stop `budget`. When a shared account's limit tripped it (`account`: its spend and limit),
        the event's own figures are still the run's: its spend and its budget."""
        limit = self.options.budget.usd
        if account is not None:
            spent_usd = await self.spent()
        self.emit(
            BudgetEvent(
                spent_usd=spent_usd, limit_usd=limit, mode="stop", account=account
            )
        )
        return await self.stop("budget")

    async def stop(
        self, reason: StoppedBy, refusal: Refusal | None = None
    ) -> RunToolLoopResult:
        """A budget, steps, cancel or refused stop: answer every open call with `Not run: <reason>.`."""
        for call_id in self.history.open_calls():
            self.history.append(
                ToolMessage(tool_call_id=call_id, content=f"Not run: {reason}.")
            )
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
            compacted=None
            if self.compaction is None
            else self.compaction.carried_state,
        )

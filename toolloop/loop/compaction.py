"""The compaction step of a run with a context policy (SPEC.md 5.2; the rules in context.py).

With server-side threshold compaction (`server_compact_at_tokens`), the compaction block comes back in
a model answer (kept with its reasoning blocks, journaled with the step): every later request sends
the conversation's first message, then the history from that answer on (the API ignores what comes
before the block; its docs: "send it back").

`before(turn)` runs ahead of model step `turn`: when the next request's input tokens pass
`compact_at_tokens`, it runs the journal step `compact:<turn>` (or replays it) and from then on
`view` gives every request the summary and the turns from the cut on. A step whose compaction would
cross the budget stores `{"skipped": "budget"}` (cost 0) and the model call goes ahead: the budget's
own checks (finish mode, the stop) then decide, and a replay skips the same way.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from toolloop.abort import AbortSignal
from toolloop.contract import (
    AssistantMessage,
    ChatMessage,
    ContentPart,
    PromptGenRequest,
    PromptGenResult,
    ReasoningBlock,
    TextPart,
    ToolDefinition,
    UserMessage,
)
from toolloop.loop.context import (
    Compacted,
    CompactionState,
    ContextPolicy,
    choose_cut,
    estimate_tokens,
    message_tokens,
    stored_value,
    summary_message,
)
from toolloop.loop.history import History
from toolloop.loop.tools import call
from toolloop.loop.types import (
    CompactionEvent,
    LoopEvent,
    RunToolLoopOptions,
    StepResult,
    StepWork,
)


class _Loop(Protocol):
    """What a compaction reads of its run (toolloop/loop/run.py)."""

    options: RunToolLoopOptions
    history: History
    definitions: list[ToolDefinition]
    params: dict[str, Any] | None
    cost: float

    async def spent(self) -> float: ...

    def emit(self, event: LoopEvent) -> None: ...

    def signal_for(self, journal_signal: AbortSignal) -> AbortSignal: ...


def mark_last(messages: list[ChatMessage]) -> list[ChatMessage]:
    """The messages with a cache mark on the newest one that can carry it (as cache.py marks)."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, AssistantMessage):
            continue
        content = message.content
        if isinstance(content, str):
            parts: list[ContentPart] = (
                [TextPart(text=content)] if content.strip() else []
            )
        else:
            parts = list(content)
        for position in range(len(parts) - 1, -1, -1):
            part = parts[position]
            if isinstance(part, TextPart) and part.text.strip():
                parts[position] = TextPart(text=part.text, cache=True)
                return [
                    *messages[:index],
                    message.model_copy(update={"content": parts}),
                    *messages[index + 1 :],
                ]
    return messages


class CompactionError(RuntimeError):
    """A compaction call answered without any summary text."""


class Compaction:
    """The compaction state of one run: what the requests carry, and the count that decides."""

    def __init__(self, run: _Loop) -> None:
        self.run = run
        policy = run.options.context
        assert policy is not None
        self.policy: ContextPolicy = policy
        self.state: Compacted | None = None
        self.latest: tuple[int, int, int] | None = None
        """(prompt tokens the provider billed, history length, cut) of the latest model request."""
        self.latest_cost = 0.0
        self.server_cut = server_cut(run.history.messages)
        """Index of the latest assistant message with a server-side compaction block (0: none):
        found in the messages the call starts from (a conversation that goes on after a
        compaction, as a durable run's follow-up does), then moved on by each answer with one."""
        self.carried_state: CompactionState | None = None
        """The compaction in force, as `result.compacted` hands it to the next call."""
        self.on_demand = self.decide_on_demand()
        """The compaction step asks for the provider's own summary (else the summary call)."""
        if run.options.compacted is not None:
            self.restore(run.options.compacted)

    def decide_on_demand(self) -> bool:
        """The policy's `on_demand`, or (None) the model's capability: `options.supports`, or the
        `supports` of `generate` (`PromptGen.as_generate`), asked for "on_demand_compaction"."""
        if self.policy.on_demand is not None:
            return self.policy.on_demand
        options = self.run.options
        supports = options.supports or getattr(options.generate, "supports", None)
        if not callable(supports):
            return False
        return bool(supports("on_demand_compaction", options.model))

    def restore(self, carried: CompactionState) -> None:
        """Start from the compaction a previous call of the same history ended with
        (`options.compacted`): its requests carry that summary, and nothing is summarized again
        until the compacted request passes the threshold."""
        messages = self.run.history.messages
        if carried.cut >= len(messages) or not isinstance(
            messages[carried.cut], AssistantMessage
        ):
            raise ValueError(
                f"options.compacted cuts the history at message {carried.cut}, which is not an "
                f"assistant message of these {len(messages)} messages.\n"
                "  Pass the previous result's compacted with that result's messages (and what "
                "follows them), or leave it unset."
            )
        if carried.block is None and not carried.summary.strip():
            raise ValueError(
                "options.compacted has neither a summary nor a compaction block.\n"
                "  Pass the previous result's compacted unchanged, or leave it unset."
            )
        self.carried_state = carried
        self.state = Compacted(
            cut=carried.cut,
            covered_turns=carried.covered_turns,
            head=[]
            if carried.block is not None
            else [summary_message(carried.summary, carried.covered_turns, messages[0])],
            block=carried.block,
        )

    # -- the count ---------------------------------------------------------------------------------

    def sized(self, result: PromptGenResult, turn: int) -> None:
        """Record the provider's count of the request model step `turn` just made (its stored usage);
        an answer with a server-side compaction block gets its `CompactionEvent` (cost 0: the
        summary pass is in the step's own cost, `usage.iterations`), before its `ModelEvent`."""
        cut = self.state.cut if self.state is not None else 0
        self.latest = (result.usage.prompt_tokens, len(self.run.history.messages), cut)
        self.latest_cost = result.cost_usd
        if any(block.type == "compaction" for block in result.reasoning or ()):
            history = self.run.history
            self.server_cut = len(history.messages)  # where this answer's message goes
            passes = [
                i
                for i in (result.meta or {}).get("iterations", [])
                if i.get("type") == "compaction"
            ]
            self.run.emit(
                CompactionEvent(
                    step=turn,
                    covered_turns=len(history.assistant_at),
                    cost_usd=0.0,
                    input_tokens=sum(
                        int(i.get("input_tokens", 0))
                        + int(i.get("cache_read_input_tokens", 0))
                        + int(i.get("cache_creation_input_tokens", 0))
                        for i in passes
                    ),
                )
            )

    def input_tokens(self) -> tuple[int, str]:
        """The input tokens of the next request and where the figure comes from."""
        history = self.run.history
        cut = self.state.cut if self.state is not None else 0
        latest = self.latest
        if latest is not None and latest[2] == cut and latest[0] > 0:
            added = sum(message_tokens(m) for m in history.sent[latest[1] :])
            return latest[0] + added, "usage+estimate"
        run = self.run
        head: list[ChatMessage] = (
            list(self.state.head) if self.state is not None else []
        )
        messages = head + list(history.sent[cut:])
        return estimate_tokens(
            run.options.system, run.definitions, messages
        ), "estimate"

    # -- the step ----------------------------------------------------------------------------------

    async def before(self, turn: int) -> None:
        limit = self.policy.compact_at_tokens
        if limit is None:
            return
        history = self.run.history
        history.trim_images()
        counted, source = self.input_tokens()
        if abs(counted - limit) <= self.policy.count_margin * limit and self.counts():
            # near the threshold: the provider's count decides (journaled: a replay reads it)
            value = await self.run.options.step(
                f"count:{turn}", self.count_work(counted, source)
            )
            counted, source = int(value["input_tokens"]), str(value["count"])
        if counted <= limit:
            return
        current = self.state.cut if self.state is not None else 0
        cut = choose_cut(
            history.assistant_at, self.policy.keep_turns, len(history.messages), current
        )
        if cut is None:
            return
        value = await self.run.options.step(
            f"compact:{turn}", self.work(cut, counted, source)
        )
        self.record(turn, value)

    def counter(
        self,
    ) -> Callable[[PromptGenRequest, AbortSignal], Awaitable[int | None]] | None:
        options = self.run.options
        found = options.count_tokens or getattr(options.generate, "count_tokens", None)
        return found if callable(found) else None

    def counts(self) -> bool:
        """Whether the provider can count the next request: a counter (`options.count_tokens`, or
        `generate`'s) and the model's `supports("count_tokens")` (fal and others: no)."""
        if self.counter() is None:
            return False
        options = self.run.options
        supports = options.supports or getattr(options.generate, "supports", None)
        return callable(supports) and bool(supports("count_tokens", options.model))

    def count_work(self, counted: int, source: str) -> StepWork:
        """Step `count:<n>`: the provider's count of the next request (cost 0: counting is free),
        `{"input_tokens", "count": "provider", "estimate"}`; when the count fails, the loop's own
        figure with the error (`"count"` as before), so the step is journaled either way and a
        replay decides the same."""

        async def work(signal: AbortSignal) -> StepResult:
            counter = self.counter()
            assert counter is not None
            fallback = {"input_tokens": counted, "count": source, "estimate": counted}
            try:
                tokens = await counter(
                    self.count_request(), self.run.signal_for(signal)
                )
            except Exception as error:
                if signal.aborted:
                    raise
                fallback["error"] = f"{type(error).__name__}: {error}"[:300]
                return StepResult(value=fallback, cost_usd=0.0)
            if tokens is None:
                return StepResult(value=fallback, cost_usd=0.0)
            value = {
                "input_tokens": int(tokens),
                "count": "provider",
                "estimate": counted,
            }
            return StepResult(value=value, cost_usd=0.0)

        return work

    def count_request(self) -> PromptGenRequest:
        """The next model request as far as its input tokens go: the system text, the tools, the
        run's params (thinking, context edits) and the messages as `view` gives them."""
        run = self.run
        return PromptGenRequest(
            prompt="",
            system=run.options.system,
            model=run.options.model,
            params=run.params,
            messages=self.view(list(run.history.sent)),
            tools=run.definitions,
            cache_system=None if run.options.cache == "off" else True,
        )

    def work(self, cut: int, counted: int, source: str) -> StepWork:
        async def work(signal: AbortSignal) -> StepResult:
            run = self.run
            budget = run.options.budget
            spent = await run.spent()
            if spent + self.latest_cost > budget.usd:
                return StepResult(
                    value={"skipped": "budget", "spent_usd": spent}, cost_usd=0.0
                )
            request = self.request(cut)
            result = await call(run.options.generate, request, run.signal_for(signal))
            if not isinstance(result, PromptGenResult):
                result = PromptGenResult.model_validate(result)
            covered = self.covered_turns(cut)
            dumped = result.model_dump(mode="json")
            if self.on_demand:
                block = next(
                    (b for b in result.reasoning or () if b.type == "compaction"), None
                )
                if block is None or not block.data.get("content"):
                    raise CompactionError(
                        "The on-demand compaction call answered without a compaction block with a summary.\n"
                        "  Use a model and provider that have it (Anthropic, capabilities.compaction), or "
                        "turn on_demand off."
                    )
                value = stored_value(
                    str(block.data["content"]), cut, covered, counted, source, dumped
                )
                value["block"] = block.model_dump(mode="json")
                return StepResult(value=value, cost_usd=result.cost_usd)
            summary = result.text.strip()
            if not summary:
                raise CompactionError(
                    "The compaction call answered without a summary (no text).\n"
                    "  Check the model and the summary_prompt of the context policy; the run can be resumed."
                )
            return StepResult(
                value=stored_value(summary, cut, covered, counted, source, dumped),
                cost_usd=result.cost_usd,
            )

        return work

    def covered_turns(self, cut: int) -> int:
        return sum(1 for index in self.run.history.assistant_at if index < cut)

    def request(self, cut: int) -> PromptGenRequest:
        """The summary request: what the next request would carry up to the cut, then the prompt
        (on demand: no prompt, and `params["compaction"]` in place of any context edits, which the
        API refuses beside it)."""
        run = self.run
        history = run.history
        current = self.state
        start = current.cut if current is not None else 0
        messages = self.carried(list(history.sent[start:cut]))
        params: dict[str, Any] = dict(run.params or {})
        params["max_tokens"] = self.policy.max_summary_tokens
        if self.on_demand:
            params.pop("context_management", None)
            asked: dict[str, Any] = {"type": "summarize"}
            if self.policy.summary_prompt is not None:
                asked["instructions"] = self.policy.summary_prompt
            params["compaction"] = asked
            if (
                run.options.cache == "conversation"
            ):  # the prefix the latest request cached ends here
                messages = mark_last(messages)
        else:
            marked = run.options.cache == "conversation"
            messages.append(
                UserMessage(content=[TextPart(text=self.policy.prompt, cache=marked)])
            )
        return PromptGenRequest(
            prompt="",
            system=run.options.system,
            model=run.options.model,
            params=params,
            messages=messages,
            tools=run.definitions,
            cache_system=None if run.options.cache == "off" else True,
        )

    def record(self, turn: int, value: Any) -> None:
        if not isinstance(value, dict) or "skipped" in value:
            return
        result = PromptGenResult.model_validate(value["result"])
        run = self.run
        run.cost += result.cost_usd
        covered = int(value["covered_turns"])
        block = value.get("block")
        self.carried_state = CompactionState(
            cut=int(value["cut"]),
            covered_turns=covered,
            summary="" if block else str(value["summary"]),
            block=ReasoningBlock.model_validate(block) if block else None,
        )
        self.state = Compacted(
            cut=int(value["cut"]),
            covered_turns=covered,
            head=[]
            if block
            else [
                summary_message(str(value["summary"]), covered, run.history.messages[0])
            ],
            block=ReasoningBlock.model_validate(block) if block else None,
        )
        run.emit(
            CompactionEvent(
                step=turn,
                covered_turns=covered,
                cost_usd=result.cost_usd,
                input_tokens=int(value.get("input_tokens", 0)),
                usage=result.usage,
            )
        )

    # -- the request -------------------------------------------------------------------------------

    def carried(self, tail: list[ChatMessage]) -> list[ChatMessage]:
        """The history from the latest cut (`tail`) as a request carries it: the summary message
        first, or (on demand) the provider's block first in the assistant message at the cut."""
        state = self.state
        if state is None:
            return tail
        if state.block is None:
            return [*state.head, *tail]
        first = tail[0]
        # a cut is always at an assistant message
        assert isinstance(first, AssistantMessage)
        carrying = first.model_copy(
            update={"reasoning": [state.block, *(first.reasoning or [])]}
        )
        return [carrying, *tail[1:]]

    def view(self, messages: list[ChatMessage]) -> list[ChatMessage]:
        """The messages of a model request after the latest compaction: the summary, then the
        history from the cut on (`messages` is the whole history as the request would send it)."""
        state = self.state
        if state is not None:
            return self.carried(messages[state.cut :])
        if (
            self.server_cut > 1
        ):  # the API drops what comes before the block: so does the request
            return [messages[0], *messages[self.server_cut :]]
        return messages


def server_cut(messages: list[ChatMessage]) -> int:
    """Index of the latest assistant message that holds a server-side compaction block (0: none)."""
    for index in range(len(messages) - 1, 0, -1):
        message = messages[index]
        if isinstance(message, AssistantMessage) and any(
            block.type == "compaction" for block in message.reasoning or ()
        ):
            return index
    return 0

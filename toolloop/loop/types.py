"""Types of `run_tool_loop` (SPEC.md section 2): options, tools, journal steps, events, result."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    model_serializer,
    model_validator,
)

from toolloop.abort import NEVER_ABORTED, AbortSignal
from toolloop.contract import (
    ChatMessage,
    ContentPart,
    DeltaEvent,
    FinishReason,
    PromptGenRequest,
    PromptGenResult,
    PromptGenUsage,
    ToolCall,
)
from toolloop.loop.context import CompactionState, ContextPolicy


class _Value(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class _Options(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)


# -- tools -------------------------------------------------------------------------------------


class ToolOutput(_Value):
    """What one tool call produced. `value` is for the caller (JSON-safe; the model never sees it);
    `content` is what the model reads (`[]` is sent as the text `(no output)`)."""

    value: Any = None
    content: list[ContentPart] = Field(default_factory=list)
    cost_usd: float = 0.0
    rows: list[str] | None = None
    is_error: bool = Field(default=False, exclude_if=lambda value: value is False)
    """The call failed and `content` says why: the model's tool result is marked as an error
    (Anthropic `is_error: true`). Left out of dumps when False (journals written before it read
    the same)."""


class Started(_Value):
    """The first half of a two-phase tool: a JSON-safe handle that `wait` receives."""

    started: Any = None
    rows: list[str] | None = None


class ToolSpec(_Options):
    """One tool. `schema` validates the input and becomes the tool's JSON schema. A tool with both
    `start` and `wait` is two-phase and `run` is never called. Every callable may be sync or async."""

    name: str
    description: str
    schema_: type[BaseModel] = Field(alias="schema")
    run: Callable[..., Any] | None = None
    start: Callable[..., Any] | None = None
    wait: Callable[..., Any] | None = None
    estimate_usd: Callable[..., Any] | None = None
    queue: str | None = None
    """The Celery queue a durable run sends this tool's steps to (None: the default tool queue)."""
    needs_approval: bool | Callable[..., Any] = False
    """True, or `(input) -> bool`: a call of this tool waits for a person's decision (SPEC 4.4)."""
    approval_timeout_s: float | None = None
    """A durable run's deadline for this tool's decisions (None: the run's `approval_timeout_s`)."""
    approval_default: Literal["reject", "approve"] = "reject"
    """The outcome when the deadline passes with no decision (SPEC 4.5)."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", arbitrary_types_allowed=True, populate_by_name=True
    )

    if TYPE_CHECKING:
        # What users write: `schema=` (the field is `schema_` only because BaseModel owns `schema`).
        def __init__(
            self,
            *,
            name: str,
            description: str,
            schema: type[BaseModel],
            run: Callable[..., Any] | None = None,
            start: Callable[..., Any] | None = None,
            wait: Callable[..., Any] | None = None,
            estimate_usd: Callable[..., Any] | None = None,
            queue: str | None = None,
            needs_approval: bool | Callable[..., Any] = False,
            approval_timeout_s: float | None = None,
            approval_default: Literal["reject", "approve"] = "reject",
        ) -> None: ...

    @property
    def two_phase(self) -> bool:
        return self.start is not None and self.wait is not None

    @model_validator(mode="after")
    def _runnable(self) -> ToolSpec:
        if (
            self.run is None and not self.two_phase and self.name != "ask"
        ):  # `ask` is never run
            raise ValueError(
                f"tool {self.name!r} has no run and is not two-phase (start and wait).\n"
                "  Give it run(input, signal), or both start(input, signal) and wait(started, signal)."
            )
        return self


# -- budget --------------------------------------------------------------------------------------


class Budget(_Options):
    """`usd`: the limit. `finish_at`: the share of it at which finish mode starts. `spent_usd`: spend
    carried over from earlier segments. `spent`: optional callable (sync or async) returning outside
    spend, read again at every check."""

    usd: float
    finish_at: float = 1.0
    spent_usd: float = 0.0
    spent: Callable[[], Any] | None = None


# -- the journal -------------------------------------------------------------------------------


class StepResult(_Options):
    """What a step's work returns: the JSON-compatible value to store and its cost."""

    value: Any = None
    cost_usd: float = 0.0


StepWork = Callable[[AbortSignal], Awaitable[StepResult]]
"""The work of one step: receives the journal's signal, returns what to store."""

StepFn = Callable[[str, StepWork], Awaitable[Any]]
"""The journal: `await step(key, work)` runs `work` once per key and returns the stored value."""

Generate = Callable[..., Awaitable[PromptGenResult]]


class Steer(_Value):
    """A user message for a running loop (SPEC 6.1, docs/conversations.md): `id` names its journal
    step (`steer:<id>`), so it must be unique within the loop's journal; `content` is what the model
    reads, as a user message placed after the last complete turn."""

    id: str = Field(min_length=1, max_length=200)
    content: str


Steers = Callable[[int, bool], Awaitable[list[Steer]]]
"""`RunToolLoopOptions.steers(turn, ending)`: called with the model turn about to be asked for, returns
the steers to take before it that this loop has not taken yet ([] when none). `ending` is True when
the loop stops `done` unless a steer comes (a durable caller may answer from what it has at hand
there and hold the stop itself while one waits, as workers/step/steering.py does)."""
"""`generate(request, signal)`, or `generate(request, signal, on_delta=None)` for a model that streams
(SPEC 4.3): the loop passes `on_delta` only to a callable that takes it, and only with an `on_step`."""


# -- events --------------------------------------------------------------------------------------


def _unset(value: Any) -> bool:
    return value is None


class Refusal(_Value):
    """Why the model declined (SPEC 4.2), as the provider said it: `category` (Anthropic: `cyber`,
    `bio`, `frontier_llm`, `reasoning_extraction`, `general_harms`; None when it names none) and
    `explanation` (human-readable, not stable; None when there is none)."""

    category: str | None = None
    explanation: str | None = None


class ModelEvent(_Value):
    kind: Literal["model"] = "model"
    step: int
    text: str | None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    cost_usd: float
    usage: PromptGenUsage
    finish_reason: FinishReason = "stop"
    refusal: Refusal | None = Field(default=None, exclude_if=_unset)
    """Set when `finish_reason == "refusal"` (left out of dumps otherwise)."""
    provider: str | None = Field(default=None, exclude_if=_unset)
    """`result.meta["provider"]`: who answered (None when the model's result does not say)."""
    fallback_from: list[dict[str, str]] | None = Field(default=None, exclude_if=_unset)
    """`result.meta["fallback_from"]`: the providers that failed before this one answered, each
    `{"provider", "reason"}` (None when the first provider answered)."""


class ToolEvent(_Value):
    kind: Literal["tool"] = "tool"
    step: int
    name: str
    call_id: str
    cost_usd: float
    summary: str
    rows: list[str] = Field(default_factory=list)


class AccountLimit(_Value):
    """The shared budget account whose limit stopped a run (a durable worker's, workers/flow/limiter.py): its
    `name`, `period` ("day", "month" or "total") and that period's id (`2026-12-02`, `2026-12`,
    `total`), its `limit_usd`, and what the account had spent and reserved in it (`spent_usd`)."""

    name: str
    period: str
    period_id: str
    limit_usd: float
    spent_usd: float


class BudgetEvent(_Value):
    """The run's budget: finish mode starts, or the run stops (`spent_usd` of the run's `limit_usd`).
    `account` names the shared account when its limit, not the run's, stopped it (left out of the
    event's JSON otherwise)."""

    kind: Literal["budget"] = "budget"
    spent_usd: float
    limit_usd: float
    mode: Literal["finish", "stop"]
    account: AccountLimit | None = None

    @model_serializer(mode="wrap")
    def _without_no_account(
        self, handler: SerializerFunctionWrapHandler
    ) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if data.get("account") is None:
            data.pop("account", None)
        return data


class CompactionEvent(_Value):
    """A compaction step (SPEC 5.2): before model turn `step`, the turns up to `covered_turns` (counted
    from the start of the run's history) were summarized; `cost_usd` is what the summary call cost.
    Emitted after the step, replayed ones too."""

    kind: Literal["compaction"] = "compaction"
    step: int
    covered_turns: int
    cost_usd: float
    input_tokens: int = 0
    """The input-token count of the request that would have been sent (what decided the compaction)."""
    usage: PromptGenUsage = Field(default_factory=PromptGenUsage)
    """The usage of the summary call."""


class SteerEvent(_Value):
    """A steer was taken (SPEC 6.1): before model turn `step`, the message `content` (steer `id`)
    joined the history after the last complete turn. Emitted after its `steer:<id>` step, replayed
    ones too."""

    kind: Literal["steer"] = "steer"
    step: int
    id: str
    content: str


LoopEvent = Annotated[
    ModelEvent | ToolEvent | BudgetEvent | CompactionEvent | SteerEvent | DeltaEvent,
    Field(discriminator="kind"),
]
"""`DeltaEvent` (SPEC 4.3; defined with the contract types, as providers make them): the text of a
model step as it streams, before that step's `ModelEvent`. Never journaled; a replayed step has none."""
LOOP_EVENT: TypeAdapter[LoopEvent] = TypeAdapter(LoopEvent)


# -- options and result --------------------------------------------------------------------------

Reasoning = Literal["off", "low", "medium", "high"]
CacheMode = Literal["off", "system", "conversation"]
CacheTtl = Literal["5m", "1h"]
StoppedBy = Literal[
    "done", "budget", "steps", "cancel", "asked", "refused", "approval", "expired"
]


class Decision(_Value):
    """A person's decision on one held call (SPEC 4.4): `approve`, `reject` (with `reason`) or `edit`
    (with the new `input`). `input_digest`: the digest of the held input the person saw; a decision
    whose digest does not match the held call's is refused before any work (None: not checked)."""

    action: Literal["approve", "reject", "edit"]
    input_digest: str | None = None
    reason: str = ""
    input: dict[str, Any] | None = None
    actor: str | None = None


class Approval(_Value):
    """A held call waiting for a decision: `input` is the validated input as a JSON-safe dict,
    `input_digest` the sha256 of its canonical JSON (`toolloop.input_digest`)."""

    call_id: str
    name: str
    input: dict[str, Any]
    input_digest: str
    estimate_usd: float | None = None


class RunToolLoopOptions(_Options):
    generate: Generate
    model: str
    system: str
    messages: list[ChatMessage]
    tools: list[ToolSpec]
    budget: Budget
    max_steps: int
    step: StepFn
    signal: AbortSignal = NEVER_ABORTED
    reasoning: Reasoning | None = None
    on_step: Callable[[LoopEvent], Any] | None = None
    finish_note: str | None = None
    keep_images: int | None = 2
    cache: CacheMode = "conversation"
    cache_ttl: CacheTtl = "5m"
    """TTL of every mark the request carries (the loop's and the caller's): "1h" is sent as
    `params["cache_ttl"]`, and the provider puts `"ttl": "1h"` on each mark (SPEC 2.9 holds: no
    1-hour mark after a 5-minute one, as all marks share the TTL)."""
    max_tool_result_bytes: int | None = None
    """A tool result (value and content, as JSON) larger than this is answered to the model as an
    error instead (the tool's cost still counts); None: no limit."""
    max_image_bytes: int | None = None
    """A tool result with an image file larger than this is answered as an error; None: no limit."""
    context: ContextPolicy | None = None
    """Context management of a long run (SPEC 5, docs/context.md): None (the default) changes nothing."""
    steers: Steers | None = None
    """Steering (SPEC 6.1): before each model call, and before stopping `done`, the loop asks
    `steers(turn, ending)` for messages to take; each becomes journal step `steer:<id>` (value
    `{"content", "turn", "index"}`, cost 0), a `UserMessage` at the end of the history (never
    between a tool call and its result: every call of the last turn is answered by then) and a
    `SteerEvent`; then it asks again, until none comes. A steer taken before `done` gets a model call
    of its own: the loop goes on. None (the default): no steering."""
    decisions: dict[str, Decision] | None = None
    """Decisions on the calls the previous loop held (`result.approvals`), by call id: the loop answers
    those open calls first, then goes on (SPEC 4.4)."""
    supports: Callable[[str, str], bool] | None = None
    """`supports(feature, model)`: whether the model has a feature on the provider the calls go to
    first (`PromptGen.supports`; "on_demand_compaction" is the one asked, by a `context` policy
    whose `on_demand` is None). None: the `supports` of `generate` when it has one
    (`PromptGen.as_generate()` does), else nothing is supported."""
    count_tokens: (
        Callable[[PromptGenRequest, AbortSignal], Awaitable[int | None]] | None
    ) = None
    """`await count_tokens(request, signal)`: the provider's count of a request's input tokens
    (`PromptGen.count_tokens`: Anthropic's token counting), None when it cannot count. Used by a
    `context` policy near its threshold, where `supports("count_tokens", model)`. None: the
    `count_tokens` of `generate` when it has one (`PromptGen.as_generate()` does)."""
    compacted: CompactionState | None = None
    """The compaction the previous call over these messages ended with (`result.compacted`): with a
    `context` policy, requests start from its summary and the turns from its cut on, so a resume
    after an ask or an approval does not compact the whole history again (docs/context.md)."""


class Asked(_Value):
    input: dict[str, Any]
    """The validated input of the `ask` call, as a JSON-safe dict."""


class RunToolLoopResult(_Value):
    stopped_by: StoppedBy
    spent_usd: float
    steps: int
    messages: list[ChatMessage]
    final_text: str | None = None
    asked: Asked | None = None
    refusal: Refusal | None = Field(default=None, exclude_if=_unset)
    """Set only for `"refused"`: the category and explanation the provider gave."""
    approvals: list[Approval] | None = Field(default=None, exclude_if=_unset)
    """Set only for `"approval"`: the held calls."""
    compacted: CompactionState | None = Field(default=None, exclude_if=_unset)
    """With a `context` policy that compacted (in this call or a previous one): the compaction in
    force at the end, to pass as `options.compacted` to the call that goes on from `messages`."""

"""What the simulated model answers: turns, faults, scripts and policies.

A policy is a callable `(SimRequest) -> SimTurn` (a dict in the turn's shape or a plain string are
accepted too, and so is an async callable). A script is a list of turns; as a policy it answers turn
number `request.assistant_turns` (the number of assistant messages in the request's history), so the
answer depends only on the request: a retried request gets the same turn. Past the end of a script
the answer is `AFTER_SCRIPT`, a plain final text without tool calls.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from toolloop.contract import ChatMessage, ToolDefinition

Wire = Literal["anthropic", "fal"]


class _Value(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SimToolCall(_Value):
    """One tool call of a turn. `raw_arguments` sends arguments that are not JSON (then `input` is
    ignored): fal gets them as `function.arguments`, Anthropic as a string `input`."""

    name: str
    input: Any = Field(default_factory=dict)
    raw_arguments: str | None = None


class SimFault(_Value):
    """A fault served instead of (or before) the turn's answer, for the first `times` requests of a
    conversation at this turn (`times: null` = every time).

    kind "error"   HTTP `status` (429, 500, 529, 401, ...) in the wire's error format; `retry_after`
                   seconds go into a `retry-after` header, `headers` are added as given (e.g.
                   `x-should-retry`), `error_code` becomes `error.details.error_code` (e.g.
                   `contract_spend_limit_reached`)
    kind "timeout" sleep `seconds`, then answer normally (a client with a shorter timeout gives up)
    kind "drop"    close the connection without any response
    kind "refusal" a refusal answer (Anthropic `stop_reason: refusal`; fal `finish_reason:
                   content_filter`)
    Mid-stream, for a streamed request (`"stream": true`), after `after` token pieces of the answer
    (toolloop/sim/stream.py; it must have more pieces than that):
    kind "stream_drop"  close the connection in the middle of the answer
    kind "stream_error" the wire's error event (`status`, default 529: Anthropic `overloaded_error`)
                        and the end of the stream
    kind "stall"        pause `seconds`, then go on with the answer
    A request that is not streamed gets "stream_drop" as "drop", "stream_error" as "error" (HTTP
    `status`, default 529) and "stall" as "timeout".
    """

    kind: Literal[
        "error", "timeout", "drop", "refusal", "stream_drop", "stream_error", "stall"
    ] = "error"
    status: int | None = None
    retry_after: float | None = None
    seconds: float = 0.0
    times: int | None = 1
    message: str | None = None
    headers: dict[str, str] | None = None
    error_code: str | None = None
    after: int = 3

    @model_validator(mode="after")
    def _check(self) -> SimFault:
        if self.kind == "error" and (
            self.status is None or not 400 <= self.status <= 599
        ):
            raise ValueError(
                f"fault kind 'error' needs an HTTP status from 400 to 599, got {self.status!r}; "
                "set status (e.g. 429, 500, 529) or another kind (timeout, drop, refusal)"
            )
        if self.times is not None and self.times < 1:
            raise ValueError(
                f"fault times must be at least 1 (or null for always), got {self.times!r}"
            )
        return self


class SimRefusal(_Value):
    """A scripted refusal: Anthropic answers `stop_reason: refusal` with `stop_details` (`category`
    one of cyber, bio, frontier_llm, reasoning_extraction, general_harms, or None; `explanation`);
    fal answers `finish_reason: content_filter`. The turn's text is kept, its tool calls dropped."""

    category: str | None = None
    explanation: str | None = None


class SimTurn(_Value):
    """One answer of the simulated model.

    `usage` is merged over the computed usage object, in the wire's own key names. `stop_reason`
    overrides the computed one (Anthropic names `end_turn`, `tool_use`, `max_tokens`, `refusal`,
    `pause_turn`, or the neutral `stop`, `tool_calls`, `length`). `latency_s` is added to the
    server's latency. `refusal` makes the answer a refusal with its details. `max_tokens_needed`:
    a request whose `max_tokens` is below it gets the answer cut at max_tokens in the middle of its
    last tool call (Anthropic: that tool_use last, its input `{}`; fal: `length`, its arguments cut
    short). `thinking` is the text of the answer's thinking block when thinking is on (default: one
    made from the history); `redacted_thinking` adds (True) or leaves out (False) a redacted block
    (default: one history in four). See toolloop/sim/thinking.py.
    """

    text: str = ""
    tool_calls: list[SimToolCall] = Field(default_factory=list)
    usage: dict[str, Any] | None = None
    stop_reason: str | None = None
    fault: SimFault | None = None
    latency_s: float = 0.0
    refusal: SimRefusal | None = None
    max_tokens_needed: int | None = None
    thinking: str | None = None
    redacted_thinking: bool | None = None
    tokens_per_s: float | None = None
    """Streamed, the rate of this answer's token pieces (None: the server's `tokens_per_s`)."""
    generation_s: float = 0.0
    """How long the model takes to generate this answer: not streamed, the answer comes that long
    after the request (on top of `latency_s`); streamed, `message_start` comes at once and the
    token pieces are spread over it (in place of `tokens_per_s`). Scaled by the server's
    `time_scale`, as every wait of the simulator is."""

    def cut_by(self, max_tokens: Any) -> bool:
        """This answer's last tool call is cut off under `max_tokens`."""
        needed = self.max_tokens_needed
        return (
            bool(self.tool_calls)
            and needed is not None
            and isinstance(max_tokens, int)
            and max_tokens < needed
        )


AFTER_SCRIPT = SimTurn(text="(The simulator's script has ended.)")


@dataclass(frozen=True)
class SimRequest:
    """A neutral view of one model request, the same for both wires.

    `messages` are parsed back to toolloop.contract types (images become `ImagePart`s whose `path` is
    a `sim://` name or the URL, `hash` the sha256 of the bytes or URL). `assistant_turns` is the
    number of assistant messages in the history; `conversation_id` hashes the system text and the
    first message (the same for every turn of one conversation); `history_hash` hashes the whole
    history without cache marks (the same for a retried request).
    """

    wire: Wire
    model: str
    system: str | None
    messages: list[ChatMessage]
    tools: list[ToolDefinition]
    assistant_turns: int
    conversation_id: str
    history_hash: str
    body: dict[str, Any] = field(repr=False, default_factory=dict)

    @property
    def tool_names(self) -> list[str]:
        return [tool.name for tool in self.tools]


PolicyResult = SimTurn | dict[str, Any] | str
Policy = Callable[[SimRequest], PolicyResult | Awaitable[PolicyResult]]


class Script:
    """A list of turns used as a policy: turn `request.assistant_turns`, then `after_end`."""

    def __init__(
        self,
        turns: Sequence[SimTurn | dict[str, Any] | str],
        after_end: SimTurn = AFTER_SCRIPT,
    ):
        self.turns = [to_turn(turn) for turn in turns]
        self.after_end = after_end

    def __call__(self, request: SimRequest) -> SimTurn:
        index = request.assistant_turns
        return self.turns[index] if index < len(self.turns) else self.after_end

    def __len__(self) -> int:
        return len(self.turns)


def to_turn(value: PolicyResult) -> SimTurn:
    """A turn from a `SimTurn`, a dict in its shape, or a plain string (a final text)."""
    if isinstance(value, SimTurn):
        return value
    if isinstance(value, str):
        return SimTurn(text=value)
    return SimTurn.model_validate(value)


async def answer(policy: Policy, request: SimRequest) -> SimTurn:
    """Ask the policy for its turn (sync or async)."""
    result = policy(request)
    if inspect.isawaitable(result):
        result = await result
    return to_turn(result)


def load_script(path: str | Path) -> Script:
    """A script from a YAML or JSON file: a list of turns (mappings, or strings for final texts), or
    `{turns: [...]}`."""
    path = Path(path)
    text = path.read_text()
    data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    if isinstance(data, dict) and "turns" in data:
        data = data["turns"]
    if not isinstance(data, list):
        raise ValueError(
            f"The script {str(path)!r} is not a list of turns.\n"
            "  Write a YAML/JSON list like [{text: Hi}], or {turns: [...]}."
        )
    return Script(data)


def as_policy(policy_or_script: Policy | Script | Sequence[Any] | str | Path) -> Policy:
    """A policy from a policy, a `Script`, a list of turns or a script file path."""
    if isinstance(policy_or_script, str | Path):
        return load_script(policy_or_script)
    if isinstance(policy_or_script, Script) or callable(policy_or_script):
        return policy_or_script
    return Script(list(policy_or_script))

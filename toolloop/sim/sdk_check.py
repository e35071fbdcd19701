"""Strict mode: every Anthropic request body is validated against the official `anthropic` SDK's
request types (`MessageCreateParamsNonStreaming`, or `MessageCreateParamsStreaming` for a body with
`"stream": true`, and each nested TypedDict), no unknown key anywhere. A body with a beta-only part
(`context_management`, a `compaction` block: `uses_beta`) is checked against the beta namespace's
types instead (`anthropic.types.beta`), its edits each against their own TypedDict.

The SDK is a dev dependency only. `sdk_validator()` returns None when it is not installed; the
simulator then serves without the check and says so in a warning and in `stats()["strict"]`.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from pydantic import ConfigDict, TypeAdapter, ValidationError
from pydantic.warnings import TypedDictExtraConfigWarning as PydanticWarning

Validator = Callable[[dict[str, Any]], None]


class SdkValidationError(ValueError):
    """The body is not a valid `MessageCreateParams` (answered 400 invalid_request_error)."""


def sdk_available() -> bool:
    return importlib.util.find_spec("anthropic") is not None


@functools.cache
def sdk_validator() -> Validator | None:
    """The validator (built once: pydantic schemas are slow to build), or None without the SDK. A
    body with `"stream": true` is checked against `MessageCreateParamsStreaming`, any other against
    `MessageCreateParamsNonStreaming` (`stream` absent or false)."""
    if not sdk_available():
        return None
    return _Dispatch()


@functools.cache
def sdk_count_validator() -> Validator | None:
    """The validator of a `POST /v1/messages/count_tokens` body: the SDK's
    `MessageCountTokensParams` (plain or beta, as for a message), whose fields are the message's
    minus `max_tokens`, `stream`, `metadata`, `stop_sequences`, the sampling ones and a few others;
    None without the SDK."""
    if not sdk_available():
        return None
    return _Dispatch(count=True)


def uses_beta(body: dict[str, Any]) -> bool:
    """The body uses a beta-only part (context management, a compaction block): it is checked
    against the SDK's beta types (`anthropic.types.beta`), and needs its `anthropic-beta` header."""
    if "context_management" in body or "compaction" in body:
        return True
    for turn in body.get("messages") or []:
        content = turn.get("content") if isinstance(turn, dict) else None
        if isinstance(content, list) and any(
            isinstance(block, dict) and block.get("type") == "compaction"
            for block in content
        ):
            return True
    return False


class _Dispatch:
    """The plain types for a plain body, the beta types (built on first use) for a beta one."""

    def __init__(self, count: bool = False) -> None:
        self.count = count
        self.plain = _Checker(beta=False, count=count)
        self.beta: _Checker | None = None

    def __call__(self, body: dict[str, Any]) -> None:
        if not uses_beta(body):
            self.plain(body)
            return
        if self.beta is None:
            self.beta = _Checker(beta=True, count=self.count)
        self.beta(body)


class _Checker:
    """The SDK's request types as pydantic adapters, and the walk of a body through them. `beta`:
    the beta namespace's (`BetaMessageCreateParams...`, `Beta<Block>Param`, the context-management
    edits and `BetaCompactionBlockParam`)."""

    def __init__(self, beta: bool, count: bool = False) -> None:
        import anthropic.types as plain  # the SDK is a dev dependency: a strict simulator only
        import anthropic.types.beta as beta_types  # (as above)
        from anthropic.types import message_create_params as plain_params  # (as above)

        # (as above)
        from anthropic.types.beta import (
            message_create_params as beta_params,
        )

        sdk: Any = beta_types if beta else plain
        params: Any = beta_params if beta else plain_params
        prefix = "Beta" if beta else ""
        # a config is taken by a union only: hence the `| None`
        forbid = ConfigDict(extra="forbid")
        streaming: Any = params.MessageCreateParamsStreaming | None
        whole: Any = params.MessageCreateParamsNonStreaming | None
        if count:  # POST /v1/messages/count_tokens: no stream, no max_tokens
            from anthropic.types import message_count_tokens_params as plain_count
            from anthropic.types.beta import message_count_tokens_params as beta_count

            counting: Any = beta_count if beta else plain_count
            whole = streaming = counting.MessageCountTokensParams | None
        with _quiet():  # a few beta TypedDicts allow extra keys: pydantic warns that forbid skips them
            self.streaming: TypeAdapter[Any] = TypeAdapter(streaming, config=forbid)
            self.whole: TypeAdapter[Any] = TypeAdapter(whole, config=forbid)
        self.sdk = sdk
        self.prefix = prefix

        def kind(name: str) -> Any:
            return getattr(sdk, prefix + name)

        self.blocks: dict[str, Any] = {
            "text": kind("TextBlockParam"),
            "image": kind("ImageBlockParam"),
            "tool_use": kind("ToolUseBlockParam"),
            "tool_result": kind("ToolResultBlockParam"),
            "thinking": kind("ThinkingBlockParam"),
            "redacted_thinking": kind("RedactedThinkingBlockParam"),
        }
        self.edits: dict[str, Any] = {}
        if beta:
            self.blocks["compaction"] = sdk.BetaCompactionBlockParam
            self.edits = {
                "clear_tool_uses_20250919": sdk.BetaClearToolUses20250919EditParam,
                "clear_thinking_20251015": sdk.BetaClearThinking20251015EditParam,
                "compact_20260112": sdk.BetaCompact20260112EditParam,
            }
        self.thinking: dict[str, Any] = {
            "adaptive": kind("ThinkingConfigAdaptiveParam"),
            "enabled": kind("ThinkingConfigEnabledParam"),
            "disabled": kind("ThinkingConfigDisabledParam"),
        }
        self.choices: dict[str, Any] = {
            "auto": kind("ToolChoiceAutoParam"),
            "any": kind("ToolChoiceAnyParam"),
            "tool": kind("ToolChoiceToolParam"),
            "none": kind("ToolChoiceNoneParam"),
        }
        self.text_block = kind("TextBlockParam")
        self.tool = kind("ToolParam")
        self.output_config = kind("OutputConfigParam")
        self.adapters: dict[Any, TypeAdapter[Any]] = {}

    def __call__(self, body: dict[str, Any]) -> None:
        try:
            self.top_level(body)
            for index, turn in enumerate(body["messages"]):
                self.message(index, turn)
            params = self.streaming if body.get("stream") is True else self.whole
            # after the blocks: their errors name the field
            _consume(params.validate_python(body))
        except ValidationError as error:
            raise SdkValidationError(_message(error, "")) from None
        except (AttributeError, KeyError, TypeError) as error:
            raise SdkValidationError(
                f"The body does not have the SDK's shape: {error!r}"
            ) from None

    def top_level(self, body: dict[str, Any]) -> None:
        for index, block in enumerate(
            body["system"] if isinstance(body.get("system"), list) else []
        ):
            self.strict(self.text_block, block, f"system.{index}")
        for index, tool in enumerate(body.get("tools") or []):
            self.strict(self.tool, tool, f"tools.{index}")
        managed = body.get("context_management")
        edits = managed.get("edits") if isinstance(managed, dict) else None
        for index, edit in enumerate(edits if isinstance(edits, list) else []):
            kind = edit.get("type") if isinstance(edit, dict) else None
            self.strict(
                self.edits.get(str(kind)), edit, f"context_management.edits.{index}"
            )
        if isinstance(body.get("tool_choice"), dict):
            self.strict(
                self.choices.get(body["tool_choice"].get("type")),
                body["tool_choice"],
                "tool_choice",
            )
        if isinstance(body.get("thinking"), dict):
            self.strict(
                self.thinking.get(body["thinking"].get("type")),
                body["thinking"],
                "thinking",
            )
        if isinstance(body.get("output_config"), dict):
            self.strict(self.output_config, body["output_config"], "output_config")

    def message(self, index: int, turn: dict[str, Any]) -> None:
        extra = sorted(set(turn) - {"role", "content"})
        if extra:
            raise SdkValidationError(
                f"messages.{index}.{extra[0]}: Extra inputs are not permitted"
            )
        content = turn["content"]
        for position, block in enumerate([] if isinstance(content, str) else content):
            where = f"messages.{index}.content.{position}"
            self.strict(self.blocks.get(block.get("type")), block, where)
            inner = block.get("content") if block.get("type") == "tool_result" else None
            for number, part in enumerate(inner if isinstance(inner, list) else []):
                self.strict(
                    self.blocks.get(part.get("type")), part, f"{where}.content.{number}"
                )

    def strict(self, typed_dict: Any, value: Any, where: str) -> None:
        if typed_dict is None:
            raise SdkValidationError(f"{where}: unknown type {value.get('type')!r}")
        adapter = self.adapters.get(typed_dict)
        if (
            adapter is None
        ):  # kept alive: a lazily validated Iterable must not outlive its adapter
            with _quiet():
                adapter = self.adapters[typed_dict] = TypeAdapter(typed_dict)
        try:
            _consume(adapter.validate_python(value))
        except ValidationError as error:
            raise SdkValidationError(_message(error, where)) from None
        known = typed_dict.__required_keys__ | typed_dict.__optional_keys__
        extra = sorted(set(value) - known)
        if extra:
            raise SdkValidationError(
                f"{where}.{extra[0]}: Extra inputs are not permitted"
            )


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Building an adapter of a TypedDict that allows extra items (some beta types) warns that the
    `forbid` config does not apply to it; the strict walk checks every block's keys itself."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PydanticWarning)
        yield


def _message(error: Any, where: str) -> str:
    """The first error of a pydantic `ValidationError`, at its place in the body."""
    first = error.errors()[0]
    # union arm names
    loc = [str(part) for part in first["loc"] if not str(part)[:1].isupper()]
    place = ".".join([where, *loc] if where else loc)
    return f"{place}: {first['msg']} (anthropic SDK request types)"


def _consume(value: Any) -> Any:
    """Walk what pydantic validated lazily (the SDK types use Iterable) so every item is checked."""
    if isinstance(value, dict):
        return {k: _consume(v) for k, v in value.items()}
    if isinstance(value, str | bytes):
        return value
    if isinstance(value, Iterable):
        return [_consume(v) for v in value]
    return value

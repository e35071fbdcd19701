"""The public API is what `toolloop.__all__` names (and `toolloop.http.__all__`, the HTTP clients):
pinned here, so adding or dropping a name is a decision made in this file (extend the sorted list
when you export something new)."""

from __future__ import annotations

from types import ModuleType

import toolloop
import toolloop.http
import toolloop.providers

PUBLIC = [
    "AbortController",
    "AbortError",
    "AbortSignal",
    "AlreadyDecidedError",
    "Approval",
    "ApprovalError",
    "Asked",
    "AssistantMessage",
    "Budget",
    "BudgetEvent",
    "ChatMessage",
    "CompactionError",
    "CompactionEvent",
    "CompactionState",
    "ContentPart",
    "ContextPolicy",
    "Decision",
    "DeltaEvent",
    "ImagePart",
    "Journal",
    "LoopEvent",
    "MemoryJournal",
    "ModelEvent",
    "PromptGen",
    "PromptGenError",
    "PromptGenHandler",
    "PromptGenRequest",
    "PromptGenResult",
    "PromptGenUnavailableError",
    "PromptGenUsage",
    "ReasoningBlock",
    "RedisJournal",
    "Refusal",
    "RunToolLoopOptions",
    "RunToolLoopResult",
    "SpendLimitError",
    "Started",
    "StepResult",
    "TextPart",
    "ToolArgumentsError",
    "ToolCall",
    "ToolDefinition",
    "ToolEvent",
    "ToolMessage",
    "ToolOutput",
    "ToolSpec",
    "ToolloopError",
    "UserMessage",
    "from_env",
    "idempotency_key",
    "input_digest",
    "is_prompt_gen_unavailable",
    "run_tool_loop",
]

SPEC_NAMES = {
    # SPEC.md sections 1 and 2: every one of these must stay exported
    "AbortController",
    "AbortError",
    "AbortSignal",
    "Asked",
    "AssistantMessage",
    "Budget",
    "BudgetEvent",
    "ChatMessage",
    "ContentPart",
    "ImagePart",
    "LoopEvent",
    "MemoryJournal",
    "ModelEvent",
    "PromptGenRequest",
    "PromptGenResult",
    "PromptGenUnavailableError",
    "PromptGenUsage",
    "RunToolLoopOptions",
    "RunToolLoopResult",
    "Started",
    "StepResult",
    "TextPart",
    "ToolArgumentsError",
    "ToolCall",
    "ToolDefinition",
    "ToolEvent",
    "ToolMessage",
    "ToolOutput",
    "ToolSpec",
    "UserMessage",
    "is_prompt_gen_unavailable",
    "run_tool_loop",
    # SPEC.md section 3: the providers' facade and the handler protocol
    "PromptGen",
    "PromptGenHandler",
}


def test_all_is_pinned_and_sorted() -> None:
    assert sorted(PUBLIC) == PUBLIC
    assert sorted(toolloop.__all__) == PUBLIC


def test_every_public_name_resolves_and_nothing_else_leaks() -> None:
    for name in toolloop.__all__:
        assert getattr(toolloop, name) is not None
    leaked = {
        name
        for name, value in vars(toolloop).items()
        if not name.startswith("_")
        and name not in toolloop.__all__
        and not isinstance(value, ModuleType)
    }
    assert leaked == set()


def test_spec_names_are_exported() -> None:
    assert set(toolloop.__all__) >= SPEC_NAMES


HTTP_PUBLIC = [
    "Answer",
    "HttpClient",
    "HttpxClient",
    "KeepAliveClient",
    "Network",
    "client_from_env",
]


def test_the_http_package_exports_its_clients_and_the_providers_keep_theirs() -> None:
    """`toolloop.http` is the one home of the HTTP clients; `toolloop.providers` still re-exports
    the clients its handlers take (`http_client=`), the same objects."""
    assert sorted(toolloop.http.__all__) == HTTP_PUBLIC
    for name in ("HttpClient", "HttpxClient", "KeepAliveClient", "client_from_env"):
        assert getattr(toolloop.providers, name) is getattr(toolloop.http, name)

"""What the simulated APIs refuse, from the same model catalogue the providers shape requests by
(`toolloop.providers.catalog`: one source of truth). Checked on the raw body before it is parsed.

Anthropic (`check_anthropic`), with the real API's status and error type, by the request's
`anthropic-version` (the versioning page, platform.claude.com/docs/en/api/versioning, read 2026-12-02):
    2026-10-21                 `temperature`, `top_p`, `top_k` are removed: any of them is a 400 (the
                               message, "<name>: Extra inputs are not permitted", is a third party's
                               capture); a `document` block directly in an assistant message and a
                               text block with non-empty `citations` in a user message (directly or
                               in a `search_result` block) are a 400
    2023-06-01                 `temperature`, `top_p`, `top_k` where the model's row refuses
                               `temperature` are a 400 (derived: the pages name the three together)
    both:
    404 not_found_error        a retired or unknown model ("model: <id>"); register a test model
                               with `SimServer(catalog=default_catalog().with_models(...))`
    400 invalid_request_error  a `thinking.type` the model does not accept (`disabled` to an
                               always-on model, `adaptive` to Haiku 4.5 / Opus 4.5, `enabled` to an
                               adaptive-only one), effort without adaptive thinking, a budget under
                               1,024 or not under max_tokens; a forced tool_choice where refused or
                               while thinking; `temperature` where refused; max_tokens above the
                               model's maximum output; an empty text block or message; a
                               tool_result whose tool_use is not in the previous assistant turn
fal (`check_fal`), for `anthropic/...` slugs only (other vendors pass): a retired or unknown
Anthropic slug is a 404; temperature and a forced tool_choice where the model refuses them, 400.
"""

from __future__ import annotations

from typing import Any

from toolloop.providers.catalog import Catalog, ModelInfo


class SimRefusal(Exception):
    """The request breaks a rule of the API: answered with `status` and the wire's envelope."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(status, message)
        self.status = status
        self.message = message


def model_info(catalog: Catalog, model: Any) -> ModelInfo:
    info = catalog.find(model) if isinstance(model, str) else None
    if info is None or info.status == "retired":
        raise SimRefusal(404, f"model: {model}")
    return info


SAMPLING = ("temperature", "top_p", "top_k")
NEW_VERSION = "2026-10-21"


def check_anthropic(body: Any, catalog: Catalog, version: str | None = None) -> None:
    """Refuse what the API refuses for this body under `version` (None: 2023-06-01's rules)."""
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        return  # the parser answers the shape errors
    if version == NEW_VERSION:
        check_version(body)
    info = model_info(catalog, body["model"])
    model = info.id
    max_tokens = body.get("max_tokens")
    cap = info.max_output_tokens
    if isinstance(max_tokens, int) and cap is not None and max_tokens > cap:
        raise SimRefusal(
            400,
            f"max_tokens: {max_tokens} > {cap}, which is the maximum allowed number of output tokens "
            f"for {model}",
        )
    for name in SAMPLING:
        if name in body and not info.temperature:
            raise SimRefusal(
                400,
                f"{name}: is not supported for {model}. Remove it from the request.",
            )
    thinking_on = _check_thinking(body, info, max_tokens)
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") in ("any", "tool"):
        if not info.forced_tool_choice:
            raise SimRefusal(
                400,
                f"tool_choice: forced tool use (type '{choice['type']}') is not supported for {model}; "
                "use 'auto' or 'none'.",
            )
        if thinking_on:
            raise SimRefusal(
                400, "Thinking may not be enabled when tool_choice forces tool use."
            )
    _check_messages(body.get("messages"), body.get("system"))


def check_version(body: dict[str, Any]) -> None:
    """The three Messages API changes of anthropic-version 2026-10-21."""
    for name in SAMPLING:
        if name in body:
            raise SimRefusal(400, f"{name}: Extra inputs are not permitted")
    messages = body.get("messages")
    for index, turn in enumerate(messages if isinstance(messages, list) else []):
        content = turn.get("content") if isinstance(turn, dict) else None
        for position, block in enumerate(content if isinstance(content, list) else []):
            if not isinstance(block, dict):
                continue
            where = f"messages.{index}.content.{position}"
            if turn.get("role") == "assistant" and block.get("type") == "document":
                raise SimRefusal(
                    400,
                    f"{where}: a `document` block may not be in an assistant message",
                )
            if turn.get("role") == "user":
                inner = (
                    block.get("content")
                    if block.get("type") == "search_result"
                    else [block]
                )
                for text in inner if isinstance(inner, list) else []:
                    if (
                        isinstance(text, dict)
                        and text.get("type") == "text"
                        and text.get("citations")
                    ):
                        raise SimRefusal(
                            400,
                            f"{where}: a text block in a user message may not carry `citations`",
                        )


def _check_thinking(body: dict[str, Any], info: ModelInfo, max_tokens: Any) -> bool:
    """Refuse what the model does not accept; whether the model thinks for this request."""
    thinking = body.get("thinking")
    effort = (body.get("output_config") or {}).get("effort")
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    model = info.id
    if kind is not None and kind not in info.thinking:
        if kind == "disabled":
            message = (
                f"thinking.type: 'disabled' is not supported for {model}: thinking is always on. "
                "Use thinking.type 'adaptive' with output_config.effort."
            )
        elif kind == "adaptive":
            message = (
                f"adaptive thinking is not supported on {model}. "
                "Use thinking.type 'enabled' with budget_tokens."
            )
        elif kind == "enabled":
            message = (
                f"thinking.type.enabled is not supported for {model}. Use thinking.type.adaptive "
                "and output_config.effort to control thinking behavior."
            )
        else:
            message = f"thinking.type: {kind!r} is not supported for {model}."
        raise SimRefusal(400, message)
    if effort is not None and "adaptive" not in info.thinking:
        raise SimRefusal(
            400, f"output_config.effort: effort is not supported on {model}."
        )
    if kind == "enabled":
        budget = thinking.get("budget_tokens") if isinstance(thinking, dict) else None
        if not isinstance(budget, int) or budget < 1024:
            raise SimRefusal(
                400,
                "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024",
            )
        if isinstance(max_tokens, int) and max_tokens <= budget:
            raise SimRefusal(
                400, "`max_tokens` must be greater than `thinking.budget_tokens`."
            )
    if kind is None:
        return info.always_thinks
    return bool(kind != "disabled")


def _check_messages(messages: Any, system: Any) -> None:
    if isinstance(system, list):
        for block in system:
            _check_text(block, "system")
    if not isinstance(messages, list):
        return
    previous_uses: set[str] = set()
    for index, turn in enumerate(messages):
        if not isinstance(turn, dict):
            return
        content = turn.get("content")
        last = index == len(messages) - 1
        if (
            isinstance(content, str)
            and not content
            and not (last and turn.get("role") == "assistant")
        ):
            raise SimRefusal(
                400,
                f"messages.{index}: all messages must have non-empty content except for the optional "
                "final assistant message",
            )
        blocks = content if isinstance(content, list) else []
        uses: set[str] = set()
        for position, block in enumerate(blocks):
            _check_block(
                block,
                f"messages.{index}.content.{position}",
                turn.get("role"),
                previous_uses,
                uses,
            )
        previous_uses = uses if turn.get("role") == "assistant" else set()


def _check_block(
    block: Any, where: str, role: Any, previous_uses: set[str], uses: set[str]
) -> None:
    """One content block: non-empty text; a tool_result answers a tool_use of the previous assistant
    turn. A tool_use's id joins `uses`."""
    _check_text(block, where)
    if not isinstance(block, dict):
        return
    if block.get("type") == "tool_use":
        uses.add(str(block.get("id")))
    elif block.get("type") == "tool_result":
        if role == "user" and str(block.get("tool_use_id")) not in previous_uses:
            raise SimRefusal(
                400,
                f"{where}: unexpected `tool_use_id` found in `tool_result` blocks: "
                f"{block.get('tool_use_id')}. Each `tool_result` block must have a corresponding "
                "`tool_use` block in the previous message.",
            )
        for inner in (
            block.get("content") or [] if isinstance(block.get("content"), list) else []
        ):
            _check_text(inner, where)


def _check_text(block: Any, where: str) -> None:
    if (
        isinstance(block, dict)
        and block.get("type") == "text"
        and not block.get("text")
    ):
        raise SimRefusal(400, f"{where}: text content blocks must be non-empty")


def check_fal(body: Any, catalog: Catalog) -> None:
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        return
    model = body["model"]
    if not model.startswith(("anthropic/", "claude-")):
        return  # the simulator does not model other vendors' catalogues
    info = model_info(catalog, model)
    if "temperature" in body and not info.temperature:
        raise SimRefusal(400, f"temperature is not supported for {model}.")
    choice = body.get("tool_choice")
    if (
        choice == "required" or isinstance(choice, dict)
    ) and not info.forced_tool_choice:
        raise SimRefusal(
            400,
            f"tool_choice: forced tool use is not supported for {model}; use 'auto'.",
        )

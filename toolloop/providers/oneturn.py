"""One-turn providers (SPEC 3.2): `openai` (Chat Completions over HTTP), `codex` and `claude` (the
local CLIs). They serve a prompt and an optional system text only: a request with messages, tools,
tool_choice or cache_system is refused with `PromptGenUnavailableError(reason="unsupported")` in
`estimate` and `execute`, before any call, so a fallback chain moves past them. A CLI binary that is
not on PATH is unavailable "missing". The caller's abort kills a running CLI and is raised unchanged.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Mapping
from typing import Any

import httpx

from toolloop.abort import AbortSignal, race
from toolloop.contract import OnDelta, PromptGenRequest, PromptGenResult, PromptGenUsage
from toolloop.errors import PromptGenError, PromptGenUnavailableError
from toolloop.http import HttpClient, HttpxClient
from toolloop.providers.base import Secret
from toolloop.providers.call import call_json
from toolloop.providers.catalog import Catalog, ModelPrice, token_cost
from toolloop.providers.chat_completions import parse_completion
from toolloop.providers.common import (
    estimate_tokens,
    input_text,
    max_tokens_of,
    reasoning_of,
)
from toolloop.providers.models import default_catalog
from toolloop.providers.retry import Endpoint, RetryPolicy

_CLAUDE_ALIASES = {
    "sonnet": "claude-sonnet-5-5",
    "opus": "claude-opus-5-5",
    "haiku": "claude-haiku-4-5",
}


def refuse_unless_one_turn(name: str, request: PromptGenRequest) -> None:
    if not request.is_one_turn:
        raise PromptGenUnavailableError(
            f"{name} serves one-turn prompts only; this request has messages, tools or cache marks.\n"
            "  Use the 'anthropic' or 'fal' provider, or list one of them in fallback.",
            "unsupported",
        )


def _estimate(
    price: ModelPrice | None, request: PromptGenRequest, max_tokens: int
) -> float:
    if price is None:
        return 0.0
    total = (
        estimate_tokens(input_text(request)) * price.input + max_tokens * price.output
    )
    return round(total / 1_000_000, 6)


class OpenAIHandler:
    """`POST {base_url}/v1/chat/completions` with a system and a user message."""

    name = "openai"

    def __init__(
        self,
        api_key: str | None = None,
        *,
        base_url: str = "https://api.openai.com",
        default_model: str = "gpt-5-mini",
        prices: Mapping[str, ModelPrice] | None = None,
        catalog: Catalog | None = None,
        timeout_s: float = 120.0,
        retry: RetryPolicy | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        http_client: HttpClient | None = None,
    ) -> None:
        self._key = Secret(api_key)
        self.default_model = default_model
        self.catalog = (catalog or default_catalog()).with_prices(prices or {})
        url = base_url.rstrip("/") + "/v1/chat/completions"
        self.endpoint = Endpoint(
            self.name, url, "OPENAI_API_KEY", timeout_s, retry or RetryPolicy()
        )
        self.http: HttpClient = http_client or HttpxClient(transport)

    def __repr__(self) -> str:
        return f"OpenAIHandler(url={self.endpoint.url!r}, key={'set' if self._key else 'missing'})"

    def estimate(self, request: PromptGenRequest) -> float:
        refuse_unless_one_turn(self.name, request)
        price = self.catalog.price(request.model or self.default_model)
        return _estimate(price, request, max_tokens_of(request, 4096))

    async def execute(
        self,
        request: PromptGenRequest,
        signal: AbortSignal,
        on_delta: OnDelta | None = None,
    ) -> PromptGenResult:
        signal.throw_if_aborted()
        refuse_unless_one_turn(self.name, request)
        model = request.model or self.default_model
        price = self.catalog.price(model) or ModelPrice(0, 0, 0, 0)
        key = self._key.required("openai", "OPENAI_API_KEY")
        messages = (
            [{"role": "system", "content": request.system}] if request.system else []
        )
        messages.append({"role": "user", "content": request.prompt})
        body: dict[str, Any] = {"model": model, "messages": messages}
        given = (request.params or {}).get("max_tokens") is not None
        # None: the API's own default
        max_tokens = max_tokens_of(request, 4096) if given else None
        if max_tokens is not None:
            body["max_completion_tokens"] = max_tokens
        if request.temperature is not None:
            body["temperature"] = min(max(request.temperature, 0.0), 2.0)
        reasoning = reasoning_of(self.name, request, None)
        if reasoning is not None:
            body["reasoning_effort"] = "minimal" if reasoning == "off" else reasoning
        headers = {"authorization": f"Bearer {key}"}
        data = await call_json(
            self.endpoint, body, headers, signal, client=self.http, secret=self._key
        )
        return parse_completion(
            data,
            provider=self.name,
            price=price,
            model=model,
            input_text=input_text(request),
            max_tokens=max_tokens,
        )


class _CliHandler:
    name = ""
    binary = ""

    def __init__(
        self,
        *,
        binary: str | None = None,
        default_model: str | None = None,
        timeout_s: float = 600,
    ):
        self.binary = binary or self.binary
        self.default_model = default_model
        self.timeout_s = timeout_s

    def __repr__(self) -> str:
        return f"{type(self).__name__}(binary={self.binary!r}, default_model={self.default_model!r})"

    def _price(self, model: str | None) -> ModelPrice | None:
        return None

    def estimate(self, request: PromptGenRequest) -> float:
        refuse_unless_one_turn(self.name, request)
        return _estimate(
            self._price(request.model or self.default_model), request, 4096
        )

    async def _run(self, args: list[str], stdin: str, signal: AbortSignal) -> str:
        """Run the CLI with `stdin`; its stdout, or an error with the tail of its stderr."""
        signal.throw_if_aborted()
        path = shutil.which(self.binary)
        if path is None:
            raise PromptGenUnavailableError(
                f"{self.name}: the {self.binary!r} command was not found on PATH.\n"
                f"  Install it, or use another prompt-gen provider.",
                "missing",
            )
        process = await asyncio.create_subprocess_exec(
            path,
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await race(
                asyncio.wait_for(process.communicate(stdin.encode()), self.timeout_s),
                signal,
            )
        except TimeoutError:
            raise PromptGenError(
                f"{self.name} did not answer within {self.timeout_s:g} s.\n  Try again, or raise timeout_s.",
                retryable=True,
            ) from None
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        if process.returncode != 0:
            tail = (
                " ".join(err.decode(errors="replace").split())[-300:] or "(no stderr)"
            )
            raise PromptGenError(
                f"{self.name} exited with status {process.returncode}: {tail}\n"
                f"  Run `{self.binary}` by hand to see what it needs (login, model name).",
            )
        return out.decode(errors="replace")


class ClaudeHandler(_CliHandler):
    """`claude -p --output-format json`: the answer, its reported cost and usage."""

    name = "claude"
    binary = "claude"

    def _price(self, model: str | None) -> ModelPrice | None:
        model = _CLAUDE_ALIASES.get(model or "sonnet", model or "")
        return default_catalog().price(model)

    async def execute(
        self,
        request: PromptGenRequest,
        signal: AbortSignal,
        on_delta: OnDelta | None = None,
    ) -> PromptGenResult:
        refuse_unless_one_turn(self.name, request)
        args = ["-p", "--output-format", "json"]
        model = request.model or self.default_model
        if model:
            args += ["--model", model]
        if request.system:
            args += ["--system-prompt", request.system]
        data = _json(self.name, await self._run(args, request.prompt, signal))
        if data.get("is_error"):
            raise PromptGenError(
                f"claude answered with an error: {data.get('result')!s:.300}\n  Check `claude` by hand."
            )
        usage = _dict(data.get("usage"))
        read = int(usage.get("cache_read_input_tokens") or 0)
        write = int(usage.get("cache_creation_input_tokens") or 0)
        prompt = int(usage.get("input_tokens") or 0) + read + write
        cost = data.get("total_cost_usd")
        return PromptGenResult(
            text=str(data.get("result") or ""),
            cost_usd=float(cost) if isinstance(cost, int | float) else 0.0,
            finish_reason="stop",
            usage=PromptGenUsage(
                prompt_tokens=prompt,
                completion_tokens=int(usage.get("output_tokens") or 0),
                cached_tokens=read,
                cache_write_tokens=write,
            ),
            meta={
                "provider": self.name,
                "model": model,
                "cost_source": "usage" if cost is not None else "none",
            },
        )


class CodexHandler(_CliHandler):
    """`codex exec --json`: the last agent message and the turn's token usage."""

    name = "codex"
    binary = "codex"

    def _price(self, model: str | None) -> ModelPrice | None:
        return default_catalog().price(model) if model else None

    async def execute(
        self,
        request: PromptGenRequest,
        signal: AbortSignal,
        on_delta: OnDelta | None = None,
    ) -> PromptGenResult:
        refuse_unless_one_turn(self.name, request)
        model = request.model or self.default_model
        args = (
            ["exec", "--json", "--skip-git-repo-check"]
            + (["-m", model] if model else [])
            + ["-"]
        )
        prompt = (
            f"{request.system}\n\n{request.prompt}"
            if request.system
            else request.prompt
        )
        text, usage = "", _dict(None)
        for line in (await self._run(args, prompt, signal)).splitlines():
            event = _json(self.name, line) if line.strip().startswith("{") else {}
            item = _dict(event.get("item"))
            if (
                event.get("type") == "item.completed"
                and item.get("type") == "agent_message"
            ):
                text = str(item.get("text") or "")
            elif event.get("type") == "turn.completed":
                usage = _dict(event.get("usage"))
            elif event.get("type") in ("turn.failed", "error"):
                raise PromptGenError(
                    f"codex failed: {json.dumps(event)[:300]}\n  Check `codex exec` by hand."
                )
        read = int(usage.get("cached_input_tokens") or 0)
        prompt_tokens, output = (
            int(usage.get("input_tokens") or 0),
            int(usage.get("output_tokens") or 0),
        )
        price = self._price(model)
        cost = (
            token_cost(
                price,
                input=max(prompt_tokens - read, 0),
                output=output,
                cache_read=read,
            )
            if price
            else 0.0
        )
        return PromptGenResult(
            text=text,
            cost_usd=cost,
            usage=PromptGenUsage(
                prompt_tokens=prompt_tokens,
                completion_tokens=output,
                cached_tokens=read,
            ),
            meta={
                "provider": self.name,
                "model": model,
                "cost_source": "tokens" if price else "none",
            },
        )


def _json(name: str, text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError:
        raise PromptGenError(
            f"{name} printed output that is not JSON: {text.strip()[:200]!r}\n"
            "  Check the installed CLI version supports JSON output."
        ) from None
    return data if isinstance(data, dict) else {}


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}

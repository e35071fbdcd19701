"""`FalHandler`: fal's OpenAI-compatible router (SPEC 3.2: serves messages, tools, text-part marks)."""

from __future__ import annotations

from collections.abc import Mapping

import httpx

from toolloop.abort import AbortSignal
from toolloop.contract import PromptGenRequest, PromptGenResult
from toolloop.errors import PromptGenError, PromptGenUnavailableError
from toolloop.providers.base import Secret
from toolloop.providers.common import (
    check_request,
    estimate_input_tokens,
    image_parts,
    input_text,
    log_answer,
    max_tokens_of,
    read_images,
    reasoning_of,
)
from toolloop.providers.fal.request import DEFAULT_MAX_TOKENS, build_body, prompt_images
from toolloop.providers.fal.response import flag, parse_completion
from toolloop.providers.http import Endpoint, RetryPolicy, post_json
from toolloop.providers.prices import ANTHROPIC_PRICES, FAL_PRICES, ModelPrice, find_price

DEFAULT_RUN_URL = "https://fal.run"
DEFAULT_MODEL = "anthropic/claude-opus-5.5"
ROUTE = "/openrouter/router/openai/v1/chat/completions"


class FalHandler:
    """Calls `POST {run_url}/openrouter/router/openai/v1/chat/completions` with `Authorization: Key`.
    Model None or "default" means `default_model`; every model needs a price row. A bare Anthropic
    model id (`claude-sonnet-4-5`) is sent as fal's router names it (`anthropic/claude-sonnet-4-5`) at
    Anthropic's prices, so a run that falls back from `anthropic` to `fal` keeps its model."""

    name = "fal"

    def __init__(
        self,
        api_key: str | None = None,
        *,
        run_url: str | None = None,
        default_model: str = DEFAULT_MODEL,
        prices: Mapping[str, ModelPrice] | None = None,
        timeout_s: float = 60.0,
        retry: RetryPolicy | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        key_env: str = "FAL_KEY",
    ) -> None:
        self._key = Secret(api_key)
        self.run_url = (run_url or DEFAULT_RUN_URL).rstrip("/")
        self.default_model = default_model
        self.prices: dict[str, ModelPrice] = {**FAL_PRICES, **(prices or {})}
        self.endpoint = Endpoint(
            provider=self.name,
            url=self.run_url + ROUTE,
            key_env=key_env,
            timeout_s=timeout_s,
            policy=retry or RetryPolicy(),
            transport=transport,
        )

    def __repr__(self) -> str:
        key = "set" if self._key else "missing"
        return f"FalHandler(run_url={self.run_url!r}, default_model={self.default_model!r}, key={key})"

    def estimate(self, request: PromptGenRequest) -> float:
        """USD ceiling: estimated input tokens (1000 per image) + max_tokens at the output price."""
        check_request(self.name, request)
        price = self._price(self._model(request))
        reasoning_of(self.name, request, "medium")
        tokens = estimate_input_tokens(request) + 1000 * len(prompt_images(request))
        total = tokens * price.input + max_tokens_of(request, DEFAULT_MAX_TOKENS) * price.output
        return round(total / 1_000_000, 6)

    async def execute(self, request: PromptGenRequest, signal: AbortSignal) -> PromptGenResult:
        signal.throw_if_aborted()
        check_request(self.name, request)
        model = self._model(request)
        price = self._price(model)
        reasoning = reasoning_of(self.name, request, "medium") or "medium"
        extra = prompt_images(request)
        key = self._key.reveal()
        if key is None:
            raise PromptGenUnavailableError(
                f"{self.name} has no API key.\n"
                f"  Set {self.endpoint.key_env}, or use another prompt-gen provider.",
                "auth",
            )
        images = await read_images(self.name, image_parts(request) + extra)
        body = build_body(request, model=model, reasoning=reasoning, images=images)
        headers = {"authorization": f"Key {key}"}
        data = await post_json(self.endpoint, body, headers, signal, secret=self._key, flag=flag)
        result = parse_completion(
            data,
            price=price,
            model=model,
            input_text=input_text(request),
            max_tokens=max_tokens_of(request, DEFAULT_MAX_TOKENS),
        )
        if result.meta is not None:
            result.meta["reasoning"] = reasoning
        log_answer(self.name, model, result)
        return result

    def _model(self, request: PromptGenRequest) -> str:
        if request.model in (None, "default"):
            return self.default_model
        model = str(request.model)
        return f"anthropic/{model}" if model.startswith("claude-") else model

    def _price(self, model: str) -> ModelPrice:
        price = find_price(self.prices, model)
        if price is None and model.startswith("anthropic/"):
            price = find_price(ANTHROPIC_PRICES, model.removeprefix("anthropic/"))
        if price is None:
            known = ", ".join(sorted(self.prices))
            raise PromptGenError(
                f"{self.name} has no price for model {model!r}; it knows {known}.\n"
                "  Pass prices={model: ModelPrice(...)} to the handler, or pick a priced model."
            )
        return price

"""`AnthropicHandler`: the native Messages API provider (SPEC 3.2: serves messages, tools, marks).

It streams (`"stream": true`, toolloop/providers/anthropic/stream.py) when the caller passes
`on_delta`, or when the body's `max_tokens` is above `NON_STREAMING_MAX_TOKENS` (21,333: the SDK
refuses such a call non-streamed, as it may outlive 10 minutes); else it asks for the whole answer.
Either way the result is the same `PromptGenResult`; streamed, `timeout_s` is an idle timeout.
"""

from __future__ import annotations

from collections.abc import Mapping

import httpx

from toolloop.abort import AbortSignal
from toolloop.contract import OnDelta, PromptGenRequest, PromptGenResult
from toolloop.errors import PromptGenError, PromptGenUnavailableError
from toolloop.providers.anthropic.encode import encode_body
from toolloop.providers.anthropic.params import DEFAULT_MAX_TOKENS, top_level
from toolloop.providers.anthropic.request import betas, body_frame
from toolloop.providers.anthropic.response import cut_cost, parse_message
from toolloop.providers.anthropic.stream import NON_STREAMING_MAX_TOKENS, MessageStream
from toolloop.providers.base import Secret
from toolloop.providers.catalog import Catalog, ModelInfo, ModelPrice
from toolloop.providers.client import HttpClient, HttpxClient
from toolloop.providers.common import (
    cache_ttl_of,
    check_request,
    estimate_input_tokens,
    image_parts,
    log_answer,
    max_tokens_of,
    read_images,
    reasoning_of,
)
from toolloop.providers.cutcost import Cut, Readers, carry, with_cuts
from toolloop.providers.http import Endpoint, RetryPolicy, call_json
from toolloop.providers.models import default_catalog

DEFAULT_BASE_URL = "https://api.anthropic.com"
DEFAULT_MODEL = "claude-sonnet-5-5"
API_VERSION = "2023-06-01"


class AnthropicHandler:
    """Calls `POST {base_url}/v1/messages`. The key is read from `api_key` (the caller usually passes
    `ANTHROPIC_API_KEY`); without one, `execute` raises unavailable "auth" and `estimate` works.
    Every request is shaped and priced from `catalog` (default `default_catalog()`), with `prices`
    laid over it; a retired or unknown model is an error before any call (`Catalog.require`).
    `http_client`: the HTTP client to send with (default: its own `HttpxClient`, over `transport`
    when given); `timeout_s`: the wait for an answer, or, streamed, for each next event."""

    name = "anthropic"

    def __init__(
        self,
        api_key: str | None = None,
        *,
        base_url: str | None = None,
        default_model: str = DEFAULT_MODEL,
        prices: Mapping[str, ModelPrice] | None = None,
        catalog: Catalog | None = None,
        timeout_s: float = 180.0,
        retry: RetryPolicy | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        key_env: str = "ANTHROPIC_API_KEY",
        http_client: HttpClient | None = None,
    ) -> None:
        self._key = Secret(api_key)
        self.base_url = (base_url or DEFAULT_BASE_URL).rstrip("/")
        self.default_model = default_model
        self.catalog = (catalog or default_catalog()).with_prices(prices or {})
        self.endpoint = Endpoint(
            provider=self.name,
            url=f"{self.base_url}/v1/messages",
            key_env=key_env,
            timeout_s=timeout_s,
            policy=retry or RetryPolicy(),
        )
        self.http: HttpClient = http_client or HttpxClient(transport)

    def __repr__(self) -> str:
        key = "set" if self._key else "missing"
        return (
            f"AnthropicHandler(base_url={self.base_url!r}, default_model={self.default_model!r}, key={key})"
        )

    def estimate(self, request: PromptGenRequest) -> float:
        """USD ceiling: estimated input tokens at the input price + max_tokens at the output price."""
        check_request(self.name, request)
        model = request.model or self.default_model
        info, price = self._model(model)
        reasoning = reasoning_of(self.name, request, None)
        output = int(top_level(request, info, reasoning)[0]["max_tokens"])
        total = estimate_input_tokens(request) * price.input + output * price.output
        return round(total / 1_000_000, 6)

    async def execute(
        self, request: PromptGenRequest, signal: AbortSignal, on_delta: OnDelta | None = None
    ) -> PromptGenResult:
        signal.throw_if_aborted()
        check_request(self.name, request)
        model = request.model or self.default_model
        info, price = self._model(model)
        reasoning = reasoning_of(self.name, request, None)
        ttl = cache_ttl_of(request)
        key = self._key.reveal()
        if key is None:
            raise PromptGenUnavailableError(
                f"{self.name} has no API key.\n"
                f"  Set {self.endpoint.key_env}, or use another prompt-gen provider.",
                "auth",
            )
        images = await read_images(self.name, image_parts(request))
        notes: list[str] = []
        body = body_frame(request, model=model, reasoning=reasoning, info=info, notes=notes)
        headers = {"x-api-key": key, "anthropic-version": API_VERSION}
        if needed := betas(request):
            headers["anthropic-beta"] = ",".join(needed)
        streams = on_delta is not None or int(body["max_tokens"]) > NON_STREAMING_MAX_TOKENS
        if streams:
            body["stream"] = True
        content = encode_body(request, body, images)  # the bytes of build_body's body, built once per message
        del body  # the request's dict tree is not kept across the wait for the answer
        readers = Readers(MessageStream) if streams else None

        def cuts() -> list[Cut]:  # streamed attempts cut mid-answer: they may have been billed
            made = readers.cut() if readers is not None else []
            return [cut_cost(p, price=price, model=model, ttl=ttl) for p in made]

        try:
            data = await call_json(self.endpoint, content, headers, signal, client=self.http,
                                   secret=self._key, stream=readers, on_delta=on_delta)  # fmt: skip
        except PromptGenError as error:
            carry(error, cuts())
            raise
        room = max_tokens_of(request, DEFAULT_MAX_TOKENS)
        result = with_cuts(parse_message(data, price=price, model=model, ttl=ttl, max_tokens=room), cuts())
        if notes and result.meta is not None:
            result.meta["request_notes"] = notes
        log_answer(self.name, model, result)
        return result

    def _model(self, model: str) -> tuple[ModelInfo, ModelPrice]:
        """The catalogue row and price of `model`; retired, unknown or unpriced raise here."""
        info = self.catalog.require(self.name, model)
        assert info.price is not None  # require() refuses a row without a price
        return info, info.price

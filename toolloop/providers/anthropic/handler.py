"""`AnthropicHandler`: the native Messages API provider (SPEC 3.2: serves messages, tools, marks).

It streams (`"stream": true`, toolloop/providers/anthropic/stream.py) when the caller passes
`on_delta`, or when the SDK would refuse the call non-streamed (the expected time of the body's
`max_tokens` is over 10 minutes: above 21,333 tokens; toolloop/providers/timeouts.py); else it asks
for the whole answer and waits at least that expected time for it (the SDK's 10 minutes by
default). Either way the result is the same `PromptGenResult`; streamed, the timeout is an idle
timeout. Attempts that timed out or were cut are priced into the result (cutcost.py).
"""

from __future__ import annotations

from collections.abc import Mapping

import httpx

from toolloop.abort import AbortSignal
from toolloop.contract import OnDelta, PromptGenRequest, PromptGenResult
from toolloop.errors import PromptGenError
from toolloop.http import HttpClient, HttpxClient
from toolloop.providers.anthropic.encode import encode_body
from toolloop.providers.anthropic.params import DEFAULT_MAX_TOKENS, top_level
from toolloop.providers.anthropic.request import (
    betas,
    body_frame,
    build_body,
    count_body,
)
from toolloop.providers.anthropic.response import cut_cost, parse_message
from toolloop.providers.anthropic.stream import MessageStream
from toolloop.providers.base import Secret
from toolloop.providers.call import Tally, call_json
from toolloop.providers.catalog import Catalog, ModelInfo, ModelPrice
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
from toolloop.providers.cutcost import Cut, Readers, carry, unanswered, with_cuts
from toolloop.providers.models import default_catalog
from toolloop.providers.retry import Endpoint, RetryPolicy
from toolloop.providers.timeouts import SDK_TIMEOUT_S, Timeouts

DEFAULT_BASE_URL = "https://api.anthropic.com"
DEFAULT_MODEL = "claude-sonnet-5-5"
API_VERSION = "2026-10-21"
"""The `anthropic-version` sent (docs/providers.md, "API version"): what the SDK 2.x sends. Its three
Messages API changes (the versioning page: temperature / top_p / top_k removed, a `document` block in
an assistant message and non-empty `citations` on a user text block refused) touch nothing these
requests send. The key stays in `x-api-key` (the SDK's `Authorization: Bearer` is a client choice)."""


COUNT_WAIT_S = 30.0
"""The read timeout of a token count (a short answer)."""


class AnthropicHandler:
    """Calls `POST {base_url}/v1/messages`. The key is read from `api_key` (the caller usually passes
    `ANTHROPIC_API_KEY`); without one, `execute` raises unavailable "auth" and `estimate` works.
    Every request is shaped and priced from `catalog` (default `default_catalog()`), with `prices`
    laid over it; a retired or unknown model is an error before any call (`Catalog.require`).
    `http_client`: the HTTP client to send with (default: its own `HttpxClient`, over `transport`
    when given); `timeout_s`: the least wait for a whole answer, and streamed the most wait for each
    next read (default the SDK's 10 minutes); `timeouts` sets each part (timeouts.py) and wins."""

    name = "anthropic"

    def __init__(
        self,
        api_key: str | None = None,
        *,
        base_url: str | None = None,
        default_model: str = DEFAULT_MODEL,
        prices: Mapping[str, ModelPrice] | None = None,
        catalog: Catalog | None = None,
        timeout_s: float = SDK_TIMEOUT_S,
        retry: RetryPolicy | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        key_env: str = "ANTHROPIC_API_KEY",
        http_client: HttpClient | None = None,
        timeouts: Timeouts | None = None,
    ) -> None:
        self._key = Secret(api_key)
        self.base_url = (base_url or DEFAULT_BASE_URL).rstrip("/")
        self.default_model = default_model
        self.catalog = (catalog or default_catalog()).with_prices(prices or {})
        self.timeouts = timeouts or Timeouts.of(timeout_s)
        self.endpoint = Endpoint(
            provider=self.name,
            url=f"{self.base_url}/v1/messages",
            key_env=key_env,
            timeout_s=self.timeouts.idle_s,
            policy=retry or RetryPolicy(),
        )
        self.http: HttpClient = http_client or HttpxClient(transport)
        self.count_endpoint = Endpoint(
            provider=self.name,
            url=f"{self.base_url}/v1/messages/count_tokens",
            key_env=key_env,
            timeout_s=self.timeouts.connect_s + COUNT_WAIT_S,
            policy=retry or RetryPolicy(),
        )

    def __repr__(self) -> str:
        key = "set" if self._key else "missing"
        return (
            f"AnthropicHandler(base_url={self.base_url!r},"
            f" default_model={self.default_model!r}, key={key})"
        )

    def supports(self, feature: str, model: str | None = None) -> bool:
        """Whether `model` (default: the handler's) has `feature` on this API, from its catalogue
        row (`ModelInfo.supports`): "on_demand_compaction", and "count_tokens" (`count_tokens`).
        An unknown or retired model has nothing."""
        info = self.catalog.find(model or self.default_model)
        if info is None or info.status == "retired":
            return False
        # token counting: every active model (the token-counting docs)
        return feature == "count_tokens" or info.supports(feature)

    async def count_tokens(self, request: PromptGenRequest, signal: AbortSignal) -> int:
        """The input tokens of `request` by Anthropic's token counting (`POST
        /v1/messages/count_tokens`, free, its own rate limit): the message body it would send,
        less its output fields (`count_body`), with the same beta headers. The docs call the
        figure an estimate that may differ from the billed one by a little. Raises as `execute`
        does (the retry policy's attempts); a caller falls back to its own estimate."""
        signal.throw_if_aborted()
        check_request(self.name, request)
        model = request.model or self.default_model
        info, _ = self._model(model)
        key = self._key.required(self.name, self.endpoint.key_env)
        images = await read_images(self.name, image_parts(request))
        reasoning = reasoning_of(self.name, request, None)
        body = count_body(
            build_body(
                request, model=model, reasoning=reasoning, images=images, info=info
            )
        )
        headers = {"x-api-key": key, "anthropic-version": API_VERSION}
        if needed := betas(request):
            headers["anthropic-beta"] = ",".join(needed)
        data = await call_json(
            self.count_endpoint,
            body,
            headers,
            signal,
            client=self.http,
            secret=self._key,
            connect_s=self.timeouts.connect_s,
        )
        tokens = data.get("input_tokens") if isinstance(data, dict) else None
        if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
            raise PromptGenError(
                f"{self.name} answered the token count without input_tokens.\n"
                "  Check the base URL; the loop falls back to its estimate."
            )
        return tokens

    def estimate(self, request: PromptGenRequest) -> float:
        """USD ceiling: estimated input tokens at the input price + max_tokens at the output price."""
        check_request(self.name, request)
        model = request.model or self.default_model
        info, price = self._model(model)
        reasoning = reasoning_of(self.name, request, None)
        output = int(top_level(request, info, reasoning)[0]["max_tokens"])
        tokens = estimate_input_tokens(request)
        price = price.at(tokens)  # a long prompt is priced at its tier
        total = tokens * price.input + output * price.output
        return round(total / 1_000_000, 6)

    async def execute(
        self,
        request: PromptGenRequest,
        signal: AbortSignal,
        on_delta: OnDelta | None = None,
    ) -> PromptGenResult:
        signal.throw_if_aborted()
        check_request(self.name, request)
        model = request.model or self.default_model
        info, price = self._model(model)
        reasoning = reasoning_of(self.name, request, None)
        ttl = cache_ttl_of(request)
        key = self._key.required(self.name, self.endpoint.key_env)
        images = await read_images(self.name, image_parts(request))
        notes: list[str] = []
        body = body_frame(
            request, model=model, reasoning=reasoning, info=info, notes=notes
        )
        headers = {"x-api-key": key, "anthropic-version": API_VERSION}
        if needed := betas(request):
            headers["anthropic-beta"] = ",".join(needed)
        max_tokens = int(body["max_tokens"])
        timeouts = self.timeouts
        streams = on_delta is not None or timeouts.streams(max_tokens)
        if streams:
            body["stream"] = True
        # the bytes of build_body's body, built once per message
        content = encode_body(request, body, images)
        del body  # the request's dict tree is not kept across the wait for the answer
        readers = Readers(MessageStream) if streams else None
        tally = Tally()

        def cuts() -> list[
            Cut
        ]:  # attempts cut mid-answer or timed out: they may have been billed
            made = readers.cut() if readers is not None else []
            found = [cut_cost(p, price=price, model=model, ttl=ttl) for p in made]
            if tally.unanswered:  # (no estimate walk of the request on the usual path)
                found += unanswered(
                    self.name,
                    tally.unanswered,
                    input_tokens=estimate_input_tokens(request),
                    max_tokens=max_tokens,
                    input_rate=price.input,
                    output_rate=price.output,
                )
            return found

        try:
            data = await call_json(
                self.endpoint,
                content,
                headers,
                signal,
                client=self.http,
                secret=self._key,
                stream=readers,
                on_delta=on_delta,
                wait_s=timeouts.idle_s if streams else timeouts.whole(max_tokens),
                connect_s=timeouts.connect_s,
                tally=tally,
            )
        except PromptGenError as error:
            carry(error, cuts())
            raise
        room = max_tokens_of(request, DEFAULT_MAX_TOKENS)
        result = with_cuts(
            parse_message(data, price=price, model=model, ttl=ttl, max_tokens=room),
            cuts(),
        )
        if notes and result.meta is not None:
            result.meta["request_notes"] = notes
        log_answer(self.name, model, result)
        return result

    def _model(self, model: str) -> tuple[ModelInfo, ModelPrice]:
        """The catalogue row and price of `model`; retired, unknown or unpriced raise here."""
        info = self.catalog.require(self.name, model)
        assert info.price is not None  # require() refuses a row without a price
        return info, info.price

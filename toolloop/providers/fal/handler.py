"""`FalHandler`: fal's OpenAI-compatible router (SPEC 3.2: serves messages, tools, text-part marks).

It streams (`"stream": true, "stream_options": {"include_usage": true}`;
toolloop/providers/fal/stream.py) with `on_delta`, or when the anthropic SDK's rule would require
it (the expected time of `max_tokens` is over 10 minutes: above 21,333 tokens, so fal's default
of 32,000 streams; toolloop/providers/timeouts.py); else it asks for the whole answer and waits at
least that expected time. The result is the same; streamed, the timeout is an idle timeout
between chunks. Attempts that timed out or were cut are priced into the result (cutcost.py).
"""

from __future__ import annotations

from collections.abc import Mapping

import httpx

from toolloop.abort import AbortSignal
from toolloop.contract import OnDelta, PromptGenRequest, PromptGenResult, ToolChoiceName
from toolloop.errors import PromptGenError
from toolloop.fastjson import dumps
from toolloop.http import HttpClient, HttpxClient
from toolloop.providers.base import Secret
from toolloop.providers.call import Tally, call_json
from toolloop.providers.catalog import Catalog, ModelInfo, ModelPrice
from toolloop.providers.chat_completions import parse_completion
from toolloop.providers.common import (
    cache_ttl_of,
    check_request,
    estimate_input_tokens,
    image_parts,
    input_text,
    log_answer,
    max_tokens_of,
    reasoning_of,
    with_ttl,
)
from toolloop.providers.cutcost import Cut, Readers, carry, unanswered, with_cuts
from toolloop.providers.fal.request import DEFAULT_MAX_TOKENS, build_body, prompt_images
from toolloop.providers.fal.response import cut_cost, flag
from toolloop.providers.fal.storage import DEFAULT_UPLOAD_URL, UrlCache, image_urls
from toolloop.providers.fal.stream import CompletionStream
from toolloop.providers.models import default_catalog
from toolloop.providers.retry import Endpoint, RetryPolicy
from toolloop.providers.timeouts import SDK_TIMEOUT_S, Timeouts

DEFAULT_RUN_URL = "https://fal.run"
DEFAULT_MODEL = "anthropic/claude-opus-5.5"
ROUTE = "/openrouter/router/openai/v1/chat/completions"
UPLOAD_ROUTE = "/storage/upload/initiate?storage_type=fal-cdn-v3"
UPLOAD_TIMEOUT_S = 60.0
"""The most wait of an image upload's each read (or `Timeouts.whole_s` when shorter)."""


class FalHandler:
    """Calls `POST {run_url}/openrouter/router/openai/v1/chat/completions` with `Authorization: Key`.
    Model None or "default" means `default_model`. Every model comes from `catalog` (default
    `default_catalog()`, `prices` laid over it): a retired or unknown one is an error before any
    call. A bare Anthropic id (`claude-sonnet-5-5`) is sent as fal's router names it (the row's
    `fal_slug`, e.g. `anthropic/claude-sonnet-5.5`) at the same catalogue price, so a run that
    falls back from `anthropic` to `fal` keeps its model. `temperature` and a forced `tool_choice`
    are left out (`auto`) for an Anthropic model that refuses them; `meta["request_notes"]` says so.
    Images are uploaded to fal storage (`upload_url`; default fal's own with the default `run_url`,
    else `{run_url}/storage/upload/initiate`), each file once: its URL is kept in `self.urls`, an
    LRU of `url_cache_size` entries by content hash; `upload_images=False` sends data URIs.
    `http_client`: the HTTP client of the model calls (default: its own `HttpxClient`, over
    `transport` when given). `timeout_s`: the least wait for a whole answer, and streamed the most
    wait for each next read (default the anthropic SDK's 10 minutes); `timeouts` sets each part
    (timeouts.py) and wins."""

    name = "fal"

    def __init__(
        self,
        api_key: str | None = None,
        *,
        run_url: str | None = None,
        default_model: str = DEFAULT_MODEL,
        prices: Mapping[str, ModelPrice] | None = None,
        catalog: Catalog | None = None,
        timeout_s: float = SDK_TIMEOUT_S,
        retry: RetryPolicy | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        key_env: str = "FAL_KEY",
        upload_url: str | None = None,
        upload_images: bool = True,
        url_cache_size: int = 4096,
        http_client: HttpClient | None = None,
        timeouts: Timeouts | None = None,
    ) -> None:
        self._key = Secret(api_key)
        self.timeouts = timeouts or Timeouts.of(timeout_s)
        self.run_url = (run_url or DEFAULT_RUN_URL).rstrip("/")
        self.default_model = default_model
        own = self.run_url == DEFAULT_RUN_URL
        default_upload = DEFAULT_UPLOAD_URL if own else self.run_url + UPLOAD_ROUTE
        self.upload_url = (upload_url or default_upload) if upload_images else None
        self.urls = UrlCache(url_cache_size)
        self.catalog = (catalog or default_catalog()).with_prices(prices or {})
        self.endpoint = Endpoint(
            provider=self.name,
            url=self.run_url + ROUTE,
            key_env=key_env,
            timeout_s=self.timeouts.idle_s,
            policy=retry or RetryPolicy(),
        )
        self.transport = transport
        self.http: HttpClient = http_client or HttpxClient(transport)

    def __repr__(self) -> str:
        key = "set" if self._key else "missing"
        return f"FalHandler(run_url={self.run_url!r}, default_model={self.default_model!r}, key={key})"

    def estimate(self, request: PromptGenRequest) -> float:
        """USD ceiling: estimated input tokens (1000 per image) + max_tokens at the output price."""
        check_request(self.name, request)
        price = self._model(request)[2]
        reasoning_of(self.name, request, "medium")
        tokens = estimate_input_tokens(request) + 1000 * len(prompt_images(request))
        price = price.at(tokens)  # a long prompt is priced at its tier
        total = (
            tokens * price.input
            + max_tokens_of(request, DEFAULT_MAX_TOKENS) * price.output
        )
        return round(total / 1_000_000, 6)

    async def execute(
        self,
        request: PromptGenRequest,
        signal: AbortSignal,
        on_delta: OnDelta | None = None,
    ) -> PromptGenResult:
        signal.throw_if_aborted()
        check_request(self.name, request)
        model, info, price = self._model(request)
        request, notes = _accepted(request, info)
        ttl = cache_ttl_of(request)
        reasoning = reasoning_of(self.name, request, "medium") or "medium"
        extra = prompt_images(request)
        key = self._key.required(self.name, self.endpoint.key_env)
        images = await image_urls(
            image_parts(request) + extra,
            cache=self.urls,
            upload_url=self.upload_url,
            key=key,
            timeout_s=min(UPLOAD_TIMEOUT_S, self.timeouts.whole_s),
            transport=self.transport,
            provider=self.name,
            network=getattr(self.http, "network", None),
        )
        body = with_ttl(
            build_body(request, model=model, reasoning=reasoning, images=images), ttl
        )
        headers = {"authorization": f"Key {key}"}
        max_tokens = max_tokens_of(request, DEFAULT_MAX_TOKENS)
        timeouts = self.timeouts
        streams = on_delta is not None or timeouts.streams(max_tokens)
        if streams:
            body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        readers = Readers(CompletionStream) if streams else None
        tally = Tally()
        content = dumps(body)
        del body  # the request's dict tree is not kept across the wait for the answer

        def cuts() -> list[
            Cut
        ]:  # attempts cut mid-answer or timed out: they may have been billed
            made = readers.cut() if readers is not None else []
            text = input_text(request) if made else ""
            found = [
                cut_cost(p, price=price, model=model, input_text=text, ttl=ttl)
                for p in made
            ]
            if tally.unanswered:  # (no estimate walk of the request on the usual path)
                found += unanswered(
                    self.name,
                    tally.unanswered,
                    input_tokens=estimate_input_tokens(request)
                    + 1000 * len(prompt_images(request)),
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
                flag=flag,
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
        result = parse_completion(
            data,
            provider=self.name,
            price=price,
            model=model,
            input_text=input_text(request),
            ttl=ttl,
            max_tokens=max_tokens_of(request, DEFAULT_MAX_TOKENS),
        )
        result = with_cuts(result, cuts())
        if result.meta is not None:
            result.meta["reasoning"] = reasoning
            if notes:
                result.meta["request_notes"] = notes
        log_answer(self.name, model, result)
        return result

    def _model(self, request: PromptGenRequest) -> tuple[str, ModelInfo, ModelPrice]:
        """The id to send, the catalogue row and its price; retired, unknown or unpriced raise."""
        name = (
            self.default_model
            if request.model in (None, "default")
            else str(request.model)
        )
        info = self.catalog.require(self.name, name)
        assert info.price is not None  # require() refuses a row without a price
        if "/" in name or info.vendor != "anthropic":
            return name, info, info.price
        return info.fal_slug or f"anthropic/{name}", info, info.price


def _accepted(
    request: PromptGenRequest, info: ModelInfo
) -> tuple[PromptGenRequest, list[str]]:
    """The request without what an Anthropic model refuses (temperature, a forced tool_choice)."""
    if info.vendor != "anthropic":
        return request, []
    update: dict[str, object] = {}
    notes = []
    if request.temperature is not None and not info.temperature:
        update["temperature"] = None
        notes.append(f"{info.id} refuses temperature: not sent")
    forced = request.tool_choice == "required" or isinstance(
        request.tool_choice, ToolChoiceName
    )
    if forced and not info.forced_tool_choice:
        update["tool_choice"] = "auto"
        notes.append(f"{info.id} refuses a forced tool_choice: sent 'auto'")
    return (request.model_copy(update=update) if update else request), notes

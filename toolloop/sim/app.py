"""The simulator's ASGI app: one pipeline for both wires, plus `/_sim/stats` and `/_sim/reset`.

A model request goes: key check (401) -> header check -> strict mode's SDK validation (400, the
Anthropic wire) -> the catalogue's rules (`rules.py`: 404 for a retired or unknown model, 400 for
what the model refuses) -> parse (400) -> cache plan (400 for bad marks; reads the cache) -> the
policy's turn -> its fault, if still due for this history -> latency
(the server's plus the turn's) -> cache commit (writes) -> the answer, cut to `max_tokens`; for a
body with `"stream": true` the same answer as Server-Sent Events at `tokens_per_s`, with the turn's
mid-stream fault, if any (toolloop/sim/stream.py).
Nothing but the fault counters, the stats and the prompt cache is kept between requests, so the
same request always gets the same answer once its faults are used up.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import math
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from toolloop.providers.catalog import Catalog
from toolloop.providers.models import default_catalog
from toolloop.sim import anthropic_wire, compaction, fal_wire, stream
from toolloop.sim.cache import PromptCache
from toolloop.sim.common import Parsed, Wire, fit_max_tokens
from toolloop.sim.context import ContextRules, Managed
from toolloop.sim.ratelimit import SimRateLimits
from toolloop.sim.rules import (
    NEW_VERSION,
    SAMPLING,
    SimRefusal,
    check_anthropic,
    check_fal,
)
from toolloop.sim.script import Policy, SimFault, SimTurn, answer
from toolloop.sim.sdk_check import sdk_count_validator, sdk_validator

log = logging.getLogger("toolloop.sim")

ANTHROPIC_PATH = "/v1/messages"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
COUNT_FIELDS = frozenset(
    {
        "model",
        "messages",
        "system",
        "tools",
        "tool_choice",
        "thinking",
        "output_config",
        "context_management",
        "compaction",
        "mcp_servers",
        "cache_control",
        "speed",
    }
)
"""The body of `POST /v1/messages/count_tokens` (the SDK's `MessageCountTokensParams`, anthropic
2.14.0, less its account fields): a message's body minus `max_tokens`, `stream`, `metadata`,
`stop_sequences`, `temperature` / `top_p` / `top_k`, `service_tier` and the like."""
FAL_PATH = "/openrouter/router/openai/v1/chat/completions"
UPLOAD_PATH = "/storage/upload/initiate"
_SEND_KEY = "toolloop.sim.send"
MID_STREAM = frozenset({"stream_drop", "stream_error", "stall"})


class _Dropped(Response):
    """The response of a "drop" fault: its connection is already closed, nothing is sent."""


@dataclass(frozen=True)
class _Wire:
    name: str
    module: Wire


class Simulator:
    """The state of one simulated provider and its ASGI app (`simulator.app`)."""

    def __init__(
        self,
        policy: Policy,
        *,
        latency_s: float = 0.0,
        require_key: str | None = None,
        cache: PromptCache | None = None,
        catalog: Catalog | None = None,
        strict: bool = False,
        idle_timeout_s: float | None = None,
        rate_limits: SimRateLimits | None = None,
        tokens_per_s: float | None = None,
        fal_rate_limits: SimRateLimits | None = None,
        time_scale: float = 1.0,
        stream_end_delay_s: float = 0.0,
    ) -> None:
        if not (math.isfinite(time_scale) and time_scale > 0):
            raise ValueError(
                f"time_scale must be a finite number above 0, got {time_scale!r}"
            )
        self.policy = policy
        self.time_scale = time_scale
        """Real seconds per simulated second: every wait (latencies, `generation_s`, token pacing,
        the seconds of a timeout or stall fault) is multiplied by it, so 190 s of generation take
        1.9 s at 0.01. `retry-after` values are sent as scripted (they are the client's waits)."""
        self.stream_end_delay_s = stream_end_delay_s
        """A streamed answer's HTTP body ends this long (real seconds) after its last event
        (`message_stop` / `data: [DONE]`), as when the final chunk comes in a later TCP segment."""
        self.tokens_per_s = tokens_per_s
        """The rate of a streamed answer's token pieces (None: as fast as they can be sent)."""
        self.rate_limits = rate_limits or SimRateLimits()
        """The Anthropic wire's limits per key; `fal_rate_limits` the fal wire's."""
        self.fal_rate_limits = fal_rate_limits or SimRateLimits()
        self.idle_timeout_s = idle_timeout_s
        self._idle_since: dict[int, tuple[Any, float]] = {}
        """Per keep-alive connection (its transport's id): the transport and when it last finished a
        response (holding the transport keeps its id from being reused by a new connection)."""
        self.latency_s = latency_s
        self.require_key = require_key
        self.catalog = catalog or default_catalog()
        # not `cache or`: an empty PromptCache is falsy (it has a length)
        self.cache = cache if cache is not None else PromptCache(catalog=self.catalog)
        self.validate = sdk_validator() if strict else None
        self.validate_count = sdk_count_validator() if strict else None
        if strict and self.validate is None:
            log.warning(
                "the simulator's strict mode is off: the anthropic SDK is not installed, so request "
                "bodies are not validated against its types (pip install anthropic to turn it on)"
            )
        self.strict = self.validate is not None
        self._lock = threading.Lock()
        self.context = ContextRules(secrets.token_bytes(32))
        """Context management (toolloop/sim/context.py): its compaction blocks are signed with a key
        of this server's own, so a block from another server (or tampered with) is refused."""
        self._ids = itertools.count(1)
        self._faults: Counter[str] = Counter()
        self._counts: dict[str, Counter[str]] = {}
        self.files: dict[str, tuple[str, bytes]] = {}
        """fal storage: token -> (content type, bytes) of every finished upload."""
        self._pending: dict[str, str] = {}
        self.upload_failures = 0
        """fal storage: how many of the next upload initiations answer 500 (a scripted failure)."""
        self.reset()
        routes = [
            Route(
                ANTHROPIC_PATH,
                self._route(_Wire("anthropic", anthropic_wire)),
                methods=["POST"],
            ),
            Route(COUNT_TOKENS_PATH, self._count_tokens, methods=["POST"]),
            Route(FAL_PATH, self._route(_Wire("fal", fal_wire)), methods=["POST"]),
            Route(UPLOAD_PATH, self._upload_initiate, methods=["POST"]),
            Route("/storage/upload/put/{token}", self._upload_put, methods=["PUT"]),
            Route("/storage/files/{token}", self._upload_file, methods=["GET"]),
            Route("/_sim/stats", self._stats_route, methods=["GET"]),
            Route("/_sim/reset", self._reset_route, methods=["POST"]),
        ]
        self._app = Starlette(routes=routes)

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI entry; it keeps the server's own `send` so a "drop" fault can reach the socket."""
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        scope[_SEND_KEY] = send
        try:
            if self.idle_timeout_s is not None:
                await self._idle_checked(scope, receive, send)
            else:
                await self._app(scope, receive, send)
        except asyncio.CancelledError:
            # uvicorn cancels what still runs once its graceful shutdown is over (a call whose client
            # was interrupted and left): the request ends here, with nothing to answer and no traceback
            return

    async def _idle_checked(self, scope: Scope, receive: Receive, send: Send) -> None:
        """`idle_timeout_s`: a request on a keep-alive connection idle longer than that finds the
        connection closed before any response (what a client sees when its request crosses the
        server's close of an idle connection); counted as status "closed-idle"."""
        transport = _transport(send)
        if transport is None:
            await self._app(scope, receive, send)
            return
        key = id(transport)
        seen = self._idle_since.pop(key, None)
        assert self.idle_timeout_s is not None
        if (
            seen is not None
            and seen[0] is transport
            and time.monotonic() - seen[1] > self.idle_timeout_s
        ):
            self._count("statuses", "closed-idle")
            transport.close()
            return

        async def sending(message: Any) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get(
                "more_body", False
            ):
                if len(self._idle_since) > 4096:  # forget the connections closed since
                    for old in [
                        k for k, (t, _) in self._idle_since.items() if t.is_closing()
                    ]:
                        del self._idle_since[old]
                self._idle_since[key] = (transport, time.monotonic())

        await self._app(scope, receive, sending)

    def stats(self) -> dict[str, Any]:
        """Request counts: total, per endpoint, per conversation, per status, per fault served."""
        with self._lock:
            counts = {name: dict(counter) for name, counter in self._counts.items()}
            connections = len(self._peers)
        requests = sum(counts["endpoints"].values())
        return {
            "requests": requests,
            **counts,
            "cache_entries": len(self.cache),
            "strict": self.strict,
            "files": len(self.files),
            "connections": connections,
        }

    def reset(self) -> None:
        """Forget the stats, the fault counters and the prompt cache."""
        with self._lock:
            kinds = [
                "endpoints",
                "conversations",
                "statuses",
                "faults",
                "uploads",
                "streamed",
            ]
            kinds += ["compactions", "billed", "counted"]
            self._counts = {key: Counter() for key in kinds}
            self._peers: set[Any] = set()
            self._faults = Counter()
            self.files, self._pending, self.upload_failures = {}, {}, 0
        self.cache.clear()
        self.rate_limits.reset()
        self.fal_rate_limits.reset()

    async def _upload_initiate(self, request: Request) -> Response:
        """fal storage, step 1: `{file_name, content_type}` -> `{upload_url, file_url}` (counted in
        `stats()["uploads"]["initiate"]`; a scripted failure answers 500)."""
        self._count("uploads", "initiate")
        if fal_wire.api_key(request.headers) == "":
            return JSONResponse(
                {"detail": "Missing authorization header"}, status_code=401
            )
        with self._lock:
            failing = self.upload_failures > 0
            self.upload_failures -= 1 if failing else 0
        if failing:
            self._count("uploads", "failed")
            return JSONResponse(
                {"detail": "storage is unavailable (scripted)"}, status_code=500
            )
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not (isinstance(body, dict) and isinstance(body.get("content_type"), str)):
            return JSONResponse(
                {"detail": "Pass {file_name, content_type}."}, status_code=422
            )
        token = f"f{next(self._ids):06d}"
        with self._lock:
            self._pending[token] = body["content_type"]
        base = str(request.base_url).rstrip("/")
        return JSONResponse(
            {
                "upload_url": f"{base}/storage/upload/put/{token}",
                "file_url": f"{base}/storage/files/{token}",
            }
        )

    async def _upload_put(self, request: Request) -> Response:
        """fal storage, step 2: the bytes of an initiated upload (counted as `uploads["put"]`)."""
        token = request.path_params["token"]
        data = await request.body()
        with self._lock:
            kind = self._pending.pop(token, None)
            if kind is not None:
                self.files[token] = (request.headers.get("content-type") or kind, data)
        if kind is None:
            return JSONResponse({"detail": "no such upload"}, status_code=404)
        self._count("uploads", "put")
        return Response(status_code=200)

    async def _upload_file(self, request: Request) -> Response:
        found = self.files.get(request.path_params["token"])
        if found is None:
            return JSONResponse({"detail": "no such file"}, status_code=404)
        return Response(found[1], media_type=found[0])

    def _bill(self, wire: str, model: str, usage: dict[str, Any]) -> None:
        """Add an answer's billed tokens to `stats()["billed"]` (`<model>:<kind>`). Anthropic: every
        entry of `usage.iterations` when the answer has them (a compaction's summary pass is billed
        there, outside the top level), else the top level; fal: its prompt and completion tokens."""
        with self._lock:
            billed = self._counts["billed"]
            if wire != "anthropic":
                details = usage.get("prompt_tokens_details") or {}
                cached = int(details.get("cached_tokens", 0) or 0)
                written = int(details.get("cache_write_tokens", 0) or 0)
                billed[f"{model}:input"] += (
                    int(usage.get("prompt_tokens", 0)) - cached - written
                )
                billed[f"{model}:cache_read"] += cached
                billed[f"{model}:cache_write"] += written
                billed[f"{model}:output"] += int(usage.get("completion_tokens", 0))
                return
            iterations = usage.get("iterations") or [usage]
            for item in iterations:
                billed[f"{model}:input"] += int(item.get("input_tokens", 0))
                billed[f"{model}:cache_read"] += int(
                    item.get("cache_read_input_tokens", 0)
                )
                billed[f"{model}:cache_write"] += int(
                    item.get("cache_creation_input_tokens", 0)
                )
                billed[f"{model}:output"] += int(item.get("output_tokens", 0))

    def _count(self, kind: str, key: str) -> None:
        with self._lock:
            self._counts[kind][key] += 1

    def _route(self, wire: _Wire) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            self._count("endpoints", wire.name)
            with (
                self._lock
            ):  # a connection is its client's (host, port) while it is open
                self._peers.add(request.scope.get("client"))
            response = await self._serve(wire, request)
            self._count(
                "statuses",
                "dropped"
                if isinstance(response, _Dropped)
                else str(response.status_code),
            )
            return response

        return endpoint

    async def _serve(self, wire: _Wire, http: Request) -> Response:
        request_id = f"req_sim{next(self._ids):012d}"
        admitted = await self._admit(wire, http, request_id)
        if isinstance(admitted, Response):
            return admitted
        parsed, plan, key, limit_headers, managed = admitted
        sim = compaction.counted(parsed.request)
        self._count("conversations", sim.conversation_id)
        try:
            if (
                managed is not None and managed.on_demand
            ):  # the server's own summary, not the model's turn
                self._count("compactions", sim.history_hash)
                turn = SimTurn()
            elif compaction.is_summary_request(sim):
                self._count("compactions", sim.history_hash)
                turn = compaction.summary_turn(sim)
            else:
                turn = await answer(self.policy, sim)
        except (
            Exception
        ) as error:  # a user's policy: report it rather than hang the client
            log.exception("the simulator's policy raised")
            return self._error(
                wire, 500, f"The simulator's policy raised {error!r}.", request_id
            )
        streamed = sim.body.get("stream") is True
        if streamed:
            self._count("streamed", wire.name)
        fault = (
            turn.fault
            if turn.fault is not None and self._fault_due(sim.history_hash, turn.fault)
            else None
        )
        if fault is not None:
            self._count(
                "faults",
                fault.kind if fault.kind != "error" else f"error:{fault.status}",
            )
            served = await self._before_answer(wire, http, fault, streamed, request_id)
            if served is not None:
                return served
        await self._sleep(turn.latency_s + (0.0 if streamed else turn.generation_s))
        self.cache.commit(plan)
        refusal = fault is not None and fault.kind == "refusal"
        body = wire.module.render(
            fit_max_tokens(turn, sim.body.get("max_tokens")), sim, plan.usage, refusal
        )
        if managed is not None:
            self.context.answer(managed, body, plan.usage, compaction.summary_text(sim))
        self._bill(wire.name, sim.model, body.get("usage", {}))
        limits = self._limits(wire)
        if limits.on:
            usage = body.get("usage", {})
            limits.used_output(
                key, int(usage.get("output_tokens", usage.get("completion_tokens", 0)))
            )
        headers = {"request-id": request_id, **limit_headers}
        if not streamed:
            return JSONResponse(body, headers=headers)
        events = (
            stream.anthropic_events(body)
            if wire.name == "anthropic"
            else stream.fal_chunks(body)
        )
        rate = turn.tokens_per_s or self.tokens_per_s
        mid = fault if fault is not None and fault.kind in MID_STREAM else None
        pace = stream.Pace(
            rate, turn.generation_s, self.time_scale, self.stream_end_delay_s
        )
        chunks = stream.paced(events, wire.name, pace, mid, lambda: self._drop(http))
        return StreamingResponse(
            chunks, media_type="text/event-stream", headers=headers
        )

    async def _admit(
        self, wire: _Wire, http: Request, request_id: str
    ) -> Response | tuple[Parsed, Any, str, dict[str, str], Managed | None]:
        """The parsed request, its cache plan, key and rate-limit headers; or the error answer (a bad
        key, header or body, a rule the model breaks, the rate limit)."""
        module = wire.module
        key = module.api_key(http.headers)
        if not key or (self.require_key is not None and key != self.require_key):
            return self._error(
                wire,
                401,
                "invalid x-api-key" if wire.name == "anthropic" else "Invalid key",
                request_id,
            )
        problem = module.header_problem(http.headers)
        if problem:
            return self._error(wire, 400, problem, request_id)
        try:
            raw = json.loads(await http.body())
            if wire.name == "anthropic":
                version = http.headers.get("anthropic-version")
                if self.validate is not None and isinstance(raw, dict):
                    # the SDK's types are 2026-10-21's: 2023-06-01 still has the sampling fields
                    old = version != NEW_VERSION
                    self.validate(
                        {k: v for k, v in raw.items() if not (old and k in SAMPLING)}
                    )
                check_anthropic(raw, self.catalog, version)
                self.context.check(raw, http.headers)
            else:
                check_fal(raw, self.catalog)
            parsed = module.parse(raw)
            managed: Managed | None = None
            if wire.name == "anthropic":
                managed = self.context.apply(raw, parsed)
                parsed = managed.parsed
            plan = self.cache.plan(parsed.request.model, parsed.blocks)
        except SimRefusal as refused:
            return self._error(wire, refused.status, refused.message, request_id)
        except (
            ValueError
        ) as error:  # bad JSON, the SDK check, WireInputError, CacheRequestError, ...
            return self._error(wire, 400, str(error), request_id)
        limit_headers: dict[str, str] = {}
        limits = self._limits(wire)
        if limits.on:
            wait, limit_headers = limits.admit(
                key, plan.usage.input_tokens + plan.usage.cache_creation_input_tokens
            )
            if wire.name != "anthropic":  # fal sends no anthropic-ratelimit-* headers
                limit_headers = {}
            if wait is not None:
                self._count("faults", "rate_limit")
                limit_headers["retry-after"] = str(max(1, math.ceil(wait)))
                message = "This request would exceed your organization's rate limit. Please try again later."
                return self._error(wire, 429, message, request_id, limit_headers)
        return parsed, plan, key, limit_headers, managed

    async def _count_tokens(self, http: Request) -> Response:
        """`POST /v1/messages/count_tokens` (Anthropic's token counting): the body of a message
        without its output fields (`COUNT_FIELDS`; strict mode: the SDK's `MessageCountTokensParams`),
        checked as a message is (the model's rules, the beta headers), answered
        `{"input_tokens": N}`: the prompt tokens the same message would report (input + cache
        reads + cache writes; after its context edits). Free: no usage, no cache read or write.
        Counted in `stats()["counted"]` by model, `stats()["endpoints"]["count_tokens"]`."""
        self._count("endpoints", "count_tokens")
        request_id = f"req_sim{next(self._ids):012d}"
        wire = _Wire("anthropic", anthropic_wire)
        response = self._counted(wire, http, request_id, await http.body())
        self._count("statuses", str(response.status_code))
        return response

    def _counted(
        self, wire: _Wire, http: Request, request_id: str, content: bytes
    ) -> Response:
        key = anthropic_wire.api_key(http.headers)
        if not key or (self.require_key is not None and key != self.require_key):
            return self._error(wire, 401, "invalid x-api-key", request_id)
        problem = anthropic_wire.header_problem(http.headers)
        if problem:
            return self._error(wire, 400, problem, request_id)
        try:
            raw = json.loads(content)
            if not isinstance(raw, dict):
                raise ValueError("The request body must be a JSON object.")
            extra = sorted(set(raw) - COUNT_FIELDS)
            if extra:
                raise ValueError(f"{extra[0]}: Extra inputs are not permitted")
            if self.validate_count is not None:
                self.validate_count(raw)
            check_anthropic(raw, self.catalog, http.headers.get("anthropic-version"))
            self.context.check(raw, http.headers)
            # the wire's parser wants a message's max_tokens: any value, it is not counted
            parsed = anthropic_wire.parse({**raw, "max_tokens": 1})
            parsed = self.context.apply(raw, parsed).parsed
        except SimRefusal as refused:
            return self._error(wire, refused.status, refused.message, request_id)
        except ValueError as error:
            return self._error(wire, 400, str(error), request_id)
        self._count("counted", parsed.request.model)
        tokens = sum(block.tokens for block in parsed.blocks)
        return JSONResponse(
            {"input_tokens": tokens}, headers={"request-id": request_id}
        )

    def _limits(self, wire: _Wire) -> SimRateLimits:
        return self.rate_limits if wire.name == "anthropic" else self.fal_rate_limits

    async def _before_answer(
        self,
        wire: _Wire,
        http: Request,
        fault: SimFault,
        streamed: bool,
        request_id: str,
    ) -> Response | None:
        """What a fault serves before any answer (an error, a drop), after its wait (a timeout, or
        a mid-stream fault of a request that is not streamed); None: the answer follows."""
        kind: str = fault.kind
        if kind in MID_STREAM and not streamed:
            kind = {"stream_drop": "drop", "stream_error": "error", "stall": "timeout"}[
                kind
            ]
        if kind == "error":
            return self._fault_error(wire, fault, request_id)
        if kind == "drop":
            return self._drop(http)
        if kind == "timeout":
            await asyncio.sleep(fault.seconds * self.time_scale)
        return None

    def _fault_due(self, history_hash: str, fault: SimFault) -> bool:
        with self._lock:
            self._faults[history_hash] += 1
            return fault.times is None or self._faults[history_hash] <= fault.times

    async def _sleep(self, turn_s: float) -> None:
        delay = (self.latency_s + turn_s) * self.time_scale
        if delay > 0:
            await asyncio.sleep(delay)

    def _fault_error(self, wire: _Wire, fault: SimFault, request_id: str) -> Response:
        status = fault.status or (529 if fault.kind == "stream_error" else 500)
        message = fault.message or f"Simulated HTTP {status} (a scripted fault)."
        headers = dict(fault.headers or {})
        if fault.retry_after is not None:
            seconds = fault.retry_after
            headers["retry-after"] = (
                str(int(seconds)) if seconds == int(seconds) else str(seconds)
            )
        response = self._error(wire, status, message, request_id, headers)
        if fault.error_code is not None:
            body = wire.module.error_body(status, message, request_id)
            body["error"]["details"] = {"error_code": fault.error_code}
            response = JSONResponse(
                body, status_code=status, headers={"request-id": request_id, **headers}
            )
        return response

    def _error(
        self,
        wire: _Wire,
        status: int,
        message: str,
        request_id: str,
        headers: dict[str, str] | None = None,
    ) -> Response:
        body = wire.module.error_body(status, message, request_id)
        return JSONResponse(
            body,
            status_code=status,
            headers={"request-id": request_id, **(headers or {})},
        )

    def _drop(self, http: Request) -> Response:
        transport = _transport(http.scope.get(_SEND_KEY))
        if (
            transport is not None
        ):  # under another server the closest thing is the empty 500 below
            transport.abort()  # later writes to an aborted transport are discarded silently
        return _Dropped(status_code=500)

    async def _stats_route(self, request: Request) -> Response:
        return JSONResponse(self.stats())

    async def _reset_route(self, request: Request) -> Response:
        self.reset()
        return JSONResponse({"ok": True})


def _transport(send: Any) -> Any:
    """The connection's transport behind uvicorn's `send` (None under another server)."""
    return getattr(getattr(send, "__self__", None), "transport", None)

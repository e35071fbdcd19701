"""A small web backend: it enqueues durable runs, streams their events as server-sent events, and
shows a run in a browser (the run viewer, examples/viewer.py).

    export TOOLLOOP_TOOLSETS=review=examples.storyboard.tools:REVIEW_TOOLS   # as the workers have it
    export TOOLLOOP_WEB_TOKEN=change-me                                     # every request needs it
    python examples/web.py                          # PORT (default 8000), HOST (default 127.0.0.1)
    curl -X POST localhost:8000/runs -H "Authorization: Bearer $TOOLLOOP_WEB_TOKEN" \
        -H "Idempotency-Key: review-$(date +%s)" -d '{"model": "claude-sonnet-5-5",
        "toolset": "review", "messages": [{"role": "user", "content": "Review the rough cut."}]}'
                                  # -> {"run_id": "..."}; a fresh key per run; a retry sends the same key
    curl -H "Authorization: Bearer $TOOLLOOP_WEB_TOKEN" localhost:8000/runs/RUN_ID/approvals
                         # the calls waiting for a decision; POST .../approvals/CALL/approve|reject|edit
                         # (409: decided already; 202 "queued": no worker yet), GET .../approvals/CALL
    curl -N -H "Authorization: Bearer $TOOLLOOP_WEB_TOKEN" localhost:8000/runs/RUN_ID/events
    curl -X POST -H "Authorization: Bearer $TOOLLOOP_WEB_TOKEN" localhost:8000/runs/RUN_ID/answer \
        -d '{"content": "Keep shot 3."}'
    open "http://localhost:8000/runs/RUN_ID?token=$TOOLLOOP_WEB_TOKEN"   # the run viewer

Routes: POST /runs, GET /runs (newest first: ?status=, ?limit=, ?cursor=), GET /runs/{id} (the
status as JSON; the run viewer for a browser, Accept: text/html), GET /runs/{id}/messages, GET
/runs/{id}/events (server-sent events, one `id:` each; resumes after the `Last-Event-ID` header or
`?after=`; a run enqueued with `"stream": true` sends its model text as `delta` events), GET
/runs/{id}/images/{hash} (an image of the run's conversation: its file must be readable here, as on
one machine or a volume the workers share), POST /runs/{id}/answer, POST
/runs/{id}/cancel (409 for a run that has ended). It only talks to Redis through
`workers.async_client.AsyncClient` (redis.asyncio: no route holds a thread, an event stream is an
`async for`); the workers do the runs. It imports no toolset: a run naming a toolset
that is not registered (TOOLLOOP_TOOLSETS, names only) is a 422 listing the registered names; a
spec over a limit is a 413 (docs/workers.md, "What is refused"). Without REDIS_URL it uses the
embedded server of $TOOLLOOP_HOME or the working directory, started when needed, as the `toolloop`
command does.

Authentication: every request carries `Authorization: Bearer <TOOLLOOP_WEB_TOKEN>`, or the
`toolloop_token` cookie that a page opened with `?token=<TOOLLOOP_WEB_TOKEN>` sets (a browser's
EventSource cannot send headers); anything else is a 401. The app refuses to start without the
token. `authorized()` is the one place to plug a real authentication (sessions, OAuth, per-user
access to runs) in a real backend.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

if not __package__ and str(Path(__file__).resolve().parents[1]) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python examples/web.py`: the checkout

import pydantic
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from examples import viewer
from toolloop.contract import CHAT_MESSAGES, ImagePart, ToolMessage, UserMessage
from toolloop.loop.approvals import ApprovalError
from workers.async_client import AsyncClient
from workers.errors import EnqueueError, LimitError, RunNotFoundError, RunStateError, ToolsetError


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def sse(event: Any) -> str:
    """One server-sent event: the stream id (for Last-Event-ID), the kind, the event as JSON. A
    streaming run's text comes as `delta` events (`step`, `attempt`, `text`, `seq` null) before its
    `model` event; a `discarded` event voids the text of that step's `attempt` (docs/streaming.md)."""
    data = json.dumps({"seq": event.seq, "segment": event.segment, **event.data}, default=str)
    return f"id: {event.id}\nevent: {event.kind}\ndata: {data}\n\n"


TOKEN_ENV = "TOOLLOOP_WEB_TOKEN"
COOKIE = "toolloop_token"


def authorized(request: Request, token: str) -> bool:
    """Whether the request may use the API: the bearer token, or the viewer's cookie. The place to
    plug a real authentication (and per-user access to runs) in a real backend."""
    header = request.headers.get("authorization", "")
    given = header[7:].strip() if header.lower().startswith("bearer ") else request.cookies.get(COOKIE, "")
    given = given or request.query_params.get("token", "")
    return bool(given) and hmac.compare_digest(given.encode(), token.encode())


class TokenGate:
    """ASGI middleware: a request that is not `authorized` is a 401 (streams pass through as they are)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app, self.token = app, token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not authorized(Request(scope), self.token):
            await error(401, f"Send Authorization: Bearer <{TOKEN_ENV}>.")(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _client(request: Request) -> AsyncClient:
    """The app's client (`create_app`)."""
    client: AsyncClient = request.app.state.client
    return client


async def enqueue(request: Request) -> Response:
    client = _client(request)
    limit = client.settings.max_spec_bytes
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:  # refused before the body is read
        return error(
            413, f"The body is {int(declared):,} bytes; the limit is {limit:,} (TOOLLOOP_MAX_SPEC_BYTES)."
        )
    body = await request.body()
    if len(body) > limit:
        return error(
            413, f"The body is {len(body):,} bytes; the limit is {limit:,} (TOOLLOOP_MAX_SPEC_BYTES)."
        )
    key = request.headers.get("idempotency-key") or None
    try:
        run_id = await client.enqueue(json.loads(body), idempotency_key=key)
    except json.JSONDecodeError:
        return error(400, "The body is not JSON.")
    except pydantic.ValidationError as invalid:
        details = invalid.errors(include_url=False, include_input=False, include_context=False)
        return JSONResponse({"error": "invalid run spec", "details": details}, status_code=422)
    except ToolsetError as bad:
        return error(422, str(bad))
    except LimitError as big:
        return error(413, str(big))
    except EnqueueError as failed:
        return error(503, str(failed))
    except ValueError as bad:  # an idempotency key of the wrong length
        return error(400, str(bad))
    return JSONResponse({"run_id": run_id}, status_code=201)


async def status(request: Request) -> Response:
    client = _client(request)
    run_id = request.path_params["run_id"]
    current = await client.status(run_id)
    if "text/html" not in request.headers.get("accept", ""):
        return JSONResponse(current.model_dump(mode="json"))
    events = [{"id": e.id, **e.data} async for e in client.events(run_id, deltas=False)]
    history = await client.history(run_id)
    page = viewer.page(run_id, current.model_dump(mode="json"), events, history)
    response = HTMLResponse(page)
    if request.query_params.get("token"):  # the viewer's own requests carry the cookie
        response.set_cookie(COOKIE, request.query_params["token"], httponly=True, samesite="strict")
    return response


async def list_runs(request: Request) -> Response:
    client = _client(request)
    query = request.query_params
    try:
        limit = int(query.get("limit", "50"))
        found = await client.list_runs(status=query.get("status"), limit=limit, cursor=query.get("cursor"))
    except ValueError as bad:
        return error(400, str(bad))
    runs = [vars(run) for run in found.runs]
    return JSONResponse({"runs": runs, "next": found.next})


async def image(request: Request) -> Response:
    """An image of the run's conversation, by its hash: only files the run's messages name."""
    client = _client(request)
    run_id, digest = request.path_params["run_id"], request.path_params["digest"]
    for message in await client.history(run_id):
        if isinstance(message, ToolMessage | UserMessage) and isinstance(message.content, list):
            for part in message.content:
                if isinstance(part, ImagePart) and part.hash == digest and Path(part.path).is_file():
                    return FileResponse(part.path, media_type=part.mime_type)
    return error(404, f"Run {run_id!r} has no image {digest!r} (or its file is gone).")


async def messages(request: Request) -> Response:
    client = _client(request)
    history = await client.history(request.path_params["run_id"])
    return Response(CHAT_MESSAGES.dump_json(history), media_type="application/json")


async def events(request: Request) -> Response:
    client = _client(request)
    run_id = request.path_params["run_id"]
    finished = (await client.status(run_id)).finished  # 404 before the stream starts
    after = request.headers.get("last-event-id") or request.query_params.get("after")
    if finished:  # what is left, then the end (204 stops an EventSource from reconnecting)
        rest = [sse(event) async for event in client.events(run_id, after=after)]
        return (
            StreamingResponse(iter(rest), media_type="text/event-stream")
            if rest
            else Response(status_code=204)
        )

    async def stream() -> AsyncIterator[str]:  # awaited blocking reads: no thread per stream
        async for event in client.events(run_id, after=after, follow=True):
            yield sse(event)

    return StreamingResponse(stream(), media_type="text/event-stream", headers={"cache-control": "no-cache"})


async def answer(request: Request) -> Response:
    client = _client(request)
    try:
        body = await request.json()
    except json.JSONDecodeError:
        body = None
    if not isinstance(body, dict) or not isinstance(body.get("content"), str):
        return error(400, 'Send {"content": "the answer"}.')
    answer_id = await client.answer(request.path_params["run_id"], body["content"])
    return JSONResponse({"answer_id": answer_id}, status_code=202)


async def approvals(request: Request) -> Response:
    client = _client(request)
    current = await client.status(request.path_params["run_id"])
    return JSONResponse({"approvals": current.approvals or []})


async def decide(request: Request) -> Response:
    client = _client(request)
    run_id, call_id, action = (request.path_params[k] for k in ("run_id", "call_id", "action"))
    if action not in ("approve", "reject", "edit"):
        return error(404, f"No decision {action!r}: use approve, reject or edit.")
    try:
        body = await request.json() if await request.body() else {}
    except json.JSONDecodeError:
        body = None
    if not isinstance(body, dict):
        return error(400, 'Send a JSON object: {"digest": ..., "actor": ..., "reason": ..., "input": {...}}.')
    options = {"digest": body.get("digest"), "actor": body.get("actor")}
    try:
        if action == "approve":
            outcome = await client.approve(run_id, call_id, **options)
        elif action == "reject":
            reason = str(body.get("reason") or "")
            outcome = await client.reject(run_id, call_id, reason, **options)
        else:
            if not isinstance(body.get("input"), dict):
                return error(400, 'Send the new input as {"input": {...}}.')
            outcome = await client.edit(run_id, call_id, body["input"], **options)
    except ApprovalError as refused:  # a repeated decision (AlreadyDecidedError) too: the first one wins
        return error(409, str(refused))
    if outcome == "queued":  # stored; no worker applied it yet: GET .../approvals/CALL reads it later
        return JSONResponse(
            {"outcome": outcome, "state": "queued, applied when a worker runs"}, status_code=202
        )
    return JSONResponse({"outcome": outcome})


async def decision(request: Request) -> Response:
    """Where the decision on one call stands: pending, queued, decided, expired or refused."""
    client = _client(request)
    try:
        found = await client.decision(request.path_params["run_id"], request.path_params["call_id"])
    except ApprovalError as unknown:
        return error(404, str(unknown))
    return JSONResponse(found.model_dump(mode="json"))


async def cancel(request: Request) -> Response:
    client = _client(request)
    await client.cancel(request.path_params["run_id"])
    return JSONResponse({"cancel": "requested"}, status_code=202)


async def not_found(request: Request, exc: Exception) -> Response:
    return error(404, str(exc))


async def conflict(request: Request, exc: Exception) -> Response:
    return error(409, str(exc))


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    yield
    await app.state.client.aclose()  # on the loop its connections were made on


def create_app(client: AsyncClient | None = None, token: str | None = None) -> Starlette:
    """The app; `token`: the bearer token every request needs (TOOLLOOP_WEB_TOKEN when None)."""
    token = token if token is not None else os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise SystemExit(
            f"{TOKEN_ENV} is not set: examples/web.py needs a bearer token for every request.\n"
            f"  export {TOKEN_ENV}=$(python -c 'import secrets; print(secrets.token_urlsafe())')"
        )
    client = client or AsyncClient(_default_redis())
    app = Starlette(
        routes=[
            Route("/runs", enqueue, methods=["POST"]),
            Route("/runs", list_runs),
            Route("/runs/{run_id}", status),
            Route("/runs/{run_id}/images/{digest}", image),
            Route("/runs/{run_id}/messages", messages),
            Route("/runs/{run_id}/events", events),
            Route("/runs/{run_id}/answer", answer, methods=["POST"]),
            Route("/runs/{run_id}/cancel", cancel, methods=["POST"]),
            Route("/runs/{run_id}/approvals", approvals),
            Route("/runs/{run_id}/approvals/{call_id}", decision),
            Route("/runs/{run_id}/approvals/{call_id}/{action:str}", decide, methods=["POST"]),
        ],
        exception_handlers={RunNotFoundError: not_found, RunStateError: conflict},
        lifespan=lifespan,
        middleware=[Middleware(TokenGate, token=token)],
    )
    app.state.client = client
    return app


def _default_redis() -> str:
    """REDIS_URL, else the embedded server of $TOOLLOOP_HOME or ./.toolloop, started when needed
    (the rule of every entry point: toolloop.defaults.find_redis_url)."""
    from toolloop.defaults import redis_url

    return redis_url().url


if __name__ == "__main__":
    import uvicorn

    host, port = os.environ.get("HOST", "127.0.0.1"), int(os.environ.get("PORT", "8000"))
    uvicorn.run(create_app(), host=host, port=port, log_level="warning")

"""A small web backend: it enqueues durable runs, streams their events as server-sent events, and
shows a run in a browser (the run viewer, examples/viewer.py).

    export TOOLLOOP_TOOLSETS=review=examples.storyboard.tools:REVIEW_TOOLS   # as the workers have it
    export TOOLLOOP_WEB_TOKEN=change-me                                     # every request needs it
    python examples/web.py                          # PORT (default 8000), HOST (default 127.0.0.1)
    curl -X POST localhost:8000/runs -H "Authorization: Bearer $TOOLLOOP_WEB_TOKEN" \
        -H 'Content-Type: application/json' -H "Idempotency-Key: review-$(date +%s)" \
        -d '{"model": "claude-sonnet-5-5", "toolset": "review",
             "messages": [{"role": "user", "content": "Review the rough cut."}]}'
                                  # -> {"run_id": "..."}; a fresh key per run; a retry sends the same key
    curl -H "Authorization: Bearer $TOOLLOOP_WEB_TOKEN" localhost:8000/runs/RUN_ID/approvals
                         # the calls waiting for a decision; POST .../approvals/CALL/approve|reject|edit
                         # (409: decided already; 202 "queued": no worker yet), GET .../approvals/CALL
    curl -N -H "Authorization: Bearer $TOOLLOOP_WEB_TOKEN" localhost:8000/runs/RUN_ID/events
    curl -X POST -H "Authorization: Bearer $TOOLLOOP_WEB_TOKEN" localhost:8000/runs/RUN_ID/answer \
        -H 'Content-Type: application/json' -d '{"content": "Keep shot 3."}'
    open "http://localhost:8000/runs/RUN_ID?token=$TOOLLOOP_WEB_TOKEN"   # the run viewer

Routes: POST /runs, GET /runs (newest first: ?status=, ?limit=, ?cursor=), GET /runs/{id} (the
status as JSON; the run viewer for a browser, Accept: text/html), GET /runs/{id}/messages, GET
/runs/{id}/events (server-sent events, one `id:` each; resumes after the `Last-Event-ID` header or
`?after=`; a run enqueued with `"stream": true` sends its model text as `delta` events), GET
/runs/{id}/images/{hash} (an image of the run's conversation, below), POST /runs/{id}/answer, POST
/runs/{id}/messages (a follow-up: {"content", "add_budget_usd", "add_max_steps"}, `Idempotency-Key`;
docs/conversations.md), POST /runs/{id}/steer ({"content"}), POST /runs/{id}/interrupt, POST
/runs/{id}/cancel (409 for a run that has ended, or that takes no follow-up or steer); a
`Last-Event-ID` (or `after`) that is not an id of the run's stream, or is past its end, is a 400
that says so. It only talks to Redis through `workers.client.aio.AsyncClient` (redis.asyncio: no
route holds a thread, an event stream is an `async for`); the workers do the runs. It imports no
toolset: a run naming a toolset that is not registered (TOOLLOOP_TOOLSETS, names only) is a 422
listing the registered names; a spec over a limit is a 413 (docs/workers.md, "What is refused").
Without REDIS_URL it uses the embedded server of $TOOLLOOP_HOME or the working directory, started
when needed, as the `toolloop` command does.

Authentication: every request carries `Authorization: Bearer <TOOLLOOP_WEB_TOKEN>`, or the
`toolloop_token` cookie that a page opened with `?token=<TOOLLOOP_WEB_TOKEN>` sets (a browser's
EventSource cannot send headers); anything else is a 401. The app refuses to start without the
token. `authorized()` is the one place to plug a real authentication (sessions, OAuth, per-user
access to runs) in a real backend.

Cross-site requests (`Guard`): a POST (enqueue, answer, follow-up, steer, interrupt, cancel,
decisions) is refused (403) when its
`Origin` is not this app's own (scheme, host and port: another port of the same host is another
origin; TOOLLOOP_WEB_ORIGINS adds the public origins of a proxy in front, comma-separated) or its
`Sec-Fetch-Site` is not `same-origin`; a POST authenticated by the cookie alone must also carry
`X-CSRF-Token`, a token bound to the cookie that only the viewer's page knows; `?token=` opens pages
only. A POST body must be `Content-Type: application/json` (415 otherwise), and every body is read
with its limit counted as it arrives (413 the moment it passes, chunked bodies too): the run spec
TOOLLOOP_MAX_SPEC_BYTES; an answer or a decision twice its field's limit plus 4 KiB (escapes), and
the field itself its limit (TOOLLOOP_MAX_ANSWER_BYTES, _REASON_BYTES, _EDIT_BYTES: workers/client/limits.py).

Images: `GET /runs/{id}/images/{hash}` serves an image of that run's conversation that a tool result
produced, or that the run's spec supplied from under TOOLLOOP_WEB_IMAGE_ROOT (unset: none is served,
403); its file must be readable here (one machine, or a volume the workers share), a regular file of
at most TOOLLOOP_MAX_IMAGE_BYTES whose first bytes are PNG, JPEG, GIF or WebP, served as the type the
bytes show (never the type the message names). Every response has `X-Content-Type-Options: nosniff`,
`Referrer-Policy: no-referrer`, `Cross-Origin-Resource-Policy: same-origin` and the viewer's
`Content-Security-Policy` (scripts and styles by hash only, everything else from this origin).
Shown by tests/integration/test_web_hostile.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import stat
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

if not __package__ and str(Path(__file__).resolve().parents[1]) not in sys.path:
    # `python examples/web.py`: the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pydantic
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from examples import viewer
from toolloop.contract import CHAT_MESSAGES
from toolloop.loop.approvals import ApprovalError, DeadlineError
from workers.client import AsyncClient
from workers.client.ops import EventIdError
from workers.protocol.errors import (
    EnqueueError,
    LimitError,
    RunNotFoundError,
    RunStateError,
    ToolsetError,
)


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def sse(event: Any) -> str:
    """One server-sent event: the stream id (for Last-Event-ID), the kind, the event as JSON. A
    streaming run's text comes as `delta` events (`step`, `attempt`, `text`, `seq` null) before its
    `model` event; a `discarded` event voids the text of that step's `attempt` (docs/streaming.md)."""
    data = json.dumps(
        {"seq": event.seq, "segment": event.segment, **event.data}, default=str
    )
    return f"id: {event.id}\nevent: {event.kind}\ndata: {data}\n\n"


TOKEN_ENV = "TOOLLOOP_WEB_TOKEN"
ORIGINS_ENV = "TOOLLOOP_WEB_ORIGINS"
IMAGE_ROOT_ENV = "TOOLLOOP_WEB_IMAGE_ROOT"
COOKIE = "toolloop_token"
CSRF_HEADER = "x-csrf-token"
SAFE_METHODS = ("GET", "HEAD")
HEADERS = [
    (b"content-security-policy", viewer.CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
]
"""On every response, errors and streams included (`Guard`)."""


class Refused(Exception):
    """A request refused with `status` and a message that says what to send instead."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def authorized(request: Request, token: str) -> str | None:
    """How the request may use the API: "header" (the bearer token), "cookie" (the viewer's cookie)
    or "query" (`?token=`, which opens pages only), or None. The place to plug a real
    authentication (and per-user access to runs) in a real backend."""
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return "header" if _same(header[7:].strip(), token) else None
    if _same(request.cookies.get(COOKIE, ""), token):
        return "cookie"
    return "query" if _same(request.query_params.get("token", ""), token) else None


def csrf_token(cookie: str, token: str) -> str:
    """The CSRF token bound to the viewer's cookie: only a page this app served knows it."""
    return hmac.new(
        token.encode(), b"csrf\0" + cookie.encode(), hashlib.sha256
    ).hexdigest()


def _same(given: str, token: str) -> bool:
    return bool(given) and hmac.compare_digest(given.encode(), token.encode())


class Guard:
    """ASGI middleware: the security headers on every response; a request that is not
    `authorized` is a 401; a cross-site one, a state change without a header token or the cookie's
    CSRF token, is a 403 (module docstring)."""

    def __init__(self, app: ASGIApp, token: str, origins: tuple[str, ...] = ()) -> None:
        self.app, self.token, self.origins = app, token, origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *HEADERS]
            await send(message)

        request = Request(scope)
        refused = self.refusal(request)
        if refused is not None:
            await refused(scope, receive, with_headers)
            return
        await self.app(scope, receive, with_headers)

    def refusal(self, request: Request) -> Response | None:
        how = authorized(request, self.token)
        safe = request.method in SAFE_METHODS
        if how is None or (how == "query" and not safe):
            return error(
                401,
                f"Send Authorization: Bearer <{TOKEN_ENV}> (a ?token= opens pages only).",
            )
        site = request.headers.get("sec-fetch-site")
        if (
            safe
        ):  # a page of another site may not read through the cookie (an <img>, a fetch)
            navigating = request.headers.get("sec-fetch-mode") == "navigate"
            if (
                how == "cookie"
                and site in ("same-site", "cross-site")
                and not navigating
            ):
                return error(
                    403,
                    f"A request from another site ({site}) is refused.\n"
                    "  Open the viewer on this app's own origin.",
                )
            return None
        origin = request.headers.get("origin")
        own = f"{request.url.scheme}://{request.headers.get('host', '')}"
        if origin is not None and origin not in (own, *self.origins):
            return error(
                403,
                f"A request from another origin ({origin[:100]}) is refused; this app is {own}.\n"
                f"  Send it from the app's own pages, or add the origin to {ORIGINS_ENV}.",
            )
        if site is not None and site not in ("same-origin", "none"):
            return error(
                403,
                f"A request from another site (Sec-Fetch-Site: {site[:20]}) is refused.",
            )
        if how == "cookie":
            sent = request.headers.get(CSRF_HEADER, "")
            if not _same(sent, csrf_token(request.cookies[COOKIE], self.token)):
                return error(
                    403,
                    "A request with the viewer's cookie needs its X-CSRF-Token header.\n"
                    f"  Send it from the viewer's page, or send Authorization: Bearer <{TOKEN_ENV}>.",
                )
        return None


async def body_of(request: Request, limit: int, setting: str) -> bytes:
    """The body, refused (413) as soon as it passes `limit` bytes: a declared length before anything
    is read, a chunked one while it is read (nothing past the limit is kept)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise Refused(
            413,
            f"The body is {int(declared):,} bytes; the limit is {limit:,} ({setting}).",
        )
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise Refused(
                413,
                f"The body is over {limit:,} bytes, the limit ({setting}); it was not read.",
            )
        chunks.append(chunk)
    return b"".join(chunks)


async def json_of(request: Request, limit: int, setting: str) -> Any:
    """The JSON body (None when empty), read with `body_of`: 415 unless it is application/json."""
    media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media and media != "application/json":
        raise Refused(
            415, f"The body is {media[:60]}; send Content-Type: application/json."
        )
    body = await body_of(request, limit, setting)
    if not body:
        return None
    if not media:
        raise Refused(
            415, "The body has no Content-Type; send Content-Type: application/json."
        )
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        raise Refused(400, "The body is not JSON.") from None


def _client(request: Request) -> AsyncClient:
    """The app's client (`create_app`)."""
    client: AsyncClient = request.app.state.client
    return client


def _field_body(limit: int) -> int:
    """The body limit of a route whose largest field may have `limit` bytes (JSON escapes)."""
    return 2 * limit + 4096


async def enqueue(request: Request) -> Response:
    client = _client(request)
    spec = await json_of(
        request, client.settings.max_spec_bytes, "TOOLLOOP_MAX_SPEC_BYTES"
    )
    if spec is None:
        return error(400, "Send the run spec as JSON.")
    key = request.headers.get("idempotency-key") or None
    try:
        run_id = await client.enqueue(spec, idempotency_key=key)
    except pydantic.ValidationError as invalid:
        details = invalid.errors(
            include_url=False, include_input=False, include_context=False
        )
        return JSONResponse(
            {"error": "invalid run spec", "details": details}, status_code=422
        )
    except ToolsetError as bad:
        return error(422, str(bad))
    except EnqueueError as failed:
        return error(503, str(failed))
    except LimitError:
        raise
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
    token: str = request.app.state.token
    csrf = csrf_token(token, token)  # the cookie holds the token (set below or before)
    children = (
        [n.model_dump(mode="json") for n in await client.tree(run_id)][1:]
        if current.children
        else []
    )
    page = viewer.page(
        run_id,
        current.model_dump(mode="json"),
        events,
        history,
        csrf=csrf,
        children=children,
    )
    response = HTMLResponse(page, headers={"cache-control": "no-store"})
    if request.query_params.get("token"):  # the viewer's own requests carry the cookie
        response.set_cookie(
            COOKIE,
            token,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
    return response


async def list_runs(request: Request) -> Response:
    client = _client(request)
    query = request.query_params
    try:
        limit = int(query.get("limit", "50"))
        found = await client.list_runs(
            status=query.get("status"), limit=limit, cursor=query.get("cursor")
        )
    except ValueError as bad:
        return error(400, str(bad))
    runs = [vars(run) for run in found.runs]
    return JSONResponse({"runs": runs, "next": found.next})


IMAGE_TYPES = {
    b"\x89PNG\r\n\x1a\n": "image/png",
    b"\xff\xd8\xff": "image/jpeg",
    b"GIF87a": "image/gif",
    b"GIF89a": "image/gif",
}


def sniffed(data: bytes) -> str | None:
    """The image type the bytes show (PNG, JPEG, GIF, WebP), else None: never the type a message names."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return next(
        (kind for magic, kind in IMAGE_TYPES.items() if data.startswith(magic)), None
    )


def read_image(path: str, limit: int) -> bytes | None:
    """The bytes of the regular file at `path` (its last part no symlink, no FIFO to wait on), or None
    when it is missing, not a regular file or over `limit` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        data = file.read(limit + 1)
    return data if len(data) <= limit else None


async def image(request: Request) -> Response:
    """An image of the run's conversation by its hash: one a tool result produced, or one the spec
    supplied from under TOOLLOOP_WEB_IMAGE_ROOT; served as the type its bytes show."""
    client = _client(request)
    run_id, digest = request.path_params["run_id"], request.path_params["digest"]
    root: Path | None = request.app.state.image_root
    found = [img for img in await client.images(run_id) if img.part.hash == digest]
    found.sort(key=lambda img: img.supplied)  # a tool's first
    if not found:
        return error(404, f"Run {run_id!r} has no image {digest[:80]!r}.")
    for img in found:
        path = os.path.realpath(img.part.path)
        if img.supplied and (root is None or not Path(path).is_relative_to(root)):
            continue
        data = await run_in_threadpool(
            read_image, path, client.settings.max_image_bytes
        )
        kind = sniffed(data or b"")
        if data is not None and kind is not None:
            return Response(
                data, media_type=kind, headers={"cache-control": "private, max-age=300"}
            )
    if all(img.supplied for img in found) and root is None:
        return error(
            403,
            f"Image {digest[:80]!r} of run {run_id!r} came with its spec; such images are served only\n"
            f"  from the directory {IMAGE_ROOT_ENV} names (unset here).",
        )
    return error(
        403,
        f"Image {digest[:80]!r} of run {run_id!r} is not served: its file is gone, outside "
        f"{IMAGE_ROOT_ENV},\n  over TOOLLOOP_MAX_IMAGE_BYTES, or not a PNG, JPEG, GIF or WebP image.",
    )


async def messages(request: Request) -> Response:
    client = _client(request)
    history = await client.history(request.path_params["run_id"])
    return Response(CHAT_MESSAGES.dump_json(history), media_type="application/json")


async def events(request: Request) -> Response:
    client = _client(request)
    run_id = request.path_params["run_id"]
    finished = (await client.status(run_id)).finished  # 404 before the stream starts
    after = request.headers.get("last-event-id") or request.query_params.get("after")
    if (
        finished
    ):  # what is left, then the end (204 stops an EventSource from reconnecting)
        rest = [sse(event) async for event in client.events(run_id, after=after)]
        return (
            StreamingResponse(iter(rest), media_type="text/event-stream")
            if rest
            else Response(status_code=204)
        )
    if after:  # an id past the end (or no id at all) is a 400 now, not a stream that never ends
        check = client.events(run_id, after=after)
        async for _ in check:
            break

    async def stream() -> AsyncIterator[
        str
    ]:  # awaited blocking reads: no thread per stream
        async for event in client.events(run_id, after=after, follow=True):
            yield sse(event)

    return StreamingResponse(
        stream(), media_type="text/event-stream", headers={"cache-control": "no-cache"}
    )


async def answer(request: Request) -> Response:
    client = _client(request)
    limit = client.settings.max_answer_bytes
    body = await json_of(
        request, _field_body(limit), "twice TOOLLOOP_MAX_ANSWER_BYTES + 4 KiB"
    )
    if not isinstance(body, dict) or not isinstance(body.get("content"), str):
        return error(400, 'Send {"content": "the answer"}.')
    try:
        answer_id = await client.answer(request.path_params["run_id"], body["content"])
    except LimitError:
        raise
    except ValueError as bad:  # an answer that starts with the record separator
        return error(400, str(bad))
    return JSONResponse({"answer_id": answer_id}, status_code=202)


async def send(request: Request) -> Response:
    """A follow-up (docs/conversations.md): {"content", "add_budget_usd"?, "add_max_steps"?}, with an
    optional `Idempotency-Key` header (a repeat returns the first one's outcome, nothing is sent);
    202 {"what": "continued"|"answered", "segment"}; 409 for a run that takes no follow-up."""
    client = _client(request)
    limit = client.settings.max_answer_bytes
    body = await json_of(
        request, _field_body(limit), "twice TOOLLOOP_MAX_ANSWER_BYTES + 4 KiB"
    )
    if not isinstance(body, dict) or not isinstance(body.get("content"), str):
        return error(
            400,
            'Send {"content": "the message"} (and "add_budget_usd", "add_max_steps" to top up).',
        )
    try:
        sent = await client.send(
            request.path_params["run_id"],
            body["content"],
            idempotency_key=request.headers.get("idempotency-key") or None,
            add_budget_usd=body.get("add_budget_usd", 0.0),
            add_max_steps=body.get("add_max_steps", 0),
        )
    except LimitError:
        raise
    except DeadlineError as late:
        return error(409, str(late))
    except ValueError as bad:  # an empty text, a bad top-up or key
        return error(400, str(bad))
    return JSONResponse({"what": sent.what, "segment": sent.segment}, status_code=202)


async def steer(request: Request) -> Response:
    """A steer: {"content"}; 202 {"steer_id"}; 409 for a run that is not queued or running."""
    client = _client(request)
    limit = client.settings.max_answer_bytes
    body = await json_of(
        request, _field_body(limit), "twice TOOLLOOP_MAX_ANSWER_BYTES + 4 KiB"
    )
    if not isinstance(body, dict) or not isinstance(body.get("content"), str):
        return error(400, 'Send {"content": "what the run should read"}.')
    try:
        steer_id = await client.steer(request.path_params["run_id"], body["content"])
    except LimitError:
        raise
    except ValueError as bad:
        return error(400, str(bad))
    return JSONResponse({"steer_id": steer_id}, status_code=202)


async def interrupt(request: Request) -> Response:
    """Stop the run's call in flight; it waits for a follow-up (409 unless queued or running)."""
    client = _client(request)
    await json_of(request, 4096, "4 KiB: interrupt takes no body")
    await client.interrupt(request.path_params["run_id"])
    return JSONResponse({"interrupt": "sent"}, status_code=202)


async def approvals(request: Request) -> Response:
    client = _client(request)
    current = await client.status(request.path_params["run_id"])
    return JSONResponse({"approvals": current.approvals or []})


async def decide(request: Request) -> Response:
    client = _client(request)
    run_id, call_id, action = (
        request.path_params[k] for k in ("run_id", "call_id", "action")
    )
    if action not in ("approve", "reject", "edit"):
        return error(404, f"No decision {action[:40]!r}: use approve, reject or edit.")
    settings = client.settings
    limit = _field_body(max(settings.max_edit_bytes, settings.max_reason_bytes))
    body = await json_of(
        request, limit, "twice TOOLLOOP_MAX_EDIT_BYTES or _REASON_BYTES + 4 KiB"
    )
    body = {} if body is None else body
    shape = 'Send a JSON object: {"digest": "...", "actor": "...", "reason": "...", "input": {...}}.'
    if not isinstance(body, dict):
        return error(400, shape)
    options = {"digest": body.get("digest"), "actor": body.get("actor")}
    if any(
        value is not None and not isinstance(value, str)
        for value in (*options.values(), body.get("reason"))
    ):
        return error(400, f"digest, actor and reason are strings. {shape}")
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
    except (
        ApprovalError
    ) as refused:  # a repeated decision (AlreadyDecidedError) too: the first one wins
        return error(409, str(refused))
    if (
        outcome == "queued"
    ):  # stored; no worker applied it yet: GET .../approvals/CALL reads it later
        return JSONResponse(
            {"outcome": outcome, "state": "queued, applied when a worker runs"},
            status_code=202,
        )
    return JSONResponse({"outcome": outcome})


async def decision(request: Request) -> Response:
    """Where the decision on one call stands: pending, queued, decided, expired or refused."""
    client = _client(request)
    try:
        found = await client.decision(
            request.path_params["run_id"], request.path_params["call_id"]
        )
    except ApprovalError as unknown:
        return error(404, str(unknown))
    return JSONResponse(found.model_dump(mode="json"))


async def cancel(request: Request) -> Response:
    client = _client(request)
    await json_of(request, 4096, "4 KiB: cancel takes no body")
    await client.cancel(request.path_params["run_id"])
    return JSONResponse({"cancel": "requested"}, status_code=202)


async def not_found(request: Request, exc: Exception) -> Response:
    return error(404, str(exc))


async def conflict(request: Request, exc: Exception) -> Response:
    return error(409, str(exc))


async def refused(request: Request, exc: Exception) -> Response:
    """A `Refused` with its status; a field over its limit 413; an event id that is none 400."""
    if isinstance(exc, Refused):
        return error(exc.status, str(exc))
    return error(413 if isinstance(exc, LimitError) else 400, str(exc))


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    yield
    await app.state.client.aclose()  # on the loop its connections were made on


def create_app(
    client: AsyncClient | None = None,
    token: str | None = None,
    *,
    origins: tuple[str, ...] | None = None,
    image_root: str | None = None,
) -> Starlette:
    """The app; `token`: the bearer token every request needs (TOOLLOOP_WEB_TOKEN when None);
    `origins`: other origins its pages are served from (TOOLLOOP_WEB_ORIGINS when None);
    `image_root`: the directory spec-supplied images may be served from (TOOLLOOP_WEB_IMAGE_ROOT when
    None; unset: none)."""
    token = token if token is not None else os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise SystemExit(
            f"{TOKEN_ENV} is not set: examples/web.py needs a bearer token for every request.\n"
            f"  export {TOKEN_ENV}=$(python -c 'import secrets; print(secrets.token_urlsafe())')"
        )
    if origins is None:
        origins = tuple(
            o.strip().rstrip("/")
            for o in os.environ.get(ORIGINS_ENV, "").split(",")
            if o.strip()
        )
    root = (
        image_root
        if image_root is not None
        else os.environ.get(IMAGE_ROOT_ENV, "").strip()
    )
    if root and not Path(root).is_dir():
        raise SystemExit(
            f"{IMAGE_ROOT_ENV}={root!r} is not a directory.\n"
            "  Name the directory the runs' own images are in, or unset it (no spec image is served)."
        )
    client = client or AsyncClient(_default_redis())
    app = Starlette(
        routes=[
            Route("/runs", enqueue, methods=["POST"]),
            Route("/runs", list_runs),
            Route("/runs/{run_id}", status),
            Route("/runs/{run_id}/images/{digest}", image),
            Route("/runs/{run_id}/messages", messages),
            Route("/runs/{run_id}/messages", send, methods=["POST"]),
            Route("/runs/{run_id}/steer", steer, methods=["POST"]),
            Route("/runs/{run_id}/interrupt", interrupt, methods=["POST"]),
            Route("/runs/{run_id}/events", events),
            Route("/runs/{run_id}/answer", answer, methods=["POST"]),
            Route("/runs/{run_id}/cancel", cancel, methods=["POST"]),
            Route("/runs/{run_id}/approvals", approvals),
            Route("/runs/{run_id}/approvals/{call_id}", decision),
            Route(
                "/runs/{run_id}/approvals/{call_id}/{action:str}",
                decide,
                methods=["POST"],
            ),
        ],
        exception_handlers={
            RunNotFoundError: not_found,
            RunStateError: conflict,
            Refused: refused,
            LimitError: refused,
            EventIdError: refused,
        },
        lifespan=lifespan,
        middleware=[Middleware(Guard, token=token, origins=origins)],
    )
    app.state.client = client
    app.state.token = token
    app.state.image_root = Path(os.path.realpath(root)) if root else None
    return app


def _default_redis() -> str:
    """REDIS_URL, else the embedded server of $TOOLLOOP_HOME or ./.toolloop, started when needed
    (the rule of every entry point: toolloop.defaults.find_redis_url)."""
    from toolloop.defaults import redis_url

    return redis_url().url


if __name__ == "__main__":
    import uvicorn

    host, port = (
        os.environ.get("HOST", "127.0.0.1"),
        int(os.environ.get("PORT", "8000")),
    )
    uvicorn.run(create_app(), host=host, port=port, log_level="warning")

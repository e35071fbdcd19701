"""A small web backend: it enqueues durable runs and streams their events as server-sent events.

    export TOOLLOOP_TOOLSETS=review=examples.storyboard.tools:REVIEW_TOOLS   # as the workers have it
    REDIS_URL=redis://127.0.0.1:6379/0 python examples/web.py        # PORT (default 8000), HOST
    curl -X POST localhost:8000/runs -H 'Idempotency-Key: order-1234' -d '{"model": "claude-sonnet-4-5",
        "toolset": "review", "messages": [{"role": "user", "content": "Review the rough cut."}]}'
                                                    # -> {"run_id": "..."}; the same key: the same run
    curl -N localhost:8000/runs/RUN_ID/events       # text/event-stream, one event per step, until it ends
    curl -X POST localhost:8000/runs/RUN_ID/answer -d '{"content": "Keep shot 3."}'

Routes: POST /runs, GET /runs/{id}, GET /runs/{id}/messages, GET /runs/{id}/events (resumes after the
`Last-Event-ID` header or `?after=`), POST /runs/{id}/answer, POST /runs/{id}/cancel. It only talks
to Redis through `workers.client.Client`; the workers do the runs. It imports no toolset: a run
naming a toolset that is not registered (TOOLLOOP_TOOLSETS, names only) is a 422 listing the
registered names; a spec over a limit is a 413 (docs/workers.md, "What is refused"). Without
REDIS_URL it uses the embedded server of the working directory (toolloop.defaults), as the
`toolloop` command does.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pydantic
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from toolloop.contract import CHAT_MESSAGES
from workers.client import Client
from workers.errors import EnqueueError, LimitError, RunNotFoundError, RunStateError, ToolsetError


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def sse(event: Any) -> str:
    """One server-sent event: the stream id (for Last-Event-ID), the kind, the event as JSON."""
    data = json.dumps({"seq": event.seq, "segment": event.segment, **event.data}, default=str)
    return f"id: {event.id}\nevent: {event.kind}\ndata: {data}\n\n"


def create_app(client: Client | None = None) -> Starlette:
    client = client or Client(_default_redis())

    async def enqueue(request: Request) -> Response:
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
            run_id = client.enqueue(json.loads(body), idempotency_key=key)
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

    def status(request: Request) -> Response:
        return JSONResponse(client.status(request.path_params["run_id"]).model_dump(mode="json"))

    def messages(request: Request) -> Response:
        history = client.history(request.path_params["run_id"])
        return Response(CHAT_MESSAGES.dump_json(history), media_type="application/json")

    def events(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        finished = client.status(run_id).finished  # 404 before the stream starts
        after = request.headers.get("last-event-id") or request.query_params.get("after")
        if finished:  # what is left, then the end (204 stops an EventSource from reconnecting)
            rest = [sse(event) for event in client.events(run_id, after=after)]
            return (
                StreamingResponse(iter(rest), media_type="text/event-stream")
                if rest
                else Response(status_code=204)
            )

        def stream() -> Iterator[str]:  # blocking reads: Starlette iterates it in a thread
            for event in client.events(run_id, after=after, follow=True):
                yield sse(event)

        return StreamingResponse(
            stream(), media_type="text/event-stream", headers={"cache-control": "no-cache"}
        )

    async def answer(request: Request) -> Response:
        try:
            body = await request.json()
        except json.JSONDecodeError:
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("content"), str):
            return error(400, 'Send {"content": "the answer"}.')
        answer_id = client.answer(request.path_params["run_id"], body["content"])
        return JSONResponse({"answer_id": answer_id}, status_code=202)

    def cancel(request: Request) -> Response:
        client.cancel(request.path_params["run_id"])
        return JSONResponse({"cancel": "requested"}, status_code=202)

    async def not_found(request: Request, exc: Exception) -> Response:
        return error(404, str(exc))

    async def conflict(request: Request, exc: Exception) -> Response:
        return error(409, str(exc))

    return Starlette(
        routes=[
            Route("/runs", enqueue, methods=["POST"]),
            Route("/runs/{run_id}", status),
            Route("/runs/{run_id}/messages", messages),
            Route("/runs/{run_id}/events", events),
            Route("/runs/{run_id}/answer", answer, methods=["POST"]),
            Route("/runs/{run_id}/cancel", cancel, methods=["POST"]),
        ],
        exception_handlers={RunNotFoundError: not_found, RunStateError: conflict},
    )


def _default_redis() -> str:
    """REDIS_URL, else the embedded server of $TOOLLOOP_HOME or ./.toolloop, started when needed
    (the rule of every entry point: toolloop/defaults.py, workers.settings.find_redis_url)."""
    from toolloop.defaults import redis_url

    return redis_url().url


if __name__ == "__main__":
    import uvicorn

    host, port = os.environ.get("HOST", "127.0.0.1"), int(os.environ.get("PORT", "8000"))
    uvicorn.run(create_app(), host=host, port=port, log_level="warning")

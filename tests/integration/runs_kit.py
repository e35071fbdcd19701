"""Helpers of the run tests: clients for fixtures, log readers, event checks."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

from toolloop.embedded import EmbeddedServer
from workers.client import Client
from workers.protocol.records import RunEventRecord

TOOLSET = "agents"


def client_on(server: EmbeddedServer) -> Iterator[Client]:
    """A `workers.client.sync.Client` on `server`, closed after the test: `yield from` it in a fixture."""
    made = Client(server.url)
    yield made
    made.close()


def redis_on(server: EmbeddedServer) -> Iterator[redis.Redis]:
    """A plain (decoding) Redis client on `server`, closed after the test: `yield from` it."""
    made = redis.Redis.from_url(server.url, decode_responses=True)
    yield made
    made.close()


def spec(system: str, user: str = "Go.", **fields: Any) -> dict[str, Any]:
    return {
        "model": "scripted",
        "system": system,
        "toolset": TOOLSET,
        "messages": [{"role": "user", "content": user}],
        **fields,
    }


def logged(path: Path | None) -> list[dict[str, Any]]:
    assert path is not None
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def kinds(client: Client, run_id: str) -> list[str]:
    """The kinds of the run's events, after checking each is in the stream once and in order."""
    events: list[RunEventRecord] = list(client.events(run_id))
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    return [e.kind for e in events]


def eventually(check: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout} s: {check}")
        time.sleep(0.05)


@contextmanager
def celery_events(client: Client, kind: str) -> Iterator[list[dict[str, Any]]]:
    """The Celery events of `kind` ("task-sent", "task-progress", ...) on the client's broker while
    the block runs, in a list that fills as they arrive (a receiver thread, stopped at the end)."""
    seen: list[dict[str, Any]] = []
    with client.celery.connection_for_read() as connection:
        receiver = client.celery.events.Receiver(
            connection, handlers={kind: seen.append}, app=client.celery
        )
        listening = threading.Thread(
            target=receiver.capture, kwargs={"wakeup": False}, daemon=True
        )
        listening.start()
        time.sleep(0.5)  # the receiver's queue is bound
        try:
            yield seen
        finally:
            receiver.should_stop = True
            listening.join(timeout=5)

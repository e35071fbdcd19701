"""Enqueue in one round trip: the request that stores a run AND sends its first step (pure; both
clients send it, workers/client/ops.py).

One Lua script (ENQUEUE, workers/protocol/scripts/enqueue.py) writes the run (spec, state, first
input, the `queued` event, the outbox record, the indexes), then LPUSHes the first `toolloop.advance` message
(a Celery protocol-2 message built by `workers.protocol.wire`, as the worker's successors are) and PUBLISHes
its `task-sent` event (Flower shows the step from the moment it is queued). It is atomic: a run is
stored with its first step sent, or nothing is (Redis refuses a script for OOM at its first write,
the SET). An idempotency key maps to one run id; the script finds that run stored and writes and
sends nothing (its first step was sent with it; a message lost later is the sweeper's, from the
outbox record, dated TOOLLOOP_REDRIVE_AGE ahead as a sent step is).
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import redis as redis_lib

from toolloop.contract import CHAT_MESSAGES
from toolloop.providers.catalog import Catalog
from toolloop.providers.models_file import catalog_from_env
from workers.client import limits
from workers.client.ops import Eval, Sender
from workers.config import toolsets
from workers.config.settings import Settings
from workers.observe import tracing
from workers.protocol import keys
from workers.protocol.errors import EnqueueError
from workers.protocol.names import ADVANCE
from workers.protocol.scripts.enqueue import ENQUEUE
from workers.protocol.spec import RunSpec


def run_id_for(idempotency_key: str | None) -> str:
    """A fresh run id, or the one id an idempotency key always maps to (workers.runs.lifecycle.run_id_for)."""
    if idempotency_key is None:
        return uuid.uuid4().hex
    if not 0 < len(idempotency_key) <= 256:
        raise ValueError(
            f"The idempotency key is {len(idempotency_key)} characters long.\n"
            "  Use 1 to 256 characters (an order id, a request id)."
        )
    return hashlib.sha256(
        f"toolloop-idempotency\x00{idempotency_key}".encode()
    ).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class Enqueue:
    run_id: str
    request: Eval


class Preparer:
    """Checks a spec and builds its ENQUEUE request. The registered toolset names are read once, and
    the model catalogue in force (`catalog`, default `catalog_from_env()`: TOOLLOOP_MODELS laid over
    the built-in rows), so a client refuses a bad operator file when it is made, not a worker later."""

    def __init__(
        self,
        settings: Settings,
        toolset_names: Iterable[str],
        sender: Sender,
        catalog: Catalog | None = None,
        *,
        run_prefix: str = "",
    ) -> None:
        self.settings = settings
        self.run_prefix = run_prefix
        """Put before every run id made here (a shard's `s<k>-`, workers/client/shards.py)."""
        self.names = frozenset(toolset_names)
        self.sender = sender
        self.catalog = catalog or catalog_from_env()

    def check(self, spec: RunSpec | dict[str, Any]) -> tuple[RunSpec, str]:
        """The checked spec and its JSON: pydantic.ValidationError, ToolsetError or LimitError when
        an enqueue would refuse it (a schedule's spec is checked here too: workers/client/schedules.py)."""
        checked = spec if isinstance(spec, RunSpec) else RunSpec.model_validate(spec)
        if checked.toolset is not None and checked.toolset not in self.names:
            raise toolsets.not_registered(checked.toolset, self.names)
        spec_json = checked.model_dump_json()
        limits.check_spec(checked, self.settings, size=len(spec_json))
        return checked, spec_json

    def __call__(
        self,
        spec: RunSpec | dict[str, Any],
        idempotency_key: str | None,
        *,
        run_prefix: str | None = None,
        fired: dict[str, Any] | None = None,
    ) -> Enqueue:
        """Validate `spec` (pydantic.ValidationError; ToolsetError; LimitError; ValueError for a bad
        key) and build the request that stores the run and sends its first step. `run_prefix`
        overrides the preparer's; `fired` (a schedule's fire: its id and tick) goes in the run's
        `queued` event and in its first step's label (Flower)."""
        checked, spec_json = self.check(spec)
        run_id = (self.run_prefix if run_prefix is None else run_prefix) + run_id_for(
            idempotency_key
        )
        now = time.time()
        queued = {
            "model": checked.model,
            "toolset": checked.toolset,
            "budget_usd": checked.budget_usd,
        }
        label = "model 1"
        if fired:
            queued.update(fired)
            label = f"model 1 (schedule {fired.get('schedule', '')})"
        # the caller's span: the run's trace is part of it
        parent = tracing.current_traceparent()
        message, channel, event = self.sender.message(
            ADVANCE, [run_id, 1], f"{run_id}:1", "llm", label, parent
        )
        request = Eval(
            ENQUEUE,
            [
                keys.spec(run_id),
                keys.state(run_id),
                keys.inputs(run_id),
                keys.events(run_id),
                keys.outbox(run_id),
                keys.LIVE_RUNS,
                keys.ALL_RUNS,
                "llm",
            ],
            [
                run_id,
                spec_json,
                now,
                CHAT_MESSAGES.dump_json(checked.messages),
                orjson.dumps(queued),
                now + self.settings.redrive_age,
                message.raw,
                channel,
                event,
                parent,
            ],
        )
        return Enqueue(run_id, request)


def prepare_all(
    prepare: Preparer,
    specs: Sequence[RunSpec | dict[str, Any]],
    keys: Sequence[str | None] | None,
) -> list[Enqueue]:
    """Every spec of a batch checked and built (the first bad one raises: nothing is sent)."""
    if keys is not None and len(keys) != len(specs):
        raise ValueError(
            f"{len(specs)} specs and {len(keys)} idempotency keys.\n  Give one key (or None) per spec."
        )
    return [
        prepare(spec, None if keys is None else keys[i]) for i, spec in enumerate(specs)
    ]


def batch_result(made: list[Enqueue], replies: list[Any], keyed: bool) -> list[str]:
    """The run ids of a sent batch, or the EnqueueError of its first failed run."""
    failed = [reply for reply in replies if isinstance(reply, Exception)]
    if failed:
        raise failure(failed[0], keyed, stored_some=len(failed) < len(replies))
    return [m.run_id for m in made]


REDIS_ERRORS = (OSError, redis_lib.RedisError)


def failure(
    error: BaseException, keyed: bool, stored_some: bool = False
) -> EnqueueError:
    """The EnqueueError for a Redis error of an enqueue (`keyed`: it had an idempotency key;
    `stored_some`: a batch whose other runs were stored)."""
    again = " with the same idempotency key." if keyed else "."
    if isinstance(error, redis_lib.OutOfMemoryError):
        message = (
            "Redis is out of memory (maxmemory reached) and refused the run; nothing was stored.\n"
            "  Free memory in Redis (delete finished runs, raise maxmemory), then enqueue again"
            + again
        )
        stored: bool | None = False
    elif isinstance(
        error, OSError | redis_lib.ConnectionError | redis_lib.TimeoutError
    ):
        message = (
            f"Lost the connection to Redis while enqueueing ({type(error).__name__}); the run may or "
            "may not be stored.\n"
            + (
                "  Enqueue again with the same idempotency key once Redis answers: it makes one run."
                if keyed
                else "  Check Redis, then enqueue again; pass idempotency_key= so a retry cannot make a "
                "second run."
            )
        )
        stored = None
    else:
        message = (
            f"Redis refused the run ({type(error).__name__}); nothing was stored.\n"
            "  Check the server (`toolloop doctor`), then enqueue again."
        )
        stored = False
    if stored_some:
        message = (
            "Some runs of the batch were stored and others not: "
            + message.split("\n")[0]
            + "\n"
            "  Enqueue the batch again with idempotency keys: the stored runs are not made twice."
        )
        stored = None
    return EnqueueError(message, stored=stored)

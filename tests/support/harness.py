"""An in-process step harness: a real `WorkerProcess` on a private Redis, steps run one by one.

`step_harness` (a fixture: tests/unit/conftest.py) builds the process a worker builds at start, on
the test's own event loop and a private `redis-server` (`toolloop.embedded.start_server`, flushed
before each test), with a `Client` beside it. A test enqueues a run, then runs `advance` itself:
`await harness.step(run_id)` is one delivery of the run's next task, as the step consumer or a
Celery pool thread would run it, with no worker process and no queue in between. What the step
leaves behind is read from Redis (`state`, `journal`, `queued`, `outbox`, `unacked`). The model is
`harness.model` (a `ScriptedModel` or any `generate(request, signal)`), swappable between steps.
The process's hooks record every observation point (`harness.hooks.points`).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from toolloop.abort import AbortSignal
from toolloop.contract import PromptGenRequest, PromptGenResult
from toolloop.embedded import EmbeddedServer, start_server
from workers.client import Client
from workers.config.celery import make_app
from workers.config.settings import Settings
from workers.observe.hooks import Hooks
from workers.process.worker_process import WorkerProcess
from workers.protocol import keys, names, wire
from workers.runs import lifecycle as runs
from workers.step.advance import Outcome, Task, advance

HOSTNAME = "harness@test"


class RecordingHooks(Hooks):
    """Hooks that note every point reached, in order: (name, fields)."""

    def __init__(self) -> None:
        self.points: list[tuple[str, dict[str, Any]]] = []

    def point(self, name: str, **fields: Any) -> None:
        self.points.append((name, fields))

    def sent(
        self, name: str, flushed: Callable[[], Any], **fields: Any
    ) -> Awaitable[None]:
        return self._after_write(name, flushed, fields)

    async def _after_write(
        self, name: str, flushed: Callable[[], Any], fields: dict[str, Any]
    ) -> None:
        # as a kill plan does: the point is reached once the send was written
        await flushed()
        self.points.append((name, fields))

    def names(self) -> list[str]:
        return [name for name, _ in self.points]


@dataclasses.dataclass
class StepHarness:
    process: WorkerProcess
    client: Client
    redis: redis.Redis
    hooks: RecordingHooks
    model: Any = None
    """The model of every step from now on: a `ScriptedModel` or a `generate(request, signal)`."""

    async def generate(
        self, request: PromptGenRequest, signal: AbortSignal
    ) -> PromptGenResult:
        assert self.model is not None, "set harness.model before a step calls the model"
        result: PromptGenResult = await self.model(request, signal)
        return result

    def enqueue(
        self, system: str = "You test.", user: str = "Go.", **fields: Any
    ) -> str:
        spec = {
            "model": "scripted",
            "system": system,
            "toolset": "agents",
            "messages": [{"role": "user", "content": user}],
            **fields,
        }
        return self.client.enqueue(spec)

    def next_n(self, run_id: str) -> int:
        return int(self.redis.hget(keys.state(run_id), "n") or 0) + 1  # type: ignore[arg-type]

    async def step(self, run_id: str, n: int | None = None) -> Outcome:
        """One delivery of task `n` of the run (default: its next one), run here and now."""
        n = self.next_n(run_id) if n is None else n
        outcome = await advance(
            self.process, run_id, n, Task(names.step_id(run_id, n), HOSTNAME)
        )
        await self.written()
        return outcome

    async def written(self) -> None:
        """Wait until what the process queued in its Redis batch so far was written (its sends)."""
        await self.process.batch.call("PING")

    async def run_to_end(self, run_id: str, limit: int = 30) -> list[str]:
        """Steps until one does not say "next"; what each said."""
        said: list[str] = []
        while len(said) < limit:
            said.append(str(await self.step(run_id)))
            if said[-1] != "next":
                return said
        raise AssertionError(f"run {run_id} did not end in {limit} steps: {said}")

    def apply_answers(self, run_id: str) -> list[str]:
        """Run the `toolloop.answer` tasks of the run's inbox here, as a worker's control queue would."""
        inbox: dict[str, str] = self.redis.hgetall(keys.inbox(run_id))  # type: ignore[assignment]
        return [
            runs.answer(self.process.redis, self.process.celery, run_id, a, self.hooks)
            for a in inbox
        ]

    # -- what Redis shows -------------------------------------------------------------------------

    def state(self, run_id: str) -> dict[str, str]:
        return self.redis.hgetall(keys.state(run_id))  # type: ignore[return-value]

    def journal(self, run_id: str, segment: int = 0) -> dict[str, str]:
        return self.redis.hgetall(
            keys.journal(run_id, f"{keys.segment_name(segment)}/")
        )  # type: ignore[return-value]

    def outbox(self, run_id: str) -> list[str]:
        return self.redis.zrange(keys.outbox(run_id), 0, -1)  # type: ignore[return-value]

    def queued(self) -> list[wire.Delivery]:
        """Every task message waiting on a toolloop queue, oldest first."""
        found: list[wire.Delivery] = []
        for key in wire.queue_keys(list(names.QUEUES)):
            found += [
                wire.parse(raw) for raw in reversed(self.redis.lrange(key, 0, -1))
            ]  # type: ignore[union-attr]
        return found

    def unacked(self) -> dict[str, str]:
        return self.redis.hgetall(names.UNACKED)  # type: ignore[return-value]

    def events(self, run_id: str) -> list[str]:
        return [fields["kind"] for _, fields in self.redis.xrange(keys.events(run_id))]  # type: ignore[union-attr]


@pytest.fixture(scope="session")
def harness_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    server = start_server(Path(tmp_path_factory.mktemp("harness-redis")))
    yield server
    server.stop()


@pytest.fixture
async def step_harness(harness_redis: EmbeddedServer) -> AsyncIterator[StepHarness]:
    plain = redis.Redis.from_url(harness_redis.url, decode_responses=True)
    plain.flushall()
    settings = dataclasses.replace(
        Settings.from_env(),
        redis_url=harness_redis.url,
        redis_source="harness",
        sweep_interval=0,
        kill_plan="",
    )
    hooks = RecordingHooks()
    holder: list[StepHarness] = []

    async def generate(
        request: PromptGenRequest, signal: AbortSignal
    ) -> PromptGenResult:
        return await holder[0].generate(request, signal)

    process = WorkerProcess(
        make_app(settings),
        settings,
        hooks=hooks,
        loop=asyncio.get_running_loop(),
        prompt_gen=generate,
    )
    client = Client(harness_redis.url)
    harness = StepHarness(process, client, plain, hooks)
    holder.append(harness)
    try:
        yield harness
    finally:
        await process.aclose()
        process.celery.close()
        client.close()
        plain.close()

"""The journal contract of SPEC.md 2.5, run against MemoryJournal and RedisJournal alike."""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis

from toolloop import (
    AbortController,
    AbortError,
    MemoryJournal,
    StepResult,
    idempotency_key,
)
from toolloop.abort import AbortSignal
from toolloop.journal.redis import RedisJournal
from workers.process.segment import SegmentJournal, StepBoundary

MakeJournal = Callable[..., Any]


@pytest.fixture(params=["memory", "redis"])
def make_journal(request: pytest.FixtureRequest) -> MakeJournal:
    """`make_journal(prefix="s0/", signal=...)`: two calls with one prefix share their entries."""
    if request.param == "memory":
        entries: dict[str, str] = {}
        return lambda prefix="s0/", **kw: MemoryJournal(prefix, entries=entries, **kw)
    client: redis.Redis = request.getfixturevalue("redis_client")
    run_id = uuid.uuid4().hex
    return lambda prefix="s0/", **kw: RedisJournal(client, run_id, prefix, **kw)


class Counter:
    def __init__(self, value: Any = None, cost: float = 0.0) -> None:
        self.calls = 0
        self.value = value
        self.cost = cost

    async def __call__(self, signal: AbortSignal) -> StepResult:
        self.calls += 1
        signal.throw_if_aborted()
        return StepResult(value=self.value, cost_usd=self.cost)


async def test_a_step_runs_once_and_then_replays(make_journal: MakeJournal) -> None:
    work = Counter({"answer": 42, "items": (1, 2)}, cost=0.25)
    first = await make_journal().step("model:1", work)
    again = await make_journal().step("model:1", Counter("other"))
    assert work.calls == 1
    # JSON round trip, both times
    assert first == again == {"answer": 42, "items": [1, 2]}


async def test_a_failing_step_stores_nothing_and_its_error_passes_unchanged(
    make_journal: MakeJournal,
) -> None:
    error = ValueError("tool broke")

    async def broken(signal: AbortSignal) -> StepResult:
        raise error

    with pytest.raises(ValueError) as caught:
        await make_journal().step("tool:a", broken)
    assert caught.value is error
    work = Counter("second try")
    assert await make_journal().step("tool:a", work) == "second try"
    assert work.calls == 1


async def test_values_that_are_not_json_are_refused(make_journal: MakeJournal) -> None:
    with pytest.raises(ValueError):
        await make_journal().step("tool:nan", Counter(math.nan))
    with pytest.raises(TypeError):
        await make_journal().step("tool:set", Counter({1, 2}))


async def test_prefixes_are_separate_segments(make_journal: MakeJournal) -> None:
    assert await make_journal("s0/").step("model:1", Counter("first")) == "first"
    assert await make_journal("s1/").step("model:1", Counter("second")) == "second"
    assert await make_journal("s0/").step("model:1", Counter("x")) == "first"


async def test_the_signal_reaches_the_work(make_journal: MakeJournal) -> None:
    controller = AbortController()
    controller.abort("cancel")
    journal = make_journal(signal=controller.signal)
    with pytest.raises(AbortError):
        await journal.step("model:1", Counter("never"))
    assert await make_journal().step("model:1", Counter("later")) == "later"


async def test_redis_two_copies_of_one_step_run_it_once(
    redis_client: redis.Redis,
) -> None:
    run_id = uuid.uuid4().hex
    calls = 0

    async def slow(signal: AbortSignal) -> StepResult:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.3)
        return StepResult(value=f"value {calls}", cost_usd=0.1)

    one, two = await asyncio.gather(
        RedisJournal(redis_client, run_id).step("model:1", slow),
        RedisJournal(redis_client, run_id).step("model:1", slow),
    )
    assert calls == 1
    assert one == two == "value 1"


async def test_redis_a_fenced_copy_does_not_write(redis_client: redis.Redis) -> None:
    """A copy whose lease lapsed and was taken by another process does not store its value."""
    run_id = uuid.uuid4().hex
    slow_copy = RedisJournal(redis_client, run_id, lease_ms=100)

    async def outlives_its_lease(signal: AbortSignal) -> StepResult:
        await asyncio.sleep(0.3)  # the lease lapses; another copy takes it and commits
        other = RedisJournal(redis_client, run_id)
        assert (
            await other.step("model:1", Counter("the newer copy")) == "the newer copy"
        )
        return StepResult(value="the stale copy")

    assert await slow_copy.step("model:1", outlives_its_lease) == "the newer copy"
    stored = RedisJournal(redis_client, run_id).load()
    assert stored == {"model:1": '{"value": "the newer copy", "cost_usd": 0.0}'}


async def test_the_workers_segment_journal_runs_one_live_step_then_stops_at_the_next(
    redis_client: redis.Redis,
) -> None:
    stored = '{"value": "replayed", "cost_usd": 0.5}'
    journal = SegmentJournal("unused", "s0/", {"model:1": stored}, live_steps=1)
    live = Counter("live", cost=0.2)
    assert await journal.step("model:1", Counter("never")) == "replayed"
    assert await journal.step("tool:a", live) == "live"
    later = Counter("later")
    with pytest.raises(StepBoundary) as boundary:
        await journal.step("model:2", later)
    assert boundary.value.key == "model:2"
    assert later.calls == 0 and live.calls == 1
    assert journal.pending == [("tool:a", '{"value": "live", "cost_usd": 0.2}', 0.2)]
    # the worker commits, not the journal
    assert redis_client.exists("tl:{unused}:journal:s0") == 0


async def test_a_step_the_leased_journal_stored_replays_in_the_segment_journal_and_back(
    redis_client: redis.Redis,
) -> None:
    run_id = uuid.uuid4().hex
    first = await RedisJournal(redis_client, run_id).step(
        "model:1", Counter({"a": [1]}, cost=0.5)
    )
    assert first == {"a": [1]}
    segment = SegmentJournal(run_id, "s0/", RedisJournal(redis_client, run_id).load())
    assert await segment.step("model:1", Counter("never")) == {"a": [1]}
    assert (segment.replayed, segment.cost_usd) == (1, 0.5)
    assert await segment.step("tool:b", Counter("live", cost=0.25)) == "live"
    ((key, text, _cost),) = segment.pending
    # what RUN_COMMIT writes
    redis_client.hset(f"tl:{{{run_id}}}:journal:s0", key, text)
    again = RedisJournal(redis_client, run_id)
    assert (
        await again.step("tool:b", Counter("never")) == "live"
        and again.cost_usd == 0.25
    )


async def test_a_loop_run_again_over_its_journal_calls_nothing(
    make_journal: MakeJournal,
) -> None:
    from pydantic import BaseModel

    from toolloop import (
        Budget,
        RunToolLoopOptions,
        TextPart,
        ToolOutput,
        ToolSpec,
        run_tool_loop,
    )
    from toolloop.testing import ScriptedModel, call, reply

    class Shot(BaseModel):
        shot: int

    runs = 0

    def read_frame(input: Shot, signal: AbortSignal) -> ToolOutput:
        nonlocal runs
        runs += 1
        return ToolOutput(
            value=input.shot,
            content=[TextPart(text=f"frame {input.shot}")],
            cost_usd=0.5,
        )

    model = ScriptedModel(
        [
            reply(tool_calls=[call("read_frame", {"shot": 3})], cost_usd=0.25),
            reply("Fine."),
        ]
    )
    tool = ToolSpec(
        name="read_frame", description="Read a frame.", schema=Shot, run=read_frame
    )

    async def run() -> Any:
        options = RunToolLoopOptions(
            generate=model,
            model="m",
            system="s",
            messages=[{"role": "user", "content": "Go."}],
            tools=[tool],
            budget=Budget(usd=10),
            max_steps=5,
            step=make_journal().step,
        )
        return await run_tool_loop(options)

    first = await run()
    second = await run()
    assert (model.calls, runs) == (2, 1)  # the second run replayed every step
    assert second == first
    assert (second.stopped_by, second.spent_usd, second.final_text) == (
        "done",
        0.75,
        "Fine.",
    )


async def test_the_work_of_a_redis_step_sees_an_idempotency_key_stable_across_reruns(
    redis_client: redis.Redis,
) -> None:
    run_id = uuid.uuid4().hex
    seen: list[str | None] = []

    async def work(signal: AbortSignal) -> StepResult:
        # a sync tool's thread sees it too
        seen.append(await asyncio.to_thread(idempotency_key))
        raise RuntimeError("the effect happened, the step did not finish")

    for _ in range(2):  # a step whose work fails runs again: the same key both times
        with pytest.raises(RuntimeError):
            await RedisJournal(redis_client, run_id, "s1/").step(
                "tool:call_7:start", work
            )
    assert seen == [f"{run_id}/s1/tool:call_7:start"] * 2
    assert idempotency_key() is None  # outside a step's work


async def test_memory_journal_steps_have_no_idempotency_key() -> None:
    seen: list[str | None] = []

    async def work(signal: AbortSignal) -> StepResult:
        seen.append(idempotency_key())
        return StepResult(value=1)

    await MemoryJournal().step("tool:a:start", work)
    assert seen == [None]

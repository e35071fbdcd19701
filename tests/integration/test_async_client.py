"""`AsyncClient` and `enqueue_many` behave as `Client.enqueue` and `Client` do, against a real worker:
the same runs, events, answers, decisions, cancels, listings and errors."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.runs_kit import (
    celery_events,
    client_on,
    eventually,
    kinds,
    logged,
    spec,
)
from toolloop.loop.approvals import ApprovalError
from workers.client import AsyncClient, Client
from workers.protocol import keys
from workers.protocol.errors import (
    LimitError,
    RunNotFoundError,
    RunStateError,
    ToolsetError,
)

pytestmark = pytest.mark.integration

ADD = "Add 1 and 1."  # other numbers than 2 + 3: the session worker's tool log is shared (test_runs_done)
TOOLS_RUN = ["queued", "model", "tool", "model", "finished"]


@pytest.fixture
def client(runs_redis, worker) -> Iterator[Client]:  # type: ignore[no-untyped-def]
    yield from client_on(runs_redis)


def test_enqueue_many_makes_the_runs_enqueue_makes(client: Client) -> None:
    single = client.enqueue(spec("tools", "Add 4 and 5."))
    batch = client.enqueue_many([spec("tools", f"Add {n} and 13.") for n in range(5)])
    assert len(set(batch)) == 5 and single not in batch
    for run_id, total in zip([single, *batch], [9, 13, 14, 15, 16, 17], strict=True):
        # the scripted model adds the numbers it is given
        status = client.wait(run_id, timeout=30)
        assert (
            status.status == "done" and status.final_text == f"The sum is {total}."
        ), status
        assert kinds(client, run_id) == TOOLS_RUN
    assert [client.history(r)[0].content for r in batch] == [
        f"Add {n} and 13." for n in range(5)
    ]


def test_enqueue_many_keeps_idempotency_and_checks_every_spec_first(
    client: Client,
) -> None:
    keyed = client.enqueue_many(
        [spec("tools", ADD), spec("tools", ADD)], idempotency_keys=["many-1", "many-2"]
    )
    again = client.enqueue_many([spec("tools", "Other.")], idempotency_keys=["many-1"])
    assert (
        again == keyed[:1]
        and client.enqueue(spec("tools", ADD), idempotency_key="many-2") == keyed[1]
    )
    assert kinds(client, keyed[0]).count("queued") == 1
    stored = client.redis.zcard(keys.ALL_RUNS)
    with pytest.raises(ToolsetError):
        client.enqueue_many([spec("tools", ADD), spec("tools", ADD, toolset="nosuch")])
    with pytest.raises(ValueError, match="one key"):
        client.enqueue_many([spec("tools", ADD)], idempotency_keys=["a", "b"])
    # nothing of a refused batch was stored
    assert client.redis.zcard(keys.ALL_RUNS) == stored
    for run_id in keyed:
        assert client.wait(run_id, timeout=30).status == "done"


async def test_the_async_client_runs_a_run_as_the_client_does(
    runs_redis, client: Client
) -> None:  # type: ignore[no-untyped-def]
    async with AsyncClient(runs_redis.url) as aclient:
        run_id = await aclient.enqueue(
            spec("tools", "Add 4 and 5."), idempotency_key="async-1"
        )
        assert (
            await aclient.enqueue(spec("tools", "Else."), idempotency_key="async-1")
            == run_id
        )
        followed = [event async for event in aclient.events(run_id, follow=True)]
        assert [e.kind for e in followed] == TOOLS_RUN
        status = await aclient.wait(run_id, timeout=10)
        assert status == client.status(run_id) and status.final_text == "The sum is 9."
        assert await aclient.history(run_id) == client.history(run_id)
        assert [e.id for e in followed] == [e.id for e in client.events(run_id)]
        page = await aclient.list_runs(status="done", limit=5)
        assert page == client.list_runs(status="done", limit=5) and run_id in [
            r.run_id for r in page.runs
        ]
        many = await aclient.enqueue_many([spec("tools", ADD), spec("tools", ADD)])
        done = await asyncio.gather(*(aclient.wait(r, timeout=30) for r in many))
        assert [s.status for s in done] == ["done", "done"]
        assert (
            await aclient.add_spend(run_id, 0.25)
            == client.add_spend(run_id, 0.0)
            == 0.25
        )
        with pytest.raises(RunStateError):
            await aclient.cancel(run_id)
        with pytest.raises(RunStateError):
            await aclient.retry(run_id)
        with pytest.raises(RunNotFoundError):
            await aclient.status("nosuch")
        with pytest.raises(RunNotFoundError):
            [e async for e in aclient.events("nosuch")]
        with pytest.raises(LimitError):
            await aclient.enqueue(spec("tools", "x" * 1_000_001))


async def test_the_async_client_answers_and_cancels(
    runs_redis, worker, client: Client
) -> None:  # type: ignore[no-untyped-def]
    async with AsyncClient(runs_redis.url) as aclient:
        run_id = await aclient.enqueue(spec("ask"))
        parked = await aclient.wait(run_id, timeout=20)
        assert parked.status == "asked" and parked.asked == {"question": "Which shot?"}
        await aclient.answer(run_id, "Shot 3")
        status = await aclient.wait(run_id, timeout=20)
        assert status.status == "done" and status.final_text == "You said: Shot 3"
        assert kinds(client, run_id) == [
            "queued",
            "model",
            "parked",
            "answered",
            "resumed",
            "model",
            "finished",
        ]
        starts = len([e for e in logged(worker.tool_log) if e.get("event") == "start"])
        # a tool that sleeps 30 s unless cancelled
        slow = await aclient.enqueue(spec("slow"))
        for _ in range(400):  # cancel the tool where it runs (its abort), within 20 s
            if (
                len([e for e in logged(worker.tool_log) if e.get("event") == "start"])
                > starts
            ):
                break
            await asyncio.sleep(0.05)
        await aclient.cancel(slow)
        cancelled = await aclient.wait(slow, timeout=20)
        assert cancelled.status == "cancel", cancelled


async def test_the_async_client_decides_held_calls(runs_redis, client: Client) -> None:  # type: ignore[no-untyped-def]
    async with AsyncClient(runs_redis.url) as aclient:
        run_id = await aclient.enqueue(spec("approve"))
        parked = await aclient.wait(run_id, timeout=20)
        assert parked.status == "asked" and parked.approvals, parked
        [held] = parked.approvals
        with pytest.raises(ApprovalError):
            await aclient.approve(run_id, held["call_id"], digest="sha256:another")
        outcome = await aclient.approve(
            run_id, held["call_id"], digest=held["input_digest"], actor="ana"
        )
        assert outcome == "resumed"
        status = await aclient.wait(run_id, timeout=20)
        assert (
            status.status == "done" and status.final_text == "Model read: published 2+3"
        )
        decided: list[Any] = [
            e for e in client.events(run_id) if e.kind == "approval_decided"
        ]
        assert [e.data["actor"] for e in decided] == ["ana"]


def test_every_enqueue_sends_the_task_sent_event_flower_reads(
    runs_redis, client: Client
) -> None:  # type: ignore[no-untyped-def]
    with celery_events(client, "task-sent") as seen:
        run_ids = [
            client.enqueue(spec("tools", ADD)),
            *client.enqueue_many([spec("tools", ADD)]),
        ]

        async def through_the_async_client() -> list[str]:
            async with AsyncClient(runs_redis.url) as aclient:
                return [await aclient.enqueue(spec("tools", ADD))]

        run_ids += asyncio.run(through_the_async_client())
        firsts = {f"{run_id}:1" for run_id in run_ids}
        eventually(lambda: firsts <= {e["uuid"] for e in seen})
    for event in (e for e in seen if e["uuid"] in firsts):
        assert (event["name"], event["queue"], event["kwargs"]) == (
            "toolloop.advance",
            "llm",
            "{'step': 'model 1'}",
        )
        assert event["args"] == repr([event["uuid"].split(":")[0], 1])  # ids only
    for run_id in run_ids:
        assert client.wait(run_id, timeout=30).status == "done"

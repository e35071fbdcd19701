"""`workers.step.advance` step by step, in-process (tests/support/harness.py): a real WorkerProcess on a
private Redis, no worker subprocess. Each test reads what the step left in Redis: the run's state,
journal, outbox, the queues and kombu's `unacked` hash."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest
import redis

from tests.support.harness import HOSTNAME, StepHarness
from toolloop.abort import AbortSignal
from toolloop.contract import PromptGenRequest, PromptGenResult
from toolloop.testing import ScriptedModel, call, reply
from workers.protocol import keys
from workers.worker.consumer import StepConsumer


def add_then_answer() -> ScriptedModel:
    adding = reply(
        "Adding.", tool_calls=[call("add", {"a": 2, "b": 3}, id="c1")], cost_usd=0.01
    )
    return ScriptedModel([adding, reply("It is 5.", cost_usd=0.01)])


async def test_a_run_steps_to_its_end_with_the_hooks_at_every_point(
    step_harness: StepHarness,
) -> None:
    h = step_harness
    h.model = add_then_answer()
    run = h.enqueue()
    h.redis.delete("llm")  # the first step's message: this test delivers it itself
    assert await h.run_to_end(run) == ["next", "next", "stop: done"]
    state = h.state(run)
    assert (state["status"], state["final_text"], state["n"]) == (
        "done",
        "It is 5.",
        "3",
    )
    assert sorted(h.journal(run)) == ["model:1", "model:2", "tool:c1"]
    assert h.events(run)[-1] == "finished" and h.outbox(run) == []
    # each successor was sent, on its queue
    sent = sorted(h.queued(), key=lambda d: d.task_id)
    assert [(d.task_id, d.kwargsrepr) for d in sent] == [
        (f"{run}:2", "{'step': 'tool add'}"),
        (f"{run}:3", "{'step': 'model 2'}"),
    ]
    assert h.hooks.names()[:5] == [
        "advance:begin",
        "work:before",
        "commit:before",
        "commit:after",
        "enqueue:after",
    ]
    assert [f["key"] for n, f in h.hooks.points if n == "work:before"] == [
        "model:1",
        "tool:c1",
        "model:2",
    ]
    assert h.hooks.names().count("enqueue:after") == 2  # the last step sends nothing
    assert run not in h.process.kept  # a finished run keeps no loop


async def test_a_kept_loop_goes_on_without_replay_and_a_parked_run_releases_it(
    step_harness: StepHarness,
) -> None:
    h = step_harness
    adding = reply("Adding.", tool_calls=[call("add", {"a": 1, "b": 1}, id="c1")])
    h.model = ScriptedModel(
        [adding, reply("", tool_calls=[call("ask", {"question": "More?"}, id="q1")])]
    )
    run = h.enqueue()
    assert str(await h.step(run)) == "next"
    assert run in h.process.kept  # paused at the tool step's boundary
    assert str(await h.step(run)) == "next"
    assert h.model.calls == 1 and run in h.process.kept
    assert str(await h.step(run)) == "park"
    assert h.state(run)["status"] == "asked" and json.loads(h.state(run)["asked"]) == {
        "question": "More?"
    }
    assert run not in h.process.kept and len(h.process.kept) == 0


async def test_a_stale_copy_runs_nothing_and_sends_its_successor_again(
    step_harness: StepHarness,
) -> None:
    h = step_harness
    h.model = add_then_answer()
    # TOOLLOOP_OUTBOX_AGE=0
    h.process.settings = dataclasses.replace(h.process.settings, outbox_age=0)
    run = h.enqueue()
    h.redis.delete("llm")
    assert str(await h.step(run, 1)) == "next"
    journal = h.journal(run)
    h.redis.delete("tools")
    h.redis.zadd(keys.outbox(run), {"2|tools": 0})  # its successor's message seems lost
    assert str(await h.step(run, 1)) == "stale"  # a redelivered copy of task 1
    assert h.model.calls == 1 and h.journal(run) == journal
    assert [d.task_id for d in h.queued()] == [f"{run}:2"]  # sent again from the outbox


async def test_a_copy_finds_the_run_busy_while_another_holds_its_lease(
    step_harness: StepHarness,
) -> None:
    h = step_harness
    h.model = add_then_answer()
    run = h.enqueue()
    h.redis.set(keys.lease(run), "other-copy:1", px=60_000)
    assert str(await h.step(run, 1)) == "busy"
    assert h.model.calls == 0 and h.journal(run) == {}
    assert (
        h.state(run)["status"] == "queued"
        and h.redis.get(keys.lease(run)) == "other-copy:1"
    )
    # a dead holder's lease, about to lapse
    h.redis.set(keys.lease(run), "other-copy:1", px=300)
    assert str(await h.step(run, 1)) == "next"  # the copy waited for it, then ran
    assert h.model.calls == 1 and sorted(h.journal(run)) == ["model:1"]


async def test_a_copy_whose_lease_was_taken_over_is_fenced_at_its_commit(
    step_harness: StepHarness,
) -> None:
    h = step_harness
    scripted = add_then_answer()
    took_over: list[str] = []

    async def model(request: PromptGenRequest, signal: AbortSignal) -> PromptGenResult:
        if (
            not took_over
        ):  # the first copy's call: meanwhile its lease lapses and a second copy runs
            took_over.append(str(h.redis.get(keys.lease(run))))
            h.redis.delete(keys.lease(run))
            took_over.append(str(await h.step(run, 1)))
            return reply(
                "The first copy's answer.",
                tool_calls=[call("add", {"a": 9, "b": 9}, id="c9")],
            )
        return await scripted(request, signal)

    h.model = model
    run = h.enqueue()
    outcome = await h.step(run, 1)
    assert took_over[1] == "next"  # the second copy committed step 1
    # the first was fenced, re-drove, and found the step committed
    assert str(outcome) == "stale"
    stored = json.loads(h.journal(run)["model:1"])["value"]["result"]
    # the second copy's value, never the first's
    assert [c["id"] for c in stored["tool_calls"]] == ["c1"]
    assert h.hooks.names().count("commit:after") == 1
    assert h.state(run)["n"] == "1"


async def test_an_answer_sent_before_the_park_resumes_the_run_at_its_park(
    step_harness: StepHarness,
) -> None:
    h = step_harness
    h.model = ScriptedModel(
        [
            reply("", tool_calls=[call("ask", {"question": "Which shot?"}, id="q1")]),
            reply("Shot 3 it is."),
        ]
    )
    run = h.enqueue()
    h.client.answer(run, "Shot 3.")
    assert h.apply_answers(run) == ["kept"]  # not parked yet: kept for the segment
    assert str(await h.step(run)) == "park"
    state = h.state(run)
    # resumed by its own park commit
    assert (state["status"], state["segment"]) == (
        "queued",
        "1",
    )
    assert h.outbox(run) == ["2|llm"]
    assert str(await h.step(run)) == "stop: done"
    answered = (h.model.requests[-1].messages or [])[-1]
    # the ask's answer
    assert answered.role == "tool" and "Shot 3." in answered.model_dump_json()
    assert h.state(run)["final_text"] == "Shot 3 it is."
    assert "answered" in h.events(run)


async def test_go_on_the_commit_begins_the_successor_in_the_step_consumer(
    step_harness: StepHarness,
) -> None:
    h = step_harness
    h.model = add_then_answer()
    consumer = StepConsumer(h.process, ["llm", "tools"], 10, HOSTNAME)
    h.process.consumer = consumer
    run = h.enqueue()
    h.redis.delete("llm")
    assert str(await h.step(run, 1)) == "next"
    for _ in range(
        200
    ):  # the successors run as the consumer's tasks, each begun by its predecessor's commit
        if not consumer.running:
            break
        await asyncio.sleep(0.01)
    state = h.state(run)
    assert (state["status"], state["n"]) == ("done", "3")
    assert h.queued() == [] and h.outbox(run) == []  # nothing went through a queue
    assert h.unacked() == {}  # each go_on delivery was recorded, then acked
    assert h.model.calls == 2
    assert h.hooks.names().count("advance:begin") == 3 and consumer.free == 10
    # a successor the commit began is past `enqueue:after` at once: a kill there comes before it runs
    points = [name for name in h.hooks.names() if name != "work:before"]
    assert points[:5] == [
        "advance:begin",
        "commit:before",
        "commit:after",
        "enqueue:after",
        "advance:begin",
    ]


async def test_a_cancel_drops_the_kept_loop_of_its_run(
    step_harness: StepHarness,
) -> None:
    h = step_harness
    h.model = add_then_answer()
    run = h.enqueue()
    assert str(await h.step(run)) == "next" and run in h.process.kept
    h.process.cancelled(run)  # what the cancel listener does with a published run id
    await asyncio.sleep(0)
    assert run not in h.process.kept


async def test_redis_lost_under_the_model_call_runs_the_step_again_and_fails_no_run(
    step_harness: StepHarness,
) -> None:
    """A Redis error raised inside the step's work (here by the model call, as a flow-control
    booking raises it when Redis is away) is what workers/protocol/errors.py calls REDIS_LOST: the
    step is not committed and runs again (the consumer puts it back); the run does not end
    `failed` (the Redis-away fault test saw one that did)."""
    h = step_harness
    model = add_then_answer()
    lost = [True]

    async def away_once(
        request: PromptGenRequest, signal: AbortSignal
    ) -> PromptGenResult:
        if lost.pop() if lost else False:
            raise redis.ConnectionError(
                "Error 111 connecting to 127.0.0.1. Connection refused."
            )
        return await model(request, signal)

    h.model = away_once
    run = h.enqueue()
    with pytest.raises(redis.ConnectionError):
        await h.step(run, 1)
    assert h.state(run)["status"] != "failed" and h.journal(run) == {}
    assert str(await h.step(run, 1)) == "next"  # the same task, delivered again
    assert model.calls == 1 and sorted(h.journal(run)) == ["model:1"]

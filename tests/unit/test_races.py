"""Races seen under load, each made deterministic with the step harness (tests/support/harness.py): a
real WorkerProcess on a private Redis, the interleaving forced by the order the test runs things in
or by a hook point of the process (workers/observe/hooks.py), never by sleeping."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.support.harness import RecordingHooks, StepHarness
from toolloop.loop.approvals import AlreadyDecidedError
from toolloop.testing import ScriptedModel, call, reply
from workers.protocol import keys


def ask_then_echo() -> ScriptedModel:
    return ScriptedModel(
        [
            reply("", tool_calls=[call("ask", {"question": "Which shot?"}, id="q1")]),
            reply("Noted."),
        ]
    )


async def test_two_answers_count_in_the_order_sent_whatever_order_their_messages_run(
    step_harness: StepHarness,
) -> None:
    # the control queue's messages run in threads: the second answer's may be handled first
    h = step_harness
    h.model = ask_then_echo()
    run = h.enqueue()
    assert str(await h.step(run)) == "park"
    h.client.answer(run, "first")
    # a double click: ignored when sent, nothing stored for it
    h.client.answer(run, "second")
    inbox: dict[str, str] = h.redis.hgetall(keys.inbox(run))  # type: ignore[assignment]
    from workers.runs import lifecycle as runs

    applied = [
        runs.answer(h.process.redis, h.process.celery, run, a)
        for a in reversed(list(inbox))
    ]
    assert applied == ["resumed"]
    assert str(await h.step(run)) == "stop: done"
    answered = (h.model.requests[-1].messages or [])[-1]
    assert answered.role == "tool" and "first" in answered.model_dump_json()
    assert "second" not in answered.model_dump_json()
    [data] = [
        f["data"]
        for _, f in h.redis.xrange(keys.events(run))
        if f["kind"] == "answered"
    ]  # type: ignore[union-attr]
    assert '"first"' in data


async def test_an_early_answer_then_a_second_one_keep_the_first(
    step_harness: StepHarness,
) -> None:
    h = step_harness
    h.model = ask_then_echo()
    run = h.enqueue()
    h.client.answer(run, "early")  # before the run parks: kept for its question
    h.client.answer(run, "later")
    assert str(await h.step(run)) == "park"  # resumed by its own park commit
    assert h.state(run)["segment"] == "1"
    assert h.apply_answers(run) == ["ignored"]  # the wake-up finds the run moved on
    assert str(await h.step(run)) == "stop: done"
    assert "early" in (h.model.requests[-1].messages or [])[-1].model_dump_json()
    assert h.events(run).count("answered") == 1


class CancelBeforeTheWork(RecordingHooks):
    """At `work:before` (the step read the run's state, its work has not begun), cancel the run and
    deliver the published cancel to the process before the step arms it: the listener thread may
    run at any moment."""

    def __init__(self, harness: StepHarness, key: str) -> None:
        super().__init__()
        self.harness = harness
        self.key = key

    def point(self, name: str, **fields: Any) -> None:
        super().point(name, **fields)
        if name == "work:before" and fields.get("key") == self.key:
            self.harness.client.cancel(fields["run"])
            self.harness.process.cancelled(fields["run"])


def slow_tool_then_answer() -> ScriptedModel:
    return ScriptedModel(
        [
            reply("", tool_calls=[call("slow", {"seconds": 20}, id="t1")]),
            reply("Slept."),
        ]
    )


async def test_a_cancel_landing_after_the_tool_step_began_and_before_its_work_aborts_the_tool(
    step_harness: StepHarness,
) -> None:
    h = step_harness
    # the tool step's state read, its tool not started
    h.hooks = hooks = CancelBeforeTheWork(h, "tool:t1")
    h.process.hooks = hooks
    h.model = slow_tool_then_answer()
    run = h.enqueue()
    assert str(await h.step(run)) == "next"
    # the tool waits 20 s unless aborted
    stopped = await asyncio.wait_for(h.run_to_end(run), timeout=10)
    assert stopped[-1] == "stop: cancel", stopped
    assert "work:before" in hooks.names()
    assert h.state(run)["status"] == "cancel"


async def test_a_cancel_landing_after_the_model_step_began_and_before_its_call_stops_the_run(
    step_harness: StepHarness,
) -> None:
    h = step_harness
    h.hooks = hooks = CancelBeforeTheWork(h, "model:1")
    h.process.hooks = hooks
    h.model = slow_tool_then_answer()
    run = h.enqueue()
    stopped = await asyncio.wait_for(h.run_to_end(run), timeout=10)
    assert stopped[-1] == "stop: cancel", stopped
    assert h.model.requests == []  # the model call was never sent


def publish_then_note() -> ScriptedModel:
    return ScriptedModel(
        [
            reply("", tool_calls=[call("publish", {"a": 1, "b": 2}, id="p1")]),
            reply("Noted."),
        ]
    )


async def test_two_decisions_sent_back_to_back_count_in_the_order_sent_whatever_order_their_messages_run(
    step_harness: StepHarness,
) -> None:
    # approve, then reject, on one held call: the reject is refused when it is sent (DECIDE_SEND:
    # the approve is queued already), so whatever order their `toolloop.decide` messages would run
    # in, the approve is the decision (fails before #31: "first applied wins", the reject won).
    from workers.runs import approvals

    h = step_harness
    h.model = publish_then_note()
    run = h.enqueue()
    assert str(await h.step(run)) == "park"
    # no worker applies it here
    assert h.client.approve(run, "p1", wait_s=0.1) == "queued"
    with pytest.raises(AlreadyDecidedError, match="queued already"):
        h.client.reject(run, "p1", "not now", wait_s=0.1)
    inbox: dict[str, str] = h.redis.hgetall(keys.decide_inbox(run))  # type: ignore[assignment]
    assert [json.loads(entry)["decision"]["action"] for entry in inbox.values()] == [
        "approve"
    ]
    order = h.redis.lrange(keys.decide_order(run), 0, -1)
    # the send order the workers apply by (workers/runs/approvals.py)
    assert order == list(inbox)
    tools = h.process.toolsets.for_worker
    applied = [
        approvals.apply(h.process.redis, h.process.celery, run, d, tools, 0)
        for d in order
    ]
    assert applied == ["resumed"], applied
    assert h.redis.llen(keys.decide_order(run)) == 0
    assert (await h.run_to_end(run))[-1] == "stop: done"
    # approved: it ran
    assert (
        "published 1+2" in (h.model.requests[-1].messages or [])[-1].model_dump_json()
    )

"""Tool code cannot stop the process (toolloop/loop/tools.py `call_tool`): `SystemExit`,
`KeyboardInterrupt` and `GeneratorExit` from a tool's `run`, `start` or `wait` answer the call with a
tool error the model reads, journaled, and the loop goes on; in the main thread, where a signal
lands, `KeyboardInterrupt` and `SystemExit` still stop the loop, and cancellation always does.

The loop runs in a thread of its own here, as a durable worker runs it (workers/process/worker_process.py),
and a
sync tool offloaded to a thread goes through `contained`, as the worker's do (workers/config/toolsets.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from loop_kit import Exploding, Shot, options, run

from toolloop import MemoryJournal, Started, TextPart, ToolMessage, ToolOutput, ToolSpec
from toolloop.loop.tools import contained
from toolloop.testing import ScriptedModel, call, reply
from workers.process.live import _contained


def in_thread(make: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """Run a coroutine on a fresh loop in a thread that is not the main one; its result or error."""
    box: dict[str, Any] = {}

    def body() -> None:
        try:
            box["result"] = asyncio.run(make())
        except BaseException as error:  # the test looks at it
            box["error"] = error

    thread = threading.Thread(target=body)
    thread.start()
    thread.join(timeout=30)
    if "error" in box:
        raise box["error"]
    return box["result"]


def raising(error: BaseException, offload: bool = False) -> Any:
    def run_sync(input: Shot, signal: object) -> ToolOutput:
        raise error

    async def run_async(input: Shot, signal: object) -> ToolOutput:
        if (
            offload
        ):  # a sync tool in a thread, as a worker runs one (workers/config/toolsets.py)
            return await asyncio.to_thread(contained(run_sync), input, signal)
        raise error

    return run_async


def tool(run: Any) -> ToolSpec:
    return ToolSpec(name="parse", description="Parse arguments.", schema=Shot, run=run)


def script() -> ScriptedModel:
    return ScriptedModel(
        [reply(tool_calls=[call("parse", {"shot": 3}, id="c1")]), reply("Went on.")]
    )


@pytest.mark.parametrize(
    ("error", "offload", "shown"),
    [
        (SystemExit(2), False, "SystemExit(2)"),
        (SystemExit(2), True, "SystemExit(2)"),
        (KeyboardInterrupt(), False, "KeyboardInterrupt()"),
        (KeyboardInterrupt(), True, "KeyboardInterrupt()"),
        (GeneratorExit(), False, "GeneratorExit()"),
        (GeneratorExit(), True, "GeneratorExit()"),
    ],
)
def test_a_tool_that_would_stop_the_process_fails_its_call_and_the_run_goes_on(
    error: BaseException, offload: bool, shown: str, caplog: pytest.LogCaptureFixture
) -> None:
    journal = MemoryJournal()
    with caplog.at_level(logging.ERROR, logger="toolloop.loop"):
        result, _ = in_thread(
            lambda: run(script(), journal, tools=[tool(raising(error, offload))])
        )
    assert result.stopped_by == "done" and result.final_text == "Went on."
    answer = result.messages[2]
    assert isinstance(answer, ToolMessage) and answer.tool_call_id == "c1"
    assert isinstance(answer.content, list) and isinstance(answer.content[0], TextPart)
    assert answer.content[0].text.startswith(
        f"Tool 'parse' failed: it raised {shown} instead of returning"
    )
    assert (
        json.loads(journal.entries["tool:c1"])["value"]["content"][0]["text"]
        == answer.content[0].text
    )
    logged = [r for r in caplog.records if r.name == "toolloop.loop"]
    assert (
        len(logged) == 1
        and "call c1" in logged[0].getMessage()
        and shown in logged[0].getMessage()
    )
    replayed, _ = in_thread(lambda: run(script(), journal, tools=[tool(Exploding())]))
    # journaled: a replay answers the same, runs nothing
    assert replayed.messages == result.messages


def test_a_two_phase_tool_whose_start_or_wait_crashes_is_answered_with_the_error() -> (
    None
):
    waits: list[Any] = []

    def start(input: Shot, signal: object) -> Started:
        if input.shot == 1:
            raise SystemExit("bad argument")
        return Started(started={"shot": input.shot})

    def wait(handle: Any, signal: object) -> ToolOutput:
        waits.append(handle)
        raise KeyboardInterrupt

    render = ToolSpec(
        name="render", description="Render.", schema=Shot, start=start, wait=wait
    )
    model = ScriptedModel(
        [
            reply(
                tool_calls=[
                    call("render", {"shot": 1}, id="r1"),
                    call("render", {"shot": 2}, id="r2"),
                ]
            ),
            reply("Both failed."),
        ]
    )
    journal = MemoryJournal()
    result, _ = in_thread(lambda: run(model, journal, tools=[render]))
    assert result.stopped_by == "done"
    texts = {
        m.tool_call_id: m.content[0].text
        for m in result.messages
        if isinstance(m, ToolMessage)
    }  # type: ignore[union-attr]
    assert texts["r1"].startswith(
        "Tool 'render' failed: it raised SystemExit('bad argument')"
    )
    assert texts["r2"].startswith("Tool 'render' failed: it raised KeyboardInterrupt()")
    assert waits == [{"shot": 2}]  # the crashed start's wait step calls no wait
    assert (
        json.loads(journal.entries["tool:r1:start"])["value"]["crashed"] == texts["r1"]
    )
    assert "tool:r1:wait" in journal.entries


async def test_in_the_main_thread_keyboard_interrupt_and_system_exit_still_stop_the_loop() -> (
    None
):
    assert threading.current_thread() is threading.main_thread()
    for error in (KeyboardInterrupt(), SystemExit(2)):
        with pytest.raises(type(error)):
            await run(script(), tools=[tool(raising(error))])


def test_cancellation_still_stops_the_loop() -> None:
    async def cancelled() -> None:
        await run(script(), tools=[tool(raising(asyncio.CancelledError()))])

    with pytest.raises(asyncio.CancelledError):
        in_thread(cancelled)


def test_an_exception_still_ends_the_loop_with_that_error() -> None:
    with pytest.raises(ValueError, match="plain"):
        in_thread(lambda: run(script(), tools=[tool(raising(ValueError("plain")))]))


async def test_a_worker_loop_fails_the_run_when_other_run_code_raises_system_exit() -> (
    None
):
    """workers/process/live.py: a SystemExit from a model call (not a tool) fails the run with two lines;
    it does not leave the task to asyncio, which would raise it out of the worker's event loop."""

    async def exits(*_: object) -> None:
        raise SystemExit(3)

    with pytest.raises(RuntimeError) as caught:
        await _contained(options(exits))
    first, second = str(caught.value).split("\n")
    assert (
        "raised SystemExit(3), which would have stopped the worker" in first
        and second.startswith("  ")
    )

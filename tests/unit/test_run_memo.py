"""The run's memo (toolloop/memo.py): a model call builds only the request blocks of messages the last
request did not send, and the body stays byte for byte what a build from nothing gives (the prompt
cache depends on it); the memo ends with its run."""

from __future__ import annotations

import contextvars
from typing import Any

from loop_kit import options, read_frame

from toolloop import MemoryJournal, PromptGenRequest, run_tool_loop
from toolloop.fastjson import dumps
from toolloop.memo import RunMemo, run_memo
from toolloop.providers.anthropic.request import build_body
from toolloop.testing import ScriptedModel, call, reply


def body_bytes(request: PromptGenRequest) -> bytes:
    return dumps(build_body(request, model="claude-sonnet-5-5", reasoning=None, images={}))


class Checking(ScriptedModel):
    """Builds each request's body with the run's memo and from nothing, and keeps both."""

    def __init__(self, turns: list[Any]) -> None:
        super().__init__(turns)
        self.bodies: list[tuple[bytes, bytes]] = []
        self.built: list[list[Any]] = []
        """Per call, the block lists of its request (kept, so no id is reused)."""
        self.memos: list[RunMemo | None] = []

    def answer(self, request: PromptGenRequest, signal: Any) -> Any:
        memo = run_memo.get()
        self.memos.append(memo)
        with_memo = body_bytes(request)
        assert memo is not None
        self.built.append([entry[1][1] for entry in memo.blocks.values()])
        bare = contextvars.copy_context()
        bare.run(run_memo.set, None)
        self.bodies.append((with_memo, bare.run(body_bytes, request)))
        return super().answer(request, signal)


async def test_bodies_built_with_the_memo_are_the_bodies_built_from_nothing() -> None:
    script = [reply(tool_calls=[call("read_frame", {"shot": t}, id=f"c{t}")]) for t in range(1, 7)]
    memos: list[RunMemo | None] = []  # kept, so no memo's id is reused by the next run's
    for cache in ("conversation", "system", "off"):
        model = Checking([*script, reply("done")])
        result = await run_tool_loop(options(model, MemoryJournal(), tools=[read_frame()], cache=cache))
        assert result.stopped_by == "done"
        assert len(model.bodies) == 7
        assert all(with_memo == bare for with_memo, bare in model.bodies), cache
        rebuilt = [
            sum(1 for blocks in now if not any(blocks is old for old in before))
            for before, now in zip(model.built, model.built[1:], strict=False)
        ]
        # each call builds the new assistant and tool message and at most one newly marked copy,
        # not the 13 messages of the last request
        assert len(model.built[-1]) == 13 and max(rebuilt) <= 3, rebuilt
        memos.extend(model.memos)
    # one memo per run, none outside a run
    assert len({id(memo) for memo in memos}) == 3 and run_memo.get() is None

"""The examples run: the README's quickstart, and the storyboard review (toolset + simulator policy)
played in-process with a memory journal."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

from examples.storyboard import frames_png
from examples.storyboard.brief import PROMPT, SYSTEM
from examples.storyboard.policy import review_policy
from examples.storyboard.tools import REVIEW_TOOLS
from toolloop import (
    AbortSignal,
    AssistantMessage,
    Budget,
    ImagePart,
    MemoryJournal,
    PromptGenRequest,
    PromptGenResult,
    RunToolLoopOptions,
    ToolCall,
    ToolMessage,
    run_tool_loop,
)
from toolloop.sim.script import SimRequest

ROOT = Path(__file__).resolve().parents[2]


def test_quickstart_runs_and_replays() -> None:
    done = subprocess.run(
        [sys.executable, "examples/quickstart.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert first == "done 'Trim 2 s.' $0.01 ['model:1', 'tool:call_1', 'model:2']"
    assert second == "replayed: True model calls: 2"


def test_the_readme_shows_the_quickstart_as_it_is() -> None:
    readme = (ROOT / "README.md").read_text()
    block = readme.split("```python\n", 1)[1].split("```", 1)[0]
    code = (ROOT / "examples" / "quickstart.py").read_text().split('"""', 2)[2]
    assert [line for line in block.splitlines() if line] == [
        line for line in code.splitlines() if line
    ]


def test_committed_frames_are_what_the_generator_draws() -> None:
    for shot in frames_png.SHOTS:
        data = frames_png.frame_path(shot).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n")
        assert data == frames_png.png_bytes(frames_png.draw(shot))


async def policy_model(
    request: PromptGenRequest, signal: AbortSignal
) -> PromptGenResult:
    """The storyboard policy as a `generate`, without HTTP: what the simulator would answer."""
    messages = request.messages or []
    turn = review_policy(
        SimRequest(
            wire="anthropic",
            model=request.model or "",
            system=request.system,
            messages=messages,
            tools=request.tools or [],
            assistant_turns=sum(isinstance(m, AssistantMessage) for m in messages),
            conversation_id="c",
            history_hash=str(len(messages)),
        )
    )
    calls = [
        ToolCall(id=f"t{len(messages)}_{i}", name=c.name, input=c.input)
        for i, c in enumerate(turn.tool_calls)
    ]
    return PromptGenResult(
        text=turn.text,
        tool_calls=calls,
        finish_reason="tool_calls" if calls else "stop",
    )


async def test_storyboard_review_asks_then_quotes_the_answer() -> None:
    journal = MemoryJournal("s0/")
    options = RunToolLoopOptions(
        generate=policy_model,
        model="claude-sonnet-5-5",
        system=SYSTEM,
        messages=[{"role": "user", "content": PROMPT}],
        tools=REVIEW_TOOLS,
        budget=Budget(usd=1.0),
        max_steps=10,
        step=journal.step,
    )
    first = await run_tool_loop(options)
    assert first.stopped_by == "asked"
    assert "Shot 3" in first.asked.input["question"]
    called = [
        c.name
        for m in first.messages
        if isinstance(m, AssistantMessage)
        for c in m.tool_calls or []
    ]
    assert called == ["list_shots", "read_frame", "read_frame", "render_preview", "ask"]
    parts = [p for m in first.messages if isinstance(m, ToolMessage) for p in m.content]
    images = [p for p in parts if isinstance(p, ImagePart)]
    assert [Path(p.path).name for p in images] == ["shot_03.png", "shot_05.png"]
    assert (
        images[0].hash == hashlib.sha256(Path(images[0].path).read_bytes()).hexdigest()
    )
    assert first.spent_usd > 0  # the preview render costs money

    ask_id = first.messages[-1].tool_calls[0].id  # type: ignore[union-attr]
    answer = ToolMessage(
        tool_call_id=ask_id, content="Keep shot 3; trim shot 5 by a second."
    )
    second = await run_tool_loop(
        options.model_copy(
            update={
                "messages": [*first.messages, answer],
                "step": journal.segment("s1/").step,
                "budget": Budget(usd=1.0, spent_usd=first.spent_usd),
            }
        )
    )
    assert second.stopped_by == "done"
    assert second.final_text is not None
    assert "Keep shot 3; trim shot 5 by a second." in second.final_text
    # the story agrees with its own question: "keep" was offered as 5.0 s, and 5.0 s is what it keeps
    question = first.asked.input["question"] if first.asked else ""
    assert "(5.0 s), or trim it to the board's 4.0 s?" in question
    assert (
        "trim shot 3 (Sunset, hero walks in) from 6.0 s to 5.0 s" in second.final_text
    )
    assert (
        "trim shot 5 (Rooftop, the phone lights up) from 5.0 s to 4.0 s"
        in second.final_text
    )
    assert (
        "22.0 s before, 20.0 s after, against the board's 18.0 s" in second.final_text
    )

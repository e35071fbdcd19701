"""A tool loop on fal whose tool returns an image, through the real FalHandler to the simulator over
HTTP: the image is uploaded to fal storage once (later steps reuse its URL), it reaches the model
in a user turn after the text-only tool messages, and a failed upload falls back to a data URI."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from tests.support.sim import Recording
from toolloop import (
    Budget,
    ImagePart,
    MemoryJournal,
    RunToolLoopOptions,
    RunToolLoopResult,
    TextPart,
    ToolOutput,
    ToolSpec,
    UserMessage,
    run_tool_loop,
)
from toolloop.abort import AbortSignal
from toolloop.contract import PromptGenRequest, PromptGenResult
from toolloop.providers.fal import FalHandler
from toolloop.sim import SimServer

PNG = b"\x89PNG\r\n\x1a\nframe"
SCRIPT: list[Any] = [
    {"tool_calls": [{"name": "read_frame", "input": {"shot": 1}}]},
    {"tool_calls": [{"name": "read_frame", "input": {"shot": 2}}]},
    {"text": "Both frames are fine."},
]


class Shot(BaseModel):
    shot: int


async def run(sim: SimServer, png: Path) -> RunToolLoopResult:
    handler = FalHandler("k", run_url=sim.base_url)
    image = ImagePart(path=str(png), mime_type="image/png", hash="frame")

    def read_frame(input: Shot, signal: AbortSignal) -> ToolOutput:
        return ToolOutput(
            value=input.shot, content=[TextPart(text=f"Frame {input.shot}:"), image]
        )

    async def generate(
        request: PromptGenRequest, signal: AbortSignal
    ) -> PromptGenResult:
        return await handler.execute(request, signal)

    return await run_tool_loop(
        RunToolLoopOptions(
            generate=generate,
            model="anthropic/claude-opus-5.5",
            system="You review storyboards.",
            messages=[UserMessage(content="Review the board.")],
            tools=[
                ToolSpec(
                    name="read_frame",
                    description="Read one frame.",
                    schema=Shot,
                    run=read_frame,
                )
            ],
            budget=Budget(usd=10.0),
            max_steps=5,
            step=MemoryJournal().step,
        )
    )


def image_urls(body: dict[str, Any]) -> list[str]:
    """The image URLs of the user turns that follow tool messages; tool messages carry text only."""
    urls = []
    for previous, message in zip(body["messages"], body["messages"][1:], strict=False):
        if message["role"] == "tool":
            assert all(part["type"] == "text" for part in message["content"])
        if message["role"] == "user" and previous["role"] == "tool":
            urls += [
                part["image_url"]["url"]
                for part in message["content"]
                if part["type"] == "image_url"
            ]
    return urls


async def test_a_tool_image_is_uploaded_once_and_shown_in_a_user_turn(
    tmp_path: Path,
) -> None:
    png = tmp_path / "frame.png"
    png.write_bytes(PNG)
    policy = Recording(SCRIPT)
    with SimServer(policy) as sim:
        result = await run(sim, png)
        uploads = sim.stats()["uploads"]
        (file_url,) = [
            f"{sim.base_url}/storage/files/{token}" for token in sim.simulator.files
        ]
        assert sim.simulator.files[file_url.rsplit("/", 1)[1]] == ("image/png", PNG)
    assert (result.stopped_by, result.final_text) == ("done", "Both frames are fine.")
    assert uploads == {"initiate": 1, "put": 1}  # three requests, one upload
    assert [image_urls(body) for body in policy.bodies] == [
        [],
        [file_url],
        [file_url, file_url],
    ]


async def test_a_failed_upload_falls_back_to_a_data_uri_and_the_run_finishes(
    tmp_path: Path,
) -> None:
    png = tmp_path / "frame.png"
    png.write_bytes(PNG)
    policy = Recording(SCRIPT)
    with SimServer(policy) as sim:
        sim.simulator.upload_failures = 1
        result = await run(sim, png)
        uploads = sim.stats()["uploads"]
        files = len(sim.simulator.files)
    assert (result.stopped_by, result.final_text) == ("done", "Both frames are fine.")
    # not retried on the next step
    assert (uploads, files) == (
        {"initiate": 1, "failed": 1},
        0,
    )
    uri = "data:image/png;base64," + base64.b64encode(PNG).decode()
    assert [image_urls(body) for body in policy.bodies] == [[], [uri], [uri, uri]]

"""Tool definitions (SPEC 2.3) and the loop's text answers (2.4)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from loop_kit import Shot, read_frame, run
from pydantic import BaseModel, Field

from toolloop import (
    ImagePart,
    MemoryJournal,
    TextPart,
    ToolDefinition,
    ToolMessage,
    ToolOutput,
    ToolSpec,
)
from toolloop.testing import ScriptedModel, call, reply


class Region(BaseModel):
    title: str = Field(description="A property named title is kept.")
    corner: tuple[int, int]


class Crop(BaseModel):
    """Crop a frame."""

    region: Region
    mode: Literal["fit", "fill"] = "fit"
    caption: dict[str, str] = Field(default={"title": "kept: a default is data"})


def noop(input: BaseModel, signal: object) -> ToolOutput:
    return ToolOutput()


async def test_definitions_follow_the_spec_example_in_tool_order() -> None:
    model = ScriptedModel([reply("ok")])
    crop = ToolSpec(name="crop", description="Crop.", schema=Crop, run=noop)
    await run(model, tools=[read_frame(), crop])
    definitions = model.requests[0].tools or []
    assert [d.name for d in definitions] == ["read_frame", "crop"]
    assert definitions[0] == ToolDefinition(
        name="read_frame",
        description="Read one frame.",
        input_schema={
            "type": "object",
            "properties": {
                "shot": {"type": "number"},
                "take": {"default": 1, "type": "number"},
            },
            "required": ["shot"],
        },
    )


async def test_titles_and_schema_keys_are_removed_but_a_title_property_stays() -> None:
    model = ScriptedModel([reply("ok")])
    crop = ToolSpec(name="crop", description="Crop.", schema=Crop, run=noop)
    await run(model, tools=[crop])
    schema = (model.requests[0].tools or [])[0].input_schema
    assert "title" not in schema
    assert all("title" not in prop for prop in schema["properties"].values())
    region = schema["$defs"]["Region"]
    assert "title" not in region
    assert region["properties"]["title"] == {
        "description": "A property named title is kept.",
        "type": "string",
    }
    assert region["required"] == ["title", "corner"]
    assert schema["properties"]["mode"] == {
        "default": "fit",
        "enum": ["fit", "fill"],
        "type": "string",
    }
    assert schema["description"] == "Crop a frame."
    assert schema["properties"]["caption"]["default"] == {
        "title": "kept: a default is data"
    }
    assert "$schema" not in schema


async def test_definitions_are_built_once_per_run() -> None:
    model = ScriptedModel(
        [reply(tool_calls=[call("read_frame", {"shot": 1})]), reply("ok")]
    )
    await run(model, tools=[read_frame()])
    first, second = (r.tools for r in model.requests)
    assert first is second


async def test_nested_input_is_validated_with_locations() -> None:
    crop = ToolSpec(name="crop", description="Crop.", schema=Crop, run=noop)
    bad = {"region": {"title": "t", "corner": [1, "x"]}, "mode": "zoom"}
    model = ScriptedModel([reply(tool_calls=[call("crop", bad, id="c1")]), reply("ok")])
    result, events = await run(model, tools=[crop])
    text = (
        "Invalid input for crop: "
        "✖ Input should be a valid integer, unable to parse string as an integer\n"
        "  → at region.corner.1\n"
        "✖ Input should be 'fit' or 'fill'\n"
        "  → at mode"
    )
    assert result.messages[2] == ToolMessage(
        tool_call_id="c1", content=[TextPart(text=text)], is_error=True
    )
    assert events.events[1].summary == text[:200]  # type: ignore[union-attr]


async def test_tool_receives_the_validated_model() -> None:
    seen: list[object] = []

    def record(input: Shot, signal: object) -> ToolOutput:
        seen.append(input)
        return ToolOutput(content=[TextPart(text="ok")])

    tool = read_frame().model_copy(update={"run": record})
    model = ScriptedModel(
        [reply(tool_calls=[call("read_frame", {"shot": "3"})]), reply("ok")]
    )
    await run(model, tools=[tool])
    assert seen == [Shot(shot=3.0, take=1)]


async def test_a_tool_result_over_the_limit_is_answered_as_an_error_and_not_journaled(
    tmp_path: Path,
) -> None:
    def huge(input: Shot, signal: object) -> ToolOutput:
        return ToolOutput(
            value="v" * 5000, content=[TextPart(text="x" * 5000)], cost_usd=0.02
        )

    big_image = tmp_path / "big.png"
    big_image.write_bytes(b"\x89PNG" + b"0" * 3000)

    def image(input: Shot, signal: object) -> ToolOutput:
        return ToolOutput(
            content=[ImagePart(path=str(big_image), mime_type="image/png", hash="ab")]
        )

    tools = [
        ToolSpec(name="huge", description="Huge.", schema=Shot, run=huge),
        ToolSpec(name="image", description="Image.", schema=Shot, run=image),
    ]
    model = ScriptedModel(
        [
            reply(tool_calls=[call("huge", {"shot": 1}), call("image", {"shot": 2})]),
            reply("ok"),
        ]
    )
    journal = MemoryJournal()
    result, _ = await run(
        model, journal, tools=tools, max_tool_result_bytes=1000, max_image_bytes=2000
    )
    answers = [m for m in result.messages if isinstance(m, ToolMessage)]
    first, second = (answer.content[0].text for answer in answers)  # type: ignore[union-attr,index]
    assert first.startswith("Tool 'huge' returned ") and "the limit is 1,000" in first
    assert "the image 'big.png' of 3,004 bytes; the limit is 2,000" in second
    # sent as error tool results
    assert [answer.is_error for answer in answers] == [
        True,
        True,
    ]
    assert result.spent_usd == 0.02  # the tool's cost still counts
    # not journaled
    assert all("v" * 100 not in stored for stored in journal.entries.values())

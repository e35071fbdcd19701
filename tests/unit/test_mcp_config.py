"""Registering MCP servers (workers/config/mcp.py, workers/config/toolsets.py): what the operator writes, read
without importing or connecting; each mistake a two-line error saying what to do; `${VAR}` filled in
from the worker's environment only, its value in no error; MCP input schemas checked like any tool's."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolloop.loop.tools import tool_definitions, validate_input
from workers.config.mcp import McpServer, expand, read_file
from workers.config.settings import Settings
from workers.config.toolsets import Registry, parse
from workers.protocol.errors import ToolsetError
from workers.step.mcptools import input_model


def _file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "toolsets.yaml"
    path.write_text(text)
    return str(path)


def test_an_mcp_entry_in_toolloop_toolsets_registers_an_http_server() -> None:
    entries = parse(
        "docs=mcp:http://127.0.0.1:3001/mcp,review=examples.storyboard.tools:REVIEW_TOOLS"
    )
    registry = Registry(entries)
    assert registry.names() == ["docs", "review"]
    (server,) = registry.toolset("docs").servers
    assert server.url == "http://127.0.0.1:3001/mcp" and server.label == "docs"
    assert registry.toolset("review").python == (
        "examples.storyboard.tools:REVIEW_TOOLS",
    )


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ("docs=mcp:ftp://host/mcp", "not name=pkg.module:NAME nor name=mcp:<url>"),
        ("docs=mcp:https://user:pw@host.example/mcp", "carries credentials"),
    ],
)
def test_a_bad_mcp_entry_is_refused_in_two_lines(entry: str, says: str) -> None:
    with pytest.raises(ToolsetError) as refused:
        parse(entry)
    assert says in str(refused.value) and len(str(refused.value).splitlines()) == 2


def test_the_file_registers_stdio_and_http_servers_mixed_with_python_tools(
    tmp_path: Path,
) -> None:
    path = _file(
        tmp_path,
        """
everything:
  mcp:
    command: ["npx", "-y", "@modelcontextprotocol/server-everything"]
docs:
  python: examples.storyboard.tools:REVIEW_TOOLS
  mcp:
    url: "https://docs.example.com/mcp"
    headers: {Authorization: "Bearer ${DOCS_TOKEN}"}
    timeout_s: 30
    needs_approval: [delete_page]
""",
    )
    found = read_file(path)
    assert found["everything"].servers[0].command == (
        "npx",
        "-y",
        "@modelcontextprotocol/server-everything",
    )
    docs = found["docs"]
    assert docs.python == ("examples.storyboard.tools:REVIEW_TOOLS",)
    # kept as written
    assert docs.servers[0].headers == (("Authorization", "Bearer ${DOCS_TOKEN}"),)
    assert docs.servers[0].needs_approval == frozenset({"delete_page"})
    settings = Settings.from_env()
    names = Settings(
        **{**settings.__dict__, "toolsets": {}, "toolsets_file": path}
    ).toolset_names()
    # read by a client without connecting or importing
    assert names == [
        "docs",
        "everything",
    ]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("a: [1, 2\n", "not valid YAML"),
        ("- a\n", "not a mapping of toolset names"),
        (
            "docs: {mcp: {url: 'http://127.0.0.1:1/mcp', command: ['x']}}\n",
            "exactly one of `url` and `command`",
        ),
        ("docs: {mcp: {command: 'node server.js'}}\n", "not a list of strings"),
        (
            "docs: {mcp: {url: 'http://127.0.0.1:1/mcp', timeout_s: 0}}\n",
            "timeout_s: 0",
        ),
        (
            "docs: {mcp: {url: 'http://127.0.0.1:1/mcp', token: 'x'}}\n",
            "unknown: 'token'",
        ),
        ("docs: {tools: x}\n", "not a mapping with `mcp:` and/or `python:`"),
    ],
)
def test_a_bad_file_is_refused_in_two_lines(
    tmp_path: Path, text: str, says: str
) -> None:
    with pytest.raises(ToolsetError) as refused:
        read_file(_file(tmp_path, text))
    assert says in str(refused.value), str(refused.value)
    assert len(str(refused.value).splitlines()) == 2


def test_a_name_in_both_places_is_refused(tmp_path: Path) -> None:
    path = _file(tmp_path, "docs: {mcp: {url: 'http://127.0.0.1:1/mcp'}}\n")
    with pytest.raises(
        ToolsetError, match="registered both in TOOLLOOP_TOOLSETS and in"
    ):
        Registry({"docs": "app.tools:TOOLS"}, path)


def test_a_var_is_read_from_the_environment_and_a_missing_one_is_named_not_shown() -> (
    None
):
    assert expand("Bearer ${T}", {"T": "s3cret"}, label="docs") == "Bearer s3cret"
    with pytest.raises(ToolsetError) as missing:
        expand("Bearer ${T} ${U}", {"T": "s3cret"}, label="docs")
    assert "${U}" in str(missing.value) and "s3cret" not in str(missing.value)
    assert (
        McpServer(label="x", url="http://127.0.0.1:1/mcp").where
        == "http://127.0.0.1:1/mcp"
    )


def test_an_mcp_input_schema_is_the_definition_and_validates_like_any_tool() -> None:
    from toolloop.loop.types import ToolSpec

    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "number"},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["a"],
        "additionalProperties": False,
    }
    spec = ToolSpec(
        name="get-sum",
        description="Sum.",
        schema=input_model("get-sum", schema),
        run=lambda i, s: None,
    )
    (definition,) = tool_definitions([spec])
    assert definition.input_schema == schema  # exactly the server's
    checked = validate_input(spec, {"a": 2, "tags": ["x"]})
    assert not isinstance(checked, str) and checked.model_dump(mode="json") == {
        "a": 2,
        "tags": ["x"],
    }
    refused = validate_input(spec, {"a": "two", "tags": [1]})
    assert refused == (
        "Invalid input for get-sum: ✖ 'two' is not of type 'number'\n  → at a\n"
        "✖ 1 is not of type 'string'\n  → at tags.0"
    )

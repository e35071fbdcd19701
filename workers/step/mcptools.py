"""An MCP server's tools as a run's tools: listed once per run and journaled, each call one tool step.

- The list: the first step of a run that needs a toolset with servers lists each server
  (`tools/list`, every page) and writes what it got to the run's `tl:{<run>}:mcptools` hash with
  HSETNX (workers/protocol/keys.py); every later step of the run, a replay or a redelivered one
  included, reads it from there and never lists again, so a server whose tools changed cannot
  change a running run. The tools keep the server's names, descriptions and input schemas; an input
  is checked against the schema (JSON Schema, `jsonschema`) like any tool's, and a bad one is
  answered `Invalid input for <name>: ...` as an error tool result without reaching the server.
- A call: one journal step `tool:<call id>` (SPEC 2.4) whose work is one `tools/call`. Its `_meta`
  carries `toolloop/idempotency_key`, the step's `toolloop.idempotency_key()` ("<run>/<seg>/tool:<id>"),
  the same on every re-run of the step: a worker killed after the server answered and before the
  commit sends the call again with the same key, and a server that dedupes by it does the work once.
  The kill point `mcp:called` (workers/testing/killpoints.py) is that window.
- Results: text as text; images written once, by content, to the image directory
  (TOOLLOOP_IMAGE_DIR) and sent as image parts (SPEC 2.8's `keep_images` applies); structured content
  as its JSON text (unless a text part already says exactly that); resource links and embedded
  resources as text naming them (an embedded image as an image); audio named, not sent. An `isError`
  result, and a call the server never answered (timeout, died, malformed), become an error tool
  result (`is_error: true`); the run goes on and the model sees why.
- Approval: a tool named in the server's `needs_approval`, or, with `approve_destructive`, a tool
  whose annotations do not say it is read-only and non-destructive (MCP's defaults: destructive).
"""

from __future__ import annotations

import base64
import binascii
import copy
import hashlib
import json
import os
import tempfile
from typing import TYPE_CHECKING, Any

import jsonschema
import mcp_types
from pydantic import BaseModel, ConfigDict, model_validator
from pydantic_core import PydanticCustomError

from toolloop.abort import AbortSignal
from toolloop.contract import ContentPart, ImagePart, TextPart
from toolloop.journal.base import idempotency_key
from toolloop.loop.types import ToolOutput, ToolSpec
from workers.config.mcp import McpServer, Toolset
from workers.process.mcpservers import McpCallError
from workers.protocol import keys
from workers.protocol.errors import ToolsetError
from workers.step.mcptasks import META_KEY, task_spec

if TYPE_CHECKING:
    from workers.process.worker_process import WorkerProcess

IMAGE_DIR_ENV = "TOOLLOOP_IMAGE_DIR"
_IMAGE_TYPES = {
    "image/png": "png",
    "image/jpeg": "jpg",
    "image/gif": "gif",
    "image/webp": "webp",
}


# -- the list, journaled ------------------------------------------------------------------------


def tool_record(tool: mcp_types.Tool) -> dict[str, Any]:
    """What the run journals of one listed tool (JSON)."""
    annotations = tool.annotations
    record: dict[str, Any] = {
        "name": tool.name,
        "description": tool.description or "",
        "input_schema": tool.input_schema,
        "read_only": bool(annotations and annotations.read_only_hint),
        "destructive": not (annotations and annotations.destructive_hint is False),
    }
    execution = getattr(tool, "execution", None)
    if execution is not None and getattr(execution, "task_support", None):
        record["task_support"] = execution.task_support
    return record


async def listed(
    process: WorkerProcess, run_id: str, toolset: Toolset
) -> dict[str, list[dict[str, Any]]]:
    """The tools of each server of `toolset` as the run journaled them, listing (and journaling)
    those of the servers it has not listed yet. `McpCallError` when a server does not answer."""
    client = process.batch.client
    key = keys.mcp_tools(run_id)
    stored: dict[str, str] = await client.hgetall(key)  # type: ignore[assignment]
    found: dict[str, list[dict[str, Any]]] = {}
    for server in toolset.servers:
        text = stored.get(server.label)
        if text is None:
            tools = await process.mcp.list_tools(server)
            text = json.dumps(
                [tool_record(tool) for tool in tools], separators=(",", ":")
            )
            if not await client.hsetnx(
                key, server.label, text
            ):  # another copy listed first: its list
                text = str(await client.hget(key, server.label) or text)
        found[server.label] = json.loads(text)
    return found


async def run_tools(
    process: WorkerProcess, run_id: str, name: str | None
) -> list[ToolSpec]:
    """The tools of a run naming toolset `name`: its Python tools and its servers' journaled tools."""
    python = process.toolsets.for_worker(name)
    if name is None:
        return python
    toolset = process.toolsets.toolset(name)
    if not toolset.servers:
        return python
    lists = await listed(process, run_id, toolset)
    tools = list(python)
    for server in toolset.servers:
        tools.extend(specs_for(process, server, lists[server.label]))
    names = [tool.name for tool in tools]
    duplicates = sorted({one for one in names if names.count(one) > 1})
    if duplicates:
        raise ToolsetError(
            f"Toolset {name!r} has more than one tool named {', '.join(map(repr, duplicates))} "
            "(its Python tools and MCP servers together).\n"
            "  Register the clashing servers or tools in toolsets of their own."
        )
    return tools


def journaled_tools(
    process: WorkerProcess, run_id: str, name: str | None
) -> list[ToolSpec]:
    """From a thread (a control task): the run's tools, its MCP tools as the run journaled them (a
    server that was never listed for the run has none here; nothing is listed)."""
    python = process.toolsets.for_worker(name)
    if name is None or not process.toolsets.toolset(name).servers:
        return python
    stored: dict[str, str] = process.redis.hgetall(keys.mcp_tools(run_id))  # type: ignore[assignment]
    tools = list(python)
    for server in process.toolsets.toolset(name).servers:
        if server.label in stored:
            tools.extend(specs_for(process, server, json.loads(stored[server.label])))
    return tools


def specs_for(
    process: WorkerProcess, server: McpServer, records: list[dict[str, Any]]
) -> list[ToolSpec]:
    """The ToolSpecs of one server's journaled tool list (made once per list in the process)."""
    digest = hashlib.sha256(json.dumps(records, sort_keys=True).encode()).hexdigest()
    cache = process.mcp.specs
    found = cache.get((server, digest))
    if found is None:
        found = cache[(server, digest)] = [
            _spec(process, server, record) for record in records
        ]
    return found


def _spec(
    process: WorkerProcess, server: McpServer, record: dict[str, Any]
) -> ToolSpec:
    name = str(record["name"])

    async def run(checked: BaseModel, signal: AbortSignal) -> ToolOutput:
        arguments = checked.model_dump(mode="json")
        meta = {META_KEY: idempotency_key() or ""}
        try:
            result = await process.mcp.call_tool(server, name, arguments, meta)
        except McpCallError as error:
            return _error_output(str(error))
        step = meta[META_KEY]
        process.hooks.point(
            "mcp:called", run=step.split("/", 1)[0], key=step, tool=name
        )
        return output_of(result, image_dir(process))

    destructive = not record.get("read_only") and bool(record.get("destructive", True))
    description = str(record.get("description") or "")
    schema = input_model(name, record.get("input_schema") or {"type": "object"})
    needs_approval = name in server.needs_approval or (
        server.approve_destructive and destructive
    )
    if (
        record.get("task_support") == "required"
    ):  # its calls must be tasks: a two-phase tool
        images = image_dir(process)
        return task_spec(
            process,
            server,
            name,
            description,
            schema,
            needs_approval,
            lambda result: output_of(result, images),
        )
    return ToolSpec(
        name=name,
        description=description,
        schema=schema,
        run=run,
        needs_approval=needs_approval,
    )


# -- input schemas --------------------------------------------------------------------------------


def input_model(tool: str, schema: dict[str, Any]) -> type[BaseModel]:
    """A pydantic model whose JSON schema is the server's `schema` exactly and whose validation is
    that schema's (jsonschema), so the loop checks an MCP tool's input as it checks any tool's."""
    kept = copy.deepcopy(schema)
    validator_class = jsonschema.validators.validator_for(
        kept, default=jsonschema.Draft202012Validator
    )
    try:
        validator_class.check_schema(kept)
    except jsonschema.SchemaError as error:
        raise ToolsetError(
            f"The MCP tool {tool!r} has an input schema that is not valid JSON Schema: "
            f"{error.message[:200]}.\n"
            "  Fix the server's tool definition."
        ) from None
    validator = validator_class(kept)

    class McpInput(BaseModel):
        model_config = ConfigDict(extra="allow", frozen=True)

        @model_validator(mode="before")
        @classmethod
        def _schema(cls, data: Any) -> Any:
            data = {} if data is None else data
            problems = sorted(
                validator.iter_errors(data),
                key=lambda e: [str(p) for p in e.absolute_path],
            )
            if problems:
                raise PydanticCustomError(
                    "mcp_schema", "{text}", {"text": _problems_text(problems)}
                )
            if not isinstance(data, dict):
                raise PydanticCustomError("mcp_schema", "Input should be an object", {})
            return data

        @classmethod
        def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
            return copy.deepcopy(kept)

    McpInput.__name__ = McpInput.__qualname__ = f"McpInput_{tool}"
    return McpInput


def _problems_text(problems: list[jsonschema.ValidationError]) -> str:
    """Each problem as SPEC 2.4's lines (`✖ ` is put before the first by the loop)."""
    lines: list[str] = []
    for index, problem in enumerate(problems):
        lines.append(("" if index == 0 else "✖ ") + problem.message[:300])
        if problem.absolute_path:
            lines.append(
                "  → at " + ".".join(str(part) for part in problem.absolute_path)
            )
    return "\n".join(lines)


# -- results ----------------------------------------------------------------------------------------


def image_dir(process: WorkerProcess) -> str:
    return process.settings.image_dir or os.path.join(
        tempfile.gettempdir(), "toolloop-images"
    )


def output_of(result: mcp_types.CallToolResult, images: str) -> ToolOutput:
    """A `tools/call` result as the model reads it (see the module docstring)."""
    parts: list[ContentPart] = []
    for block in result.content:
        parts.extend(_parts(block, images))
    structured = result.structured_content
    if structured is not None:
        text = json.dumps(structured, ensure_ascii=False, separators=(",", ":"))
        if not any(
            isinstance(p, TextPart) and _same_json(p.text, structured) for p in parts
        ):
            parts.append(TextPart(text=text))
    value: Any = (
        structured
        if structured is not None
        else "\n".join(p.text for p in parts if isinstance(p, TextPart))
    )
    return ToolOutput(value=value, content=parts, is_error=bool(result.is_error))


def _same_json(text: str, value: Any) -> bool:
    try:
        return bool(json.loads(text) == value)
    except ValueError:
        return False


def _parts(block: Any, images: str) -> list[ContentPart]:
    if isinstance(block, mcp_types.TextContent):
        return [TextPart(text=block.text)]
    if isinstance(block, mcp_types.ImageContent):
        return [_image(block.data, block.mime_type, images)]
    if isinstance(block, mcp_types.ResourceLink):
        described = f" ({block.mime_type})" if block.mime_type else ""
        about = f": {block.description}" if block.description else ""
        return [
            TextPart(
                text=f"[resource link] {block.name} <{block.uri}>{described}{about}"
            )
        ]
    if isinstance(block, mcp_types.EmbeddedResource):
        resource = block.resource
        mime = resource.mime_type or ""
        if isinstance(resource, mcp_types.TextResourceContents):
            return [TextPart(text=f"[resource] <{resource.uri}>\n{resource.text}")]
        if mime in _IMAGE_TYPES:
            return [_image(resource.blob, mime, images)]
        size = len(resource.blob) * 3 // 4
        return [
            TextPart(
                text=f"[resource] <{resource.uri}> ({mime or 'binary'}, about {size:,} bytes, not shown)"
            )
        ]
    if isinstance(block, mcp_types.AudioContent):
        return [TextPart(text=f"[audio] ({block.mime_type}, not sent to the model)")]
    return [TextPart(text=f"[{getattr(block, 'type', 'content')}] (not shown)")]


def _image(data: str, mime: str, directory: str) -> ContentPart:
    """An image written once under its digest (the same bytes on every replay), as an image part."""
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return TextPart(text=f"[image] ({mime}: its data is not base64, not shown)")
    extension = _IMAGE_TYPES.get(mime)
    if extension is None:
        return TextPart(text=f"[image] ({mime}: not a type the model reads, not shown)")
    digest = hashlib.sha256(raw).hexdigest()
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{digest}.{extension}")
    if not os.path.exists(path):
        temporary = f"{path}.{os.getpid()}.part"
        with open(temporary, "wb") as file:
            file.write(raw)
        os.replace(temporary, path)
    return ImagePart(path=path, mime_type=mime, hash=digest)


def _error_output(text: str) -> ToolOutput:
    return ToolOutput(value=text, content=[TextPart(text=text)], is_error=True)

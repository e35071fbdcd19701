"""Limits on what a run may ask for, checked at enqueue (`check_spec`) so that one request cannot
fill Redis or a worker's memory. Each is a setting (workers/settings.py, docs/workers.md):

    TOOLLOOP_MAX_SPEC_BYTES   the run spec as JSON          -> LimitError at enqueue (HTTP 413)
    TOOLLOOP_MAX_MESSAGES     messages in the spec          -> LimitError at enqueue (HTTP 413)
    TOOLLOOP_MAX_IMAGE_BYTES  an image file the spec names  -> LimitError at enqueue (HTTP 413)

A tool result over TOOLLOOP_MAX_TOOL_RESULT_BYTES (or with an image over TOOLLOOP_MAX_IMAGE_BYTES)
is not refused but answered to the model as an error (RunToolLoopOptions.max_tool_result_bytes); a
task message over TOOLLOOP_MAX_TASK_BYTES goes to the rejected list (workers/consumer.py).
"""

from __future__ import annotations

import os

from toolloop.contract import ImagePart
from workers.errors import LimitError
from workers.settings import Settings
from workers.spec import RunSpec


def check_spec(spec: RunSpec, settings: Settings, size: int | None = None) -> None:
    """Refuse a spec over a limit, with the limit, the value and the setting that raises it.
    `size`: the length of the spec's JSON when the caller has it already."""
    if len(spec.messages) > settings.max_messages:
        raise LimitError(
            f"The run spec has {len(spec.messages)} messages; the limit is {settings.max_messages}.\n"
            "  Send fewer (summarize older turns), or raise TOOLLOOP_MAX_MESSAGES on the clients.",
            "TOOLLOOP_MAX_MESSAGES",
        )
    size = len(spec.model_dump_json()) if size is None else size
    if size > settings.max_spec_bytes:
        raise LimitError(
            f"The run spec is {size:,} bytes as JSON; the limit is {settings.max_spec_bytes:,}.\n"
            "  Send less text (large inputs belong in a tool that reads them), or raise "
            "TOOLLOOP_MAX_SPEC_BYTES on the clients.",
            "TOOLLOOP_MAX_SPEC_BYTES",
        )
    for message in spec.messages:
        content = message.content if isinstance(message.content, list) else []
        for part in content:
            if isinstance(part, ImagePart):
                check_image(part.path, settings.max_image_bytes)


def check_image(path: str, limit: int) -> None:
    """Refuse an image file larger than `limit` bytes (a file not found here is the worker's to read)."""
    try:
        size = os.stat(path).st_size
    except OSError:
        return
    if size > limit:
        raise LimitError(
            f"The image {os.path.basename(path)!r} is {size:,} bytes; the limit is {limit:,}.\n"
            "  Send a smaller image (providers refuse large ones too), or raise TOOLLOOP_MAX_IMAGE_BYTES.",
            "TOOLLOOP_MAX_IMAGE_BYTES",
        )

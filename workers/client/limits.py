"""Limits on what a run may ask for, checked at enqueue (`check_spec`) so that one request cannot
fill Redis or a worker's memory. Each is a setting (workers/config/settings.py, docs/workers.md):

    TOOLLOOP_MAX_SPEC_BYTES   the run spec as JSON          -> LimitError at enqueue (HTTP 413)
    TOOLLOOP_MAX_MESSAGES     messages in the spec          -> LimitError at enqueue (HTTP 413)
    TOOLLOOP_MAX_IMAGE_BYTES  an image file the spec names  -> LimitError at enqueue (HTTP 413)

What a person sends a run is bounded too, checked by `Client` and `AsyncClient` before anything is
stored (`check_answer`, `check_decision`; the web example answers 413):

    TOOLLOOP_MAX_ANSWER_BYTES    an answer's text, UTF-8         -> LimitError at `answer`
    TOOLLOOP_MAX_REASON_BYTES    a reject reason, UTF-8          -> LimitError at `reject`
    TOOLLOOP_MAX_EDIT_BYTES      an edited input as JSON         -> LimitError at `edit`
    (256 bytes, fixed)           a call id, an actor, a digest   -> LimitError at any decision

and the decisions a run keeps for calls it has not made yet: at most TOOLLOOP_MAX_EARLY_DECISIONS
per segment (the workers' DECIDE script refuses the next one: ApprovalError), and as many waiting
for a worker on the run's control inbox (ops.decide refuses the next one: LimitError).

A tool result over TOOLLOOP_MAX_TOOL_RESULT_BYTES (or with an image over TOOLLOOP_MAX_IMAGE_BYTES)
is not refused but answered to the model as an error (RunToolLoopOptions.max_tool_result_bytes); a
task message over TOOLLOOP_MAX_TASK_BYTES goes to the rejected list (workers/worker/consumer.py).
"""

from __future__ import annotations

import json
import os

from toolloop.contract import ImagePart
from toolloop.loop.types import Decision
from workers.config.settings import Settings
from workers.protocol.errors import LimitError
from workers.protocol.spec import RunSpec


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


IDENT_BYTES = 256
"""The most a call id, an actor or a digest of a decision may have (UTF-8)."""


def _over(what: str, size: int, limit: int, setting: str, hint: str) -> LimitError:
    where = f"raise {setting} on the clients" if setting else "it is fixed"
    return LimitError(
        f"{what} is {size:,} bytes; the limit is {limit:,}.\n  {hint} ({where}).",
        setting,
    )


def check_answer(content: str, settings: Settings) -> None:
    """Refuse an answer longer than TOOLLOOP_MAX_ANSWER_BYTES (UTF-8)."""
    size = len(content.encode())
    if size > settings.max_answer_bytes:
        raise _over(
            "The answer",
            size,
            settings.max_answer_bytes,
            "TOOLLOOP_MAX_ANSWER_BYTES",
            "Send a shorter answer; large inputs belong in a tool that reads them",
        )


def check_decision(call_id: str, decision: Decision, settings: Settings) -> None:
    """Refuse a decision whose reason, edited input, call id, actor or digest is over its limit."""
    for name, value in (
        ("call id", call_id),
        ("actor", decision.actor),
        ("digest", decision.input_digest),
    ):
        size = len((value or "").encode())
        if size > IDENT_BYTES:
            raise _over(
                f"The decision's {name}", size, IDENT_BYTES, "", "Send a shorter one"
            )
    size = len((decision.reason or "").encode())
    if size > settings.max_reason_bytes:
        raise _over(
            "The reject reason",
            size,
            settings.max_reason_bytes,
            "TOOLLOOP_MAX_REASON_BYTES",
            "Give a shorter reason: the model reads it",
        )
    if decision.input is not None:
        size = len(
            json.dumps(
                decision.input, separators=(",", ":"), ensure_ascii=False
            ).encode()
        )
        if size > settings.max_edit_bytes:
            raise _over(
                "The edited input",
                size,
                settings.max_edit_bytes,
                "TOOLLOOP_MAX_EDIT_BYTES",
                "Send a smaller input",
            )

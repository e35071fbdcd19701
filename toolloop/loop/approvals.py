"""Approvals (SPEC.md 4.4): which calls wait for a person, the digest that binds a decision to the
input the person saw, and how a decision becomes the call's answer."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel

from toolloop.contract import TextPart
from toolloop.loop.types import Decision, ToolOutput

REJECTED = "Rejected by the person: {reason}."
EDITED = "The person edited the input before the tool ran; it ran with: {input}"
NOT_RUN_ASKED = "Not run: asked."
"""The answer of a held approval when an ask of the same turn wins (the model may call again)."""


class ApprovalError(ValueError):
    """A decision that cannot be applied: it names a call that is not held, its digest does not match
    the held input, or its edited input fails the tool's schema. Nothing ran."""


class AlreadyDecidedError(ApprovalError):
    """A decision on a call that has one already (recorded, or sent and waiting for a worker): the
    first decision sent wins; nothing was sent for this one."""


class DeadlineError(ValueError):
    """An answer or decision that came after its deadline: the run went on with the default."""


def canonical_json(value: Any) -> str:
    """The canonical JSON of a JSON-safe value: sorted keys, no spaces, UTF-8 kept."""
    return json.dumps(
        value,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )


def input_digest(value: BaseModel | dict[str, Any]) -> str:
    """`sha256:<hex>` of the canonical JSON of a validated input (a model, or its JSON-safe dump)."""
    data = value.model_dump(mode="json") if isinstance(value, BaseModel) else value
    return "sha256:" + hashlib.sha256(canonical_json(data).encode()).hexdigest()


def rejected_text(reason: str) -> str:
    return REJECTED.format(reason=reason.strip().rstrip(".") or "no reason given")


def edited_output(output: ToolOutput, edited: BaseModel) -> ToolOutput:
    """The tool's output with a first text part saying the person edited the input, and to what."""
    note = TextPart(
        text=EDITED.format(input=canonical_json(edited.model_dump(mode="json")))
    )
    return output.model_copy(update={"content": [note, *output.content]})


def check_digest(decision: Decision, call_id: str, held: BaseModel) -> None:
    if decision.input_digest is not None and decision.input_digest != input_digest(
        held
    ):
        raise ApprovalError(
            f"The decision on call {call_id!r} was made for another input (digest "
            f"{decision.input_digest}, the held input's is {input_digest(held)}).\n"
            "  Read the run's pending approvals again and decide on the input they show."
        )

"""`encode_body`: the JSON bytes of a Messages API body, each history message encoded once per run.

Invariant: the bytes are exactly `fastjson.dumps(build_body(...))`, the body a build from nothing
gives (the prompt cache reads the prefix byte for byte; tests/unit/test_body_bytes.py compares them
at every turn of long conversations). What makes reuse safe:
- A message's bytes depend only on the message (a frozen model), the TTL of the marks, and the
  bytes of its images. The loop sends a message whose wire form changes as another object: an image
  dropped (toolloop/loop/history.py `trim_images`), a cache mark set, moved or taken off
  (toolloop/loop/cache.py: the marked copy, then the original again). So the run's memo keeps the
  last request's `Sent`: its messages, the bytes of its `messages` array, and where each message's
  bytes are in them (toolloop/memo.py `RunMemo.wire`). The next request takes the bytes of the
  longest run of the same objects at its start (found in C: `map(is_not, ...)`), up to the first
  message holding an image, then each further message's bytes when it is the same object at the same
  place, and encodes the others. A message holding an image is encoded every time (its bytes are read
  at send time), and the memo keeps no image's bytes (`Sent.keep`). A different TTL reuses nothing.
- Each message's blocks are encoded at the depth they have in the body (three lists around them),
  so orjson refuses a too deeply nested value here exactly when it would refuse the whole body.
  When orjson refuses any part, the whole body goes through `fastjson.dumps`, as it did before (its
  fallback writes numbers unlike orjson: a body is never made of both).
- Turns are joined as orjson writes `{"role": ..., "content": [...]}` (compact, keys in order):
  consecutive user messages share a turn, an assistant message is a turn of its own. The body's
  other fields are the frame's own (`body_frame`), around `"messages"` in its place.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from itertools import compress, count
from operator import is_not
from typing import Any

import orjson

from toolloop.contract import AssistantMessage, ChatMessage, PromptGenRequest
from toolloop.fastjson import dumps
from toolloop.memo import RunMemo, run_memo
from toolloop.providers.anthropic.request import has_image, message_blocks, turns
from toolloop.providers.common import CacheTtl, cache_ttl_of

NONE, USER, ASSISTANT = 0, 1, 2
"""Roles as `Sent.last` stores them."""
_OPEN = {
    USER: b'{"role":"user","content":[',
    ASSISTANT: b'{"role":"assistant","content":[',
}
_NEXT = {role: b"]}," + opening for role, opening in _OPEN.items()}


MESSAGES = b',"messages":[]'
"""Where the messages go in the frame's bytes: the first such bytes are the frame's own `messages`
(outside any string, where `"` is always escaped; and no key before it, `model`, `max_tokens`,
`system` and its text block, holds a `messages`)."""


class Sent:
    """One request's messages and its body: `body[base + starts[i]:base + ends[i]]` is message i's
    blocks (empty for a message with none), `body[base:base + ends[i]]` the `messages` array through
    message i without its last turn's close; `last[i]` the role of the last turn through message i,
    `stable` the number of messages before the first one holding an image (the bytes through
    message `stable - 1` read no image)."""

    __slots__ = (
        "base",
        "body",
        "ends",
        "images",
        "last",
        "messages",
        "stable",
        "starts",
        "ttl",
    )

    def __init__(
        self,
        messages: list[ChatMessage],
        ttl: str,
        starts: array[int],
        ends: array[int],
        last: bytearray,
        stable: int,
    ) -> None:
        self.messages, self.ttl, self.stable = messages, ttl, stable
        self.starts, self.ends, self.last = starts, ends, last
        self.body, self.base = b"", 0
        self.images: list[int] = []
        """The messages holding an image (until `keep`)."""

    def keep(self, body: bytes, at: int) -> None:
        """Keep `body`, whose `messages` array starts at `at`; without the bytes of its images: then
        a copy of the array's bytes through message `stable - 1` and those of each later message
        without an image (the run keeps its memo between steps: a body's images can be megabytes)."""
        if not self.images:
            self.body, self.base = body, at
            return
        view, starts, ends, stable = (
            memoryview(body),
            self.starts,
            self.ends,
            self.stable,
        )
        length = ends[stable - 1] if stable else 0
        pieces = [view[at : at + length]]
        images = set(self.images)
        for index in range(stable, len(starts)):
            if index not in images:
                begin, end = at + starts[index], at + ends[index]
                pieces.append(view[begin:end])
                starts[index], length = length, length + end - begin
                ends[index] = length
        self.body, self.base, self.images = b"".join(pieces), 0, []


NOTHING = Sent([], "", array("Q"), array("Q"), bytearray(), 0)


def encode_body(
    request: PromptGenRequest, frame: dict[str, Any], images: Mapping[str, str]
) -> bytes:
    """The bytes of `frame` (from `body_frame`, its `"messages"` still empty) with the request's
    messages in place; with the run's memo, only what the last request did not send is encoded.
    `images` maps each image path to its base64 bytes."""
    ttl = cache_ttl_of(request)
    memo = run_memo.get()
    sent: Sent | None = None
    try:
        framed = orjson.dumps(frame)
        if request.messages is None:
            chunks: list[Any] = [
                orjson.dumps({"role": "user", "content": request.prompt})
            ]
        else:
            chunks, sent = _messages(request.messages, images, ttl, memo)
    except (
        TypeError
    ):  # orjson refused a value (an integer beyond 64 bits, too deep a nesting)
        return dumps({**frame, "messages": turns(request, images, ttl)})
    at = framed.index(MESSAGES) + len(MESSAGES) - 1
    view = memoryview(framed)
    body = b"".join((view[:at], *chunks, view[at:]))
    if memo is not None and sent is not None:
        sent.keep(body, at)
        memo.wire = sent
    return body


def _messages(
    messages: Sequence[ChatMessage],
    images: Mapping[str, str],
    ttl: CacheTtl,
    memo: RunMemo | None,
) -> tuple[list[Any], Sent | None]:
    """The bytes (bytes or views of the last body) of the `messages` array between its brackets, and
    this request's `Sent` for the run's memo (None without one)."""
    old = (
        NOTHING
        if memo is None or memo.wire is None or memo.wire.ttl != ttl
        else memo.wire
    )
    known = old.messages
    same = min(
        next(
            compress(count(), map(is_not, known, messages)),
            min(len(known), len(messages)),
        ),
        old.stable,
    )
    view, base = memoryview(old.body), old.base
    parts: list[Any] = [view[base : base + old.ends[same - 1]]] if same else []
    starts, ends, last = old.starts[:same], old.ends[:same], old.last[:same]
    length = ends[-1] if same else 0
    role = last[-1] if same else NONE
    stable = same
    images_at: list[int] = []
    for index in range(same, len(messages)):
        message = messages[index]
        image = has_image(message)
        encoded: Any
        if not image and index < len(known) and known[index] is message:
            own = ASSISTANT if isinstance(message, AssistantMessage) else USER
            encoded = view[base + old.starts[index] : base + old.ends[index]]
        else:
            name, blocks = message_blocks(message, images, ttl)
            own = ASSISTANT if name == "assistant" else USER
            # at their depth in the body: see the top
            encoded = orjson.dumps([[[blocks]]])[4:-4]
        start = length
        if encoded:
            opening = (
                _OPEN[own]
                if role == NONE
                else b","
                if role == own == USER
                else _NEXT[own]
            )
            parts += (opening, encoded)
            start += len(opening)
            length = start + len(encoded)
            role = own
        starts.append(start)
        ends.append(length)
        last.append(role)
        if image:
            images_at.append(index)
        elif stable == index:
            stable += 1
    if role != NONE:
        parts.append(b"]}")
    if memo is None:
        return parts, None
    sent = Sent(list(messages), ttl, starts, ends, last, stable)
    sent.images = images_at
    return parts, sent

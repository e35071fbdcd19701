"""The conversation of one run, and the form of it that the next request sends (SPEC.md 2.8).

Invariant: `messages` is the true history (every image kept; it becomes `result.messages`); `sent[i]`
is `messages[i]` as requests send it: a tool message's images become `[image dropped: <name>]` once
it has `keep_images` or more assistant messages after it. That happens at most once per message and
the replaced form never changes, so the work per request is proportional to what is new, and the
metadata kept here lets the cache marks (cache.py) be computed without scanning the whole history.
"""

from __future__ import annotations

from bisect import bisect_right

from toolloop.contract import (
    AssistantMessage,
    ChatMessage,
    ContentPart,
    ImagePart,
    TextPart,
    ToolMessage,
)


class History:
    """The growing history. `keep_images` is the option of the same name (None keeps every image)."""

    __slots__ = (
        "_drop_next",
        "_image_at",
        "_image_before",
        "assistant_at",
        "before",
        "caller_marks",
        "keep_images",
        "marks",
        "messages",
        "sent",
        "text_ok",
        "tool_image",
    )

    def __init__(self, messages: list[ChatMessage], keep_images: int | None) -> None:
        self.keep_images = keep_images
        self.messages: list[ChatMessage] = []
        self.sent: list[ChatMessage] = []
        self.before: list[int] = []
        """Assistant messages before message i."""
        self.text_ok: list[bool] = []
        """Message i is a user or tool message with a text part that is not blank."""
        self.tool_image: list[bool] = []
        """Message i is a tool message with an image part (before any trimming)."""
        self.marks: list[int] = []
        """Text parts of message i that carry the caller's own cache mark."""
        self.caller_marks = 0
        self.assistant_at: list[int] = []
        self._image_at: list[int] = []
        """Tool messages with images, in order; `_image_before[k]` is `before[_image_at[k]]`."""
        self._image_before: list[int] = []
        self._drop_next = 0
        for message in messages:
            self.append(message)

    @property
    def assistants(self) -> int:
        return len(self.assistant_at)

    def append(self, message: ChatMessage) -> None:
        index = len(self.messages)
        self.messages.append(message)
        self.sent.append(message)
        self.before.append(len(self.assistant_at))
        if isinstance(message, AssistantMessage):
            self.assistant_at.append(index)
            self.text_ok.append(False)
            self.tool_image.append(False)
            self.marks.append(0)
            return
        content = message.content
        if isinstance(content, str):
            self.text_ok.append(bool(content.strip()))
            self.tool_image.append(False)
            self.marks.append(0)
            return
        self.text_ok.append(any(p.type == "text" and p.text.strip() for p in content))
        marks = sum(1 for p in content if p.type == "text" and p.cache)
        self.marks.append(marks)
        self.caller_marks += marks
        image = isinstance(message, ToolMessage) and any(
            p.type == "image" for p in content
        )
        self.tool_image.append(image)
        if image:
            self._image_at.append(index)
            self._image_before.append(self.before[index])

    def truncate(self, length: int) -> None:
        """Forget the messages from `length` on (a finish note that was sent but not answered)."""
        while len(self.messages) > length:
            self.messages.pop()
            self.sent.pop()
            self.before.pop()
            self.text_ok.pop()
            self.tool_image.pop()
            self.caller_marks -= self.marks.pop()
            if self.assistant_at and self.assistant_at[-1] >= length:
                self.assistant_at.pop()
            if self._image_at and self._image_at[-1] >= length:
                self._image_at.pop()
                self._image_before.pop()
        self._drop_next = min(self._drop_next, len(self._image_at))

    # -- images (2.8) ------------------------------------------------------------------------------

    def dropped(self, index: int, assistants: int) -> bool:
        """Whether tool message `index` has its images replaced in a history with `assistants`."""
        keep = self.keep_images
        return (
            keep is not None
            and self.tool_image[index]
            and self.before[index] <= assistants - keep
        )

    def trim_images(self) -> None:
        """Bring `sent` up to date: replace the images that are now old enough."""
        keep = self.keep_images
        if keep is None:
            return
        limit = self.assistants - keep
        while (
            self._drop_next < len(self._image_at)
            and self._image_before[self._drop_next] <= limit
        ):
            index = self._image_at[self._drop_next]
            message = self.messages[index]
            assert isinstance(message, ToolMessage) and not isinstance(
                message.content, str
            )
            self.sent[index] = message.model_copy(
                update={"content": _drop(message.content)}
            )
            self._drop_next += 1

    def first_kept_image(self, assistants: int) -> int | None:
        """Index of the first tool message that still has images in a history with `assistants`."""
        keep = self.keep_images
        if keep is None:
            return None
        k = bisect_right(self._image_before, assistants - keep)
        return self._image_at[k] if k < len(self._image_at) else None

    # -- open calls (2.10) -------------------------------------------------------------------------

    def open_calls(self) -> list[str]:
        """Ids of the calls of the last assistant turn that have no tool message yet, in order."""
        if not self.assistant_at:
            return []
        last = self.assistant_at[-1]
        message = self.messages[last]
        assert isinstance(message, AssistantMessage)
        if not message.tool_calls:
            return []
        answered = {
            m.tool_call_id
            for m in self.messages[last + 1 :]
            if isinstance(m, ToolMessage)
        }
        return [c.id for c in message.tool_calls if c.id not in answered]


def _drop(content: list[ContentPart]) -> list[ContentPart]:
    return [
        TextPart(text=f"[image dropped: {_file_name(part.path)}]")
        if isinstance(part, ImagePart)
        else part
        for part in content
    ]


def _file_name(path: str) -> str:
    return path.replace("\\", "/").rsplit("/", 1)[-1]

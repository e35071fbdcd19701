"""Prompt-cache marks of each request (SPEC.md 2.9).

Invariant: the marks are a pure function of the history and the options (`cache`, `keep_images`,
`max_steps`, the given messages), never of loop state, so a resumed run sends the same request for
the same step. Marks are set on copies; the history never carries them.

In `"conversation"` mode a request carries at most 4 breakpoints counting the caller's own: the
system mark, then the two rolling marks (this history's mark target, then the target of the history
cut before its last assistant message, where the previous request put its mark), the older one
dropped first when slots run out. A mark target is the newest message of the stable prefix (no
tool image that this run may still drop) that can carry a mark (a user or tool message with a text
part that is not blank; the mark goes on its last such part).
"""

from __future__ import annotations

from toolloop.contract import ChatMessage, TextPart
from toolloop.loop.history import History
from toolloop.loop.types import CacheMode
from toolloop.memo import RunMemo

BREAKPOINTS = 4
"""Most cache breakpoints a request may carry (Anthropic's limit)."""


def request_messages(
    history: History, mode: CacheMode, max_assistants: int, memo: RunMemo | None = None
) -> tuple[list[ChatMessage], bool | None]:
    """The messages of the next request (images trimmed, marks set) and its `cache_system`. With
    the run's `memo`, a message marked in the last request gets the same marked copy again."""
    history.trim_images()
    sent = list(history.sent)
    if mode == "off":
        return sent, None
    if mode == "system":
        return sent, True
    free = BREAKPOINTS - history.caller_marks
    cache_system: bool | None = None
    if free > 0:
        cache_system = True
        free -= 1
    assistants = history.assistants
    targets = [mark_target(history, len(sent), assistants, max_assistants)]
    if assistants:
        older = mark_target(
            history, history.assistant_at[-1], assistants - 1, max_assistants
        )
        if older != targets[0]:
            targets.append(older)
    last = {} if memo is None else memo.marked
    kept: dict[int, tuple[ChatMessage, ChatMessage | None]] = {}
    for index in targets:
        if index is None:
            continue
        message = sent[index]
        hit = last.get(id(message))
        marked = hit[1] if hit is not None and hit[0] is message else _marked(message)
        kept[id(message)] = (message, marked)
        if marked is None:
            continue  # the caller marked that part already: it takes no slot
        if free > 0:
            sent[index] = marked
            free -= 1
    if memo is not None:
        memo.marked = kept
    return sent, cache_system


def mark_target(
    history: History, length: int, assistants: int, max_assistants: int
) -> int | None:
    """The mark target of the history's first `length` messages (holding `assistants` assistant
    messages): the newest message of its stable prefix that can carry a mark, or None."""
    end = length
    keep = history.keep_images
    if keep is not None:
        first = history.first_kept_image(assistants)
        if (
            first is not None
            and first < end
            and history.before[first] <= max_assistants - keep
        ):
            end = first
    text_ok = history.text_ok
    for index in range(end - 1, -1, -1):
        if text_ok[index] or history.dropped(index, assistants):
            return index
    return None


def _marked(message: ChatMessage) -> ChatMessage | None:
    """A copy of the message with a mark on its last text part that is not blank; None when that
    part is marked already."""
    content = message.content
    if isinstance(content, str):
        return message.model_copy(
            update={"content": [TextPart(text=content, cache=True)]}
        )
    assert content is not None
    for position in range(len(content) - 1, -1, -1):
        part = content[position]
        if part.type == "text" and part.text.strip():
            if part.cache:
                return None
            parts = list(content)
            parts[position] = TextPart(text=part.text, cache=True)
            return message.model_copy(update={"content": parts})
    raise AssertionError("a mark target always has a text part that is not blank")

"""The simulator's token estimate: deterministic, documented, close enough to plan costs with.

    text              ceil(ASCII characters / 4) + one token per non-ASCII code point
    image             IMAGE_TOKENS (a fixed count, whatever the picture; the same as fal's estimate)
    JSON value        the text estimate of its compact JSON (tool definitions, tool-call inputs)

Every count the simulator reports (prompt, cache read/write, output) is a sum of these, so a test can
compute the exact figure it expects with the same functions.
"""

from __future__ import annotations

import json
import math
from typing import Any

IMAGE_TOKENS = 1000


def text_tokens(text: str) -> int:
    """ceil(ASCII characters / 4) + the number of non-ASCII code points."""
    if text.isascii():
        return math.ceil(len(text) / 4)
    ascii_chars = len(text.encode("ascii", "ignore"))
    return math.ceil(ascii_chars / 4) + (len(text) - ascii_chars)


def compact_json(value: Any) -> str:
    """The compact JSON text of a value, keys in the order given (as a client would send them)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def json_tokens(value: Any) -> int:
    """The text estimate of a value's compact JSON."""
    return text_tokens(compact_json(value))

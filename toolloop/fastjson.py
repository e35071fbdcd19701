"""JSON bytes for hot paths: orjson (several times faster than the standard library on the bodies
and messages a step writes), falling back to the standard library for what orjson refuses (integers
beyond 64 bits, which a hostile tool call can hold)."""

from __future__ import annotations

import json
import re
from typing import Any

import orjson


def dumps(value: Any) -> bytes:
    """`value` as compact UTF-8 JSON. NaN and infinities become null (orjson); the fallback keeps
    every integer exact."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def loads(text: str | bytes) -> Any:
    """Parsed JSON: orjson, falling back to the standard library for what it refuses (a lone
    surrogate escape such as `\\ud800`); the fallback's errors are raised. orjson reads an integer
    beyond 64 bits as a float: use it where no such number can matter (the events of a model
    stream: counts and text; tool arguments inside them are JSON text, parsed exactly later)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


_LONG_DIGITS = re.compile(rb"\d{19}")
"""19 digits in a row: an integer that may not fit 64 bits (a float's repr has at most 17), or a
string of digits: either way the exact parser reads it."""


def loads_exact(text: str | bytes) -> Any:
    """What `json.loads(text)` gives, faster: orjson, except for a text holding 19 digits in a row
    (orjson would read an integer past 64 bits as a float) or one orjson refuses (a lone surrogate
    escape, a number past a double's range), which the standard library reads."""
    try:
        raw = text.encode() if isinstance(text, str) else text
    except UnicodeEncodeError:  # a str holding a lone surrogate itself
        return json.loads(text)
    if _LONG_DIGITS.search(raw) is not None:
        return json.loads(text)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(text)

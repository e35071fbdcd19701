"""JSON bytes for hot paths: orjson (several times faster than the standard library on the bodies
and messages a step writes), falling back to the standard library for what orjson refuses (integers
beyond 64 bits, which a hostile tool call can hold). A model's answer is read with `loads_exact`
(a whole body) or `event_json` (a stream event), and no string of it holds a lone surrogate
(`valid_text`)."""

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


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def event_json(data: str) -> Any:
    """A stream event's JSON, parsed by orjson (which refuses lone surrogates), else by the
    standard library and passed through `valid_text`: no string in it holds a lone surrogate."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return valid_text(json.loads(data))


def valid_text(data: Any) -> Any:
    """`data` (parsed JSON) with every lone surrogate replaced by U+FFFD. JSON may carry one as an
    unpaired `\\ud800` escape; such a str cannot be encoded to UTF-8, so a model answer holding one
    could not be journaled (Redis), dumped by pydantic, or sent back to the provider."""
    if isinstance(data, str):
        return data if data.isascii() else _LONE_SURROGATE.sub("\ufffd", data)
    if isinstance(data, list):
        return [valid_text(item) for item in data]
    if isinstance(data, dict):
        return {valid_text(key): valid_text(value) for key, value in data.items()}
    return data

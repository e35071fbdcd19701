"""`toolloop.fastjson.loads_exact` reads every text as `json.loads` does (big integers exact, lone
surrogate escapes, numbers past a double), only faster where orjson can read it the same."""

from __future__ import annotations

import json
import math

import pytest

from toolloop.fastjson import loads_exact

TEXTS = [
    '{"value": {"result": {"text": "ok", "cost_usd": 1e-05}}, "cost_usd": 0.00012}',
    '{"input": {"n": 18446744073709551616, "m": -9223372036854775809}}',  # past 64 bits: exact
    '{"input": {"id": 1234567890123456789}}',
    '["\\ud800 lone", "pair \\ud83d\\ude00", "caf\\u00e9", "é \u2028"]',
    "[1e400, -1e400]",
    "[0.1, 2.0, -0.0, 5e-324, 1.7976931348623157e308]",
]


@pytest.mark.parametrize("text", TEXTS)
def test_loads_exact_reads_what_the_standard_library_reads(text: str) -> None:
    for given in (text, text.encode("utf-8", "surrogatepass")):
        if isinstance(given, bytes) and "\\ud800" in text:
            given = text.encode()  # (the escape is ASCII: the bytes are valid UTF-8)
        got, expected = loads_exact(given), json.loads(given)
        assert repr(got) == repr(expected)
        # the same types: an int stays an int
        assert json.dumps(got) == json.dumps(expected)


def test_a_str_holding_a_lone_surrogate_itself_is_read() -> None:
    assert loads_exact('["\ud800"]') == ["\ud800"]


def test_what_is_not_json_is_a_value_error() -> None:
    for text in ("", "{", b"\xff"):
        with pytest.raises(ValueError):
            loads_exact(text)
    assert math.isinf(loads_exact("1e400"))

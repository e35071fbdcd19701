"""Invalid run specs are refused at enqueue with a clear message, and nothing is enqueued.

Property-based: a valid spec with one field broken (hypothesis draws the field and the bad value).
"Nothing enqueued" is checked on the private Redis the client talks to: not one key appears (no run
state, no journal, no queue list). A spec that is accepted must also be readable back by the
worker exactly as it was given (the spec is stored as JSON).
"""

from __future__ import annotations

import math
from typing import Any

import pydantic
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolloop.embedded import EmbeddedServer
from workers.client import Client
from workers.protocol.errors import ToolsetError
from workers.protocol.spec import RunSpec

pytestmark = pytest.mark.faults

VALID: dict[str, Any] = {
    "model": "claude-sonnet-5-5",
    "system": "You review storyboards.",
    "messages": [{"role": "user", "content": "Review the storyboard."}],
    "toolset": "faults",
    "budget_usd": 1.0,
    "max_steps": 10,
}

BAD_VALUES: dict[str, list[Any]] = {
    "model": ["", None, 3, [], {"name": "x"}],
    "messages": [
        [],
        None,
        "Review the storyboard.",
        [{"role": "boss", "content": "hi"}],
        [{"role": "user"}],
        [{"content": "no role"}],
        [{"role": "user", "content": [{"type": "video", "path": "x"}]}],
        [{"role": "tool", "content": "no call id"}],
        [{"role": "assistant", "tool_calls": [{"name": "no id"}]}],
    ],
    "toolset": [
        "nocolon",
        ":TOOLS",
        "faults.toolset:",
        "a b:TOOLS",
        "1pkg:TOOLS",
        "faults.no_such_module_xyz:TOOLS",
        "faults.toolset:NO_SUCH_NAME",
        "faults.toolset:EFFECTS",
        "faults.toolset:record",
        3,
    ],
    "budget_usd": [0, -1, -0.01, math.nan, math.inf, "lots", None],
    "finish_at": [0, -0.5, 1.5, math.nan, "half"],
    "max_steps": [0, -3, 2.5, "many", None],
    "reasoning": ["ultra", "", 1, "OFF"],
    "cache": ["all", "", None, True],
    "keep_images": ["two", 1.5, [1], -2],
    "provider": ["nosuch", "", 3],
    "fallback": ["anthropic", [1], None, ["nosuch"]],
    "api_key": ["sk-ant-FAKE-should-not-be-a-field"],
    "system": [None, 7, ["a"]],
}
BAD = {name: st.sampled_from(values) for name, values in BAD_VALUES.items()}


SINGLE = [(name, value) for name, values in BAD_VALUES.items() for value in values]


def _keys(client: redis.Redis) -> set[str]:
    return set(client.scan_iter(count=1000))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def client(redis_server: EmbeddedServer) -> Any:
    made = Client(redis_server.url)
    yield made
    made.close()


def _refused(
    client: Client, redis_client: redis.Redis, spec: dict[str, Any], broken: list[str]
) -> None:
    before = _keys(redis_client)
    with pytest.raises((pydantic.ValidationError, ToolsetError)) as caught:
        run_id = client.enqueue(spec)
        pytest.fail(f"enqueue accepted {spec!r} (run {run_id})")
    assert _keys(redis_client) == before, "a refused spec left keys in Redis"
    message = str(caught.value)
    if isinstance(caught.value, ToolsetError):
        lines = message.splitlines()
        assert (
            len(lines) == 2
            and lines[1].startswith("  ")
            and repr(spec["toolset"]) in lines[0]
        ), message
    else:
        assert any(name in message for name in broken), message


@pytest.mark.parametrize(
    ("name", "value"), SINGLE, ids=[f"{n}={v!r}" for n, v in SINGLE]
)
def test_each_bad_field_is_refused_and_nothing_is_enqueued(
    name: str, value: Any, client: Client, redis_client: redis.Redis
) -> None:
    _refused(client, redis_client, {**VALID, name: value}, [name])


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_bad_fields_together_are_refused_and_nothing_is_enqueued(
    data: st.DataObject, client: Client, redis_client: redis.Redis
) -> None:
    broken = data.draw(
        st.lists(st.sampled_from(sorted(BAD)), min_size=1, max_size=3, unique=True)
    )
    spec = dict(VALID)
    for name in broken:
        spec[name] = data.draw(BAD[name], label=name)
    _refused(client, redis_client, spec, broken)


def test_an_accepted_spec_reads_back_as_given(
    client: Client, redis_client: redis.Redis
) -> None:
    run_id = client.enqueue(VALID)
    stored = redis_client.get(f"tl:{{{run_id}}}:spec")
    assert stored is not None
    assert RunSpec.model_validate_json(stored) == RunSpec.model_validate(VALID)

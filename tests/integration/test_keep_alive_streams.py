"""A streamed answer is read to the end of its HTTP body, so its keep-alive connection goes back to
the pool (toolloop/providers/call.py, `_drain`): three streamed model calls in a row use one
connection, also when the body's last chunk comes 0.5, 5 or 50 ms after `message_stop`
(`SimServer(stream_end_delay_s=...)`; the simulator counts the connections its requests came on).
Before, the reader stopped at `message_stop` and each call opened a connection of its own.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.conftest import Worker
from tests.integration.runs_kit import client_on, spec
from toolloop import PromptGenRequest, UserMessage
from toolloop.abort import NEVER_ABORTED
from toolloop.contract import DeltaEvent
from toolloop.embedded import EmbeddedServer
from toolloop.http import KeepAliveClient
from toolloop.providers import AnthropicHandler, FalHandler
from toolloop.sim import SimServer
from workers.client import Client

ADD = {"name": "add", "input": {"a": 20, "b": 22}}
SCRIPT = [
    {"text": "Adding.", "tool_calls": [ADD]},
    {"text": "Adding again.", "tool_calls": [ADD]},
    {"text": "It is 42."},
]


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer(SCRIPT) as server:
        yield server


@pytest.mark.parametrize("late_s", [0.0, 0.0005, 0.005, 0.05])
@pytest.mark.parametrize("wire", ["anthropic", "fal"])
@pytest.mark.timeout(30)
async def test_three_streamed_calls_use_one_connection(
    sim: SimServer, wire: str, late_s: float
) -> None:
    sim.reset()
    sim.simulator.stream_end_delay_s = late_s
    client = KeepAliveClient()
    handler = (
        AnthropicHandler("sk-ant-FAKE", base_url=sim.base_url, http_client=client)
        if wire == "anthropic"
        else FalHandler("fal-FAKE", run_url=sim.base_url, http_client=client)
    )
    deltas: list[DeltaEvent] = []
    try:
        for index in range(3):
            request = PromptGenRequest(
                model="claude-sonnet-5-5",
                messages=[UserMessage(content=f"call {index}")],
            )
            result = await handler.execute(
                request, NEVER_ABORTED, on_delta=deltas.append
            )
            assert result.text == "Adding."
    finally:
        await client.aclose()
    stats = sim.stats()
    assert stats["streamed"] == {wire: 3}
    assert stats["connections"] == 1, stats


@pytest.fixture(scope="module")
def client(sim_redis: EmbeddedServer, sim_worker: Worker) -> Iterator[Client]:
    yield from client_on(sim_redis)


@pytest.mark.timeout(60)
def test_a_streaming_run_of_three_model_calls_on_a_worker_uses_one_connection(
    sim: SimServer, client: Client
) -> None:
    sim.reset()
    sim.simulator.stream_end_delay_s = 0.05
    run_id = client.enqueue(
        spec(
            "You add numbers.",
            model="claude-sonnet-5-5",
            provider="anthropic",
            stream=True,
        )
    )
    status = client.wait(run_id, timeout=30)
    assert status.status == "done", status
    assert status.final_text == "It is 42."
    stats = sim.stats()
    assert stats["streamed"] == {"anthropic": 3}
    assert stats["connections"] == 1, stats

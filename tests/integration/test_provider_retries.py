"""Retries as the anthropic SDK makes them, over real HTTP to the simulator (toolloop/providers/retry.py):
a 429 that names no wait and a connection refused before any response are retried with backoff; an
attempt that timed out is retried once, then the fallback provider answers, and both timed-out
attempts are counted in the answer's cost (each may have been generated and billed whole).
"""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest

from toolloop import PromptGenRequest, UserMessage
from toolloop.abort import NEVER_ABORTED
from toolloop.http import KeepAliveClient
from toolloop.providers import AnthropicHandler, FalHandler, PromptGen, RetryPolicy
from toolloop.providers.models import default_catalog
from toolloop.providers.timeouts import Timeouts
from toolloop.sim import SimRequest, SimServer, SimTurn

QUICK = RetryPolicy(attempts=4, base_delay_s=0.2, max_delay_s=0.4, total_s=30)
REQUEST = PromptGenRequest(
    model="claude-sonnet-5-5", messages=[UserMessage(content="Add 20 and 22.")]
)
SCALE = 0.002
"""The simulator's clock and the handlers' timeouts alike: 600 s take 1.2 s."""


def anthropic(base_url: str, timeouts: Timeouts | None = None) -> AnthropicHandler:
    client = KeepAliveClient()
    return AnthropicHandler(
        "sk-ant-FAKE",
        base_url=base_url,
        retry=QUICK,
        http_client=client,
        timeouts=timeouts,
    )


@pytest.mark.timeout(30)
async def test_a_429_without_retry_after_is_retried_with_backoff() -> None:
    turn = {"text": "42.", "fault": {"kind": "error", "status": 429, "times": 2}}
    with SimServer([turn]) as sim:
        result = await anthropic(sim.base_url).execute(REQUEST, NEVER_ABORTED)
        statuses = sim.stats()["statuses"]
    assert result.text == "42."
    assert statuses == {"429": 2, "200": 1}


@pytest.mark.timeout(30)
async def test_a_connection_refused_before_any_response_is_retried_until_the_server_listens() -> (
    None
):
    with socket.socket() as probe:  # a free port that nothing listens on yet
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sim = SimServer(["42."], port=port)
    # refused until then: attempts 1 and 2 (0.2 s apart)
    later = threading.Timer(0.3, sim.start)
    later.start()
    try:
        result = await anthropic(sim.base_url).execute(REQUEST, NEVER_ABORTED)
        assert result.text == "42."
        assert sim.stats()["requests"] == 1
    finally:
        later.join()
        sim.stop()


def slow_anthropic(request: SimRequest) -> SimTurn:
    """Anthropic takes 700 s (scaled) before it answers, longer than the call waits; fal answers."""
    if request.wire == "anthropic":
        return SimTurn.model_validate(
            {
                "text": "late",
                "fault": {"kind": "timeout", "seconds": 700, "times": None},
            }
        )
    return SimTurn(text="From fal.")


@pytest.mark.timeout(30)
async def test_a_timed_out_call_is_tried_twice_then_the_fallback_answers_and_both_are_paid() -> (
    None
):
    # a non-streamed call waits 600 s (1.2 s), fal's too
    timeouts = Timeouts().scaled(SCALE)
    with SimServer(slow_anthropic, time_scale=SCALE) as sim:
        fal = FalHandler(
            "fal-FAKE", run_url=sim.base_url, retry=QUICK, timeouts=timeouts
        )
        gen = PromptGen(
            {"anthropic": anthropic(sim.base_url, timeouts), "fal": fal},
            "anthropic",
            ["fal"],
        )
        result = await gen.generate(
            REQUEST.model_copy(update={"params": {"max_tokens": 8192}})
        )
        await asyncio.sleep(1.5)  # the abandoned answers finish on the server's side
        endpoints = sim.stats()["endpoints"]
    # not 4 slow attempts of the same answer
    assert endpoints == {
        "anthropic": 2,
        "fal": 1,
    }
    assert result.text == "From fal." and result.meta is not None
    assert result.meta["fallback_from"] == [
        {"provider": "anthropic", "reason": "timeout"}
    ]
    cut = result.meta["cut_usage"]
    assert [c["provider"] for c in cut] == ["anthropic", "anthropic"]
    assert {c["output_from"] for c in cut} == {"max_tokens"} and {
        c["completion_tokens"] for c in cut
    } == {8192}
    price = default_catalog().require("anthropic", "claude-sonnet-5-5").price
    assert price is not None
    # each timed-out attempt at its whole room
    assert result.cost_usd >= 2 * 8192 * price.output / 1e6
    assert result.meta["cost_source"].endswith("+cut")

"""Keep-alive connections the server closed while idle: a model call on one is retried once on a fresh
connection, so it never fails for it (toolloop/http/keepalive.py, `KeepAliveClient`).

The simulator closes a connection idle for more than 1 s when the next request arrives on it, before
any response (`SimServer(idle_timeout_s=1.0)`: a request crossing a load balancer's close of an
idle connection); 50 conversations make 20 calls each (1,000 model calls) on one worker-like loop
with the keep-alive transport, in rounds: every conversation calls at once, then all sit idle for
1.05-1.1 s, so most calls go out on a pooled connection the server has closed. All 1,000 succeed,
each answered once.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from toolloop import PromptGenRequest, UserMessage
from toolloop.abort import NEVER_ABORTED
from toolloop.http import KeepAliveClient
from toolloop.providers import AnthropicHandler, RetryPolicy
from toolloop.sim import SimServer

CONVERSATIONS = 50
CALLS = 20
# no retries of the provider's own: a stale connection must not fail
ONE_TRY = RetryPolicy(attempts=1)


@pytest.mark.timeout(120)
@pytest.mark.slow
async def test_calls_after_idle_gaps_never_fail_on_a_connection_the_server_closed() -> (
    None
):
    rng = random.Random(5)
    with SimServer([], idle_timeout_s=1.0) as sim:
        client = KeepAliveClient()
        handler = AnthropicHandler(
            "sk-ant-FAKE-keepalive",
            base_url=sim.base_url,
            timeout_s=10,
            retry=ONE_TRY,
            http_client=client,
        )
        failures: list[str] = []

        async def call(index: int, turn: int) -> None:
            text = f"conversation {index}, call {turn}"
            request = PromptGenRequest(
                model="claude-sonnet-5-5", messages=[UserMessage(content=text)]
            )
            try:
                await handler.execute(request, NEVER_ABORTED)
            except Exception as error:  # every failure is counted, none may happen
                failures.append(f"{type(error).__name__}: {error}")

        try:
            for turn in range(
                CALLS
            ):  # every conversation calls, then all sit idle past the 1 s
                await asyncio.gather(
                    *(call(index, turn) for index in range(CONVERSATIONS))
                )
                await asyncio.sleep(rng.uniform(1.05, 1.1))
            assert client.used
        finally:
            await client.aclose()
        served = sim.stats()["statuses"]
    assert failures == [], (
        f"{len(failures)} of {CONVERSATIONS * CALLS} calls failed, e.g. {failures[:3]}"
    )
    assert served["200"] == CONVERSATIONS * CALLS
    # the stale path was taken
    assert served.get("closed-idle", 0) >= CONVERSATIONS * CALLS // 4, served

"""500 concurrent requests with 1 s of simulated latency complete together, in about 1 s.

The server runs as its own process (`python -m toolloop.sim`, which this also tests) and the client
is a bare asyncio HTTP/1.1 client, so the figure is the server's: httpx's connection pool costs
O(connections^2) of client CPU at this concurrency (docs/simulator.md).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

REQUESTS = 500


@pytest.fixture
def sim_process() -> Iterator[tuple[str, int]]:
    process = subprocess.Popen(
        [sys.executable, "-m", "toolloop.sim", "--port", "0", "--latency", "1.0"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert process.stdout is not None
        base_url = process.stdout.readline().strip()
        assert base_url.startswith("http://127.0.0.1:")
        yield "127.0.0.1", int(base_url.rsplit(":", 1)[1])
    finally:
        os.kill(process.pid, signal.SIGTERM)
        assert process.wait(timeout=10) == 0
        process.stdout.close()  # type: ignore[union-attr]


async def post(host: str, port: int, index: int) -> tuple[int, dict[str, object]]:
    body = json.dumps(
        {
            "model": "claude-sonnet-5-5",
            "max_tokens": 10,
            "messages": [{"role": "user", "content": f"conversation {index}"}],
        }
    ).encode()
    head = (
        "POST /v1/messages HTTP/1.1\r\nhost: sim\r\nx-api-key: k\r\nanthropic-version: 2023-06-01\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(head.encode() + body)
    data = await reader.read()
    writer.close()
    await writer.wait_closed()
    status_line, _, rest = data.partition(b"\r\n")
    return int(status_line.split()[1]), json.loads(rest.partition(b"\r\n\r\n")[2])


async def test_500_concurrent_requests_with_1s_latency_finish_in_under_3s(
    sim_process: tuple[str, int],
) -> None:
    host, port = sim_process
    await post(host, port, -1)  # the server is warm
    started = time.monotonic()
    answers = await asyncio.gather(
        *(post(host, port, index) for index in range(REQUESTS))
    )
    elapsed = time.monotonic() - started
    assert [status for status, _ in answers] == [200] * REQUESTS
    assert {body["content"][0]["text"] for _, body in answers} == {
        "(The simulator's script has ended.)"
    }  # type: ignore[index]
    print(f"{REQUESTS} concurrent requests with 1 s latency: {elapsed:.2f} s")
    assert 1.0 <= elapsed < 3.0

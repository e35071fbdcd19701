"""A minimal HTTP/1.1 server that answers every request after a fixed latency (keep-alive, asyncio).

Used by bench/pools.py to hold many slow "model calls" open at little CPU cost, so the figure measures
the worker, not the server. `python bench/_slow_server.py PORT LATENCY_S` runs it in the foreground.
"""

from __future__ import annotations

import asyncio
import sys

BODY = b'{"id":"msg_bench","type":"message","role":"assistant","content":[{"type":"text","text":"ok"}]}'
RESPONSE = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
    + str(len(BODY)).encode()
    + b"\r\n\r\n"
    + BODY
)


async def handle(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, latency: float
) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            if length:
                await reader.readexactly(length)
            await asyncio.sleep(latency)
            writer.write(RESPONSE)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def serve(port: int, latency: float) -> None:
    server = await asyncio.start_server(
        lambda r, w: handle(r, w, latency), "127.0.0.1", port, backlog=4096
    )
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1]), float(sys.argv[2])))

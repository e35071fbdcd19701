"""`SimServer`: the simulator on a real socket, served by uvicorn in a background thread.

    script = [{"tool_calls": [{"name": "read_frame", "input": {"shot": 3}}]}, {"text": "Done."}]
    with SimServer(script) as sim:
        os.environ["ANTHROPIC_BASE_URL"] = sim.base_url
        ...
        assert sim.stats()["endpoints"]["anthropic"] == 2

`start()` binds (port 0 = a free port), starts the
thread and returns once the server accepts connections; `stop()` shuts it down and joins the thread.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import uvicorn

from toolloop.providers.catalog import Catalog
from toolloop.providers.models_file import catalog_from_env
from toolloop.sim.app import Simulator
from toolloop.sim.cache import LOOKBACK_BLOCKS, MIN_CACHE_TOKENS, PromptCache
from toolloop.sim.ratelimit import SimRateLimits
from toolloop.sim.script import Policy, Script, as_policy


class SimServer:
    """The provider simulator on `host:port` (port 0 picks a free one). See docs/simulator.md.

    `catalog` (default the catalogue in force: `default_catalog()` with TOOLLOOP_MODELS laid over it,
    toolloop/providers/models_file.py) is the models it serves: any other id is a 404, as on
    the real API. `strict` validates every Anthropic body against the anthropic SDK's request
    types (None: on when the environment has TOOLLOOP_SIM_STRICT=1, as the test suite sets)."""

    def __init__(
        self,
        policy_or_script: Policy | Script | Sequence[Any] | str | Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        latency_s: float = 0.0,
        require_key: str | None = None,
        min_cache_tokens: int = MIN_CACHE_TOKENS,
        model_min_cache_tokens: Mapping[str, int] | None = None,
        lookback: int = LOOKBACK_BLOCKS,
        clock: Callable[[], float] = time.monotonic,
        backlog: int = 4096,
        idle_timeout_s: float | None = None,
        catalog: Catalog | None = None,
        strict: bool | None = None,
        rate_limits: SimRateLimits | None = None,
        tokens_per_s: float | None = None,
        fal_rate_limits: SimRateLimits | None = None,
        time_scale: float = 1.0,
        stream_end_delay_s: float = 0.0,
        ssl_certfile: str | Path | None = None,
        ssl_keyfile: str | Path | None = None,
    ) -> None:
        """`time_scale`: real seconds per simulated second (every wait of the simulator, a turn's
        `generation_s` included; 0.01 makes 190 s of generation take 1.9 s).
        `stream_end_delay_s`: a streamed answer's body ends that long after its last event.
        `ssl_certfile`, `ssl_keyfile`: serve HTTPS with this certificate (PEM) and key.
        `rate_limits`, `fal_rate_limits`: each wire's limits per key (default: none).
        `tokens_per_s`: the rate of a streamed answer (None: as fast as it can be sent).
        `idle_timeout_s`: a keep-alive connection idle longer than this is closed by the server
        when the next request arrives on it, before any response (as when a client's request crosses
        a load balancer's close of an idle connection); None: connections stay open 30 s."""
        catalog = catalog or catalog_from_env()
        cache = PromptCache(
            min_tokens=min_cache_tokens,
            model_min_tokens=model_min_cache_tokens,
            lookback=lookback,
            clock=clock,
            catalog=catalog,
        )
        if strict is None:
            strict = os.environ.get("TOOLLOOP_SIM_STRICT", "").strip() == "1"
        self.simulator = Simulator(
            as_policy(policy_or_script),
            latency_s=latency_s,
            require_key=require_key,
            cache=cache,
            catalog=catalog,
            strict=strict,
            rate_limits=rate_limits,
            fal_rate_limits=fal_rate_limits,
            idle_timeout_s=idle_timeout_s,
            tokens_per_s=tokens_per_s,
            time_scale=time_scale,
            stream_end_delay_s=stream_end_delay_s,
        )
        self.ssl_certfile = None if ssl_certfile is None else str(ssl_certfile)
        self.ssl_keyfile = None if ssl_keyfile is None else str(ssl_keyfile)
        self.host = host
        self.port = port
        self.backlog = backlog
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None

    @property
    def base_url(self) -> str:
        """e.g. "http://127.0.0.1:53211" (the port is known once `start()` or `bind()` ran); https
        with a certificate."""
        scheme = "https" if self.ssl_certfile else "http"
        return f"{scheme}://{self.host}:{self.port}"

    @property
    def cache(self) -> PromptCache:
        return self.simulator.cache

    def stats(self) -> dict[str, Any]:
        return self.simulator.stats()

    def reset(self) -> None:
        self.simulator.reset()

    def bind(self) -> socket.socket:
        """Bind the listening socket (done by `start()`); afterwards `port` is the real port."""
        if self._socket is None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((self.host, self.port))
                sock.listen(self.backlog)
            except OSError as error:
                sock.close()
                raise OSError(
                    error.errno,
                    f"The simulator cannot listen on {self.host}:{self.port}: {error.strerror}.\n"
                    "  Pick another port (0 = a free one).",
                ) from error
            self.port = sock.getsockname()[1]
            self._socket = sock
        return self._socket

    def config(self) -> uvicorn.Config:
        return uvicorn.Config(
            self.simulator.app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            interface="asgi3",
            proxy_headers=False,
            http="httptools"
            if importlib.util.find_spec("httptools")
            else "h11",  # C parser: ~1/3 the CPU
            backlog=self.backlog,
            timeout_graceful_shutdown=1,
            timeout_keep_alive=30,
            ssl_certfile=self.ssl_certfile,
            ssl_keyfile=self.ssl_keyfile,
        )

    def start(self, timeout: float = 10.0) -> SimServer:
        """Serve in a background thread; returns self once the server accepts connections."""
        if self._thread is not None:
            return self
        sock = self.bind()
        self._server = uvicorn.Server(self.config())
        server = self._server
        self._thread = threading.Thread(
            target=_serve_on_own_loop,
            args=(server, sock),
            name=f"toolloop-sim:{self.port}",
            daemon=True,
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"The simulator on {self.base_url} did not start within {timeout:.0f} s.\n"
                    "  Check that the port is free, or pass port=0 for a free one."
                )
            time.sleep(0.005)
        return self

    def serve_forever(self) -> None:
        """Serve in the main thread until SIGINT/SIGTERM, then return (what `python -m toolloop.sim`
        runs). uvicorn re-raises the signal it caught once it has shut down; the handlers set here
        make that a plain return, so the process exits 0."""
        sock = self.bind()
        self._server = uvicorn.Server(self.config())
        previous = {
            number: signal.signal(number, _ignore)
            for number in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            self._server.run(sockets=[sock])
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving and join the thread; safe to call twice."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        self._server = None

    def __enter__(self) -> SimServer:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()


def _ignore(number: int, frame: object) -> None:
    """A signal handler that does nothing: uvicorn has already shut down when it re-raises."""


def _serve_on_own_loop(server: uvicorn.Server, sock: socket.socket) -> None:
    """The server thread: uvloop when installed, else a standard loop; closed when serving ends."""
    loop: asyncio.AbstractEventLoop
    try:
        import uvloop  # optional at run time: the standard loop where it is missing

        loop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(server.serve(sockets=[sock]))
    finally:
        loop.close()

"""Shared test switches (keep this file minimal; put suite fixtures in the suite's own conftest).

No test may reach a real model provider: resolving one of their hosts fails the test at once, so a
provider pointed at the wrong URL shows up as a clear error instead of a paid (or hanging) call.
Tests use `toolloop.sim` or a `ScriptedModel` instead (docs/testing.md). Every test process
registers the same toolsets (TEST_TOOLSETS); worker subprocesses inherit them. Every
simulator a test starts is strict (TOOLLOOP_SIM_STRICT=1): each Anthropic body a provider
sends is validated against the anthropic SDK's request types, and a body that does not
validate is a 400.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest

TEST_TOOLSETS = (
    "agents=tests.integration.agents:TOOLS,review=examples.storyboard.tools:REVIEW_TOOLS,"
    "faults=faults.toolset:TOOLS"
)
"""The toolsets every test process, worker and client registers (TOOLLOOP_TOOLSETS, as an operator
configures workers and web backends alike); runs name them `agents`, `review` and `faults`."""
os.environ["TOOLLOOP_TOOLSETS"] = TEST_TOOLSETS  # before any module reads the settings

PROVIDER_HOSTS = ("anthropic.com", "openai.com", "fal.run", "fal.ai", "fal.media", "openrouter.ai")


def _is_provider(host: Any) -> bool:
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    if not isinstance(host, str):
        return False
    host = host.lower().rstrip(".")
    return any(host == suffix or host.endswith("." + suffix) for suffix in PROVIDER_HOSTS)


@pytest.fixture(autouse=True, scope="session")
def _no_real_providers() -> Iterator[None]:
    real = socket.getaddrinfo

    def guarded(host: Any, *args: Any, **kwargs: Any) -> Any:
        if _is_provider(host):
            raise AssertionError(
                f"A test tried to reach the real provider host {host!r}.\n"
                "  Point it at toolloop.sim (ANTHROPIC_BASE_URL / FAL_RUN_URL) or use a ScriptedModel."
            )
        return real(host, *args, **kwargs)

    socket.getaddrinfo = guarded
    try:
        yield
    finally:
        socket.getaddrinfo = real


@pytest.fixture(autouse=True, scope="session")
def _strict_simulator() -> Iterator[None]:
    before = os.environ.get("TOOLLOOP_SIM_STRICT")
    os.environ["TOOLLOOP_SIM_STRICT"] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TOOLLOOP_SIM_STRICT", None)
        else:
            os.environ["TOOLLOOP_SIM_STRICT"] = before

"""Shared test switches (keep this file minimal; put suite fixtures in the suite's own conftest).

No test may reach a real model provider: resolving one of their hosts fails the test at once, so a
provider pointed at the wrong URL shows up as a clear error instead of a paid (or hanging) call.
Tests use `toolloop.sim` or a `ScriptedModel` instead (docs/testing.md). Every test process
registers the same toolsets (TEST_TOOLSETS); worker subprocesses inherit them. Every
simulator a test starts is strict (TOOLLOOP_SIM_STRICT=1): each Anthropic body a provider
sends is validated against the anthropic SDK's request types, and a body that does not
validate is a 400. Each tier of the suite (unit, replay, integration, faults) starts with a line naming
it and its size, and the summary gives each tier's time (TierLines).
"""

from __future__ import annotations

import os
import socket
import time
from collections import Counter
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

TIERS = {
    "unit": "in-process: the loop, providers, workers' parts",
    "replay": "recorded runs replayed",
    "integration": "Redis servers, Celery worker processes, the simulator over HTTP",
    "faults": "the bounded reliability suite: kills, restarts, bad input",
}
"""The tiers, in the order they run (pyproject's testpaths), and what each runs on."""

PROVIDER_HOSTS = (
    "anthropic.com",
    "openai.com",
    "fal.run",
    "fal.ai",
    "fal.media",
    "openrouter.ai",
)


def _is_provider(host: Any) -> bool:
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    if not isinstance(host, str):
        return False
    host = host.lower().rstrip(".")
    return any(
        host == suffix or host.endswith("." + suffix) for suffix in PROVIDER_HOSTS
    )


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


def tier_of(nodeid: str) -> str:
    """`unit` for tests/unit/test_x.py::test_y (the folder under tests/)."""
    parts = nodeid.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else parts[0]


class TierLines:
    """One line as each tier begins (pytest -q prints only dots) and, in the summary, each tier's
    time, from its first test's start to its last test's end. Under pytest-xdist the tiers overlap
    where they meet: each line is printed once, when the tier's first test starts. State of this
    session only: an instance per pytest config, not module globals."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.sizes: Counter[str] = Counter()
        self.spans: dict[str, list[float]] = {}  # tier: [first start, last end]

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.sizes = Counter(tier_of(item.nodeid) for item in session.items)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        # the controller collects nothing
        self.sizes = Counter(tier_of(nodeid) for nodeid in ids)

    @pytest.hookimpl(
        tryfirst=True
    )  # before the terminal reporter writes the file's name
    def pytest_runtest_logstart(
        self, nodeid: str, location: tuple[str, int | None, str]
    ) -> None:
        tier = tier_of(nodeid)
        if tier in self.spans:
            return
        self.spans[tier] = [time.monotonic()] * 2
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            if (
                reporter._tw.width_of_current_line
            ):  # end the line of the tier before's dots (pytest -q)
                reporter.write("\n")
            about = TIERS.get(tier)
            reporter.write_sep(
                "-",
                f"{tier}: {self.sizes[tier]} tests" + (f" ({about})" if about else ""),
            )

    def pytest_runtest_logfinish(
        self, nodeid: str, location: tuple[str, int | None, str]
    ) -> None:
        if (span := self.spans.get(tier_of(nodeid))) is not None:
            span[1] = time.monotonic()

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.spans:
            times = ", ".join(
                f"{tier} {seconds(end - start)}"
                for tier, (start, end) in self.spans.items()
            )
            terminalreporter.write_line(f"tiers: {times}")


def seconds(took: float) -> str:
    if took < 10:
        return f"{took:.1f} s"
    return f"{took:.0f} s" if took < 100 else f"{took // 60:.0f} min {took % 60:.0f} s"


def pytest_collection_modifyitems(config: pytest.Config, items: list[Any]) -> None:
    """Under pytest-xdist (`make test`: each process collects, the same way), the tests marked `slow`
    start first, so the last minutes are not one long test on one process while the other idles."""
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller only, under pytest-xdist
        config.pluginmanager.register(TierLines(config), "toolloop-tiers")

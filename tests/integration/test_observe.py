"""Observability of durable runs on real workers (docs/operations.md, "Traces and metrics").

- One trace per run across two worker processes and a SIGKILL between them: the workers export
  their spans to one JSON-lines file (TOOLLOOP_TRACES_FILE, an SDK exporter in each worker); the
  test reads it and finds one trace, one `chat` span per model call made and one `execute_tool`
  span per tool execution that finished, with the GenAI attributes and the cache token counts, all
  children of the run segment's one `toolloop.run` span (ids derived from the run id).
- /metrics of a worker after a run equals the run's journal: steps committed, spend, cache reads.

The model is the provider simulator over real HTTP (Anthropic wire, prompt cache on with a small
long system text so that the second turn reads the first turn's cache).
"""

from __future__ import annotations

import ipaddress
import json
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import FAST_RECOVERY, Worker, sim_env, start_worker
from tests.integration.runs_kit import eventually, logged, spec
from toolloop.embedded import EmbeddedServer
from toolloop.sim import SimRequest, SimServer, SimTurn
from workers.client import Client
from workers.observe.tracing import segment_ids
from workers.protocol import keys

pytestmark = pytest.mark.integration

# past the 1,024-token cache minimum
CONTEXT = "You review storyboards, one frame at a time. " * 200
KILLED = "observe-killed " + CONTEXT
PLAIN = "observe-plain " + CONTEXT


class Model:
    """Turn 0 calls `slow` (3 s for the killed scenario), turn 1 answers."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls = 0

    def __call__(self, request: SimRequest) -> SimTurn:
        with self.lock:
            self.calls += 1
        if request.assistant_turns == 0:
            seconds = (
                3.0 if (request.system or "").startswith("observe-killed") else 0.05
            )
            return SimTurn(
                text="Waiting.",
                tool_calls=[{"name": "slow", "input": {"seconds": seconds}}],
            )  # type: ignore[list-item]
        return SimTurn(text="Done waiting.")


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer(Model()) as server:
        yield server


def env_for(sim: SimServer, tmp_path: Path, **extra: str) -> dict[str, str]:
    return sim_env(sim, tmp_path / "tools.jsonl", **FAST_RECOVERY, **extra)


def journal_of(redis_url: str, run_id: str) -> dict[str, dict[str, Any]]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        raw: dict[str, str] = client.hgetall(keys.journal(run_id, "s0"))  # type: ignore[assignment]
    finally:
        client.close()
    return {field: json.loads(text) for field, text in raw.items()}


def model_usage(journal: dict[str, dict[str, Any]]) -> list[dict[str, int]]:
    return [
        entry["value"]["result"]["usage"]
        for key, entry in sorted(journal.items())
        if "model:" in key
    ]


def test_one_trace_across_two_workers_and_a_kill(
    sim_redis: EmbeddedServer, sim: SimServer, tmp_path: Path
) -> None:
    traces = tmp_path / "spans.jsonl"
    env = env_for(sim, tmp_path, TOOLLOOP_TRACES_FILE=str(traces))
    tool_log = tmp_path / "tools.jsonl"
    first: Worker = start_worker(sim_redis.url, tmp_path, env)
    second: Worker | None = None
    client = Client(sim_redis.url)
    try:
        run_id = client.enqueue(
            spec(KILLED, model="claude-sonnet-5-5", provider="anthropic")
        )
        eventually(lambda: tool_log.exists() and tool_log.read_text(), timeout=20)
        time.sleep(0.5)  # inside the 3 s tool
        first.kill()
        second = start_worker(sim_redis.url, tmp_path, env)
        status = client.wait(run_id, timeout=60)
        assert status.status == "done", (status, second.log.read_text()[-3000:])
        assert [e["event"] for e in logged(tool_log)] == ["start", "start", "finished"]
    finally:
        first.kill()
        if second is not None:
            second.stop()
        client.close()
    spans = [json.loads(line) for line in traces.read_text().splitlines()]
    mine = [s for s in spans if s["attributes"].get("toolloop.run_id") == run_id]
    trace_ids = {s["trace_id"] for s in mine}
    assert len(trace_ids) == 1, trace_ids  # one run, one trace: every step span of it
    (trace_id,) = trace_ids
    in_trace = [s for s in spans if s["trace_id"] == trace_id]
    assert len({s["pid"] for s in in_trace}) == 2  # both workers' spans
    chats = [
        s for s in in_trace if s["attributes"].get("gen_ai.operation.name") == "chat"
    ]
    tools = [
        s
        for s in in_trace
        if s["attributes"].get("gen_ai.operation.name") == "execute_tool"
    ]
    # one per model call: the killed worker's call was committed, not made again
    assert len(chats) == 2
    # the tool finished once (its killed execution never ended a span)
    assert len(tools) == 1
    (segment,) = (
        mine  # the run's one segment: one `toolloop.run` span, exported by the second worker
    )
    assert (
        segment["name"] == "toolloop.run"
        and segment["attributes"]["toolloop.outcome"] == "stop"
    )
    # its children, both workers'
    assert {s["parent_id"] for s in chats + tools} == {segment["span_id"]}
    derived_trace, derived_span = segment_ids(run_id, 0)
    assert (trace_id, segment["span_id"]) == (
        f"{derived_trace:032x}",
        f"{derived_span:016x}",
    )
    assert segment["start"] <= min(s["start"] for s in chats + tools)
    assert segment["end"] >= max(s["end"] for s in chats + tools)
    assert tools[0]["attributes"]["gen_ai.tool.name"] == "slow"
    usage = model_usage(journal_of(sim_redis.url, run_id))
    for chat, used in zip(sorted(chats, key=lambda s: s["start"]), usage, strict=True):
        attributes = chat["attributes"]
        assert attributes["gen_ai.provider.name"] == "anthropic"
        assert attributes["gen_ai.request.model"] == "claude-sonnet-5-5"
        assert attributes["gen_ai.response.model"]
        assert attributes["gen_ai.usage.input_tokens"] == used["prompt_tokens"]
        assert attributes["gen_ai.usage.output_tokens"] == used["completion_tokens"]
        assert (
            attributes["gen_ai.usage.cache_read.input_tokens"] == used["cached_tokens"]
        )
        assert (
            attributes["gen_ai.usage.cache_creation.input_tokens"]
            == used["cache_write_tokens"]
        )
        assert attributes["gen_ai.response.finish_reasons"]
        assert "toolloop.cost_usd" in attributes
    # the second turn read the first turn's cache
    assert usage[1]["cached_tokens"] > 0, usage
    # no keys, no content
    assert (
        "sim-key" not in traces.read_text()
        and "storyboards, one frame" not in traces.read_text()
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening(port: int) -> set[str]:
    """The local addresses with a socket listening on TCP `port` (Linux /proc/net/tcp, tcp6)."""
    found: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table, encoding="ascii") as file:
            for line in file.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, _, hex_port = local.partition(":")
                if state == "0A" and int(hex_port, 16) == port:
                    raw = bytes.fromhex(address)
                    words = b"".join(
                        raw[i : i + 4][::-1] for i in range(0, len(raw), 4)
                    )
                    found.add(str(ipaddress.ip_address(words)))
    return found


def scrape(port: int) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """/metrics as {sample name: {labels: value}}."""
    text = (
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10)
        .read()
        .decode()
    )
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[
                tuple(sorted(sample.labels.items()))
            ] = sample.value
    return samples


def total(
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]],
    name: str,
    **labels: str,
) -> float:
    wanted = set(labels.items())
    return sum(v for k, v in samples.get(name, {}).items() if wanted <= set(k))


def test_metrics_equal_the_runs_journal(
    sim_redis: EmbeddedServer, sim: SimServer, tmp_path: Path
) -> None:
    port = free_port()
    worker = start_worker(
        sim_redis.url, tmp_path, env_for(sim, tmp_path, TOOLLOOP_METRICS_PORT=str(port))
    )
    client = Client(sim_redis.url)
    try:
        before = scrape(port)
        assert total(before, "toolloop_steps_committed_total") == 0
        # TOOLLOOP_METRICS_HOST unset: loopback only
        assert listening(port) == {"127.0.0.1"}
        run_id = client.enqueue(
            spec(PLAIN, model="claude-sonnet-5-5", provider="anthropic")
        )
        status = client.wait(run_id, timeout=60)
        assert status.status == "done", (status, worker.log.read_text()[-3000:])
        after = eventually(
            lambda: (s := scrape(port)) and total(s, "toolloop_runs_total") and s
        )
    finally:
        worker.stop()
        client.close()
    journal = journal_of(sim_redis.url, run_id)
    usage = model_usage(journal)
    assert total(after, "toolloop_steps_committed_total") == len(journal) == 3
    assert (
        total(after, "toolloop_steps_committed_total", kind="model", queue="llm") == 2
    )
    assert (
        total(after, "toolloop_steps_committed_total", kind="tool", queue="tools") == 1
    )
    assert total(after, "toolloop_steps_started_total") == 3
    assert total(after, "toolloop_steps_rerun_total") == 0
    assert total(after, "toolloop_step_seconds_count") == 3
    spent = sum(entry["cost_usd"] for entry in journal.values())
    assert spent > 0
    assert total(after, "toolloop_spend_usd_total") == pytest.approx(spent, rel=1e-9)
    assert total(after, "toolloop_spend_usd_total") == pytest.approx(
        status.spent_usd, rel=1e-9
    )
    reads = sum(u["cached_tokens"] for u in usage)
    assert reads > 0
    assert total(after, "toolloop_prompt_tokens_total", cache="read") == reads
    assert total(after, "toolloop_prompt_tokens_total", cache="write") == sum(
        u["cache_write_tokens"] for u in usage
    )
    assert total(after, "toolloop_prompt_tokens_total") == sum(
        u["prompt_tokens"] for u in usage
    )
    assert (
        total(after, "toolloop_model_calls_total", provider="anthropic", status="ok")
        == 2
    )
    assert total(after, "toolloop_runs_total", status="done") == 1
    assert total(after, "toolloop_leases_lost_total") == 0
    assert ("queue", "llm") in {
        label for labels in after["toolloop_queue_depth"] for label in labels
    }
    # the run has ended: nothing runs
    assert total(after, "toolloop_steps_in_flight") == 0

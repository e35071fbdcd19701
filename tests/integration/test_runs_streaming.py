"""A streaming durable run (RunSpec.stream) through a real worker: the model's text reaches a
`Client.events` reader as `delta` entries, batched, before each step's `model` event, and a reader
that drops and comes back with its last id gets every delta once, in order."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import Worker, own_redis, worker_on
from tests.integration.runs_kit import client_on, spec
from tests.integration.streamer import answer_words, worker_env
from toolloop.embedded import EmbeddedServer
from workers.client import AsyncClient, Client
from workers.protocol.records import RunEventRecord

WORDS = 120
TOOLLOOP = str(Path(sys.executable).parent / "toolloop")
WORD_MS = 5


@pytest.fixture(scope="module")
def stream_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    yield from own_redis(tmp_path_factory, "stream-redis")


@pytest.fixture(scope="module")
def stream_worker(
    stream_redis: EmbeddedServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Worker]:
    directory: Path = tmp_path_factory.mktemp("stream-worker")
    yield from worker_on(stream_redis.url, directory, worker_env(WORDS, WORD_MS))


@pytest.fixture
def client(stream_redis: EmbeddedServer, stream_worker: Worker) -> Iterator[Client]:
    yield from client_on(stream_redis)


def ms(entry_id: str) -> int:
    return int(entry_id.split("-")[0])


def test_a_reader_that_reconnects_with_its_last_id_gets_every_delta_once_in_order(
    client: Client,
) -> None:
    run_id = client.enqueue(spec("You add numbers.", stream=True))
    first: list[RunEventRecord] = []
    for event in client.events(run_id, follow=True):
        first.append(event)
        if sum(e.kind == "delta" for e in first) == 5:
            break  # the page closed mid-answer
    rest = list(client.events(run_id, follow=True, after=first[-1].id))
    seen = first + rest
    stored = list(client.events(run_id))  # the whole stream, read once the run ended

    # nothing missed, nothing twice, in order
    assert [e.id for e in seen] == [e.id for e in stored]
    assert client.status(run_id).status == "done"
    models = [e for e in stored if e.kind == "model"]
    assert len(models) == 2
    for (
        model
    ) in models:  # each step's deltas spell its model event's text, and come before it
        before = stored[: stored.index(model)]
        text = "".join(
            e.text for e in before if e.kind == "delta" and e.step == model.step
        )
        assert text == model.text == "".join(answer_words(model.step, WORDS))
    assert not [e for e in stored if e.kind == "discarded"]
    committed = [e for e in stored if e.committed]
    assert [e.seq for e in committed] == list(range(1, len(committed) + 1))
    assert [e.kind for e in client.events(run_id, deltas=False)] == [
        e.kind for e in committed
    ]


def test_deltas_are_batched_at_most_one_write_per_50_ms(client: Client) -> None:
    run_id = client.enqueue(spec("You add numbers.", stream=True))
    client.wait(run_id, timeout=60)
    stored = list(client.events(run_id))
    for step in (1, 2):
        deltas = [e for e in stored if e.kind == "delta" and e.step == step]
        # 120 words over ~600 ms: about 12 writes, not 120
        assert len(deltas) < WORDS / 4
        gaps = [ms(b.id) - ms(a.id) for a, b in itertools.pairwise(deltas[:-1])]
        # the last one goes with the model event, early
        assert gaps and min(gaps) >= 40, gaps


def test_a_run_without_stream_writes_no_deltas(client: Client) -> None:
    run_id = client.enqueue(spec("You add numbers."))
    client.wait(run_id, timeout=60)
    kinds = [e.kind for e in client.events(run_id)]
    assert "delta" not in kinds and kinds.count("model") == 2, kinds


def test_a_run_cancelled_mid_answer_marks_its_text_discarded(client: Client) -> None:
    run_id = client.enqueue(spec("You add numbers.", stream=True))
    for event in client.events(run_id, follow=True):
        if event.kind == "delta":
            client.cancel(run_id)
            break
    status = client.wait(run_id, timeout=60)
    stored = list(client.events(run_id))
    deltas = [e for e in stored if e.kind == "delta"]
    marks = [e for e in stored if e.kind == "discarded"]
    assert status.status == "cancel"
    assert deltas and [(m.step, m.attempt) for m in marks] == [
        (deltas[0].step, deltas[0].attempt)
    ]
    # after every delta it voids
    assert stored.index(marks[0]) > stored.index(deltas[-1])
    assert json.dumps([e.kind for e in stored if e.committed]).count("model") == 0


def test_an_answer_begun_again_within_a_step_voids_its_first_attempt(
    client: Client,
) -> None:
    run_id = client.enqueue(spec("You add numbers.", user="redo, think", stream=True))
    seen = list(client.events(run_id, follow=True))
    step1 = [e for e in seen if not e.committed and e.step == 1]
    marks = [e for e in step1 if e.kind == "discarded"]
    assert len(marks) == 1
    void = marks[0].attempt
    at = step1.index(marks[0])
    # the first answer, then its marker
    assert {e.attempt for e in step1[:at]} == {void}
    # then the answer begun again
    assert all(e.attempt == f"{void}.1" for e in step1[at + 1 :])
    thinking = [e for e in step1[:at] if getattr(e, "thinking", False)]
    assert "".join(e.text for e in thinking) == "let me see "
    kept = "".join(e.text for e in step1[at + 1 :])
    model = next(e for e in seen if e.kind == "model" and e.step == 1)
    assert kept == model.text == "".join(answer_words(1, WORDS))


def test_toolloop_follow_prints_the_text_as_it_streams_and_says_what_was_discarded(
    client: Client, stream_redis: EmbeddedServer, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"} | {
        "REDIS_URL": stream_redis.url,
        "TOOLLOOP_HOME": str(tmp_path),
    }
    done = subprocess.run(
        [
            TOOLLOOP,
            "run",
            "redo",
            "--model",
            "scripted",
            "--toolset",
            "agents",
            "--follow",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    texts = [
        line
        for line in lines
        if line.startswith("step  1  text ") and "(discarded" not in line
    ]
    assert len(texts) == 2, done.stdout  # the first answer, then the one begun again
    assert texts[0].split("text", 1)[1].strip().startswith("old0 old1")
    note = lines.index(next(line for line in lines if "(discarded" in line))
    assert lines.index(texts[0]) < note < lines.index(texts[1])
    assert (
        texts[1].split("text", 1)[1].strip() == "".join(answer_words(1, WORDS)).strip()
    )
    model = next(i for i, line in enumerate(lines) if line.startswith("step  1  model"))
    assert model > lines.index(texts[1])
    assert any(line.startswith("step  2  text ") for line in lines)


def test_the_async_client_reads_the_same_deltas_and_resumes_after_an_id(
    client: Client, stream_redis: EmbeddedServer
) -> None:
    run_id = client.enqueue(spec("You add numbers.", stream=True))
    client.wait(run_id, timeout=60)
    stored = list(client.events(run_id))

    async def read() -> tuple[list[str], list[str], list[str]]:
        async with AsyncClient(stream_redis.url) as aclient:
            every = [e.id async for e in aclient.events(run_id)]
            after = [e.id async for e in aclient.events(run_id, after=stored[5].id)]
            committed = [e.kind async for e in aclient.events(run_id, deltas=False)]
        return every, after, committed

    every, after, committed = asyncio.run(read())
    assert every == [e.id for e in stored] and after == every[6:]
    assert committed == [e.kind for e in stored if e.committed]

"""A worker killed mid-stream (kill point `stream:write`, workers/process/deltas.py): a reader following the
run sees the killed attempt's deltas, then its `discarded` marker, then the re-run step's deltas, and
the text it is left with is the journal's."""

from __future__ import annotations

import json
from pathlib import Path

import redis

from faults.workerpool import WorkerPool
from tests.integration.runs_kit import spec
from tests.integration.streamer import answer_words, worker_env
from toolloop.embedded import EmbeddedServer
from workers.client import Client
from workers.protocol import keys
from workers.protocol.records import RunEventRecord

WORDS = 80


def shown_text(events: list[RunEventRecord], step: int) -> str:
    """What a page shows of `step`: its deltas, minus those of every attempt marked discarded."""
    text: dict[str, str] = {}
    for event in events:
        if event.committed or event.step != step:
            continue
        if event.kind == "discarded":
            text.pop(event.attempt, None)
        else:
            text[event.attempt] = text.get(event.attempt, "") + event.text
    return "".join(text.values())


def test_a_worker_killed_mid_stream_leaves_a_discard_marker_then_the_rerun_text(
    redis_server: EmbeddedServer, redis_client: redis.Redis, work_dir: Path
) -> None:
    plan = work_dir / "stream-plan.json"
    plan.write_text(
        json.dumps([{"point": "stream:write", "key": "s0/model:1", "write": 3}])
    )
    env = worker_env(WORDS, 10, TOOLLOOP_KILL_PLAN=str(plan))
    with WorkerPool(redis_server.url, work_dir, env, size=1, concurrency=4) as pool:
        client = Client(redis_server.url)
        try:
            run_id = client.enqueue(spec("You add numbers.", stream=True))
            # one reader, across the kill
            seen = list(client.events(run_id, follow=True))
            status = client.wait(run_id, timeout=60)
        finally:
            client.close()
        assert pool.deaths, "the kill point did not fire"
    assert status.status == "done", status
    killed = [e for e in seen if e.kind == "delta" and e.step == 1]
    first = killed[0].attempt
    marks = [i for i, e in enumerate(seen) if e.kind == "discarded"]
    assert [(seen[i].step, seen[i].attempt) for i in marks] == [(1, first)]
    mark = marks[0]
    before = [e for e in seen[:mark] if e.kind == "delta"]
    after = [e for e in seen[mark:] if e.kind == "delta" and e.step == 1]
    # the killed attempt's text, then its marker
    assert before and {e.attempt for e in before} == {first}
    # then the re-run's, under a new attempt
    assert after and first not in {e.attempt for e in after}
    model = next(e for e in seen if e.kind == "model" and e.step == 1)
    assert seen.index(model) > seen.index(after[-1])
    stored = json.loads(
        redis_client.hget(keys.journal(run_id, "s0"), "model:1") or "{}"
    )
    journal_text = stored["value"]["result"]["text"]
    assert (
        shown_text(seen, 1)
        == journal_text
        == model.text
        == "".join(answer_words(1, WORDS))
    )
    # the page did show text it had to drop
    assert "".join(e.text for e in before) != journal_text

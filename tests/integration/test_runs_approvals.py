"""Approvals of durable runs (SPEC 4.4, 4.5) with a real worker: a held call parks the run, the
person's decision (approve, reject, edit) over the control queue resumes it, deadlines expire it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.runs_kit import client_on, eventually, kinds, logged, spec
from toolloop import AlreadyDecidedError, ApprovalError
from workers.client import Client


@pytest.fixture
def client(runs_redis, worker) -> Iterator[Client]:  # type: ignore[no-untyped-def]
    yield from client_on(runs_redis)


def published(worker: Any) -> list[dict[str, Any]]:
    return [line for line in logged(worker.tool_log) if line["tool"] == "publish"]


def parked(client: Client, run_id: str) -> dict[str, Any]:
    status = client.wait(run_id, timeout=20)
    assert status.status == "asked" and status.approvals, status
    [held] = status.approvals
    return held


def test_approve_runs_the_tool_and_the_model_reads_its_result(
    client: Client, worker: Any
) -> None:
    before = len(published(worker))
    run_id = client.enqueue(spec("approve"))
    held = parked(client, run_id)
    assert (held["name"], held["input"], held["estimate_usd"]) == (
        "publish",
        {"a": 2.0, "b": 3.0},
        0.5,
    )
    assert held["input_digest"].startswith("sha256:") and held["deadline"] is None
    assert len(published(worker)) == before  # nothing ran while it waits
    assert (
        client.approve(
            run_id, held["call_id"], digest=held["input_digest"], actor="ana"
        )
        == "resumed"
    )
    status = client.wait(run_id, timeout=20)
    assert status.status == "done", status
    assert status.final_text == "Model read: published 2+3"
    assert len(published(worker)) == before + 1
    assert kinds(client, run_id) == [
        "queued",
        "model",
        "tool",
        "parked",
        "approval_requested",
        "approval_decided",
        "resumed",
        "tool",
        "model",
        "finished",
    ]
    [decided] = [e for e in client.events(run_id) if e.kind == "approval_decided"]
    assert (decided.data["call_id"], decided.data["action"], decided.data["actor"]) == (
        held["call_id"],
        "approve",
        "ana",
    )


def test_reject_answers_the_model_with_the_reason(client: Client, worker: Any) -> None:
    before = len(published(worker))
    run_id = client.enqueue(spec("approve"))
    held = parked(client, run_id)
    client.reject(run_id, held["call_id"], "wrong numbers")
    status = client.wait(run_id, timeout=20)
    assert status.final_text == "Model read: Rejected by the person: wrong numbers.", (
        status
    )
    assert len(published(worker)) == before


def test_edit_runs_with_the_new_input_and_the_model_is_told(
    client: Client, worker: Any
) -> None:
    run_id = client.enqueue(spec("approve"))
    held = parked(client, run_id)
    client.edit(run_id, held["call_id"], {"a": 7, "b": 1})
    status = client.wait(run_id, timeout=20)
    assert status.final_text == (
        'Model read: The person edited the input before the tool ran; it ran with: {"a":7.0,"b":1.0}'
        "published 7+1"
    ), status
    assert published(worker)[-1] == {
        "tool": "publish",
        "ran_with": {"a": 7.0, "b": 1.0},
    }


def test_a_bad_edit_is_refused_with_the_message_and_the_run_still_waits(
    client: Client, worker: Any
) -> None:
    run_id = client.enqueue(spec("approve"))
    held = parked(client, run_id)
    with pytest.raises(ApprovalError, match="Input should be a valid number"):
        client.edit(run_id, held["call_id"], {"a": "seven", "b": 1})
    assert client.wait(run_id, timeout=5).approvals == [held]
    client.approve(run_id, held["call_id"])
    assert client.wait(run_id, timeout=20).final_text == "Model read: published 2+3"


def test_a_stale_digest_is_refused_and_a_duplicate_is_refused(client: Client) -> None:
    run_id = client.enqueue(spec("approve"))
    held = parked(client, run_id)
    with pytest.raises(ApprovalError, match="another input"):
        client.approve(run_id, held["call_id"], digest="sha256:" + "0" * 64)
    assert client.status(run_id).status == "asked"
    with pytest.raises(ApprovalError, match="does not hold call"):
        client.approve(run_id, "toolu_nope")
    assert client.reject(run_id, held["call_id"], "no") == "resumed"
    with pytest.raises(
        AlreadyDecidedError, match=r"decided already \(reject\)"
    ):  # the first one wins
        client.approve(run_id, held["call_id"])
    status = client.wait(run_id, timeout=20)
    assert status.final_text == "Model read: Rejected by the person: no.", status
    assert kinds(client, run_id).count("approval_decided") == 1


def test_a_decision_sent_before_the_run_parks_is_kept_and_used(
    client: Client, worker: Any, tmp_path: Path
) -> None:
    # the run holds at a gate tool before the call is held, until the test opens it
    gate = tmp_path / "open"
    run_id = client.enqueue(spec("approve_gated", str(gate)))
    model = eventually(lambda: [e for e in client.events(run_id) if e.kind == "model"])
    call_id = next(c["id"] for c in model[0].tool_calls if c["name"] == "publish")
    assert client.status(run_id).status in ("queued", "running")
    assert client.edit(run_id, call_id, {"a": 4, "b": 4}, actor="early bird") == "kept"
    gate.touch()
    status = client.wait(run_id, timeout=20)
    assert status.status == "done", status
    assert (status.final_text or "").endswith("published 4+4"), status
    assert published(worker)[-1] == {
        "tool": "publish",
        "ran_with": {"a": 4.0, "b": 4.0},
    }


def test_an_approval_deadline_rejects_by_default_and_a_late_decision_is_refused(
    client: Client,
) -> None:
    run_id = client.enqueue(spec("approve", approval_timeout_s=2))
    held = parked(client, run_id)
    assert held["deadline"] is not None and held["default"] == "reject"
    status = eventually(lambda: (s := client.status(run_id)).finished and s, timeout=15)
    assert (
        status.final_text
        == "Model read: Rejected by the person: no decision before the deadline."
    )
    with pytest.raises(ApprovalError, match="deadline"):
        client.approve(run_id, held["call_id"])
    assert "approval_expired" in kinds(client, run_id)


def test_a_tool_names_its_own_default_and_deadline(client: Client, worker: Any) -> None:
    before = len(published(worker))
    run_id = client.enqueue(spec("approve_yes"))
    held = parked(client, run_id)
    assert held["default"] == "approve"
    status = eventually(lambda: (s := client.status(run_id)).finished and s, timeout=15)
    assert status.final_text == "Model read: published 2+3", status
    assert len(published(worker)) == before + 1


def test_an_ask_deadline_answers_with_ask_default_or_stops_expired(
    client: Client,
) -> None:
    answered = client.enqueue(spec("ask", ask_timeout_s=2, ask_default="(no answer)"))
    stopped = client.enqueue(spec("ask", ask_timeout_s=2))
    status = eventually(
        lambda: (s := client.status(answered)).finished and s, timeout=15
    )
    assert status.final_text == "You said: (no answer)", status
    status = eventually(
        lambda: (s := client.status(stopped)).finished and s, timeout=15
    )
    assert status.status == "expired", status
    events = kinds(client, stopped)
    assert events[-2:] == ["expired", "finished"]
    from toolloop.loop.approvals import DeadlineError

    with pytest.raises(DeadlineError, match="deadline"):
        client.answer(stopped, "too late")


def test_the_cli_shows_pending_approvals_and_decides(
    client: Client, runs_redis: Any, tmp_path: Any
) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env |= {"REDIS_URL": runs_redis.url, "TOOLLOOP_HOME": str(tmp_path)}
    tool = str(Path(sys.executable).parent / "toolloop")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [tool, *args], env=env, capture_output=True, text=True, timeout=60
        )

    run_id = client.enqueue(spec("approve"))
    held = parked(client, run_id)
    shown = cli("status", run_id)
    assert shown.returncode == 0, shown.stderr
    assert f"approval  {held['call_id']}  publish" in shown.stdout
    assert (
        '  input   {"a": 2.0, "b": 3.0}' in shown.stdout
        and held["input_digest"] in shown.stdout
    )
    bad = cli("edit", run_id, held["call_id"], '{"a": "x", "b": 1}')
    assert (
        bad.returncode == 1
        and "Refused:" in bad.stderr
        and "valid number" in bad.stderr
    ), bad
    done = cli("approve", run_id, held["call_id"], "--actor", "cli user")
    assert done.returncode == 0 and "decided; the run goes on" in done.stdout, done
    assert client.wait(run_id, timeout=20).final_text == "Model read: published 2+3"
    events = cli("events", run_id)
    assert "approval decided: approve by cli user" in events.stdout, events.stdout


def test_the_web_example_lists_and_decides_approvals(client: Client) -> None:
    from starlette.testclient import TestClient

    from examples.web import create_app
    from workers.client import AsyncClient

    app = create_app(AsyncClient(client.settings.redis_url), token="t0ken")
    with TestClient(app, headers={"Authorization": "Bearer t0ken"}) as http:
        run_id = client.enqueue(spec("approve"))
        held = parked(client, run_id)
        assert http.get(f"/runs/{run_id}/approvals").json() == {"approvals": [held]}
        base = f"/runs/{run_id}/approvals/{held['call_id']}"
        stale = http.post(f"{base}/approve", json={"digest": "sha256:" + "1" * 64})
        assert stale.status_code == 409 and "another input" in stale.json()["error"]
        bad = http.post(f"{base}/edit", json={"input": {"a": []}})
        assert bad.status_code == 409 and "valid number" in bad.json()["error"]
        assert http.post(f"{base}/maybe").status_code == 404
        done = http.post(
            f"{base}/reject",
            json={"reason": "too big", "actor": "web", "digest": held["input_digest"]},
        )
        assert done.status_code == 200 and done.json() == {"outcome": "resumed"}
    assert (
        client.wait(run_id, timeout=20).final_text
        == "Model read: Rejected by the person: too big."
    )


def test_a_cancel_while_waiting_for_a_decision_ends_the_run_without_running_the_tool(
    client: Client, worker: Any
) -> None:
    before = len(published(worker))
    run_id = client.enqueue(spec("approve"))
    held = parked(client, run_id)
    client.cancel(run_id)
    status = client.wait(run_id, timeout=20)
    assert status.status == "cancel", status
    assert client.history(run_id)[-1].model_dump()["content"] == "Not run: cancel."
    assert len(published(worker)) == before
    with pytest.raises(ApprovalError, match="ended"):
        client.approve(run_id, held["call_id"])


def test_an_ask_answered_in_time_does_not_expire_later(client: Client) -> None:
    run_id = client.enqueue(spec("ask2", ask_timeout_s=2))
    assert client.wait(run_id, timeout=20).ask_deadline is not None
    client.answer(run_id, "in time")
    second = client.wait(run_id, timeout=20)
    assert second.asked == {"question": "Question 2?"}, second
    client.answer(run_id, "also in time")
    status = client.wait(run_id, timeout=20)
    assert status.final_text == "You said: in time, then also in time", status
    assert "expired" not in kinds(client, run_id)


def test_an_approved_call_runs_on_its_tools_own_queue(
    client: Client, runs_redis: Any, tmp_path: Any
) -> None:
    from tests.integration.conftest import start_worker

    run_id = client.enqueue(spec("approve_gpu"))
    held = parked(client, run_id)
    assert client.approve(run_id, held["call_id"]) == "resumed"
    # the decided step waits for a worker of "gpu"
    eventually(lambda: client.redis.llen("gpu") == 1)
    gpu = start_worker(
        runs_redis.url,
        tmp_path,
        {"TOOLLOOP_PROMPT_GEN": "tests.integration.agents:make_generate"},
        "gpu",
    )
    try:
        status = client.wait(run_id, timeout=20)
        assert status.final_text == "Model read: published 2+3", status
    finally:
        gpu.stop()


def test_a_turn_may_hold_several_calls_and_resumes_once_all_are_decided(
    client: Client, worker: Any
) -> None:
    before = len(published(worker))
    run_id = client.enqueue(spec("approve2"))
    status = client.wait(run_id, timeout=20)
    assert status.approvals is not None and [a["input"] for a in status.approvals] == [
        {"a": 1.0, "b": 2.0},
        {"a": 3.0, "b": 4.0},
    ]
    first, second = (a["call_id"] for a in status.approvals)
    assert client.approve(run_id, first) == "recorded"
    # the other call still waits
    assert client.wait(run_id, timeout=5).status == "asked"
    assert client.reject(run_id, second, "one is enough") == "resumed"
    status = client.wait(run_id, timeout=20)
    assert status.final_text == "Model read: Rejected by the person: one is enough.", (
        status
    )
    assert published(worker)[before:] == [
        {"tool": "publish", "ran_with": {"a": 1.0, "b": 2.0}}
    ]


def test_an_early_decision_for_another_input_is_dropped_and_the_call_waits(
    client: Client, tmp_path: Path
) -> None:
    gate = tmp_path / "open"
    run_id = client.enqueue(spec("approve_gated", str(gate)))
    model = eventually(lambda: [e for e in client.events(run_id) if e.kind == "model"])
    call_id = next(c["id"] for c in model[0].tool_calls if c["name"] == "publish")
    assert client.approve(run_id, call_id, digest="sha256:" + "2" * 64) == "kept"
    gate.touch()
    held = parked(client, run_id)
    eventually(lambda: "approval_refused" in kinds(client, run_id))
    assert client.wait(run_id, timeout=5).approvals == [held]  # still waiting
    assert client.approve(run_id, call_id, digest=held["input_digest"]) == "resumed"
    assert client.wait(run_id, timeout=20).final_text == "Model read: published 2+3"


def test_a_late_answer_pinned_to_an_expired_question_is_refused(client: Client) -> None:
    from toolloop.loop.approvals import DeadlineError

    run_id = client.enqueue(spec("ask2", ask_timeout_s=2, ask_default="(nobody)"))
    first = client.wait(run_id, timeout=20)
    second = eventually(
        lambda: (s := client.status(run_id)).segment == 1 and s.status == "asked" and s,
        15,
    )
    assert second.asked == {"question": "Question 2?"}
    with pytest.raises(DeadlineError, match="deadline"):
        client.answer(run_id, "late", segment=first.segment)
    client.answer(run_id, "second")
    assert (
        client.wait(run_id, timeout=20).final_text == "You said: (nobody), then second"
    )

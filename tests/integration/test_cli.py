"""The `toolloop` command through real subprocesses: its errors, the embedded defaults, a full run
driven from the command line (worker, run, status, answer, events), and the demo end to end."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from toolloop.embedded import EmbeddedServer, free_port
from workers.client import Client
from workers.protocol import keys
from workers.protocol.scripts.deltas import DELTA_FLUSH

ROOT = Path(__file__).resolve().parents[2]
TOOLLOOP = str(Path(sys.executable).parent / "toolloop")
POLICY = "tests.integration.cli_policy:policy"
TOOLSET = "review"
REGISTERED = "review=examples.storyboard.tools:REVIEW_TOOLS"
FAIL_ONCE = "Fail once, then answer."
ANSWER = "Keep shot 3; trim shot 5 by a second."


def env_for(tmp_path: Path, redis_url: str | None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("REDIS_URL", "ANTHROPIC_API_KEY", "FAL_KEY")
    }
    env["TOOLLOOP_HOME"] = str(tmp_path / "state")
    if redis_url:
        env["REDIS_URL"] = redis_url
    return env


def toolloop(
    env: dict[str, str], *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TOOLLOOP, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_clean_error(done: subprocess.CompletedProcess[str], first_line: str) -> None:
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stderr.rstrip("\n").splitlines()
    assert len(lines) == 2, done.stderr
    assert first_line in lines[0]
    assert lines[1].startswith("  ")
    assert "Traceback" not in done.stderr


@pytest.fixture
def env(tmp_path: Path, redis_server: EmbeddedServer) -> dict[str, str]:
    return env_for(tmp_path, redis_server.url)


@pytest.mark.parametrize("command", ["status", "events", "answer", "cancel", "retry"])
def test_unknown_run_id(env: dict[str, str], command: str) -> None:
    args = [command, "no-such-run"] + (["yes"] if command == "answer" else [])
    assert_clean_error(toolloop(env, *args), "No run has the id 'no-such-run'.")


def test_malformed_file(env: dict[str, str], tmp_path: Path) -> None:
    bad = tmp_path / "run.json"
    bad.write_text('{"model": "m", "messages": [')
    assert_clean_error(
        toolloop(env, "run", "-f", str(bad)), "is not valid JSON or YAML"
    )


def test_invalid_spec_field(env: dict[str, str]) -> None:
    done = toolloop(
        env, "run", "Hi", "--model", "m", "--toolset", "review", "--max-steps", "0"
    )
    assert_clean_error(done, "max_steps")


@pytest.mark.parametrize(
    ("flags", "first_line"),
    [
        (["--provider", "nosuch"], "'nosuch' is not a provider"),
        (["--fallback", "anthropic,nosuch"], "'nosuch' is not a provider"),
        (["--keep-images", "-2"], "keep_images"),
    ],
)
def test_bad_provider_or_keep_images_are_refused_at_enqueue(
    env: dict[str, str], redis_client: redis.Redis, flags: list[str], first_line: str
) -> None:
    before = redis_client.zcard("tl:runs:all")
    done = toolloop(env, "run", "Hi", "--model", "m", "--toolset", "review", *flags)
    assert_clean_error(done, first_line)
    assert redis_client.zcard("tl:runs:all") == before  # nothing enqueued


def test_doctor_warns_about_redis_and_fails_on_a_broken_toolset(
    env: dict[str, str], tmp_path: Path
) -> None:
    served = {**env, "TOOLLOOP_TOOLSETS": REGISTERED}
    done = toolloop(served, "doctor")
    assert done.returncode == 0, done.stdout + done.stderr
    # the test server runs without one
    assert "warn  Redis has no maxmemory" in done.stdout
    assert "ok    AOF on" in done.stdout
    assert (
        "ok    toolset 'review' = examples.storyboard.tools:REVIEW_TOOLS (list_shots"
        in done.stdout
    )
    broken = toolloop(
        {
            **env,
            "TOOLLOOP_TOOLSETS": f"{REGISTERED},broken=tests.integration.nowhere:TOOLS",
        },
        "doctor",
    )
    assert (
        broken.returncode == 1
        and "error toolset 'broken': Cannot import" in broken.stdout
    ), broken.stdout
    gone = toolloop(
        {**served, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}, "doctor"
    )
    assert gone.returncode == 1 and gone.stdout.startswith(
        "error Redis at redis://127.0.0.1:"
    ), gone.stdout


def test_redis_unreachable(tmp_path: Path) -> None:
    env = env_for(tmp_path, f"redis://127.0.0.1:{free_port()}/0")
    started = time.monotonic()
    assert_clean_error(
        toolloop(env, "status", "some-run"), "Cannot reach Redis at redis://127.0.0.1:"
    )
    assert time.monotonic() - started < 20


@pytest.mark.parametrize(
    ("toolset", "first_line"),
    [
        (None, "The run has no toolset."),
        (
            "examples.storyboard.tools:REVIEW_TOOLS",
            "is not registered; the registered toolsets are",
        ),
        ("nope", "The toolset 'nope' is not registered"),
    ],
)
def test_bad_toolset_enqueues_nothing(
    env: dict[str, str], redis_client: redis.Redis, toolset: str | None, first_line: str
) -> None:
    before = set(redis_client.keys())
    args = ["run", "Hi", "--model", "m"] + (["--toolset", toolset] if toolset else [])
    assert_clean_error(toolloop(env, *args), first_line)
    # no new key (old ones may expire meanwhile)
    assert set(redis_client.keys()) - before == set()


def test_sim_bad_script_is_two_lines(env: dict[str, str], tmp_path: Path) -> None:
    done = toolloop(
        env, "sim", "--port", "0", "--script", str(tmp_path / "missing.yaml")
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "Cannot read the script" in done.stderr


def test_embedded_server_is_started_reused_and_stopped(tmp_path: Path) -> None:
    env = env_for(tmp_path, None)
    first = json.loads(toolloop(env, "up").stdout)
    try:
        second = json.loads(toolloop(env, "up").stdout)
        assert first["source"] == "embedded, started" and second["source"] == "embedded"
        assert first["url"] == second["url"] and first["pid"] == second["pid"]
        assert first["url"] != "redis://127.0.0.1:6379/0"
        assert (tmp_path / "state" / "redis" / "appendonlydir").exists()  # AOF is on
        queued = toolloop(
            env, "run", "Hi", "--model", "claude-sonnet-5-5", "--toolset", TOOLSET
        )
        run_id = queued.stdout.splitlines()[0]  # no worker: it stays queued
    finally:
        down = toolloop(env, "down")
    assert down.stdout.strip() == f"Stopped the embedded Redis (pid {first['pid']})."
    assert not (tmp_path / "state" / "redis" / "server.json").exists()
    # the next command starts it again from its AOF files: the run is still there
    status = toolloop(env, "status", run_id, "--json")
    try:
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["status"] == "queued"
    finally:
        toolloop(env, "down")
    # a `run` that starts the server prints the run id alone on stdout (RUN_ID=$(toolloop run ...))
    started = toolloop(
        env, "run", "Hi", "--model", "claude-sonnet-4-5", "--toolset", TOOLSET
    )
    try:
        assert started.returncode == 0 and len(started.stdout.split()) == 1, (
            started.stdout
        )
        assert "Started the embedded Redis" in started.stderr
    finally:
        toolloop(env, "down")


@pytest.mark.slow
def test_a_run_from_the_command_line(env: dict[str, str], tmp_path: Path) -> None:
    log = (tmp_path / "worker.log").open("wb")
    unregistered = {k: v for k, v in env.items() if k != "TOOLLOOP_TOOLSETS"}
    worker = subprocess.Popen(  # the worker's toolsets from its flag, the run's names from the env
        [
            TOOLLOOP,
            "worker",
            "-c",
            "4",
            "-l",
            "WARNING",
            "--sim-policy",
            POLICY,
            "--toolsets",
            REGISTERED,
        ],
        cwd=ROOT,
        env=unregistered,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        done = toolloop(
            {**unregistered, "TOOLLOOP_TOOLSETS": REGISTERED},
            "run",
            "-f",
            "examples/storyboard/run.yaml",
        )
        assert done.returncode == 0, done.stderr
        run_id = done.stdout.splitlines()[0]
        client = Client(env["REDIS_URL"])
        client.wait(run_id, timeout=60)  # until it parks on its question
        client.close()
        status = json.loads(toolloop(env, "status", run_id, "--json").stdout)
        assert status["status"] == "asked", (tmp_path / "worker.log").read_text()[
            -2000:
        ]
        assert "Shot 3" in status["asked"]["question"]
        assert toolloop(env, "answer", run_id, ANSWER).returncode == 0
        events = toolloop(env, "events", run_id, "--follow", timeout=90)
        assert events.returncode == 0, events.stderr
        lines = events.stdout.splitlines()
        assert lines[0].startswith("run      queued (model claude-sonnet-5-5")
        assert (
            "step  2  model" in events.stdout
            and "→ read_frame(shot=3), read_frame(shot=5)" in events.stdout
        )
        assert any(
            line.startswith("step  3  tool   render_preview   $0.0055")
            for line in lines
        )
        assert lines[-1] == "run      finished: done"
        final = json.loads(toolloop(env, "status", run_id, "--json").stdout)
        assert final["status"] == "done" and ANSWER in final["final_text"]

        # a run that fails (the provider refuses its first request), then is retried from its journal
        failing = toolloop(
            env,
            "run",
            FAIL_ONCE,
            "--model",
            "claude-sonnet-5-5",
            "--toolset",
            TOOLSET,
            "--follow",
            timeout=90,
        )
        assert failing.returncode == 1, failing.stdout + failing.stderr
        assert failing.stdout.splitlines()[-1].startswith(
            "run      failed: PromptGenUnavailableError"
        )
        failed_id = failing.stdout.splitlines()[0]
        assert (
            toolloop(env, "retry", failed_id).stdout.strip() == f"Retrying {failed_id}."
        )
        retried = toolloop(env, "events", failed_id, "--follow", timeout=90)
        assert retried.returncode == 0, retried.stdout + retried.stderr
        assert retried.stdout.splitlines()[-1] == "run      finished: done", (
            retried.stdout
        )
        requeued = [
            line
            for line in retried.stdout.splitlines()
            if line.startswith("run      queued")
        ]
        # the retry's names model and toolset
        assert len(requeued) == 2 and requeued[0] == requeued[1]
        assert "None" not in requeued[1] and "toolset review" in requeued[1], requeued
        # a reader that stops early: no BrokenPipeError, no traceback
        piped = subprocess.run(
            f"'{TOOLLOOP}' events {run_id} | head -1",
            shell=True,
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert piped.stdout.startswith("run      queued") and piped.stderr == "", (
            piped.stderr
        )
        ended = toolloop(env, "answer", run_id, "Again.")
        assert_clean_error(
            ended, f"Run {run_id!r} has ended (done); it takes no answer."
        )
        assert_clean_error(
            toolloop(env, "cancel", run_id),
            "has ended (done); there is nothing to cancel",
        )
        assert json.loads(toolloop(env, "status", failed_id, "--json").stdout)[
            "final_text"
        ] == ("Answered after a retry.")
    finally:
        # the command forwards it to its Celery worker
        os.kill(worker.pid, signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        finally:
            if worker.poll() is None:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait(timeout=10)
            log.close()
    assert "the worker talks to the simulator" in (tmp_path / "worker.log").read_text()


def _late_delta(redis_url: str, run_id: str, text: str) -> None:
    """Write one more delta of the run's last streamed step, as the worker's DELTA_FLUSH does with
    that step's fencing token: what Redis runs when the worker's delta batch, sent on one pooled
    connection, is run after the step's commit, sent on another (docs/streaming.md)."""
    client = Client(redis_url)
    last = [e for e in client.events(run_id) if e.kind == "delta"][-1]
    client.close()
    # the delta's own fields (extra)
    segment, step, attempt = (
        last.segment,
        last.step,
        last.attempt,
    )
    raw = redis.Redis.from_url(redis_url, decode_responses=True)
    r = run_id
    written = raw.eval(
        DELTA_FLUSH,
        3,
        keys.state(r),
        keys.fence(r),
        keys.events(r),
        attempt.split(".")[0],
        attempt,
        segment,
        step,
        text,
        "",
    )
    raw.close()
    assert written == 1


def _numbers(out: str, kind: str) -> list[int]:
    return [
        int(m.group(1))
        for m in re.finditer(rf"^step +(\d+)  {kind}", out, re.MULTILINE)
    ]


def test_a_streamed_steps_text_and_model_lines_have_one_number(
    env: dict[str, str], tmp_path: Path
) -> None:
    """`toolloop events` numbers a step's text line as its model line, across the run's segments
    (after an answer) and in a retried run, whatever order their entries arrive in."""
    log = (tmp_path / "worker.log").open("wb")
    worker = subprocess.Popen(
        [TOOLLOOP, "worker", "-c", "4", "-l", "WARNING", "--sim-policy", POLICY],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        # two segments: four steps, the question, then the step after the answer
        started = toolloop(
            env,
            "run",
            "Review the cut.",
            "--model",
            "claude-sonnet-5-5",
            "--toolset",
            TOOLSET,
            "--stream",
        )
        run_id = started.stdout.strip()
        client = Client(env["REDIS_URL"])
        asked = client.wait(run_id, timeout=60).status
        assert asked == "asked", (tmp_path / "worker.log").read_text()[-2000:]
        assert toolloop(env, "answer", run_id, ANSWER).returncode == 0
        assert client.wait(run_id, timeout=60).status == "done"
        # a run that fails at its first step, retried (its step runs again, streamed)
        failing = toolloop(
            env,
            "run",
            FAIL_ONCE,
            "--model",
            "claude-sonnet-5-5",
            "--toolset",
            TOOLSET,
            "--follow",
            timeout=90,
        )
        failed_id = failing.stdout.splitlines()[0]
        assert toolloop(env, "retry", failed_id).returncode == 0
        assert client.wait(failed_id, timeout=60).status == "done"
        client.close()
        for run, steps in ((run_id, [1, 2, 3, 4, 5]), (failed_id, [1])):
            _late_delta(env["REDIS_URL"], run, " (late)")
            out = toolloop(env, "events", run).stdout
            assert _numbers(out, "model") == steps, out
            assert sorted(set(_numbers(out, "text "))) == steps, out
            late = next(line for line in out.splitlines() if line.endswith(" (late)"))
            assert late.startswith(f"step {steps[-1]:>2}  text"), out
    finally:
        os.kill(worker.pid, signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        finally:
            if worker.poll() is None:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait(timeout=10)
            log.close()


def test_a_bad_toolsets_flag_is_refused_before_anything_starts(tmp_path: Path) -> None:
    env = env_for(tmp_path, None)
    done = toolloop(env, "worker", "--toolsets", "review=os")
    assert_clean_error(
        done, "--toolsets has the entry 'review=os', which is not name=pkg.module:NAME"
    )
    assert not (
        tmp_path / "state" / "redis" / "server.json"
    ).exists()  # no Redis was started


def test_demo_end_to_end_on_embedded_defaults(tmp_path: Path) -> None:
    env = env_for(tmp_path, None)
    env.pop("TOOLLOOP_TOOLSETS")  # the demo registers its own toolset
    done = toolloop(env, "demo", "--answer", ANSWER, timeout=150)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "redis    embedded server started at redis://127.0.0.1:" in out
    assert "asked    Shot 3 is the hero's entrance" in out
    assert f"answer   {ANSWER}" in out
    assert f'final    You said: "{ANSWER}"' in out
    assert "spent    $0.0" in out and "in 5 model calls (done)" in out
    cache = next(line for line in out.splitlines() if line.startswith("cache"))
    assert "read from cache" in cache and "saving $0.0" in cache
    # it stopped what it started: the embedded server and the worker
    assert not (tmp_path / "state" / "redis" / "server.json").exists()
    worker_pid = int(out.split("celery worker pid ")[1].split()[0])
    with pytest.raises(ProcessLookupError):
        os.kill(worker_pid, 0)
    assert toolloop(env, "down").stdout.strip() == "No embedded Redis was running here."


def test_demo_without_an_answer_or_a_terminal_stops_cleanly(tmp_path: Path) -> None:
    env = env_for(tmp_path, None)
    done = subprocess.run(
        [TOOLLOOP, "demo"],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert_clean_error(done, "The agent asked a question and stdin is not a terminal.")
    assert not (tmp_path / "state" / "redis" / "server.json").exists()
    worker_pid = int(done.stdout.split("celery worker pid ")[1].split()[0])
    with pytest.raises(ProcessLookupError):
        os.kill(worker_pid, 0)


def test_accounts_sets_a_limit_and_shows_spend(env: dict[str, str]) -> None:
    done = toolloop(env, "accounts", "--set", "cli-tenant", "5", "--period", "month")
    assert done.returncode == 0, done.stderr
    assert (
        "cli-tenant" in done.stdout
        and "month" in done.stdout
        and "5.0000" in done.stdout
    )
    listed = toolloop(env, "accounts", "--json")
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    mine = [row for row in rows if row["name"] == "cli-tenant"]
    assert mine == [
        {
            "name": "cli-tenant",
            "limit_usd": 5.0,
            "period": "month",
            "finish_at": 0.9,
            "spent_usd": 0.0,
            "reserved_usd": 0.0,
        }
    ]
    bad = toolloop(env, "accounts", "--set", "cli-tenant", "-1")
    assert bad.returncode == 1 and "must be a finite number more than 0" in bad.stderr

"""The `toolloop` command over two real Redis shards (TOOLLOOP_REDIS_SHARDS, no REDIS_URL), each with a
real worker: `run` puts each run on one shard, and `status`, `events`, `answer`, `approve`,
`decision`, `cancel`, `retry`, `list`, `prune` and `accounts` reach the run's shard or every shard,
as `workers.client.shards.ShardedClient` routes them. Most calls go through `toolloop.cli.main` in this
process (the command's own code, without a second interpreter's start-up per call); one runs the
installed command as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.integration.conftest import Worker, own_redis, worker_on
from tests.integration.runs_kit import spec
from toolloop.cli import main
from toolloop.embedded import EmbeddedServer, free_port
from workers.client.shards import shard_of

pytestmark = pytest.mark.integration

TOOLLOOP = str(Path(sys.executable).parent / "toolloop")


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[EmbeddedServer]]:
    first, second = (
        own_redis(tmp_path_factory, "cli-shard-0"),
        own_redis(tmp_path_factory, "cli-shard-1"),
    )
    yield [next(first), next(second)]
    for server in (first, second):
        next(server, None)


@pytest.fixture(scope="module")
def workers(
    shards: list[EmbeddedServer], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[Worker]]:
    env = {"TOOLLOOP_PROMPT_GEN": "tests.integration.agents:make_generate"}
    made = [
        worker_on(s.url, tmp_path_factory.mktemp(f"cli-shard-worker-{i}"), env)
        for i, s in enumerate(shards)
    ]
    yield [next(w) for w in made]
    for w in made:
        next(w, None)


@pytest.fixture
def sharded(
    shards: list[EmbeddedServer], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> str:
    value = ",".join(s.url for s in shards)
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.setenv("TOOLLOOP_REDIS_SHARDS", value)
    # no embedded Redis is started
    monkeypatch.setenv("TOOLLOOP_HOME", str(tmp_path / "state"))
    return value


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def key_on(shard: int, name: str) -> str:
    """An idempotency key that ShardedClient places on `shard` of 2 (crc32(key) % 2)."""
    return next(
        f"{name}-{i}"
        for i in range(100)
        if zlib.crc32(f"{name}-{i}".encode()) % 2 == shard
    )


def enqueue(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    system: str,
    user: str,
    shard: int,
) -> str:
    path = tmp_path / f"{system}-{shard}.json"
    path.write_text(json.dumps(spec(system, user)))
    code, out, err = cli(
        capsys,
        "run",
        "-f",
        str(path),
        "--idempotency-key",
        key_on(shard, f"{system}{user}"),
    )
    assert code == 0, err
    run_id = out.strip()
    assert shard_of(run_id, 2) == shard
    return run_id


def keys_of(server: EmbeddedServer, run_id: str) -> list[bytes]:
    client = redis.Redis.from_url(server.url)
    try:
        return list(client.scan_iter(match=f"*{{{run_id}}}*", count=1000))
    finally:
        client.close()


def test_every_run_command_reaches_the_runs_shard(
    shards: list[EmbeddedServer],
    workers: list[Worker],
    sharded: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    added = [
        enqueue(capsys, tmp_path, "tools", "Add 20 and 22.", shard) for shard in (0, 1)
    ]
    asked = enqueue(capsys, tmp_path, "ask", "Pick one.", 1)
    held = enqueue(capsys, tmp_path, "approve", "Publish it.", 1)
    assert added[1].startswith("s1-") and not added[0].startswith("s")
    for run_id in (*added, asked, held):  # each run's keys on its own shard only
        here = [bool(keys_of(server, run_id)) for server in shards]
        assert here == [shard_of(run_id, 2) == 0, shard_of(run_id, 2) == 1], (
            run_id,
            here,
        )

    for run_id in added:
        code, out, err = cli(capsys, "status", run_id, "--wait", "--json")
        assert code == 0, err
        assert (
            json.loads(out)["status"] == "done"
            and json.loads(out)["final_text"] == "The sum is 42."
        )
    code, out, _ = cli(capsys, "events", added[1], "--json")
    assert code == 0 and json.loads(out.splitlines()[-1])["kind"] == "finished"

    code, out, err = cli(capsys, "status", asked, "--wait", "--json")
    assert code == 0 and json.loads(out)["status"] == "asked", err
    assert cli(capsys, "answer", asked, "shot 3")[:2] == (0, f"Answered {asked}.\n")
    code, out, err = cli(capsys, "status", asked, "--wait", "--json")
    assert json.loads(out)["final_text"] == "You said: shot 3", err

    code, out, err = cli(capsys, "status", held, "--wait", "--calls")
    assert code == 0 and out.strip(), err
    call = out.split()[0]
    code, out, err = cli(capsys, "approve", held, call)
    assert code == 0 and out.startswith(f"approve {call}: "), err
    code, out, err = cli(capsys, "status", held, "--wait", "--json")
    assert json.loads(out)["status"] == "done", err
    code, out, err = cli(capsys, "decision", held, call, "--json")
    assert code == 0 and json.loads(out)["state"] == "decided", err

    # a command that needs a run in another state: the refusal comes from the run's shard, not "no run"
    code, _, err = cli(capsys, "retry", added[1])
    assert (
        code == 1
        and f"Run {added[1]!r} is 'done'; only a failed run can be retried." in err
    )
    cancelled = enqueue(capsys, tmp_path, "ask", "Cancel me.", 1)
    cli(capsys, "status", cancelled, "--wait")
    assert cli(capsys, "cancel", cancelled)[:2] == (
        0,
        f"Cancel requested for {cancelled}.\n",
    )
    code, out, _ = cli(capsys, "status", cancelled, "--wait", "--json")
    assert json.loads(out)["status"] == "cancel"

    made = [*added, asked, held, cancelled]
    code, out, _ = cli(capsys, "list", "--json", "-n", "100")
    listed = [json.loads(line)["run_id"] for line in out.splitlines()[:-1]]
    assert sorted(listed) == sorted(made) and len(listed) == len(set(listed))
    created = {
        json.loads(line)["run_id"]: json.loads(line)["created_at"]
        for line in out.splitlines()[:-1]
    }
    # newest first
    assert [created[r] for r in listed] == sorted(created.values(), reverse=True)
    # a page of 3 of 5, and the cursor to the rest
    code, out, _ = cli(capsys, "list", "-n", "3")
    assert out.splitlines()[-1].startswith("more: toolloop list --cursor ")
    cursor = out.splitlines()[-1].split("'")[1]
    code, rest, _ = cli(capsys, "list", "--json", "--cursor", cursor)
    assert [json.loads(line)["run_id"] for line in rest.splitlines()[:-1]] == listed[3:]

    code, out, err = cli(capsys, "accounts", "--set", "team", "5", "--json")
    assert code == 0, err
    assert sorted(json.loads(line)["shard"] for line in out.splitlines()) == [0, 1]
    code, out, _ = cli(capsys, "prune", "--older-than", "1d")
    assert out.splitlines() == [
        f"Shard {i}: Deleted 0 finished runs; dropped 0 expired runs from the index."
        for i in (0, 1)
    ]

    # the installed command, as a user runs it: the same shards from the environment
    done = subprocess.run(
        [TOOLLOOP, "status", added[1]],
        env={**os.environ},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "The sum is 42." in done.stdout, done.stderr


def test_sharded_commands_refuse_bad_shards_in_two_lines(
    shards: list[EmbeddedServer],
    sharded: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, _, err = cli(capsys, "status", "s7-" + "0" * 32)
    assert code == 1 and err.splitlines()[0].startswith(
        f"Run 's7-{'0' * 32}' lives on shard 7, and 2 shards"
    )
    assert len(err.splitlines()) == 2 and err.splitlines()[1].startswith("  ")
    code, _, err = cli(capsys, "status", "0" * 32)
    assert code == 1 and err.splitlines()[0] == f"No run has the id '{'0' * 32}'."

    monkeypatch.setenv(
        "TOOLLOOP_REDIS_SHARDS", f"{shards[0].url},redis://127.0.0.1:{free_port()}/0"
    )
    code, _, err = cli(capsys, "list")
    assert code == 1 and err.startswith(
        "Cannot reach shard 1 of TOOLLOOP_REDIS_SHARDS at redis://127.0.0.1:"
    )
    assert len(err.splitlines()) == 2
    monkeypatch.setenv("TOOLLOOP_REDIS_SHARDS", "redis://a:6379/0,http://b/0")
    code, _, err = cli(capsys, "list")
    assert code == 1 and err.startswith(
        "TOOLLOOP_REDIS_SHARDS: REDIS_URL 'http://b/0' has the scheme 'http'"
    )
    code, _, err = cli(capsys, "worker")
    assert code == 1 and err.startswith(
        "TOOLLOOP_REDIS_SHARDS is set and REDIS_URL is not: a worker serves"
    )

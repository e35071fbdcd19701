"""What `Client.enqueue` refuses and how it fails, against a real Redis (no worker: nothing here
needs one to run): the limits (message count, spec size, image size), the idempotency key (the same
key twice is one run), and a Redis out of memory (a clear error that quotes no prompt text, nothing
half-written, and the same key works once memory is freed)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import redis_in
from tests.integration.runs_kit import client_on, spec
from toolloop.embedded import EmbeddedServer, free_port
from workers.client import Client
from workers.protocol import keys
from workers.protocol.errors import EnqueueError, LimitError

pytestmark = pytest.mark.integration

SECRET_PROMPT = "Confidential: the merger with Initech closes Friday; tell nobody."


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedServer]:
    yield from redis_in(tmp_path / "redis")


@pytest.fixture
def client(server: EmbeddedServer) -> Iterator[Client]:
    yield from client_on(server)


def test_specs_over_a_limit_are_refused_and_store_nothing(
    client: Client, tmp_path: Path
) -> None:
    many = [{"role": "user", "content": "hi"}] * 1001
    big_text = "x" * 1_000_001
    image = tmp_path / "big.png"
    image.write_bytes(b"0" * 5_000_001)
    picture = [
        {"type": "image", "path": str(image), "mime_type": "image/png", "hash": "ab"}
    ]
    text = [{"role": "user", "content": big_text}]
    pictured = [{"role": "user", "content": picture}]
    cases = [
        (
            {"messages": many},
            "1001 messages; the limit is 1000",
            "TOOLLOOP_MAX_MESSAGES",
        ),
        ({"messages": text}, "the limit is 1,000,000", "TOOLLOOP_MAX_SPEC_BYTES"),
        (
            {"messages": pictured},
            "'big.png' is 5,000,001 bytes",
            "TOOLLOOP_MAX_IMAGE_BYTES",
        ),
    ]
    for change, says, setting in cases:
        with pytest.raises(LimitError) as caught:
            client.enqueue({**spec("tools"), **change})
        first, second = str(caught.value).splitlines()
        assert says in first and setting in second and caught.value.setting == setting
    assert client.redis.dbsize() == 0


def test_the_same_idempotency_key_makes_one_run(client: Client) -> None:
    first = client.enqueue(
        spec("tools", "Add 2 and 3.", toolset="agents"), idempotency_key="order-7"
    )
    again = client.enqueue(
        spec("tools", "Something else.", toolset="agents"), idempotency_key="order-7"
    )
    other = client.enqueue(
        spec("tools", "Add 2 and 3.", toolset="agents"), idempotency_key="order-8"
    )
    assert first == again != other
    assert client.redis.zcard(keys.LIVE_RUNS) == 2
    assert [e.kind for e in client.events(first)] == ["queued"]  # stored once
    assert client.history(first)[0].content == "Add 2 and 3."  # the first spec wins


def test_out_of_memory_is_a_clear_error_with_no_prompt_and_nothing_half_written(
    client: Client,
) -> None:
    client.redis.config_set("maxmemory-policy", "noeviction")
    client.redis.config_set("maxmemory", "1")  # every write is refused
    try:
        for key in (None, "order-9"):
            with pytest.raises(EnqueueError) as caught:
                client.enqueue(
                    spec("tools", SECRET_PROMPT, toolset="agents"), idempotency_key=key
                )
            message = str(caught.value)
            assert (
                "out of memory" in message.splitlines()[0]
                and "nothing was stored" in message
            )
            assert message.splitlines()[1].startswith("  Free memory in Redis")
            assert SECRET_PROMPT[:20] not in message and "Confidential" not in repr(
                caught.value.args
            )
            assert caught.value.__cause__ is None and caught.value.stored is False
        assert client.redis.dbsize() == 0, "a refused enqueue left keys behind"
    finally:
        client.redis.config_set("maxmemory", "0")
    run_id = client.enqueue(
        spec("tools", SECRET_PROMPT, toolset="agents"), idempotency_key="order-9"
    )
    assert (
        client.enqueue(
            spec("tools", SECRET_PROMPT, toolset="agents"), idempotency_key="order-9"
        )
        == run_id
    )
    assert (
        client.redis.zcard(keys.LIVE_RUNS) == 1
        and client.status(run_id).status == "queued"
    )


def test_enqueue_many_under_out_of_memory_stores_nothing_and_says_so(
    client: Client,
) -> None:
    client.redis.config_set("maxmemory-policy", "noeviction")
    client.redis.config_set("maxmemory", "1")
    try:
        with pytest.raises(EnqueueError) as caught:
            client.enqueue_many(
                [spec("tools", SECRET_PROMPT), spec("tools", "Add 1 and 1.")]
            )
        first, second = str(caught.value).splitlines()
        assert (
            "out of memory" in first
            and second.startswith("  Free memory")
            and caught.value.stored is False
        )
        assert "Confidential" not in str(caught.value)
        assert client.redis.dbsize() == 0
    finally:
        client.redis.config_set("maxmemory", "0")
    assert len(set(client.enqueue_many([spec("tools"), spec("tools")]))) == 2


def test_a_lost_connection_is_a_clear_error_that_says_a_keyed_retry_is_safe() -> None:
    nobody = Client(f"redis://127.0.0.1:{free_port()}/0")
    try:
        for key, advice in (
            (None, "pass idempotency_key="),
            ("order-10", "with the same idempotency key"),
        ):
            with pytest.raises(EnqueueError) as caught:
                nobody.enqueue(
                    spec("tools", SECRET_PROMPT, toolset="agents"), idempotency_key=key
                )
            first, second = str(caught.value).splitlines()
            assert first.startswith(
                "Lost the connection to Redis while enqueueing (ConnectionError)"
            )
            assert advice in second and caught.value.stored is None
            assert "Confidential" not in str(caught.value)
        with pytest.raises(EnqueueError) as caught:
            nobody.enqueue_many(
                [spec("tools", SECRET_PROMPT, toolset="agents")],
                idempotency_keys=["k-1"],
            )
        assert caught.value.stored is None and "with the same idempotency key" in str(
            caught.value
        )
    finally:
        nobody.close()

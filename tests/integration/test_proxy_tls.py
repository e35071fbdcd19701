"""Proxies and private CAs on every HTTP path of the providers (toolloop/http/network.py): a
real forward proxy (Debian's tinyproxy) in front of the simulator served over TLS with a
certificate of a CA made here (openssl). HTTPS_PROXY sends each call through a CONNECT tunnel (the
proxy's log names it), SSL_CERT_FILE makes the private CA trusted, NO_PROXY covering the host goes
direct; the same set in code per provider (`Network(proxy=..., verify=...)`). Both HTTP clients,
both wires, and a durable run on a real worker.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import sim_env, start_worker
from tests.integration.runs_kit import client_on, spec
from tests.support.proxy import Tinyproxy, certificates
from toolloop import PromptGenError, PromptGenRequest, UserMessage
from toolloop.abort import NEVER_ABORTED
from toolloop.embedded import EmbeddedServer
from toolloop.http import HttpClient, HttpxClient, KeepAliveClient, Network
from toolloop.providers import AnthropicHandler, FalHandler, RetryPolicy
from toolloop.sim import SimServer
from workers.client import Client

ONCE = RetryPolicy(attempts=1)
REQUEST = PromptGenRequest(
    model="claude-sonnet-5-5", messages=[UserMessage(content="Add 20 and 22.")]
)
SCRIPT = [
    {"text": "Adding.", "tool_calls": [{"name": "add", "input": {"a": 20, "b": 22}}]},
    {"text": "It is 42."},
]
PROXY_VARIABLES = (
    "HTTPS_PROXY",
    "HTTP_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
)

if shutil.which("tinyproxy") is None or shutil.which("openssl") is None:
    pytest.fail(
        "tinyproxy or openssl is not installed: apt-get install -y tinyproxy openssl (.ci/run does)"
    )


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return certificates(tmp_path_factory.mktemp("ca"))


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tinyproxy]:
    with Tinyproxy(tmp_path_factory.mktemp("tinyproxy")) as running:
        yield running


@pytest.fixture(scope="module")
def sim(ca: Path) -> Iterator[SimServer]:
    with SimServer(
        SCRIPT,
        ssl_certfile=ca.parent / "server.pem",
        ssl_keyfile=ca.parent / "server.key",
    ) as server:
        yield server


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    return monkeypatch


def target(sim: SimServer) -> str:
    return f"127.0.0.1:{sim.port}"


def handlers(sim: SimServer, client: HttpClient) -> list[AnthropicHandler | FalHandler]:
    return [
        AnthropicHandler(
            "sk-ant-FAKE", base_url=sim.base_url, retry=ONCE, http_client=client
        ),
        FalHandler("fal-FAKE", run_url=sim.base_url, retry=ONCE, http_client=client),
    ]


@pytest.mark.parametrize("kind", ["keep-alive", "httpx"])
@pytest.mark.timeout(30)
async def test_https_proxy_and_ssl_cert_file_from_the_environment(
    kind: str, sim: SimServer, proxy: Tinyproxy, ca: Path, clean_env: pytest.MonkeyPatch
) -> None:
    clean_env.setenv("HTTPS_PROXY", proxy.url)
    clean_env.setenv("SSL_CERT_FILE", str(ca))
    client: HttpClient = KeepAliveClient() if kind == "keep-alive" else HttpxClient()
    before = proxy.connects(target(sim))
    try:
        for handler in handlers(sim, client):
            assert (await handler.execute(REQUEST, NEVER_ABORTED)).text == "Adding."
    finally:
        await client.aclose()
    tunnels = proxy.connects(target(sim)) - before
    # keep-alive: one tunnel kept
    assert tunnels == (1 if kind == "keep-alive" else 2), proxy.text()[-2000:]

    # the host is covered: straight to it
    clean_env.setenv("NO_PROXY", "localhost,127.0.0.1")
    client = KeepAliveClient() if kind == "keep-alive" else HttpxClient()
    try:
        for handler in handlers(sim, client):
            assert (await handler.execute(REQUEST, NEVER_ABORTED)).text == "Adding."
    finally:
        await client.aclose()
    assert proxy.connects(target(sim)) - before == tunnels


@pytest.mark.parametrize("kind", ["keep-alive", "httpx"])
@pytest.mark.timeout(30)
async def test_a_private_ca_is_needed_and_a_proxy_can_be_set_per_provider_in_code(
    kind: str, sim: SimServer, proxy: Tinyproxy, ca: Path, clean_env: pytest.MonkeyPatch
) -> None:
    untrusted: HttpClient = KeepAliveClient() if kind == "keep-alive" else HttpxClient()
    with pytest.raises(PromptGenError, match="CERTIFICATE_VERIFY_FAILED"):
        await handlers(sim, untrusted)[0].execute(REQUEST, NEVER_ABORTED)
    await untrusted.aclose()
    # ignored: the code's network wins
    clean_env.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    mine = Network(proxy=proxy.url, verify=str(ca), trust_env=False)
    client: HttpClient = (
        KeepAliveClient(network=mine)
        if kind == "keep-alive"
        else HttpxClient(network=mine)
    )
    before = proxy.connects(target(sim))
    try:
        assert (
            await handlers(sim, client)[1].execute(REQUEST, NEVER_ABORTED)
        ).text == "Adding."
    finally:
        await client.aclose()
    assert proxy.connects(target(sim)) == before + 1


@pytest.fixture
def client(sim_redis: EmbeddedServer) -> Iterator[Client]:
    yield from client_on(sim_redis)


@pytest.mark.parametrize("direct", [False, True], ids=["through the proxy", "NO_PROXY"])
@pytest.mark.timeout(90)
def test_a_durable_run_reaches_the_tls_simulator_through_the_proxy(
    direct: bool,
    sim_redis: EmbeddedServer,
    sim: SimServer,
    proxy: Tinyproxy,
    ca: Path,
    client: Client,
    tmp_path: Path,
) -> None:
    no_proxy = "127.0.0.1" if direct else ""
    variables = {
        "HTTPS_PROXY": proxy.url,
        "SSL_CERT_FILE": str(ca),
        "NO_PROXY": no_proxy,
    }
    env = sim_env(
        sim, **variables, **{name.lower(): value for name, value in variables.items()}
    )
    before = proxy.connects(target(sim))
    worker = start_worker(sim_redis.url, tmp_path, env)
    try:
        run_id = client.enqueue(
            spec("You add numbers.", model="claude-sonnet-5-5", provider="anthropic")
        )
        status = client.wait(run_id, timeout=30)
    finally:
        worker.stop()
    assert status.status == "done", status
    assert status.final_text == "It is 42."
    assert proxy.connects(target(sim)) - before == (0 if direct else 1), proxy.text()[
        -2000:
    ]

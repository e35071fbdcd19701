"""What a REDIS_URL names (toolloop/redisurl.py): direct, Valkey and Sentinel forms, the Celery broker
settings made from them, and clear refusals that never show the password."""

from __future__ import annotations

import dataclasses
import ssl

import pytest

from toolloop import redisurl
from workers.config.celery import make_app, ssl_options
from workers.config.settings import Settings


def test_a_direct_url_is_passed_to_redis_py_as_is_and_valkey_is_read_as_redis() -> None:
    assert redisurl.parse("redis://:pw@h:6380/2").url == "redis://:pw@h:6380/2"
    assert redisurl.parse("valkey://h:6379/0").url == "redis://h:6379/0"
    assert (
        redisurl.parse("valkeys://h:6379/0?ssl_ca_certs=/ca.pem").url
        == "rediss://h:6379/0?ssl_ca_certs=/ca.pem"
    )
    assert not redisurl.parse("redis://h/0").is_sentinel
    client = redisurl.sync_client("valkey://127.0.0.1:7001/3")
    assert client.connection_pool.connection_kwargs["db"] == 3


def test_a_sentinel_url_names_its_sentinels_service_db_and_credentials() -> None:
    target = redisurl.parse(
        "redis+sentinel://user:s%40cret@10.0.0.1:26379,10.0.0.2,[::1]:26380/prod/4"
    )
    assert target.sentinels == (
        ("10.0.0.1", 26379),
        ("10.0.0.2", 26379),
        ("::1", 26380),
    )
    assert (target.service, target.db, target.tls) == ("prod", 4, False)
    assert target.node_kwargs["username"] == "user"
    assert target.node_kwargs["password"] == "s@cret"
    assert target.sentinel_kwargs == {}


def test_tls_sentinel_options_reach_the_nodes_and_the_sentinels() -> None:
    target = redisurl.parse(
        "rediss+sentinel://:pw@s1:26379/svc?ssl_ca_certs=/ca.pem&sentinel_password=sp&socket_timeout=3"
    )
    assert target.tls and target.node_kwargs["ssl"] is True
    assert target.node_kwargs["ssl_ca_certs"] == "/ca.pem"
    assert target.node_kwargs["socket_timeout"] == 3.0
    assert target.sentinel_kwargs == {
        "ssl_ca_certs": "/ca.pem",
        "ssl": True,
        "password": "sp",
    }


def test_the_celery_broker_of_a_sentinel_url_is_kombus_form_with_its_master_name() -> (
    None
):
    url, options = redisurl.broker("redis+sentinel://:pw@s1:26379,s2:26380/svc/2")
    assert url == "sentinel://:pw@s1:26379/2;sentinel://:pw@s2:26380/2"
    assert options == {"master_name": "svc"}
    app = make_app(
        dataclasses.replace(
            Settings.from_env(), redis_url="redis+sentinel://s1:26379/svc"
        )
    )
    assert app.conf.broker_transport_options["master_name"] == "svc"
    assert app.conf.broker_url.startswith("sentinel://s1:26379")
    assert app.conf.toolloop_redis_url == "redis+sentinel://s1:26379/svc"
    assert redisurl.broker("redis://h:1/0") == ("redis://h:1/0", {})


def test_tls_sentinel_gives_celery_its_ssl_options() -> None:
    options = ssl_options("rediss+sentinel://s1:26379/svc?ssl_ca_certs=/ca.pem")
    assert options == {"ssl_ca_certs": "/ca.pem", "ssl_cert_reqs": ssl.CERT_REQUIRED}
    assert ssl_options("redis+sentinel://s1:26379/svc") == {}


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://h:1/0", "has the scheme 'http'"),
        ("localhost:6379", "is not a URL"),
        ("redis+sentinel:///svc", "names no sentinel"),
        ("redis+sentinel://s1:26379", "names no service"),
        ("redis+sentinel://s1:26379/svc/x", "has the database 'x'"),
        ("redis+sentinel://s1:port/svc", "whose port is not a number"),
        ("redis+sentinel://:hunter2@s1:99999/svc", "has the sentinel 's1:99999'"),
    ],
)
def test_a_url_that_names_no_redis_is_refused_in_two_lines_without_its_password(
    url: str, says: str
) -> None:
    with pytest.raises(redisurl.RedisUrlError) as caught:
        redisurl.parse(url)
    message = str(caught.value)
    assert says in message.splitlines()[0]
    assert len(message.splitlines()) == 2 and message.splitlines()[1].startswith("  ")
    assert "hunter2" not in message

"""workers/worker/kombu_redis.py: a worker refuses broker transport options that move kombu's Redis layout
(the step consumer and the event sender write it themselves), and says what to do."""

from __future__ import annotations

import pytest
from kombu.transport.redis import Channel

from workers.config.celery import make_app
from workers.worker.kombu_redis import (
    _LAYOUT,
    UnsupportedTransportOption,
    check_transport_options,
)


def test_our_own_configuration_and_kombus_defaults_spelled_out_are_accepted() -> None:
    check_transport_options(make_app().conf.broker_transport_options)
    check_transport_options(None)
    check_transport_options({name: getattr(Channel, name) for name in _LAYOUT})
    check_transport_options(
        {"fanout_prefix": Channel.keyprefix_fanout, "priority_steps": (0, 3, 6, 9)}
    )
    check_transport_options(
        {
            "visibility_timeout": 7200,
            "socket_timeout": 5,
            "queue_order_strategy": "sorted",
        }
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("sep", ":"),
        ("unacked_key", "toolloop_unacked"),
        ("unacked_index_key", "toolloop_unacked_index"),
        ("priority_steps", list(range(10))),
        ("global_keyprefix", "app1:"),
        ("ack_emulation", False),
        ("fanout_prefix", "/custom."),
        ("fanout_patterns", False),
    ],
)
def test_an_option_that_moves_the_layout_is_refused_with_what_to_do(
    name: str, value: object
) -> None:
    options = {**make_app().conf.broker_transport_options, name: value}
    with pytest.raises(UnsupportedTransportOption) as refused:
        check_transport_options(options)
    message = str(refused.value)
    assert f"{name}={value!r}" in message and "kombu's default" in message
    assert "Remove these options from broker_transport_options" in message
    assert "visibility_timeout" not in message  # only what is refused is named

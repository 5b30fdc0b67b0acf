"""What docs/protocol.md says, held to by the broker where a client written from it found the
broker more lenient or less exact (issue 14, "The protocol document, exact")."""

from __future__ import annotations

import pytest

from broker.client import Admin
from broker.client.connection import Connection
from broker.errors import BrokerError
from broker.protocol import MetadataRequest
from tests.pylogd import RunningBroker


@pytest.mark.parametrize("value", ["+5", " 5", "5 ", "5_0", "\u0665", "0x10", str(2**64), "", "-1"])
def test_a_setting_value_is_ascii_digits_only(
    broker: RunningBroker, topic: str, value: str
) -> None:
    with Admin(broker.endpoint) as admin, pytest.raises(BrokerError) as raised:
        admin.create_topic(topic, 1, {"flush_messages": value})
    assert raised.value.name == "INVALID_TOPIC"
    assert "flush_messages" in raised.value.message


def test_a_topic_asked_twice_in_metadata_comes_back_once(broker: RunningBroker, topic: str) -> None:
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic, 2)
    with Connection(broker.endpoint, timeout_s=10.0) as connection:
        reply = connection.request(MetadataRequest((topic, topic, "absent-topic", "absent-topic")))
    assert [info.topic for info in reply.topics] == [topic, "absent-topic"]

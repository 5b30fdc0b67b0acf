"""What docs/protocol.md says, held to by the broker where a client written from it found the
broker more lenient or less exact (issue 14, "The protocol document, exact")."""

from __future__ import annotations

import struct

import pytest
import zmq
from click.testing import CliRunner

from broker.client import Admin
from broker.client.connection import Connection
from broker.errors import BrokerError
from broker.log.message import encode_message
from broker.protocol import (
    ErrorCode,
    FetchRequest,
    MetadataRequest,
    RequestHeader,
    decode_reply_header,
    encode_request,
)
from cli.pylogd import main as pylogd_main
from tests.client.test_consumer import SIZE, TEN, first_segment, flip_value_byte, produce
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


def raw_fetch(endpoint: str, topic: str, offset: int, max_bytes: int) -> tuple[int, str, bytes]:
    """A FETCH sent and its reply read as a client in another language would, from the bytes:
    (error_code, error_message, the bytes of frame 1 after error_message)."""
    request = FetchRequest(topic, 0, offset, max_bytes, 0, 0)
    with zmq.Context() as context, context.socket(zmq.DEALER) as dealer:
        dealer.connect(endpoint)
        dealer.send_multipart(encode_request(RequestHeader(request.api, 1, 7, "raw"), request))
        assert dealer.poll(10_000), "no reply"
        (frame,) = dealer.recv_multipart()
    correlation_id, code, length = struct.unpack_from(">IhH", frame)
    assert correlation_id == 7
    return code, frame[8 : 8 + length].decode(), frame[8 + length :]


def test_invalid_offset_and_fetch_size_too_small_carry_their_values_in_fields(
    broker: RunningBroker, topic: str
) -> None:
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic)
    produce(broker, topic, *TEN[:2])
    code, text, fields = raw_fetch(broker.endpoint, topic, SIZE + 5, 100)
    assert (code, struct.unpack(">QQ", fields)) == (8, (SIZE, 2 * SIZE))  # INVALID_OFFSET
    assert "not a message boundary" in text  # for people
    code, _, fields = raw_fetch(broker.endpoint, topic, SIZE, 1)
    assert (code, struct.unpack(">Q", fields)) == (10, (SIZE,))  # FETCH_SIZE_TOO_SMALL: needed
    code, _, fields = raw_fetch(broker.endpoint, topic, 3 * SIZE, 100)
    assert (code, fields) == (9, b"")  # OFFSET_OUT_OF_RANGE: no fields


def test_corrupt_segment_carries_the_damaged_range_in_fields(
    pylogd: RunningBroker, topic: str
) -> None:
    with Admin(pylogd.endpoint) as admin:
        admin.create_topic(topic)
    produce(pylogd, topic, *TEN)
    assert pylogd.stop() == 0
    flip_value_byte(first_segment(pylogd, topic), 2)  # found by recovery on start
    broker = pylogd.restarted()
    try:
        code, text, fields = raw_fetch(broker.endpoint, topic, 2 * SIZE, 1000)
    finally:
        broker.stop()
    assert code == 11  # CORRUPT_SEGMENT
    start, end, length = struct.unpack_from(">QQH", fields)
    assert (start, end) == (2 * SIZE, 3 * SIZE)
    reason = fields[18:].decode()
    assert len(fields) == 18 + length and reason.startswith("checksum mismatch")
    assert f"({reason})" in text


def refused(admin: Admin, call: str, topic: str, *args: object) -> str:
    """The INVALID_TOPIC text of an Admin call that must be refused."""
    with pytest.raises(BrokerError) as raised:
        getattr(admin, call)(topic, *args)
    assert raised.value.name == "INVALID_TOPIC", raised.value
    return raised.value.message


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({"segment_bytes": "100"}, "segment_bytes (100) must be at least max_message_bytes"),
        ({"segment_bytes": "25", "max_message_bytes": "26"}, "segment_bytes must be at least 26"),
        ({"max_message_bytes": str(2**31)}, "max_message_bytes must be at most 2147483647"),
        ({"segment_bytes": "999", "max_message_bytes": "1000"}, "must be at least max_message"),
    ],
)
def test_create_refuses_a_setting_out_of_its_bounds_or_settings_that_do_not_fit(
    broker: RunningBroker, topic: str, settings: dict[str, str], problem: str
) -> None:
    with Admin(broker.endpoint) as admin:
        assert problem in refused(admin, "create_topic", topic, 1, settings)
        admin.create_topic(topic, 1, {"segment_bytes": "1000", "max_message_bytes": "1000"})


def test_alter_checks_the_settings_in_effect_after_the_change(
    broker: RunningBroker, topic: str
) -> None:
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic, 1, {"segment_bytes": "1000", "max_message_bytes": "1000"})
        problem = refused(admin, "alter_topic_config", topic, {"max_message_bytes": "2000"})
        assert "segment_bytes (1000) must be at least max_message_bytes (2000)" in problem
        problem = refused(admin, "alter_topic_config", topic, {}, ["max_message_bytes"])
        assert "max_message_bytes (1048576)" in problem  # the broker's default comes back
        admin.alter_topic_config(topic, {"max_message_bytes": "2000"}, ["segment_bytes"])
        assert "segment_bytes (100) must be" in refused(
            admin, "alter_topic_config", topic, {"segment_bytes": "100"}
        )
        settings = {entry.key: entry.value for entry in admin.topic_config(topic)}
    assert (settings["segment_bytes"], settings["max_message_bytes"]) == ("1073741824", "2000")


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        (["--log-segment-bytes", "100"], "segment_bytes (100) must be at least max_message_bytes"),
        (["--log-segment-bytes", "10", "--log-max-message-bytes", "10"], "at least 26, not 10"),
        (["--log-max-message-bytes", str(2**31)], "max_message_bytes must be at most"),
    ],
)
def test_pylogd_refuses_to_start_with_defaults_that_break_a_bound(
    flags: list[str], problem: str
) -> None:
    result = CliRunner().invoke(pylogd_main, flags)
    assert result.exit_code == 2
    (line,) = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert line.startswith("Error: [log] ") and problem in line


def test_fetch_size_too_small_over_the_fetch_cap_names_the_max_bytes_asked(
    broker: RunningBroker, topic: str
) -> None:
    """A message over fetch_max_bytes (1 MiB) and over max_bytes: the reply's text names the
    request's max_bytes, not the broker's cap, and `needed` is the message's size."""
    big = b"x" * (3 << 20)
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic, 1, {"max_message_bytes": str(4 << 20)})
    produce(broker, topic, big)
    code, text, fields = raw_fetch(broker.endpoint, topic, 0, 2 << 20)
    assert (code, struct.unpack(">Q", fields)) == (10, (len(encode_message(big)),))
    assert f"larger than max_bytes {2 << 20}:" in text


def test_a_replica_fetch_of_a_partition_of_one_replica_is_unknown_topic_or_partition(
    broker: RunningBroker, topic: str
) -> None:
    """docs/protocol.md, FETCH: `replica_id` must be one of the partition's replicas other than
    the leader, else UNKNOWN_TOPIC_OR_PARTITION; a partition of one replica has no other."""
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic)
    request = FetchRequest(topic, 0, 0, 1000, 0, 0, replica_id=7)
    with zmq.Context() as context, context.socket(zmq.DEALER) as dealer:
        dealer.connect(broker.endpoint)
        dealer.send_multipart(encode_request(RequestHeader(request.api, 2, 9, "raw"), request))
        assert dealer.poll(10_000), "no reply"
        header = decode_reply_header(dealer.recv_multipart())
    assert ErrorCode(header.error_code).name == "UNKNOWN_TOPIC_OR_PARTITION"
    assert "broker 7 is not a replica" in header.error_message

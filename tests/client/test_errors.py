"""Typed client errors: each wire error code raises its own exception class, a BrokerError and
the broker-side class of the error tree at once, so `except TopicAlreadyExists` works."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest

from broker.client import Admin
from broker.errors import (
    AuthorizationFailed,
    BrokerError,
    CorruptSegment,
    FencedLeaderEpoch,
    FetchSizeTooSmall,
    InvalidOffset,
    InvalidProducerEpoch,
    NotCoordinator,
    NotEnoughReplicas,
    NotLeaderForPartition,
    OutOfOrderSequence,
    TopicAlreadyExists,
    Unavailable,
    UnknownLeaderEpoch,
    UnknownTopicOrPartition,
)
from broker.protocol import Api, ErrorCode, decode_reply, encode_error, error_code_for, error_entry
from tests.pylogd import RunningBroker

PROTOCOL_MD = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"


def documented_codes() -> list[tuple[int, str]]:
    """(code, name) of every row of docs/protocol.md's error code table."""
    text = PROTOCOL_MD.read_text()
    table = text[text.index("## Error codes") : text.index("## Limits")]
    return [(int(c), n) for c, n in re.findall(r"^\| (\d+) +\| `([A-Z_]+)`", table, re.M)]


def raised_for(code: int, message: str = "text") -> BrokerError:
    """What a client raises for a METADATA reply with error `code`."""
    with_fields: dict[int, Exception] = {
        ErrorCode.INVALID_OFFSET: InvalidOffset(45, 38, 76),
        ErrorCode.FETCH_SIZE_TOO_SMALL: FetchSizeTooSmall(0, 1, 38),
        ErrorCode.CORRUPT_SEGMENT: CorruptSegment("t-0", 38, 76, "why"),
        ErrorCode.AUTHORIZATION_FAILED: AuthorizationFailed("web", "produce", "clicks"),
        ErrorCode.NOT_LEADER_FOR_PARTITION: NotLeaderForPartition("t-0", 2, 6),
        ErrorCode.NOT_ENOUGH_REPLICAS: NotEnoughReplicas("t-0", 1, 2),
        ErrorCode.FENCED_LEADER_EPOCH: FencedLeaderEpoch("t-0", 5, 6),
        ErrorCode.UNKNOWN_LEADER_EPOCH: UnknownLeaderEpoch("t-0", 5, 4),
        ErrorCode.OUT_OF_ORDER_SEQUENCE: OutOfOrderSequence("t-0", 9, 0, 7, 5),
        ErrorCode.INVALID_PRODUCER_EPOCH: InvalidProducerEpoch("t-0", 9, 0, 1),
        ErrorCode.NOT_COORDINATOR: NotCoordinator("g", 2, "127.0.0.1", 9093),
    }
    frames = (
        [encode_error(7, with_fields.get(code, ErrorCode(code)), message)[0]]
        if code in set(ErrorCode)
        else [struct.pack(">IhH", 7, code, len(message)) + message.encode()]
    )
    with pytest.raises(BrokerError) as raised:
        decode_reply(Api.METADATA, frames)
    return raised.value


def test_every_documented_error_code_raises_its_own_class() -> None:
    codes = [(code, name) for code, name in documented_codes() if code != 0]
    assert [name for _, name in codes] == [c.name for c in ErrorCode if c]  # table = enum
    classes = {code: type(raised_for(code)) for code, _ in codes}
    assert len(set(classes.values())) == len(codes)  # one class per code
    for code, name in codes:
        error = raised_for(code, "why")
        entry = error_entry(code)
        assert entry is not None
        assert (error.code, error.name, error.message, error.retriable) == (
            code,
            name,
            "why",
            entry.retriable,
        )
        assert str(error) == f"{name}: why"
        if entry.exception is not None:  # the broker-side class catches it too
            assert isinstance(error, entry.exception)
        assert isinstance(error, Unavailable) == entry.retriable
        assert error_code_for(error) == code  # round trip: a forwarded error keeps its code


def test_the_replication_errors_carry_their_fields_and_say_whether_to_retry() -> None:
    not_leader = raised_for(ErrorCode.NOT_LEADER_FOR_PARTITION)
    assert isinstance(not_leader, NotLeaderForPartition)
    assert (not_leader.leader, not_leader.leader_epoch, not_leader.retriable) == (2, 6, True)
    too_few = raised_for(ErrorCode.NOT_ENOUGH_REPLICAS)
    assert isinstance(too_few, NotEnoughReplicas)
    assert (too_few.isr_size, too_few.min_insync_replicas, too_few.retriable) == (1, 2, True)
    fenced = raised_for(ErrorCode.FENCED_LEADER_EPOCH)
    assert isinstance(fenced, FencedLeaderEpoch) and not isinstance(fenced, Unavailable)
    assert (fenced.leader_epoch, fenced.retriable) == (6, False)
    unknown = raised_for(ErrorCode.UNKNOWN_LEADER_EPOCH)
    assert isinstance(unknown, UnknownLeaderEpoch)
    assert (unknown.leader_epoch, unknown.retriable) == (4, True)


def test_a_not_leader_reply_with_no_leader_known_says_minus_1() -> None:
    frames = encode_error(7, NotLeaderForPartition("t-0", -1, -1))
    with pytest.raises(NotLeaderForPartition) as raised:
        decode_reply(Api.PRODUCE, frames)
    assert (raised.value.leader, raised.value.leader_epoch) == (-1, -1)
    assert "no leader is known" in str(raised.value)


def test_an_unknown_code_is_a_plain_broker_error() -> None:
    error = raised_for(999)
    assert type(error) is BrokerError
    assert (error.name, error.retriable) == ("UNKNOWN_ERROR_999", False)
    assert error_code_for(error) == ErrorCode.UNKNOWN_SERVER_ERROR


def test_except_topic_already_exists_works_against_a_broker(
    broker: RunningBroker, topic: str
) -> None:
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic)
        try:
            admin.create_topic(topic)
        except TopicAlreadyExists as error:
            assert isinstance(error, BrokerError)
            assert error.name == "TOPIC_ALREADY_EXISTS" and topic in error.message
        else:
            pytest.fail("a second create_topic raised nothing")
        admin.delete_topic(topic)
        with pytest.raises(UnknownTopicOrPartition):
            admin.delete_topic(topic)

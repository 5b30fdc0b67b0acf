"""The consumer group apis (13 to 18) on the wire: what their decoders refuse (docs/protocol.md,
"Consumer groups", "Partition lists" and each api's section), partition lists, and the group
error codes on both sides (NOT_COORDINATOR's fields)."""

from __future__ import annotations

import pytest

from broker import errors
from broker.errors import (
    BrokerError,
    InvalidTopic,
    MalformedReply,
    MalformedRequest,
    NotCoordinator,
    Unavailable,
)
from broker.log.epochs import MAX_OFFSET
from broker.protocol import (
    ERROR_FIELDS,
    MAX_PARTS,
    MIN_MEMBER_EPOCH,
    Api,
    CommitPart,
    DeleteGroupRequest,
    DescribeGroupReply,
    DescribeGroupRequest,
    EmptyReply,
    ErrorCode,
    GroupHeartbeatReply,
    GroupHeartbeatRequest,
    GroupMemberInfo,
    GroupPartitions,
    OffsetCommitRequest,
    Request,
    RequestHeader,
    broker_error,
    decode_reply,
    decode_request,
    encode_error,
    encode_reply,
    encode_request,
    error_entry,
    partition_list,
)

EVENTS = (GroupPartitions("events", (0, 1)),)


def heartbeat(
    member_epoch: int = 1,
    topics: tuple[str, ...] = ("events",),
    owned: tuple[GroupPartitions, ...] = EVENTS,
) -> GroupHeartbeatRequest:
    return GroupHeartbeatRequest(
        "loaders", "m-1", member_epoch, "", 10_000, 300_000, "", topics, owned
    )


def frames(request: Request) -> list[bytes]:
    return [bytes(f) for f in encode_request(RequestHeader(request.api, 1, 7, "t"), request)]


def refused(request: Request, error: type[Exception], *fragments: str) -> None:
    with pytest.raises(error) as raised:
        decode_request(frames(request))
    for fragment in fragments:
        assert fragment in str(raised.value), str(raised.value)


# -- GROUP_HEARTBEAT ---------------------------------------------------------------------------


@pytest.mark.parametrize("epoch", [MIN_MEMBER_EPOCH, -1, 0, 1, 2**31 - 1])
def test_a_heartbeat_takes_every_epoch_from_minus_2(epoch: int) -> None:
    request = heartbeat(epoch, owned=())
    assert decode_request(frames(request))[1] == request


def test_a_heartbeat_epoch_below_minus_2_is_malformed() -> None:
    refused(heartbeat(-3), MalformedRequest, "GROUP_HEARTBEAT body", "field member_epoch is -3")


def test_a_heartbeat_without_a_topic_is_malformed_a_leave_too() -> None:
    for epoch in (0, 1, -1, -2):
        refused(heartbeat(epoch, topics=(), owned=()), MalformedRequest, "topic_count is 0")


@pytest.mark.parametrize(
    ("owned", "fragment"),
    [
        ((GroupPartitions("events", (1, 0)),), "field partition is 0 after 1"),
        ((GroupPartitions("events", (0, 0)),), "field partition is 0 after 0"),
        (
            (GroupPartitions("events", (0,)), GroupPartitions("events", (1,))),
            "names topic 'events' twice",
        ),
    ],
)
def test_an_owned_list_out_of_order_or_repeated_is_malformed(
    owned: tuple[GroupPartitions, ...], fragment: str
) -> None:
    refused(heartbeat(owned=owned), MalformedRequest, "partition list owned", fragment)


def test_topic_names_of_a_heartbeat_are_checked_as_every_request_s() -> None:
    refused(heartbeat(topics=("a b",)), InvalidTopic, "'a b'")
    refused(heartbeat(owned=(GroupPartitions("..", (0,)),)), InvalidTopic, "'..'")


def test_group_names_and_ids_are_the_broker_s_to_check() -> None:
    request = GroupHeartbeatRequest("a group?", "é", 0, "x y", 0, 0, "none such", ("t",), ())
    assert decode_request(frames(request))[1] == request
    assert decode_request(frames(DescribeGroupRequest("")))[1] == DescribeGroupRequest("")
    assert decode_request(frames(DeleteGroupRequest("?")))[1] == DeleteGroupRequest("?")


def test_a_reply_s_assignment_out_of_order_is_malformed() -> None:
    reply = GroupHeartbeatReply(1, 1000, (GroupPartitions("events", (1, 0)),))
    with pytest.raises(MalformedReply, match="partition list assignment"):
        decode_reply(Api.GROUP_HEARTBEAT, encode_reply(1, reply))


# -- OFFSET_COMMIT -----------------------------------------------------------------------------


def commit(*parts: CommitPart) -> OffsetCommitRequest:
    return OffsetCommitRequest("loaders", "m-1", 1, parts)


def test_a_commit_of_no_parts_or_of_too_many_is_malformed() -> None:
    refused(commit(), MalformedRequest, "OFFSET_COMMIT body", "part_count is 0")
    too_many = [CommitPart("events", p, 0) for p in range(MAX_PARTS + 1)]
    refused(commit(*too_many), MalformedRequest, f"part_count is {MAX_PARTS + 1}")
    most = commit(*too_many[:MAX_PARTS])
    assert decode_request(frames(most))[1] == most


def test_a_commit_of_an_offset_of_2_63_or_more_is_malformed() -> None:
    request = commit(CommitPart("events", 0, MAX_OFFSET))
    assert decode_request(frames(request))[1] == request
    refused(
        commit(CommitPart("events", 1, MAX_OFFSET + 1)),
        MalformedRequest,
        f"part events-1: field offset is {MAX_OFFSET + 1}",
    )


def test_a_commit_part_s_topic_name_is_checked() -> None:
    refused(commit(CommitPart("a/b", 0, 1)), InvalidTopic, "'a/b'")


def test_a_commit_without_a_member_decodes() -> None:
    request = OffsetCommitRequest("loaders", "", -1, (CommitPart("events", 0, 0),))
    assert decode_request(frames(request))[1] == request


# -- DESCRIBE_GROUP, DELETE_GROUP --------------------------------------------------------------


def member(**lists: tuple[GroupPartitions, ...]) -> GroupMemberInfo:
    given = {"assigned": (), "revoking": (), "waiting": ()} | lists
    return GroupMemberInfo("m-1", "", "c", "h", 1, False, 10_000, 300_000, ("events",), **given)


@pytest.mark.parametrize("name", ["assigned", "revoking", "waiting"])
def test_a_described_member_s_lists_are_checked(name: str) -> None:
    bad = member(**{name: (GroupPartitions("events", (2, 2)),)})
    reply = DescribeGroupReply(2, 1, 3, 3, "uniform", (bad,))
    with pytest.raises(MalformedReply, match=f"partition list {name}"):
        decode_reply(Api.DESCRIBE_GROUP, encode_reply(1, reply))


def test_a_described_member_s_left_is_a_flag() -> None:
    reply = DescribeGroupReply(1, 1, 1, 1, "uniform", (member(),))
    (frame,) = encode_reply(1, reply)
    at = bytes(frame).index(b"\x00\x00\x00\x01\x00\x00\x00\x27\x10") + 4  # epoch 1, left, 10000
    broken = bytes(frame)[:at] + b"\x02" + bytes(frame)[at + 1 :]
    with pytest.raises(MalformedReply, match="field left is 2"):
        decode_reply(Api.DESCRIBE_GROUP, [broken])


def test_delete_group_is_answered_with_an_empty_reply() -> None:
    assert decode_reply(Api.DELETE_GROUP, encode_reply(5, EmptyReply())) == EmptyReply()


# -- partition lists ---------------------------------------------------------------------------


def test_partition_list_sorts_topics_and_partitions_and_drops_repeats() -> None:
    pairs = [("views", 3), ("events", 1), ("views", 0), ("events", 1), ("events", 0)]
    assert partition_list(pairs) == (
        GroupPartitions("events", (0, 1)),
        GroupPartitions("views", (0, 3)),
    )
    assert partition_list([]) == ()


# -- the group error codes ---------------------------------------------------------------------

GROUP_CODES = [code for code in ErrorCode if code >= ErrorCode.NOT_COORDINATOR]


@pytest.mark.parametrize("code", GROUP_CODES, ids=lambda code: code.name)
def test_each_group_code_is_raised_as_its_own_class_on_the_client_side(code: ErrorCode) -> None:
    entry = error_entry(code)
    assert entry is not None and entry.exception is not None
    fields: dict[str, int | str] | None = None
    if code in ERROR_FIELDS:
        fields = {"coordinator": 2, "host": "h", "port": 1}
    error = broker_error(code, "m", fields)
    assert isinstance(error, BrokerError) and isinstance(error, entry.exception)
    assert type(error) is getattr(errors, f"Broker{entry.exception.__name__.removesuffix('Error')}")
    assert error.retriable == issubclass(entry.exception, Unavailable)


def test_not_coordinator_carries_the_broker_it_names() -> None:
    error = NotCoordinator("loaders", 2, "127.0.0.1", 9093)
    assert str(error) == (
        "group loaders: this broker does not coordinate it: broker 2 at 127.0.0.1:9093 does"
    )
    with pytest.raises(errors.BrokerNotCoordinator) as raised:
        decode_reply(Api.OFFSET_FETCH, encode_error(3, error))
    assert isinstance(raised.value, NotCoordinator) and raised.value.retriable
    assert (raised.value.coordinator, raised.value.host, raised.value.port) == (
        2,
        "127.0.0.1",
        9093,
    )
    none = NotCoordinator("loaders", -1)
    assert str(none).endswith("no coordinator is known")
    with pytest.raises(errors.BrokerNotCoordinator) as raised:
        decode_reply(Api.GROUP_HEARTBEAT, encode_error(3, none))
    assert (raised.value.coordinator, raised.value.host, raised.value.port) == (-1, "", 0)


def test_not_coordinator_s_fields_are_coordinator_host_port_in_that_order() -> None:
    (frame,) = encode_error(9, NotCoordinator("g", 2, "h", 9093), "")
    assert bytes(frame)[8:] == b"\x00\x00\x00\x02" + b"\x00\x01h" + b"\x23\x85"
    for broken in (bytes(frame)[:-1], bytes(frame) + b"\x00"):
        with pytest.raises(MalformedReply, match="NOT_COORDINATOR error fields"):
            decode_reply(Api.GROUP_HEARTBEAT, [broken])

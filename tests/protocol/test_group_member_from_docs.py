"""A group member written from docs/protocol.md alone: the raw frames of the consumer group
vectors, sent in their order to a real pylogd (which coordinates every group: it is the only
broker), are answered with the vectors' reply frames byte for byte: a join given both
partitions, a heartbeat, a commit, the offsets fetched, the group described and listed, the
leave, the group deleted. Only what the document's cluster of two brokers makes differ is
compared by value instead: the coordinator's broker id in the listing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq

from broker import protocol
from broker.client import Admin
from broker.protocol import Api, decode_reply
from tests.protocol.test_protocol import Vector, documented_vectors
from tests.pylogd import RunningBroker

REPLY_TIMEOUT_MS = 10_000


@pytest.fixture
def vectors() -> dict[str, Vector]:
    return {v.name: v for v in documented_vectors()}


@pytest.fixture
def dealer(broker: RunningBroker) -> Iterator[zmq.Socket[bytes]]:
    socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(broker.endpoint)
    yield socket
    socket.close()


def ask(dealer: zmq.Socket[bytes], request: Vector) -> list[bytes]:
    dealer.send_multipart([b"", *request.frames])
    assert dealer.poll(REPLY_TIMEOUT_MS), f"no reply to {request.name}"
    empty, *frames = dealer.recv_multipart()
    assert empty == b""
    return frames


def test_the_documented_member_joins_commits_and_leaves(
    broker: RunningBroker, dealer: zmq.Socket[bytes], vectors: dict[str, Vector]
) -> None:
    with Admin(broker.endpoint) as admin:
        admin.create_topic("events", 2)
    for request, reply in [
        ("group-heartbeat-join-request", "group-heartbeat-join-reply"),
        ("group-heartbeat-request", "group-heartbeat-reply"),
        ("offset-commit-request", "offset-commit-reply"),
        ("offset-fetch-request", "offset-fetch-reply"),
        ("describe-group-request", "describe-group-reply"),
    ]:
        assert ask(dealer, vectors[request]) == vectors[reply].frames, request
    listed = decode_reply(Api.LIST_GROUPS, ask(dealer, vectors["list-groups-request"]))
    documented = decode_reply(Api.LIST_GROUPS, vectors["list-groups-reply"].frames)
    assert isinstance(listed, protocol.ListGroupsReply)
    assert isinstance(documented, protocol.ListGroupsReply)
    assert [(g.group, g.members, g.topics) for g in listed.groups] == [
        (g.group, g.members, g.topics) for g in documented.groups
    ]
    for request, reply in [
        ("group-heartbeat-leave-request", "group-heartbeat-leave-reply"),
        ("delete-group-request", "delete-group-reply"),
    ]:
        assert ask(dealer, vectors[request]) == vectors[reply].frames, request

"""The group apis in curve mode (docs/protocol.md, "Consumer groups", Security): a member needs
`fetch` on every topic it subscribes to and commits, deleting a group `delete` on every topic
(an ACL on `*`); a principal without them is answered AUTHORIZATION_FAILED and nothing is
changed."""

from __future__ import annotations

import uuid

from broker import protocol
from broker.client import Admin
from broker.errors import BrokerAuthorizationFailed
from broker.protocol import (
    CommitPart,
    DeleteGroupRequest,
    GroupHeartbeatRequest,
    OffsetCommitRequest,
)
from tests.conftest import wait_until
from tests.curve import SUPER_USER, CurveBroker, curve_broker_fixture

curve_broker = curve_broker_fixture()


def test_group_requests_need_fetch_on_their_topics_and_delete_on_every_topic(
    curve_broker: CurveBroker, topic: str
) -> None:
    with Admin(curve_broker.broker.endpoint, keys=curve_broker.keys(SUPER_USER)) as admin:
        admin.create_topic(topic)
    group = f"g-{uuid.uuid4().hex[:8]}"
    join = GroupHeartbeatRequest(group, "m-1", 0, "", 10_000, 300_000, "", (topic,), ())
    refused = curve_broker.call("alice", join)
    assert isinstance(refused, BrokerAuthorizationFailed) and topic in str(refused)
    curve_broker.pylogctl(
        "acl", "add", "--principal", "alice", "--topic", topic, "--operation", "fetch"
    )
    replies: list[object] = []  # the broker learns the ACL from ZooKeeper's watch: soon after

    def let_in() -> bool:
        replies.append(curve_broker.call("alice", join))
        return not isinstance(replies[-1], BrokerAuthorizationFailed)

    wait_until(let_in, what="alice's fetch ACL to reach the broker")
    joined = replies[-1]
    assert isinstance(joined, protocol.GroupHeartbeatReply) and joined.member_epoch == 1
    commit = OffsetCommitRequest(group, "m-1", 1, (CommitPart(topic, 0, 0),))
    assert isinstance(curve_broker.call("alice", commit), protocol.OffsetCommitReply)
    other = OffsetCommitRequest(group, "m-1", 1, (CommitPart("elsewhere", 0, 0),))
    assert isinstance(curve_broker.call("alice", other), BrokerAuthorizationFailed)
    leave = GroupHeartbeatRequest(group, "m-1", -1, "", 10_000, 300_000, "", (topic,), ())
    assert isinstance(curve_broker.call("alice", leave), protocol.GroupHeartbeatReply)
    delete = DeleteGroupRequest(group)
    assert isinstance(curve_broker.call("alice", delete), BrokerAuthorizationFailed)
    assert isinstance(curve_broker.call(SUPER_USER, delete), protocol.EmptyReply)

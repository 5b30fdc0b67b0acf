"""A client that asks as a replica (FETCH version 2 with replica_id >= 0) of a real curve
broker: refused AUTHORIZATION_FAILED whatever its ACLs, a super user too; only brokers, with the
cluster's key, fetch as replicas (docs/security.md, "Brokers among themselves")."""

from __future__ import annotations

import pytest

from broker import protocol
from broker.errors import BrokerError
from broker.protocol import CreateTopicRequest, ErrorCode, FetchRequest, RequestHeader
from tests.conftest import wait_until
from tests.curve import NO_REPLY_MS, CurveBroker, curve_broker_fixture

replicated = curve_broker_fixture("replicated")


def fetch_v2(broker: CurveBroker, name: str, request: FetchRequest) -> protocol.Reply | Exception:
    socket = broker.client(name)
    try:
        header = RequestHeader(protocol.Api.FETCH, 2, 9, "test-replica-fetch")
        socket.send_multipart(protocol.encode_request(header, request))
        assert socket.poll(NO_REPLY_MS * 4), "no reply"
        frames = socket.recv_multipart()
    finally:
        socket.close()
    try:
        return protocol.decode_reply(protocol.Api.FETCH, frames, 2)
    except BrokerError as error:
        return error


@pytest.fixture(scope="module")
def topic(replicated: CurveBroker) -> str:
    name = "sec.replica-fetch"
    assert replicated.call("admin", CreateTopicRequest(name, 1, {})) == protocol.EmptyReply()
    replicated.pylogctl("acl", "add", "--principal", "alice", "--topic", "*", "--operation", "all")
    # the broker takes the ACL from ZooKeeper by a watch: wait until it lets alice consume
    as_consumer = FetchRequest(name, 0, 0, 1 << 16, 0, 0)
    wait_until(
        lambda: isinstance(fetch_v2(replicated, "alice", as_consumer), protocol.FetchReply),
        what="alice's ACL taken by the broker",
    )
    return name


@pytest.mark.parametrize("name", ["alice", "admin"])  # every ACL; a super user
def test_a_client_principal_fetching_as_a_replica_is_refused(
    replicated: CurveBroker, topic: str, name: str
) -> None:
    def as_replica() -> FetchRequest:
        return FetchRequest(topic, 0, 0, 1 << 16, 0, 0, replica_id=1, flushed_offset=0)

    reply = fetch_v2(replicated, name, as_replica())
    assert isinstance(reply, BrokerError), reply
    assert reply.code == ErrorCode.AUTHORIZATION_FAILED
    assert "as a replica" in str(reply)
    # the same principal as a consumer (replica_id -1) is served
    consumer = fetch_v2(replicated, name, FetchRequest(topic, 0, 0, 1 << 16, 0, 0))
    assert isinstance(consumer, protocol.FetchReply), consumer

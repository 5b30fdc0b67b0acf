"""The cluster principal (docs/security.md, "Brokers among themselves"): the keys of the
cluster are the brokers', let in as CLUSTER_PRINCIPAL, which may fetch and describe every
topic and alone may fetch as a replica; no client principal, a super user included, may."""

from __future__ import annotations

from pathlib import Path

import pytest
import zmq
from zmq.utils import z85

from broker.errors import AuthorizationFailed
from broker.registry import BrokerRegistration
from broker.replication.reassign import cannot_follow, why_waiting
from broker.security import (
    CLUSTER_PRINCIPAL,
    Acl,
    Authorizer,
    BrokerKeys,
    KeyFileError,
    Operation,
    Principals,
    ZapHandler,
    check_principal_name,
    generate_keys,
    load_public_key,
)

CLUSTER_KEY = zmq.curve_keypair()[0]
CLIENT_KEY = zmq.curve_keypair()[0]


def test_the_cluster_principal_fetches_and_describes_every_topic_and_nothing_more() -> None:
    authorizer = Authorizer(["ops"])
    authorizer.update([Acl("app", "*", frozenset(Operation))])
    for operation in Operation:
        allowed = operation in (Operation.FETCH, Operation.DESCRIBE)
        assert authorizer.allowed(CLUSTER_PRINCIPAL, operation, "any.topic") is allowed
    with pytest.raises(ValueError):  # no client principal, ACL or super user can be named so
        check_principal_name(CLUSTER_PRINCIPAL)


@pytest.mark.parametrize("principal", ["app", "ops"])
def test_no_client_principal_may_fetch_as_a_replica_even_with_every_acl_or_a_super_user(
    principal: str,
) -> None:
    authorizer = Authorizer(["ops"])
    authorizer.update([Acl("app", "*", frozenset(Operation))])
    with pytest.raises(AuthorizationFailed, match="as a replica"):
        authorizer.check_replica(principal, "clicks", 2)
    assert authorizer.denied == 1
    authorizer.check_replica(CLUSTER_PRINCIPAL, "clicks", 2)


def test_the_cluster_keys_are_the_cluster_principal_whatever_else_names_them() -> None:
    principals = Principals(None, [CLUSTER_KEY])
    principals.from_registry({"app": (CLIENT_KEY,), "thief": (CLUSTER_KEY,)})
    assert principals.principal(CLUSTER_KEY.decode()) == CLUSTER_PRINCIPAL
    assert principals.principal(CLIENT_KEY.decode()) == "app"
    assert len(principals) == 1  # client keys only
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    handler = ZapHandler(context, principals)
    try:
        request = [b"1.0", b"7", b"pylog", b"10.0.0.1", b"", b"CURVE", z85.decode(CLUSTER_KEY)]
        assert handler._answer(request)[2:5] == [b"200", b"OK", CLUSTER_KEY]
    finally:
        handler.close()
        context.term()


def test_a_follower_connects_only_to_a_leader_whose_key_is_the_clusters(tmp_path: Path) -> None:
    generate_keys(tmp_path, "broker")
    generate_keys(tmp_path, "next")
    generate_keys(tmp_path, "stranger")
    keys = BrokerKeys.load(tmp_path / "broker.key_secret", [str(tmp_path / "next.key")])
    own, following = keys.public, load_public_key(tmp_path / "next.key")
    assert keys.cluster == {own, following}
    assert keys.to_leader(None).broker == own  # a leader that registered no key: ours
    assert keys.to_leader(following).broker == following  # during a change of keys
    with pytest.raises(KeyFileError, match="none of this broker's cluster keys"):
        keys.to_leader(load_public_key(tmp_path / "stranger.key"))
    assert "secret" not in repr(keys) and keys.secret.decode() not in repr(keys)


def test_the_registrations_tell_why_a_broker_cannot_follow() -> None:
    cluster, other = CLUSTER_KEY.decode(), CLIENT_KEY.decode()
    leader = BrokerRegistration("h", 1, curve_key=cluster, cluster_keys=(cluster,))
    good = BrokerRegistration("h", 2, curve_key=cluster, cluster_keys=(cluster,))
    rogue = BrokerRegistration("h", 4, curve_key=other, cluster_keys=(cluster, other))
    distrusting = BrokerRegistration("h", 5, curve_key=cluster, cluster_keys=(other,))
    plaintext = BrokerRegistration("h", 6)
    assert cannot_follow(2, good, 1, leader) is None
    assert cannot_follow(6, plaintext, 1, BrokerRegistration("h", 1)) is None
    assert "leader 1 refuses broker 4's key" in (cannot_follow(4, rogue, 1, leader) or "")
    assert "broker 5 does not take leader 1's key" in (
        cannot_follow(5, distrusting, 1, leader) or ""
    )
    assert "serves plaintext" in (cannot_follow(6, plaintext, 1, leader) or "")
    brokers = {1: leader, 2: good, 4: rogue}
    assert why_waiting([2, 3, 4], 1, brokers) == [
        "broker 3 is down",
        cannot_follow(4, rogue, 1, leader),
    ]
    assert BrokerRegistration.from_json(rogue.to_json()) == rogue
    assert b"curve_key" not in plaintext.to_json()

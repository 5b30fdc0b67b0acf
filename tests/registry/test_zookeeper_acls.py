"""ZooKeeper digest ACLs on the registry's nodes (issue 16), against a real ZooKeeper.

A registry with `auth` presents that digest identity and creates its nodes with ACL
[digest(identity): ALL, world: READ]; /consumers lets anyone create a group's node, which is
then its creator's. An `observer` is a plain kazoo client, without any identity."""

from __future__ import annotations

import logging
import queue
from collections.abc import Callable

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import ACL, make_acl

from broker.errors import RegistryAccessDenied
from broker.mirror.group import MirrorGroup
from broker.registry import BrokerRegistration, Registry, TopicConfig
from broker.security import ZooKeeperAuth
from broker.zookeeper import PrivateZooKeeper
from tests.registry.test_registry import expire_session

BROKERS = ZooKeeperAuth("pylog", "brokers-secret")
ALICE = ZooKeeperAuth("alice", "alice-secret")
BOB = ZooKeeperAuth("bob", "bob-secret")

BROKER = BrokerRegistration(host="127.0.0.1", port=9092)
CONFIG = TopicConfig(partitions=2, brokers=(1, 1))


def owned_by(auth: ZooKeeperAuth, **world: bool) -> set[ACL]:
    """An ACL as a client without ADMIN on the node reads it: ZooKeeper shows a digest
    identity's user, and "x" for its password's hash."""
    return {make_acl("digest", f"{auth.user}:x", all=True), make_acl("world", "anyone", **world)}


BROKERS_ACL = owned_by(BROKERS, read=True)
CONSUMERS_ACL = owned_by(BROKERS, read=True, create=True, delete=True)
OPEN_ACL = {make_acl("world", "anyone", all=True)}


def acl(client: KazooClient, path: str) -> set[ACL]:
    return set(client.get_acls(path)[0])


def test_a_client_without_the_identity_reads_the_brokers_nodes_but_cannot_change_them(
    make_registry: Callable[..., Registry],
    observer: KazooClient,
    registry_chroot: str,
    zookeeper: PrivateZooKeeper,
) -> None:
    broker = make_registry(auth=BROKERS)
    broker.brokers.register(1, BROKER)
    broker.topics.create_topic_config("clicks", CONFIG)
    broker.topics.register_topic_partitions("clicks", 1, [0, 1])
    root = registry_chroot
    nodes = [
        root,
        f"{root}/brokers",
        f"{root}/brokers/ids",
        f"{root}/brokers/ids/1",
        f"{root}/brokers/topics/clicks",
        f"{root}/brokers/topics/clicks/1",
        f"{root}/brokers/topics/clicks/partitions/1",
        f"{root}/brokers/topics/clicks/partitions/1/state",
        f"{root}/config",
        f"{root}/config/topics/clicks",
    ]
    for path in nodes:
        assert acl(observer, path) == BROKERS_ACL, path
    assert acl(observer, f"{root}/consumers") == CONSUMERS_ACL

    # anyone reads
    assert observer.get(f"{root}/brokers/ids/1")[0] == BROKER.to_json()
    assert observer.get(f"{root}/config/topics/clicks")[0] == CONFIG.to_json()
    # nobody without the identity writes: not a plain client, nor the same user with another
    # password (digest identities are the user and the password's hash)
    impostor = KazooClient(zookeeper.connect_string, auth_data=[("digest", "pylog:guessed")])
    impostor.start(timeout=10)
    try:
        for client in (observer, impostor):
            with pytest.raises(NoAuthError):
                client.create(f"{root}/config/topics/evil", CONFIG.to_json())
            with pytest.raises(NoAuthError):
                client.set(f"{root}/config/topics/clicks", b"{}")
            with pytest.raises(NoAuthError):
                client.delete(f"{root}/config/topics/clicks")
            with pytest.raises(NoAuthError):
                client.create(f"{root}/brokers/ids/2", BROKER.to_json(), ephemeral=True)
            with pytest.raises(NoAuthError):
                client.delete(f"{root}/brokers/ids/1")
            with pytest.raises(NoAuthError):
                client.create(f"{root}/security", b"")
            with pytest.raises(NoAuthError):
                client.set_acls(
                    f"{root}/config/topics/clicks", [make_acl("world", "anyone", all=True)]
                )
    finally:
        impostor.stop()
        impostor.close()
    assert broker.topics.topic_config("clicks") == CONFIG

    # another broker with the identity does everything a broker does
    other = make_registry(auth=BROKERS)
    other.brokers.register(2, BROKER)
    other.topics.delete_topic_config("clicks")
    assert sorted(broker.brokers.read()) == [1, 2]


def test_a_group_belongs_to_the_identity_that_made_it(
    make_registry: Callable[..., Registry], observer: KazooClient, registry_chroot: str
) -> None:
    make_registry(auth=BROKERS)
    alice = make_registry(auth=ALICE)
    alice.groups.register_consumer("loaders", "a", ["clicks"])
    assert alice.groups.claim_partition("loaders", "clicks", "1-0", "a") is None
    alice.groups.commit_offset("loaders", "clicks", "1-0", 42)
    group = f"{registry_chroot}/consumers/loaders"
    for path in (group, f"{group}/ids/a", f"{group}/owners/clicks/1-0", f"{group}/offsets/clicks"):
        assert acl(observer, path) == owned_by(ALICE, read=True), path

    bob = make_registry(auth=BOB)
    assert bob.groups.committed_offset("loaders", "clicks", "1-0") == 42  # reading is open
    assert bob.groups.consumers("loaders") == {"a": ("clicks",)}
    with pytest.raises(RegistryAccessDenied, match=r"loaders/offsets/clicks/1-0.*'bob'"):
        bob.groups.commit_offset("loaders", "clicks", "1-0", 0)
    with pytest.raises(RegistryAccessDenied, match="'bob'"):
        bob.groups.commit_offset("loaders", "clicks", "1-1", 0)  # a new node under alice's
    with pytest.raises(RegistryAccessDenied):
        bob.groups.register_consumer("loaders", "b", ["clicks"])
    with pytest.raises(RegistryAccessDenied):
        bob.groups.claim_partition("loaders", "clicks", "1-1", "b")
    with pytest.raises(RegistryAccessDenied):
        bob.groups.delete_group("loaders")
    with pytest.raises(NoAuthError):
        observer.set(f"{group}/offsets/clicks/1-0", b'{"offset":0,"version":1}')
    assert alice.groups.committed_offset("loaders", "clicks", "1-0") == 42
    assert bob.session.statistics().registered == 0  # a refused registration is not kept

    # bob makes a group of his own next to it, and a second member of alice's joins it
    bob.groups.register_consumer("auditors", "b", ["clicks"])
    second = make_registry(auth=ALICE)
    second.groups.register_consumer("loaders", "a2", ["clicks"])
    assert sorted(alice.groups.consumers("loaders")) == ["a", "a2"]

    # its owner deletes it, the group's own node included (world may delete an empty one)
    for member in (alice, second, bob):
        member.stop()
    owner = make_registry(auth=ALICE)
    assert owner.groups.delete_group("loaders")
    assert owner.groups.names() == ["auditors"]


def test_a_secured_start_secures_a_registry_made_without_acls(
    make_registry: Callable[..., Registry],
    observer: KazooClient,
    registry_chroot: str,
    zookeeper: PrivateZooKeeper,
    caplog: pytest.LogCaptureFixture,
) -> None:
    old = make_registry()
    old.brokers.register(1, BROKER)
    old.topics.create_topic_config("clicks", CONFIG)
    old.topics.register_topic_partitions("clicks", 1, [0])
    old.groups.commit_offset("loaders", "clicks", "1-0", 7)
    root = registry_chroot
    observer.create(f"{root}/security/principals", b"", makepath=True)
    assert acl(observer, f"{root}/config/topics/clicks") == OPEN_ACL

    secured = make_registry(auth=BROKERS)
    # every node but the chroot's, then the chroot: 17 under it, /consumers among them, and
    # the partitions' state nodes (partitions, 0, 0/state, 1, 1/state)
    assert secured.acls.secure_tree() == 18
    for path in (
        root,
        f"{root}/brokers",
        f"{root}/brokers/ids",
        f"{root}/brokers/ids/1",
        f"{root}/brokers/topics",
        f"{root}/brokers/topics/clicks",
        f"{root}/brokers/topics/clicks/1",
        f"{root}/brokers/topics/clicks/partitions",
        f"{root}/brokers/topics/clicks/partitions/0",
        f"{root}/brokers/topics/clicks/partitions/0/state",
        f"{root}/brokers/topics/clicks/partitions/1/state",
        f"{root}/config",
        f"{root}/config/topics",
        f"{root}/config/topics/clicks",
        f"{root}/security",
        f"{root}/security/principals",
    ):
        assert acl(observer, path) == BROKERS_ACL, path
    assert acl(observer, f"{root}/consumers") == CONSUMERS_ACL
    # the groups' nodes are their members', not the brokers': left as they were
    assert acl(observer, f"{root}/consumers/loaders") == OPEN_ACL
    assert acl(observer, f"{root}/consumers/loaders/offsets/clicks/1-0") == OPEN_ACL
    assert secured.acls.secure_tree() == 0  # the chroot carries the ACL: done before

    # the old registry's session keeps reading but can no longer write the brokers' nodes
    assert old.topics.topic_config("clicks") == CONFIG
    with pytest.raises(RegistryAccessDenied):
        old.topics.create_topic_config("views", CONFIG)
    old.groups.commit_offset("loaders", "clicks", "1-0", 8)  # its open group stays open

    # once its session expires, its registrations are refused: given up, loudly, and the
    # rest of the registry (the watches) goes on
    seen: queue.Queue[dict[int, BrokerRegistration]] = queue.Queue()
    old.brokers.watch(seen.put)
    assert seen.get(timeout=5) == {1: BROKER}
    with caplog.at_level(logging.ERROR, logger="broker.registry.session"):
        expire_session(old, zookeeper.connect_string)
        assert seen.get(timeout=10) == {}
        assert old.session.wait_registered(timeout=10)
    assert old.session.statistics().registered == 0
    assert f"cannot register {root}/brokers/ids/1 again" in caplog.text
    assert "refused by ZooKeeper (NoAuth)" in caplog.text


def test_nodes_of_another_identity_are_not_taken_over(
    make_registry: Callable[..., Registry],
) -> None:
    make_registry(auth=ALICE)  # the chroot's nodes are alice's
    brokers = make_registry(auth=BROKERS)
    with pytest.raises(RegistryAccessDenied, match="'pylog'"):
        brokers.acls.secure_tree()
    with pytest.raises(RegistryAccessDenied):
        brokers.brokers.register(1, BROKER)


def test_a_session_without_the_identity_gets_a_clear_error_on_writes(
    make_registry: Callable[..., Registry], observer: KazooClient, registry_chroot: str
) -> None:
    make_registry(auth=BROKERS)
    make_registry(auth=ALICE).groups.register_consumer("loaders", "a", ["clicks"])
    plain = make_registry()  # starts: the base paths exist, and reading is open
    assert plain.brokers.read() == {}
    with pytest.raises(RegistryAccessDenied) as denied:
        plain.topics.create_topic_config("clicks", CONFIG)
    assert str(denied.value) == (
        f"create {registry_chroot}/brokers/topics/clicks/partitions: refused by ZooKeeper "
        "(NoAuth): "
        "an ACL on that path does not let a session without a ZooKeeper identity change it"
    )
    with pytest.raises(RegistryAccessDenied):
        plain.brokers.register(1, BROKER)
    assert plain.session.statistics().registered == 0
    with pytest.raises(RuntimeError, match="identity"):
        plain.acls.secure_tree()

    # a member of the paper's protocol (a mirror process, broker.mirror.group) without an
    # identity joining alice's group fails at once, saying why
    with pytest.raises(RegistryAccessDenied, match="without a ZooKeeper identity"):
        MirrorGroup(plain.groups, plain.topics, "loaders", "b").join(
            frozenset({"clicks"}), lambda: None
        )
    assert plain.session.statistics().registered == 0
    # it may make a group of its own, but that group is open to every client
    plain.groups.register_consumer("open", "c", ["clicks"])
    assert acl(observer, f"{registry_chroot}/consumers/open") == OPEN_ACL


def test_acls_need_a_chroot_of_their_own(zookeeper: PrivateZooKeeper) -> None:
    with pytest.raises(ValueError, match="chroot"):
        Registry(zookeeper.connect_string, "/", auth=BROKERS)

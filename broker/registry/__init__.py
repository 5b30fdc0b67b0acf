"""The broker registry in ZooKeeper: which brokers are up, where topics live, topic settings,
consumer groups.

This is the only package of pylog that imports kazoo. Paths follow Kafka 0.7, under a chroot
that the operator chooses (default "/pylog", so one ensemble can hold several clusters):

    <chroot>/brokers/ids/<broker_id>              ephemeral   BrokerRegistration as JSON
        {"version": 1, "host": "10.0.0.7", "port": 9092, "workers": 2, "log_dirs": ["/d1"]}
    <chroot>/brokers/topics/<topic>/<broker_id>   ephemeral   partitions of the topic there
        {"version": 1, "partitions": [0, 3]}
    <chroot>/brokers/topics/<topic>/partitions/<p>/state
                                                  persistent  PartitionState as JSON
        {"version": 1, "leader": 2, "leader_epoch": 3, "isr": [2, 3], "controller_epoch": 5}
    <chroot>/config/topics/<topic>                persistent  TopicConfig as JSON
        {"version": 1, "partitions": 4, "brokers": [1, 2, 3, 1],
         "replicas": [[1, 2], [2, 3], [3, 1], [1, 2]], "settings": {...}}
    <chroot>/config/quotas                        persistent  quotas (broker.registry.quotas)
        {"version": 1, "quotas": {"client": {"<default>": {"produce_bytes_per_s": 1048576}}}}
    <chroot>/config/brokers                       persistent  live broker settings
        {"version": 1, "brokers": {"default": {"log.flush_interval_ms": "200"}}}
    <chroot>/controller                           ephemeral   ControllerInfo as JSON
        {"version": 1, "broker_id": 2, "controller_epoch": 5}
    <chroot>/controller_epoch                     persistent  the last controller's epoch
        {"version": 1, "controller_epoch": 5}
    <chroot>/admin/reassign/<topic>-<p>           persistent  a reassignment under way
        {"version": 1, "replicas": [4, 2, 3], "from": [1, 2, 3]}
    <chroot>/admin/preferred_election             persistent  a preferred-leader election asked
        {"version": 1, "topics": ["clicks"]}
    <chroot>/consumers/<group>/ids/<consumer_id>  ephemeral   a member and its topics
        {"version": 1, "topics": ["clicks"]}
    <chroot>/consumers/<group>/owners/<topic>/<broker_id>-<partition>
                                                  ephemeral   the member consuming it
        {"version": 1, "consumer": "host-1234-5f3a"}
    <chroot>/consumers/<group>/offsets/<topic>/<broker_id>-<partition>
                                                  persistent  the group's committed offset
        {"version": 1, "offset": 1042}

docs/registry.md describes every path and value, and who writes and watches each.

Node data is compact UTF-8 JSON with sorted keys (nodes). An ephemeral node lives as long as
the ZooKeeper session that created it: when a broker stops, dies or is cut off for longer than
the session timeout, its nodes disappear and everyone watching sees it go.

The parts: session (the connection, bounded requests, ephemeral nodes kept through session
loss, the reads and watches of node data and children: what happens when the connection or
the session is lost), watches (kazoo's ChildrenWatch, with the callbacks on threads of the
registry), nodes (the JSON of the nodes), and the stores, each made on the session and
holding the calls on one concern: brokers (and their epochs), topics and states (the topics'
configurations and the partitions' state nodes), admin (reassignments and preferred-leader
elections asked), groups and coordination, controller, acls (ZooKeeper's, on the nodes),
security, quotas, settings. A Registry holds the session (`registry.session`) and makes its
stores on it (`registry.topics`, `registry.groups`, ...).

Thread-safety: a Registry may be used from several threads at once (trio.to_thread included).
Watch callbacks run on threads of the registry, one at a time per watch.
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING

from broker.lifecycle import Running
from broker.registry.acls import NodeAcls
from broker.registry.admin import (
    ElectionInProgress,
    Reassignment,
    ReassignmentInProgress,
    ReassignmentNodes,
)
from broker.registry.brokers import BrokerRegistration, Brokers
from broker.registry.controller import Controller, ControllerInfo, ControllerMoved
from broker.registry.coordination import ClaimedElsewhere, ClaimedGroup, GroupCoordination
from broker.registry.groups import partition_name
from broker.registry.nodes import FORMAT_VERSION
from broker.registry.quotas import Quotas
from broker.registry.security import Security
from broker.registry.session import DEFAULT_CHROOT, RegistryStatistics, Session
from broker.registry.settings import BrokerSettingsNode
from broker.registry.states import NO_LEADER, PartitionState, PartitionStateChanged
from broker.registry.topic_config import MAX_PARTITIONS, TopicConfig
from broker.registry.topics import TopicNodes

if TYPE_CHECKING:
    from broker.security import ZooKeeperAuth

__all__ = [
    "DEFAULT_CHROOT",
    "FORMAT_VERSION",
    "MAX_PARTITIONS",
    "NO_LEADER",
    "BrokerRegistration",
    "ClaimedElsewhere",
    "ClaimedGroup",
    "ControllerInfo",
    "ControllerMoved",
    "ElectionInProgress",
    "PartitionState",
    "PartitionStateChanged",
    "Reassignment",
    "ReassignmentInProgress",
    "Registry",
    "RegistryStatistics",
    "TopicConfig",
    "partition_name",
]


class Registry(Running):
    """A broker's (or a tool's) connection to the registry in ZooKeeper.

    Paths, under `chroot`:

        /brokers/ids/<broker_id>              ephemeral   brokers.register
        /brokers/topics/<topic>/<broker_id>   ephemeral   topics.register_topic_partitions
        /brokers/topics/<topic>/partitions/<p>/state
                                              persistent  topics.create_topic_config,
                                                          topics.write_partition_state
        /config/topics/<topic>                persistent  topics.create_topic_config
        /controller, /controller_epoch        both        controller.elect
        /admin/reassign/<topic>-<p>,          persistent  reassignments.start_reassignment,
        /admin/preferred_election                         reassignments.ask_preferred_election
        /consumers/<group>/...                both        groups.register_consumer,
                                                          groups.claim_partition,
                                                          groups.commit_offset;
                                                          groups.claim_group,
                                                          groups.write_group (a coordinator)
        /security/principals, /security/acls  persistent  security.add_principal, ...
        /config/brokers                       persistent  settings.set, settings.delete
        /config/quotas                        persistent  quotas.set, quotas.delete

    Its stores, each made on its `session` (kazoo's recipes are the model): `brokers`
    (broker.registry.brokers), `topics` (their configurations, the brokers serving them and
    the partitions' state nodes: broker.registry.topics and .states), `reassignments`
    (reassignments and preferred-leader elections asked: broker.registry.admin), `groups`
    (consumer groups, their members, owners, offsets and coordinators: broker.registry.groups
    and .coordination), `controller` (its election, broker.registry.controller), `acls`
    (ZooKeeper's ACLs on the nodes: broker.registry.acls), and the
    nodes of one JSON value each: `security` (broker.registry.security), `settings` (live
    broker settings, broker.registry.settings) and `quotas` (broker.registry.quotas).

    With `auth` (a ZooKeeperAuth), the session presents that digest identity and the nodes it
    creates carry ZooKeeper ACLs (broker.registry.session; docs/registry.md, "Who may write
    what").

    `connect_string` is "host:port[,host:port...]" (no chroot there: pass `chroot`).
    `session_timeout_s` is asked of the server, which clamps it to 2-20 of its ticks.
    Every call waits at most `request_timeout_s` for a connection and an answer, then raises
    RegistryUnavailable. kazoo reconnects on its own, waiting at most `reconnect_max_delay_s`
    between attempts.

    Ephemeral nodes registered here are re-created after a session expiry (see
    broker.registry.session); nodes of a previous session found at our paths are replaced. Use
    as a context manager, or call start() and stop(); a Registry is started once.
    """

    BASE_PATHS = ("/brokers/ids", "/brokers/topics", "/config/topics")
    SHARED_PATHS = ("/consumers",)  # the groups'
    session_type: type[Session] = Session
    """What the session is made as (a test's subclass intercepts its requests)."""

    def __init__(
        self,
        connect_string: str,
        chroot: str = DEFAULT_CHROOT,
        session_timeout_s: float = 6.0,
        *,
        request_timeout_s: float = 5.0,
        reconnect_max_delay_s: float = 2.0,
        auth: ZooKeeperAuth | None = None,
    ) -> None:
        self.session = self.session_type(
            connect_string,
            chroot,
            session_timeout_s,
            request_timeout_s=request_timeout_s,
            reconnect_max_delay_s=reconnect_max_delay_s,
            auth=auth,
            base_paths=self.BASE_PATHS,
            shared_paths=self.SHARED_PATHS,
        )

    def start(self, timeout: float = 15.0) -> None:
        """Connect and create the base paths (Session.start)."""
        self.session.start(timeout)

    def stop(self) -> None:
        """Close the session: ZooKeeper deletes its ephemeral nodes at once. Idempotent."""
        self.session.stop()

    @cached_property
    def brokers(self) -> Brokers:
        return Brokers(self.session)

    @cached_property
    def topics(self) -> TopicNodes:
        return TopicNodes(self.session, self.brokers)

    @cached_property
    def reassignments(self) -> ReassignmentNodes:
        return ReassignmentNodes(self.session, self.topics)

    @cached_property
    def groups(self) -> GroupCoordination:
        return GroupCoordination(self.session)

    @cached_property
    def controller(self) -> Controller:
        return Controller(self.session)

    @cached_property
    def acls(self) -> NodeAcls:
        return NodeAcls(self.session)

    @cached_property
    def security(self) -> Security:
        return Security(self.session)

    @cached_property
    def settings(self) -> BrokerSettingsNode:
        return BrokerSettingsNode(self.session)

    @cached_property
    def quotas(self) -> Quotas:
        return Quotas(self.session)

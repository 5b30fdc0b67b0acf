"""confluent_kafka.admin's shape over pylog's Admin and GroupCalls, for programs written for
Kafka: `AdminClient(conf)` with `create_topics`, `delete_topics`, `create_partitions`,
`describe_configs`, `alter_configs`, `incremental_alter_configs`, `list_topics`,
`describe_topics`, `describe_cluster`, `list_groups`, `list_consumer_groups`,
`describe_consumer_groups`, `delete_consumer_groups`, `list_consumer_group_offsets`,
`alter_consumer_group_offsets` and `list_offsets`, each returning
concurrent.futures.Future objects as confluent-kafka's do (a dict of them by topic, group,
resource or partition, or one), whose `result()` raises KafkaException.

The calls run one after another in the client's own thread (its ZeroMQ sockets belong to it),
in the order made. Topic settings are named as Kafka names them (`retention.ms`,
`compression.type`, ...: TOPIC_SETTINGS; -1 for "none"), or as pylog does. What pylog does not
have (ACLs set through Kafka's api, SCRAM users, record deletion and leader elections through
this client, transactions) raises KafkaException at once, with one line naming what to use
instead (docs/clients.md, "The admin client").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Final, NoReturn, TypeVar

from broker.client.admin import Admin
from broker.client.coordinator import GroupCalls
from broker.client.framing import DEFAULT_CLIENT_ID, normalize_endpoint
from broker.client.kafka import admin_records

# confluent_kafka.admin's records are this module's too (its __all__)
from broker.client.kafka.admin_records import *  # noqa: F403
from broker.client.kafka.admin_records import (
    FIXED_SETTINGS,
    GROUP_STATE_NAMES,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    ConsumerGroupDescription,
    ConsumerGroupListing,
    DescribeClusterResult,
    GroupMember,
    GroupMetadata,
    ListConsumerGroupsResult,
    ListOffsetsResultInfo,
    MemberAssignment,
    MemberDescription,
    NewPartitions,
    NewTopic,
    OffsetSpec,
    ResourceType,
    TopicDescription,
    group_kind,
    kafka_setting,
    listed_partitions,
    pylog_setting,
    refused,
)
from broker.client.kafka.errors import KafkaError, KafkaException
from broker.client.kafka.messages import (
    OFFSET_END,
    OFFSET_INVALID,
    BrokerMetadata,
    ClusterMetadata,
    TopicPartition,
    list_topics,
    offset_at,
)
from broker.client.kafka.model import (
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    ConsumerGroupType,
    Node,
    TopicCollection,
    TopicPartitionInfo,
)
from broker.client.kafka.settings import COMMON_KEYS, checked_settings, client_keys, number
from broker.errors import BrokerUnknownGroup, PylogError
from broker.groups.assignors import TopicPartition as GroupTopicPartition
from broker.lifecycle import Closing
from broker.protocol import LATEST, DescribeGroupReply, ErrorCode, GroupListing, broker_error

T = TypeVar("T")

ADMIN_KEYS: Final = COMMON_KEYS
"""The keys an AdminClient takes: the common ones (create_partitions goes through a broker, as
every other call: no ZooKeeper identity is needed any more)."""


class AdminClient(Closing):
    """confluent_kafka.admin.AdminClient's shape (module docstring). Configuration as the
    Producer's common keys (`bootstrap.servers`, `client.id`, `request.timeout.ms`, the Curve
    keys)."""

    def __init__(self, conf: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        conf = checked_settings({**(conf or {}), **kwargs}, ADMIN_KEYS, "admin client")
        self._bootstrap = str(conf["bootstrap.servers"])
        self._client_id = str(conf.get("client.id", DEFAULT_CLIENT_ID))
        self._timeout_s = (
            number("request.timeout.ms", conf.get("request.timeout.ms", 10_000)) / 1000
        )
        self._keys = client_keys(conf)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="pylog-admin")
        self._admin: Admin | None = None
        """Made, used and closed in the client's thread."""
        self._closed = False

    # the client's thread

    def _submit(self, call: Callable[..., T], *args: Any) -> Future[T]:
        """`call(*args)` in the client's thread; a PylogError it raises is the future's
        KafkaException."""
        return self._thread.submit(self._guarded, call, *args)

    @staticmethod
    def _guarded(call: Callable[..., T], *args: Any) -> T:
        try:
            return call(*args)
        except PylogError as error:
            raise KafkaException(error) from None

    def _cluster_admin(self) -> Admin:
        if self._admin is None:
            self._admin = Admin(self._bootstrap, self._client_id, self._timeout_s, keys=self._keys)
        return self._admin

    def _group(self, group: str) -> GroupCalls:
        return GroupCalls(self._bootstrap, group, self._client_id, self._timeout_s, keys=self._keys)

    # topics

    def create_topics(
        self,
        new_topics: list[NewTopic],
        operation_timeout: float = 0,
        request_timeout: float | None = None,
        validate_only: bool = False,
    ) -> dict[str, Future[None]]:
        """Create each topic; each future's result is None once every partition is served."""
        if validate_only:
            refused("validate_only", "pylog's CREATE_TOPIC has no dry run")
        return {topic.topic: self._submit(self._create, topic) for topic in new_topics}

    def _create(self, topic: NewTopic) -> None:
        if topic.replica_assignment:
            raise KafkaException(
                "replica_assignment: pylog places a new topic's replicas itself (racks apart); "
                "pylogctl topic reassign moves them afterwards"
            )
        config = dict(pylog_setting(name, value) for name, value in topic.config.items())
        if topic.replication_factor > 0:
            config["replication_factor"] = str(topic.replication_factor)
        partitions = topic.num_partitions if topic.num_partitions > 0 else 1
        self._cluster_admin().create_topic(topic.topic, partitions, config)

    def delete_topics(
        self, topics: list[str], operation_timeout: float = 0, request_timeout: float | None = None
    ) -> dict[str, Future[None]]:
        """Delete each topic and its data."""
        return {topic: self._submit(self._delete, topic) for topic in topics}

    def _delete(self, topic: str) -> None:
        self._cluster_admin().delete_topic(topic)

    def create_partitions(
        self,
        new_partitions: list[NewPartitions],
        operation_timeout: float = 0,
        request_timeout: float | None = None,
        validate_only: bool = False,
    ) -> dict[str, Future[None]]:
        """Give each topic `new_total_count` partitions in all, placed over the brokers up, as
        `pylogctl topic add-partitions` does, through a broker (CREATE_PARTITIONS). Each
        future's result is None once the registry holds them; their brokers serve them moments
        later."""
        if validate_only:
            refused("validate_only", "pylog adds partitions without a dry run")
        return {p.topic: self._submit(self._grow, p) for p in new_partitions}

    def _grow(self, grown: NewPartitions) -> None:
        if grown.replica_assignment:
            raise KafkaException(
                "replica_assignment: pylog places new partitions itself (racks apart)"
            )
        self._cluster_admin().add_partitions(grown.topic, grown.new_total_count)

    # settings

    def describe_configs(
        self, resources: list[ConfigResource], request_timeout: float | None = None
    ) -> dict[ConfigResource, Future[dict[str, ConfigEntry]]]:
        """Every setting of each topic, by Kafka's name (pylog's where Kafka has none)."""
        return {resource: self._submit(self._describe_config, resource) for resource in resources}

    def _describe_config(self, resource: ConfigResource) -> dict[str, ConfigEntry]:
        entries = {}
        for entry in self._cluster_admin().topic_config(self._topic_of(resource)):
            name, value = kafka_setting(entry.key, entry.value)
            source = (
                ConfigSource.DYNAMIC_TOPIC_CONFIG
                if entry.overridden
                else ConfigSource.DEFAULT_CONFIG
            )
            read_only = entry.key in FIXED_SETTINGS
            entries[name] = ConfigEntry(name, value, source, read_only, not entry.overridden)
        return entries

    @staticmethod
    def _topic_of(resource: ConfigResource) -> str:
        if resource.restype is not ResourceType.TOPIC:
            raise KafkaException(
                f"{resource.restype.name} settings: this client describes and alters topics'; "
                "a broker's live settings are pylogctl broker config's"
            )
        return resource.name

    def alter_configs(
        self, resources: list[ConfigResource], request_timeout: float | None = None
    ) -> dict[ConfigResource, Future[None]]:
        """Set each topic's `set_config` and put every other setting it overrides back to the
        default, as Kafka's AlterConfigs does (replication_factor, fixed, stays)."""
        return {resource: self._submit(self._replace, resource) for resource in resources}

    def _replace(self, resource: ConfigResource) -> None:
        admin = self._cluster_admin()
        topic = self._topic_of(resource)
        wanted = dict(pylog_setting(k, v) for k, v in resource.set_config_dict.items())
        now = admin.topic_config(topic)
        for entry in now:  # a fixed setting given as it is (read back, as Kafka's delta example)
            if entry.key in FIXED_SETTINGS and wanted.get(entry.key) == entry.value:
                del wanted[entry.key]
        dropped = [
            entry.key
            for entry in now
            if entry.overridden and entry.key not in wanted and entry.key not in FIXED_SETTINGS
        ]
        admin.alter_topic_config(topic, wanted, dropped)

    def incremental_alter_configs(
        self, resources: list[ConfigResource], request_timeout: float | None = None
    ) -> dict[ConfigResource, Future[None]]:
        """Change only the settings named: SET one, or DELETE one (back to the default).
        pylog's settings are single values: APPEND and SUBTRACT (for list settings) are
        refused."""
        return {resource: self._submit(self._change, resource) for resource in resources}

    def _change(self, resource: ConfigResource) -> None:
        changed: dict[str, str] = {}
        deleted: list[str] = []
        for entry in resource.incremental_configs:
            operation = entry.incremental_operation
            if operation is AlterConfigOpType.SET:
                key, value = pylog_setting(entry.name, entry.value)
                changed[key] = value
            elif operation is AlterConfigOpType.DELETE:
                deleted.append(pylog_setting(entry.name, None)[0])
            else:
                name = "none" if operation is None else operation.name
                raise KafkaException(
                    f"{entry.name}: {name}: pylog's topic settings are single values; SET or "
                    "DELETE them"
                )
        self._cluster_admin().alter_topic_config(self._topic_of(resource), changed, deleted)

    # the cluster and its topics

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> ClusterMetadata:
        """The brokers and `topic` (every topic when None), as the Producer's list_topics."""
        return self._submit(lambda: list_topics(self._cluster_admin().cluster, topic)).result()

    def describe_cluster(
        self, include_authorized_operations: bool = False, request_timeout: float | None = None
    ) -> Future[DescribeClusterResult]:
        """The brokers up (DescribeClusterResult)."""
        self._no_operations(include_authorized_operations)
        return self._submit(self._cluster_described)

    def _cluster_described(self) -> DescribeClusterResult:
        brokers = self._cluster_admin().brokers()
        nodes = [Node(b.broker_id, b.host, b.port) for b in brokers if b.up]
        return DescribeClusterResult(None, nodes)

    def describe_topics(
        self,
        topics: TopicCollection,
        include_authorized_operations: bool = False,
        request_timeout: float | None = None,
    ) -> dict[str, Future[TopicDescription]]:
        """Each topic's partitions with their leader, replicas and in-sync replicas."""
        self._no_operations(include_authorized_operations)
        return {name: self._submit(self._topic_described, name) for name in topics.topic_names}

    def _topic_described(self, name: str) -> TopicDescription:
        admin = self._cluster_admin()
        reply = admin.metadata([name])
        nodes = {b.broker_id: Node(b.broker_id, b.host, b.port) for b in reply.brokers}
        topic = admin.topic(name)

        def node(broker_id: int) -> Node:
            return nodes.get(broker_id) or Node(broker_id, "", 0)

        partitions = [
            TopicPartitionInfo(
                p.partition,
                node(p.broker_id) if p.broker_id >= 0 else None,
                [node(r) for r in p.replicas],
                [node(r) for r in p.isr],
            )
            for p in topic.partitions
        ]
        return TopicDescription(name, None, False, partitions)

    def list_offsets(
        self,
        topic_partition_offsets: Mapping[TopicPartition, OffsetSpec],
        isolation_level: object = None,
        request_timeout: float | None = None,
    ) -> dict[TopicPartition, Future[ListOffsetsResultInfo]]:
        """Each partition's offset at its OffsetSpec, asked of its leader (`isolation_level`
        either: pylog has no transactions)."""
        return {
            tp: self._submit(self._offset, tp, spec) for tp, spec in topic_partition_offsets.items()
        }

    def _offset(self, tp: TopicPartition, spec: OffsetSpec) -> ListOffsetsResultInfo:
        cluster = self._cluster_admin().cluster
        offset = offset_at(cluster, tp.topic, tp.partition, spec.time)
        if spec.time >= 0 and offset >= offset_at(cluster, tp.topic, tp.partition, LATEST):
            offset = OFFSET_END  # no message at or after that time, as Kafka says it
        return ListOffsetsResultInfo(offset)

    # consumer groups

    def list_groups(self, group: str | None = None, timeout: float = -1) -> list[GroupMetadata]:
        """Every group (or `group`), with its members, as Kafka's older call gives them."""
        return self._submit(self._groups_metadata, group).result()

    def _groups_metadata(self, only: str | None) -> list[GroupMetadata]:
        listed = []
        brokers = {b.broker_id: b for b in self._cluster_admin().brokers()}
        for listing in self._listings():
            if only is not None and listing.group != only:
                continue
            reply = self._described(listing.group)
            state = group_kind(reply)[0] if reply is not None else ConsumerGroupState.EMPTY
            holder = brokers.get(listing.coordinator)
            members = [
                GroupMember(m.member_id, m.client_id, m.client_host)
                for m in (reply.members if reply is not None else ())
            ]
            listed.append(
                GroupMetadata(
                    None
                    if holder is None
                    else BrokerMetadata(holder.broker_id, holder.host, holder.port),
                    listing.group,
                    None,
                    GROUP_STATE_NAMES.get(state, "Unknown"),
                    "consumer",
                    "" if reply is None else reply.assignor,
                    members,
                )
            )
        return listed

    def _listings(self) -> tuple[GroupListing, ...]:
        with self._group("") as calls:
            return calls.list_groups()

    def _described(self, group: str) -> DescribeGroupReply | None:
        """The group as its coordinator holds it; None for a group it knows no member of
        (only offsets)."""
        with self._group(group) as calls:
            try:
                return calls.describe()
            except BrokerUnknownGroup:
                return None

    def list_consumer_groups(
        self,
        request_timeout: float | None = None,
        states: Iterable[ConsumerGroupState] | None = None,
        types: Iterable[ConsumerGroupType] | None = None,
    ) -> Future[ListConsumerGroupsResult]:
        """Every group (those in one of `states` and of one of `types`, when given)."""
        return self._submit(self._group_listing, set(states or ()), set(types or ()))

    def _group_listing(
        self, states: set[ConsumerGroupState], types: set[ConsumerGroupType]
    ) -> ListConsumerGroupsResult:
        result = ListConsumerGroupsResult()
        for listing in self._listings():
            reply = self._described(listing.group)
            state, kind = (
                group_kind(reply)
                if reply is not None
                else (ConsumerGroupState.EMPTY, ConsumerGroupType.CONSUMER)
            )
            if (not states or state in states) and (not types or kind in types):
                result.valid.append(ConsumerGroupListing(listing.group, False, state, kind))
        return result

    def describe_consumer_groups(
        self,
        group_ids: list[str],
        include_authorized_operations: bool = False,
        request_timeout: float | None = None,
    ) -> dict[str, Future[ConsumerGroupDescription]]:
        """Each group's state, assignor, coordinator and members with what each owns and its
        target."""
        self._no_operations(include_authorized_operations)
        return {group: self._submit(self._group_described, group) for group in group_ids}

    def _group_described(self, group: str) -> ConsumerGroupDescription:
        with self._group(group) as calls:
            reply = calls.describe()
            coordinator = calls.coordinator
        state, kind = group_kind(reply)
        node = None
        if coordinator is not None:
            for broker in self._cluster_admin().brokers():
                if broker.up and normalize_endpoint(f"{broker.host}:{broker.port}") == coordinator:
                    node = Node(broker.broker_id, broker.host, broker.port)
        members = []
        for m in reply.members:
            owned = listed_partitions(m.assigned)
            going = set(listed_partitions(m.revoking))
            target = [tp for tp in owned if tp not in going] + listed_partitions(m.waiting)
            members.append(
                MemberDescription(
                    m.member_id,
                    m.client_id,
                    m.client_host,
                    MemberAssignment(owned),
                    m.instance_id or None,
                    MemberAssignment(sorted(target)),
                )
            )
        return ConsumerGroupDescription(
            group, False, members, reply.assignor, state, node, None, kind
        )

    def delete_consumer_groups(
        self, group_ids: list[str], request_timeout: float | None = None
    ) -> dict[str, Future[None]]:
        """Delete each group and its committed offsets (refused while it has members)."""
        return {group: self._submit(self._delete_group, group) for group in group_ids}

    def _delete_group(self, group: str) -> None:
        with self._group(group) as calls:
            calls.delete()

    def list_consumer_group_offsets(
        self,
        list_consumer_group_offsets_request: list[ConsumerGroupTopicPartitions],
        require_stable: bool = False,
        request_timeout: float | None = None,
    ) -> dict[str, Future[ConsumerGroupTopicPartitions]]:
        """Each group's committed offsets: of the partitions named (OFFSET_INVALID for one
        without), or of every partition it has one for."""
        return {
            asked.group_id: self._submit(self._committed, asked)
            for asked in list_consumer_group_offsets_request
        }

    def _committed(self, asked: ConsumerGroupTopicPartitions) -> ConsumerGroupTopicPartitions:
        named = asked.topic_partitions
        with self._group(asked.group_id) as calls:
            found = calls.committed(sorted({tp.topic for tp in named or ()}))
        if named is None:
            partitions = [TopicPartition(tp.topic, tp.partition, o) for tp, o in found.items()]
        else:
            partitions = [
                TopicPartition(
                    tp.topic,
                    tp.partition,
                    found.get(GroupTopicPartition(tp.topic, tp.partition), OFFSET_INVALID),
                )
                for tp in named
            ]
        return ConsumerGroupTopicPartitions(asked.group_id, sorted(partitions))

    def alter_consumer_group_offsets(
        self,
        alter_consumer_group_offsets_request: list[ConsumerGroupTopicPartitions],
        request_timeout: float | None = None,
    ) -> dict[str, Future[ConsumerGroupTopicPartitions]]:
        """Commit each group's offsets, the offset to read next of each partition named (a
        byte position where a message starts: list_offsets finds them by time), through its
        coordinator, which refuses while the group has members reading those topics
        (NON_EMPTY_GROUP); a partition refused has its `error`."""
        return {
            asked.group_id: self._submit(self._alter_offsets, asked)
            for asked in alter_consumer_group_offsets_request
        }

    def _alter_offsets(self, asked: ConsumerGroupTopicPartitions) -> ConsumerGroupTopicPartitions:
        named = asked.topic_partitions or []
        if not named or any(tp.offset < 0 for tp in named):
            raise KafkaException(
                "alter_consumer_group_offsets: give each partition the offset to read next (0 or "
                "more: a byte position where a message starts)"
            )
        offsets = {GroupTopicPartition(tp.topic, tp.partition): tp.offset for tp in named}
        with self._group(asked.group_id) as calls:
            outcome = calls.commit(offsets)
        partitions = []
        for tp in named:
            done = TopicPartition(tp.topic, tp.partition, tp.offset)
            code = outcome.get(GroupTopicPartition(tp.topic, tp.partition), ErrorCode.NONE)
            if code != ErrorCode.NONE:
                done.error = KafkaError.of(broker_error(code, f"{tp.topic}-{tp.partition}"))
            partitions.append(done)
        return ConsumerGroupTopicPartitions(asked.group_id, partitions)

    # what pylog does not do through this client

    @staticmethod
    def _no_operations(asked: bool) -> None:
        if asked:
            refused(
                "include_authorized_operations",
                "pylog's ACLs grant Curve keys operations on topics; pylogctl acl list shows them",
            )

    def create_acls(self, *args: Any, **kwargs: Any) -> NoReturn:
        refused("create_acls", "pylog's ACLs grant Curve keys operations: pylogctl acl add")

    def describe_acls(self, *args: Any, **kwargs: Any) -> NoReturn:
        refused("describe_acls", "pylog's ACLs grant Curve keys operations: pylogctl acl list")

    def delete_acls(self, *args: Any, **kwargs: Any) -> NoReturn:
        refused("delete_acls", "pylog's ACLs grant Curve keys operations: pylogctl acl remove")

    def describe_user_scram_credentials(self, *args: Any, **kwargs: Any) -> NoReturn:
        refused("SCRAM", "pylog authenticates clients by Curve keys (docs/security.md)")

    alter_user_scram_credentials = describe_user_scram_credentials

    def delete_records(self, *args: Any, **kwargs: Any) -> NoReturn:
        refused("delete_records", "pylogctl topic delete-records moves log starts")

    def elect_leaders(self, *args: Any, **kwargs: Any) -> NoReturn:
        refused("elect_leaders", "pylogctl topic elect-preferred")

    # the client itself

    def poll(self, timeout: float = -1) -> int:
        """0: the futures complete on their own (confluent-kafka's poll serves callbacks)."""
        return 0

    def close(self) -> None:
        """Finish the calls made, then close the connections (as the end of a `with` block
        does)."""
        if not self._closed:
            self._closed = True
            self._thread.submit(self._close_admin).result()
            self._thread.shutdown()

    def _close_admin(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None


__all__ = ["ADMIN_KEYS", "AdminClient"]
__all__ += admin_records.__all__

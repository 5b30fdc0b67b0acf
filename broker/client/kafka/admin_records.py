"""The records and enumerations of confluent_kafka.admin (NewTopic, ConfigResource,
ConsumerGroupDescription, ...) and the topic settings as Kafka names them, for the admin client
(broker.client.kafka.admin, which re-exports them)."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Final, NoReturn

from broker.client.kafka.errors import KafkaError, KafkaException, not_implemented
from broker.client.kafka.messages import BrokerMetadata, TopicPartition
from broker.client.kafka.model import (
    ConsumerGroupState,
    ConsumerGroupType,
    Node,
    TopicPartitionInfo,
)
from broker.protocol import EARLIEST, LATEST, DescribeGroupReply, GroupPartitions

TOPIC_SETTINGS: Final = {
    "flush.messages": "flush_messages",
    "flush.ms": "flush_interval_ms",
    "segment.bytes": "segment_bytes",
    "segment.ms": "segment_ms",
    "retention.ms": "retention_ms",
    "retention.bytes": "retention_bytes",
    "max.message.bytes": "max_message_bytes",
    "compression.type": "compression",
    "min.insync.replicas": "min_insync_replicas",
    "unclean.leader.election.enable": "unclean_leader_election",
}
"""Kafka's name of each topic setting pylog has, to pylog's (docs/protocol.md, "Topic
settings"); `replication_factor` has none (NewTopic's replication_factor sets it)."""
_UNLIMITED: Final = frozenset({"segment_ms", "retention_ms", "retention_bytes"})
"""pylog's settings whose "none" (no limit) is Kafka's -1."""
_KAFKA_NAMES: Final = {pylog: kafka for kafka, pylog in TOPIC_SETTINGS.items()}
FIXED_SETTINGS: Final = frozenset({"replication_factor"})
"""Set at creation only: alter_configs leaves it as it is."""


def pylog_setting(name: str, value: str | None) -> tuple[str, str]:
    """A topic setting as Kafka writes it, as pylog's CREATE_TOPIC and ALTER_CONFIG take it."""
    key = TOPIC_SETTINGS.get(name, name)
    text = "" if value is None else str(value).strip()
    if key in _UNLIMITED and text == "-1":
        text = "none"
    elif key == "unclean_leader_election" and text.lower() in ("true", "false"):
        text = "1" if text.lower() == "true" else "0"
    elif key == "compression" and text.lower() == "uncompressed":
        text = "none"
    return key, text


def kafka_setting(key: str, value: str) -> tuple[str, str]:
    """A topic setting as DESCRIBE_CONFIG gives it, as Kafka names and writes it."""
    name = _KAFKA_NAMES.get(key, key)
    if key in _UNLIMITED and value == "none":
        value = "-1"
    elif key == "unclean_leader_election":
        value = "true" if value == "1" else "false"
    elif key == "compression" and value == "none":
        value = "uncompressed"
    return name, value


class ResourceType(Enum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    BROKER = 4
    TRANSACTIONAL_ID = 5

    def __lt__(self, other: ResourceType) -> bool:
        return self.value < other.value


class ConfigSource(Enum):
    UNKNOWN_CONFIG = 0
    DYNAMIC_TOPIC_CONFIG = 1
    DYNAMIC_BROKER_CONFIG = 2
    DYNAMIC_DEFAULT_BROKER_CONFIG = 3
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5
    GROUP_CONFIG = 8


class AlterConfigOpType(Enum):
    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3


class AclOperation(Enum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12


class AclPermissionType(Enum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


class ResourcePatternType(Enum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class ScramMechanism(Enum):
    UNKNOWN = 0
    SCRAM_SHA_256 = 1
    SCRAM_SHA_512 = 2


@dataclass
class AclBinding:
    """Taken so that programs building one import; create_acls and the rest refuse it (pylog's
    ACLs grant Curve keys operations on topics: pylogctl acl)."""

    restype: ResourceType
    name: str | None
    resource_pattern_type: ResourcePatternType
    principal: str | None
    host: str | None
    operation: AclOperation
    permission_type: AclPermissionType


AclBindingFilter = AclBinding


@dataclass
class ScramCredentialInfo:
    mechanism: ScramMechanism
    iterations: int


@dataclass
class UserScramCredentialUpsertion:
    user: str
    scram_credential_info: ScramCredentialInfo
    password: bytes
    salt: bytes | None = None


@dataclass
class UserScramCredentialDeletion:
    user: str
    mechanism: ScramMechanism


class OffsetSpec:
    """Which offset list_offsets asks for: earliest(), latest(), for_timestamp(ms)."""

    def __init__(self, time: int) -> None:
        self.time = time
        """EARLIEST, LATEST or ms since the epoch (OFFSETS' time)."""

    @classmethod
    def earliest(cls) -> OffsetSpec:
        return cls(EARLIEST)

    @classmethod
    def latest(cls) -> OffsetSpec:
        return cls(LATEST)

    @classmethod
    def for_timestamp(cls, timestamp: int) -> OffsetSpec:
        if timestamp < 0:
            raise ValueError("for_timestamp takes a time in ms since the epoch")
        return cls(timestamp)

    @classmethod
    def max_timestamp(cls) -> NoReturn:
        raise not_implemented(
            "OffsetSpec.max_timestamp: pylog's OFFSETS finds offsets by time from the start "
            "of a partition (for_timestamp), not the message with the largest timestamp"
        )


@dataclass
class ListOffsetsResultInfo:
    """An offset list_offsets found: a byte position (OFFSET_END, -1: no message at or after
    the time asked); `timestamp` -1 (pylog's OFFSETS does not say it)."""

    offset: int
    timestamp: int = -1
    leader_epoch: int | None = None


class NewTopic:
    """A topic create_topics makes: `num_partitions` (-1: 1), `replication_factor` (-1: the
    topic setting's default, 1) and `config` (topic settings, Kafka's names or pylog's)."""

    def __init__(
        self,
        topic: str,
        num_partitions: int = -1,
        replication_factor: int = -1,
        replica_assignment: list[list[int]] | None = None,
        config: Mapping[str, str] | None = None,
    ) -> None:
        self.topic = topic
        self.num_partitions = num_partitions
        self.replication_factor = replication_factor
        self.replica_assignment = replica_assignment
        self.config = dict(config or {})

    def __repr__(self) -> str:
        return f"NewTopic(topic={self.topic},num_partitions={self.num_partitions})"


class NewPartitions:
    """A topic's new partition count in all, for create_partitions."""

    def __init__(
        self,
        topic: str,
        new_total_count: int,
        replica_assignment: list[list[int]] | None = None,
    ) -> None:
        self.topic = topic
        self.new_total_count = new_total_count
        self.replica_assignment = replica_assignment

    def __repr__(self) -> str:
        return f"NewPartitions(topic={self.topic},new_total_count={self.new_total_count})"


class ConfigEntry:
    """A setting describe_configs returns (Kafka's name, value as text, where it comes from),
    or one incremental_alter_configs changes (`incremental_operation`)."""

    def __init__(
        self,
        name: str,
        value: str | None,
        source: ConfigSource = ConfigSource.UNKNOWN_CONFIG,
        is_read_only: bool = False,
        is_default: bool = False,
        is_sensitive: bool = False,
        is_synonym: bool = False,
        synonyms: Mapping[str, ConfigEntry] | None = None,
        incremental_operation: AlterConfigOpType | None = None,
    ) -> None:
        self.name = name
        self.value = value
        self.source = source
        self.is_read_only = is_read_only
        self.is_default = is_default
        self.is_sensitive = is_sensitive
        self.is_synonym = is_synonym
        self.synonyms = dict(synonyms or {})
        self.incremental_operation = incremental_operation

    def __repr__(self) -> str:
        return f'ConfigEntry({self.name}="{self.value}")'

    def __str__(self) -> str:
        return f'{self.name}="{self.value}"'


@functools.total_ordering
class ConfigResource:
    """A resource with settings: pylog's are topics (ResourceType.TOPIC, or "TOPIC" / "topic");
    `set_config` what alter_configs sets, `incremental_configs` what
    incremental_alter_configs changes."""

    Type = ResourceType

    def __init__(
        self,
        restype: ResourceType | str | int,
        name: str,
        set_config: Mapping[str, str] | None = None,
        described_configs: Mapping[str, ConfigEntry] | None = None,
        error: KafkaError | None = None,
        incremental_configs: Iterable[ConfigEntry] | None = None,
    ) -> None:
        if name is None:
            raise ValueError("Expected resource name to be a string")
        if isinstance(restype, str):
            try:
                restype = ResourceType[restype.upper()]
            except KeyError:
                raise ValueError(
                    f'Unknown resource type "{restype}": should be a ConfigResource.Type'
                ) from None
        elif isinstance(restype, int):
            restype = ResourceType(restype)
        self.restype = restype
        self.name = name
        self.set_config_dict = dict(set_config or {})
        self.incremental_configs = list(incremental_configs or ())
        self.configs = None if described_configs is None else dict(described_configs)
        self.error = error

    def __repr__(self) -> str:
        return f"ConfigResource({self.restype},{self.name})"

    def __hash__(self) -> int:
        return hash((self.restype, self.name))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ConfigResource):
            return NotImplemented
        return (self.restype, self.name) == (other.restype, other.name)

    def __lt__(self, other: ConfigResource) -> bool:
        return (self.restype.value, self.name) < (other.restype.value, other.name)

    def __len__(self) -> int:
        return len(self.set_config_dict)

    def set_config(self, name: str, value: str, overwrite: bool = True) -> None:
        if overwrite or name not in self.set_config_dict:
            self.set_config_dict[name] = value

    def add_incremental_config(self, config_entry: ConfigEntry) -> None:
        self.incremental_configs.append(config_entry)


@dataclass
class GroupMember:
    """A member of list_groups' GroupMetadata (confluent_kafka.admin's): `metadata` and
    `assignment` are Kafka's serialized protocol bytes, empty here (pylog's are
    describe_consumer_groups' MemberDescription)."""

    id: str
    client_id: str
    client_host: str
    metadata: bytes = b""
    assignment: bytes = b""


@dataclass
class GroupMetadata:
    """A group as list_groups (Kafka's older call) gives it."""

    broker: BrokerMetadata | None
    id: str
    error: KafkaError | None
    state: str
    protocol_type: str
    protocol: str
    members: list[GroupMember] = field(default_factory=list)

    def __str__(self) -> str:
        return self.id


@dataclass
class ConsumerGroupListing:
    group_id: str
    is_simple_consumer_group: bool
    state: ConsumerGroupState
    type: ConsumerGroupType


@dataclass
class ListConsumerGroupsResult:
    valid: list[ConsumerGroupListing] = field(default_factory=list)
    errors: list[KafkaException] = field(default_factory=list)


@dataclass
class MemberAssignment:
    topic_partitions: list[TopicPartition] = field(default_factory=list)


@dataclass
class MemberDescription:
    member_id: str
    client_id: str
    host: str
    assignment: MemberAssignment
    group_instance_id: str | None = None
    target_assignment: MemberAssignment | None = None


@dataclass
class ConsumerGroupDescription:
    group_id: str
    is_simple_consumer_group: bool
    members: list[MemberDescription]
    partition_assignor: str
    state: ConsumerGroupState
    coordinator: Node | None
    authorized_operations: list[AclOperation] | None = None
    type: ConsumerGroupType = ConsumerGroupType.CONSUMER


@dataclass
class TopicDescription:
    name: str
    topic_id: None
    is_internal: bool
    partitions: list[TopicPartitionInfo]
    authorized_operations: list[AclOperation] | None = None


@dataclass
class DescribeClusterResult:
    """The brokers up (`nodes`); pylog has no cluster id, and no DESCRIBE_CLUSTER field names
    the controller: `controller` None."""

    controller: Node | None
    nodes: list[Node]
    cluster_id: str | None = None
    authorized_operations: list[AclOperation] | None = None


_STATES: Final = {
    0: ConsumerGroupState.EMPTY,
    1: ConsumerGroupState.STABLE,
    2: ConsumerGroupState.COMPLETING_REBALANCING,
}
"""DESCRIBE_GROUP's state (docs/protocol.md) as confluent-kafka names it; 3 (the paper's
protocol) is a CLASSIC group, STABLE with members and EMPTY without."""
GROUP_STATE_NAMES: Final = {
    ConsumerGroupState.EMPTY: "Empty",
    ConsumerGroupState.STABLE: "Stable",
    ConsumerGroupState.COMPLETING_REBALANCING: "CompletingRebalance",
}
"""list_groups' state strings, Kafka's."""


def group_kind(reply: DescribeGroupReply) -> tuple[ConsumerGroupState, ConsumerGroupType]:
    if reply.state == 3:
        state = ConsumerGroupState.STABLE if reply.members else ConsumerGroupState.EMPTY
        return state, ConsumerGroupType.CLASSIC
    return _STATES.get(reply.state, ConsumerGroupState.UNKNOWN), ConsumerGroupType.CONSUMER


def listed_partitions(lists: Iterable[GroupPartitions]) -> list[TopicPartition]:
    return sorted(TopicPartition(g.topic, p) for g in lists for p in g.partitions)


def refused(name: str, instead: str) -> NoReturn:
    raise not_implemented(f"{name}: {instead} (docs/clients.md, 'The admin client')")


__all__ = [
    "TOPIC_SETTINGS",
    "AclBinding",
    "AclOperation",
    "AclPermissionType",
    "AlterConfigOpType",
    "ConfigEntry",
    "ConfigResource",
    "ConfigSource",
    "ConsumerGroupDescription",
    "ConsumerGroupListing",
    "DescribeClusterResult",
    "GroupMember",
    "GroupMetadata",
    "ListConsumerGroupsResult",
    "ListOffsetsResultInfo",
    "MemberAssignment",
    "MemberDescription",
    "NewPartitions",
    "NewTopic",
    "OffsetSpec",
    "ResourcePatternType",
    "ResourceType",
    "ScramCredentialInfo",
    "ScramMechanism",
    "TopicDescription",
    "UserScramCredentialDeletion",
    "UserScramCredentialUpsertion",
]

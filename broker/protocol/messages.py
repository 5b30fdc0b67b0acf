"""The requests and replies of every api as values: what encode_request and decode_request,
encode_reply and decode_reply turn into frames and back."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from broker.log.epochs import EpochEntry
from broker.log.message import Buffer
from broker.log.producers import StoredSet
from broker.protocol.apis import Ack, Api

# -- requests and replies ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RequestHeader:
    """The start of a request's frame; the body follows right after client_id. `version` is
    the api_version; `correlation_id` comes back in the
    reply; `client_id` names the client in the broker's logs."""

    api: Api
    version: int
    correlation_id: int
    client_id: str = ""


@dataclass(frozen=True, slots=True)
class ProduceRequest:
    """Append `message_set` (messages back to back: the rest of the frame after the body) to a
    partition.

    Version 3 only (0 before): an idempotent producer's `producer_id` (0: none, the set is
    not deduplicated), `producer_epoch` and `sequence`, the set's number among that producer's
    sets to this partition (docs/protocol.md, PRODUCE)."""

    api: ClassVar[Api] = Api.PRODUCE
    topic: str
    partition: int
    ack: Ack
    message_set: Buffer
    producer_id: int = 0
    producer_epoch: int = 0
    sequence: int = 0


@dataclass(frozen=True, slots=True)
class FetchRequest:
    """Whole messages from `offset`, at most `max_bytes` of them; wait up to `max_wait_ms` for
    `min_bytes` to be readable past `offset` before answering with what there is.

    Version 2 only, with these defaults at version 1: `replica_id`, the asking follower's
    broker id (-1: a consumer); `leader_epoch`, the asker's view of the partition's leader
    epoch (-1: not known, not checked); `flushed_offset`, where the asking replica's own
    flushed bytes end (0 from a consumer)."""

    api: ClassVar[Api] = Api.FETCH
    topic: str
    partition: int
    offset: int
    max_bytes: int
    max_wait_ms: int
    min_bytes: int
    replica_id: int = -1
    leader_epoch: int = -1
    flushed_offset: int = 0


@dataclass(frozen=True, slots=True)
class OffsetsRequest:
    """`time` is LATEST (-1), EARLIEST (-2) or a timestamp in ms since the Unix epoch."""

    api: ClassVar[Api] = Api.OFFSETS
    topic: str
    partition: int
    time: int


@dataclass(frozen=True, slots=True)
class MetadataRequest:
    """Brokers and the partitions of `topics`; of every topic when `topics` is empty."""

    api: ClassVar[Api] = Api.METADATA
    topics: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class CreateTopicRequest:
    """Create a topic of `partitions` partitions. `config` maps topic settings (LogConfig field
    names: flush_messages, segment_bytes, retention_ms, ...) to decimal text, or "none" for no
    limit, in wire order; the broker checks keys and values (broker.config), not this module."""

    api: ClassVar[Api] = Api.CREATE_TOPIC
    topic: str
    partitions: int
    config: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class DeleteTopicRequest:
    """Delete a topic's partitions, with their data, and its registration."""

    api: ClassVar[Api] = Api.DELETE_TOPIC
    topic: str


@dataclass(frozen=True, slots=True)
class CreatePartitionsRequest:
    """Give a topic `count` partitions in all (more than it has), the new ones placed over the
    brokers up as a new topic's would be."""

    api: ClassVar[Api] = Api.CREATE_PARTITIONS
    topic: str
    count: int


@dataclass(frozen=True, slots=True)
class DescribeClusterRequest:
    """Every broker of the cluster, up or down, and the ZooKeeper that holds its registry."""

    api: ClassVar[Api] = Api.DESCRIBE_CLUSTER


@dataclass(frozen=True, slots=True)
class DescribePartitionRequest:
    """The state of one partition on the broker that holds it: offsets, size on disk,
    segments, oldest timestamp and the settings in effect."""

    api: ClassVar[Api] = Api.DESCRIBE_PARTITION
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class DescribeConfigRequest:
    """Every setting of a topic: its own value, or the answering broker's default."""

    api: ClassVar[Api] = Api.DESCRIBE_CONFIG
    topic: str


@dataclass(frozen=True, slots=True)
class AlterConfigRequest:
    """Change a topic's settings live: `set` maps settings to decimal text or "none" (as for
    CREATE_TOPIC), `delete` names settings that go back to the brokers' defaults."""

    api: ClassVar[Api] = Api.ALTER_CONFIG
    topic: str
    set: Mapping[str, str]
    delete: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class OffsetForLeaderEpochRequest:
    """A replica that starts following asks the leader where `leader_epoch` (its own latest,
    -1 for a replica without history) ends on the leader: the truncation of
    docs/replication.md."""

    api: ClassVar[Api] = Api.OFFSET_FOR_LEADER_EPOCH
    topic: str
    partition: int
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class ProducePart:
    """One partition's part of a MULTI_PRODUCE: its message set and, from an idempotent
    producer, the set's `sequence` among that producer's sets to the partition (0 else)."""

    topic: str
    partition: int
    message_set: Buffer
    sequence: int = 0


@dataclass(frozen=True, slots=True)
class MultiProduceRequest:
    """Append a message set to each of several partitions of this broker (`parts`, in order:
    two parts of one partition are appended in the order they come), each part answered apart
    as a PRODUCE of version 3 to its partition would be (docs/protocol.md, MULTI_PRODUCE).
    `producer_id` and `producer_epoch`: an idempotent producer's, for every part (0: none)."""

    api: ClassVar[Api] = Api.MULTI_PRODUCE
    ack: Ack
    parts: tuple[ProducePart, ...]
    producer_id: int = 0
    producer_epoch: int = 0


@dataclass(frozen=True, slots=True)
class FetchPart:
    """One partition's part of a MULTI_FETCH: where to read from, at most `max_bytes` of it;
    `leader_epoch` and `flushed_offset` as in a FetchRequest of version 2."""

    topic: str
    partition: int
    offset: int
    max_bytes: int
    leader_epoch: int = -1
    flushed_offset: int = 0


@dataclass(frozen=True, slots=True)
class SessionPartition:
    """A partition a fetch session forgets (MULTI_FETCH version 2's `forgotten`)."""

    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class MultiFetchRequest:
    """Read from each of several partitions of this broker (`parts`), each part served as a
    FetchRequest of version 5 to its partition would be, at most `max_bytes` in all (but a
    first message whole), waiting up to `max_wait_ms` for `min_bytes` to be readable over
    all the parts (docs/protocol.md, MULTI_FETCH). `replica_id` as in FetchRequest."""

    api: ClassVar[Api] = Api.MULTI_FETCH
    replica_id: int
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    parts: tuple[FetchPart, ...]
    session_id: int = 0
    """Version 2: a follower's fetch session (docs/protocol.md, MULTI_FETCH version 2): 0 with
    `session_epoch` 0 asks for a new one, the id the broker gave with the next epoch goes on
    with it; `session_epoch` SESSIONLESS (-1, the only value of version 1): none."""
    session_epoch: int = -1
    forgotten: tuple[SessionPartition, ...] = ()
    """Version 2: partitions a session's fetch no longer reads."""

    def part_request(self, part: FetchPart) -> FetchRequest:
        """The FETCH that `part` is served as."""
        return FetchRequest(
            part.topic,
            part.partition,
            part.offset,
            part.max_bytes,
            self.max_wait_ms,
            self.min_bytes,
            self.replica_id,
            part.leader_epoch,
            part.flushed_offset,
        )


# -- consumer groups (docs/protocol.md, "Consumer groups") -------------------------------------


@dataclass(frozen=True, slots=True)
class GroupPartitions:
    """One topic of a partition list: the topic and its `partitions`, ascending, without
    repeats (a list names each topic once). partition_list builds a list from pairs."""

    topic: str
    partitions: tuple[int, ...]


def partition_list(pairs: Iterable[tuple[str, int]]) -> tuple[GroupPartitions, ...]:
    """A partition list of (topic, partition) pairs in any order, repeats dropped: topics in
    name order, each with its partitions ascending, as the wire wants them."""
    by_topic: dict[str, set[int]] = {}
    for topic, partition in pairs:
        by_topic.setdefault(topic, set()).add(partition)
    return tuple(GroupPartitions(t, tuple(sorted(by_topic[t]))) for t in sorted(by_topic))


@dataclass(frozen=True, slots=True)
class GroupHeartbeatRequest:
    """A consumer group member's heartbeat, sent to the group's coordinator: join
    (`member_epoch` 0), stay, report what it owns (`owned`) and learn what to own; leave
    (`member_epoch` -1, or -2 for a static member coming back within its session).
    `instance_id` "" for none, `assignor` "" for the broker's default; `topics` the
    subscription, at least one (a leave's too)."""

    api: ClassVar[Api] = Api.GROUP_HEARTBEAT
    group: str
    member_id: str
    member_epoch: int
    instance_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    assignor: str
    topics: tuple[str, ...]
    owned: tuple[GroupPartitions, ...]


@dataclass(frozen=True, slots=True)
class CommitPart:
    """One partition's offset in an OFFSET_COMMIT: the next offset to read (below 2^63)."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class OffsetCommitRequest:
    """Record a group's offsets (1 to 10,000 parts): a member's (`member_id`, fenced by
    `member_epoch`), or without a member (`member_id` "", `member_epoch` -1)."""

    api: ClassVar[Api] = Api.OFFSET_COMMIT
    group: str
    member_id: str
    member_epoch: int
    parts: tuple[CommitPart, ...]


@dataclass(frozen=True, slots=True)
class OffsetFetchRequest:
    """A group's committed offsets for `topics`; for every topic with offsets when empty."""

    api: ClassVar[Api] = Api.OFFSET_FETCH
    group: str
    topics: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DescribeGroupRequest:
    """A group's state, epochs, assignor, members and their partitions."""

    api: ClassVar[Api] = Api.DESCRIBE_GROUP
    group: str


@dataclass(frozen=True, slots=True)
class ListGroupsRequest:
    """Every group of the cluster's registry, asked of any broker."""

    api: ClassVar[Api] = Api.LIST_GROUPS


@dataclass(frozen=True, slots=True)
class DeleteGroupRequest:
    """Delete a group without members, its offsets included; answered with an EmptyReply."""

    api: ClassVar[Api] = Api.DELETE_GROUP
    group: str


Request = (
    ProduceRequest
    | FetchRequest
    | OffsetsRequest
    | MetadataRequest
    | CreateTopicRequest
    | DeleteTopicRequest
    | CreatePartitionsRequest
    | DescribeClusterRequest
    | DescribePartitionRequest
    | DescribeConfigRequest
    | AlterConfigRequest
    | OffsetForLeaderEpochRequest
    | MultiProduceRequest
    | MultiFetchRequest
    | GroupHeartbeatRequest
    | OffsetCommitRequest
    | OffsetFetchRequest
    | DescribeGroupRequest
    | ListGroupsRequest
    | DeleteGroupRequest
)


@dataclass(frozen=True, slots=True)
class ReplyHeader:
    """The start of a reply's first frame; a success's body follows right after error_message.
    `error_code` is an ErrorCode, or a plain int for a code from a newer
    broker; `error_message` is for people, empty on success."""

    correlation_id: int
    error_code: int
    error_message: str


@dataclass(frozen=True, slots=True)
class ProduceReply:
    """`base_offset` is the offset of the first message appended, `count` how many were.
    Version 2 only (0 at version 1): `throttle_ms`, how long the broker held the request back
    before serving it, its client being over a quota."""

    base_offset: int
    count: int
    throttle_ms: int = 0


@dataclass(frozen=True, slots=True)
class PartReply:
    """One part's answer in a MULTI_PRODUCE reply: `reply` is the frame a PRODUCE of version 3
    to the part's partition would have been answered with, after its correlation_id (error_code,
    error_message, then the body or the error's fields); protocol.decode_part_reply reads it."""

    topic: str
    partition: int
    reply: Buffer


@dataclass(frozen=True, slots=True)
class MultiProduceReply:
    """Each part's answer, in the request's order; `throttle_ms` as in ProduceReply."""

    parts: tuple[PartReply, ...]
    throttle_ms: int = 0


@dataclass(frozen=True, slots=True)
class FetchPartReply:
    """One part's answer in a MULTI_FETCH reply: `reply` is the first frame a FETCH of version 5
    to the part's partition would have been answered with, after its correlation_id, and
    `message_set` its second frame (empty with an error); protocol.decode_fetch_part reads
    them."""

    topic: str
    partition: int
    reply: Buffer
    message_set: Buffer


@dataclass(frozen=True, slots=True)
class MultiFetchReply:
    """Each part's answer, in the request's order; `throttle_ms` as in FetchReply."""

    parts: tuple[FetchPartReply, ...]
    throttle_ms: int = 0
    session_id: int = 0
    """Version 2: the fetch session the request went on or began (0: none; its parts are
    then every part asked, else only those with news)."""


@dataclass(frozen=True, slots=True)
class FetchReply:
    """`message_set` (frame 2) holds whole messages starting exactly at the fetch offset; it is
    empty when nothing arrived within max_wait_ms.

    Version 2 only (left out of a version 1 reply): `leader_epoch`, the answering leader's
    epoch; `epochs`, the leader's epoch entries for the message set, in order (none when it
    is empty): the one in effect at the fetch offset (start_offset as stored, maybe below it),
    then those whose start_offset is in (offset, offset + its length]: what
    PartitionLog.append_replicated takes.

    Version 4 only (0 before): `throttle_ms`, how long the broker held the request back
    before serving it, its client being over a quota.

    Version 5 only (none before): `producers`, the idempotent producers' entries of the sets
    in the message set, in offset order, for a replica (none for a consumer): what
    PartitionLog.append_replicated takes."""

    high_watermark: int
    log_start_offset: int
    message_set: Buffer
    leader_epoch: int = -1
    epochs: tuple[EpochEntry, ...] = ()
    throttle_ms: int = 0
    producers: tuple[StoredSet, ...] = ()


@dataclass(frozen=True, slots=True)
class OffsetsReply:
    """The offset an OffsetsRequest asked for."""

    offset: int


@dataclass(frozen=True, slots=True)
class MetadataBroker:
    """A broker of the cluster and where to connect to it: tcp://host:port; its `rack`
    (version 2 only; "" for none, and at version 1)."""

    broker_id: int
    host: str
    port: int
    rack: str = ""


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """A partition of a METADATA reply and the broker to send its requests to, `broker_id`:
    its leader (the wire's `leader` at version 2, where -1 means none; a version 1 reply
    carries no -1 and gives `replicas[0]`, the preferred leader, instead). error_code
    PARTITION_UNAVAILABLE while no broker serves it (the leader down, or still opening it, or
    none), DISK_FULL or STORAGE_ERROR when the leader could not open it.

    Version 2 only (left out at version 1): `leader_epoch` (-1: none known), `replicas` (in
    assignment order, the preferred leader first) and `isr`, the in-sync replicas."""

    partition: int
    broker_id: int
    error_code: int = 0
    leader_epoch: int = -1
    replicas: tuple[int, ...] = ()
    isr: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """A topic of a METADATA reply; error_code UNKNOWN_TOPIC_OR_PARTITION (and no partitions)
    for a topic asked for that does not exist."""

    topic: str
    error_code: int
    partitions: tuple[PartitionInfo, ...]


@dataclass(frozen=True, slots=True)
class MetadataReply:
    """The brokers of the cluster, and the topics asked for (all when none was)."""

    brokers: tuple[MetadataBroker, ...]
    topics: tuple[TopicInfo, ...]


@dataclass(frozen=True, slots=True)
class EmptyReply:
    """The reply to CREATE_TOPIC, DELETE_TOPIC, ALTER_CONFIG, DELETE_GROUP and CREATE_PARTITIONS:
    success, and a body of zero bytes."""


@dataclass(frozen=True, slots=True)
class ClusterBroker:
    """A broker of a DESCRIBE_CLUSTER reply. A broker that is down (it holds partitions but is
    not registered) has host "", port 0, version "" and no log dirs."""

    broker_id: int
    up: bool
    host: str
    port: int
    version: str
    """The pylog version it runs."""
    log_dirs: tuple[str, ...]
    partitions: int
    """How many partitions of all topics it holds."""


@dataclass(frozen=True, slots=True)
class DescribeClusterReply:
    """Where the cluster's registry lives (a client needs it for consumer groups) and every
    broker, by id."""

    zookeeper_connect: str
    """host:port[,host:port...], as the answering broker connects to it."""
    zookeeper_chroot: str
    """The znode under which the registry lives, "/" for the root."""
    brokers: tuple[ClusterBroker, ...]


@dataclass(frozen=True, slots=True)
class SegmentState:
    """A segment file of a DESCRIBE_PARTITION version 2 reply: where it starts, its bytes, and
    when it was last written (ms since the epoch; what retention_ms is counted from)."""

    base_offset: int
    size_bytes: int
    last_modified_ms: int


@dataclass(frozen=True, slots=True)
class DescribePartitionReply:
    """A partition's offsets, the bytes of its segment files, how many there are, the
    timestamp of its oldest message (the one at the log start; -1 when it holds none) and
    the settings in effect on it (every topic setting, as CREATE_TOPIC spells them). From
    version 2, what retention is forecast from: how often the broker applies it, the bytes
    appended a second lately, and each segment file."""

    log_start_offset: int
    high_watermark: int
    log_end_offset: int
    size_bytes: int
    segments: int
    oldest_timestamp: int
    config: Mapping[str, str]
    retention_check_interval_ms: int = 0
    append_bytes_per_s: int = 0
    segment_list: tuple[SegmentState, ...] = ()


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    """A topic setting, its value as text, and whether the topic sets it itself (else it is
    the broker's default)."""

    key: str
    value: str
    overridden: bool


@dataclass(frozen=True, slots=True)
class DescribeConfigReply:
    """Every topic setting, in the order of the CREATE_TOPIC table."""

    entries: tuple[ConfigEntry, ...]


@dataclass(frozen=True, slots=True)
class OffsetForLeaderEpochReply:
    """The largest leader epoch the leader has that is <= the one asked and where it ends on
    the leader: the start offset of the leader's first entry with a larger epoch, or the
    leader's log end offset when `epoch` is its latest; (-1, the leader's log start offset)
    when it has no epoch at or below the one asked (PartitionLog.end_offset_for_epoch)."""

    epoch: int
    end_offset: int


@dataclass(frozen=True, slots=True)
class GroupHeartbeatReply:
    """The member's epoch to send in its next heartbeat (-1 after a leave, -2 after a static
    member's leave with -2), when to send it (`heartbeat_interval_ms` after this reply, or at
    once when what it owns changes), and the partitions it may own now (`assignment`, a
    partition list)."""

    member_epoch: int
    heartbeat_interval_ms: int
    assignment: tuple[GroupPartitions, ...]


@dataclass(frozen=True, slots=True)
class CommitPartReply:
    """One part's answer in an OFFSET_COMMIT reply: 0 (NONE) when its offset is recorded,
    else PARTITION_NOT_ASSIGNED or UNKNOWN_TOPIC_OR_PARTITION (an ErrorCode when known)."""

    topic: str
    partition: int
    error_code: int


@dataclass(frozen=True, slots=True)
class OffsetCommitReply:
    """Each part's answer, in the request's order."""

    parts: tuple[CommitPartReply, ...]


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    """A partition's committed offset: the next one to read."""

    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class CommittedTopic:
    """A topic's committed partitions, and theirs only."""

    topic: str
    offsets: tuple[CommittedOffset, ...]


@dataclass(frozen=True, slots=True)
class OffsetFetchReply:
    """The committed offsets of the topics asked (of every topic with offsets when none was);
    a partition without a committed offset is not listed, nor a topic without any."""

    topics: tuple[CommittedTopic, ...]


@dataclass(frozen=True, slots=True)
class GroupMemberInfo:
    """A member of a DESCRIBE_GROUP reply: its ids, where it runs, its epoch, whether it left
    as a static member (`left`), its timeouts and subscription, and three partition lists:
    what it owns (`assigned`), what it is asked to give back and has not yet (`revoking`), and
    what its target holds that another member still owns (`waiting`)."""

    member_id: str
    instance_id: str
    client_id: str
    client_host: str
    member_epoch: int
    left: bool
    session_timeout_ms: int
    rebalance_timeout_ms: int
    topics: tuple[str, ...]
    assigned: tuple[GroupPartitions, ...]
    revoking: tuple[GroupPartitions, ...]
    waiting: tuple[GroupPartitions, ...]


@dataclass(frozen=True, slots=True)
class DescribeGroupReply:
    """A group as its coordinator holds it. `state`: 0 empty, 1 stable (every member owns its
    target), 2 reconciling, 3 run by members of the paper's protocol (then `members` are those,
    with epochs -1 and empty lists)."""

    state: int
    coordinator_epoch: int
    group_epoch: int
    assignment_epoch: int
    assignor: str
    members: tuple[GroupMemberInfo, ...]


@dataclass(frozen=True, slots=True)
class GroupListing:
    """A group of a LIST_GROUPS reply: the broker holding its claim (`coordinator`, -1 when
    none does), its member ids, and the topics it has offsets for or subscribes to."""

    group: str
    coordinator: int
    members: tuple[str, ...]
    topics: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ListGroupsReply:
    """Every group under the registry's /consumers."""

    groups: tuple[GroupListing, ...]


RoutedRequest = (
    ProduceRequest
    | FetchRequest
    | OffsetsRequest
    | DescribePartitionRequest
    | OffsetForLeaderEpochRequest
)
"""The requests of ROUTED_APIS: their bodies begin with topic and partition."""


Reply = (
    ProduceReply
    | MultiProduceReply
    | MultiFetchReply
    | FetchReply
    | OffsetsReply
    | MetadataReply
    | EmptyReply
    | DescribeClusterReply
    | DescribePartitionReply
    | DescribeConfigReply
    | OffsetForLeaderEpochReply
    | GroupHeartbeatReply
    | OffsetCommitReply
    | OffsetFetchReply
    | DescribeGroupReply
    | ListGroupsReply
)


class Route(NamedTuple):
    """The partition a PRODUCE, FETCH or OFFSETS request is for: what the supervisor routes by
    to the worker that owns it."""

    topic: str
    partition: int

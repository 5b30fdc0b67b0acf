"""One table per api: its versions, its request and reply bodies field by field (names and
types as docs/protocol.md gives them, which tests/protocol checks), the errors particular to
it, and the checks its values pass once read (each body's `make`). broker.protocol.schema
compiles the bodies; requests and replies encode and decode every api through them.

A new api, or a new version of one, is a change here (and its message class, if new, in
messages), its section in docs/protocol.md and its vectors."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from broker.errors import InvalidTopic
from broker.log.epochs import MAX_OFFSET, EpochEntry
from broker.log.producers import StoredSet
from broker.protocol.apis import ACKS, API_VERSION, EARLIEST, Ack, Api
from broker.protocol.codes import ErrorCode
from broker.protocol.messages import (
    AlterConfigRequest,
    ClusterBroker,
    CommitPart,
    CommitPartReply,
    CommittedOffset,
    CommittedTopic,
    ConfigEntry,
    CreatePartitionsRequest,
    CreateTopicRequest,
    DeleteGroupRequest,
    DeleteTopicRequest,
    DescribeClusterReply,
    DescribeClusterRequest,
    DescribeConfigReply,
    DescribeConfigRequest,
    DescribeGroupReply,
    DescribeGroupRequest,
    DescribePartitionReply,
    DescribePartitionRequest,
    EmptyReply,
    FetchPart,
    FetchPartReply,
    FetchReply,
    FetchRequest,
    GroupHeartbeatReply,
    GroupHeartbeatRequest,
    GroupListing,
    GroupMemberInfo,
    GroupPartitions,
    ListGroupsReply,
    ListGroupsRequest,
    MetadataBroker,
    MetadataReply,
    MetadataRequest,
    MultiFetchReply,
    MultiFetchRequest,
    MultiProduceReply,
    MultiProduceRequest,
    OffsetCommitReply,
    OffsetCommitRequest,
    OffsetFetchReply,
    OffsetFetchRequest,
    OffsetForLeaderEpochReply,
    OffsetForLeaderEpochRequest,
    OffsetsReply,
    OffsetsRequest,
    PartitionInfo,
    PartReply,
    ProducePart,
    ProduceReply,
    ProduceRequest,
    SegmentState,
    SessionPartition,
    TopicInfo,
)
from broker.protocol.names import check_topic_name
from broker.protocol.schema import Body, Field, Many, Pair
from broker.protocol.wire import Reader

Values = dict[str, Any]


@dataclass(frozen=True, slots=True)
class ApiTable:
    """An api: its `versions` (in order), its request and reply bodies, what frames its reply
    has on success, and the error codes particular to it (docs/protocol.md's "Errors:"; any
    request may also get those of the "Apis" section)."""

    api: Api
    versions: tuple[int, ...]
    request: Body
    reply: Body
    errors: frozenset[ErrorCode] = frozenset()
    reply_frames: tuple[str, ...] = ("header and body",)


_TOPIC: Final = Field("topic", "string")


def _settings_many(attr: str, count: str) -> Many:
    return Many(attr, Field(count, "u16"), _PAIR, pairs=True)


_PAIR: Final = Body("", Pair, (Field("key", "string"), Field("value", "string")))


def _check_epoch(reader: Reader, name: str, epoch: int, none: str = "none") -> None:
    """A leader epoch is -1 (`none`) or more."""
    if epoch < -1:
        raise reader.fail(f"field {name} is {epoch}: it must be -1 ({none}) or >= 0")


def settings(topic: str, pairs: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """Settings by key, in wire order; InvalidTopic for a key given twice."""
    config: dict[str, str] = {}
    for key, value in pairs:
        if key in config:
            raise InvalidTopic(f"topic {topic}: setting {key!r} is given twice")
        config[key] = value
    return config


# -- PRODUCE -----------------------------------------------------------------------------------

PRODUCE_THROTTLE_VERSION: Final = 2
"""The PRODUCE version whose reply says how long a quota held the request back (throttle_ms,
docs/protocol.md "Quotas"); a request of an older version is held back the same."""
PRODUCE_IDEMPOTENT_VERSION: Final = 3
"""The PRODUCE version whose request carries an idempotent producer's id, epoch and sequence
(docs/protocol.md, PRODUCE); its reply is version 2's."""


def _check_ack(reader: Reader, ack: int) -> Ack:
    if ack > Ack.ALL:
        raise reader.fail(
            f"field ack is {ack}: it must be 0 (none), 1 (written), 2 (flushed) or 3 (all)"
        )
    return ACKS[ack]


def _make_produce(reader: Reader, values: Values, version: int) -> ProduceRequest:
    values["ack"] = _check_ack(reader, values["ack"])
    if not values.get("producer_id") and (values.get("producer_epoch") or values.get("sequence")):
        raise reader.fail(
            f"producer_id is 0 (no idempotent producer) but producer_epoch is "
            f"{values['producer_epoch']} and sequence {values['sequence']}: both must be 0 then"
        )
    return ProduceRequest(**values)


PRODUCE: Final = ApiTable(
    Api.PRODUCE,
    (1, 2, 3),
    Body(
        "PRODUCE",
        ProduceRequest,
        (
            _TOPIC,
            Field("partition", "u32"),
            Field("ack", "u8"),
            Field("producer_id", "u64", since=PRODUCE_IDEMPOTENT_VERSION),
            Field("producer_epoch", "u16", since=PRODUCE_IDEMPOTENT_VERSION),
            Field("sequence", "u32", since=PRODUCE_IDEMPOTENT_VERSION),
        ),
        _make_produce,
        strict=True,
        rest="message_set",
    ),
    Body(
        "PRODUCE",
        ProduceReply,
        (
            Field("base_offset", "u64"),
            Field("count", "u32"),
            Field("throttle_ms", "u32", since=PRODUCE_THROTTLE_VERSION),
        ),
    ),
    frozenset(
        {
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            ErrorCode.INVALID_MESSAGE,
            ErrorCode.MESSAGE_TOO_LARGE,
            ErrorCode.DISK_FULL,
            ErrorCode.STORAGE_ERROR,
            ErrorCode.PARTITION_UNAVAILABLE,
            ErrorCode.NOT_LEADER_FOR_PARTITION,
            ErrorCode.NOT_ENOUGH_REPLICAS,
            ErrorCode.OUT_OF_ORDER_SEQUENCE,
            ErrorCode.DUPLICATE_SEQUENCE,
            ErrorCode.INVALID_PRODUCER_EPOCH,
            ErrorCode.UNKNOWN_PRODUCER_ID,
            ErrorCode.TOO_MANY_PRODUCERS,
        }
    ),
)

# -- MULTI_PRODUCE -----------------------------------------------------------------------------

MAX_PARTS: Final = 10_000
"""The most parts a MULTI_PRODUCE, a MULTI_FETCH or an OFFSET_COMMIT carries (a broker holds at
most this many partitions)."""


def _make_multi_produce(reader: Reader, values: Values, version: int) -> MultiProduceRequest:
    values["ack"] = _check_ack(reader, values["ack"])
    parts = values["parts"]
    if not 1 <= len(parts) <= MAX_PARTS:
        raise reader.fail(f"part_count is {len(parts)}: it must be from 1 to {MAX_PARTS}")
    for part in parts:
        check_topic_name(part.topic)
    if not values["producer_id"]:
        sequenced = next((p for p in parts if p.sequence), None)
        if values["producer_epoch"] or sequenced is not None:
            raise reader.fail(
                f"producer_id is 0 (no idempotent producer) but producer_epoch is "
                f"{values['producer_epoch']} and a part's sequence "
                f"{0 if sequenced is None else sequenced.sequence}: both must be 0 then"
            )
    return MultiProduceRequest(**values)


MULTI_PRODUCE: Final = ApiTable(
    Api.MULTI_PRODUCE,
    (1,),
    Body(
        "MULTI_PRODUCE",
        MultiProduceRequest,
        (
            Field("ack", "u8"),
            Field("producer_id", "u64"),
            Field("producer_epoch", "u16"),
            Many(
                "parts",
                Field("part_count", "u32"),
                Body(
                    "MULTI_PRODUCE",
                    ProducePart,
                    (
                        _TOPIC,
                        Field("partition", "u32"),
                        Field("sequence", "u32"),
                        Field("message_set", "bytes"),
                    ),
                ),
            ),
        ),
        _make_multi_produce,
        strict=True,
    ),
    Body(
        "MULTI_PRODUCE",
        MultiProduceReply,
        (
            Field("throttle_ms", "u32"),
            Many(
                "parts",
                Field("part_count", "u32"),
                Body(
                    "MULTI_PRODUCE",
                    PartReply,
                    (_TOPIC, Field("partition", "u32"), Field("reply", "bytes")),
                ),
            ),
        ),
    ),
)

# -- FETCH -------------------------------------------------------------------------------------

REPLICA_FETCH_VERSION: Final = 2
"""The FETCH version of replication: a follower's replica_id, leader epochs both ways."""
SETS_FETCH_VERSION: Final = 3
"""The FETCH version from which a reader reads compressed sets; older ones are served each
segment up to its first, and UNSUPPORTED_FORMAT at or past it."""
FETCH_THROTTLE_VERSION: Final = 4
"""The FETCH version whose reply says how long a quota held the request back."""
PRODUCERS_FETCH_VERSION: Final = 5
"""The FETCH version whose reply to a replica carries the idempotent producers' entries of
the sets it returns (docs/protocol.md, FETCH), which a follower stores with them."""


def _check_fetch(reader: Reader, request: FetchRequest, version: int) -> None:
    if request.max_bytes < 1:
        raise reader.fail("field max_bytes is 0: it must be at least 1")
    replica_id = request.replica_id
    if replica_id < -1:
        raise reader.fail(
            f"field replica_id is {replica_id}: it must be -1 (a consumer) or a broker id"
        )
    _check_epoch(reader, "leader_epoch", request.leader_epoch, "unknown")
    if replica_id == -1 and request.flushed_offset != 0:
        raise reader.fail(
            f"field flushed_offset is {request.flushed_offset}: a consumer's (replica_id -1) "
            "must be 0"
        )


def _check_fetch_reply(reader: Reader, reply: FetchReply, version: int) -> None:
    _check_epoch(reader, "leader_epoch", reply.leader_epoch)
    epochs = reply.epochs
    for i, (epoch, start) in enumerate(epochs):
        if i and (epoch <= epochs[i - 1].epoch or start <= epochs[i - 1].start_offset):
            raise reader.fail(
                f"epoch entry {i}, ({epoch}, {start}), does not follow ({epochs[i - 1].epoch}, "
                f"{epochs[i - 1].start_offset}): epochs and start offsets must rise"
            )
        if epoch < 0:
            raise reader.fail(f"epoch entry {i} has epoch {epoch}: it must be >= 0")
    producers = reply.producers
    for i, entry in enumerate(producers):
        if not entry.producer_id or entry.end <= entry.offset:
            raise reader.fail(
                f"producer entry {i} has producer_id {entry.producer_id} and [offset, end) "
                f"[{entry.offset}, {entry.end}): the id must be > 0 and the range not empty"
            )
        if i and entry.offset < producers[i - 1].end:
            raise reader.fail(
                f"producer entry {i} starts at {entry.offset}, before the end "
                f"{producers[i - 1].end} of the one before: entries must follow each other"
            )


FETCH: Final = ApiTable(
    Api.FETCH,
    (1, 2, 3, 4, 5),
    Body(
        "FETCH",
        FetchRequest,
        (
            _TOPIC,
            Field("partition", "u32"),
            Field("offset", "u64"),
            Field("max_bytes", "u32"),
            Field("max_wait_ms", "u32"),
            Field("min_bytes", "u32"),
            Field("replica_id", "i32", since=REPLICA_FETCH_VERSION),
            Field("leader_epoch", "i32", since=REPLICA_FETCH_VERSION),
            Field("flushed_offset", "u64", since=REPLICA_FETCH_VERSION),
        ),
        check=_check_fetch,
        strict=True,
    ),
    Body(
        "FETCH",
        FetchReply,
        (
            Field("high_watermark", "u64"),
            Field("log_start_offset", "u64"),
            Field("leader_epoch", "i32", since=REPLICA_FETCH_VERSION),
            Many(
                "epochs",
                Field("epoch_count", "u16"),
                Body(
                    "FETCH",
                    EpochEntry,
                    (Field("epoch", "i32"), Field("start_offset", "u64")),
                ),
                since=REPLICA_FETCH_VERSION,
            ),
            Field("throttle_ms", "u32", since=FETCH_THROTTLE_VERSION),
            Many(
                "producers",
                Field("producer_count", "u32"),
                Body(
                    "FETCH",
                    StoredSet,
                    (
                        Field("producer_id", "u64"),
                        Field("producer_epoch", "u16"),
                        Field("sequence", "u32"),
                        Field("offset", "u64"),
                        Field("end", "u64"),
                        Field("message_count", "u32"),
                    ),
                ),
                since=PRODUCERS_FETCH_VERSION,
                strict=True,
            ),
        ),
        check=_check_fetch_reply,
        frame="message_set",
    ),
    frozenset(
        {
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            ErrorCode.OFFSET_OUT_OF_RANGE,
            ErrorCode.INVALID_OFFSET,
            ErrorCode.FETCH_SIZE_TOO_SMALL,
            ErrorCode.CORRUPT_SEGMENT,
            ErrorCode.STORAGE_ERROR,
            ErrorCode.PARTITION_UNAVAILABLE,
            ErrorCode.NOT_LEADER_FOR_PARTITION,
            ErrorCode.FENCED_LEADER_EPOCH,
            ErrorCode.UNKNOWN_LEADER_EPOCH,
            ErrorCode.UNSUPPORTED_FORMAT,
        }
    ),
    ("header and body", "message set"),
)

# -- OFFSETS -----------------------------------------------------------------------------------


def _check_offsets(reader: Reader, request: OffsetsRequest, version: int) -> None:
    if request.time < EARLIEST:
        raise reader.fail(
            f"field time is {request.time}: it must be -2 (earliest), -1 (latest) or a "
            "timestamp >= 0"
        )


OFFSETS: Final = ApiTable(
    Api.OFFSETS,
    (1,),
    Body(
        "OFFSETS",
        OffsetsRequest,
        (_TOPIC, Field("partition", "u32"), Field("time", "i64")),
        check=_check_offsets,
        strict=True,
    ),
    Body("OFFSETS", OffsetsReply, (Field("offset", "u64"),)),
    frozenset(
        {
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            ErrorCode.CORRUPT_SEGMENT,
            ErrorCode.STORAGE_ERROR,
            ErrorCode.PARTITION_UNAVAILABLE,
            ErrorCode.NOT_LEADER_FOR_PARTITION,
        }
    ),
)

# -- METADATA ----------------------------------------------------------------------------------

METADATA_LEADERS_VERSION: Final = 2
"""The METADATA version whose reply gives each partition's leader, epoch, replicas and ISR."""


def _partition_at(partition: PartitionInfo, version: int) -> PartitionInfo:
    """A partition as a version 1 reply gives it: no -1 leader, the preferred one instead."""
    if version >= METADATA_LEADERS_VERSION or partition.broker_id != -1:
        return partition
    if not partition.replicas:
        raise ValueError(
            f"partition {partition.partition} has broker_id -1 and no replicas: METADATA "
            "version 1 needs a broker id"
        )
    return PartitionInfo(partition.partition, partition.replicas[0], partition.error_code)


def _check_partition(reader: Reader, partition: PartitionInfo, version: int) -> None:
    if partition.broker_id < -1:
        raise reader.fail(
            f"field leader is {partition.broker_id}: it must be -1 (none) or a broker id"
        )
    _check_epoch(reader, "leader_epoch", partition.leader_epoch)


METADATA: Final = ApiTable(
    Api.METADATA,
    (1, 2),
    Body(
        "METADATA",
        MetadataRequest,
        (Many("topics", Field("topic_count", "u16"), _TOPIC),),
        strict=True,
    ),
    Body(
        "METADATA",
        MetadataReply,
        (
            Many(
                "brokers",
                Field("broker_count", "u16"),
                Body(
                    "METADATA",
                    MetadataBroker,
                    (
                        Field("broker_id", "u32"),
                        Field("host", "string"),
                        Field("port", "u16"),
                        Field("rack", "string", since=METADATA_LEADERS_VERSION),
                    ),
                ),
            ),
            Many(
                "topics",
                Field("topic_count", "u16"),
                Body(
                    "METADATA",
                    TopicInfo,
                    (
                        _TOPIC,
                        Field("error_code", "code"),
                        Many(
                            "partitions",
                            Field("partition_count", "u32"),
                            Body(
                                "METADATA",
                                PartitionInfo,
                                (
                                    Field("partition", "u32"),
                                    Field("broker_id", "u32", until=METADATA_LEADERS_VERSION - 1),
                                    Field(
                                        "leader",
                                        "i32",
                                        since=METADATA_LEADERS_VERSION,
                                        attr="broker_id",
                                    ),
                                    Field("leader_epoch", "i32", since=METADATA_LEADERS_VERSION),
                                    Many(
                                        "replicas",
                                        Field("replica_count", "u16"),
                                        Field("replica", "u32"),
                                        since=METADATA_LEADERS_VERSION,
                                    ),
                                    Many(
                                        "isr",
                                        Field("isr_count", "u16"),
                                        Field("isr", "u32"),
                                        since=METADATA_LEADERS_VERSION,
                                    ),
                                    Field("error_code", "code"),
                                ),
                                check=_check_partition,
                                prepare=_partition_at,
                            ),
                        ),
                    ),
                ),
            ),
        ),
    ),
)

# -- topics: CREATE_TOPIC, DELETE_TOPIC, CREATE_PARTITIONS, DESCRIBE_CONFIG, ALTER_CONFIG -------


def _make_create_topic(reader: Reader, values: Values, version: int) -> CreateTopicRequest:
    topic = values["topic"]
    if values["partitions"] < 1:
        raise InvalidTopic(f"topic {topic}: partitions is 0, a topic needs at least 1")
    return CreateTopicRequest(topic, values["partitions"], settings(topic, values["config"]))


CREATE_TOPIC: Final = ApiTable(
    Api.CREATE_TOPIC,
    (1,),
    Body(
        "CREATE_TOPIC",
        CreateTopicRequest,
        (_TOPIC, Field("partitions", "u32"), _settings_many("config", "config_count")),
        _make_create_topic,
        strict=True,
    ),
    Body("CREATE_TOPIC", EmptyReply, ()),
    frozenset(
        {
            ErrorCode.TOPIC_ALREADY_EXISTS,
            ErrorCode.REGISTRY_UNAVAILABLE,
            ErrorCode.DISK_FULL,
            ErrorCode.STORAGE_ERROR,
        }
    ),
)

DELETE_TOPIC: Final = ApiTable(
    Api.DELETE_TOPIC,
    (1,),
    Body("DELETE_TOPIC", DeleteTopicRequest, (_TOPIC,), strict=True),
    Body("DELETE_TOPIC", EmptyReply, ()),
    frozenset({ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.REGISTRY_UNAVAILABLE}),
)


def _make_create_partitions(
    reader: Reader, values: Values, version: int
) -> CreatePartitionsRequest:
    if values["count"] < 1:
        raise InvalidTopic(f"topic {values['topic']}: count is 0, a topic has at least 1 partition")
    return CreatePartitionsRequest(values["topic"], values["count"])


CREATE_PARTITIONS: Final = ApiTable(
    Api.CREATE_PARTITIONS,
    (1,),
    Body(
        "CREATE_PARTITIONS",
        CreatePartitionsRequest,
        (_TOPIC, Field("count", "u32")),
        _make_create_partitions,
        strict=True,
    ),
    Body("CREATE_PARTITIONS", EmptyReply, ()),
    frozenset(
        {
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            ErrorCode.INVALID_TOPIC,
            ErrorCode.REGISTRY_UNAVAILABLE,
        }
    ),
)

DESCRIBE_CONFIG: Final = ApiTable(
    Api.DESCRIBE_CONFIG,
    (1,),
    Body("DESCRIBE_CONFIG", DescribeConfigRequest, (_TOPIC,), strict=True),
    Body(
        "DESCRIBE_CONFIG",
        DescribeConfigReply,
        (
            Many(
                "entries",
                Field("config_count", "u16"),
                Body(
                    "DESCRIBE_CONFIG",
                    ConfigEntry,
                    (
                        Field("key", "string"),
                        Field("value", "string"),
                        Field("overridden", "flag"),
                    ),
                ),
            ),
        ),
    ),
    frozenset({ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.REGISTRY_UNAVAILABLE}),
)


def _make_alter_config(reader: Reader, values: Values, version: int) -> AlterConfigRequest:
    topic, deleted = values["topic"], values["delete"]
    changed = settings(topic, values["set"])
    for key in deleted:
        if key in changed:
            raise InvalidTopic(f"topic {topic}: setting {key!r} is both set and deleted")
    if len(set(deleted)) != len(deleted):
        raise InvalidTopic(f"topic {topic}: a setting is deleted twice")
    return AlterConfigRequest(topic, changed, deleted)


ALTER_CONFIG: Final = ApiTable(
    Api.ALTER_CONFIG,
    (1,),
    Body(
        "ALTER_CONFIG",
        AlterConfigRequest,
        (
            _TOPIC,
            _settings_many("set", "set_count"),
            Many("delete", Field("delete_count", "u16"), Field("key", "string")),
        ),
        _make_alter_config,
        strict=True,
    ),
    Body("ALTER_CONFIG", EmptyReply, ()),
    frozenset(
        {
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            ErrorCode.INVALID_TOPIC,
            ErrorCode.REGISTRY_UNAVAILABLE,
        }
    ),
)

# -- DESCRIBE_CLUSTER, DESCRIBE_PARTITION ------------------------------------------------------

DESCRIBE_CLUSTER: Final = ApiTable(
    Api.DESCRIBE_CLUSTER,
    (1,),
    Body("DESCRIBE_CLUSTER", DescribeClusterRequest, (), strict=True),
    Body(
        "DESCRIBE_CLUSTER",
        DescribeClusterReply,
        (
            Field("zookeeper_connect", "string"),
            Field("zookeeper_chroot", "string"),
            Many(
                "brokers",
                Field("broker_count", "u16"),
                Body(
                    "DESCRIBE_CLUSTER",
                    ClusterBroker,
                    (
                        Field("broker_id", "u32"),
                        Field("up", "flag"),
                        Field("host", "string"),
                        Field("port", "u16"),
                        Field("version", "string"),
                        Many("log_dirs", Field("log_dir_count", "u16"), Field("log_dir", "string")),
                        Field("partitions", "u32"),
                    ),
                ),
            ),
        ),
    ),
)


def _make_describe_partition_reply(
    reader: Reader, values: Values, version: int
) -> DescribePartitionReply:
    values["config"] = dict(values["config"])
    if "segment_list" in values:
        values["segment_list"] = tuple(values["segment_list"])
    return DescribePartitionReply(**values)


DESCRIBE_PARTITION_RETENTION_VERSION: Final = 2
"""DESCRIBE_PARTITION's version whose reply says what retention is forecast from."""

DESCRIBE_PARTITION: Final = ApiTable(
    Api.DESCRIBE_PARTITION,
    (1, DESCRIBE_PARTITION_RETENTION_VERSION),
    Body(
        "DESCRIBE_PARTITION",
        DescribePartitionRequest,
        (_TOPIC, Field("partition", "u32")),
        strict=True,
    ),
    Body(
        "DESCRIBE_PARTITION",
        DescribePartitionReply,
        (
            Field("log_start_offset", "u64"),
            Field("high_watermark", "u64"),
            Field("log_end_offset", "u64"),
            Field("size_bytes", "u64"),
            Field("segments", "u32"),
            Field("oldest_timestamp", "i64"),
            _settings_many("config", "config_count"),
            Field("retention_check_interval_ms", "u32", since=DESCRIBE_PARTITION_RETENTION_VERSION),
            Field("append_bytes_per_s", "u64", since=DESCRIBE_PARTITION_RETENTION_VERSION),
            Many(
                "segment_list",
                Field("segment_list_count", "u32"),
                Body(
                    "DESCRIBE_PARTITION",
                    SegmentState,
                    (
                        Field("base_offset", "u64"),
                        Field("size_bytes", "u64"),
                        Field("last_modified_ms", "i64"),
                    ),
                ),
                since=DESCRIBE_PARTITION_RETENTION_VERSION,
            ),
        ),
        _make_describe_partition_reply,
    ),
    frozenset(
        {
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            ErrorCode.PARTITION_UNAVAILABLE,
            ErrorCode.STORAGE_ERROR,
        }
    ),
)

# -- OFFSET_FOR_LEADER_EPOCH -------------------------------------------------------------------


def _check_offset_for_leader_epoch(
    reader: Reader, request: OffsetForLeaderEpochRequest, version: int
) -> None:
    _check_epoch(reader, "leader_epoch", request.leader_epoch, "no history")


def _check_offset_for_leader_epoch_reply(
    reader: Reader, reply: OffsetForLeaderEpochReply, version: int
) -> None:
    _check_epoch(reader, "epoch", reply.epoch)


OFFSET_FOR_LEADER_EPOCH: Final = ApiTable(
    Api.OFFSET_FOR_LEADER_EPOCH,
    (1,),
    Body(
        "OFFSET_FOR_LEADER_EPOCH",
        OffsetForLeaderEpochRequest,
        (_TOPIC, Field("partition", "u32"), Field("leader_epoch", "i32")),
        check=_check_offset_for_leader_epoch,
        strict=True,
    ),
    Body(
        "OFFSET_FOR_LEADER_EPOCH",
        OffsetForLeaderEpochReply,
        (Field("epoch", "i32"), Field("end_offset", "u64")),
        check=_check_offset_for_leader_epoch_reply,
    ),
    frozenset(
        {
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            ErrorCode.PARTITION_UNAVAILABLE,
            ErrorCode.NOT_LEADER_FOR_PARTITION,
            ErrorCode.STORAGE_ERROR,
        }
    ),
)

# -- MULTI_FETCH -------------------------------------------------------------------------------


SESSIONLESS: Final = -1
"""A MULTI_FETCH's session_epoch outside any fetch session (version 1's only one)."""
MAX_SESSION_EPOCH: Final = (1 << 31) - 1


def _make_multi_fetch(reader: Reader, values: Values, version: int) -> MultiFetchRequest:
    parts = values["parts"]
    request = MultiFetchRequest(**values)
    session = request.session_epoch != SESSIONLESS
    least = 0 if session and request.session_id else 1  # a session's next fetch: any
    if not least <= len(parts) <= MAX_PARTS:
        raise reader.fail(f"part_count is {len(parts)}: it must be from {least} to {MAX_PARTS}")
    if request.max_bytes < 1:
        raise reader.fail("field max_bytes is 0: it must be at least 1")
    if request.session_epoch < SESSIONLESS or request.session_id < 0:
        raise reader.fail(
            f"session_id {request.session_id} and session_epoch {request.session_epoch}: "
            "the id is at least 0, the epoch at least -1"
        )
    if session and request.replica_id < 0:
        raise reader.fail("a fetch session is a follower's: replica_id -1 with session_epoch")
    if (request.session_id == 0) != (request.session_epoch <= 0):
        raise reader.fail(
            f"session_id {request.session_id} with session_epoch {request.session_epoch}: "
            "0 goes with -1 (none) or 0 (a new session), another id with an epoch from 1"
        )
    if len(request.forgotten) > (MAX_PARTS if request.session_id else 0):
        raise reader.fail("forgotten partitions go only with a session's next fetch")
    for part in parts:
        check_topic_name(part.topic)
        _check_fetch(reader, request.part_request(part), PRODUCERS_FETCH_VERSION)
    for forgotten in request.forgotten:
        check_topic_name(forgotten.topic)
    return request


MULTI_FETCH: Final = ApiTable(
    Api.MULTI_FETCH,
    (1, 2),
    Body(
        "MULTI_FETCH",
        MultiFetchRequest,
        (
            Field("replica_id", "i32"),
            Field("max_wait_ms", "u32"),
            Field("min_bytes", "u32"),
            Field("max_bytes", "u32"),
            Many(
                "parts",
                Field("part_count", "u32"),
                Body(
                    "MULTI_FETCH",
                    FetchPart,
                    (
                        _TOPIC,
                        Field("partition", "u32"),
                        Field("offset", "u64"),
                        Field("max_bytes", "u32"),
                        Field("leader_epoch", "i32"),
                        Field("flushed_offset", "u64"),
                    ),
                ),
            ),
            Field("session_id", "i32", since=2),
            Field("session_epoch", "i32", since=2),
            Many(
                "forgotten",
                Field("forgotten_count", "u32"),
                Body("MULTI_FETCH", SessionPartition, (_TOPIC, Field("partition", "u32"))),
                since=2,
            ),
        ),
        _make_multi_fetch,
        strict=True,
    ),
    Body(
        "MULTI_FETCH",
        MultiFetchReply,
        (
            Field("throttle_ms", "u32"),
            Many(
                "parts",
                Field("part_count", "u32"),
                Body(
                    "MULTI_FETCH",
                    FetchPartReply,
                    (
                        _TOPIC,
                        Field("partition", "u32"),
                        Field("reply", "bytes"),
                        Field("message_set", "bytes"),
                    ),
                ),
            ),
            Field("session_id", "i32", since=2),
        ),
    ),
    frozenset({ErrorCode.FETCH_SESSION_ID_NOT_FOUND, ErrorCode.INVALID_FETCH_SESSION_EPOCH}),
)

# -- consumer groups: GROUP_HEARTBEAT, OFFSET_COMMIT, OFFSET_FETCH, DESCRIBE_GROUP, LIST_GROUPS,
# DELETE_GROUP --------------------------------------------------------------------------------

MIN_MEMBER_EPOCH: Final = -2
"""The lowest member_epoch of a GROUP_HEARTBEAT: -2, a static member's leave (-1 a leave, 0 a
join, else an epoch the coordinator gave)."""


def _partition_list(attr: str) -> Many:
    """A partition list (docs/protocol.md, "Partition lists"): topic_count, then per topic the
    topic, partition_count and its partitions. _check_partition_list checks one read."""
    return Many(
        attr,
        Field("topic_count", "u16"),
        Body(
            "partition list",
            GroupPartitions,
            (
                _TOPIC,
                Many("partitions", Field("partition_count", "u32"), Field("partition", "u32")),
            ),
        ),
    )


def _check_partition_list(reader: Reader, name: str, entries: tuple[GroupPartitions, ...]) -> None:
    """A partition list's topics distinct, each one's partitions ascending without repeats."""
    topics: set[str] = set()
    for entry in entries:
        if entry.topic in topics:
            raise reader.fail(
                f"partition list {name} names topic {entry.topic!r} twice: its topics must be "
                "distinct"
            )
        topics.add(entry.topic)
        previous = -1
        for partition in entry.partitions:
            if partition <= previous:
                raise reader.fail(
                    f"partition list {name}, topic {entry.topic!r}: field partition is "
                    f"{partition} after {previous}: partitions must ascend, without repeats"
                )
            previous = partition


_GROUP: Final = Field("group", "string")

_GROUP_ERRORS: Final = frozenset(
    {
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.COORDINATOR_LOADING,
        ErrorCode.INVALID_GROUP,
        ErrorCode.REGISTRY_ACCESS_DENIED,
    }
)
"""The errors of every api sent to a group's coordinator: another broker coordinates it, it is
being claimed or loaded, a group name not allowed, and a claim ZooKeeper refuses (a group whose
nodes a member's ZooKeeper identity secures)."""


def _make_group_heartbeat(reader: Reader, values: Values, version: int) -> GroupHeartbeatRequest:
    epoch = values["member_epoch"]
    if epoch < MIN_MEMBER_EPOCH:
        raise reader.fail(
            f"field member_epoch is {epoch}: it must be 0 (join), -1 (leave), -2 (a static "
            "member's leave) or an epoch the coordinator gave"
        )
    if not values["topics"]:
        raise reader.fail("field topic_count is 0: a member subscribes to at least one topic")
    owned = values["owned"]
    for entry in owned:
        check_topic_name(entry.topic)
    _check_partition_list(reader, "owned", owned)
    return GroupHeartbeatRequest(**values)


def _check_group_heartbeat_reply(reader: Reader, reply: GroupHeartbeatReply, version: int) -> None:
    _check_partition_list(reader, "assignment", reply.assignment)


GROUP_HEARTBEAT: Final = ApiTable(
    Api.GROUP_HEARTBEAT,
    (1,),
    Body(
        "GROUP_HEARTBEAT",
        GroupHeartbeatRequest,
        (
            _GROUP,
            Field("member_id", "string"),
            Field("member_epoch", "i32"),
            Field("instance_id", "string"),
            Field("session_timeout_ms", "u32"),
            Field("rebalance_timeout_ms", "u32"),
            Field("assignor", "string"),
            Many("topics", Field("topic_count", "u16"), _TOPIC),
            _partition_list("owned"),
        ),
        _make_group_heartbeat,
        strict=True,
    ),
    Body(
        "GROUP_HEARTBEAT",
        GroupHeartbeatReply,
        (
            Field("member_epoch", "i32"),
            Field("heartbeat_interval_ms", "u32"),
            _partition_list("assignment"),
        ),
        check=_check_group_heartbeat_reply,
    ),
    _GROUP_ERRORS
    | {
        ErrorCode.UNKNOWN_MEMBER_ID,
        ErrorCode.FENCED_MEMBER_EPOCH,
        ErrorCode.UNRELEASED_INSTANCE_ID,
        ErrorCode.GROUP_HAS_ZOOKEEPER_MEMBERS,
        ErrorCode.REGISTRY_UNAVAILABLE,
    },
)


def _make_offset_commit(reader: Reader, values: Values, version: int) -> OffsetCommitRequest:
    parts = values["parts"]
    if not 1 <= len(parts) <= MAX_PARTS:
        raise reader.fail(f"part_count is {len(parts)}: it must be from 1 to {MAX_PARTS}")
    for part in parts:
        check_topic_name(part.topic)
        if part.offset > MAX_OFFSET:
            raise reader.fail(
                f"part {part.topic}-{part.partition}: field offset is {part.offset}: offsets "
                "are below 2^63"
            )
    return OffsetCommitRequest(**values)


OFFSET_COMMIT: Final = ApiTable(
    Api.OFFSET_COMMIT,
    (1,),
    Body(
        "OFFSET_COMMIT",
        OffsetCommitRequest,
        (
            _GROUP,
            Field("member_id", "string"),
            Field("member_epoch", "i32"),
            Many(
                "parts",
                Field("part_count", "u32"),
                Body(
                    "OFFSET_COMMIT",
                    CommitPart,
                    (_TOPIC, Field("partition", "u32"), Field("offset", "u64")),
                ),
            ),
        ),
        _make_offset_commit,
        strict=True,
    ),
    Body(
        "OFFSET_COMMIT",
        OffsetCommitReply,
        (
            Many(
                "parts",
                Field("part_count", "u32"),
                Body(
                    "OFFSET_COMMIT",
                    CommitPartReply,
                    (_TOPIC, Field("partition", "u32"), Field("error_code", "code")),
                ),
            ),
        ),
    ),
    _GROUP_ERRORS
    | {
        ErrorCode.UNKNOWN_MEMBER_ID,
        ErrorCode.FENCED_MEMBER_EPOCH,
        ErrorCode.GROUP_NOT_EMPTY,
        ErrorCode.GROUP_HAS_ZOOKEEPER_MEMBERS,
        ErrorCode.REGISTRY_UNAVAILABLE,
        ErrorCode.PARTITION_NOT_ASSIGNED,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    },
)

OFFSET_FETCH: Final = ApiTable(
    Api.OFFSET_FETCH,
    (1,),
    Body(
        "OFFSET_FETCH",
        OffsetFetchRequest,
        (_GROUP, Many("topics", Field("topic_count", "u16"), _TOPIC)),
        strict=True,
    ),
    Body(
        "OFFSET_FETCH",
        OffsetFetchReply,
        (
            Many(
                "topics",
                Field("topic_count", "u16"),
                Body(
                    "OFFSET_FETCH",
                    CommittedTopic,
                    (
                        _TOPIC,
                        Many(
                            "offsets",
                            Field("partition_count", "u32"),
                            Body(
                                "OFFSET_FETCH",
                                CommittedOffset,
                                (Field("partition", "u32"), Field("offset", "u64")),
                            ),
                        ),
                    ),
                ),
            ),
        ),
    ),
    _GROUP_ERRORS | {ErrorCode.REGISTRY_UNAVAILABLE},
)


def _check_group_member(reader: Reader, member: GroupMemberInfo, version: int) -> None:
    _check_partition_list(reader, "assigned", member.assigned)
    _check_partition_list(reader, "revoking", member.revoking)
    _check_partition_list(reader, "waiting", member.waiting)


DESCRIBE_GROUP: Final = ApiTable(
    Api.DESCRIBE_GROUP,
    (1,),
    Body("DESCRIBE_GROUP", DescribeGroupRequest, (_GROUP,), strict=True),
    Body(
        "DESCRIBE_GROUP",
        DescribeGroupReply,
        (
            Field("state", "u8"),
            Field("coordinator_epoch", "i32"),
            Field("group_epoch", "i32"),
            Field("assignment_epoch", "i32"),
            Field("assignor", "string"),
            Many(
                "members",
                Field("member_count", "u16"),
                Body(
                    "DESCRIBE_GROUP",
                    GroupMemberInfo,
                    (
                        Field("member_id", "string"),
                        Field("instance_id", "string"),
                        Field("client_id", "string"),
                        Field("client_host", "string"),
                        Field("member_epoch", "i32"),
                        Field("left", "flag"),
                        Field("session_timeout_ms", "u32"),
                        Field("rebalance_timeout_ms", "u32"),
                        Many("topics", Field("topic_count", "u16"), _TOPIC),
                        _partition_list("assigned"),
                        _partition_list("revoking"),
                        _partition_list("waiting"),
                    ),
                    check=_check_group_member,
                ),
            ),
        ),
    ),
    _GROUP_ERRORS | {ErrorCode.UNKNOWN_GROUP},
)

LIST_GROUPS: Final = ApiTable(
    Api.LIST_GROUPS,
    (1,),
    Body("LIST_GROUPS", ListGroupsRequest, (), strict=True),
    Body(
        "LIST_GROUPS",
        ListGroupsReply,
        (
            Many(
                "groups",
                Field("group_count", "u32"),
                Body(
                    "LIST_GROUPS",
                    GroupListing,
                    (
                        _GROUP,
                        Field("coordinator", "i32"),
                        Many("members", Field("member_count", "u16"), Field("member_id", "string")),
                        Many("topics", Field("topic_count", "u16"), _TOPIC),
                    ),
                ),
            ),
        ),
    ),
    frozenset({ErrorCode.REGISTRY_UNAVAILABLE}),
)

DELETE_GROUP: Final = ApiTable(
    Api.DELETE_GROUP,
    (1,),
    Body("DELETE_GROUP", DeleteGroupRequest, (_GROUP,), strict=True),
    Body("DELETE_GROUP", EmptyReply, ()),
    _GROUP_ERRORS
    | {
        ErrorCode.GROUP_NOT_EMPTY,
        ErrorCode.GROUP_HAS_ZOOKEEPER_MEMBERS,
        ErrorCode.UNKNOWN_GROUP,
        ErrorCode.REGISTRY_UNAVAILABLE,
    },
)

TABLES: Final[Mapping[Api, ApiTable]] = {
    table.api: table
    for table in (
        PRODUCE,
        FETCH,
        OFFSETS,
        METADATA,
        CREATE_TOPIC,
        DELETE_TOPIC,
        DESCRIBE_CLUSTER,
        DESCRIBE_PARTITION,
        DESCRIBE_CONFIG,
        ALTER_CONFIG,
        OFFSET_FOR_LEADER_EPOCH,
        MULTI_PRODUCE,
        MULTI_FETCH,
        GROUP_HEARTBEAT,
        OFFSET_COMMIT,
        OFFSET_FETCH,
        DESCRIBE_GROUP,
        LIST_GROUPS,
        DELETE_GROUP,
        CREATE_PARTITIONS,
    )
}
"""Every api's table, by api."""
API_VERSIONS: Final[Mapping[Api, tuple[int, ...]]] = {
    api: table.versions for api, table in TABLES.items()
}
"""The api_versions this broker speaks, per api, in order."""
REPLY_CLASSES: Final[Mapping[type, ApiTable]] = {
    table.reply.cls: table for table in TABLES.values() if table.reply.cls is not EmptyReply
} | {EmptyReply: CREATE_TOPIC}
"""The table of a reply class, for its versions (EmptyReply answers CREATE_TOPIC,
DELETE_TOPIC, ALTER_CONFIG, DELETE_GROUP and CREATE_PARTITIONS, all of version 1 only)."""


def request_version(api: Api) -> int:
    """The api_version this package's clients ask `api` at unless told: the newest of PRODUCE
    and FETCH (PRODUCE's carries the idempotent producer's sequence, and its reply, as FETCH's,
    says how long a quota held it back; FETCH's reads compressed sets), version 1 of the others
    (a METADATA of version 2 is asked for where a client needs what it adds)."""
    if api is Api.FETCH:
        return FETCH_THROTTLE_VERSION
    return PRODUCE_IDEMPOTENT_VERSION if api is Api.PRODUCE else API_VERSION


def check_version(api: Api, version: int) -> None:
    if version not in API_VERSIONS[api]:
        raise ValueError(
            f"{api.name} has no version {version}: versions "
            f"{', '.join(map(str, API_VERSIONS[api]))}"
        )

"""The wire protocol of the pylog broker: frames in, values out, and back. No sockets here.

A request is one ZeroMQ frame and a reply one or two. The routing envelope (the ROUTER's
identity frame, and the empty delimiter a REQ socket adds and strips by itself; a DEALER client
sends none) is the transport's business: the functions here take and return the frames after
it, so item 0 of a frame list is "frame 1" of docs/protocol.md:

    request   frame 1  header       api_key u16, api_version u16, correlation_id u32,
                                    client_id string
                       body         right after client_id: fixed per api and api_version
                                    (API_VERSIONS: FETCH has versions 2 to 4, PRODUCE and
                                    METADATA a version 2)
                       message set  PRODUCE only: the rest of the frame, messages back to
                                    back (broker.log.message); no length field
    reply     frame 1  header       correlation_id u32, error_code i16, error_message string
                       body         right after error_message, fixed per api; absent when
                                    error_code is not 0
                       error fields the codes of ERROR_FIELDS only (INVALID_OFFSET,
                                    NOT_LEADER_FOR_PARTITION, ...), right after error_message:
                                    the values a client acts on; no text is parsed
              frame 2  message set  FETCH success only: whole messages from the fetch offset

All integers are big-endian; a string is a u16 byte length and that many bytes of UTF-8. A
frame that ends inside a field, or has bytes left over after the body's last field (for a
PRODUCE request there are none: the message set runs to the end), is malformed; error messages
name the part ("request header", "FETCH body", "reply header", ...), the field and its byte
position counted from the start of the frame. docs/protocol.md is the full description, with
test vectors that tests/protocol checks against this module.

Message sets are copied at most once: a PRODUCE request's is joined into its one frame by
encode_request (and read back by decode_request as a memoryview over that frame's tail), a
FETCH reply's is put into the frame list by encode_reply as the very object given (a view of a
segment is sent without copying) and read back by decode_reply as a memoryview over frame 2.
Decoders take any buffer as a frame (bytes, memoryview, and at run time a zmq.Frame too).
Decoding a request checks every field's framing and range and every topic name, but not the
message set, which is the partition log's job (broker.log.message.validate_message_set), nor
topic settings, which are broker.config's.

Every error has a wire code in one table, ERROR_TABLE: code, exception class, retriable.

Versions: a request's header says its api_version, and decode_request reads the body of that
version; a reply does not say it, so encode_reply and decode_reply take the version of the
request it answers (1 by default). The dataclasses hold the fields of every version, the newer
ones with defaults that mean "not said" (FetchRequest.replica_id -1, ...), so that code written
for version 1 builds and reads them unchanged. Encoding a request at version 1 with a newer
field set is a ValueError (a replica's FETCH must not go out as a consumer's); encoding a reply
at version 1 leaves the newer fields out (the asker did not ask for them).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import ClassVar, Final, Literal, NamedTuple, assert_never, overload

from broker import errors
from broker.errors import (
    AuthorizationFailed,
    BrokerError,
    BrokerShuttingDown,
    CorruptSegment,
    DiskFull,
    DuplicateSequence,
    FencedLeaderEpoch,
    FetchSizeTooSmall,
    InvalidMessage,
    InvalidOffset,
    InvalidProducerEpoch,
    InvalidTopic,
    MalformedReply,
    MalformedRequest,
    MessageTooLarge,
    NotEnoughReplicas,
    NotLeaderForPartition,
    OffsetOutOfRange,
    OutOfOrderSequence,
    PartitionUnavailable,
    PylogError,
    RegistryAccessDenied,
    RegistryUnavailable,
    RepliesNotRead,
    StorageIOError,
    TopicAlreadyExists,
    UnknownLeaderEpoch,
    UnknownTopicOrPartition,
    UnsupportedApi,
    UnsupportedFormat,
    UnsupportedVersion,
)
from broker.log.config import SettingValue
from broker.log.epochs import EpochEntry as EpochEntry  # the entries of a FETCH reply
from broker.log.message import Buffer
from broker.log.producers import StoredSet as StoredSet  # the producers of a FETCH reply

Frames = Sequence[Buffer]
"""The frames of a request or reply after the routing envelope (item 0 is frame 1): one for a
request, one or two for a reply."""

API_VERSION: Final = 1
"""The first version of every api, and the only one of most (API_VERSIONS)."""
SETS_FETCH_VERSION: Final = 3
"""The FETCH version from which a reader reads compressed sets; older ones are served each
segment up to its first, and UNSUPPORTED_FORMAT at or past it."""
EARLIEST: Final = -2
"""OFFSETS time meaning the log start offset."""
LATEST: Final = -1
"""OFFSETS time meaning the high watermark: the next offset to be written and visible."""
MAX_STRING_BYTES: Final = 0xFFFF
"""The most UTF-8 bytes a string field holds (its length is a u16)."""
MAX_TOPIC_LENGTH: Final = 249
"""The longest topic name, in characters (all of them ASCII)."""


class Api(IntEnum):
    """The api_key of a request."""

    PRODUCE = 0
    FETCH = 1
    OFFSETS = 2
    METADATA = 3
    CREATE_TOPIC = 4
    DELETE_TOPIC = 5
    DESCRIBE_CLUSTER = 6
    DESCRIBE_PARTITION = 7
    DESCRIBE_CONFIG = 8
    ALTER_CONFIG = 9
    OFFSET_FOR_LEADER_EPOCH = 10


API_VERSIONS: Final[Mapping[Api, tuple[int, ...]]] = {api: (1,) for api in Api} | {
    Api.PRODUCE: (1, 2, 3),
    Api.FETCH: (1, 2, 3, 4, 5),
    Api.METADATA: (1, 2),
}
"""The api_versions this broker speaks, per api, in order."""
PRODUCE_THROTTLE_VERSION: Final = 2
"""The PRODUCE version whose reply says how long a quota held the request back (throttle_ms,
docs/protocol.md "Quotas"); a request of an older version is held back the same."""
PRODUCE_IDEMPOTENT_VERSION: Final = 3
"""The PRODUCE version whose request carries an idempotent producer's id, epoch and sequence
(docs/protocol.md, PRODUCE); its reply is version 2's."""
FETCH_THROTTLE_VERSION: Final = 4
"""The FETCH version whose reply says how long a quota held the request back."""
PRODUCERS_FETCH_VERSION: Final = 5
"""The FETCH version whose reply to a replica carries the idempotent producers' entries of
the sets it returns (docs/protocol.md, FETCH), which a follower stores with them."""


def request_version(api: Api) -> int:
    """The api_version this package's clients ask `api` at unless told: the newest of PRODUCE
    and FETCH (PRODUCE's carries the idempotent producer's sequence, and its reply, as FETCH's,
    says how long a quota held it back; FETCH's reads compressed sets), version 1 of the others
    (a METADATA of version 2 is asked for where a client needs what it adds)."""
    if api is Api.FETCH:
        return FETCH_THROTTLE_VERSION
    return PRODUCE_IDEMPOTENT_VERSION if api is Api.PRODUCE else API_VERSION


class Ack(IntEnum):
    """When the broker answers a PRODUCE request."""

    NONE = 0
    """Never: no reply at all, not even on error."""
    WRITTEN = 1
    """Once the message set is appended to the partition (not yet flushed nor visible)."""
    FLUSHED = 2
    """Once the flush that made the message set durable on the leader is done."""
    ALL = 3
    """Once every in-sync replica has flushed it (the high watermark reached the set's end),
    the in-sync set holding at least the topic's min_insync_replicas (docs/replication.md)."""


_ACKS: Final = tuple(Ack)
"""Ack by value, without the enum call (a decoded request checks the range first)."""


class ErrorCode(IntEnum):
    """The error_code of a reply (i16). ERROR_TABLE says what each one means."""

    NONE = 0
    UNKNOWN_SERVER_ERROR = 1
    MALFORMED_REQUEST = 2
    UNSUPPORTED_API = 3
    UNSUPPORTED_VERSION = 4
    UNKNOWN_TOPIC_OR_PARTITION = 5
    INVALID_MESSAGE = 6
    MESSAGE_TOO_LARGE = 7
    INVALID_OFFSET = 8
    OFFSET_OUT_OF_RANGE = 9
    FETCH_SIZE_TOO_SMALL = 10
    CORRUPT_SEGMENT = 11
    DISK_FULL = 12
    STORAGE_ERROR = 13
    PARTITION_UNAVAILABLE = 14
    BROKER_SHUTTING_DOWN = 15
    REGISTRY_UNAVAILABLE = 16
    TOPIC_ALREADY_EXISTS = 17
    INVALID_TOPIC = 18
    AUTHORIZATION_FAILED = 19
    REGISTRY_ACCESS_DENIED = 20
    NOT_LEADER_FOR_PARTITION = 21
    NOT_ENOUGH_REPLICAS = 22
    FENCED_LEADER_EPOCH = 23
    UNKNOWN_LEADER_EPOCH = 24
    REPLIES_NOT_READ = 25
    UNSUPPORTED_FORMAT = 26
    OUT_OF_ORDER_SEQUENCE = 27
    DUPLICATE_SEQUENCE = 28
    INVALID_PRODUCER_EPOCH = 29


# -- the error table ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ErrorEntry:
    """One row of the error table: a wire code, the exception class the broker raises for it,
    and whether the same request may succeed when retried (the Unavailable branch of the error
    tree). NONE has no class, nor has UNKNOWN_SERVER_ERROR: it stands for any exception that
    is not in the table. docs/protocol.md says what each code means to a client."""

    code: ErrorCode
    exception: type[PylogError] | None
    retriable: bool

    @property
    def name(self) -> str:
        return self.code.name


ERROR_TABLE: Final[tuple[ErrorEntry, ...]] = (
    ErrorEntry(ErrorCode.NONE, None, False),
    ErrorEntry(ErrorCode.UNKNOWN_SERVER_ERROR, None, False),
    ErrorEntry(ErrorCode.MALFORMED_REQUEST, MalformedRequest, False),
    ErrorEntry(ErrorCode.UNSUPPORTED_API, UnsupportedApi, False),
    ErrorEntry(ErrorCode.UNSUPPORTED_VERSION, UnsupportedVersion, False),
    ErrorEntry(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, UnknownTopicOrPartition, False),
    ErrorEntry(ErrorCode.INVALID_MESSAGE, InvalidMessage, False),
    ErrorEntry(ErrorCode.MESSAGE_TOO_LARGE, MessageTooLarge, False),
    ErrorEntry(ErrorCode.INVALID_OFFSET, InvalidOffset, False),
    ErrorEntry(ErrorCode.OFFSET_OUT_OF_RANGE, OffsetOutOfRange, False),
    ErrorEntry(ErrorCode.FETCH_SIZE_TOO_SMALL, FetchSizeTooSmall, False),
    ErrorEntry(ErrorCode.CORRUPT_SEGMENT, CorruptSegment, False),
    ErrorEntry(ErrorCode.DISK_FULL, DiskFull, False),
    ErrorEntry(ErrorCode.STORAGE_ERROR, StorageIOError, False),
    ErrorEntry(ErrorCode.PARTITION_UNAVAILABLE, PartitionUnavailable, True),
    ErrorEntry(ErrorCode.BROKER_SHUTTING_DOWN, BrokerShuttingDown, True),
    ErrorEntry(ErrorCode.REGISTRY_UNAVAILABLE, RegistryUnavailable, True),
    ErrorEntry(ErrorCode.TOPIC_ALREADY_EXISTS, TopicAlreadyExists, False),
    ErrorEntry(ErrorCode.INVALID_TOPIC, InvalidTopic, False),
    ErrorEntry(ErrorCode.AUTHORIZATION_FAILED, AuthorizationFailed, False),
    ErrorEntry(ErrorCode.REGISTRY_ACCESS_DENIED, RegistryAccessDenied, False),
    ErrorEntry(ErrorCode.NOT_LEADER_FOR_PARTITION, NotLeaderForPartition, True),
    ErrorEntry(ErrorCode.NOT_ENOUGH_REPLICAS, NotEnoughReplicas, True),
    ErrorEntry(ErrorCode.FENCED_LEADER_EPOCH, FencedLeaderEpoch, False),
    ErrorEntry(ErrorCode.UNKNOWN_LEADER_EPOCH, UnknownLeaderEpoch, True),
    ErrorEntry(ErrorCode.REPLIES_NOT_READ, RepliesNotRead, True),
    ErrorEntry(ErrorCode.UNSUPPORTED_FORMAT, UnsupportedFormat, False),
    ErrorEntry(ErrorCode.OUT_OF_ORDER_SEQUENCE, OutOfOrderSequence, True),
    ErrorEntry(ErrorCode.DUPLICATE_SEQUENCE, DuplicateSequence, False),
    ErrorEntry(ErrorCode.INVALID_PRODUCER_EPOCH, InvalidProducerEpoch, False),
)
"""code <-> name <-> exception class <-> retriable, in code order."""

_ENTRY_BY_CODE: Final = {entry.code.value: entry for entry in ERROR_TABLE}
_CODE_BY_EXCEPTION: Final = {
    entry.exception: entry.code for entry in ERROR_TABLE if entry.exception is not None
}


def error_entry(code: int) -> ErrorEntry | None:
    """The table row of a wire error code, or None for a code this module does not know."""
    return _ENTRY_BY_CODE.get(code)


def error_code_for(error: BaseException) -> ErrorCode:
    """The wire code the broker answers `error` with: the table row of the nearest class in
    the exception's MRO, UNKNOWN_SERVER_ERROR when none is in the table. A BrokerError (an
    error another broker answered with) keeps its code."""
    if isinstance(error, BrokerError):
        entry = _ENTRY_BY_CODE.get(error.code)
        if entry is None or entry.code is ErrorCode.NONE:
            return ErrorCode.UNKNOWN_SERVER_ERROR
        return entry.code
    for cls in type(error).__mro__:
        code = _CODE_BY_EXCEPTION.get(cls)
        if code is not None:
            return code
    return ErrorCode.UNKNOWN_SERVER_ERROR


_REPLY_ERROR_BY_CODE: Final[dict[ErrorCode, type[BrokerError]]] = {
    ErrorCode.UNKNOWN_SERVER_ERROR: errors.UnknownServerError,
    ErrorCode.MALFORMED_REQUEST: errors.BrokerMalformedRequest,
    ErrorCode.UNSUPPORTED_API: errors.BrokerUnsupportedApi,
    ErrorCode.UNSUPPORTED_VERSION: errors.BrokerUnsupportedVersion,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: errors.BrokerUnknownTopicOrPartition,
    ErrorCode.INVALID_MESSAGE: errors.BrokerInvalidMessage,
    ErrorCode.MESSAGE_TOO_LARGE: errors.BrokerMessageTooLarge,
    ErrorCode.INVALID_OFFSET: errors.BrokerInvalidOffset,
    ErrorCode.OFFSET_OUT_OF_RANGE: errors.BrokerOffsetOutOfRange,
    ErrorCode.FETCH_SIZE_TOO_SMALL: errors.BrokerFetchSizeTooSmall,
    ErrorCode.CORRUPT_SEGMENT: errors.BrokerCorruptSegment,
    ErrorCode.DISK_FULL: errors.BrokerDiskFull,
    ErrorCode.STORAGE_ERROR: errors.BrokerStorageIOError,
    ErrorCode.PARTITION_UNAVAILABLE: errors.BrokerPartitionUnavailable,
    ErrorCode.BROKER_SHUTTING_DOWN: errors.BrokerShuttingDownError,
    ErrorCode.REGISTRY_UNAVAILABLE: errors.BrokerRegistryUnavailable,
    ErrorCode.TOPIC_ALREADY_EXISTS: errors.BrokerTopicAlreadyExists,
    ErrorCode.INVALID_TOPIC: errors.BrokerInvalidTopic,
    ErrorCode.AUTHORIZATION_FAILED: errors.BrokerAuthorizationFailed,
    ErrorCode.REGISTRY_ACCESS_DENIED: errors.BrokerRegistryAccessDenied,
    ErrorCode.NOT_LEADER_FOR_PARTITION: errors.BrokerNotLeaderForPartition,
    ErrorCode.NOT_ENOUGH_REPLICAS: errors.BrokerNotEnoughReplicas,
    ErrorCode.FENCED_LEADER_EPOCH: errors.BrokerFencedLeaderEpoch,
    ErrorCode.UNKNOWN_LEADER_EPOCH: errors.BrokerUnknownLeaderEpoch,
    ErrorCode.REPLIES_NOT_READ: errors.BrokerRepliesNotRead,
    ErrorCode.UNSUPPORTED_FORMAT: errors.BrokerUnsupportedFormat,
    ErrorCode.OUT_OF_ORDER_SEQUENCE: errors.BrokerOutOfOrderSequence,
    ErrorCode.DUPLICATE_SEQUENCE: errors.BrokerDuplicateSequence,
    ErrorCode.INVALID_PRODUCER_EPOCH: errors.BrokerInvalidProducerEpoch,
}
"""The class a client raises for each nonzero code: a BrokerError and the table's exception."""


def broker_error(
    code: int, message: str, fields: Mapping[str, int | str] | None = None
) -> BrokerError:
    """The client-side exception for a reply's nonzero error code: that code's own BrokerError
    subclass, also an instance of the table's exception class (`except TopicAlreadyExists`
    catches it), with the reply's error fields (ERROR_FIELDS) as attributes of the same name.
    A code this module does not know (from a newer broker) is a plain BrokerError named
    UNKNOWN_ERROR_<code>, not retriable."""
    entry = _ENTRY_BY_CODE.get(code)
    if entry is None:
        return BrokerError(code, f"UNKNOWN_ERROR_{code}", message, False)
    error_class = _REPLY_ERROR_BY_CODE.get(entry.code, BrokerError)
    error = error_class(code, entry.name, message, entry.retriable)
    for name, value in (fields or {}).items():
        setattr(error, name, value)  # the broker-side class declares it (broker.errors)
    return error


# -- topic names and settings ------------------------------------------------------------------

_TOPIC_NAME: Final = re.compile(r"[A-Za-z0-9._-]+")
_TOPIC_CHARACTER: Final = re.compile(r"[A-Za-z0-9._-]")


_checked_topics: set[str] = set()
_CHECKED_TOPICS_MAX: Final = 100_000


def check_topic_name(topic: str) -> None:
    """Raise InvalidTopic unless `topic` is 1-249 characters of A-Z a-z 0-9 . _ - and is
    neither "." nor ".." (a topic name becomes a directory name). Names found good are
    remembered (up to _CHECKED_TOPICS_MAX): every routed request checks its topic."""
    if topic in _checked_topics:
        return
    if _TOPIC_NAME.fullmatch(topic) and len(topic) <= MAX_TOPIC_LENGTH:
        if topic not in (".", "..") and len(_checked_topics) < _CHECKED_TOPICS_MAX:
            _checked_topics.add(topic)
        if topic in (".", ".."):
            raise InvalidTopic(f"topic name {topic!r} is not allowed: it names a directory")
        return
    if not topic:
        raise InvalidTopic("topic name is empty: it needs 1 to 249 characters")
    if len(topic) > MAX_TOPIC_LENGTH:
        raise InvalidTopic(
            f"topic name of {len(topic)} characters is over the limit of {MAX_TOPIC_LENGTH}"
        )
    position = next(i for i, char in enumerate(topic) if not _TOPIC_CHARACTER.fullmatch(char))
    raise InvalidTopic(
        f"topic name {topic!r} has {topic[position]!r} at position {position}: only "
        "A-Z a-z 0-9 . _ - are allowed"
    )


def settings_text(settings: Mapping[str, SettingValue]) -> dict[str, str]:
    """Topic settings as the wire spells them: decimal text, a word, or "none" for a limit
    off."""
    return {key: "none" if value is None else str(value) for key, value in settings.items()}


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


Request = (
    ProduceRequest
    | FetchRequest
    | OffsetsRequest
    | MetadataRequest
    | CreateTopicRequest
    | DeleteTopicRequest
    | DescribeClusterRequest
    | DescribePartitionRequest
    | DescribeConfigRequest
    | AlterConfigRequest
    | OffsetForLeaderEpochRequest
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
    """The reply to CREATE_TOPIC, DELETE_TOPIC and ALTER_CONFIG: success, and a body of zero
    bytes."""


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
class DescribePartitionReply:
    """A partition's offsets, the bytes of its segment files, how many there are, the
    timestamp of its oldest message (the one at the log start; -1 when it holds none) and
    the settings in effect on it (every topic setting, as CREATE_TOPIC spells them)."""

    log_start_offset: int
    high_watermark: int
    log_end_offset: int
    size_bytes: int
    segments: int
    oldest_timestamp: int
    config: Mapping[str, str]


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


Reply = (
    ProduceReply
    | FetchReply
    | OffsetsReply
    | MetadataReply
    | EmptyReply
    | DescribeClusterReply
    | DescribePartitionReply
    | DescribeConfigReply
    | OffsetForLeaderEpochReply
)


class Route(NamedTuple):
    """The partition a PRODUCE, FETCH or OFFSETS request is for: what the supervisor routes by
    to the worker that owns it."""

    topic: str
    partition: int


# -- fixed-size field runs, and reading a frame field by field ---------------------------------

_TYPE_NAMES: Final = {
    "B": "u8",
    "H": "u16",
    "I": "u32",
    "Q": "u64",
    "h": "i16",
    "i": "i32",
    "q": "i64",
}


class _Fields:
    """A run of fixed-size fields packed and unpacked with one struct."""

    __slots__ = ("codes", "names", "offsets", "size", "struct")

    def __init__(self, *fields: tuple[str, str]) -> None:
        self.names = tuple(name for name, _ in fields)
        self.codes = tuple(code for _, code in fields)
        self.struct = struct.Struct(">" + "".join(self.codes))
        self.size = self.struct.size
        self.offsets = tuple(
            struct.calcsize(">" + "".join(self.codes[:i])) for i in range(len(self.codes) + 1)
        )

    def pack(self, *values: int) -> bytes:
        try:
            return self.struct.pack(*values)
        except struct.error:
            for name, code, value in zip(self.names, self.codes, values, strict=True):
                try:
                    struct.pack(">" + code, value)
                except struct.error:
                    raise ValueError(
                        f"field {name} is {value!r}: not a {_TYPE_NAMES[code]}"
                    ) from None
            raise


_U16: Final = struct.Struct(">H")
_API_AND_VERSION: Final = struct.Struct(">HH")
_STRING_LENGTH: Final = 2

_REQUEST_HEADER: Final = _Fields(("api_key", "H"), ("api_version", "H"), ("correlation_id", "I"))
_REPLY_HEADER: Final = _Fields(("correlation_id", "I"), ("error_code", "h"))
_PARTITION: Final = _Fields(("partition", "I"))
_PRODUCE: Final = _Fields(("partition", "I"), ("ack", "B"))
_PRODUCE_V3: Final = _Fields(("producer_id", "Q"), ("producer_epoch", "H"), ("sequence", "I"))
_FETCH: Final = _Fields(
    ("partition", "I"),
    ("offset", "Q"),
    ("max_bytes", "I"),
    ("max_wait_ms", "I"),
    ("min_bytes", "I"),
)
_FETCH_V2: Final = _Fields(("replica_id", "i"), ("leader_epoch", "i"), ("flushed_offset", "Q"))
_OFFSETS: Final = _Fields(("partition", "I"), ("time", "q"))
_OFFSET_FOR_LEADER_EPOCH: Final = _Fields(("partition", "I"), ("leader_epoch", "i"))
_TOPIC_COUNT: Final = _Fields(("topic_count", "H"))
_CREATE_TOPIC: Final = _Fields(("partitions", "I"), ("config_count", "H"))
_PRODUCE_REPLY: Final = _Fields(("base_offset", "Q"), ("count", "I"))
_FETCH_REPLY: Final = _Fields(("high_watermark", "Q"), ("log_start_offset", "Q"))
_FETCH_REPLY_V2: Final = _Fields(("leader_epoch", "i"), ("epoch_count", "H"))
_THROTTLE: Final = _Fields(("throttle_ms", "I"))
_EPOCH_ENTRY: Final = _Fields(("epoch", "i"), ("start_offset", "Q"))
_PRODUCER_COUNT: Final = _Fields(("producer_count", "I"))
_PRODUCER_ENTRY: Final = _Fields(
    ("producer_id", "Q"),
    ("producer_epoch", "H"),
    ("sequence", "I"),
    ("offset", "Q"),
    ("end", "Q"),
    ("message_count", "I"),
)
_OFFSET_FOR_LEADER_EPOCH_REPLY: Final = _Fields(("epoch", "i"), ("end_offset", "Q"))
_OFFSETS_REPLY: Final = _Fields(("offset", "Q"))
_BROKER_COUNT: Final = _Fields(("broker_count", "H"))
_BROKER_ID: Final = _Fields(("broker_id", "I"))
_PORT: Final = _Fields(("port", "H"))
_TOPIC_ERROR: Final = _Fields(("error_code", "h"), ("partition_count", "I"))
_PARTITION_INFO: Final = _Fields(("partition", "I"), ("broker_id", "I"), ("error_code", "h"))
_PARTITION_LEADER: Final = _Fields(("partition", "I"), ("leader", "i"), ("leader_epoch", "i"))
_REPLICA_COUNT: Final = _Fields(("replica_count", "H"))
_ISR_COUNT: Final = _Fields(("isr_count", "H"))
_PARTITION_ERROR: Final = _Fields(("error_code", "h"))
_CONFIG_COUNT: Final = _Fields(("config_count", "H"))
_ALTER_COUNTS: Final = _Fields(("set_count", "H"))
_DELETE_COUNT: Final = _Fields(("delete_count", "H"))
_UP: Final = _Fields(("up", "B"))
_LOG_DIR_COUNT: Final = _Fields(("log_dir_count", "H"))
_BROKER_PARTITIONS: Final = _Fields(("partitions", "I"))
_PARTITION_STATE: Final = _Fields(
    ("log_start_offset", "Q"),
    ("high_watermark", "Q"),
    ("log_end_offset", "Q"),
    ("size_bytes", "Q"),
    ("segments", "I"),
    ("oldest_timestamp", "q"),
)
_OVERRIDDEN: Final = _Fields(("overridden", "B"))


@dataclass(frozen=True, slots=True)
class ErrorFields:
    """What an error reply of one code carries after error_message: fixed-size `numbers`,
    then `texts` (strings, for people). Their names are the attributes of the broker-side
    exception (broker.errors) that the broker encodes them from and a client decodes them to."""

    numbers: _Fields
    texts: tuple[str, ...] = ()


ERROR_FIELDS: Final[Mapping[ErrorCode, ErrorFields]] = {
    ErrorCode.INVALID_OFFSET: ErrorFields(_Fields(("message_start", "Q"), ("next_offset", "Q"))),
    ErrorCode.FETCH_SIZE_TOO_SMALL: ErrorFields(_Fields(("needed", "Q"))),
    ErrorCode.CORRUPT_SEGMENT: ErrorFields(_Fields(("start", "Q"), ("end", "Q")), ("reason",)),
    ErrorCode.AUTHORIZATION_FAILED: ErrorFields(_Fields(), ("operation", "resource")),
    ErrorCode.NOT_LEADER_FOR_PARTITION: ErrorFields(
        _Fields(("leader", "i"), ("leader_epoch", "i"))
    ),
    ErrorCode.NOT_ENOUGH_REPLICAS: ErrorFields(
        _Fields(("isr_size", "I"), ("min_insync_replicas", "I"))
    ),
    ErrorCode.FENCED_LEADER_EPOCH: ErrorFields(_Fields(("leader_epoch", "i"))),
    ErrorCode.UNKNOWN_LEADER_EPOCH: ErrorFields(_Fields(("leader_epoch", "i"))),
    ErrorCode.OUT_OF_ORDER_SEQUENCE: ErrorFields(_Fields(("expected", "I"))),
    ErrorCode.INVALID_PRODUCER_EPOCH: ErrorFields(_Fields(("current_epoch", "H"))),
}
"""The error codes whose reply carries fields after error_message (docs/protocol.md, "Reply
header"); every other code's frame 1 ends with error_message."""


class _Reader:
    """Reads one frame's fields in order. Anything cut short, not UTF-8 or left over raises
    `error` with a message naming the part of the frame (header or body), the field and the
    byte position from the start of the frame."""

    __slots__ = ("_buf", "_end", "_error", "_last", "_pos", "_where")

    def __init__(self, buf: Buffer, where: str, error: type[PylogError]) -> None:
        self._buf = memoryview(buf)  # any buffer (a zmq.Frame too) slices without copying
        self._end = len(self._buf)
        self._pos = 0
        self._where = where
        self._error = error
        self._last = ""

    def fail(self, problem: str) -> PylogError:
        return self._error(f"{self._where}: {problem}")

    def enter(self, where: str) -> None:
        """The fields from here on belong to `where` (the header ends, the body begins)."""
        self._where = where
        self._last = ""  # so that bytes in a body of no fields are not blamed on the header

    def rest(self) -> memoryview:
        """The bytes from here to the end of the frame, uncopied (a PRODUCE message set)."""
        return self._buf[self._pos :]

    def skip_string(self) -> None:
        """Step over a string without decoding it (bounds checked)."""
        pos = self._pos
        if pos + _STRING_LENGTH > self._end:
            raise self._cut_short("string length", pos, _STRING_LENGTH)
        end = pos + _STRING_LENGTH + _U16.unpack_from(self._buf, pos)[0]
        if end > self._end:
            raise self.fail(
                f"cut short: a string runs to byte {end}, the frame ends at {self._end}"
            )
        self._pos = end

    def fixed(self, fields: _Fields) -> tuple[int, ...]:
        pos = self._pos
        if pos + fields.size > self._end:
            for i, name in enumerate(fields.names):
                start, end = pos + fields.offsets[i], pos + fields.offsets[i + 1]
                if end > self._end:
                    raise self._cut_short(name, start, end - start)
        values: tuple[int, ...] = fields.struct.unpack_from(self._buf, pos)
        self._pos = pos + fields.size
        self._last = fields.names[-1]
        return values

    def string(self, name: str) -> str:
        pos = self._pos
        if pos + _STRING_LENGTH > self._end:
            raise self._cut_short(f"{name} (its length)", pos, _STRING_LENGTH)
        (size,) = _U16.unpack_from(self._buf, pos)
        start = pos + _STRING_LENGTH
        end = start + size
        if end > self._end:
            raise self.fail(
                f"cut short in field {name}: its length says {_plural(size, 'byte')} from byte "
                f"{start}, the frame has {_plural(self._end, 'byte')}"
            )
        try:
            text = str(self._buf[start:end], "utf-8")
        except UnicodeDecodeError as error:
            raise self.fail(
                f"field {name} is not valid UTF-8: {error.reason} at byte {start + error.start}"
            ) from None
        self._pos = end
        self._last = name
        return text

    def finish(self) -> None:
        left = self._end - self._pos
        if left == 0:
            return
        if not self._last:
            raise self.fail(f"must be empty, it has {_plural(left, 'byte')} from byte {self._pos}")
        raise self.fail(
            f"{_plural(left, 'trailing byte')} after the last field, {self._last}, which ends "
            f"at byte {self._pos}"
        )

    def _cut_short(self, name: str, start: int, size: int) -> PylogError:
        return self.fail(
            f"cut short in field {name}: it needs {_plural(size, 'byte')} from byte {start}, the "
            f"frame has {_plural(self._end, 'byte')}"
        )


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _string(name: str, text: str, truncate: bool = False) -> bytes:
    data = text.encode()
    if len(data) > MAX_STRING_BYTES:
        if not truncate:
            raise ValueError(
                f"field {name} is {len(data)} bytes of UTF-8, over the {MAX_STRING_BYTES} a "
                "string holds"
            )
        data = data[:MAX_STRING_BYTES].decode(errors="ignore").encode()
    return _U16.pack(len(data)) + data


def _code(value: int) -> int:
    """An ErrorCode member for a known code, the plain int for one from a newer broker."""
    entry = _ENTRY_BY_CODE.get(value)
    return value if entry is None else entry.code


# -- requests ----------------------------------------------------------------------------------

_APIS: Final = {api.value: api for api in Api}
_REPLY_FRAMES: Final[Mapping[Api, tuple[str, ...]]] = {api: ("header and body",) for api in Api} | {
    Api.FETCH: ("header and body", "message set")
}
_HEADER_WHERE: Final = "request header"
_BODY_WHERE: Final = {api: f"{api.name} body" for api in Api}
_REPLY_HEADER_WHERE: Final = "reply header"
_REPLY_BODY_WHERE: Final = {api: f"{api.name} reply body" for api in Api}


def encode_request(header: RequestHeader, request: Request) -> list[Buffer]:
    """A request's one frame (the envelope is the transport's business): header, body and, for
    PRODUCE, the message set, back to back; the message set is copied into the frame, once.

    The body is laid out for header.version. Checks only what the wire cannot carry (a
    version this module does not know, an integer out of its type, a string over 65535 bytes,
    a FETCH field of version 2 set on a version 1 request), raising ValueError naming the
    field; the broker checks the rest."""
    if header.api != request.api:
        raise ValueError(f"the header says {header.api.name}, the request is {request.api.name}")
    _check_version(header.api, header.version)
    parts: list[Buffer] = [
        _REQUEST_HEADER.pack(header.api, header.version, header.correlation_id),
        _string("client_id", header.client_id),
    ]
    if isinstance(request, ProduceRequest):
        parts += [
            _string("topic", request.topic),
            _PRODUCE.pack(request.partition, request.ack),
        ]
        if header.version >= PRODUCE_IDEMPOTENT_VERSION:
            parts.append(
                _PRODUCE_V3.pack(request.producer_id, request.producer_epoch, request.sequence)
            )
        elif request.producer_id:
            raise ValueError(
                f"producer_id is a field of PRODUCE version {PRODUCE_IDEMPOTENT_VERSION}, "
                f"not of version {header.version}"
            )
        parts.append(request.message_set)
    elif isinstance(request, FetchRequest):
        parts += [
            _string("topic", request.topic),
            _FETCH.pack(
                request.partition,
                request.offset,
                request.max_bytes,
                request.max_wait_ms,
                request.min_bytes,
            ),
        ]
        if header.version >= 2:
            parts.append(
                _FETCH_V2.pack(request.replica_id, request.leader_epoch, request.flushed_offset)
            )
        else:
            for name, default in _FETCH_V2_DEFAULTS.items():
                if getattr(request, name) != default:
                    raise ValueError(
                        f"field {name} is {getattr(request, name)!r}: FETCH version 1 has no "
                        "such field (send version 2)"
                    )
    elif isinstance(request, OffsetsRequest):
        parts += [_string("topic", request.topic), _OFFSETS.pack(request.partition, request.time)]
    elif isinstance(request, MetadataRequest):
        parts.append(_TOPIC_COUNT.pack(len(request.topics)))
        parts += [_string("topic", topic) for topic in request.topics]
    elif isinstance(request, CreateTopicRequest):
        parts += [
            _string("topic", request.topic),
            _CREATE_TOPIC.pack(request.partitions, len(request.config)),
        ]
        for key, value in request.config.items():
            parts += [_string("key", key), _string("value", value)]
    elif isinstance(request, DeleteTopicRequest | DescribeConfigRequest):
        parts.append(_string("topic", request.topic))
    elif isinstance(request, DescribeClusterRequest):
        pass
    elif isinstance(request, DescribePartitionRequest):
        parts += [_string("topic", request.topic), _PARTITION.pack(request.partition)]
    elif isinstance(request, AlterConfigRequest):
        parts += [_string("topic", request.topic), _ALTER_COUNTS.pack(len(request.set))]
        for key, value in request.set.items():
            parts += [_string("key", key), _string("value", value)]
        parts.append(_DELETE_COUNT.pack(len(request.delete)))
        parts += [_string("key", key) for key in request.delete]
    elif isinstance(request, OffsetForLeaderEpochRequest):
        parts += [
            _string("topic", request.topic),
            _OFFSET_FOR_LEADER_EPOCH.pack(request.partition, request.leader_epoch),
        ]
    else:
        assert_never(request)
    return [b"".join(parts)]


_FETCH_V2_DEFAULTS: Final = {"replica_id": -1, "leader_epoch": -1, "flushed_offset": 0}
"""A version 1 FETCH's values of the version 2 fields: a consumer, with no epoch."""


def _check_version(api: Api, version: int) -> None:
    if version not in API_VERSIONS[api]:
        raise ValueError(
            f"{api.name} has no version {version}: versions "
            f"{', '.join(map(str, API_VERSIONS[api]))}"
        )


def _read_header(frames: Frames) -> tuple[_Reader, RequestHeader]:
    """The checks every request passes first, in this order: it is one frame; the frame holds
    api_key, api_version and correlation_id; the api is known; the version is spoken; then
    client_id. Returns the reader, placed at the start of the body, and the header."""
    if len(frames) != 1:
        raise MalformedRequest(
            f"a request is 1 frame (header, body and, for PRODUCE, the message set), this one "
            f"has {len(frames)}"
        )
    reader = _Reader(frames[0], _HEADER_WHERE, MalformedRequest)
    api_key, version, correlation_id = reader.fixed(_REQUEST_HEADER)
    api = _APIS.get(api_key)
    if api is None:
        raise UnsupportedApi(
            f"api_key {api_key} is unknown: this broker speaks api_keys "
            f"{min(Api).value} to {max(Api).value}"
        )
    if version not in API_VERSIONS[api]:
        raise UnsupportedVersion(api.name, version, API_VERSIONS[api])
    client_id = reader.string("client_id")
    reader.enter(_BODY_WHERE[api])
    return reader, RequestHeader(api, version, correlation_id, client_id)


def decode_request(frames: Frames) -> tuple[RequestHeader, Request]:
    """The header and body of a request from its one frame (after the routing envelope).

    Raises MalformedRequest (frame count, framing, trailing bytes, UTF-8, field ranges),
    UnsupportedApi, UnsupportedVersion or InvalidTopic (a topic name, a partition count of 0, a
    setting given twice), each naming the field and its byte position. A PRODUCE request's
    message set is a memoryview over the rest of the frame, unchecked and uncopied."""
    reader, header = _read_header(frames)
    request = _REQUEST_DECODERS[header.api](reader, header.version)
    if isinstance(
        request,
        ProduceRequest
        | FetchRequest
        | OffsetsRequest
        | DescribePartitionRequest
        | OffsetForLeaderEpochRequest,
    ):
        _remember(frames[0], header.api, header.version, Route(request.topic, request.partition))
    return header, request


def _decode_produce(reader: _Reader, version: int) -> ProduceRequest:
    topic = reader.string("topic")
    partition, ack = reader.fixed(_PRODUCE)
    check_topic_name(topic)
    if ack > Ack.ALL:
        raise reader.fail(
            f"field ack is {ack}: it must be 0 (none), 1 (written), 2 (flushed) or 3 (all)"
        )
    if version < PRODUCE_IDEMPOTENT_VERSION:
        return ProduceRequest(topic, partition, _ACKS[ack], reader.rest())
    producer_id, epoch, sequence = reader.fixed(_PRODUCE_V3)
    if not producer_id and (epoch or sequence):
        raise reader.fail(
            f"producer_id is 0 (no idempotent producer) but producer_epoch is {epoch} and "
            f"sequence {sequence}: both must be 0 then"
        )
    return ProduceRequest(topic, partition, _ACKS[ack], reader.rest(), producer_id, epoch, sequence)


def _decode_fetch(reader: _Reader, version: int) -> FetchRequest:
    topic = reader.string("topic")
    partition, offset, max_bytes, max_wait_ms, min_bytes = reader.fixed(_FETCH)
    replica_id, leader_epoch, flushed_offset = (
        reader.fixed(_FETCH_V2) if version >= 2 else _FETCH_V2_DEFAULTS.values()
    )
    reader.finish()
    check_topic_name(topic)
    if max_bytes < 1:
        raise reader.fail("field max_bytes is 0: it must be at least 1")
    if replica_id < -1:
        raise reader.fail(
            f"field replica_id is {replica_id}: it must be -1 (a consumer) or a broker id"
        )
    if leader_epoch < -1:
        raise reader.fail(f"field leader_epoch is {leader_epoch}: it must be -1 (unknown) or >= 0")
    if replica_id == -1 and flushed_offset != 0:
        raise reader.fail(
            f"field flushed_offset is {flushed_offset}: a consumer's (replica_id -1) must be 0"
        )
    return FetchRequest(
        topic,
        partition,
        offset,
        max_bytes,
        max_wait_ms,
        min_bytes,
        replica_id,
        leader_epoch,
        flushed_offset,
    )


def _decode_offset_for_leader_epoch(reader: _Reader, version: int) -> OffsetForLeaderEpochRequest:
    topic = reader.string("topic")
    partition, leader_epoch = reader.fixed(_OFFSET_FOR_LEADER_EPOCH)
    reader.finish()
    check_topic_name(topic)
    if leader_epoch < -1:
        raise reader.fail(
            f"field leader_epoch is {leader_epoch}: it must be -1 (no history) or >= 0"
        )
    return OffsetForLeaderEpochRequest(topic, partition, leader_epoch)


def _decode_offsets(reader: _Reader, version: int) -> OffsetsRequest:
    topic = reader.string("topic")
    partition, time = reader.fixed(_OFFSETS)
    reader.finish()
    check_topic_name(topic)
    if time < EARLIEST:
        raise reader.fail(
            f"field time is {time}: it must be -2 (earliest), -1 (latest) or a timestamp >= 0"
        )
    return OffsetsRequest(topic, partition, time)


def _decode_metadata(reader: _Reader, version: int) -> MetadataRequest:
    (count,) = reader.fixed(_TOPIC_COUNT)
    topics = tuple(reader.string(f"topic[{i}]") for i in range(count))
    reader.finish()
    for topic in topics:
        check_topic_name(topic)
    return MetadataRequest(topics)


def _decode_create_topic(reader: _Reader, version: int) -> CreateTopicRequest:
    topic = reader.string("topic")
    partitions, count = reader.fixed(_CREATE_TOPIC)
    pairs = _read_pairs(reader, count)
    reader.finish()
    check_topic_name(topic)
    if partitions < 1:
        raise InvalidTopic(f"topic {topic}: partitions is 0, a topic needs at least 1")
    return CreateTopicRequest(topic, partitions, _settings(topic, pairs))


def _read_pairs(reader: _Reader, count: int) -> list[tuple[str, str]]:
    return [(reader.string(f"key[{i}]"), reader.string(f"value[{i}]")) for i in range(count)]


def _settings(topic: str, pairs: list[tuple[str, str]]) -> dict[str, str]:
    """Settings by key, in wire order; InvalidTopic for a key given twice."""
    config: dict[str, str] = {}
    for key, value in pairs:
        if key in config:
            raise InvalidTopic(f"topic {topic}: setting {key!r} is given twice")
        config[key] = value
    return config


def _decode_delete_topic(reader: _Reader, version: int) -> DeleteTopicRequest:
    return DeleteTopicRequest(_topic_only(reader))


def _topic_only(reader: _Reader) -> str:
    topic = reader.string("topic")
    reader.finish()
    check_topic_name(topic)
    return topic


def _decode_describe_cluster(reader: _Reader, version: int) -> DescribeClusterRequest:
    reader.finish()
    return DescribeClusterRequest()


def _decode_describe_partition(reader: _Reader, version: int) -> DescribePartitionRequest:
    topic = reader.string("topic")
    (partition,) = reader.fixed(_PARTITION)
    reader.finish()
    check_topic_name(topic)
    return DescribePartitionRequest(topic, partition)


def _decode_describe_config(reader: _Reader, version: int) -> DescribeConfigRequest:
    return DescribeConfigRequest(_topic_only(reader))


def _decode_alter_config(reader: _Reader, version: int) -> AlterConfigRequest:
    topic = reader.string("topic")
    (count,) = reader.fixed(_ALTER_COUNTS)
    pairs = _read_pairs(reader, count)
    (delete_count,) = reader.fixed(_DELETE_COUNT)
    deleted = tuple(reader.string(f"delete[{i}]") for i in range(delete_count))
    reader.finish()
    check_topic_name(topic)
    settings = _settings(topic, pairs)
    for key in deleted:
        if key in settings:
            raise InvalidTopic(f"topic {topic}: setting {key!r} is both set and deleted")
    if len(set(deleted)) != len(deleted):
        raise InvalidTopic(f"topic {topic}: a setting is deleted twice")
    return AlterConfigRequest(topic, settings, deleted)


_REQUEST_DECODERS: Final[Mapping[Api, Callable[[_Reader, int], Request]]] = {
    Api.PRODUCE: _decode_produce,
    Api.FETCH: _decode_fetch,
    Api.OFFSETS: _decode_offsets,
    Api.METADATA: _decode_metadata,
    Api.CREATE_TOPIC: _decode_create_topic,
    Api.DELETE_TOPIC: _decode_delete_topic,
    Api.DESCRIBE_CLUSTER: _decode_describe_cluster,
    Api.DESCRIBE_PARTITION: _decode_describe_partition,
    Api.DESCRIBE_CONFIG: _decode_describe_config,
    Api.ALTER_CONFIG: _decode_alter_config,
    Api.OFFSET_FOR_LEADER_EPOCH: _decode_offset_for_leader_epoch,
}

ROUTED_APIS: Final = frozenset(
    {Api.PRODUCE, Api.FETCH, Api.OFFSETS, Api.DESCRIBE_PARTITION, Api.OFFSET_FOR_LEADER_EPOCH}
)
"""The apis the front sends to the worker holding the partition: their bodies begin with
topic and partition. The front serves the others itself."""


# -- known prefixes ----------------------------------------------------------------------------
#
# A client's requests to one partition all begin with the same bytes but for the correlation id:
# api_key, api_version, [correlation_id], client_id, topic, partition. Checking them (header,
# UTF-8, the topic name) and building the header costs ~8 µs in Python, more than the rest of a
# one-message PRODUCE; so a prefix that passed once is remembered by its bytes, and the
# requests after it are routed (peek_route) and decoded (peek_produce) from one dict lookup.
# Whether a prefix passes depends on its bytes alone, so a remembered one needs no check again.


class _Prefix(NamedTuple):
    api: Api
    version: int
    route: Route


_prefixes: dict[bytes, _Prefix] = {}
_PREFIXES_MAX: Final = 4096
_CORRELATION_ID: Final = struct.Struct(">I")


def _prefix_key(frame: memoryview) -> tuple[bytes, int] | None:
    """A routed request's prefix without its correlation id, the key it is remembered by, and
    the byte where the prefix ends (the body's fields after partition begin); None for a frame
    too short to hold one."""
    try:
        topic_start = 10 + _U16.unpack_from(frame, 8)[0]
        end = topic_start + 6 + _U16.unpack_from(frame, topic_start)[0]
    except struct.error:
        return None
    if end > len(frame):
        return None
    return frame[:4].tobytes() + frame[8:end].tobytes(), end


def _remember(frame: Buffer, api: Api, version: int, route: Route) -> None:
    """Remember the prefix of `frame`, a request to `route` that passed every check."""
    known = _prefix_key(memoryview(frame))
    if known is not None:
        if len(_prefixes) >= _PREFIXES_MAX:
            _prefixes.clear()
        _prefixes[known[0]] = _Prefix(api, version, route)


def peek_route(frames: Frames) -> Route | None:
    """Where the supervisor sends a request: the (topic, partition) of a request of
    ROUTED_APIS, None for the apis the front serves itself (METADATA, CREATE_TOPIC, ...).
    Reads the header and the start of the body, never the message set. Raises what
    decode_request would for what it reads, but a request it routes may still be refused
    by decode_request."""
    if len(frames) == 1:
        known = _prefix_key(memoryview(frames[0]))
        if known is not None and (prefix := _prefixes.get(known[0])) is not None:
            return prefix.route
    reader, header = _read_header(frames)
    api = header.api
    if api not in ROUTED_APIS:
        return None
    topic = reader.string("topic")
    (partition,) = reader.fixed(_PARTITION)
    check_topic_name(topic)
    route = Route(topic, partition)
    _remember(frames[0], api, header.version, route)
    return route


def peek_client_id(frames: Frames) -> str:
    """The client_id of a request that peek_route routed (its header was read whole once):
    read from its place, undecodable bytes replaced."""
    frame = frames[0]
    (length,) = _U16.unpack_from(frame, 8)
    return bytes(frame[10 : 10 + length]).decode("utf-8", "replace")


def peek_api(frames: Frames) -> int:
    """The api_key of a request that peek_route routed (its first frame is long enough)."""
    api: int = _API_AND_VERSION.unpack_from(frames[0])[0]
    return api


def peek_api_name(frames: Frames) -> str:
    """The name of a request's api in lower case ("produce"), read from its first frame
    without decoding the request: "unknown" for a frame too short or an api_key unknown."""
    if len(frames) < 1 or len(frames[0]) < _API_AND_VERSION.size:
        return "unknown"
    try:
        return Api(_API_AND_VERSION.unpack_from(frames[0])[0]).name.lower()
    except ValueError:
        return "unknown"


def peek_produce(
    frames: Frames,
) -> tuple[int, int, Route, int, int, int, int, memoryview] | None:
    """A PRODUCE request whose prefix is known good (see above), decoded with no header or
    request object: its correlation_id, api_version, route, ack (an int, checked),
    producer_id, producer_epoch and sequence (0 before version 3; checked) and message set (a
    view of the rest of the frame, unchecked). None for any other request, and for one whose
    prefix is not known yet: decode_request then decodes it (and, if it passes, remembers it)
    or refuses it."""
    if len(frames) != 1:
        return None
    view = memoryview(frames[0])
    known = _prefix_key(view)
    if known is None:
        return None
    prefix = _prefixes.get(known[0])
    end = known[1]
    if prefix is None or prefix.api is not Api.PRODUCE or end >= len(view):
        return None
    ack = view[end]
    if ack > Ack.ALL:
        return None
    correlation_id = _CORRELATION_ID.unpack_from(view, 4)[0]
    if prefix.version < PRODUCE_IDEMPOTENT_VERSION:
        return correlation_id, prefix.version, prefix.route, ack, 0, 0, 0, view[end + 1 :]
    start = end + 1 + _PRODUCE_V3.size
    if start > len(view):
        return None
    producer_id, epoch, sequence = _PRODUCE_V3.struct.unpack_from(view, end + 1)
    if not producer_id and (epoch or sequence):
        return None
    return (
        correlation_id,
        prefix.version,
        prefix.route,
        ack,
        producer_id,
        epoch,
        sequence,
        view[start:],
    )


def peek_correlation_id(frames: Frames) -> int:
    """The correlation id to answer a request with, even one that fails to decode: the
    request's own when its first frame holds at least its first 8 bytes (whatever the frame
    count), else 0. Never raises."""
    if not frames or len(frames[0]) < _REQUEST_HEADER.size:
        return 0
    return int(_REQUEST_HEADER.struct.unpack_from(frames[0])[2])


def is_fire_and_forget(frames: Frames) -> bool:
    """Whether the broker must not answer this request, not even with an error: true for a
    one-frame PRODUCE request (of a version spoken) whose frame reaches its ack field (client_id and
    topic whole by their lengths, then partition and ack) and has ack 0 (Ack.NONE), however
    malformed the rest. Never raises."""
    if len(frames) != 1 or len(frames[0]) < _REQUEST_HEADER.size:
        return False
    frame = frames[0]
    api_key, version = _API_AND_VERSION.unpack_from(frame)
    if api_key != Api.PRODUCE or version not in API_VERSIONS[Api.PRODUCE]:
        return False
    reader = _Reader(frame, _HEADER_WHERE, MalformedRequest)
    try:
        reader.fixed(_REQUEST_HEADER)
        reader.skip_string()  # client_id
        reader.skip_string()  # topic
        _, ack = reader.fixed(_PRODUCE)
    except MalformedRequest:
        return False
    return int(ack) == Ack.NONE


# -- replies -----------------------------------------------------------------------------------

_SUCCESS: Final = b"\x00\x00"  # error_message: the empty string


def encode_reply(correlation_id: int, reply: Reply, version: int = API_VERSION) -> list[Buffer]:
    """The frames of a successful reply to a request of api_version `version`: header and
    body in one frame, and for FETCH the message set as a second frame, the very object given
    (so a view of a segment is sent without copying). At version 1 the fields of version 2
    are left out (a version 1 METADATA gives a partition without leader, broker_id -1, as its
    replicas[0]). ValueError, naming the field, for what the wire cannot carry (a version the
    reply's api does not have included)."""
    _check_version(_REPLY_APIS[type(reply)], version)
    parts: list[Buffer] = [_REPLY_HEADER.pack(correlation_id, ErrorCode.NONE), _SUCCESS]
    if isinstance(reply, ProduceReply):
        parts.append(_PRODUCE_REPLY.pack(reply.base_offset, reply.count))
        if version >= PRODUCE_THROTTLE_VERSION:
            parts.append(_THROTTLE.pack(reply.throttle_ms))
    elif isinstance(reply, FetchReply):
        parts.append(_FETCH_REPLY.pack(reply.high_watermark, reply.log_start_offset))
        if version >= 2:
            parts.append(_FETCH_REPLY_V2.pack(reply.leader_epoch, len(reply.epochs)))
            parts += [_EPOCH_ENTRY.pack(e.epoch, e.start_offset) for e in reply.epochs]
        if version >= FETCH_THROTTLE_VERSION:
            parts.append(_THROTTLE.pack(reply.throttle_ms))
        if version >= PRODUCERS_FETCH_VERSION:
            parts.append(_PRODUCER_COUNT.pack(len(reply.producers)))
            parts += [_PRODUCER_ENTRY.pack(*entry) for entry in reply.producers]
        elif reply.producers:
            raise ValueError(
                f"producers is a field of FETCH version {PRODUCERS_FETCH_VERSION}, not of "
                f"version {version}"
            )
        return [b"".join(parts), reply.message_set]
    elif isinstance(reply, OffsetsReply):
        parts.append(_OFFSETS_REPLY.pack(reply.offset))
    elif isinstance(reply, MetadataReply):
        _encode_metadata_reply(parts, reply, version)
    elif isinstance(reply, OffsetForLeaderEpochReply):
        parts.append(_OFFSET_FOR_LEADER_EPOCH_REPLY.pack(reply.epoch, reply.end_offset))
    elif isinstance(reply, EmptyReply):
        pass
    elif isinstance(reply, DescribeClusterReply):
        parts += [
            _string("zookeeper_connect", reply.zookeeper_connect),
            _string("zookeeper_chroot", reply.zookeeper_chroot),
            _BROKER_COUNT.pack(len(reply.brokers)),
        ]
        for b in reply.brokers:
            parts += [
                _BROKER_ID.pack(b.broker_id),
                _UP.pack(b.up),
                _string("host", b.host),
                _PORT.pack(b.port),
                _string("version", b.version),
                _LOG_DIR_COUNT.pack(len(b.log_dirs)),
                *(_string("log_dir", d) for d in b.log_dirs),
                _BROKER_PARTITIONS.pack(b.partitions),
            ]
    elif isinstance(reply, DescribePartitionReply):
        parts.append(
            _PARTITION_STATE.pack(
                reply.log_start_offset,
                reply.high_watermark,
                reply.log_end_offset,
                reply.size_bytes,
                reply.segments,
                reply.oldest_timestamp,
            )
        )
        parts.append(_CONFIG_COUNT.pack(len(reply.config)))
        for key, value in reply.config.items():
            parts += [_string("key", key), _string("value", value)]
    elif isinstance(reply, DescribeConfigReply):
        parts.append(_CONFIG_COUNT.pack(len(reply.entries)))
        for entry in reply.entries:
            parts += [
                _string("key", entry.key),
                _string("value", entry.value),
                _OVERRIDDEN.pack(entry.overridden),
            ]
    else:
        assert_never(reply)
    return [b"".join(parts)]


_REPLY_APIS: Final[Mapping[type, Api]] = {
    ProduceReply: Api.PRODUCE,
    FetchReply: Api.FETCH,
    OffsetsReply: Api.OFFSETS,
    MetadataReply: Api.METADATA,
    EmptyReply: Api.CREATE_TOPIC,  # as DELETE_TOPIC and ALTER_CONFIG: version 1 only
    DescribeClusterReply: Api.DESCRIBE_CLUSTER,
    DescribePartitionReply: Api.DESCRIBE_PARTITION,
    DescribeConfigReply: Api.DESCRIBE_CONFIG,
    OffsetForLeaderEpochReply: Api.OFFSET_FOR_LEADER_EPOCH,
}
"""The api a reply class answers, for its versions."""


def _encode_metadata_reply(parts: list[Buffer], reply: MetadataReply, version: int) -> None:
    parts.append(_BROKER_COUNT.pack(len(reply.brokers)))
    for broker in reply.brokers:
        parts += [
            _BROKER_ID.pack(broker.broker_id),
            _string("host", broker.host),
            _PORT.pack(broker.port),
        ]
        if version >= 2:
            parts.append(_string("rack", broker.rack))
    parts.append(_TOPIC_COUNT.pack(len(reply.topics)))
    for topic in reply.topics:
        parts += [
            _string("topic", topic.topic),
            _TOPIC_ERROR.pack(topic.error_code, len(topic.partitions)),
        ]
        for p in topic.partitions:
            if version < 2:
                holder = p.broker_id
                if holder == -1:  # no leader: version 1 names the preferred one
                    if not p.replicas:
                        raise ValueError(
                            f"partition {p.partition} has broker_id -1 and no replicas: "
                            "METADATA version 1 needs a broker id"
                        )
                    holder = p.replicas[0]
                parts.append(_PARTITION_INFO.pack(p.partition, holder, p.error_code))
                continue
            parts += [
                _PARTITION_LEADER.pack(p.partition, p.broker_id, p.leader_epoch),
                _REPLICA_COUNT.pack(len(p.replicas)),
                *(_BROKER_ID.pack(r) for r in p.replicas),
                _ISR_COUNT.pack(len(p.isr)),
                *(_BROKER_ID.pack(r) for r in p.isr),
                _PARTITION_ERROR.pack(p.error_code),
            ]


def encode_error(
    correlation_id: int, error: BaseException | ErrorCode, message: str | None = None
) -> list[Buffer]:
    """The one frame of an error reply: the reply header, then the code's ERROR_FIELDS.

    `error` is an exception, whose code comes from error_code_for, whose text is the message
    unless `message` is given, and whose attributes give the error fields; or an ErrorCode
    (message default empty) of a code without fields (ValueError for one with). A string over
    65535 bytes of UTF-8 is cut at a character boundary."""
    if isinstance(error, ErrorCode):
        code = error
        text = "" if message is None else message
    else:
        code = error_code_for(error)
        text = _describe(error) if message is None else message
    if code is ErrorCode.NONE:
        raise ValueError("ErrorCode.NONE is not an error: use encode_reply")
    parts = [_REPLY_HEADER.pack(correlation_id, code), _string("error_message", text, True)]
    fields = ERROR_FIELDS.get(code)
    if fields is not None:
        if isinstance(error, ErrorCode):
            raise ValueError(f"a {code.name} reply carries fields: give the exception")
        parts.append(fields.numbers.pack(*(getattr(error, n) for n in fields.numbers.names)))
        parts += [_string(name, getattr(error, name), True) for name in fields.texts]
    return [b"".join(parts)]


def _describe(error: BaseException) -> str:
    if isinstance(error, BrokerError):
        return error.message
    if isinstance(error, PylogError):
        return str(error)
    return f"{type(error).__name__}: {error}"


_SUCCESS_START: Final = struct.Struct(">IhH")
"""A reply's correlation id, error code and error message length: (id, 0, 0) is a success."""
_PRODUCE_ACK_V2: Final = struct.Struct(">IhHQII")
_PRODUCE_ACKS: Final = {1: struct.Struct(">IhHQI"), 2: _PRODUCE_ACK_V2, 3: _PRODUCE_ACK_V2}
"""A successful PRODUCE reply of each version as one struct: header with an empty
error_message, then the body."""


def _read_reply_header(frames: Frames) -> tuple[_Reader, ReplyHeader]:
    if not frames:
        raise MalformedReply("the reply has no frames: no header")
    reader = _Reader(frames[0], _REPLY_HEADER_WHERE, MalformedReply)
    correlation_id, code = reader.fixed(_REPLY_HEADER)
    message = reader.string("error_message")
    return reader, ReplyHeader(correlation_id, _code(code), message)


def decode_reply_header(frames: Frames) -> ReplyHeader:
    """The header at the start of a reply's first frame: read it first to match the reply to
    its request by correlation id. Raises MalformedReply."""
    if frames and len(frames[0]) >= _SUCCESS_START.size:  # a success, with one unpack
        correlation_id, code, message_length = _SUCCESS_START.unpack_from(frames[0])
        if code == 0 and message_length == 0:
            return ReplyHeader(correlation_id, ErrorCode.NONE, "")
    return _read_reply_header(frames)[1]


@overload
def decode_reply(
    api: Literal[Api.PRODUCE], frames: Frames, version: int = API_VERSION
) -> ProduceReply: ...
@overload
def decode_reply(
    api: Literal[Api.FETCH], frames: Frames, version: int = API_VERSION
) -> FetchReply: ...
@overload
def decode_reply(
    api: Literal[Api.OFFSETS], frames: Frames, version: int = API_VERSION
) -> OffsetsReply: ...
@overload
def decode_reply(
    api: Literal[Api.METADATA], frames: Frames, version: int = API_VERSION
) -> MetadataReply: ...
@overload
def decode_reply(
    api: Literal[Api.CREATE_TOPIC, Api.DELETE_TOPIC, Api.ALTER_CONFIG],
    frames: Frames,
    version: int = API_VERSION,
) -> EmptyReply: ...
@overload
def decode_reply(
    api: Literal[Api.DESCRIBE_CLUSTER], frames: Frames, version: int = API_VERSION
) -> DescribeClusterReply: ...
@overload
def decode_reply(
    api: Literal[Api.DESCRIBE_PARTITION], frames: Frames, version: int = API_VERSION
) -> DescribePartitionReply: ...
@overload
def decode_reply(
    api: Literal[Api.DESCRIBE_CONFIG], frames: Frames, version: int = API_VERSION
) -> DescribeConfigReply: ...
@overload
def decode_reply(
    api: Literal[Api.OFFSET_FOR_LEADER_EPOCH], frames: Frames, version: int = API_VERSION
) -> OffsetForLeaderEpochReply: ...
@overload
def decode_reply(api: Api, frames: Frames, version: int = API_VERSION) -> Reply: ...
def decode_reply(api: Api, frames: Frames, version: int = API_VERSION) -> Reply:
    """The body of a reply to a request of `api` at api_version `version`, from its frames
    after the routing envelope; a field of a newer version than `version` takes its default.

    Raises BrokerError (code, name, message, retriable, and the code's ERROR_FIELDS) when
    the error code is not 0, MalformedReply when the frames do not follow the protocol, and
    ValueError for a version `api` does not have. A FETCH reply's message set is a memoryview
    over frame 2."""
    _check_version(api, version)
    if api is Api.PRODUCE and len(frames) == 1 and len(frames[0]) == _PRODUCE_ACKS[version].size:
        _, code, message_length, *fields = _PRODUCE_ACKS[version].unpack_from(frames[0])
        if code == 0 and message_length == 0:  # an ack, with one unpack: a producer's hot path
            return ProduceReply(*fields)
    reader, header = _read_reply_header(frames)
    if header.error_code != ErrorCode.NONE:
        if len(frames) != 1:
            raise MalformedReply(
                f"an error reply is 1 frame (the reply header), this one has {len(frames)}"
            )
        raise broker_error(header.error_code, header.error_message, _error_fields(reader, header))
    names = _REPLY_FRAMES[api]
    if len(frames) != len(names):
        raise MalformedReply(
            f"a {api.name} reply is {_plural(len(names), 'frame')} ({', '.join(names)}), "
            f"this one has {len(frames)}"
        )
    reader.enter(_REPLY_BODY_WHERE[api])
    reply: Reply
    if api is Api.PRODUCE:
        base_offset, count = reader.fixed(_PRODUCE_REPLY)
        throttle_ms = _read_throttle(reader, version >= PRODUCE_THROTTLE_VERSION)
        reply = ProduceReply(base_offset, count, throttle_ms)
    elif api is Api.FETCH:
        high_watermark, log_start_offset = reader.fixed(_FETCH_REPLY)
        if version < 2:
            reply = FetchReply(high_watermark, log_start_offset, memoryview(frames[1]))
        else:
            leader_epoch, epochs = _read_fetch_epochs(reader)
            throttle_ms = _read_throttle(reader, version >= FETCH_THROTTLE_VERSION)
            producers = _read_fetch_producers(reader) if version >= PRODUCERS_FETCH_VERSION else ()
            message_set = memoryview(frames[1])
            reply = FetchReply(
                high_watermark,
                log_start_offset,
                message_set,
                leader_epoch,
                epochs,
                throttle_ms,
                producers,
            )
    elif api is Api.OFFSETS:
        reply = OffsetsReply(*reader.fixed(_OFFSETS_REPLY))
    elif api is Api.METADATA:
        reply = _decode_metadata_reply(reader, version)
    elif api is Api.OFFSET_FOR_LEADER_EPOCH:
        epoch, end_offset = reader.fixed(_OFFSET_FOR_LEADER_EPOCH_REPLY)
        _check_epoch(reader, "epoch", epoch)
        reply = OffsetForLeaderEpochReply(epoch, end_offset)
    elif api is Api.DESCRIBE_CLUSTER:
        reply = _decode_describe_cluster_reply(reader)
    elif api is Api.DESCRIBE_PARTITION:
        start, high, end, size, segments, oldest = reader.fixed(_PARTITION_STATE)
        (count,) = reader.fixed(_CONFIG_COUNT)
        config = dict(_read_pairs(reader, count))
        reply = DescribePartitionReply(start, high, end, size, segments, oldest, config)
    elif api is Api.DESCRIBE_CONFIG:
        (count,) = reader.fixed(_CONFIG_COUNT)
        entries = []
        for i in range(count):
            key, value = reader.string(f"key[{i}]"), reader.string(f"value[{i}]")
            entries.append(ConfigEntry(key, value, _flag(reader, _OVERRIDDEN)))
        reply = DescribeConfigReply(tuple(entries))
    else:
        reply = EmptyReply()
    reader.finish()
    return reply


def _error_fields(reader: _Reader, header: ReplyHeader) -> dict[str, int | str]:
    """The fields after error_message: the code's ERROR_FIELDS, nothing for another known
    code, and whatever there is, unread, for a code from a newer broker."""
    if not isinstance(header.error_code, ErrorCode):
        return {}
    values: dict[str, int | str] = {}
    fields = ERROR_FIELDS.get(header.error_code)
    if fields is not None:
        reader.enter(f"{header.error_code.name} error fields")
        if fields.numbers.names:
            values.update(zip(fields.numbers.names, reader.fixed(fields.numbers), strict=True))
        values.update((name, reader.string(name)) for name in fields.texts)
    reader.finish()
    return values


def _check_epoch(reader: _Reader, name: str, epoch: int) -> None:
    """A leader epoch is -1 (none) or more; MalformedReply below."""
    if epoch < -1:
        raise reader.fail(f"field {name} is {epoch}: it must be -1 (none) or >= 0")


def _read_throttle(reader: _Reader, present: bool) -> int:
    """A reply's throttle_ms when its version has one (PRODUCE 2, FETCH 4), else 0."""
    return int(reader.fixed(_THROTTLE)[0]) if present else 0


def _read_fetch_epochs(reader: _Reader) -> tuple[int, tuple[EpochEntry, ...]]:
    """A version 2 FETCH reply's leader_epoch and epoch entries: epochs >= 0, epochs and start
    offsets rising (as in a leader-epoch-checkpoint), else MalformedReply."""
    leader_epoch, count = reader.fixed(_FETCH_REPLY_V2)
    _check_epoch(reader, "leader_epoch", leader_epoch)
    entries: list[EpochEntry] = []
    for i in range(count):
        epoch, start = reader.fixed(_EPOCH_ENTRY)
        if entries and (epoch <= entries[-1].epoch or start <= entries[-1].start_offset):
            raise reader.fail(
                f"epoch entry {i}, ({epoch}, {start}), does not follow ({entries[-1].epoch}, "
                f"{entries[-1].start_offset}): epochs and start offsets must rise"
            )
        if epoch < 0:
            raise reader.fail(f"epoch entry {i} has epoch {epoch}: it must be >= 0")
        entries.append(EpochEntry(epoch, start))
    return leader_epoch, tuple(entries)


def _read_fetch_producers(reader: _Reader) -> tuple[StoredSet, ...]:
    """A version 5 FETCH reply's producer entries: producer_id > 0, each set's end past its
    offset, offsets rising, else MalformedReply."""
    (count,) = reader.fixed(_PRODUCER_COUNT)
    entries: list[StoredSet] = []
    for i in range(count):
        entry = StoredSet(*reader.fixed(_PRODUCER_ENTRY))
        if not entry.producer_id or entry.end <= entry.offset:
            raise reader.fail(
                f"producer entry {i} has producer_id {entry.producer_id} and [offset, end) "
                f"[{entry.offset}, {entry.end}): the id must be > 0 and the range not empty"
            )
        if entries and entry.offset < entries[-1].end:
            raise reader.fail(
                f"producer entry {i} starts at {entry.offset}, before the end "
                f"{entries[-1].end} of the one before: entries must follow each other"
            )
        entries.append(entry)
    return tuple(entries)


def _decode_metadata_reply(reader: _Reader, version: int) -> MetadataReply:
    brokers = []
    (broker_count,) = reader.fixed(_BROKER_COUNT)
    for _ in range(broker_count):
        (broker_id,) = reader.fixed(_BROKER_ID)
        host = reader.string("host")
        (port,) = reader.fixed(_PORT)
        rack = reader.string("rack") if version >= 2 else ""
        brokers.append(MetadataBroker(broker_id, host, port, rack))
    topics = []
    (topic_count,) = reader.fixed(_TOPIC_COUNT)
    for _ in range(topic_count):
        topic = reader.string("topic")
        code, partition_count = reader.fixed(_TOPIC_ERROR)
        partitions = []
        for _ in range(partition_count):
            if version < 2:
                number, holder, partition_code = reader.fixed(_PARTITION_INFO)
                partitions.append(PartitionInfo(number, holder, _code(partition_code)))
                continue
            number, leader, leader_epoch = reader.fixed(_PARTITION_LEADER)
            if leader < -1:
                raise reader.fail(f"field leader is {leader}: it must be -1 (none) or a broker id")
            _check_epoch(reader, "leader_epoch", leader_epoch)
            (count,) = reader.fixed(_REPLICA_COUNT)
            replicas = tuple(reader.fixed(_BROKER_ID)[0] for _ in range(count))
            (count,) = reader.fixed(_ISR_COUNT)
            isr = tuple(reader.fixed(_BROKER_ID)[0] for _ in range(count))
            (partition_code,) = reader.fixed(_PARTITION_ERROR)
            partitions.append(
                PartitionInfo(number, leader, _code(partition_code), leader_epoch, replicas, isr)
            )
        topics.append(TopicInfo(topic, _code(code), tuple(partitions)))
    return MetadataReply(tuple(brokers), tuple(topics))


def _decode_describe_cluster_reply(reader: _Reader) -> DescribeClusterReply:
    connect = reader.string("zookeeper_connect")
    chroot = reader.string("zookeeper_chroot")
    (count,) = reader.fixed(_BROKER_COUNT)
    brokers = []
    for _ in range(count):
        (broker_id,) = reader.fixed(_BROKER_ID)
        up = _flag(reader, _UP)
        host = reader.string("host")
        (port,) = reader.fixed(_PORT)
        version = reader.string("version")
        (dirs,) = reader.fixed(_LOG_DIR_COUNT)
        log_dirs = tuple(reader.string(f"log_dir[{i}]") for i in range(dirs))
        (partitions,) = reader.fixed(_BROKER_PARTITIONS)
        brokers.append(ClusterBroker(broker_id, up, host, port, version, log_dirs, partitions))
    return DescribeClusterReply(connect, chroot, tuple(brokers))


def _flag(reader: _Reader, field: _Fields) -> bool:
    """A u8 that is 0 (false) or 1 (true); MalformedReply for any other value."""
    (value,) = reader.fixed(field)
    if value > 1:
        raise reader.fail(f"field {field.names[0]} is {value}: it must be 0 or 1")
    return bool(value)

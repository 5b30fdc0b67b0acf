"""Error codes: the wire code of every error, its exception classes on each side, whether it is
retriable (ERROR_TABLE), and the fields an error reply carries (ERROR_FIELDS)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Final

from broker import errors
from broker.errors import (
    AuthorizationFailed,
    BrokerError,
    BrokerShuttingDown,
    CoordinatorLoading,
    CorruptSegment,
    DiskFull,
    DuplicateSequence,
    FencedLeaderEpoch,
    FencedMemberEpoch,
    FetchSessionIdNotFound,
    FetchSizeTooSmall,
    GroupHasZooKeeperMembers,
    GroupNotEmptyError,
    InvalidFetchSessionEpoch,
    InvalidGroup,
    InvalidMessage,
    InvalidOffset,
    InvalidProducerEpoch,
    InvalidTopic,
    MalformedRequest,
    MessageTooLarge,
    NotCoordinator,
    NotEnoughReplicas,
    NotLeaderForPartition,
    OffsetOutOfRange,
    OutOfOrderSequence,
    PartitionNotAssigned,
    PartitionUnavailable,
    PylogError,
    RegistryAccessDenied,
    RegistryUnavailable,
    RepliesNotRead,
    StorageIOError,
    TooManyProducers,
    TopicAlreadyExists,
    UnknownGroup,
    UnknownLeaderEpoch,
    UnknownMemberId,
    UnknownProducerId,
    UnknownTopicOrPartition,
    UnreleasedInstanceId,
    UnsupportedApi,
    UnsupportedFormat,
    UnsupportedVersion,
)
from broker.protocol.wire import Fields


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
    NOT_COORDINATOR = 30
    COORDINATOR_LOADING = 31
    UNKNOWN_MEMBER_ID = 32
    FENCED_MEMBER_EPOCH = 33
    UNRELEASED_INSTANCE_ID = 34
    PARTITION_NOT_ASSIGNED = 35
    GROUP_NOT_EMPTY = 36
    UNKNOWN_GROUP = 37
    INVALID_GROUP = 38
    GROUP_HAS_ZOOKEEPER_MEMBERS = 39
    UNKNOWN_PRODUCER_ID = 40
    TOO_MANY_PRODUCERS = 41
    FETCH_SESSION_ID_NOT_FOUND = 42
    INVALID_FETCH_SESSION_EPOCH = 43


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
    ErrorEntry(ErrorCode.NOT_COORDINATOR, NotCoordinator, True),
    ErrorEntry(ErrorCode.COORDINATOR_LOADING, CoordinatorLoading, True),
    ErrorEntry(ErrorCode.UNKNOWN_MEMBER_ID, UnknownMemberId, False),
    ErrorEntry(ErrorCode.FENCED_MEMBER_EPOCH, FencedMemberEpoch, False),
    ErrorEntry(ErrorCode.UNRELEASED_INSTANCE_ID, UnreleasedInstanceId, True),
    ErrorEntry(ErrorCode.PARTITION_NOT_ASSIGNED, PartitionNotAssigned, False),
    ErrorEntry(ErrorCode.GROUP_NOT_EMPTY, GroupNotEmptyError, False),
    ErrorEntry(ErrorCode.UNKNOWN_GROUP, UnknownGroup, False),
    ErrorEntry(ErrorCode.INVALID_GROUP, InvalidGroup, False),
    ErrorEntry(ErrorCode.GROUP_HAS_ZOOKEEPER_MEMBERS, GroupHasZooKeeperMembers, True),
    ErrorEntry(ErrorCode.UNKNOWN_PRODUCER_ID, UnknownProducerId, False),
    ErrorEntry(ErrorCode.TOO_MANY_PRODUCERS, TooManyProducers, True),
    ErrorEntry(ErrorCode.FETCH_SESSION_ID_NOT_FOUND, FetchSessionIdNotFound, False),
    ErrorEntry(ErrorCode.INVALID_FETCH_SESSION_EPOCH, InvalidFetchSessionEpoch, False),
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
    ErrorCode.NOT_COORDINATOR: errors.BrokerNotCoordinator,
    ErrorCode.COORDINATOR_LOADING: errors.BrokerCoordinatorLoading,
    ErrorCode.UNKNOWN_MEMBER_ID: errors.BrokerUnknownMemberId,
    ErrorCode.FENCED_MEMBER_EPOCH: errors.BrokerFencedMemberEpoch,
    ErrorCode.UNRELEASED_INSTANCE_ID: errors.BrokerUnreleasedInstanceId,
    ErrorCode.PARTITION_NOT_ASSIGNED: errors.BrokerPartitionNotAssigned,
    ErrorCode.GROUP_NOT_EMPTY: errors.BrokerGroupNotEmpty,
    ErrorCode.UNKNOWN_GROUP: errors.BrokerUnknownGroup,
    ErrorCode.INVALID_GROUP: errors.BrokerInvalidGroup,
    ErrorCode.GROUP_HAS_ZOOKEEPER_MEMBERS: errors.BrokerGroupHasZooKeeperMembers,
    ErrorCode.UNKNOWN_PRODUCER_ID: errors.BrokerUnknownProducerId,
    ErrorCode.TOO_MANY_PRODUCERS: errors.BrokerTooManyProducers,
    ErrorCode.FETCH_SESSION_ID_NOT_FOUND: errors.BrokerFetchSessionIdNotFound,
    ErrorCode.INVALID_FETCH_SESSION_EPOCH: errors.BrokerInvalidFetchSessionEpoch,
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


_NO_FIELDS: Final = Fields()


@dataclass(frozen=True, slots=True)
class ErrorFields:
    """What an error reply of one code carries after error_message: fixed-size `numbers`,
    then `texts` (strings), then fixed-size `after` (NOT_COORDINATOR's port, after its host).
    Their names are the attributes of the broker-side exception (broker.errors) that the
    broker encodes them from and a client decodes them to."""

    numbers: Fields
    texts: tuple[str, ...] = ()
    after: Fields = _NO_FIELDS

    @property
    def names(self) -> tuple[str, ...]:
        """Every field's name, in wire order."""
        return (*self.numbers.names, *self.texts, *self.after.names)


ERROR_FIELDS: Final[Mapping[ErrorCode, ErrorFields]] = {
    ErrorCode.INVALID_OFFSET: ErrorFields(Fields(("message_start", "Q"), ("next_offset", "Q"))),
    ErrorCode.FETCH_SIZE_TOO_SMALL: ErrorFields(Fields(("needed", "Q"))),
    ErrorCode.CORRUPT_SEGMENT: ErrorFields(Fields(("start", "Q"), ("end", "Q")), ("reason",)),
    ErrorCode.AUTHORIZATION_FAILED: ErrorFields(Fields(), ("operation", "resource")),
    ErrorCode.NOT_LEADER_FOR_PARTITION: ErrorFields(Fields(("leader", "i"), ("leader_epoch", "i"))),
    ErrorCode.NOT_ENOUGH_REPLICAS: ErrorFields(
        Fields(("isr_size", "I"), ("min_insync_replicas", "I"))
    ),
    ErrorCode.FENCED_LEADER_EPOCH: ErrorFields(Fields(("leader_epoch", "i"))),
    ErrorCode.UNKNOWN_LEADER_EPOCH: ErrorFields(Fields(("leader_epoch", "i"))),
    ErrorCode.OUT_OF_ORDER_SEQUENCE: ErrorFields(Fields(("expected", "I"))),
    ErrorCode.INVALID_PRODUCER_EPOCH: ErrorFields(Fields(("current_epoch", "H"))),
    ErrorCode.NOT_COORDINATOR: ErrorFields(
        Fields(("coordinator", "i")), ("host",), Fields(("port", "H"))
    ),
}
"""The error codes whose reply carries fields after error_message (docs/protocol.md, "Reply
header"); every other code's frame 1 ends with error_message."""


def known_code(value: int) -> int:
    """An ErrorCode member for a known code, the plain int for one from a newer broker."""
    entry = _ENTRY_BY_CODE.get(value)
    return value if entry is None else entry.code

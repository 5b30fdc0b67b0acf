"""confluent-kafka's errors over pylog's: KafkaError (Kafka's code for each kind of pylog
error that has one), KafkaException, and the one-line refusal of what pylog does not have."""

from __future__ import annotations

import builtins
import contextlib
from collections.abc import Iterator
from typing import Final

from broker.errors import (
    AuthenticationFailed,
    AuthorizationFailed,
    BrokerError,
    CorruptSegment,
    GroupNotEmptyError,
    InvalidMessage,
    InvalidTopic,
    MessageTooLarge,
    NotEnoughReplicas,
    NotLeaderForPartition,
    OffsetOutOfRange,
    PylogError,
    TopicAlreadyExists,
    Unavailable,
    UnknownGroup,
    UnknownTopicOrPartition,
)
from broker.protocol import ErrorCode, broker_error


class KafkaError:
    """An error as confluent-kafka reports one: `code()`, `name()`, `str()`, `retriable()`,
    `fatal()`. Codes are Kafka's where pylog's error means the same, else _FAIL (the pylog
    error it stands for is `error`, its class names it)."""

    _FAIL: Final = -150
    _PARTITION_EOF: Final = -191
    _MSG_TIMED_OUT: Final = -192
    _TRANSPORT: Final = -195
    _AUTHENTICATION: Final = -169
    _INVALID_ARG: Final = -186
    _UNKNOWN_PARTITION: Final = -190
    _NOT_IMPLEMENTED: Final = -170
    OFFSET_OUT_OF_RANGE: Final = 1
    CORRUPT_MESSAGE: Final = 2
    UNKNOWN_TOPIC_OR_PART: Final = 3
    NOT_LEADER_FOR_PARTITION: Final = 6
    MSG_SIZE_TOO_LARGE: Final = 10
    NOT_ENOUGH_REPLICAS: Final = 19
    TOPIC_AUTHORIZATION_FAILED: Final = 29
    TOPIC_ALREADY_EXISTS: Final = 36
    INVALID_TOPIC_EXCEPTION: Final = 17
    NON_EMPTY_GROUP: Final = 68
    GROUP_ID_NOT_FOUND: Final = 69

    def __init__(
        self, code: int, reason: str, retriable: bool = False, error: PylogError | None = None
    ) -> None:
        self._code = code
        self._reason = reason
        self._retriable = retriable
        self.error = error
        """The pylog error reported, or None."""

    @classmethod
    def of(cls, error: PylogError) -> KafkaError:
        """`error` as Kafka would report it."""
        code = next((code for kind, code in _CODES if isinstance(error, kind)), cls._FAIL)
        retriable = (
            error.retriable if isinstance(error, BrokerError) else isinstance(error, Unavailable)
        )
        return cls(code, str(error), retriable, error)

    def code(self) -> int:
        return self._code

    def name(self) -> str:
        for attribute, value in vars(KafkaError).items():
            if attribute.lstrip("_").isupper() and value == self._code:
                return attribute
        return str(self._code)

    def str(self) -> str:
        return self._reason

    def retriable(self) -> bool:
        return self._retriable

    def fatal(self) -> bool:
        return False

    def __str__(self) -> builtins.str:
        return self._reason

    def __repr__(self) -> builtins.str:
        return f'KafkaError{{code={self.name()},val={self._code},str="{self._reason}"}}'

    def __eq__(self, other: object) -> bool:
        if isinstance(other, KafkaError):
            return self._code == other._code
        if isinstance(other, int):
            return self._code == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._code)


_CODES: Final[tuple[tuple[type[PylogError], int], ...]] = (
    (OffsetOutOfRange, KafkaError.OFFSET_OUT_OF_RANGE),
    (CorruptSegment, KafkaError.CORRUPT_MESSAGE),
    (InvalidMessage, KafkaError.CORRUPT_MESSAGE),
    (UnknownTopicOrPartition, KafkaError.UNKNOWN_TOPIC_OR_PART),
    (NotLeaderForPartition, KafkaError.NOT_LEADER_FOR_PARTITION),
    (MessageTooLarge, KafkaError.MSG_SIZE_TOO_LARGE),
    (NotEnoughReplicas, KafkaError.NOT_ENOUGH_REPLICAS),
    (AuthorizationFailed, KafkaError.TOPIC_AUTHORIZATION_FAILED),
    (TopicAlreadyExists, KafkaError.TOPIC_ALREADY_EXISTS),
    (InvalidTopic, KafkaError.INVALID_TOPIC_EXCEPTION),
    (GroupNotEmptyError, KafkaError.NON_EMPTY_GROUP),
    (UnknownGroup, KafkaError.GROUP_ID_NOT_FOUND),
    (AuthenticationFailed, KafkaError._AUTHENTICATION),
    (Unavailable, KafkaError._TRANSPORT),
)
"""Kafka's code for each kind of pylog error that has one, the first match taken."""


class KafkaException(Exception):
    """What confluent-kafka raises: `args[0]` is the KafkaError."""

    def __init__(self, error: KafkaError | PylogError | str) -> None:
        if isinstance(error, PylogError):
            error = KafkaError.of(error)
        elif isinstance(error, str):
            error = KafkaError(KafkaError._INVALID_ARG, error)
        super().__init__(error)


class IllegalStateException(KafkaException):
    """confluent-kafka's, for a call made in the wrong state (its share consumer's)."""


class ConcurrentModificationException(KafkaException):
    """confluent-kafka's, for a client used from two threads at once (its share consumer's)."""


NO_TRANSACTIONS: Final = (
    "transactions: pylog has none (yet): no transactional.id, init_transactions or "
    "read_committed; its idempotent producer stores a batch sent again once "
    "(docs/clients.md, 'What pylog does not have')"
)


def not_implemented(what: str) -> KafkaException:
    """The one-line refusal of a confluent-kafka feature pylog does not have."""
    return KafkaException(KafkaError(KafkaError._NOT_IMPLEMENTED, what))


def error_of(code: int, what: str) -> KafkaError | None:
    if code == ErrorCode.NONE:
        return None
    return KafkaError.of(broker_error(code, what))


@contextlib.contextmanager
def as_kafka_errors() -> Iterator[None]:
    """A PylogError, or a ValueError (a partition this member does not own), raised as the
    KafkaException a confluent-kafka program catches."""
    try:
        yield
    except PylogError as error:
        raise KafkaException(error) from None
    except ValueError as error:
        raise KafkaException(str(error)) from None

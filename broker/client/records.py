"""What a group member hands out: Records (or records of another tuple type of Record's layout),
and the partitions it owns, named with their preferred leader (BrokerPartition), each with
where it is read (Owned)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from typing_extensions import TypeVar

from broker.client.consumer import DEFAULT_FETCH_BYTES
from broker.log.headers import Headers

if TYPE_CHECKING:
    from broker.client.connection import Connection


@dataclass(frozen=True, order=True, slots=True)
class BrokerPartition:
    """A partition of a topic and its preferred leader (the first of its replicas)."""

    topic: str
    broker_id: int
    partition: int


class Record(NamedTuple):
    """A message as a group member receives it."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes
    headers: Headers = ()
    """(key, value or None) pairs, in order; () for a message without."""
    next_offset: int = -1
    """Where the next message starts: what to commit to have read this one (the offset of
    the message after it, or of the set after it for the last message of a compressed set;
    a message of a set before its last has its own offset here: committed, the whole set is
    read again). -1 only in a Record made by hand."""


R = TypeVar("R", bound=tuple[Any, ...], default=Record)
"""What a member hands out: Records, or records of another tuple type of Record's layout
(the Kafka-shaped consumer's Messages, broker.client.kafka), made straight from the fetched
bytes (broker.log.codec.decode_records)."""
OFFSET_AT: Final = Record._fields.index("offset")
NEXT_AT: Final = Record._fields.index("next_offset")
"""Where a record of any record type holds its offset, and its next offset."""


@dataclass(eq=False)
class Owned:
    """An owned partition: what was handed out, what is fetched next, what is in flight."""

    tp: BrokerPartition
    endpoint: str
    position: int
    """The offset after the last processed record: what a commit records."""
    delivered: int
    """The offset after the last record handed out; `position` catches up with it when the
    application asks for the next record (or calls commit())."""
    committed: int | None
    fetch_offset: int = 0
    fetch_bytes: int = DEFAULT_FETCH_BYTES
    known_end: int = -1
    """Where the partition's readable bytes ended at its last fetch reply (its high watermark
    then; -1 before one and after an error): what is known to wait past `fetch_offset`
    (`fetch_round`), and whether it was read to its end (`at_end`)."""
    buffered: deque[Any] = field(default_factory=deque)
    """Records (of the member's record type) of the last fetch reply not handed out yet."""
    in_flight: tuple[Connection, int] | None = None
    sent_at: float = 0.0
    rest_until: float = 0.0
    located: bool = True
    """False after a fetch error that did not say where the leader is: METADATA is asked before
    the next fetch (FetchSession.locate)."""
    paused: bool = False
    """Not fetched until resumed (GroupConsumer.pause)."""

"""The apis of the wire protocol, their versions, and the constants their fields use."""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum
from typing import Final

from broker.log.message import Buffer

Frames = Sequence[Buffer]
"""The frames of a request or reply after the routing envelope (item 0 is frame 1): one for a
request, one or two for a reply."""

API_VERSION: Final = 1
"""The first version of every api, and the only one of most (tables.API_VERSIONS)."""
EARLIEST: Final = -2
"""OFFSETS time meaning the log start offset."""
LATEST: Final = -1
"""OFFSETS time meaning the high watermark: the next offset to be written and visible."""
CREATE_WAIT_S: Final = 10.0
"""The longest a broker holds a CREATE_TOPIC before it answers: until every broker holding a
partition serves it, or this long (docs/protocol.md, CREATE_TOPIC). A client waits for the
reply this long past its own timeout, as for a FETCH's max_wait_ms."""
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
    MULTI_PRODUCE = 11
    MULTI_FETCH = 12
    GROUP_HEARTBEAT = 13
    OFFSET_COMMIT = 14
    OFFSET_FETCH = 15
    DESCRIBE_GROUP = 16
    LIST_GROUPS = 17
    DELETE_GROUP = 18
    CREATE_PARTITIONS = 19


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


ACKS: Final = tuple(Ack)
"""Ack by value, without the enum call (a decoded request checks the range first)."""

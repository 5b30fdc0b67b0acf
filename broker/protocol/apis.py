"""The apis of the wire protocol, their versions, and the constants their fields use."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import IntEnum
from typing import Final

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


ACKS: Final = tuple(Ack)
"""Ack by value, without the enum call (a decoded request checks the range first)."""


def check_version(api: Api, version: int) -> None:
    if version not in API_VERSIONS[api]:
        raise ValueError(
            f"{api.name} has no version {version}: versions "
            f"{', '.join(map(str, API_VERSIONS[api]))}"
        )

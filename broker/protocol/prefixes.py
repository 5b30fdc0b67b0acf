"""Known prefixes: the hot path's shortcut past decoding a routed request's header (see
KnownPrefixes)."""

from __future__ import annotations

import struct
from typing import Final, NamedTuple

from broker.log.message import Buffer
from broker.protocol.apis import Ack, Api, Frames
from broker.protocol.messages import Request, RequestHeader, Route, RoutedRequest
from broker.protocol.names import check_topic_name
from broker.protocol.requests import ROUTED_APIS, decode_request, read_request_header
from broker.protocol.tables import FETCH, PRODUCE, PRODUCE_IDEMPOTENT_VERSION
from broker.protocol.wire import U16


class _Prefix(NamedTuple):
    api: Api
    version: int
    route: Route


_CORRELATION_ID: Final = struct.Struct(">I")
_PARTITION: Final = FETCH.request.run("partition")
"""A routed request's partition, right after its topic (as in every api of ROUTED_APIS)."""
_PRODUCER: Final = PRODUCE.request.run("producer_id", "producer_epoch", "sequence")


def _prefix_key(frame: memoryview) -> tuple[bytes, int] | None:
    """A routed request's prefix without its correlation id, the key it is remembered by, and
    the byte where the prefix ends (the body's fields after partition begin); None for a frame
    too short to hold one."""
    try:
        topic_start = 10 + U16.unpack_from(frame, 8)[0]
        end = topic_start + 6 + U16.unpack_from(frame, topic_start)[0]
    except struct.error:
        return None
    if end > len(frame):
        return None
    return frame[:4].tobytes() + frame[8:end].tobytes(), end


class KnownPrefixes:
    """The prefixes of routed requests that passed every check, by their bytes: at most
    `capacity`, forgotten all at once when full (a client's partitions come back at its next
    request). A front routes with one, a worker decodes with one; not shared between threads."""

    __slots__ = ("_capacity", "_prefixes")

    def __init__(self, capacity: int = 4096) -> None:
        self._capacity = capacity
        self._prefixes: dict[bytes, _Prefix] = {}

    def remember(self, frame: Buffer, api: Api, version: int, route: Route) -> None:
        """Remember the prefix of `frame`, a request to `route` that passed every check."""
        known = _prefix_key(memoryview(frame))
        if known is not None:
            if len(self._prefixes) >= self._capacity:
                self._prefixes.clear()
            self._prefixes[known[0]] = _Prefix(api, version, route)

    def decode(self, frames: Frames) -> tuple[RequestHeader, Request]:
        """decode_request, remembering the prefix of a routed request that passes."""
        header, request = decode_request(frames)
        if isinstance(request, RoutedRequest):
            self.remember(
                frames[0], header.api, header.version, Route(request.topic, request.partition)
            )
        return header, request

    def route(self, frames: Frames) -> Route | None:
        """Where the supervisor sends a request: the (topic, partition) of a request of
        ROUTED_APIS, None for the apis the front serves itself (METADATA, CREATE_TOPIC, ...).
        Reads the header and the start of the body, never the message set. Raises what
        decode_request would for what it reads, but a request it routes may still be refused
        by decode_request."""
        if len(frames) == 1:
            known = _prefix_key(memoryview(frames[0]))
            if known is not None and (prefix := self._prefixes.get(known[0])) is not None:
                return prefix.route
        reader, header = read_request_header(frames)
        api = header.api
        if api not in ROUTED_APIS:
            return None
        topic = reader.string("topic")
        (partition,) = reader.fixed(_PARTITION)
        check_topic_name(topic)
        route = Route(topic, partition)
        self.remember(frames[0], api, header.version, route)
        return route

    def produce(
        self, frames: Frames
    ) -> tuple[int, int, Route, int, int, int, int, memoryview] | None:
        """A PRODUCE request whose prefix is known good (see above), decoded with no header or
        request object: its correlation_id, api_version, route, ack (an int, checked),
        producer_id, producer_epoch and sequence (0 before version 3; checked) and message set
        (a view of the rest of the frame, unchecked). None for any other request, and for one
        whose prefix is not known yet: `decode` then decodes it (and, if it passes, remembers
        it) or refuses it."""
        if len(frames) != 1:
            return None
        view = memoryview(frames[0])
        known = _prefix_key(view)
        if known is None:
            return None
        prefix = self._prefixes.get(known[0])
        end = known[1]
        if prefix is None or prefix.api is not Api.PRODUCE or end >= len(view):
            return None
        ack = view[end]
        if ack > Ack.ALL:
            return None
        correlation_id = _CORRELATION_ID.unpack_from(view, 4)[0]
        if prefix.version < PRODUCE_IDEMPOTENT_VERSION:
            return correlation_id, prefix.version, prefix.route, ack, 0, 0, 0, view[end + 1 :]
        start = end + 1 + _PRODUCER.size
        if start > len(view):
            return None
        producer_id, epoch, sequence = _PRODUCER.struct.unpack_from(view, end + 1)
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

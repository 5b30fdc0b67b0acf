"""Requests: encoding and decoding a request's one frame, and reading parts of a frame
without decoding it (peek_*)."""

from __future__ import annotations

import functools
from typing import Final

from broker.errors import (
    MalformedRequest,
    UnsupportedApi,
    UnsupportedVersion,
)
from broker.log.message import Buffer
from broker.protocol.apis import Ack, Api, Frames
from broker.protocol.messages import (
    ProduceRequest,
    Request,
    RequestHeader,
)
from broker.protocol.names import check_topic_name
from broker.protocol.tables import (
    API_VERSIONS,
    MULTI_PRODUCE,
    PRODUCE,
    PRODUCE_IDEMPOTENT_VERSION,
    TABLES,
    check_version,
)
from broker.protocol.wire import (
    API_AND_VERSION,
    REQUEST_HEADER,
    U16,
    Reader,
    encode_string,
)

# -- requests ----------------------------------------------------------------------------------

_APIS: Final = {api.value: api for api in Api}
_PARTITION_AND_ACK: Final = PRODUCE.request.run("partition", "ack")
_MULTI_ACK: Final = MULTI_PRODUCE.request.run("ack")
_FIRE_AND_FORGET: Final = frozenset({Api.PRODUCE, Api.MULTI_PRODUCE})
"""The apis whose requests with ack 0 get no reply."""
_HEADER_WHERE: Final = "request header"
_BODY_WHERE: Final = {api: f"{api.name} body" for api in Api}


def encode_request(header: RequestHeader, request: Request) -> list[Buffer]:
    """A request's one frame (the envelope is the transport's business): header, body and, for
    PRODUCE, the message set, back to back; the message set is copied into the frame, once.

    The body is laid out for header.version, as its api's table says. Checks only what the
    wire cannot carry (a version the api does not have, an integer out of its type, a string
    over 65535 bytes, a field of a newer version set to other than its default, such as a FETCH
    field of version 2 on a version 1 request), raising ValueError naming the field; the
    broker checks the rest."""
    if header.api != request.api:
        raise ValueError(f"the header says {header.api.name}, the request is {request.api.name}")
    check_version(header.api, header.version)
    body = TABLES[header.api].request
    parts: list[Buffer] = [
        REQUEST_HEADER.pack(header.api, header.version, header.correlation_id),
        encode_string("client_id", header.client_id),
    ]
    body.at(header.version).encode_into(parts, request)
    if body.rest:
        parts.append(getattr(request, body.rest))
    return [b"".join(parts)]


_PRODUCE_V3: Final = PRODUCE.request.run(
    "partition", "ack", "producer_id", "producer_epoch", "sequence"
)
"""A PRODUCE of version 3's body after its topic, as one struct."""


@functools.lru_cache(maxsize=4096)
def _name(name: str, text: str) -> bytes:
    """A client id or a topic as the wire's `string`, made once."""
    return encode_string(name, text)


def encode_produce(correlation_id: int, client_id: str, request: ProduceRequest) -> list[Buffer]:
    """encode_request of a PRODUCE of version 3 (a producer's every batch), byte for byte, in
    one join: no header object, the client id and topic encoded once (a third of the
    producer's cost a message at batch 1 went to encoding its request)."""
    if not 0 < correlation_id < 1 << 32:
        raise ValueError(f"correlation_id {correlation_id} is out of range")
    return [
        b"".join(
            (
                REQUEST_HEADER.pack(Api.PRODUCE, PRODUCE_IDEMPOTENT_VERSION, correlation_id),
                _name("client_id", client_id),
                _name("topic", request.topic),
                _PRODUCE_V3.pack(
                    request.partition,
                    request.ack,
                    request.producer_id,
                    request.producer_epoch,
                    request.sequence,
                ),
                request.message_set,
            )
        )
    ]


def read_request_header(frames: Frames) -> tuple[Reader, RequestHeader]:
    """The checks every request passes first, in this order: it is one frame; the frame holds
    api_key, api_version and correlation_id; the api is known; the version is spoken; then
    client_id. Returns the reader, placed at the start of the body, and the header."""
    if len(frames) != 1:
        raise MalformedRequest(
            f"a request is 1 frame (header, body and, for PRODUCE, the message set), this one "
            f"has {len(frames)}"
        )
    reader = Reader(frames[0], _HEADER_WHERE, MalformedRequest)
    api_key, version, correlation_id = reader.fixed(REQUEST_HEADER)
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
    message set is a memoryview over the rest of the frame, unchecked and uncopied.

    The fields are read as the api's table says; then the frame must end (but for PRODUCE);
    then the topic names are checked, then the table's own checks run."""
    reader, header = read_request_header(frames)
    body = TABLES[header.api].request
    layout = body.at(header.version)
    if body.make is None:
        request = layout.build(reader)
        if not body.rest:
            reader.finish()
        _check_topics(getattr(request, "topic", None), getattr(request, "topics", ()))
        layout.check(reader, request)
        return header, request
    values = layout.read(reader)
    if body.rest:
        values[body.rest] = reader.rest()
    else:
        reader.finish()
    _check_topics(values.get("topic"), values.get("topics", ()))
    return header, layout.make(reader, values)


def _check_topics(topic: str | None, topics: tuple[str, ...]) -> None:
    """InvalidTopic for a request's topic name (or one of its names) that breaks the rules."""
    if topic is not None:
        check_topic_name(topic)
    for name in topics:
        check_topic_name(name)


ROUTED_APIS: Final = frozenset(
    {Api.PRODUCE, Api.FETCH, Api.OFFSETS, Api.DESCRIBE_PARTITION, Api.OFFSET_FOR_LEADER_EPOCH}
)
"""The apis the front sends to the worker holding the partition: their bodies begin with
topic and partition. The front serves the others itself."""


def peek_client_id(frames: Frames) -> str:
    """The client_id of a request that KnownPrefixes.route routed (its header was read
    whole once): read from its place, undecodable bytes replaced."""
    frame = frames[0]
    (length,) = U16.unpack_from(frame, 8)
    return bytes(frame[10 : 10 + length]).decode("utf-8", "replace")


def peek_api(frames: Frames) -> int:
    """The api_key of a request that KnownPrefixes.route routed (its first frame is long
    enough)."""
    api: int = API_AND_VERSION.unpack_from(frames[0])[0]
    return api


def peek_api_name(frames: Frames) -> str:
    """The name of a request's api in lower case ("produce"), read from its first frame
    without decoding the request: "unknown" for a frame too short or an api_key unknown."""
    if len(frames) < 1 or len(frames[0]) < API_AND_VERSION.size:
        return "unknown"
    try:
        return Api(API_AND_VERSION.unpack_from(frames[0])[0]).name.lower()
    except ValueError:
        return "unknown"


def peek_correlation_id(frames: Frames) -> int:
    """The correlation id to answer a request with, even one that fails to decode: the
    request's own when its first frame holds at least its first 8 bytes (whatever the frame
    count), else 0. Never raises."""
    if not frames or len(frames[0]) < REQUEST_HEADER.size:
        return 0
    return int(REQUEST_HEADER.struct.unpack_from(frames[0])[2])


def is_fire_and_forget(frames: Frames) -> bool:
    """Whether the broker must not answer this request, not even with an error: true for a
    one-frame PRODUCE request (of a version spoken) whose frame reaches its ack field (client_id
    and topic whole by their lengths, then partition and ack) and has ack 0 (Ack.NONE), however
    malformed the rest; likewise for a MULTI_PRODUCE, whose ack is its body's first field.
    Never raises."""
    if len(frames) != 1 or len(frames[0]) < REQUEST_HEADER.size:
        return False
    frame = frames[0]
    api_key, version = API_AND_VERSION.unpack_from(frame)
    if api_key not in _FIRE_AND_FORGET or version not in API_VERSIONS[_APIS[api_key]]:
        return False
    reader = Reader(frame, _HEADER_WHERE, MalformedRequest)
    try:
        reader.fixed(REQUEST_HEADER)
        reader.skip_string()  # client_id
        if api_key == Api.PRODUCE:
            reader.skip_string()  # topic
            _, ack = reader.fixed(_PARTITION_AND_ACK)
        else:
            (ack,) = reader.fixed(_MULTI_ACK)
    except MalformedRequest:
        return False
    return int(ack) == Ack.NONE

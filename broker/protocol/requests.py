"""Requests: encoding and decoding a request's one frame, and reading parts of a frame
without decoding it (peek_*)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final, assert_never

from broker.errors import (
    InvalidTopic,
    MalformedRequest,
    UnsupportedApi,
    UnsupportedVersion,
)
from broker.log.epochs import EpochEntry as EpochEntry  # the entries of a FETCH reply
from broker.log.message import Buffer
from broker.log.producers import StoredSet as StoredSet  # the producers of a FETCH reply
from broker.protocol.apis import (
    ACKS,
    API_VERSIONS,
    EARLIEST,
    PRODUCE_IDEMPOTENT_VERSION,
    Ack,
    Api,
    Frames,
    check_version,
)
from broker.protocol.messages import (
    AlterConfigRequest,
    CreateTopicRequest,
    DeleteTopicRequest,
    DescribeClusterRequest,
    DescribeConfigRequest,
    DescribePartitionRequest,
    FetchRequest,
    MetadataRequest,
    OffsetForLeaderEpochRequest,
    OffsetsRequest,
    ProduceRequest,
    Request,
    RequestHeader,
)
from broker.protocol.names import check_topic_name
from broker.protocol.wire import (
    ALTER_COUNTS,
    API_AND_VERSION,
    CREATE_TOPIC_BODY,
    DELETE_COUNT,
    FETCH_BODY,
    FETCH_BODY_V2,
    OFFSET_FOR_LEADER_EPOCH_BODY,
    OFFSETS_BODY,
    PARTITION_FIELD,
    PRODUCE_BODY,
    PRODUCE_BODY_V3,
    REQUEST_HEADER,
    TOPIC_COUNT,
    U16,
    Reader,
    encode_string,
    read_pairs,
)

# -- requests ----------------------------------------------------------------------------------

_APIS: Final = {api.value: api for api in Api}
_HEADER_WHERE: Final = "request header"
_BODY_WHERE: Final = {api: f"{api.name} body" for api in Api}


def encode_request(header: RequestHeader, request: Request) -> list[Buffer]:
    """A request's one frame (the envelope is the transport's business): header, body and, for
    PRODUCE, the message set, back to back; the message set is copied into the frame, once.

    The body is laid out for header.version. Checks only what the wire cannot carry (a
    version this module does not know, an integer out of its type, a string over 65535 bytes,
    a FETCH field of version 2 set on a version 1 request), raising ValueError naming the
    field; the broker checks the rest."""
    if header.api != request.api:
        raise ValueError(f"the header says {header.api.name}, the request is {request.api.name}")
    check_version(header.api, header.version)
    parts: list[Buffer] = [
        REQUEST_HEADER.pack(header.api, header.version, header.correlation_id),
        encode_string("client_id", header.client_id),
    ]
    if isinstance(request, ProduceRequest):
        parts += [
            encode_string("topic", request.topic),
            PRODUCE_BODY.pack(request.partition, request.ack),
        ]
        if header.version >= PRODUCE_IDEMPOTENT_VERSION:
            parts.append(
                PRODUCE_BODY_V3.pack(request.producer_id, request.producer_epoch, request.sequence)
            )
        elif request.producer_id:
            raise ValueError(
                f"producer_id is a field of PRODUCE version {PRODUCE_IDEMPOTENT_VERSION}, "
                f"not of version {header.version}"
            )
        parts.append(request.message_set)
    elif isinstance(request, FetchRequest):
        parts += [
            encode_string("topic", request.topic),
            FETCH_BODY.pack(
                request.partition,
                request.offset,
                request.max_bytes,
                request.max_wait_ms,
                request.min_bytes,
            ),
        ]
        if header.version >= 2:
            parts.append(
                FETCH_BODY_V2.pack(request.replica_id, request.leader_epoch, request.flushed_offset)
            )
        else:
            for name, default in _FETCH_V2_DEFAULTS.items():
                if getattr(request, name) != default:
                    raise ValueError(
                        f"field {name} is {getattr(request, name)!r}: FETCH version 1 has no "
                        "such field (send version 2)"
                    )
    elif isinstance(request, OffsetsRequest):
        parts += [
            encode_string("topic", request.topic),
            OFFSETS_BODY.pack(request.partition, request.time),
        ]
    elif isinstance(request, MetadataRequest):
        parts.append(TOPIC_COUNT.pack(len(request.topics)))
        parts += [encode_string("topic", topic) for topic in request.topics]
    elif isinstance(request, CreateTopicRequest):
        parts += [
            encode_string("topic", request.topic),
            CREATE_TOPIC_BODY.pack(request.partitions, len(request.config)),
        ]
        for key, value in request.config.items():
            parts += [encode_string("key", key), encode_string("value", value)]
    elif isinstance(request, DeleteTopicRequest | DescribeConfigRequest):
        parts.append(encode_string("topic", request.topic))
    elif isinstance(request, DescribeClusterRequest):
        pass
    elif isinstance(request, DescribePartitionRequest):
        parts += [encode_string("topic", request.topic), PARTITION_FIELD.pack(request.partition)]
    elif isinstance(request, AlterConfigRequest):
        parts += [encode_string("topic", request.topic), ALTER_COUNTS.pack(len(request.set))]
        for key, value in request.set.items():
            parts += [encode_string("key", key), encode_string("value", value)]
        parts.append(DELETE_COUNT.pack(len(request.delete)))
        parts += [encode_string("key", key) for key in request.delete]
    elif isinstance(request, OffsetForLeaderEpochRequest):
        parts += [
            encode_string("topic", request.topic),
            OFFSET_FOR_LEADER_EPOCH_BODY.pack(request.partition, request.leader_epoch),
        ]
    else:
        assert_never(request)
    return [b"".join(parts)]


_FETCH_V2_DEFAULTS: Final = {"replica_id": -1, "leader_epoch": -1, "flushed_offset": 0}
"""A version 1 FETCH's values of the version 2 fields: a consumer, with no epoch."""


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
    message set is a memoryview over the rest of the frame, unchecked and uncopied."""
    reader, header = read_request_header(frames)
    request = _REQUEST_DECODERS[header.api](reader, header.version)
    return header, request


def _decode_produce(reader: Reader, version: int) -> ProduceRequest:
    topic = reader.string("topic")
    partition, ack = reader.fixed(PRODUCE_BODY)
    check_topic_name(topic)
    if ack > Ack.ALL:
        raise reader.fail(
            f"field ack is {ack}: it must be 0 (none), 1 (written), 2 (flushed) or 3 (all)"
        )
    if version < PRODUCE_IDEMPOTENT_VERSION:
        return ProduceRequest(topic, partition, ACKS[ack], reader.rest())
    producer_id, epoch, sequence = reader.fixed(PRODUCE_BODY_V3)
    if not producer_id and (epoch or sequence):
        raise reader.fail(
            f"producer_id is 0 (no idempotent producer) but producer_epoch is {epoch} and "
            f"sequence {sequence}: both must be 0 then"
        )
    return ProduceRequest(topic, partition, ACKS[ack], reader.rest(), producer_id, epoch, sequence)


def _decode_fetch(reader: Reader, version: int) -> FetchRequest:
    topic = reader.string("topic")
    partition, offset, max_bytes, max_wait_ms, min_bytes = reader.fixed(FETCH_BODY)
    replica_id, leader_epoch, flushed_offset = (
        reader.fixed(FETCH_BODY_V2) if version >= 2 else _FETCH_V2_DEFAULTS.values()
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


def _decode_offset_for_leader_epoch(reader: Reader, version: int) -> OffsetForLeaderEpochRequest:
    topic = reader.string("topic")
    partition, leader_epoch = reader.fixed(OFFSET_FOR_LEADER_EPOCH_BODY)
    reader.finish()
    check_topic_name(topic)
    if leader_epoch < -1:
        raise reader.fail(
            f"field leader_epoch is {leader_epoch}: it must be -1 (no history) or >= 0"
        )
    return OffsetForLeaderEpochRequest(topic, partition, leader_epoch)


def _decode_offsets(reader: Reader, version: int) -> OffsetsRequest:
    topic = reader.string("topic")
    partition, time = reader.fixed(OFFSETS_BODY)
    reader.finish()
    check_topic_name(topic)
    if time < EARLIEST:
        raise reader.fail(
            f"field time is {time}: it must be -2 (earliest), -1 (latest) or a timestamp >= 0"
        )
    return OffsetsRequest(topic, partition, time)


def _decode_metadata(reader: Reader, version: int) -> MetadataRequest:
    (count,) = reader.fixed(TOPIC_COUNT)
    topics = tuple(reader.string(f"topic[{i}]") for i in range(count))
    reader.finish()
    for topic in topics:
        check_topic_name(topic)
    return MetadataRequest(topics)


def _decode_create_topic(reader: Reader, version: int) -> CreateTopicRequest:
    topic = reader.string("topic")
    partitions, count = reader.fixed(CREATE_TOPIC_BODY)
    pairs = read_pairs(reader, count)
    reader.finish()
    check_topic_name(topic)
    if partitions < 1:
        raise InvalidTopic(f"topic {topic}: partitions is 0, a topic needs at least 1")
    return CreateTopicRequest(topic, partitions, _settings(topic, pairs))


def _settings(topic: str, pairs: list[tuple[str, str]]) -> dict[str, str]:
    """Settings by key, in wire order; InvalidTopic for a key given twice."""
    config: dict[str, str] = {}
    for key, value in pairs:
        if key in config:
            raise InvalidTopic(f"topic {topic}: setting {key!r} is given twice")
        config[key] = value
    return config


def _decode_delete_topic(reader: Reader, version: int) -> DeleteTopicRequest:
    return DeleteTopicRequest(_topic_only(reader))


def _topic_only(reader: Reader) -> str:
    topic = reader.string("topic")
    reader.finish()
    check_topic_name(topic)
    return topic


def _decode_describe_cluster(reader: Reader, version: int) -> DescribeClusterRequest:
    reader.finish()
    return DescribeClusterRequest()


def _decode_describe_partition(reader: Reader, version: int) -> DescribePartitionRequest:
    topic = reader.string("topic")
    (partition,) = reader.fixed(PARTITION_FIELD)
    reader.finish()
    check_topic_name(topic)
    return DescribePartitionRequest(topic, partition)


def _decode_describe_config(reader: Reader, version: int) -> DescribeConfigRequest:
    return DescribeConfigRequest(_topic_only(reader))


def _decode_alter_config(reader: Reader, version: int) -> AlterConfigRequest:
    topic = reader.string("topic")
    (count,) = reader.fixed(ALTER_COUNTS)
    pairs = read_pairs(reader, count)
    (delete_count,) = reader.fixed(DELETE_COUNT)
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


_REQUEST_DECODERS: Final[Mapping[Api, Callable[[Reader, int], Request]]] = {
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


def peek_client_id(frames: Frames) -> str:
    """The client_id of a request that KnownPrefixes.route routed (its header was read whole once):
    read from its place, undecodable bytes replaced."""
    frame = frames[0]
    (length,) = U16.unpack_from(frame, 8)
    return bytes(frame[10 : 10 + length]).decode("utf-8", "replace")


def peek_api(frames: Frames) -> int:
    """The api_key of a request that KnownPrefixes.route routed (its first frame is long enough)."""
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
    one-frame PRODUCE request (of a version spoken) whose frame reaches its ack field (client_id and
    topic whole by their lengths, then partition and ack) and has ack 0 (Ack.NONE), however
    malformed the rest. Never raises."""
    if len(frames) != 1 or len(frames[0]) < REQUEST_HEADER.size:
        return False
    frame = frames[0]
    api_key, version = API_AND_VERSION.unpack_from(frame)
    if api_key != Api.PRODUCE or version not in API_VERSIONS[Api.PRODUCE]:
        return False
    reader = Reader(frame, _HEADER_WHERE, MalformedRequest)
    try:
        reader.fixed(REQUEST_HEADER)
        reader.skip_string()  # client_id
        reader.skip_string()  # topic
        _, ack = reader.fixed(PRODUCE_BODY)
    except MalformedRequest:
        return False
    return int(ack) == Ack.NONE

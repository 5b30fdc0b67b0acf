"""Replies: encoding and decoding a reply's frames, errors included."""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Final, Literal, assert_never, overload

from broker.errors import (
    BrokerError,
    MalformedReply,
    PylogError,
)
from broker.log.epochs import EpochEntry as EpochEntry  # the entries of a FETCH reply
from broker.log.message import Buffer
from broker.log.producers import StoredSet as StoredSet  # the producers of a FETCH reply
from broker.protocol.apis import (
    API_VERSION,
    FETCH_THROTTLE_VERSION,
    PRODUCE_THROTTLE_VERSION,
    PRODUCERS_FETCH_VERSION,
    Api,
    Frames,
    check_version,
)
from broker.protocol.codes import ERROR_FIELDS, ErrorCode, broker_error, error_code_for, known_code
from broker.protocol.messages import (
    ClusterBroker,
    ConfigEntry,
    DescribeClusterReply,
    DescribeConfigReply,
    DescribePartitionReply,
    EmptyReply,
    FetchReply,
    MetadataBroker,
    MetadataReply,
    OffsetForLeaderEpochReply,
    OffsetsReply,
    PartitionInfo,
    ProduceReply,
    Reply,
    ReplyHeader,
    TopicInfo,
)
from broker.protocol.wire import (
    BROKER_COUNT,
    BROKER_ID,
    BROKER_PARTITIONS,
    CONFIG_COUNT,
    EPOCH_ENTRY,
    FETCH_REPLY,
    FETCH_REPLY_V2,
    ISR_COUNT,
    LOG_DIR_COUNT,
    OFFSET_FOR_LEADER_EPOCH_REPLY,
    OFFSETS_REPLY,
    OVERRIDDEN,
    PARTITION_ERROR,
    PARTITION_INFO,
    PARTITION_LEADER,
    PARTITION_STATE,
    PORT,
    PRODUCE_REPLY,
    PRODUCER_COUNT,
    PRODUCER_ENTRY,
    REPLICA_COUNT,
    REPLY_HEADER,
    THROTTLE,
    TOPIC_COUNT,
    TOPIC_ERROR,
    UP,
    Fields,
    Reader,
    encode_string,
    plural,
    read_pairs,
)

# -- replies -----------------------------------------------------------------------------------

_SUCCESS: Final = b"\x00\x00"  # error_message: the empty string


_REPLY_FRAMES: Final[Mapping[Api, tuple[str, ...]]] = {api: ("header and body",) for api in Api} | {
    Api.FETCH: ("header and body", "message set")
}
_REPLY_HEADER_WHERE: Final = "reply header"
_REPLY_BODY_WHERE: Final = {api: f"{api.name} reply body" for api in Api}


def encode_reply(correlation_id: int, reply: Reply, version: int = API_VERSION) -> list[Buffer]:
    """The frames of a successful reply to a request of api_version `version`: header and
    body in one frame, and for FETCH the message set as a second frame, the very object given
    (so a view of a segment is sent without copying). At version 1 the fields of version 2
    are left out (a version 1 METADATA gives a partition without leader, broker_id -1, as its
    replicas[0]). ValueError, naming the field, for what the wire cannot carry (a version the
    reply's api does not have included)."""
    check_version(_REPLY_APIS[type(reply)], version)
    parts: list[Buffer] = [REPLY_HEADER.pack(correlation_id, ErrorCode.NONE), _SUCCESS]
    if isinstance(reply, ProduceReply):
        parts.append(PRODUCE_REPLY.pack(reply.base_offset, reply.count))
        if version >= PRODUCE_THROTTLE_VERSION:
            parts.append(THROTTLE.pack(reply.throttle_ms))
    elif isinstance(reply, FetchReply):
        parts.append(FETCH_REPLY.pack(reply.high_watermark, reply.log_start_offset))
        if version >= 2:
            parts.append(FETCH_REPLY_V2.pack(reply.leader_epoch, len(reply.epochs)))
            parts += [EPOCH_ENTRY.pack(e.epoch, e.start_offset) for e in reply.epochs]
        if version >= FETCH_THROTTLE_VERSION:
            parts.append(THROTTLE.pack(reply.throttle_ms))
        if version >= PRODUCERS_FETCH_VERSION:
            parts.append(PRODUCER_COUNT.pack(len(reply.producers)))
            parts += [PRODUCER_ENTRY.pack(*entry) for entry in reply.producers]
        elif reply.producers:
            raise ValueError(
                f"producers is a field of FETCH version {PRODUCERS_FETCH_VERSION}, not of "
                f"version {version}"
            )
        return [b"".join(parts), reply.message_set]
    elif isinstance(reply, OffsetsReply):
        parts.append(OFFSETS_REPLY.pack(reply.offset))
    elif isinstance(reply, MetadataReply):
        _encode_metadata_reply(parts, reply, version)
    elif isinstance(reply, OffsetForLeaderEpochReply):
        parts.append(OFFSET_FOR_LEADER_EPOCH_REPLY.pack(reply.epoch, reply.end_offset))
    elif isinstance(reply, EmptyReply):
        pass
    elif isinstance(reply, DescribeClusterReply):
        parts += [
            encode_string("zookeeper_connect", reply.zookeeper_connect),
            encode_string("zookeeper_chroot", reply.zookeeper_chroot),
            BROKER_COUNT.pack(len(reply.brokers)),
        ]
        for b in reply.brokers:
            parts += [
                BROKER_ID.pack(b.broker_id),
                UP.pack(b.up),
                encode_string("host", b.host),
                PORT.pack(b.port),
                encode_string("version", b.version),
                LOG_DIR_COUNT.pack(len(b.log_dirs)),
                *(encode_string("log_dir", d) for d in b.log_dirs),
                BROKER_PARTITIONS.pack(b.partitions),
            ]
    elif isinstance(reply, DescribePartitionReply):
        parts.append(
            PARTITION_STATE.pack(
                reply.log_start_offset,
                reply.high_watermark,
                reply.log_end_offset,
                reply.size_bytes,
                reply.segments,
                reply.oldest_timestamp,
            )
        )
        parts.append(CONFIG_COUNT.pack(len(reply.config)))
        for key, value in reply.config.items():
            parts += [encode_string("key", key), encode_string("value", value)]
    elif isinstance(reply, DescribeConfigReply):
        parts.append(CONFIG_COUNT.pack(len(reply.entries)))
        for entry in reply.entries:
            parts += [
                encode_string("key", entry.key),
                encode_string("value", entry.value),
                OVERRIDDEN.pack(entry.overridden),
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
    parts.append(BROKER_COUNT.pack(len(reply.brokers)))
    for broker in reply.brokers:
        parts += [
            BROKER_ID.pack(broker.broker_id),
            encode_string("host", broker.host),
            PORT.pack(broker.port),
        ]
        if version >= 2:
            parts.append(encode_string("rack", broker.rack))
    parts.append(TOPIC_COUNT.pack(len(reply.topics)))
    for topic in reply.topics:
        parts += [
            encode_string("topic", topic.topic),
            TOPIC_ERROR.pack(topic.error_code, len(topic.partitions)),
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
                parts.append(PARTITION_INFO.pack(p.partition, holder, p.error_code))
                continue
            parts += [
                PARTITION_LEADER.pack(p.partition, p.broker_id, p.leader_epoch),
                REPLICA_COUNT.pack(len(p.replicas)),
                *(BROKER_ID.pack(r) for r in p.replicas),
                ISR_COUNT.pack(len(p.isr)),
                *(BROKER_ID.pack(r) for r in p.isr),
                PARTITION_ERROR.pack(p.error_code),
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
    parts = [REPLY_HEADER.pack(correlation_id, code), encode_string("error_message", text, True)]
    fields = ERROR_FIELDS.get(code)
    if fields is not None:
        if isinstance(error, ErrorCode):
            raise ValueError(f"a {code.name} reply carries fields: give the exception")
        parts.append(fields.numbers.pack(*(getattr(error, n) for n in fields.numbers.names)))
        parts += [encode_string(name, getattr(error, name), True) for name in fields.texts]
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


def _read_reply_header(frames: Frames) -> tuple[Reader, ReplyHeader]:
    if not frames:
        raise MalformedReply("the reply has no frames: no header")
    reader = Reader(frames[0], _REPLY_HEADER_WHERE, MalformedReply)
    correlation_id, code = reader.fixed(REPLY_HEADER)
    message = reader.string("error_message")
    return reader, ReplyHeader(correlation_id, known_code(code), message)


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
    check_version(api, version)
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
            f"a {api.name} reply is {plural(len(names), 'frame')} ({', '.join(names)}), "
            f"this one has {len(frames)}"
        )
    reader.enter(_REPLY_BODY_WHERE[api])
    reply: Reply
    if api is Api.PRODUCE:
        base_offset, count = reader.fixed(PRODUCE_REPLY)
        throttle_ms = _read_throttle(reader, version >= PRODUCE_THROTTLE_VERSION)
        reply = ProduceReply(base_offset, count, throttle_ms)
    elif api is Api.FETCH:
        high_watermark, log_start_offset = reader.fixed(FETCH_REPLY)
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
        reply = OffsetsReply(*reader.fixed(OFFSETS_REPLY))
    elif api is Api.METADATA:
        reply = _decode_metadata_reply(reader, version)
    elif api is Api.OFFSET_FOR_LEADER_EPOCH:
        epoch, end_offset = reader.fixed(OFFSET_FOR_LEADER_EPOCH_REPLY)
        _check_epoch(reader, "epoch", epoch)
        reply = OffsetForLeaderEpochReply(epoch, end_offset)
    elif api is Api.DESCRIBE_CLUSTER:
        reply = _decode_describe_cluster_reply(reader)
    elif api is Api.DESCRIBE_PARTITION:
        start, high, end, size, segments, oldest = reader.fixed(PARTITION_STATE)
        (count,) = reader.fixed(CONFIG_COUNT)
        config = dict(read_pairs(reader, count))
        reply = DescribePartitionReply(start, high, end, size, segments, oldest, config)
    elif api is Api.DESCRIBE_CONFIG:
        (count,) = reader.fixed(CONFIG_COUNT)
        entries = []
        for i in range(count):
            key, value = reader.string(f"key[{i}]"), reader.string(f"value[{i}]")
            entries.append(ConfigEntry(key, value, _flag(reader, OVERRIDDEN)))
        reply = DescribeConfigReply(tuple(entries))
    else:
        reply = EmptyReply()
    reader.finish()
    return reply


def _error_fields(reader: Reader, header: ReplyHeader) -> dict[str, int | str]:
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


def _check_epoch(reader: Reader, name: str, epoch: int) -> None:
    """A leader epoch is -1 (none) or more; MalformedReply below."""
    if epoch < -1:
        raise reader.fail(f"field {name} is {epoch}: it must be -1 (none) or >= 0")


def _read_throttle(reader: Reader, present: bool) -> int:
    """A reply's throttle_ms when its version has one (PRODUCE 2, FETCH 4), else 0."""
    return int(reader.fixed(THROTTLE)[0]) if present else 0


def _read_fetch_epochs(reader: Reader) -> tuple[int, tuple[EpochEntry, ...]]:
    """A version 2 FETCH reply's leader_epoch and epoch entries: epochs >= 0, epochs and start
    offsets rising (as in a leader-epoch-checkpoint), else MalformedReply."""
    leader_epoch, count = reader.fixed(FETCH_REPLY_V2)
    _check_epoch(reader, "leader_epoch", leader_epoch)
    entries: list[EpochEntry] = []
    for i in range(count):
        epoch, start = reader.fixed(EPOCH_ENTRY)
        if entries and (epoch <= entries[-1].epoch or start <= entries[-1].start_offset):
            raise reader.fail(
                f"epoch entry {i}, ({epoch}, {start}), does not follow ({entries[-1].epoch}, "
                f"{entries[-1].start_offset}): epochs and start offsets must rise"
            )
        if epoch < 0:
            raise reader.fail(f"epoch entry {i} has epoch {epoch}: it must be >= 0")
        entries.append(EpochEntry(epoch, start))
    return leader_epoch, tuple(entries)


def _read_fetch_producers(reader: Reader) -> tuple[StoredSet, ...]:
    """A version 5 FETCH reply's producer entries: producer_id > 0, each set's end past its
    offset, offsets rising, else MalformedReply."""
    (count,) = reader.fixed(PRODUCER_COUNT)
    entries: list[StoredSet] = []
    for i in range(count):
        entry = StoredSet(*reader.fixed(PRODUCER_ENTRY))
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


def _decode_metadata_reply(reader: Reader, version: int) -> MetadataReply:
    brokers = []
    (broker_count,) = reader.fixed(BROKER_COUNT)
    for _ in range(broker_count):
        (broker_id,) = reader.fixed(BROKER_ID)
        host = reader.string("host")
        (port,) = reader.fixed(PORT)
        rack = reader.string("rack") if version >= 2 else ""
        brokers.append(MetadataBroker(broker_id, host, port, rack))
    topics = []
    (topic_count,) = reader.fixed(TOPIC_COUNT)
    for _ in range(topic_count):
        topic = reader.string("topic")
        code, partition_count = reader.fixed(TOPIC_ERROR)
        partitions = []
        for _ in range(partition_count):
            if version < 2:
                number, holder, partition_code = reader.fixed(PARTITION_INFO)
                partitions.append(PartitionInfo(number, holder, known_code(partition_code)))
                continue
            number, leader, leader_epoch = reader.fixed(PARTITION_LEADER)
            if leader < -1:
                raise reader.fail(f"field leader is {leader}: it must be -1 (none) or a broker id")
            _check_epoch(reader, "leader_epoch", leader_epoch)
            (count,) = reader.fixed(REPLICA_COUNT)
            replicas = tuple(reader.fixed(BROKER_ID)[0] for _ in range(count))
            (count,) = reader.fixed(ISR_COUNT)
            isr = tuple(reader.fixed(BROKER_ID)[0] for _ in range(count))
            (partition_code,) = reader.fixed(PARTITION_ERROR)
            partitions.append(
                PartitionInfo(
                    number, leader, known_code(partition_code), leader_epoch, replicas, isr
                )
            )
        topics.append(TopicInfo(topic, known_code(code), tuple(partitions)))
    return MetadataReply(tuple(brokers), tuple(topics))


def _decode_describe_cluster_reply(reader: Reader) -> DescribeClusterReply:
    connect = reader.string("zookeeper_connect")
    chroot = reader.string("zookeeper_chroot")
    (count,) = reader.fixed(BROKER_COUNT)
    brokers = []
    for _ in range(count):
        (broker_id,) = reader.fixed(BROKER_ID)
        up = _flag(reader, UP)
        host = reader.string("host")
        (port,) = reader.fixed(PORT)
        version = reader.string("version")
        (dirs,) = reader.fixed(LOG_DIR_COUNT)
        log_dirs = tuple(reader.string(f"log_dir[{i}]") for i in range(dirs))
        (partitions,) = reader.fixed(BROKER_PARTITIONS)
        brokers.append(ClusterBroker(broker_id, up, host, port, version, log_dirs, partitions))
    return DescribeClusterReply(connect, chroot, tuple(brokers))


def _flag(reader: Reader, field: Fields) -> bool:
    """A u8 that is 0 (false) or 1 (true); MalformedReply for any other value."""
    (value,) = reader.fixed(field)
    if value > 1:
        raise reader.fail(f"field {field.names[0]} is {value}: it must be 0 or 1")
    return bool(value)

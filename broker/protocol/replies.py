"""Replies: encoding and decoding a reply's frames, errors included."""

from __future__ import annotations

import struct
from typing import Final, Literal, overload

from broker.errors import (
    BrokerError,
    MalformedReply,
    PylogError,
)
from broker.log.message import Buffer
from broker.protocol.apis import API_VERSION, Api, Frames
from broker.protocol.codes import ERROR_FIELDS, ErrorCode, broker_error, error_code_for, known_code
from broker.protocol.messages import (
    DescribeClusterReply,
    DescribeConfigReply,
    DescribeGroupReply,
    DescribePartitionReply,
    EmptyReply,
    FetchPartReply,
    FetchReply,
    GroupHeartbeatReply,
    ListGroupsReply,
    MetadataReply,
    MultiFetchReply,
    MultiProduceReply,
    OffsetCommitReply,
    OffsetFetchReply,
    OffsetForLeaderEpochReply,
    OffsetsReply,
    PartReply,
    ProduceReply,
    Reply,
    ReplyHeader,
)
from broker.protocol.tables import (
    PRODUCE,
    PRODUCE_IDEMPOTENT_VERSION,
    PRODUCERS_FETCH_VERSION,
    REPLY_CLASSES,
    TABLES,
    check_version,
)
from broker.protocol.wire import (
    REPLY_HEADER,
    Reader,
    encode_string,
    plural,
)

# -- replies -----------------------------------------------------------------------------------

_SUCCESS: Final = b"\x00\x00"  # error_message: the empty string


_REPLY_HEADER_WHERE: Final = "reply header"
_REPLY_BODY_WHERE: Final = {api: f"{api.name} reply body" for api in Api}


def encode_reply(correlation_id: int, reply: Reply, version: int = API_VERSION) -> list[Buffer]:
    """The frames of a successful reply to a request of api_version `version`: header and
    body in one frame, and for FETCH the message set as a second frame, the very object given
    (so a view of a segment is sent without copying). The body is laid out as the api's table
    says for `version`: the fields of newer versions are left out (a version 1 METADATA gives
    a partition without leader, broker_id -1, as its replicas[0]), but for FETCH's producers,
    refused (a follower must not lose them). ValueError, naming the field, for what the wire
    cannot carry (a version the reply's api does not have included)."""
    table = REPLY_CLASSES[type(reply)]
    check_version(table.api, version)
    parts: list[Buffer] = [REPLY_HEADER.pack(correlation_id, ErrorCode.NONE), _SUCCESS]
    body = table.reply
    body.at(version).encode_into(parts, reply)
    if body.frame:
        return [b"".join(parts), getattr(reply, body.frame)]
    return [b"".join(parts)]


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
        if fields.after.names:
            parts.append(fields.after.pack(*(getattr(error, n) for n in fields.after.names)))
    return [b"".join(parts)]


def _describe(error: BaseException) -> str:
    if isinstance(error, BrokerError):
        return error.message
    if isinstance(error, PylogError):
        return str(error)
    return f"{type(error).__name__}: {error}"


_SUCCESS_START: Final = struct.Struct(">IhH")
"""A reply's correlation id, error code and error message length: (id, 0, 0) is a success."""
_PRODUCE_ACKS: Final = {
    version: struct.Struct(">IhH" + "".join(PRODUCE.reply.run(*names).codes))
    for version in PRODUCE.versions
    for names in [[name for name, _ in PRODUCE.reply.rows(version)]]
}
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
    api: Literal[
        Api.CREATE_TOPIC,
        Api.DELETE_TOPIC,
        Api.ALTER_CONFIG,
        Api.DELETE_GROUP,
        Api.CREATE_PARTITIONS,
    ],
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
def decode_reply(
    api: Literal[Api.MULTI_PRODUCE], frames: Frames, version: int = API_VERSION
) -> MultiProduceReply: ...
@overload
def decode_reply(
    api: Literal[Api.MULTI_FETCH], frames: Frames, version: int = API_VERSION
) -> MultiFetchReply: ...
@overload
def decode_reply(
    api: Literal[Api.GROUP_HEARTBEAT], frames: Frames, version: int = API_VERSION
) -> GroupHeartbeatReply: ...
@overload
def decode_reply(
    api: Literal[Api.OFFSET_COMMIT], frames: Frames, version: int = API_VERSION
) -> OffsetCommitReply: ...
@overload
def decode_reply(
    api: Literal[Api.OFFSET_FETCH], frames: Frames, version: int = API_VERSION
) -> OffsetFetchReply: ...
@overload
def decode_reply(
    api: Literal[Api.DESCRIBE_GROUP], frames: Frames, version: int = API_VERSION
) -> DescribeGroupReply: ...
@overload
def decode_reply(
    api: Literal[Api.LIST_GROUPS], frames: Frames, version: int = API_VERSION
) -> ListGroupsReply: ...
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
    table = TABLES[api]
    names = table.reply_frames
    if len(frames) != len(names):
        raise MalformedReply(
            f"a {api.name} reply is {plural(len(names), 'frame')} ({', '.join(names)}), "
            f"this one has {len(frames)}"
        )
    reader.enter(_REPLY_BODY_WHERE[api])
    body = table.reply
    layout = body.at(version)
    reply: Reply
    if body.make is None:
        reply = layout.build(reader, memoryview(frames[1]) if body.frame else None)
        reader.finish()
        layout.check(reader, reply)
        return reply
    values = layout.read(reader)
    reader.finish()
    reply = layout.make(reader, values)
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
        if fields.after.names:
            values.update(zip(fields.after.names, reader.fixed(fields.after), strict=True))
    reader.finish()
    return values


_NO_CORRELATION_ID: Final = bytes(REPLY_HEADER.offsets[1])
"""Where a part's reply (MULTI_PRODUCE) starts in the PRODUCE reply frame it is made from: the
correlation_id left out."""


def part_reply(frame: Buffer) -> memoryview:
    """A MULTI_PRODUCE part's `reply` from the one frame of a PRODUCE reply of version 3 (or of
    encode_error) for its partition: the frame after its correlation_id, uncopied."""
    return memoryview(frame)[len(_NO_CORRELATION_ID) :]


def decode_part_reply(part: PartReply) -> ProduceReply:
    """A MULTI_PRODUCE part's answer, as decode_reply reads a PRODUCE reply of version 3: the
    ProduceReply of its ack, or BrokerError (with the code's fields) for its error, or
    MalformedReply."""
    return decode_reply(
        Api.PRODUCE, [_NO_CORRELATION_ID + bytes(part.reply)], PRODUCE_IDEMPOTENT_VERSION
    )


def fetch_part_reply(topic: str, partition: int, frames: Frames) -> FetchPartReply:
    """A MULTI_FETCH part's answer from the frames of a FETCH reply of version 5 (or of
    encode_error) for its partition: the first after its correlation_id, the message set (empty
    for an error)."""
    return FetchPartReply(
        topic, partition, part_reply(frames[0]), frames[1] if len(frames) > 1 else b""
    )


_PLAIN_FETCH_PART: Final = struct.Struct(">hHQQiHII")
"""A MULTI_FETCH part's `reply` on success with no epoch or producer entries (a consumer's, or
a follower's of an empty message set): error_code 0, an empty error_message, then the FETCH
version 5 body, with one unpack."""


def fetch_part(topic: str, partition: int, reply: FetchReply) -> FetchPartReply:
    """A MULTI_FETCH part answered with `reply`, as encode_reply gives a FETCH reply of version
    5 (one pack when it has no epoch or producer entries: a worker's hot path)."""
    if reply.epochs or reply.producers:
        frames = encode_reply(0, reply, PRODUCERS_FETCH_VERSION)
        return fetch_part_reply(topic, partition, frames)
    packed = _PLAIN_FETCH_PART.pack(
        0,
        0,
        reply.high_watermark,
        reply.log_start_offset,
        reply.leader_epoch,
        0,
        reply.throttle_ms,
        0,
    )
    return FetchPartReply(topic, partition, packed, reply.message_set)


def decode_fetch_part(part: FetchPartReply) -> FetchReply:
    """A MULTI_FETCH part's answer, as decode_reply reads a FETCH reply of version 5: its
    FetchReply (the message set a view of the part's), or BrokerError (with the code's fields)
    for its error, or MalformedReply (an error's message set must be empty)."""
    reply = part.reply
    if len(reply) == _PLAIN_FETCH_PART.size:  # the common case: a hot path of every reader
        code, message_length, high, start, epoch, epochs, throttle_ms, producers = (
            _PLAIN_FETCH_PART.unpack_from(reply)
        )
        if code == message_length == epochs == producers == 0 and epoch >= -1:
            return FetchReply(high, start, memoryview(part.message_set), epoch, (), throttle_ms)
    frames: list[Buffer] = [_NO_CORRELATION_ID + bytes(reply)]
    if part.reply[:2] == _SUCCESS:  # error_code 0: a FETCH success has its message set
        frames.append(part.message_set)
    elif len(part.message_set):
        raise MalformedReply(
            f"part {part.topic}-{part.partition} is an error with a message set of "
            f"{len(part.message_set)} bytes: an error's must be empty"
        )
    return decode_reply(Api.FETCH, frames, PRODUCERS_FETCH_VERSION)

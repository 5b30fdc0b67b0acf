"""The message format: one message on disk and on the wire, and message sets.

Layout of one message (all integers big-endian; docs/storage.md has a worked hex example):

    offset  size  field
    0       4     length      u32, bytes that follow this field: 22 + key bytes + value bytes
    4       8     checksum    u64, XXH3-64 (seed 0) of bytes [12, 4 + length): everything after
                              the checksum field
    12      1     magic       u8, format version, 1
    13      1     attributes  u8, bits 0-2 compression codec (0 = none, 1 gzip, 3 lz4,
                              4 zstd: a compressed set, broker.log.compression), bits 3-7
                              reserved and zero
    14      8     timestamp   i64, milliseconds since the Unix epoch, set by the producer
    22      4     key_length  i32, -1 for a message without a key
    26      k     key         key_length bytes (none when key_length is -1)
    26 + k  v     value       the rest: length - 22 - k bytes

A message set is messages back to back with nothing between them. A message's offset is the
position of its first byte in its partition's stream of all bytes ever appended, so the next
message's offset is this offset + 4 + length. The format carries no offsets: a set is appended
exactly as the producer built it.

A compressed set is one message (the wrapper) whose codec is not 0 and whose value is the
compressed bytes of an inner set of plain messages (broker.log.compression). The walks of the
broker (`scan`) take it as one message; the decoders (`decode_set`, and broker.log.columns's
`decode_columns`) stop at it, and broker.log.codec expands it and decodes its inner set with
the set's offset. A format 2 message's header block is broker.log.headers'.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from typing import NamedTuple, TypeVar

from xxhash import xxh3_64_intdigest

from broker.errors import InvalidMessage, MessageTooLarge
from broker.log.headers import HeaderItems, Headers, header_block, header_block_bytes, headers_fit

MAGIC = 1
MAGIC_V2 = 2
"""Format 2: format 1 with a header block between the key and the value (docs/storage.md)."""
HEADERS_MIN = 6
"""The least a format 2 message adds: headers_length (u32) and a header count (u16) of 0."""
LENGTH_SIZE = 4
HEADER_SIZE = 26
"""Bytes before the key: length, checksum, magic, attributes, timestamp, key_length."""
MIN_LENGTH = HEADER_SIZE - LENGTH_SIZE
"""The smallest valid value of the length field: no key, empty value."""
CHECKSUM_START = 12
"""The checksum covers the message from this byte to its end."""
MAGIC_AT = 12
"""The magic byte: the message's format, 1 or 2."""
ATTRIBUTES_AT = 13
"""The attributes byte: 0 in a plain message, a compressed set's codec in its wrapper."""
KEY_LENGTH_AT = 22
"""Where a message's key_length (i32) is."""
CODEC_MASK = 0x07
SET_CODECS = frozenset({1, 3, 4})
"""The codecs of a compressed set: gzip, lz4 and zstd (Kafka's numbers; 2, snappy, is not
taken)."""
NESTED_SET = "a compressed set inside a compressed set"
"""What is wrong with a valid compressed set where only plain messages may be."""
MAX_FORMAT_MESSAGE_BYTES = LENGTH_SIZE + 0xFFFF_FFFF
"""The largest message the format can describe (a u32 length field): what stored bytes are
judged by. max_message_bytes is a limit on what producers send, and may change."""

_HEADER = struct.Struct(">IQBBqi")
_LENGTH = struct.Struct(">I")
_PREFIX = struct.Struct(">IQ")
"""length and checksum: what encode_message puts before the checksummed body."""
_BODY_HEADER = struct.Struct(">BBqi")
_TIMESTAMP = struct.Struct(">q")
TIMESTAMP_START = 14
# The hot loop reads magic and attributes as one u16: version 1, attributes 0 (a plain
# message) or a compressed set's codec.
_SCAN_HEADER = struct.Struct(">IQHqi")
_MAGIC_ATTRIBUTES = MAGIC << 8
_STORED_MAGIC_ATTRIBUTES = frozenset(
    {_MAGIC_ATTRIBUTES, MAGIC_V2 << 8} | {MAGIC << 8 | c for c in SET_CODECS}
)
"""A message's magic and attributes, as one u16: format 1 plain or a compressed set's wrapper,
or format 2 (whose attributes are 0: a wrapper is of format 1)."""
_MAGIC_V2_ATTRIBUTES = MAGIC_V2 << 8
NO_TIMESTAMP = -(1 << 63)
"""The smallest i64: the greatest timestamp of no messages at all."""

Buffer = bytes | bytearray | memoryview
R = TypeVar("R", bound=tuple[object, ...])
"""A record type of decode_records."""


class Message(NamedTuple):
    """One decoded message. `size` is its size on disk (4 + length). A named tuple, not a
    dataclass: consumers build one per message, and a tuple is several times cheaper to make."""

    offset: int
    size: int
    timestamp_ms: int
    key: bytes | None
    value: bytes
    attributes: int
    checksum: int
    checksum_ok: bool
    headers: Headers = ()
    """Its headers (format 2), in order: (key, value or None) pairs; () for format 1."""

    @property
    def next_offset(self) -> int:
        return self.offset + self.size


class ScanResult(NamedTuple):
    """What a framing-and-checksum walk over a buffer found.

    `valid_bytes` is the length of the longest prefix made of valid messages, `message_count`
    how many messages it holds, `marks` the positions of the message starts chosen for the
    sparse index (see broker.log.index), and `error` why the walk stopped before the end, or
    None. `greatest` holds the greatest timestamp of each run of valid messages between
    marks (for the time index, broker.log.timeindex): `greatest[0]` of those before the first
    mark, `greatest[k + 1]` of those from `marks[k]` to the next mark; NO_TIMESTAMP for a run
    of none. `first_new` is the position of the first compressed set or message of format 2
    among the valid messages (what FETCH versions 1 and 2 cannot read), or -1
    and `first_set` that of the first compressed set (broker.log.codec.check_sets looks inside
    the sets). A named tuple: one is made for every message set appended.
    """

    valid_bytes: int
    message_count: int
    marks: list[int]
    error: str | None
    greatest: list[int]
    first_new: int
    first_set: int


def encode_message(
    value: bytes,
    key: bytes | None = None,
    timestamp_ms: int | None = None,
    inner: bool = False,
    headers: HeaderItems | None = None,
) -> bytes:
    """Encode one message, ready to be appended or joined into a message set; `inner`, one
    for the inner set of a compressed set, whose checksum field is 0 (docs/storage.md). With
    `headers` (an empty list too), a message of format 2 (`header_block_bytes` says what it
    takes)."""
    inner = bool(inner)
    block = None if headers is None else header_block_bytes(headers)
    if timestamp_ms is None:
        timestamp_ms = time.time_ns() // 1_000_000
    if block is not None:
        if key is None:
            body = _BODY_HEADER.pack(MAGIC_V2, 0, timestamp_ms, -1) + block + value
        else:
            body = _BODY_HEADER.pack(MAGIC_V2, 0, timestamp_ms, len(key)) + key + block + value
    elif key is None:
        body = _BODY_HEADER.pack(MAGIC, 0, timestamp_ms, -1) + value
    else:
        body = _BODY_HEADER.pack(MAGIC, 0, timestamp_ms, len(key)) + key + value
    return _PREFIX.pack(len(body) + 8, 0 if inner else xxh3_64_intdigest(body)) + body


def scan(
    buf: Buffer,
    max_message_bytes: int,
    index_interval: int = 0,
    next_mark: int = 0,
    inner: bool = False,
) -> ScanResult:
    """Walk `buf` from its start, checking every message's framing and checksum.

    Stops at the first message that is cut short, malformed, over `max_message_bytes` in size
    on disk, or whose checksum does not match; a compressed set is one message here. With
    `index_interval` > 0, every message that starts at or after `next_mark` is recorded in
    `marks`, and the next mark is then due `index_interval` bytes later; `greatest` gets the
    greatest timestamp of each run between marks. Used both to validate a producer's set and
    to recover a segment. With `inner`, `buf` is the inner set of a compressed set: each
    checksum field must be 0 instead of matching.
    """
    walked = scan_walk(buf, max_message_bytes, index_interval, next_mark, inner)
    return scan_result(buf, max_message_bytes, walked, inner)


Walked = tuple[int, int, list[int], list[int], int, int]
"""What the walk of `scan` found: valid_bytes, message_count, marks, greatest, first_new,
first_set."""


def scan_result(
    buf: Buffer, max_message_bytes: int, walked: Walked, inner: bool = False
) -> ScanResult:
    """The ScanResult of a walk of `buf` (`scan_walk`, or broker.log._codec's), with the reason
    it stopped before the end, if it did."""
    pos, count, marks, greatest, first_new, first_set = walked
    error = None if pos == len(buf) else _diagnose(buf, pos, max_message_bytes, inner)
    return ScanResult(pos, count, marks, error, greatest, first_new, first_set)


def scan_walk(
    buf: Buffer, max_message_bytes: int, index_interval: int, next_mark: int, inner: bool
) -> Walked:
    """The walk of `scan` (its arguments), without the reason it stopped: the reference of
    broker.log._codec.scan_walk."""
    end = len(buf)
    max_length = max_message_bytes - LENGTH_SIZE
    unpack = _SCAN_HEADER.unpack_from
    checksum_of = xxh3_64_intdigest
    marks: list[int] = []
    greatest: list[int] = []
    top = NO_TIMESTAMP
    stored = _STORED_MAGIC_ATTRIBUTES
    inner = bool(inner)
    if index_interval <= 0:
        next_mark = end + 1
    pos = 0
    count = 0
    first_new = first_set = -1
    try:
        while pos < end:
            length, checksum, magic_attributes, timestamp, key_length = unpack(buf, pos)
            following = pos + 4 + length
            v2 = magic_attributes == _MAGIC_V2_ATTRIBUTES
            if (
                following > end
                or length > max_length
                or length < MIN_LENGTH
                or magic_attributes not in stored
                or not -1 <= key_length <= length - MIN_LENGTH - (HEADERS_MIN if v2 else 0)
                or (v2 and not headers_fit(buf, pos + HEADER_SIZE + max(key_length, 0), following))
                or (
                    checksum != 0
                    if inner
                    else checksum_of(buf[pos + CHECKSUM_START : following]) != checksum
                )
            ):
                break
            if magic_attributes != _MAGIC_ATTRIBUTES and first_new < 0:
                first_new = pos
            if magic_attributes & CODEC_MASK and first_set < 0:
                first_set = pos
            if pos >= next_mark:
                marks.append(pos)
                next_mark = pos + index_interval
                greatest.append(top)
                top = timestamp
            elif timestamp > top:
                top = timestamp
            pos = following
            count += 1
    except struct.error:
        pass  # fewer than HEADER_SIZE bytes left: a cut-short message, diagnosed below
    greatest.append(top)
    return pos, count, marks, greatest, first_new, first_set


def validate_message_set(
    buf: Buffer, max_message_bytes: int, index_interval: int = 0, next_mark: int = 0
) -> ScanResult:
    """Check a producer's message set; raise InvalidMessage naming the first bad message, or
    MessageTooLarge when what is wrong with it is its size over `max_message_bytes`."""
    return validated(
        buf, max_message_bytes, scan(buf, max_message_bytes, index_interval, next_mark)
    )


def validated(buf: Buffer, max_message_bytes: int, result: ScanResult) -> ScanResult:
    """`result`, a scan of a producer's set `buf`, if the set is valid; else what
    validate_message_set raises."""
    if len(buf) == 0:
        raise InvalidMessage(0, "the message set is empty")
    if result.error is not None:
        position = result.valid_bytes
        size = oversized(buf, position, max_message_bytes)
        if size is not None:
            raise MessageTooLarge(f"message at byte {position} of the set", size, max_message_bytes)
        raise InvalidMessage(position, result.error)
    return result


def oversized(buf: Buffer, position: int, max_message_bytes: int) -> int | None:
    """The size of the message at `position` of `buf`, where a scan stopped, when it stopped
    there for being over `max_message_bytes` (its length field, not what follows, is read);
    else None."""
    if len(buf) - position >= LENGTH_SIZE:
        size = message_size_at(buf, position)
        if size > max_message_bytes and size - LENGTH_SIZE >= MIN_LENGTH:
            return size
    return None


def _diagnose(buf: Buffer, pos: int, max_message_bytes: int, inner: bool = False) -> str:
    """Say why the message at `pos` failed the checks in `scan` (the slow path)."""
    left = len(buf) - pos
    if left < HEADER_SIZE:
        return f"cut short: {left} bytes left, a message header needs {HEADER_SIZE}"
    length, checksum, magic, attributes, _, key_length = _HEADER.unpack_from(buf, pos)
    if length < MIN_LENGTH:
        return f"length field {length} is below the minimum {MIN_LENGTH}"
    if length + LENGTH_SIZE > max_message_bytes:
        return f"message size {length + LENGTH_SIZE} is over max.message.bytes {max_message_bytes}"
    if length + LENGTH_SIZE > left:
        return f"cut short: the message needs {length + LENGTH_SIZE} bytes, {left} are left"
    if magic not in (MAGIC, MAGIC_V2):
        return f"unknown format version (magic) {magic}"
    if magic == MAGIC_V2 and attributes:
        return (
            f"attributes {attributes:#04x} in a message of format 2 (a compressed set is of "
            "format 1)"
        )
    codec = attributes & CODEC_MASK
    if codec and codec not in SET_CODECS:
        named = " (snappy, which pylog does not take)" if codec == 2 else ""
        return f"unsupported compression codec {codec}{named}"
    if attributes & ~CODEC_MASK:
        return f"reserved attribute bits set: {attributes:#04x}"
    if not -1 <= key_length <= length - MIN_LENGTH - (HEADERS_MIN if magic == MAGIC_V2 else 0):
        return f"key length {key_length} does not fit in a message of length {length}"
    if magic == MAGIC_V2:
        try:
            header_block(buf, pos + HEADER_SIZE + max(key_length, 0), pos + LENGTH_SIZE + length)
        except ValueError as error:
            return f"header block: {error}"
    if inner:
        if checksum:
            return (
                f"checksum field {checksum:#018x} is not 0 (the set's own checksum covers the "
                "messages of a compressed set)"
            )
        return NESTED_SET
    actual = xxh3_64_intdigest(buf[pos + CHECKSUM_START : pos + LENGTH_SIZE + length])
    if actual != checksum:
        return f"checksum mismatch: stored {checksum:#018x}, computed {actual:#018x}"
    return NESTED_SET


def decode_message(buf: Buffer, pos: int, offset: int) -> Message:
    """Decode the message starting at `pos` of `buf`, whose partition offset is `offset`.

    Checks framing (raising InvalidMessage) but not the checksum: `checksum_ok` reports it, so
    that tools can show a damaged message instead of stopping at it.
    """
    left = len(buf) - pos
    if left < HEADER_SIZE:
        raise InvalidMessage(pos, f"cut short: {left} bytes left, a header needs {HEADER_SIZE}")
    length, checksum, magic, attributes, timestamp_ms, key_length = _HEADER.unpack_from(buf, pos)
    following = pos + LENGTH_SIZE + length
    if length < MIN_LENGTH or following > len(buf) or magic not in (MAGIC, MAGIC_V2):
        raise InvalidMessage(pos, _diagnose(buf, pos, following - pos))
    extra = HEADERS_MIN if magic == MAGIC_V2 else 0
    if not -1 <= key_length <= length - MIN_LENGTH - extra:
        raise InvalidMessage(pos, f"key length {key_length} does not fit in length {length}")
    key_end = value_start = pos + HEADER_SIZE + max(key_length, 0)
    headers: Headers = ()
    if magic == MAGIC_V2:
        try:
            value_start, headers = header_block(buf, key_end, following)
        except ValueError as error:
            raise InvalidMessage(pos, f"header block: {error}") from None
    return Message(
        offset=offset,
        size=LENGTH_SIZE + length,
        timestamp_ms=timestamp_ms,
        key=None if key_length < 0 else bytes(buf[pos + HEADER_SIZE : key_end]),
        value=bytes(buf[value_start:following]),
        attributes=attributes,
        checksum=checksum,
        checksum_ok=xxh3_64_intdigest(buf[pos + CHECKSUM_START : following]) == checksum,
        headers=headers,
    )


def iter_messages(buf: Buffer, base_offset: int = 0, inner: bool = False) -> Iterator[Message]:
    """Decode a message set of whole messages whose first byte is at `base_offset`, checking
    every message's framing and checksum.

    With `inner`, `buf` is a compressed set's inner set, whose checksum fields must be 0.

    Raises InvalidMessage at the first message whose framing or checksum is wrong. This is the
    consumer's hot loop: one header unpack, one checksum and two slices a message. It works on
    bytes (a buffer of another kind is copied once): slicing bytes and hashing the slice costs
    about half of what a memoryview slice does, and each value is copied out anyway."""
    data = buf if type(buf) is bytes else bytes(buf)
    end = len(data)
    unpack = _HEADER.unpack_from
    checksum_of = xxh3_64_intdigest
    make = tuple.__new__  # Message(...) without its Python-level __new__
    pos = 0
    while pos < end:
        try:
            length, checksum, magic, attributes, timestamp_ms, key_length = unpack(data, pos)
        except struct.error:
            raise InvalidMessage(pos, _diagnose(data, pos, end - pos, inner)) from None
        following = pos + LENGTH_SIZE + length
        v2 = magic == MAGIC_V2
        headers: Headers = ()
        value_start = pos + HEADER_SIZE + max(key_length, 0)
        try:
            if v2 and following <= end and -1 <= key_length <= length - MIN_LENGTH - HEADERS_MIN:
                value_start, headers = header_block(data, value_start, following)
            bad = (
                following > end
                or length < MIN_LENGTH
                or magic not in (MAGIC, MAGIC_V2)
                or attributes
                or not -1 <= key_length <= length - MIN_LENGTH - (HEADERS_MIN if v2 else 0)
                or (
                    checksum != 0
                    if inner
                    else checksum_of(data[pos + CHECKSUM_START : following]) != checksum
                )
            )
        except ValueError:
            bad = True
        if bad:
            raise InvalidMessage(
                pos, _diagnose(data, pos, max(following - pos, HEADER_SIZE), inner)
            )
        key = None if key_length < 0 else data[pos + HEADER_SIZE : pos + HEADER_SIZE + key_length]
        yield make(
            Message,
            (
                base_offset + pos,
                following - pos,
                timestamp_ms,
                key,
                data[value_start:following],
                attributes,
                checksum,
                True,
                headers,
            ),
        )
        pos = following


def decode_set(
    buf: Buffer, base_offset: int, start: int = 0, set_size: int = -1
) -> tuple[list[Message], int | None]:
    """The messages of a set whose first byte is at `base_offset`, from position `start`, up
    to the first that fails its checks (a compressed set among them), and that one's position
    in `buf` (None when all pass): the reference of broker.log._codec.decode_set.
    `decode_failure` says why. With `set_size` >= 0, `buf` is the inner set of a compressed
    set at `base_offset` whose size on disk is `set_size`: every message has the set's offset,
    and size 0 but the last, whose size is `set_size` (docs/storage.md)."""
    if not 0 <= start <= len(buf):
        raise ValueError(f"start {start} is outside the set of {len(buf)} bytes")
    messages: list[Message] = []
    try:
        messages.extend(iter_messages(buf[start:], base_offset + start, set_size >= 0))
    except InvalidMessage as error:
        bad: int | None = error.position + start
    else:
        bad = None
    if set_size >= 0:
        messages = [m._replace(offset=base_offset, size=0) for m in messages]
        if messages and bad is None:
            messages[-1] = messages[-1]._replace(size=set_size)
    return messages, bad


def decode_records(
    buf: Buffer,
    base_offset: int,
    start: int,
    set_size: int,
    record_type: type[R],
    topic: str,
    partition: int,
) -> tuple[list[R], int | None]:
    """decode_set's messages as records of `record_type` (a tuple type without a __dict__,
    such as a named tuple), each (topic, partition, offset, timestamp_ms, key, value, headers,
    next_offset), next_offset the offset plus the message's size: the reference of
    broker.log._codec.decode_records, which makes them without a Message between."""
    if not (
        issubclass(record_type, tuple)
        and record_type.__dictoffset__ == 0
        and record_type.__basicsize__ == tuple.__basicsize__
    ):
        raise TypeError("decode_records: type is a tuple type without __dict__")
    if type(topic) is not str or type(partition) is not int:
        raise TypeError("decode_records: topic is a str, partition an int")
    messages, bad = decode_set(buf, base_offset, start, set_size)
    fields = (
        (m.offset, m.timestamp_ms, m.key, m.value, m.headers, m.next_offset) for m in messages
    )
    return [tuple.__new__(record_type, (topic, partition, *f)) for f in fields], bad


def decode_failure(buf: Buffer, pos: int, inner: bool = False) -> InvalidMessage:
    """What iter_messages raises at the message at `pos` of `buf` (an inner set's, with
    `inner`), which fails its checks."""
    left = len(buf) - pos
    size = message_size_at(buf, pos) if left >= HEADER_SIZE else left
    return InvalidMessage(pos, _diagnose(buf, pos, max(size, HEADER_SIZE), inner))


def valid_message_end(buf: Buffer, pos: int) -> int | None:
    """Where the message starting at `pos` ends, if it passes every check of `scan` (framing
    and checksum, within the format's limits); None if it does not."""
    try:
        length, checksum, magic_attributes, _, key_length = _SCAN_HEADER.unpack_from(buf, pos)
    except struct.error:
        return None
    following: int = pos + LENGTH_SIZE + length
    v2 = magic_attributes == _MAGIC_V2_ATTRIBUTES
    if (
        following > len(buf)
        or length < MIN_LENGTH
        or magic_attributes not in _STORED_MAGIC_ATTRIBUTES
        or not -1 <= key_length <= length - MIN_LENGTH - (HEADERS_MIN if v2 else 0)
        or (v2 and not headers_fit(buf, pos + HEADER_SIZE + max(key_length, 0), following))
        or xxh3_64_intdigest(buf[pos + CHECKSUM_START : following]) != checksum
    ):
        return None
    return following


def timestamp_at(buf: Buffer, pos: int) -> int:
    """The timestamp (ms) of the message starting at `pos`, from its header alone."""
    return int(_TIMESTAMP.unpack_from(buf, pos + TIMESTAMP_START)[0])


def message_size_at(buf: Buffer, pos: int) -> int:
    """The on-disk size of the message starting at `pos`, from its length field alone."""
    return LENGTH_SIZE + int(_LENGTH.unpack_from(buf, pos)[0])

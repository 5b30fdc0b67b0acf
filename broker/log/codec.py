"""The message format's hot loops, from the C extension broker.log._codec when it is built,
else from their Python references in broker.log.message and broker.log.columns (docs/storage.md,
"The codec").

Both give the same results, exceptions included (tests/log/test_codec.py). `PYLOG_CODEC=python`
in the environment takes the Python ones (for comparisons, and as the way out should the C ones
misbehave); `PYLOG_CODEC=c` makes a missing extension an ImportError that says how to build it.
`IMPLEMENTATION` says which is in use: "c" or "python".
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterator
from typing import Final, TypeVar

from broker.errors import InvalidMessage, MessageTooLarge
from broker.log import columns, compression, message
from broker.log.columns import Columns, Piece
from broker.log.compression import (
    MAX_INNER_SET_BYTES,
    Compressor,
    InnerSetOverBound,
    expand,
    inner_message,
    inner_set,
    plain_message,
)
from broker.log.message import (
    ATTRIBUTES_AT,
    CODEC_MASK,
    HEADER_SIZE,
    KEY_LENGTH_AT,
    NESTED_SET,
    SET_CODECS,
    Buffer,
    Message,
    R,
    ScanResult,
    decode_failure,
    message_size_at,
    oversized,
    valid_message_end,
    validated,
)

_CHOICE = os.environ.get("PYLOG_CODEC", "")
if _CHOICE not in ("", "c", "python"):
    raise ImportError(f"PYLOG_CODEC must be c or python, not {_CHOICE!r}")

_BUILD_HINT = (
    "the C codec broker.log._codec is not built: install gcc, the Python headers "
    "(python3-dev) and libxxhash-dev (scripts/setup does), then `pip install -e .` again"
)

if _CHOICE == "python":
    from broker.log import message as _impl
else:
    try:
        from broker.log import _codec as _impl  # type: ignore[no-redef]
    except ImportError as error:
        if _CHOICE == "c":
            raise ImportError(f"PYLOG_CODEC=c: {_BUILD_HINT} ({error})") from error
        from broker.log import message as _impl

IMPLEMENTATION: Final = "c" if _impl is not message else "python"
T = TypeVar("T")
READ_MESSAGES: Final = 100_000
READ_EXPANDED_BYTES: Final = 64 << 20
"""A reader's decoding (`decode`, `decode_records`) expands a fetched set's compressed sets
until it holds READ_MESSAGES messages or has expanded READ_EXPANDED_BYTES, and stops at the
next set's start: a fetch of 1 MiB may hold hundreds of sets of 64 MiB each once expanded. Its
last message's next offset is then where the reader fetches next (the whole reply's end when
it did not stop)."""
_KEY_LENGTH = struct.Struct(">i")

encode_message: Final = _impl.encode_message
"""encode_message(value, key=None, timestamp_ms=None): broker.log.message.encode_message."""
_scan_walk: Final = _impl.scan_walk
_decode_set: Final = _impl.decode_set
_decode_records: Final = _impl.decode_records
_decode_columns: Final[Callable[[list[Piece], int], Columns]] = (
    columns if _impl is message else _impl
).decode_columns
"""The C one, or its Python reference, which broker.log.columns holds."""


def scan(
    buf: Buffer,
    max_message_bytes: int,
    index_interval: int = 0,
    next_mark: int = 0,
    inner: bool = False,
) -> ScanResult:
    """broker.log.message.scan."""
    walked = _scan_walk(buf, max_message_bytes, index_interval, next_mark, inner)
    return message.scan_result(buf, max_message_bytes, walked, inner)


def validate_message_set(
    buf: Buffer, max_message_bytes: int, index_interval: int = 0, next_mark: int = 0
) -> ScanResult:
    """broker.log.message.validate_message_set."""
    return validated(
        buf, max_message_bytes, scan(buf, max_message_bytes, index_interval, next_mark)
    )


def set_timestamp(inner: Buffer) -> int:
    """The timestamp of a compressed set of `inner` (a valid inner set: its messages'
    checksum fields 0), the greatest of its messages' (broker.log.compression.Compressor.wrap)."""
    return _scan_walk(inner, len(inner), 0, 0, True)[3][0]


def check_sets(
    buf: Buffer, result: ScanResult, max_message_bytes: int = MAX_INNER_SET_BYTES
) -> int:
    """How many messages a producer's set `buf` holds, counting the inner messages of each
    compressed set, once each set is checked: it decompresses (compression.inner_set) into
    plain messages that pass every check, each at most `max_message_bytes` (the topic's;
    MessageTooLarge naming it past that). `result` is the set's scan, which passed.
    InvalidMessage at the first compressed set that fails, saying why; MessageTooLarge once
    the inner sets would hold more than compression.MAX_EXPANDED_BYTES together (each set is
    decompressed within what the ones before it left, so no more is ever decompressed)."""
    if result.first_set < 0:
        return result.message_count
    count = result.message_count
    budget = compression.MAX_EXPANDED_BYTES
    left = budget
    pos = result.first_set
    while pos < len(buf):
        following = pos + message_size_at(buf, pos)
        if buf[pos + ATTRIBUTES_AT]:  # the walk took it: a set's codec
            (key_length,) = _KEY_LENGTH.unpack_from(buf, pos + KEY_LENGTH_AT)
            if key_length != -1:  # readers decompress from where a key would be
                raise InvalidMessage(
                    pos,
                    f"compressed set: its wrapper has a key ({key_length} bytes): a compressed "
                    "set's has none",
                )
            bound = min(compression.MAX_INNER_SET_BYTES, left)
            try:
                expanded = inner_set(buf, pos, bound)
            except InnerSetOverBound as over:
                if bound == compression.MAX_INNER_SET_BYTES:
                    raise  # over the format's bound for one set
                raise MessageTooLarge(
                    "the message set, its compressed sets decompressed,",
                    budget - left + over.size,
                    budget,
                ) from None
            left -= len(expanded)
            inner = _inner_scan(expanded, max_message_bytes)
            size = None
            if inner.error is not None:  # a whole message over the limit; past the end: damage
                size = oversized(expanded, inner.valid_bytes, max_message_bytes)
                if size is not None and size > len(expanded) - inner.valid_bytes:
                    size = None
            del expanded  # one inner set held at a time
            if size is not None:
                raise MessageTooLarge(
                    f"message at byte {inner.valid_bytes} of the compressed set at byte {pos}",
                    size,
                    max_message_bytes,
                )
            if inner.message_count > compression.MAX_SET_MESSAGES:
                raise InvalidMessage(
                    pos,
                    f"compressed set: {inner.message_count} messages, over the "
                    f"{compression.MAX_SET_MESSAGES} a set may hold",
                )
            if inner.error is not None:
                raise InvalidMessage(
                    pos,
                    f"compressed set: message at byte {inner.valid_bytes} of the set: "
                    f"{inner.error}",
                )
            count += inner.message_count - 1
        pos = following
    return count


def _inner_scan(inner: Buffer, max_message_bytes: int) -> ScanResult:
    """The scan of a compressed set's inner set, a set inside it reported as its error (at
    that set's position): what PRODUCE checks of it."""
    result = scan(inner, max_message_bytes, inner=True)
    if result.error is None and result.first_set >= 0:
        return result._replace(valid_bytes=result.first_set, error=NESTED_SET)
    return result


def count_sets(buf: Buffer, result: ScanResult) -> int:
    """How many of the messages of `buf` (its scan `result`, which passed) are compressed
    sets, each counted as one message there: read from their headers, nothing decompressed."""
    if result.first_set < 0:
        return 0
    sets = 0
    pos = result.first_set
    while pos < result.valid_bytes:
        sets += buf[pos + ATTRIBUTES_AT] != 0
        pos += message_size_at(buf, pos)
    return sets


def converted(buf: Buffer, result: ScanResult, compressor: Compressor | None) -> bytes | None:
    """A producer's set `buf` (its scan `result`; check_sets passed) as a topic whose
    `compression` is a codec (`compressor`) or none (None) stores it, or None when it already
    is: every message a set of that codec, or no set at all. With a codec, the messages are
    put into as few sets as the bound allows (a plain message over it stays plain); with none,
    each set's messages become plain messages, their checksums computed."""
    if compressor is None and result.first_set < 0:
        return None
    spans = []  # each message: where it starts and ends, its codec (0: plain)
    pos = 0
    while pos < len(buf):
        following = pos + message_size_at(buf, pos)
        spans.append((pos, following, buf[pos + ATTRIBUTES_AT]))
        pos = following
    if compressor is not None and all(codec == compressor.codec for _, _, codec in spans):
        return None
    if compressor is None:
        return b"".join(
            _plain_messages(inner_set(buf, start)) if codec else bytes(buf[start:end])
            for start, end, codec in spans
        )
    units = [
        inner_set(buf, start) if codec else inner_message(bytes(buf[start:end]))
        for start, end, codec in spans
    ]
    counts = [
        scan(unit, MAX_INNER_SET_BYTES, inner=True).message_count if codec else 1
        for unit, (_, _, codec) in zip(units, spans, strict=True)
    ]
    return compressed_sets(compressor, units, counts)[0]


def compressed_sets(
    compressor: Compressor, units: list[bytes], counts: list[int] | None = None
) -> tuple[bytes, list[int], list[int]]:
    """`units` (inner messages or whole inner sets, in order; `counts`: the messages of each,
    default one) as compressed sets of at most MAX_INNER_SET_BYTES and MAX_SET_MESSAGES each;
    a unit over the bytes (one message) as a plain message, its checksum computed. The bytes,
    where each set's units start in the units' bytes joined, and where each set starts in the
    bytes."""
    starts: list[int] = []
    sent_at: list[int] = []
    parts: list[bytes] = []
    sent = position = 0
    for group in _groups(units, counts or [1] * len(units)):
        inner = b"".join(group)
        if len(inner) > MAX_INNER_SET_BYTES:
            part = plain_message(inner)
        else:
            part = compressor.wrap(inner, set_timestamp(inner))
        starts.append(position)
        sent_at.append(sent)
        parts.append(part)
        position += len(inner)
        sent += len(part)
    return b"".join(parts), starts, sent_at


def _groups(units: list[bytes], counts: list[int]) -> Iterator[list[bytes]]:
    """`units` in runs of at most MAX_INNER_SET_BYTES and MAX_SET_MESSAGES (`counts`: each
    unit's messages) each (a longer unit alone)."""
    group: list[bytes] = []
    size = messages = 0
    for unit, count in zip(units, counts, strict=True):
        if group and (
            size + len(unit) > MAX_INNER_SET_BYTES
            or messages + count > compression.MAX_SET_MESSAGES
        ):
            yield group
            group, size, messages = [], 0, 0
        group.append(unit)
        size += len(unit)
        messages += count
    if group:
        yield group


def _plain_messages(inner: bytes) -> bytes:
    """The messages of inner set `inner` as plain messages, their checksums computed."""
    parts = []
    pos = 0
    while pos < len(inner):
        following = pos + message_size_at(inner, pos)
        parts.append(plain_message(inner[pos:following]))
        pos = following
    return b"".join(parts)


def decode(buf: Buffer, base_offset: int) -> tuple[list[Message], InvalidMessage | None]:
    """The messages of a set whose first byte is at `base_offset`, as iter_messages gives
    them, each compressed set's inner messages in its place (with the set's offset, and size
    0 but the last: docs/storage.md), up to the first message or set that fails its checks,
    and what is wrong there (None when all pass): a set that fails gives none of its
    messages. Within the reader's budget (READ_MESSAGES, READ_EXPANDED_BYTES): past it, the
    messages up to a compressed set's start, whole sets only."""
    return _expanded(buf, base_offset, _decode_set)


def decode_records(
    buf: Buffer, base_offset: int, record_type: type[R], topic: str, partition: int
) -> tuple[list[R], InvalidMessage | None]:
    """`decode`'s messages as records of `record_type` (message.decode_records), made from
    the bytes with no Message between: what a consumer hands out, at the cost of decoding."""

    def records(inner: Buffer, base: int, start: int, set_size: int) -> tuple[list[R], int | None]:
        return _decode_records(inner, base, start, set_size, record_type, topic, partition)

    return _expanded(buf, base_offset, records)


def _expanded(
    buf: Buffer,
    base_offset: int,
    decode_set: Callable[[Buffer, int, int, int], tuple[list[T], int | None]],
) -> tuple[list[T], InvalidMessage | None]:
    """What `decode_set` gives of the set, each compressed set expanded in its place, within
    the reader's budget: `decode`."""
    decoded, bad = decode_set(buf, base_offset, 0, -1)
    expanded = 0
    while bad is not None:
        if len(decoded) >= READ_MESSAGES or expanded >= READ_EXPANDED_BYTES:
            return decoded, None  # the rest, from this set on, for the next fetch
        if not is_set(buf, bad):
            return decoded, decode_failure(buf, bad)
        following = bad + message_size_at(buf, bad)
        try:
            inner = inner_set(buf, bad)
        except InvalidMessage as error:
            return decoded, error
        expanded += len(inner)
        messages, inner_bad = decode_set(inner, base_offset + bad, 0, following - bad)
        if inner_bad is not None:
            return decoded, _inner_failure(inner, inner_bad, bad)
        decoded += messages
        more, bad = decode_set(buf, base_offset, following, -1)
        decoded += more
    return decoded, None


def decode_columns(
    buf: Buffer, base_offset: int, end_offset: int
) -> Iterator[tuple[Columns, InvalidMessage | None]]:
    """broker.log.columns.decode_columns of the messages of a set whose first byte is at
    `base_offset` (its compressed sets expanded, as `decode` does), in chunks, each with what
    is wrong at the message or set where it stopped if one failed its checks (the last chunk
    then). A chunk stops expanding at a set's start once it holds READ_MESSAGES rows or has
    expanded READ_EXPANDED_BYTES, and the next goes on from there: a fetch of 1 MiB may hold
    hundreds of sets of 64 MiB each once expanded, and the reader takes one chunk (a record
    batch) before the next is made."""
    start: int | None = 0
    while start is not None:
        columns, failure, start = _columns_from(buf, base_offset, start, end_offset)
        yield columns, failure


def _columns_from(
    buf: Buffer, base_offset: int, start: int, end_offset: int
) -> tuple[Columns, InvalidMessage | None, int | None]:
    """A chunk of decode_columns: the columns from position `start` of `buf` within the
    reader's budget, the failure where they stopped, and where the next chunk starts (None:
    none follows)."""
    view = memoryview(buf)
    columns = _decode_columns([(view[start:], base_offset + start, -1)], end_offset)
    bad = None if columns.bad is None else start + columns.bad
    if bad is None or not is_set(buf, bad):
        return columns, None if bad is None else decode_failure(buf, bad), None
    pieces, failure, following = _pieces(buf, base_offset, start, bad, columns.rows, end_offset)
    columns = _decode_columns(pieces, end_offset)
    if columns.bad is not None:
        bad = start + columns.bad
        if is_set(buf, bad):  # a message of its inner set failed
            inner = inner_set(buf, bad)
            return columns, _inner_failure(inner, _decode_set(inner, 0, 0, 0)[1] or 0, bad), None
        return columns, decode_failure(buf, bad), None
    return columns, failure, following


def _pieces(
    buf: Buffer, base_offset: int, start: int, first_set: int, rows: int, end_offset: int
) -> tuple[list[Piece], InvalidMessage | None, int | None]:
    """The pieces of `buf` for a chunk of decode_columns from `start`, whose first compressed
    set is at `first_set` (`rows` plain messages before it): the runs of plain messages, and
    the inner sets of the compressed sets below `end_offset` expanded, within the reader's
    budget; the failure of a set that does not expand, where they stop; and the position of
    the set where the budget stopped them (None: they reached the end)."""
    view = memoryview(buf)
    pieces: list[Piece] = [(view[start:first_set], base_offset + start, -1)]
    pos = first_set
    run = -1  # where the current run of plain messages started
    end = len(buf)
    expanded = 0
    while pos < end and base_offset + pos < end_offset:
        if len(buf) - pos < HEADER_SIZE or not is_set(buf, pos):
            if run < 0:
                run = pos
            if len(buf) - pos < HEADER_SIZE:
                break
            pos += message_size_at(buf, pos)
            rows += 1
            continue
        if rows >= READ_MESSAGES or expanded >= READ_EXPANDED_BYTES:
            if run >= 0:
                pieces.append((view[run:pos], base_offset + run, -1))
            return pieces, None, pos  # the rest, from this set on, for the next chunk
        if run >= 0:
            pieces.append((view[run:pos], base_offset + run, -1))
            run = -1
        following = pos + message_size_at(buf, pos)
        try:
            inner = inner_set(buf, pos)
        except InvalidMessage as error:
            return pieces, error, None
        pieces.append((inner, base_offset + pos, following - pos))
        expanded += len(inner)
        rows += scan(inner, MAX_INNER_SET_BYTES, inner=True).message_count
        pos = following
    if run >= 0:
        pieces.append((view[run:], base_offset + run, -1))
    return pieces, None, None


def set_messages(wrapper: Message) -> tuple[int, Iterator[Message], InvalidMessage | None]:
    """How many inner messages the compressed set `wrapper` (a Message as decode_message gives
    it, its value the compressed bytes) holds, and those messages as `decode` gives them, made
    one at a time as they are taken (a set may hold millions: 64 MiB of empty messages); or 0,
    none, and what is wrong with it (InvalidMessage at position 0 of the set), its inner set
    checked whole, as PRODUCE checks it, before any is made."""
    try:
        inner = expand(wrapper.attributes & CODEC_MASK, wrapper.value)
    except ValueError as error:
        return 0, iter(()), InvalidMessage(0, f"compressed set: {error}")
    result = _inner_scan(inner, MAX_INNER_SET_BYTES)
    if result.error is not None:
        return 0, iter(()), _inner_failure(inner, result.valid_bytes, 0)
    return result.message_count, _inner_messages(inner, wrapper, result.message_count), None


def _inner_messages(inner: bytes, wrapper: Message, count: int) -> Iterator[Message]:
    """The `count` messages of the inner set `inner` of `wrapper`, each with the set's offset
    and the size 0 but the last, whose size is the set's (decode_set's inner messages)."""
    for number, each in enumerate(message.iter_messages(inner, wrapper.offset, inner=True)):
        yield each._replace(offset=wrapper.offset, size=wrapper.size if number == count - 1 else 0)


def is_set(buf: Buffer, pos: int) -> bool:
    """Whether a compressed set that passes every check of `scan` starts at `pos` of `buf`."""
    return (
        len(buf) - pos >= HEADER_SIZE
        and buf[pos + ATTRIBUTES_AT] in SET_CODECS
        and valid_message_end(buf, pos) is not None
    )


def _inner_failure(inner: bytes, bad: int, pos: int) -> InvalidMessage:
    """The failure of the compressed set at `pos` whose inner set `inner` fails at `bad`."""
    return InvalidMessage(
        pos,
        "compressed set: message at byte "
        f"{bad} of the set: {decode_failure(inner, bad, True).reason}",
    )

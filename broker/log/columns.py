"""A fetched set's messages as the buffers of Arrow columns, for the Spark source's record
batches (pipeline.reader): `decode_columns` is the Python reference of
broker.log._codec.decode_columns (broker.log.codec calls the one in use), `Columns` what both
return.
"""

from __future__ import annotations

from array import array
from typing import NamedTuple

from broker.log.message import Buffer, Message, decode_set


class Columns(NamedTuple):
    """The messages of a fetched set as Arrow buffers (native byte order), for a record batch
    of the Spark source (pipeline.reader): `rows` rows, of which `key_nulls` have no key;
    the keys as a nullable binary array (`key_validity` bitmap, `key_offsets` int32,
    `key_data`), the values as a binary array without nulls, `offsets` and `timestamps_us`
    int64. `bad` is the position (from the first message's offset) of the first message that
    failed its checks, or of the compressed set it is in, or None. The headers as a list of
    (key, value) structs, spark-sql-kafka's `headers` column: null for a row without any
    (`header_validity` bitmap, `header_nulls` of them), `header_offsets` int32 into its
    `header_entries` entries, their keys a string array (`header_key_offsets`,
    `header_key_data`), their values a nullable binary array (`header_value_validity`,
    `header_value_offsets`, `header_value_data`, `header_value_nulls` nulls)."""

    rows: int
    key_nulls: int
    key_validity: bytes
    key_offsets: bytes
    key_data: bytes
    value_offsets: bytes
    value_data: bytes
    offsets: bytes
    timestamps_us: bytes
    bad: int | None
    header_validity: bytes
    header_offsets: bytes
    header_key_offsets: bytes
    header_key_data: bytes
    header_value_validity: bytes
    header_value_offsets: bytes
    header_value_data: bytes
    header_nulls: int
    header_entries: int
    header_value_nulls: int


MAX_COLUMNS_SET = 0x7FFF_FFFF
"""The largest set decode_columns takes: Arrow's binary arrays have int32 offsets."""
_MICROS_RANGE = range(-(1 << 63) // 1000 + 1, ((1 << 63) - 1) // 1000 + 1)
"""Timestamps in ms whose microseconds fit in an int64."""


Piece = tuple[Buffer, int, int]
"""What decode_columns decodes: (buf, base_offset, set_size), a run of messages whose first
byte is at base_offset (set_size -1), or the inner set of a compressed set at base_offset whose
size on disk is set_size (decode_set)."""


def decode_columns(pieces: list[Piece], end_offset: int) -> Columns:
    """The messages of `pieces`, in order, those at offsets below `end_offset` up to the first
    that fails its checks, as the buffers of Arrow columns: the reference of
    broker.log._codec.decode_columns. Each message is checked before its offset is compared
    with `end_offset`, so the first message at or past `end_offset`, where the walk stops, is
    `bad` when it fails them; a compressed set's inner set is taken whole or not at all (its
    offset below `end_offset` or not), and a message in it that fails makes the set `bad`.
    `bad` is a position counted from the first piece's base_offset. OverflowError for an
    offset, or a timestamp in microseconds, that an int64 cannot hold."""
    if sum(len(buf) for buf, _, _ in pieces) > MAX_COLUMNS_SET:
        raise ValueError(
            "decode_columns takes a set of at most 2 GiB - 1 bytes (Arrow's binary offsets are "
            "32-bit)"
        )
    taken: list[Message] = []
    bad = None
    for buf, base_offset, set_size in pieces:
        if set_size >= 0 and base_offset >= end_offset:
            break
        messages, failed = decode_set(buf, base_offset, 0, set_size)
        if set_size >= 0:
            _check_int64(messages)
            if failed is not None:
                bad = base_offset - pieces[0][1]
                break
            taken += messages
            continue
        for message in messages:
            if message.offset >= end_offset:
                return _columns(taken, None)
            _check_int64([message])
            taken.append(message)
        if failed is not None:
            bad = base_offset + failed - pieces[0][1]
            break
    return _columns(taken, bad)


def _check_int64(messages: list[Message]) -> None:
    """OverflowError for a message whose offset, or timestamp in microseconds, an Arrow int64
    cannot hold."""
    for message in messages:
        if not -(1 << 63) <= message.offset < 1 << 63:
            raise OverflowError(f"the offset {message.offset} is out of the range of Arrow's int64")
        if message.timestamp_ms not in _MICROS_RANGE:
            raise OverflowError(
                f"the timestamp of the message at offset {message.offset}, "
                f"{message.timestamp_ms} ms, is out of the range of Arrow's timestamps in "
                "microseconds"
            )


def _columns(messages: list[Message], bad: int | None) -> Columns:
    """The Arrow buffers of `messages`, and `bad`."""
    keys = _BinaryArray()
    values = _BinaryArray()
    headed = _BinaryArray()  # only its validity: which rows have headers
    header_keys = _BinaryArray()
    header_values = _BinaryArray()
    header_offsets = array("i", [0])
    for message in messages:
        keys.add(message.key)
        values.add(message.value)
        headed.add(b"" if message.headers else None)
        for key, value in message.headers:
            header_keys.add(key.encode())
            header_values.add(value)
        header_offsets.append(len(header_keys.offsets) - 1)
    return Columns(
        len(messages),
        keys.nulls,
        bytes(keys.validity),
        keys.offsets.tobytes(),
        bytes(keys.data),
        values.offsets.tobytes(),
        bytes(values.data),
        array("q", [m.offset for m in messages]).tobytes(),
        array("q", [m.timestamp_ms * 1000 for m in messages]).tobytes(),
        bad,
        bytes(headed.validity),
        header_offsets.tobytes(),
        header_keys.offsets.tobytes(),
        bytes(header_keys.data),
        bytes(header_values.validity),
        header_values.offsets.tobytes(),
        bytes(header_values.data),
        headed.nulls,
        len(header_keys.offsets) - 1,
        header_values.nulls,
    )


class _BinaryArray:
    """The buffers of an Arrow binary array being built: validity bitmap, int32 offsets, data."""

    def __init__(self) -> None:
        self.validity = bytearray()
        self.offsets = array("i", [0])
        self.data = bytearray()
        self.nulls = 0

    def add(self, item: bytes | None) -> None:
        count = len(self.offsets) - 1
        if count % 8 == 0:
            self.validity.append(0)
        if item is None:
            self.nulls += 1
        else:
            self.validity[count // 8] |= 1 << count % 8
            self.data += item
        self.offsets.append(len(self.data))

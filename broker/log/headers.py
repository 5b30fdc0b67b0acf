"""A format 2 message's header block (docs/storage.md): `header_block` reads one,
`header_block_bytes` writes one; the Python references of what broker.log._codec does in C,
for broker.log.message's decoders and encode_message.

Layout, between a format 2 message's key and its value (all integers big-endian):

    size  field
    4     headers_length  u32, the bytes that follow in the block
    2     count           u16, the headers
    then `count` times:
    2     key_length      u16
    k     key             UTF-8
    4     value_length    i32, -1 for a header without a value
    v     value
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")

Headers = tuple[tuple[str, bytes | None], ...]
"""A message's headers: (key, value or None) pairs, in order; () for format 1."""


def header_block(buf: bytes | bytearray | memoryview, at: int, end: int) -> tuple[int, Headers]:
    """The header block of a format 2 message at `at` (its headers_length field), which must
    end by `end`: where the value starts, and the headers. ValueError saying what is wrong."""
    if end - at < 4:
        raise ValueError("cut short: no room for headers_length")
    block = int.from_bytes(buf[at : at + 4], "big")
    at += 4
    if block < 2 or block > end - at:
        raise ValueError(f"headers_length {block} does not fit in the message")
    stop = at + block
    (count,) = _U16.unpack_from(buf, at)
    at += 2
    headers = []
    for number in range(count):
        if stop - at < 2:
            raise ValueError(f"header {number} is cut short")
        (key_length,) = _U16.unpack_from(buf, at)
        at += 2
        if stop - at < key_length:
            raise ValueError(f"header {number}: its key is cut short")
        try:
            key = bytes(buf[at : at + key_length]).decode()
        except UnicodeDecodeError:
            raise ValueError(f"header {number}: its key is not UTF-8") from None
        at += key_length
        if stop - at < 4:
            raise ValueError(f"header {number} is cut short")
        (value_length,) = _I32.unpack_from(buf, at)
        at += 4
        if value_length < -1 or stop - at < value_length:
            raise ValueError(f"header {number}: value length {value_length} does not fit")
        value = None if value_length < 0 else bytes(buf[at : at + value_length])
        at += max(value_length, 0)
        headers.append((key, value))
    if at != stop:
        raise ValueError(f"{stop - at} bytes follow the headers in their block")
    return stop, tuple(headers)


def headers_fit(buf: bytes | bytearray | memoryview, at: int, end: int) -> bool:
    """Whether a whole header block lies at `at` of a format 2 message ending at `end`."""
    try:
        header_block(buf, at, end)
    except ValueError:
        return False
    return True


HeaderItems = Iterable[tuple[str, bytes | bytearray | memoryview | None]]
"""Headers as a producer gives them: (key, value or None) pairs (or a mapping's items)."""


def header_block_bytes(headers: HeaderItems) -> bytes:
    """The header block of format 2 (headers_length included) for `headers`: keys str, at most
    65535 bytes of UTF-8 each; values bytes, bytearray, memoryview or None, at most 2 GiB - 1;
    at most 65535 of them. TypeError or ValueError naming what is wrong."""
    block = bytearray(2)
    count = 0
    for item in headers:
        try:
            name, data = item
        except (TypeError, ValueError):
            raise TypeError(f"a header is a (key, value) pair, not {item!r}") from None
        if not isinstance(name, str):
            raise TypeError(f"a header's key is a str, not {type(name).__name__}")
        encoded = name.encode()
        if len(encoded) > 0xFFFF:
            raise ValueError(f"header key {name[:40]!r}... is over 65535 bytes of UTF-8")
        block += _U16.pack(len(encoded)) + encoded
        if data is None:
            block += _I32.pack(-1)
        elif isinstance(data, bytes | bytearray | memoryview):
            raw = bytes(data)
            if len(raw) > 0x7FFF_FFFF:
                raise ValueError(f"the value of header {name!r} is over 2 GiB")
            block += _I32.pack(len(raw)) + raw
        else:
            raise TypeError(
                f"the value of header {name!r} is bytes or None, not {type(data).__name__}"
            )
        count += 1
        if count > 0xFFFF:
            raise ValueError("a message holds at most 65535 headers")
    block[0:2] = _U16.pack(count)
    return _U32.pack(len(block)) + bytes(block)

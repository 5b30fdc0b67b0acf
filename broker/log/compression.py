"""Compressed sets (docs/storage.md, "Compressed sets"): one message, the wrapper, whose codec
(attributes bits 0-2) is gzip (1), lz4 (3) or zstd (4) and whose value is the compressed bytes
of an inner set of plain messages. The wrapper has no key; its timestamp is the greatest of
the inner messages'. An inner set is at most MAX_INNER_SET_BYTES once decompressed, not empty,
and holds plain messages only (no set inside a set).

The broker stores a producer's wrapper as it came; it checks each inner set on PRODUCE
(broker.log.codec.check_sets), never on recovery (the wrapper's checksum covers the
compressed bytes). Readers expand each set (`inner_set`) with the same bound, so that a
hostile set cannot make either allocate more.

Why these libraries (docs/design/compression-and-headers.md): zlib is the standard library's;
python-zstandard and python-lz4 keep a context a producer, where cramjam makes one a call and
was 5-15 times slower on sets of fifty log lines.
"""

from __future__ import annotations

import struct
import threading
import zlib
from enum import IntEnum
from typing import Final

import lz4.frame
import zstandard
from xxhash import xxh3_64_intdigest

from broker.errors import InvalidMessage
from broker.log.message import (
    ATTRIBUTES_AT,
    CHECKSUM_START,
    CODEC_MASK,
    HEADER_SIZE,
    LENGTH_SIZE,
    MAGIC,
    MAX_FORMAT_MESSAGE_BYTES,
    Buffer,
    message_size_at,
)

MAX_INNER_SET_BYTES: Final = 64 << 20
"""The most bytes an inner set holds once decompressed: a rule of the format, so that the
broker that checks a set and every reader that expands it agree on it."""
MAX_SET_MESSAGES: Final = 100_000
"""The most messages a producer's compressed set holds: the broker refuses more (its readers
make an object a message; 64 MiB of empty messages would be 2.5 million), and pylog's
producers and the broker's conversion to the topic's codec make no set of more."""
MAX_EXPANDED_BYTES: Final = 64 << 20
"""The most bytes the inner sets of one producer's message set (a PRODUCE's, or a part's of a
MULTI_PRODUCE) hold together once decompressed: what the broker decompresses, and converts to
the topic's compression, for one, each set within what the ones before it left
(broker.log.codec.check_sets)."""


class OverBound(ValueError):
    """An inner set larger than the bound it is decompressed within: `size` is what its frame
    says (lz4, zstd), or the bound + 1 (gzip, stopped there)."""

    def __init__(self, message: str, size: int) -> None:
        super().__init__(message)
        self.size = size


class InnerSetOverBound(InvalidMessage):
    """inner_set's InvalidMessage for an OverBound: `size` as its."""

    def __init__(self, position: int, reason: str, size: int) -> None:
        super().__init__(position, reason)
        self.size = size


class Codec(IntEnum):
    """A compressed set's codec, its attributes bits 0-2 (Kafka's numbers)."""

    NONE = 0
    GZIP = 1
    LZ4 = 3
    ZSTD = 4


CODECS: Final = {codec.name.lower(): codec for codec in Codec}
"""The codecs by the names settings and options use: none, gzip, lz4, zstd."""

LEVELS: Final = {Codec.GZIP: range(0, 10), Codec.LZ4: range(0, 17), Codec.ZSTD: range(-7, 23)}
"""The levels each codec takes (lz4's are its frame format's: 0-2 fast, 3-16 high
compression; zstd's negative ones are its fast levels)."""

_WRAPPER_HEAD = struct.Struct(">IQBBqi")


def codec_named(name: str) -> Codec:
    """The codec called `name` (none, gzip, lz4, zstd); ValueError naming the choices."""
    codec = CODECS.get(name.lower())
    if codec is None:
        raise ValueError(f"unknown compression {name!r}: choose one of {', '.join(CODECS)}")
    return codec


def compressor_for(name: str, level: int | None = None) -> Compressor | None:
    """The Compressor of the codec called `name` at `level` (None: the codec's default), None
    for "none"; ValueError naming the choices, or the levels the codec takes."""
    codec = codec_named(name)
    if codec is Codec.NONE:
        if level is not None:
            raise ValueError("a compression level is for a compression other than none")
        return None
    return Compressor(codec, level)


class Compressor:
    """Compresses a producer's sets with one codec at one level (None: the codec's default),
    keeping the codec's context from one set to the next."""

    def __init__(self, codec: Codec, level: int | None = None) -> None:
        if codec is Codec.NONE:
            raise ValueError("Compressor needs a codec other than none")
        if level is not None and level not in LEVELS[codec]:
            levels = LEVELS[codec]
            raise ValueError(
                f"{codec.name.lower()} takes levels {levels.start} to {levels.stop - 1}, "
                f"not {level}"
            )
        self.codec = codec
        self.level = level
        self._zstd = zstandard.ZstdCompressor(
            level=3 if level is None else level, write_checksum=True
        )

    def compress(self, data: bytes) -> bytes:
        """`data` compressed into one gzip member, LZ4 frame or zstd frame."""
        if self.codec is Codec.ZSTD:
            return self._zstd.compress(data)  # with the content size in its header
        if self.codec is Codec.LZ4:
            return bytes(
                lz4.frame.compress(
                    data,
                    compression_level=0 if self.level is None else self.level,
                    content_checksum=True,
                    store_size=True,
                )
            )
        return zlib.compress(data, 6 if self.level is None else self.level, wbits=31)

    def wrap(self, message_set: Buffer, timestamp_ms: int) -> bytes:
        """The compressed set of plain messages `message_set`, whose greatest timestamp is
        `timestamp_ms` (broker.log.codec.set_timestamp): one wrapper message."""
        return encode_wrapper(self.codec, self.compress(bytes(message_set)), timestamp_ms)


def encode_wrapper(codec: Codec, compressed: bytes, timestamp_ms: int) -> bytes:
    """The wrapper message of `compressed`, an inner set compressed with `codec`."""
    length = HEADER_SIZE - LENGTH_SIZE + len(compressed)
    if LENGTH_SIZE + length > MAX_FORMAT_MESSAGE_BYTES:
        raise ValueError(f"a compressed set of {len(compressed)} bytes does not fit in a message")
    head = bytearray(_WRAPPER_HEAD.pack(length, 0, MAGIC, codec, timestamp_ms, -1))
    body = bytes(head[CHECKSUM_START:]) + compressed
    struct.pack_into(">Q", head, 4, xxh3_64_intdigest(body))
    return bytes(head[:CHECKSUM_START]) + body


def plain_message(inner: bytes) -> bytes:
    """The message `inner` (one encoded for an inner set: checksum field 0) as a plain one,
    its checksum computed."""
    return (
        struct.pack(
            ">IQ",
            message_size_at(inner, 0) - LENGTH_SIZE,
            xxh3_64_intdigest(inner[CHECKSUM_START:]),
        )
        + inner[CHECKSUM_START:]
    )


def inner_message(plain: bytes) -> bytes:
    """The plain message `plain` as a message of an inner set: its checksum field 0."""
    return plain[:4] + bytes(8) + plain[CHECKSUM_START:]


def inner_set(buf: Buffer, pos: int, bound: int | None = None) -> bytes:
    """The decompressed inner set of the compressed set at `pos` of `buf`, whose framing and
    checksum passed; InvalidMessage at `pos` when it does not decompress whole, within `bound`
    (default MAX_INNER_SET_BYTES; InnerSetOverBound past it), into exactly one frame."""
    codec = buf[pos + ATTRIBUTES_AT] & CODEC_MASK
    end = pos + message_size_at(buf, pos)
    try:
        return expand(codec, bytes(buf[pos + HEADER_SIZE : end]), bound)  # a wrapper has no key
    except OverBound as over:
        raise InnerSetOverBound(pos, f"compressed set: {over}", over.size) from None
    except ValueError as error:
        raise InvalidMessage(pos, f"compressed set: {error}") from None


def expand(codec: int, compressed: bytes, bound: int | None = None) -> bytes:
    """The inner set of a compressed set of `codec` whose value is `compressed`; ValueError
    saying why when it does not decompress whole, within `bound` (default
    MAX_INNER_SET_BYTES; OverBound past it, a frame that says its size not decompressed at
    all), into exactly one frame, or is empty."""
    try:
        data = _decompress(codec, compressed, MAX_INNER_SET_BYTES if bound is None else bound)
    except (RuntimeError, zlib.error, zstandard.ZstdError) as error:
        raise ValueError(str(error)) from None
    if not data:
        raise ValueError("the inner set is empty")
    return data


_contexts = threading.local()
"""A zstd decompression context for each thread (one costs ~15 µs to make, a set of fifty
log lines ~5 µs to decompress; a context is not to be shared by threads)."""


def _decompress(codec: int, compressed: bytes, bound: int) -> bytes:
    if codec == Codec.ZSTD:
        frame = zstandard.get_frame_parameters(compressed)
        size = frame.content_size
        if size == zstandard.CONTENTSIZE_UNKNOWN:
            raise ValueError("the zstd frame does not give its content size in its header")
        if not frame.has_checksum:
            raise ValueError("the zstd frame has no content checksum")
        _check_size("zstd", size, bound)
        decompressor = getattr(_contexts, "zstd", None)
        if decompressor is None:
            decompressor = _contexts.zstd = zstandard.ZstdDecompressor()
        data: bytes = decompressor.decompress(
            compressed, max_output_size=bound, allow_extra_data=False
        )
        return data
    if codec == Codec.LZ4:
        # The size first: python-lz4 allocates what the frame's header says (and its
        # streaming decompressor, which takes a bound, costs three times as much a set).
        info = lz4.frame.get_frame_info(compressed)
        size = info["content_size"]
        if size == 0:
            raise ValueError("the lz4 frame does not give its content size in its header")
        if not info["content_checksum"]:
            raise ValueError("the lz4 frame has no content checksum")
        _check_size("lz4", size, bound)
        data, read = lz4.frame.decompress(compressed, return_bytes_read=True)
        if len(data) != size:
            raise ValueError(f"the lz4 frame holds {len(data)} bytes, its header says {size}")
        if read != len(compressed):
            raise ValueError(f"{len(compressed) - read} bytes follow the lz4 data")
        return bytes(data)
    gzip = zlib.decompressobj(wbits=31)
    data = gzip.decompress(compressed, bound + 1)
    if len(data) > bound:
        raise OverBound(f"the gzip data holds more than the bound {bound} bytes", bound + 1)
    if not gzip.eof:
        raise ValueError("the gzip data is cut short or damaged")
    unused = gzip.unused_data or gzip.unconsumed_tail
    if unused:
        raise ValueError(f"{len(unused)} bytes follow the gzip data")
    return data


def _check_size(name: str, size: int, bound: int) -> None:
    if size > bound:
        raise OverBound(f"the {name} frame holds {size} bytes, over the bound {bound}", size)

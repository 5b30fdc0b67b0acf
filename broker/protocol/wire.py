"""Reading and writing a frame's fields: fixed-size runs packed with one struct (Fields), a
frame read field by field with errors that name the field and its byte (Reader), strings."""

from __future__ import annotations

import struct
from typing import Final

from broker.errors import (
    PylogError,
)
from broker.log.message import Buffer
from broker.protocol.apis import MAX_STRING_BYTES

# -- fixed-size field runs, and reading a frame field by field ---------------------------------

INT_CODES: Final = {
    "u8": "B",
    "u16": "H",
    "u32": "I",
    "u64": "Q",
    "i16": "h",
    "i32": "i",
    "i64": "q",
}
"""The fixed-size types, by their names in docs/protocol.md, and their struct codes."""
_TYPE_NAMES: Final = {code: name for name, code in INT_CODES.items()}


class Fields:
    """A run of fixed-size fields packed and unpacked with one struct."""

    __slots__ = ("codes", "names", "offsets", "size", "struct")

    def __init__(self, *fields: tuple[str, str]) -> None:
        self.names = tuple(name for name, _ in fields)
        self.codes = tuple(code for _, code in fields)
        self.struct = struct.Struct(">" + "".join(self.codes))
        self.size = self.struct.size
        self.offsets = tuple(
            struct.calcsize(">" + "".join(self.codes[:i])) for i in range(len(self.codes) + 1)
        )

    def pack(self, *values: int) -> bytes:
        try:
            return self.struct.pack(*values)
        except struct.error:
            for name, code, value in zip(self.names, self.codes, values, strict=True):
                try:
                    struct.pack(">" + code, value)
                except struct.error:
                    raise ValueError(
                        f"field {name} is {value!r}: not a {_TYPE_NAMES[code]}"
                    ) from None
            raise


U16: Final = struct.Struct(">H")
U32: Final = struct.Struct(">I")
API_AND_VERSION: Final = struct.Struct(">HH")
_STRING_LENGTH: Final = 2

REQUEST_HEADER: Final = Fields(("api_key", "H"), ("api_version", "H"), ("correlation_id", "I"))
REPLY_HEADER: Final = Fields(("correlation_id", "I"), ("error_code", "h"))


class Reader:
    """Reads one frame's fields in order. Anything cut short, not UTF-8 or left over raises
    `error` with a message naming the part of the frame (header or body), the field and the
    byte position from the start of the frame."""

    __slots__ = ("_buf", "_end", "_error", "_last", "_pos", "_where")

    def __init__(self, buf: Buffer, where: str, error: type[PylogError]) -> None:
        self._buf = memoryview(buf)  # any buffer (a zmq.Frame too) slices without copying
        self._end = len(self._buf)
        self._pos = 0
        self._where = where
        self._error = error
        self._last = ""

    def fail(self, problem: str) -> PylogError:
        return self._error(f"{self._where}: {problem}")

    def enter(self, where: str) -> None:
        """The fields from here on belong to `where` (the header ends, the body begins)."""
        self._where = where
        self._last = ""  # so that bytes in a body of no fields are not blamed on the header

    def rest(self) -> memoryview:
        """The bytes from here to the end of the frame, uncopied (a PRODUCE message set)."""
        return self._buf[self._pos :]

    def skip_string(self) -> None:
        """Step over a string without decoding it (bounds checked)."""
        pos = self._pos
        if pos + _STRING_LENGTH > self._end:
            raise self._cut_short("string length", pos, _STRING_LENGTH)
        end = pos + _STRING_LENGTH + U16.unpack_from(self._buf, pos)[0]
        if end > self._end:
            raise self.fail(
                f"cut short: a string runs to byte {end}, the frame ends at {self._end}"
            )
        self._pos = end

    def fixed(self, fields: Fields) -> tuple[int, ...]:
        pos = self._pos
        if pos + fields.size > self._end:
            for i, name in enumerate(fields.names):
                start, end = pos + fields.offsets[i], pos + fields.offsets[i + 1]
                if end > self._end:
                    raise self._cut_short(name, start, end - start)
        values: tuple[int, ...] = fields.struct.unpack_from(self._buf, pos)
        self._pos = pos + fields.size
        self._last = fields.names[-1]
        return values

    def string(self, name: str) -> str:
        pos = self._pos
        if pos + _STRING_LENGTH > self._end:
            raise self._cut_short(f"{name} (its length)", pos, _STRING_LENGTH)
        (size,) = U16.unpack_from(self._buf, pos)
        start = pos + _STRING_LENGTH
        end = start + size
        if end > self._end:
            raise self.fail(
                f"cut short in field {name}: its length says {plural(size, 'byte')} from byte "
                f"{start}, the frame has {plural(self._end, 'byte')}"
            )
        try:
            text = str(self._buf[start:end], "utf-8")
        except UnicodeDecodeError as error:
            raise self.fail(
                f"field {name} is not valid UTF-8: {error.reason} at byte {start + error.start}"
            ) from None
        self._pos = end
        self._last = name
        return text

    def bytes(self, name: str) -> memoryview:
        """A `bytes` field: its u32 length, then that many bytes, returned uncopied."""
        pos = self._pos
        if pos + U32.size > self._end:
            raise self._cut_short(f"{name} (its length)", pos, U32.size)
        (size,) = U32.unpack_from(self._buf, pos)
        start = pos + U32.size
        end = start + size
        if end > self._end:
            raise self.fail(
                f"cut short in field {name}: its length says {plural(size, 'byte')} from byte "
                f"{start}, the frame has {plural(self._end, 'byte')}"
            )
        self._pos = end
        self._last = name
        return self._buf[start:end]

    def finish(self) -> None:
        left = self._end - self._pos
        if left == 0:
            return
        if not self._last:
            raise self.fail(f"must be empty, it has {plural(left, 'byte')} from byte {self._pos}")
        raise self.fail(
            f"{plural(left, 'trailing byte')} after the last field, {self._last}, which ends "
            f"at byte {self._pos}"
        )

    def _cut_short(self, name: str, start: int, size: int) -> PylogError:
        return self.fail(
            f"cut short in field {name}: it needs {plural(size, 'byte')} from byte {start}, the "
            f"frame has {plural(self._end, 'byte')}"
        )


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def encode_string(name: str, text: str, truncate: bool = False) -> bytes:
    data = text.encode()
    if len(data) > MAX_STRING_BYTES:
        if not truncate:
            raise ValueError(
                f"field {name} is {len(data)} bytes of UTF-8, over the {MAX_STRING_BYTES} a "
                "string holds"
            )
        data = data[:MAX_STRING_BYTES].decode(errors="ignore").encode()
    return U16.pack(len(data)) + data


def encode_bytes_length(name: str, data: Buffer) -> bytes:
    """The u32 length that starts a `bytes` field holding `data` (ValueError past 2^32 - 1)."""
    size = memoryview(data).nbytes
    if size > 0xFFFFFFFF:
        raise ValueError(f"field {name} is {size} bytes, over the 4 GiB a bytes field holds")
    return U32.pack(size)

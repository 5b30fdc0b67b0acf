"""What a segment's two index files (`.index`, broker.log.index; `.timeindex`,
broker.log.timeindex) share: their header, their checksum and how they are written.

Both files are, big-endian:

    0   8   segment_size   u64, the size of the .log file the index describes
    8   8   checksum       u64, xxh3_64 of segment_size and the body (bytes 0-7, then 16-)
    16  ..  body           entries, a whole number of entries of the index's kind

A file is written to `<name>.tmp`, fsynced, renamed over `<name>`, and the folder fsynced, so
that after a crash either the old file or the whole new one is there. Reading tells a file that
belongs to a segment that was not closed cleanly (missing, or written for another size) from a
damaged one (the right size, but its length or checksum is wrong).
"""

from __future__ import annotations

import os
import struct
import sys
from array import array
from pathlib import Path

from xxhash import xxh3_64_intdigest

from broker.log.fsdir import fsync_directory

_SIZE = struct.Struct(">Q")
HEAD = struct.Struct(">QQ")
"""segment_size, checksum."""


def big_endian(entries: array[int]) -> bytes:
    """The bytes of `entries`, each big-endian."""
    if sys.byteorder == "big":
        return entries.tobytes()
    swapped = array(entries.typecode, entries)
    swapped.byteswap()
    return swapped.tobytes()


def from_big_endian(typecode: str, data: bytes) -> array[int]:
    """The array of `typecode` items stored big-endian in `data`."""
    entries = array(typecode)
    entries.frombytes(data)
    if sys.byteorder == "little":
        entries.byteswap()
    return entries


def write_index_file(path: Path, segment_size: int, body: bytes) -> None:
    """Store `body` for a segment of `segment_size` bytes: tmp file, fsync, rename, fsync of
    the folder. OSError as the file system gives it; the old file is then left as it was."""
    size = _SIZE.pack(segment_size)
    checksum = xxh3_64_intdigest(size + body)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, HEAD.pack(segment_size, checksum) + body)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_directory(path.parent)


def read_index_file(
    path: Path, segment_size: int, entry_bytes: int
) -> tuple[bytes | None, str | None]:
    """The body stored at `path` for a segment of `segment_size` bytes, or None and why not:
    no reason when the file is missing or describes another size (the segment was not closed
    cleanly), a reason when it describes this size but its length is not a whole number of
    `entry_bytes` entries or it fails its checksum."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None, None
    if len(data) < _SIZE.size or _SIZE.unpack_from(data)[0] != segment_size:
        return None, None
    if len(data) < HEAD.size or (len(data) - HEAD.size) % entry_bytes:
        return None, f"its length {len(data)} does not fit its layout"
    _, checksum = HEAD.unpack_from(data)
    if xxh3_64_intdigest(data[: _SIZE.size] + data[HEAD.size :]) != checksum:
        return None, "it fails its checksum"
    return data[HEAD.size :], None

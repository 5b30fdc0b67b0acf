"""What a segment's two index files (`.index`, broker.log.index; `.timeindex`,
broker.log.timeindex) share: their header, their checksum and how they are written.

Both files are, big-endian:

    0   8   segment_size   u64, the size of the .log file the index describes
    8   8   checksum       u64, xxh3_64 of segment_size and the body (bytes 0-7, then 16-)
    16  ..  body           entries, a whole number of entries of the index's kind

Both bodies end with a positions column: n u32 segment-relative message starts, strictly
increasing, the first 0 (the whole body of an offset index; the P column of a time index).

A file is written to `<name>.tmp`, fsynced, renamed over `<name>`, and the folder fsynced, so
that after a crash either the old file or the whole new one is there. Reading tells a file that
belongs to a segment that was not closed cleanly (missing, or written for another size) from a
damaged one (the right size, but its length, its checksum or its positions are wrong).

A closed segment's index is not read into memory (`IndexFile`): opening a log reads the head of
each file and its length (`read_index_head`), which tells an unclean close; the file is mapped,
and its checksum and positions checked, when a read or a lookup first uses it (IndexDamaged
when that fails: it is then rebuilt from its log, broker.log.partition). So opening costs what
the segment count needs, whatever the segments hold, and the entries stay in the page cache
rather than in the process. A mapping holds a descriptor (CPython's mmap keeps a duplicate) and
is registered in OPEN_FILES (broker.log.files), which releases the least recently used; the
next use maps the file again, and checks it again only when it is another file than the one
checked (its device, inode, size or modification time changed).
"""

from __future__ import annotations

import mmap
import os
import struct
import sys
from array import array
from pathlib import Path

from xxhash import xxh3_64, xxh3_64_intdigest

from broker.errors import StorageIOError
from broker.log.files import OPEN_FILES
from broker.log.fsdir import fsync_directory

_SIZE = struct.Struct(">Q")
HEAD = struct.Struct(">QQ")
"""segment_size, checksum."""
U32 = struct.Struct(">I")


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


def write_index_file(path: Path, segment_size: int, body: bytes) -> os.stat_result:
    """Store `body` for a segment of `segment_size` bytes: tmp file, fsync, rename, fsync of
    the folder; returns the file's status as written (`IndexFile` trusts a file that still has
    it). A file that holds exactly these bytes already is left as it is, and its status
    returned: the close of a partition that took no message since it was opened writes
    nothing (a file so found was stored the same way, fsynced before its rename; a crash
    between its rename and the folder's fsync, then a power loss, can at worst leave the old
    file or none, which open rebuilds from the log). OSError as the file system gives it; the
    old file is then left as it was."""
    size = _SIZE.pack(segment_size)
    data = HEAD.pack(segment_size, xxh3_64_intdigest(size + body)) + body
    stored = _stored(path, data)
    if stored is not None:
        return stored
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
        written = os.fstat(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_directory(path.parent)
    return written


def _stored(path: Path, data: bytes) -> os.stat_result | None:
    """The status of the file at `path` if it holds exactly `data`, else None."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        status = os.fstat(fd)
        if status.st_size != len(data) or os.pread(fd, len(data), 0) != data:
            return None
        return status
    finally:
        os.close(fd)


def _head_fault(head: bytes, length: int, segment_size: int, entry_bytes: int) -> str | None:
    """Why a file of `length` bytes starting with `head` (its first 8 bytes or more) is not a
    whole index of a segment of `segment_size` bytes: "" when it describes another size, a
    reason when its length does not fit its layout; None when its head and length fit."""
    if len(head) < _SIZE.size or _SIZE.unpack_from(head)[0] != segment_size:
        return ""
    if length < HEAD.size or (length - HEAD.size) % entry_bytes:
        return f"its length {length} does not fit its layout"
    return None


def _fault(data: bytes | mmap.mmap, segment_size: int, entry_bytes: int) -> str | None:
    """`_head_fault` of a whole file, `data`, and then why its body is damaged: its checksum
    fails, or its positions column does not start at 0 or runs past the segment."""
    length = len(data)
    fault = _head_fault(bytes(data[: _SIZE.size]), length, segment_size, entry_bytes)
    if fault is not None:
        return fault
    hasher = xxh3_64()
    with memoryview(data) as view:
        hasher.update(view[: _SIZE.size])
        hasher.update(view[HEAD.size :])
    if hasher.intdigest() != HEAD.unpack_from(data)[1]:
        return "it fails its checksum"
    # the checksum vouches for the order this process wrote them in; this costs nothing and
    # catches an index written for other bytes
    n = (length - HEAD.size) // entry_bytes
    if (segment_size > 0 and not n) or (
        n
        and (
            U32.unpack_from(data, length - 4 * n)[0] != 0
            or U32.unpack_from(data, length - 4)[0] >= max(segment_size, 1)
        )
    ):
        return "its entries do not start at 0 within the segment"
    return None


def read_index_file(
    path: Path, segment_size: int, entry_bytes: int
) -> tuple[bytes | None, str | None]:
    """The body stored at `path` for a segment of `segment_size` bytes, read whole and checked
    (`pylogctl log verify`), or None and why not: no reason when the file is missing or
    describes another size (the segment was not closed cleanly), a reason when it describes
    this size but is damaged (its length does not fit `entry_bytes` entries, its checksum
    fails, or its positions are wrong)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None, None
    fault = _fault(data, segment_size, entry_bytes)
    if fault is not None:
        return None, fault or None
    return data[HEAD.size :], None


def read_index_head(path: Path, segment_size: int, entry_bytes: int) -> tuple[bool, str | None]:
    """Whether the file at `path` may be the index of a segment of `segment_size` bytes, from
    its first 8 bytes and its length alone (its checksum is checked on first use, `IndexFile`):
    False and no reason when it is missing or describes another size (the segment was not
    closed cleanly), False and a reason when its length does not fit `entry_bytes` entries."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False, None
    try:
        fault = _head_fault(
            os.pread(fd, _SIZE.size, 0), os.fstat(fd).st_size, segment_size, entry_bytes
        )
    finally:
        os.close(fd)
    return fault is None, fault or None


class IndexDamaged(Exception):
    """A closed segment's stored index failed its check when it was first used (or was gone):
    it must not be trusted, and is rebuilt from its log (broker.log.partition)."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path.name} is damaged: {reason}")
        self.path = path
        self.reason = reason


def _identity(status: os.stat_result) -> tuple[int, int, int, int]:
    return status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns


class IndexFile:
    """A closed segment's index file, mapped read-only while it is used (see the module's
    docstring). `checked`: the status of a file known good (this process wrote it)."""

    def __init__(
        self,
        path: Path,
        segment_size: int,
        entry_bytes: int,
        checked: os.stat_result | None = None,
    ) -> None:
        self.path = path
        self._segment_size = segment_size
        self._entry_bytes = entry_bytes
        self._checked = None if checked is None else _identity(checked)
        self._map: mmap.mmap | None = None

    def mapping(self) -> mmap.mmap:
        """The whole file (head included), mapped again if it was released, and checked if it
        is not the file last checked. IndexDamaged when it fails a check or is gone;
        StorageIOError when it cannot be mapped (EMFILE...)."""
        m = self._map
        if m is None:
            m = self._map = self._mapped()
        OPEN_FILES.used(self, self.close)
        return m

    def _mapped(self) -> mmap.mmap:
        try:
            with open(self.path, "rb") as f:
                status = os.fstat(f.fileno())
                length = status.st_size
                if length < HEAD.size:
                    raise IndexDamaged(self.path, f"its length {length} does not fit its layout")
                m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except FileNotFoundError:
            raise IndexDamaged(self.path, "it is gone") from None
        except OSError as error:
            raise StorageIOError(f"mapping {self.path}: {error}") from error
        if _identity(status) != self._checked:
            fault = _fault(m, self._segment_size, self._entry_bytes)
            if fault is not None:
                m.close()
                raise IndexDamaged(self.path, fault or "it describes another segment size now")
            self._checked = _identity(status)
        return m

    def close(self) -> None:
        """Unmap the file (OPEN_FILES calls this; the next use maps it again)."""
        OPEN_FILES.closed(self)
        m, self._map = self._map, None
        if m is not None:
            m.close()  # no view of it outlives a lookup

"""The replicated high watermark of one partition folder, kept across restarts (Kafka's
replication-offset-checkpoint; docs/storage.md, "The high-watermark checkpoint";
docs/replication.md, "Fencing").

File `high-watermark-checkpoint` in the partition folder, 24 bytes, big-endian:

    offset  size  field
    0       4     magic  b"PLHW"
    4       4     format version  1
    8       8     high watermark (unsigned)
    16      8     XXH3-64 of bytes 0-15

The leader of a replicated partition writes it each time its high watermark moves, before it
reports the new value to anyone (a consumer's FETCH or OFFSETS, an ack=all); a follower writes
the high watermark its leader last sent. It is written in place with one pwrite and not
fsynced: a crash of the process keeps it (the page cache holds it), so a leader restarted at
once never reports a lower high watermark than the one before it; a power loss may keep an
older value, or a torn one. A file that is missing, of another length or whose checksum does
not match reads as 0 (`problem` says why), the value a replica starts from without one: the
high watermark then rises as the followers fetch. The write handle stays open between writes,
registered in OPEN_FILES (broker.log.files) as a segment's is, so that a high watermark that
moves at every round of a thousand partitions costs a pwrite, not an open, a pwrite and a
close; `close` releases it. Not safe to share between threads.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from xxhash import xxh3_64_intdigest

from broker.log.files import OPEN_FILES

CHECKPOINT_NAME = "high-watermark-checkpoint"
MAGIC = b"PLHW"
FORMAT_VERSION = 1
_BODY = struct.Struct(">4sIQ")
_CHECKSUM = struct.Struct(">Q")
SIZE = _BODY.size + _CHECKSUM.size


def encode(high_watermark: int) -> bytes:
    body = _BODY.pack(MAGIC, FORMAT_VERSION, high_watermark)
    return body + _CHECKSUM.pack(xxh3_64_intdigest(body))


def decode(data: bytes) -> int:
    """The high watermark the file's bytes hold; ValueError naming what is wrong."""
    if len(data) != SIZE:
        raise ValueError(f"{len(data)} bytes, not {SIZE}")
    body = data[: _BODY.size]
    if _CHECKSUM.unpack_from(data, _BODY.size)[0] != xxh3_64_intdigest(body):
        raise ValueError("its checksum does not match (a torn write)")
    magic, version, high_watermark = _BODY.unpack(body)
    if magic != MAGIC or version != FORMAT_VERSION:
        raise ValueError(f"magic {magic!r} version {version}: not a format this broker reads")
    value: int = high_watermark
    return value


class HighWatermarkCheckpoint:
    """The checkpoint of the partition folder `directory`: `value` is what it holds (read at
    creation), `write` replaces it. The folder must exist."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / CHECKPOINT_NAME
        self._fd: int | None = None
        self._key = (self, "checkpoint")
        self.problem: str | None = None
        """Why the file read as 0 though it exists (None: read, or absent)."""
        try:
            self.value = decode(self.path.read_bytes())
        except FileNotFoundError:
            self.value = 0
        except (OSError, ValueError) as error:
            self.value = 0
            self.problem = f"{self.path.name} unreadable, taken as 0: {error}"

    def write(self, high_watermark: int) -> None:
        """Hold `high_watermark` from now on (nothing written when it is held already).
        OSError as the disk says."""
        if high_watermark == self.value:
            return
        fd = self._fd
        if fd is None:
            fd = self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        OPEN_FILES.used(self._key, self._release)
        os.pwrite(fd, encode(high_watermark), 0)
        self.value = high_watermark

    def close(self) -> None:
        """Release the write handle (the partition is closed or deleted)."""
        OPEN_FILES.closed(self._key)
        self._release()

    def _release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

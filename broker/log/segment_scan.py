"""A segment's bytes checked whole: `scan_segment` checks every message (framing and checksum),
keeps every valid one, notes each damaged range and finds a torn tail (what recovery and a
segment's scan run); `walk_timestamps` rebuilds a time index from the message headers alone;
`index_disagreement` walks every index entry against the framing (`pylogctl log verify`)."""

from __future__ import annotations

import contextlib
import mmap
import re
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

from broker.log.codec import scan
from broker.log.message import (
    CHECKSUM_START,
    HEADER_SIZE,
    LENGTH_SIZE,
    MAX_FORMAT_MESSAGE_BYTES,
    NO_TIMESTAMP,
    SET_CODECS,
    Buffer,
    message_size_at,
    valid_message_end,
)

_LENGTH = struct.Struct(">I")
_LENGTH_AND_TIMESTAMP = struct.Struct(">I10xq")
_STORED_HEADS = re.compile(b"\\x01[" + re.escape(bytes([0, *sorted(SET_CODECS)])) + b"]|\\x02\\x00")
"""What a message has at byte CHECKSUM_START: magic 1, and attributes 0 or a compressed
set's codec; or magic 2 and attributes 0."""
_RESYNC_CHUNK = 1 << 20


class Damage(NamedTuple):
    """Bytes [start, end) of a segment that fail the checks, kept in place, and why."""

    start: int
    end: int
    reason: str


class SegmentScan(NamedTuple):
    """What `scan_segment` found. `end` is where the bytes to keep end: the size, or the start
    of a torn tail, whose problem is `tail_error` (None when there is none). `marks` are the
    index entries, `damage` the damaged ranges before `end`, `greatest` the greatest timestamp
    of the valid messages of each run between marks (broker.log.message.ScanResult)."""

    end: int
    marks: list[int]
    damage: list[Damage]
    tail_error: str | None
    greatest: list[int]


def scan_segment(data: Buffer, index_interval: int) -> SegmentScan:
    """Check the framing and checksum of every message of a segment's bytes, judged by the
    format's own limits (never by max_message_bytes, a setting that may have changed).

    Where a message fails, its damage ends where the next valid message starts: where its
    length field leads, when that is the end or a valid message, else the first position
    further on where a message passes every check. Damage that no valid message follows is a
    torn tail. Index marks fall every `index_interval` bytes and on the first message after
    each damaged range."""
    size = len(data)
    marks: list[int] = []
    damage: list[Damage] = []
    greatest = [NO_TIMESTAMP]
    pos = next_mark = 0
    while pos < size:
        result = scan(data[pos:], MAX_FORMAT_MESSAGE_BYTES, index_interval, next_mark - pos)
        if result.marks:
            marks.extend(pos + m for m in result.marks)
            next_mark = marks[-1] + index_interval
        greatest[-1] = max(greatest[-1], result.greatest[0])
        greatest += result.greatest[1:]
        pos += result.valid_bytes
        if result.error is None:
            break
        resume = _resume_point(data, pos)
        if resume is None:
            return SegmentScan(pos, marks, damage, result.error, greatest)
        damage.append(Damage(pos, resume, result.error))
        pos = next_mark = resume
    return SegmentScan(size, marks, damage, None, greatest)


def walk_timestamps(data: Buffer, index_interval: int) -> tuple[list[int], list[int]] | None:
    """The marks (one every `index_interval` bytes, as `scan` chooses them) and the greatest
    timestamp of each run between them (ScanResult.greatest) of segment bytes `data`, from
    their message headers alone (no checksums); None when the length fields do not lead from
    byte 0 exactly to the end. About 0.35 s per million messages."""
    size = len(data)
    unpack = _LENGTH_AND_TIMESTAMP.unpack_from
    marks: list[int] = []
    greatest: list[int] = []
    top = NO_TIMESTAMP
    pos = next_mark = 0
    while pos < size:
        if pos + HEADER_SIZE > size:
            return None
        length, timestamp = unpack(data, pos)
        following = pos + LENGTH_SIZE + length
        if following - pos < HEADER_SIZE or following > size:
            return None
        if pos >= next_mark:
            marks.append(pos)
            next_mark = pos + index_interval
            greatest.append(top)
            top = timestamp
        elif timestamp > top:
            top = timestamp
        pos = following
    greatest.append(top)
    return marks, greatest


def _resume_point(data: Buffer, pos: int) -> int | None:
    """Where a valid message (or the end) follows the bad message at `pos`, or None."""
    size = len(data)
    if size - pos >= HEADER_SIZE:
        following = pos + message_size_at(data, pos)
        if pos + HEADER_SIZE <= following <= size and (
            following == size or valid_message_end(data, following) is not None
        ):
            return following
    # Search for the magic and attributes of a message (_STORED_HEADS) at CHECKSUM_START, then
    # make the full checks there, copying _RESYNC_CHUNK bytes at a time.
    begin = pos + 1
    while begin < size:
        stop = min(size, begin + _RESYNC_CHUNK)
        window = bytes(data[begin + CHECKSUM_START : stop + CHECKSUM_START + 1])
        for hit in _STORED_HEADS.finditer(window, 0, stop - begin + 1):
            if hit.start() >= stop - begin:
                break
            if valid_message_end(data, begin + hit.start()) is not None:
                return begin + hit.start()
        begin = stop
    return None


def index_disagreement(data: Buffer, entries: Sequence[int]) -> tuple[int, str] | None:
    """Where and why index `entries` do not fit the framing of segment bytes `data`, or None
    when the length fields lead from byte 0 exactly to the end through every entry. Walks
    every message header (no checksums): about 0.25 s per million messages, plus reading the
    file when it is not in the page cache."""
    size = len(data)
    length_at = _LENGTH.unpack_from
    pending = iter(entries)
    target = next(pending, size)
    pos = 0
    while pos < size:
        if pos >= target:
            if pos > target:
                return target, f"entry {target} is not where a message starts"
            target = next(pending, size)
        if pos + HEADER_SIZE > size:
            return pos, f"the message at byte {pos} is cut short by the end of the file"
        following = pos + LENGTH_SIZE + length_at(data, pos)[0]
        if following - pos < HEADER_SIZE or following > size:
            return pos, f"the length field of the message at byte {pos} breaks the framing"
        pos = following
    if target < size:
        return target, f"entry {target} is not where a message starts"
    return None


@contextlib.contextmanager
def mapped(path: Path) -> Iterator[memoryview]:
    """A non-empty file, read-only and without copying, for the time of a scan."""
    with (
        open(path, "rb") as f,
        mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m,
        memoryview(m) as data,
    ):
        yield data

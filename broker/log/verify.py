"""Read-only checks of segment files, for `pylogctl log verify` and `pylogctl log dump`.

Nothing here changes a file: unlike PartitionLog.open, which recovers (cuts a torn tail,
rebuilds indexes, renames), these functions only read and report. Stored bytes are judged by
the format's own limits, as recovery judges them.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from broker.errors import InvalidMessage
from broker.log.codec import check_sets, count_sets, scan
from broker.log.index import OffsetIndex
from broker.log.message import MAX_FORMAT_MESSAGE_BYTES, Message, decode_message
from broker.log.recovery import SEGMENT_NAME
from broker.log.segment import INDEX_SUFFIX, TIME_INDEX_SUFFIX
from broker.log.segment_scan import index_disagreement
from broker.log.timeindex import TimeIndex


@dataclass(frozen=True, slots=True)
class SegmentCheck:
    """The verdict on one segment file. `error` is None when every message is valid and the
    segment starts where the one before it ended; otherwise it names the problem, and
    `position` is the byte of the file where it was found. `sets` of the `messages` are
    compressed sets not opened, each counted as one (0 with `deep`: their messages are
    counted)."""

    path: Path
    base_offset: int
    size: int
    messages: int
    error: str | None
    position: int | None
    sets: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None


def base_offset_of(path: Path) -> int:
    """The base offset a segment's file name gives it (0 for a file not named like one)."""
    match = SEGMENT_NAME.match(path.name)
    return int(match.group(1)) if match else 0


def map_file(path: Path) -> memoryview:
    """The whole file, read-only and without copying (an empty view for an empty file)."""
    with open(path, "rb") as f:
        if f.seek(0, 2) == 0:
            return memoryview(b"")
        return memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))


def check_segment(path: Path, expected_base: int | None = None, deep: bool = False) -> SegmentCheck:
    """Check every message's framing and checksum, that the segment starts at
    `expected_base` (where the previous segment of its partition ended), if given, and that
    its index, if one describes a file of this size (it was closed cleanly), agrees with it:
    an index written for another size is stale, and recovery rebuilds it. A time index that
    describes a file of this size must pass its checksum. With `deep`, every compressed set is
    also decompressed and its inner set checked (as PRODUCE checks it), and `messages` counts
    the inner messages; else a set counts as one message, and `sets` says how many are."""
    base = base_offset_of(path)
    try:
        data = map_file(path)
    except OSError as error:
        return SegmentCheck(path, base, 0, 0, f"cannot be read: {error}", 0)
    size = len(data)
    if expected_base is not None and base != expected_base:
        return SegmentCheck(
            path, base, size, 0, f"starts at {base}, the segment before ends at {expected_base}", 0
        )
    result = scan(data, MAX_FORMAT_MESSAGE_BYTES)
    if result.error is not None:
        return SegmentCheck(
            path, base, size, result.message_count, result.error, result.valid_bytes
        )
    count, sets = result.message_count, 0
    if deep:
        try:
            count = check_sets(data, result)
        except InvalidMessage as error:
            return SegmentCheck(path, base, size, count, error.reason, error.position)
    else:
        sets = count_sets(data, result)
    index_path = path.with_suffix(INDEX_SUFFIX)
    index, damaged = OffsetIndex.load(index_path, size)
    if damaged is not None:
        problem = f"index {index_path.name} is damaged: {damaged}"
        return SegmentCheck(path, base, size, count, problem, 0)
    if index is not None:
        wrong = index_disagreement(data, index.entries())
        if wrong is not None:
            problem = f"index {index_path.name} disagrees with the log: {wrong[1]}"
            return SegmentCheck(path, base, size, count, problem, wrong[0])
    time_index_path = path.with_suffix(TIME_INDEX_SUFFIX)
    _, damaged = TimeIndex.load(time_index_path, size)
    if damaged is not None:
        problem = f"time index {time_index_path.name} is damaged: {damaged}"
        return SegmentCheck(path, base, size, count, problem, 0)
    return SegmentCheck(path, base, size, count, None, None, sets)


def partition_dirs(path: Path) -> list[Path]:
    """`path` itself when it holds segments, else its subfolders that do, sorted by name."""
    if any(SEGMENT_NAME.match(p.name) for p in path.iterdir()):
        return [path]
    return sorted(p for p in path.iterdir() if p.is_dir() and any(p.glob("*.log")))


def check_partition(directory: Path, deep: bool = False) -> Iterator[SegmentCheck]:
    """Check a partition folder's segments in offset order, one verdict as each is done
    (`check_segment`, `deep` or not)."""
    segments = sorted(p for p in directory.iterdir() if SEGMENT_NAME.match(p.name))
    expected: int | None = None
    for path in segments:
        verdict = check_segment(path, expected, deep)
        expected = verdict.base_offset + verdict.size
        yield verdict


def set_aside_files(directory: Path) -> list[Path]:
    """The *.bad files recovery left in a partition folder."""
    return sorted(directory.glob("*.bad"))


def dump_segment(path: Path) -> Iterator[Message]:
    """Every message of a segment file, checksum verdict included, in file order.

    Raises InvalidMessage (with the file position) where the framing breaks, as nothing after
    that point can be told apart from garbage."""
    data = map_file(path)
    base = base_offset_of(path)
    pos = 0
    while pos < len(data):
        message = decode_message(data, pos, base + pos)
        yield message
        pos += message.size

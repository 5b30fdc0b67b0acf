"""Recovery of a partition folder on open (docs/storage.md, "Recovery after a crash"): which
segment files are kept, scanned, put back to their length, cut or set aside, and what is
reported (RecoveryReport). broker.log.partition opens a PartitionLog on what `recover_folder`
returns; its reads (broker.log.local_log) scan a segment again (`rescan`) or rebuild a stored
index (`rebuild_index`) when they find it damaged.

A closed segment is trusted when its index describes its size; the newest segment, and any
other, is scanned, checksums and all. Where the framing holds nothing is cut: a damaged message
stays in place and is reported. Only a torn tail of the newest segment is cut, its bytes moved
to a `*.bad` file. A closed segment that lost or gained bytes inside a damaged range is put back
to its length there, so that what follows keeps its offsets; a gap (offsets no segment holds)
keeps the later segments and is reported as damaged; a segment that starts inside the one
before it, or cannot be read, is set aside with every later one, and the log goes on past the
furthest of them, so that no offset is handed out twice. Recovery never simply deletes
anything, and the folder is fsynced after every file created, renamed or deleted.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from broker.errors import StorageError
from broker.log.config import LogConfig
from broker.log.fsdir import fsync_directory, fsync_file
from broker.log.indexfile import IndexDamaged
from broker.log.message import message_size_at, valid_message_end
from broker.log.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    PRODUCERS_SUFFIX,
    TIME_INDEX_SUFFIX,
    FramingBroken,
    Segment,
    bad_file_path,
)
from broker.log.segment_scan import Damage

SEGMENT_NAME = re.compile(r"^(\d{20})\.log$")
_LEFTOVER_SUFFIXES = tuple(
    f"{suffix}.tmp" for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX, LOG_SUFFIX)
)

log = logging.getLogger(__name__)
_partition_log = logging.getLogger("broker.log.partition")
"""What reads repair is logged as the partition's (as operators have seen it)."""


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What `PartitionLog.open` found and did. `problems` has one line per cut or renamed
    file, per index rebuilt because it was damaged (as open found it: one that fails its
    checksum on first use is logged then), per damaged range kept, and per problem with the
    leader-epoch file (set aside, or entries past the log end dropped: broker.log.epochs);
    `damaged` holds those ranges, [start, end) offsets."""

    segments_scanned: int
    bytes_truncated: int
    bad_files: tuple[Path, ...]
    problems: tuple[str, ...]
    damaged: tuple[tuple[int, int], ...] = ()


def list_files(directory: Path) -> list[str]:
    """The names of the files in `directory`: one listing, which a partition's opening hands
    to each part of it (recover_folder, LeaderEpochs.load, ProducerStates.load) rather than
    each looking for its files (a broker opens thousands)."""
    with os.scandir(directory) as entries:
        return [entry.name for entry in entries if entry.is_file()]


def recover_folder(
    directory: Path, config: LogConfig, sync: bool = True, files: Collection[str] | None = None
) -> tuple[list[Segment], RecoveryReport]:
    """The segments of partition folder `directory`, oldest first, recovered (never empty: a
    new segment is created when none is kept, fsynced into the folder unless `sync` is
    False: Segment.create), and what was found and done (the leader-epoch file's problems are
    the caller's to add). `files`: the folder's file names, when the caller has just listed
    it (list_files; None: listed here)."""
    if files is None:
        files = list_files(directory)
    leftovers = [name for name in files if name.endswith(_LEFTOVER_SUFFIXES)]
    for leftover in leftovers:
        # an index write that a crash interrupted (indexes are derived), or the copy of a
        # segment's head that a cut makes while the segment is read (SegmentFile.cut)
        (directory / leftover).unlink()
    if leftovers:
        fsync_directory(directory)
    found = sorted(
        (int(m.group(1)), directory / name) for name in files if (m := SEGMENT_NAME.match(name))
    )
    segments: list[Segment] = []
    scanned = 0
    truncated = 0
    bad: list[Path] = []
    problems: list[str] = []
    damaged: list[tuple[int, int]] = []
    expected_base = found[0][0] if found else 0
    ended: str | None = None  # why the log ended before the file at hand
    beyond = 0  # where the files set aside for a mismatched start ended
    gaps: list[tuple[int, int]] = []  # offsets no segment holds, between two segments

    def note_damage(segment: Segment) -> None:
        for damage in segment.damage:
            start, end = segment.base_offset + damage.start, segment.base_offset + damage.end
            damaged.append((start, end))
            problems.append(
                f"{segment.log_path.name}: offsets [{start}, {end}) damaged, kept in place: "
                f"{damage.reason}"
            )

    for i, (base, path) in enumerate(found):
        newest = i == len(found) - 1
        if ended is None and base != expected_base and segments:
            # the segment before lost bytes, or gained some, or a segment went missing
            before = segments[-1]
            restored = _restore_length(before, base, config.index_interval_bytes, problems)
            if restored is not None:
                segments[-1] = restored
                expected_base = base
            elif base > expected_base:  # a gap, kept: reads there say so (_locate)
                gaps.append((expected_base, base))
                problems.append(
                    f"{path.name}: offsets [{expected_base}, {base}) missing: no segment "
                    f"holds them ({before.log_path.name} ends at {expected_base})"
                )
                expected_base = base
        if ended is None and base != expected_base:
            ended = f"it starts at {base}, but the log before it ends at {expected_base}"
            beyond = max(beyond, *(_file_end(*later) for later in found[i:]))
        if ended is not None:
            problems.append(f"{path.name}: set aside: {ended}")
            bad.append(_set_aside(path))
            continue
        try:
            segment, trusted, timed, damaged_index = Segment.open_existing(path, base)
            if damaged_index is not None:
                problems.append(f"{path.name}: {damaged_index}; rebuilt from the log")
            if trusted and not timed and not newest:
                trusted = build_time_index(segment, config.index_interval_bytes, problems)
            if newest or not trusted:
                scanned += 1
                cut, kept = scan_untrusted(segment, config.index_interval_bytes, newest, problems)
                truncated += cut
                bad += kept
        except OSError as error:
            problems.append(f"{path.name}: set aside: cannot be read: {error}")
            beyond = max(beyond, *(_file_end(*later) for later in found[i:]))
            bad.append(_set_aside(path))
            ended = f"it follows {path.name}, which cannot be read"
            continue
        segments.append(segment)
        expected_base = segment.end_offset
    if segments and segments[-1].indexes.stored:
        # the newest kept after newer ones were set aside: it becomes the active segment,
        # whose indexes live in memory, so it is scanned as the newest is, cutting nothing
        active = segments[-1]
        scanned += 1
        result = active.recover(config.index_interval_bytes)
        if result.tail_error is not None:
            active.keep_damage(Damage(result.end, active.size, result.tail_error))
    for segment in segments:
        note_damage(segment)
    damaged = sorted(damaged + gaps)
    if segments and beyond > segments[-1].end_offset:
        # past what was set aside too: no offset it held is ever handed out again
        damaged.append((segments[-1].end_offset, beyond))
        segments.append(Segment.create(directory, beyond, sync))
    if not segments:
        segments.append(Segment.create(directory, max(expected_base, beyond), sync))
    return segments, RecoveryReport(scanned, truncated, tuple(bad), tuple(problems), tuple(damaged))


def scan_untrusted(
    segment: Segment, index_interval: int, newest: bool, problems: list[str]
) -> tuple[int, list[Path]]:
    """Scan a segment whose index cannot be trusted (Segment.recover) and deal with a torn
    tail: the newest segment's is cut, its bytes moved to a *.bad file; an older segment's is
    kept as damage, as the next segment starts where the file ends. Returns the bytes cut and
    the files that keep them; adds a line to `problems` for what it did."""
    name = segment.log_path.name
    result = segment.recover(index_interval)
    if not newest:
        if result.tail_error is not None:
            segment.keep_damage(Damage(result.end, segment.size, result.tail_error))
        try:
            segment.indexes.store(segment.size)
        except StorageError as error:
            problems.append(f"{name}: the rebuilt indexes cannot be stored: {error}")
    if result.tail_error is None or not newest:
        return 0, []
    cut = segment.size - result.end
    try:
        kept = segment.cut_tail(result.end)
    except OSError as error:
        problems.append(f"{name}: a torn tail of {cut} bytes cannot be moved aside: {error}")
        segment.keep_damage(Damage(result.end, segment.size, result.tail_error))
        return 0, []
    problems.append(
        f"{name}: truncated {cut} bytes at position {result.end}, kept in {kept.name}: "
        f"{result.tail_error}"
    )
    return cut, [kept]


def _restore_length(
    segment: Segment, end: int, index_interval: int, problems: list[str]
) -> Segment | None:
    """A closed segment that ends short of `end`, where the next segment starts (bytes went
    missing), or past it (bytes were added): put its file back to its length, so that the
    messages after the change, and every later segment, keep their offsets. The bytes change
    at the end of its last damaged range (where the framing that the change broke found a
    valid message again): zeros put in, the range growing by as many; or bytes taken out of
    the range (the file first kept whole in a *.bad file), when the range is long enough.
    Returns the segment opened again on the new file, or None when it has no damage (bytes
    lost at its end, or whole segments missing: a gap) or too little to take out (the later
    segments are then set aside). Adds a line to `problems`."""
    name = segment.log_path.name
    if not segment.framing_checked:
        scan_untrusted(segment, index_interval, False, problems)
    if not segment.damage:  # no framing broke: nothing says where bytes would have been
        return None
    change = end - segment.end_offset
    path = segment.log_path
    try:
        data = path.read_bytes()
    except OSError as error:
        problems.append(f"{name}: cannot be put back to its length: {error}")
        return None
    at = _change_position(data, segment.damage, change)
    if at is None:
        return None
    temporary = path.with_name(path.name + ".tmp")
    try:
        if change > 0:
            data = data[:at] + bytes(change) + data[at:]
            what = f"{change} bytes missing before {end}: put back as zeros at position {at}"
        else:
            kept = bad_file_path(path)
            kept.write_bytes(data)
            fsync_file(kept)
            data = data[: at + change] + data[at:]
            what = (
                f"{-change} bytes too many before {end}: taken out at position {at + change}, "
                f"the file kept whole in {kept.name}"
            )
        temporary.write_bytes(data)
        fsync_file(temporary)
    except OSError as error:  # a full disk: the segment stays as it is
        temporary.unlink(missing_ok=True)
        problems.append(f"{name}: cannot be put back to its length: {error}")
        return None
    segment.close()
    temporary.rename(path)
    fsync_directory(path.parent)
    restored = Segment.open_existing(path, segment.base_offset)[0]
    scan_untrusted(restored, index_interval, False, problems)
    problems.append(f"{name}: {what}; the messages after it keep their offsets")
    return restored


def _file_end(base: int, path: Path) -> int:
    """Where segment file `path`, starting at `base`, ends (`base` when it cannot be read)."""
    try:
        return base + path.stat().st_size
    except OSError:
        return base


def _change_position(data: bytes, damage: list[Damage], change: int) -> int | None:
    """Where `change` bytes (missing: > 0; too many: < 0) are to be put back or taken out of
    segment bytes `data`, so that what follows is where it was: in the damaged range whose
    first message's length field, moved by `change`, leads to a valid message (that message's
    start), or else at the end of the last range (which, to take bytes out, must be long
    enough). None when it cannot be."""
    for start, end, _ in damage:
        if start + 4 > len(data):
            continue
        following = start + message_size_at(data, start) - change
        if start < following <= end and valid_message_end(data, following) is not None:
            return following
    last = damage[-1]
    if change < 0 and last.end - last.start < -change:
        return None
    return last.end


def build_time_index(segment: Segment, index_interval: int, problems: list[str]) -> bool:
    """Build and store the time index of a closed segment opened on a trusted offset index
    (Segment.walk_time_index); False when its framing breaks and it must be recovered."""
    if not segment.walk_time_index(index_interval):
        return False
    try:
        segment.indexes.store_times(segment.size)
    except StorageError as error:
        name = segment.log_path.name
        problems.append(f"{name}: the rebuilt time index cannot be stored: {error}")
    return True


def _set_aside(path: Path) -> Path:
    """Rename an untrusted segment to *.bad (never over another file), drop its indexes and
    fsync the folder."""
    target = bad_file_path(path)
    path.rename(target)
    for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX, PRODUCERS_SUFFIX):
        with contextlib.suppress(FileNotFoundError):
            path.with_suffix(suffix).unlink()
    fsync_directory(path.parent)
    return target


def rebuild_index(segments: list[Segment], damaged: IndexDamaged, index_interval: int) -> None:
    """A closed segment's stored index failed its check on first use (or is gone): never
    trusted, it is rebuilt from the log as on open (a time index by a walk of the message
    headers, an offset index, or a time index whose walk breaks, by a scan of the segment,
    damage kept in place), stored, and every problem logged."""
    segment = next(s for s in segments if damaged.path in (s.index_path, s.time_index_path))
    name = segment.log_path.name
    kind = "index" if damaged.path == segment.index_path else "time index"
    problems = [f"{name}: {kind} {damaged}; rebuilt from the log"]
    if kind == "index" or not build_time_index(segment, index_interval, problems):
        scan_untrusted(segment, index_interval, False, problems)
        problems += [
            f"{name}: offsets [{segment.base_offset + d.start}, {segment.base_offset + d.end})"
            f" damaged, kept in place: {d.reason}"
            for d in segment.damage
        ]
    for problem in problems:
        _partition_log.warning("%s: %s", segment.log_path.parent.name, problem)


def rescan(segment: Segment, broken: FramingBroken, index_interval: int) -> None:
    """A read met framing that breaks where no damage was known: the file changed after it
    was opened. Scan that segment again as recovery does, cutting nothing: what fails the
    checks becomes damage that reads report (CorruptSegment), and the rest is served."""
    result = segment.recover(index_interval)
    if result.tail_error is not None:
        segment.keep_damage(Damage(result.end, segment.size, result.tail_error))
    _partition_log.warning(
        "%s: %s; %s scanned again: damaged %s",
        segment.log_path.parent.name,
        broken,
        segment.log_path.name,
        ", ".join(f"[{d.start}, {d.end})" for d in segment.damage) or "nothing",
    )

"""The partition log: append, read, flush, roll and retention on real files."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.errors import (
    DiskFull,
    FetchSizeTooSmall,
    InvalidMessage,
    InvalidOffset,
    MessageTooLarge,
    OffsetOutOfRange,
    StorageIOError,
)
from broker.log import LogConfig, Message, PartitionLog, encode_message, iter_messages
from broker.log.segment import Segment
from tests.conftest import FakeClock

NO_TIME_LIMITS = {"segment_ms": None, "retention_ms": None}


def make_set(first: int, count: int, size: int = 100) -> bytes:
    """`count` messages of `size` bytes on disk, values numbered from `first`."""
    pad = size - 26 - 8
    return b"".join(
        encode_message(b"%08d" % i + b"." * pad, timestamp_ms=i)
        for i in range(first, first + count)
    )


def read_all(log: PartitionLog, offset: int | None = None, max_bytes: int = 4096) -> list[Message]:
    """Every readable message from `offset` (default: log start) to the high watermark."""
    offset = log.log_start_offset if offset is None else offset
    out: list[Message] = []
    while offset < log.flushed_offset:
        batch = list(iter_messages(log.read(offset, max_bytes), offset))
        out += batch
        offset = batch[-1].next_offset
    return out


def open_log(path: Path, clock: FakeClock, **settings_: object) -> PartitionLog:
    config = LogConfig(**{**NO_TIME_LIMITS, "fsync": False, **settings_})  # type: ignore[arg-type]
    return PartitionLog.open(path, config, clock)


message_sets = st.lists(
    st.lists(
        st.tuples(st.binary(max_size=120), st.none() | st.binary(max_size=10)),
        min_size=1,
        max_size=8,
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(message_sets, st.integers(min_value=300, max_value=3000))
def test_reads_return_exactly_what_was_appended_at_the_offsets_append_returned(
    sets: list[list[tuple[bytes, bytes | None]]], max_bytes: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        log = open_log(Path(tmp) / "t-0", FakeClock(), segment_bytes=2000, index_interval_bytes=128)
        expected = []
        for batch in sets:
            encoded = [encode_message(v, key=k, timestamp_ms=1) for v, k in batch]
            offset = log.append(b"".join(encoded))
            for (value, key), data in zip(batch, encoded, strict=True):
                expected.append((offset, key, value))
                offset += len(data)
        log.flush()
        got = read_all(log, max_bytes=max_bytes)
        assert [(m.offset, m.key, m.value) for m in got] == expected
        for offset, key, value in expected:  # every message is also readable on its own
            first = next(iter_messages(log.read(offset, max_bytes), offset))
            assert (first.key, first.value) == (key, value)
        log.close()


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=20), min_size=1, max_size=30))
def test_segment_lookup_by_bisect_equals_a_linear_scan(set_sizes: list[int]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        log = open_log(Path(tmp) / "t-0", FakeClock(), segment_bytes=1000)
        n = 0
        for count in set_sizes:
            log.append(make_set(n, count, size=50))
            n += count
        segments = log.segments
        for offset in range(0, log.log_end_offset, 7):
            linear = [s for s in segments if s.base_offset <= offset < s.end_offset]
            assert log.local.segment_for(offset) is linear[-1]
        log.close()


def test_offsets_are_byte_positions_across_appends(tmp_path: Path, clock: FakeClock) -> None:
    log = open_log(tmp_path / "t-0", clock)
    assert log.append(make_set(0, 3)) == 0
    assert log.append(make_set(3, 2)) == 300
    assert log.log_end_offset == 500


def test_only_flushed_messages_are_readable(tmp_path: Path, clock: FakeClock) -> None:
    log = open_log(tmp_path / "t-0", clock, flush_messages=100)
    log.append(make_set(0, 5))
    assert (log.flushed_offset, log.log_end_offset) == (0, 500)
    assert log.read(0, 10_000).nbytes == 0
    with pytest.raises(OffsetOutOfRange):
        log.read(100, 10_000)
    log.flush()
    assert len(read_all(log)) == 5


def test_flush_triggers_when_flush_messages_are_pending(tmp_path: Path, clock: FakeClock) -> None:
    log = open_log(tmp_path / "t-0", clock, flush_messages=10)
    log.append(make_set(0, 6))
    assert log.flushed_offset == 0
    log.append(make_set(6, 4))
    assert log.flushed_offset == 1000
    assert log.local.statistics().pending_messages == 0


def test_flush_triggers_when_the_oldest_pending_message_waited_the_interval(
    tmp_path: Path, clock: FakeClock
) -> None:
    log = open_log(tmp_path / "t-0", clock, flush_messages=1000, flush_interval_ms=500)
    assert log.local.next_flush_deadline() is None
    log.append(make_set(0, 1))
    assert log.local.next_flush_deadline() == clock.monotonic() + 0.5
    clock.advance(0.3)
    log.append(make_set(1, 1))  # the deadline runs from the first pending message
    assert not log.local.flush_if_due()
    clock.advance(0.2)
    assert log.local.flush_if_due()
    assert log.flushed_offset == 200
    assert log.local.next_flush_deadline() is None
    log.append(make_set(2, 1))
    clock.advance(0.6)
    log.append(make_set(3, 1))  # an append past the deadline flushes too
    assert log.flushed_offset == 400


def test_flush_fsyncs_only_when_configured(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    for fsync, expected in ((False, 0), (True, 1)):
        log = open_log(tmp_path / f"t-{int(fsync)}", clock, fsync=fsync)
        synced.clear()  # opening fsyncs the folders a new partition adds to
        log.append(make_set(0, 1))
        log.flush()
        assert len(synced) == expected


def test_offset_inside_a_message_is_invalid_naming_its_neighbours(
    tmp_path: Path, clock: FakeClock
) -> None:
    log = open_log(tmp_path / "t-0", clock, index_interval_bytes=1000)
    log.append(make_set(0, 30))
    log.flush()
    for offset, previous in ((1, 0), (1250, 1200), (2999, 2900)):
        with pytest.raises(InvalidOffset) as caught:
            log.read(offset, 10_000)
        assert (caught.value.message_start, caught.value.next_offset) == (previous, previous + 100)
        assert f"offset {offset} is not a message boundary" in str(caught.value)


def test_where_the_last_read_or_flush_ended_is_not_walked_to_again(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fetch from where the previous read, or the flush before it, ended (a follower's and a
    consumer's next fetch) is served without walking the headers from an index entry to check
    its offset; an offset of no read is checked as ever."""
    log = open_log(tmp_path / "t-0", clock, index_interval_bytes=1_000_000)
    walks: list[int] = []
    check = Segment.check_boundary

    def counted(segment: Segment, position: int, limit: int) -> None:
        walks.append(position)
        check(segment, position, limit)

    monkeypatch.setattr(Segment, "check_boundary", counted)
    log.append(make_set(0, 10))
    log.flush()  # ends at 1000
    log.append(make_set(10, 10))
    log.flush()
    assert len(log.read(0, 300)) == 300  # the log start: walked to, as an offset of no read
    assert len(log.read(300, 400)) == 400  # where that read ended
    log.local.check_offset(700)  # where that one ended, as a fetch's check before its read
    assert len(log.read(700, 100_000)) == 1300
    assert len(log.read(1000, 100)) == 100  # where the first flush ended
    assert walks == [0]
    with pytest.raises(InvalidOffset):
        log.read(750, 100)
    assert walks == [0, 750]


@pytest.mark.parametrize("how", ["truncate", "reset"])
def test_a_start_known_before_bytes_are_cut_is_checked_again_after(
    tmp_path: Path, clock: FakeClock, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Offsets known as message starts are forgotten when bytes are cut (a follower's
    truncation or reset): one inside a message written since is refused by the check, not
    read as framing that breaks (which would scan the segment again)."""
    log = open_log(tmp_path / "t-0", clock)
    log.append(make_set(0, 3))  # messages at 0, 100, 200
    log.flush()
    assert len(log.read(0, 200)) == 200  # 200 known as a start
    if how == "truncate":
        log.truncate_to(100)
    else:
        log.reset_to(100)
    log.append(make_set(3, 1, size=150))  # [100, 250): 200 is inside it
    log.flush()
    with pytest.raises(InvalidOffset):
        log.read(200, 100)
    assert "scanned again" not in caplog.text


def test_offset_outside_the_log_names_both_bounds(tmp_path: Path, clock: FakeClock) -> None:
    log = open_log(tmp_path / "t-0", clock, segment_bytes=500, retention_bytes=500)
    for i in range(3):
        log.append(make_set(i * 5, 5))
    log.flush()
    log.local.apply_retention()
    assert (log.log_start_offset, log.flushed_offset) == (1000, 1500)
    for offset in (0, 999, 1501, 10**12):
        with pytest.raises(OffsetOutOfRange, match=r"readable offsets are \[1000, 1500\]"):
            log.read(offset, 1000)


def test_read_returns_only_whole_messages_within_max_bytes(
    tmp_path: Path, clock: FakeClock
) -> None:
    log = open_log(tmp_path / "t-0", clock, index_interval_bytes=250)
    log.append(make_set(0, 20))
    log.flush()
    for max_bytes, expected in ((100, 100), (199, 100), (250, 200), (1000, 1000), (10**6, 2000)):
        assert log.read(300, max_bytes).nbytes == min(expected, 1700)


def test_first_message_larger_than_max_bytes_is_an_error_naming_its_size(
    tmp_path: Path, clock: FakeClock
) -> None:
    log = open_log(tmp_path / "t-0", clock)
    log.append(make_set(0, 1, size=500))
    log.flush()
    with pytest.raises(FetchSizeTooSmall) as caught:
        log.read(0, 499)
    assert caught.value.needed == 500
    assert "max_bytes >= 500" in str(caught.value)


def test_read_at_the_high_watermark_is_empty(tmp_path: Path, clock: FakeClock) -> None:
    log = open_log(tmp_path / "t-0", clock)
    assert log.read(0, 100).nbytes == 0
    log.append(make_set(0, 2))
    log.flush()
    assert log.read(200, 100).nbytes == 0


def test_segments_roll_at_segment_bytes_named_by_base_offset(
    tmp_path: Path, clock: FakeClock
) -> None:
    log = open_log(tmp_path / "t-0", clock, segment_bytes=1000)
    for i in range(7):
        log.append(make_set(i * 3, 3))  # 300 bytes: three sets fit in a segment
    names = sorted(p.name for p in (tmp_path / "t-0").glob("*.log"))
    assert names == [f"{b:020d}.log" for b in (0, 900, 1800)]
    assert [s.size for s in log.segments] == [900, 900, 300]
    log.flush()
    assert len(read_all(log)) == 21


def test_segments_roll_at_segment_ms(tmp_path: Path, clock: FakeClock) -> None:
    log = open_log(tmp_path / "t-0", clock, segment_ms=60_000)
    log.append(make_set(0, 1))
    clock.advance(59)
    log.append(make_set(1, 1))
    assert len(log.segments) == 1
    clock.advance(1)
    log.append(make_set(2, 1))
    assert [s.base_offset for s in log.segments] == [0, 200]
    assert log.flushed_offset == 200  # rolling flushed the old segment


def test_oversize_message_and_oversize_set_are_rejected(tmp_path: Path, clock: FakeClock) -> None:
    log = open_log(tmp_path / "t-0", clock, segment_bytes=1000, max_message_bytes=300)
    with pytest.raises(MessageTooLarge, match=r"message at byte 0 of the set of 301 bytes"):
        log.append(make_set(0, 1, size=301))
    with pytest.raises(MessageTooLarge, match="message set of 1100 bytes"):
        log.append(make_set(0, 11))
    assert log.log_end_offset == 0


def test_rejected_append_leaves_the_log_exactly_as_it_was(tmp_path: Path, clock: FakeClock) -> None:
    directory = tmp_path / "t-0"
    log = open_log(directory, clock, segment_bytes=1000)
    log.append(make_set(0, 9))
    before = {p.name: p.read_bytes() for p in directory.iterdir()}
    bad = bytearray(make_set(9, 3))
    bad[250] ^= 0x40
    with pytest.raises(InvalidMessage) as caught:
        log.append(bytes(bad))  # would have rolled: 900 + 300 > 1000
    assert caught.value.position == 200
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == before
    assert (log.log_end_offset, len(log.segments), log.flushed_offset) == (900, 1, 0)


def test_retention_by_age_deletes_old_closed_segments_only(
    tmp_path: Path, clock: FakeClock
) -> None:
    log = open_log(tmp_path / "t-0", clock, segment_bytes=500, retention_ms=3_600_000)
    for i in range(4):
        log.append(make_set(i * 5, 5))
    old = clock.time() - 3601
    for segment in log.segments:
        os.utime(segment.log_path, (old, old))  # all of them, the active one too
    deleted = log.local.apply_retention()
    assert [p.name for p in deleted] == [f"{b:020d}.log" for b in (0, 500, 1000)]
    assert [s.base_offset for s in log.segments] == [1500]
    assert not any(p.exists() for p in deleted)
    assert log.log_start_offset == 1500


def test_retention_by_age_keeps_young_segments(tmp_path: Path, clock: FakeClock) -> None:
    log = open_log(tmp_path / "t-0", clock, segment_bytes=500, retention_ms=3_600_000)
    for i in range(3):
        log.append(make_set(i * 5, 5))
    clock.now_time = log.segments[0].log_path.stat().st_mtime + 3599
    assert log.local.apply_retention() == []


def test_retention_by_size_keeps_at_least_retention_bytes(tmp_path: Path, clock: FakeClock) -> None:
    log = open_log(tmp_path / "t-0", clock, segment_bytes=500, retention_bytes=1200)
    for i in range(6):
        log.append(make_set(i * 5, 5))  # six segments of 500 bytes, the last active
    log.local.apply_retention()
    assert [s.base_offset for s in log.segments] == [1500, 2000, 2500]
    assert log.local.statistics().size_bytes == 1500


def test_retention_never_deletes_a_segment_a_reader_holds(tmp_path: Path, clock: FakeClock) -> None:
    log = open_log(tmp_path / "t-0", clock, segment_bytes=500, retention_bytes=1)
    for i in range(3):
        log.append(make_set(i * 5, 5))
    log.flush()
    view = log.read(100, 10_000)  # a read in progress in the oldest segment
    assert log.local.apply_retention() == []
    assert [m.value[:8] for m in iter_messages(view, 100)] == [b"%08d" % i for i in range(1, 5)]
    del view
    assert len(log.local.apply_retention()) == 2
    assert log.log_start_offset == 1000


def test_close_and_reopen_keeps_offsets_and_data(tmp_path: Path, clock: FakeClock) -> None:
    log = open_log(tmp_path / "t-0", clock, segment_bytes=500)
    for i in range(5):
        log.append(make_set(i * 4, 4))
    log.close()
    reopened = open_log(tmp_path / "t-0", clock, segment_bytes=500)
    assert reopened.recovery.segments_scanned == 1  # the newest only: the others closed cleanly
    assert reopened.recovery.problems == ()
    assert reopened.flushed_offset == 2000
    assert [m.value[:8] for m in read_all(reopened)] == [b"%08d" % i for i in range(20)]
    assert reopened.append(make_set(20, 1)) == 2000


@pytest.mark.broker
@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_full_disk_is_an_error_that_leaves_the_log_intact(tmp_path: Path, clock: FakeClock) -> None:
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", mount_point], check=True)
    filler = mount_point / "filler"
    filler.write_bytes(bytes(32 * 1024))
    log = open_log(mount_point / "t-0", clock)
    try:
        appended = 0
        with pytest.raises(DiskFull, match="No space left on device"):
            for _ in range(100):  # 100 x 3000 bytes cannot fit in 64 KiB
                log.append(make_set(appended, 30))
                appended += 30
        segment = log.segments[-1]
        assert segment.log_path.stat().st_size == segment.size == log.log_end_offset
        assert log.log_end_offset == appended * 100
        filler.unlink()  # the operator makes room: the same log takes appends again
        assert log.append(make_set(appended, 30)) == appended * 100
        log.flush()
        expected = [b"%08d" % i for i in range(appended + 30)]
        assert [m.value[:8] for m in read_all(log)] == expected
    finally:
        with contextlib.suppress(DiskFull):
            log.close()
        subprocess.run(["umount", mount_point], check=True)


def test_offset_for_timestamp_is_the_first_message_at_or_after_it(
    tmp_path: Path, clock: FakeClock
) -> None:
    log = open_log(tmp_path / "t-0", clock, segment_bytes=500)
    for i in range(12):  # timestamps 0..11, 100 bytes each, over three segments
        log.append(make_set(i, 1))
    log.flush()
    assert len(log.segments) > 1
    assert log.offset_for_timestamp(0) == 0
    assert log.offset_for_timestamp(7) == 700
    assert log.offset_for_timestamp(12) == log.flushed_offset


def test_offset_for_timestamp_is_first_in_offset_order_whatever_the_timestamps_order(
    tmp_path: Path, clock: FakeClock
) -> None:
    log = open_log(tmp_path / "t-0", clock, segment_bytes=500)
    log.append(make_set(5, 5))
    log.append(make_set(0, 5))  # rolls: a second segment whose messages carry older timestamps
    log.flush()
    assert [s.indexes.times.greatest for s in log.segments] == [9, 4]
    assert log.offset_for_timestamp(0) == 0
    assert log.offset_for_timestamp(7) == 200
    assert log.offset_for_timestamp(2_000) == log.flushed_offset


def test_check_offset_raises_what_read_would_without_reading(
    tmp_path: Path, clock: FakeClock
) -> None:
    log = open_log(tmp_path / "t-0", clock)
    log.append(make_set(0, 2))
    log.flush()
    log.local.check_offset(100)
    log.local.check_offset(200)  # the high watermark: readable, nothing there yet
    with pytest.raises(InvalidOffset):
        log.local.check_offset(150)
    with pytest.raises(OffsetOutOfRange):
        log.local.check_offset(300)


def test_read_to_the_high_watermark_with_an_indexed_unflushed_message_right_after_it(
    tmp_path: Path, clock: FakeClock
) -> None:
    # Every message indexed: the first unflushed message, which starts at the high
    # watermark, has an index entry there (found by perf/paper.py's latency run).
    log = open_log(tmp_path / "t-0", clock, index_interval_bytes=1)
    log.append(make_set(0, 3))
    log.flush()
    log.append(make_set(3, 2))  # appended, not flushed
    assert log.log_end_offset > log.flushed_offset == 300
    assert len(log.read(0, 1 << 20)) == 300
    assert len(log.read(100, 200)) == 200


def test_a_failed_fsync_fails_the_log_until_it_is_reopened_from_the_disk(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = open_log(tmp_path / "t-0", clock, fsync=True)
    log.append(make_set(0, 3))
    log.flush()
    log.append(make_set(3, 2))  # pending when fsync fails: never to be acked as flushed
    real_fsync = os.fsync

    def failing_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(StorageIOError, match="Input/output error"):
        log.flush()
    assert log.flushed_offset == 300
    monkeypatch.setattr(os, "fsync", real_fsync)
    # fsync works again, but the page cache is not to be trusted: the log refuses until reopened
    for refused in (log.flush, lambda: log.append(make_set(5, 1)), log.roll):
        with pytest.raises(StorageIOError, match="a flush failed"):
            refused()
    assert log.flushed_offset == 300
    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(StorageIOError, match="Input/output error"):
        log.reopen_from_disk()  # the disk still fails: try again later
    monkeypatch.setattr(os, "fsync", real_fsync)
    reopened = log.reopen_from_disk()
    assert reopened.log_end_offset == reopened.flushed_offset == 300
    assert [m.value[:8] for m in read_all(reopened)] == [b"%08d" % i for i in range(3)]
    assert reopened.append(make_set(5, 1)) == 300
    reopened.close()
    # nothing past the high watermark comes back when the folder is opened again
    with PartitionLog.open(tmp_path / "t-0", reopened.local.config, clock) as again:
        assert [m.value[:8] for m in read_all(again)][-1] == b"00000005"
        assert again.log_end_offset == 400

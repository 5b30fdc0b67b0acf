"""Records deleted before an offset (PartitionLog.advance_start): the log start moves to a
message boundary, reads below it are out of range, segments wholly below it go, and the start
comes back with a log reopened from the disk."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from broker.errors import OffsetOutOfRange
from broker.log import PartitionLog
from tests.conftest import FakeClock
from tests.log.test_partition import make_set, open_log, read_all


def filled(tmp_path: Path, clock: FakeClock) -> PartitionLog:
    """Five segments of five 100-byte messages (timestamps 0 to 24), all flushed."""
    log = open_log(tmp_path / "t-0", clock, segment_bytes=500)
    for first in range(0, 25, 5):
        log.append(make_set(first, 5))
    log.flush()
    assert len(log.segments) == 5 and log.flushed_offset == 2500
    return log


def test_the_start_moves_to_a_boundary_and_reads_before_it_are_out_of_range(
    tmp_path: Path, clock: FakeClock
) -> None:
    log = filled(tmp_path, clock)
    assert log.advance_start(1200) == 1200  # message 12, in the third segment
    assert log.log_start_offset == 1200
    assert [s.base_offset for s in log.segments] == [1000, 1500, 2000]  # two wholly below: gone
    assert not (tmp_path / "t-0" / "00000000000000000000.log").exists()
    with pytest.raises(OffsetOutOfRange):
        log.read(1100, 100)
    messages = read_all(log)
    assert [m.offset for m in messages][:2] == [1200, 1300] and len(messages) == 13
    assert log.local.statistics().log_start_offset == 1200


def test_the_start_never_moves_back_nor_past_the_log_end(tmp_path: Path, clock: FakeClock) -> None:
    log = filled(tmp_path, clock)
    log.advance_start(1200)
    assert log.advance_start(300) == 1200
    assert log.advance_start(10**9) == 2500  # every record: an empty log starting at its end
    assert read_all(log) == []
    log.append(make_set(25, 1))
    log.flush()
    assert [m.offset for m in read_all(log)] == [2500]


def test_an_offset_inside_a_message_moves_the_start_past_that_message(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    log = filled(tmp_path, clock)
    assert log.advance_start(1250) == 1300
    assert "log start 1250 is inside the message [1200, 1300): moved to 1300" in caplog.text


def test_offsets_by_time_start_at_the_log_start(tmp_path: Path, clock: FakeClock) -> None:
    log = filled(tmp_path, clock)
    log.advance_start(1200)
    assert log.offset_for_timestamp(0) == 1200  # message 0 is gone: the first left is 12
    assert log.offset_for_timestamp(15) == 1500
    assert log.offset_for_timestamp(99) == 2500


def test_a_segment_a_reader_holds_is_deleted_by_the_next_retention_pass(
    tmp_path: Path, clock: FakeClock
) -> None:
    log = filled(tmp_path, clock)
    view = log.read(0, 100)  # a reader holds a view of the first segment
    log.advance_start(1200)
    assert [s.base_offset for s in log.segments] == [0, 500, 1000, 1500, 2000]  # oldest first
    assert log.log_start_offset == 1200
    del view
    deleted = log.local.apply_retention()
    assert [p.name for p in deleted] == [f"{0:020d}.log", f"{500:020d}.log"]
    assert [s.base_offset for s in log.segments] == [1000, 1500, 2000]


def test_retention_past_the_start_moves_it_with_the_segments(
    tmp_path: Path, clock: FakeClock
) -> None:
    log = filled(tmp_path, clock)
    log.advance_start(200)
    log.local.reconfigure(dataclasses.replace(log.local.config, retention_bytes=1000))
    log.local.apply_retention()
    assert log.log_start_offset == log.segments[0].base_offset == 1500


def test_a_log_reopened_from_the_disk_keeps_its_start(tmp_path: Path, clock: FakeClock) -> None:
    log = filled(tmp_path, clock)
    log.advance_start(1200)
    reopened = log.reopen_from_disk()
    assert reopened.log_start_offset == 1200
    reopened.close()


def test_a_reset_log_starts_where_it_was_reset(tmp_path: Path, clock: FakeClock) -> None:
    log = filled(tmp_path, clock)
    log.advance_start(1200)
    log.reset_to(700)  # a follower whose leader starts past its end, say
    assert log.log_start_offset == log.log_end_offset == 700


def test_an_empty_log_asked_to_start_past_its_end_starts_there(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A mirrored topic's partition (docs/mirror.md): created empty on the target, it starts
    where the source's log starts, so that every message lands at the source's offset; the
    epoch the leader began with is kept, at the new start."""
    log = open_log(tmp_path / "t-0", clock, segment_bytes=500)
    log.assign_epoch(3)
    assert log.advance_start(4200) == 4200
    assert log.log_start_offset == log.log_end_offset == log.flushed_offset == 4200
    assert [(e.epoch, e.start_offset) for e in log.epochs.entries] == [(3, 4200)]
    assert log.advance_start(100) == 4200  # never back
    log.append(make_set(0, 2))
    log.flush()
    assert [m.offset for m in read_all(log)] == [4200, 4300]
    assert log.advance_start(10**9) == 4400  # a log that holds bytes stops at its end
    reopened = log.reopen_from_disk()
    assert reopened.log_start_offset == reopened.log_end_offset == 4400
    reopened.close()

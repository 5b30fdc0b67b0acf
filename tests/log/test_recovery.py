"""Recovery on open: damage a partition's files on purpose, reopen, check what was kept and cut."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from broker.errors import InvalidOffset
from broker.log import PartitionLog
from tests.conftest import FakeClock
from tests.log.test_partition import make_set, open_log, read_all


@pytest.fixture
def crashed(tmp_path: Path, clock: FakeClock) -> Path:
    """A partition of 3 segments of 10 messages of 100 bytes, left without a clean close."""
    log = open_log(tmp_path / "t-0", clock, segment_bytes=1000, index_interval_bytes=300)
    for i in range(3):
        log.append(make_set(i * 10, 10))
    log.flush()
    return tmp_path / "t-0"  # no close(): the newest segment's index is never written


def reopen(directory: Path, clock: FakeClock) -> PartitionLog:
    return open_log(directory, clock, segment_bytes=1000, index_interval_bytes=300)


def values(log: PartitionLog) -> list[bytes]:
    return [m.value[:8] for m in read_all(log)]


def numbered(n: int) -> list[bytes]:
    return [b"%08d" % i for i in range(n)]


NEWEST = f"{2000:020d}.log"


def test_crash_without_damage_keeps_everything(crashed: Path, clock: FakeClock) -> None:
    log = reopen(crashed, clock)
    assert log.recovery.problems == ()
    assert log.recovery.segments_scanned == 1
    assert values(log) == numbered(30)
    assert log.append(make_set(30, 1)) == 3000


def test_segment_cut_mid_message_is_truncated_to_the_last_whole_message(
    crashed: Path, clock: FakeClock
) -> None:
    os.truncate(crashed / NEWEST, 950)
    log = reopen(crashed, clock)
    assert log.recovery.bytes_truncated == 50
    assert log.recovery.problems == (
        f"{NEWEST}: truncated 50 bytes at position 900: cut short: the message needs 100 "
        "bytes, 50 are left",
    )
    assert (crashed / NEWEST).stat().st_size == 900
    assert values(log) == numbered(29)
    assert log.append(make_set(29, 1)) == 2900


def test_random_garbage_after_the_last_message_is_cut(crashed: Path, clock: FakeClock) -> None:
    garbage = os.urandom(777)
    with open(crashed / NEWEST, "ab") as f:
        f.write(garbage)
    log = reopen(crashed, clock)
    assert log.recovery.bytes_truncated == 777
    assert values(log) == numbered(30)


def test_zeroed_tail_after_power_loss_is_cut(crashed: Path, clock: FakeClock) -> None:
    with open(crashed / NEWEST, "ab") as f:
        f.write(bytes(4096))
    log = reopen(crashed, clock)
    assert log.recovery.bytes_truncated == 4096
    assert "length field 0 is below the minimum 22" in log.recovery.problems[0]
    assert values(log) == numbered(30)


def test_zero_length_record_and_what_follows_it_are_cut(crashed: Path, clock: FakeClock) -> None:
    with open(crashed / NEWEST, "ab") as f:
        f.write(bytes(4) + make_set(30, 2))  # a length field of 0, then two good messages
    log = reopen(crashed, clock)
    assert log.recovery.bytes_truncated == 204
    assert values(log) == numbered(30)


def test_flipped_byte_mid_message_cuts_from_that_message(crashed: Path, clock: FakeClock) -> None:
    with open(crashed / NEWEST, "r+b") as f:
        f.seek(450)  # inside the value of the fifth message of the segment
        byte = f.read(1)
        f.seek(450)
        f.write(bytes([byte[0] ^ 0x10]))
    log = reopen(crashed, clock)
    assert log.recovery.bytes_truncated == 600
    assert "checksum mismatch" in log.recovery.problems[0]
    assert values(log) == numbered(24)


def test_recovered_index_finds_boundaries_again(crashed: Path, clock: FakeClock) -> None:
    (crashed / f"{1000:020d}.index").unlink()  # as if the roll was interrupted
    log = reopen(crashed, clock)
    assert log.recovery.segments_scanned == 2
    assert [e for s in log.segments for e in s.index.entries()] == [0, 300, 600, 900] * 3
    with pytest.raises(InvalidOffset):
        log.read(1650, 1000)
    assert log.read(1600, 1000).nbytes == 400


def test_damage_in_an_older_segment_sets_aside_everything_after_it(
    crashed: Path, clock: FakeClock
) -> None:
    middle = crashed / f"{1000:020d}.log"
    newest_bytes = (crashed / NEWEST).read_bytes()
    (crashed / f"{1000:020d}.index").unlink()  # it was not closed cleanly
    with open(middle, "r+b") as f:
        f.seek(520)
        f.write(b"\xff")
    log = reopen(crashed, clock)
    assert log.recovery.bytes_truncated == 500
    assert log.recovery.bad_files == (crashed / (NEWEST + ".bad"),)
    assert log.recovery.problems[1] == (
        f"{NEWEST}: set aside: it follows the cut in {1000:020d}.log"
    )
    assert (crashed / (NEWEST + ".bad")).read_bytes() == newest_bytes  # kept, not deleted
    assert values(log) == numbered(15)
    assert log.append(make_set(15, 1)) == 1500


def test_segment_without_any_valid_message_is_renamed_bad(crashed: Path, clock: FakeClock) -> None:
    garbage = os.urandom(300)
    (crashed / NEWEST).write_bytes(garbage)
    log = reopen(crashed, clock)
    assert log.recovery.bad_files == (crashed / (NEWEST + ".bad"),)
    assert (crashed / (NEWEST + ".bad")).read_bytes() == garbage
    assert "no valid message" in log.recovery.problems[0]
    assert values(log) == numbered(20)
    assert log.append(make_set(20, 1)) == 2000  # a fresh segment where the bad one began
    assert (crashed / NEWEST).stat().st_size == 100


def test_gap_between_segments_sets_aside_the_later_ones(crashed: Path, clock: FakeClock) -> None:
    (crashed / f"{1000:020d}.log").rename(crashed / "moved-away")
    log = reopen(crashed, clock)
    assert log.recovery.bad_files == (crashed / (NEWEST + ".bad"),)
    assert "starts at 2000, but the log before it ends at 1000" in log.recovery.problems[0]
    assert values(log) == numbered(10)


def test_second_bad_file_for_the_same_segment_does_not_overwrite_the_first(
    crashed: Path, clock: FakeClock
) -> None:
    (crashed / (NEWEST + ".bad")).write_bytes(b"earlier")
    (crashed / NEWEST).write_bytes(b"x" * 100)
    log = reopen(crashed, clock)
    assert log.recovery.bad_files == (crashed / (NEWEST + ".1.bad"),)
    assert (crashed / (NEWEST + ".bad")).read_bytes() == b"earlier"

"""The time index: OFFSETS by time is a bisect and a short walk, and finds what a walk of every
message finds; recovery rebuilds a time index that is missing or damaged."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.log import PartitionLog, encode_message
from broker.log.verify import check_partition
from tests.conftest import FakeClock
from tests.log.test_partition import make_set, open_log, read_all

NOW_MS = 1_800_000_000_000
"""About 2027: timestamps on both sides of the files' modification times."""

timestamps = st.integers(min_value=-5, max_value=2 * NOW_MS) | st.integers(
    min_value=-(1 << 63), max_value=(1 << 63) - 1
)
message_sets = st.lists(st.lists(timestamps, min_size=1, max_size=6), min_size=1, max_size=30)


def linear_scan(log: PartitionLog, timestamp_ms: int) -> int:
    """The first flushed message at or after `timestamp_ms`, by reading every message."""
    found = (m.offset for m in read_all(log) if m.timestamp_ms >= timestamp_ms)
    return next(found, log.flushed_offset)


@settings(max_examples=80, deadline=None)
@given(message_sets, st.lists(timestamps, min_size=1, max_size=12), st.integers(0, 2))
def test_lookup_by_time_index_equals_a_linear_scan(
    sets: list[list[int]], lookups: list[int], unflushed: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "t-0"
        settings_ = {"segment_bytes": 600, "index_interval_bytes": 150}
        log = open_log(folder, FakeClock(), **settings_)
        for i, times in enumerate(sets):
            log.append(b"".join(encode_message(b"v%d" % i, timestamp_ms=t) for t in times))
            if i == len(sets) - 1 - unflushed:
                log.flush()
        lookups += [t for times in sets for t in times]  # every stored timestamp, and near it
        lookups += [t + 1 for t in lookups] + [t - 1 for t in lookups]
        crashed = open_log(folder, FakeClock(), **settings_)  # newest segment scanned
        log.close()
        reopened = open_log(folder, FakeClock(), **settings_)  # time indexes from the files
        for opened in (log, crashed, reopened):
            for t in lookups:
                assert opened.offset_for_timestamp(t) == linear_scan(opened, t), t
        crashed.close(flush=False)
        reopened.close()


def closed_log(folder: Path, clock: FakeClock) -> list[bytes]:
    """Three closed segments of 5 messages of 100 bytes, timestamps 0-14; the index files."""
    log = open_log(folder, clock, segment_bytes=500, index_interval_bytes=200)
    for i in range(15):
        log.append(make_set(i, 1))
    log.close()
    return [p.read_bytes() for p in sorted(folder.glob("*.timeindex"))]


def test_a_missing_time_index_is_built_on_open_and_stored(tmp_path: Path, clock: FakeClock) -> None:
    folder = tmp_path / "t-0"
    stored = closed_log(folder, clock)
    assert len(stored) == 3
    for path in folder.glob("*.timeindex"):
        path.unlink()  # as a log written before time indexes existed
    log = open_log(folder, clock, segment_bytes=500, index_interval_bytes=200)
    assert log.recovery.problems == ()
    assert log.recovery.segments_scanned == 1  # the newest; the others are walked, not scanned
    assert [p.read_bytes() for p in sorted(folder.glob("*.timeindex"))[:2]] == stored[:2]
    assert [log.offset_for_timestamp(t) for t in (0, 7, 14, 15)] == [0, 700, 1400, 1500]


def test_a_damaged_time_index_is_reported_and_rebuilt(tmp_path: Path, clock: FakeClock) -> None:
    folder = tmp_path / "t-0"
    stored = closed_log(folder, clock)
    first = folder / f"{0:020d}.timeindex"
    damaged = bytearray(stored[0])
    damaged[20] ^= 0x01  # a timestamp: the checksum fails
    first.write_bytes(bytes(damaged))
    (folder / f"{500:020d}.timeindex.tmp").write_bytes(b"left by a crash")
    log = open_log(folder, clock, segment_bytes=500, index_interval_bytes=200)
    assert log.recovery.problems == ()  # its checksum is checked on first use (test_lazy_index)
    assert not list(folder.glob("*.tmp"))
    assert log.offset_for_timestamp(3) == 300
    assert first.read_bytes() == stored[0]


def test_a_time_index_of_a_segment_whose_framing_broke_is_rebuilt_by_its_scan(
    tmp_path: Path, clock: FakeClock
) -> None:
    folder = tmp_path / "t-0"
    closed_log(folder, clock)
    (folder / f"{0:020d}.timeindex").unlink()
    segment = folder / f"{0:020d}.log"
    data = bytearray(segment.read_bytes())
    data[203] ^= 0x40  # the length field of the message at 200: the walk cannot go on
    segment.write_bytes(bytes(data))
    log = open_log(folder, clock, segment_bytes=500, index_interval_bytes=200)
    assert log.recovery.damaged == ((200, 300),)
    assert log.recovery.segments_scanned == 2
    assert (folder / f"{0:020d}.timeindex").exists()
    assert [log.offset_for_timestamp(t) for t in (1, 2, 3)] == [100, 300, 300]


def test_retention_and_recovery_remove_time_indexes_with_their_segments(
    tmp_path: Path, clock: FakeClock
) -> None:
    folder = tmp_path / "t-0"
    log = open_log(folder, clock, segment_bytes=500, retention_bytes=1)
    for i in range(15):
        log.append(make_set(i, 1))
    log.flush()
    log.local.apply_retention()
    log.close()
    assert sorted(p.name for p in folder.glob("*.timeindex")) == [f"{1000:020d}.timeindex"]
    for suffix in (".log", ".index", ".timeindex"):  # inside the one before it: set aside
        (folder / f"{1000:020d}{suffix}").rename(folder / f"{100:020d}{suffix}")
    (folder / f"{0:020d}.log").write_bytes(make_set(0, 2))
    PartitionLog.open(folder, log.local.config, clock).close()
    left = sorted(p.name for p in folder.glob("*index"))  # the empty one after what was set
    assert left == [f"{0:020d}.{kind}" for kind in ("index", "timeindex")]  # aside stores none


def test_log_verify_reports_a_damaged_time_index(tmp_path: Path, clock: FakeClock) -> None:
    folder = tmp_path / "t-0"
    stored = closed_log(folder, clock)
    assert all(check.ok for check in check_partition(folder))
    (folder / f"{500:020d}.timeindex").write_bytes(stored[1][:-1] + b"\xff")
    problems = [check.error for check in check_partition(folder) if not check.ok]
    assert problems == [f"time index {500:020d}.timeindex is damaged: it fails its checksum"]

"""A follower's storage on real files: PartitionLog.truncate_to, reset_to, append_replicated
and the epoch history they keep, with crashes and failures at each step of a cut."""

from __future__ import annotations

import errno
import logging
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.errors import DiskFull, InvalidMessage, InvalidOffset, StorageError, StorageIOError
from broker.log import PartitionLog, encode_message
from broker.log.epochs import CHECKPOINT_NAME, LeaderEpochs
from broker.log.fsdir import fsync_file
from broker.log.segment import Segment
from tests.conftest import FakeClock
from tests.log.test_partition import make_set, open_log, read_all

SMALL = {"segment_bytes": 1000, "index_interval_bytes": 300}


def log_bytes(log: PartitionLog) -> bytes:
    """Every readable byte, through the public read path, from the log start."""
    out = bytearray()
    offset = log.log_start_offset
    while offset < log.flushed_offset:
        chunk = log.read(offset, 1 << 20)
        out += chunk
        offset += len(chunk)
    return bytes(out)


def history(log: PartitionLog) -> tuple[tuple[int, int], ...]:
    """The log's epoch entries as (epoch, start offset) pairs."""
    return tuple((e.epoch, e.start_offset) for e in log.epochs.entries)


def crash_and_open(log: PartitionLog, clock: FakeClock, **settings_: object) -> PartitionLog:
    """The folder opened again as after a crash: the old log's files released, nothing
    flushed, no index written."""
    log.close(flush=False)
    return open_log(log.directory, clock, **{**SMALL, **settings_})


def filled(path: Path, clock: FakeClock, **settings_: object) -> PartitionLog:
    """30 messages of 100 bytes in 3 segments [0, 1000) [1000, 2000) [2000, 3000), flushed,
    the first two closed (their indexes stored), epochs (1, 0) (2, 1500) (4, 2500)."""
    log = open_log(path, clock, **{**SMALL, **settings_})
    for i in range(6):
        if i in (0, 3, 5):
            log.assign_epoch({0: 1, 3: 2, 5: 4}[i])
        log.append(make_set(i * 5, 5))
    log.flush()
    assert [s.base_offset for s in log.segments] == [0, 1000, 2000]
    assert log.segments[0].indexes.stored and log.segments[1].indexes.stored
    return log


messages = st.lists(st.binary(max_size=150), min_size=1, max_size=3)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(messages, st.booleans(), st.integers(0, 5)), min_size=1, max_size=15),
    st.data(),
)
def test_a_cut_leaves_exactly_the_prefix_and_appends_continue_there(
    sets: list[tuple[list[bytes], bool, int]], data: st.DataObject
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        clock = FakeClock()
        log = open_log(Path(tmp) / "t-0", clock, segment_bytes=600, index_interval_bytes=64)
        stream = b""
        boundaries = [0]
        epoch = 0
        for values, flush, epoch_step in sets:
            if epoch_step == 0:
                epoch += 1
                log.assign_epoch(epoch)
            encoded = [encode_message(v, timestamp_ms=len(stream)) for v in values]
            assert log.append(b"".join(encoded)) == len(stream)
            for one in encoded:
                stream += one
                boundaries.append(len(stream))
            if flush:
                log.flush()
        if data.draw(st.booleans(), "opened again before the cut"):
            log.close()  # the closed segments then are read on their stored indexes
            log = open_log(Path(tmp) / "t-0", clock, segment_bytes=600, index_interval_bytes=64)
        entries = log.epochs.entries
        high_watermark = log.flushed_offset
        cut = data.draw(st.sampled_from(boundaries))
        assert log.truncate_to(cut) == len(stream) - cut
        assert log.log_end_offset == cut
        assert log.flushed_offset == min(high_watermark, cut)
        assert history(log) == tuple(e for e in entries if e.start_offset < cut)
        log.flush()
        assert log_bytes(log) == stream[:cut]
        more = encode_message(b"after the cut", timestamp_ms=0)
        assert log.append(more) == cut
        log.flush()
        assert log_bytes(log) == stream[:cut] + more
        log.close()
        with open_log(Path(tmp) / "t-0", clock, segment_bytes=600) as again:
            assert again.recovery.problems == ()
            assert log_bytes(again) == stream[:cut] + more
            assert history(again) == tuple(e for e in entries if e.start_offset < cut)


def test_a_cut_inside_a_message_or_outside_the_log_changes_nothing(
    tmp_path: Path, clock: FakeClock
) -> None:
    log = filled(tmp_path / "t-0", clock)
    before = {p.name: p.read_bytes() for p in (tmp_path / "t-0").iterdir()}
    for offset in (50, 1010, 2999):
        with pytest.raises(InvalidOffset) as refused:
            log.truncate_to(offset)
        assert refused.value.message_start == offset // 100 * 100
    for offset in (-1, 3001):
        with pytest.raises(ValueError, match=r"outside the log \[0, 3000\]"):
            log.truncate_to(offset)
    assert {p.name: p.read_bytes() for p in (tmp_path / "t-0").iterdir()} == before
    assert log.log_end_offset == log.flushed_offset == 3000 and log.local.failure is None
    assert log_bytes(log) == b"".join(make_set(i, 1) for i in range(30))


def test_a_cut_in_a_closed_segment_makes_it_the_active_one(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    log = filled(tmp_path / "t-0", clock)
    with caplog.at_level(logging.INFO, logger="broker.log.partition"):
        assert log.truncate_to(1500) == 1500
    assert "t-0: truncated to 1500: 1500 bytes cut, 1500 of them flushed" in caplog.text
    assert caplog.records[-1].levelno == logging.WARNING  # flushed bytes cut
    assert [s.base_offset for s in log.segments] == [0, 1000]
    assert not (tmp_path / "t-0" / f"{2000:020d}.log").exists()
    assert log.log_end_offset == log.flushed_offset == 1500
    assert history(log) == ((1, 0),)  # (2, 1500) started at the cut
    assert log.end_offset_for_epoch(2) == (1, 1500)
    assert [m.value[:8] for m in read_all(log)] == [b"%08d" % i for i in range(15)]
    assert log.append(make_set(100, 3)) == 1500  # appended to the segment cut
    log.flush()
    assert [s.base_offset for s in log.segments] == [0, 1000]
    assert log.append(make_set(103, 3)) == 1800  # and rolled as any active segment
    assert [s.base_offset for s in log.segments] == [0, 1000, 1800]
    log.close()
    with open_log(tmp_path / "t-0", clock, **SMALL) as again:
        assert again.recovery.problems == ()
        expected = [b"%08d" % i for i in (*range(15), *range(100, 106))]
        assert [m.value[:8] for m in read_all(again)] == expected


def test_a_closed_segment_whose_time_index_is_damaged_is_scanned_before_its_cut(
    tmp_path: Path, clock: FakeClock
) -> None:
    log = filled(tmp_path / "t-0", clock)
    times = tmp_path / "t-0" / f"{1000:020d}.timeindex"
    damaged = bytearray(times.read_bytes())
    damaged[-1] ^= 0xFF
    times.write_bytes(bytes(damaged))
    log.truncate_to(1500)
    assert log.segments[-1].framing_checked  # scanned: its indexes rebuilt, then cut
    assert log.offset_for_timestamp(12) == 1200
    assert log.append(make_set(15, 1)) == 1500
    log.flush()
    assert log_bytes(log) == b"".join(make_set(i, 1) for i in range(16))


def test_a_cut_at_a_segment_boundary_and_at_the_log_start(tmp_path: Path, clock: FakeClock) -> None:
    log = filled(tmp_path / "t-0", clock)
    log.truncate_to(2000)
    assert [(s.base_offset, s.size) for s in log.segments] == [(0, 1000), (1000, 1000), (2000, 0)]
    log.truncate_to(0)
    assert [(s.base_offset, s.size) for s in log.segments] == [(0, 0)]
    assert history(log) == () and log.flushed_offset == 0
    assert log.append(make_set(0, 1)) == 0
    log.close()
    with open_log(tmp_path / "t-0", clock, **SMALL) as again:
        assert again.log_end_offset == 100 and history(again) == ()


def test_a_cut_at_the_log_end_drops_only_the_entries_there(
    tmp_path: Path, clock: FakeClock
) -> None:
    log = filled(tmp_path / "t-0", clock)
    log.assign_epoch(6)
    assert log.epochs.entries[-1] == (6, 3000)
    assert log.truncate_to(3000) == 0
    assert history(log) == ((1, 0), (2, 1500), (4, 2500))
    assert log.log_end_offset == log.flushed_offset == 3000


def test_pending_appends_past_the_cut_are_dropped_and_those_before_stay_pending(
    tmp_path: Path, clock: FakeClock
) -> None:
    log = open_log(tmp_path / "t-0", clock, flush_messages=100)
    log.append(make_set(0, 3))
    log.flush()
    log.append(make_set(3, 5))  # pending: [300, 800)
    assert log.local.statistics().pending_messages == 5
    log.truncate_to(500)
    assert log.flushed_offset == 300 and log.log_end_offset == 500
    assert log.local.statistics().pending_messages == 2
    assert log.local.next_flush_deadline() is not None
    log.flush()
    assert [m.value[:8] for m in read_all(log)] == [b"%08d" % i for i in range(5)]
    log.append(make_set(5, 1))
    log.truncate_to(500)
    assert log.local.statistics().pending_messages == 0 and log.local.next_flush_deadline() is None


def test_a_view_held_across_a_cut_stays_valid(tmp_path: Path, clock: FakeClock) -> None:
    log = filled(tmp_path / "t-0", clock)
    view = log.read(2000, 1000)  # a fetch reply being sent
    held = bytes(view)
    log.truncate_to(2200)  # the segment is copied, not cut under the view
    assert bytes(view) == held  # no SIGBUS, the old pages
    assert (tmp_path / "t-0" / f"{2000:020d}.log").stat().st_size == 200
    assert not list((tmp_path / "t-0").glob("*.tmp"))
    assert log_bytes(log) == b"".join(make_set(i, 1) for i in range(22))
    view.release()


def test_a_damaged_range_past_the_cut_goes_with_it(tmp_path: Path, clock: FakeClock) -> None:
    log = filled(tmp_path / "t-0", clock)
    log.close()
    newest = tmp_path / "t-0" / f"{2000:020d}.log"
    with open(newest, "r+b") as f:
        f.seek(550)
        f.write(b"X")  # the message at 2500 fails its checksum
    log = open_log(tmp_path / "t-0", clock, **SMALL)
    assert log.recovery.damaged == ((2500, 2600),)
    log.truncate_to(2500)
    assert log.segments[-1].damage == []
    log.append(make_set(50, 1))
    log.flush()
    assert [m.value[:8] for m in read_all(log, 2400)] == [b"00000024", b"00000050"]


def test_reset_to_empties_the_log_above_or_below_its_range(
    tmp_path: Path, clock: FakeClock
) -> None:
    for start in (10_000, 0, 500):
        log = filled(tmp_path / f"t-{start}", clock)
        log.append(make_set(30, 2))  # pending: dropped too
        log.reset_to(start)
        assert [(s.base_offset, s.size) for s in log.segments] == [(start, 0)]
        assert log.log_start_offset == log.flushed_offset == log.log_end_offset == start
        assert history(log) == () and log.local.statistics().pending_messages == 0
        assert sorted(p.name for p in log.directory.iterdir()) == [
            f"{start:020d}.log",
            CHECKPOINT_NAME,
        ]
        log.assign_epoch(7)
        assert log.append(make_set(0, 2)) == start
        log.close()
        with open_log(log.directory, clock, **SMALL) as again:
            assert (again.log_start_offset, again.log_end_offset) == (start, start + 200)
            assert history(again) == ((7, start),)
    with pytest.raises(ValueError):
        log.reset_to(-1)


def test_append_replicated_takes_the_leaders_bytes_and_epochs_at_the_log_end(
    tmp_path: Path, clock: FakeClock
) -> None:
    log = open_log(tmp_path / "t-0", clock, max_message_bytes=50, segment_bytes=1000)
    # max_message_bytes is not applied: the leader stored these under its own settings
    assert log.append_replicated(make_set(0, 3), 0, [(2, 0)]) == 3
    with pytest.raises(ValueError, match="not at the log end 300"):
        log.append_replicated(make_set(3, 1), 200, [(2, 0)])
    # the entry in effect at 300 started earlier; epoch 5 starts inside the bytes
    log.append_replicated(make_set(3, 4), 300, [(1, 0), (2, 0), (5, 500)])
    assert history(log) == ((2, 0), (5, 500))
    log.append_replicated(make_set(7, 1), 700, [(5, 500), (6, 700), (7, 800)])
    assert history(log) == ((2, 0), (5, 500), (6, 700), (7, 800))
    with pytest.raises(ValueError, match="past the end 900"):
        log.append_replicated(make_set(8, 1), 800, [(7, 800), (8, 901)])
    with pytest.raises(ValueError, match="below the latest"):
        log.append_replicated(make_set(8, 1), 800, [(6, 800)])
    with pytest.raises(InvalidMessage):
        log.append_replicated(make_set(8, 1)[:-1], 800, [(8, 800)])
    assert history(log) == ((2, 0), (5, 500), (6, 700), (7, 800))
    assert log.log_end_offset == 800
    log.flush()
    assert [m.value[:8] for m in read_all(log)] == [b"%08d" % i for i in range(8)]


def test_append_replicated_takes_its_entries_back_when_the_append_fails(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = open_log(tmp_path / "t-0", clock)
    log.append_replicated(make_set(0, 3), 0, [(2, 0)])

    def full(*args: object) -> None:
        raise DiskFull("append to the segment: No space left on device")

    monkeypatch.setattr(Segment, "append", full)
    with pytest.raises(DiskFull):
        log.append_replicated(make_set(3, 2), 300, [(2, 0), (3, 300), (4, 400)])
    monkeypatch.undo()
    assert history(log) == ((2, 0), (3, 300))  # the entry at the log end stays
    assert LeaderEpochs.load(log.directory).entries == ((2, 0), (3, 300))
    log.append_replicated(make_set(3, 2), 300, [(3, 300), (4, 400)])  # the retry goes through
    assert history(log) == ((2, 0), (3, 300), (4, 400))


def test_a_crash_between_the_entries_and_their_bytes_drops_the_entries(
    tmp_path: Path, clock: FakeClock
) -> None:
    log = open_log(tmp_path / "t-0", clock, **SMALL)
    log.append_replicated(make_set(0, 3), 0, [(2, 0)])
    log.flush()
    log.epochs.assign_all([(3, 300), (5, 450)])  # written; the bytes never reached the disk
    again = crash_and_open(log, clock)
    assert history(again) == ((2, 0), (3, 300))
    assert again.recovery.problems == (
        f"{CHECKPOINT_NAME}: entries starting after the log end 300 dropped: (5, 450)",
    )


def test_a_damaged_epoch_file_is_set_aside_on_open(tmp_path: Path, clock: FakeClock) -> None:
    log = filled(tmp_path / "t-0", clock)
    log.close()
    (tmp_path / "t-0" / CHECKPOINT_NAME).write_bytes(b"1\n3\n1 0\n2 1500\n")  # cut short
    with open_log(tmp_path / "t-0", clock, **SMALL) as again:
        assert history(again) == ()
        assert again.recovery.problems == (
            f"{CHECKPOINT_NAME}: it says 3 entries but holds 2 lines of them; set aside as "
            f"{CHECKPOINT_NAME}.bad, starting with no leader epochs",
        )
        assert again.end_offset_for_epoch(4) == (-1, 0)
        assert again.log_end_offset == 3000  # the log itself is untouched


# -- interrupted and failed cuts ---------------------------------------------------------------


class Interrupted(OSError):
    pass


@pytest.fixture
def interrupt_at(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[int], list[str]]]:
    """Make the step `k` (from 0) of a cut raise before it does anything: the folder is then
    as a crash at that moment leaves it. The steps are every file change a cut makes, in order:
    segment deletions, the cut of a segment, its fsync, the writes of the epoch history.
    Returns the names of the steps seen (all of them when `k` is never reached)."""
    seen: list[str] = []
    target = [-1]

    def step(name: str, real: Callable[..., object]) -> Callable[..., object]:
        def wrapper(*args: object, **kwargs: object) -> object:
            if len(seen) == target[0]:
                seen.append(name)
                raise Interrupted(errno.EIO, f"interrupted at {name}")
            seen.append(name)
            return real(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(Segment, "delete", step("delete", Segment.delete))
    monkeypatch.setattr(Segment, "truncate_to", step("cut", Segment.truncate_to))
    monkeypatch.setattr("broker.log.local_log.fsync_file", step("fsync", fsync_file))
    monkeypatch.setattr(LeaderEpochs, "_store", step("epochs", LeaderEpochs._store))
    monkeypatch.setattr(Segment, "create", step("create", Segment.create))

    def arm(k: int) -> list[str]:
        seen.clear()
        target[0] = k
        return seen

    yield arm


def test_a_cut_interrupted_at_any_step_opens_as_a_consistent_prefix(
    tmp_path: Path, clock: FakeClock, interrupt_at: Callable[[int], list[str]]
) -> None:
    stream = b"".join(make_set(i, 1) for i in range(30))
    entries = ((1, 0), (2, 1500), (4, 2500))
    whole = filled(tmp_path / "whole", clock)
    steps = interrupt_at(-1)
    whole.truncate_to(1200)
    steps = list(steps)  # (the list seen is cleared by the next interrupt_at)
    assert steps == ["delete", "cut", "fsync", "epochs"]
    for k in range(len(steps)):
        log = filled(tmp_path / f"t-{k}", clock)
        interrupt_at(k)
        with pytest.raises(StorageIOError, match=f"interrupted at {steps[k]}"):
            log.truncate_to(1200)
        assert log.local.failure is not None and log.flushed_offset == 1200
        with pytest.raises(StorageIOError, match="nothing more is written"):
            log.append(make_set(0, 1))
        interrupt_at(-1)
        again = crash_and_open(log, clock)
        end = again.log_end_offset
        assert end == [3000, 2000, 1200, 1200][k]
        assert again.recovery.bad_files == ()
        assert log_bytes(again) == stream[:end]  # a prefix, no gap, nothing set aside
        # the history never claims a byte past the log end, nor loses one before it
        assert history(again) == tuple(e for e in entries if e[1] <= end)
        assert again.truncate_to(1200) == end - 1200  # the follower's next try finishes it
        assert history(again) == ((1, 0),)
        again.close()


def test_reopen_from_disk_finishes_a_failed_cut(
    tmp_path: Path, clock: FakeClock, interrupt_at: Callable[[int], list[str]]
) -> None:
    for k, name in enumerate(["delete", "cut", "fsync", "epochs"]):
        log = filled(tmp_path / f"t-{k}", clock)
        interrupt_at(k)
        with pytest.raises(StorageIOError, match=f"interrupted at {name}"):
            log.truncate_to(1200)
        interrupt_at(-1)
        reopened = log.reopen_from_disk()
        assert reopened.log_end_offset == reopened.flushed_offset == 1200
        assert [s.base_offset for s in reopened.segments] == [0, 1000]
        assert log_bytes(reopened) == b"".join(make_set(i, 1) for i in range(12))
        assert reopened.epochs.entries[:1] == ((1, 0),)
        assert all(e.start_offset <= 1200 for e in reopened.epochs.entries)
        reopened.close()


def test_a_reset_interrupted_at_any_step_opens_as_a_prefix_without_history(
    tmp_path: Path, clock: FakeClock, interrupt_at: Callable[[int], list[str]]
) -> None:
    stream = b"".join(make_set(i, 1) for i in range(30))
    whole = filled(tmp_path / "whole", clock)
    steps = interrupt_at(-1)
    whole.reset_to(9000)
    steps = list(steps)
    assert steps == ["epochs", "delete", "delete", "delete", "create"]
    for k in range(len(steps)):
        log = filled(tmp_path / f"t-{k}", clock)
        interrupt_at(k)
        with pytest.raises(StorageError, match=f"interrupted at {steps[k]}"):
            log.reset_to(9000)
        assert log.local.failure is not None
        interrupt_at(-1)
        again = crash_and_open(log, clock)
        if k == 0:  # nothing done yet
            assert history(again) == ((1, 0), (2, 1500), (4, 2500))
        else:
            assert history(again) == ()
        if k < 4:  # the segments deleted newest first: a prefix is left
            assert again.log_start_offset == 0
            assert log_bytes(again) == stream[: [3000, 3000, 2000, 1000][k]]
        else:  # every segment gone: an empty log at 0, which the follower resets again
            assert (again.log_start_offset, again.log_end_offset) == (0, 0)
        again.reset_to(9000)
        assert (again.log_start_offset, again.log_end_offset) == (9000, 9000)
        again.close()
        reopened = filled(tmp_path / f"r-{k}", clock)
        interrupt_at(k)
        with pytest.raises(StorageError):
            reopened.reset_to(9000)
        interrupt_at(-1)
        finished = reopened.reopen_from_disk()
        assert finished.log_end_offset == finished.flushed_offset == finished.log_start_offset
        finished.close()


def test_a_failed_fsync_during_a_cut_fails_the_log_until_it_is_reopened(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = filled(tmp_path / "t-0", clock)
    real_fsync = os.fsync

    def failing_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(StorageIOError, match="Input/output error"):
        log.truncate_to(2500)
    assert log.local.failure is not None
    for refused in (
        lambda: log.truncate_to(2000),
        lambda: log.reset_to(0),
        lambda: log.assign_epoch(9),
        lambda: log.append_replicated(make_set(0, 1), log.log_end_offset),
    ):
        with pytest.raises(StorageIOError, match="nothing more is written"):
            refused()
    monkeypatch.setattr(os, "fsync", real_fsync)
    reopened = log.reopen_from_disk()
    assert reopened.log_end_offset == reopened.flushed_offset == 2500
    assert history(reopened) == ((1, 0), (2, 1500), (4, 2500))  # the entry at the end
    reopened.truncate_to(2500)
    assert history(reopened) == ((1, 0), (2, 1500))
    reopened.close()

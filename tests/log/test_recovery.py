"""Recovery on open: damage a partition's files on purpose, reopen, check what was kept and cut."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from broker.errors import CorruptSegment, InvalidOffset
from broker.log import PartitionLog, encode_message, iter_messages
from broker.log.segment_scan import Damage, scan_segment
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
        f"{NEWEST}: truncated 50 bytes at position 900, kept in {NEWEST}.bad: cut short: the "
        "message needs 100 bytes, 50 are left",
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


def test_zero_length_record_is_damage_and_the_messages_after_it_are_kept(
    crashed: Path, clock: FakeClock
) -> None:
    with open(crashed / NEWEST, "ab") as f:
        f.write(bytes(4) + make_set(30, 2))  # a length field of 0, then two good messages
    log = reopen(crashed, clock)
    assert log.recovery.bytes_truncated == 0
    assert log.recovery.damaged == ((3000, 3004),)
    assert "length field 0 is below the minimum 22" in log.recovery.problems[0]
    assert each_message(log, [100 * i for i in range(30)]) == numbered(30)
    assert [m.value[:8] for m in read_all(log, 3004)] == numbered(32)[30:]


def test_recovered_index_finds_boundaries_again(crashed: Path, clock: FakeClock) -> None:
    (crashed / f"{1000:020d}.index").unlink()  # as if the roll was interrupted
    log = reopen(crashed, clock)
    assert log.recovery.segments_scanned == 2
    assert [e for s in log.segments for e in s.indexes.offsets.entries()] == [0, 300, 600, 900] * 3
    with pytest.raises(InvalidOffset):
        log.read(1650, 1000)
    assert log.read(1600, 1000).nbytes == 400


def test_damage_in_an_older_unclean_segment_cuts_nothing_and_sets_nothing_aside(
    crashed: Path, clock: FakeClock
) -> None:
    middle = crashed / f"{1000:020d}.log"
    (crashed / f"{1000:020d}.index").unlink()  # it was not closed cleanly
    flip(middle, 520, 0xFF)
    log = reopen(crashed, clock)
    assert log.recovery.bytes_truncated == 0
    assert log.recovery.bad_files == ()
    assert log.recovery.damaged == ((1500, 1600),)
    offsets = [100 * i for i in range(30)]
    assert each_message(log, offsets[:15] + offsets[16:]) == numbered(15) + numbered(30)[16:]
    assert log.append(make_set(30, 1)) == 3000
    assert (crashed / f"{1000:020d}.index").exists()  # rebuilt and stored


def test_newest_segment_without_any_valid_message_is_moved_to_a_bad_file(
    crashed: Path, clock: FakeClock
) -> None:
    garbage = os.urandom(300)
    (crashed / NEWEST).write_bytes(garbage)
    log = reopen(crashed, clock)
    assert log.recovery.bad_files == (crashed / (NEWEST + ".bad"),)
    assert (crashed / (NEWEST + ".bad")).read_bytes() == garbage
    assert log.recovery.problems[0].startswith(f"{NEWEST}: truncated 300 bytes at position 0")
    assert values(log) == numbered(20)
    assert log.append(make_set(20, 1)) == 2000  # a fresh segment where the bad one began
    assert (crashed / NEWEST).stat().st_size == 100


def test_a_missing_segment_leaves_a_gap_and_the_later_ones_are_kept(
    crashed: Path, clock: FakeClock
) -> None:
    (crashed / f"{1000:020d}.log").rename(crashed / "moved-away")
    log = reopen(crashed, clock)
    assert log.recovery.bad_files == ()
    assert log.recovery.damaged == ((1000, 2000),)
    assert (
        f"{NEWEST}: offsets [1000, 2000) missing: no segment holds them"
        in (log.recovery.problems[0])
    )
    assert [m.value[:8] for m in iter_messages(log.read(0, 4096), 0)] == numbered(10)
    with pytest.raises(CorruptSegment, match=r"offsets \[1000, 2000\) are damaged \(missing"):
        log.read(1000, 4096)
    assert [m.value[:8] for m in read_all(log, 2000)] == numbered(30)[20:]
    assert log.append(make_set(30, 1)) == 3000


def test_a_segment_inside_the_one_before_it_is_set_aside_and_its_offsets_never_reused(
    closed: Path, clock: FakeClock
) -> None:
    insert_bytes(closed / MIDDLE, 1000, make_set(99, 1))  # a valid message too many at its end
    log = reopen(closed, clock)
    assert log.recovery.bad_files == (closed / (NEWEST + ".bad"),)
    assert "starts at 2000, but the log before it ends at 2100" in log.recovery.problems[0]
    assert each_message(log, [100 * i for i in range(20)]) == numbered(20)
    with pytest.raises(CorruptSegment, match=r"offsets \[2100, 3000\)"):
        log.read(2100, 4096)  # what was set aside: said so, not an empty partition
    assert log.append(make_set(30, 1)) == 3000  # past every offset handed out before


def test_second_bad_file_for_the_same_segment_does_not_overwrite_the_first(
    crashed: Path, clock: FakeClock
) -> None:
    (crashed / (NEWEST + ".bad")).write_bytes(b"earlier")
    (crashed / NEWEST).write_bytes(b"x" * 100)
    log = reopen(crashed, clock)
    assert log.recovery.bad_files == (crashed / (NEWEST + ".1.bad"),)
    assert (crashed / (NEWEST + ".bad")).read_bytes() == b"earlier"


# -- issue 11: recovery never throws away good data ------------------------------------------


@pytest.fixture
def closed(tmp_path: Path, clock: FakeClock) -> Path:
    """A partition of 3 segments of 10 messages of 100 bytes, closed cleanly (every index
    written)."""
    log = open_log(tmp_path / "t-0", clock, segment_bytes=1000, index_interval_bytes=300)
    for i in range(3):
        log.append(make_set(i * 10, 10))
    log.close()
    return tmp_path / "t-0"


MIDDLE = f"{1000:020d}.log"


def flip(path: Path, position: int, mask: int = 0x10) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)
        f.seek(position)
        f.write(bytes([byte[0] ^ mask]))


def each_message(log: PartitionLog, offsets: list[int]) -> list[bytes]:
    """Read every message at `offsets` one by one, last first, so that each read walks from its
    own index entry (a read from where another ended need not: PartitionLog's known starts)."""
    read = [next(iter_messages(log.read(o, 100), o)).value[:8] for o in reversed(offsets)]
    return read[::-1]


def test_lowering_max_message_bytes_keeps_every_stored_message(
    closed: Path, clock: FakeClock
) -> None:
    # Recovery judges stored bytes by the format's limits, not by today's produce limit.
    log = open_log(closed, clock, segment_bytes=1000, max_message_bytes=60)
    assert log.recovery.problems == ()
    assert log.recovery.bytes_truncated == 0
    assert values(log) == numbered(30)
    assert log.append(encode_message(b"small", timestamp_ms=1)) == 3000


def test_damaged_message_in_the_newest_segment_is_kept_and_nothing_after_it_is_cut(
    crashed: Path, clock: FakeClock
) -> None:
    flip(crashed / NEWEST, 450)  # inside the value of the fifth message: [2400, 2500)
    for _ in range(2):  # and the same again after a second restart
        log = reopen(crashed, clock)
        assert log.recovery.bytes_truncated == 0
        assert log.recovery.damaged == ((2400, 2500),)
        (problem,) = log.recovery.problems
        assert problem.startswith(f"{NEWEST}: offsets [2400, 2500) damaged, kept in place: ")
        assert "checksum mismatch" in problem
        assert (crashed / NEWEST).stat().st_size == 1000
        assert [m.value[:8] for m in iter_messages(log.read(2000, 4096), 2000)] == numbered(24)[
            20:
        ]  # a read stops in front of the damaged message
        with pytest.raises(CorruptSegment) as raised:
            log.read(2400, 4096)
        assert str(raised.value).startswith("partition t-0: offsets [2400, 2500) are damaged (")
        assert str(raised.value).endswith("fetch from offset 2500 to skip them")
        assert (raised.value.start, raised.value.end) == (2400, 2500)
        assert [m.value[:8] for m in read_all(log, 2500)] == numbered(30)[25:]
        with pytest.raises(InvalidOffset, match="starts at 2400 and the next one at 2500"):
            log.read(2450, 4096)
        log.close()
    log = reopen(crashed, clock)
    assert log.append(make_set(30, 1)) == 3000  # no offset handed out before is reused


def test_damage_whose_framing_breaks_mid_segment_is_skipped_to_the_next_valid_message(
    crashed: Path, clock: FakeClock
) -> None:
    flip(crashed / NEWEST, 402, 0x40)  # the length field of [2400, 2500): framing breaks
    log = reopen(crashed, clock)
    assert log.recovery.bytes_truncated == 0
    assert log.recovery.damaged == ((2400, 2500),)
    assert "is over" in log.recovery.problems[0] or "cut short" in log.recovery.problems[0]
    assert [m.value[:8] for m in read_all(log, 2500)] == numbered(30)[25:]
    assert log.append(make_set(30, 1)) == 3000


def test_torn_tail_is_cut_and_the_bytes_cut_are_kept_in_a_bad_file(
    crashed: Path, clock: FakeClock
) -> None:
    garbage = os.urandom(777)
    with open(crashed / NEWEST, "ab") as f:
        f.write(make_set(30, 1)[:60] + garbage)  # a message cut short, then garbage
    log = reopen(crashed, clock)
    assert log.recovery.bytes_truncated == 837
    assert log.recovery.bad_files == (crashed / (NEWEST + ".bad"),)
    assert (crashed / (NEWEST + ".bad")).read_bytes() == make_set(30, 1)[:60] + garbage
    assert values(log) == numbered(30)
    assert log.append(make_set(30, 1)) == 3000


def test_a_flipped_value_byte_in_a_closed_segment_leaves_every_other_message_readable(
    closed: Path, clock: FakeClock
) -> None:
    flip(closed / MIDDLE, 450)  # the value of [1400, 1500); framing intact, checksum wrong
    log = reopen(closed, clock)
    offsets = [100 * i for i in range(30)]
    assert each_message(log, offsets[:14]) == numbered(14)
    assert each_message(log, offsets[15:]) == numbered(30)[15:]


def test_a_flipped_length_byte_in_a_closed_segment_is_found_after_a_restart_and_skippable(
    closed: Path, clock: FakeClock
) -> None:
    flip(closed / MIDDLE, 402, 0x40)  # the length field of [1400, 1500); its index intact
    log = reopen(closed, clock)
    assert log.recovery.segments_scanned == 1  # the newest only: opening reads no closed log
    assert [m.value[:8] for m in iter_messages(log.read(1000, 4096), 1000)] == numbered(14)[10:]
    offsets = [100 * i for i in range(30)]
    assert each_message(log, offsets[:14]) == numbered(14)
    assert each_message(log, offsets[15:]) == numbered(30)[15:]
    with pytest.raises(CorruptSegment, match=r"offsets \[1400, 1500\)"):
        log.read(1400, 4096)
    assert [m.value[:8] for m in read_all(log, 1500)] == numbered(30)[15:]


def test_a_damaged_index_is_rebuilt_on_first_use(closed: Path, clock: FakeClock) -> None:
    index = closed / f"{1000:020d}.index"
    data = bytearray(index.read_bytes())
    assert data[16:] == b"".join(p.to_bytes(4, "big") for p in (0, 300, 600, 900))
    data[20:24] = (350).to_bytes(4, "big")  # an entry inside a message
    index.write_bytes(bytes(data))
    log = reopen(closed, clock)
    assert log.recovery.problems == ()  # its checksum is checked on first use (test_lazy_index)
    assert each_message(log, [100 * i for i in range(30)]) == numbered(30)
    assert log.segments[1].indexes.offsets.entries() == [0, 300, 600, 900]
    assert log.recovery.bytes_truncated == 0 and log.recovery.damaged == ()


def fsynced_directories(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every directory that os.fsync is called on from now on, in order."""
    seen: list[Path] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            seen.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    return seen


def test_directories_are_fsynced_after_files_are_created_renamed_or_deleted(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced = fsynced_directories(monkeypatch)
    folder = tmp_path / "t-0"
    log = open_log(folder, clock, segment_bytes=1000, retention_bytes=1)
    assert synced == [tmp_path, folder]  # the new partition folder, then its first segment
    synced.clear()
    log.append(make_set(0, 10))
    log.append(make_set(10, 1))  # rolls: both indexes renamed into place, a segment created
    assert synced == [folder, folder, folder]
    synced.clear()
    log.flush()
    assert log.local.apply_retention() == [folder / f"{0:020d}.log"]
    assert synced == [folder]
    log.close()
    synced.clear()
    (folder / f"{1050:020d}.log").write_bytes(make_set(0, 1))  # inside the last: set aside
    reopened = open_log(folder, clock, segment_bytes=1000)
    assert reopened.recovery.bad_files == (folder / f"{1050:020d}.log.bad",)
    assert folder in synced
    reopened.close()


def test_damage_that_appears_after_open_is_found_by_the_read_that_meets_it(
    closed: Path, clock: FakeClock
) -> None:
    log = reopen(closed, clock)
    flip(closed / MIDDLE, 402, 0x40)  # the length field of [1400, 1500), under an open log
    offsets = [100 * i for i in range(30)]
    assert each_message(log, offsets[15:]) == numbered(30)[15:]  # the walk from 1300 meets it
    assert each_message(log, offsets[:14]) == numbered(14)
    with pytest.raises(CorruptSegment, match=r"offsets \[1400, 1500\)"):
        log.read(1400, 4096)
    assert log.offset_for_timestamp(14) == 1500  # the damaged message's timestamp is not read


@pytest.mark.parametrize("gap", [27, 1 << 20, (1 << 20) + 1, (1 << 20) + 12, (1 << 20) + 13])
def test_the_scan_resyncs_at_the_first_valid_message_after_zeroed_bytes(gap: int) -> None:
    first, after = make_set(0, 1), make_set(1, 2)
    data = first + bytes(gap) + after
    result = scan_segment(data, 300)
    assert result.damage == [Damage(100, 100 + gap, "length field 0 is below the minimum 22")]
    assert (result.end, result.tail_error) == (len(data), None)
    assert result.marks == [0, 100 + gap]
    assert scan_segment(first + bytes(gap), 300).tail_error is not None  # nothing after: torn


def remove_bytes(path: Path, position: int, count: int) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:position] + data[position + count :])


def insert_bytes(path: Path, position: int, extra: bytes) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:position] + extra + data[position:])


def test_bytes_missing_in_a_closed_segment_are_put_back_and_every_offset_kept(
    closed: Path, clock: FakeClock
) -> None:
    remove_bytes(closed / MIDDLE, 430, 7)  # inside the value of [1400, 1500)
    for restart in range(2):  # and the same after a second restart
        log = reopen(closed, clock)
        assert log.recovery.bad_files == ()
        if restart == 0:  # then closed cleanly: the damage is found again by the read
            assert log.recovery.damaged == ((1400, 1500),)
            assert any("7 bytes missing" in problem for problem in log.recovery.problems)
        assert (closed / MIDDLE).stat().st_size == 1000
        offsets = [100 * i for i in range(30)]
        assert each_message(log, offsets[:14]) == numbered(14)
        assert each_message(log, offsets[15:]) == numbered(30)[15:]  # at their old offsets
        if restart == 0:  # (its framing whole, the damage is a checksum the client checks)
            with pytest.raises(CorruptSegment, match=r"offsets \[1400, 1500\)"):
                log.read(1400, 4096)
        assert [m.value[:8] for m in read_all(log, 1500)] == numbered(30)[15:]
        log.close()
    log = reopen(closed, clock)
    assert log.append(make_set(30, 1)) == 3000  # no offset handed out before is reused


def test_a_message_missing_at_the_end_of_a_closed_segment_is_a_gap_readers_are_told_of(
    closed: Path, clock: FakeClock
) -> None:
    remove_bytes(closed / MIDDLE, 900, 100)  # its last message, whole: no framing breaks
    log = reopen(closed, clock)
    assert log.recovery.damaged == ((1900, 2000),)
    assert each_message(log, [100 * i for i in range(19)]) == numbered(19)
    with pytest.raises(CorruptSegment, match=r"offsets \[1900, 2000\) are damaged \(missing"):
        log.read(1900, 4096)  # not an empty read: a consumer there would wait for ever
    assert [m.value[:8] for m in read_all(log, 2000)] == numbered(30)[20:]
    assert log.append(make_set(30, 1)) == 3000


def test_bytes_added_inside_a_closed_segment_are_taken_out_and_every_offset_kept(
    closed: Path, clock: FakeClock
) -> None:
    original = (closed / MIDDLE).read_bytes()
    insert_bytes(closed / MIDDLE, 450, b"x" * 7)  # inside the value of [1400, 1500)
    log = reopen(closed, clock)
    assert log.recovery.bad_files == ()
    assert (closed / (MIDDLE + ".bad")).read_bytes()[450:457] == b"x" * 7  # kept whole
    assert (closed / MIDDLE).stat().st_size == 1000
    assert any("7 bytes too many" in problem for problem in log.recovery.problems)
    offsets = [100 * i for i in range(30)]
    assert each_message(log, offsets[:14]) == numbered(14)
    assert each_message(log, offsets[15:]) == numbered(30)[15:]
    assert (closed / MIDDLE).read_bytes()[500:] == original[500:]
    assert log.append(make_set(30, 1)) == 3000


def test_opening_a_partition_lists_its_folder_once_and_looks_for_no_file_it_did_not_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker opens thousands of partitions at a start: its folder is listed once
    (recovery.list_files), and the leader-epoch history, its leftover and the producers'
    entries are read only when listed (a look for each cost 15-20% of an opening). What
    the listing held is still acted on: a leftover history write deleted, an orphan entries
    file deleted, the history read."""
    folder = tmp_path / "t-0"
    with PartitionLog.open(folder) as plog:
        plog.append(make_set(0, 3))
        plog.epochs.assign(3, 0)
    (folder / "leader-epoch-checkpoint.tmp").write_bytes(b"half")
    (folder / "00000000000000000999.producers").write_bytes(b"")  # of no segment
    listings: list[str] = []
    scandir, listdir = os.scandir, os.listdir

    def counted_scandir(path: os.PathLike[str]) -> object:
        listings.append(f"scandir {path}")
        return scandir(path)

    def counted_listdir(path: os.PathLike[str]) -> list[str]:
        listings.append(f"listdir {path}")
        return listdir(path)

    monkeypatch.setattr(os, "scandir", counted_scandir)
    monkeypatch.setattr(os, "listdir", counted_listdir)
    with PartitionLog.open(folder) as plog:
        assert len(read_all(plog)) == 3
        assert plog.epochs.latest_epoch == 3
    assert listings == [f"scandir {folder}"]
    assert sorted(p.name for p in folder.iterdir()) == [
        "00000000000000000000.index",
        "00000000000000000000.log",
        "00000000000000000000.timeindex",
        "leader-epoch-checkpoint",
    ]

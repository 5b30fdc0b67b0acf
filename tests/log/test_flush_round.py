"""A flush round: many partition logs synced together by one syncfs, and a failure of the sync
failing exactly the logs whose data it may concern (broker.log.flush_round)."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from broker.errors import StorageIOError
from broker.log import LogConfig, PartitionLog, encode_message
from broker.log.flush_round import FlushRound
from broker.log.fsdir import syncfs as real_syncfs

MESSAGE = encode_message(b"x" * 74, timestamp_ms=1)


class Syncs:
    """The fsyncs of segment files (by partition folder name) and the syncfs calls made, and
    the faults to make: `failing` folder names whose fsyncs fail with EIO, `syncfs_fails` for
    a syncfs that fails as the kernel's does when a file of the file system lost its
    writeback."""

    def __init__(self) -> None:
        self.fsyncs: list[str] = []
        self.syncfs = 0
        self.failing: set[str] = set()
        self.syncfs_fails = False


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> Syncs:
    seen = Syncs()
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        if path.suffix == ".log":
            seen.fsyncs.append(path.parent.name)
            if path.parent.name in seen.failing:
                raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fsync(fd)

    def syncfs(fd: int) -> None:
        seen.syncfs += 1
        if seen.syncfs_fails:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_syncfs(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr("broker.log.flush_round.syncfs", syncfs)
    return seen


@pytest.fixture
def logs(tmp_path: Path) -> Iterator[Callable[..., list[PartitionLog]]]:
    opened: list[PartitionLog] = []

    def open_logs(count: int, **settings: object) -> list[PartitionLog]:
        config = LogConfig(flush_messages=1 << 30, segment_ms=None, **settings)  # type: ignore[arg-type]
        made = [PartitionLog.open(tmp_path / f"t-{i}", config) for i in range(count)]
        opened.extend(made)
        return made

    yield open_logs
    for plog in opened:
        plog.close(flush=False)


def appended(plogs: list[PartitionLog]) -> list[PartitionLog]:
    for plog in plogs:
        plog.append(MESSAGE)
    return plogs


def test_a_round_syncs_its_logs_with_one_syncfs_and_makes_their_messages_visible(
    syncs: Syncs, logs: Callable[..., list[PartitionLog]], tmp_path: Path
) -> None:
    plogs = appended(logs(5))
    round_ = FlushRound()
    round_.watch(tmp_path)
    result = round_.flush(plogs)
    assert (syncs.syncfs, syncs.fsyncs) == (1, [])
    assert result.flushed == plogs and not result.failed
    assert [p.flushed_offset for p in plogs] == [len(MESSAGE)] * 5
    assert round_.flush(plogs).flushed == []  # nothing pending: nothing synced again
    assert syncs.syncfs == 1
    round_.close()


def test_a_round_with_one_log_to_sync_fsyncs_it_alone(
    syncs: Syncs, logs: Callable[..., list[PartitionLog]], tmp_path: Path
) -> None:
    first, second = logs(2)
    round_ = FlushRound()
    round_.watch(tmp_path)
    appended([first])
    assert round_.flush([first, second]).flushed == [first]
    assert (syncs.syncfs, syncs.fsyncs) == (0, ["t-0"])
    round_.close()


def test_a_file_system_not_watched_is_synced_file_by_file(
    syncs: Syncs, logs: Callable[..., list[PartitionLog]]
) -> None:
    plogs = appended(logs(3))
    assert FlushRound().flush(plogs).flushed == plogs
    assert (syncs.syncfs, sorted(syncs.fsyncs)) == (0, ["t-0", "t-1", "t-2"])


def test_logs_that_do_not_fsync_are_made_visible_without_a_sync(
    syncs: Syncs, logs: Callable[..., list[PartitionLog]], tmp_path: Path
) -> None:
    plogs = appended(logs(3, fsync=False))
    round_ = FlushRound()
    round_.watch(tmp_path)
    assert round_.flush(plogs).flushed == plogs
    assert (syncs.syncfs, syncs.fsyncs) == (0, [])
    assert [p.flushed_offset for p in plogs] == [len(MESSAGE)] * 3
    round_.close()


def test_a_failed_syncfs_fails_only_the_logs_whose_own_fsync_fails(
    syncs: Syncs, logs: Callable[..., list[PartitionLog]], tmp_path: Path
) -> None:
    plogs = appended(logs(4))
    round_ = FlushRound()
    round_.watch(tmp_path)
    syncs.syncfs_fails = True
    syncs.failing = {"t-2"}
    result = round_.flush(plogs)
    assert sorted(syncs.fsyncs) == ["t-0", "t-1", "t-2", "t-3"]  # each asked after the syncfs
    assert result.flushed == [plogs[0], plogs[1], plogs[3]]
    assert list(result.failed) == [plogs[2]] and not result.file_system_errors
    assert [p.flushed_offset for p in plogs] == [len(MESSAGE), len(MESSAGE), 0, len(MESSAGE)]
    assert plogs[2].local.failure is not None and "fsync" in plogs[2].local.failure
    with pytest.raises(StorageIOError):  # failed until reopened from the disk
        plogs[2].append(MESSAGE)
    assert all(p.local.failure is None for p in (plogs[0], plogs[1], plogs[3]))
    round_.close()


def test_a_failed_syncfs_that_no_log_owns_fails_none_and_is_reported(
    syncs: Syncs, logs: Callable[..., list[PartitionLog]], tmp_path: Path
) -> None:
    plogs = appended(logs(3))
    round_ = FlushRound()
    round_.watch(tmp_path)
    syncs.syncfs_fails = True
    result = round_.flush(plogs)
    assert result.flushed == plogs and not result.failed
    assert [e.errno for e in result.file_system_errors] == [errno.EIO]
    round_.close()


def test_a_log_whose_segment_cannot_be_opened_to_sync_fails_nothing_and_holds_back_no_other(
    syncs: Syncs,
    logs: Callable[..., list[PartitionLog]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plogs = appended(logs(3))
    round_ = FlushRound()
    round_.watch(tmp_path)

    def no_descriptor() -> None:
        raise StorageIOError("reopening 00000000000000000000.log: [Errno 24] Too many open files")

    monkeypatch.setattr(plogs[1].local, "segment_to_sync", no_descriptor)
    result = round_.flush(plogs)
    assert result.flushed == [plogs[0], plogs[2]] and list(result.failed) == [plogs[1]]
    assert plogs[1].local.failure is None and plogs[1].flushed_offset == 0  # tried again later
    monkeypatch.undo()
    assert round_.flush(plogs).flushed == [plogs[1]]
    round_.close()

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
    """The fsyncs of segment files (by partition folder name), of producer-entries files
    (`entries`) and of partition folders (`folders`), and the syncfs calls made, and the
    faults to make: `failing` folder names whose segment fsyncs fail with EIO,
    `entries_failing` those whose entries fsyncs do, `syncfs_fails` for a syncfs that fails as
    the kernel's does when a file of the file system lost its writeback."""

    def __init__(self) -> None:
        self.fsyncs: list[str] = []
        self.entries: list[str] = []
        self.folders: list[str] = []
        self.syncfs = 0
        self.failing: set[str] = set()
        self.entries_failing: set[str] = set()
        self.syncfs_fails = False


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> Syncs:
    seen = Syncs()

    def recorded(real: Callable[[int], None]) -> Callable[[int], None]:
        def sync(fd: int) -> None:
            path = Path(os.readlink(f"/proc/self/fd/{fd}"))
            if path.is_dir():
                seen.folders.append(path.name)
            elif path.suffix in (".log", ".producers"):
                made, failing = (
                    (seen.fsyncs, seen.failing)
                    if path.suffix == ".log"
                    else (seen.entries, seen.entries_failing)
                )
                made.append(path.parent.name)
                if path.parent.name in failing:
                    raise OSError(errno.EIO, os.strerror(errno.EIO))
            real(fd)

        return sync

    def syncfs(fd: int) -> None:
        seen.syncfs += 1
        if seen.syncfs_fails:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_syncfs(fd)

    monkeypatch.setattr(os, "fsync", recorded(os.fsync))
    monkeypatch.setattr(os, "fdatasync", recorded(os.fdatasync))
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


def test_a_log_alone_whose_producer_entries_wait_is_synced_with_them_by_one_syncfs(
    syncs: Syncs, logs: Callable[..., list[PartitionLog]], tmp_path: Path
) -> None:
    """An idempotent set's entry is as durable as its bytes once they are flushed (a power
    loss that kept the bytes and lost the entry had the set sent again stored twice): one
    syncfs covers the segment, the entries file and that file's creation."""
    (plog,) = logs(1)
    round_ = FlushRound()
    round_.watch(tmp_path)
    plog.append_idempotent(MESSAGE, 7, 0, 0, flush=False)
    assert plog.producers.unsynced
    assert round_.flush([plog]).flushed == [plog]
    assert (syncs.syncfs, syncs.fsyncs, syncs.entries) == (1, [], [])
    assert not plog.producers.unsynced
    appended([plog])  # no idempotent set since: the segment's own fsync
    assert round_.flush([plog]).flushed == [plog]
    assert (syncs.syncfs, syncs.fsyncs, syncs.entries) == (1, ["t-0"], [])
    round_.close()


def test_without_syncfs_a_log_syncs_its_entries_file_and_once_its_folder_entry(
    syncs: Syncs, logs: Callable[..., list[PartitionLog]]
) -> None:
    (plog,) = logs(1)
    syncs.folders.clear()  # those of its opening
    plog.append_idempotent(MESSAGE, 7, 0, 0, flush=False)
    assert FlushRound().flush([plog]).flushed == [plog]
    assert (syncs.fsyncs, syncs.entries, syncs.folders) == (["t-0"], ["t-0"], ["t-0"])
    plog.append_idempotent(MESSAGE, 7, 0, 1, flush=False)
    assert FlushRound().flush([plog]).flushed == [plog]  # the file is there: no folder sync
    assert (syncs.fsyncs, syncs.entries, syncs.folders) == (["t-0"] * 2, ["t-0"] * 2, ["t-0"])
    assert plog.flushed_offset == 2 * len(MESSAGE)


def test_a_failed_sync_of_the_producer_entries_fails_the_log_and_shows_nothing(
    syncs: Syncs, logs: Callable[..., list[PartitionLog]]
) -> None:
    first, second = logs(2)
    first.append_idempotent(MESSAGE, 7, 0, 0, flush=False)
    second.append_idempotent(MESSAGE, 8, 0, 0, flush=False)
    syncs.entries_failing = {"t-0"}
    result = FlushRound().flush([first, second])
    assert list(result.failed) == [first] and result.flushed == [second]
    assert (first.flushed_offset, second.flushed_offset) == (0, len(MESSAGE))
    assert first.local.failure is not None and "producers" in first.local.failure
    with pytest.raises(StorageIOError):  # failed until reopened from the disk
        first.append(MESSAGE)


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

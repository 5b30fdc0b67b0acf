"""A flush round: many partition logs of one disk flushed together, their segments synced by
one syncfs(2) of the file system that holds them instead of one fsync each.

Why: an fsync costs a journal commit whatever the bytes, so a worker that flushed its dirtied
partitions one after another paid one commit per partition (perf/bench_flush_round.py, on
this machine's ext4, 5 KB a file: 100 files fdatasynced in turn 20.9 ms, from 16 threads
5.7 ms, one syncfs 2.1 ms; 1,000 files 248 / 62 / 13 ms). One file alone is cheaper by its
own fsync (0.13 ms, syncfs 0.22 ms), so a round with a single segment to sync on a file system
fsyncs it, unless its idempotent producers' entries wait to be synced with it (their file,
broker.log.producers, and its entry in the folder when it is new: one syncfs covers all, where
fsyncs would be two or three).

Errors, and why they fail exactly what they may concern: since Linux 5.8 syncfs reports a
writeback error of any file of the file system that came after the descriptor it is called
through was opened, or last reported one (the super block's errseq); and each file keeps its
own error state too, reported once to every descriptor of it that has not seen it, by fsync.
So a round keeps one descriptor per file system, opened (`watch`) before any partition there
is written to, and after a syncfs that failed it fsyncs each of the round's segments: one whose
fsync fails is a log whose data may be lost (it fails, as a failed fsync fails a log:
LocalLog.flush); one whose fsync succeeds had its data written (its pages were written
by the syncfs, and its own error state holds no failure), so its flush completes. A syncfs
error that no segment of the round reports was another file's (a partition that does not
fsync, or not ours): it is returned for the log, and fails nothing.

The syncfs writes back every dirty page of the file system, the files of partitions that do
not fsync and other programs' included: a log dir is meant to have its disk to itself
(docs/storage.md, "Flush, roll and retention"). Not safe to share between threads.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from broker.errors import StorageError
from broker.log.fsdir import syncfs
from broker.log.partition import PartitionLog
from broker.log.segment import Segment


@dataclass
class RoundResult:
    """What a round did: the logs flushed (their messages now visible), those that were not
    and why (a log whose sync failed has failed; one whose handle could not be opened,
    EMFILE, has not), and the syncfs errors no segment of the round owned."""

    flushed: list[PartitionLog] = field(default_factory=list)
    failed: dict[PartitionLog, StorageError] = field(default_factory=dict)
    file_system_errors: list[OSError] = field(default_factory=list)


class FlushRound:
    """Flushes partition logs together, one syncfs per file system (see the module doc)."""

    def __init__(self) -> None:
        self._file_systems: dict[int, int] = {}
        """st_dev -> a descriptor of a folder there, kept open for syncfs's error reports."""
        self._watched: set[Path] = set()

    def watch(self, directory: Path) -> None:
        """Keep a descriptor of `directory`'s file system for syncfs, if none is kept yet: call
        it before partitions there are written to, so that no writeback error of theirs comes
        before it (OSError as os.open gives it)."""
        if directory in self._watched:
            return
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        device = os.fstat(fd).st_dev
        if device in self._file_systems:
            os.close(fd)
        else:
            self._file_systems[device] = fd
        self._watched.add(directory)

    def close(self) -> None:
        """Release the descriptors `watch` kept."""
        for fd in self._file_systems.values():
            os.close(fd)
        self._file_systems.clear()
        self._watched.clear()

    def flush(self, logs: Iterable[PartitionLog]) -> RoundResult:
        """Flush each of `logs` that has messages pending (LocalLog.flush's rules, each
        log apart): their segments synced together, then their messages made visible."""
        started = time.perf_counter()
        result = RoundResult()
        to_sync: dict[int, list[tuple[PartitionLog, Segment]]] = {}
        ready: list[PartitionLog] = []
        for plog in logs:
            if not plog.local.flush_pending:
                continue
            try:
                segment = plog.local.segment_to_sync()
            except StorageError as error:
                result.failed[plog] = error
                continue
            if segment is None:
                ready.append(plog)
            else:
                to_sync.setdefault(plog.local.device, []).append((plog, segment))
        for device, pairs in to_sync.items():
            fd = self._file_systems.get(device)
            if fd is not None and (len(pairs) > 1 or pairs[0][0].producers.unsynced):
                try:
                    syncfs(fd)
                except OSError as error:
                    failed_before = len(result.failed)
                    ready += self._sync_each(pairs, result)
                    if len(result.failed) == failed_before:
                        result.file_system_errors.append(error)
                    continue
                for plog, segment in pairs:
                    segment.file.synced_by_file_system()
                    plog.producers.synced_by_file_system()
                    ready.append(plog)
            else:
                ready += self._sync_each(pairs, result)
        seconds = time.perf_counter() - started
        for plog in ready:
            plog.local.complete_flush(seconds)
        result.flushed = ready
        return result

    @staticmethod
    def _sync_each(
        pairs: list[tuple[PartitionLog, Segment]], result: RoundResult
    ) -> list[PartitionLog]:
        """fsync each segment on its own, and its log's producer entries; the logs whose sync
        failed fail (noted in `result`). Returns the logs synced."""
        synced = []
        for plog, segment in pairs:
            try:
                segment.file.sync()
                plog.producers.sync()
            except StorageError as error:
                plog.local.fail_flush(error)
                result.failed[plog] = error
                continue
            synced.append(plog)
        return synced

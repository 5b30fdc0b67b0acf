"""A process keeps at most `max_open_files` segment files open, whatever the partitions it
serves: many more partitions than the file descriptor limit append, flush and read."""

from __future__ import annotations

import json
import mmap
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.errors import StorageIOError
from broker.log import iter_messages
from broker.log.files import DEFAULT_MAX_OPEN_FILES, OpenFiles
from broker.log.producers import producers_path
from tests.conftest import FakeClock, synced_paths
from tests.log.test_partition import make_set, open_log, read_all

ROOT = Path(__file__).parents[2]

ROUND_ROBIN = """
import json, os, resource, sys
from pathlib import Path

descriptors, partitions, max_open_files = (int(a) for a in sys.argv[2:5])
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (descriptors, hard))
from broker.log import LogConfig, PartitionLog, encode_message, iter_messages
if max_open_files:
    from broker.log.files import OPEN_FILES
    OPEN_FILES.limit = max_open_files
config = LogConfig(fsync=False, segment_ms=None, retention_ms=None)
root = Path(sys.argv[1])
logs = [PartitionLog.open(root / f"t-{i}", config) for i in range(partitions)]
most = 0
for turn in range(3):
    for i, log in enumerate(logs):
        value = b"%d.%d" % (i, turn)
        offset = log.append(encode_message(value, timestamp_ms=turn))
        log.flush()
        view = log.read(offset, 1000)
        assert [m.value for m in iter_messages(view, offset)] == [value]
        del view
        if i % 97 == 0:
            most = max(most, len(os.listdir("/proc/self/fd")))
for i, log in enumerate(logs):
    expected = [b"%d.%d" % (i, t) for t in range(3)]
    assert [m.value for m in iter_messages(log.read(0, 1000))] == expected
    log.close()
print(json.dumps({"most_open": most}))
"""


def fsynced_files(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths of the files os.fsync is called on from now on (folders left out)."""
    seen: list[str] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if not os.path.isdir(path):
            seen.append(path)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    return seen


@pytest.mark.broker
@pytest.mark.parametrize(
    ("descriptors", "max_open_files"), [(256, 128), (1024, 0)], ids=["limit-256", "defaults"]
)
def test_2000_partitions_append_flush_and_read_round_robin_under_a_low_descriptor_limit(
    tmp_path: Path, descriptors: int, max_open_files: int
) -> None:
    """0: the default max_open_files, under the usual limit of 1,024."""
    run = subprocess.run(
        [sys.executable, "-c", ROUND_ROBIN, str(tmp_path)]
        + [str(n) for n in (descriptors, 2000, max_open_files)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    most_open = json.loads(run.stdout)["most_open"]
    assert most_open <= (max_open_files or DEFAULT_MAX_OPEN_FILES) + 16


def test_the_least_recently_used_handles_are_released_and_reopened_on_demand(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = OpenFiles(limit=4)
    monkeypatch.setattr("broker.log.segment_file.OPEN_FILES", files)
    logs = [open_log(tmp_path / f"t-{i}", clock, fsync=True) for i in range(3)]
    synced = fsynced_files(monkeypatch)
    for i, log in enumerate(logs):
        log.append(make_set(i, 2))
    assert len(files) == 3  # three write handles
    for log in logs:
        read_all(log)  # nothing flushed: nothing mapped
        log.flush()  # the first log's write handle was not released: fsynced through it
        read_all(log)
    assert len(files) == 4  # 3 write handles and 3 mappings, the two oldest released
    assert len(synced) == 3
    for i, log in enumerate(logs):  # the released handles open again
        log.append(make_set(10 + i, 1))
        log.flush()
        values = [m.value[:8] for m in read_all(log)]
        assert values == [b"%08d" % n for n in (i, i + 1, 10 + i)]
    assert len(files) == 4
    for log in logs:
        log.close()
    assert len(files) == 0


def test_a_write_handle_released_before_its_flush_is_fsynced_by_the_flush(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = OpenFiles(limit=1)
    monkeypatch.setattr("broker.log.segment_file.OPEN_FILES", files)
    first, second = (open_log(tmp_path / f"t-{i}", clock, fsync=True) for i in range(2))
    first.append(make_set(0, 1))
    second.append(make_set(0, 1))  # releases the first log's write handle
    synced = fsynced_files(monkeypatch)
    first.flush()
    assert synced == [str(first.segments[-1].log_path)]
    first.close()
    second.close()


def test_a_mapping_a_view_still_uses_is_closed_once_the_view_is_dropped(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = OpenFiles(limit=1)
    monkeypatch.setattr("broker.log.segment_file.OPEN_FILES", files)
    first, second = (open_log(tmp_path / f"t-{i}", clock) for i in range(2))
    for log in (first, second):
        log.append(make_set(0, 3))
        log.close()  # closed segments: reads only map them
    first, second = (open_log(tmp_path / f"t-{i}", clock) for i in range(2))
    view = first.read(0, 1000)
    second.read(0, 1000)  # releases the first log's mapping: a view still uses it
    assert files.kept_aside == 1
    assert [m.value[:8] for m in iter_messages(view)] == [b"%08d" % i for i in range(3)]
    del view
    assert files.kept_aside == 0


def test_a_reopen_that_fails_is_a_storage_io_error(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = OpenFiles(limit=1)
    monkeypatch.setattr("broker.log.segment_file.OPEN_FILES", files)
    first, second = (open_log(tmp_path / f"t-{i}", clock) for i in range(2))
    first.append(make_set(0, 1))
    first.flush()
    second.append(make_set(0, 1))  # releases the first log's write handle
    real_open = os.open

    def no_descriptors(*args: object, **kwargs: object) -> int:
        raise OSError(24, "Too many open files", str(args[0]))

    monkeypatch.setattr(os, "open", no_descriptors)
    with pytest.raises(StorageIOError, match="Too many open files"):
        first.append(make_set(1, 1))
    monkeypatch.setattr(mmap, "mmap", lambda *a, **k: no_descriptors(first.segments[0].log_path))
    with pytest.raises(StorageIOError, match="Too many open files"):
        first.read(0, 1000)
    monkeypatch.setattr(os, "open", real_open)
    assert first.log_end_offset == 100  # the log is as it was
    assert first.append(make_set(1, 1)) == 100
    first.close()
    second.close()


def test_max_open_files_must_be_at_least_1_and_lowering_it_releases_handles() -> None:
    with pytest.raises(ValueError, match="max_open_files must be at least 1, not 0"):
        OpenFiles(limit=0)
    files, released = OpenFiles(limit=3), []

    def release(key: str) -> Callable[[], None]:
        return lambda: released.append(key)

    for key in "abca":  # "a" used again: the most recently used
        files.used(key, release(key))
    files.limit = 1
    assert (released, len(files)) == (["b", "c"], 1)


def test_many_partitions_in_one_process_hold_at_most_the_limit(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = OpenFiles(limit=10)
    monkeypatch.setattr("broker.log.segment_file.OPEN_FILES", files)
    before = len(os.listdir("/proc/self/fd"))
    logs = [open_log(tmp_path / f"t-{i}", clock) for i in range(40)]
    for log in logs:
        log.append(make_set(0, 1))
        log.flush()
        read_all(log)
    assert len(os.listdir("/proc/self/fd")) - before <= 10
    for log in logs:
        log.close()


def test_a_flush_that_cannot_open_its_file_again_does_not_fail_the_log(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = OpenFiles(limit=1)
    monkeypatch.setattr("broker.log.segment_file.OPEN_FILES", files)
    first, second = (open_log(tmp_path / f"t-{i}", clock, fsync=True) for i in range(2))
    first.append(make_set(0, 1))
    second.append(make_set(0, 1))  # releases the first log's write handle, before its flush
    real_open = os.open

    def no_descriptors(*args: object, **kwargs: object) -> int:
        raise OSError(24, "Too many open files", str(args[0]))

    monkeypatch.setattr(os, "open", no_descriptors)
    with pytest.raises(StorageIOError, match="Too many open files"):
        first.flush()  # no fsync was made, none failed: the page cache is still to be trusted
    monkeypatch.setattr(os, "open", real_open)
    assert first.local.failure is None and first.flushed_offset == 0
    first.flush()
    assert first.flushed_offset == 100
    first.close()
    second.close()


def test_idempotent_appends_to_many_partitions_hold_no_more_descriptors_than_the_limit(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each partition's producer-state file took a descriptor of its own for good: 10,000
    # partitions written by idempotent producers needed 10,000, whatever max_open_files said.
    files = OpenFiles(limit=4)
    monkeypatch.setattr("broker.log.segment_file.OPEN_FILES", files)
    monkeypatch.setattr("broker.log.producers.OPEN_FILES", files)
    logs = [open_log(tmp_path / f"t-{i}", clock, fsync=True) for i in range(40)]
    before = len(os.listdir("/proc/self/fd"))
    for turn in range(2):
        for log in logs:
            log.append_idempotent(make_set(turn, 1), 7, 0, turn)
    assert len(os.listdir("/proc/self/fd")) - before <= files.limit + 2
    synced = synced_paths(monkeypatch, os, "fdatasync")
    for log in logs:  # a roll syncs the closed segment's entries, through a handle reopened
        log.roll()
    states = sorted(path for path in synced if path.endswith(".producers"))
    assert states == sorted(str(producers_path(log.directory, 0)) for log in logs)
    for log in logs:
        assert len(log.producers.sets_between(0, 0, log.log_end_offset)) == 2
        log.close()

"""Acks tell the truth about the disk: a real pylogd against disks that fail on purpose.

- fsync fails (EIO): an LD_PRELOAD shim, compiled here with gcc, makes syncfs, and fsync and
  fdatasync of every file or of those the control file names, fail while it exists;
- the disk is full: the log dir is a small tmpfs (mounted here: the tests run as root, as CI
  does) with few bytes and few inodes;
- file descriptors run out: the worker's RLIMIT_NOFILE is lowered with prlimit.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import resource
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq

from broker import protocol
from broker.errors import BrokerError
from broker.log import encode_message
from broker.protocol import Ack, Api
from broker.registry import Registry
from tests.broker.test_pylogd import RawClient, error_of, message_set
from tests.conftest import wait_until
from tests.pylogd import RunningBroker

SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* While the file named by PYLOG_FAULT_FSYNC exists, the disk fails as the kernel reports a lost
   writeback: syncfs fails with EIO (some file of the file system lost data), and so do fsync
   and fdatasync of the files concerned: every file when the control file is empty, else those
   whose path holds the control file's first line. */
static int failing(int fd) {
    const char *control = getenv("PYLOG_FAULT_FSYNC");
    if (control == NULL || access(control, F_OK) != 0) return 0;
    if (fd < 0) return 1;
    char pattern[256] = "", link[64], path[PATH_MAX];
    FILE *f = fopen(control, "r");
    if (f != NULL) {
        if (fgets(pattern, sizeof pattern, f) == NULL) pattern[0] = 0;
        fclose(f);
    }
    pattern[strcspn(pattern, "\n")] = 0;
    if (pattern[0] == 0) return 1;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n < 0) return 0;
    path[n] = 0;
    return strstr(path, pattern) != NULL;
}

int fsync(int fd) {
    static int (*real)(int);
    if (failing(fd)) { errno = EIO; return -1; }
    if (real == NULL) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (failing(fd)) { errno = EIO; return -1; }
    if (real == NULL) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    return real(fd);
}

int syncfs(int fd) {
    static int (*real)(int);
    if (failing(-1)) { errno = EIO; return -1; }
    if (real == NULL) real = (int (*)(int))dlsym(RTLD_NEXT, "syncfs");
    return real(fd);
}
"""


def send_async(
    endpoint: str, context: zmq.Context[zmq.Socket[bytes]], frames: list[bytes]
) -> zmq.Socket[bytes]:
    """Send one request on a DEALER of its own (no reply awaited); returns the socket."""
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    dealer.send_multipart(frames)
    return dealer


def produce_frames(
    topic: str, data: bytes, ack: Ack, correlation_id: int, partition: int = 0
) -> list[bytes]:
    header = protocol.RequestHeader(Api.PRODUCE, 1, correlation_id, "tests")
    request = protocol.ProduceRequest(topic, partition, ack, data)
    return [bytes(f) for f in protocol.encode_request(header, request)]


def produce_when_back(
    client: RawClient, topic: str, data: bytes, partition: int = 0
) -> protocol.ProduceReply:
    """Produce with ack=flushed, retrying while the partition is unavailable (bounded)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return client.produce(topic, partition, data, Ack.FLUSHED)
        except BrokerError as error:
            if not error.retriable or time.monotonic() > deadline:
                raise
        time.sleep(0.05)


# -- fsync fails ------------------------------------------------------------------------------


@pytest.fixture
def fsync_shim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The control file: while it exists, syncfs and fsync fail with EIO in processes started
    after this (LD_PRELOAD is set in the environment the test's pylogd inherits); fsync of
    the files whose path holds its first line only, if it has one (SHIM)."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is needed to build the fsync fault shim")
    source = tmp_path / "fsync_shim.c"
    source.write_text(SHIM)
    library = tmp_path / "fsync_shim.so"
    subprocess.run([gcc, "-shared", "-fPIC", "-o", str(library), str(source), "-ldl"], check=True)
    control = tmp_path / "fail-fsync"
    monkeypatch.setenv("LD_PRELOAD", str(library))
    monkeypatch.setenv("PYLOG_FAULT_FSYNC", str(control))
    return control


def test_a_failed_fsync_answers_storage_error_and_the_partition_recovers_from_disk(
    fsync_shim: Path, make_pylogd: Callable[..., RunningBroker], tmp_path: Path
) -> None:
    broker = make_pylogd(
        "--broker-log-dirs", str(tmp_path / "logs"), "--log-flush-interval-ms", "50"
    )
    client = RawClient(broker.endpoint)
    try:
        client.create("fsynced", 1)
        kept = message_set(0, 3)
        assert client.produce("fsynced", 0, kept, Ack.FLUSHED).base_offset == 0
        (worker,) = broker.worker_pids()

        fsync_shim.touch()  # the disk starts failing
        waiting = send_async(
            broker.endpoint,
            client.context,
            produce_frames("fsynced", message_set(3, 2), Ack.FLUSHED, 77),
        )
        assert waiting.poll(10_000), "the producer waiting on ack=flushed got no reply"
        header = protocol.decode_reply_header(waiting.recv_multipart())
        assert header.correlation_id == 77
        assert protocol.ErrorCode(header.error_code).name == "STORAGE_ERROR"
        waiting.close()

        # offline while the disk fails: a clear, retriable answer, and no spinning
        wait_until(
            lambda: broker.log_path.read_text().count("recovery of fsynced-0 failed") >= 3,
            20,
            "three recovery attempts, backing off",
        )
        for call in (
            lambda: client.produce("fsynced", 0, message_set(5, 1), Ack.FLUSHED),
            lambda: client.fetch("fsynced", 0, 0),
        ):
            with pytest.raises(BrokerError) as raised:
                call()
            assert raised.value.name == "PARTITION_UNAVAILABLE"
            assert "fsync" in raised.value.message
        # backing off, not spinning: each attempt waits twice the last (broker.flusher)
        logged = broker.log_path.read_text()
        waits = re.findall(r"recovery of fsynced-0 failed .*; next attempt in ([\d.]+) s", logged)
        assert waits[:3] == ["0.1", "0.2", "0.4"], broker.log_tail()
        assert broker.log_path.read_text().count("fsynced-0") < 60, broker.log_tail()

        fsync_shim.unlink()  # the disk works again: the partition comes back from the disk
        after = message_set(10, 2)
        assert produce_when_back(client, "fsynced", after).base_offset == len(kept)
        assert client.read_all("fsynced", 0) == kept + after  # the failed set never visible
        assert broker.worker_pids() == [worker]
        client.close()
        assert broker.stop() == 0
        broker = broker.restarted()
        client = RawClient(broker.endpoint)
        assert client.read_all("fsynced", 0) == kept + after
    finally:
        client.close()
        with contextlib.suppress(Exception):
            broker.stop()


def test_a_flush_round_whose_sync_fails_on_one_partition_fails_that_one_alone(
    fsync_shim: Path, make_pylogd: Callable[..., RunningBroker], tmp_path: Path
) -> None:
    # Two partitions of one worker flushed in a round (one syncfs); the disk loses split-1's
    # writeback: its producer is told STORAGE_ERROR and it goes offline, while split-0's
    # producer is acked and split-0 goes on serving (its own fsync reports no loss).
    broker = make_pylogd("--broker-log-dirs", str(tmp_path / "logs"))
    client = RawClient(broker.endpoint)
    try:
        client.create("split", 2)
        kept = [message_set(0, 2), message_set(10, 2)]
        for partition in (0, 1):
            assert client.produce("split", partition, kept[partition], Ack.FLUSHED).base_offset == 0
        fsync_shim.write_text("split-1\n")  # the disk starts losing split-1's writes
        waiting = [
            send_async(
                broker.endpoint,
                client.context,
                produce_frames("split", message_set(20 + p, 1), Ack.FLUSHED, 80 + p, p),
            )
            for p in (0, 1)
        ]
        answers = {}
        for dealer in waiting:
            assert dealer.poll(10_000), "a producer waiting on ack=flushed got no reply"
            header = protocol.decode_reply_header(dealer.recv_multipart())
            answers[header.correlation_id] = protocol.ErrorCode(header.error_code).name
            dealer.close()
        assert answers == {80: "NONE", 81: "STORAGE_ERROR"}
        more = message_set(30, 3)
        assert client.produce("split", 0, more, Ack.FLUSHED).base_offset > 0  # still served
        assert client.read_all("split", 0) == kept[0] + message_set(20, 1) + more
        with pytest.raises(BrokerError) as raised:
            client.fetch("split", 1, 0)
        assert raised.value.name == "PARTITION_UNAVAILABLE"

        fsync_shim.unlink()  # the disk works again: split-1 comes back, without the lost set
        after = message_set(40, 1)
        assert produce_when_back(client, "split", after, 1).base_offset == len(kept[1])
        assert client.read_all("split", 1) == kept[1] + after
    finally:
        client.close()
        with contextlib.suppress(Exception):
            broker.stop()


# -- the disk is full -------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """mount(options): a tmpfs of its own under tmp_path (`size=`, `nr_inodes=`), unmounted at
    the end. Skips when mounting is not allowed (it needs root; CI runs as root)."""
    mounted: list[Path] = []

    def mount(options: str) -> Path:
        target = tmp_path / f"disk-{len(mounted)}"
        target.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip()}")
        mounted.append(target)
        return target

    yield mount
    for target in mounted:
        subprocess.run(["umount", "-l", str(target)], check=False)


def fill_inodes(directory: Path, limit: int = 10_000) -> list[Path]:
    """Create empty files in `directory` until the file system has no inode left."""
    directory.mkdir()
    made: list[Path] = []
    for i in range(limit):
        path = directory / f"f{i}"
        try:
            path.touch()
        except OSError as error:
            assert error.errno == errno.ENOSPC, error
            return made
        made.append(path)
    raise AssertionError(f"{limit} files and still room for more")


def fill_space(path: Path) -> None:
    """Write zeros to `path` until the file system is full."""
    chunk = b"\0" * 65536
    with open(path, "wb", buffering=0) as f:
        for _ in range(100_000):
            try:
                f.write(chunk)
            except OSError as error:
                assert error.errno == errno.ENOSPC, error
                return
    raise AssertionError("the disk never filled")


def big_set(count: int, size: int = 1000) -> bytes:
    return b"".join(encode_message(b"%06d" % i + b"x" * size) for i in range(count))


def topic_names(client: RawClient) -> set[str]:
    reply = client.call(Api.METADATA, protocol.MetadataRequest(()))
    assert isinstance(reply, protocol.MetadataReply)
    return {t.topic for t in reply.topics}


def test_deleting_a_topic_on_a_full_disk_frees_its_space(
    small_disk: Callable[[str], Path], make_pylogd: Callable[..., RunningBroker]
) -> None:
    disk = small_disk("size=2m")
    broker = make_pylogd(
        "--broker-log-dirs",
        str(disk / "logs"),
        "--log-segment-bytes",
        str(256 * 1024),
        "--log-max-message-bytes",
        str(256 * 1024),
    )
    client = RawClient(broker.endpoint)
    try:
        client.create("filler", 1)
        for _ in range(200):  # ~50 KB a set: the 2 MiB disk fills within 41
            with contextlib.suppress(BrokerError):
                client.produce("filler", 0, big_set(50), Ack.FLUSHED)
                continue
            break
        for _ in range(20):
            assert error_of(lambda: client.produce("filler", 0, big_set(50), Ack.FLUSHED)) == (
                "DISK_FULL"
            )
        logged = broker.log_path.read_text().count("No space left on device")
        assert 1 <= logged <= 3, "DISK_FULL is logged, at most once every 5 s"
        (worker,) = broker.worker_pids()
        free_before = shutil.disk_usage(disk).free
        client.call(Api.DELETE_TOPIC, protocol.DeleteTopicRequest("filler"))
        wait_until(lambda: not (disk / "logs" / "filler-0").exists(), 10, "the folder removed")
        assert shutil.disk_usage(disk).free > free_before + 1_500_000
        assert broker.worker_pids() == [worker], "the worker died deleting the topic"
        assert "filler" not in topic_names(client)
        client.close()
        assert broker.stop() == 0
        broker = broker.restarted()  # and it is not adopted from a folder left behind
        client = RawClient(broker.endpoint)
        assert "filler" not in topic_names(client)
        assert not (disk / "logs" / "filler-0").exists()
    finally:
        client.close()
        with contextlib.suppress(Exception):
            broker.stop()


def test_a_roll_that_finds_no_room_for_its_new_segment_answers_disk_full(
    small_disk: Callable[[str], Path], make_pylogd: Callable[..., RunningBroker]
) -> None:
    disk = small_disk("size=4m,nr_inodes=64")
    broker = make_pylogd(
        "--broker-log-dirs",
        str(disk / "logs"),
        "--log-segment-bytes",
        "4000",
        "--log-max-message-bytes",
        "4000",
    )
    client = RawClient(broker.endpoint)
    try:
        client.create("rolling", 1)
        first, second = big_set(3), big_set(2)  # ~3 KB, then ~2 KB: the second set rolls
        client.produce("rolling", 0, first, Ack.FLUSHED)
        fillers = fill_inodes(disk / "fillers")
        fillers.pop().unlink()  # one inode left: the sealed segment's index takes it
        (worker,) = broker.worker_pids()
        with pytest.raises(BrokerError) as raised:
            client.produce("rolling", 0, second, Ack.FLUSHED)
        assert raised.value.name == "DISK_FULL"
        assert "No space left on device" in raised.value.message
        assert broker.worker_pids() == [worker]
        for path in fillers:
            path.unlink()
        assert client.produce("rolling", 0, second, Ack.FLUSHED).base_offset == len(first)
        assert client.read_all("rolling", 0) == first + second
    finally:
        client.close()


def test_a_topic_whose_partition_cannot_be_created_is_not_created(
    small_disk: Callable[[str], Path], make_pylogd: Callable[..., RunningBroker]
) -> None:
    disk = small_disk("size=4m,nr_inodes=64")
    broker = make_pylogd("--broker-log-dirs", str(disk / "logs"))
    client = RawClient(broker.endpoint)
    try:
        fillers = fill_inodes(disk / "fillers")
        with pytest.raises(BrokerError) as raised:
            client.create("nowhere", 2)
        assert raised.value.name == "DISK_FULL"
        assert "nowhere-" in raised.value.message
        assert "No space left on device" in raised.value.message
        assert "nowhere" not in topic_names(client)
        assert error_of(lambda: client.produce("nowhere", 0, big_set(1), Ack.FLUSHED)) == (
            "UNKNOWN_TOPIC_OR_PARTITION"
        )
        for path in fillers:
            path.unlink()
        client.create("nowhere", 2)  # with room again, the same create works
        for number in (0, 1):
            assert client.produce("nowhere", number, big_set(1), Ack.FLUSHED).base_offset == 0
    finally:
        client.close()


# -- file descriptors run out -----------------------------------------------------------------


def test_running_out_of_file_descriptors_answers_storage_error_with_the_reason(
    make_pylogd: Callable[..., RunningBroker], tmp_path: Path
) -> None:
    broker = make_pylogd("--broker-log-dirs", str(tmp_path / "logs"))
    client = RawClient(broker.endpoint)
    try:
        (worker,) = broker.worker_pids()
        in_use = len(os.listdir(f"/proc/{worker}/fd"))
        resource.prlimit(worker, resource.RLIMIT_NOFILE, (in_use + 6, in_use + 6))
        failure: BrokerError | None = None
        for i in range(50):  # each partition written and read holds two descriptors
            try:
                client.create(f"fd{i}", 1)
                client.produce(f"fd{i}", 0, big_set(1), Ack.FLUSHED)
                client.read_all(f"fd{i}", 0)
            except BrokerError as error:
                failure = error
                break
        assert failure is not None, "50 partitions and descriptors left"
        assert failure.name == "STORAGE_ERROR", failure
        assert "Too many open files" in failure.message
        # the partitions opened before still take writes, the worker still serves
        assert client.produce("fd0", 0, big_set(1), Ack.FLUSHED).base_offset > 0
        assert broker.worker_pids() == [worker]
    finally:
        client.close()


def test_a_partition_that_cannot_be_opened_at_start_is_listed_with_its_error(
    make_pylogd: Callable[..., RunningBroker],
    make_registry: Callable[..., Registry],
    tmp_path: Path,
) -> None:
    logs = tmp_path / "logs"
    broker = make_pylogd("--broker-log-dirs", str(logs))
    client = RawClient(broker.endpoint)
    try:
        client.create("blocked", 2)
        stored = big_set(1)
        client.produce("blocked", 1, stored, Ack.FLUSHED)
        client.close()
        assert broker.stop() == 0
        shutil.rmtree(logs / "blocked-0")
        (logs / "blocked-0").write_text("not a folder")  # its folder cannot be made
        broker = broker.restarted()
        client = RawClient(broker.endpoint)

        def codes() -> list[str]:
            reply = client.call(Api.METADATA, protocol.MetadataRequest(("blocked",)))
            assert isinstance(reply, protocol.MetadataReply)
            return [protocol.ErrorCode(p.error_code).name for p in reply.topics[0].partitions]

        # PARTITION_UNAVAILABLE while its worker opens it (never NONE before it said so)
        wait_until(lambda: "PARTITION_UNAVAILABLE" not in codes(), 30, "the partitions opened")
        assert codes() == ["STORAGE_ERROR", "NONE"]
        with pytest.raises(BrokerError) as raised:
            client.produce("blocked", 0, big_set(1), Ack.FLUSHED)
        assert raised.value.name == "STORAGE_ERROR"
        assert "blocked-0" in raised.value.message
        assert client.read_all("blocked", 1) == stored  # the other one is served
        # ZooKeeper says so too: a partition is registered as served once its worker opened it
        registry = make_registry()
        wait_until(
            lambda: registry.topics.topic_brokers("blocked") == {0: (1,)}, 30, "registration"
        )
    finally:
        client.close()
        with contextlib.suppress(Exception):
            broker.stop()

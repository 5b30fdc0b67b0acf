"""Fixtures for several brokers sharing the session's ZooKeeper, and for group members that
join through the brokers' group coordinator."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from broker.client.group import GroupConsumer
from broker.client.records import BrokerPartition, Record
from tests.pylogd import RunningBroker
from tests.pylogd import broker_flags as broker_flags  # imported from here too


def bootstrap(brokers: Iterable[RunningBroker]) -> str:
    """The endpoints of `brokers`, comma-separated: a client's bootstrap list."""
    return ",".join(broker.endpoint for broker in brokers)


@pytest.fixture
def three_brokers(make_pylogd: Callable[..., RunningBroker], tmp_path: Path) -> list[RunningBroker]:
    """Brokers 1, 2 and 3 of one cluster (one ZooKeeper chroot)."""
    return [make_pylogd(*broker_flags(tmp_path, i), name=f"broker-{i}") for i in (1, 2, 3)]


class PrintingMember:
    """A group member in a child process (`argv`) that prints a JSON line a record; the
    values it printed, as read."""

    def __init__(self, member_id: str, argv: list[str]) -> None:
        self.id = member_id
        self.process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.values: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.values.append(json.loads(line)["value"])

    def stop(self, signum: int = signal.SIGTERM) -> str:
        """Send `signum` (unless it exited), reap it (SIGKILL after 30 s): its stderr."""
        if self.process.poll() is None:
            self.process.send_signal(signum)
        try:
            _, stderr = self.process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            _, stderr = self.process.communicate(timeout=30)
        self.reader.join(10)
        return stderr


P = TypeVar("P", bound=PrintingMember)


@contextlib.contextmanager
def printing_members(kind: Callable[..., P]) -> Iterator[Callable[..., P]]:
    """A starter of `kind(*args)` members in child processes: each started is stopped at the
    end (SIGTERM, reaped) and its stderr's tail printed, for the test's log."""
    started: list[P] = []

    def start(*args: str) -> P:
        started.append(kind(*args))
        return started[-1]

    try:
        yield start
    finally:
        for member in started:
            print(f"--- member {member.id} stderr:\n{member.stop()[-3000:]}")


@dataclass
class Member:
    """A GroupConsumer polled by a thread of its own until stopped; what it received and when
    its assignments changed (`revoked`: taken away, or lost), with time.monotonic() stamps."""

    consumer: GroupConsumer
    records: list[tuple[float, Record]] = field(default_factory=list)
    assigned: list[tuple[float, frozenset[BrokerPartition]]] = field(default_factory=list)
    revoked: list[tuple[float, frozenset[BrokerPartition]]] = field(default_factory=list)
    error: BaseException | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                for record in self.consumer.poll(100):
                    self.records.append((time.monotonic(), record))
            if self.consumer.connected:
                self.consumer.commit()  # the last poll's records are processed too
        except BaseException as error:  # reported by the test through `error`
            self.error = error

    def values(self) -> list[bytes]:
        return [record.value for _, record in self.records]

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(30)
        self.consumer.close()


@pytest.fixture
def make_member() -> Iterator[Callable[..., Member]]:
    """Start group members polling in threads; all are closed at the end of the test.
    `make(broker, group, topics, **options)` is GroupConsumer's signature: the member joins
    through the group's coordinator, found through `broker` ("host:port" of the cluster's
    brokers, comma-separated), with a 2 s session and auto-commits every 0.2 s by default."""
    members: list[Member] = []

    def make(broker: str, group: str, topics: list[str], **options: Any) -> Member:
        member: Member
        options.setdefault("session_timeout_s", 2.0)
        options.setdefault("auto_commit_interval_s", 0.2)
        consumer = GroupConsumer(
            broker,
            group,
            topics,
            on_assigned=lambda tps: member.assigned.append((time.monotonic(), tps)),
            on_revoked=lambda tps: member.revoked.append((time.monotonic(), tps)),
            **options,
        )
        member = Member(consumer)
        member.thread = threading.Thread(target=member.run, daemon=True)
        member.thread.start()
        members.append(member)
        return member

    yield make
    for member in members:
        member.close()
    for member in members:
        assert member.error is None, f"{member.consumer.consumer_id}: {member.error!r}"

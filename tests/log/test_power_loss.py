"""Power cuts under load: pylogd runs under the shim of tests/log/powerloss.c, which keeps track
of every write its log dirs have not fsynced and every directory entry not made durable;
producers send at ack=flushed; then every process is killed at once and the disk put back as a
power loss leaves it (every other cut the strictest state, the others a state drawn: zero
tails, pages half written, entries committed up to a point). After each of 20 cuts the broker
starts again on what is left: every message ever acknowledged is there, in the order
acknowledged, and every message read is whole (no checksum fails, no offset is given twice)."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.client import Admin
from broker.client.connection import Connection
from broker.errors import PylogError
from broker.log import encode_message, iter_messages
from broker.protocol import LATEST, Ack, FetchRequest, OffsetsRequest, ProduceRequest
from perf.cpu import tree_pids
from tests.conftest import wait_until
from tests.log import powerloss
from tests.pylogd import RunningBroker

CUTS = 20
BATCH = 10


class Producer(threading.Thread):
    """Sends batches of BATCH messages ("<partition>:<n>") to one partition at ack=flushed,
    one at a time, until `stop` is set or a request fails (the power is cut); `acked` holds
    the numbers of the messages acknowledged, in order."""

    def __init__(self, endpoint: str, topic: str, partition: int, first: int) -> None:
        super().__init__(daemon=True)
        self.endpoint, self.topic, self.partition = endpoint, topic, partition
        self.next = first
        self.acked: list[int] = []
        self.stop = threading.Event()

    def run(self) -> None:
        with Connection(self.endpoint, timeout_s=2.0) as connection:
            while not self.stop.is_set():
                numbers = range(self.next, self.next + BATCH)
                message_set = b"".join(
                    encode_message(f"{self.partition}:{n}".encode()) for n in numbers
                )
                try:
                    connection.request(
                        ProduceRequest(self.topic, self.partition, Ack.FLUSHED, message_set)
                    )
                except PylogError:
                    return
                self.acked.extend(numbers)
                self.next += BATCH


def read_all(endpoint: str, topic: str, partition: int) -> list[int]:
    """The numbers of every message of the partition, from its start to its end (every
    message's checksum checked on the way)."""
    numbers = []
    with Connection(endpoint, timeout_s=10.0) as connection:
        end = connection.request(OffsetsRequest(topic, partition, LATEST)).offset
        offset = 0
        while offset < end:
            reply = connection.request(FetchRequest(topic, partition, offset, 1 << 20, 0, 0))
            assert len(reply.message_set) > 0, f"nothing at {offset} below the end {end}"
            for message in iter_messages(bytes(reply.message_set), offset):
                owner, number = message.value.decode().split(":")
                assert int(owner) == partition
                numbers.append(int(number))
                offset = message.next_offset
    return numbers


@pytest.mark.slow  # ~1 minute each: 20 starts of pylogd, each after a power cut
@pytest.mark.parametrize(
    "partitions",
    [
        pytest.param(2, id="a-partition-a-worker"),  # a flush round fdatasyncs its one segment
        pytest.param(4, id="two-a-worker"),  # a round of two segments: one syncfs for both
    ],
)
def test_every_acknowledged_message_survives_twenty_power_cuts(
    make_pylogd: Callable[..., RunningBroker],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    partitions: int,
) -> None:
    disk = tmp_path / "disk"  # the log dirs: what the power cut reaches (not pylogd's own log)
    journal = tmp_path / "journal"
    library = powerloss.build(tmp_path)
    for name, value in powerloss.environment(library, disk, journal).items():
        monkeypatch.setenv(name, value)  # for every pylogd started from here on
    broker = make_pylogd(
        "--broker-log-dirs", f"{disk / 'a'},{disk / 'b'}", "--log-flush-interval-ms", "50"
    )
    small = {"segment_bytes": "2048", "max_message_bytes": "1024"}  # rolls, indexes
    with Admin(broker.endpoint) as admin:
        admin.create_topic("power", partitions, small)
    acked: dict[int, list[int]] = {p: [] for p in range(partitions)}
    chance = random.Random(27)
    restored = 0
    for cut in range(CUTS):
        producers = [
            Producer(broker.endpoint, "power", p, (max(acked[p], default=-1) + 1) + 100_000 * cut)
            for p in range(partitions)
        ]
        for producer in producers:
            producer.start()
        target = chance.randrange(20, 200)

        def enough(producers: list[Producer] = producers, target: int = target) -> bool:
            return sum(len(p.acked) for p in producers) >= target

        wait_until(enough, timeout=60, what=f"{target} messages acknowledged before cut {cut}")
        assert broker.process is not None
        powerloss.kill_all(tree_pids(broker.process.pid))  # the power goes: in the middle of it
        broker.process.wait()
        for producer in producers:
            producer.stop.set()
            producer.join(timeout=30)
            assert not producer.is_alive()
            acked[producer.partition].extend(producer.acked)
        # every other cut the strictest state (all not made durable lost), else one drawn
        restored += powerloss.cut(disk, journal, chance if cut % 2 else None)
        broker = broker.restarted()
        for partition in range(partitions):
            numbers = read_all(broker.endpoint, "power", partition)
            assert len(numbers) == len(set(numbers)), f"cut {cut}: a message read twice"
            kept, sent = set(numbers), set(acked[partition])
            lost = [n for n in acked[partition] if n not in kept]
            assert not lost, f"cut {cut}: partition {partition} lost acknowledged {lost[:10]}"
            order = [n for n in numbers if n in sent]
            assert order == acked[partition], f"cut {cut}: acknowledged messages out of order"
    assert restored > 0  # the cuts changed files: writes not yet fsynced were dropped
    total = sum(len(numbers) for numbers in acked.values())  # docs/storage.md quotes these
    print(f"{CUTS} cuts, {total} acknowledged, 0 lost, {restored} files and entries put back")

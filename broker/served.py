"""What the parts of a worker share (broker.worker): the partitions it serves, and what it owes
the supervisor. The parts are the worker itself (the loop, PRODUCE, the supervisor's
commands), broker.flusher (flushes, failed disks), broker.reads (FETCH, OFFSETS,
DESCRIBE_PARTITION, OFFSET_FOR_LEADER_EPOCH) and broker.leadership (leading and following
replicated partitions). All of it runs on the worker's trio loop: not safe to share between
threads.

Replies and STATE messages made where nothing may be sent (the acks a flush gives, an ISR
change to ask for) are handed to `owe` and put in `state_messages`, and wait until
`send_owed`, which the loop and the tasks that made them call.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import trio

from broker.clock import Clock
from broker.errors import PartitionUnavailable, UnknownTopicOrPartition
from broker.log.message import Buffer
from broker.partition import Partition
from broker.ratelog import RateLimitedLog
from broker.replication.replica import Reply
from broker.transport import replies_message
from broker.trio_socket import TrioSocket

log = logging.getLogger("pylog.worker")

STORAGE_LOG_EVERY_S = 5.0


class Served:
    """The partitions of worker `index`, its socket to the supervisor, and its clock."""

    def __init__(self, index: int, socket: TrioSocket[list[bytes]], clock: Clock) -> None:
        self.index = index
        self.socket = socket
        self.clock = clock
        """The worker's one clock: its parts' times (leases, acks, ISR lags, fetch sessions,
        flush deadlines) are all read off it. Its monotonic() is the machine's in a broker:
        the supervisor's leases are on that."""
        self.partitions: dict[tuple[str, int], Partition] = {}
        self._replies: list[Reply] = []
        """Replies made where nothing may be sent (`owe`), sent by send_owed."""
        self.state_messages: list[list[bytes]] = []
        """STATE messages for the supervisor made where nothing may be sent (ISR changes to
        ask for), sent by send_owed."""
        self.nursery: trio.Nursery | None = None
        """The worker's, once it serves: tasks of its parts (long polls, copy loops, reopens)."""
        self.storage_log = RateLimitedLog(log, STORAGE_LOG_EVERY_S)
        """Storage errors, logged at most once per STORAGE_LOG_EVERY_S per kind."""

    def get(self, topic: str, number: int) -> Partition:
        """The partition, if served: UnknownTopicOrPartition if not here, PartitionUnavailable
        while it is offline."""
        try:
            partition = self.partitions[(topic, number)]
        except KeyError:
            raise UnknownTopicOrPartition(
                f"partition {number} of topic {topic!r} is not on this broker"
            ) from None
        if partition.offline is not None:
            raise PartitionUnavailable(
                f"{partition.name} is offline after {partition.offline}; it is being reopened "
                "from the disk: retry shortly"
            )
        return partition

    def still_open(self, partition: Partition) -> bool:
        """Whether `partition` is still served here (not deleted, the worker not closing)."""
        return self.partitions.get((partition.topic, partition.number)) is partition

    async def reply(self, tagged: bytes, frames: Sequence[Buffer]) -> None:
        await self.socket.send([tagged, *frames])

    def owe(self, replies: list[Reply]) -> None:
        """Send `replies` with the next send_owed: the one way the parts hand the worker the
        answers a Replica gives (acks a flush or the high watermark gives, failures)."""
        self._replies += replies

    @property
    def owing(self) -> bool:
        """Whether send_owed has anything to send."""
        return bool(self._replies or self.state_messages)

    async def send_owed(self) -> None:
        """Send the replies made where nothing could be sent, as one REPLIES message (a hundred
        acks of one flush cost the worker one send and the supervisor one receive), then the
        STATE messages."""
        replies, self._replies = self._replies, []
        if replies:
            await self.socket.send(replies_message(replies))
        messages, self.state_messages = self.state_messages, []
        for message in messages:
            await self.socket.send(message)

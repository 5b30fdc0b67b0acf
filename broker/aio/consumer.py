"""A consumer of one partition on asyncio: broker.client.PartitionConsumer's rules, awaited.

Where it starts, the position, the fetch size grown to the message there, and damaged data
(CorruptSegment, or with `skip_corrupt` logged, listed in `skipped` and read past) are
broker.client.consumer's (PartitionReader). It does not fetch ahead: another task can run
while a fetch waits.

`async for message in consumer` yields messages for ever (or to the high watermark with
`stop_at_end`). The position moves past a fetch's messages when the fetch returns, as the sync
consumer's does; a cancelled fetch (task.cancel(), asyncio.timeout) leaves it where it was.

Not safe to share between event loops (or threads).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import cast

from broker.aio.connection import AsyncCluster
from broker.client.cluster import partition_of
from broker.client.consumer import DEFAULT_FETCH_BYTES, MAX_FETCH_BYTES, PartitionReader, Start
from broker.client.framing import DEFAULT_CLIENT_ID, wait_ms
from broker.errors import BrokerError
from broker.lifecycle import AsyncClosing
from broker.log.message import Message
from broker.protocol import OffsetsRequest
from broker.security import ClientKeys


class AsyncPartitionConsumer(PartitionReader, AsyncClosing):
    """Read partition `partition` of `topic` from the broker that holds it, found through
    `endpoint`, on asyncio. Settings as broker.client.PartitionConsumer's (`keys` reach
    brokers serving CurveZMQ). It connects, and finds its start, on first use (`async with`,
    the first `poll` or step of `async for`); `cluster`, when given, is used instead of one of
    its own, and `close()` leaves it open."""

    def __init__(
        self,
        endpoint: str,
        topic: str,
        partition: int = 0,
        start: Start = "earliest",
        fetch_bytes: int = DEFAULT_FETCH_BYTES,
        max_wait_ms: int = 500,
        max_fetch_bytes: int = MAX_FETCH_BYTES,
        stop_at_end: bool = False,
        retries: int = 5,
        client_id: str = DEFAULT_CLIENT_ID,
        timeout_s: float = 10.0,
        skip_corrupt: bool = False,
        cluster: AsyncCluster | None = None,
        *,
        keys: ClientKeys | None = None,
    ) -> None:
        super().__init__(
            topic,
            partition,
            fetch_bytes,
            max_wait_ms,
            max_fetch_bytes,
            stop_at_end,
            retries,
            skip_corrupt,
        )
        self._start = start
        self._start_at = self._start_time(start)  # a bad start is a ValueError here
        self._own_cluster = cluster is None
        self.cluster = (
            AsyncCluster(endpoint, client_id, timeout_s, retries, keys=keys)
            if cluster is None
            else cluster
        )
        self._opened = False

    async def _connected(self) -> None:
        """On first use: check that the partition exists, and find the start."""
        if not self._opened:
            partition_of(await self.cluster.partitions(self.topic), self.topic, self.partition)
            if self._start_at is None:
                self._position = cast(int, self._start)
            else:
                self._position = await self._offset_for_time(self._start_at)
            self._opened = True

    async def offset_for_time(self, time: int) -> int:
        """OFFSETS: the offset for `time` (EARLIEST, LATEST, or ms since the epoch), from the
        partition's leader (AsyncCluster.call_leader)."""
        await self._connected()
        return await self._offset_for_time(time)

    async def _offset_for_time(self, time: int) -> int:
        request = OffsetsRequest(self.topic, self.partition, time)
        return (await self.cluster.call_leader(request, self.retries)).offset

    async def poll(self, max_wait_ms: int | None = None) -> list[Message]:
        """One fetch from the position: the messages there, waiting up to `max_wait_ms`
        (default the consumer's) for one to arrive; advances the position past them. The
        fetch goes to the partition's leader and follows leadership when it moves
        (AsyncCluster.call_leader). TypeError for a float `max_wait_ms`."""
        wait = wait_ms(max_wait_ms, self.max_wait_ms)
        await self._connected()
        while True:
            try:
                request = self._request(self._position, wait)
                reply = await self.cluster.call_leader(request, self.retries)
            except BrokerError as error:
                skipped = self._fetch_failed(error)
                if skipped is not None:
                    return skipped
                continue
            return self._take(reply)

    async def __aiter__(self) -> AsyncIterator[Message]:
        """Messages from the position on, waiting for new ones; with `stop_at_end`, until the
        position reaches the high watermark (fetches then do not wait)."""
        while True:
            wait = 0 if self.stop_at_end else self.max_wait_ms
            for message in await self.poll(wait):
                yield message
            if self.stop_at_end and self.at_end:
                return

    async def open(self) -> None:
        """Connect, and find the start."""
        await self._connected()

    async def close(self) -> None:
        if self._own_cluster:
            await self.cluster.close()

"""The copy of one partition: the source's bytes appended in order to the same partition of the
target, so that every message has the same offset on both clusters (docs/mirror.md).

A `PartitionCopy` reads where the target stands (its leader's log start and high watermark,
once nothing is pending above the high watermark), then fetches the source from there and sends
each fetched message set as it is in one PRODUCE (ack all by default), one at a time, the next
FETCH already on its way. Every ack says where the set landed: anything but the offset it was
fetched from means another writer (or a cut) on the target, and the copy stops there
(`Diverged`) rather than go on at shifted offsets. Any other failure (a leader change, no
reply, a broker down on either side) makes it read where the target stands again and go on
from there: a set appended but not acknowledged is then either in the target (past it) or not
(sent again).

An empty target partition starts where the source's log starts (`start_target`, which writes
the target topic's `log_starts` in its registry): the source's offsets from the first byte.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from broker.aio.connection import AsyncCluster
from broker.backoff import Backoff
from broker.client.framing import retriable
from broker.client.retention import RetentionForecast
from broker.errors import (
    BrokerError,
    BrokerOffsetOutOfRange,
    BrokerUnknownTopicOrPartition,
    PylogError,
    Unavailable,
)
from broker.log.message import Buffer, timestamp_at
from broker.mirror.config import MirrorSettings
from broker.protocol import (
    EARLIEST,
    LATEST,
    DescribePartitionRequest,
    FetchReply,
    FetchRequest,
    OffsetsRequest,
    ProduceRequest,
)

log = logging.getLogger(__name__)

RETRY_BACKOFF_S = 0.2
MAX_RETRY_BACKOFF_S = 5.0
SETTLE_S = 30.0
"""How long the target's leader gets to settle (its log end reaching its high watermark)
before the copy gives up this round and tries again."""


_ASKED_AGAIN = (BrokerOffsetOutOfRange, BrokerUnknownTopicOrPartition)
"""Errors not retriable for a client, after which the copy reads where it stands again."""


class Diverged(PylogError):
    """The target partition does not hold the source's bytes at the source's offsets, or
    cannot go on to: the copy of the partition stops (docs/mirror.md says what to do)."""


@dataclass(slots=True)
class CopyProgress:
    """Where one partition's copy stands (what the progress line, `pylogctl mirror describe`
    and the metrics read)."""

    topic: str
    partition: int
    position: int | None = None
    """The next offset to copy: the target's high watermark, as the last ack left it."""
    source_high_watermark: int | None = None
    copied_bytes: int = 0
    copied_messages: int = 0
    next_timestamp_ms: int | None = None
    """The timestamp of the first message fetched and not yet copied (None: caught up)."""
    stopped: str | None = None
    """Why the copy stopped (Diverged, or an error no retry mends), or None while it runs."""
    retention: RetentionForecast | None = None
    """When retention at the source deletes the next message to copy, as last asked (None:
    not asked yet, or the source's leader could not say: Mirror._watch_retention)."""

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    @property
    def lag_bytes(self) -> int | None:
        if self.position is None or self.source_high_watermark is None:
            return None
        return max(0, self.source_high_watermark - self.position)

    def lag_seconds(self, now_ms: float) -> float:
        """The age of the oldest message not copied yet (0 when caught up)."""
        if self.next_timestamp_ms is None or not self.lag_bytes:
            return 0.0
        return max(0.0, (now_ms - self.next_timestamp_ms) / 1000)


class PartitionCopy:
    """Copies partition `partition` of `topic` from `source` to `target` for as long as it
    runs (`run`); `start_target(offset)` makes the (empty) target partition's log start at
    `offset`, returning once its registry holds it."""

    def __init__(
        self,
        source: AsyncCluster,
        target: AsyncCluster,
        topic: str,
        partition: int,
        settings: MirrorSettings,
        fetch_max_bytes: int,
        start_target: Callable[[int], Awaitable[None]],
    ) -> None:
        self.source = source
        self.target = target
        self.settings = settings
        self.fetch_max_bytes = fetch_max_bytes
        self.start_target = start_target
        self.progress = CopyProgress(topic, partition)

    @property
    def topic(self) -> str:
        return self.progress.topic

    @property
    def partition(self) -> int:
        return self.progress.partition

    async def run(self) -> None:
        """Copy until cancelled or stopped (`progress.stopped` says why: logged at ERROR)."""
        backoff = Backoff(RETRY_BACKOFF_S, MAX_RETRY_BACKOFF_S)
        while True:
            before = self.progress.copied_bytes
            try:
                await self._copy()
            except Diverged as error:
                self._stop(str(error))
                return
            except (BrokerError, Unavailable) as error:
                # OFFSET_OUT_OF_RANGE: the source's log moved (retention deleted what was not
                # copied yet, or the source is behind the target): _resume says what holds.
                # UNKNOWN_TOPIC_OR_PARTITION: a partition just added, not served yet (a topic
                # deleted at the source: the Mirror cancels its copies).
                if not (retriable(error) or isinstance(error, _ASKED_AGAIN)):
                    self._stop(f"{type(error).__name__}: {error}")
                    return
                if self.progress.copied_bytes != before:  # it went on a while: a new failure
                    backoff.reset()
                log.warning(
                    "%s: %s: reading where the target stands again in %.1f s",
                    self.progress.name,
                    error,
                    backoff.current_s,
                )
            except PylogError as error:  # refused keys, a malformed reply: no retry mends it
                self._stop(f"{type(error).__name__}: {error}")
                return
            await asyncio.sleep(backoff.next())

    def _stop(self, why: str) -> None:
        self.progress.stopped = why
        log.error("%s: copy stopped: %s", self.progress.name, why)

    async def _copy(self) -> None:
        position = await self._resume()
        progress = self.progress
        progress.position = position
        fetch = asyncio.ensure_future(self._fetch(position))
        try:
            while True:
                reply = await fetch
                data = reply.message_set
                following = position + len(data)
                fetch = asyncio.ensure_future(self._fetch(following))
                if data:
                    progress.next_timestamp_ms = timestamp_at(data, 0)
                    await self._append(position, data)
                    position = following
                else:
                    progress.next_timestamp_ms = None
        finally:
            fetch.cancel()

    async def _fetch(self, offset: int) -> FetchReply:
        request = FetchRequest(
            self.topic,
            self.partition,
            offset,
            self.fetch_max_bytes,
            self.settings.fetch_wait_ms,
            1,
        )
        reply = await self.source.call_leader(request, 0)
        self.progress.source_high_watermark = reply.high_watermark
        return reply

    async def _append(self, offset: int, data: Buffer) -> None:
        request = ProduceRequest(self.topic, self.partition, self.settings.acks, data)
        connection = await self.target.leader_connection(self.topic, self.partition)
        try:
            reply = await connection.request(request)
        except (BrokerError, Unavailable) as error:
            self.target.learn_from(self.topic, self.partition, error, connection.endpoint)
            raise
        if reply.base_offset != offset:
            raise Diverged(
                f"the set copied from source offset {offset} ({len(data)} bytes) was stored "
                f"at {reply.base_offset} on the target: something else writes to the target "
                "partition, or cut it"
            )
        progress = self.progress
        progress.position = offset + len(data)
        progress.copied_bytes += len(data)
        progress.copied_messages += reply.count

    async def _resume(self) -> int:
        """Where to copy from: the target's high watermark, once its leader's log ends there;
        for an empty target partition starting before the source's log, the source's log
        start (the target's log started there first). Diverged when the target's bytes
        cannot be the source's: it ends past the source's log end, or it ends before the
        source's log start (bytes deleted at the source before they were copied)."""
        start, end = await self._settled()
        source_start, source_end = await self._source_range()
        if start == end and end < source_start:
            log.info("%s: the target starts at %d, as the source", self.progress.name, source_start)
            await self.start_target(source_start)
            return await self._started_at(source_start)
        if end > source_end:
            raise Diverged(
                f"the target holds [{source_end}, {end}) past the source's high watermark "
                f"{source_end}: something else wrote to the target partition (or the source "
                "lost messages)"
            )
        if end < source_start:
            raise Diverged(
                f"the source deleted [{end}, {source_start}) before it was copied: the target "
                "cannot go on at the source's offsets (empty it, pylogctl topic "
                "delete-records --before latest on the target, to start again at the "
                "source's log start)"
            )
        return end

    async def _settled(self) -> tuple[int, int]:
        """(log start, high watermark) of the target partition, from its leader, once no
        appended byte waits above the high watermark (a set sent before a crash or a lost
        reply is then kept or cut by the target's replication)."""
        deadline = time.monotonic() + SETTLE_S
        request = DescribePartitionRequest(self.topic, self.partition)
        while True:
            state = await self.target.call_leader(request, self.target.retries)
            if state.log_end_offset == state.high_watermark or time.monotonic() > deadline:
                break
            await asyncio.sleep(RETRY_BACKOFF_S)
        if state.log_end_offset != state.high_watermark:
            raise Unavailable(
                f"the target's leader holds [{state.high_watermark}, {state.log_end_offset}) "
                f"above its high watermark after {SETTLE_S:.0f} s"
            )
        return state.log_start_offset, state.high_watermark

    async def _source_range(self) -> tuple[int, int]:
        call = self.source.call_leader
        retries = self.source.retries
        start = await call(OffsetsRequest(self.topic, self.partition, EARLIEST), retries)
        end = await call(OffsetsRequest(self.topic, self.partition, LATEST), retries)
        return start.offset, end.offset

    async def _started_at(self, offset: int) -> int:
        """Wait until the target's leader starts the partition at `offset` (its broker takes
        the registry's log start within moments)."""
        deadline = time.monotonic() + SETTLE_S
        while True:
            start, end = await self._settled()
            if start == end == offset:
                return offset
            if time.monotonic() > deadline:
                raise Unavailable(
                    f"the target partition starts at {start}, not {offset} as asked "
                    f"{SETTLE_S:.0f} s ago"
                )
            await asyncio.sleep(RETRY_BACKOFF_S)

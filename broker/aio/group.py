"""A member of a consumer group on asyncio: broker.client.GroupConsumer, awaited.

The member is a GroupConsumer (broker.client.group: its rebalance, positions, delivery rule,
damaged data and commits are the ones used here), created and driven from the event loop;
what differs is where its I/O runs:

- Joining (the member's heartbeat thread started), following a new assignment (METADATA,
  OFFSET_FETCH, OFFSETS), commits (auto-commit included), waiting for the coordinator's news
  and `close` run in worker threads (asyncio.to_thread), one at a time, never on the event
  loop. `on_assigned` and `on_revoked` are plain functions, called in such a thread
  (`on_lost`, after the member was told it lost its partitions, on the event loop).
- Fetches go out on zmq.asyncio sockets, one long poll per owned partition in a task of its
  own, so that another task runs while the member waits.

Delivery is the sync member's, at least once: a record counts as processed when the next one
is asked for (the next step of `async for`, the next `poll`, or `commit()`). Records fetched
and not handed out stay with the member, so a `break`, an exception in the handler, a
cancelled task (task.cancel(), asyncio.timeout around a step or the loop) or Ctrl-C leave
nothing skipped: the record in hand is read again by the partition's next owner unless the
loop asked for the next one, and a loop entered again goes on where the last stopped. A
worker thread still running when its caller was cancelled is waited for by the member's next
call.

Not safe to share between event loops (or threads).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any, Self, TypeVar

from broker.aio.connection import AsyncCluster
from broker.client.framing import wait_ms
from broker.client.group import GroupConsumer
from broker.client.group_fetch import NEWS_CHECK_S, RETRY_BACKOFF_S, fetch_replies, fetch_request
from broker.client.records import BrokerPartition, Owned, Record
from broker.errors import PylogError, Unavailable
from broker.lifecycle import AsyncClosing
from broker.log.message import Buffer

log = logging.getLogger("pylog.group")

T = TypeVar("T")


_Fetching = tuple[list[Owned], list[int], asyncio.Task[list[Buffer]]]


class AsyncGroupConsumer(AsyncClosing):
    """Consume `topics` as a member of `group`, through the group's coordinator, found through
    `broker` ("host:port", several comma-separated), on asyncio: `async with
    AsyncGroupConsumer(broker, group, topics) as member: async for record in member: ...`.
    `options` are GroupConsumer's keyword arguments (consumer_id, reset,
    auto_commit_interval_s, max_wait_ms, session_timeout_s, max_poll_interval_s, keys, ...),
    checked when the member joins (`async with`, `open()`, or its first poll or step); its
    fetches present the member's `keys`."""

    def __init__(self, broker: str, group: str, topics: Iterable[str], **options: Any) -> None:
        self._joining = (broker, group, tuple(topics), options)
        self._member: GroupConsumer | None = None
        self._cluster: AsyncCluster | None = None
        self._fetching: dict[str, _Fetching] = {}
        """The request in flight to each broker (by endpoint): the partitions it fetches,
        their fetch offsets then, and its task."""
        self._joined: asyncio.Future[GroupConsumer] | None = None
        """Joining, in a worker thread (a cancelled `open` leaves it running)."""
        self._thread: asyncio.Future[Any] | None = None
        """The last call run in a worker thread (see `_in_thread`)."""

    @property
    def member(self) -> GroupConsumer:
        """The sync member this one drives (ValueError before it joined)."""
        if self._member is None:
            raise ValueError("the member has not joined yet: use async with, or open()")
        return self._member

    @property
    def assignment(self) -> frozenset[BrokerPartition]:
        """The partitions this member owns now."""
        return self.member.assignment

    def positions(self) -> dict[BrokerPartition, int]:
        """Each owned partition's position: the offset after the last processed record."""
        return self.member.positions()

    async def open(self) -> None:
        """Join the group (in a worker thread); nothing when joined already."""
        if self._member is None:
            if self._joined is None:
                broker, group, topics, options = self._joining
                joining = asyncio.to_thread(GroupConsumer[Record], broker, group, topics, **options)
                self._joined = asyncio.ensure_future(joining)
            member = await asyncio.shield(self._joined)
            if self._member is None:
                self._member = member
                cluster = member.cluster
                self._cluster = AsyncCluster(
                    (), cluster.client_id, member.timeout_s, keys=cluster.keys
                )

    async def _in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in a worker thread, after the last such call has ended (a cancelled
        caller leaves its thread running, never two at once)."""
        await self._after_last_thread()
        call = asyncio.ensure_future(asyncio.to_thread(fn, *args))
        self._thread = call
        try:
            return await asyncio.shield(call)
        finally:
            if call.done():
                self._thread = None

    async def _after_last_thread(self) -> None:
        """Wait for the last worker-thread call whose caller was cancelled while it ran, and
        raise its error, which that caller never saw."""
        previous = self._thread
        if previous is None:
            return
        await asyncio.wait([previous])
        self._thread = None
        if not previous.cancelled():
            previous.result()

    # -- consuming ---------------------------------------------------------------------------

    async def poll(self, max_wait_ms: int | None = None) -> list[Record]:
        """GroupConsumer.poll, awaited: the next records of the owned partitions, waiting up
        to `max_wait_ms` for some. Calling it counts every record returned before as
        processed. TypeError for a float `max_wait_ms`."""
        await self.open()
        member = self.member
        member._processed_all()
        await self._fill(wait_ms(max_wait_ms, member.max_wait_ms))
        return member._take_buffered()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Record:
        """The next record (for ever, until close or interrupt): the one in hand counts as
        processed now."""
        await self.open()
        member = self.member
        while True:
            member._processed_all()
            if member._closed or member._interrupted:
                raise StopAsyncIteration
            if member.commits.due():
                await self._in_thread(member.commits.auto_commit)
            record = member._hand_out()
            if record is not None:
                return record
            await self._fill(None)

    def interrupt(self) -> None:
        """End an `async for` loop at its next step, the record in hand counted as
        processed (GroupConsumer.interrupt): a signal handler may call it."""
        self.member.interrupt()

    async def _fill(self, max_wait_ms: int | None) -> None:
        """GroupConsumer._fill with its blocking calls in worker threads and its fetches on
        the event loop."""
        member = self.member
        wait_s = (member.max_wait_ms if max_wait_ms is None else max_wait_ms) / 1000
        member._check_heartbeats()
        if not member.connected:  # past its lease: wait for the heartbeat thread's news
            self._drop_fetches()
            member.fetching.stop()
            await self._in_thread(member._rebalance_wanted.wait, wait_s)
            return
        if not member._in_session(wait_s):  # connected: it returns at once
            return
        # the fetches in flight go on for the partitions kept
        if member.rebalancing.due() and not await self._in_thread(member.rebalancing.follow):
            return
        if member.commits.due():
            await self._in_thread(member.commits.auto_commit)
        if member.fetching.any_buffered():
            return
        if not member.fetching.owned:
            await self._in_thread(member._rebalance_wanted.wait, wait_s)
            return
        await self._fetch(wait_s)

    async def _fetch(self, wait_s: float) -> None:
        """Send a long poll to each broker with none in flight, for its owned partitions (one
        MULTI_FETCH, or a FETCH for one; but those resting after an error, and those
        FetchSession.next_fetches leaves for the next round), wait up to `wait_s` for a
        first reply, and take every reply there."""
        member = self.member
        assert self._cluster is not None
        now = member.clock.monotonic()
        by_endpoint: dict[str, list[Owned]] = {}
        for owned in member.fetching.owned.values():
            if owned.rest_until > now:
                continue
            if not owned.located and not await self._in_thread(member.fetching.locate, owned):
                continue
            if owned.endpoint not in self._fetching:  # else it goes with that broker's next
                by_endpoint.setdefault(owned.endpoint, []).append(owned)
        for endpoint, owned_there in member.fetching.next_fetches(by_endpoint, now).items():
            exchange = self._cluster.connect(endpoint).exchange(fetch_request(owned_there, wait_s))
            offsets = []
            for owned in owned_there:
                owned.sent_at = now
                offsets.append(owned.fetch_offset)
            self._fetching[endpoint] = (owned_there, offsets, asyncio.ensure_future(exchange))
        if not self._fetching:  # every partition rests after an error
            rest_s = min(owned.rest_until for owned in member.fetching.owned.values()) - now
            await asyncio.sleep(min(max(rest_s, 0.0), wait_s))
            return
        tasks = [task for _, _, task in self._fetching.values()]
        loop = asyncio.get_running_loop()  # its clock is the one asyncio.wait times out on
        deadline = loop.time() + wait_s
        while True:  # cut short, within NEWS_CHECK_S, by the heartbeat thread's news
            left_s = deadline - loop.time()
            timeout_s = max(0.0, min(left_s, NEWS_CHECK_S))
            done, _ = await asyncio.wait(
                tasks, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
            if done or left_s <= NEWS_CHECK_S or member._rebalance_wanted.is_set():
                break
        for endpoint, (fetched, offsets, task) in list(self._fetching.items()):
            if not task.done():
                continue
            del self._fetching[endpoint]
            try:
                replies = fetch_replies(fetched, task.result())
            except Unavailable:
                for owned in fetched:
                    owned.rest_until = member.clock.monotonic() + RETRY_BACKOFF_S
                    owned.located = False  # the broker may be down: another may lead now
                    log.warning("no reply to a fetch of %s from %s", owned.tp, endpoint)
                continue
            for owned, offset, reply in zip(fetched, offsets, replies, strict=True):
                if member.fetching.owned.get(owned.tp) is not owned:
                    continue  # given up (or lost) while the fetch was in flight
                if owned.fetch_offset != offset:
                    continue  # fetching started again elsewhere meanwhile: a stale reply
                if member.fetching.on_reply(owned, reply):
                    await self._in_thread(member.fetching.reset_out_of_range, owned)

    def _drop_fetches(self) -> None:
        """Forget the fetches in flight (the member's partitions change or pause)."""
        for _, _, task in self._fetching.values():
            task.cancel()
        self._fetching.clear()

    # -- offsets and life cycle --------------------------------------------------------------

    async def commit(self) -> None:
        """GroupConsumer.commit, in a worker thread: every record handed out counts as
        processed, the one in hand included, and each owned position is recorded."""
        await self._in_thread(self.member.commit)

    async def close(self) -> None:
        """GroupConsumer.close, in a worker thread: commit the processed records (with
        auto-commit), give the partitions up, leave the group; then close the sockets."""
        self._drop_fetches()
        try:
            if self._member is None and self._joined is not None:
                await asyncio.wait([self._joined])  # an open cancelled while joining
                if not self._joined.cancelled() and self._joined.exception() is None:
                    self._member = self._joined.result()
            if self._member is not None:
                try:
                    await self._after_last_thread()
                except PylogError as error:
                    log.warning("group %s: before closing: %s", self._member.group, error)
                await self._in_thread(self._member.close)
        finally:
            if self._cluster is not None:
                await self._cluster.close()

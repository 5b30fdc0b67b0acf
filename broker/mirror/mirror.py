"""`Mirror`: the topics of a source cluster copied to a target cluster (docs/mirror.md).

It lists the source's topics every `discover_interval_s` (METADATA); each one that the
configuration names or matches is prepared on the target (`_prepare`: created with the source's
partition count and settings, the [target.settings] over them, sets stored as they come; an
existing one checked, and grown to the source's partition count) and each of its partitions
copied by a `PartitionCopy` task of its own. A topic the target cannot mirror (its partitions
more than the source's, its sets converted, its messages smaller) is refused: logged at ERROR
and shown by the metrics, asked again at each listing.

Administration (topic settings, creation, the target's registry) goes through the sync
clients on one thread of the mirror's own, one call at a time, in order; the copies are on the
event loop. A call whose task is cancelled (SIGTERM) still ends on that thread before the
clients are closed there: a ZeroMQ socket closed while another thread waits on it can crash
the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from broker.aio.connection import AsyncCluster
from broker.client.admin import Admin
from broker.client.group_member import default_consumer_id
from broker.client.retention import RetentionForecast, forecast
from broker.config import REPLICA_SETTINGS, TOPIC_SETTINGS
from broker.errors import PylogError, TopicAlreadyExists, UnknownTopicOrPartition
from broker.mirror.config import FORCED_SETTINGS, ClusterAddress, MirrorConfig
from broker.mirror.copy import CopyProgress, PartitionCopy
from broker.mirror.group import MirrorGroup
from broker.protocol import (
    DESCRIBE_PARTITION_RETENTION_VERSION,
    DescribePartitionReply,
    DescribePartitionRequest,
    decode_reply,
)
from broker.ratelog import RateLimitedLog
from broker.registry import Registry

log = logging.getLogger(__name__)
T = TypeVar("T")

TICK_S = 0.5
RETENTION_WARN_EVERY_S = 600.0
"""How often one copy is warned of again while its retention forecast stays short."""
"""How often the group's state is looked at between listings (a lost ZooKeeper connection
stops the copies within it: kazoo notices the loss two thirds into the session timeout,
before the session can expire and another member claim the partitions)."""
CREATABLE_SETTINGS = frozenset({*TOPIC_SETTINGS, *REPLICA_SETTINGS})
"""The settings a new topic takes (CREATE_TOPIC): those the target's topic copies from the
source's where the source's topic sets them itself."""


class TopicRefused(PylogError):
    """The target's topic cannot hold the source's at the same offsets (the message says
    why)."""


@dataclass(frozen=True, slots=True)
class TopicPlan:
    """A topic ready on the target: its partitions, and the most bytes a copied set holds."""

    partitions: int
    fetch_max_bytes: int


class Mirror:
    """Copies the topics `config` names from its source to its target while `run` runs."""

    def __init__(self, config: MirrorConfig) -> None:
        self.config = config
        self.copies: dict[tuple[str, int], PartitionCopy] = {}
        self.refused: dict[str, str] = {}
        """Topic -> why the target cannot mirror it (as last found)."""
        self.plans: dict[str, TopicPlan] = {}
        self.member = config.mirror.member_id or default_consumer_id()
        """This process's id in its group."""
        self._tasks: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._admin_lock = asyncio.Lock()
        """One call at a time through the sync clients and the registry."""
        self._admin_thread = ThreadPoolExecutor(1, thread_name_prefix="pylog-mirror-admin")
        """The one thread the sync clients and the registry are used (and closed) on."""
        self._changed = asyncio.Event()
        self._noted: set[str] = set()
        self._registry: Registry | None = None
        self._group: MirrorGroup | None = None
        self._paused = False
        """Copies stopped while ZooKeeper was not reachable: started again once it is."""
        self._retired = (0, 0)
        """(messages, bytes) copied by the copies stopped here (handed to other members)."""
        self._retention_log = RateLimitedLog(log, RETENTION_WARN_EVERY_S)
        self._source_admin = self._admin(config.source)
        self._target_admin = self._admin(config.target)
        self.source = self._cluster(config.source)
        self.target = self._cluster(config.target)

    async def _in_admin_thread(self, call: Callable[..., T], *args: Any) -> T:
        """`call(*args)` on the admin thread, after the calls before it (cancelled ones too)."""
        return await asyncio.get_running_loop().run_in_executor(self._admin_thread, call, *args)

    def _admin(self, cluster: ClusterAddress) -> Admin:
        settings = self.config.mirror
        return Admin(cluster.bootstrap, settings.client_id, settings.timeout_s, keys=cluster.keys)

    def _cluster(self, cluster: ClusterAddress) -> AsyncCluster:
        settings = self.config.mirror
        return AsyncCluster(
            cluster.bootstrap, settings.client_id, settings.timeout_s, keys=cluster.keys
        )

    def progress(self) -> list[CopyProgress]:
        """Every partition this process copies, in topic and partition order."""
        return [self.copies[key].progress for key in sorted(self.copies)]

    async def run(self) -> None:
        """List, share and copy until cancelled (SIGTERM / Ctrl-C in pylog-mirror)."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(self._log_progress())
                tasks.create_task(self._watch_retention())
                next_listing = loop.time()
                while True:
                    due = self._changed.is_set()  # a member came or went
                    self._changed.clear()
                    if loop.time() >= next_listing:
                        await self.discover()
                        next_listing = loop.time() + self.config.mirror.discover_interval_s
                        due = True
                    await self._balance(tasks, loop, due)
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(TICK_S):
                            await self._changed.wait()
        finally:
            await self.close()

    async def discover(self) -> None:
        """List the source's topics; prepare those newly named (or grown) on the target."""
        try:
            reply = await self.source.metadata(())
        except PylogError as error:  # no reply, or refused (keys, ACLs)
            log.warning("listing the source's topics: %s: %s", type(error).__name__, error)
            return
        listed = {info.topic for info in reply.topics}
        for gone in sorted(set(self.plans) - listed):
            log.warning("topic %r is gone from the source: its copy stops", gone)
            del self.plans[gone]
        for info in reply.topics:
            topic, count = info.topic, len(info.partitions)
            if info.error_code or not self.config.mirror.mirrors(topic):
                continue
            plan = self.plans.get(topic)
            if plan is None or plan.partitions < count:
                await self._prepared(topic, count)

    async def _balance(
        self, tasks: asyncio.TaskGroup, loop: asyncio.AbstractEventLoop, due: bool
    ) -> None:
        """Copy only while the ZooKeeper session that claimed the partitions holds them (this
        is looked at every tick, without a request); when `due` (a listing, a member come or
        gone) or back in session, share the partitions again: stop those that went to others
        (or whose topic is gone), claim and start the new ones."""
        try:
            if self._group is None or due:
                await self._joined(loop)
            assert self._group is not None and self._registry is not None
            group, session = self._group, self._registry.session
            if not session.connected:
                self._paused = True
                await self._stop_all("the target's ZooKeeper is not reachable: copies paused")
                return
            if group.claim_session != session.session_id:
                await self._stop_all(
                    "ZooKeeper session expired: its partitions went back to the group"
                )
                group.claim_session = session.session_id
                due = True
            if not (due or self._paused):
                return
            self._paused = False
            counts = {topic: plan.partitions for topic, plan in self.plans.items()}
            async with self._admin_lock:
                wanted = await self._in_admin_thread(group.wanted, counts)
            for key in sorted(set(self.copies) - wanted):
                await self._stop_copy(key)
                async with self._admin_lock:
                    await self._in_admin_thread(group.release, *key)
            for key in sorted(wanted - set(self.copies)):
                async with self._admin_lock:
                    owner = await self._in_admin_thread(group.claim, *key)
                if owner is None:
                    self._start_copy(tasks, *key)
                else:
                    self._note(
                        f"{key[0]}-{key[1]}: owned by {owner}; taken once it lets go", logging.INFO
                    )
        except PylogError as error:
            self._paused = True  # tried again at the next tick
            self._note(f"sharing the partitions: {error}; trying again", logging.WARNING)

    def _note(self, what: str, level: int) -> None:
        """Log `what` once, not at every tick while it holds."""
        if what not in self._noted:
            self._noted.add(what)
            log.log(level, "%s", what)

    async def _joined(self, loop: asyncio.AbstractEventLoop) -> MirrorGroup:
        """The group, joined with the topics prepared now (the target's registry opened on
        first use)."""
        async with self._admin_lock:
            registry = await self._in_admin_thread(self._open_registry)
            if self._group is None:
                self._group = MirrorGroup(
                    registry.groups, registry.topics, self.config.mirror.group, self.member
                )

            def changed() -> None:  # from kazoo's thread
                loop.call_soon_threadsafe(self._changed.set)

            await self._in_admin_thread(self._group.join, frozenset(self.plans), changed)
            return self._group

    async def _stop_all(self, why: str) -> None:
        if self.copies:
            log.warning("%s", why)
        for key in sorted(self.copies):
            await self._stop_copy(key)

    async def _stop_copy(self, key: tuple[str, int]) -> None:
        task = self._tasks.pop(key)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        done = self.copies.pop(key).progress
        self._retired = (
            self._retired[0] + done.copied_messages,
            self._retired[1] + done.copied_bytes,
        )
        self._noted.clear()
        log.info("%s-%d: no longer copied here", *key)

    def _start_copy(self, tasks: asyncio.TaskGroup, topic: str, number: int) -> None:
        async def start_target(offset: int) -> None:
            async with self._admin_lock:
                registry = await self._in_admin_thread(self._open_registry)
                await self._in_admin_thread(
                    registry.topics.move_log_starts, topic, {number: offset}
                )

        copy = PartitionCopy(
            self.source,
            self.target,
            topic,
            number,
            self.config.mirror,
            self.plans[topic].fetch_max_bytes,
            start_target,
        )
        self.copies[topic, number] = copy
        self._tasks[topic, number] = tasks.create_task(copy.run())
        self._noted.clear()
        log.info("%s-%d: copied here", topic, number)

    async def _prepared(self, topic: str, partitions: int) -> TopicPlan | None:
        try:
            async with self._admin_lock:
                plan = await self._in_admin_thread(self._prepare, topic, partitions)
        except PylogError as error:  # refused, or a cluster or ZooKeeper not answering
            why = str(error)
            if self.refused.get(topic) != why:
                log.error("topic %r is not mirrored: %s", topic, why)
            self.refused[topic] = why
            return None
        if self.refused.pop(topic, None) is not None or topic not in self.plans:
            log.info("topic %r: mirrored (partitions: %d)", topic, plan.partitions)
        self.plans[topic] = plan
        return plan

    def _prepare(self, topic: str, partitions: int) -> TopicPlan:
        """The target's `topic` made ready to hold the source's `partitions` partitions at
        the source's offsets (in a worker thread). TopicRefused when it cannot be."""
        source = {e.key: e for e in self._source_admin.topic_config(topic)}
        try:
            target = self._target_admin.topic_config(topic)
        except UnknownTopicOrPartition:
            settings = {
                key: entry.value
                for key, entry in source.items()
                if entry.overridden and key in CREATABLE_SETTINGS
            }
            settings["max_message_bytes"] = source["max_message_bytes"].value
            settings |= {**self.config.target_settings, **FORCED_SETTINGS}
            with contextlib.suppress(TopicAlreadyExists):  # another mirror of the group did
                self._target_admin.create_topic(topic, partitions, settings)
                log.info("topic %r: created on the target with %s", topic, settings)
            target = self._target_admin.topic_config(topic)
        held = {e.key: e.value for e in target}
        if held["compression"] != FORCED_SETTINGS["compression"]:
            raise TopicRefused(
                f"the target's topic stores sets as {held['compression']!r}: copied sets "
                "would change size and offsets (compression=producer needed)"
            )
        if int(held["max_message_bytes"]) < int(source["max_message_bytes"].value):
            raise TopicRefused(
                f"the target's max_message_bytes {held['max_message_bytes']} is below the "
                f"source's {source['max_message_bytes'].value}"
            )
        count = len(self._target_admin.topic(topic).partitions)
        if count > partitions:
            raise TopicRefused(
                f"the target's topic has {count} partitions, the source's {partitions}"
            )
        if count < partitions:
            self._open_registry().topics.add_partitions(topic, partitions)
            log.info("topic %r: grown to %d partitions on the target", topic, partitions)
        # A message of max_message_bytes is fetched whole; a set never outgrows a segment.
        largest = max(self.config.mirror.fetch_max_bytes, int(source["max_message_bytes"].value))
        fetch_max_bytes = min(largest, int(held["segment_bytes"]))
        return TopicPlan(partitions, fetch_max_bytes)

    def _open_registry(self) -> Registry:
        """The target's registry (where its topics' log starts are asked), found from one of
        its brokers (DESCRIBE_CLUSTER), opened on first use."""
        if self._registry is None:
            address = self._target_admin.zookeeper()
            registry = Registry(
                address.connect,
                address.chroot,
                self.config.mirror.session_timeout_s,
                auth=self.config.target.zookeeper_auth,
            )
            registry.start(timeout=self.config.mirror.timeout_s)
            self._registry = registry
        return self._registry

    async def _log_progress(self) -> None:
        interval_s = self.config.mirror.progress_interval_s
        before = (0, 0)
        while True:
            await asyncio.sleep(interval_s)
            progress = self.progress()
            now = self.totals()
            log.info("%s", progress_line(progress, now, before, interval_s, self.refused))
            before = now

    async def _watch_retention(self) -> None:
        """Every retention_check_interval_s, each copy's forecast (broker.client.retention,
        from its source leader's DESCRIBE_PARTITION version 2), for the metrics; a copy whose
        next message retention deletes within retention_warning_s is warned of, at most once
        every RETENTION_WARN_EVERY_S for each (again sooner once deleted): its target is
        down, or the mirror is too slow, and what it has not copied will be lost."""
        settings = self.config.mirror
        while True:
            await asyncio.sleep(settings.retention_check_interval_s)
            for copy in list(self.copies.values()):
                progress = copy.progress
                if progress.position is None or progress.stopped is not None:
                    continue
                request = DescribePartitionRequest(copy.topic, copy.partition)
                version = DESCRIBE_PARTITION_RETENTION_VERSION
                endpoint = None
                try:  # once, a leader down not waited for: the next check asks again
                    connection = await self.source.leader_connection(copy.topic, copy.partition)
                    endpoint = connection.endpoint
                    frames = await connection.exchange(request, version)
                    state = decode_reply(request.api, frames, version)
                except PylogError as error:
                    log.debug("%s: no retention forecast: %s", progress.name, error)
                    self.source.learn_from(copy.topic, copy.partition, error, endpoint)
                    progress.retention = None
                    continue
                assert isinstance(state, DescribePartitionReply)
                ahead = forecast(state, progress.position, time.time() * 1000)
                progress.retention = ahead
                if ahead is None or ahead.seconds is None or not settings.retention_warning_s:
                    continue
                if ahead.seconds < settings.retention_warning_s:
                    self._warn_retention(progress, ahead)

    def _warn_retention(self, progress: CopyProgress, ahead: RetentionForecast) -> None:
        where = f"{progress.name} at source offset {progress.position}"
        if ahead.rule == "deleted":
            what = "retention at the source has deleted messages not copied yet"
        else:
            what = (
                f"retention at the source deletes the next message to copy in "
                f"{ahead.seconds:.0f} s ({ahead.rule}), under retention_warning_s"
            )
        self._retention_log.log(
            logging.WARNING,
            f"{progress.name} {ahead.rule}",
            f"{where}: {what}: is the target up? (pylogctl mirror describe); raise the source "
            "topic's retention_ms / retention_bytes (pylogctl topic alter) to gain time",
        )

    def totals(self) -> tuple[int, int]:
        """(messages, bytes) this process has copied, its copies handed to others included."""
        messages = sum(p.copied_messages for p in self.progress())
        copied = sum(p.copied_bytes for p in self.progress())
        return self._retired[0] + messages, self._retired[1] + copied

    async def close(self) -> None:
        """Stop every copy, leave the group (its partitions go to the others at once) and
        close the connections."""
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        await self.source.close()
        await self.target.close()
        await self._in_admin_thread(self._close_sync)
        self._admin_thread.shutdown()

    def _close_sync(self) -> None:
        self._source_admin.close()
        self._target_admin.close()
        if self._registry is not None:
            self._registry.stop()


def progress_line(
    progress: list[CopyProgress],
    totals: tuple[int, int],
    before: tuple[int, int],
    interval_s: float,
    refused: Mapping[str, str],
) -> str:
    """The line a minute: partitions copying and stopped, what was copied since `before`
    (the `totals`, messages and bytes, a line ago) and in all, the lag."""
    messages, copied = totals
    stopped = [p.name for p in progress if p.stopped is not None]
    lags = [p.lag_bytes for p in progress if p.lag_bytes is not None]
    now_ms = time.time() * 1000
    oldest = max((p.lag_seconds(now_ms) for p in progress), default=0.0)
    line = (
        f"mirror: {len(progress) - len(stopped)} partitions copying; "
        f"{messages - before[0]:,} messages ({_megabytes(copied - before[1])}) in the last "
        f"{interval_s:g} s, {messages:,} ({_megabytes(copied)}) in all; "
        f"lag {sum(lags):,} bytes, oldest message not copied {oldest:.1f} s"
    )
    if stopped:
        line += f"; stopped: {', '.join(stopped)}"
    if refused:
        line += f"; topics refused: {', '.join(sorted(refused))}"
    return line


def _megabytes(count: int) -> str:
    return f"{count / 1e6:,.1f} MB"

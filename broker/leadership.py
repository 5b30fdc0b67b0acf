"""How a worker leads and follows its replicated partitions (docs/replication.md): the roles
the supervisor sends (control.PartitionRole) taken by each partition's Replica
(broker.replication.replica: the rules), then acted on here: a term started (the epoch's entry
in the log first), a copy loop from the leader (broker.replication.follower), the ISR changes
a leader asks the supervisor for, and the lease (broker.replication.lease) that every
leadership here acts under: renewed by the supervisor, and when it runs out, the acks waiting
on the partitions led here are failed and their long polls answered.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

import trio

from broker import control
from broker.config import BrokerConfig
from broker.errors import DISK_ERRORS, StorageError
from broker.replication.fetcher import Fetchers
from broker.replication.follower import EpochRound, Follower, Role, replica_keys
from broker.replication.lease import Lease
from broker.served import Partition, Served

log = logging.getLogger("pylog.worker")


class Leadership:
    """The roles of the partitions of `served`, under one lease. The worker's flusher is
    handed in as what this needs of it: `flush_partitions` (Flusher.flush_partitions: those
    still served and online, one round) and `on_disk_error` (Flusher.on_disk_error)."""

    def __init__(
        self,
        served: Served,
        config: BrokerConfig,
        flush_partitions: Callable[[set[Partition]], None],
        on_disk_error: Callable[[Partition, StorageError], None],
    ) -> None:
        self.served = served
        self.config = config
        self._flush_partitions = flush_partitions
        self._on_disk_error = on_disk_error
        self.lease = Lease()
        """The lease the supervisor last renewed, shared by every partition's Replica."""
        self.lease_renewed = trio.Event()
        self.fetchers: Fetchers | None = None
        """The worker's connections to the leaders it follows partitions of."""
        self.epoch_round = EpochRound()
        """Where the copy loops write their partitions' leader epochs, a turn's together."""
        self._copies: tuple[set[Partition], trio.Event] | None = None
        """The partitions copy loops appended to in this turn, and the event their flush
        round sets (_flush_copied)."""

    async def take_role(self, command: control.PartitionRole) -> None:
        """A replicated partition's state node, as the supervisor read it (docs/replication.md,
        Replica.adopt): lead it (a new term: the epoch's entry added to the log's history
        first), or follow the leader it names (a new copy loop, which truncates first), or
        neither. Waiting acks and long polls of a leader that stops leading are answered
        NOT_LEADER_FOR_PARTITION."""
        partition = self.served.partitions.get((command.topic, command.partition))
        if partition is None:
            return  # not open: a failed open, a delete
        replica, follower = partition.replica, partition.follower
        endpoint, epoch = command.endpoint, command.leader_epoch
        role = Role(command.leader, endpoint, epoch, command.curve_key) if endpoint else None
        following = follower is not None and follower.role == role
        led = replica.leader is not None
        adoption, failed = replica.adopt(command, following, self.served.clock.monotonic())
        self.served.owe(failed)
        if adoption == "kept":
            if replica.leader is not None:
                self.served.owe(partition.update_high_watermark())
            return
        if led and replica.leader is None:
            partition.wake_all()  # consumers and followers find it not led here and answer so
        self.stop_following(partition)
        if adoption == "lead":
            self._lead(partition, epoch)
        elif adoption == "follow":
            assert role is not None  # adopt follows only a leader with an endpoint
            self._follow(partition, role)

    async def _flush_copied(self, partition: Partition) -> None:
        """Flush what a copy loop appended to `partition`, with what the others appended in
        this turn of the loop (the parts of one MULTI_FETCH reply): one flush round for them
        all (broker.log.flush_round: one syncfs), not an fsync a partition one after another;
        returns once it is done (or failed: the partition goes offline, Flusher.flush_round)."""
        if self._copies is None:
            self._copies = (set(), trio.Event())
            assert self.served.nursery is not None
            self.served.nursery.start_soon(self._flush_copies)  # once this turn ends
        partitions, flushed = self._copies
        partitions.add(partition)
        await flushed.wait()

    async def _flush_copies(self) -> None:
        assert self._copies is not None
        (partitions, flushed), self._copies = self._copies, None
        try:
            self._flush_partitions(partitions)
            await self.served.send_owed()
        finally:
            flushed.set()

    def _lead(self, partition: Partition, epoch: int) -> None:
        """Start a term as the leader in `epoch`: its entry in the log's history first (a
        failure is tried again by check_isrs)."""
        plog = partition.log
        start = plog.log_end_offset
        try:
            plog.assign_epoch(epoch)
        except (*DISK_ERRORS, ValueError) as error:
            if not isinstance(error, ValueError):
                self._on_disk_error(partition, error)
            message = f"{partition.name}: cannot lead epoch {epoch} yet: {error}"
            self.served.storage_log.log(logging.ERROR, "lead", message)
            return
        lag_max_s = self.config.broker_replica_lag_max_ms / 1000
        replica = partition.replica
        term = replica.start_term(
            start, plog.flushed_offset, lag_max_s, self.served.clock.monotonic()
        )
        isr = sorted(term.isr)
        log.info(
            "%s: leading in epoch %d from offset %d, ISR %s", partition.name, epoch, start, isr
        )
        self.served.owe(partition.update_high_watermark())

    async def renew_lease(self, until: float, broker_epoch: int) -> None:
        """A lease the supervisor renewed. In a new incarnation (the first lease, or one after
        the session expired), each partition's role is taken again: leaderships of the old
        one end, and one given to the new one, read before the lease came, begins."""
        incarnation = broker_epoch != self.lease.broker_epoch
        self.lease.until, self.lease.broker_epoch = until, broker_epoch
        self.lease_renewed.set()
        if incarnation:
            for partition in list(self.served.partitions.values()):
                role = partition.replica.role
                if role is not None and partition.offline is None:
                    await self.take_role(role)

    def stop_following(self, partition: Partition) -> None:
        if partition.following is not None:
            partition.following.cancel()
        partition.following = partition.follower = None

    def _follow(self, partition: Partition, role: Role) -> None:
        config = self.config

        async def copied(count: int) -> None:
            partition.messages_in += count
            partition.move_start()  # a log start asked past this log's end is reached now
            assert partition.follower is not None
            partition.see_high_watermark(partition.follower.leader_high_watermark)
            await self._flush_copied(partition)  # before the next fetch: it tells the leader

        follower = Follower(
            config.broker_id,
            partition.topic,
            partition.number,
            lambda: partition.log,
            role,
            config.broker_replica_fetch_max_bytes,
            config.broker_replica_fetch_wait_ms,
            copied,
            self._fetchers(),
            self.epoch_round,
        )
        scope = trio.CancelScope()
        partition.follower, partition.following = follower, scope

        async def run() -> None:
            with scope:
                await follower.run()

        assert self.served.nursery is not None
        self.served.nursery.start_soon(run)

    def _fetchers(self) -> Fetchers:
        """The worker's fetchers (one per leader broker), made when it first follows."""
        if self.fetchers is None:
            assert self.served.nursery is not None
            context = self.served.socket.socket.context
            config = self.config
            keys = partial(replica_keys, config)
            self.fetchers = Fetchers(
                config.broker_id,
                context,
                self.served.nursery,
                config.broker_replica_lag_max_ms // 2,  # the leader sees it caught up twice
                keys,
            )
        return self.fetchers

    async def check_isrs(self) -> None:
        """Every quarter of replica_lag_max_ms: the followers of the partitions led here that
        stopped catching up leave the ISR (those that fetch are checked as they fetch), and a
        partition this broker should lead but could not start to (its leader epoch could not
        be written) tries again."""
        while True:
            await trio.sleep(self.config.broker_replica_lag_max_ms / 4000)
            for partition in list(self.served.partitions.values()):
                replica = partition.replica
                if replica.leader is not None:
                    self.served.ask_isr(partition)
                elif (
                    replica.role is not None
                    and replica.mine(replica.role)
                    and partition.offline is None
                ):
                    await self.take_role(replica.role)
            await self.served.send_owed()

    async def lapse_leaders(self) -> None:
        """When the lease runs out without a renewal: the partitions led here answer their
        waiting acks NOT_LEADER_FOR_PARTITION (leader -1) and wake their long polls, which
        answer so; until a renewal, they serve nothing (Partition.check_leader)."""
        while True:
            renewed = self.lease_renewed = trio.Event()
            left = self.lease.until - self.served.clock.monotonic()
            if left > 0:
                with trio.move_on_after(left):
                    await renewed.wait()
                if renewed.is_set():
                    continue
            led = [p for p in self.served.partitions.values() if p.replica.leader is not None]
            if led:
                log.warning(
                    "worker %d: the lease ran out (ZooKeeper has not confirmed this broker): "
                    "its %d led partitions answer NOT_LEADER_FOR_PARTITION until it does",
                    self.served.index,
                    len(led),
                )
            for partition in led:
                self.served.owe(partition.replica.fail_acks(partition.replica.fenced()))
                partition.wake_all()
            await self.served.send_owed()
            await renewed.wait()

    async def reopened(self, partition: Partition) -> None:
        """An offline partition's log reopened from the disk: lead it now if its role said so
        and it could not."""
        role = partition.replica.role
        if role is not None and partition.replica.leader is None:
            await self.take_role(role)
            await self.served.send_owed()

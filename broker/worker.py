"""A worker: one process, one trio loop, owning a partition group (the partitions of one log
directory, or a share of them with `workers_per_dir`). The supervisor forks it (`run_forked`).

It connects a DEALER socket to the supervisor's ipc endpoint for it and serves what arrives
(see broker.transport for the frames; broker.control for the supervisor's commands):

- PRODUCE appends the validated message set to the partition log as it came. ack=none sends no
  reply; ack=written replies once appended; ack=flushed replies once a flush has made the
  messages durable (fsync, if configured) and visible; ack=all once the in-sync replicas have
  flushed them (the high watermark).
- FETCH, OFFSETS, DESCRIBE_PARTITION and OFFSET_FOR_LEADER_EPOCH: broker.reads.
- Commands from the supervisor open partitions (recovering them), delete topics, change a
  topic's settings on its open partitions (LocalLog.reconfigure; a flush they make due
  happens at once), give replicated partitions their roles and renew the leaders' lease
  (broker.leadership).

Flushes, by count, by time and by group commit, and what a failed flush does: broker.flusher.
Retention runs every retention_check_interval_ms. Deleting a topic releases its logs without
writing anything (no flush, no index), so a full disk cannot stop it, and removes their folders.
Storage errors answered to requests (DISK_FULL, STORAGE_ERROR, an OSError such as EMFILE turned
into the latter) are logged at most once per broker.served.STORAGE_LOG_EVERY_S per kind.

On SIGTERM or SIGINT it flushes every log and answers the producers waiting for that flush,
then stops, closes every log and exits 0. A supervisor that dies, even by SIGKILL, has the
kernel send its workers SIGTERM (PR_SET_PDEATHSIG), so none is left holding its partitions.
With `[metrics] enabled` it counts requests, errors and their time by api, flush durations and
each partition's traffic (broker.worker_stats) and sends the supervisor a snapshot every
STATS_EVERY_S, which serves them (broker.metrics).
Flow control: the worker gives the supervisor back the bytes of the requests it has served
(CREDIT, broker.transport), so the front holds back requests, not the worker's memory, when
the worker falls behind.
The page cache, not the worker, holds recent data, so a restarted worker serves reads as fast
as the one before it.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import resource
import shutil
import signal
import sys
import time
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

import trio
import zmq

from broker import control, protocol
from broker.clock import SYSTEM_CLOCK, Clock
from broker.config import BrokerConfig
from broker.errors import (
    DISK_ERRORS,
    PylogError,
    UnknownTopicOrPartition,
    UnsupportedApi,
)
from broker.expansions import Expansions
from broker.flusher import Flusher, log_recovery
from broker.leadership import Leadership
from broker.log import PartitionLog
from broker.log.config import LogConfig, SettingValue
from broker.log.files import OPEN_FILES
from broker.log.fsdir import storage_error, sync_created
from broker.log.hwcheckpoint import HighWatermarkCheckpoint
from broker.log.message import Buffer
from broker.log.partition import SetsToOpen
from broker.logs import configure_logging, set_log_level
from broker.processes import exit_with_supervisor, name_process, segment_file_limit
from broker.reads import Reads
from broker.replication.replica import PendingAck, Replica
from broker.served import Partition, Served
from broker.transport import (
    COMMAND,
    CREDIT_EVERY_BYTES,
    CREDIT_IDLE_S,
    credit_frames,
    receive_from_supervisor,
    request_weight,
    throttle_of,
)
from broker.trio_socket import TrioSocket
from broker.worker_stats import STATS_EVERY_S, WorkerStats

log = logging.getLogger("pylog.worker")

TURN_S = 0.002
"""The longest a client's turn to have its compressed sets opened serves more of its requests
(_open_sets_in_turn): what another client may wait for each client before it in the turns."""

ANSWER_TIMEOUT_S = 5.0

SYNC_TOGETHER_FROM = 64
"""The partitions to open at once from which the new ones are made durable by one syncfs of
the log dir's file system (sync_created) rather than two directory fsyncs each: a syncfs also
writes back every other dirty page there (another program's too, in the default single-box
setup), so for a topic of a few partitions the fsyncs cost less and disturb nothing."""

OPEN_CHUNK = 1000
"""The partitions a worker opens, makes durable (one syncfs) and reports opened at a time, so
that of a topic of thousands some are served (registered in ZooKeeper, in METADATA) after a
second, not all after many (docs/storage.md, "Recovery after a crash")."""


class Worker:
    """The partitions of one group and the loop that serves them."""

    def __init__(
        self,
        index: int,
        config: BrokerConfig,
        socket: TrioSocket[list[bytes]],
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.index = index
        self.config = config
        self.clock = clock
        """Its one clock (Served.clock): the partition logs' too (flush deadlines, segment
        ages, retention)."""
        self.topic_settings: dict[str, dict[str, SettingValue]] = {}
        """Each topic's own settings, as the supervisor last gave them (over the [log]
        defaults, which may change live)."""
        self.socket = socket
        self.served = Served(index, socket, clock)
        self.partitions = self.served.partitions
        self.flusher = Flusher(
            self.served,
            lambda partition: self.leadership.reopened(partition),
            clock,
            config.log_flush_when_idle,
        )
        self.leadership = Leadership(
            self.served, config, self.flusher.flush_partitions, self.flusher.on_disk_error
        )
        self.reads = Reads(
            self.served,
            config.broker_fetch_max_bytes,
            lambda: self.config.log_retention_check_interval_ms,
            config.broker_replica_lag_max_ms,
        )
        self.prefixes = protocol.KnownPrefixes()
        """The prefixes of requests found good: the next PRODUCE ones are decoded by it."""
        self.unanswered_errors = 0
        """Failed produce requests with ack=none, which get no reply: logged and counted."""
        self._served_bytes = 0
        """Bytes of requests served (request_weight) and not yet given back to the supervisor
        (CREDIT)."""
        self._fetch_max_bytes = config.broker_fetch_max_bytes
        workers = len(config.log_dir_paths) * config.broker_workers_per_dir
        self._credit_step = min(
            CREDIT_EVERY_BYTES, max(1, config.broker_queued_request_bytes // (2 * workers))
        )
        """Served bytes given back at once: at most half the front's limit over all workers
        held back, so credit held back alone never stops the front reading."""
        self._credit_owed = trio.Event()
        """Set when served bytes wait for _give_credit_when_idle."""
        self.stats = WorkerStats()
        self.expansions = Expansions()
        """The requests whose compressed sets wait for their client's turn to be opened."""

    @property
    def nursery(self) -> trio.Nursery | None:
        """The worker's nursery, once it serves (its parts start their tasks there)."""
        return self.served.nursery

    @nursery.setter
    def nursery(self, nursery: trio.Nursery | None) -> None:
        self.served.nursery = nursery

    # -- the loop --------------------------------------------------------------------------

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            nursery.start_soon(self.flusher.run)
            nursery.start_soon(self._apply_retention)
            nursery.start_soon(self._give_credit_when_idle)
            nursery.start_soon(self._open_sets_in_turn)
            nursery.start_soon(self.leadership.check_isrs)
            nursery.start_soon(self.leadership.lapse_leaders)
            if self.config.metrics_enabled:
                nursery.start_soon(self._report_stats)
            await self.socket.send(control.encode(control.WorkerHello(self.index)))
            task_status.started()
            while True:
                frames = await self.socket.receive(on_idle=self.flusher.group_commit)
                if frames[0] == COMMAND:
                    try:
                        command = control.decode_command(frames[1])
                    except ValueError as error:  # a bug: the two sides are one program
                        log.error("worker %d: %s", self.index, error)
                        continue
                    await self._run_command(command)
                    continue
                # requests, each a client's tagged identity and its frame
                expansions = self.expansions
                for i in range(1, len(frames), 2):
                    request = frames[i + 1 : i + 2]
                    if expansions.requests and expansions.behind(frames[i], request):
                        continue  # after its client's sets to open, in order
                    if await self._serve_request(frames[i], request):
                        self._served_bytes += request_weight(frames[i + 1], self._fetch_max_bytes)
                await self._after_serving()

    async def _open_sets_in_turn(self) -> None:
        """Serve the requests whose compressed sets are to be opened, one client's at a time,
        the clients in turn (broker.expansions), the loop serving what came between two. A
        turn serves its client's requests in order for up to TURN_S (one at least, however
        long), so a client whose sets are cheap to open has them served together, as the
        loop serves what comes together. The bytes of a turn that took that long are given
        back to the front at once, so that it reads the next client's request (it reads its
        clients in turn too)."""
        expansions = self.expansions
        while True:
            client, queue = await expansions.next_turn()
            started = time.perf_counter()
            while queue and time.perf_counter() - started < TURN_S:
                tagged, request = expansions.take(queue)
                await self._serve_request(tagged, request, expand=True)
                self._served_bytes += request_weight(request[0], self._fetch_max_bytes)
            expansions.end_turn(client)
            await self._after_serving(at_once=time.perf_counter() - started >= TURN_S)

    async def _after_serving(self, at_once: bool = False) -> None:
        """After serving requests: a flush made due waits no longer, the replies owed (acks,
        ISR changes) go, and the requests' bytes go back to the front, now if `at_once` or
        they add up to the credit step, else once idle (_give_credit_when_idle)."""
        self.flusher.served_message()
        if self.served.owing:
            await self.served.send_owed()
        if self._served_bytes >= self._credit_step or (at_once and self._served_bytes):
            await self._give_credit()
        elif not self._credit_owed.is_set():
            self._credit_owed.set()

    async def _give_credit(self) -> None:
        served, self._served_bytes = self._served_bytes, 0
        await self.socket.send(credit_frames(served))  # wakes receive(), as any send must

    async def _give_credit_when_idle(self) -> None:
        """Give back what was served, CREDIT_IDLE_S after the first bytes of it were: a worker
        that falls idle owes the front nothing for long, with no message a request."""
        while True:
            await self._credit_owed.wait()
            await trio.sleep(CREDIT_IDLE_S)
            self._credit_owed = trio.Event()
            if self._served_bytes:
                await self._give_credit()

    async def flush_and_answer(self, timeout_s: float) -> None:
        """Flush every partition and give the producers waiting for a flush their acks (for a
        clean shutdown: their messages are durable, so they are told so; if the flush fails,
        that they were not stored), waiting at most `timeout_s` for the supervisor to take
        them."""
        self.flusher.flush_round(p for p in list(self.partitions.values()) if p.offline is None)
        with trio.move_on_after(timeout_s):
            await self.served.send_owed()

    def close(self) -> None:
        """Flush and close every partition log (a clean close: indexes written)."""
        for partition in self.partitions.values():
            try:
                partition.log.close()
            except PylogError as error:
                log.error("closing %s-%d: %s", partition.topic, partition.number, error)
            partition.checkpoint.close()
            partition.wake_all()
        self.partitions.clear()
        self.flusher.round.close()

    # -- requests --------------------------------------------------------------------------

    async def _serve_request(
        self, tagged: bytes, request_frames: list[bytes], expand: bool = False
    ) -> bool:
        """Serve a request, answering it (or its error); False when it waits for its turn to
        have its compressed sets opened instead (its append raised SetsToOpen: served again
        with `expand`, by _open_sets_in_turn)."""
        started = time.perf_counter()
        api = "unknown"
        correlation_id: int | None = None
        waits = False
        try:
            produce = self.prefixes.produce(request_frames)  # the hot path: no objects made
            if produce is not None:
                api = "produce"
                correlation_id = produce[0]
                await self._produce(tagged, *produce, request_frames, expand=expand)
                return True
            header, request = self.prefixes.decode(request_frames)
            api = header.api.name.lower()
            correlation_id = header.correlation_id
            if isinstance(request, protocol.ProduceRequest):
                route = protocol.Route(request.topic, request.partition)
                await self._produce(
                    tagged,
                    correlation_id,
                    header.version,
                    route,
                    request.ack,
                    request.producer_id,
                    request.producer_epoch,
                    request.sequence,
                    request.message_set,
                    request_frames,
                    expand=expand,
                )
            elif isinstance(request, protocol.FetchRequest):
                await self.reads.fetch(tagged, correlation_id, request, header.version)
            elif isinstance(request, protocol.MultiFetchRequest):
                await self.reads.multi_fetch(tagged, correlation_id, request, header.version)
            elif isinstance(request, protocol.OffsetForLeaderEpochRequest):
                await self.reads.offset_for_leader_epoch(tagged, correlation_id, request)
            elif isinstance(request, protocol.OffsetsRequest):
                reply = protocol.OffsetsReply(self.reads.offset_at(request))
                await self.served.reply(tagged, protocol.encode_reply(correlation_id, reply))
            elif isinstance(request, protocol.DescribePartitionRequest):
                described = self.reads.describe(request, header.version)
                frames = protocol.encode_reply(correlation_id, described, header.version)
                await self.served.reply(tagged, frames)
            else:
                raise UnsupportedApi(f"{type(request).__name__} is served by the front socket")
        except SetsToOpen:  # nothing changed: served again in its client's turn
            self.expansions.wait_turn(tagged, request_frames)
            waits = True
        except Exception as error:  # every failure is answered; the worker keeps serving
            if isinstance(error, OSError):  # the disk or the file table (EMFILE) said no
                error = storage_error(error, f"worker {self.index}")
            self.stats.failed(api, protocol.error_code_for(error).name)
            if isinstance(error, DISK_ERRORS):
                kind = type(error).__name__
                self.served.storage_log.log(logging.ERROR, kind, f"worker {self.index}: {error}")
            elif not isinstance(error, PylogError):
                log.exception("worker %d: unexpected error serving a request", self.index)
            if protocol.is_fire_and_forget(request_frames):
                self.unanswered_errors += 1
                message = f"worker {self.index}: produce with ack=none failed: {error}"
                self.served.storage_log.log(logging.WARNING, "ack=none", message)
            else:
                if correlation_id is None:  # the request did not decode
                    correlation_id = protocol.peek_correlation_id(request_frames)
                await self.served.reply(tagged, protocol.encode_error(correlation_id, error))
        finally:
            if not waits:
                self.stats.served(api, time.perf_counter() - started)
        return not waits

    async def _produce(
        self,
        tagged: bytes,
        correlation_id: int,
        version: int,
        route: protocol.Route,
        ack: int,
        producer_id: int,
        epoch: int,
        sequence: int,
        message_set: Buffer,
        request_frames: list[bytes],
        expand: bool,
    ) -> None:
        """Append a producer's set and answer it (or leave its ack to the flush that stores
        it); SetsToOpen, nothing changed, for a set whose compressed sets are to be opened
        unless `expand`. `request_frames`: the request's, whose client id a new idempotent
        producer is let in as."""
        partition = self.served.get(*route)
        partition.admit(ack)  # led here, under the lease; at ack=all, the ISR big enough
        offset, count, end = self.flusher.append(
            partition,
            message_set,
            producer_id,
            epoch,
            sequence,
            expand,
            lambda: protocol.peek_client_id(request_frames),
        )
        waiting = partition.replica.waiting_for(ack, end, partition.log.flushed_offset)
        if waiting == "never":
            return
        frames = protocol.encode_reply(
            correlation_id, protocol.ProduceReply(offset, count, throttle_of(tagged)), version
        )
        if waiting == "now":
            await self.served.reply(tagged, frames)
            return
        # Answered by the flush (at ack=all the high watermark) that stores it, or failed
        # (Replica.fail_acks); flushed soon, as followers copy only flushed bytes.
        (frame,) = frames
        waiting.append(PendingAck(end, correlation_id, (tagged, frame)))
        self.flusher.wanted.add(partition)

    # -- commands from the supervisor ------------------------------------------------------

    async def _run_command(self, command: control.Command) -> None:
        match command:
            case control.OpenPartitions(partitions):
                await self._open_in_chunks(partitions)
            case control.DeletePartitions(topic, partitions):
                for number, folder in partitions:
                    self._delete(topic, number, Path(folder))
                await self.socket.send(control.encode(control.PartitionsDeleted(topic)))
            case control.ConfigureTopic(topic, settings):
                self._configure(topic, settings)
            case control.ReconfigureBroker(values):
                self._reconfigure(values)
            case control.MoveLogStarts(topic, starts):
                self._move_starts(topic, starts)
            case control.PartitionRole():
                await self.leadership.take_role(command)
            case control.RenewLease(until, broker_epoch):
                await self.leadership.renew_lease(until, broker_epoch)
            case control.WakeFetch(tag):
                self.reads.wake(bytes.fromhex(tag))
        await self.served.send_owed()  # acks that a delete failed or a new setting's flush made

    async def _open_in_chunks(self, partitions: Sequence[control.PartitionToOpen]) -> None:
        """Open `partitions` OPEN_CHUNK at a time (_open_all), reporting each chunk opened,
        and log one line for them all. The garbage collector is held off meanwhile
        (gc_held): every object made is kept, and the collections that walked all of them
        again and again took a third of the time to open 10,000 partitions."""
        started = self.clock.monotonic()
        opened = new = failed = 0
        with gc_held():
            for start in range(0, len(partitions), OPEN_CHUNK):
                report, created = self._open_all(partitions[start : start + OPEN_CHUNK])
                await self.socket.send(control.encode(report))
                opened += len(report.opened)
                failed += len(report.failed)
                new += created
        log.info(
            "worker %d: %d partitions opened (%d new) in %.1f s%s",
            self.index,
            opened,
            new,
            self.clock.monotonic() - started,
            f", {failed} could not be" if failed else "",
        )

    def _open_all(
        self, partitions: Sequence[control.PartitionToOpen]
    ) -> tuple[control.PartitionsOpened, int]:
        """Open each partition (those open already stay as they are); a replicated one serves
        no client until its role says it leads. From SYNC_TOGETHER_FROM partitions on, the
        folders created are made durable together (broker.log.fsdir.sync_created: one syncfs a
        log dir, where their own fsyncs would be two a partition) before any is served; one
        whose creation cannot be made so fails. Returns what was opened and what failed, and
        how many were created."""
        together = len(partitions) >= SYNC_TOGETHER_FROM
        new_count = 0
        opened: list[tuple[str, int]] = []
        failed: list[tuple[str, int, int, str]] = []
        created: dict[Path, dict[Path, tuple[str, int]]] = {}
        configs: dict[str, LogConfig] = {}  # a topic's partitions come with one set of settings
        for p in partitions:
            name = f"{p.topic}-{p.partition}"
            try:
                self.topic_settings[p.topic] = p.settings
                config = configs.get(p.topic) or configs.setdefault(
                    p.topic, self.config.log_config(p.settings)
                )
                folder = Path(p.directory) / name
                new = not folder.is_dir()
                defer = new and together  # its sync to sync_created
                if self._open(p.topic, p.partition, Path(p.directory), config, sync=not defer):
                    self.partitions[(p.topic, p.partition)].replica.replicated = p.replicated
                    new_count += new
                    if defer:
                        created.setdefault(Path(p.directory), {})[folder] = (p.topic, p.partition)
                self.partitions[(p.topic, p.partition)].move_start(p.log_start)
                opened.append((p.topic, p.partition))
            except (PylogError, OSError, ValueError) as error:
                failed.append(self._not_opened(p.topic, p.partition, p.directory, error))
        for directory, folders in created.items():
            for folder, problem in sync_created(directory, folders).items():
                topic, number = folders[folder]
                self._close_unserved(topic, number)
                if (topic, number) in opened:  # else failed already (its move_start)
                    opened.remove((topic, number))
                    failed.append(self._not_opened(topic, number, str(directory), problem))
        return control.PartitionsOpened(tuple(opened), tuple(failed)), new_count

    @staticmethod
    def _not_opened(
        topic: str, number: int, directory: str, error: Exception
    ) -> tuple[str, int, int, str]:
        """Log why partition `number` of `topic` in log dir `directory` was not opened, and
        return it as a PartitionsOpened failure."""
        name = f"{topic}-{number}"
        if isinstance(error, OSError):
            error = storage_error(error, f"opening {name}")
        log.error("cannot open %s in %s: %s", name, directory, error)
        return (topic, number, protocol.error_code_for(error), f"{name}: {error}")

    def _close_unserved(self, topic: str, number: int) -> None:
        """Release a partition just opened and never served (its creation failed to become
        durable): nothing to flush, nobody waiting."""
        partition = self.partitions.pop((topic, number))
        with contextlib.suppress(PylogError):
            partition.log.close(flush=False)
        partition.checkpoint.close()

    def _open(
        self, topic: str, number: int, directory: Path, config: LogConfig, sync: bool = True
    ) -> bool:
        """Open a partition's log; False when it is open already. `sync` False: what it
        creates is not fsynced (PartitionLog.open), its caller makes it durable."""
        if (topic, number) in self.partitions:
            return False
        self.flusher.round.watch(directory)  # before the partition is written to
        plog = PartitionLog.open(directory / f"{topic}-{number}", config, self.clock, sync)
        plog.local.on_flush = self.stats.flush_seconds.observe
        log_recovery(f"{topic}-{number}", plog)
        checkpoint = HighWatermarkCheckpoint(plog.directory)
        if checkpoint.problem is not None:
            log.warning("%s-%d: %s", topic, number, checkpoint.problem)
        name = f"{topic}-{number}"
        replica = Replica(name, self.config.broker_id, self.leadership.lease)
        replica.high_watermark_seen = checkpoint.value
        self.partitions[(topic, number)] = Partition(
            topic, number, plog, replica, checkpoint, self.clock
        )
        self.flusher.deadline_changed.set()
        return True

    def _configure(self, topic: str, settings: dict[str, SettingValue]) -> None:
        """Apply a topic's new settings to its partitions open here."""
        if self._apply_settings(topic, settings):
            log.info("worker %d: topic %s now uses %s", self.index, topic, settings)

    def _apply_settings(self, topic: str, settings: dict[str, SettingValue]) -> bool:
        """The topic's own settings over the broker's [log] defaults, to its partitions open
        here, and a flush of those they make due (a lower flush_messages or
        flush_interval_ms); False, logged, for settings that do not check."""
        self.topic_settings[topic] = settings
        try:
            config = self.config.log_config(settings)
        except ValueError as error:  # checked against the defaults of the broker that took it
            log.error("topic %s: settings %s refused: %s", topic, settings, error)
            return False
        for partition in list(self.partitions.values()):
            if partition.topic == topic:
                partition.log.local.reconfigure(config)
                if partition.offline is None:
                    self.flusher.flush(partition, if_due=True)
        self.flusher.deadline_changed.set()
        return True

    def _reconfigure(self, values: dict[str, Any]) -> None:
        """Live broker settings changed: the topics' defaults (every topic's partitions here
        get their settings again over them), how often retention runs, the log level."""
        self.config.take_live(BrokerConfig({**self.config.values, **values}))
        set_log_level(self.config.broker_log_level)
        for topic, settings in list(self.topic_settings.items()):
            self._apply_settings(topic, settings)
        log.info("worker %d: live settings now %s", self.index, values)

    def _move_starts(self, topic: str, starts: Sequence[tuple[int, int]]) -> None:
        """Records of `topic` deleted: each partition open here starts where the registry asks
        (Partition.move_start)."""
        for number, start in starts:
            partition = self.partitions.get((topic, number))
            if partition is None:
                continue
            before = partition.log.log_start_offset
            try:
                partition.move_start(start)
            except (PylogError, OSError) as error:
                log.error("%s: cannot move its log start to %d: %s", partition.name, start, error)
                continue
            if partition.log.log_start_offset != before:
                log.info(
                    "%s: log start %d -> %d (records before it deleted)",
                    partition.name,
                    before,
                    partition.log.log_start_offset,
                )

    def _delete(self, topic: str, number: int, folder: Path) -> None:
        """Stop serving a partition (if open here) and remove its folder. Its log is released
        without writing anything, so that a full or failing disk cannot stop a delete."""
        partition = self.partitions.pop((topic, number), None)
        if partition is not None:
            self.leadership.stop_following(partition)
            try:
                partition.log.close(flush=False)
            except PylogError as error:
                log.error("closing %s for its delete: %s", partition.name, error)
            partition.checkpoint.close()
            partition.wake_all()  # they see it gone and answer
            deleted = UnknownTopicOrPartition(f"{partition.name} was deleted before its flush")
            self.served.owe(partition.replica.fail_acks(deleted))  # never acked
        try:
            shutil.rmtree(folder)
        except FileNotFoundError:
            return
        except OSError as error:
            log.error("deleting %s: %s", folder, error)
            return
        log.info("deleted partition %s-%d", topic, number)

    # -- background tasks ------------------------------------------------------------------

    async def _report_stats(self) -> None:
        """Send the supervisor a snapshot of the figures every STATS_EVERY_S (for
        broker.metrics)."""
        while True:
            await trio.sleep(STATS_EVERY_S)
            partitions = []
            for p in list(self.partitions.values()):
                figures = p.log.local.statistics()
                partitions.append(
                    [
                        p.topic,
                        p.number,
                        p.messages_in,
                        p.bytes_in,
                        p.bytes_out,
                        figures.size_bytes,
                        figures.segments,
                        figures.log_start_offset,
                        p.high_watermark,  # consumers' (Replica.high_watermark)
                    ]
                )
            snapshot = self.stats.snapshot(partitions)
            await self.socket.send(control.encode(control.StatsReport(snapshot)))

    async def _apply_retention(self) -> None:
        while True:
            await trio.sleep(self.config.log_retention_check_interval_ms / 1000)
            for partition in list(self.partitions.values()):
                if partition.offline is not None:  # its files are being reopened
                    continue
                partition.append_rate(self.clock.monotonic())  # a note for DESCRIBE_PARTITION's
                try:
                    deleted = partition.log.local.apply_retention()
                except (PylogError, OSError) as error:
                    log.error("retention of %s-%d: %s", partition.topic, partition.number, error)
                    continue
                if deleted:
                    names = ", ".join(p.name for p in deleted)
                    log.info("retention deleted %s", names)


async def run_worker(index: int, endpoint: str, config: BrokerConfig) -> None:
    """Serve until SIGTERM or SIGINT, then flush and close every log."""
    OPEN_FILES.limit = segment_file_limit(config.log_max_open_files)
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 5000)
    socket.setsockopt(zmq.SNDHWM, 0)
    socket.setsockopt(zmq.RCVHWM, 0)
    socket.connect(endpoint)
    worker = Worker(index, config, TrioSocket(socket, receive_from_supervisor))
    try:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.serve)
                async for signum in signals:
                    log.info(
                        "worker %d: %s, flushing and exiting", index, signal.Signals(signum).name
                    )
                    await worker.flush_and_answer(ANSWER_TIMEOUT_S)
                    nursery.cancel_scope.cancel()
                    break
    finally:
        worker.close()
        socket.close()
        context.term()


@contextlib.contextmanager
def gc_held() -> Iterator[None]:
    """The cyclic garbage collector off for the block (on again after it, if it was on): for
    work that makes many objects and keeps them all, which each collection would walk anew."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def run_forked(index: int, endpoint: str, config: BrokerConfig, supervisor_pid: int) -> NoReturn:
    """Worker `index`, in the child the supervisor has just forked (broker.pool); never
    returns: exits 0 after a SIGTERM or SIGINT, 1 with the traceback on stderr after an error.

    The child leaves what it inherited alone. The supervisor's objects are never collected
    (gc.freeze: their finalizers would close the supervisor's sockets, or ZeroMQ's, whose
    threads are not in this process) and its descriptors are closed, but stdin, stdout and
    stderr, which it writes through new file objects (a thread of the supervisor may have held
    the old ones' locks at the fork). Its signal handlers are the defaults again, and its
    name (ps, top) pylog-worker-<index>: its command line is the supervisor's."""
    code = 1
    try:
        gc.freeze()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        os.closerange(3, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 (never closed)
        sys.stderr = open(2, "w", buffering=1, closefd=False, errors="backslashreplace")  # noqa: SIM115
        logging.root.handlers.clear()
        name_process(f"pylog-worker-{index}")
        exit_with_supervisor(supervisor_pid)
        configure_logging(config.broker_log_format, config.broker_log_level)
        trio.run(run_worker, index, endpoint, config)
        code = 0
    except SystemExit as exit_:
        if isinstance(exit_.code, str):
            print(exit_.code, file=sys.stderr)
        code = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)

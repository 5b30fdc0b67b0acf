"""A follower's copy loop for one partition (docs/replication.md, "The follower"), run as a trio
task of the worker that holds the partition, for one leader and one leader epoch: the worker
cancels it and starts another when the partition's state node names a new leader or epoch.

1. **Truncate** (KIP-101, KIP-279): ask the leader OFFSET_FOR_LEADER_EPOCH for this replica's
   latest epoch, and cut the log to the lower of the leader's answer and this replica's own end
   of that epoch; a replica without history, or whose answer lies outside its log, starts again
   empty at the leader's offset.
2. **Copy**: FETCH version 2 from the log end, saying the replica's flushed offset, long polling
   `replica_fetch_wait_ms`; append the bytes exactly as they came, with the leader's epoch
   entries for them, then hand the partition to the worker (`copied`), which flushes what was
   copied before the next fetch asks for more: the leader learns the new flushed offset from
   that fetch, and its high watermark moves.

In security.mode curve the follower's socket is a Curve client of the leader's front: it
presents this broker's key pair (a key of the cluster, which the leader lets in as the cluster
principal, broker.security) and takes the leader for the holder of the public key the leader
registered in ZooKeeper, provided that key is one of the cluster's (BrokerKeys.to_leader). A
handshake the leader refuses is told in the warning of the retry, with its cause, as the
socket's monitor saw it.

A fetch answered OFFSET_OUT_OF_RANGE (the leader's log moved, or this replica holds bytes the
leader does not) goes back to 1. Errors that the leader's state will mend (NOT_LEADER, an epoch
that is fenced or not yet known, a leader that does not answer) are retried with back-off,
logged at most once per kind every few seconds.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio
import zmq
from zmq.utils.monitor import parse_monitor_message

from broker import protocol
from broker.client.connection import monitor_handshakes
from broker.config import BrokerConfig
from broker.errors import OffsetOutOfRange, PartitionUnavailable, PylogError
from broker.log import PartitionLog
from broker.log.message import Buffer
from broker.ratelog import RateLimitedLog
from broker.security import BrokerKeys
from broker.transport import TrioSocket
from broker.zmqio import receive_frames

log = logging.getLogger("pylog.follower")

REPLY_GRACE_S = 5.0
"""How much longer than its long poll a fetch waits for the leader's reply."""
FIRST_BACKOFF_S = 0.05
MAX_BACKOFF_S = 2.0
LOG_EVERY_S = 5.0


@dataclass(frozen=True)
class Role:
    """Whom a follower copies from: the leader's broker id, its front's endpoint and its
    leader epoch, and in curve mode the public key the leader registered (None: none)."""

    leader: int
    endpoint: str
    epoch: int
    key: str | None = None


def replica_keys(config: BrokerConfig) -> BrokerKeys | None:
    """This broker's keys for its followers in security.mode curve (read when a follower starts,
    so a file changed is read at the next one), None in plaintext; KeyFileError as loading
    raises it."""
    if config.security_mode != "curve":
        return None
    return BrokerKeys.load(config.key_file_path, config.security_broker_keys)


class _Handshakes:
    """The handshakes of a follower's socket with the leader, from the socket's monitor: why
    the last one failed (`failure`), None once one succeeded."""

    EVENTS = (
        zmq.EVENT_HANDSHAKE_SUCCEEDED
        | zmq.EVENT_HANDSHAKE_FAILED_AUTH
        | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
        | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    )

    def __init__(self, socket: zmq.Socket[bytes], role: Role) -> None:
        self.monitor: zmq.Socket[bytes] = monitor_handshakes(socket)
        self.role = role
        self._failure: str | None = None

    def failure(self) -> str | None:
        """Why the last handshake failed, after reading every event waiting (never waits)."""
        leader = f"leader {self.role.leader} ({self.role.endpoint})"
        while int(self.monitor.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            event = parse_monitor_message(self.monitor.recv_multipart())
            kind, value = event["event"], int(event["value"])
            if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._failure = None
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:  # value: the ZAP status code
                self._failure = (
                    f"{leader} refused this broker's key (ZAP {value}): it is none of the "
                    "leader's cluster keys (security.key_file, security.broker_keys), so the "
                    "leader does not take this broker for one of its cluster"
                )
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
                self._failure = (
                    f"the handshake with {leader} failed (ZeroMQ protocol error {value:#x}): "
                    "one of the two serves plaintext, or the leader holds another key than "
                    "it registered"
                )
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                self._failure = (
                    f"{leader} broke the handshake off: does it serve the other security.mode?"
                )
        return self._failure

    def close(self) -> None:
        self.monitor.close(linger=0)


class Follower:
    """Copies one partition (`plog`) from `role`'s leader, as replica `me`."""

    def __init__(
        self,
        me: int,
        topic: str,
        number: int,
        plog: Callable[[], PartitionLog],
        role: Role,
        fetch_max_bytes: int,
        fetch_wait_ms: int,
        copied: Callable[[int], Awaitable[None]],
        keys: Callable[[], BrokerKeys | None] = lambda: None,
    ) -> None:
        self.me = me
        self.topic = topic
        self.number = number
        self._plog = plog
        """The partition's log now (a failed log is replaced by its reopened one)."""
        self.role = role
        self.fetch_max_bytes = fetch_max_bytes
        self.fetch_wait_ms = fetch_wait_ms
        self._copied = copied
        """Called with the count of messages after each append: the worker flushes them."""
        self._keys = keys
        """This broker's keys among brokers (curve mode), None in plaintext."""
        self.leader_high_watermark = 0
        """The leader's high watermark, as its last FETCH reply said."""
        self._ids = itertools.count(1)
        self._log = RateLimitedLog(log, LOG_EVERY_S)

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.number}"

    async def run(self, context: zmq.Context[zmq.Socket[bytes]]) -> None:
        """Copy until cancelled."""
        backoff = FIRST_BACKOFF_S
        log.info(
            "%s: following broker %d (%s), leader epoch %d",
            self.name,
            self.role.leader,
            self.role.endpoint,
            self.role.epoch,
        )
        socket: zmq.Socket[bytes] | None = None
        handshakes: _Handshakes | None = None
        try:
            while True:
                try:
                    if socket is None:
                        socket, handshakes = self._connect(context)
                        channel = TrioSocket(socket, receive_frames)
                    await self._truncate(channel)
                    await self._copy(channel)  # returns when the log must be truncated again
                    backoff = FIRST_BACKOFF_S
                except (PylogError, OSError, ValueError) as error:
                    failure = None if handshakes is None else handshakes.failure()
                    kind = "handshake" if failure else type(error).__name__
                    cause = f"{failure} ({error})" if failure else str(error)
                    self._log.log(logging.WARNING, kind, f"{self.name}: {cause}; retrying")
                    await trio.sleep(backoff)
                    backoff = min(backoff * 2, MAX_BACKOFF_S)
        finally:
            if handshakes is not None:
                handshakes.close()
            if socket is not None:
                socket.close()

    def _connect(
        self, context: zmq.Context[zmq.Socket[bytes]]
    ) -> tuple[zmq.Socket[bytes], _Handshakes]:
        """A DEALER connected to the leader's front: a Curve client with this broker's keys
        in curve mode (KeyFileError when they cannot be read, or the leader's registered key
        is none of the cluster's), plaintext else; and its handshakes' monitor."""
        keys = self._keys()
        client_keys = None
        if keys is not None:
            leader_key = None if self.role.key is None else self.role.key.encode()
            client_keys = keys.to_leader(leader_key)
        socket = context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        if client_keys is not None:
            client_keys.apply(socket)
        handshakes = _Handshakes(socket, self.role)  # before connecting: no event missed
        socket.connect(self.role.endpoint)
        return socket, handshakes

    async def _request(
        self, channel: TrioSocket[list[zmq.Frame]], request: protocol.Request, version: int
    ) -> protocol.Reply:
        """Send `request` to the leader and return its reply (raising its error); Unavailable
        when none comes within the long poll and REPLY_GRACE_S."""
        correlation_id = next(self._ids) % (1 << 32)
        header = protocol.RequestHeader(request.api, version, correlation_id, f"replica-{self.me}")
        await channel.send(protocol.encode_request(header, request))
        wait_s = self.fetch_wait_ms / 1000 + REPLY_GRACE_S
        with trio.move_on_after(wait_s):
            while True:
                frames: list[Buffer] = [f.buffer for f in await channel.receive()]
                if protocol.decode_reply_header(frames).correlation_id == correlation_id:
                    return protocol.decode_reply(request.api, frames, version)
                # a reply to a request that timed out before: passed over
        raise PartitionUnavailable(
            f"{self.name}: no reply from leader {self.role.leader} ({self.role.endpoint}) "
            f"within {wait_s:g} s"
        )

    async def _truncate(self, channel: TrioSocket[list[zmq.Frame]]) -> None:
        plog = self._plog()
        latest = plog.epochs.latest_epoch
        request = protocol.OffsetForLeaderEpochRequest(self.topic, self.number, latest)
        reply = await self._request(channel, request, 1)
        assert isinstance(reply, protocol.OffsetForLeaderEpochReply)
        plog = self._plog()
        if reply.epoch < 0 or latest < 0:  # no common history: start where the leader starts
            target = reply.end_offset if reply.epoch < 0 else plog.log_start_offset
            if latest >= 0 or plog.log_end_offset != plog.log_start_offset:
                log.warning(
                    "%s: no leader epoch in common with leader %d: starting again at %d",
                    self.name,
                    self.role.leader,
                    target,
                )
            if not (plog.log_start_offset == plog.log_end_offset == target):
                plog.reset_to(target)
            return
        own_end = plog.end_offset_for_epoch(reply.epoch)[1]
        target = min(reply.end_offset, own_end)
        if target < plog.log_start_offset:
            plog.reset_to(reply.end_offset)
        elif target < plog.log_end_offset:
            plog.truncate_to(target)

    async def _copy(self, channel: TrioSocket[list[zmq.Frame]]) -> None:
        while True:
            plog = self._plog()
            offset = plog.log_end_offset
            request = protocol.FetchRequest(
                self.topic,
                self.number,
                offset,
                self.fetch_max_bytes,
                self.fetch_wait_ms,
                1,
                replica_id=self.me,
                leader_epoch=self.role.epoch,
                flushed_offset=plog.high_watermark,
            )
            try:
                reply = await self._request(channel, request, 2)
            except OffsetOutOfRange as error:
                log.info("%s: fetch at %d out of range (%s)", self.name, offset, error)
                earliest = protocol.OffsetsRequest(self.topic, self.number, protocol.EARLIEST)
                start = await self._request(channel, earliest, 1)
                assert isinstance(start, protocol.OffsetsReply)
                if offset < start.offset:  # retention on the leader went past this log's end
                    self._plog().reset_to(start.offset)
                    continue
                return  # this log holds bytes the leader does not: truncate again
            assert isinstance(reply, protocol.FetchReply)
            self.leader_high_watermark = reply.high_watermark
            if len(reply.message_set):
                plog = self._plog()
                count = plog.append_replicated(reply.message_set, offset, reply.epochs, flush=False)
                await self._copied(count)

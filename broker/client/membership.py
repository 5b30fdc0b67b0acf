"""A group member's side of the coordinated protocol (docs/protocol.md, "Consumer groups";
docs/design/group-coordinator.md, sections 5 and 6).

`Membership` holds the rules, free of I/O: fed the coordinator's replies and refusals with the
times they were sent, it says what the next heartbeat carries, what the member may own, and
whether it may hand out records (its lease). `Heartbeats` runs them: a thread of its own, with
a connection of its own (broker.client.coordinator.GroupCalls), sends the heartbeats, so a slow
handler in the thread that polls keeps its partitions; it wakes that thread (`changed`) when
the assignment moves or ownership is lost, and sends a heartbeat at once when the polling
thread reports partitions given up (`report`).

**The lease.** A member hands out no record once its session has run since it *sent* its last
answered heartbeat: the coordinator counts the session from that heartbeat's arrival, later,
so a member that the coordinator removes has stopped before its partitions are given away.

**Lost.** UNKNOWN_MEMBER_ID or FENCED_MEMBER_EPOCH: the member's partitions are another's (or
about to be); it gives every one up without committing and joins again (epoch 0) once the
polling thread has dropped them.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass, field

from broker.backoff import Backoff
from broker.client.coordinator import GroupCalls
from broker.clock import Clock
from broker.errors import (
    BrokerError,
    FencedMemberEpoch,
    PylogError,
    Unavailable,
    UnknownMemberId,
)
from broker.groups.assignors import TopicPartition
from broker.protocol import GroupHeartbeatReply, GroupHeartbeatRequest, partition_list

log = logging.getLogger("pylog.client")

RETRY_FIRST_S = 0.1
RETRY_MAX_S = 1.0
"""The heartbeat thread's back-off after a heartbeat that got no answer (the coordinator
moving, loading, or unreachable)."""
STOP_WAIT_S = 5.0
"""How long closing a member waits for a heartbeat under way before it leaves without one."""


@dataclass
class Membership:
    """A member's state in its group (module docstring): `epoch` of the last reply (0: to
    join), `assignment` the partitions the coordinator says it may own, `owned` those the
    polling thread holds (reported in each heartbeat), `lease_until` (monotonic) the end of
    its lease, `lost` set when the coordinator no longer knows it at its epoch."""

    group: str
    member_id: str
    topics: tuple[str, ...]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    instance_id: str = ""
    assignor: str = ""
    epoch: int = 0
    assignment: frozenset[TopicPartition] = frozenset()
    owned: frozenset[TopicPartition] = frozenset()
    lease_until: float = -math.inf
    lost: bool = False
    interval_s: float = 0.0
    """How long after the last reply the next heartbeat is due."""
    polled_at: float = 0.0
    """When the application last asked for records (the polling thread sets it)."""

    def request(self, leave: bool = False) -> GroupHeartbeatRequest | None:
        """The next heartbeat; a leave's with `leave` (-2 for a static member, which keeps its
        partitions for its session); None while lost: the polling thread drops what it owned
        first (a join reports nothing owned), at the application's next poll."""
        if self.lost and not leave:
            return None
        return self._heartbeat((-2 if self.instance_id else -1) if leave else self.epoch)

    def _heartbeat(self, epoch: int) -> GroupHeartbeatRequest:
        return GroupHeartbeatRequest(
            self.group,
            self.member_id,
            epoch,
            self.instance_id,
            self.session_timeout_ms,
            self.rebalance_timeout_ms,
            self.assignor,
            self.topics,
            partition_list(self.owned),
        )

    def answered(self, reply: GroupHeartbeatReply, sent_at: float) -> bool:
        """A reply to a heartbeat sent at `sent_at`; True when the polling thread has something
        to do: its owned partitions differ from the assignment, or its lease starts again."""
        renewed = self.lease_until <= sent_at
        self.epoch = reply.member_epoch
        self.assignment = frozenset(
            TopicPartition(t.topic, p) for t in reply.assignment for p in t.partitions
        )
        self.lease_until = sent_at + self.session_timeout_ms / 1000
        self.interval_s = reply.heartbeat_interval_ms / 1000
        return renewed or self.assignment != self.owned

    def refused(self, error: PylogError) -> bool:
        """A heartbeat refused; True when the member lost its partitions (UNKNOWN_MEMBER_ID,
        FENCED_MEMBER_EPOCH): it joins again once they are dropped."""
        if isinstance(error, UnknownMemberId | FencedMemberEpoch):
            self._lose()
            return True
        return False

    def past_deadline(self, now: float) -> bool:
        """Whether the application, holding partitions (or given some), has not asked for
        records for longer than its processing deadline (`rebalance_timeout_ms`, Kafka's
        max.poll.interval.ms): then the member leaves the group by itself."""
        holds = bool(self.owned or self.assignment)
        return holds and not self.lost and now - self.polled_at > self.rebalance_timeout_ms / 1000

    def deadline_passed(self) -> GroupHeartbeatRequest:
        """The leave a member past its deadline sends; it is lost from then on (its partitions
        dropped uncommitted at the next poll, then it joins again)."""
        request = self._heartbeat(-1)  # a static member too: it is not coming back soon
        self._lose()
        return request

    def _lose(self) -> None:
        """Out of the group: nothing assigned, no lease, to join again (epoch 0) once the
        polling thread dropped what it owned."""
        self.epoch, self.assignment, self.lost = 0, frozenset(), True
        self.lease_until = -math.inf

    def may_hand_out(self, now: float) -> bool:
        """Whether records may be handed out at `now`: within the lease, not lost."""
        return not self.lost and now < self.lease_until


@dataclass
class Heartbeats:
    """The heartbeat thread of a member (module docstring). `changed` is set when the polling
    thread has something to do; `failure` holds what ended the thread, for the polling thread
    to raise: a refusal nothing retries (INVALID_GROUP, AUTHORIZATION_FAILED, ...), a
    handshake the broker refused (AuthenticationFailed), or any error of the thread's own."""

    membership: Membership
    calls: GroupCalls
    clock: Clock
    changed: threading.Event
    lock: threading.Lock = field(default_factory=threading.Lock)
    failure: Exception | None = None
    _kick: threading.Event = field(default_factory=threading.Event)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    log: logging.Logger = log
    """Where its warnings go (the member's `logger`)."""

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"heartbeat-{self.membership.group}", daemon=True
        )
        self._thread.start()

    def report(self, owned: frozenset[TopicPartition], dropped_all: bool = False) -> None:
        """The polling thread owns `owned` now (`dropped_all`: after a loss, nothing): sent in a
        heartbeat at once."""
        with self.lock:
            self.membership.owned = owned
            if dropped_all:
                self.membership.lost = False
        self._kick.set()

    def _run(self) -> None:
        try:
            self._beat()
        except Exception as error:  # raised by the polling thread, never lost with this one
            self.failure = error
            self.changed.set()

    def _beat(self) -> None:
        """Heartbeats until stopped, or until the coordinator refused the member for good
        (`failure`)."""
        backoff = Backoff(RETRY_FIRST_S, RETRY_MAX_S)
        while not self._stop.is_set():
            request: GroupHeartbeatRequest | None
            with self.lock:
                if self.membership.past_deadline(self.clock.monotonic()):
                    request = self.membership.deadline_passed()
                    self.log.warning(
                        "group %s: %s has not polled for longer than its max_poll_interval_s "
                        "(%g s): leaving the group; its partitions go to others, and it joins "
                        "again at its next poll",
                        self.membership.group,
                        self.membership.member_id,
                        self.membership.rebalance_timeout_ms / 1000,
                    )
                    self.changed.set()
                else:
                    request = self.membership.request()
            wait_s = self.membership.interval_s
            if request is not None and request.member_epoch < 0:  # the deadline's leave
                try:
                    self.calls.heartbeat(request)
                except (BrokerError, Unavailable) as error:  # removed at its session then
                    self.log.warning("group %s: leave: %s", self.membership.group, error)
            elif request is not None:
                sent_at = self.clock.monotonic()
                try:
                    reply = self.calls.heartbeat(request)
                except (BrokerError, Unavailable) as error:
                    with self.lock:
                        lost = self.membership.refused(error)
                    if lost:
                        self.log.warning(
                            "group %s: %s; joining again", self.membership.group, error
                        )
                        self.changed.set()
                        continue
                    if isinstance(error, BrokerError) and not error.retriable:
                        self.failure = error
                        self.changed.set()
                        return
                    self.log.warning("group %s: heartbeat: %s", self.membership.group, error)
                    wait_s = backoff.next()
                else:
                    backoff.reset()
                    with self.lock:
                        if self.membership.answered(reply, sent_at):
                            self.changed.set()
                    wait_s = self.membership.interval_s
            self._kick.wait(wait_s)
            self._kick.clear()

    def leave(self) -> None:
        """Stop the thread, then leave the group (the member committed before); a leave
        that gets no answer, or a thread still waiting on one, is left to the session's end."""
        if not self.stop():
            return
        with self.lock:
            request = self.membership.request(leave=True)
        if request is None or self.membership.epoch <= 0:  # not in the group
            return
        try:
            self.calls.heartbeat(request)
        except (BrokerError, Unavailable) as error:
            self.log.warning("group %s: leave: %s", self.membership.group, error)

    def stop(self) -> bool:
        """Stop the thread; False when it is still waiting on a heartbeat after STOP_WAIT_S
        (it ends with that heartbeat)."""
        self._stop.set()
        self._kick.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(STOP_WAIT_S)
            return not self._thread.is_alive()
        return True

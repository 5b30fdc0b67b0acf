"""A partition's replication on this broker (Kafka's `Partition`; docs/replication.md): the rules,
with no I/O. The worker feeds a Replica the roles the supervisor reads from the partition's
state node, its log's flushes, the followers' fetches, the lease and the time; the Replica
says what to do (lead from an offset, follow a leader, neither), which acks to answer and
which to fail, and what may be served. The worker does the I/O: the log (appends, the epoch
entry a term starts with), the copy loop, the checkpoint of the high watermark, the sockets.

- **Serving** (`check_serving`): a partition of one replica is always served here; a
  replicated one only by its leader, in a term, under a lease that covers the incarnation the
  role named (Fencing): NOT_LEADER_FOR_PARTITION otherwise, naming the leader known, or -1
  when this broker leads but may have been replaced.
- **Roles** (`adopt`): a role naming this broker in another incarnation than the lease's is
  not taken (the controller chooses anew); in the same term (leader epoch) only the ISR and
  replicas change; a new term, or another leader, ends the term here (its acks failed).
- **Acks**: ack=flushed waits for the log's flushed end (`answer_flushed`), ack=all for the
  high watermark (`answer_high_watermark`); either is failed NOT_LEADER_FOR_PARTITION
  (leader -1) when it comes due while this broker may not lead, NOT_ENOUGH_REPLICAS when the
  ISR shrinks below min_insync_replicas, NOT_LEADER_FOR_PARTITION (the leader known) when the
  term ends.
- **The high watermark** (`answer_high_watermark`, LeaderState.raise_high_watermark) never
  moves back within a term; a term starts it at the lower of the one last seen
  (`high_watermark_seen`, kept across restarts by the worker's checkpoint) and the log's
  flushed end.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from broker import protocol
from broker.control import PartitionRole
from broker.errors import NotEnoughReplicas, NotLeaderForPartition, PylogError
from broker.log.message import Buffer
from broker.replication.leader import LeaderState
from broker.replication.lease import Lease

Reply = tuple[bytes, Buffer]
"""A one-frame reply (an ack, an error) and the tagged identity it goes to."""


class PendingAck(NamedTuple):
    """A produce waiting for its messages, which end at `end`, to be flushed (ack=flushed) or
    under the high watermark (ack=all)."""

    end: int
    correlation_id: int
    reply: Reply


AckRoute = deque[PendingAck] | Literal["now", "never"]
"""Where a produce's answer goes (Replica.waiting_for): the queue it waits in, sent at once, or
none sent (ack=none)."""

Adoption = Literal["kept", "lead", "follow", "none"]
"""What a role asks of the worker (Replica.adopt): nothing more (the same leader followed, or
the ISR of this term updated), a new term here (`start_term` once the log has the epoch's
entry), a copy loop from the role's leader, or neither."""


@dataclass(eq=False)
class Replica:
    """The replication state of one partition held by broker `me`; `lease` is the worker's,
    shared by its replicas."""

    name: str
    me: int
    lease: Lease
    replicated: bool = False
    """Whether it has other replicas (a role said so): then only its leader serves clients,
    and they see up to the high watermark the in-sync replicas agree on."""
    role: PartitionRole | None = None
    """The last role (the state node as the supervisor read it)."""
    known_leader: int = -1
    leader_epoch: int = -1
    leader_broker_epoch: int = -1
    """The leader, leader epoch and the leader's incarnation as the last role said."""
    min_insync: int = 1
    leader: LeaderState | None = None
    """Its followers, the ISR and the high watermark, while it leads here."""
    high_watermark_seen: int = 0
    """The replicated high watermark as last known here (led, or told by the leader): where a
    term here starts it."""
    acks: deque[PendingAck] = field(default_factory=deque)
    """The ack=flushed produces waiting for a flush, in the order of their offsets: a flush
    answers a prefix of them. Plain entries, not a task each: with a hundred batches in flight
    a task per ack was a third of the worker's CPU."""
    all_acks: deque[PendingAck] = field(default_factory=deque)
    """The ack=all produces waiting for the high watermark, in the order of their offsets."""

    # -- serving -------------------------------------------------------------------------

    def leads(self, now: float) -> bool:
        """Whether it leads here at `now`: a term, and the lease covering the incarnation the
        term was given to."""
        return self.leader is not None and self.lease.covers(self.leader_broker_epoch, now)

    def fenced(self) -> NotLeaderForPartition:
        """What a leader whose lease does not cover it answers: another may lead now, for all
        it can tell (leader -1: not known)."""
        return NotLeaderForPartition(self.name, -1, self.leader_epoch)

    def not_leader(self) -> NotLeaderForPartition:
        return NotLeaderForPartition(self.name, self.known_leader, self.leader_epoch)

    def check_serving(self, now: float) -> None:
        """NotLeaderForPartition unless clients (and followers) may be served here at `now`."""
        if self.replicated and not self.leads(now):
            raise self.not_leader() if self.leader is None else self.fenced()

    def high_watermark(self, flushed: int) -> int:
        """What consumers may read up to, the log's flushed end being `flushed`: the
        replicated high watermark while it leads here; as a follower, the one the leader last
        sent, within the bytes flushed here; `flushed` for a partition of one replica."""
        leader = self.leader
        if leader is not None:
            return leader.high_watermark
        return min(self.high_watermark_seen, flushed) if self.replicated else flushed

    def start_at(self, log_start: int) -> int | None:
        """The log now starts at `log_start` (an empty log started past its end: nothing lies
        below it): the high watermark raised there if it was below, in the term and as seen;
        the new one (the caller keeps it and wakes the consumers), or None if none moved."""
        moved = None
        leader = self.leader
        if leader is not None and leader.high_watermark < log_start:
            leader.high_watermark = moved = log_start
        if self.high_watermark_seen < log_start:
            self.high_watermark_seen = moved = log_start
        return moved

    # -- acks ----------------------------------------------------------------------------

    def admit(self, ack: int, now: float) -> None:
        """Whether a produce at `ack` may be appended here at `now`: NotLeaderForPartition
        unless served here (`check_serving`), and, for a replicated partition at ack=all,
        NotEnoughReplicas while its ISR is below min_insync_replicas (Kafka's
        `appendRecordsToLeader`: nothing appended that could not be acknowledged)."""
        if not self.replicated:
            return
        self.check_serving(now)
        leader = self.leader
        assert leader is not None
        if ack == protocol.Ack.ALL and len(leader.isr) < self.min_insync:
            raise NotEnoughReplicas(self.name, len(leader.isr), self.min_insync)

    def waiting_for(self, ack: int, end: int, flushed: int) -> AckRoute:
        """Where the answer of a produce at `ack`, whose messages end at `end`, goes with the
        log flushed up to `flushed`: "never" at ack=none; "now" at ack=written, or when what
        its level asks already holds; else the queue a flush (`answer_flushed`) or the high
        watermark (`answer_high_watermark`, at ack=all of a replicated partition led here)
        answers it from. ack=all of a partition without replicas is ack=flushed."""
        if ack == protocol.Ack.NONE:
            return "never"
        leader = self.leader
        if ack == protocol.Ack.ALL and leader is not None:
            return "now" if leader.high_watermark >= end else self.all_acks
        if ack == protocol.Ack.WRITTEN or flushed >= end:
            return "now"
        return self.acks

    def answer_flushed(self, flushed: int, now: float) -> list[Reply]:
        """The log is flushed up to `flushed`: the acks of the ack=flushed produces it stored
        (their failure, when this replicated partition may not be led here now)."""
        acks = self.acks
        if acks and acks[0].end <= flushed and self.replicated and not self.leads(now):
            return fail(acks, self.fenced())  # it may have been replaced: no ack
        return answer(acks, flushed)

    def answer_high_watermark(self, flushed: int, now: float) -> tuple[int | None, list[Reply]]:
        """Recompute the high watermark of the term (a flush, a follower's fetch, an ISR
        change) with the log flushed up to `flushed`: if it moved, the new one (the caller
        keeps it, then wakes the consumers it satisfies) and the answers of the ack=all
        produces it covers (their failure, when this broker may not lead now); else None and
        no answer."""
        leader = self.leader
        assert leader is not None
        if not leader.raise_high_watermark(flushed):
            return None, []
        high_watermark = self.high_watermark_seen = leader.high_watermark
        acks = self.all_acks
        if acks and acks[0].end <= high_watermark and not self.leads(now):
            return high_watermark, fail(acks, self.fenced())  # it may have been replaced
        return high_watermark, answer(acks, high_watermark)

    def fail_acks(self, error: PylogError) -> list[Reply]:
        """Every waiting ack (ack=flushed and ack=all) answered `error` instead: its messages
        will not be stored, or not as promised."""
        return fail(self.acks, error) + fail(self.all_acks, error)

    # -- roles ---------------------------------------------------------------------------

    def mine(self, role: PartitionRole) -> bool:
        """Whether `role` names this broker the leader, in the incarnation the lease was last
        renewed for: a leadership given to an earlier one (before a restart, or a session
        that expired) is not taken; the controller chooses anew once it sees the broker's new
        epoch."""
        return role.leader == self.me and role.leader_broker_epoch == self.lease.broker_epoch

    def adopt(
        self, role: PartitionRole, following: bool, now: float
    ) -> tuple[Adoption, list[Reply]]:
        """Take `role` (`following`: whether a copy loop from its leader in its epoch runs
        already): what it asks of the worker, and the failures of the acks that can no longer
        be given (a term that ends: the caller wakes the long polls, which find it not led
        here and answer so; an ISR below min_insync_replicas)."""
        self.role = role
        self.replicated = True
        self.min_insync = role.min_insync_replicas
        self.known_leader, self.leader_epoch = role.leader, role.leader_epoch
        self.leader_broker_epoch = role.leader_broker_epoch
        if following:
            return "kept", []
        current = self.leader
        if current is not None and current.epoch == role.leader_epoch and self.mine(role):
            current.set_isr(role.isr, role.version)  # an ISR change in this term
            if role.replicas != current.replicas:  # a reassignment's
                current.set_replicas(role.replicas, now)
            if len(current.isr) < self.min_insync:  # what waits was promised more
                error = NotEnoughReplicas(self.name, len(current.isr), self.min_insync)
                return "kept", fail(self.all_acks, error)
            return "kept", []
        failed = self.stop_leading()
        if role.leader == self.me:
            return "lead" if self.mine(role) else "none", failed
        return "follow" if role.leader >= 0 and role.endpoint else "none", failed

    def start_term(self, start: int, flushed: int, lag_max_s: float, now: float) -> LeaderState:
        """Lead in the role's epoch from `start` (the log end, once the epoch's entry is in the
        log's history), the high watermark from the lower of the one last seen and `flushed`;
        the term's LeaderState."""
        role = self.role
        assert role is not None
        self.leader = LeaderState(
            self.me,
            role.leader_epoch,
            start,
            role.replicas,
            role.isr,
            min(self.high_watermark_seen, flushed),
            lag_max_s,
            now,
            role.version,
        )
        return self.leader

    def stop_leading(self) -> list[Reply]:
        """End the term here, if there is one: its acks' failures."""
        if self.leader is None:
            return []
        self.leader = None
        return self.fail_acks(self.not_leader())

    def isr_to_ask(self, now: float, fetched: int | None = None) -> tuple[int, ...] | None:
        """The ISR change to ask the supervisor for now (LeaderState.wanted_isr), never by a
        leader that may have been replaced."""
        leader = self.leader
        if leader is None or not self.leads(now):
            return None
        return leader.wanted_isr(now, fetched)


def answer(acks: deque[PendingAck], end: int) -> list[Reply]:
    """The answers of the first of `acks`, those that end by `end`, taken out."""
    replies = []
    while acks and acks[0].end <= end:
        replies.append(acks.popleft().reply)
    return replies


def fail(acks: deque[PendingAck], error: PylogError) -> list[Reply]:
    """Each of `acks` answered `error`; they are forgotten."""
    replies = []
    for ack in acks:
        (frame,) = protocol.encode_error(ack.correlation_id, error)
        replies.append((ack.reply[0], frame))
    acks.clear()
    return replies

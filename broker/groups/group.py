"""One group as its coordinator keeps it: members, epochs, the target and reconciliation
(docs/design/group-coordinator.md, sections 2 to 5), free of I/O.

A `Group` is fed requests with their arrival time and the clock for its expiries; each call
changes the group in memory and returns its reply with the `Write` that must land in the
registry before the reply is sent. A request refused raises the error it is answered with
(broker.errors: UnknownMemberId, FencedMemberEpoch, UnreleasedInstanceId, InvalidGroup,
GroupNotEmptyError) and changes nothing. The coordinator applies writes in the order they were made;
when one fails it drops the group and loads it again from the registry, so memory never runs
ahead of what ZooKeeper holds for longer than a write. Replies that give nothing away (a
request to revoke, an unchanged assignment) carry an empty write.

Durable, in each member's node: its subscription, timeouts, member epoch (and the one before),
whether it left as a static member, and `assigned`: every partition it owns, those it is being
asked to revoke included, with the assignment epoch it was given at. The group's epochs are in
its `state` node; owner nodes name each owned partition's member (its instance id when it has
one) for readers. In memory only: the target and its epoch, each member's last heartbeat and
revocation deadline, and the owner of each partition (from the members' `assigned`).

Epochs: the group epoch moves at each change of the members, their subscriptions or assignors,
or the partitions of a topic subscribed; the target is computed again at once and its
assignment epoch is that group epoch. A member's epoch becomes the assignment epoch when it
joins and when its partitions change; a member whose partitions stay keeps its epoch and costs
no write.

Reconciliation, one member at a time at each of its heartbeats: (1) partitions it owns but
should not are asked back: it is answered its assignment without them, keeps its epoch, and
must give them up (commit, then drop them from `owned`) before `rebalance_timeout_ms`; (2) once
it owns none of them they are released; (3) partitions of its target that no other member owns
are given, at most `GIVE_LIMIT` a step. A partition goes to a new owner only after the old one
gave it up, left, or was removed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from broker.errors import (
    FencedMemberEpoch,
    GroupNotEmptyError,
    InvalidGroup,
    UnknownMemberId,
    UnreleasedInstanceId,
)
from broker.groups.assignors import ASSIGNORS, Subscriber, TopicPartition
from broker.protocol.codes import ErrorCode
from broker.registry.nodes import check_name

GIVE_LIMIT = 1000
"""Partitions given (or taken back from a removed member's owner nodes) in one step: a step is
one registry transaction, and 1,000 owner nodes are about 150 KB (ZooKeeper's jute.maxbuffer is
1 MiB); the rest are given at the member's next heartbeat."""

WAITING_INTERVAL_MS = 100
"""The heartbeat interval of a member waiting for partitions that others still hold."""

MAX_REBALANCE_TIMEOUT_MS = 2**31 - 1

LEAVE = -1
"""A member epoch that leaves the group: its partitions are freed at once."""

LEAVE_STATIC = -2
"""A member epoch with which a static member leaves for a moment: it keeps its partitions for
its session, for its instance to come back."""


@dataclass(frozen=True, slots=True)
class Rules:
    """The broker's group settings."""

    heartbeat_interval_ms: int = 1000
    min_session_timeout_ms: int = 2000
    max_session_timeout_ms: int = 300_000
    assignor: str = "uniform"


class State(IntEnum):
    """What DESCRIBE_GROUP says of a group."""

    EMPTY = 0
    STABLE = 1
    """Every member owns its target."""
    RECONCILING = 2


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A GROUP_HEARTBEAT: join (`member_epoch` 0), stay, report what it owns; leave (-1, -2)."""

    member_id: str
    member_epoch: int
    topics: tuple[str, ...]
    owned: frozenset[TopicPartition] = frozenset()
    instance_id: str = ""
    session_timeout_ms: int = 10_000
    rebalance_timeout_ms: int = 300_000
    assignor: str = ""
    client_id: str = ""
    client_host: str = ""


@dataclass(frozen=True, slots=True)
class HeartbeatReply:
    member_epoch: int
    heartbeat_interval_ms: int
    assignment: frozenset[TopicPartition]


@dataclass(slots=True)
class Member:
    """A member: its node's content, and (in memory) its last heartbeat and the deadline of
    the revocation asked of it."""

    member_id: str
    topics: frozenset[str]
    member_epoch: int
    instance_id: str = ""
    client_id: str = ""
    client_host: str = ""
    assignor: str = ""
    session_timeout_ms: int = 10_000
    rebalance_timeout_ms: int = 300_000
    previous_epoch: int = 0
    left: bool = False
    assigned: dict[TopicPartition, int] = field(default_factory=dict)
    last_seen: float = 0.0
    revoke_deadline: float | None = None

    @property
    def owner_name(self) -> str:
        """What its owner nodes hold: its instance id when it has one (so a static member
        coming back under a new member id owns them unchanged), else its member id."""
        return self.instance_id or self.member_id

    def node(self) -> dict[str, Any]:
        """Its node's content (docs/registry.md); `load` reads it back."""
        assigned: dict[str, dict[str, int]] = {}
        for tp, epoch in sorted(self.assigned.items()):
            assigned.setdefault(tp.topic, {})[str(tp.partition)] = epoch
        return {
            "topics": sorted(self.topics),
            "instance_id": self.instance_id or None,
            "client_id": self.client_id,
            "client_host": self.client_host,
            "assignor": self.assignor,
            "session_timeout_ms": self.session_timeout_ms,
            "rebalance_timeout_ms": self.rebalance_timeout_ms,
            "member_epoch": self.member_epoch,
            "previous_member_epoch": self.previous_epoch,
            "left": self.left,
            "assigned": assigned,
        }

    @classmethod
    def from_node(cls, member_id: str, node: Mapping[str, Any]) -> Member:
        return cls(
            member_id=member_id,
            topics=frozenset(node["topics"]),
            member_epoch=node["member_epoch"],
            instance_id=node["instance_id"] or "",
            client_id=node["client_id"],
            client_host=node["client_host"],
            assignor=node["assignor"],
            session_timeout_ms=node["session_timeout_ms"],
            rebalance_timeout_ms=node["rebalance_timeout_ms"],
            previous_epoch=node["previous_member_epoch"],
            left=node["left"],
            assigned={
                TopicPartition(topic, int(number)): epoch
                for topic, numbers in node["assigned"].items()
                for number, epoch in numbers.items()
            },
        )

    def session_deadline(self) -> float:
        return self.last_seen + self.session_timeout_ms / 1000


@dataclass(slots=True)
class Write:
    """What a step changes in the registry, each node as (before, after): the coordinator
    creates a node that was None, deletes one that becomes None, and sets one that changed.
    Written in one transaction, conditional on the version of `state` it last wrote."""

    group_epoch: int | None = None
    """The group epoch to write into `state`; None when it did not move."""
    members: dict[str, tuple[dict[str, Any] | None, dict[str, Any] | None]] = field(
        default_factory=dict
    )
    owners: dict[TopicPartition, tuple[str | None, str | None]] = field(default_factory=dict)
    offsets: dict[TopicPartition, tuple[int | None, int]] = field(default_factory=dict)

    def member(
        self, member_id: str, before: dict[str, Any] | None, after: dict[str, Any] | None
    ) -> None:
        first = self.members[member_id][0] if member_id in self.members else before
        self.members[member_id] = (first, after)

    def owner(self, tp: TopicPartition, before: str | None, after: str | None) -> None:
        first = self.owners[tp][0] if tp in self.owners else before
        self.owners[tp] = (first, after)

    def offset_chunks(self, limit: int) -> list[Write]:
        """A write of offsets only (a commit's) as writes of at most `limit` offsets each, in
        order: a transaction must stay within ZooKeeper's jute.maxbuffer."""
        items = list(self.offsets.items())
        return [Write(offsets=dict(items[i : i + limit])) for i in range(0, len(items), limit)]

    def changes(self) -> int:
        """The registry operations it takes (`state` counted once when it moves)."""
        nodes = [*self.members.values(), *self.owners.values()]
        return (
            (self.group_epoch is not None)
            + sum(before != after for before, after in nodes)
            + len(self.offsets)
        )

    def __bool__(self) -> bool:
        return self.changes() > 0


@dataclass(frozen=True, slots=True)
class MemberDescription:
    member: Member
    revoking: frozenset[TopicPartition]
    waiting: frozenset[TopicPartition]


@dataclass(frozen=True, slots=True)
class GroupDescription:
    state: State
    group_epoch: int
    assignment_epoch: int
    assignor: str
    members: tuple[MemberDescription, ...]


class Group:
    """One group (module docstring). `partitions` maps each topic the coordinator knows to its
    partition numbers in `range`'s order (by name broker, then number)."""

    def __init__(
        self,
        name: str,
        rules: Rules,
        now: float,
        *,
        group_epoch: int = 0,
        members: Iterable[Member] = (),
        offsets: Mapping[TopicPartition, int] | None = None,
        partitions: Mapping[str, Sequence[int]] | None = None,
    ) -> None:
        check_name("group", name)
        self.name = name
        self.rules = rules
        self.group_epoch = group_epoch
        self._members = {m.member_id: m for m in members}
        self._offsets = dict(offsets or {})
        self._partitions = {t: tuple(numbers) for t, numbers in (partitions or {}).items()}
        self._owner: dict[TopicPartition, str] = {}
        for member in self._members.values():
            member.last_seen = now  # a loaded member gets a whole session from the load
            member.revoke_deadline = None
            for tp in member.assigned:
                self._owner[tp] = member.member_id
        self._target: dict[str, frozenset[TopicPartition]] = {}
        self.assignment_epoch = group_epoch
        self._compute_target({m.member_id: frozenset(m.assigned) for m in self._members.values()})

    # -- requests --------------------------------------------------------------------------

    def heartbeat(self, request: Heartbeat, now: float) -> tuple[HeartbeatReply, Write]:
        """Answer a GROUP_HEARTBEAT arriving at `now`; raises the error of a refusal."""
        write = Write()
        if request.member_epoch in (LEAVE, LEAVE_STATIC):
            member = self._known(request.member_id)
            if request.member_epoch == LEAVE_STATIC and member.instance_id:
                before = member.node()
                member.left, member.last_seen = True, now
                write.member(member.member_id, before, member.node())
                return HeartbeatReply(LEAVE_STATIC, 0, frozenset()), write
            self._remove(member, write)
            self._rebalance(write)
            return HeartbeatReply(LEAVE, 0, frozenset()), write
        self._check(request)
        if request.member_epoch == 0:
            member = self._join(request, now, write)
        else:
            member = self._known(request.member_id)
            if member.left:
                raise FencedMemberEpoch(f"member {member.member_id} left the group")
            owns = member.assigned.keys()
            current = request.member_epoch == member.member_epoch
            lost_reply = request.member_epoch == member.previous_epoch
            if not (current or lost_reply) or not request.owned <= owns:
                raise FencedMemberEpoch(
                    f"member {member.member_id} is at epoch {member.member_epoch}, not "
                    f"{request.member_epoch}, or owns less than it reports"
                )
            member.last_seen = now
            self._update(member, request, write)
        self._reconcile(member, request.owned, now, write)
        target = self._target.get(member.member_id, frozenset())
        waiting = any(tp not in member.assigned for tp in target)
        interval = min(self.rules.heartbeat_interval_ms, member.session_timeout_ms // 3)
        assignment = frozenset(tp for tp in member.assigned if tp in target)
        reply = HeartbeatReply(
            member.member_epoch, WAITING_INTERVAL_MS if waiting else interval, assignment
        )
        return reply, write

    def commit(
        self, member_id: str, member_epoch: int, parts: Sequence[tuple[TopicPartition, int]]
    ) -> tuple[list[ErrorCode], Write]:
        """Answer an OFFSET_COMMIT: an error code per part (NONE: accepted) and the write of
        the accepted offsets that changed. A member's part is accepted when the partition is
        assigned to it (being revoked included) at an epoch not above `member_epoch`, which must
        not be above the member's own (KIP-1251). Without a member (`member_id` empty) the
        group must have no member subscribing to a topic of the request."""
        write = Write()
        results: list[ErrorCode] = []
        if member_id:
            member = self._known(member_id)
            if member.left or member_epoch > member.member_epoch:
                raise FencedMemberEpoch(
                    f"member {member_id} is at epoch {member.member_epoch}, not {member_epoch}"
                )
            for tp, _ in parts:
                given_at = member.assigned.get(tp)
                ok = given_at is not None and given_at <= member_epoch
                results.append(ErrorCode.NONE if ok else ErrorCode.PARTITION_NOT_ASSIGNED)
        else:
            topics = {tp.topic for tp, _ in parts}
            readers = sorted(m.member_id for m in self._members.values() if m.topics & topics)
            if readers:
                raise GroupNotEmptyError(f"members {', '.join(readers)} read these topics")
            for tp, _ in parts:
                known = tp.partition in self._partitions.get(tp.topic, ())
                results.append(ErrorCode.NONE if known else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        for (tp, offset), result in zip(parts, results, strict=True):
            before = self._offsets.get(tp)
            if result is ErrorCode.NONE and before != offset:
                self._offsets[tp] = offset
                first = write.offsets[tp][0] if tp in write.offsets else before
                write.offsets[tp] = (first, offset)
        return results, write

    def set_partitions(self, topic: str, numbers: Sequence[int] | None) -> Write:
        """A topic was created, grew, or (None) was deleted: a new target when a member
        subscribes to it."""
        write = Write()
        before = self._partitions.get(topic)
        after = None if numbers is None else tuple(numbers)
        if before == after:
            return write
        if after is None:
            del self._partitions[topic]
        else:
            self._partitions[topic] = after
        if any(topic in m.topics for m in self._members.values()):
            self._rebalance(write)
        return write

    def expire(self, now: float) -> tuple[list[str], Write]:
        """Remove the members whose session or revocation deadline has passed by `now`: their
        ids and the write."""
        write = Write()
        gone = [m for m in self._members.values() if self._expired(m, now)]
        for member in gone:
            self._remove(member, write)
        if gone:
            self._rebalance(write)
        return [m.member_id for m in gone], write

    def next_expiry(self) -> float | None:
        """When `expire` should run next; None without members."""
        deadlines = [m.session_deadline() for m in self._members.values()]
        deadlines += [
            m.revoke_deadline for m in self._members.values() if m.revoke_deadline is not None
        ]
        return min(deadlines, default=None)

    # -- reading ---------------------------------------------------------------------------

    @property
    def offsets(self) -> dict[TopicPartition, int]:
        return dict(self._offsets)

    @property
    def members(self) -> dict[str, Member]:
        return dict(self._members)

    def describe(self) -> GroupDescription:
        described = []
        for member in sorted(self._members.values(), key=lambda m: m.member_id):
            target = self._target.get(member.member_id, frozenset())
            revoking = frozenset(tp for tp in member.assigned if tp not in target)
            waiting = frozenset(tp for tp in target if tp not in member.assigned)
            described.append(MemberDescription(member, revoking, waiting))
        if not described:
            state = State.EMPTY
        elif any(d.revoking or d.waiting for d in described):
            state = State.RECONCILING
        else:
            state = State.STABLE
        return GroupDescription(
            state, self.group_epoch, self.assignment_epoch, self.assignor(), tuple(described)
        )

    def assignor(self) -> str:
        """The assignor most members name (an empty name is the broker's), the broker's on a
        tie."""
        named = Counter(m.assignor or self.rules.assignor for m in self._members.values())
        ranked = named.most_common()
        if not ranked or (len(ranked) > 1 and ranked[0][1] == ranked[1][1]):
            return self.rules.assignor
        return ranked[0][0]

    # -- steps -----------------------------------------------------------------------------

    def _check(self, request: Heartbeat) -> None:
        rules = self.rules
        try:
            check_name("member id", request.member_id)
            if request.instance_id:
                check_name("instance id", request.instance_id)
            for topic in request.topics:
                check_name("topic", topic)
        except ValueError as e:
            raise InvalidGroup(str(e)) from None
        if not request.topics:
            raise InvalidGroup("a member subscribes to at least one topic")
        if not rules.min_session_timeout_ms <= request.session_timeout_ms:
            raise InvalidGroup(
                f"session_timeout_ms {request.session_timeout_ms} is below the broker's "
                f"group.min_session_timeout_ms ({rules.min_session_timeout_ms})"
            )
        if not request.session_timeout_ms <= rules.max_session_timeout_ms:
            raise InvalidGroup(
                f"session_timeout_ms {request.session_timeout_ms} is above the broker's "
                f"group.max_session_timeout_ms ({rules.max_session_timeout_ms})"
            )
        if not 1 <= request.rebalance_timeout_ms <= MAX_REBALANCE_TIMEOUT_MS:
            raise InvalidGroup(
                f"rebalance_timeout_ms {request.rebalance_timeout_ms} is not within 1 and "
                f"{MAX_REBALANCE_TIMEOUT_MS}"
            )
        if request.assignor and request.assignor not in ASSIGNORS:
            raise InvalidGroup(
                f"assignor {request.assignor!r} is not one of {', '.join(sorted(ASSIGNORS))}"
            )
        if request.member_epoch == 0 and request.owned:
            raise InvalidGroup("a member joining (epoch 0) owns nothing yet")

    def _known(self, member_id: str) -> Member:
        member = self._members.get(member_id)
        if member is None:
            raise UnknownMemberId(f"no member {member_id!r} in group {self.name}")
        return member

    def _join(self, request: Heartbeat, now: float, write: Write) -> Member:
        earlier = self._members.get(request.member_id)
        holder = self._instance_holder(request.instance_id)
        if holder is not None and holder is not earlier and not holder.left:
            raise UnreleasedInstanceId(
                f"instance {request.instance_id} is member {holder.member_id}'s, which has not left"
            )
        if earlier is not None and earlier is not holder:
            # A member id is unique: its earlier incarnation goes first.
            self._remove(earlier, write)
        joiner = Member(
            member_id=request.member_id,
            topics=frozenset(request.topics),
            member_epoch=0,
            instance_id=request.instance_id,
            client_id=request.client_id,
            client_host=request.client_host,
            assignor=request.assignor,
            session_timeout_ms=request.session_timeout_ms,
            rebalance_timeout_ms=request.rebalance_timeout_ms,
            last_seen=now,
        )
        if holder is not None:
            # The instance comes back (or its member joins again): the joiner takes its place,
            # partitions and epoch.
            joiner.member_epoch, joiner.previous_epoch = holder.member_epoch, holder.previous_epoch
            joiner.assigned = dict(holder.assigned)
            del self._members[holder.member_id]
            write.member(holder.member_id, holder.node(), None)
            self._members[joiner.member_id] = joiner
            for tp in joiner.assigned:
                self._owner[tp] = joiner.member_id
            self._target[joiner.member_id] = self._target.pop(holder.member_id, frozenset())
            write.member(joiner.member_id, None, joiner.node())
            same = (holder.topics, holder.assignor) == (joiner.topics, joiner.assignor)
            if (earlier is not None and earlier is not holder) or not same:
                self._rebalance(write)
            return joiner
        self._members[joiner.member_id] = joiner
        self._rebalance(write)
        joiner.member_epoch = self.assignment_epoch
        write.member(joiner.member_id, None, joiner.node())
        return joiner

    def _update(self, member: Member, request: Heartbeat, write: Write) -> None:
        """A heartbeat may change a member's subscription, assignor and timeouts, and the
        client id and address it comes from (its node is written only when one changed)."""
        before = member.node()
        topics = frozenset(request.topics)
        moved = (topics, request.assignor) != (member.topics, member.assignor)
        member.topics, member.assignor = topics, request.assignor
        member.session_timeout_ms = request.session_timeout_ms
        member.rebalance_timeout_ms = request.rebalance_timeout_ms
        member.client_id, member.client_host = request.client_id, request.client_host
        if member.node() != before:
            write.member(member.member_id, before, member.node())
        if moved:
            self._rebalance(write)

    def _reconcile(
        self, member: Member, owned: frozenset[TopicPartition], now: float, write: Write
    ) -> None:
        target = self._target.get(member.member_id, frozenset())
        revoke = [tp for tp in member.assigned if tp not in target]
        if any(tp in owned for tp in revoke):
            if member.revoke_deadline is None:
                member.revoke_deadline = now + member.rebalance_timeout_ms / 1000
            return
        member.revoke_deadline = None
        before = member.node()
        for tp in revoke:
            del member.assigned[tp]
            del self._owner[tp]
            write.owner(tp, member.owner_name, None)
        give = sorted(tp for tp in target if tp not in member.assigned and tp not in self._owner)
        for tp in give[:GIVE_LIMIT]:
            member.assigned[tp] = self.assignment_epoch
            self._owner[tp] = member.member_id
            write.owner(tp, None, member.owner_name)
        if revoke or give:
            if member.member_epoch != self.assignment_epoch:
                member.previous_epoch, member.member_epoch = (
                    member.member_epoch,
                    self.assignment_epoch,
                )
            write.member(member.member_id, before, member.node())

    def _remove(self, member: Member, write: Write) -> None:
        del self._members[member.member_id]
        for tp in member.assigned:
            del self._owner[tp]
            write.owner(tp, member.owner_name, None)
        write.member(member.member_id, member.node(), None)
        self._target.pop(member.member_id, None)

    def _rebalance(self, write: Write) -> None:
        self.group_epoch += 1
        write.group_epoch = self.group_epoch
        self._compute_target(self._target)
        self.assignment_epoch = self.group_epoch

    def _compute_target(self, previous: Mapping[str, frozenset[TopicPartition]]) -> None:
        subscribers = {
            m.member_id: Subscriber(m.topics, m.instance_id or m.member_id)
            for m in self._members.values()
        }
        subscribed = {t for m in self._members.values() for t in m.topics}
        partitions = {t: n for t, n in self._partitions.items() if t in subscribed}
        self._target = ASSIGNORS[self.assignor()](subscribers, partitions, previous)

    def _instance_holder(self, instance_id: str) -> Member | None:
        if not instance_id:
            return None
        return next((m for m in self._members.values() if m.instance_id == instance_id), None)

    def _expired(self, member: Member, now: float) -> bool:
        if now >= member.session_deadline():
            return True
        return member.revoke_deadline is not None and now >= member.revoke_deadline

"""A broker's group coordinator (docs/design/group-coordinator.md, sections 1, 2 and 8): the
groups this broker coordinates, served on the front's loop.

A group's requests (GROUP_HEARTBEAT, OFFSET_COMMIT, OFFSET_FETCH, DESCRIBE_GROUP, DELETE_GROUP)
go to the broker that rendezvous hashing chooses among the brokers up (broker.groups.choice);
any other broker answers NOT_COORDINATOR naming it. The chosen broker claims the group in
ZooKeeper (its ephemeral claim node; COORDINATOR_LOADING while another broker's claim stands),
loads it, and then answers from memory (broker.groups.group). Nothing on the loop waits: the
claim and every write run on the coordinator's own registry thread, in the order they were
made, and come back as events on the loop (broker.registry_calls). A reply is sent once every
write made before it has landed, so nothing is promised that ZooKeeper does not hold. When a
write fails, the writes after it are not sent, their replies are refused, and the group is
dropped from memory, to be claimed and loaded again at its next request.

The coordinator acts only while the broker's lease covers (broker.replication.lease): a broker
cut off from ZooKeeper answers COORDINATOR_LOADING, and one whose session was replaced drops
every group (its claims went with the old session).
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from broker import protocol
from broker.clock import SYSTEM_CLOCK, Clock
from broker.config import BrokerConfig
from broker.errors import (
    CoordinatorLoading,
    GroupHasZooKeeperMembers,
    GroupNotEmptyError,
    InvalidGroup,
    NotCoordinator,
    PylogError,
    RegistryUnavailable,
    UnknownGroup,
)
from broker.groups.assignors import TopicPartition
from broker.groups.choice import coordinator_of
from broker.groups.group import GIVE_LIMIT, Group, GroupDescription, Heartbeat, Member, Rules, Write
from broker.pool import Answers
from broker.registry import ClaimedElsewhere, ClaimedGroup, Registry, partition_name
from broker.registry.nodes import check_name, is_int
from broker.registry.session import BadVersion
from broker.registry_calls import RegistryCalls
from broker.topics import Topics

log = logging.getLogger("pylog.groups")

HOUSEKEEPING_S = 0.05
"""How often `tick` looks at the groups: members' sessions end at most this late."""

PAPER_STATE = 3
"""DESCRIBE_GROUP's state of a group run by members of the paper's protocol."""


@dataclass(frozen=True, slots=True)
class GroupStatistics:
    """The coordinator's figures (broker.metrics), as of its last housekeeping: the groups it
    coordinates, their members, and the registry writes that landed (transactions) and the
    node operations in them."""

    groups: int = 0
    members: int = 0
    registry_writes: int = 0
    registry_operations: int = 0


GroupRequest = (
    protocol.GroupHeartbeatRequest
    | protocol.OffsetCommitRequest
    | protocol.OffsetFetchRequest
    | protocol.DescribeGroupRequest
    | protocol.DeleteGroupRequest
)


@dataclass
class _Answer:
    """Where a request's reply goes: the client's tagged identity and its correlation id."""

    answers: Answers
    tagged: bytes
    correlation_id: int

    def reply(self, reply: protocol.Reply) -> None:
        self.answers.append((self.tagged, protocol.encode_reply(self.correlation_id, reply)))

    def error(self, error: Exception) -> None:
        self.answers.append((self.tagged, protocol.encode_error(self.correlation_id, error)))


class _Broken:
    """Set on the coordinator's registry thread when one of a group's writes failed: the
    writes queued after it are not sent (they were made on the state it did not write)."""

    failed: PylogError | None = None


@dataclass
class _Coordinated:
    """A group this broker claimed (or is claiming: `group` None, requests `waiting`)."""

    name: str
    group: Group | None = None
    coordinator_epoch: int = 0
    next_version: int = 0
    """The version of `state` once every write made so far has landed."""
    waiting: list[tuple[GroupRequest, protocol.RequestHeader, str, _Answer]] = field(
        default_factory=list
    )
    in_flight: list[list[Callable[[PylogError | None], None]]] = field(default_factory=list)
    """Per write not yet landed, the replies waiting for it (called with None once it landed,
    or the error it failed with)."""
    broken: _Broken = field(default_factory=_Broken)


class Coordinator:
    """The groups this broker coordinates. `serve` takes a group request from the front;
    `tick`, on every turn of the loop, removes expired members, follows partition counts and
    hands groups over when the brokers up change."""

    def __init__(
        self,
        config: BrokerConfig,
        topics: Topics,
        calls: RegistryCalls,
        answers: Answers,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.me = config.broker_id
        self.topics = topics
        self.calls = calls
        self.answers = answers
        self.clock = clock
        self.rules = Rules()
        self._groups: dict[str, _Coordinated] = {}
        self._broker_epoch = -1
        self._brokers: frozenset[int] = frozenset()
        self._orders: dict[str, tuple[object, tuple[int, ...]]] = {}
        """Per topic: the config it was computed from, and its partitions in range's order."""
        self._names: dict[str, tuple[int, ...]] = {}
        """Per topic, each partition's name broker, as last known (kept after a deletion, for
        its owner nodes' names)."""
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="groups")
        """Claims and writes, in order, apart from the topics' registry calls."""
        self._next_housekeeping = 0.0
        self.registry_writes = 0
        self.registry_operations = 0
        self._statistics = GroupStatistics()

    # -- requests ----------------------------------------------------------------------------

    def serve(
        self,
        request: GroupRequest | protocol.ListGroupsRequest,
        tagged: bytes,
        header: protocol.RequestHeader,
        client_host: str,
    ) -> None:
        """Answer a group request (now, or once its group is loaded and its write landed).
        Raises the error of a request refused at once, for the front to answer."""
        answer = _Answer(self.answers, tagged, header.correlation_id)
        if isinstance(request, protocol.ListGroupsRequest):
            self.calls.call(_listing, answer.reply, answer.error)
            return
        try:
            check_name("group", request.group)
        except ValueError as error:
            raise InvalidGroup(str(error)) from None
        self._check_coordinator(request.group)
        entry = self._groups.get(request.group)
        if entry is None:
            creates = protocol.GroupHeartbeatRequest | protocol.OffsetCommitRequest
            entry = self._claim(request.group, create=isinstance(request, creates))
        if entry.group is None:
            entry.waiting.append((request, header, client_host, answer))
        else:
            self._serve_loaded(entry, request, header, client_host, answer)

    def _serve_loaded(
        self,
        entry: _Coordinated,
        request: GroupRequest,
        header: protocol.RequestHeader,
        client_host: str,
        answer: _Answer,
    ) -> None:
        group = entry.group
        assert group is not None
        now = self.clock.monotonic()
        try:
            if isinstance(request, protocol.GroupHeartbeatRequest):
                self._follow_topics(entry, request.topics)
                reply, write = group.heartbeat(
                    _heartbeat(request, header.client_id, client_host), now
                )
                wire: protocol.Reply = protocol.GroupHeartbeatReply(
                    reply.member_epoch,
                    reply.heartbeat_interval_ms,
                    protocol.partition_list(reply.assignment),
                )
            elif isinstance(request, protocol.OffsetCommitRequest):
                self._follow_topics(entry, {p.topic for p in request.parts})
                parts = [(TopicPartition(p.topic, p.partition), p.offset) for p in request.parts]
                results, write = group.commit(request.member_id, request.member_epoch, parts)
                *before, write = write.offset_chunks(GIVE_LIMIT) or [write]
                for chunk in before:  # the reply waits for the last, which waits for these
                    self._write(entry, chunk, _logged(entry.name))
                wire = protocol.OffsetCommitReply(
                    tuple(
                        protocol.CommitPartReply(p.topic, p.partition, r)
                        for p, r in zip(request.parts, results, strict=True)
                    )
                )
            elif isinstance(request, protocol.OffsetFetchRequest):
                wire, write = _committed(group.offsets, request.topics), Write()
            elif isinstance(request, protocol.DescribeGroupRequest):
                wire, write = _described(group.describe(), entry.coordinator_epoch), Write()
            else:
                self._delete(entry, answer)
                return
        except Exception as error:  # a bug, too, is the request's error, not the loop's end
            if not isinstance(error, PylogError):
                log.exception("group %s: unexpected error serving a request", entry.name)
            answer.error(error)
            return
        self._write(
            entry, write, lambda failed: answer.error(failed) if failed else answer.reply(wire)
        )

    # -- claims, loads and writes ---------------------------------------------------------

    def _claim(self, name: str, create: bool) -> _Coordinated:
        """Claim and load group `name`; with `create` False, a group that does not exist is
        not created (DESCRIBE_GROUP, OFFSET_FETCH, DELETE_GROUP)."""
        entry = self._groups[name] = _Coordinated(name)
        me = self.me

        def loaded(claimed: ClaimedGroup | None) -> None:
            if self._groups.get(name) is not entry:
                return  # dropped meanwhile (a handover, a new session)
            if claimed is None:
                del self._groups[name]
                self._answer_unknown(entry)
                return
            if claimed.paper_members:
                del self._groups[name]
                self._release(name)
                self._answer_paper(entry, claimed)
                return
            try:
                members = [_member(name, i, node) for i, node in claimed.members.items()]
            except RegistryUnavailable as error:  # a node it cannot read: the group's error
                del self._groups[name]
                self._release(name)
                log.error("%s", error)
                self._answer_waiting(entry, error)
                return
            topics = {t for m in members for t in m.topics} | set(claimed.offsets)
            partitions = {t: self._order(t) for t in topics}
            entry.group = Group(
                name,
                self.rules,
                self.clock.monotonic(),
                group_epoch=claimed.group_epoch,
                members=members,
                offsets=self._offsets(claimed.offsets),
                partitions={t: n for t, n in partitions.items() if n is not None},
            )
            entry.coordinator_epoch = claimed.coordinator_epoch
            entry.next_version = claimed.state_version
            log.info(
                "coordinating group %s (coordinator epoch %d, group epoch %d, %d members)",
                name,
                claimed.coordinator_epoch,
                claimed.group_epoch,
                len(claimed.members),
            )
            waiting, entry.waiting = entry.waiting, []
            for request, header, host, answer in waiting:
                self._serve_loaded(entry, request, header, host, answer)

        def failed(error: PylogError) -> None:
            if self._groups.get(name) is entry:
                del self._groups[name]
            if isinstance(error, ClaimedElsewhere):
                error = CoordinatorLoading(
                    f"group {name}: waiting for broker {error.broker_id}'s claim to end"
                )
            self._answer_waiting(entry, error)

        self.calls.call(
            lambda r: r.groups.claim_group(name, me, create), loaded, failed, self._thread
        )
        return entry

    def _write(
        self, entry: _Coordinated, write: Write, then: Callable[[PylogError | None], None]
    ) -> None:
        """Send `write` (if it changes anything), then call `then` once it and every write
        before it landed, or with the error that stopped them."""
        if not write:
            if entry.in_flight:
                entry.in_flight[-1].append(then)
            else:
                then(None)
            return
        waiting = [then]
        entry.in_flight.append(waiting)
        name, version, epoch = entry.name, entry.next_version, entry.coordinator_epoch
        entry.next_version += write.group_epoch is not None
        broken, partition_of = entry.broken, self._partition_name

        def send(registry: Registry) -> int:
            if broken.failed is not None:
                raise broken.failed
            try:
                return registry.groups.write_group(name, version, epoch, write, partition_of)
            except PylogError as error:
                broken.failed = error
                raise

        def landed(_: int) -> None:
            self.registry_writes += 1
            self.registry_operations += write.changes()
            entry.in_flight.remove(waiting)
            for reply in waiting:
                reply(None)

        def failed(error: PylogError) -> None:
            error = _claimed_meanwhile(name, error)
            entry.in_flight.remove(waiting)
            if self._groups.get(name) is entry:
                log.warning("group %s: a write failed, the group is loaded again: %s", name, error)
                del self._groups[name]
            for reply in waiting:
                reply(error)

        self.calls.call(send, landed, failed, self._thread)

    def _delete(self, entry: _Coordinated, answer: _Answer) -> None:
        group = entry.group
        assert group is not None
        if group.members:
            raise GroupNotEmptyError(
                f"group {entry.name} has members: {', '.join(sorted(group.members))}"
            )
        name, version = entry.name, entry.next_version
        del self._groups[name]

        def deleted(_: None) -> None:
            log.info("deleted group %s", name)
            answer.reply(protocol.EmptyReply())

        self.calls.call(
            lambda r: r.groups.delete_coordinated_group(name, version),
            deleted,
            lambda error: answer.error(_claimed_meanwhile(name, error)),
            self._thread,
        )

    def _answer_waiting(self, entry: _Coordinated, error: PylogError) -> None:
        waiting, entry.waiting = entry.waiting, []
        for *_, answer in waiting:
            answer.error(error)

    def _answer_paper(self, entry: _Coordinated, claimed: ClaimedGroup) -> None:
        """The requests waiting for a group run by members of the paper's protocol: described
        (state 3) and its offsets read; anything else GROUP_HAS_ZOOKEEPER_MEMBERS."""
        waiting, entry.waiting = entry.waiting, []
        members = claimed.paper_members
        for request, *_, answer in waiting:
            if isinstance(request, protocol.OffsetFetchRequest):
                answer.reply(_committed(self._offsets(claimed.offsets), request.topics))
            elif isinstance(request, protocol.DescribeGroupRequest):
                described = tuple(
                    protocol.GroupMemberInfo(m, "", "", "", -1, False, 0, 0, members[m], (), (), ())
                    for m in sorted(members)
                )
                epochs = (claimed.coordinator_epoch, claimed.group_epoch, claimed.group_epoch)
                answer.reply(protocol.DescribeGroupReply(PAPER_STATE, *epochs, "range", described))
            else:
                answer.error(
                    GroupHasZooKeeperMembers(
                        f"group {entry.name} has members of the paper's protocol registered "
                        f"under ids ({', '.join(sorted(members))}): stop them first "
                        "(docs/design/group-coordinator.md, section 7)"
                    )
                )

    def _answer_unknown(self, entry: _Coordinated) -> None:
        """The requests waiting for a group found not to exist: no offsets, UNKNOWN_GROUP,
        or, for one that would create it, COORDINATOR_LOADING (its retry claims anew)."""
        waiting, entry.waiting = entry.waiting, []
        for request, *_, answer in waiting:
            if isinstance(request, protocol.OffsetFetchRequest):
                answer.reply(protocol.OffsetFetchReply(()))
            elif isinstance(request, protocol.DescribeGroupRequest | protocol.DeleteGroupRequest):
                answer.error(UnknownGroup(f"no group {entry.name}"))
            else:
                answer.error(CoordinatorLoading(f"group {entry.name}: loading"))

    # -- the loop's housekeeping ----------------------------------------------------------

    def tick(self) -> None:
        """Expire members, follow partition counts, hand over groups another broker now wins;
        at most every HOUSEKEEPING_S (the loop turns for every batch of requests)."""
        now = self.clock.monotonic()
        if now < self._next_housekeeping:
            return
        self._next_housekeeping = now + HOUSEKEEPING_S
        self._statistics = self._figures()
        if self._brokers != self._live():
            self._brokers = self._live()
            for name in [n for n in self._groups if coordinator_of(n, self._brokers) != self.me]:
                log.info(
                    "group %s: handed over to broker %s", name, coordinator_of(name, self._brokers)
                )
                self._drop(name)
                self._release(name)
        if not now < self.topics.roles.leases.lease.until:
            return  # cut off from ZooKeeper: members' heartbeats are refused, none expires
        for entry in list(self._groups.values()):
            group = entry.group
            if group is None:
                continue
            self._follow_topics(entry, {t for m in group.members.values() for t in m.topics})
            expiry = group.next_expiry()
            if expiry is not None and expiry <= now:
                gone, write = group.expire(now)
                if gone:
                    log.info(
                        "group %s: removed %s (session or revocation deadline)",
                        entry.name,
                        ", ".join(gone),
                    )
                self._write(entry, write, _logged(entry.name))

    def statistics(self) -> GroupStatistics:
        """The figures of the last housekeeping (read by the metrics thread: one frozen
        record, never the groups the loop changes)."""
        return self._statistics

    def _figures(self) -> GroupStatistics:
        loaded = [entry.group for entry in self._groups.values() if entry.group is not None]
        return GroupStatistics(
            len(loaded),
            sum(len(group.members) for group in loaded),
            self.registry_writes,
            self.registry_operations,
        )

    def close(self) -> None:
        self._thread.shutdown(wait=True, cancel_futures=True)

    # -- helpers --------------------------------------------------------------------------

    def _live(self) -> frozenset[int]:
        return frozenset(self.topics.live_brokers) | {self.me}

    def _check_coordinator(self, name: str) -> None:
        """NotCoordinator unless this broker is the group's choice, CoordinatorLoading while
        its lease does not cover."""
        brokers = self._live()
        choice = coordinator_of(name, brokers)
        if choice != self.me:
            found = self.topics.live_brokers.get(choice) if choice is not None else None
            raise NotCoordinator(
                name,
                -1 if choice is None else choice,
                "" if found is None else found.host,
                0 if found is None else found.port,
            )
        lease = self.topics.roles.leases.lease
        if lease.broker_epoch != self._broker_epoch:
            for group in list(self._groups):  # a new session: the old one's claims are gone
                self._drop(group)
            self._broker_epoch = lease.broker_epoch
        if not self.clock.monotonic() < lease.until:
            raise CoordinatorLoading(
                f"group {name}: this broker has not heard from ZooKeeper lately (its lease ran out)"
            )

    def _drop(self, name: str) -> None:
        entry = self._groups.pop(name, None)
        if entry is not None:
            self._answer_waiting(entry, CoordinatorLoading(f"group {name}: moving"))

    def _release(self, name: str) -> None:
        self.calls.call(
            lambda r: r.groups.release_group(name), lambda _: None, _log_release(name), self._thread
        )

    def _order(self, topic: str) -> tuple[int, ...] | None:
        """`topic`'s partitions in range's order (name broker, number); None when unknown."""
        config = self.topics.configs.get(topic)
        if config is None:
            return None
        cached = self._orders.get(topic)
        if cached is None or cached[0] is not config:
            order = tuple(sorted(range(config.partitions), key=lambda p: (config.brokers[p], p)))
            cached = self._orders[topic] = (config, order)
            self._names[topic] = config.brokers
        return cached[1]

    def _follow_topics(self, entry: _Coordinated, topics: Iterable[str]) -> None:
        group = entry.group
        assert group is not None
        for topic in topics:
            write = group.set_partitions(topic, self._order(topic))
            if write:
                self._write(entry, write, _logged(entry.name))

    def _partition_name(self, tp: TopicPartition) -> str:
        return partition_name(self._names[tp.topic][tp.partition], tp.partition)

    def _offsets(self, offsets: dict[str, dict[str, int]]) -> dict[TopicPartition, int]:
        """Offsets by partition name (`<broker>-<p>`) as partitions; those of topics unknown
        now, and names that are no partition's, are left out."""
        found = {}
        for topic, by_name in offsets.items():
            numbers = self._order(topic)
            if numbers is None:
                continue
            for name, offset in by_name.items():
                number = name.rpartition("-")[2]
                if number.isascii() and number.isdigit() and int(number) < len(numbers):
                    found[TopicPartition(topic, int(number))] = offset
        return found


def _claimed_meanwhile(name: str, error: PylogError) -> PylogError:
    """A write refused for the version of `state` (another broker claimed the group since) as
    the retriable COORDINATOR_LOADING a member follows; any other error as it is."""
    if isinstance(error, BadVersion):
        return CoordinatorLoading(f"group {name}: claimed by another broker meanwhile ({error})")
    return error


def _logged(name: str) -> Callable[[PylogError | None], None]:
    def done(failed: PylogError | None) -> None:
        if failed is not None:
            log.warning("group %s: %s", name, failed)

    return done


def _log_release(name: str) -> Callable[[PylogError], None]:
    return lambda error: log.warning("group %s: could not release its claim: %s", name, error)


def _member(group: str, member_id: str, node: dict[str, Any]) -> Member:
    """A member's node as the coordinator reads it back; RegistryUnavailable, naming it, for
    one it cannot read (written by hand, or by a later version)."""
    try:
        member = Member.from_node(member_id, node)
        for topic in member.topics:
            check_name("topic", topic)
        numbers = (member.member_epoch, member.previous_epoch, *member.assigned.values())
        numbers += (member.session_timeout_ms, member.rebalance_timeout_ms)
        texts = (member.instance_id, member.client_id, member.client_host, member.assignor)
        if not isinstance(node["topics"], list) or not isinstance(member.left, bool):
            raise TypeError("topics is not a list, or left not a boolean")
        if not all(is_int(n) for n in numbers) or not all(isinstance(t, str) for t in texts):
            raise TypeError("an epoch or timeout is not an integer, or a name not a string")
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise RegistryUnavailable(
            f"group {group}: the node of member {member_id} is unreadable ({error!r}): "
            "delete it (pylogctl group delete, once the members stopped) or correct it"
        ) from None
    return member


def _heartbeat(
    request: protocol.GroupHeartbeatRequest, client_id: str, client_host: str
) -> Heartbeat:
    return Heartbeat(
        request.member_id,
        request.member_epoch,
        request.topics,
        frozenset(TopicPartition(o.topic, p) for o in request.owned for p in o.partitions),
        request.instance_id,
        request.session_timeout_ms,
        request.rebalance_timeout_ms,
        request.assignor,
        client_id,
        client_host,
    )


def _committed(
    offsets: dict[TopicPartition, int], topics: tuple[str, ...]
) -> protocol.OffsetFetchReply:
    wanted = set(topics)
    by_topic: dict[str, list[protocol.CommittedOffset]] = {}
    for tp, offset in sorted(offsets.items()):
        if not wanted or tp.topic in wanted:
            by_topic.setdefault(tp.topic, []).append(protocol.CommittedOffset(tp.partition, offset))
    return protocol.OffsetFetchReply(
        tuple(protocol.CommittedTopic(t, tuple(o)) for t, o in by_topic.items())
    )


def _described(
    description: GroupDescription, coordinator_epoch: int
) -> protocol.DescribeGroupReply:
    return protocol.DescribeGroupReply(
        description.state,
        coordinator_epoch,
        description.group_epoch,
        description.assignment_epoch,
        description.assignor,
        tuple(
            protocol.GroupMemberInfo(
                d.member.member_id,
                d.member.instance_id,
                d.member.client_id,
                d.member.client_host,
                d.member.member_epoch,
                d.member.left,
                d.member.session_timeout_ms,
                d.member.rebalance_timeout_ms,
                tuple(sorted(d.member.topics)),
                protocol.partition_list(d.member.assigned),
                protocol.partition_list(d.revoking),
                protocol.partition_list(d.waiting),
            )
            for d in description.members
        ),
    )


def _listing(registry: Registry) -> protocol.ListGroupsReply:
    return protocol.ListGroupsReply(
        tuple(
            protocol.GroupListing(name, coordinator, tuple(members), tuple(topics))
            for name, coordinator, members, topics in registry.groups.group_listings()
        )
    )

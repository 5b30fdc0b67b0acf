"""The calls a consumer group's member or an operator's tool makes of the group's coordinator
(docs/protocol.md, "Consumer groups": GROUP_HEARTBEAT, OFFSET_COMMIT, OFFSET_FETCH,
DESCRIBE_GROUP, LIST_GROUPS, DELETE_GROUP).

The coordinator is found as the protocol says: a group's request goes to any broker of the
bootstrap list, and one that does not coordinate the group answers NOT_COORDINATOR naming the
one that does, where it is sent next. A coordinator that is loading the group
(COORDINATOR_LOADING), a broker that does not answer, and the other retriable errors are tried
again, the next bootstrap broker after one that did not answer, waiting 0.1 s doubling to 1 s,
for up to 3 x `timeout_s` (the reply timeout) in all; a redirect is followed at once (the first
REDIRECTS_AT_ONCE of a call). Nothing here imports kazoo.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypeVar, overload

from broker.backoff import Backoff
from broker.client.cluster import Cluster
from broker.client.framing import DEFAULT_CLIENT_ID, normalize_endpoint, retriable
from broker.client.transport import Transport
from broker.errors import BrokerError, BrokerNotCoordinator, Unavailable
from broker.groups.assignors import TopicPartition
from broker.lifecycle import Closing
from broker.protocol import (
    CommitPart,
    DeleteGroupRequest,
    DescribeGroupReply,
    DescribeGroupRequest,
    EmptyReply,
    ErrorCode,
    GroupHeartbeatReply,
    GroupHeartbeatRequest,
    GroupListing,
    ListGroupsRequest,
    OffsetCommitReply,
    OffsetCommitRequest,
    OffsetFetchReply,
    OffsetFetchRequest,
)
from broker.security import ClientKeys

COORDINATOR_BACKOFF_S = 0.1
MAX_COORDINATOR_BACKOFF_S = 1.0
REDIRECTS_AT_ONCE = 3
"""Redirects a call follows without waiting; after them (two brokers whose views of the brokers
up differ for a moment, each naming the other) it backs off as after any retriable error."""

GroupReply = TypeVar("GroupReply")


class GroupCalls(Closing):
    """The calls about consumer group `group`, sent to its coordinator (module docstring),
    through brokers of `bootstrap` ("host:port", several comma-separated). `keys` reach
    brokers serving CurveZMQ (docs/security.md); `transport` carries the calls
    (broker.client.transport; default: ZeroMQ sockets), its clock times their back-off."""

    def __init__(
        self,
        bootstrap: str,
        group: str,
        client_id: str = DEFAULT_CLIENT_ID,
        timeout_s: float = 10.0,
        *,
        keys: ClientKeys | None = None,
        transport: Transport | None = None,
    ) -> None:
        self.group = group
        self.timeout_s = timeout_s
        self.cluster = Cluster(bootstrap, client_id, timeout_s, keys=keys, transport=transport)
        self.coordinator: str | None = None
        """The coordinator's endpoint, once a broker named it."""
        self._next_bootstrap = 0

    def heartbeat(self, request: GroupHeartbeatRequest) -> GroupHeartbeatReply:
        """Send a member's heartbeat (`request.group` must be this group)."""
        return self._call(request)

    def commit(
        self,
        offsets: Mapping[TopicPartition, int],
        member_id: str = "",
        member_epoch: int = -1,
    ) -> dict[TopicPartition, ErrorCode]:
        """Commit `offsets`, as member `member_id` at `member_epoch`, or without a member
        (the defaults: refused with GROUP_NOT_EMPTY while members read these topics). Each
        partition's outcome: NONE, PARTITION_NOT_ASSIGNED (a zombie's),
        UNKNOWN_TOPIC_OR_PARTITION."""
        parts = tuple(CommitPart(tp.topic, tp.partition, o) for tp, o in sorted(offsets.items()))
        reply: OffsetCommitReply = self._call(
            OffsetCommitRequest(self.group, member_id, member_epoch, parts)
        )
        return {TopicPartition(p.topic, p.partition): ErrorCode(p.error_code) for p in reply.parts}

    def committed(self, topics: Iterable[str] = ()) -> dict[TopicPartition, int]:
        """The group's committed offsets of `topics` (every topic with offsets when empty)."""
        reply: OffsetFetchReply = self._call(OffsetFetchRequest(self.group, tuple(topics)))
        return {
            TopicPartition(t.topic, o.partition): o.offset for t in reply.topics for o in t.offsets
        }

    def describe(self) -> DescribeGroupReply:
        """The group's state, epochs, assignor and members (UnknownGroup when there is none)."""
        return self._call(DescribeGroupRequest(self.group))

    def delete(self) -> None:
        """Delete the group and its offsets (GroupNotEmpty while it has members)."""
        self._call(DeleteGroupRequest(self.group))

    def list_groups(self) -> tuple[GroupListing, ...]:
        """Every group of the cluster, asked of any broker."""
        return self.cluster.ask_any(lambda c: c.request(ListGroupsRequest())).groups

    @overload
    def _call(self, request: GroupHeartbeatRequest) -> GroupHeartbeatReply: ...
    @overload
    def _call(self, request: OffsetCommitRequest) -> OffsetCommitReply: ...
    @overload
    def _call(self, request: OffsetFetchRequest) -> OffsetFetchReply: ...
    @overload
    def _call(self, request: DescribeGroupRequest) -> DescribeGroupReply: ...
    @overload
    def _call(self, request: DeleteGroupRequest) -> EmptyReply: ...
    def _call(
        self,
        request: GroupHeartbeatRequest
        | OffsetCommitRequest
        | OffsetFetchRequest
        | DescribeGroupRequest
        | DeleteGroupRequest,
    ) -> object:
        clock = self.cluster.clock
        deadline = clock.monotonic() + 3 * self.timeout_s
        backoff = Backoff(COORDINATOR_BACKOFF_S, MAX_COORDINATOR_BACKOFF_S)
        followed = 0
        while True:
            endpoint = self.coordinator or self._bootstrap()
            try:
                reply = self.cluster.connect(endpoint).request(request)
            except BrokerNotCoordinator as redirect:
                named = (
                    normalize_endpoint(f"{redirect.host}:{redirect.port}")
                    if redirect.coordinator >= 0
                    else None
                )
                self.coordinator = named
                if named is not None and named != endpoint and followed < REDIRECTS_AT_ONCE:
                    followed += 1
                    continue  # followed at once (brokers whose views differ: backed off)
                error: BrokerError | Unavailable = redirect
            except (BrokerError, Unavailable) as failure:
                if not retriable(failure):
                    raise
                if not isinstance(failure, BrokerError):  # no answer: ask another broker
                    self.coordinator = None
                    self._next_bootstrap += 1
                error = failure
            else:
                self.coordinator = endpoint  # it answered: the coordinator, until it is not
                return reply
            wait_s = backoff.next()
            if clock.monotonic() + wait_s > deadline:
                raise error
            clock.sleep(wait_s)

    def _bootstrap(self) -> str:
        endpoints = self.cluster.bootstrap
        return endpoints[self._next_bootstrap % len(endpoints)]

    def close(self) -> None:
        self.cluster.close()

"""What a principal may do: ACLs and the Authorizer (docs/security.md).

Authorizer decides whether a principal may do an operation on a topic, from the ACLs (kept in
ZooKeeper, broker.registry.security): a super user may do anything; an ACL grants operations on
a topic name, a prefix (`logs.*`) or every topic (`*`). Its answers are cached per (principal,
operation, topic) until the ACLs change, so the hot path costs one dict lookup. The cluster
principal may fetch and describe every topic, nothing else; it alone may fetch as a replica
(`check_replica`), whatever the ACLs say, a super user's included.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from broker.errors import AuthorizationFailed, InvalidTopic
from broker.protocol import check_topic_name
from broker.security.principals import CLUSTER_PRINCIPAL, check_principal_name


class Operation(StrEnum):
    """What an ACL grants on a topic; DESCRIBE is implied by every other operation."""

    PRODUCE = "produce"
    FETCH = "fetch"
    DESCRIBE = "describe"
    CREATE = "create"
    DELETE = "delete"
    ALTER = "alter"


ALL: Final = "all"
"""In an ACL's operations: every Operation."""


def parse_operations(names: Iterable[str]) -> frozenset[Operation]:
    """Operations from their names ("all" for every one); ValueError naming an unknown one."""
    operations: set[Operation] = set()
    for name in names:
        if name == ALL:
            operations.update(Operation)
            continue
        try:
            operations.add(Operation(name))
        except ValueError:
            known = ", ".join([*Operation, ALL])
            raise ValueError(f"unknown operation {name!r}: one of {known}") from None
    if not operations:
        raise ValueError("an ACL grants at least one operation")
    return frozenset(operations)


def check_resource(resource: str) -> None:
    """ValueError unless `resource` is a topic name, a prefix of one ending in `*` (`logs.*`),
    or `*` (every topic)."""
    if resource == "*":
        return
    name = resource[:-1] if resource.endswith("*") else resource
    try:
        check_topic_name(name)
    except InvalidTopic as error:
        raise ValueError(
            f"resource {resource!r}: a topic name, a prefix ending in * (logs.*), or *: {error}"
        ) from None


@dataclass(frozen=True, slots=True)
class Acl:
    """`principal` may do `operations` on the topics `resource` names: a topic name, a prefix
    ending in `*` (`logs.*` is every topic whose name starts with "logs."), or `*`."""

    principal: str
    resource: str
    operations: frozenset[Operation]

    def __post_init__(self) -> None:
        check_principal_name(self.principal)
        check_resource(self.resource)
        if not self.operations:
            raise ValueError("an ACL grants at least one operation")

    def matches(self, topic: str) -> bool:
        if self.resource.endswith("*"):
            return topic.startswith(self.resource[:-1])
        return topic == self.resource

    def grants(self, operation: Operation) -> bool:
        """Whether the ACL grants `operation` (DESCRIBE comes with any operation)."""
        return operation is Operation.DESCRIBE or operation in self.operations


CLUSTER_OPERATIONS: Final = frozenset({Operation.FETCH, Operation.DESCRIBE})
"""What the cluster principal may do on every topic: a follower's FETCH,
OFFSET_FOR_LEADER_EPOCH and OFFSETS."""

CACHED_DECISIONS: Final = 100_000
"""Decisions the Authorizer remembers before it starts over (memory stays bounded whatever
topic names clients send)."""


class _Rules:
    """One version of the ACLs, with the decisions made from it (so that a decision made from
    old ACLs can never land in the cache of new ones)."""

    __slots__ = ("by_principal", "decisions")

    def __init__(self, acls: Iterable[Acl]) -> None:
        self.by_principal: dict[str, list[Acl]] = {}
        for acl in acls:
            self.by_principal.setdefault(acl.principal, []).append(acl)
        self.decisions: dict[tuple[str, Operation, str], bool] = {}


class Authorizer:
    """Whether a principal may do an operation on a topic: a super user may do anything; any
    other principal what its ACLs grant. `update` (from any thread: the registry's watch)
    replaces the ACLs as one; the next request is decided by the new ones."""

    def __init__(self, super_users: Iterable[str]) -> None:
        self.super_users = frozenset(super_users)
        self._rules = _Rules(())
        self.denied = 0
        """Requests refused AUTHORIZATION_FAILED (broker.metrics)."""

    def update(self, acls: Iterable[Acl]) -> None:
        self._rules = _Rules(acls)

    def allowed(self, principal: str, operation: Operation, topic: str) -> bool:
        if principal == CLUSTER_PRINCIPAL:  # a broker: its followers fetch every topic
            return operation in CLUSTER_OPERATIONS
        rules = self._rules
        key = (principal, operation, topic)
        decision = rules.decisions.get(key)
        if decision is None:
            decision = principal in self.super_users or any(
                acl.grants(operation) and acl.matches(topic)
                for acl in rules.by_principal.get(principal, ())
            )
            if len(rules.decisions) >= CACHED_DECISIONS:
                rules.decisions.clear()
            rules.decisions[key] = decision
        return decision

    def check(self, principal: str, operation: Operation, topic: str) -> None:
        """AuthorizationFailed unless `principal` may do `operation` on `topic`."""
        if not self.allowed(principal, operation, topic):
            self.denied += 1
            raise AuthorizationFailed(principal, operation.value, topic)

    def check_replica(self, principal: str, topic: str, replica_id: int) -> None:
        """AuthorizationFailed unless `principal` is the cluster principal: only a broker may
        FETCH as a replica (`replica_id` >= 0), whatever the ACLs grant, since a replica's
        fetch moves the leader's high watermark and ISR (ack=all would be answered for copies
        no broker holds). A super user may not either: no operator's tool needs it."""
        if principal != CLUSTER_PRINCIPAL:
            self.denied += 1
            raise AuthorizationFailed(
                principal,
                "replica",
                topic,
                f"principal {principal!r} may not fetch topic {topic!r} as a replica "
                f"(replica_id {replica_id}): only brokers may, with the cluster's key "
                "(docs/security.md); a consumer's FETCH says replica_id -1",
            )

    def deny(self) -> None:
        """Count a denial answered without an exception (a topic of a METADATA reply)."""
        self.denied += 1

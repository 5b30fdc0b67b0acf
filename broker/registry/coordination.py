"""Groups coordinated by a broker, in the registry (docs/design/group-coordinator.md, section 2):
the coordinator's claim, the group's epochs, its members' nodes, and the owner and offset nodes
it writes for them, under /consumers/<group>:

    coordinator          ephemeral   {"broker_id": 2, "coordinator_epoch": 8}
    state                persistent  {"coordinator_epoch": 8, "group_epoch": 41}
    members/<member_id>  persistent  broker.groups.group.Member.node()
    owners/<topic>/<broker>-<p>      {"consumer": member or instance id}
    offsets/<topic>/<broker>-<p>     {"offset": 104857}, as the paper's members write them

Every write of a coordinator is one transaction conditional on the version of `state` it last
wrote: a broker that claimed the group since makes it fail (BadVersion), and the old
coordinator drops the group."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kazoo.client import TransactionRequest

from broker.errors import RegistryUnavailable
from broker.registry.groups import Groups
from broker.registry.nodes import check_name, decode, encode, int_field
from broker.registry.session import NodeExists, NoNode

if TYPE_CHECKING:  # annotations only: broker.groups imports the registry's name checks
    from broker.groups.assignors import TopicPartition
    from broker.groups.group import Write


class ClaimedElsewhere(RegistryUnavailable):
    """Another broker's live session holds the group's claim node."""

    def __init__(self, group: str, broker_id: int) -> None:
        self.broker_id = broker_id
        super().__init__(f"group {group} is claimed by broker {broker_id}")


@dataclass(frozen=True, slots=True)
class ClaimedGroup:
    """What a claim read: the epochs, the `state` node's version after the claim, each
    member's node, the committed offsets (topic -> partition name -> offset) and the members
    of the paper's protocol registered under `ids`."""

    coordinator_epoch: int
    group_epoch: int
    state_version: int
    members: dict[str, dict[str, Any]]
    offsets: dict[str, dict[str, int]]
    paper_members: dict[str, tuple[str, ...]]
    """Member id -> its topics, for each member of the paper's protocol."""


class GroupCoordination(Groups):
    """The consumer groups in the registry, with the calls of a group coordinator: the store
    `Registry.groups`."""

    def _group_path(self, group: str, *parts: str) -> str:
        return "/".join((f"{self.chroot}/consumers/{group}", *parts))

    def claim_group(self, group: str, broker_id: int, create: bool = True) -> ClaimedGroup | None:
        """Claim `group` for `broker_id`: create its ephemeral claim node and raise its
        coordinator epoch in `state` in one transaction, then read the group. A claim left by
        an earlier session of the same broker (a restart) is deleted first; ClaimedElsewhere
        when another broker's session holds it. None, with `create` False, when the group
        has no node."""
        check_name("group", group)
        claim, state = self._group_path(group, "coordinator"), self._group_path(group, "state")
        if not create:
            try:
                self._session.get(self._group_path(group))
            except NoNode:
                return None
        self._session.ensure_path(self._group_path(group, "members"))
        try:
            data, stat = self._session.get(claim)
        except NoNode:
            pass
        else:
            holder = int_field(decode(data), "broker_id")
            if holder != broker_id:
                raise ClaimedElsewhere(group, holder)
            self._session.delete(claim, stat.version)  # ours, from a session before this one
        try:
            data, stat = self._session.get(state)
            found = decode(data)
            epochs = (int_field(found, "coordinator_epoch"), int_field(found, "group_epoch"))
            version = stat.version
        except NoNode:
            epochs, version = (0, 0), -1
        coordinator_epoch, group_epoch = epochs[0] + 1, epochs[1]
        state_data = encode({"coordinator_epoch": coordinator_epoch, "group_epoch": group_epoch})

        def build(transaction: TransactionRequest) -> None:
            claim_data = encode({"broker_id": broker_id, "coordinator_epoch": coordinator_epoch})
            transaction.create(claim, claim_data, ephemeral=True)
            if version < 0:
                transaction.create(state, state_data)
            else:
                transaction.set_data(state, state_data, version)

        try:
            self._session.commit(f"claim group {group}", build)
        except NodeExists:
            raise ClaimedElsewhere(group, self._claim_holder(group)) from None
        members_path = self._group_path(group, "members")
        members = self._session.read_all(members_path, decode, str)
        offsets = self.committed_offsets(group)
        paper = self.consumers(group)
        return ClaimedGroup(coordinator_epoch, group_epoch, version + 1, members, offsets, paper)

    def delete_coordinated_group(self, group: str, state_version: int) -> None:
        """Delete `group` whole (offsets included) if its `state` is at `state_version` (the
        coordinator's, which holds the claim): BadVersion else. The claim node and the group's
        node go last."""
        self._session.commit(
            f"delete group {group}",
            lambda t: t.check(self._group_path(group, "state"), state_version),
        )
        for part in ("offsets", "owners", "members", "ids", "state"):
            self._delete_tree(self._group_path(group, part))
        self._delete_tree(self._group_path(group))

    def group_listings(self) -> list[tuple[str, int, list[str], list[str]]]:
        """Every group under /consumers: its name, the broker holding its claim (-1: none),
        its members (coordinated ones and those of the paper's protocol) and the topics it
        has offsets or owners for."""
        listings = []
        for group in self.names():
            members: list[str] = []
            for part in ("members", "ids"):
                with contextlib.suppress(NoNode):
                    members += self._session.children(self._group_path(group, part))
            topics: set[str] = set()
            for part in ("offsets", "owners"):
                with contextlib.suppress(NoNode):
                    topics.update(self._session.children(self._group_path(group, part)))
            listings.append((group, self._claim_holder(group), sorted(members), sorted(topics)))
        return listings

    def coordinated(self, group: str) -> bool:
        """Whether a coordinator has claimed `group` (it has a `state` node): then its offsets
        change through the coordinator (OFFSET_COMMIT), which keeps them in memory."""
        check_name("group", group)
        try:
            self._session.get(self._group_path(group, "state"))
        except NoNode:
            return False
        return True

    def release_group(self, group: str) -> None:
        """Delete this session's claim of `group` (nothing when it holds none)."""
        self._session.delete_if_ours(self._group_path(group, "coordinator"))

    def write_group(
        self,
        group: str,
        state_version: int,
        coordinator_epoch: int,
        write: Write,
        name: Callable[[TopicPartition], str],
    ) -> int:
        """Apply a coordinator's step (broker.groups.group.Write) in one transaction
        conditional on `state` being at `state_version`; `name` gives a partition's node name
        ("<broker>-<p>"). Returns the version of `state` after it. BadVersion when another
        broker claimed the group since."""
        state = self._group_path(group, "state")

        def build(transaction: TransactionRequest) -> None:
            if write.group_epoch is None:
                transaction.check(state, state_version)
            else:
                epochs = {"coordinator_epoch": coordinator_epoch, "group_epoch": write.group_epoch}
                transaction.set_data(state, encode(epochs), state_version)
            for member_id, (before, after) in write.members.items():
                path = self._group_path(group, "members", member_id)
                _change(transaction, path, before, after, encode)
            for tp, (owner_before, owner_after) in write.owners.items():
                path = self._group_path(group, "owners", tp.topic, name(tp))
                _change(transaction, path, owner_before, owner_after, _owner)
            for tp, (offset_before, offset_after) in write.offsets.items():
                path = self._group_path(group, "offsets", tp.topic, name(tp))
                _change(transaction, path, offset_before, offset_after, _offset)

        what = f"write group {group}"
        try:
            self._session.commit(what, build)
        except NoNode:  # a topic's first owner or offset: its parent node is created first
            for topic in {tp.topic for tp in (*write.owners, *write.offsets)}:
                self._session.ensure_path(self._group_path(group, "owners", topic))
                self._session.ensure_path(self._group_path(group, "offsets", topic))
            self._session.commit(what, build)
        return state_version + (write.group_epoch is not None)

    def _claim_holder(self, group: str) -> int:
        try:
            data, _ = self._session.get(self._group_path(group, "coordinator"))
        except NoNode:
            return -1
        return int_field(decode(data), "broker_id")


def _owner(member: str) -> bytes:
    return encode({"consumer": member})


def _offset(offset: int) -> bytes:
    return encode({"offset": offset})


def _change(
    transaction: TransactionRequest,
    path: str,
    before: Any,
    after: Any,
    data: Callable[[Any], bytes],
) -> None:
    """The operation that takes node `path` from `before` to `after` (None: no node)."""
    if before == after:
        return
    if after is None:
        transaction.delete(path)
    elif before is None:
        transaction.create(path, data(after))
    else:
        transaction.set_data(path, data(after))

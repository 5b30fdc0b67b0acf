"""Consumer groups in the registry: members, partition owners and committed offsets under
/consumers/<group>."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import TypeVar

from broker.errors import PylogError, RegistryUnavailable
from broker.protocol import check_topic_name
from broker.registry.nodes import check_name, decode, encode, int_field, is_int
from broker.registry.session import ATTEMPTS, NodeExists, NoNode, NotEmpty, Session


class GroupNotEmpty(PylogError):
    """A group cannot be deleted while it has members: `members` are their ids."""

    def __init__(self, group: str, members: Iterable[str]) -> None:
        self.group = group
        self.members = sorted(members)
        super().__init__(f"group {group} has members: {', '.join(self.members)}")


T = TypeVar("T")


def partition_name(broker_id: int, partition: int) -> str:
    """A partition's name under /consumers: "<broker_id>-<partition>", as in Kafka 0.7."""
    return f"{broker_id}-{partition}"


def _topics(data: bytes) -> tuple[str, ...]:
    topics = decode(data).get("topics")
    if not isinstance(topics, list) or not all(isinstance(t, str) for t in topics):
        raise ValueError("'topics' is not a list of names")
    return tuple(topics)


def _offset(data: bytes) -> int:
    return int_field(decode(data), "offset")


def _consumer(data: bytes) -> str:
    owner = decode(data).get("consumer")
    if not isinstance(owner, str):
        raise ValueError("'consumer' is not a consumer id")
    return owner


class Groups:
    """The consumer groups in the registry (/consumers), on `session`.

    With `auth`, /consumers lets any member create its group's node (and delete it once
    empty), and a group's nodes are then the identity's that created them (docs/registry.md)."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self.chroot = session.chroot

    def consumer_path(self, group: str, consumer_id: str) -> str:
        return f"{self.chroot}/consumers/{group}/ids/{consumer_id}"

    def owner_path(self, group: str, topic: str, name: str) -> str:
        return f"{self.chroot}/consumers/{group}/owners/{topic}/{name}"

    def offset_path(self, group: str, topic: str, name: str) -> str:
        return f"{self.chroot}/consumers/{group}/offsets/{topic}/{name}"

    def register_consumer(self, group: str, consumer_id: str, topics: Iterable[str]) -> None:
        """Create (or update) the ephemeral /consumers/<group>/ids/<consumer_id> listing the
        topics the member consumes; kept (and re-created after a session expiry) until stop()
        or unregister_consumer."""
        check_name("group", group)
        check_name("consumer id", consumer_id)
        names = sorted(set(topics))
        for topic in names:
            check_topic_name(topic)
        self._session.register(self.consumer_path(group, consumer_id), encode({"topics": names}))

    def unregister_consumer(self, group: str, consumer_id: str) -> None:
        """Delete /consumers/<group>/ids/<consumer_id> and stop keeping it."""
        self._session.unregister(self.consumer_path(group, consumer_id))

    def consumers(self, group: str) -> dict[str, tuple[str, ...]]:
        """The group's live members: consumer id -> the topics it consumes."""
        check_name("group", group)
        return self._session.read_all(self._ids_path(group), _topics, str)

    def group_members(self, group: str) -> dict[str, tuple[str, ...]]:
        """Every member of the group, for operators: those of the paper's protocol (`ids`) and
        those its coordinator keeps (`members`, broker.registry.coordination, a static member
        that left for a moment included): member id -> the topics it consumes."""
        check_name("group", group)
        coordinated = self._session.read_all(
            f"{self.chroot}/consumers/{group}/members", _topics, str
        )
        return {**coordinated, **self.consumers(group)}

    def watch_members(self, group: str, callback: Callable[[list[str]], None]) -> None:
        """Call `callback` with the ids of `group`'s members now and whenever a member joins or
        leaves; no member's node is read for it (Session.watch_children): consumers() reads
        them."""
        check_name("group", group)
        self._session.watch_children(self._ids_path(group), callback)

    def claim_partition(self, group: str, topic: str, name: str, consumer_id: str) -> str | None:
        """Create the ephemeral owner node of partition `name` of `topic` for `consumer_id`.
        None when it is ours (now, or already in this session); else the id of the member that
        owns it. Not re-created after a session expiry: ownership ends with the session."""
        path = self.owner_path(group, topic, name)
        for _ in range(ATTEMPTS):
            try:
                found = self._session.create_ephemeral(path, encode({"consumer": consumer_id}))
            except NoNode:
                continue
            if found is None:
                return None
            data, stat = found
            if stat.ephemeral_owner == self._session.session_id:
                return None
            try:
                return _consumer(data)
            except ValueError:
                return f"session 0x{stat.ephemeral_owner:x}"
        raise RegistryUnavailable(f"could not claim {path}: it kept changing under us")

    def release_partition(self, group: str, topic: str, name: str) -> None:
        """Delete the owner node of partition `name` if this session holds it."""
        self._session.delete_if_ours(self.owner_path(group, topic, name))

    def partition_owners(self, group: str, topic: str) -> dict[str, str]:
        """Partition name -> the member owning it, for the owned partitions of `topic`."""
        return self._session.read_all(
            f"{self.chroot}/consumers/{group}/owners/{topic}", _consumer, str
        )

    def commit_offset(self, group: str, topic: str, name: str, offset: int) -> None:
        """Write the group's committed offset of partition `name` (persistent)."""
        if not is_int(offset) or offset < 0:
            raise ValueError(f"an offset is an integer >= 0, not {offset!r}")
        path = self.offset_path(group, topic, name)
        data = encode({"offset": offset})
        try:
            self._session.set(path, data, -1)
        except NoNode:
            try:
                self._session.create(path, data, makepath=True)
            except NodeExists:  # another member committed first: ours is as good
                self._session.set(path, data, -1)

    def committed_offset(self, group: str, topic: str, name: str) -> int | None:
        """The group's committed offset of partition `name`, or None if none was committed."""
        path = self.offset_path(group, topic, name)
        try:
            data, _ = self._session.get(path)
        except NoNode:
            return None
        try:
            return _offset(data)
        except ValueError as error:
            raise RegistryUnavailable(f"{path} holds unreadable data: {error}") from None

    # -- the groups as a whole, for operators ------------------------------------------------

    def names(self) -> list[str]:
        """The name of every group with a node under /consumers (members, owners or committed
        offsets; a deleted group has none), sorted."""
        try:
            return self._session.children(f"{self.chroot}/consumers")
        except NoNode:
            return []

    def committed_offsets(self, group: str) -> dict[str, dict[str, int]]:
        """Every committed offset of the group: topic -> partition name -> offset."""
        check_name("group", group)
        return self._per_topic(f"{self.chroot}/consumers/{group}/offsets", _offset)

    def owners(self, group: str) -> dict[str, dict[str, str]]:
        """Every owned partition of the group: topic -> partition name -> owning member."""
        check_name("group", group)
        return self._per_topic(f"{self.chroot}/consumers/{group}/owners", _consumer)

    def delete_group(self, group: str) -> bool:
        """Delete /consumers/<group> with its committed offsets; False when there is no such
        group. GroupNotEmpty while it has members: /ids is deleted first, which ZooKeeper
        refuses while a member's node is in it; and while a coordinated member's node is under
        /members (then its coordinator's nodes go too). A member joining after that re-creates /ids
        (and finds no committed offsets): the group's node is then left with it, and
        GroupNotEmpty raised."""
        check_name("group", group)
        root = f"{self.chroot}/consumers/{group}"
        try:
            self._session.delete(self._ids_path(group))
        except NotEmpty:
            raise GroupNotEmpty(group, self.consumers(group)) from None
        except NoNode:
            if group not in self.names():
                return False
        try:
            coordinated = self._session.children(f"{root}/members")
        except NoNode:
            coordinated = []
        if coordinated:  # a group of the coordinated protocol (broker.registry.coordination)
            raise GroupNotEmpty(group, coordinated)
        for part in ("offsets", "owners", "members", "state", "coordinator"):
            self._delete_tree(f"{root}/{part}")
        try:
            self._session.delete(root)
        except NotEmpty:
            raise GroupNotEmpty(group, self.consumers(group)) from None
        except NoNode:
            pass  # deleted by another client meanwhile
        return True

    def _per_topic(self, path: str, parse: Callable[[bytes], T]) -> dict[str, dict[str, T]]:
        try:
            topics = self._session.children(path)
        except NoNode:
            return {}
        found = {topic: self._session.read_all(f"{path}/{topic}", parse, str) for topic in topics}
        return {topic: nodes for topic, nodes in found.items() if nodes}

    def _delete_tree(self, path: str) -> None:
        """Delete `path` and everything under it (nothing when it does not exist)."""
        try:
            children = self._session.children(path)
        except NoNode:
            return
        for child in children:
            self._delete_tree(f"{path}/{child}")
        with contextlib.suppress(NoNode):
            self._session.delete(path)

    def _ids_path(self, group: str) -> str:
        return f"{self.chroot}/consumers/{group}/ids"

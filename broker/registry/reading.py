"""Reading the nodes under a path of the registry, now and as they change (kazoo's DataWatch,
and ChildrenWatch: broker.registry.watches): what the registry's parts (brokers, topics, states,
groups, admin, controller) are read with."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from kazoo.recipe.watchers import DataWatch

from broker.errors import RegistryUnavailable
from broker.registry.session import BadVersion, NodeExists, NoNode, Session
from broker.registry.watches import ChildrenWatch

log = logging.getLogger("broker.registry.session")

WRITE_ATTEMPTS = 10
"""How many times a change is read and written again when others keep changing the node."""
K = TypeVar("K")
T = TypeVar("T")


class NodeReads(Session):
    """The reads and watches of node data and children, which the registry's stores (brokers,
    topics, groups, controller, security, quotas, settings, reassignments) are given the
    session to make: `read_all` and `add_watch` of a path's children, `watch_data` of a node,
    and `read_node`, `change` and `watch_node` of a node of one JSON value."""

    def read_all(
        self, path: str, parse: Callable[[bytes], T], key: Callable[[str], K]
    ) -> dict[K, T]:
        """read_each of every child of `path` now ({} when `path` does not exist)."""
        try:
            children = self.children(path)
        except NoNode:
            return {}
        return self.read_each(path, children, parse, key)

    def read_each(
        self,
        path: str,
        children: Iterable[str],
        parse: Callable[[bytes], T],
        key: Callable[[str], K],
    ) -> dict[K, T]:
        """`key(child)` -> `parse(data of path/child)` for each child, the children read
        together (Session.get_many: one round trip, not one each). A child gone since it was
        listed is left out, as is one whose name or data is refused by ValueError (with a
        warning)."""
        children = list(children)
        answers = self.get_many(f"read {path}", [f"{path}/{child}" for child in children])
        result: dict[K, T] = {}
        for child, answer in zip(children, answers, strict=True):
            if isinstance(answer, NoNode):
                continue  # went away between the listing and the read
            if isinstance(answer, Exception):
                raise answer
            try:
                result[key(child)] = parse(answer[0])
            except ValueError as error:
                log.warning("ignoring unreadable %s/%s: %s", path, child, error)
        return result

    def watch_data(
        self, path: str, parse: Callable[[bytes], T], callback: Callable[[T | None, int], bool]
    ) -> None:
        """Call `callback(parse(data), version)` with the data of the node at `path` now and
        whenever it is written, and `callback(None, -1)` while the node does not exist, until
        stop() or the callback returns False. kazoo's DataWatch keeps the watch armed across
        reconnections and session expiries (it reads the node again then, and calls back if it
        changed meanwhile); it is armed on a thread of kazoo's, so this call does not wait on
        ZooKeeper. The callback runs on kazoo's threads: it must only hand the value on. Data
        that `parse` refuses (ValueError) is logged and passed over."""
        self._check_open()
        stopped = self._stopped

        def changed(data: bytes | None, stat: Any) -> bool:
            if stopped.is_set():
                return False
            if stat is None:
                return callback(None, -1)
            try:
                value = parse(data or b"")
            except ValueError as error:
                log.error("%s holds unreadable data, passed over: %s", path, error)
                return True
            return callback(value, stat.version)

        self._client.handler.spawn(DataWatch, self._client, path, changed)

    def add_watch(
        self,
        path: str,
        parse: Callable[[bytes], T],
        key: Callable[[str], K],
        callback: Callable[[dict[K, T]], None],
    ) -> None:
        """Call `callback` with what read_all(path, parse, key) reads now, whenever the
        children change and after every reconnection, until stop() (broker.registry.watches).
        `path` is created if it does not exist."""
        self._check_open()
        watch = ChildrenWatch(
            self._client,
            path,
            lambda children: self.read_each(path, children, parse, key),
            callback,
            connected=lambda: self.connected,
            stopped=self._stopped,
        )
        self._watches.append(watch)
        watch.start()

    # -- one node read, changed, watched -----------------------------------------------------

    def read_node(self, path: str, parse: Callable[[bytes], T]) -> tuple[T, int]:
        """What `path` holds (parsed as if empty when it does not exist, version -1)."""
        try:
            data, stat = self.get(path)
        except NoNode:
            return parse(b""), -1
        try:
            return parse(data), stat.version
        except ValueError as error:
            raise RegistryUnavailable(f"{path} holds unreadable data: {error}") from None

    def change(
        self,
        path: str,
        parse: Callable[[bytes], T],
        change: Callable[[T], T],
        to_json: Callable[[T], bytes],
    ) -> None:
        """Write `change(what path holds)`, a conditional write on the version read (created if
        absent), read and tried again when another write came between."""
        for _ in range(WRITE_ATTEMPTS):
            value, version = self.read_node(path, parse)
            data = to_json(change(value))
            try:
                if version < 0:
                    self.create(path, data, makepath=True)
                else:
                    self.set(path, data, version)
            except (BadVersion, NodeExists, NoNode):
                continue
            return
        raise RegistryUnavailable(
            f"{path} changed under each of {WRITE_ATTEMPTS} attempts to change it: try again"
        )

    def watch_node(
        self, path: str, parse: Callable[[bytes], T], callback: Callable[[T], None]
    ) -> None:
        """Call `callback(parse(data))` now and whenever the node at `path` changes (parse of
        b"" while it does not exist), until stop(); kazoo's DataWatch keeps the watch armed
        across reconnections. A node that cannot be parsed is logged and passed over (the
        last good value stays in force)."""
        self._check_open()
        stopped = self._stopped

        def changed(data: bytes | None, stat: Any) -> bool:
            if stopped.is_set():
                return False
            try:
                value = parse(data or b"")
            except ValueError as error:
                log.error("%s holds unreadable data, passed over: %s", path, error)
                return True
            callback(value)
            return True

        self._client.handler.spawn(DataWatch, self._client, path, changed)

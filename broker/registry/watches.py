"""Callbacks on the children of a path: kazoo's ChildrenWatch keeps the watch armed, and a
runner thread of each watch reads the children's nodes and calls the callback.

kazoo's ChildrenWatch lists the children (arming the watch) on every change ZooKeeper
reports, and lists them again after a reconnection and after a session expiry (which drops
the session's watches). What it does not keep, and this module adds:

- It calls its function on kazoo's one event thread. A registry callback reads every child's
  node (one request each, each waiting up to request_timeout_s) and hands the result to the
  application, which may take its time: on that thread it would hold up every other watch of
  the session. Here kazoo's function only records the names and wakes the watch's runner.
- An exception in its function is logged and that state is lost until the next change. A
  read that fails here (a request timed out) is retried with back-off while connected; a
  read that fails because the connection went is left to the (re)connection's trigger().
- After a reconnection it calls its function only when the names changed. The children's
  data may have changed meanwhile (a topic deleted and created again under the same name
  while our session was gone), and our own ephemeral nodes are re-created only then: the
  registry calls trigger() once they are, and the runner reads every node anew.
- A watch on a path that does not exist ends for good: the path is created first.

Triggers coalesce: the callback sees the latest state, not every step; it runs on the
watch's runner, one call at a time per watch.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionClosedError
from kazoo.recipe.watchers import ChildrenWatch as KazooChildrenWatch

from broker.backoff import Backoff
from broker.errors import RegistryUnavailable

log = logging.getLogger(__name__)

READ_RETRY_FIRST_S = 0.1
READ_RETRY_MAX_S = 2.0
"""A watch's read that failed is tried again after READ_RETRY_FIRST_S, doubling up to this."""

T = TypeVar("T")


class ChildrenWatch(Generic[T]):
    """Call `callback(read(children))` with the sorted child names of `path` now and
    whenever they change, and again on every trigger(), until `stopped` is set.
    `connected` tells whether a failed read is worth retrying now."""

    def __init__(
        self,
        client: KazooClient,
        path: str,
        read: Callable[[list[str]], T],
        callback: Callable[[T], None],
        *,
        connected: Callable[[], bool],
        stopped: threading.Event,
    ) -> None:
        self.path = path
        self._client = client
        self._read = read
        self._callback = callback
        self._connected = connected
        self._stopped = stopped
        self._lock = threading.Lock()
        self._children: list[str] | None = None  # kazoo's latest listing; None before its first
        self._dirty = False
        self._running = False

    def start(self) -> None:
        """Arm kazoo's watch on a thread of its own: its first listing waits for a connection
        as long as one takes (kazoo's command retry), and the callback follows it."""
        self._client.handler.spawn(self._arm)

    def trigger(self) -> None:
        """Have the runner read the nodes anew and call the callback (once kazoo has listed
        the children a first time; that listing triggers by itself)."""
        with self._lock:
            if self._children is None:
                return
            self._dirty = True
            if self._running:
                return
            self._running = True
        self._client.handler.spawn(self._run)

    def _arm(self) -> None:
        try:
            self._client.retry(self._client.ensure_path, self.path)
            KazooChildrenWatch(self._client, self.path, self._listed)
        except ConnectionClosedError:
            pass  # the registry stopped
        except Exception:
            log.exception("watching %s failed", self.path)

    def _listed(self, children: list[str]) -> bool:
        """kazoo's function, on kazoo's threads: record and wake the runner, nothing slow.
        False (once stopped) makes kazoo drop the watch."""
        if self._stopped.is_set():
            return False
        with self._lock:
            self._children = sorted(children)
        self.trigger()
        return True

    def _run(self) -> None:
        backoff = Backoff(READ_RETRY_FIRST_S, READ_RETRY_MAX_S)
        while True:
            with self._lock:
                if not self._dirty or self._stopped.is_set():
                    self._running = False
                    return
                self._dirty = False
                children = list(self._children or ())
            try:
                value = self._read(children)
            except RegistryUnavailable as error:
                with self._lock:  # under the lock: a trigger() now finds us running or not
                    if not self._connected():
                        self._running = False
                        return  # the (re)connection triggers us again
                    self._dirty = True
                log.warning("reading %s for a watch failed, retrying: %s", self.path, error)
                if self._stopped.wait(backoff.next()):
                    return
                continue
            except Exception:
                log.exception("reading %s for a watch failed unexpectedly", self.path)
                with self._lock:
                    self._running = False
                return
            backoff.reset()
            try:
                self._callback(value)
            except Exception:
                log.exception("registry watch callback on %s failed", self.path)

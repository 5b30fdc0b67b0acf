"""The registry's ZooKeeper session: connecting, every request, the ephemeral nodes kept
through session loss, and the watches armed on it (broker.registry.watches).

Connection and session loss:

- A lost connection (ZooKeeper restarting, a network blip) suspends the session; kazoo
  reconnects by itself and, if it is back within the session timeout, the session and all its
  ephemeral nodes are intact. While it is away every call waits at most `request_timeout_s`
  for the connection and then raises RegistryUnavailable, as does a request in flight when
  the connection is lost (it is not sent again: see Session._request).
- An expired session (away for longer than the timeout, or closed by the server) takes all
  our ephemeral nodes with it. kazoo opens a new session; the registry then re-creates every
  node it was asked to register (broker, topic partitions, group members), from a thread of
  its own, never from kazoo's connection thread (one that an ACL refuses is given up, with
  an error logged: asking again would be refused again). A node still present at one of our
  paths is kept if it belongs to the current session and is deleted and created again if it
  belongs to another one (an old session of this broker not yet expired, e.g. after a quick
  restart).
- The same re-registration runs after every reconnection (it finds the nodes in place after a
  plain connection loss and does nothing), and then every watch's callback is called again
  with the state read anew, since nodes may have changed while we were away.
- `wait_registered(timeout)` waits until, in the current connection, every registered node is
  known to exist; `connected` and `statistics()` tell the state.

ZooKeeper ACLs (`auth`, docs/registry.md "Who may write what"): a session given a digest
identity presents it (again at every reconnection) and creates every node with the ACL
[digest(identity): ALL, world: READ], so that anyone reads the registry and only holders of
the identity change those nodes; the `shared_paths` (the registry's /consumers) let anyone
create a node there (and delete an empty one), which is then its creator's.
NodeAcls.secure_tree (broker.registry.acls) gives the nodes of a registry made without ACLs
the brokers' ACL.

The stores (broker.registry.brokers, .topics, ...) are made of the session's reads and
watches: `read_all` and `add_watch` of a path's children, `watch_data` of a node, and
`read_node`, `change` and `watch_node` of a node of one JSON value.

Every kazoo error, including timeouts, becomes broker.errors.RegistryUnavailable (retriable),
but for ZooKeeper's NoAuth, an ACL refusing the change: RegistryAccessDenied (not retriable).
No kazoo exception leaves this package.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from kazoo.client import KazooClient, KazooState, TransactionRequest
from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.recipe.watchers import DataWatch
from kazoo.retry import KazooRetry
from kazoo.security import ACL, make_acl, make_digest_acl

from broker.backoff import Backoff
from broker.errors import RegistryAccessDenied, RegistryUnavailable
from broker.lifecycle import Running
from broker.registry.watches import ChildrenWatch

if TYPE_CHECKING:
    from broker.security import ZooKeeperAuth

log = logging.getLogger(__name__)

DEFAULT_CHROOT = "/pylog"

ATTEMPTS = 5  # tries of a create/check/delete cycle that other clients keep racing
TRANSACTION_BYTES = 256 * 1024
"""The most one transaction of commit_in_chunks carries, its operations as serialized: a
quarter of ZooKeeper's jute.maxbuffer (1 MiB, 1048575 bytes, by default). The server refuses a
larger packet and drops the connection that sent it ("Len error"): a transaction creating the
state nodes of 4,000 partitions was 1,158,102 bytes. About 1,500 state nodes' creations fit."""
_OPERATION_HEADER_BYTES = 9
"""What a transaction adds before each operation (type, done flag, error: 4 + 1 + 4 bytes)."""
Failed = RegistryUnavailable | RegistryAccessDenied
"""What a request of _request_many that failed answers (see _outcome)."""
FAILED = (RegistryUnavailable, RegistryAccessDenied)
WRITE_ATTEMPTS = 10
"""How many times `change` reads and writes a node again when others keep changing it."""
REQUESTS_AT_ONCE = 500
"""The most requests _request_many sends before it waits for their answers."""
WIND_DOWN_CHECK_S = 0.1
"""How often a request waiting for the connection looks whether the broker winds down."""
RESTORE_RETRY_FIRST_S = 0.1
RESTORE_RETRY_MAX_S = 2.0
"""A re-registration that failed is tried again after RESTORE_RETRY_FIRST_S, doubling up to this."""

K = TypeVar("K")
T = TypeVar("T")


@dataclass(frozen=True)
class RegistryStatistics:
    """A snapshot of the registry's connection. `sessions` counts the ZooKeeper sessions
    established (1 until one expires), `sessions_lost` the expiries seen, `nodes_restored`
    the ephemeral nodes re-created because they had gone, `registered` how many ephemeral
    nodes this registry keeps."""

    connected: bool
    session_id: int | None
    sessions: int
    sessions_lost: int
    nodes_restored: int
    registered: int


# Private kazoo-free outcomes of one request. They are RegistryUnavailable subclasses so that,
# should one ever escape a public method, callers still see the documented error.
class NoNode(RegistryUnavailable):
    pass


class NodeExists(RegistryUnavailable):
    pass


class NotEmpty(RegistryUnavailable):
    pass


class BadVersion(RegistryUnavailable):
    pass


_KAZOO_OUTCOMES: tuple[tuple[type[Exception], type[RegistryUnavailable]], ...] = (
    (NoNodeError, NoNode),
    (NodeExistsError, NodeExists),
    (NotEmptyError, NotEmpty),
    (BadVersionError, BadVersion),
)


_VERBS = {"Create": "create", "Delete": "delete", "SetData": "write", "CheckVersion": "check"}
"""How an error names each kind of operation of a transaction (kazoo.protocol.serialization)."""


@dataclass(frozen=True)
class Stat:
    version: int
    ephemeral_owner: int
    czxid: int = 0
    """The transaction id that created the node: a node created anew (a broker's
    registration after a restart) has another, a later one."""


class Session(Running):
    """A connection to ZooKeeper under a chroot, with the requests, ephemeral registrations,
    reads and watches that the registry's stores (brokers, topics, groups, ...) are made of.

    `connect_string` is "host:port[,host:port...]" (no chroot there: pass `chroot`).
    `session_timeout_s` is asked of the server, which clamps it to 2-20 of its ticks.
    Every call waits at most `request_timeout_s` for a connection and an answer, then raises
    RegistryUnavailable. kazoo reconnects on its own, waiting at most `reconnect_max_delay_s`
    between attempts. `base_paths` (under the chroot) are created at start; with `auth`, the
    `shared_paths` too, with the `shared_acl`. Started once (start() and stop(), or as a
    context manager).
    """

    def __init__(
        self,
        connect_string: str,
        chroot: str = DEFAULT_CHROOT,
        session_timeout_s: float = 6.0,
        *,
        request_timeout_s: float = 5.0,
        reconnect_max_delay_s: float = 2.0,
        auth: ZooKeeperAuth | None = None,
        base_paths: Sequence[str] = (),
        shared_paths: Sequence[str] = (),
    ) -> None:
        if "/" in connect_string:
            raise ValueError(f"pass the chroot as `chroot`, not in {connect_string!r}")
        if not chroot.startswith("/") or (chroot != "/" and chroot.endswith("/")):
            raise ValueError(f"chroot must be an absolute path like /pylog, not {chroot!r}")
        if auth is not None and chroot == "/":
            raise ValueError("ZooKeeper ACLs need a chroot of pylog's own, like /pylog, not /")
        self.connect_string = connect_string
        self.chroot = "" if chroot == "/" else chroot
        self.session_timeout_s = session_timeout_s
        self.request_timeout_s = request_timeout_s
        self.auth = auth
        self.base_paths = tuple(base_paths)
        self.shared_paths = tuple(shared_paths)
        self.acl: list[ACL] | None = None
        """The ACL of the nodes this session creates (None without `auth`: ZooKeeper's open one)."""
        self.shared_acl: list[ACL] = []
        """The ACL of the `shared_paths`, whose children are each their creator's."""
        if auth is not None:
            ours = make_digest_acl(auth.user, auth.password, all=True)
            self.acl = [ours, make_acl("world", "anyone", read=True)]
            self.shared_acl = [
                ours,
                make_acl("world", "anyone", read=True, create=True, delete=True),
            ]
        self._client = KazooClient(
            hosts=connect_string,
            timeout=session_timeout_s,
            connection_retry=KazooRetry(
                max_tries=-1, delay=0.1, backoff=2, max_delay=reconnect_max_delay_s
            ),
            auth_data=None if auth is None else [("digest", auth.credential)],
            default_acl=self.acl,
        )
        # _state_lock guards the fields below it and is never held during a request: kazoo's
        # connection thread takes it in the state listener.
        self._state_lock = threading.Lock()
        self._generation = 0  # bumped on every connection state change
        self._connected = threading.Event()
        self._registered = threading.Event()
        self._started = False
        self._stopping = False
        self._winding_down = threading.Event()
        self._session_ids: set[int] = set()
        self._sessions_lost = 0
        self._nodes_restored = 0
        # _register_lock serialises every change to our ephemeral nodes, held across requests.
        self._register_lock = threading.RLock()
        self._ephemerals: dict[str, bytes] = {}  # path -> data we keep registered
        self._stale: set[str] = set()  # our ephemeral paths to delete once connected
        self._watches: list[ChildrenWatch[Any]] = []
        self._stopped = threading.Event()

    # -- lifetime ----------------------------------------------------------------------------

    def start(self, timeout: float = 15.0) -> None:
        """Connect (waiting at most `timeout` seconds) and create the base paths (with `auth`,
        the `shared_paths` too), those missing.

        Raises RegistryUnavailable when ZooKeeper cannot be reached in time, and
        RegistryAccessDenied when a missing path may not be created with this identity."""
        if self._started:
            raise RuntimeError("a Registry is started once; make a new one")
        self._started = True
        self._client.add_listener(self._on_state_change)
        try:
            self._client.start(timeout=timeout)
        except (KazooException, KazooTimeoutError) as error:
            self.stop()
            raise RegistryUnavailable(
                f"cannot connect to ZooKeeper at {self.connect_string} within {timeout:g} s "
                f"({type(error).__name__}: {error})"
            ) from error
        try:
            for path in self.base_paths:
                self.ensure_path(self.chroot + path)
            if self.auth is not None:
                for path in self.shared_paths:
                    self.ensure_path(self.chroot + path, self.shared_acl)
        except (RegistryUnavailable, RegistryAccessDenied):
            self.stop()
            raise
        log.info("registry connected to %s%s", self.connect_string, self.chroot)

    def stop(self) -> None:
        """Close the session: ZooKeeper deletes our ephemeral nodes at once. Idempotent."""
        with self._state_lock:
            if self._stopping:
                return
            self._stopping = True
            self._connected.clear()
            self._registered.clear()
        self._stopped.set()
        try:
            self._client.stop()
            self._client.close()
        except (KazooException, KazooTimeoutError, OSError) as error:
            log.warning("error while closing the ZooKeeper session: %s", error)

    # -- state -------------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """Whether the session is connected now."""
        return self._connected.is_set()

    @property
    def session_id(self) -> int | None:
        """The ZooKeeper session id while connected (it changes after an expiry)."""
        client_id = self._client.client_id
        if client_id is None:
            return None
        session: int = client_id[0]
        return session

    def wait_registered(self, timeout: float | None = None) -> bool:
        """Wait until connected with every registered node known to exist in this connection
        (after a session expiry: re-created); False if `timeout` seconds passed first."""
        return self._registered.wait(timeout)

    def statistics(self) -> RegistryStatistics:
        with self._state_lock:
            sessions, lost, restored = (
                len(self._session_ids),
                self._sessions_lost,
                self._nodes_restored,
            )
        with self._register_lock:
            registered = len(self._ephemerals)
        return RegistryStatistics(
            connected=self.connected,
            session_id=self.session_id,
            sessions=sessions,
            sessions_lost=lost,
            nodes_restored=restored,
            registered=registered,
        )

    @property
    def identity(self) -> str:
        """Who this session is to ZooKeeper's ACLs, for error messages."""
        if self.auth is None:
            return "a session without a ZooKeeper identity"
        return f"digest identity {self.auth.user!r}"

    # -- ephemeral registrations -------------------------------------------------------------

    def register(self, path: str, data: bytes) -> None:
        """Make `path` an ephemeral node holding `data`, kept (re-created after a session
        expiry) until unregister or stop(); remembered even when this call fails with
        RegistryUnavailable (not when an ACL refuses it: RegistryAccessDenied)."""
        self._check_open()
        with self._register_lock:
            self._ephemerals[path] = data
            self._stale.discard(path)
            try:
                self._ensure_ephemeral(path, data)
            except RegistryAccessDenied:
                del self._ephemerals[path]
                raise

    def unregister(self, path: str) -> None:
        self._check_open()
        with self._register_lock:
            self._ephemerals.pop(path, None)
            try:
                self.delete_if_ours(path)
            except RegistryUnavailable:
                self._stale.add(path)  # deleted at the next reconnection, if still there
                raise

    def _ensure_ephemeral(self, path: str, data: bytes) -> bool:
        """Make `path` an ephemeral node of this session holding `data`. Returns True when it
        had to be created, False when it was there (and is now up to date)."""
        for _ in range(ATTEMPTS):
            try:
                found = self.create_ephemeral(path, data)
            except NoNode:
                continue
            if found is None:
                return True
            old, stat = found
            session = self.session_id
            if session is None:
                raise RegistryUnavailable(f"register {path}: the connection was lost")
            if stat.ephemeral_owner == session:
                if old != data:
                    try:
                        self.set(path, data, stat.version)
                    except (NoNode, BadVersion):
                        continue
                return False
            log.warning(
                "replacing %s held by session 0x%x (ours is 0x%x): a previous session of this "
                "broker, not expired yet, or another process using the same id",
                path,
                stat.ephemeral_owner,
                session,
            )
            with contextlib.suppress(NoNode, BadVersion):
                self.delete(path, stat.version)
        raise RegistryUnavailable(f"could not register {path}: it kept changing under us")

    def create_ephemeral(self, path: str, data: bytes) -> tuple[bytes, Stat] | None:
        """Create `path` as an ephemeral node of this session holding `data` (and its parents
        as persistent ones): None when created, else what is there. NoNode when a parent
        was deleted between makepath and create, or the node between create and read: the
        caller tries again."""
        try:
            self.create(path, data, ephemeral=True, makepath=True)
            return None
        except NodeExists:
            return self.get(path)

    def delete_if_ours(self, path: str) -> None:
        try:
            _, stat = self.get(path)
            if stat.ephemeral_owner == self.session_id:
                self.delete(path, stat.version)
        except (NoNode, BadVersion):
            pass

    # -- connection state --------------------------------------------------------------------

    def _on_state_change(self, state: str) -> None:
        """kazoo's state listener: runs in kazoo's connection thread and must not block."""
        with self._state_lock:
            if self._stopping:
                return
            self._generation += 1
            generation = self._generation
            if state == KazooState.CONNECTED:
                self._connected.set()
            else:
                self._connected.clear()
                self._registered.clear()
                if state == KazooState.LOST:
                    self._sessions_lost += 1
        if state == KazooState.CONNECTED:
            log.info("registry connected to ZooKeeper")
            self._client.handler.spawn(self._restore, generation)
        elif state == KazooState.SUSPENDED:
            log.warning("registry lost its ZooKeeper connection; kazoo is reconnecting")
        else:
            log.warning("registry's ZooKeeper session expired: our ephemeral nodes are gone")

    def _restore(self, generation: int) -> None:
        """After a (re)connection: re-create missing registrations, delete stale ones, call
        the watches again. Runs on its own thread; retries while the same connection lasts.
        (A loop of our own rather than a KazooRetry: it retries our RegistryUnavailable, which
        KazooRetry does not know, and ends when the connection it was started for ends.)"""
        backoff = Backoff(RESTORE_RETRY_FIRST_S, RESTORE_RETRY_MAX_S)
        while True:
            try:
                restored = self._restore_once()
            except RegistryUnavailable as error:
                with self._state_lock:
                    same_connection = generation == self._generation and not self._stopping
                if not same_connection:
                    return  # a later state change has its own _restore
                delay = backoff.next()
                log.warning("re-registration failed, retrying in %.1f s: %s", delay, error)
                if self._stopped.wait(delay):
                    return
                continue
            except Exception:
                log.exception("re-registration failed unexpectedly")
                return
            break
        session = self.session_id
        with self._state_lock:
            if generation != self._generation or self._stopping:
                return
            if session is not None:
                self._session_ids.add(session)
            self._nodes_restored += restored
            self._registered.set()
        if restored:
            log.info("re-created %d registry node(s) in session 0x%x", restored, session or 0)
        for watch in list(self._watches):
            watch.trigger()

    def _restore_once(self) -> int:
        restored = 0
        with self._register_lock:
            for path in list(self._stale):
                self.delete_if_ours(path)
                self._stale.discard(path)
            for path, data in list(self._ephemerals.items()):
                try:
                    if self._ensure_ephemeral(path, data):
                        restored += 1
                except RegistryAccessDenied as error:  # asking again is refused again
                    del self._ephemerals[path]
                    log.error("cannot register %s again, given up: %s", path, error)
        return restored

    # -- requests: each of ours goes through _request (kazoo's ChildrenWatch makes its own) ---

    def _check_open(self) -> None:
        if not self._started or self._stopping:
            raise RegistryUnavailable("the registry is not started, or stopped")

    def _request(self, what: str, send: Callable[[], Any]) -> Any:
        """Wait for the connection, send one request and wait for its answer, all within
        request_timeout_s; translate every kazoo outcome into a RegistryUnavailable (sub)class.

        Not kazoo's KazooRetry, which would send a request cut off by a lost connection again
        once connected: the caller must hear of the loss at once. A group member checks its
        connection at each poll, to stop before its session can expire and another member
        take its partitions (docs/registry.md); a call retried up to request_timeout_s kept
        it inside one poll past that point, and it then handed out records it had fetched
        after its partitions were taken (tests/cluster/test_groups.py, a member cut off from
        ZooKeeper). Nor kazoo's plain calls: they do not bound their wait, and one made
        while disconnected waits in kazoo's queue to be sent whenever the connection is back."""
        deadline = self._ready(what)
        try:
            return send().get(timeout=max(0.0, deadline - time.monotonic()))
        except KazooTimeoutError:
            raise self._no_answer(what) from None
        except KazooException as error:
            raise self._outcome(what, error) from None

    def _ready(self, what: str) -> float:
        """Before requests are sent: the session is open and connected (waited for up to
        request_timeout_s, else RegistryUnavailable; at once once `wind_down` was called).
        Returns by when their answers are due."""
        self._check_open()
        deadline = time.monotonic() + self.request_timeout_s
        while not self._connected.is_set():
            if self._winding_down.is_set():
                raise RegistryUnavailable(
                    f"{what}: not connected to ZooKeeper at {self.connect_string}, and the "
                    "broker is shutting down"
                )
            left = deadline - time.monotonic()
            if left <= 0:
                raise RegistryUnavailable(
                    f"{what}: not connected to ZooKeeper at {self.connect_string} "
                    f"(waited {self.request_timeout_s:g} s)"
                )
            self._connected.wait(min(left, WIND_DOWN_CHECK_S))
        return deadline

    def wind_down(self) -> None:
        """The broker shuts down: from now on a request made while the session is not
        connected fails at once instead of waiting request_timeout_s for ZooKeeper (those
        waiting already, within WIND_DOWN_CHECK_S), so that a broker whose ZooKeeper is gone
        stops in a second or two. Connected, requests go on as before (leaving the registry
        cleanly)."""
        self._winding_down.set()

    def _no_answer(self, what: str) -> RegistryUnavailable:
        return RegistryUnavailable(
            f"{what}: no answer from ZooKeeper at {self.connect_string} within "
            f"{self.request_timeout_s:g} s"
        )

    def _request_many(self, what: str, sends: Sequence[Callable[[], Any]]) -> list[Any]:
        """As _request, for many requests: up to REQUESTS_AT_ONCE sent before their answers
        are waited for (one round trip for them all, not one each: 10,000 partition states
        read one by one took seconds), each such window within request_timeout_s. Returns the
        answers in order, an answer that failed as the error it becomes (NoNode, ...: see
        _outcome), for the caller to raise or pass over; a lost connection, or a window not
        answered in time, raises RegistryUnavailable."""
        answers: list[Any] = []
        for start in range(0, len(sends), REQUESTS_AT_ONCE):
            deadline = self._ready(what)
            pending = [send() for send in sends[start : start + REQUESTS_AT_ONCE]]
            for result in pending:
                try:
                    answers.append(result.get(timeout=max(0.0, deadline - time.monotonic())))
                except KazooTimeoutError:
                    raise self._no_answer(what) from None
                except KazooException as error:
                    answers.append(self._outcome(what, error))
        return answers

    def _outcome(
        self, what: str, error: KazooException
    ) -> RegistryUnavailable | RegistryAccessDenied:
        """The error of ours that a kazoo error of the request `what` becomes."""
        if isinstance(error, NoAuthError):
            return RegistryAccessDenied(
                f"{what}: refused by ZooKeeper (NoAuth): an ACL on that path does not let "
                f"{self.identity} change it"
            )
        for kazoo_error, outcome in _KAZOO_OUTCOMES:
            if isinstance(error, kazoo_error):
                return outcome(f"{what}: {type(error).__name__}")
        return RegistryUnavailable(
            f"{what}: ZooKeeper at {self.connect_string}: {type(error).__name__} {error}"
        )

    def commit(self, what: str, build: Callable[[TransactionRequest], None]) -> list[Any]:
        """Send the operations that `build` adds to a kazoo transaction as one ZooKeeper
        multi-request, all applied or none, as _request sends one request; returns each
        operation's result. When one fails, that operation's outcome is raised (NoNode,
        NodeExists, BadVersion, NotEmpty, RegistryAccessDenied...), not the others'
        "rolled back", named by that operation and its path ("create /pylog/config/...")."""

        transaction = self._client.transaction()
        build(transaction)
        results: list[Any] = self._request(what, transaction.commit_async)
        for operation, result in zip(transaction.operations, results, strict=False):
            if isinstance(result, KazooException) and not isinstance(result, RolledBackError):
                verb = _VERBS.get(type(operation).__name__, "change")
                raise self._outcome(f"{verb} {operation.path}", result)
        return results

    def commit_in_chunks(
        self,
        what: str,
        build: Callable[[TransactionRequest], None],
        guard: Callable[[TransactionRequest], None],
    ) -> int:
        """Send the operations that `build` adds, in their order, as consecutive transactions
        (commit) of at most TRANSACTION_BYTES each, every one beginning with the operations
        `guard` adds (checks of a node's version, which fence a writer that another has
        overtaken). Each transaction is applied whole or not at all; the first that fails
        raises its outcome as commit does, and none after it is sent, while those before it
        stay applied: the caller orders its writes so that readers never take a part for the
        whole (broker.registry.topics). Returns how many transactions were sent."""
        operations = self._client.transaction()
        build(operations)
        head = self._client.transaction()
        guard(head)
        budget = TRANSACTION_BYTES - sum(_serialized_bytes(op) for op in head.operations)
        chunks: list[list[Any]] = []
        used = budget
        for operation in operations.operations:
            size = _serialized_bytes(operation)
            if used + size > budget:
                chunks.append([*head.operations])
                used = 0
            chunks[-1].append(operation)
            used += size
        for chunk in chunks:

            def fill(transaction: TransactionRequest, chunk: list[Any] = chunk) -> None:
                transaction.operations.extend(chunk)

            self.commit(what, fill)
        return len(chunks)

    def create(
        self, path: str, data: bytes, *, ephemeral: bool = False, makepath: bool = False
    ) -> None:
        self._request(
            f"create {path}",
            lambda: self._client.create_async(path, data, ephemeral=ephemeral, makepath=makepath),
        )

    def get(self, path: str) -> tuple[bytes, Stat]:
        """What `path` holds, and its Stat; NoNode when it does not exist."""
        data, stat = self._request(f"read {path}", lambda: self._client.get_async(path))
        return bytes(data or b""), Stat(stat.version, stat.ephemeralOwner, stat.czxid)

    def exists(self, path: str) -> Stat | None:
        """The Stat of `path`, its data not read; None when it does not exist."""
        stat = self._request(f"look at {path}", lambda: self._client.exists_async(path))
        return None if stat is None else Stat(stat.version, stat.ephemeralOwner, stat.czxid)

    def children(self, path: str) -> list[str]:
        children = self._request(f"list {path}", lambda: self._client.get_children_async(path))
        return sorted(str(child) for child in children)

    def get_many(self, what: str, paths: Sequence[str]) -> list[tuple[bytes, Stat] | Failed]:
        """get of each of `paths`, together (_request_many): each answer, or its error."""
        client = self._client
        answers = self._request_many(what, [functools.partial(client.get_async, p) for p in paths])
        return [
            answer
            if isinstance(answer, FAILED)
            else (
                bytes(answer[0] or b""),
                Stat(answer[1].version, answer[1].ephemeralOwner, answer[1].czxid),
            )
            for answer in answers
        ]

    def children_many(self, what: str, paths: Sequence[str]) -> list[list[str] | Failed]:
        """children of each of `paths`, together (_request_many): each answer, or its error."""
        client = self._client
        sends = [functools.partial(client.get_children_async, p) for p in paths]
        return [
            answer if isinstance(answer, FAILED) else sorted(map(str, answer))
            for answer in self._request_many(what, sends)
        ]

    def set(self, path: str, data: bytes, version: int) -> int:
        """Write `path` if it is at `version` (-1: any); returns its new version."""
        stat = self._request(f"write {path}", lambda: self._client.set_async(path, data, version))
        new_version: int = stat.version
        return new_version

    def delete(self, path: str, version: int = -1) -> None:
        """Delete `path` if it is at `version` (-1: any)."""
        self._request(f"delete {path}", lambda: self._client.delete_async(path, version))

    def ensure_path(self, path: str, acl: list[ACL] | None = None) -> None:
        """Create `path` and its missing parents, with `acl` (default: the session's)."""
        self._request(f"create {path}", lambda: self._client.ensure_path_async(path, acl))

    def get_acls(self, path: str) -> list[ACL]:
        """The ACL of `path`; NoNode when it does not exist."""
        found, _ = self._request(
            f"read the ACL of {path}", functools.partial(self._client.get_acls_async, path)
        )
        return list(found)

    def set_acls(self, path: str, acl: list[ACL]) -> None:
        """Give `path` the ACL `acl`; NoNode when it does not exist."""
        self._request(f"set the ACL of {path}", lambda: self._client.set_acls_async(path, acl))

    # -- reads and watches of node data and children: what the stores are made of --------

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
        self._watch_children(
            path, lambda children: self.read_each(path, children, parse, key), callback
        )

    def watch_children(self, path: str, callback: Callable[[list[str]], None]) -> None:
        """As add_watch, with the sorted names of the children only: for a caller that a change
        wakes and that reads what it needs itself, no child's node is read for it."""
        self._watch_children(path, list, callback)

    def _watch_children(
        self, path: str, read: Callable[[list[str]], T], callback: Callable[[T], None]
    ) -> None:
        self._check_open()
        watch = ChildrenWatch(
            self._client,
            path,
            read,
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


def _serialized_bytes(operation: Any) -> int:
    """How many bytes a transaction's operation (kazoo's Create, SetData...) takes in it."""
    return _OPERATION_HEADER_BYTES + len(operation.serialize())

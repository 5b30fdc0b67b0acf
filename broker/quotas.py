"""Byte-rate quotas per principal (curve mode) or client id (plaintext): a client over its
quota is slowed, never refused (docs/protocol.md, "Quotas").

Operators set quotas in ZooKeeper (`pylogctl quota set`, broker.registry.quotas): produce and
fetch bytes a second, for one principal or client id, or the default for every one without
its own; each broker applies them to what it serves, live.

The front keeps, per client and direction, the bytes it owes: a PRODUCE adds its request
frame when it is served, a consumer's FETCH reply its message set when it goes out; what is
owed drains at the quota's rate. A client may run WINDOW_S of its quota ahead; a PRODUCE or
FETCH that comes while its client owes more waits in the front, unserved, until the client
owes no more than that, then is served, and its reply says how long it waited (throttle_ms,
carried to the worker in the request's tagged identity: broker.transport.throttled). The
requests its connection sends meanwhile wait behind it, in order. Followers' fetches are
neither counted nor held back: replication is not a client.

This is GCRA (a token bucket kept as one level of bytes): O(1) a request, and nothing at all
while no quota is set (`active`).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

import zmq

from broker.errors import RepliesNotRead
from broker.transport import connection_of

DEFAULT: Final = "<default>"
"""The name a quota is set under to apply to every principal (or client id) without its own."""
WINDOW_S: Final = 1.0
"""How far ahead of its quota a client may run, in seconds of it: what it may send at once
after being idle, and so how exact the quota is over a short time."""
SHORTEST_WAIT_S: Final = 0.0001
"""A wait shorter than this is none: rounding must not hold a request back for nothing."""
FORGET_AFTER_S: Final = 300.0
"""A client that owes nothing and sent nothing for this long is forgotten (its counts too)."""
MAX_RATE: Final = 1 << 40
"""The largest quota, bytes a second (1 TiB/s): anything more is no quota."""
MAX_CLIENTS: Final = 10_000
"""The most clients the front keeps counts of at once: past it, a client without a quota of
its own is counted with every other such one, under DEFAULT's name (one bucket at the default
quota), until the idle are forgotten; so a client that makes up new ids costs no more."""
MAX_NAME: Final = 255
"""A client id longer than this (a quota may name none) is counted under its first MAX_NAME
characters."""
HELD_SHARES: Final = 4
"""A client holds at most 1 / HELD_SHARES of the broker's ceiling of request bytes held
back for quotas (Throttle.held_ceiling), so that it takes no more than that from the others."""


class Kind(StrEnum):
    """Whom a quota names: a principal (a broker in curve mode), or a client id (plaintext)."""

    PRINCIPAL = "principal"
    CLIENT = "client"


class Direction(StrEnum):
    PRODUCE = "produce"
    FETCH = "fetch"


@dataclass(frozen=True, slots=True)
class Quota:
    """Bytes a second a client may produce and fetch; None: no limit on that direction (the
    default's, when this is an override)."""

    produce_bytes_per_s: int | None = None
    fetch_bytes_per_s: int | None = None

    def __post_init__(self) -> None:
        for name in ("produce_bytes_per_s", "fetch_bytes_per_s"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_RATE
            ):
                raise ValueError(f"{name} is {value!r}: a whole number from 1 to {MAX_RATE}")

    def rate(self, direction: Direction) -> int | None:
        if direction is Direction.PRODUCE:
            return self.produce_bytes_per_s
        return self.fetch_bytes_per_s


@dataclass(frozen=True, slots=True)
class QuotaConfig:
    """Every quota the registry holds: per Kind, name (or DEFAULT) -> Quota."""

    quotas: Mapping[Kind, Mapping[str, Quota]] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        """Whether any quota is set at all."""
        return any(self.quotas.values())

    def rate(self, kind: Kind, name: str, direction: Direction) -> int | None:
        """The quota of `name` in `direction`: its own, else the kind's default, else None."""
        named = self.quotas.get(kind, {})
        for key in (name, DEFAULT):
            quota = named.get(key)
            if quota is not None and (rate := quota.rate(direction)) is not None:
                return rate
        return None


def describe_quotas(config: QuotaConfig) -> str:
    """The quotas for a log line: "none", or each "kind name produce/fetch" in bytes a second."""
    parts = [
        f"{kind} {name} produce {quota.produce_bytes_per_s or '-'} fetch "
        f"{quota.fetch_bytes_per_s or '-'} B/s"
        for kind, named in sorted(config.quotas.items())
        for name, quota in sorted(named.items())
    ]
    return "; ".join(parts) or "none"


class _Bucket:
    """What one client owes in one direction: `level` bytes at time `at`, drained at `rate`."""

    __slots__ = ("at", "bytes", "level", "rate", "throttled_s")

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self.level = 0.0
        self.at = 0.0
        self.bytes = 0
        """Bytes counted, in all (broker.metrics)."""
        self.throttled_s = 0.0
        """Seconds its requests waited, in all (broker.metrics)."""

    def wait_s(self, now: float) -> float:
        """How long a request must wait before it is served: 0 while the client owes no more
        than WINDOW_S of its quota."""
        level = self.level - (now - self.at) * self.rate
        self.at = now
        if level <= 0:
            self.level = 0.0
            return 0.0
        self.level = level
        wait = level / self.rate - WINDOW_S
        return wait if wait >= SHORTEST_WAIT_S else 0.0

    def charge(self, size: int, now: float) -> None:
        self.wait_s(now)  # drained up to now
        self.level += size
        self.bytes += size


@dataclass(slots=True)
class _Client:
    """A principal's or client id's buckets (None: no quota that way), and when last seen."""

    kind: Kind
    name: str
    produce: _Bucket | None
    fetch: _Bucket | None
    seen: float


@dataclass(frozen=True, slots=True)
class ClientStatistics:
    """One client's counts (broker.metrics): bytes counted and seconds held back, by direction;
    its quotas (None: none)."""

    kind: Kind
    name: str
    produce_bytes: int
    fetch_bytes: int
    produce_throttled_s: float
    fetch_throttled_s: float
    produce_quota: int | None
    fetch_quota: int | None


@dataclass(frozen=True, slots=True)
class QuotaStatistics:
    """The quotas' figures (broker.metrics): every client known now, and the requests held
    back now, for all connections."""

    clients: tuple[ClientStatistics, ...]
    held_requests: int


@dataclass(slots=True)
class _Held:
    """A connection's requests held back, oldest first, each with the time it arrived, and
    when the first may be looked at again; the client they count to."""

    until: float
    client: tuple[Kind, str]
    fd: int
    """The descriptor of the connection's TCP connection (broker.zmqio.source_fd; -1: none)."""
    requests: deque[tuple[list[zmq.Frame], float]] = field(default_factory=deque)


class Throttle:
    """The front's quotas: which requests wait and for how long. The loop calls `admit` for
    each PRODUCE and consumer FETCH, `fetched` for each FETCH reply, `hold` for requests (and
    for every request of a connection in `held`), and `due` once a turn; `update` when the
    registry's quotas change (from another thread: it swaps one reference)."""

    def __init__(
        self,
        parked_per_client: int,
        held_ceiling: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.parked_per_client = parked_per_client
        self.held_ceiling = held_ceiling
        """The most request bytes held back for quotas, for all clients (queued_request_bytes:
        the front's one ceiling of requests); a client holds at most 1 / HELD_SHARES of it."""
        self.clock = clock
        self.config = QuotaConfig()
        self._pending: QuotaConfig | None = None
        """A configuration from the registry's thread, taken on the loop's next turn."""
        self._clients: dict[tuple[Kind, str], _Client] = {}
        self._fetchers: dict[bytes, tuple[_Client, float]] = {}
        """The client of each connection that fetched as a consumer (whom its replies count
        to), and when it last did."""
        self.held: dict[bytes, _Held] = {}
        """The connections whose requests are held back: a new request of one waits behind."""
        self._next_sweep = 0.0
        self.held_requests = 0
        """Requests held back now, for all connections (broker.metrics)."""
        self.held_bytes = 0
        """Their bytes."""
        self._client_held: dict[tuple[Kind, str], int] = {}
        """The bytes held back now of each client that has any."""
        self.active = False
        """Whether any quota is set: read for every request and FETCH reply, so kept as a
        plain attribute (the configuration's `active` walks its quotas)."""

    def update(self, config: QuotaConfig) -> None:
        """Quotas as the registry now has them: in force for the next request the loop
        admits, or its next turn."""
        self._pending = config
        if config.active:  # admitted from now on (a quota set); cleared by _take
            self.active = True

    def admit(
        self,
        tagged: bytes,
        client_name: tuple[Kind, str],
        direction: Direction,
        size: int,
        arrived: float | None,
    ) -> float:
        """0 when the request of connection `tagged` may be served now (a PRODUCE's `size`
        then counted, and the wait of one held back since `arrived`), else how long it must
        wait first, in seconds: then `hold` it."""
        now = self.clock()
        if self._pending is not None:
            self._take(self._pending, now)
        client = self._clients.get(client_name) or self._new_client(self._counted(client_name))
        client.seen = now
        if direction is Direction.FETCH:
            self._fetchers[tagged] = (client, now)
            bucket = client.fetch
        else:
            bucket = client.produce
        if bucket is None:
            return 0.0
        wait = bucket.wait_s(now)
        if wait > 0:
            return wait
        if direction is Direction.PRODUCE:  # drained up to now by wait_s
            bucket.level += size
            bucket.bytes += size
        if arrived is not None:
            bucket.throttled_s += now - arrived
        return 0.0

    def fetched(self, tagged: bytes, size: int) -> None:
        """A FETCH reply of `size` bytes of messages goes out on connection `tagged`."""
        fetcher = self._fetchers.get(connection_of(tagged))
        if fetcher is not None and (bucket := fetcher[0].fetch) is not None:
            bucket.charge(size, self.clock())

    def hold(
        self,
        tagged: bytes,
        frames: list[zmq.Frame],
        arrived: float,
        wait_s: float,
        client: tuple[Kind, str] | None = None,
        again: bool = False,
        fd: int = -1,
    ) -> None:
        """Hold back a request of `tagged`, of `client` (None: the connection's requests are
        held already, theirs), that arrived at `arrived`: behind the connection's others, or
        with `wait_s` > 0 (admit's), first, and the connection until then. RepliesNotRead when
        the connection holds parked_per_client already, or its client 1 / HELD_SHARES of the
        held_ceiling bytes, or all clients the held_ceiling (but a client holding nothing
        while nothing is held may hold one); a client that keeps fewer requests in flight
        never meets them. `again`: one that `due` gave and admit found still over its quota,
        counted already, held again without these checks. `fd`: the descriptor the request
        came by (broker.zmqio.source_fd), so that `closed` drops what its connection held."""
        size = _size(frames)
        held = self.held.get(tagged)
        if held is None:
            assert client is not None, "a connection held for the first time names its client"
            held = _Held(self.clock() + wait_s, client, fd)
        elif len(held.requests) >= self.parked_per_client and not again:
            raise RepliesNotRead(
                f"this connection has {len(held.requests)} requests held back for its quota "
                "of bytes a second already: keep fewer requests in flight (each waits its turn)"
            )
        if not again:
            self._check_room(held.client, size)
        self.held[tagged] = held
        self.held_bytes += size
        self._client_held[held.client] = self._client_held.get(held.client, 0) + size
        if wait_s > 0:
            held.until = self.clock() + wait_s
            held.requests.appendleft((frames, arrived))
        else:
            held.requests.append((frames, arrived))
        self.held_requests += 1

    def due(self) -> Iterator[tuple[bytes, list[zmq.Frame], float]]:
        """Once a turn: take a new configuration in, then yield the held requests whose wait
        is over, in order (tagged identity, frames as received, arrival time). A request the
        caller holds again (admit found its client still over) stops its connection's."""
        now = self.clock()
        if self._pending is not None:
            self._take(self._pending, now)
        for tagged, held in list(self.held.items()):
            while held.requests and held.until <= now:
                frames, arrived = held.requests.popleft()
                self.held_requests -= 1
                self._release(held.client, _size(frames))
                yield tagged, frames, arrived
            if not held.requests:
                del self.held[tagged]
        if now >= self._next_sweep:
            self._sweep(now)

    def closed(self, fd: int) -> int:
        """The TCP connection of descriptor `fd` closed (the front socket's monitor): drop
        the requests held for it, never to be served (nothing of theirs appended, no reply:
        there is no one to answer). How many were dropped. A connection that opened on the
        same descriptor in the instant before the close was read loses its held requests too
        (its client's timeout sends them again)."""
        if fd < 0:
            return 0
        dropped = 0
        for tagged, held in list(self.held.items()):
            if held.fd != fd:
                continue
            for frames, _ in held.requests:
                self._release(held.client, _size(frames))
            dropped += len(held.requests)
            self.held_requests -= len(held.requests)
            del self.held[tagged]
        return dropped

    def _check_room(self, client: tuple[Kind, str], size: int) -> None:
        """RepliesNotRead unless `size` more bytes of `client` may be held back (hold)."""
        share = self.held_ceiling // HELD_SHARES
        mine = self._client_held.get(client, 0)
        if mine and mine + size > share:
            raise RepliesNotRead(
                f"{mine} bytes of this client's requests are held back for its quota already "
                f"(at most {share}): keep fewer requests in flight (each waits its turn)"
            )
        if self.held_bytes and self.held_bytes + size > self.held_ceiling:
            raise RepliesNotRead(
                f"the broker holds {self.held_bytes} bytes of requests back for quotas already "
                f"(at most {self.held_ceiling}): keep fewer requests in flight"
            )

    def _release(self, client: tuple[Kind, str], size: int) -> None:
        """`size` bytes of `client` held back no more."""
        self.held_bytes -= size
        left = self._client_held[client] - size
        if left:
            self._client_held[client] = left
        else:
            del self._client_held[client]

    def timeout_ms(self, longest: int) -> int:
        """How long the loop may wait for messages before a held request is due (at most
        `longest`)."""
        if not self.held:
            return longest
        first = min(held.until for held in self.held.values())
        return max(0, min(longest, math.ceil((first - self.clock()) * 1000)))

    def statistics(self) -> QuotaStatistics:
        """Every client known now (those with a quota that sent in the last FORGET_AFTER_S),
        and the requests held now."""
        out = []
        for client in list(self._clients.values()):
            produce, fetch = client.produce, client.fetch
            out.append(
                ClientStatistics(
                    client.kind,
                    client.name,
                    0 if produce is None else produce.bytes,
                    0 if fetch is None else fetch.bytes,
                    0.0 if produce is None else produce.throttled_s,
                    0.0 if fetch is None else fetch.throttled_s,
                    None if produce is None else produce.rate,
                    None if fetch is None else fetch.rate,
                )
            )
        return QuotaStatistics(tuple(out), self.held_requests)

    def _counted(self, client_name: tuple[Kind, str]) -> tuple[Kind, str]:
        """The name a client not known yet is counted under: its own (MAX_NAME characters of
        it), or DEFAULT's once MAX_CLIENTS are known, unless it has a quota of its own."""
        kind, name = client_name
        name = name[:MAX_NAME]
        if len(self._clients) >= MAX_CLIENTS and name not in self.config.quotas.get(kind, {}):
            return kind, DEFAULT
        return kind, name

    def _new_client(self, client_name: tuple[Kind, str]) -> _Client:
        client = self._clients.get(client_name)
        if client is not None:  # the name it is counted under is known: DEFAULT, a prefix
            return client
        kind, name = client_name
        client = self._clients[client_name] = _Client(
            kind,
            name,
            self._bucket(kind, name, Direction.PRODUCE),
            self._bucket(kind, name, Direction.FETCH),
            0.0,
        )
        return client

    def _bucket(self, kind: Kind, name: str, direction: Direction) -> _Bucket | None:
        rate = self.config.rate(kind, name, direction)
        return None if rate is None else _Bucket(rate)

    def _take(self, config: QuotaConfig, now: float) -> None:
        """Apply `config`: every client's rates now (what it owes kept, in bytes), and every
        held request looked at again at once."""
        if self._pending is config:  # not replaced since by a newer one
            self._pending = None
        self.config = config
        self.active = config.active
        for client in self._clients.values():
            for direction in Direction:
                rate = config.rate(client.kind, client.name, direction)
                bucket = getattr(client, direction.value)
                if rate is None:
                    setattr(client, direction.value, None)
                elif bucket is None:
                    setattr(client, direction.value, _Bucket(rate))
                else:
                    bucket.wait_s(now)  # drained at the old rate up to now
                    bucket.rate = rate
        for held in self.held.values():
            held.until = now

    def _sweep(self, now: float) -> None:
        """Forget the clients idle for FORGET_AFTER_S that owe nothing, and the connections
        that have not fetched for as long."""
        self._next_sweep = now + FORGET_AFTER_S / 10
        for key, client in list(self._clients.items()):
            if now - client.seen > FORGET_AFTER_S and not _owes(client, now):
                del self._clients[key]
        for tagged, (_, seen) in list(self._fetchers.items()):
            if now - seen > FORGET_AFTER_S:
                del self._fetchers[tagged]


def _size(frames: list[zmq.Frame]) -> int:
    """The bytes of a request held back."""
    return sum(len(frame) for frame in frames)


def _owes(client: _Client, now: float) -> bool:
    """Whether `client` owes any bytes in either direction at `now`."""
    for bucket in (client.produce, client.fetch):
        if bucket is not None:
            bucket.wait_s(now)  # drained up to now
            if bucket.level > 0:
                return True
    return False

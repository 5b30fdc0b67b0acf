"""The leader's lease (docs/replication.md, "Fencing"): how long this broker may go on acting as
the leader of the partitions it leads without hearing from ZooKeeper, and in which incarnation.

The controller chooses another leader only after the leader's ZooKeeper session has expired
(its registration gone) or after the leader registered again (a restart: a new broker epoch,
the czxid of its registration node, Kafka's KIP-380). A session cannot expire sooner than the
session timeout after the server last heard from it. So when the supervisor reads its own
registration at time T (monotonic, taken before the request is sent) and the server answers
that the node is this session's, no other leader can have been chosen for this incarnation
before T + the session timeout. The lease runs to T + LEASE_FRACTION of it, the rest a margin
for clocks that run at slightly different rates; it is renewed every RENEW_FRACTION of its
length, on a thread of its own so that no other registry call delays it.

A worker serves a partition as its leader (PRODUCE at every ack, FETCH, OFFSETS; acks it
sends) only while `Lease.covers(the broker epoch its role names, now)`: before the lease's end,
and in the incarnation the lease was confirmed for. A broker frozen (SIGSTOP, a VM paused, a
long GC-like stall) past its session finds its lease run out when it resumes and answers
NOT_LEADER_FOR_PARTITION to everything it had queued; after its session expired it gets a new
one, registers again and renews the lease for its new broker epoch, which the roles read
before (naming the old one) never match: it leads again only when the controller chooses it
anew. The monotonic clock is the machine's, shared by the supervisor and its workers.

The lease is reckoned on `zookeeper.session_timeout_ms`, so the server must not negotiate a
shorter session: ZooKeeper clamps it to its minSessionTimeout..maxSessionTimeout (2 to 20
ticks by default: keep the setting at most 20 ticks, 40 s with a 2 s tick). One asked below 2
ticks is raised, which only lengthens the margin.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from broker.errors import PylogError
from broker.registry_calls import RegistryCalls

if TYPE_CHECKING:  # annotations only: a worker imports this module, and no kazoo
    from broker.registry import Registry

LEASE_FRACTION = 2 / 3
"""The lease's length, as a fraction of the ZooKeeper session timeout."""
RENEW_FRACTION = 1 / 4
"""How often the lease is renewed, as a fraction of its length."""
UNREGISTERED_RETRY_S = 0.02
"""How soon the registration is read again when it was not this session's: at start, or after
a session expired, the broker registers within moments, and leads nothing until then."""


@dataclass
class Lease:
    """Until when (time.monotonic()) this broker may act as a leader, in which incarnation
    (`broker_epoch`); (0, -1) until the first renewal. One object shared by the partitions of
    a worker, renewed in place."""

    until: float = 0.0
    broker_epoch: int = -1

    def covers(self, broker_epoch: int, now: float) -> bool:
        """Whether a leadership given to incarnation `broker_epoch` may act at `now`."""
        return now < self.until and broker_epoch == self.broker_epoch


class LeaseKeeper:
    """The supervisor's side: renews the lease by reading the broker's registration
    (Registry.brokers.registered_epoch) on a thread of its own, and hands each lease renewed to
    `renewed` on the loop. `tick` is called on every turn of the loop; nothing waits."""

    def __init__(
        self,
        calls: RegistryCalls,
        broker_id: int,
        session_timeout_s: float,
        renewed: Callable[[Lease], None],
    ) -> None:
        self.calls = calls
        self.broker_id = broker_id
        self.length = session_timeout_s * LEASE_FRACTION
        self.every = self.length * RENEW_FRACTION
        self._renewed = renewed
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="lease")
        """Not the registry thread: a slow call queued there must not let the lease lapse."""
        self.lease = Lease()
        """The last lease renewed."""
        self._next_at = 0.0
        self._asking = False

    def tick(self) -> None:
        """Ask for a renewal when one is due and none is under way."""
        if self._asking or time.monotonic() < self._next_at:
            return
        self._asking = True
        self.calls.call(self._confirm, self._answered, self._failed, self._thread)

    def shutdown(self) -> None:
        self._thread.shutdown(wait=True, cancel_futures=True)

    def _confirm(self, registry: Registry) -> tuple[float, int | None]:
        """The time taken before asking, and the broker epoch of this session's registration
        (None: not registered in this session)."""
        sent = time.monotonic()
        return sent, registry.brokers.registered_epoch(self.broker_id)

    def _answered(self, result: tuple[float, int | None]) -> None:
        sent, broker_epoch = result
        self._asking = False
        if broker_epoch is None:  # not registered (yet, or again): soon registered
            self._next_at = time.monotonic() + min(self.every, UNREGISTERED_RETRY_S)
            return
        self._next_at = time.monotonic() + self.every
        self.lease = Lease(sent + self.length, broker_epoch)
        self._renewed(self.lease)

    def _failed(self, _: PylogError) -> None:
        self._asking = False
        self._next_at = time.monotonic() + self.every

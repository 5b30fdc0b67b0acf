"""What the leader of a replicated partition knows of its followers (docs/replication.md, "The
leader"): where each one fetches from, what it has flushed, when it last caught up; the in-sync
set (ISR) as ZooKeeper last said, the change to it asked and not yet made, and the high
watermark.

Pure bookkeeping, no I/O: the worker feeds it each follower's fetch and its own flushes, and
asks it for the high watermark and for the ISR change to ask the supervisor for.

- A follower is **caught up** when it fetches from the leader's flushed end or past it (it has
  every byte the leader can give it; followers copy flushed bytes only), or, under steady
  load, as of its previous fetch when it now fetches from where the leader's flushed end was
  then (Kafka's lastFetchLeaderLogEndOffset): a leader that flushes during every round trip
  never sees a follower at its flushed end of the moment.
- **Shrink**: an ISR follower not caught up for `lag_max_s` leaves the ISR.
- **Expand**: a follower outside the ISR whose flushed offset has reached the high watermark,
  fetching at or past the start of the leader's epoch (so it has truncated to the leader's
  history), joins it.
- **The high watermark** is the lowest flushed offset over the ISR (the leader's own included)
  and never moves back. The ISR it counts is the largest ZooKeeper may hold (Kafka's "maximal
  ISR", KIP-497): a shrink counts once ZooKeeper has it, an expansion from the moment it is
  asked until a state node newer than the one it was asked from says how it ended. So no
  ack=all is answered for bytes that a replica ZooKeeper may list as in sync (and the
  controller may choose) lacks.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from broker.log.epochs import EpochEntry

ISR_RETRY_S = 5.0
"""How long an ISR change asked of the supervisor is waited for before it is asked again (its
answer, the state node's new data, may have been lost with a ZooKeeper session)."""


@dataclass
class FollowerProgress:
    """One follower as its fetches show it."""

    fetch_offset: int
    flushed: int
    caught_up_at: float
    fetched_at: float = 0.0
    leader_flushed_then: int = 0
    """When it last fetched, and the leader's flushed end at that moment."""


class LeaderState:
    """The leader's view of its followers, for one term (one leader epoch)."""

    def __init__(
        self,
        me: int,
        epoch: int,
        epoch_start: int,
        replicas: Iterable[int],
        isr: Iterable[int],
        high_watermark: int,
        lag_max_s: float,
        now: float,
        version: int = 0,
    ) -> None:
        self.me = me
        self.epoch = epoch
        self.epoch_start = epoch_start
        """The leader's log end when its term began: a follower fetching below it has not yet
        truncated to this leader's history."""
        self.replicas = tuple(replicas)
        self.isr = frozenset(isr)
        self.version = version
        """The version of the state node that said `isr`."""
        self.lag_max_s = lag_max_s
        self.high_watermark = high_watermark
        # Every follower starts as caught up now: it gets lag_max_s to show itself.
        self.followers = {
            r: FollowerProgress(high_watermark, high_watermark if r in self.isr else 0, now)
            for r in self.replicas
            if r != me
        }
        self.asked: tuple[int, ...] | None = None
        """The ISR asked of the supervisor, until ZooKeeper's answer (or ISR_RETRY_S)."""
        self.asked_at = 0.0
        self.joining: frozenset[int] = frozenset()
        """Followers asked into the ISR whose outcome no state node has told yet: counted in
        the high watermark meanwhile (ZooKeeper may list them already)."""
        self.joining_from = version
        """The state node version those were asked from: a newer one tells the outcome."""

    def record_fetch(
        self, replica: int, offset: int, flushed: int, leader_flushed: int, now: float
    ) -> None:
        """A fetch of `replica` from `offset`, saying it has flushed up to `flushed`, while
        the leader's flushed end is `leader_flushed`."""
        follower = self.followers[replica]
        follower.fetch_offset = offset
        follower.flushed = min(flushed, offset)
        if offset >= leader_flushed:
            follower.caught_up_at = now
        elif offset >= follower.leader_flushed_then:  # it had all there was at its last fetch
            follower.caught_up_at = max(follower.caught_up_at, follower.fetched_at)
        follower.fetched_at, follower.leader_flushed_then = now, leader_flushed

    def set_isr(self, isr: Iterable[int], version: int) -> None:
        """The ISR as the state node of `version` holds it (the asked change made, or someone
        else's)."""
        self.isr = frozenset(isr)
        self.version = version
        self.asked = None
        if version > self.joining_from:  # the asked expansion was made, or lost to another
            self.joining = frozenset()

    def set_replicas(self, replicas: Iterable[int], now: float) -> None:
        """The partition's replicas as changed within this term by a reassignment: a follower
        added is known from its first fetch on (it joins the ISR as any other, once caught
        up), one removed is forgotten."""
        self.replicas = tuple(replicas)
        for replica in self.replicas:
            if replica != self.me and replica not in self.followers:
                self.followers[replica] = FollowerProgress(-1, 0, now)  # no fetch yet: not joining
        for replica in [r for r in self.followers if r not in self.replicas]:
            del self.followers[replica]

    def raise_high_watermark(self, leader_flushed: int) -> bool:
        """Recompute the high watermark with the leader's flushed end; whether it moved."""
        counted = self.isr | self.joining
        ends = [leader_flushed]
        ends.extend(f.flushed for r, f in self.followers.items() if r in counted)
        high_watermark = max(self.high_watermark, min(ends))
        moved = high_watermark != self.high_watermark
        self.high_watermark = high_watermark
        return moved

    def wanted_isr(self, now: float, fetched: int | None = None) -> tuple[int, ...] | None:
        """The ISR to ask the supervisor for now (sorted), or None: no change is due, or one
        asked is still awaited. Only `fetched`, the follower whose fetch this is, may join
        (Kafka's rule): a follower that stopped fetching, whom the controller took out of the
        ISR when its broker died, is not taken back in on its last fetch."""
        if self.asked is not None and now - self.asked_at < ISR_RETRY_S:
            return None
        isr = set(self.isr)
        for replica, follower in self.followers.items():
            if replica in isr and now - follower.caught_up_at > self.lag_max_s:
                isr.discard(replica)
            elif (
                replica == fetched
                and replica not in isr
                and follower.flushed >= self.high_watermark
                and follower.fetch_offset >= self.epoch_start
                and now - follower.caught_up_at <= self.lag_max_s
            ):
                isr.add(replica)
        if isr == self.isr:
            return None
        if joining := isr - self.isr:
            self.joining |= joining
            self.joining_from = self.version
        self.asked = tuple(sorted(isr))
        self.asked_at = now
        return self.asked


def epoch_entries(entries: Sequence[EpochEntry], offset: int, end: int) -> tuple[EpochEntry, ...]:
    """The leader's epoch entries that a FETCH version 2 reply of the bytes [offset, end)
    carries: the one in effect at `offset`, then those that start after it, up to `end`."""
    in_effect = [e for e in entries if e.start_offset <= offset][-1:]
    return (*in_effect, *(e for e in entries if offset < e.start_offset <= end))

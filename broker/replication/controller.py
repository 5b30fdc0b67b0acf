"""The controller (docs/replication.md, "The controller"): the service, run in every pylogd
supervisor, that gets itself elected controller through ZooKeeper and, while it is, chooses the
partitions' leaders.

- **Election.** The service tries `Registry.controller.elect(broker_id)`. When another broker
  holds /controller it waits for the watch on /controller and tries again once the node goes.
  Every time it wakes it asks again (`controller.elect` answers the epoch this session holds, a
  new epoch, or None), so a session that expired (its /controller gone with it) or a newer
  controller is noticed then; a write refused with ControllerMoved stops the acting at once.
  Each change is logged: elected at INFO, the loss of an epoch at WARNING.
- **Failover.** As controller, on election and on every change of the live brokers
  (/brokers/ids), of the topics (/config/topics) and of a topic's `unclean_leader_election`
  setting, it settles every partition (choose_leader): a partition whose leader is not alive
  (or is -1) gets the first replica, in `replicas[p]` order, that is alive and in the ISR; with
  none, and the topic's `unclean_leader_election` at 1, the first alive replica (an unclean
  election: WARNING, counted); else leader -1 (ERROR, once: the partition is unavailable until
  an ISR replica's broker returns, which is then chosen). A partition whose leader is alive
  loses the dead brokers from its ISR. Topics made before replication get their state nodes
  first (Registry.topics.create_partition_states).
- **Preferred-leader election** (ControllerService.elect_preferred): leadership goes back to
  `replicas[p][0]` where it is alive and in the ISR. The service runs it by itself over every
  topic every `leader_rebalance_interval_ms` while it is the controller (the first run that
  long after its election; 0: never), so leadership spreads back after a broker restarts.

Every write is Registry.topics.write_partition_state conditional on the node's version read and on
/controller_epoch being at this controller's epoch: PartitionStateChanged reads the node again
and decides again (broker.replication.acting: WRITE_ATTEMPTS times at most), ControllerMoved
ends this epoch's acting. The choices themselves are pure functions: broker.replication.election.

All of it runs on the service's own thread: kazoo's watch callbacks only put an event on its
queue, and a failure to reach ZooKeeper is retried with back-off on that thread. Nothing of it
runs on the supervisor's routing loop.

- **Reassignment** (broker.replication.reassign): a partition asked to move
  (/admin/reassign/<topic>-<p>, `pylogctl topic reassign`) gets the wanted replicas added, then,
  once they are all in the ISR, the old ones removed and leadership moved if its leader goes,
  in one transaction that also deletes the request. Looked at in every round and every
  REASSIGN_CHECK_S while one waits.
- **Asked preferred-leader election** (/admin/preferred_election, `pylogctl topic
  elect-preferred`): run in the next round, then its node deleted.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from broker.backoff import Backoff
from broker.clock import SYSTEM_CLOCK, Clock
from broker.errors import PylogError, RegistryUnavailable, Unavailable
from broker.registry import ControllerInfo, ControllerMoved, Registry, TopicConfig
from broker.registry.nodes import validate_broker_id
from broker.registry.topic_config import Replicas
from broker.replication.acting import Acting, Counters, Settled, unclean_allowed

log = logging.getLogger("pylog.controller")

RETRY_MIN_S = 0.1
RETRY_MAX_S = 2.0
"""The wait before a round that failed (ZooKeeper unreachable, a partition left behind) is
tried again: RETRY_MIN_S, doubling up to RETRY_MAX_S while rounds keep failing."""

STOP_TIMEOUT_S = 5.0
"""How long ControllerService.stop waits, by default, for the service's thread to end."""

LEADER_REBALANCE_INTERVAL_MS = 30_000
"""The default of ControllerService.start's leader_rebalance_interval_ms, as the broker setting
`broker.leader_rebalance_interval_ms`'s."""

REASSIGN_CHECK_S = 0.5
"""How often the controller looks again at reassignments waiting for their new replicas to
join the ISR (it is not told when an ISR changes)."""


class NotController(Unavailable):
    """An act of the controller (elect_preferred) asked of a service that is not the controller
    now: ask the broker that is (Registry.controller()), or again later. Nothing was written."""

    def __init__(self, broker_id: int, controller: ControllerInfo | None) -> None:
        who = (
            "no broker is (an election is under way)"
            if controller is None
            else f"broker {controller.broker_id} is, epoch {controller.epoch}"
        )
        super().__init__(f"broker {broker_id} is not the controller: {who}")
        self.controller = controller


@dataclass(frozen=True)
class ControllerStatistics:
    """A snapshot of a controller service. `controller_epoch`: the epoch it acts in, None when
    it is not the controller; `elections`: the times it was elected; `leaders_chosen`: leaders
    chosen from the ISR for a partition without a live leader; `unclean_elections`: leaders
    chosen outside the ISR; `offline_partitions`: partitions without a leader after its last
    round (0 when not the controller); `isr_removals`: dead brokers removed from an ISR (one per
    partition and write); `preferred_moves`: leaderships moved to the preferred leader (by
    elect_preferred and by the periodic runs); `preferred_runs`: periodic preferred-leader
    elections run to their end (every `leader_rebalance_interval_ms` while the controller);
    `preferred_run_due`: when the next is due, on the service's clock (None: not the controller,
    or the periodic election switched off);
    `reassign_steps`: reassignment steps written (expand, finish); `reassignments_done`:
    reassignments finished; `reassignments_waiting`: those waiting for their new replicas
    after its last look (0 when not the controller)."""

    controller_epoch: int | None
    elections: int
    leaders_chosen: int
    unclean_elections: int
    offline_partitions: int
    isr_removals: int
    preferred_moves: int
    preferred_runs: int = 0
    preferred_run_due: float | None = None
    reassign_steps: int = 0
    reassignments_done: int = 0
    reassignments_waiting: int = 0


_STOP = "stop"
_WAKE = "wake"


class ControllerService:
    """The controller service of one broker: start(registry, broker_id) once the broker is
    registered, stop() before the registry stops. See the module's docstring for what it does.

    Thread-safety: start, stop, elect_preferred and statistics may be called from any thread.
    """

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        """Its timers' clock (retries, the periodic election, reassignments): its monotonic()."""
        self._events: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._lock = threading.Lock()
        """Held by whoever acts as controller: the service's thread, or elect_preferred."""
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._registry: Registry | None = None
        self._broker_id = -1
        self._epoch: int | None = None
        self._known: dict[str, Settled] = {}
        """The topics settled in `_epoch` (acting.Settled): a new epoch starts with none."""
        self._counters = Counters()
        self._rebalance_interval_s = 0.0
        """Seconds between periodic preferred-leader elections; 0: none (set by start)."""
        self._rebalance_at: float | None = None
        """When the next periodic preferred-leader election is due, on the clock (None: not the
        controller, or switched off)."""
        self._topic_watches: dict[str, tuple[bool, Replicas] | None] = {}
        """Topics whose node's data is watched, each with what its leaders are chosen from as
        the watch last saw it, its unclean_leader_election and its replicas (None before its
        first call)."""
        self._watches_lock = threading.Lock()

    # -- lifetime --------------------------------------------------------------------------

    def start(
        self,
        registry: Registry,
        broker_id: int,
        *,
        leader_rebalance_interval_ms: int = LEADER_REBALANCE_INTERVAL_MS,
    ) -> None:
        """Watch /controller, the live brokers and the topics, and start the service's thread,
        which tries to be elected at once. Does not wait on ZooKeeper.

        While it is the controller, the thread runs a preferred-leader election over every
        topic (as elect_preferred) every `leader_rebalance_interval_ms`: the first that long
        after its election, each next that long after the previous one ended (never more
        often); 0 switches it off. Each run that moves a partition logs it at INFO; moves and
        runs are counted (statistics()).

        RuntimeError when started already; ValueError for a broker id that is not an integer
        >= 0 or an interval that is not an integer >= 0; RegistryUnavailable when the
        registry is not started."""
        if self._thread is not None:
            raise RuntimeError("a ControllerService is started once; make a new one")
        validate_broker_id(broker_id)
        interval = leader_rebalance_interval_ms
        if not isinstance(interval, int) or isinstance(interval, bool) or interval < 0:
            raise ValueError(
                f"leader_rebalance_interval_ms is an integer >= 0 (0: off), not {interval!r}"
            )
        self._rebalance_interval_s = interval / 1000
        self._registry, self._broker_id = registry, broker_id
        registry.controller.watch(self._on_controller)
        registry.brokers.watch_ids(lambda _: self._wake())
        registry.topics.watch_topic_names(lambda _: self._wake())
        registry.reassignments.watch_reassignments(lambda _: self._wake())
        registry.reassignments.watch_preferred_election(self._on_preferred_election)
        self._thread = threading.Thread(
            target=self._run, name=f"controller-{broker_id}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> bool:
        """Stop acting, resign as controller if this service is (so that another broker is
        elected at once, not when this session ends) and wait at most `timeout` seconds for
        the thread to end; False when it did not end in time (it ends after its ZooKeeper
        request in flight, which waits at most the registry's request_timeout_s).
        Idempotent."""
        self._stopping.set()
        self._events.put(_STOP)
        thread = self._thread
        if thread is None or thread is threading.current_thread():
            return True
        thread.join(timeout)
        if thread.is_alive():
            log.warning("the controller's thread did not end within %.1f s", timeout)
            return False
        return True

    @property
    def controller_epoch(self) -> int | None:
        """The controller epoch this service acts in; None when it is not the controller."""
        return self._epoch

    def statistics(self) -> ControllerStatistics:
        """What the service did so far (ControllerStatistics)."""
        c = self._counters
        return ControllerStatistics(
            controller_epoch=self._epoch,
            elections=c.elections,
            leaders_chosen=c.leaders_chosen,
            unclean_elections=c.unclean_elections,
            offline_partitions=c.offline_partitions if self._epoch is not None else 0,
            isr_removals=c.isr_removals,
            preferred_moves=c.preferred_moves,
            preferred_runs=c.preferred_runs,
            preferred_run_due=self._rebalance_at,
            reassign_steps=c.reassign_steps,
            reassignments_done=c.reassignments_done,
            reassignments_waiting=len(c.reassignments_waiting) if self._epoch is not None else 0,
        )

    # -- acts asked from outside ------------------------------------------------------------

    def elect_preferred(self, topics: Iterable[str] | None = None) -> int:
        """Preferred-leader election over `topics` (default: every topic), on the calling
        thread (it waits while the service's thread is in a round): for each partition whose
        leader is not its preferred leader `replicas[p][0]` while that broker is alive and in
        the ISR, leadership moves to it (leader epoch + 1, the ISR as it is), by the same
        conditional writes as failover. Returns how many partitions moved.

        NotController when this service is not the controller; ControllerMoved when it was
        but another controller was elected meanwhile (it then stops acting);
        UnknownTopicOrPartition for a topic that does not exist (nothing moved);
        RegistryUnavailable when ZooKeeper cannot be reached (some may have moved)."""
        registry = self._registry
        if registry is None:
            raise NotController(self._broker_id, None)
        with self._lock:
            epoch = self._epoch
            if epoch is None or self._stopping.is_set():
                raise NotController(self._broker_id, registry.controller.current())
            acting = self._acting(registry, epoch)
            try:
                return acting.elect_preferred(topics)
            except ControllerMoved:
                self._lose(epoch, "a newer controller refused its write")
                self._wake()
                raise

    # -- the thread ---------------------------------------------------------------------------

    def _wake(self) -> None:
        if not self._stopping.is_set():
            self._events.put(_WAKE)

    def _on_preferred_election(self, asked: bool) -> bool:
        """/admin/preferred_election was created or deleted (on kazoo's thread)."""
        if asked:
            self._wake()
        return not self._stopping.is_set()

    def _on_controller(self, _: ControllerInfo | None) -> bool:
        """/controller changed (on kazoo's thread): wake the service, which asks again."""
        self._wake()
        return not self._stopping.is_set()

    def _run(self) -> None:
        backoff = Backoff(RETRY_MIN_S, RETRY_MAX_S)
        retry_at: float | None = self._clock.monotonic()  # the first round at once
        self._rebalance_at = None
        rebalance_epoch: int | None = None
        """The controller epoch _rebalance_at was set in."""
        reassign_at: float | None = None
        """When reassignments waiting for their new replicas are looked at again."""
        try:
            while True:
                due = [at for at in (retry_at, self._rebalance_at, reassign_at) if at is not None]
                timeout = None if not due else max(0.0, min(due) - self._clock.monotonic())
                events = []
                with contextlib.suppress(queue.Empty):  # none: a retry or a run is due
                    events.append(self._events.get(timeout=timeout))
                while True:  # what came meanwhile is seen by this one round
                    try:
                        events.append(self._events.get_nowait())
                    except queue.Empty:
                        break
                if _STOP in events or self._stopping.is_set():
                    return
                now = self._clock.monotonic()
                if events or (retry_at is not None and now >= retry_at):
                    if self._attempt(self._round, "controller round", backoff.current_s):
                        backoff.reset()
                        retry_at = None
                    else:
                        retry_at = self._clock.monotonic() + backoff.next()
                elif reassign_at is not None and now >= reassign_at:
                    self._attempt(self._reassign, "reassignment", REASSIGN_CHECK_S)
                reassign_at = (
                    self._clock.monotonic() + REASSIGN_CHECK_S
                    if self._epoch is not None and self._counters.reassignments_waiting
                    else None
                )
                epoch = self._epoch
                if epoch is None or self._rebalance_interval_s <= 0:
                    self._rebalance_at = rebalance_epoch = None
                    continue
                if rebalance_epoch != epoch:  # elected (again): the first run an interval on
                    self._rebalance_at, rebalance_epoch = now + self._rebalance_interval_s, epoch
                    continue
                if self._rebalance_at is not None and self._clock.monotonic() >= self._rebalance_at:
                    elect = self._rebalance
                    if not self._attempt(elect, "preferred-leader election", backoff.current_s):
                        retry_at = self._clock.monotonic() if retry_at is None else retry_at
                    # never more often than the interval, whatever came of it
                    self._rebalance_at = self._clock.monotonic() + self._rebalance_interval_s
        finally:
            with self._lock:  # not under an elect_preferred under way
                self._resign()

    def _attempt(self, act: Callable[[], bool], what: str, delay: float) -> bool:
        """Run `act` under the acting lock; False when it failed or left something to retry
        (logged: the retry comes `delay` seconds later)."""
        try:
            with self._lock:
                return act()
        except RegistryUnavailable as error:
            log.warning("%s failed, retrying in %.1f s: %s", what, delay, error)
        except PylogError as error:  # an ACL refusing a write, say: logged, retried
            log.error("%s failed, retrying in %.1f s: %s", what, delay, error)
        except Exception:
            log.exception("%s failed unexpectedly; retrying", what)
        return False

    def _rebalance(self) -> bool:
        """The periodic preferred-leader election over every topic, as the controller. False
        when it stopped acting (ControllerMoved: a round then asks again who is)."""
        registry, epoch = self._registry, self._epoch
        assert registry is not None
        if epoch is None or self._stopping.is_set():
            return True
        acting = self._acting(registry, epoch)
        try:
            moved = acting.elect_preferred(None)
        except ControllerMoved:
            self._lose(epoch, "a newer controller refused its write")
            registry.controller.resign()  # /controller is not ours now, unless set by hand
            return False
        self._counters.preferred_runs += 1
        if moved:
            log.info(
                "preferred-leader election: %d partition(s) led by their preferred leader again",
                moved,
            )
        else:
            log.debug("preferred-leader election: every partition that can be is so led")
        return True

    def _reassign(self) -> bool:
        """The reassignments under way, looked at again as the controller. False when it
        stopped acting (ControllerMoved: a round then asks again who is)."""
        registry, epoch = self._registry, self._epoch
        assert registry is not None
        if epoch is None or self._stopping.is_set():
            return True
        try:
            self._acting(registry, epoch).reassign()
        except ControllerMoved:
            self._lose(epoch, "a newer controller refused its write")
            registry.controller.resign()
            return False
        return True

    def _round(self) -> bool:
        """Be the controller, or learn that another broker is; as controller, settle every
        partition. True when nothing is left to retry."""
        registry = self._registry
        assert registry is not None
        epoch = registry.controller.elect(self._broker_id)
        if epoch != self._epoch:
            if self._epoch is not None:
                self._lose(self._epoch, "its session expired or it resigned")
            if epoch is None:
                return True  # another broker is: its /controller's watch wakes us
            self._epoch, self._known = epoch, {}
            self._counters.elections += 1
            log.info(
                "broker %d acts as the controller, controller epoch %d", self._broker_id, epoch
            )
        if epoch is None:
            return True
        acting = self._acting(registry, epoch)
        try:
            settled, topics = acting.settle()
            acting.reassign()
            self._run_asked_election(acting)
        except ControllerMoved:
            self._lose(epoch, "a newer controller refused its write")
            registry.controller.resign()  # /controller is not ours now, unless set by hand
            return False
        self._watch_topics(registry, topics)
        return settled

    def _run_asked_election(self, acting: Acting) -> None:
        """Run the preferred-leader election an operator asked for
        (/admin/preferred_election, `pylogctl topic elect-preferred`), if one is asked, then
        delete its node. A topic of it deleted since is passed over."""
        asked, topics = acting.reassignments.preferred_election_asked()
        if not asked:
            return
        known = set(acting.topics.topic_configs())
        if topics is not None and (gone := sorted(set(topics) - known)):
            log.warning("preferred-leader election asked: topic(s) %s do not exist", gone)
            topics = [t for t in topics if t in known]
        moved = acting.elect_preferred(topics)
        acting.reassignments.end_preferred_election()
        log.info(
            "preferred-leader election asked over %s: %d partition(s) moved",
            "every topic" if topics is None else f"topic(s) {topics}",
            moved,
        )

    def _acting(self, registry: Registry, epoch: int) -> Acting:
        """The acts of controller epoch `epoch`, on `registry`'s stores."""
        return Acting(
            registry.brokers,
            registry.topics,
            registry.reassignments,
            epoch,
            self._counters,
            self._stopping.is_set,
            self._known,
        )

    def _lose(self, epoch: int, why: str) -> None:
        if self._epoch == epoch:
            self._epoch = None
            log.warning(
                "broker %d is no longer the controller of epoch %d: %s", self._broker_id, epoch, why
            )

    def _resign(self) -> None:
        """On the way out: give /controller up, if held, so another broker is elected now."""
        registry, epoch = self._registry, self._epoch
        self._epoch = None
        if registry is None or epoch is None:
            return
        try:
            if registry.controller.resign():
                log.info("broker %d resigned as the controller of epoch %d", self._broker_id, epoch)
        except PylogError as error:
            log.info("could not resign as controller (its session ending does it): %s", error)

    def _watch_topics(self, registry: Registry, topics: list[str]) -> None:
        """Watch the node of each topic not watched yet: a change of its
        unclean_leader_election (a live setting) or of its replicas (partitions added, a
        reassignment's step) wakes the service."""
        for topic in topics:
            with self._watches_lock:
                if topic in self._topic_watches:
                    continue
                self._topic_watches[topic] = None

            def changed(config: TopicConfig | None, topic: str = topic) -> bool:
                with self._watches_lock:
                    if config is None or self._stopping.is_set():
                        self._topic_watches.pop(topic, None)
                        return False
                    unclean = unclean_allowed(config)
                    before = self._topic_watches.get(topic)
                    self._topic_watches[topic] = now = (unclean, config.replicas)
                if before is not None and before != now:
                    self._wake()
                return True

            try:
                registry.topics.watch_topic_config(topic, changed)
            except (PylogError, ValueError) as error:
                with self._watches_lock:
                    self._topic_watches.pop(topic, None)
                log.warning("cannot watch the configuration of topic %r: %s", topic, error)

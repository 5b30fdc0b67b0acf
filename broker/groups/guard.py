"""The retention guard in the broker (issue 51; docs/storage.md, "Retention"): for every
consumer group this broker coordinates, how long before retention deletes the next message the
group would read, partition by partition, as `pylogctl group describe` forecasts it
(broker.client.retention.forecast, from each partition's leader: DESCRIBE_PARTITION version 2).

A thread of the supervisor, every broker.retention_guard_interval_ms: it reads from the
registry the groups there are (a group with no member left, whose reader is down, is the one
that matters most, and it has no coordinator state in any broker), keeps those this broker
coordinates (broker.groups.choice: the same choice as the coordinator's), reads their
committed offsets, and asks each partition's leader once for its segments, settings and append
rate, as a client of the cluster would (broker.client.Cluster, reaching this broker's own front
and the others'; in security.mode curve with this broker's key pair, the cluster's). The
figures go to the metrics endpoint (pylog_group_retention_seconds, pylog_group_retention_bytes,
by group, topic and partition), and a group whose forecast falls under
broker.retention_warning_ms is named in the log with what to do, at most once every
WARN_EVERY_S for each partition of it (again sooner once it is deleted).

A forecast it cannot make (a leader down, an older broker) is left out of the figures; a round
that fails (ZooKeeper away) is logged, and the next one tries again. The guard reads the
registry and the brokers only: it changes nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from broker.client.cluster import Cluster
from broker.client.retention import RetentionForecast, forecast
from broker.errors import BrokerError, PylogError, Unavailable
from broker.groups.choice import coordinator_of
from broker.protocol import DESCRIBE_PARTITION_RETENTION_VERSION, DescribePartitionRequest
from broker.ratelog import RateLimitedLog
from broker.registry.brokers import Brokers
from broker.registry.coordination import GroupCoordination
from broker.security import ClientKeys

log = logging.getLogger("pylog.retention")

WARN_EVERY_S = 600.0
"""How often one partition of a group is warned of again while its forecast stays short."""
RETRIES = 0
"""A leader's DESCRIBE_PARTITION is not tried again, a leader down not waited for: the next
round asks again, of the leader then known (Cluster.learn_from)."""
TIMEOUT_S = 5.0
"""How long the guard waits for a broker's reply."""

Reader = tuple[str, str, int]
"""A group's reading of a partition: (group, topic, partition)."""


@dataclass(frozen=True, slots=True)
class Guarded:
    """A forecast for one reader: where the group's next message is (`position`) and when
    retention deletes it (`forecast`)."""

    position: int
    forecast: RetentionForecast


class RetentionGuard:
    """The guard of broker `me`, reaching the cluster through `endpoint` (this broker's own
    front) with `keys` (curve mode; None in plaintext), reading the registry's `brokers` and
    `groups` stores; a round every `interval_s` once `start`ed, a warning under `warning_s`
    (0: none)."""

    def __init__(
        self,
        me: int,
        brokers: Brokers,
        groups: GroupCoordination,
        endpoint: str,
        interval_s: float,
        warning_s: float,
        keys: ClientKeys | None = None,
    ) -> None:
        self.me = me
        self.brokers = brokers
        self.groups = groups
        self.endpoint = endpoint
        self.interval_s = interval_s
        self.warning_s = warning_s
        self.keys = keys
        self._forecasts: Mapping[Reader, Guarded] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="retention-guard", daemon=True)
        self._warnings = RateLimitedLog(log, WARN_EVERY_S)
        self._failures = RateLimitedLog(log, WARN_EVERY_S)

    def start(self) -> None:
        if self.interval_s > 0:
            self._thread.start()

    def stop(self) -> None:
        """End the rounds, without waiting: the one under way stops before its next partition
        (its call under way answered BROKER_SHUTTING_DOWN by this broker once it shuts down,
        or within TIMEOUT_S)."""
        self._stop.set()

    def join(self) -> None:
        """Wait for the thread after `stop`, at most TIMEOUT_S (it is a daemon)."""
        if self._thread.is_alive():
            self._thread.join(TIMEOUT_S)

    def forecasts(self) -> Mapping[Reader, Guarded]:
        """The last round's forecasts (read by the metrics thread: a mapping never changed
        once made)."""
        return self._forecasts

    def _run(self) -> None:
        with Cluster(self.endpoint, "retention-guard", TIMEOUT_S, keys=self.keys) as cluster:
            while not self._stop.wait(self.interval_s):
                try:
                    self._forecasts = self.round(cluster, time.time() * 1000)
                except (PylogError, ValueError) as error:  # ValueError: a node unreadable
                    self._failures.log(
                        logging.WARNING, "round", f"retention guard: no forecast now: {error}"
                    )

    def round(self, cluster: Cluster, now_ms: float) -> dict[Reader, Guarded]:
        """One round: the forecast of each partition of each group this broker coordinates
        (those the leaders could not be asked about left out), each short one warned of."""
        live = list(self.brokers.read())
        positions: dict[tuple[str, int], dict[str, int]] = {}
        for group in self.groups.names():
            if coordinator_of(group, live) != self.me:
                continue
            for topic, committed in self.groups.committed_offsets(group).items():
                for name, offset in committed.items():
                    number = int(name.partition("-")[2])
                    positions.setdefault((topic, number), {})[group] = offset
        found: dict[Reader, Guarded] = {}
        for (topic, number), readers in sorted(positions.items()):
            if self._stop.is_set():
                break
            request = DescribePartitionRequest(topic, number)
            version = DESCRIBE_PARTITION_RETENTION_VERSION
            endpoint = None
            try:
                connection = cluster.leader_connection(topic, number)
                endpoint = connection.endpoint
                state = connection.call(request, RETRIES, version=version)
            except (BrokerError, Unavailable) as error:
                log.debug("retention guard: %s-%d not described: %s", topic, number, error)
                cluster.learn_from(topic, number, error, endpoint)
                continue
            for group, offset in readers.items():
                ahead = forecast(state, offset, now_ms)
                if ahead is not None:
                    found[group, topic, number] = Guarded(offset, ahead)
                    self._warn(group, topic, number, found[group, topic, number])
        return found

    def _warn(self, group: str, topic: str, number: int, guarded: Guarded) -> None:
        seconds = guarded.forecast.seconds
        if not self.warning_s or seconds is None or seconds >= self.warning_s:
            return
        where = f"group {group}: {topic}-{number} at offset {guarded.position}"
        if guarded.forecast.rule == "deleted":
            what = "retention has deleted messages it had not read (it will skip them)"
        else:
            what = (
                f"retention deletes the next message it reads in {seconds:.0f} s "
                f"({guarded.forecast.rule}), under broker.retention_warning_ms"
            )
        self._warnings.log(
            logging.WARNING,
            f"{group} {topic}-{number} {guarded.forecast.rule}",
            f"{where}: {what}: read faster, or raise the topic's retention_ms / retention_bytes "
            "(pylogctl topic alter)",
        )

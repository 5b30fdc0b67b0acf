"""How far a mirror's target is behind its source, read from the two clusters themselves (what
`pylogctl mirror describe` prints): right whether the mirror runs or not, since the target's
log end is the mirror's position (docs/mirror.md, "Watching it").

Per partition of each mirrored topic: the source's log start and high watermark, the target's
high watermark, the lag in bytes (the source's high watermark minus the target's), in messages
(counted by reading the source from the target's high watermark, as `pylogctl group describe`
counts them: exact up to `count_bytes`, estimated past it) and in seconds (the age of the first
message not copied yet), and the mirror process that copies it (its owner node in the target's
registry).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from broker.client.admin import Admin, PartitionOffsets
from broker.client.lag import COUNT_BYTES, backlog, lag_figures
from broker.client.retention import ahead_of
from broker.errors import BrokerError, Unavailable, UnknownTopicOrPartition
from broker.mirror.config import MirrorConfig
from broker.registry import Registry, partition_name
from broker.registry.coordination import GroupCoordination
from broker.registry.topics import TopicNodes


@dataclass(frozen=True, slots=True)
class MirrorLag:
    """One partition of a mirrored topic (None where unknown: `note` says why)."""

    topic: str
    partition: int
    source_log_start: int | None
    source_high_watermark: int | None
    target_log_start: int | None
    target_high_watermark: int | None
    owner: str | None
    lag_bytes: int | None = None
    lag_messages: int | None = None
    lag_messages_estimated: bool = False
    lag_seconds: float | None = None
    retention_seconds: float | None = None
    """How long before retention on the source deletes the next message to copy (0: deleted
    already; None: nothing will as things stand, or not known: broker.client.retention)."""
    retention_bytes: int | None = None
    note: str | None = None


@contextlib.contextmanager
def mirror_clusters(
    config: MirrorConfig, timeout_s: float, retries: int
) -> Iterator[tuple[Admin, Admin, Registry]]:
    """What describe_mirror reads, open for the block: an Admin of the source and one of the
    target (each with its keys), and the target's registry, where the target says it is (with
    the target's ZooKeeper identity)."""
    source, target = config.source, config.target
    with (
        Admin(source.bootstrap, timeout_s=timeout_s, retries=retries, keys=source.keys) as s,
        Admin(target.bootstrap, timeout_s=timeout_s, retries=retries, keys=target.keys) as t,
    ):
        found = t.zookeeper()
        with Registry(
            found.connect, found.chroot, request_timeout_s=timeout_s, auth=target.zookeeper_auth
        ) as registry:
            yield s, t, registry


def describe_mirror(
    config: MirrorConfig,
    source: Admin,
    target: Admin,
    registry: Registry,
    topics: Sequence[str] = (),
    count_bytes: int = COUNT_BYTES,
) -> list[MirrorLag]:
    """The lag of every partition of `topics` (default: the source's topics that `config`
    mirrors), in topic and partition order; `registry` is the target's (its topics and
    groups are read)."""
    names = sorted(topics) or [t for t in source.list_topics() if config.mirror.mirrors(t)]
    return [
        lag
        for topic in names
        for lag in _topic_lag(
            config, source, target, registry.topics, registry.groups, topic, count_bytes
        )
    ]


def _topic_lag(
    config: MirrorConfig,
    source: Admin,
    target: Admin,
    topic_nodes: TopicNodes,
    groups: GroupCoordination,
    topic: str,
    count_bytes: int,
) -> list[MirrorLag]:
    copied: dict[int, PartitionOffsets] = {}
    owners: dict[str, str] = {}
    names: dict[int, str] = {}
    try:
        copied = {p.partition: p for p in target.describe(topic)}
        brokers = topic_nodes.topic_config(topic).brokers
        names = {p: partition_name(b, p) for p, b in enumerate(brokers)}
        owners = groups.partition_owners(config.mirror.group, topic)
    except UnknownTopicOrPartition:
        pass
    now_ms = time.time() * 1000
    lags = []
    for offsets in source.describe(topic):
        number = offsets.partition
        held = copied.get(number)
        lag = MirrorLag(
            topic,
            number,
            offsets.log_start_offset,
            offsets.high_watermark,
            held.log_start_offset if held else None,
            held.high_watermark if held else None,
            owners.get(names.get(number, "")),
        )
        lags.append(_counted(lag, source, count_bytes, now_ms))
    return lags


def _counted(lag: MirrorLag, source: Admin, count_bytes: int, now_ms: float) -> MirrorLag:
    start, end, copied = lag.source_log_start, lag.source_high_watermark, lag.target_high_watermark
    if start is None or end is None:
        return replace(lag, note="the source's partition is not served now")
    if copied is None:
        return replace(lag, note="not on the target (yet)")
    if copied > end:
        return replace(lag, note=f"the target holds more than the source ({copied} > {end})")
    if 0 < copied < start:
        return replace(lag, note=f"the source deleted [{copied}, {start}) before it was copied")
    position = max(copied, start)  # an empty target starts at the source's log start
    note = None
    if lag.target_log_start is not None and start < lag.target_log_start < copied:
        note = f"[{start}, {lag.target_log_start}) of the source is not on the target (deleted?)"
    try:
        connection = source.cluster.leader_connection(lag.topic, lag.partition)
        found = backlog(connection, lag.topic, lag.partition, position, end, count_bytes)
    except (BrokerError, Unavailable) as error:
        return replace(lag, lag_bytes=end - position, note=f"cannot count: {error}")
    ahead = ahead_of(connection, lag.topic, lag.partition, position, now_ms, 3)
    return replace(lag, **lag_figures(found, ahead, position, end, now_ms), note=note)

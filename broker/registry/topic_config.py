"""A topic's configuration as /config/topics/<topic> holds it (`TopicConfig`): its partitions,
their replicas and name brokers, its own settings and the log starts moved by delete-records;
read and written by broker.registry.topics, and read by the partition states it is created
with (broker.registry.states)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from broker.errors import InvalidTopic, UnknownTopicOrPartition
from broker.log.config import SettingValue
from broker.placement import assign_replicas
from broker.registry.nodes import decode, encode, int_field, int_list, is_int

MAX_PARTITIONS = 10_000
"""The most partitions a topic may have. Its configuration is one ZooKeeper node, under
jute.maxbuffer (1 MiB) as every request is: 220 KB at this many partitions of 3 replicas, about
430 KB with every partition's log start (docs/registry.md, "Writing a topic")."""

Settings = Mapping[str, SettingValue]
Replicas = tuple[tuple[int, ...], ...]


def _is_word(value: object) -> bool:
    """Whether `value` is a setting's word (compression's choices, lz4 among them): lowercase
    ASCII letters and digits, a letter first."""
    return (
        isinstance(value, str)
        and value.isascii()
        and value[:1].isalpha()
        and value.isalnum()
        and value == value.lower()
    )


def _check_partition(partitions: int, partition: int) -> None:
    if not is_int(partition) or not 0 <= partition < partitions:
        raise UnknownTopicOrPartition(
            f"partition {partition!r} does not exist: the topic has partitions 0 to "
            f"{partitions - 1}"
        )


@dataclass(frozen=True)
class TopicConfig:
    """What /config/topics/<topic> holds: the topic's partition count, the replicas of each
    partition (`replicas[p]`: the brokers that hold partition p, in the order fixed by its
    assignment, the first the preferred leader), `brokers[p]` (the partition's name broker:
    its first replica at creation, fixed for ever after, since it names the partition's group
    nodes, `<brokers[p]>-<p>`; a reassignment changes `replicas[p]` only), and the topic's own
    settings (setting name -> integer, a word for a setting of choices such as compression,
    or None to switch that limit off); a setting left out takes the broker's [log] default.

    `replicas` left out (or empty) is read as one replica per partition, `brokers[p]` alone:
    a topic of a single copy, and every node written before replication had.

    `log_starts`: partition -> the offset its log starts at, for the partitions whose records
    before it were deleted (`pylogctl topic delete-records`): every replica applies it.
    """

    partitions: int
    brokers: tuple[int, ...]
    settings: Mapping[str, SettingValue] = field(default_factory=dict)
    replicas: Replicas = ()
    log_starts: Mapping[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.replicas:
            object.__setattr__(self, "replicas", tuple((b,) for b in self.brokers))

    @classmethod
    def spread(
        cls,
        partitions: int,
        brokers: Iterable[int],
        settings: Mapping[str, SettingValue] | None = None,
        *,
        replication_factor: int = 1,
        racks: Mapping[int, str | None] | None = None,
    ) -> TopicConfig:
        """`partitions` partitions with `replication_factor` replicas each over `brokers`,
        placed by broker.placement.assign_replicas with each broker's rack from `racks`
        (broker id -> rack; a broker left out, or None, has no rack). With replication factor
        1 and no racks, partition p goes to the (p mod n)-th broker by id, as before
        replication. InvalidTopic when there is no broker, or the replication factor is not
        between 1 and the number of brokers."""
        ids = set(brokers)
        if not ids:
            raise InvalidTopic("no live broker to hold the topic's partitions")
        rack_of = {b: (racks or {}).get(b) for b in ids}
        try:
            replicas = assign_replicas(max(partitions, 0), rack_of, replication_factor)
        except ValueError as error:
            raise InvalidTopic(f"cannot place the topic's replicas: {error}") from None
        return cls(partitions, tuple(r[0] for r in replicas), dict(settings or {}), replicas)

    def partitions_of(self, broker_id: int) -> list[int]:
        """The partitions that `broker_id` holds, in order: every partition it is a replica of,
        whether it leads it or follows."""
        return [p for p, replicas in enumerate(self.replicas) if broker_id in replicas]

    def replicas_of(self, partition: int) -> tuple[int, ...]:
        """The replicas of `partition`, preferred leader first; UnknownTopicOrPartition when
        the topic has no such partition."""
        _check_partition(self.partitions, partition)
        return self.replicas[partition]

    def preferred_leader(self, partition: int) -> int:
        """The preferred leader of `partition`: its first replica (`brokers[partition]` until
        a reassignment changes it); UnknownTopicOrPartition when the topic has no such partition."""
        return self.replicas_of(partition)[0]

    def validate(self, topic: str) -> None:
        """Raise InvalidTopic when partitions is not from 1 to MAX_PARTITIONS, brokers does
        not name one broker per partition, replicas does not name distinct brokers for each
        partition, or a setting is not int | None."""
        if not is_int(self.partitions) or not 1 <= self.partitions <= MAX_PARTITIONS:
            raise InvalidTopic(
                f"topic {topic!r}: partitions must be from 1 to {MAX_PARTITIONS}, "
                f"not {self.partitions!r}"
            )
        if len(self.brokers) != self.partitions or not all(
            is_int(b) and b >= 0 for b in self.brokers
        ):
            raise InvalidTopic(
                f"topic {topic!r}: brokers must name one broker id per partition, "
                f"not {self.brokers!r}"
            )
        try:
            _check_replicas(self.brokers, self.replicas)
        except ValueError as error:
            raise InvalidTopic(f"topic {topic!r}: {error}") from None
        for name, value in self.settings.items():
            if not isinstance(name, str) or not (value is None or is_int(value) or _is_word(value)):
                raise InvalidTopic(
                    f"topic {topic!r}: setting {name!r} must be an integer, a word or None, "
                    f"not {value!r}"
                )
        try:
            check_log_starts(self.partitions, self.log_starts)
        except ValueError as error:
            raise InvalidTopic(f"topic {topic!r}: {error}") from None

    def to_json(self) -> bytes:
        obj: dict[str, object] = {
            "partitions": self.partitions,
            "brokers": list(self.brokers),
            "replicas": [list(r) for r in self.replicas],
            "settings": dict(self.settings),
        }
        if self.log_starts:
            obj["log_starts"] = {str(p): start for p, start in sorted(self.log_starts.items())}
        return encode(obj)

    @classmethod
    def from_json(cls, data: bytes) -> TopicConfig:
        """Parse node data; ValueError when it is not a topic configuration. A node without
        `replicas` (written before replication) reads as one replica per partition,
        `brokers[p]`."""
        obj = decode(data)
        settings = obj.get("settings", {})
        if not isinstance(settings, dict):
            raise ValueError("'settings' is not an object")
        if not all(v is None or is_int(v) or _is_word(v) for v in settings.values()):
            raise ValueError("a setting is not an integer, a word or null")
        partitions = int_field(obj, "partitions")
        brokers = int_list(obj, "brokers")
        if len(brokers) != partitions:
            raise ValueError(f"'brokers' names {len(brokers)} brokers for {partitions} partitions")
        replicas: Replicas = tuple((b,) for b in brokers)
        if "replicas" in obj:
            value = obj["replicas"]
            if not isinstance(value, list) or not all(
                isinstance(r, list) and all(is_int(b) and b >= 0 for b in r) for r in value
            ):
                raise ValueError("'replicas' is not a list of lists of integers >= 0")
            replicas = tuple(tuple(r) for r in value)
            _check_replicas(brokers, replicas)
        starts = obj.get("log_starts", {})
        if not isinstance(starts, dict) or not all(
            isinstance(p, str) and p.isdigit() for p in starts
        ):
            raise ValueError("'log_starts' is not an object of partition numbers")
        log_starts = {int(p): start for p, start in starts.items()}
        check_log_starts(partitions, log_starts)
        return cls(partitions, brokers, settings, replicas, log_starts)


def check_log_starts(partitions: int, starts: Mapping[int, int]) -> None:
    """ValueError unless each of `starts` is a partition of the topic and an offset >= 0."""
    for partition, start in starts.items():
        if not is_int(partition) or not 0 <= partition < partitions:
            raise ValueError(f"a log start names partition {partition!r}, not one of the topic's")
        if not is_int(start) or start < 0:
            raise ValueError(f"the log start of partition {partition} is {start!r}, not >= 0")


def _check_replicas(brokers: Sequence[int], replicas: Replicas) -> None:
    """ValueError unless `replicas` names, for each partition of `brokers`, distinct broker
    ids >= 0. (The first is brokers[p] at creation; a reassignment changes replicas only.)"""
    if len(replicas) != len(brokers):
        raise ValueError(
            f"replicas must name the replicas of each of the {len(brokers)} partitions, "
            f"not {len(replicas)}"
        )
    for p, replica in enumerate(replicas):
        if (
            not isinstance(replica, tuple)
            or not replica
            or not all(is_int(b) and b >= 0 for b in replica)
            or len(set(replica)) != len(replica)
        ):
            raise ValueError(
                f"the replicas of partition {p} must be distinct broker ids, not {replica!r}"
            )

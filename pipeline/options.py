"""The source's options, read and checked once on the driver (docs/pipeline.md lists them).

Names follow Spark's Kafka source where they mean the same; Spark hands them over with lower
case keys. Offsets are byte positions, so `maxBytesPerTrigger` and `maxBytesPerPartition`
count bytes of stored messages (4 + length each), not messages.

An offsets option is "earliest", "latest" or JSON, {"topic": {"0": 1234, "1": -2}}, with -2
for earliest and -1 for latest; a partition not named takes the default (earliest for
startingOffsets, latest for endingOffsets). A parsed option is a plain picklable value: the
readers carry it to Spark's tasks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from pipeline.cluster import Cluster, TopicPartition, bootstrap_endpoint
from pipeline.errors import OptionError

EARLIEST: Final = -2
LATEST: Final = -1
DEFAULT_MAX_BYTES_PER_PARTITION: Final = 64 << 20

CLUSTER_OPTIONS: Final = frozenset({"broker", "zookeeper.connect"})
SOURCE_OPTIONS: Final = CLUSTER_OPTIONS | {
    "subscribe",
    "assign",
    "startingoffsets",
    "endingoffsets",
    "startingtimestamp",
    "failondataloss",
    "maxbytespertrigger",
    "maxbytesperpartition",
}


def check_known(options: Mapping[str, str], known: frozenset[str], what: str) -> None:
    unknown = sorted(set(options) - known)
    if unknown:
        raise OptionError(
            f"unknown {what} option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )


def positive_int(options: Mapping[str, str], name: str) -> int | None:
    text = options.get(name.lower())
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise OptionError(f"{name} {text!r} is not an integer") from None
    if value < 1:
        raise OptionError(f"{name} is {value}: it must be at least 1")
    return value


def boolean(options: Mapping[str, str], name: str, default: bool) -> bool:
    text = options.get(name.lower())
    if text is None:
        return default
    if text.strip().lower() not in ("true", "false"):
        raise OptionError(f"{name} {text!r}: use true or false")
    return text.strip().lower() == "true"


@dataclass(frozen=True, slots=True)
class Subscription:
    """What to read: every partition of some topics (`subscribe`) or some partitions
    (`assign`, JSON {"topic": [0, 1]})."""

    topics: tuple[str, ...]
    assigned: tuple[TopicPartition, ...] = ()

    def includes(self, tp: TopicPartition) -> bool:
        return tp in self.assigned if self.assigned else tp.topic in self.topics

    def partitions(self, cluster: Cluster) -> dict[TopicPartition, str]:
        """Each partition to read now -> the endpoint of the broker holding it."""
        found: dict[TopicPartition, str] = {}
        for topic in self.topics:
            for number, endpoint in cluster.holders(topic).items():
                found[TopicPartition(topic, number)] = endpoint
        for tp in self.assigned:
            if tp not in found:
                raise OptionError(f"assign: topic {tp.topic!r} has no partition {tp.partition}")
        if self.assigned:
            return {tp: found[tp] for tp in self.assigned}
        return dict(sorted(found.items()))


def _subscription(options: Mapping[str, str]) -> Subscription:
    subscribe, assign = options.get("subscribe"), options.get("assign")
    if (subscribe is None) == (assign is None):
        raise OptionError("give exactly one of the options subscribe and assign")
    if subscribe is not None:
        topics = tuple(dict.fromkeys(t.strip() for t in subscribe.split(",") if t.strip()))
        if not topics:
            raise OptionError(f"subscribe {subscribe!r} names no topic")
        return Subscription(topics)
    assert assign is not None
    parsed = _json(assign, "assign")
    assigned: list[TopicPartition] = []
    for topic, numbers in parsed.items():
        if not isinstance(numbers, list) or not numbers:
            raise OptionError(f"assign: topic {topic!r} needs a list of partitions, like [0, 1]")
        for number in numbers:
            if not isinstance(number, int) or isinstance(number, bool) or number < 0:
                raise OptionError(f"assign: topic {topic!r}: {number!r} is not a partition")
            assigned.append(TopicPartition(topic, number))
    if not assigned:
        raise OptionError("assign names no partition")
    return Subscription(tuple(parsed), tuple(dict.fromkeys(assigned)))


def _json(text: str, name: str) -> dict[str, object]:
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as error:
        raise OptionError(f"{name} is not valid JSON ({error}): {text!r}") from None
    if not isinstance(parsed, dict):
        raise OptionError(f"{name} must be a JSON object, not {text!r}")
    return parsed


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """Where to start or end in each partition: an offset, EARLIEST or LATEST."""

    default: int
    given: Mapping[TopicPartition, int] = field(default_factory=dict)

    def get(self, tp: TopicPartition) -> int:
        return self.given.get(tp, self.default)


def _offset_spec(
    options: Mapping[str, str], name: str, default: int, subscription: Subscription
) -> OffsetSpec:
    text = options.get(name.lower())
    if text is None:
        return OffsetSpec(default)
    if text.strip().lower() == "earliest":
        return OffsetSpec(EARLIEST)
    if text.strip().lower() == "latest":
        return OffsetSpec(LATEST)
    parsed = _json(text, name)
    given: dict[TopicPartition, int] = {}
    for topic, partitions in parsed.items():
        if not isinstance(partitions, dict):
            raise OptionError(f'{name}: topic {topic!r} needs an object like {{"0": 1234}}')
        for key, offset in partitions.items():
            if not key.isdigit():
                raise OptionError(f"{name}: topic {topic!r}: {key!r} is not a partition number")
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < EARLIEST:
                raise OptionError(
                    f"{name}: {topic}-{key}: {offset!r} is not an offset (>= 0, -2 earliest, "
                    "-1 latest)"
                )
            tp = TopicPartition(topic, int(key))
            if not subscription.includes(tp):
                raise OptionError(f"{name} names {tp}, which the query does not read")
            given[tp] = offset
    return OffsetSpec(default, given)


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """The source's options, checked. `bootstrap` is a broker endpoint (see cluster.py)."""

    bootstrap: str
    subscription: Subscription
    starting: OffsetSpec
    ending: OffsetSpec
    starting_timestamp_ms: int | None
    fail_on_data_loss: bool
    max_bytes_per_trigger: int | None
    max_bytes_per_partition: int


def parse_source_options(options: Mapping[str, str], streaming: bool) -> SourceOptions:
    """Check the options of a batch (`streaming` false) or streaming read, then find the
    cluster (asking ZooKeeper when `zookeeper.connect` names it); OptionError names the first
    problem."""
    options = {key.lower(): value for key, value in options.items()}
    check_known(options, SOURCE_OPTIONS, "source")
    subscription = _subscription(options)
    starting = _offset_spec(
        options, "startingOffsets", LATEST if streaming else EARLIEST, subscription
    )
    ending = _offset_spec(options, "endingOffsets", LATEST, subscription)
    timestamp = options.get("startingtimestamp")
    starting_timestamp_ms = None
    if timestamp is not None:
        if "startingoffsets" in options:
            raise OptionError("give startingOffsets or startingTimestamp, not both")
        try:
            starting_timestamp_ms = int(timestamp)
        except ValueError:
            raise OptionError(f"startingTimestamp {timestamp!r}: ms since the epoch") from None
        if starting_timestamp_ms < 0:
            raise OptionError(f"startingTimestamp {timestamp!r} is negative")
    if streaming and "endingoffsets" in options:
        raise OptionError("endingOffsets is for batch reads; a stream has no end")
    if not streaming:
        if LATEST in (starting.default, *starting.given.values()):
            raise OptionError("startingOffsets latest (-1) reads nothing in a batch query")
        if EARLIEST in (ending.default, *ending.given.values()):
            raise OptionError("endingOffsets earliest (-2) reads nothing in a batch query")
        if "maxbytespertrigger" in options:
            raise OptionError("maxBytesPerTrigger is for streaming reads")
    fail_on_data_loss = boolean(options, "failOnDataLoss", True)
    max_bytes_per_trigger = positive_int(options, "maxBytesPerTrigger")
    max_bytes_per_partition = positive_int(options, "maxBytesPerPartition")
    return SourceOptions(
        bootstrap=bootstrap_endpoint(options),
        subscription=subscription,
        starting=starting,
        ending=ending,
        starting_timestamp_ms=starting_timestamp_ms,
        fail_on_data_loss=fail_on_data_loss,
        max_bytes_per_trigger=max_bytes_per_trigger,
        max_bytes_per_partition=max_bytes_per_partition or DEFAULT_MAX_BYTES_PER_PARTITION,
    )

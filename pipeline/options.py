"""The source's options, read and checked once on the driver (docs/pipeline.md lists them).

Names follow Spark's Kafka source where they mean the same; Spark hands them over with lower
case keys. Offsets are byte positions, so `maxBytesPerTrigger` and `maxBytesPerPartition`
count bytes of stored messages (4 + length each), not messages.

An offsets option is "earliest", "latest" or JSON, {"topic": {"0": 1234, "1": -2}}, with -2
for earliest and -1 for latest; a partition not named takes the default (earliest for
startingOffsets, latest for endingOffsets). A time option (startingTimestamp, endingTimestamp:
ms since the epoch for every partition; startingOffsetsByTimestamp, endingOffsetsByTimestamp:
JSON {"topic": {"0": ms}}) replaces its offsets option: the partition's first message whose
timestamp is at or after the time, found by OFFSETS with that time. A parsed option is a plain
picklable value: the readers carry it to Spark's tasks.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from broker.protocol import EARLIEST, LATEST  # Spark's offsets JSON takes them as OFFSETS does
from broker.security import ClientKeys
from pipeline.cluster import (
    FETCH_TIMEOUT_S,
    OFFSET_RETRIES,
    OFFSET_RETRY_INTERVAL_S,
    DriverView,
    SourcePartition,
    bootstrap_endpoint,
    client_keys,
)
from pipeline.errors import OptionError

log = logging.getLogger("pylog.pipeline")

DEFAULT_MAX_BYTES_PER_PARTITION: Final = 64 << 20

CLUSTER_OPTIONS: Final = frozenset(
    {"broker", "zookeeper.connect", "kafka.bootstrap.servers", "keyfile", "brokerkey"}
)
CLUSTER_KAFKA_OPTIONS: Final = frozenset({"kafka.bootstrap.servers", "kafka.security.protocol"})
"""The kafka.* options that mean something to both the source and the sink."""
SOURCE_KAFKA_OPTIONS: Final = CLUSTER_KAFKA_OPTIONS | {"kafka.group.id"}
SOURCE_OPTIONS: Final = CLUSTER_OPTIONS | {
    "subscribe",
    "subscribepattern",
    "assign",
    "startingoffsets",
    "endingoffsets",
    "startingtimestamp",
    "endingtimestamp",
    "startingoffsetsbytimestamp",
    "endingoffsetsbytimestamp",
    "startingoffsetsbytimestampstrategy",
    "failondataloss",
    "maxbytespertrigger",
    "maxoffsetspertrigger",
    "minoffsetspertrigger",
    "maxtriggerdelay",
    "maxbytesperpartition",
    "minpartitions",
    "includeheaders",
    "groupidprefix",
    "kafkaconsumer.polltimeoutms",
    "fetchoffset.numretries",
    "fetchoffset.retryintervalms",
}
STREAM_ONLY: Final = (
    "maxBytesPerTrigger",
    "maxOffsetsPerTrigger",
    "minOffsetsPerTrigger",
    "maxTriggerDelay",
    "kafka.group.id",
    "groupIdPrefix",
)
"""The source options a batch read ignores (logged), as Spark's Kafka source does."""
DEFAULT_MAX_TRIGGER_DELAY_S: Final = 15 * 60.0
"""maxTriggerDelay's default, Spark's: 15 minutes."""
_DURATION_UNITS: Final = {
    "us": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "min": 60.0,
    "h": 3600.0,
    "d": 86400.0,
}


SECURITY_PROTOCOLS: Final = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


def check_known(
    options: Mapping[str, str], known: frozenset[str], what: str, kafka: frozenset[str]
) -> None:
    """OptionError for an option neither `known` nor a `kafka.*` one. The `kafka.*` options
    are accepted, as Spark's Kafka connector takes them: those in `kafka` mean something to
    pylog and are read where they do, the rest are logged (once, on the driver) as ignored;
    kafka.security.protocol is checked against the Curve options."""
    kafka_like = {k for k in options if k.startswith("kafka.")}
    ignored = sorted(kafka_like - kafka)
    if ignored:
        log.warning("%s options with no meaning to pylog, ignored: %s", what, ", ".join(ignored))
    _check_security_protocol(options)
    unknown = sorted(set(options) - known - kafka_like)
    if unknown:
        raise OptionError(
            f"unknown {what} option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )


def _check_security_protocol(options: Mapping[str, str]) -> None:
    """kafka.security.protocol: PLAINTEXT without keys; SSL or SASL_* with the Curve options
    (keyFile and brokerKey), pylog's encryption and authentication."""
    text = options.get("kafka.security.protocol")
    if text is None:
        return
    protocol = text.strip().upper()
    if protocol not in SECURITY_PROTOCOLS:
        raise OptionError(
            f"kafka.security.protocol {text!r}: use one of {', '.join(SECURITY_PROTOCOLS)}"
        )
    curve = bool(options.get("keyfile", "").strip())
    if protocol == "PLAINTEXT" and curve:
        raise OptionError(
            "kafka.security.protocol PLAINTEXT with keyFile: a client with keys speaks CurveZMQ; "
            "drop one or the other"
        )
    if protocol != "PLAINTEXT" and not curve:
        raise OptionError(
            f"kafka.security.protocol {protocol}: pylog's encryption and authentication are "
            "CurveZMQ, not TLS or SASL: give keyFile and brokerKey (docs/pipeline.md, Curve)"
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


def duration_s(options: Mapping[str, str], name: str, default: float) -> float:
    """The option `name` as a duration in seconds, written as Spark writes them: a number
    and a unit (us, ms, s, m or min, h, d; none: milliseconds), "15m", "30s", "500". OptionError
    for anything else."""
    text = options.get(name.lower())
    if text is None:
        return default
    found = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", text.lower())
    if found is None or found.group(2) not in (*_DURATION_UNITS, ""):
        raise OptionError(
            f"{name} {text!r}: a duration such as 15m, 30s or 500ms (units "
            f"{', '.join(_DURATION_UNITS)}; none is ms)"
        )
    return int(found.group(1)) * _DURATION_UNITS[found.group(2) or "ms"]


def read_only_group(options: Mapping[str, str]) -> str | None:
    """The group a stream commits its progress to, for lag reporting (`pylogctl group
    describe`): kafka.group.id, or groupIdPrefix followed by a random suffix (one per query
    start, as Spark's Kafka source names its groups), or None."""
    group = options.get("kafka.group.id", "").strip()
    if group:
        return group
    prefix = options.get("groupidprefix", "").strip()
    if prefix:
        group = f"{prefix}-{uuid.uuid4().hex[:12]}"
        log.info("groupIdPrefix %s: the stream's read-only group is %s", prefix, group)
        return group
    return None


def boolean(options: Mapping[str, str], name: str, default: bool) -> bool:
    text = options.get(name.lower())
    if text is None:
        return default
    if text.strip().lower() not in ("true", "false"):
        raise OptionError(f"{name} {text!r}: use true or false")
    return text.strip().lower() == "true"


@dataclass(frozen=True, slots=True)
class Subscription:
    """What to read: every partition of some topics (`subscribe`), of every topic whose
    whole name matches a regular expression (`subscribePattern`, looked up again at each
    planning step, so that topics created later are read), or some partitions (`assign`, JSON
    {"topic": [0, 1]})."""

    topics: tuple[str, ...]
    assigned: tuple[SourcePartition, ...] = ()
    pattern: re.Pattern[str] | None = None

    def includes(self, tp: SourcePartition) -> bool:
        if self.pattern is not None:
            return self.pattern.fullmatch(tp.topic) is not None
        return tp in self.assigned if self.assigned else tp.topic in self.topics

    def partitions(self, cluster: DriverView) -> dict[SourcePartition, str]:
        """Each partition to read now -> the endpoint of the broker holding it."""
        if self.pattern is not None:
            return dict(sorted(cluster.matching(self.pattern).items()))
        found: dict[SourcePartition, str] = {}
        for topic in self.topics:
            for number, endpoint in cluster.holders(topic).items():
                found[SourcePartition(topic, number)] = endpoint
        for tp in self.assigned:
            if tp not in found:
                raise OptionError(f"assign: topic {tp.topic!r} has no partition {tp.partition}")
        if self.assigned:
            return {tp: found[tp] for tp in self.assigned}
        return dict(sorted(found.items()))


def _subscription(options: Mapping[str, str]) -> Subscription:
    subscribe, assign = options.get("subscribe"), options.get("assign")
    pattern = options.get("subscribepattern")
    if [subscribe, pattern, assign].count(None) != 2:
        raise OptionError("give exactly one of the options subscribe, subscribePattern and assign")
    if pattern is not None:
        try:
            return Subscription((), pattern=re.compile(pattern))
        except re.error as error:
            raise OptionError(f"subscribePattern {pattern!r}: {error}") from None
    if subscribe is not None:
        topics = tuple(dict.fromkeys(t.strip() for t in subscribe.split(",") if t.strip()))
        if not topics:
            raise OptionError(f"subscribe {subscribe!r} names no topic")
        return Subscription(topics)
    assert assign is not None
    parsed = _json(assign, "assign")
    assigned: list[SourcePartition] = []
    for topic, numbers in parsed.items():
        if not isinstance(numbers, list) or not numbers:
            raise OptionError(f"assign: topic {topic!r} needs a list of partitions, like [0, 1]")
        for number in numbers:
            if not isinstance(number, int) or isinstance(number, bool) or number < 0:
                raise OptionError(f"assign: topic {topic!r}: {number!r} is not a partition")
            assigned.append(SourcePartition(topic, number))
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
    given: Mapping[SourcePartition, int] = field(default_factory=dict)

    def get(self, tp: SourcePartition) -> int:
        return self.given.get(tp, self.default)


@dataclass(frozen=True, slots=True)
class TimeSpec:
    """Where to start or end by time, in ms since the epoch: for every partition (`default`,
    from startingTimestamp / endingTimestamp) or for some (`given`, from the ByTimestamp JSON);
    None where the offsets option decides."""

    default: int | None = None
    given: Mapping[SourcePartition, int] = field(default_factory=dict)

    def get(self, tp: SourcePartition) -> int | None:
        return self.given.get(tp, self.default)


def _per_partition(
    text: str, name: str, subscription: Subscription, least: int, what: str
) -> dict[SourcePartition, int]:
    """JSON {"topic": {"0": value}} with integer values of at least `least`."""
    given: dict[SourcePartition, int] = {}
    for topic, partitions in _json(text, name).items():
        if not isinstance(partitions, dict):
            raise OptionError(f'{name}: topic {topic!r} needs an object like {{"0": 1234}}')
        for key, value in partitions.items():
            if not key.isdigit():
                raise OptionError(f"{name}: topic {topic!r}: {key!r} is not a partition number")
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise OptionError(f"{name}: {topic}-{key}: {value!r} is not {what}")
            tp = SourcePartition(topic, int(key))
            if not subscription.includes(tp):
                raise OptionError(f"{name} names {tp}, which the query does not read")
            given[tp] = value
    return given


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
    what = "an offset (>= 0, -2 earliest, -1 latest)"
    return OffsetSpec(default, _per_partition(text, name, subscription, EARLIEST, what))


def _time_spec(options: Mapping[str, str], end: str, subscription: Subscription) -> TimeSpec:
    """The time option of one end ("starting" or "ending"), checking that at most one of its
    offsets option and its two time options is given."""
    names = (f"{end}Offsets", f"{end}Timestamp", f"{end}OffsetsByTimestamp")
    given = [name for name in names if name.lower() in options]
    if len(given) > 1:
        raise OptionError(f"give at most one of {', '.join(names)}, not {' and '.join(given)}")
    text = options.get(names[1].lower())
    if text is not None:
        try:
            moment = int(text)
        except ValueError:
            raise OptionError(f"{names[1]} {text!r}: ms since the epoch") from None
        if moment < 0:
            raise OptionError(f"{names[1]} {text!r} is negative")
        return TimeSpec(moment)
    text = options.get(names[2].lower())
    if text is not None:
        what = "a time (ms since the epoch, >= 0)"
        return TimeSpec(given=_per_partition(text, names[2], subscription, 0, what))
    return TimeSpec()


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """The source's options, checked. `bootstrap` is one or more broker endpoints, comma
    separated (see cluster.py). A time, where one is given, decides over the offsets option
    (`starting_time` over `starting`, `ending_time` over `ending`); `time_no_match_error`
    is startingOffsetsByTimestampStrategy error: a starting time after every message of a
    partition fails the query instead of starting at its latest offset. `keys`: what the
    driver and the tasks present to brokers serving Curve (keyFile and brokerKey)."""

    bootstrap: str
    keys: ClientKeys | None
    subscription: Subscription
    starting: OffsetSpec
    ending: OffsetSpec
    starting_time: TimeSpec
    ending_time: TimeSpec
    time_no_match_error: bool
    fail_on_data_loss: bool
    max_bytes_per_trigger: int | None
    max_offsets_per_trigger: int | None
    min_offsets_per_trigger: int | None
    """A micro-batch waits until that many messages are there, or maxTriggerDelay passed."""
    max_trigger_delay_s: float
    group: str | None
    """The read-only group the stream commits its progress to (kafka.group.id,
    groupIdPrefix), or None."""
    max_bytes_per_partition: int
    min_partitions: int | None
    headers: bool = False
    """includeHeaders: the rows have a headers column."""
    poll_timeout_s: float = FETCH_TIMEOUT_S
    """kafkaConsumer.pollTimeoutMs: how long a task waits for a FETCH reply."""
    offset_retries: int = OFFSET_RETRIES
    """fetchOffset.numRetries: how many more times the driver asks where partitions are while
    one has no leader serving it."""
    offset_retry_interval_s: float = OFFSET_RETRY_INTERVAL_S
    """fetchOffset.retryIntervalMs."""

    def cluster(self) -> DriverView:
        """The driver's connections to the cluster, for one planning step."""
        return DriverView(
            self.bootstrap,
            keys=self.keys,
            unavailable_retries=self.offset_retries,
            retry_interval_s=self.offset_retry_interval_s,
        )


def parse_source_options(options: Mapping[str, str], streaming: bool) -> SourceOptions:
    """Check the options of a batch (`streaming` false) or streaming read, then find the
    cluster (asking ZooKeeper when `zookeeper.connect` names it); OptionError names the first
    problem."""
    options = {key.lower(): value for key, value in options.items()}
    check_known(options, SOURCE_OPTIONS, "source", SOURCE_KAFKA_OPTIONS)
    subscription = _subscription(options)
    starting = _offset_spec(
        options, "startingOffsets", LATEST if streaming else EARLIEST, subscription
    )
    ending = _offset_spec(options, "endingOffsets", LATEST, subscription)
    starting_time = _time_spec(options, "starting", subscription)
    ending_time = _time_spec(options, "ending", subscription)
    strategy = options.get("startingoffsetsbytimestampstrategy", "latest").strip().lower()
    if strategy not in ("latest", "error"):
        raise OptionError(f"startingOffsetsByTimestampStrategy {strategy!r}: use latest or error")
    if streaming:
        for name in ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"):
            if name.lower() in options:
                raise OptionError(f"{name} is for batch reads; a stream has no end")
    else:
        if LATEST in (starting.default, *starting.given.values()):
            raise OptionError("startingOffsets latest (-1) reads nothing in a batch query")
        if EARLIEST in (ending.default, *ending.given.values()):
            raise OptionError("endingOffsets earliest (-2) reads nothing in a batch query")
    headers = boolean(options, "includeHeaders", False)
    fail_on_data_loss = boolean(options, "failOnDataLoss", True)
    max_bytes_per_trigger = positive_int(options, "maxBytesPerTrigger")
    max_offsets_per_trigger = positive_int(options, "maxOffsetsPerTrigger")
    min_offsets_per_trigger = positive_int(options, "minOffsetsPerTrigger")
    max_trigger_delay_s = duration_s(options, "maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY_S)
    if (
        min_offsets_per_trigger is not None
        and max_offsets_per_trigger is not None
        and min_offsets_per_trigger > max_offsets_per_trigger
    ):
        raise OptionError(
            f"minOffsetsPerTrigger {min_offsets_per_trigger} is over maxOffsetsPerTrigger "
            f"{max_offsets_per_trigger}"
        )
    group = read_only_group(options)
    if not streaming:
        for name in STREAM_ONLY:
            if name.lower() in options:  # Spark's Kafka source ignores them there too
                log.warning("%s is for streaming reads: ignored in a batch read", name)
        max_bytes_per_trigger = max_offsets_per_trigger = min_offsets_per_trigger = None
        group = None
    max_bytes_per_partition = positive_int(options, "maxBytesPerPartition")
    min_partitions = positive_int(options, "minPartitions")
    poll_timeout_s = duration_s(options, "kafkaConsumer.pollTimeoutMs", FETCH_TIMEOUT_S)
    if not poll_timeout_s > 0:
        raise OptionError("kafkaConsumer.pollTimeoutMs must be more than 0")
    retries = options.get("fetchoffset.numretries", str(OFFSET_RETRIES)).strip()
    if not retries.isdigit():
        raise OptionError(f"fetchOffset.numRetries {retries!r}: a whole number, 0 or more")
    interval_s = duration_s(options, "fetchOffset.retryIntervalMs", OFFSET_RETRY_INTERVAL_S)
    return SourceOptions(
        bootstrap=bootstrap_endpoint(options),
        keys=client_keys(options),
        subscription=subscription,
        starting=starting,
        ending=ending,
        starting_time=starting_time,
        ending_time=ending_time,
        time_no_match_error=strategy == "error",
        fail_on_data_loss=fail_on_data_loss,
        max_bytes_per_trigger=max_bytes_per_trigger,
        max_offsets_per_trigger=max_offsets_per_trigger,
        min_offsets_per_trigger=min_offsets_per_trigger,
        max_trigger_delay_s=max_trigger_delay_s,
        group=group,
        max_bytes_per_partition=max_bytes_per_partition or DEFAULT_MAX_BYTES_PER_PARTITION,
        min_partitions=min_partitions,
        headers=headers,
        poll_timeout_s=poll_timeout_s,
        offset_retries=int(retries),
        offset_retry_interval_s=interval_s,
    )

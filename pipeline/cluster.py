"""Where a pylog cluster is, which broker holds each partition, and exact offsets.

The source and the sink find the cluster from one of three options: `broker`, the front socket
of any broker ("tcp://HOST:PORT" or "HOST:PORT"), `kafka.bootstrap.servers`, several of them
("HOST:PORT,HOST:PORT", asked in turn, as Spark's Kafka source takes them), or
`zookeeper.connect`, the ensemble the brokers register in ("HOST:PORT[,HOST:PORT][/CHROOT]",
chroot /pylog when none is given), from which the driver picks a live broker. Either way the
driver resolves it once to bootstrap endpoints and hands only endpoints to Spark tasks:
executors never talk to ZooKeeper.

A cluster whose brokers serve CurveZMQ is reached with `keyFile` (the client's secret key
file) and `brokerKey` (the brokers' public key, or its key file): the driver reads the files
once (`client_keys`) and the keys travel to Spark's tasks inside the options, so that no
executor needs the files (docs/pipeline.md, "Curve").

Which broker holds a partition comes from METADATA (broker.client.cluster, in
`DriverView.holders`); offsets come from OFFSETS sent to the broker that holds the partition. A
`DriverView` keeps one connection per broker for the calls of one planning step and is not shared
between threads.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from broker.client import lag
from broker.client.cluster import Cluster, split_endpoints
from broker.client.connection import Connection
from broker.errors import BrokerError
from broker.protocol import ErrorCode, OffsetsRequest, PartitionInfo
from broker.registry import DEFAULT_CHROOT, Registry
from broker.security import ClientKeys, KeyFileError
from pipeline.errors import NotMessageBoundary, OptionError, PipelineError

RETRIES: Final = 5
CLIENT_ID: Final = "pylog-spark"
FETCH_TIMEOUT_S: Final = 10.0
"""kafkaConsumer.pollTimeoutMs's default: a task's wait for a FETCH reply (the client's)."""
OFFSET_RETRIES: Final = 3
OFFSET_RETRY_INTERVAL_S: Final = 1.0
"""fetchOffset.numRetries and fetchOffset.retryIntervalMs's defaults, as Spark's Kafka source's:
the driver asks again where partitions are while one has no leader serving it."""


@dataclass(frozen=True, slots=True, order=True)
class SourcePartition:
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


def bootstrap_endpoint(options: Mapping[str, str]) -> str:
    """The endpoint of a broker of the cluster the options name (`broker` or
    `zookeeper.connect`), or several, comma-separated (`kafka.bootstrap.servers`: METADATA asks
    them in turn); exactly one of the three options."""
    broker = options.get("broker", "").strip()
    zookeeper = options.get("zookeeper.connect", "").strip()
    servers = options.get("kafka.bootstrap.servers", "").strip()
    if [bool(broker), bool(zookeeper), bool(servers)].count(True) != 1:
        raise OptionError(
            "say where the cluster is with exactly one of the options broker "
            "(tcp://HOST:PORT), kafka.bootstrap.servers (HOST:PORT[,HOST:PORT]) and "
            "zookeeper.connect (HOST:PORT[,HOST:PORT][/CHROOT])"
        )
    if servers:
        try:
            return ",".join(split_endpoints(servers))
        except ValueError as error:
            raise OptionError(f"kafka.bootstrap.servers {servers!r}: {error}") from None
    if broker:
        endpoint = broker if broker.startswith("tcp://") else f"tcp://{broker}"
        if not re.fullmatch(r"tcp://[^:/\s]+:\d+", endpoint):
            raise OptionError(f"broker {broker!r}: expected tcp://HOST:PORT or HOST:PORT")
        return endpoint
    hosts, _, chroot = zookeeper.partition("/")
    with Registry(hosts, f"/{chroot}" if chroot else DEFAULT_CHROOT) as registry:
        brokers = registry.brokers.read()
    if not brokers:
        raise PipelineError(f"no live broker is registered in ZooKeeper at {zookeeper!r}")
    info = brokers[min(brokers)]
    return f"tcp://{info.host}:{info.port}"


def client_keys(options: Mapping[str, str]) -> ClientKeys | None:
    """The Curve keys that the (lower-cased) options `keyfile` and `brokerkey` name, read now;
    None without them. OptionError for one without the other, and for a file that cannot be
    used (missing, malformed, or a secret file that others may read)."""
    key_file = options.get("keyfile", "").strip()
    broker_key = options.get("brokerkey", "").strip()
    if bool(key_file) != bool(broker_key):
        raise OptionError(
            "keyFile and brokerKey go together: a Curve client presents its own key pair "
            "(keyFile, its .key_secret file) and checks the broker's public key (brokerKey)"
        )
    if not key_file:
        return None
    try:
        return ClientKeys.load(key_file, broker_key)
    except KeyFileError as error:
        raise OptionError(f"keyFile {key_file!r}, brokerKey {broker_key!r}: {error}") from None


def message_bounds(connection: Connection, tp: SourcePartition, position: int) -> tuple[int, int]:
    """(start, next) of the message around byte `position` of the partition: (position,
    position) when a message starts there (broker.client.lag.message_bounds). BrokerError
    OFFSET_OUT_OF_RANGE outside [log start, high watermark]."""
    return lag.message_bounds(connection, tp.topic, tp.partition, position, RETRIES)


class DriverView(Cluster):
    """The driver's view of the cluster during one planning step: partitions, their holders
    and their exact offsets, over one connection per broker (closed by `close`), each with
    `keys` when the brokers serve Curve."""

    def __init__(
        self,
        bootstrap: str,
        timeout_s: float = 10.0,
        retries: int = RETRIES,
        keys: ClientKeys | None = None,
        unavailable_retries: int = OFFSET_RETRIES,
        retry_interval_s: float = OFFSET_RETRY_INTERVAL_S,
    ) -> None:
        super().__init__(bootstrap, CLIENT_ID, timeout_s, retries, keys=keys)
        self.unavailable_retries = unavailable_retries
        self.retry_interval_s = retry_interval_s

    def holders(self, topic: str) -> dict[int, str]:
        """Partition -> endpoint of the broker holding it, for every partition of `topic`
        (from METADATA; `served`). OptionError for a topic that does not exist."""

        def listed() -> list[tuple[str, PartitionInfo]]:
            try:
                return [(topic, info) for info in self.partitions(topic)]
            except BrokerError as error:
                if error.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                    raise OptionError(f"topic {topic!r} does not exist") from None
                raise

        return {tp.partition: endpoint for tp, endpoint in self.served(listed).items()}

    def matching(self, pattern: re.Pattern[str]) -> dict[SourcePartition, str]:
        """Each partition of every topic whose whole name `pattern` matches -> the endpoint of
        the broker holding it, from one METADATA of every topic (`served`)."""

        def listed() -> list[tuple[str, PartitionInfo]]:
            return [
                (info.topic, p)
                for info in self.metadata(()).topics
                if info.error_code == ErrorCode.NONE and pattern.fullmatch(info.topic)
                for p in info.partitions
            ]

        return self.served(listed)

    def served(
        self, listed: Callable[[], list[tuple[str, PartitionInfo]]]
    ) -> dict[SourcePartition, str]:
        """The endpoint of the leader of each partition `listed` gives (topic, partition's
        METADATA), asked again up to `unavailable_retries` times, `retry_interval_s` apart
        (fetchOffset.numRetries, fetchOffset.retryIntervalMs), while one has no leader
        serving it; then PipelineError naming that partition and its leader."""
        attempt = 0
        while True:
            found: dict[SourcePartition, str] = {}
            down: tuple[str, PartitionInfo] | None = None
            for topic, info in listed():
                endpoint = self.endpoints.get(info.broker_id)
                if info.error_code != ErrorCode.NONE or endpoint is None:
                    down = down or (topic, info)
                else:
                    found[SourcePartition(topic, info.partition)] = endpoint
            if down is None:
                return found
            if attempt >= self.unavailable_retries:
                raise PipelineError(self._unserved(*down, attempt + 1))
            attempt += 1
            time.sleep(self.retry_interval_s)

    def _unserved(self, topic: str, info: PartitionInfo, asked: int) -> str:
        if info.broker_id < 0:
            why = "it has no leader"
        elif info.broker_id not in self.endpoints:
            why = f"its leader, broker {info.broker_id}, is not registered (down?)"
        else:
            why = f"its leader, broker {info.broker_id}, does not serve it now"
        return (
            f"partition {info.partition} of topic {topic!r} cannot be read: {why}; asked "
            f"{asked} times, {self.retry_interval_s:g} s apart (fetchOffset.numRetries, "
            "fetchOffset.retryIntervalMs)"
        )

    def offsets(self, tp: SourcePartition, endpoint: str) -> tuple[int, int]:
        """(log start offset, high watermark) of the partition, by OFFSETS."""
        return lag.log_range(self.connect(endpoint), tp.topic, tp.partition, RETRIES)

    def offset_for_time(self, tp: SourcePartition, endpoint: str, time_ms: int) -> int:
        """The first offset whose message's timestamp is >= time_ms (the high watermark if
        none): every message before it is older than time_ms."""
        request = OffsetsRequest(tp.topic, tp.partition, time_ms)
        return self.connect(endpoint).call(request, RETRIES).offset

    def message_bounds(self, tp: SourcePartition, endpoint: str, position: int) -> tuple[int, int]:
        return message_bounds(self.connect(endpoint), tp, position)

    def check_boundary(self, tp: SourcePartition, endpoint: str, offset: int) -> None:
        """NotMessageBoundary unless a message starts at `offset` (or it is the high
        watermark); offsets outside the readable range are left to the caller."""
        start, following = self.message_bounds(tp, endpoint, offset)
        if start != offset:
            raise NotMessageBoundary(
                tp.topic,
                tp.partition,
                offset,
                f"the message around it starts at {start}, the next one at {following}",
            )

"""Topic administration: create, delete, list, describe.

Any broker of the cluster takes CREATE_TOPIC and DELETE_TOPIC (the first bootstrap endpoint
that answers is asked); describe asks each partition's offsets of the broker holding it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from broker.client.cluster import Cluster
from broker.client.connection import DEFAULT_CLIENT_ID
from broker.errors import BrokerError, Unavailable
from broker.lifecycle import Closing
from broker.protocol import (
    EARLIEST,
    LATEST,
    CreateTopicRequest,
    DeleteTopicRequest,
    EmptyReply,
    ErrorCode,
    MetadataReply,
    OffsetsRequest,
    TopicInfo,
    broker_error,
)


@dataclass(frozen=True, slots=True)
class PartitionOffsets:
    """A partition of a topic, the broker holding it, and its exact offsets (from OFFSETS);
    the offsets are None while the partition is not served (its broker down)."""

    partition: int
    broker_id: int
    log_start_offset: int | None
    high_watermark: int | None


class Admin(Closing):
    """Administer the topics of the cluster that `endpoint` (one or more, comma-separated)
    belongs to. Read-only calls are retried on retriable errors; create and delete are sent
    once (a retry after a lost reply could answer TOPIC_ALREADY_EXISTS or
    UNKNOWN_TOPIC_OR_PARTITION for what did succeed)."""

    def __init__(
        self,
        endpoint: str,
        client_id: str = DEFAULT_CLIENT_ID,
        timeout_s: float = 10.0,
        retries: int = 3,
    ) -> None:
        self.cluster = Cluster(endpoint, client_id, timeout_s, retries)
        self.retries = retries

    def _admin_request(self, request: CreateTopicRequest | DeleteTopicRequest) -> EmptyReply:
        """Send once, to the first bootstrap broker that can be reached."""
        error: Unavailable | None = None
        for endpoint in self.cluster.bootstrap:
            try:
                return self.cluster.connect(endpoint).request(request)
            except Unavailable as failure:
                error = failure
        assert error is not None
        raise error

    def create_topic(
        self, topic: str, partitions: int = 1, config: Mapping[str, str] | None = None
    ) -> None:
        """Create `topic` with `partitions` partitions dealt over the live brokers; `config`
        maps topic settings to decimal text or "none" (docs/protocol.md, CREATE_TOPIC). Returns
        once every partition is served. Raises BrokerError TOPIC_ALREADY_EXISTS, ..."""
        self._admin_request(CreateTopicRequest(topic, partitions, dict(config or {})))

    def delete_topic(self, topic: str) -> None:
        """Delete `topic` and its data. Raises BrokerError UNKNOWN_TOPIC_OR_PARTITION."""
        self._admin_request(DeleteTopicRequest(topic))

    def metadata(self, topics: Iterable[str] = ()) -> MetadataReply:
        """The brokers, and `topics` (every topic when empty) with their partitions. A topic
        that does not exist comes back with its own error code, not as an exception."""
        return self.cluster.metadata(topics)

    def list_topics(self) -> list[str]:
        """The names of every topic, sorted."""
        return sorted(topic.topic for topic in self.metadata().topics)

    def topic(self, topic: str) -> TopicInfo:
        """`topic` and its partitions; BrokerError UNKNOWN_TOPIC_OR_PARTITION when it does not
        exist."""
        for info in self.metadata([topic]).topics:
            if info.topic == topic:
                if info.error_code != ErrorCode.NONE:
                    raise broker_error(info.error_code, f"topic {topic!r} does not exist")
                return info
        raise broker_error(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no metadata for {topic!r}")

    def describe(self, topic: str) -> list[PartitionOffsets]:
        """Every partition of `topic`, with exact log start offsets and high watermarks asked
        of the broker holding each (None for a partition that is not served)."""
        described = []
        for partition in self.cluster.partitions(topic):
            number, holder = partition.partition, partition.broker_id
            offsets: tuple[int | None, int | None] = (None, None)
            if partition.error_code == ErrorCode.NONE:
                try:
                    connection = self.cluster.connection(holder)
                    offsets = (
                        connection.call(
                            OffsetsRequest(topic, number, EARLIEST), self.retries
                        ).offset,
                        connection.call(OffsetsRequest(topic, number, LATEST), self.retries).offset,
                    )
                except (BrokerError, Unavailable) as error:
                    if isinstance(error, BrokerError) and not error.retriable:
                        raise
            described.append(PartitionOffsets(number, holder, *offsets))
        return described

    def close(self) -> None:
        self.cluster.close()

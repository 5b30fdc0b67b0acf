"""Topic administration against one broker: create, delete, list, describe.

In this protocol version each broker holds its own partitions of a topic, so every call here
concerns the partitions of the broker at `endpoint` (docs/protocol.md, "Transport").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Self

from broker.client.connection import DEFAULT_CLIENT_ID, Connection
from broker.protocol import (
    EARLIEST,
    LATEST,
    CreateTopicRequest,
    DeleteTopicRequest,
    ErrorCode,
    MetadataReply,
    MetadataRequest,
    OffsetsRequest,
    TopicInfo,
    broker_error,
)


@dataclass(frozen=True, slots=True)
class PartitionOffsets:
    """A partition of a topic, the broker holding it, and its exact offsets (from OFFSETS)."""

    partition: int
    broker_id: int
    log_start_offset: int
    high_watermark: int


class Admin:
    """Administer topics on the broker at `endpoint`. Read-only calls are retried on retriable
    errors; create and delete are sent once (a retry after a lost reply could answer
    TOPIC_ALREADY_EXISTS or UNKNOWN_TOPIC_OR_PARTITION for what did succeed)."""

    def __init__(
        self,
        endpoint: str,
        client_id: str = DEFAULT_CLIENT_ID,
        timeout_s: float = 10.0,
        retries: int = 3,
    ) -> None:
        self.connection = Connection(endpoint, client_id, timeout_s)
        self.retries = retries

    def create_topic(
        self, topic: str, partitions: int = 1, config: Mapping[str, str] | None = None
    ) -> None:
        """Create `topic` with `partitions` partitions; `config` maps topic settings to decimal
        text or "none" (docs/protocol.md, CREATE_TOPIC). Raises BrokerError
        TOPIC_ALREADY_EXISTS, INVALID_TOPIC, ..."""
        self.connection.request(CreateTopicRequest(topic, partitions, dict(config or {})))

    def delete_topic(self, topic: str) -> None:
        """Delete `topic` and its data. Raises BrokerError UNKNOWN_TOPIC_OR_PARTITION."""
        self.connection.request(DeleteTopicRequest(topic))

    def metadata(self, topics: Iterable[str] = ()) -> MetadataReply:
        """The brokers, and `topics` (every topic when empty) with their partitions. A topic
        that does not exist comes back with its own error code, not as an exception."""
        return self.connection.call(MetadataRequest(tuple(topics)), self.retries)

    def list_topics(self) -> list[str]:
        """The names of every topic, sorted."""
        return sorted(topic.topic for topic in self.metadata().topics)

    def topic(self, topic: str) -> TopicInfo:
        """`topic`'s partitions on this broker; BrokerError UNKNOWN_TOPIC_OR_PARTITION when it
        does not exist."""
        for info in self.metadata([topic]).topics:
            if info.topic == topic:
                if info.error_code != ErrorCode.NONE:
                    raise broker_error(info.error_code, f"topic {topic!r} does not exist")
                return info
        raise broker_error(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no metadata for {topic!r}")

    def describe(self, topic: str) -> list[PartitionOffsets]:
        """Every partition of `topic`, with exact log start offsets and high watermarks (METADATA
        offsets may lag a moment behind, so each is asked for with OFFSETS)."""
        described = []
        for partition in sorted(self.topic(topic).partitions, key=lambda p: p.partition):
            number = partition.partition
            start = self.connection.call(
                OffsetsRequest(topic, number, EARLIEST), self.retries
            ).offset
            end = self.connection.call(OffsetsRequest(topic, number, LATEST), self.retries).offset
            described.append(PartitionOffsets(number, partition.broker_id, start, end))
        return described

    def close(self) -> None:
        self.connection.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

"""The errors of the Spark pipeline, under pylog's one root (broker.errors.PylogError).

    PylogError
    └── PipelineError          anything the pipeline refuses or cannot do
        ├── OptionError        a source or sink option, or a sink column, that is missing,
        │                      unknown or malformed: fix the query; retrying cannot help
        ├── NotMessageBoundary an offset (from an option or a checkpoint) inside a message
        └── DataLoss           messages that a query still had to read were deleted (retention)
                               or went away (a topic re-created), and failOnDataLoss is true

Errors raised in a Spark task reach the driver inside Spark's own exception (a
PythonException, a StreamingQueryException) whose message holds this one's text; a failed write
raises the broker's error (broker.errors.BrokerError, Unavailable) chained to the sink's
message, so that the cause shows there too.
"""

from __future__ import annotations

from broker.errors import PylogError


class PipelineError(PylogError):
    """Root of the pipeline's errors."""


class OptionError(PipelineError, ValueError):
    """A source or sink option (or a sink column) that is missing, unknown or malformed."""


class NotMessageBoundary(PipelineError):
    """An offset given by an option or read from a checkpoint is inside a message: offsets are
    byte positions, and only the first byte of a message is one to read from."""

    def __init__(self, topic: str, partition: int, offset: int, detail: str) -> None:
        super().__init__(
            f"topic {topic!r} partition {partition}: offset {offset} is not a message boundary "
            "(offsets are byte positions, not Kafka's message numbers: use an offset a read "
            "returned, -2 for earliest, or startingOffsetsByTimestamp; docs/pipeline.md, "
            f"'From a Kafka job'): {detail}"
        )
        self.topic = topic
        self.partition = partition
        self.offset = offset


class DataLoss(PipelineError):
    """Offsets [start, end) of a partition were to be read but are gone; raised only with
    failOnDataLoss true (with false, the reader logs the loss and reads on from the log start)."""

    def __init__(self, topic: str, partition: int, start: int, end: int, why: str) -> None:
        super().__init__(
            f"data loss: topic {topic!r} partition {partition}: offsets [{start}, {end}) were "
            f"not read and are gone ({why}); set failOnDataLoss to false to skip them"
        )
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end

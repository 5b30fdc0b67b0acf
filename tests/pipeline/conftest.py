"""Fixtures of the pipeline tests: one local SparkSession for the whole session (Spark takes
10-25 s to start), with format("pylog") registered, and helpers to fill topics."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from pyspark import SparkContext
from pyspark.sql import SparkSession

from broker.client import Admin, Producer
from pipeline import register
from tests.mirror.conftest import clusters, make_mirror  # noqa: F401 (fixtures)


def local_spark(master: str = "local[2]") -> SparkSession:
    """A local Spark on 127.0.0.1 run by this Python, with format("pylog") registered, 2
    partitions after a shuffle, in UTC (`master` "local[2,4]": a failed task run again)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    session = (
        SparkSession.builder.master(master)
        .appName("pylog-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    register(session)
    return session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = local_spark()
    yield session
    session.stop()
    # and the JVM: session.stop() leaves pyspark's gateway running until this process exits;
    # it ends when its stdin closes (pyspark.java_gateway)
    gateway = SparkContext._gateway
    if gateway is not None:
        gateway.shutdown()
        gateway.proc.stdin.close()
        gateway.proc.wait(60)
        SparkContext._gateway = None
        SparkContext._jvm = None


@dataclass(frozen=True)
class Sent:
    """A message as produced: where it went and what it held."""

    topic: str
    partition: int
    key: bytes | None
    value: bytes
    timestamp_ms: int


def produce(
    endpoint: str,
    topic: str,
    partitions: int,
    count: int,
    first: int = 0,
    timestamp_ms: int | None = None,
    value_bytes: int = 0,
    compression: str = "none",
) -> list[Sent]:
    """Send messages first .. first+count-1 to `topic`, spread over its partitions by number,
    acknowledged as flushed, compressed with `compression`; every third one has no key."""
    sent = []
    with Producer(endpoint, topic, compression=compression) as producer:
        for number in range(first, first + count):
            key = None if number % 3 == 0 else f"key-{number}".encode()
            value = f"value-{number}".encode().ljust(value_bytes, b".")
            stamp = 1_700_000_000_000 + number if timestamp_ms is None else timestamp_ms
            partition = number % partitions
            producer.send(value, key, stamp, partition)
            sent.append(Sent(topic, partition, key, value, stamp))
    return sent


def create_topic(endpoint: str, topic: str, partitions: int, **config: str) -> None:
    with Admin(endpoint) as admin:
        admin.create_topic(topic, partitions, config)

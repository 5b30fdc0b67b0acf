"""A Spark read while a broker of the cluster is down (issue 52): the driver asks again where
the partitions are (fetchOffset.numRetries, fetchOffset.retryIntervalMs), then fails naming the
partition and its leader. It failed with a bare `KeyError: 2`."""

from __future__ import annotations

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from broker.client import Admin
from tests.conftest import wait_until
from tests.pylogd import ThreeBrokers

pytestmark = pytest.mark.slow  # ~40 s: three brokers of its own (30 s to start beside Spark)


def test_a_read_with_a_partitions_leader_down_names_the_partition_and_the_broker(
    spark: SparkSession, own_three_brokers: ThreeBrokers, topic: str
) -> None:
    three = own_three_brokers
    with Admin(three.brokers[1].endpoint) as admin:
        admin.create_topic(topic, 3)
    replicas = three.registry.topics.topic_config(topic).replicas
    partition, down = next((p, r[0]) for p, r in enumerate(replicas) if r[0] != 1)
    three.brokers[down].stop()
    wait_until(lambda: down not in three.registry.brokers.read(), 30, "broker gone")
    read = spark.read.format("pylog").options(
        broker=three.brokers[1].endpoint,
        subscribe=topic,
        **{"fetchOffset.numRetries": "2", "fetchOffset.retryIntervalMs": "100"},
    )
    with pytest.raises(PySparkException) as raised:
        read.load().count()
    message = str(raised.value)
    assert f"partition {partition} of topic {topic!r} cannot be read" in message, message
    assert f"broker {down}" in message and "asked 3 times, 0.1 s apart" in message

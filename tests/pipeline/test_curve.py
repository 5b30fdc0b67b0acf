"""The source and sink through a CurveZMQ server (issue 16): keyFile and brokerKey, read on the
driver, reach the brokers from the driver and from Spark's tasks (tests/client/curve.py: a
Curve front with a ZAP handler relaying to a real pylogd); one without the other, or a secret
file that others may read, is an error saying so."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from pyspark.sql import SparkSession

from broker.client import PartitionConsumer
from broker.protocol import Api
from broker.security import ClientKeys, generate_keys
from pipeline.cluster import client_keys
from pipeline.errors import OptionError
from pipeline.session import cluster_options
from tests.client.curve import CurveRelay, curve_relay
from tests.pipeline.conftest import create_topic
from tests.pylogd import RunningBroker


@pytest.fixture
def relay(broker: RunningBroker, tmp_path: Path) -> Iterator[tuple[CurveRelay, ClientKeys]]:
    with curve_relay(broker.endpoint, tmp_path / "keys") as running:
        yield running


def test_the_sink_and_the_source_reach_a_curve_broker_with_key_file_and_broker_key(
    spark: SparkSession,
    broker: RunningBroker,
    relay: tuple[CurveRelay, ClientKeys],
    topic: str,
    tmp_path: Path,
) -> None:
    server, keys = relay
    create_topic(broker.endpoint, topic, 2)
    curve = {
        "broker": server.endpoint,
        "keyFile": str(tmp_path / "keys" / "client.key_secret"),
        "brokerKey": str(tmp_path / "keys" / "broker.key"),
    }
    frame = spark.createDataFrame(
        [(f"v{n}", n % 2) for n in range(6)], "value string, partition int"
    )
    frame.write.format("pylog").mode("append").options(**curve, topic=topic).save()
    with PartitionConsumer(broker.endpoint, topic, 1, stop_at_end=True) as consumer:
        assert sorted(m.value for m in consumer) == [b"v1", b"v3", b"v5"]

    rows = spark.read.format("pylog").options(**curve, subscribe=topic).load().collect()

    assert sorted(r.value for r in rows) == [f"v{n}".encode() for n in range(6)]
    assert {Api.METADATA, Api.PRODUCE, Api.OFFSETS, Api.FETCH} <= set(server.relayed)
    assert server.seen and all(seen == (keys.public, True) for seen in server.seen)


def test_key_file_without_broker_key_or_a_readable_secret_file_is_an_option_error(
    tmp_path: Path,
) -> None:
    with pytest.raises(OptionError, match="keyFile and brokerKey go together"):
        client_keys({"keyfile": str(tmp_path / "client.key_secret")})
    public, secret = generate_keys(tmp_path, "client")
    os.chmod(secret, 0o644)
    given = {"keyfile": str(secret), "brokerkey": str(public)}
    with pytest.raises(OptionError, match=r"may be read by others \(mode 0644\)"):
        client_keys(given)
    with pytest.raises(click.UsageError, match=r"may be read by others \(mode 0644\)"):
        cluster_options(None, None, str(secret), str(public))
    with pytest.raises(click.UsageError, match="--key-file and --broker-key go together"):
        cluster_options(None, None, None, str(public))

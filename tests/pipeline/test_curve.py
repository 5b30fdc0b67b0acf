"""The source and sink with a real pylogd in curve mode (issue 16): keyFile and brokerKey, read
on the driver, reach the broker from the driver and from Spark's tasks; one without the other,
or a secret file that others may read, is an error saying so."""

from __future__ import annotations

import os
from pathlib import Path

import click
import pytest
from pyspark.sql import SparkSession

from broker.client import Admin, PartitionConsumer
from broker.security import generate_keys
from pipeline.cluster import client_keys
from pipeline.errors import OptionError
from pipeline.session import cluster_options
from tests.curve import SUPER_USER, CurveBroker, curve_broker_fixture

curve_broker = curve_broker_fixture(zookeeper_acls=True)


@pytest.mark.slow  # ~21 s: a curve broker with ZooKeeper ACLs, and Spark's tasks reach it
def test_the_sink_and_the_source_reach_a_curve_broker_with_key_file_and_broker_key(
    spark: SparkSession, curve_broker: CurveBroker, topic: str
) -> None:
    endpoint, keys = curve_broker.broker.endpoint, curve_broker.keys(SUPER_USER)
    with Admin(endpoint, keys=keys) as admin:
        admin.create_topic(topic, 2)
    curve = {
        "keyFile": str(curve_broker.key_dir / f"{SUPER_USER}.key_secret"),
        "brokerKey": str(curve_broker.key_dir / "broker.key"),
    }
    frame = spark.createDataFrame(
        [(f"v{n}", n % 2) for n in range(6)], "value string, partition int"
    )
    frame.write.format("pylog").mode("append").options(**curve, broker=endpoint, topic=topic).save()
    with PartitionConsumer(endpoint, topic, 1, stop_at_end=True, keys=keys) as consumer:
        assert sorted(m.value for m in consumer) == [b"v1", b"v3", b"v5"]

    # Found through a registry with ZooKeeper ACLs, which anyone may read: no identity needed.
    zookeeper = f"{curve_broker.zookeeper}{curve_broker.chroot}"
    read = spark.read.format("pylog").options(**curve, subscribe=topic)
    rows = read.option("zookeeper.connect", zookeeper).load().collect()

    assert sorted(r.value for r in rows) == [f"v{n}".encode() for n in range(6)]


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

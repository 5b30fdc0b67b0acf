"""The audit across clusters (issue 31): what producers counted, what the source stored, what
pylog-mirror's target stored and what was loaded into Parquet from the target, hour by hour:
every stage matches when nothing was lost, and a segment deleted on the target shows as lost at
the mirror stage."""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
from click.testing import CliRunner
from pyspark.sql import SparkSession

from broker.client import Admin, Producer
from cli.pylogctl import cli
from pipeline import audit, audit_report, load
from tests.cli.conftest import ok
from tests.conftest import wait_until
from tests.mirror.conftest import MirrorProcess, log_range, mirror_config
from tests.pipeline.conftest import create_topic
from tests.pylogd import RunningBroker

TEN = datetime.datetime(2026, 11, 22, 10, 5, tzinfo=datetime.UTC)
ELEVEN = datetime.datetime(2026, 11, 22, 11, 5, tzinfo=datetime.UTC)
TOPIC = "visits"
AUDIT_TOPIC = "_audit"


def ms(moment: datetime.datetime) -> int:
    return int(moment.timestamp() * 1000)


def same_high_watermark(source: str, target: str, partitions: int = 1) -> bool:
    try:
        return all(
            log_range(target, TOPIC, p)[1] == log_range(source, TOPIC, p)[1]
            for p in range(partitions)
        )
    except Exception:  # not on the target yet
        return False


def mirrored(
    make_mirror: Callable[..., MirrorProcess], source: str, target: str, partitions: int
) -> MirrorProcess:
    """TOPIC copied from `source` to `target` by a pylog-mirror, stopped once both ends agree."""
    mirror = make_mirror(mirror_config(source, target, [TOPIC]))
    wait_until(partial(same_high_watermark, source, target, partitions), 30, "copied")
    assert mirror.stop() == 0
    return mirror


def stored(endpoint: str) -> int:
    with Admin(endpoint) as admin:
        return admin.describe_partition(TOPIC, 0).high_watermark


@pytest.mark.slow  # ~1.5 min: two clusters, a mirror and Spark jobs of their own
def test_pylogctl_audit_across_the_mirror_passes_when_every_stage_holds_every_message(
    spark: SparkSession,
    clusters: tuple[RunningBroker, RunningBroker],
    make_mirror: Callable[..., MirrorProcess],
    tmp_path: Path,
) -> None:
    source, target = clusters
    create_topic(source.endpoint, TOPIC, 2)
    create_topic(source.endpoint, AUDIT_TOPIC, 1)
    with Producer(source.endpoint, TOPIC, audit_topic=AUDIT_TOPIC) as producer:
        for n in range(30):
            producer.send(b"visit %03d" % n, None, ms(TEN if n < 20 else ELEVEN) + n, n % 2)
    mirrored(make_mirror, source.endpoint, target.endpoint, 2)
    output = str(tmp_path / "warehouse")
    load.load(spark, {"broker": target.endpoint}, [TOPIC], output)
    arguments = [
        *("audit", "--broker", source.endpoint, "--topic", TOPIC, "--output", output),
        *("--audit-topic", AUDIT_TOPIC, "--mirror-broker", target.endpoint),
        *("--start", "2026-11-22T10:00", "--end", "2026-11-22T12:00"),
    ]
    runner = CliRunner()

    report = runner.invoke(cli, arguments)
    assert report.exit_code == 0, report.output
    assert report.output.splitlines() == [
        "hour (UTC)            produced    in source     mirrored       loaded  lost at",
        "2026-11-22 10:00            20           20           20           20",
        "2026-11-22 11:00            10           10           10           10",
        "total                       30           30           30           30",
        f"{TOPIC}: OK, every stage holds every message of every hour",
    ]

    as_json = runner.invoke(cli, [*arguments, "--json"])
    assert as_json.exit_code == 0, as_json.output
    hour_10, hour_11, total = [json.loads(line) for line in as_json.stdout.splitlines()]
    nothing_lost = {"source": 0, "mirror": 0, "load": 0}
    assert hour_10 == {
        "type": "hour",
        "topic": TOPIC,
        "hour": "2026-11-22T10:00:00+00:00",
        "produced": 20,
        "in_pylog": 20,
        "mirrored": 20,
        "lost": nothing_lost,
        "loaded": 20,
        "difference": 0,
    }
    assert (hour_11["produced"], hour_11["mirrored"], hour_11["lost"]) == (10, 10, nothing_lost)
    assert total == {
        "type": "audit",
        "topic": TOPIC,
        "produced": 30,
        "in_pylog": 30,
        "mirrored": 30,
        "lost": nothing_lost,
        "loaded": 30,
        "differing_hours": 0,
    }


@pytest.mark.slow  # ~30 s: two clusters, a mirror and a Spark job of its own
def test_the_audit_follows_a_topic_across_the_mirror_and_names_the_stage_that_lost(
    spark: SparkSession,
    clusters: tuple[RunningBroker, RunningBroker],
    make_mirror: Callable[..., MirrorProcess],
    tmp_path: Path,
) -> None:
    source, target = clusters
    create_topic(source.endpoint, TOPIC, 1, segment_bytes="2048", max_message_bytes="512")
    create_topic(source.endpoint, AUDIT_TOPIC, 1)
    with Producer(source.endpoint, TOPIC, audit_topic=AUDIT_TOPIC) as producer:
        for n in range(120):  # a segment of hour 10 first, then hours 10 and 11
            producer.send(b"visit %03d" % n, timestamp_ms=ms(TEN if n < 80 else ELEVEN) + n)
    mirror = mirrored(make_mirror, source.endpoint, target.endpoint, 1)

    # A segment of the target deleted: the broker stopped, its oldest segment of the topic's
    # partition removed with its indexes, the broker started again.
    target.stop()
    (folder,) = [f for f in (target.data_dir).rglob(f"{TOPIC}-0") if f.is_dir()]
    oldest = min(folder.glob("*.log"))
    for path in folder.glob(oldest.stem + ".*"):
        path.unlink()
    target = target.restarted()
    assert stored(target.endpoint) == stored(source.endpoint)  # its start moved, not its end
    mirror.config_path.write_text(mirror_config(source.endpoint, target.endpoint, [TOPIC]))
    said = ok(source.endpoint, "mirror", "describe", "--config", str(mirror.config_path), "--json")
    (described, _) = [json.loads(line) for line in said.splitlines()]
    start = described["target_log_start"]
    assert start > 0 and described["lag_bytes"] == 0
    assert described["note"] == f"[0, {start}) of the source is not on the target (deleted?)"

    output = str(tmp_path / "warehouse")
    load.load(spark, {"broker": target.endpoint}, [TOPIC], output)  # from the target
    arguments = [
        *("--broker", source.endpoint, "--topic", TOPIC, "--output", output),
        *("--audit-topic", AUDIT_TOPIC, "--mirror-broker", target.endpoint),
        *("--start", "2026-11-22T10:00", "--end", "2026-11-22T12:00"),
    ]
    report = CliRunner().invoke(audit.main, arguments)
    assert report.exit_code == 1, report.output
    lines = report.output.splitlines()
    assert lines[0].split() == [
        *("hour", "(UTC)", "produced", "in", "source", "mirrored", "loaded", "lost", "at")
    ]
    hour_10, hour_11, total, verdict = (line.split() for line in lines[1:])
    lost = 80 - int(hour_10[4])
    assert lost > 0
    assert hour_10[2:] == [
        "80",
        "80",
        *[str(80 - lost)] * 2,
        "mirror",
        str(lost),
        "lost",
        "<--",
        "differs",
    ]
    assert hour_11[2:] == ["40", "40", "40", "40"]
    assert total[1:] == ["120", "120", *[str(120 - lost)] * 2, "mirror", str(lost), "lost"]
    assert (
        " ".join(verdict)
        == f"{TOPIC}: 1 hour(s) differ: the mirror (source -> mirror target) {lost} lost"
    )

    as_json = CliRunner().invoke(audit.main, [*arguments, "--json"])
    summary = json.loads(as_json.stdout.splitlines()[-1])
    assert summary["lost"] == {"source": 0, "mirror": lost, "load": 0}
    assert (summary["produced"], summary["in_pylog"], summary["mirrored"]) == (120, 120, 120 - lost)


def test_a_stage_that_lost_in_one_hour_and_added_in_another_is_named_with_both() -> None:
    hour_10 = datetime.datetime(2026, 11, 22, 10, tzinfo=datetime.UTC)
    counts = [
        audit_report.HourCount(hour_10, 20, 17, None, 17),  # the mirror lost 3
        audit_report.HourCount(hour_10 + datetime.timedelta(hours=1), 10, 13, None, 13),  # 3 more
        audit_report.HourCount(
            hour_10 + datetime.timedelta(hours=2), 10, 9, None, 10
        ),  # 1 not loaded
    ]
    assert audit_report.format_stages(TOPIC, counts).splitlines() == [
        "hour (UTC)           in source     mirrored       loaded  lost at",
        "2026-11-22 10:00            20           17           17  mirror 3 lost  <-- differs",
        "2026-11-22 11:00            10           13           13  mirror 3 extra  <-- differs",
        "2026-11-22 12:00            10           10            9  load 1 lost  <-- differs",
        "total                       40           40           39  load 1 lost",
        f"{TOPIC}: 3 hour(s) differ: the mirror (source -> mirror target) 3 lost and 3 extra; "
        "the load (mirror target -> Parquet) 1 lost",
    ]


@pytest.mark.parametrize(
    ("options", "error"),
    [
        (
            ("--mirror-broker", "tcp://127.0.0.1:1", "--mirror-zookeeper", "127.0.0.1:1"),
            "give --mirror-broker or --mirror-zookeeper, not both",
        ),
        (
            ("--mirror-broker", "tcp://127.0.0.1:1", "--mirror-broker-key", "x" * 40),
            "--mirror-key-file and --mirror-broker-key go together",
        ),
        (
            ("--mirror-key-file", "secret.key_secret"),
            "need --mirror-broker or --mirror-zookeeper",
        ),
    ],
)
def test_the_mirror_options_are_checked_before_spark_and_named_in_their_errors(
    options: tuple[str, ...], error: str
) -> None:
    arguments = ["audit", "--topic", TOPIC, "--output", "warehouse", *options]
    result = CliRunner().invoke(
        cli, [*arguments, "--start", "2026-11-22T10:00", "--end", "2026-11-22T12:00"]
    )
    assert result.exit_code == 2
    assert error in result.output

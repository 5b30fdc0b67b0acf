"""`pylog-mirror` between two clusters on one machine, each with its own ZooKeeper: partitions
copied byte for byte at the source's offsets (from the source's log start), consumers moving
over at their offset, new topics picked up, a second writer on the target stopping the copy."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from broker.client import Admin, PartitionConsumer, Producer
from broker.errors import BrokerError
from broker.protocol import Ack
from tests.cli.conftest import ok
from tests.conftest import single_box_flags, wait_until
from tests.mirror.conftest import MirrorProcess, log_bytes, log_range, mirror_config
from tests.pylogd import RunningBroker

Clusters = tuple[RunningBroker, RunningBroker]
SMALL_SEGMENTS = {"segment_bytes": "4096", "max_message_bytes": "1024"}


def produce(endpoint: str, topic: str, count: int, partitions: int = 2, round_: int = 0) -> None:
    """`count` messages over `partitions` partitions, the round_'th `count` of them."""
    first = round_ * count
    with Producer(endpoint, topic, ack=Ack.ALL) as producer:
        for i in range(first, first + count):
            producer.send(b"message %06d" % i, key=b"%d" % i, partition=i % partitions)
        producer.flush()


def describe(endpoint: str, mirror: MirrorProcess) -> list[dict[str, Any]]:
    """`pylogctl mirror describe --config <its file> --json`: its partitions' lines."""
    said = ok(endpoint, "mirror", "describe", "--config", str(mirror.config_path), "--json")
    lines = [json.loads(line) for line in said.splitlines()]
    assert lines[-1]["type"] == "mirror"
    return lines[:-1]


def caught_up(source: str, target: str, topic: str, partition: int) -> bool:
    try:
        return log_range(target, topic, partition) == log_range(source, topic, partition)
    except Exception:  # the target's topic not there yet
        return False


def identical(source: str, target: str, topic: str, partition: int) -> None:
    start, end = log_range(source, topic, partition)
    assert log_range(target, topic, partition) == (start, end)
    assert log_bytes(target, topic, partition, start, end) == log_bytes(
        source, topic, partition, start, end
    )


def test_a_topic_is_copied_at_the_source_offsets_from_its_log_start_and_consumers_move_over(
    clusters: Clusters, make_mirror: Callable[..., MirrorProcess]
) -> None:
    source, target = clusters
    with Admin(source.endpoint) as admin:
        admin.create_topic("clicks", 2, SMALL_SEGMENTS)
    produce(source.endpoint, "clicks", 200)
    with Admin(source.endpoint) as admin:  # the source's head deleted: it starts past 0
        half = {p: admin.describe_partition("clicks", p).high_watermark for p in (0, 1)}
    produce(source.endpoint, "clicks", 200, round_=1)
    for p in (0, 1):
        before = ("--partition", str(p), "--before", str(half[p]))
        ok(source.endpoint, "topic", "delete-records", "clicks", *before)
    mirror = make_mirror(mirror_config(source.endpoint, target.endpoint, ["clicks"]))
    for p in (0, 1):
        wait_until(partial(caught_up, source.endpoint, target.endpoint, "clicks", p), 30, "copied")
        identical(source.endpoint, target.endpoint, "clicks", p)
        assert log_range(target.endpoint, "clicks", p)[0] == half[p]

    # a consumer reads half of what is left on the source, then goes on at the target
    with PartitionConsumer(source.endpoint, "clicks", 0, start="earliest", stop_at_end=True) as c:
        read = [m for _, m in zip(range(50), c, strict=False)]
    produce(source.endpoint, "clicks", 100, round_=4)  # more while it moves over
    wait_until(partial(caught_up, source.endpoint, target.endpoint, "clicks", 0), 30, "copied")
    moved = PartitionConsumer(
        target.endpoint, "clicks", 0, start=read[-1].next_offset, stop_at_end=True
    )
    with moved as consumer:
        rest = list(consumer)
    with PartitionConsumer(source.endpoint, "clicks", 0, start="earliest", stop_at_end=True) as c:
        everything = [(m.offset, m.value) for m in c]
    assert [(m.offset, m.value) for m in read + rest] == everything

    described = describe(source.endpoint, mirror)
    assert [(d["lag_bytes"], d["lag_messages"], d["lag_seconds"]) for d in described] == [
        (0, 0, 0.0),
        (0, 0, 0.0),
    ]
    assert described[0]["owner"] and described[0]["owner"] == described[1]["owner"]
    assert mirror.stop() == 0
    produce(source.endpoint, "clicks", 30, round_=5)  # 15 a partition, not copied
    described = describe(source.endpoint, mirror)
    assert [(d["lag_messages"], d["owner"]) for d in described] == [(15, None), (15, None)]
    assert all(
        d["lag_bytes"] == d["source_high_watermark"] - d["target_high_watermark"] > 0
        for d in described
    )


@pytest.mark.parametrize("kills", [3, pytest.param(10, marks=pytest.mark.slow)])
def test_sigkills_under_load_leave_the_target_byte_identical(
    kills: int,
    three_brokers: list[RunningBroker],
    make_pylogd: Callable[..., RunningBroker],
    tmp_path: Path,
    make_mirror: Callable[..., MirrorProcess],
) -> None:
    """A source of three brokers (replication factor 3, the session's ZooKeeper) and a target
    of one (its private ZooKeeper, replication factor 1 by [target.settings]); a producer at
    ack all meanwhile; the mirror SIGKILLed each time it has copied more, `kills` times (each
    restart waits for the killed process's ZooKeeper session to expire: about 5 s a kill)."""
    source = three_brokers[0].endpoint
    target = make_pylogd(*single_box_flags(tmp_path / "t"), name="target", zookeeper="").endpoint
    with Admin(source) as admin:
        admin.create_topic("events", 3, {**SMALL_SEGMENTS, "replication_factor": "3"})
    config = mirror_config(
        source, target, ["events"], "\n[target.settings]\nreplication_factor = 1\n"
    )
    mirror = make_mirror(config)
    for round_ in range(kills):  # each round, new messages copied as the mirror is killed
        producing = threading.Thread(target=produce, args=(source, "events", 3000, 3, round_))
        producing.start()
        try:
            wait_until(partial(copied_more, target, sum_ends(target)), 30, "more copied")
            mirror.kill()
            mirror.start()
        finally:
            producing.join(timeout=60)
        assert not producing.is_alive()
    for p in range(3):
        wait_until(partial(caught_up, source, target, "events", p), 60, "copied")
        identical(source, target, "events", p)
    assert mirror.stop() == 0
    assert "stopped" not in mirror.log()


def sum_ends(target: str) -> int:
    """The high watermarks of the target's "events" partitions, summed (0 while the topic is
    not there yet)."""
    try:
        return sum(log_range(target, "events", p)[1] for p in range(3))
    except BrokerError:
        return 0


def copied_more(target: str, before: int) -> bool:
    return sum_ends(target) > before


def test_new_topics_and_partitions_are_picked_up_and_a_second_writer_stops_the_copy(
    clusters: Clusters, make_mirror: Callable[..., MirrorProcess]
) -> None:
    source, target = clusters
    extra = "metrics_port = 0\n"
    mirror = make_mirror(mirror_config(source.endpoint, target.endpoint, ["logs-*"], extra))
    with Admin(source.endpoint) as admin:
        admin.create_topic("logs-web", 1, SMALL_SEGMENTS)
        admin.create_topic("other", 1, SMALL_SEGMENTS)
    produce(source.endpoint, "logs-web", 50, partitions=1)
    wait_until(partial(caught_up, source.endpoint, target.endpoint, "logs-web", 0), 30, "copied")
    ok(source.endpoint, "topic", "add-partitions", "logs-web", "--partitions", "2")
    produce(source.endpoint, "logs-web", 50, round_=1)
    for p in (0, 1):
        wait_until(partial(caught_up, source.endpoint, target.endpoint, "logs-web", p), 30, "grown")
        identical(source.endpoint, target.endpoint, "logs-web", p)
    with Admin(target.endpoint) as admin:
        assert "other" not in admin.list_topics()

    with Producer(target.endpoint, "logs-web", ack=Ack.ALL) as intruder:  # a second writer
        intruder.send(b"not from the source", partition=0)
        intruder.flush()
    produce(source.endpoint, "logs-web", 50, round_=2)
    wait_until(lambda: "logs-web-0: copy stopped" in mirror.log(), 30, "the copy stopped")
    assert "something else writes to the target partition" in mirror.log()
    wait_until(partial(caught_up, source.endpoint, target.endpoint, "logs-web", 1), 30, "copied")
    metrics = mirror.metrics()
    p0, p1 = ((("partition", p), ("topic", "logs-web")) for p in "01")
    assert metrics["pylog_mirror_stopped", p0] == 1 and metrics["pylog_mirror_stopped", p1] == 0
    assert metrics["pylog_mirror_copied_messages_total", p1] == 50  # 25 a round
    assert metrics["pylog_mirror_lag_bytes", p1] == 0
    wait_until(lambda: "stopped: logs-web-0" in mirror.log(), 10, "the progress line")


def copied_here(mirror: MirrorProcess) -> set[str]:
    """The partitions the mirror process copies now, by its metrics."""
    return {
        f"{dict(labels)['topic']}-{dict(labels)['partition']}"
        for (name, labels) in mirror.metrics()
        if name == "pylog_mirror_stopped"
    }


def test_mirrors_of_one_group_share_the_partitions_and_take_over_from_one_that_dies(
    clusters: Clusters, make_mirror: Callable[..., MirrorProcess]
) -> None:
    source, target = clusters
    with Admin(source.endpoint) as admin:
        admin.create_topic("shared", 4, SMALL_SEGMENTS)
    produce(source.endpoint, "shared", 200, partitions=4)
    config = mirror_config(source.endpoint, target.endpoint, ["shared"], "metrics_port = 0\n")
    first = make_mirror(config.replace("[mirror]\n", '[mirror]\nmember_id = "a"\n'), "a")
    second = make_mirror(config.replace("[mirror]\n", '[mirror]\nmember_id = "b"\n'), "b")
    everything = {f"shared-{p}" for p in range(4)}

    def shared() -> bool:  # two partitions each (the range assignment), none twice
        here = [copied_here(first), copied_here(second)]
        return [len(h) for h in here] == [2, 2] and here[0] | here[1] == everything

    wait_until(shared, 30, "the partitions shared")
    for p in range(4):
        wait_until(partial(caught_up, source.endpoint, target.endpoint, "shared", p), 30, "copied")
    first.kill()
    produce(source.endpoint, "shared", 200, partitions=4, round_=1)
    wait_until(lambda: copied_here(second) == everything, 30, "the partitions taken over")
    for p in range(4):
        wait_until(partial(caught_up, source.endpoint, target.endpoint, "shared", p), 30, "copied")
        identical(source.endpoint, target.endpoint, "shared", p)
    assert second.stop() == 0


def test_compressed_sets_and_headers_are_copied_as_they_are(
    clusters: Clusters, make_mirror: Callable[..., MirrorProcess]
) -> None:
    """A gzip set is one message on disk whatever it holds: copied whole (even with a
    fetch_max_bytes below its size), its inner messages keep their offsets on the target,
    headers included."""
    source, target = clusters
    with Admin(source.endpoint) as admin:
        admin.create_topic("packed", 1)
    with Producer(source.endpoint, "packed", ack=Ack.ALL, compression="gzip") as producer:
        for i in range(300):
            producer.send(b"packed %d" % i, headers={"n": b"%d" % i}, partition=0)
        producer.flush()
    # fetch_max_bytes below a set: the set is fetched whole all the same (max_message_bytes)
    small = "fetch_max_bytes = 64\n"
    mirror = make_mirror(mirror_config(source.endpoint, target.endpoint, ["packed"], small))
    wait_until(partial(caught_up, source.endpoint, target.endpoint, "packed", 0), 30, "copied")
    identical(source.endpoint, target.endpoint, "packed", 0)

    def read(endpoint: str) -> list[tuple[int, bytes, object]]:
        with PartitionConsumer(endpoint, "packed", 0, start="earliest", stop_at_end=True) as c:
            return [(m.offset, m.value, m.headers) for m in c]

    copied = read(target.endpoint)
    assert copied == read(source.endpoint) and len(copied) == 300
    assert copied[7][1:] == (b"packed 7", (("n", b"7"),))
    assert mirror.stop() == 0


def test_a_target_topic_that_cannot_hold_the_source_offsets_is_refused_with_the_reason(
    clusters: Clusters, make_mirror: Callable[..., MirrorProcess]
) -> None:
    """Sets converted on the target would change sizes and every offset after them; more
    partitions on the target than the source cannot be the source's: refused, said, counted,
    and nothing written to them."""
    source, target = clusters
    with Admin(source.endpoint) as admin:
        admin.create_topic("zipped", 1)
        admin.create_topic("wider", 1)
    produce(source.endpoint, "zipped", 10, partitions=1)
    with Admin(target.endpoint) as admin:
        admin.create_topic("zipped", 1, {"compression": "gzip"})
        admin.create_topic("wider", 2)
    extra = "metrics_port = 0\n"
    mirror = make_mirror(
        mirror_config(source.endpoint, target.endpoint, ["zipped", "wider"], extra)
    )
    wait_until(lambda: mirror.log().count("is not mirrored") == 2, 30, "both refused")
    assert (
        "topic 'zipped' is not mirrored: the target's topic stores sets as 'gzip'" in mirror.log()
    )
    assert "topic 'wider' is not mirrored: the target's topic has 2 partitions, the source's 1" in (
        mirror.log()
    )
    assert mirror.metrics()["pylog_mirror_topics_refused", ()] == 2
    assert log_range(target.endpoint, "zipped", 0) == (0, 0)
    assert mirror.stop() == 0


def test_a_copy_whose_source_retention_outruns_it_is_warned_of_and_forecast(
    make_pylogd: Callable[..., RunningBroker],
    make_mirror: Callable[..., MirrorProcess],
    tmp_path: Path,
) -> None:
    """The target down, a copy stands still while the source's short retention goes on: the
    mirror forecasts when the next message to copy goes (pylog_mirror_retention_seconds) and
    warns of it in its log, then that it is gone (issue 51)."""
    source = make_pylogd(
        *single_box_flags(tmp_path / "source"),
        "--log-retention-check-interval-ms",
        "200",
        name="source",
        zookeeper="",
    )
    # the target's registry (the mirror's group) stays up while the target broker is down
    target = make_pylogd(*single_box_flags(tmp_path / "target"), name="target")
    config = {"segment_bytes": "4096", "max_message_bytes": "512", "retention_ms": "6000"}
    with Admin(source.endpoint) as admin:
        admin.create_topic("aging", 1, config)
    produce(source.endpoint, "aging", 10, partitions=1)
    extra = "metrics_port = 0\nretention_check_interval_s = 0.2\nretention_warning_s = 60\n"
    mirror = make_mirror(mirror_config(source.endpoint, target.endpoint, ["aging"], extra))
    copied = log_range(source.endpoint, "aging", 0)[1]

    def all_copied() -> bool:
        try:
            return log_range(target.endpoint, "aging", 0)[1] == copied
        except BrokerError:  # the mirror has not made the target's topic yet
            return False

    wait_until(all_copied, 30, "the copy")
    target.stop()
    produce(source.endpoint, "aging", 400, partitions=1, round_=1)  # rolls past what was copied
    gauge = ("pylog_mirror_retention_seconds", (("partition", "0"), ("topic", "aging")))
    wait_until(lambda: 0 < mirror.metrics().get(gauge, 0) <= 6, 30, "the forecast")
    # (the warning that it comes may name offset 0: under retention_warning_s from the start,
    # it can be given before the first copy, and is given once a RETENTION_WARN_EVERY_S)
    coming = re.compile(r"aging-0 at source offset \d+: retention at the source deletes the next")
    gone = f"aging-0 at source offset {copied}: retention at the source has deleted messages"
    wait_until(lambda: coming.search(mirror.log()), 30, "the warning")
    wait_until(lambda: gone in mirror.log(), 30, "the warning that they are gone")
    assert "is the target up? (pylogctl mirror describe)" in mirror.log()
    assert mirror.metrics()[gauge] == 0
    assert mirror.stop() == 0

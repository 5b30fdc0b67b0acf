"""pylogd's Prometheus endpoint, scraped as Prometheus would: over HTTP, parsed with
prometheus-client's own parser; and the example Grafana dashboard (deploy/grafana/pylog.json)
queries only metrics the endpoint serves."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from collections.abc import Callable
from pathlib import Path

import pytest
import zmq

from broker import protocol
from broker.client import Admin, GroupConsumer
from broker.client.connection import Connection
from broker.errors import BrokerError
from broker.log import encode_message
from broker.protocol import Ack, Api, FetchRequest, ProduceRequest
from tests.conftest import single_box_flags, wait_until
from tests.dashboard import CURVE_ONLY, QUOTA_ONLY, RETENTION_ONLY, queried_metrics
from tests.pylogd import RunningBroker

METRICS = ("--metrics-enabled", "true", "--metrics-port", "0")


def test_the_endpoint_shows_the_broker_its_workers_partitions_and_traffic(
    make_pylogd: Callable[..., RunningBroker], tmp_path: Path
) -> None:
    broker = make_pylogd(*single_box_flags(tmp_path), *METRICS)
    assert "metrics on http://127.0.0.1:" in broker.log_path.read_text()
    first = broker.metrics()
    assert first[("pylog_worker_up", (("worker", "0"),))] == 1
    assert first[("pylog_worker_up", (("worker", "1"),))] == 1
    assert first[("pylog_zookeeper_connected", ())] == 1
    assert first[("pylog_partitions", ())] == 0
    assert first[("pylog_worker_restarts_total", ())] == 0
    assert first[("process_resident_memory_bytes", ())] > 0
    assert any(name == "pylog_info" and dict(labels)["broker_id"] == "0" for name, labels in first)

    with Admin(broker.endpoint) as admin:
        admin.create_topic("counted", 2)
    with Connection(broker.endpoint, timeout_s=10.0) as connection:
        for i in range(10):  # ack=flushed: visible once acked (ack=written: once flushed)
            request = ProduceRequest("counted", i % 2, Ack.FLUSHED, encode_message(b"m%d" % i))
            connection.request(request)
        sizes = [len(encode_message(b"m%d" % i)) for i in range(10)]
        fetched = connection.request(FetchRequest("counted", 0, 0, 1 << 20, 0, 0))
        assert len(fetched.message_set) == sum(sizes[0::2])
        with pytest.raises(BrokerError, match="not a message boundary"):
            connection.request(FetchRequest("counted", 0, 1, 1 << 20, 0, 0))
    after = broker.metrics()
    assert after[("pylog_partitions", ())] == 2
    requests = ("pylog_front_requests_total", ())
    assert after[requests] - first[requests] >= 12
    wait_until(  # every request served, and given back within CREDIT_IDLE_S
        lambda: broker.metrics()[("pylog_front_queued_request_bytes", ())] == 0,
        timeout=10,
        what="the workers to give back what they served",
    )

    def partition(name: str, number: int) -> tuple[str, tuple[tuple[str, str], ...]]:
        return (name, (("partition", str(number)), ("topic", "counted")))

    def worker_figures_in() -> bool:  # each worker sends its figures every second
        figures = broker.metrics()
        return figures.get(partition("pylog_partition_bytes_out_total", 0)) == sum(
            sizes[0::2]
        ) and all(figures.get(partition("pylog_partition_messages_in_total", n)) for n in (0, 1))

    wait_until(worker_figures_in, timeout=10, what="the workers' figures")
    figures = broker.metrics()
    for number in (0, 1):
        assert figures[partition("pylog_partition_messages_in_total", number)] == 5
        assert figures[partition("pylog_partition_bytes_in_total", number)] == sum(sizes[number::2])
        assert figures[partition("pylog_partition_high_watermark", number)] == sum(sizes[number::2])
        assert figures[partition("pylog_partition_log_bytes", number)] == sum(sizes[number::2])
        assert figures[partition("pylog_partition_segments", number)] == 1
        assert figures[partition("pylog_partition_log_start_offset", number)] == 0

    def summed(name: str, **labels: str) -> float:
        return sum(
            value
            for (n, sample_labels), value in figures.items()
            if n == name and labels.items() <= dict(sample_labels).items()
        )

    assert summed("pylog_requests_total", api="produce") == 10
    assert summed("pylog_request_seconds_count", api="produce") == 10
    assert summed("pylog_request_seconds_bucket", api="produce", le="+Inf") == 10
    assert summed("pylog_requests_total", api="fetch") == 2
    assert summed("pylog_request_errors_total", api="fetch", error="INVALID_OFFSET") == 1
    assert summed("pylog_flush_seconds_count") >= 1

    assert figures[("pylog_groups_coordinated", ())] == 0
    assert figures[("pylog_group_registry_writes_total", ())] == 0
    with GroupConsumer(broker.endpoint, "metered", ["counted"], session_timeout_s=2) as member:

        def given_both() -> bool:
            member.poll(50)
            return len(member.assignment) == 2

        wait_until(given_both, timeout=30, what="the member to be given both partitions")
        wait_until(  # the coordinator's figures, as of its last housekeeping (50 ms)
            lambda: broker.metrics()[("pylog_group_registry_writes_total", ())] >= 1,
            timeout=10,
            what="the coordinator's writes to be counted",
        )
        joined = broker.metrics()
    assert joined[("pylog_groups_coordinated", ())] == 1
    assert joined[("pylog_group_members", ())] == 1
    # the join, one transaction: `state`, the member's node, the two partitions' owners
    assert joined[("pylog_group_registry_operations_total", ())] >= 4

    queried = queried_metrics() - CURVE_ONLY - QUOTA_ONLY - RETENTION_ONLY  # tests/dashboard.py
    served = {name for name, _ in figures}
    assert queried and queried <= served, f"the dashboard queries {queried - served}"

    os.kill(broker.worker_pids()[0], signal.SIGKILL)
    wait_until(
        lambda: broker.metrics()[("pylog_worker_restarts_total", ())] == 1,
        timeout=30,
        what="the restart to be counted",
    )
    wait_until(
        lambda: broker.metrics()[("pylog_worker_up", (("worker", "0"),))] == 1,
        timeout=30,
        what="the worker to be up again",
    )


def test_the_endpoint_shows_the_front_holding_back_requests(
    make_pylogd: Callable[..., RunningBroker], tmp_path: Path
) -> None:
    """With the workers stopped, the front stops reading once they owe queued_request_bytes:
    the queue and the pause show; once they go on, the queue empties."""
    limit = 1 << 20
    broker = make_pylogd(
        *single_box_flags(tmp_path), *METRICS, "--broker-queued-request-bytes", str(limit)
    )
    with Admin(broker.endpoint) as admin:
        admin.create_topic("held", 1)
    message_set = encode_message(b"p" * (64 * 1024 - 64)) * 4
    header = protocol.RequestHeader(Api.PRODUCE, 1, 1, "t")
    request = protocol.encode_request(header, ProduceRequest("held", 0, Ack.NONE, message_set))
    workers = broker.worker_pids()
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    producer = context.socket(zmq.DEALER)
    producer.setsockopt(zmq.LINGER, 0)
    producer.connect(broker.endpoint)
    try:
        for worker in workers:
            os.kill(worker, signal.SIGSTOP)
        try:
            for _ in range(16):  # 4 MiB: four times what the front takes
                producer.send_multipart(request)
            wait_until(
                lambda: broker.metrics()[("pylog_front_read_pauses_total", ())] >= 1,
                timeout=30,
                what="the front to stop reading",
            )
            assert broker.metrics()[("pylog_front_queued_request_bytes", ())] >= limit
        finally:
            for worker in workers:
                os.kill(worker, signal.SIGCONT)
        wait_until(
            lambda: broker.metrics()[("pylog_front_queued_request_bytes", ())] == 0,
            timeout=30,
            what="the workers to serve what they owed",
        )
    finally:
        producer.close()
        context.term()


def test_a_metrics_port_in_use_stops_pylogd_naming_it(
    make_pylogd: Callable[..., RunningBroker], tmp_path: Path
) -> None:
    with contextlib.closing(socket.socket()) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            make_pylogd(
                *single_box_flags(tmp_path),
                "--metrics-enabled",
                "true",
                "--metrics-port",
                str(port),
            )


def test_a_produce_with_ack_none_the_broker_refuses_is_counted_and_logged(
    make_pylogd: Callable[..., RunningBroker], tmp_path: Path
) -> None:
    """Refused before any worker serves it (an unknown topic): no reply, as docs/protocol.md
    says, but counted under worker "supervisor" and logged, the producer's only way to learn
    its messages went nowhere. A refused request that is answered is counted the same."""
    broker = make_pylogd(*single_box_flags(tmp_path), *METRICS)
    with Connection(broker.endpoint, timeout_s=10.0) as connection:
        for _ in range(3):
            connection.send_nowait(ProduceRequest("nowhere", 0, Ack.NONE, encode_message(b"x")))
        with pytest.raises(BrokerError, match="UNKNOWN_TOPIC_OR_PARTITION"):
            connection.request(ProduceRequest("nowhere", 0, Ack.WRITTEN, encode_message(b"y")))
    refused = (
        "pylog_request_errors_total",
        (("api", "produce"), ("error", "UNKNOWN_TOPIC_OR_PARTITION"), ("worker", "supervisor")),
    )
    wait_until(lambda: broker.metrics().get(refused) == 4)
    log = broker.log_path.read_text()
    assert log.count("a produce with ack=none was refused: ") == 1  # the others left out
    assert "'nowhere'" in log.split("a produce with ack=none was refused: ")[1].splitlines()[0]

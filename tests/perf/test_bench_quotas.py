"""perf/bench_quotas.py's own logic: its `on` broker counts every client to a quota it never
reaches (so on against off is the bookkeeping's cost), and admit is timed. It times nothing
(perf/ is run by hand, alone on the machine)."""

from __future__ import annotations

import re
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import pytest

from broker.client import Admin, Connection
from broker.log.message import encode_message
from broker.protocol import Ack, ProduceRequest
from perf.bench_quotas import EVERYONE, admit_cost, start_with_quotas
from perf.bench_security import broker_log


def test_admit_is_timed() -> None:
    figures = admit_cost(1000)
    assert figures["admits"] == 1000 and isinstance(figures["admit_ns"], int)


@pytest.mark.slow  # ~5 s: a pylogd with its private ZooKeeper
@pytest.mark.broker
def test_the_on_broker_counts_every_client_and_holds_back_none(tmp_path: Path) -> None:
    with ExitStack() as stack:
        system = start_with_quotas(stack, tmp_path)
        endpoint = system.pylogd.endpoint
        with Admin(endpoint) as admin:
            admin.create_topic("counted", 1)
        request = ProduceRequest("counted", 0, Ack.WRITTEN, encode_message(b"v" * 1000))
        with Connection(endpoint, client_id="anyone") as connection:
            replies = [connection.call(request) for _ in range(20)]
        assert [reply.throttle_ms for reply in replies] == [0] * 20
        (url,) = re.findall(r"metrics on (http://\S+/metrics)", broker_log(system.pylogd))
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        labels = 'direction="produce",kind="client",name="anyone"'
        counted = re.search(rf"^pylog_quota_bytes_total{{{labels}}} (\S+)$", text, re.M)
        assert counted is not None and float(counted.group(1)) > 20_000
        limit = re.search(rf"^pylog_quota_bytes_per_second{{{labels}}} (\S+)$", text, re.M)
        assert limit is not None and float(limit.group(1)) == EVERYONE.produce_bytes_per_s

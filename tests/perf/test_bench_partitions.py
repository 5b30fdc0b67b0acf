"""perf/bench_partitions.py's scale run as a test of what it measures (not of its times): a
topic of 10,000 partitions created with pylogctl, another grown to 10,000 with add-partitions,
every partition served again after a restart, and ZooKeeper never dropping the broker."""

from __future__ import annotations

from pathlib import Path

import pytest

from perf.bench_partitions import scale

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def test_ten_thousand_partitions_are_created_and_served_again_after_a_restart(
    tmp_path: Path,
) -> None:
    figures = scale(10_000, tmp_path)
    assert figures["every_partition_answered"], figures
    assert figures["zookeeper_connections_lost"] == 0, figures
    assert figures["zookeeper_len_errors"] == 0, figures

"""A clean close writes no index file it does not need (issue 48): a broker of 10,000 idle
partitions spent 8-15 s of its stop on 4 fsyncs a partition."""

from __future__ import annotations

from pathlib import Path

from broker.log import PartitionLog
from tests.conftest import FakeClock
from tests.log.test_partition import make_set, open_log, read_all


def test_closing_an_empty_partition_writes_no_index(tmp_path: Path, clock: FakeClock) -> None:
    folder = tmp_path / "t-0"
    open_log(folder, clock).close()
    assert sorted(p.name for p in folder.glob("*index")) == []
    reopened = PartitionLog.open(folder, clock=clock)
    assert reopened.log_end_offset == 0
    reopened.close()


def test_closing_a_partition_that_took_nothing_since_it_opened_leaves_its_indexes_alone(
    tmp_path: Path, clock: FakeClock
) -> None:
    folder = tmp_path / "t-0"
    log = open_log(folder, clock)
    log.append(make_set(0, 3))
    log.close()
    indexes = sorted(folder.glob("*index"))
    assert [p.suffix for p in indexes] == [".index", ".timeindex"]
    written = {p: p.stat().st_ino for p in indexes}
    reopened = PartitionLog.open(folder, log.local.config, clock)
    reopened.close()
    assert {p: p.stat().st_ino for p in indexes} == written  # not replaced by a new file
    again = PartitionLog.open(folder, log.local.config, clock)
    assert len(read_all(again)) == 3
    again.append(make_set(3, 1))
    again.close()
    assert {p: p.stat().st_ino for p in indexes} != written  # what changed is stored

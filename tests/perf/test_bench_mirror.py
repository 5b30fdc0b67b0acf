"""perf/bench_mirror.py's own logic: a round fills the source, copies it all to the target and
gives its figures. It times nothing (perf/ is run by hand, alone on the machine)."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import pytest

from perf.bench_mirror import one_round, start


@pytest.mark.slow  # ~10 s: two pylogd, each with its private ZooKeeper
@pytest.mark.broker
def test_a_round_copies_every_message_and_gives_its_figures(tmp_path: Path) -> None:
    with ExitStack() as stack:
        source, target = start(stack, tmp_path / "s"), start(stack, tmp_path / "t")
        result = one_round(source, target, 0, 5000, "all")
    assert result["messages"] == 5000  # one_round checked the target holds every byte
    assert result["mirror_msgs_per_s"] > 0 and result["producer_msgs_per_s"] > 0
    assert result["mirror/producer"] == pytest.approx(
        result["mirror_msgs_per_s"] / result["producer_msgs_per_s"], rel=1e-2
    )

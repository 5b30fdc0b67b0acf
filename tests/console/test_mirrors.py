"""Issue 54: the console's Mirrors page, from the mirrors' files: each partition's lag on a
real source and target with pylog-mirror running, the lag growing once it stops, and a file
that cannot be used named with its error beside the others."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from broker.client import Ack, Admin, Producer
from tests.conftest import wait_until
from tests.console.conftest import RunningConsole
from tests.mirror.conftest import (  # noqa: F401 (fixtures)
    MirrorProcess,
    clusters,
    make_mirror,
    mirror_config,
)
from tests.pylogd import RunningBroker


def lag_row(page: str, topic: str) -> list[str]:
    """The cells of the page's row for partition 0 of `topic` ([] when there is none)."""
    for row in re.findall(r"<tr[^>]*>(.*?)</tr>", page, re.S):
        cells = [c.strip() for c in re.findall(r"<td>(.*?)</td>", row, re.S)]
        if cells[:2] == [topic, "0"]:
            return cells
    return []


def test_the_mirrors_page_shows_each_partitions_lag_and_a_file_it_cannot_use(
    clusters: tuple[RunningBroker, RunningBroker],  # noqa: F811 (the fixture)
    make_mirror: Callable[..., MirrorProcess],  # noqa: F811 (the fixture)
    console: Callable[..., RunningConsole],
    tmp_path: Path,
) -> None:
    source, target = clusters
    with Admin(source.endpoint) as admin:
        admin.create_topic("clicks", 1)
    with Producer(source.endpoint, "clicks", ack=Ack.FLUSHED) as producer:
        for i in range(20):
            producer.send(b"click %d" % i)
    mirror = make_mirror(mirror_config(source.endpoint, target.endpoint, ["clicks"]))
    broken = tmp_path / "broken.toml"
    broken.write_text("[source]\n")
    running = console(
        "-b",
        target.endpoint,
        "--mirror-config",
        str(mirror.config_path),
        "--mirror-config",
        str(broken),
    )

    def lag() -> str:
        code, page = running.get("/mirrors")
        assert code == 200, page
        cells = lag_row(page, "clicks")
        return cells[6] if cells else ""

    wait_until(lambda: lag() == "0", 60, "the mirror caught up")
    code, page = running.get("/mirrors")
    assert code == 200, page
    assert "broken.toml" in page and "[target]" in page  # the file's error, named
    assert mirror.stop() == 0
    with Producer(source.endpoint, "clicks", ack=Ack.FLUSHED) as producer:
        for i in range(5):
            producer.send(b"later %d" % i)
    wait_until(lambda: lag() not in ("", "0"), 30, "a lag once the mirror stopped")

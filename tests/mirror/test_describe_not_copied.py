"""`pylogctl mirror describe` while a topic the mirror names is not copied (issue 53, item 1):
its summary says so and it exits 1, as `cluster health` does when unhealthy; it printed
"lag 0 bytes" and exited 0, telling a monitor all was well."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from broker.client import Admin, Producer
from tests.cli.conftest import pylogctl
from tests.mirror.conftest import mirror_config
from tests.pylogd import RunningBroker


def test_a_topic_not_on_the_target_is_named_in_the_summary_and_exits_1(
    clusters: tuple[RunningBroker, RunningBroker], tmp_path: Path
) -> None:
    source, target = clusters
    with Admin(source.endpoint) as admin:
        admin.create_topic("visits", 2)
    with Producer(source.endpoint, "visits") as producer:
        producer.send(b"a visit", partition=0)
    config = tmp_path / "mirror.toml"
    config.write_text(mirror_config(source.endpoint, target.endpoint, ["visits"]))

    described = pylogctl(source.endpoint, "mirror", "describe", "--config", str(config))
    assert described.exit_code == 1, described.output
    summary = described.output.splitlines()[-1]
    assert summary.endswith(
        "; NOT COPIED: 2 partitions (visits-0, visits-1: not on the target (yet))"
    ), summary
    as_json = pylogctl(source.endpoint, "mirror", "describe", "--config", str(config), "--json")
    assert as_json.exit_code == 1
    assert json.loads(as_json.output.splitlines()[-1])["not_copied"] == ["visits-0", "visits-1"]

    # --wait looks again while the target lacks it (a mirror just started makes it soon)
    def make_on_target() -> None:
        with Admin(target.endpoint) as admin:
            admin.create_topic("visits", 2)

    made = threading.Timer(1.0, make_on_target)
    made.start()
    try:
        described = pylogctl(
            source.endpoint, "mirror", "describe", "--config", str(config), "--wait", "60"
        )
    finally:
        made.join(30)
    assert described.exit_code == 0, described.output  # on the target: copied (here, lagging)
    assert "NOT COPIED" not in described.output

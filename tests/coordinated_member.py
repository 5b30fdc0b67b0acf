"""A group member through the coordinator as a process of its own, for the tests that kill or
stop one (tests/cluster/test_group_coordinator.py):

    python -m tests.coordinated_member BROKERS GROUP TOPIC MEMBER_ID

prints one JSON line a record ({"partition", "offset", "value"}), flushed, auto-commits every
0.2 s with a 2 s session, and closes (commit, give up, leave) on SIGTERM."""

from __future__ import annotations

import json
import signal
import sys
from types import FrameType

from broker.client import GroupConsumer


def main() -> None:
    brokers, group, topic, member_id = sys.argv[1:5]
    with GroupConsumer(
        brokers,
        group,
        [topic],
        consumer_id=member_id,
        session_timeout_s=2.0,
        auto_commit_interval_s=0.2,
        max_wait_ms=100,
    ) as member:

        def stop(signum: int, frame: FrameType | None) -> None:
            member.interrupt()

        signal.signal(signal.SIGTERM, stop)
        for record in member:
            line = {"partition": record.partition, "offset": record.offset}
            print(json.dumps(line | {"value": record.value.decode()}), flush=True)


if __name__ == "__main__":
    main()

"""`pylogctl topic add-partitions` against three real brokers, one of them down during the
change: the new partitions are placed over the brokers up, served, written to by a keyed
producer once its metadata ages, and given at once by the group's coordinator to a member
joined through the brokers."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from broker.client import Admin, Producer
from broker.protocol import Ack
from cli.partition_commands import POLL_S, SERVED_WITHIN_S, _wait_served
from tests.cli.conftest import ok, pylogctl
from tests.cluster.conftest import Member, bootstrap
from tests.conftest import FakeClock, wait_until
from tests.pylogd import RunningBroker

TOPIC = "grown"


def test_partitions_added_are_placed_on_brokers_up_served_written_and_consumed(
    three_brokers: list[RunningBroker], make_member: Callable[..., Member]
) -> None:
    endpoint = three_brokers[0].endpoint
    ok(endpoint, "topic", "create", TOPIC, "--partitions", "2", "--config", "replication_factor=2")
    member = make_member(bootstrap(three_brokers), "growers", [TOPIC])
    wait_until(lambda: len(member.consumer.assignment) == 2, 30, "the member owns both")
    producer = Producer(endpoint, TOPIC, ack=Ack.ALL, metadata_max_age_s=0.5)
    keys = [b"key-%d" % i for i in range(40)]
    for key in keys:
        producer.send(b"before", key=key)
    producer.flush()

    three_brokers[2].stop()  # broker 3 down: the new partitions go to brokers 1 and 2
    said = ok(endpoint, "topic", "add-partitions", TOPIC, "--partitions", "4")
    lines = said.splitlines()
    assert lines[0] == f"topic {TOPIC}: 2 -> 4 partitions"
    assert sorted(lines[1:]) == [
        "partition 2 replicas 1,2 (leader 1)",
        "partition 3 replicas 2,1 (leader 2)",
    ]
    with Admin(endpoint) as admin:
        partitions = admin.topic(TOPIC).partitions
    assert [p.partition for p in partitions] == [0, 1, 2, 3]
    assert {p.broker_id for p in partitions[2:]} == {1, 2}

    # The producer's metadata ages: keys now spread over four partitions.
    wait_until(lambda: producer.partitions == 4, 10, "the producer to see four partitions")
    placed = {key: producer.send(b"after", key=key) for key in keys}
    producer.flush()
    landed = {delivery.partition for delivery in placed.values()}
    producer.close()
    assert landed & {2, 3}, "no key went to a new partition"
    # The coordinator gives the member the new partitions at once (it keeps the first two),
    # and it reads what they got.
    wait_until(lambda: len(member.consumer.assignment) == 4, 30, "the member owns all four")
    assert member.revoked == []
    wait_until(
        lambda: {r.partition for _, r in member.records if r.value == b"after"} == landed,
        30,
        "the member to read every partition written after",
    )

    three_brokers[2] = three_brokers[2].restarted()
    again = json.loads(
        ok(endpoint, "topic", "add-partitions", TOPIC, "--partitions", "5", "--json")
    )
    assert again["partitions_before"] == 4 and again["partitions"] == 5
    assert again["added"] == {"4": [2, 3]}  # round robin over the three brokers up again


def test_add_partitions_refuses_fewer_partitions_and_too_few_brokers(
    three_brokers: list[RunningBroker],
) -> None:
    endpoint = three_brokers[0].endpoint
    ok(endpoint, "topic", "create", TOPIC, "--partitions", "2", "--config", "replication_factor=3")
    fewer = pylogctl(endpoint, "topic", "add-partitions", TOPIC, "--partitions", "2")
    assert fewer.exit_code == 2
    assert "has 2 partitions: partitions are only added (ask for more than 2)" in fewer.output
    missing = pylogctl(endpoint, "topic", "add-partitions", "nope", "--partitions", "3")
    assert missing.exit_code == 1 and "'nope' does not exist" in missing.output
    three_brokers[2].stop()
    short = pylogctl(endpoint, "topic", "add-partitions", TOPIC, "--partitions", "3")
    assert short.exit_code == 2
    assert "replication factor 3 is not between 1 and the 2 broker(s)" in short.output
    with Admin(endpoint) as admin:
        assert len(admin.topic(TOPIC).partitions) == 2


class ComingUp:
    """The new partitions' METADATA as a broker opening them shows it: `per_poll` more served
    at each look, after `stalled_after` of them none more (its worker stopped)."""

    def __init__(self, count: int, per_poll: int, stalled_after: int | None = None) -> None:
        self.waiting = list(range(count))
        self.per_poll = per_poll
        self.stalled_after = stalled_after
        self.looks = 0

    def __call__(self) -> list[int]:
        self.looks += 1
        served = min(self.per_poll * (self.looks - 1), self.stalled_after or len(self.waiting))
        return self.waiting[served:]


def test_the_wait_for_new_partitions_lasts_while_they_come_up_and_says_how_far(
    clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    """10,000 partitions a broker opens 100 a poll (50 s in all, over SERVED_WITHIN_S): the
    command waits them out, saying on stderr how many are served, and succeeds (the fresh-clone
    CI at 7679224 failed the 10,000-partition test on the old fixed 30 s)."""
    coming = ComingUp(10_000, per_poll=100)
    _wait_served(coming, 10_000, clock)
    assert coming.looks == 101
    progress = capsys.readouterr().err.splitlines()
    assert progress[0] == "1000 of 10000 new partitions served after 5 s"
    assert len(progress) == 9  # every 5 s


def test_the_wait_gives_up_once_no_more_partitions_came_up_for_its_limit(
    clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    coming = ComingUp(10_000, per_poll=1000, stalled_after=9_997)
    started = clock.monotonic()
    with pytest.raises(SystemExit) as exit_:
        _wait_served(coming, 10_000, clock)
    assert exit_.value.code == 1
    assert clock.monotonic() - started == pytest.approx(5 + SERVED_WITHIN_S, abs=POLL_S)
    said = capsys.readouterr().err
    assert (
        "3 of the 10000 new partitions are in ZooKeeper but not served after 30 s without one "
        "more: partitions 9997-9999; they will be once their brokers are up" in said
    )

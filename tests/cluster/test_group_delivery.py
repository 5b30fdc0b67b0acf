"""At-least-once delivery in a consumer group, on the patterns users write: a record counts as
processed when the user asks for the next one (or calls commit() after it), so a `break`, an
exception in the handler, `--max-messages` and a crash between two auto-commits each leave the
group's commit exactly after the last processed record, never past a record the user did not
finish. Each test reads the group again afterwards and asserts exactly which records come back.
The members join through the broker's group coordinator; a member that closes leaves the group at
once, one killed keeps its partition until its session expires."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from click.testing import CliRunner, Result

from broker.client import Admin, Producer
from broker.client.group import GroupConsumer
from broker.client.records import BrokerPartition
from broker.errors import CorruptSegment
from broker.protocol import Ack
from cli.pylogctl import cli
from tests.client.test_consumer import SIZE, TEN, first_segment, flip_value_byte
from tests.pylogd import RunningBroker

VALUES = [b"r-%03d" % i for i in range(100)]
M = TypeVar("M")


@pytest.fixture
def group_topic(broker: RunningBroker, topic: str) -> str:
    """A one-partition topic holding VALUES (write_values)."""
    return write_values(broker, topic)


def write_values(broker: RunningBroker, topic: str) -> str:
    """`topic` created with one partition holding VALUES, written as several message sets so
    that a member receives them in more than one fetch."""
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic, 1)
    with Producer(broker.endpoint, topic, ack=Ack.FLUSHED, batch_messages=10) as producer:
        for value in VALUES:
            producer.send(value)
        assert sum(a.count for a in producer.flush()) == len(VALUES)
    return topic


@pytest.fixture
def member(broker: RunningBroker) -> Callable[..., GroupConsumer]:
    """A GroupConsumer joining through the broker, with the test's options."""
    return member_maker(GroupConsumer, broker)


def member_maker(kind: Callable[..., M], broker: RunningBroker) -> Callable[..., M]:
    """`kind(broker.endpoint, group, [topic], ...)`: a member joining through the broker's
    group coordinator, with the test's options (a short wait and session by default)."""

    def make(group: str, topic: str, **options: object) -> M:
        options.setdefault("max_wait_ms", 200)
        options.setdefault("session_timeout_s", 2.0)
        return kind(broker.endpoint, group, [topic], **options)

    return make


def read_again(
    make: Callable[..., GroupConsumer],
    group: str,
    topic: str,
    last: bytes = VALUES[-1],
    **options: object,
) -> list[bytes]:
    """What the group's next member receives: from the group's commit to the `last` record
    (this reader commits nothing). A member killed before keeps its partition until its session
    expires: the reader is given it then."""
    got: list[bytes] = []
    with make(group, topic, auto_commit_interval_s=None, **options) as reader:
        for _ in range(200):  # bounded: a few polls bring the rest of 100 records
            got += [record.value for record in reader.poll()]
            if got and got[-1] == last:
                break
    return got


def test_a_break_out_of_the_loop_commits_only_the_records_processed(
    group_topic: str, member: Callable[..., GroupConsumer]
) -> None:
    processed: list[bytes] = []
    with member("breakers", group_topic) as consumer:
        for record in consumer:
            processed.append(record.value)
            if len(processed) == 5:
                break  # the fifth was handled, but the next was never asked for
    assert processed == VALUES[:5]
    # the fifth counts as processed only when the next is asked for: it comes again, and
    # every record after it too
    assert read_again(member, "breakers", group_topic) == VALUES[4:]


def test_a_record_whose_handler_raised_is_read_again_by_the_next_owner(
    group_topic: str, member: Callable[..., GroupConsumer]
) -> None:
    handled: list[bytes] = []
    with (
        pytest.raises(RuntimeError, match="handler failed"),
        member("raisers", group_topic) as consumer,
    ):
        for record in consumer:
            if len(handled) == 10:
                raise RuntimeError("handler failed")
            handled.append(record.value)
    assert read_again(member, "raisers", group_topic) == VALUES[10:]


def test_an_exception_on_the_first_record_commits_nothing(
    group_topic: str, member: Callable[..., GroupConsumer]
) -> None:
    with (
        pytest.raises(RuntimeError, match="handler failed"),
        member("first-raisers", group_topic) as consumer,
    ):
        for _record in consumer:
            raise RuntimeError("handler failed")
    assert read_again(member, "first-raisers", group_topic) == VALUES


def test_close_after_poll_commits_only_the_batches_before_the_last(
    group_topic: str, member: Callable[..., GroupConsumer]
) -> None:
    with member("pollers", group_topic, fetch_bytes=512) as consumer:
        first: list[bytes] = []
        for _ in range(50):  # bounded: the first non-empty poll
            first = [record.value for record in consumer.poll()]
            if first:
                break
        second = [record.value for record in consumer.poll()]  # the first batch is processed
        assert first and second
    # the second poll's records were returned but never followed by another poll or commit()
    assert read_again(member, "pollers", group_topic) == VALUES[len(first) :]


def test_commit_inside_the_loop_records_the_record_in_hand(
    group_topic: str, member: Callable[..., GroupConsumer]
) -> None:
    with member("committers", group_topic, auto_commit_interval_s=None) as consumer:
        for i, record in enumerate(consumer):
            if i == 6:
                assert record.value == VALUES[6]
                consumer.commit()  # records 0..6, the one in hand included
                break
    assert read_again(member, "committers", group_topic) == VALUES[7:]


def test_an_auto_commit_between_two_records_covers_only_the_first(
    group_topic: str,
    broker: RunningBroker,
    member: Callable[..., GroupConsumer],
) -> None:
    """A member that auto-commits at every chance is killed (SIGKILL, no close) while it
    handles its third record: the commit made when it asked for the third covers two. Its
    partition goes to the next member when its session (2 s) expires."""
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        from broker.client.group import GroupConsumer
        member = GroupConsumer({broker.endpoint!r}, "crashers", [{group_topic!r}],
                               auto_commit_interval_s=1e-9, session_timeout_s=2.0)
        for i, record in enumerate(member):
            print(record.value.decode(), flush=True)
            if i == 2:
                os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=Path.cwd()
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert done.stdout.split() == [v.decode() for v in VALUES[:3]]
    assert read_again(member, "crashers", group_topic) == VALUES[2:]


def test_group_consume_with_max_messages_commits_exactly_that_many(
    group_topic: str,
    broker: RunningBroker,
    member: Callable[..., GroupConsumer],
) -> None:
    result = CliRunner().invoke(
        cli,
        [
            "group",
            "consume",
            "counted",
            group_topic,
            "--max-messages",
            "2",
            "--format",
            "json",
            "--broker",
            broker.endpoint,
        ],
    )
    assert result.exit_code == 0, result.output
    printed = [json.loads(line)["value"] for line in result.stdout.splitlines()]
    assert printed == [v.decode() for v in VALUES[:2]]
    assert read_again(member, "counted", group_topic) == VALUES[2:]


def test_damaged_data_stops_a_member_by_name_and_skip_corrupt_reads_past_it(
    broker: RunningBroker,
    topic: str,
    member: Callable[..., GroupConsumer],
) -> None:
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic, 1)
    with Producer(broker.endpoint, topic, ack=Ack.FLUSHED) as producer:
        for value in TEN:
            producer.send(value)
    flip_value_byte(first_segment(broker, topic), 4)  # served as stored: the member finds it
    got: list[bytes] = []
    with member("careful", topic) as consumer:
        with pytest.raises(CorruptSegment) as raised:
            for record in consumer:
                got.append(record.value)
        assert (raised.value.start, raised.value.end) == (4 * SIZE, 5 * SIZE)
        assert got == TEN[:4]
        with pytest.raises(CorruptSegment):  # the same again: never skipped silently
            consumer.poll()
    assert read_again(member, "careful", topic, TEN[-1], skip_corrupt=True) == TEN[5:]

    with member("skippers", topic, skip_corrupt=True) as consumer:
        got = []
        for record in consumer:
            got.append(record.value)
            if record.value == TEN[-1]:
                consumer.commit()
                break
        assert got == TEN[:4] + TEN[5:]
        assert consumer.skipped == [(BrokerPartition(topic, 0, 0), 4 * SIZE, 5 * SIZE)]

    def group_consume(group: str, *flags: str) -> Result:
        return CliRunner().invoke(
            cli,
            [
                *("group", "consume", group, topic, "--broker", broker.endpoint, *flags),
            ],
        )

    stopped = group_consume("cli-careful")
    assert stopped.exit_code == 1
    assert stopped.stdout.splitlines() == [v.decode() for v in TEN[:4]]
    assert f"offsets [{4 * SIZE}, {5 * SIZE}) are damaged" in stopped.stderr
    assert "--skip-corrupt" in stopped.stderr
    skipping = group_consume("cli-skippers", "--skip-corrupt", "--max-messages", "9")
    assert skipping.exit_code == 0, skipping.output
    assert skipping.stdout.splitlines() == [v.decode() for v in TEN[:4] + TEN[5:]]


def test_a_loop_left_and_entered_again_goes_on_where_it_stopped(
    group_topic: str, member: Callable[..., GroupConsumer]
) -> None:
    """Records fetched and not handed out stay with the member: the next loop gets them (they
    were dropped with the last loop's generator, and the member fetched on past them)."""
    got: list[bytes] = []
    with member("re-entrants", group_topic) as consumer:
        stopper = threading.Timer(20, consumer.interrupt)  # bounds a loop waiting for nothing
        stopper.start()
        try:
            for _ in range(len(VALUES)):  # bounded: each loop takes up to three records
                for record in consumer:
                    got.append(record.value)
                    if len(got) % 3 == 0 or record.value == VALUES[-1]:
                        break
                if got[-1:] == [VALUES[-1]] or stopper.finished.is_set():
                    break
        finally:
            stopper.cancel()
    assert got == VALUES

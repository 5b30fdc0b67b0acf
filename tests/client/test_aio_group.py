"""AsyncGroupConsumer against a real broker (the group's coordinator), on the patterns of the
sync member's tests (tests/cluster/test_group_delivery.py): a `break`, an exception in the
handler, a commit in the loop, and the asyncio ones, a cancelled step, a timeout around the
handler and Ctrl-C. Each leaves the group's commit exactly after the last processed record: the
group is read again afterwards by a sync member, and exactly the records not processed come
back."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from broker.aio import AsyncGroupConsumer
from broker.client import Ack, PartitionConsumer, Producer
from broker.client.coordinator import GroupCalls
from broker.client.group import GroupConsumer
from broker.client.records import Record
from broker.groups.assignors import TopicPartition
from broker.log.message import encode_message
from tests.cluster.test_group_delivery import VALUES, read_again, write_values
from tests.pipes import PipeLines
from tests.pylogd import RunningBroker

Make = Callable[..., AsyncGroupConsumer]
M = TypeVar("M")


def member_maker(kind: Callable[..., M], broker: RunningBroker) -> Callable[..., M]:
    """`kind(broker, group, [topic], ...)`, joining through the broker (the group's
    coordinator), with the test's options (a short wait and session by default)."""

    def make(group: str, topic: str, **options: object) -> M:
        options.setdefault("max_wait_ms", 200)
        options.setdefault("session_timeout_s", 2.0)
        return kind(broker.endpoint, group, [topic], **options)

    return make


@pytest.fixture
def async_member(broker: RunningBroker) -> Make:
    return member_maker(AsyncGroupConsumer, broker)


@pytest.fixture
def member(broker: RunningBroker) -> Callable[..., GroupConsumer]:
    return member_maker(GroupConsumer, broker)


@pytest.fixture
def group_topic(broker: RunningBroker, topic: str) -> str:
    return write_values(broker, topic)


def test_a_break_out_of_async_for_commits_only_the_records_processed(
    group_topic: str, async_member: Make, member: Callable[..., GroupConsumer]
) -> None:
    async def consume() -> list[bytes]:
        processed: list[bytes] = []
        async with async_member("async-breakers", group_topic) as consumer:
            async for record in consumer:
                processed.append(record.value)
                if len(processed) == 5:
                    break  # the fifth was handled, but the next was never asked for
        return processed

    assert asyncio.run(consume()) == VALUES[:5]
    assert read_again(member, "async-breakers", group_topic) == VALUES[4:]


def test_a_record_whose_handler_raised_is_read_again(
    group_topic: str, async_member: Make, member: Callable[..., GroupConsumer]
) -> None:
    async def consume() -> None:
        handled = 0
        async with async_member("async-raisers", group_topic) as consumer:
            async for _record in consumer:
                if handled == 10:
                    raise RuntimeError("handler failed")
                handled += 1

    with pytest.raises(RuntimeError, match="handler failed"):
        asyncio.run(consume())
    assert read_again(member, "async-raisers", group_topic) == VALUES[10:]


def test_a_timeout_around_the_handler_leaves_the_record_in_hand_to_be_read_again(
    group_topic: str, async_member: Make, member: Callable[..., GroupConsumer]
) -> None:
    async def consume() -> None:
        async with async_member("async-timeouts", group_topic) as consumer:
            async with asyncio.timeout(1):
                async for record in consumer:
                    if record.value == VALUES[6]:
                        await asyncio.Event().wait()  # a handler stuck: cancelled by timeout

    with pytest.raises(TimeoutError):
        asyncio.run(consume())
    assert read_again(member, "async-timeouts", group_topic) == VALUES[6:]


def test_a_cancelled_step_loses_nothing_and_a_loop_entered_again_goes_on(
    broker: RunningBroker, group_topic: str, async_member: Make
) -> None:
    more = [b"more-%d" % i for i in range(3)]

    async def consume() -> list[bytes]:
        got: list[bytes] = []
        async with async_member("async-cancelled", group_topic) as consumer:
            async for record in consumer:  # left and entered again every three records
                got.append(record.value)
                if len(got) % 3 == 0:
                    break
            while len(got) < len(VALUES):
                async for record in consumer:
                    got.append(record.value)
                    if len(got) % 3 == 0 or len(got) == len(VALUES):
                        break
            # every record read: the next step waits for more, and is cancelled meanwhile
            waiting = asyncio.create_task(anext(consumer))
            await asyncio.sleep(0.5)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.5):
                    await anext(consumer)
            await asyncio.to_thread(produce, broker, group_topic, more)
            async with asyncio.timeout(30):
                got += [(await anext(consumer)).value for _ in more]
            await consumer.commit()  # the last one in hand too
        return got

    assert asyncio.run(consume()) == VALUES + more
    assert committed(broker, "async-cancelled", group_topic) == high_watermark(broker, group_topic)


def test_commit_records_the_record_in_hand(
    broker: RunningBroker, group_topic: str, async_member: Make
) -> None:
    async def consume() -> tuple[int, int]:
        async with async_member("async-committers", group_topic, fetch_bytes=512) as consumer:
            polled: list[Record] = []
            async with asyncio.timeout(30):
                while not polled:
                    polled = await consumer.poll()
            record = await anext(consumer)  # the polled records count as processed now
            await consumer.commit()  # the one in hand included
            (position,) = consumer.positions().values()
            return record.offset, position

    offset, position = asyncio.run(consume())
    assert position == offset + len(encode_message(VALUES[0]))  # every record is as long
    assert committed(broker, "async-committers", group_topic) == position


def test_ctrl_c_closes_the_member_committing_what_it_processed(
    group_topic: str,
    broker: RunningBroker,
    member: Callable[..., GroupConsumer],
) -> None:
    script = textwrap.dedent(
        f"""
        import asyncio
        from broker.aio import AsyncGroupConsumer

        async def main():
            async with AsyncGroupConsumer({broker.endpoint!r}, "async-interrupted",
                    [{group_topic!r}], max_wait_ms=200, session_timeout_s=2.0) as m:
                async for record in m:
                    print(record.value.decode(), flush=True)
                    if record.value == b"r-002":
                        await asyncio.Event().wait()  # Ctrl-C comes here

        asyncio.run(main())
        """
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=Path.cwd()
    )
    try:
        assert process.stdout is not None
        printed = [line.strip() for line in PipeLines(process.stdout).lines(3, timeout=60)]
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)
    finally:
        if process.poll() is None:  # a child that printed too little, or did not stop
            process.kill()
            process.wait(timeout=10)
        assert process.stdout is not None
        process.stdout.close()
    assert printed == [v.decode() for v in VALUES[:3]]
    assert process.returncode != 0  # KeyboardInterrupt, after the member closed
    assert read_again(member, "async-interrupted", group_topic) == VALUES[2:]


def committed(broker: RunningBroker, group: str, topic: str) -> int:
    """The group's committed offset of partition 0 of `topic`, as its coordinator gives it to
    the partition's next owner."""
    with GroupCalls(broker.endpoint, group) as calls:
        offsets = calls.committed([topic])
    assert set(offsets) == {TopicPartition(topic, 0)}, offsets
    return offsets[TopicPartition(topic, 0)]


def high_watermark(broker: RunningBroker, topic: str) -> int:
    with PartitionConsumer(broker.endpoint, topic, start="latest") as consumer:
        return consumer.position


def produce(broker: RunningBroker, topic: str, values: list[bytes]) -> None:
    with Producer(broker.endpoint, topic, ack=Ack.FLUSHED) as producer:
        for value in values:
            producer.send(value)

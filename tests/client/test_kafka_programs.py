"""Programs written the way confluent-kafka-python's own examples are (tests/client/
kafka_programs/: their names, calls and output, our code), run against a real broker with only
their imports changed to pylog's, as the README promises; and the examples pylog cannot run
(transactions, share groups) stop at once with one line saying why."""

from __future__ import annotations

import asyncio
import functools
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.client import Admin
from broker.client.kafka import Consumer, Message, Producer
from tests.pylogd import RunningBroker

PROGRAMS = Path(__file__).parent / "kafka_programs"
IMPORTS = (
    ("from confluent_kafka.admin import", "from broker.client.kafka.admin import"),
    ("from confluent_kafka.aio import", "from broker.client.kafka.aio import"),
    ("from confluent_kafka import", "from broker.client.kafka import"),
)
REPO = Path(__file__).parents[2]


def pylog_copy(source: str) -> str:
    """`source` with confluent-kafka's imports changed to pylog's, and nothing else."""
    changed = source
    for theirs, ours in IMPORTS:
        changed = changed.replace(theirs, ours)
    differing = [
        (old, new)
        for old, new in zip(source.splitlines(), changed.splitlines(), strict=True)
        if old != new
    ]
    assert differing and all(old.startswith("from confluent_kafka") for old, _ in differing)
    return changed


def run(program: str, tmp_path: Path, *args: str, expect_rc: int = 0) -> list[str]:
    """Run `program` of kafka_programs/, imports changed; its output lines."""
    script = tmp_path / program
    script.write_text(pylog_copy((PROGRAMS / program).read_text()))
    done = subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == expect_rc, done.stderr
    return done.stdout.splitlines() if expect_rc == 0 else done.stderr.splitlines()


def address(broker: RunningBroker) -> str:
    return broker.endpoint.removeprefix("tcp://")


def admin_program(broker: RunningBroker, tmp_path: Path) -> Callable[..., list[str]]:
    """Run admin_program.py against `broker` with the arguments given: its output lines."""
    return functools.partial(run, "admin_program.py", tmp_path, address(broker))


def test_the_admin_program_manages_topics_and_their_settings(
    broker: RunningBroker, topic: str, tmp_path: Path
) -> None:
    admin = admin_program(broker, tmp_path)
    other = f"{topic}-b"
    assert admin("create_topics", topic, other) == [
        f"Topic {topic} created",
        f"Topic {other} created",
    ]
    assert admin("create_topics", topic) == [
        f"Failed to create topic {topic}: TOPIC_ALREADY_EXISTS"
    ]
    settings = "retention.ms=86400000,compression.type=lz4"
    assert admin("alter_configs", "TOPIC", topic, settings) == [
        f"{topic} configuration successfully altered"
    ]
    assert admin("describe_configs", "topic", topic) == [
        f"{topic} compression.type = lz4 [ConfigSource.DYNAMIC_TOPIC_CONFIG,default=False]",
        f"{topic} retention.ms = 86400000 [ConfigSource.DYNAMIC_TOPIC_CONFIG,default=False]",
        f"{topic} segment.ms = 604800000 [ConfigSource.DEFAULT_CONFIG,default=True]",
    ]
    # alter_configs replaces: what it leaves out goes back to the default (Kafka's rule)
    admin("alter_configs", "TOPIC", topic, "segment.ms=-1")
    assert admin("describe_configs", "TOPIC", topic) == [
        f"{topic} compression.type = producer [ConfigSource.DEFAULT_CONFIG,default=True]",
        f"{topic} retention.ms = 604800000 [ConfigSource.DEFAULT_CONFIG,default=True]",
        f"{topic} segment.ms = -1 [ConfigSource.DYNAMIC_TOPIC_CONFIG,default=False]",
    ]
    changes = "retention.ms=SET:3600000;segment.ms=DELETE"
    assert admin(
        "incremental_alter_configs",
        "TOPIC",
        topic,
        changes,
    ) == [f"{topic} configuration successfully altered"]
    described = admin("describe_configs", "TOPIC", topic)
    assert described[1:] == [
        f"{topic} retention.ms = 3600000 [ConfigSource.DYNAMIC_TOPIC_CONFIG,default=False]",
        f"{topic} segment.ms = 604800000 [ConfigSource.DEFAULT_CONFIG,default=True]",
    ]
    # read back and written whole, replication_factor (fixed, set at creation) included
    assert admin("delta_alter_configs", "TOPIC", topic, "segment.ms=3600000") == [
        f"Config for {topic} updated"
    ]
    described = admin("describe_configs", "TOPIC", topic)
    assert described[1:] == [
        f"{topic} retention.ms = 3600000 [ConfigSource.DYNAMIC_TOPIC_CONFIG,default=False]",
        f"{topic} segment.ms = 3600000 [ConfigSource.DYNAMIC_TOPIC_CONFIG,default=False]",
    ]
    appended = admin(
        "incremental_alter_configs",
        "TOPIC",
        topic,
        "retention.ms=APPEND:1",
    )
    assert appended == [
        f"Failed to alter {topic}: retention.ms: APPEND: pylog's topic settings are single "
        "values; SET or DELETE them"
    ]
    assert admin("create_partitions", topic, "5") == [
        f"Additional partitions created for topic {topic}"
    ]
    with Admin(broker.endpoint) as pylog_admin:
        assert len(pylog_admin.topic(topic).partitions) == 5
    listed = admin("list", topic, other)
    with Admin(broker.endpoint) as pylog_admin:
        (only,) = pylog_admin.brokers()
    at = only.broker_id
    assert listed == [
        " 1 brokers",
        f'  "{topic}" with 5 partition(s)',
        *[f"partition {n} leader: {at}, replicas: [{at}], isrs: [{at}]" for n in range(5)],
        f'  "{other}" with 3 partition(s)',
        *[f"partition {n} leader: {at}, replicas: [{at}], isrs: [{at}]" for n in range(3)],
    ]
    described = admin("describe_topics", other)
    assert described == [f"Topic name : {other}"] + [
        f"    Id {n} Leader {only.broker_id} Replicas 1 ISR 1" for n in range(3)
    ]
    assert admin("describe_cluster") == ["Nodes : 1"]
    assert admin("delete_topics", other) == [f"Topic {other} deleted"]
    with Admin(broker.endpoint) as pylog_admin:
        assert other not in pylog_admin.list_topics()


def test_the_admin_program_lists_describes_moves_and_deletes_a_consumer_group(
    broker: RunningBroker, topic: str, tmp_path: Path
) -> None:
    bootstrap, group = address(broker), f"{topic}-readers"
    admin = admin_program(broker, tmp_path)
    with Admin(broker.endpoint) as pylog_admin:
        pylog_admin.create_topic(topic, partitions=3)
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(30):
        producer.produce(topic, f"m{i}", partition=i % 3)
    assert producer.flush(30) == 0
    producer.close()
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    first: list[Message] = []
    while len(first) < 30:
        message = consumer.poll(10)
        assert message is not None
        first.append(message)
    consumer.commit(asynchronous=False)
    assert admin("list_consumer_groups", group, "STABLE") == [
        f"id: {group} state: ConsumerGroupState.STABLE type: ConsumerGroupType.CONSUMER",
        "0 errors",
    ]
    assert admin("describe_consumer_groups", group) == [
        f"Group Id: {group} State: ConsumerGroupState.STABLE Type: ConsumerGroupType.CONSUMER",
        f"    Member owns {topic}[0] {topic}[1] {topic}[2]",
    ]
    listed = admin("list", group)
    assert listed[1:] == [f' "{group}" with 1 member(s), state Stable']
    # while a member reads the topic, the coordinator refuses to move its offsets
    assert admin(
        "alter_consumer_group_offsets",
        group,
        topic,
        "0",
        "0",
    ) == [f"Failed to alter {group}: NON_EMPTY_GROUP"]
    ends = {m.partition(): m.next_offset() for m in first}
    consumer.close()

    offsets = admin("list_consumer_group_offsets", group)
    assert offsets == [f"    {topic} [{p}]: {ends[p]}" for p in range(3)]
    assert admin(
        "alter_consumer_group_offsets",
        group,
        topic,
        "1",
        "0",
    ) == [f"    {topic} [1]: 0 error None"]
    asked = admin("list_consumer_group_offsets", group, topic, "1")
    assert asked == [f"    {topic} [1]: 0"]
    again = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    again.subscribe([topic])
    replayed = again.poll(10)
    assert replayed is not None
    assert (replayed.partition(), replayed.offset(), replayed.value()) == (1, 0, b"m1")
    again.close()

    assert admin("delete_consumer_groups", group) == [
        f"Deleted group with id '{group}' successfully"
    ]
    assert admin("describe_consumer_groups", group) == [
        f"Error describing group {group}: GROUP_ID_NOT_FOUND"
    ]


def test_the_admin_program_finds_offsets_by_time_and_at_either_end(
    broker: RunningBroker, topic: str, tmp_path: Path
) -> None:
    with Admin(broker.endpoint) as pylog_admin:
        pylog_admin.create_topic(topic, partitions=3)
    producer = Producer({"bootstrap.servers": address(broker)})
    for partition in range(3):
        producer.produce(topic, b"x" * 10, partition=partition)
    assert producer.flush(30) == 0
    producer.close()
    with Admin(broker.endpoint) as pylog_admin:
        ends = {p.partition: p.high_watermark for p in pylog_admin.describe(topic)}
    assert admin_program(broker, tmp_path)("list_offsets", topic) == [
        "Partition 0 Offset 0",
        f"Partition 1 Offset {ends[1]}",
        "Partition 2 Offset -1",  # no message at or after 2100: Kafka's -1
    ]


def test_the_context_manager_program_creates_produces_and_consumes_in_with_blocks(
    broker: RunningBroker, topic: str, tmp_path: Path
) -> None:
    lines = run("context_manager_program.py", tmp_path, address(broker), topic, f"{topic}-g")
    assert lines == [
        f"Topic '{topic}' created successfully",
        f"Produced 5 messages to topic '{topic}'",
        *[f"Message delivered to {topic} [0]"] * 5,  # the with block flushed them
        *[
            f"Consumed message: key=key-{i}, value=Message {i} from context manager example"
            for i in range(5)
        ],
        "=== All examples completed successfully! ===",
    ]


def test_the_asyncio_program_produces_and_consumes_with_async_rebalance_callbacks(
    broker: RunningBroker, topic: str, tmp_path: Path
) -> None:
    with Admin(broker.endpoint) as pylog_admin:
        pylog_admin.create_topic(topic, partitions=2)
    lines = run("asyncio_program.py", tmp_path, address(broker), topic, f"{topic}-g", "3")
    assert lines[0] == "on_assign 2 partitions"
    produced = [line for line in lines if line.startswith("Produced")]
    assert produced == [f"Produced batch {b}: 10 delivered" for b in range(3)]
    committed = [line for line in lines if line.startswith("Committed")]
    assert committed == [f"Committed at {n}: 2 positions" for n in (10, 20, 30)]
    assert lines[-1] == "Consumed 30 distinct 30"


@pytest.mark.parametrize(
    ("program", "line"),
    [
        (
            "transactions_program.py",
            "broker.client.kafka.KafkaException: transactions: pylog has none (yet): no "
            "transactional.id, init_transactions or read_committed; its idempotent producer "
            "stores a batch sent again once (docs/clients.md, 'What pylog does not have')",
        ),
        (
            "eos_consumer_program.py",
            "broker.client.kafka.KafkaException: assign: pylog has no manual assignment: a "
            "consumer reads as a member of its group (subscribe(topics) first), and assign() "
            "sets where the partitions the group gave it are read from (docs/clients.md)",
        ),
        (
            "share_program.py",
            "broker.client.kafka.KafkaException: share groups: pylog has none (KIP-932's "
            "queues); read with a Consumer in a group (docs/clients.md, 'What pylog does not "
            "have')",
        ),
    ],
)
def test_programs_using_what_pylog_lacks_stop_at_once_with_one_line(
    broker: RunningBroker, topic: str, tmp_path: Path, program: str, line: str
) -> None:
    errors = run(program, tmp_path, address(broker), topic, topic, expect_rc=1)
    assert errors[-1] == line
    with Admin(broker.endpoint) as pylog_admin:
        assert topic not in pylog_admin.list_topics()  # nothing was made on the way


def test_aio_producers_refuse_transactions_and_executors_in_one_line(
    broker: RunningBroker,
) -> None:
    from broker.client.kafka import KafkaException
    from broker.client.kafka.aio import AIOConsumer, AIOProducer

    async def main() -> list[str]:
        said = []
        for make in (
            lambda: AIOProducer({"bootstrap.servers": address(broker), "transactional.id": "t"}),
            lambda: AIOConsumer({"bootstrap.servers": address(broker)}, executor=object()),
        ):
            with pytest.raises(KafkaException) as refused:
                make()
            said.append(str(refused.value))
        return said

    said = asyncio.run(main())
    assert said[0].startswith("transactions: pylog has none (yet)")
    assert said[1] == (
        "executor: a pylog client runs in one thread of its own (its sockets belong to it)"
    )

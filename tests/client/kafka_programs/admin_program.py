"""An admin program written the way confluent-kafka-python's examples/adminapi.py is (its
names and calls, our own code): `admin_program.py BOOTSTRAP OPERATION ARGS...`.
tests/client/test_kafka_programs.py runs it with its imports changed to pylog's."""

import sys

from confluent_kafka import (
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    ConsumerGroupType,
    KafkaException,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
)


def create_topics(a, args):
    fs = a.create_topics([NewTopic(t, num_partitions=3, replication_factor=1) for t in args])
    for topic, f in fs.items():
        try:
            f.result()
            print(f"Topic {topic} created")
        except KafkaException as e:
            print(f"Failed to create topic {topic}: {e.args[0].name()}")


def delete_topics(a, args):
    for topic, f in a.delete_topics(args, operation_timeout=30).items():
        f.result()
        print(f"Topic {topic} deleted")


def create_partitions(a, args):
    parts = [NewPartitions(t, int(n)) for t, n in zip(args[0::2], args[1::2], strict=True)]
    for topic, f in a.create_partitions(parts, validate_only=False).items():
        f.result()
        print(f"Additional partitions created for topic {topic}")


def describe_configs(a, args):
    resources = [
        ConfigResource(kind, name) for kind, name in zip(args[0::2], args[1::2], strict=True)
    ]
    for res, f in a.describe_configs(resources).items():
        for config in sorted(f.result().values(), key=lambda c: c.name):
            if config.name in ("retention.ms", "segment.ms", "compression.type"):
                source = ConfigSource(config.source)
                print(
                    f"{res.name} {config.name} = {config.value} "
                    f"[{source},default={config.is_default}]"
                )


def alter_configs(a, args):
    resources = []
    for kind, name, configs in zip(args[0::3], args[1::3], args[2::3], strict=True):
        resource = ConfigResource(kind, name)
        for k, v in [conf.split("=") for conf in configs.split(",")]:
            resource.set_config(k, v)
        resources.append(resource)
    for res, f in a.alter_configs(resources).items():
        f.result()
        print(f"{res.name} configuration successfully altered")


def delta_alter_configs(a, args):
    """alter_configs of what is given plus every setting the resource sets now, read back
    first (as adminapi.py's delta_alter_configs does)."""
    resources = []
    for kind, name, configs in zip(args[0::3], args[1::3], args[2::3], strict=True):
        resource = ConfigResource(kind, name)
        for k, v in [conf.split("=") for conf in configs.split(",")]:
            resource.set_config(k, v)
        resources.append(resource)
    for res, f in a.describe_configs(resources).items():
        for k, entry in f.result().items():
            if not entry.is_default:
                res.set_config(k, entry.value, overwrite=False)
        for altered, done in a.alter_configs([res]).items():
            done.result()
            print(f"Config for {altered.name} updated")


def incremental_alter_configs(a, args):
    resources = []
    for kind, name, configs in zip(args[0::3], args[1::3], args[2::3], strict=True):
        entries = []
        for conf_name, operation_and_value in [c.split("=") for c in configs.split(";")]:
            if operation_and_value == "DELETE":
                operation, value = operation_and_value, None
            else:
                operation, value = operation_and_value.split(":")
            entries.append(
                ConfigEntry(conf_name, value, incremental_operation=AlterConfigOpType[operation])
            )
        resources.append(ConfigResource(kind, name, incremental_configs=entries))
    for res, f in a.incremental_alter_configs(resources).items():
        try:
            f.result()
            print(f"{res.name} configuration successfully altered")
        except KafkaException as e:
            print(f"Failed to alter {res.name}: {e}")


def list_cluster(a, args):
    md = a.list_topics(timeout=10)
    print(f" {len(md.brokers)} brokers")
    for t in sorted(md.topics.values(), key=lambda t: t.topic):
        if t.topic in args:
            print(f'  "{t}" with {len(t.partitions)} partition(s)')
            for p in t.partitions.values():
                print(f"partition {p} leader: {p.leader}, replicas: {p.replicas}, isrs: {p.isrs}")
    groups = a.list_groups(timeout=10)
    for g in groups:
        if g.id in args:
            print(f' "{g}" with {len(g.members)} member(s), state {g.state}')


def describe_topics(a, args):
    for _, f in a.describe_topics(TopicCollection(topic_names=args)).items():
        t = f.result()
        print(f"Topic name : {t.name}")
        for p in t.partitions:
            print(f"    Id {p.id} Leader {p.leader.id} Replicas {len(p.replicas)} ISR {len(p.isr)}")


def describe_cluster(a, args):
    c = a.describe_cluster(request_timeout=10).result()
    print(f"Nodes : {len(c.nodes)}")


def list_offsets(a, args):
    specs = {
        TopicPartition(args[0], 0): OffsetSpec.earliest(),
        TopicPartition(args[0], 1): OffsetSpec.latest(),
        TopicPartition(args[0], 2): OffsetSpec.for_timestamp(4102444800000),  # 2100
    }
    for partition, fut in a.list_offsets(specs, request_timeout=30).items():
        print(f"Partition {partition.partition} Offset {fut.result().offset}")


def list_consumer_groups(a, args):
    states = {ConsumerGroupState[s] for s in args[1].split(",")} if args[1:] else set()
    result = a.list_consumer_groups(request_timeout=10, states=states).result()
    for valid in result.valid:
        if valid.group_id == args[0]:
            print(f"id: {valid.group_id} state: {valid.state} type: {valid.type}")
    print(f"{len(result.errors)} errors")


def describe_consumer_groups(a, args):
    for group_id, future in a.describe_consumer_groups(args, request_timeout=10).items():
        try:
            g = future.result()
        except KafkaException as e:
            print(f"Error describing group {group_id}: {e.args[0].name()}")
            continue
        print(f"Group Id: {g.group_id} State: {g.state} Type: {g.type}")
        for member in g.members:
            owned = [f"{tp.topic}[{tp.partition}]" for tp in member.assignment.topic_partitions]
            print("    Member owns {}".format(" ".join(owned)))


def list_consumer_group_offsets(a, args):
    tps = [TopicPartition(t, int(p)) for t, p in zip(args[1::2], args[2::2], strict=True)] or None
    for _, future in a.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(args[0], tps)]
    ).items():
        for tp in future.result().topic_partitions:
            print(f"    {tp.topic} [{tp.partition}]: {tp.offset}")


def alter_consumer_group_offsets(a, args):
    tps = [
        TopicPartition(t, int(p), int(o))
        for t, p, o in zip(args[1::3], args[2::3], args[3::3], strict=True)
    ]
    for group_id, future in a.alter_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(args[0], tps)]
    ).items():
        try:
            for tp in future.result().topic_partitions:
                print(f"    {tp.topic} [{tp.partition}]: {tp.offset} error {tp.error}")
        except KafkaException as e:
            print(f"Failed to alter {group_id}: {e.args[0].name()}")


def delete_consumer_groups(a, args):
    for group_id, future in a.delete_consumer_groups(args, request_timeout=10).items():
        try:
            future.result()
            print(f"Deleted group with id '{group_id}' successfully")
        except KafkaException as e:
            print(f"Error deleting group id '{group_id}': {e.args[0].name()}")


if __name__ == "__main__":
    broker, operation, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    a = AdminClient({"bootstrap.servers": broker})
    assert ConsumerGroupType.CONSUMER != ConsumerGroupType.CLASSIC
    opsmap = {
        "create_topics": create_topics,
        "delete_topics": delete_topics,
        "create_partitions": create_partitions,
        "describe_configs": describe_configs,
        "alter_configs": alter_configs,
        "incremental_alter_configs": incremental_alter_configs,
        "delta_alter_configs": delta_alter_configs,
        "list": list_cluster,
        "describe_topics": describe_topics,
        "describe_cluster": describe_cluster,
        "list_offsets": list_offsets,
        "list_consumer_groups": list_consumer_groups,
        "describe_consumer_groups": describe_consumer_groups,
        "list_consumer_group_offsets": list_consumer_group_offsets,
        "alter_consumer_group_offsets": alter_consumer_group_offsets,
        "delete_consumer_groups": delete_consumer_groups,
    }
    opsmap[operation](a, args)

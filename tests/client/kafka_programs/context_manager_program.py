"""A program written the way confluent-kafka-python's examples/context_manager_example.py is:
an AdminClient, a Producer and a Consumer, each in a `with` block that closes it
(`context_manager_program.py BOOTSTRAP TOPIC GROUP`)."""

import sys

from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic


def main():
    broker, topic, group = sys.argv[1], sys.argv[2], sys.argv[3]

    with AdminClient({"bootstrap.servers": broker}) as admin:
        futures = admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
        for topic_name, future in futures.items():
            future.result()
            print(f"Topic '{topic_name}' created successfully")
        admin.poll(timeout=1.0)

    def delivery_callback(err, msg):
        if err:
            print(f"Message failed delivery: {err}")
        else:
            print(f"Message delivered to {msg.topic()} [{msg.partition()}]")

    with Producer({"bootstrap.servers": broker}) as producer:
        for i in range(5):
            value = f"Message {i} from context manager example"
            producer.produce(
                topic, key=f"key-{i}", value=value.encode("utf-8"), callback=delivery_callback
            )
            producer.poll(0)
        print(f"Produced 5 messages to topic '{topic}'")

    consumer_conf = {
        "bootstrap.servers": broker,
        "group.id": group,
        "auto.offset.reset": "earliest",
    }
    with Consumer(consumer_conf) as consumer:
        consumer.subscribe([topic])
        msg_count = 0
        while msg_count < 5:
            msg = consumer.poll(timeout=1.0)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    continue
                print(f"Consumer error: {msg.error()}")
                break
            key, value = msg.key().decode("utf-8"), msg.value().decode("utf-8")
            print(f"Consumed message: key={key}, value={value}")
            msg_count += 1
    print("=== All examples completed successfully! ===")


if __name__ == "__main__":
    main()

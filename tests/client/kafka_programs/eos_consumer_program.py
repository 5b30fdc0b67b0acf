"""The start of a program written the way confluent-kafka-python's examples/eos_transactions.py
is: its consumer, partition EOF events on, assigned one input partition without a group
subscription, which pylog does not have (`eos_consumer_program.py BOOTSTRAP TOPIC`)."""

import sys

from confluent_kafka import Consumer, TopicPartition

print("starting", flush=True)
consumer = Consumer(
    {
        "bootstrap.servers": sys.argv[1],
        "group.id": "eos-readers",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
    }
)
consumer.assign([TopicPartition(sys.argv[2], 0)])

"""A program written the way confluent-kafka-python's examples/share_consumer.py is: a share
consumer (KIP-932), which pylog does not have (`share_program.py BOOTSTRAP GROUP TOPIC`)."""

import sys

from confluent_kafka import (
    ConcurrentModificationException,
    IllegalStateException,
    KafkaException,
    ShareConsumer,
)

print("starting", flush=True)
sc = ShareConsumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2]})
sc.subscribe(sys.argv[3:])
try:
    while True:
        for msg in sc.poll(timeout=1.0):
            print(msg.value())
except (ConcurrentModificationException, IllegalStateException, KafkaException) as e:
    print(e)
finally:
    sc.close()

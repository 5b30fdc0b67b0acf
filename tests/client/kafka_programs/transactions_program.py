"""A program written the way confluent-kafka-python's examples/eos_transactions.py writes,
after its consumer: a transactional producer, which pylog does not have
(`transactions_program.py BOOTSTRAP TOPIC`)."""

import sys

from confluent_kafka import Producer

print("starting", flush=True)
producer = Producer({"bootstrap.servers": sys.argv[1], "transactional.id": "eos_transactions.py"})
producer.init_transactions()
producer.begin_transaction()
producer.produce(sys.argv[2], value=b"never")
producer.commit_transaction()

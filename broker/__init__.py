"""pylog: a distributed commit log for log processing, after the Kafka paper."""

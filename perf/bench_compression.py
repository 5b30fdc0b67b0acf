"""Compressed sets on real log lines, per codec, beside no compression, in one run.

    .venv/bin/python -m perf.bench_compression [--messages 200000] [--codecs none,gzip,lz4,zstd]
        [--no-spark]

Starts a real pylogd (its private ZooKeeper, default settings: fsync on), and for each codec
(`none` first) a topic of one partition that one Producer fills with `--messages` log lines
at batch 50 and ack=flushed (`compression=` the codec, at its default level), then:

- bytes on disk a message: the partition's size over the messages (wrappers, headers and all);
- produce msg/s: from the first send to the last ack (the producer compresses each batch, the
  broker opens and checks each set);
- consume msg/s: one PartitionConsumer reading the whole partition, every set expanded and
  every inner checksum verified;
- Spark rows/s (unless --no-spark): spark.read.format("pylog") of the topic into the noop
  sink, timed after every topic was read once (to warm up).

The corpus is generated, the same every run (a fixed seed): web server access lines in the
combined log format (a pool of clients, paths with product ids, the asset bundles of three
deploys, user agents, status codes and sizes as a busy site has them) and application lines
(ISO time, level, service, a random 64-bit request id, user, message, latency), half each,
interleaved, 100 to 300 bytes a line. Prints a table and one JSON line. Run it alone:
anything else on 2 cores skews it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from broker.client import Ack, Admin, Connection, Producer
from broker.protocol import LATEST, OffsetsRequest
from perf.pylog_runs import PrivatePylogd, consume

CODECS = ("none", "gzip", "lz4", "zstd")
BATCH = 50
_PATHS = [
    "/",
    "/index.html",
    "/api/v2/orders",
    "/api/v2/orders/{n}",
    "/api/v2/users/{n}/cart",
    "/static/js/app.{h}.js",
    "/static/css/site.{h}.css",
    "/images/products/{n}.jpg",
    "/search?q=shoes&page={p}",
    "/checkout/confirm",
    "/health",
]
_AGENTS = [
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/131.0.0.0 Safari/537.36",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 14_6) AppleWebKit/605.1.15 (KHTML, like Gecko) "
    "Version/18.1 Safari/605.1.15",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like "
    "Gecko) Version/18.1 Mobile/15E148 Safari/604.1",
    "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0",
    "curl/8.5.0",
    "Googlebot/2.1 (+http://www.google.com/bot.html)",
]
_SERVICES = ["order-service", "cart-service", "payment-gateway", "search", "auth"]
_MESSAGES = [
    "order created",
    "payment authorized",
    "cart updated",
    "cache miss, loading from database",
    "token refreshed",
    "slow query on table orders",
    "retrying upstream call after timeout",
    "user signed in",
]


def corpus(count: int, seed: int = 29) -> list[bytes]:
    """`count` log lines, half access lines, half application lines, interleaved."""
    rng = random.Random(seed)
    clients = [
        f"{rng.randint(1, 223)}.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{n}" for n in range(400)
    ]
    bundles = [f"{rng.getrandbits(32):08x}" for _ in range(3)]  # the deploys of the day
    statuses = [200] * 30 + [304] * 4 + [404] * 2 + [301, 500, 302, 403]
    moment = 1_764_201_600.0  # 2025-11-27T00:00:00Z
    lines = []
    for i in range(count):
        moment += rng.expovariate(2000)
        stamp = time.gmtime(moment)
        if i % 2 == 0:
            path = rng.choice(_PATHS).format(
                n=rng.randint(1, 99999), h=rng.choice(bundles), p=rng.randint(1, 20)
            )
            line = (
                f"{rng.choice(clients)} - - [{time.strftime('%d/%b/%Y:%H:%M:%S', stamp)} +0000] "
                f'"{rng.choice(["GET"] * 8 + ["POST", "PUT"])} {path} HTTP/1.1" '
                f"{rng.choice(statuses)} {rng.randint(200, 60000)} "
                f'"https://shop.example.com/" "{rng.choice(_AGENTS)}"'
            )
        else:
            millis = int(moment * 1000) % 1000
            line = (
                f"{time.strftime('%Y-%m-%dT%H:%M:%S', stamp)}.{millis:03d}Z "
                f"{rng.choice(['INFO'] * 12 + ['WARN', 'ERROR', 'DEBUG'])} "
                f"[{rng.choice(_SERVICES)}] request_id={rng.getrandbits(64):016x} "
                f'user_id={rng.randint(1, 50000)} msg="{rng.choice(_MESSAGES)}" '
                f"latency_ms={int(rng.lognormvariate(3, 1))}"
            )
        lines.append(line.encode())
    return lines


def produce(endpoint: str, topic: str, lines: list[bytes], codec: str) -> float:
    """Send every line at batch BATCH, ack=flushed; seconds from the first send to the last ack."""
    with Producer(
        endpoint,
        topic,
        ack=Ack.FLUSHED,
        batch_messages=BATCH,
        linger_ms=60_000,
        compression=codec,
    ) as producer:
        started = time.perf_counter()
        for line in lines:
            producer.send(line, partition=0)
        producer.flush()
        return time.perf_counter() - started


def spark_rows_per_s(endpoint: str, topics: list[str], count: int) -> dict[str, float]:
    """Rows/s of spark.read of each topic into the noop sink: every topic read once first (the
    first read of a session pays for the JVM's warming up), then each timed."""
    from pyspark.sql import SparkSession

    from pipeline import register

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (
        SparkSession.builder.master("local[*]")
        .appName("pylog-bench-compression")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    rates = {}
    try:
        register(spark)
        frames = {
            topic: spark.read.format("pylog").options(broker=endpoint, subscribe=topic).load()
            for topic in topics
        }
        for frame in frames.values():
            frame.write.format("noop").mode("overwrite").save()
        for topic, frame in frames.items():
            started = time.perf_counter()
            frame.write.format("noop").mode("overwrite").save()
            rates[topic] = count / (time.perf_counter() - started)
    finally:
        spark.stop()
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--codecs", default=",".join(CODECS))
    parser.add_argument("--no-spark", action="store_true", help="skip the Spark reads")
    args = parser.parse_args()
    codecs = args.codecs.split(",")
    unknown = set(codecs) - set(CODECS)
    if unknown or args.messages < 1000:
        parser.error(f"--codecs from {', '.join(CODECS)}; --messages at least 1000")
    lines = corpus(args.messages)
    raw = sum(len(line) for line in lines) / len(lines)
    results: dict[str, dict[str, Any]] = {}
    with (
        tempfile.TemporaryDirectory(prefix="pylog-bench-compression-") as work,
        PrivatePylogd(Path(work) / "pylogd") as broker,
    ):
        with Admin(broker.endpoint) as admin:
            for codec in codecs:
                admin.create_topic(f"lines-{codec}", 1)
        for codec in codecs:
            topic = f"lines-{codec}"
            produce_s = produce(broker.endpoint, topic, lines, codec)
            with Connection(broker.endpoint) as connection:
                size = connection.call(OffsetsRequest(topic, 0, LATEST)).offset
            consume_s = consume(broker, topic, len(lines), fetch_bytes=1 << 20)["seconds"]
            results[codec] = {
                "bytes_per_message": size / len(lines),
                "produce_per_s": len(lines) / produce_s,
                "consume_per_s": len(lines) / consume_s,
            }
        if not args.no_spark:
            topics = [f"lines-{codec}" for codec in codecs]
            for topic, rate in spark_rows_per_s(broker.endpoint, topics, len(lines)).items():
                results[topic.removeprefix("lines-")]["spark_rows_per_s"] = rate
    print(f"{len(lines)} log lines of {raw:.0f} bytes on average, batch {BATCH}, ack=flushed")
    print(
        f"{'codec':<6} {'B/message':>10} {'of none':>8} {'produce/s':>11} {'of none':>8} "
        f"{'consume/s':>11} {'Spark rows/s':>13}"
    )
    base = results.get("none")
    for codec, figures in results.items():
        size_ratio = figures["bytes_per_message"] / base["bytes_per_message"] if base else 0
        speed_ratio = figures["produce_per_s"] / base["produce_per_s"] if base else 0
        spark = figures.get("spark_rows_per_s")
        print(
            f"{codec:<6} {figures['bytes_per_message']:>10.1f} {size_ratio:>8.2f} "
            f"{figures['produce_per_s']:>11,.0f} {speed_ratio:>8.2f} "
            f"{figures['consume_per_s']:>11,.0f} "
            + (f"{spark:>13,.0f}" if spark is not None else f"{'-':>13}")
        )
    record = {
        "benchmark": "compression",
        "messages": len(lines),
        "line_bytes": round(raw, 1),
        "batch": BATCH,
        "results": {c: {k: round(v, 1) for k, v in f.items()} for c, f in results.items()},
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    print(json.dumps(record))


if __name__ == "__main__":
    main()

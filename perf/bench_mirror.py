"""Mirror throughput (issue 31): pylog-mirror copying a topic next to the paper's producer
filling it, on the same machine.

    flock /tmp/bench.lock .venv/bin/python -m perf.bench_mirror [--messages 1000000]
        [--repeat 3] [--ack all|flushed]

Two private pylogd (perf/pylog_runs.py's PrivatePylogd: default settings, a private ZooKeeper
each): the source and the target. Each round, on a fresh topic of one partition:

- producer: the paper's producer (perf/pylog_runs.py `produce`: `--messages` messages of 200
  bytes, batch 50, ack none) fills the source's partition; msg/s and MB/s until the source
  holds them all;
- mirror: a broker.mirror.Mirror in this process copies the topic to the target (ack all by
  default); msg/s and MB/s over the middle 80% of the bytes (from the target's high watermark
  at 10% to 90% of the source's, sampled every 20 ms, so that starting, creating the target
  topic and the last fetch's wait do not count), and the whole copy's time.

Prints one JSON line a round, then the medians and mirror/producer (the issue's target: at
least 0.8). Run it alone: on 2 cores anything beside it skews the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from broker.client import Admin
from broker.mirror import Mirror, MirrorConfig, MirrorSettings
from broker.mirror.config import ClusterAddress
from broker.protocol import LATEST, Ack, OffsetsRequest
from perf.bench_security import free_port
from perf.pylog_runs import MESSAGE_BYTES, PrivatePylogd, produce

SAMPLE_S = 0.02
COPY_LIMIT_S = 600.0


def start(stack: ExitStack, directory: Path) -> PrivatePylogd:
    return stack.enter_context(PrivatePylogd(directory, "--zookeeper-port", str(free_port())))


async def mirrored(source: str, target: str, topic: str, ack: str) -> dict[str, float]:
    """Copy `topic` from `source` to `target` with a Mirror until the target holds all the
    source holds; the times at which it held 10% and 90% of it, and the end."""
    with Admin(source) as admin:
        total = admin.describe_partition(topic, 0).high_watermark
    config = MirrorConfig(
        ClusterAddress(source),
        ClusterAddress(target),
        MirrorSettings((topic,), ack=ack, discover_interval_s=0.2, progress_interval_s=3600),
    )
    mirror = Mirror(config)
    began = time.perf_counter()
    cpu = time.process_time()
    running = asyncio.ensure_future(mirror.run())
    marks: dict[float, float] = {}
    try:
        while True:
            progress = mirror.progress()
            held = progress[0].position or 0 if progress else 0
            now = time.perf_counter()
            for share in (0.1, 0.9, 1.0):
                if share not in marks and held >= share * total:
                    marks[share] = now
            if 1.0 in marks:
                break
            if now - began > COPY_LIMIT_S:
                raise TimeoutError(f"the mirror copied {held} of {total} bytes")
            await asyncio.sleep(SAMPLE_S)
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
    return {
        "middle_s": max(marks[0.9] - marks[0.1], SAMPLE_S),  # a few messages: one sample
        "seconds": marks[1.0] - began,
        "client_cpu_s": time.process_time() - cpu,
        "bytes": total,
    }


def target_holds(target: str, topic: str) -> int:
    with Admin(target) as admin:
        return admin.cluster.call_leader(OffsetsRequest(topic, 0, LATEST), 3).offset


def one_round(
    source: PrivatePylogd, target: PrivatePylogd, n: int, messages: int, ack: str
) -> dict[str, Any]:
    topic = f"mirror-bench-{n}"
    with Admin(source.endpoint) as admin:
        admin.create_topic(topic, 1)
    produced = produce(source, topic, messages, 50, Ack.NONE)
    copy = asyncio.run(mirrored(source.endpoint, target.endpoint, topic, ack))
    assert target_holds(target.endpoint, topic) == copy["bytes"]
    for endpoint in (source.endpoint, target.endpoint):
        with Admin(endpoint) as admin:
            admin.delete_topic(topic)
    middle_messages = 0.8 * messages
    result = {
        "round": n,
        "messages": messages,
        "producer_msgs_per_s": round(messages / produced["seconds"]),
        "producer_mb_per_s": round(messages * MESSAGE_BYTES / produced["seconds"] / 1e6, 1),
        "mirror_msgs_per_s": round(middle_messages / copy["middle_s"]),
        "mirror_mb_per_s": round(0.8 * copy["bytes"] / copy["middle_s"] / 1e6, 1),
        "mirror_total_s": round(copy["seconds"], 2),
        "mirror_cpu_us_per_msg": round(copy["client_cpu_s"] / messages * 1e6, 2),
    }
    result["mirror/producer"] = round(
        result["mirror_msgs_per_s"] / result["producer_msgs_per_s"], 3
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--ack", choices=["all", "flushed"], default="all")
    args = parser.parse_args()
    rounds = []
    with tempfile.TemporaryDirectory(prefix="bench-mirror-") as work, ExitStack() as stack:
        source = start(stack, Path(work) / "source")
        target = start(stack, Path(work) / "target")
        for n in range(args.repeat):
            rounds.append(one_round(source, target, n, args.messages, args.ack))
            print(json.dumps(rounds[-1]), flush=True)
    figures = [key for key in rounds[0] if key not in ("round", "messages")]
    print(
        json.dumps({"medians": {key: statistics.median(r[key] for r in rounds) for key in figures}})
    )


if __name__ == "__main__":
    main()

"""The producer's own CPU a message: Producer.send and flush with the broker replaced by an
in-process loopback that answers every PRODUCE at once (no sockets, no pylogd), so that what is
measured is the client's code (placement, batching, the delivery handle, acknowledgements)
and not the machine's other load on the request path.

    .venv/bin/python perf/bench_send.py [--batch 1] [--messages 200000] [--repeat 5] [TREE ...]

Each TREE (a source tree: this one by default; another revision with `git worktree add`) runs
`--repeat` times, alternating, each run a process of its own with PYTHONPATH=TREE. Prints one
JSON line a run (client CPU µs a message) and each tree's median. Run it alone.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def run_one(messages: int, batch: int) -> dict[str, Any]:
    """Send `messages` 200-byte values in batches of `batch` (ack WRITTEN) to a loopback."""
    import broker
    from broker.client import Producer
    from broker.log.message import Buffer
    from broker.protocol import Ack, PartitionInfo, ProduceReply, ProduceRequest, encode_reply

    class Loopback:
        """A connection whose broker acknowledges every PRODUCE at once, in order."""

        def __init__(self) -> None:
            self.pending: deque[tuple[int, ProduceRequest]] = deque()
            self.end = 0
            self.sent = 0

        def send_pipelined(self, request: ProduceRequest) -> int:
            self.sent += 1
            self.pending.append((self.sent, request))
            return self.sent

        def receive(self, _connections: object, _timeout_s: float) -> tuple[Any, int, list[Buffer]]:
            correlation_id, request = self.pending.popleft()
            offset, self.end = self.end, self.end + len(request.message_set)
            return self, correlation_id, encode_reply(correlation_id, ProduceReply(offset, 0))

    loopback = Loopback()
    producer = Producer(
        "tcp://127.0.0.1:9", "bench", ack=Ack.WRITTEN, batch_messages=batch, linger_ms=60_000
    )
    producer._layout = (PartitionInfo(0, 0),)
    producer._served = [0]
    producer.cluster.connection = lambda _broker_id: loopback  # type: ignore[assignment,return-value]
    producer.cluster.receive_pipelined = loopback.receive  # type: ignore[method-assign,assignment]
    value = bytes(range(200))
    started = time.process_time()
    for _ in range(messages):
        producer.send(value, partition=0)
    producer.flush()
    cpu_s = time.process_time() - started
    producer.cluster.close()
    assert loopback.end == messages * (len(value) + 26), "every message acknowledged"
    return {
        "code": str(Path(broker.__file__).parent.parent),
        "batch": batch,
        "messages": messages,
        "client_us_per_message": round(cpu_s / messages * 1e6, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="*", type=Path)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--run", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        print(json.dumps(run_one(args.messages, args.batch)))
        return
    figures: dict[Path, list[float]] = {tree.resolve(): [] for tree in args.trees or [ROOT]}
    flags = [f"--batch={args.batch}", f"--messages={args.messages}", "--run"]
    for _ in range(args.repeat):
        for tree in figures:
            done = subprocess.run(
                [sys.executable, __file__, *flags],
                env={**os.environ, "PYTHONPATH": str(tree)},
                capture_output=True,
                text=True,
                check=True,
            )
            result = json.loads(done.stdout.splitlines()[-1])
            if Path(result["code"]) != tree:
                sys.exit(f"{tree}: ran the code in {result['code']}")
            figures[tree].append(result["client_us_per_message"])
            print(json.dumps(result), flush=True)
    for tree, values in figures.items():
        median = statistics.median(values)
        print(
            f"{tree}: median {median:.2f} µs a message over {len(values)} runs (batch {args.batch})"
        )


if __name__ == "__main__":
    main()

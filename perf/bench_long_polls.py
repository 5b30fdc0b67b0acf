"""What waiting long polls cost a producer: produce latency (ack=flushed, batch 1) on a
partition with and without thousands of long polls waiting on it, the code of several git
revisions alternating in one run.

    flock /tmp/bench.lock .venv/bin/python -m perf.bench_long_polls REV [REV ...]
        [--waiters 5000] [--messages 2000] [--repeat 3]

Each REV (as in perf/compare.py, whose `export` this uses: a commit, or "." for the working
tree) runs, `--repeat` times and in turn with 0 and with `--waiters` long polls, in a process
of its own against a private pylogd of that revision (perf/pylog_runs.py's PrivatePylogd, its
defaults: fsync on). The long polls are FETCHes at offset 0 for 1 GiB with a 10-minute
max_wait_ms, sent from one DEALER socket on 127.0.0.1; an OFFSETS request sent after them on
that socket is answered once the worker has served them all, so every one is waiting before
the first produce. Then one Connection sends `--messages` single-message PRODUCE requests with
ack=flushed, one at a time (after 100 not counted), each timed from send to ack; every ack
needs a flush, and that flush woke every waiting long poll before issue 12. The run checks
that no long poll was answered meanwhile. Prints one JSON line per run and the medians per
revision and waiter count. Run it alone: on 2 cores anything beside it skews the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import zmq

ROOT = Path(__file__).resolve().parent.parent
WARM_UP = 100


def run_one(waiters: int, messages: int) -> dict[str, Any]:
    """One run, in this process, with the code found first on sys.path (the tree's)."""
    import broker
    from broker import protocol
    from broker.client import Connection
    from broker.log import encode_message
    from broker.protocol import Ack, Api
    from perf.latency import latency_summary
    from perf.pylog_runs import PrivatePylogd, fresh_topic

    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.SNDHWM, 0)
    dealer.setsockopt(zmq.RCVHWM, 0)
    with (
        tempfile.TemporaryDirectory() as data,
        PrivatePylogd(Path(data)) as pylogd,
        fresh_topic(pylogd.endpoint, "longpolls") as topic,
        Connection(pylogd.endpoint) as producer,
    ):
        dealer.connect(pylogd.endpoint)
        for i in range(waiters):
            header = protocol.RequestHeader(Api.FETCH, 1, i, "bench")
            fetch = protocol.FetchRequest(topic, 0, 0, 1 << 20, 600_000, 1 << 30)
            dealer.send_multipart([b"", *protocol.encode_request(header, fetch)])
        header = protocol.RequestHeader(Api.OFFSETS, 1, waiters, "bench")
        offsets = protocol.OffsetsRequest(topic, 0, protocol.LATEST)
        dealer.send_multipart([b"", *protocol.encode_request(header, offsets)])
        if not dealer.poll(60_000):
            raise TimeoutError("the long polls were not all served within 60 s")
        answered = protocol.decode_reply_header(dealer.recv_multipart()[1:]).correlation_id
        if answered != waiters:
            raise RuntimeError(f"long poll {answered} was answered at once")

        request = protocol.ProduceRequest(topic, 0, Ack.FLUSHED, encode_message(b"x" * 174))
        delays_ms = []
        for i in range(WARM_UP + messages):
            started = time.perf_counter()
            producer.request(request)
            if i >= WARM_UP:
                delays_ms.append((time.perf_counter() - started) * 1000)
        if dealer.poll(0):
            raise RuntimeError("a long poll was answered before its 1 GiB or its 10 minutes")
    dealer.close()
    context.term()
    result = {"waiters": waiters, **latency_summary(delays_ms, messages)}
    result["code"] = str(Path(broker.__file__).parent.parent)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("revisions", nargs="*")
    parser.add_argument("--waiters", type=int, default=5_000)
    parser.add_argument("--messages", type=int, default=2_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--run", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        print(json.dumps(run_one(args.waiters, args.messages)))
        return
    if not args.revisions:
        parser.error("name at least one revision")
    from perf.compare import export, run_in_tree

    figures: dict[tuple[str, int], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as work:
        trees = {r: export(r, Path(work) / f"tree{i}") for i, r in enumerate(args.revisions)}
        for _ in range(args.repeat):
            for waiters in (0, args.waiters):
                for revision, tree in trees.items():
                    flags = [f"--waiters={waiters}", f"--messages={args.messages}"]
                    result = run_in_tree(revision, tree, __file__, flags)
                    figures.setdefault((revision, waiters), []).append(result)
                    print(json.dumps({"revision": revision, **result}), flush=True)
    for (revision, waiters), runs in figures.items():
        p50 = statistics.median(r["p50_ms"] for r in runs)
        p99 = statistics.median(r["p99_ms"] for r in runs)
        print(
            f"{revision}: {waiters} long polls waiting: produce ack=flushed batch 1 "
            f"p50 {p50:.2f} ms, p99 {p99:.2f} ms (medians of {len(runs)} runs)"
        )


if __name__ == "__main__":
    main()

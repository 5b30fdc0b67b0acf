"""pylogd's own memory under the loads that used to grow it: the code of several git revisions
in one run.

    flock /tmp/bench.lock .venv/bin/python -m perf.bench_memory REV [REV ...]
        [--gigabytes 2] [--readers 100] [--long-polls 5000]

Each REV (as in perf/compare.py: a commit, or "." for the working tree) runs, in a process of
its own, against a private pylogd of that revision (perf/pylog_runs.py's PrivatePylogd, its
defaults) through these phases, one after the other, with the clients of phases 3 and 4 left
connected to the end:

1. the paper's producer at batch 1, ack none (`--batch1-messages` 200-byte messages);
2. the paper's producer at batch 50, ack none (`--batch50-messages`);
3. `--readers` clients that never read their replies, each sending two 16 MiB FETCHes at
   offset 0 of the topic of phase 2 (a DEALER whose receive queue holds one message, with a
   64 KiB socket buffer: what a stuck client in any language looks like to the broker);
   then `--hold-s` seconds for the broker to do whatever it does with the replies;
4. `--long-polls` FETCHes waiting at the high watermark (10-minute max_wait_ms), all from one
   DEALER; an OFFSETS request sent after them is answered once the worker holds them all;
5. `--gigabytes` of 200-byte messages produced (batch 50, ack none) and read back (checksums
   verified), while everything above is still waiting.

Every 0.2 s a thread samples pylogd's own memory: the anonymous RSS (RssAnon, heap and stacks,
not the page cache its mmap reads touch) of the supervisor and all workers (the private
ZooKeeper's JVM is not counted). Prints one JSON line per run (MiB at start, the highest in
each phase, the highest and lowest after start, and at the end, with every client above still
connected) and a summary line per revision. Run it
alone: on 2 cores anything beside it skews the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import zmq

FETCH_BYTES = 16 << 20
MIB = 1 << 20


def _java_pids(pids: list[int]) -> list[int]:
    """The private ZooKeeper's JVM among pylogd's processes."""
    java = []
    for pid in pids:
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/comm").read_text().strip() == "java":
                java.append(pid)
    return java


def _stuck_client(context: zmq.Context[zmq.Socket[bytes]], endpoint: str) -> zmq.Socket[bytes]:
    """A DEALER that takes one reply off the wire and then stops reading."""
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.RCVHWM, 1)
    dealer.setsockopt(zmq.RCVBUF, 64 << 10)
    dealer.connect(endpoint)
    return dealer


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    """One run, in this process, with the code found first on sys.path (the tree's)."""
    import broker
    from broker import protocol
    from broker.protocol import LATEST, Ack, Api
    from perf.cpu import anonymous_rss_bytes
    from perf.pylog_runs import PrivatePylogd, consume, fresh_topic, produce

    samples: dict[str, list[int]] = {}
    supervisor: list[int] = []
    phase = ["start"]
    stop = threading.Event()
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sockets: list[zmq.Socket[bytes]] = []

    with tempfile.TemporaryDirectory() as data, PrivatePylogd(Path(data)) as pylogd:
        root, *children = pylogd.pids()
        java = _java_pids(children)
        workers = [pid for pid in children if pid not in java]

        def sample() -> None:
            # anonymous_rss_bytes counts a process with its descendants: pylogd's tree, less
            # the JVM; the supervisor alone, less its workers too.
            own = anonymous_rss_bytes([root]) - anonymous_rss_bytes(java)
            samples.setdefault(phase[0], []).append(own)
            supervisor.append(own - anonymous_rss_bytes(workers))

        def sampling() -> None:
            while not stop.wait(0.2):
                sample()

        def next_phase(name: str) -> None:
            sample()  # the last figure of the phase ending (a short one may have no other)
            phase[0] = name

        sample()
        sampler = threading.Thread(target=sampling, daemon=True)
        sampler.start()
        try:
            with (
                fresh_topic(pylogd.endpoint, "batch1") as batch1,
                fresh_topic(pylogd.endpoint, "batch50") as batch50,
                fresh_topic(pylogd.endpoint, "flow") as flow,
            ):
                next_phase("batch1")
                produce(pylogd, batch1, args.batch1_messages, 1, Ack.NONE)
                next_phase("batch50")
                produce(pylogd, batch50, args.batch50_messages, 50, Ack.NONE)

                next_phase("stuck_readers")
                for r in range(args.readers):
                    dealer = _stuck_client(context, pylogd.endpoint)
                    sockets.append(dealer)
                    for i in range(2):
                        header = protocol.RequestHeader(Api.FETCH, 1, i, f"stuck-{r}")
                        fetch = protocol.FetchRequest(batch50, 0, 0, FETCH_BYTES, 0, 0)
                        dealer.send_multipart([b"", *protocol.encode_request(header, fetch)])
                time.sleep(args.hold_s)  # nothing to wait on: the clients never read

                next_phase("long_polls")
                waiting = context.socket(zmq.DEALER)
                waiting.setsockopt(zmq.LINGER, 0)
                waiting.setsockopt(zmq.SNDHWM, 0)
                waiting.setsockopt(zmq.RCVHWM, 0)
                waiting.connect(pylogd.endpoint)
                sockets.append(waiting)
                high_watermark = args.batch50_messages * 200
                for i in range(args.long_polls):
                    header = protocol.RequestHeader(Api.FETCH, 1, i, "bench")
                    fetch = protocol.FetchRequest(
                        batch50, 0, high_watermark, 1 << 20, 600_000, 1 << 30
                    )
                    waiting.send_multipart([b"", *protocol.encode_request(header, fetch)])
                header = protocol.RequestHeader(Api.OFFSETS, 1, args.long_polls, "bench")
                offsets = protocol.OffsetsRequest(batch50, 0, LATEST)
                waiting.send_multipart([b"", *protocol.encode_request(header, offsets)])
                if not waiting.poll(120_000):
                    raise TimeoutError("the long polls were not all taken within 120 s")
                reply = protocol.decode_reply_header(waiting.recv_multipart()[1:])
                if reply.correlation_id != args.long_polls:
                    raise RuntimeError(f"long poll {reply.correlation_id} was answered at once")

                next_phase("flow")
                messages = int(args.gigabytes * 1e9 / 200)
                produced = produce(pylogd, flow, messages, 50, Ack.NONE, limit_s=1800)
                consumed = consume(pylogd, flow, messages)
                sample()
        finally:
            stop.set()
            sampler.join()
            for dealer in sockets:
                dealer.close()
            context.term()
    start = samples.pop("start")
    after = [value for values in samples.values() for value in values]
    result: dict[str, Any] = {
        "start_mib": round(start[0] / MIB, 1),
        **{f"{name}_max_mib": round(max(values) / MIB, 1) for name, values in samples.items()},
        "max_mib": round(max(after) / MIB, 1),
        "min_mib": round(min(after) / MIB, 1),
        "end_mib": round(after[-1] / MIB, 1),
        "supervisor_max_mib": round(max(supervisor) / MIB, 1),
        "flow_produce_msgs_per_s": round(messages / produced["seconds"]),
        "flow_consume_msgs_per_s": round(messages / consumed["seconds"]),
        "code": str(Path(broker.__file__).parent.parent),
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("revisions", nargs="*")
    parser.add_argument("--gigabytes", type=float, default=2.0)
    parser.add_argument("--readers", type=int, default=100)
    parser.add_argument("--long-polls", type=int, default=5_000)
    parser.add_argument("--batch1-messages", type=int, default=1_000_000)
    parser.add_argument("--batch50-messages", type=int, default=2_000_000)
    parser.add_argument("--hold-s", type=float, default=10.0)
    parser.add_argument("--run", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:  # in a revision's tree, whose perf/ may predate perf.compare's helpers
        print(json.dumps(run_one(args)))
        return
    if not args.revisions:
        parser.error("name at least one revision")
    from perf.compare import each_revision

    options = ("gigabytes", "readers", "long_polls", "batch1_messages", "batch50_messages")
    for revision, result in each_revision(args.revisions, __file__, args, *options, "hold_s"):
        print(
            f"{revision}: pylogd's own memory {result['start_mib']} MiB at start, "
            f"{result['min_mib']}-{result['max_mib']} MiB through every phase, "
            f"{result['end_mib']} MiB at the end",
            flush=True,
        )


if __name__ == "__main__":
    main()

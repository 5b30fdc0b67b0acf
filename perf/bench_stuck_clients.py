"""Clients that never read their replies, against the broker's one memory ceiling: the code of
several git revisions in one run.

    flock /tmp/bench.lock .venv/bin/python -m perf.bench_stuck_clients REV [REV ...]
        [--clients 20] [--fetches 500] [--hold-s 10] [--after-s 10]

Each REV (as in perf/compare.py: a commit, or "." for the working tree) runs, in a process of
its own, against a private pylogd of that revision with its defaults (perf/pylog_runs.py's
PrivatePylogd). 32 MiB of 64 KiB messages go into one partition; pylogd's memory then is
"idle". Then `--clients` clients that never read (a DEALER whose receive queue holds one
message, with a 64 KiB socket buffer: a stuck client in any language) each pipeline
`--fetches` FETCHes of 16 MiB at offset 0; for `--hold-s` seconds, while they stay connected,
another client fetches 1 MiB at a time (how many it got, and its slowest). Then the stuck
clients hang up, and `--after-s` seconds later the memory is read again.

Memory is pylogd's own: the anonymous RSS (heap and stacks, not the page cache its mmap reads
touch) of the supervisor and its workers, not the private ZooKeeper's JVM, sampled every
0.2 s. A run whose memory passes `--abort-mib` stops its stuck clients there (old code could
take the machine's memory). Prints one JSON line per revision and a summary line. Run it alone:
on 2 cores anything beside it skews the figures.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import zmq

from perf.bench_memory import _java_pids, _stuck_client

FETCH_BYTES = 16 << 20
MIB = 1 << 20
FILL_MIB = 32


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    """One run, in this process, with the code found first on sys.path (the tree's)."""
    import broker
    from broker import protocol
    from broker.client import Admin
    from broker.client.connection import Connection
    from broker.errors import BrokerError, Unavailable
    from broker.log import encode_message
    from broker.protocol import Ack, Api, FetchRequest, ProduceRequest
    from perf.cpu import anonymous_rss_bytes
    from perf.pylog_runs import PrivatePylogd

    samples: list[int] = []
    stop = threading.Event()
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    stuck: list[zmq.Socket[bytes]] = []
    with tempfile.TemporaryDirectory() as data, PrivatePylogd(Path(data)) as pylogd:
        root, *children = pylogd.pids()
        java = _java_pids(children)

        def own() -> int:
            return anonymous_rss_bytes([root]) - anonymous_rss_bytes(java)

        def sampling() -> None:
            while not stop.wait(0.2):
                samples.append(own())

        with Admin(pylogd.endpoint) as admin:
            admin.create_topic("big", 1)
        message = encode_message(b"m" * (64 * 1024 - 64))
        with Connection(pylogd.endpoint, timeout_s=30.0) as connection:
            for _ in range(FILL_MIB):
                connection.request(ProduceRequest("big", 0, Ack.FLUSHED, message * 16))
        idle = own()
        sampler = threading.Thread(target=sampling, daemon=True)
        sampler.start()
        served = refused = timeouts = 0
        slowest = 0.0
        aborted = False
        try:
            fetch = FetchRequest("big", 0, 0, FETCH_BYTES, 0, 0)
            for c in range(args.clients):
                dealer = _stuck_client(context, pylogd.endpoint)
                stuck.append(dealer)
                for i in range(args.fetches):
                    header = protocol.RequestHeader(Api.FETCH, 1, i, f"stuck-{c}")
                    dealer.send_multipart([b"", *protocol.encode_request(header, fetch)])
            with Connection(pylogd.endpoint, timeout_s=10.0) as other:
                end = time.monotonic() + args.hold_s
                while time.monotonic() < end:
                    if samples and samples[-1] > args.abort_mib * MIB:
                        aborted = True
                        break
                    start = time.monotonic()
                    try:
                        other.request(FetchRequest("big", 0, 0, MIB, 0, 0))
                        served += 1
                    except BrokerError:  # answered with an error
                        refused += 1
                    except Unavailable:  # no reply within the connection's 10 s
                        timeouts += 1
                    slowest = max(slowest, time.monotonic() - start)
            most = max(samples, default=idle)
        finally:
            for dealer in stuck:
                dealer.close()
        time.sleep(args.after_s)  # nothing to wait on: the figure is the memory after this long
        stop.set()
        sampler.join()
        after = own()
    context.term()
    return {
        "idle_mib": round(idle / MIB, 1),
        "stuck_max_mib": round(most / MIB, 1),
        "after_mib": round(after / MIB, 1),
        "after_over_idle_mib": round((after - idle) / MIB, 1),
        "aborted": aborted,
        "other_fetches": served,
        "other_refused": refused,
        "other_timeouts": timeouts,
        "other_slowest_s": round(slowest, 3),
        "code": str(Path(broker.__file__).parent.parent),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("revisions", nargs="*")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--fetches", type=int, default=500)
    parser.add_argument("--hold-s", type=float, default=10.0)
    parser.add_argument("--after-s", type=float, default=10.0)
    parser.add_argument("--abort-mib", type=int, default=8192)
    parser.add_argument("--run", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:  # in a revision's tree, whose perf/ may predate perf.compare's helpers
        print(json.dumps(run_one(args)))
        return
    if not args.revisions:
        parser.error("name at least one revision")
    from perf.compare import each_revision

    options = ("clients", "fetches", "hold_s", "after_s", "abort_mib")
    for revision, result in each_revision(args.revisions, __file__, args, *options):
        print(
            f"{revision}: pylogd's own memory {result['idle_mib']} MiB idle, at most "
            f"{result['stuck_max_mib']} MiB with {args.clients} stuck clients, "
            f"{result['after_mib']} MiB {args.after_s:g} s after they left; another client "
            f"got {result['other_fetches']} fetches (slowest {result['other_slowest_s']} s)",
            flush=True,
        )


if __name__ == "__main__":
    main()

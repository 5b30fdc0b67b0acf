"""A regression guard for the hot paths, in a few minutes: a revision against the working tree.

    scripts/perf --guard REV [--repeat 2] [--seconds 3] [--consume-messages 1000000]

REV (a commit, as in perf/compare.py) and the working tree run in turn, `--repeat` times each,
every run in a process of its own whose code (broker, client and perf/) is that revision's,
against a private pylogd of the same code with its defaults. A run measures, one after the other,
each in a fresh topic of one partition:

- produce_b1, produce_b50: 200-byte messages in batches of 1 and of 50, ack none, sent for
  `--seconds`; the run ends once the broker has flushed every one of them. It does not wait for
  the flush timer (flush.interval.ms, 1 s): ack=flushed produces of one message are sent after
  them until the partition holds them all, each one's flush taking what has come before it.
- produce_b1_flushed, produce_b50_flushed: the same at ack=flushed, 100 batches in flight; the
  run ends with the last ack.
- consume: `--consume-messages` messages stored first (not timed), then read back with fetches
  of ~1,000 messages, every checksum verified (perf/pylog_runs.py's consume).

Prints each run as a JSON line, then per figure the medians of both, the ratio working tree /
REV and "SLOWER" where it is below 0.9; exits 1 if any is. Run it alone: on 2 cores anything
beside it skews the figures, and only ratios from one run count.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

FIGURES = ("produce_b1", "produce_b50", "produce_b1_flushed", "produce_b50_flushed", "consume")
SLOWER_BELOW = 0.9
DRAIN_LIMIT_S = 60.0


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    """One run of every figure, in this process, with the code found first on sys.path (the
    tree's)."""
    import broker
    from broker.client import Connection, Producer
    from broker.log import encode_message
    from broker.protocol import LATEST, Ack, OffsetsRequest, ProduceRequest
    from perf.pylog_runs import MESSAGE_BYTES, VALUE_BYTES, PrivatePylogd, consume, fresh_topic

    value = b"x" * VALUE_BYTES

    def sustained(pylogd: PrivatePylogd, topic: str, batch: int, ack: Ack) -> float:
        """Messages a second, sent for args.seconds, until the broker has flushed them all."""
        in_flight = 100 if ack == Ack.FLUSHED else 5  # the Producer's default
        with (
            Producer(
                pylogd.endpoint,
                topic,
                ack=ack,
                batch_messages=batch,
                linger_ms=60_000,
                max_in_flight=in_flight,
            ) as producer,
            Connection(pylogd.endpoint) as watcher,
        ):
            start = time.perf_counter()
            end = start + args.seconds
            sent = 0
            while True:
                for _ in range(1000):
                    producer.send(value, partition=0)
                sent += 1000
                if time.perf_counter() >= end:
                    break
            producer.flush()
            held_bytes = sent * MESSAGE_BYTES
            marker = encode_message(b"")
            deadline = time.monotonic() + DRAIN_LIMIT_S
            while watcher.request(OffsetsRequest(topic, 0, LATEST)).offset < held_bytes:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the broker did not flush {sent} messages")
                watcher.request(ProduceRequest(topic, 0, Ack.FLUSHED, marker))
                held_bytes += len(marker)
            return sent / (time.perf_counter() - start)

    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as data, PrivatePylogd(Path(data)) as pylogd:
        for figure, batch, ack in (
            ("produce_b1", 1, Ack.NONE),
            ("produce_b50", 50, Ack.NONE),
            ("produce_b1_flushed", 1, Ack.FLUSHED),
            ("produce_b50_flushed", 50, Ack.FLUSHED),
        ):
            with fresh_topic(pylogd.endpoint, figure) as topic:
                result[figure] = round(sustained(pylogd, topic, batch, ack))
        with fresh_topic(pylogd.endpoint, "consume") as topic:
            with Producer(pylogd.endpoint, topic, batch_messages=50, linger_ms=60_000) as out:
                for _ in range(args.consume_messages):
                    out.send(value, partition=0)
            read = consume(pylogd, topic, args.consume_messages)
            result["consume"] = round(read["messages"] / read["seconds"])
    result["code"] = str(Path(broker.__file__).parent.parent)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("revision", nargs="?")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--consume-messages", type=int, default=1_000_000)
    parser.add_argument("--run", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:  # in a revision's tree, whose perf/ may predate perf.compare's helpers
        print(json.dumps(run_one(args)))
        return
    if args.revision is None:
        parser.error("name the revision to compare the working tree with")
    from perf.compare import export, run_in_tree

    flags = [f"--seconds={args.seconds}", f"--consume-messages={args.consume_messages}"]
    runs: dict[str, list[dict[str, Any]]] = {args.revision: [], ".": []}
    with tempfile.TemporaryDirectory() as work:
        trees = {r: export(r, Path(work) / f"tree{i}") for i, r in enumerate(runs)}
        for _ in range(args.repeat):
            for revision, tree in trees.items():
                result = run_in_tree(revision, tree, __file__, flags)
                print(json.dumps({"revision": revision, **result}), flush=True)
                runs[revision].append(result)
    table, slower = verdict(args.revision, runs[args.revision], runs["."])
    print(table)
    if slower:
        sys.exit(f"slower than {args.revision} (below {SLOWER_BELOW}): {', '.join(slower)}")


def verdict(
    revision: str, base: list[dict[str, Any]], head: list[dict[str, Any]]
) -> tuple[str, list[str]]:
    """The table of each figure's medians (`revision`'s runs `base`, the working tree's
    `head`) and ratio, and the figures below SLOWER_BELOW."""
    lines = [f"{'figure':<20} {revision:>12} {'.':>12}  ratio"]
    slower = []
    for figure in FIGURES:
        before = statistics.median(run[figure] for run in base)
        after = statistics.median(run[figure] for run in head)
        ratio = after / before
        mark = "  SLOWER" if ratio < SLOWER_BELOW else ""
        lines.append(f"{figure:<20} {before:>12,.0f} {after:>12,.0f}  {ratio:.2f}{mark}")
        if mark:
            slower.append(figure)
    return "\n".join(lines), slower


if __name__ == "__main__":
    main()

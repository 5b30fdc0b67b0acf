"""The cost of quotas (issue 30): the broker's CPU a request with quotas on and off, in one run.

    flock /tmp/bench.lock .venv/bin/python -m perf.bench_quotas [--repeat 3]
        [--batch1-messages 200000] [--batch50-messages 1000000] [--consume-messages 1000000]
        [--admits 1000000]

Two private pylogd (perf/pylog_runs.py's PrivatePylogd: default settings, a private ZooKeeper
each, metrics on), both running for the whole run:

- off: no quota set (the front skips the quotas altogether);
- on: a default quota for every client id of 1 TiB/s each way, set in its ZooKeeper: every
  PRODUCE and every consumer FETCH is counted to its client (the client id read from the
  request, its buckets looked up and charged, each FETCH reply's bytes counted on its way out),
  and none is ever held back, so that on against off is the bookkeeping's cost alone.

The experiments and their figures are perf/bench_security.py's (the paper's producer at batch 1
and batch 50, ack none, and the consumer; `--repeat` rounds of the two systems in turn, each on
a fresh topic; the supervisor's CPU a request its front read). Then, in this process, what
Throttle.admit costs a PRODUCE (ns a call, best of 5 rounds of `--admits`, an empty loop's
cost taken off).

Prints one JSON line a run, one of admit's figures, then one of medians and the ratios on/off.
Run it alone: on 2 cores anything beside it skews the figures.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Final

from broker.quotas import DEFAULT, MAX_RATE, Direction, Kind, Quota, QuotaConfig, Throttle
from broker.registry import Registry
from perf.bench_security import (
    METRICS,
    Bench,
    Result,
    System,
    broker_log,
    free_port,
    ns_per_call,
    summarize,
    wait_for,
)
from perf.pylog_runs import PrivatePylogd

EVERYONE: Final = Quota(MAX_RATE, MAX_RATE)
"""The default quota of the `on` broker: never reached."""


def start_with_quotas(stack: ExitStack, work: Path) -> System:
    """A pylogd whose every client id has EVERYONE for its quota (in its private ZooKeeper,
    which a plaintext broker keeps open to anyone on 127.0.0.1)."""
    zookeeper_port = free_port()
    pylogd = stack.enter_context(
        PrivatePylogd(work / "on", "--zookeeper-port", str(zookeeper_port), *METRICS)
    )
    with Registry(f"127.0.0.1:{zookeeper_port}", "/pylog") as registry:
        registry.quotas.set(Kind.CLIENT, DEFAULT, EVERYONE)
    wait_for(lambda: f"client {DEFAULT} produce {MAX_RATE}" in broker_log(pylogd), "the quota")
    return System("on", pylogd)


def admit_cost(count: int) -> Result:
    """Throttle.admit of a PRODUCE of a client under a quota it never reaches, in ns a call."""
    throttle = Throttle(64, 8 << 20)
    throttle.update(QuotaConfig({Kind.CLIENT: {DEFAULT: EVERYONE}}))
    client, tagged = (Kind.CLIENT, "bench"), b"R\x00\x00\x00\x01"
    admit = throttle.admit

    def empty(times: range) -> None:
        for _ in times:
            pass

    def admits(times: range) -> None:
        for _ in times:
            admit(tagged, client, Direction.PRODUCE, 10_000, None)

    loop_ns = ns_per_call(empty, count)
    return {"admits": count, "admit_ns": round(ns_per_call(admits, count) - loop_ns)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--batch1-messages", type=int, default=200_000)
    parser.add_argument("--batch50-messages", type=int, default=1_000_000)
    parser.add_argument("--consume-messages", type=int, default=1_000_000)
    parser.add_argument("--admits", type=int, default=1_000_000)
    args = parser.parse_args()
    counts = (args.batch1_messages, args.batch50_messages, args.consume_messages, args.admits)
    if min(args.repeat, *counts) < 1:
        parser.error("every count must be 1 or more")
    started = time.monotonic()
    bench = Bench(args)
    with tempfile.TemporaryDirectory(prefix="pylog-quotas-", dir="/tmp") as tmp:
        work = Path(tmp)
        with ExitStack() as stack:
            off = System("off", stack.enter_context(PrivatePylogd(work / "off", *METRICS)))
            bench.alternate([off, start_with_quotas(stack, work)])
    print(json.dumps({"admit": admit_cost(args.admits)}))
    summary = summarize(bench.results)
    for figures in summary.values():
        on, off_ = figures["on"], figures["off"]
        figures["on/off"] = round(on["msgs_per_s"] / off_["msgs_per_s"], 3)
        figures["front_cpu_on/off"] = round(
            on["front_us_per_request"] / off_["front_us_per_request"], 3
        )
    print(json.dumps({"summary": summary, "done_in_s": round(time.monotonic() - started, 1)}))


if __name__ == "__main__":
    main()

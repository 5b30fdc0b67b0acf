"""Replication (issue 17): the paper's producer at replication factor 1, 2 and 3 on one cluster,
and the time a partition takes to accept ack=all writes again after its leader is killed.

    flock /tmp/bench.lock .venv/bin/python -m perf.bench_replication [--messages 20000]
        [--repeat 1] [--kills 10] [--session-timeout-ms 6000] [--tick-time-ms 2000]

One cluster of three pylogd on 127.0.0.1 under a temporary folder, for the whole run: broker 1
runs the private ZooKeeper on a fixed free port (`--zookeeper-port`), brokers 2 and 3 connect to
it (`--zookeeper-connect`), as README.md's two-broker section does; every broker otherwise has
pylogd's defaults (one worker, flush every 1,000 ms or 10,000 messages, fsync on), a fixed
client port (so a restarted broker comes back at the same address), `--session-timeout-ms`
(every broker's ZooKeeper session) and `--tick-time-ms` (the ZooKeeper's tickTime).

1. **The producer** (perf/pylog_runs.py's `produce`, as `scripts/perf` runs it): `--messages`
   messages of 200 bytes built in the timed loop, at batch 1 and batch 50, with ack none (the
   paper's: the run ends when the high watermark, which counts only bytes every in-sync replica
   flushed, holds them all) and ack=all (the run ends with the last ack; 100 batches awaiting
   acks, as the harness's acked runs). Each run gets a fresh topic of one partition (led by
   broker 1, its first replica) with replication factor 1, 2 or 3 and min_insync_replicas 1;
   each (ack, batch) runs `--repeat` rounds of the factors in turn, so one run gives them all.
   A run's brokers' CPU is that of all three process trees (supervisors, workers and the
   ZooKeeper), read from /proc (perf/cpu.py) around the timed part.
2. **Failover.** A topic of two partitions at replication factor 3, min_insync_replicas 2:
   partition 1's replicas are brokers 2, 3, 1, so its leader is 2 or 3 as long as both are in
   its ISR, which each round waits for: broker 1, which holds ZooKeeper (and, being started
   first, the controller), is never killed. A producer thread sends one message at a time at
   ack=all to partition 1's leader, each message a distinct value (at most `FAILOVER_MESSAGES`
   and for a bounded time). After an error answered (NOT_LEADER_FOR_PARTITION, ...) it waits
   10 ms, asks ZooKeeper who leads and sends the same value there; after no reply within
   `REQUEST_TIMEOUT_S` it reads the partition's state every 5 ms until it changes from the one
   that named that leader (another leader, or the ISR an ack=all waited on; for at most two
   session timeouts) and sends the same value there (at least once:
   duplicates are possible, losses are not). Each of `--kills` rounds kills the leader's
   pylogd with SIGKILL (its whole process tree: supervisor and workers), measures the time
   from the kill to the first ack=all answered by another broker (and to ZooKeeper naming
   another leader, polled every 5 ms), restarts the killed broker on its data and waits for
   it to rejoin the ISR (each kill's line names the controller of the moment). At the end
   every stored message of the partition is read back from its leader: every acked value must
   be there (`lost` counts those missing) and `duplicates` counts extra copies.

The failover time is bounded below by the ZooKeeper session timeout: the controller learns of a
killed broker only when its session expires (on a tick boundary: up to a tickTime later).

Prints a JSON line a producer run and one a kill (with the producer's errors between the kill
and the first ack), then a summary line (medians; main() returns it too). Run it alone: on 2
cores anything beside it skews the figures; perf/README.md ("Replication") has a run's figures.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from broker.client import Admin, Connection, PartitionConsumer
from broker.errors import BrokerError, Unavailable
from broker.log.message import encode_message
from broker.protocol import Ack, ProduceRequest
from broker.registry import NO_LEADER, PartitionState, Registry
from broker.zookeeper import free_port
from perf.cpu import cpu_seconds
from perf.pylog_runs import VALUE_BYTES, PrivatePylogd, produce

Result = dict[str, Any]
BROKERS = (1, 2, 3)
FACTORS = (1, 2, 3)
BATCHES = (1, 50)
ACKS = (Ack.NONE, Ack.ALL)
ACKED_IN_FLIGHT = 100
"""Batches awaiting acks in the ack=all runs, as scripts/perf's acked runs."""
CHROOT = "/pylog"
"""pylogd's default chroot: brokers 2 and 3 share broker 1's."""
FAILOVER_TOPIC = "failover"
FAILOVER_PARTITION = 1
"""Replicas 2, 3, 1 (docs/replication.md, "Placement"): never led by broker 1."""
FAILOVER_MESSAGES = 10_000_000
REQUEST_TIMEOUT_S = 1.0
"""A produce with no reply within this is taken as sent to a dead broker (the thread then
asks ZooKeeper who leads); well above an ack=all's time on a live cluster."""
WAIT_S = 120.0
"""The bound of every wait for a condition (a broker starting, the ISR growing, a leader)."""


def wait_for(condition: Callable[[], bool], what: str, limit_s: float = WAIT_S) -> float:
    """Poll `condition` every 5 ms until true; the time.monotonic() it was seen true."""
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {limit_s} s")
        time.sleep(0.005)
    return time.monotonic()


def ended(pid: int) -> bool:
    """Whether process `pid` is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat[stat.rindex(")") + 2 :].startswith("Z")


class BenchCluster:
    """Brokers 1, 2 and 3 under `root`; broker 1 runs the private ZooKeeper."""

    def __init__(self, root: Path, session_timeout_ms: int, tick_time_ms: int) -> None:
        self.root = root
        self.zookeeper_port = free_port()
        self.zookeeper = f"127.0.0.1:{self.zookeeper_port}"
        self.ports = {b: free_port() for b in BROKERS}
        self.session = ("--zookeeper-session-timeout-ms", str(session_timeout_ms))
        self.tick = ("--zookeeper-tick-time-ms", str(tick_time_ms))
        self.brokers: dict[int, PrivatePylogd] = {}

    def _flags(self, broker_id: int) -> tuple[str, ...]:
        zookeeper = (
            ("--zookeeper-port", str(self.zookeeper_port), *self.tick)
            if broker_id == 1
            else ("--zookeeper-connect", self.zookeeper)
        )
        port = ("--broker-port", str(self.ports[broker_id]))  # after PrivatePylogd's port 0
        return ("--broker-id", str(broker_id), *port, *zookeeper, *self.session)

    def start(self, broker_id: int) -> PrivatePylogd:
        pylogd = PrivatePylogd(self.root / f"broker-{broker_id}", *self._flags(broker_id))
        self.brokers[broker_id] = pylogd.__enter__()
        return pylogd

    def endpoint(self, broker_id: int) -> str:
        return f"tcp://127.0.0.1:{self.ports[broker_id]}"

    def pids(self) -> list[int]:
        return [pid for pylogd in self.brokers.values() for pid in pylogd.pids()]

    def kill(self, broker_id: int) -> float:
        """SIGKILL to the broker's whole process tree; the time.monotonic() of the kill."""
        pylogd = self.brokers.pop(broker_id)
        assert pylogd.process is not None
        pids = pylogd.pids()
        killed = time.monotonic()
        for pid in pids:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        pylogd.process.wait()
        for pid in pids[1:]:  # the workers, reparented (a zombie until reaped is gone too)
            wait_for(partial(ended, pid), f"process {pid} to end")
        return killed

    def stop(self) -> None:
        for broker_id in sorted(self.brokers, reverse=True):  # broker 1 (ZooKeeper) last
            self.brokers.pop(broker_id).__exit__()


@contextmanager
def running_cluster(
    root: Path, session_timeout_ms: int, tick_time_ms: int
) -> Iterator[BenchCluster]:
    """Brokers 1, 2 and 3 started (and registered); all stopped (SIGTERM) at the end."""
    cluster = BenchCluster(root, session_timeout_ms, tick_time_ms)
    try:
        for broker_id in BROKERS:
            cluster.start(broker_id)
        with Admin(cluster.endpoint(1)) as admin:
            wait_for(lambda: len(admin.brokers()) == len(BROKERS), "all brokers to register")
        yield cluster
    finally:
        cluster.stop()


# -- 1. the producer at replication factor 1, 2 and 3 ----------------------------------------


def produce_run(
    cluster: BenchCluster, name: str, factor: int, batch: int, ack: Ack, messages: int
) -> Result:
    """One timed producer run on a fresh topic of replication factor `factor`."""
    config = {"replication_factor": str(factor), "min_insync_replicas": "1"}
    with Admin(cluster.endpoint(1)) as admin:
        admin.create_topic(name, 1, config)
        try:
            pids = cluster.pids()
            before = cpu_seconds(pids)
            in_flight = ACKED_IN_FLIGHT if ack is Ack.ALL else 5
            result = produce(
                cluster.brokers[1], name, messages, batch, ack, max_in_flight=in_flight
            )
            result["broker_cpu_s"] = cpu_seconds(pids) - before  # all three brokers
        finally:
            admin.delete_topic(name)
    return {
        "ack": ack.name.lower(),
        "batch": batch,
        "replication_factor": factor,
        "messages": result["messages"],
        "seconds": round(result["seconds"], 3),
        "msgs_per_s": round(result["messages"] / result["seconds"]),
        "client_us_per_message": round(result["client_cpu_s"] / result["messages"] * 1e6, 2),
        "broker_us_per_message": round(result["broker_cpu_s"] / result["messages"] * 1e6, 2),
    }


def producer_runs(cluster: BenchCluster, messages: int, repeat: int) -> list[Result]:
    """Every (ack, batch) `repeat` rounds, each round running replication factors 1, 2, 3."""
    results: list[Result] = []
    for ack in ACKS:
        for batch in BATCHES:
            for round_ in range(repeat):
                for factor in FACTORS:
                    name = f"rf{factor}-{ack.name.lower()}-b{batch}-{round_}"
                    line = produce_run(cluster, name, factor, batch, ack, messages)
                    print(json.dumps(line), flush=True)
                    results.append(line)
    return results


FIGURES = ("msgs_per_s", "client_us_per_message", "broker_us_per_message")


def summarize(results: list[Result]) -> list[Result]:
    """The medians of FIGURES per (ack, batch, replication factor), in the order first seen."""
    runs: dict[tuple[str, int, int], list[Result]] = {}
    for line in results:
        key = (line["ack"], line["batch"], line["replication_factor"])
        runs.setdefault(key, []).append(line)
    summary = []
    for (ack, batch, factor), lines in runs.items():
        medians = {name: statistics.median(line[name] for line in lines) for name in FIGURES}
        summary.append(
            {
                "ack": ack,
                "batch": batch,
                "replication_factor": factor,
                "runs": len(lines),
                "msgs_per_s": round(medians["msgs_per_s"]),
                "client_us_per_message": round(medians["client_us_per_message"], 2),
                "broker_us_per_message": round(medians["broker_us_per_message"], 2),
            }
        )
    return summary


# -- 2. failover -----------------------------------------------------------------------------


def value(index: int) -> bytes:
    return b"%012d" % index + b"f" * (VALUE_BYTES - 12)


@dataclass
class AckedProducer:
    """A thread sending `value(i)` for i = 0, 1, ... one at a time at ack=all to the leader of
    FAILOVER_PARTITION, until stopped, `limit` values are acked or `limit_s` passes; see the
    module docstring. `acks` holds (time.monotonic(), the answering broker, i) for each ack."""

    cluster: BenchCluster
    limit: int = FAILOVER_MESSAGES
    limit_s: float = 3600.0
    patience_s: float = 12.0
    acks: list[tuple[float, int, int]] = field(default_factory=list)
    errors: list[tuple[float, int, str]] = field(default_factory=list)
    """(time.monotonic(), the broker asked, the error's name) for each failed request."""
    failure: BaseException | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    named_by: PartitionState | None = None
    """The partition's state that named the leader last returned by _leader."""

    def start(self) -> None:
        self.thread = threading.Thread(target=self._guarded, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(WAIT_S)
        if self.failure is not None:
            raise RuntimeError("the producer thread failed") from self.failure

    def _guarded(self) -> None:
        try:
            self._run()
        except BaseException as error:  # raised again by close()
            self.failure = error

    def _leader(self, registry: Registry, unanswered: int | None) -> int | None:
        """Partition FAILOVER_PARTITION's leader as ZooKeeper names it (None if stopped).

        After no answer from `unanswered`, wait for ZooKeeper's state of the partition to
        change from the one that named it (another leader, or the ISR changed: the in-sync
        replica an ack=all waited for left it), up to `patience_s` (two session timeouts: a
        dead broker is replaced by then), so that no request waits on a dead broker while the
        new leader is known, and a live leader whose ack waited for a dead follower is asked
        again once ZooKeeper drops that follower; after patience the same broker is tried
        again (it was alive, only slow)."""
        patience = time.monotonic() + (self.patience_s if unanswered is not None else 0.0)
        named_by = self.named_by
        while not self.stop.is_set():
            state = registry.topics.partition_state(FAILOVER_TOPIC, FAILOVER_PARTITION)[0]
            leader = state.leader
            changed = named_by is None or state != named_by
            if leader > 0 and (leader != unanswered or changed or time.monotonic() > patience):
                self.named_by = state
                return leader
            time.sleep(0.005)
        return None

    def _run(self) -> None:
        connections: dict[int, Connection] = {}
        deadline = time.monotonic() + self.limit_s
        with Registry(self.cluster.zookeeper, CHROOT) as registry:
            try:
                leader = self._leader(registry, None)
                index = 0
                while leader is not None and index < self.limit and time.monotonic() < deadline:
                    if self.stop.is_set():
                        return
                    if leader not in connections:
                        connections[leader] = Connection(
                            self.cluster.endpoint(leader), timeout_s=REQUEST_TIMEOUT_S
                        )
                    request = ProduceRequest(
                        FAILOVER_TOPIC, FAILOVER_PARTITION, Ack.ALL, encode_message(value(index))
                    )
                    try:
                        connections[leader].call(request, retries=0)  # retried here
                    except BrokerError as error:  # answered: not (yet) the leader, ...
                        self.errors.append((time.monotonic(), leader, error.name))
                        time.sleep(0.01)
                        leader = self._leader(registry, None)
                        continue  # the same value goes again
                    except Unavailable:  # no answer in REQUEST_TIMEOUT_S
                        self.errors.append((time.monotonic(), leader, "no reply"))
                        leader = self._leader(registry, leader)
                        continue
                    self.acks.append((time.monotonic(), leader, index))
                    index += 1
            finally:
                for connection in connections.values():
                    connection.close()


def isr(registry: Registry) -> tuple[int, ...]:
    return tuple(sorted(registry.topics.partition_state(FAILOVER_TOPIC, FAILOVER_PARTITION)[0].isr))


def read_back(cluster: BenchCluster, registry: Registry) -> list[bytes]:
    """Every message of FAILOVER_PARTITION, read from its leader."""
    leader = registry.topics.partition_state(FAILOVER_TOPIC, FAILOVER_PARTITION)[0].leader
    with PartitionConsumer(
        cluster.endpoint(leader), FAILOVER_TOPIC, FAILOVER_PARTITION, stop_at_end=True
    ) as consumer:
        return [bytes(message.value) for message in consumer]


def leader_of(registry: Registry) -> int:
    return registry.topics.partition_state(FAILOVER_TOPIC, FAILOVER_PARTITION)[0].leader


def one_kill(cluster: BenchCluster, registry: Registry, producer: AckedProducer) -> Result:
    """Kill the leader once the producer is acked; time the first ack from another broker;
    restart the killed broker and wait until it is back in the ISR."""
    steady = len(producer.acks)  # the ISR is full: an ack from now on
    wait_for(lambda: len(producer.acks) > steady, "an ack before the kill")
    leader = leader_of(registry)
    if leader == 1:
        raise RuntimeError("broker 1 (ZooKeeper) leads the failover partition")
    controller = registry.controller.current()
    before = len(producer.acks)
    killed = cluster.kill(leader)
    elected = wait_for(lambda: leader_of(registry) not in (leader, NO_LEADER), "a new leader")

    def from_another() -> tuple[float, int, int] | None:
        return next((ack for ack in producer.acks[before:] if ack[1] != leader), None)

    wait_for(lambda: from_another() is not None, "an ack from a new leader")
    first = from_another()
    assert first is not None
    cluster.start(leader)
    rejoined = wait_for(lambda: isr(registry) == BROKERS, "the ISR to grow back")
    return {
        "killed": leader,
        "controller": controller.broker_id if controller is not None else None,
        "new_leader": first[1],
        "failover_ms": round((first[0] - killed) * 1000, 1),  # the ack's own time
        "elected_ms": round((elected - killed) * 1000, 1),  # seen in ZooKeeper (5 ms polls)
        "rejoined_isr_s": round(rejoined - killed, 2),
        "errors": [
            f"{(at - killed) * 1000:.0f} ms: broker {broker} {name}"
            for at, broker, name in producer.errors
            if killed <= at <= first[0]
        ],
        "acked": len(producer.acks),
    }


def failover_runs(cluster: BenchCluster, kills: int, limit_s: float, patience_s: float) -> Result:
    """`kills` rounds of one_kill on a fresh topic, then every message read back: losses
    (acked values not stored) and duplicates (values stored more than once) counted."""
    config = {"replication_factor": "3", "min_insync_replicas": "2"}
    with Admin(cluster.endpoint(1)) as admin:
        admin.create_topic(FAILOVER_TOPIC, 2, config)
    lines: list[Result] = []
    producer = AckedProducer(cluster, limit_s=limit_s, patience_s=patience_s)
    with Registry(cluster.zookeeper, CHROOT) as registry:
        wait_for(lambda: isr(registry) == BROKERS, "the ISR to hold all three")
        producer.start()
        try:
            for kill in range(kills):
                line = {"kill": kill + 1, **one_kill(cluster, registry, producer)}
                lines.append(line)
                print(json.dumps(line), flush=True)
        finally:
            producer.close()
        read = Counter(read_back(cluster, registry))
    acked = {value(i) for _, _, i in producer.acks}
    times = [line["failover_ms"] for line in lines]
    elections = [line["elected_ms"] for line in lines]
    return {
        "kills": len(lines),
        "failover_median_ms": round(statistics.median(times), 1) if lines else None,
        "failover_max_ms": max(times, default=None),
        "elected_median_ms": round(statistics.median(elections), 1) if lines else None,
        "elected_max_ms": max(elections, default=None),
        "acked": len(acked),
        "stored": sum(read.values()),
        "lost": len(acked - set(read)),
        "duplicates": sum(count - 1 for count in read.values()),
        "producer_errors": dict(Counter(name for _, _, name in producer.errors)),
    }


def main(argv: list[str] | None = None) -> Result:
    """Run the benchmark as the command line `argv` asks; return (and print) the summary."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000, help="a producer run's")
    parser.add_argument("--repeat", type=int, default=1, help="rounds of the producer runs")
    parser.add_argument("--kills", type=int, default=10, help="leader kills (0: none)")
    parser.add_argument("--session-timeout-ms", type=int, default=6000, help="every broker's")
    parser.add_argument("--tick-time-ms", type=int, default=2000, help="the ZooKeeper's")
    parser.add_argument("--failover-limit-s", type=float, default=1800.0)
    args = parser.parse_args(argv)
    if min(args.messages, args.repeat, args.session_timeout_ms, args.tick_time_ms) < 1:
        parser.error("--messages, --repeat and the times must be 1 or more")
    if args.kills < 0 or args.failover_limit_s <= 0:
        parser.error("--kills must be 0 or more and --failover-limit-s positive")
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="pylog-replication-", dir="/tmp") as tmp,
        running_cluster(Path(tmp), args.session_timeout_ms, args.tick_time_ms) as cluster,
    ):
        results = producer_runs(cluster, args.messages, args.repeat)
        patience_s = 2 * args.session_timeout_ms / 1000
        failover = (
            failover_runs(cluster, args.kills, args.failover_limit_s, patience_s)
            if args.kills
            else {}
        )
    summary = {
        "producer": summarize(results),
        "failover": failover,
        "messages": args.messages,
        "repeat": args.repeat,
        "session_timeout_ms": args.session_timeout_ms,
        "tick_time_ms": args.tick_time_ms,
        "done_in_s": round(time.monotonic() - started, 1),
    }
    print(json.dumps({"summary": summary}), flush=True)
    return summary


if __name__ == "__main__":
    main()

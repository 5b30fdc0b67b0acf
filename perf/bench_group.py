"""Consumer groups through the group's coordinator on three brokers: issue 49's targets.

    .venv/bin/python -m perf.bench_group [--members 10] [--partitions 900] [--runs 3]
        [--rate 3000] [--slow-s 60] [--messages 300000]

It starts a private ZooKeeper (tickTime 100 ms, so sessions of at most 2 s) and three pylogd
brokers sharing it (metrics on), all on 127.0.0.1 under a temporary folder, creates a topic of
`--partitions` (900) at replication factor 2, and runs `--members` (10) members, each a process
of its own joined through the group's coordinator (a broker's address, no ZooKeeper:
docs/protocol.md "Consumer groups"), session 2 s; the group is asked DESCRIBE_GROUP every
50 ms. Then:

- **Joins under load.** A producer writes `--rate` messages a second (acks all, each to a
  partition drawn at random, as keyed messages spread: a round robin over the partitions
  reached a member's partitions, given in ranges, in one sweep every `--partitions` / `--rate`
  seconds, so each member read in bursts 0.3 to 0.8 s apart whatever the group did), the
  members log every record they hand out, and `--runs` times, after
  10 s, an 11th member joins (its process started before the 10 s, so that its interpreter's
  start is not measured as the rebalance's cost), reads on 2 s once the group is stable, and
  leaves cleanly: for each join, the time until the group is stable (state stable, every
  partition assigned, the joiner among them), the rate each member kept reading its kept
  partitions at during the rebalance, over as long a window just before the join (a control,
  no rebalance in it) and over at least 2 s from the join, against the 10 s before, and the
  longest gap between two of a member's hand-outs during the rebalance
  against the 99th percentile of its gaps before; once every member stopped cleanly (commit,
  leave), the duplicates and gaps among the messages produced.
- **Joins and kill -9s, no load**, `--runs` of each, at half the members and then at all of
  them: the time until stable (from the joiner process's start), and for a kill -9 the time
  past its session; the partitions each moved and the ZooKeeper operations the coordinator
  made for it (its pylog_group_registry_operations_total), so that their growth with the
  group's size shows.
- **The coordinator's broker SIGKILLed** (once): the time until the group is stable again
  under the broker that takes it over, and the committed offsets lost (those lower or gone
  after, against before).
- **A slow handler** (`--slow-s`, 60 s, on one message), in two groups of two members over a
  topic of 4 partitions: under its processing deadline (max_poll_interval_s 1.5 times it) the
  member keeps its partitions, is told of no revocation and commits after; past it (half of
  it) the other member owns all 4 partitions within the deadline + 2 s, and the slow member's
  commit after its handler is refused.
- **Throughput**: `--messages` stored messages over 12 partitions read by a fresh group of one
  member and of three (each a process).

Run it alone on the machine: anything beside it skews the figures.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker.client import Admin, Delivery, Producer
from broker.client.coordinator import GroupCalls
from broker.client.group import GroupConsumer
from broker.client.records import BrokerPartition
from broker.errors import BrokerError, PylogError, Unavailable
from broker.protocol import Ack
from broker.zookeeper import PrivateZooKeeper
from perf.pylog_runs import VALUE_BYTES, PrivatePylogd

TOPIC = "bench-group"
PARTITIONS = 12
COORDINATED_TOPIC = "bench-group-coordinated"
SLOW_TOPIC = "bench-group-slow"
SESSION_S = 2.0
WINDOW_S = 10.0
"""The window before a join over which the members' rate is measured."""
RATE_WINDOW_S = 2.0
"""The shortest window a kept rate is also measured over from a join: a rate over the
rebalance's 0.7 s alone swings with one gap between two hand-outs."""
PARTITION_SEED = 49
"""The seed of the producer's random partitions (the same messages every run)."""
CHROOT = "/bench"
IDLE_S = 2.0
"""A member stops once it has read nothing for this long (the data is all stored up front)."""
OPERATIONS = ("pylog_group_registry_operations_total", ())


POLL_S = 0.05
"""How often a condition is looked at (most ask DESCRIBE_GROUP: asked every 5 ms, a group of
900 partitions kept the coordinator's broker and this process busy enough to slow the members
it measured)."""


def wait_for(condition: Callable[[], bool], limit_s: float = 120.0) -> float:
    """Poll `condition` every POLL_S until true; the time.monotonic() it was seen true."""
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not true within {limit_s} s")
        time.sleep(POLL_S)
    return time.monotonic()


def member_process(broker: str, group: str, member: str, topic: str) -> subprocess.Popen[str]:
    """A member in a child process (`--role member` of this module) that reads until idle."""
    return subprocess.Popen(
        [
            sys.executable,
            *("-m", "perf.bench_group", "--role", "member", "--broker", broker),
            *("--group", group, "--member", member, "--topic", topic),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )


def run_member(
    broker: str,
    group: str,
    member: str,
    forever: bool,
    topic: str,
    record_log: str | None,
    held: bool,
) -> None:
    """Read until idle for IDLE_S (or for ever, until SIGTERM); print the count and the last
    read's time. With `record_log`, each record's partition, offset and time.monotonic()
    there, a line each. `held`: join once a line comes on stdin."""
    if held:
        sys.stdin.readline()
    count, last = 0, time.time()
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.set())
    log = open(record_log, "w") if record_log else None  # noqa: SIM115 (closed below)
    with GroupConsumer(
        broker, group, [topic], consumer_id=member, session_timeout_s=SESSION_S
    ) as consumer:
        print(json.dumps({"ready": True}), flush=True)
        while not stopping.is_set() and (forever or time.time() - last < IDLE_S):
            records = consumer.poll(200)
            if records:
                count += len(records)
                last = time.time()
                if log is not None:
                    now = time.monotonic()
                    log.writelines(f"{r.partition} {r.offset} {now:.4f}\n" for r in records)
                    log.flush()  # the bench reads it while the member runs
        consumer.poll(0)  # the last records are processed: committed and left on close
    if log is not None:
        log.close()
    print(json.dumps({"count": count, "last": last}), flush=True)


def coordinated_member(
    broker: str, group: str, member: str, record_log: Path | None = None, held: bool = False
) -> subprocess.Popen[bytes]:
    """A member through the coordinator, in a child process, reading until SIGTERM (each
    record logged to `record_log`, when given). `held`: it joins only once a line is written
    to its stdin (its interpreter started and its imports done before)."""
    logging_to = ("--record-log", str(record_log)) if record_log else ()
    return subprocess.Popen(
        [
            sys.executable,
            *("-m", "perf.bench_group", "--role", "member", "--broker", broker),
            *("--group", group, "--member", member, "--topic", COORDINATED_TOPIC, "--forever"),
            *logging_to,
            *(["--held"] if held else []),
        ],
        stdin=subprocess.PIPE if held else None,
        stdout=subprocess.DEVNULL,
    )


def settled(calls: GroupCalls, members: int, partitions: int) -> bool:
    """Whether DESCRIBE_GROUP says the group is stable with `members` members owning all
    `partitions` partitions."""
    try:
        described = calls.describe()
    except (BrokerError, Unavailable):
        return False
    assigned = sum(len(t.partitions) for m in described.members for t in m.assigned)
    return described.state == 1 and len(described.members) == members and assigned == partitions


def operations(brokers: list[PrivatePylogd]) -> float:
    """The ZooKeeper node operations the brokers' group coordinators made so far (a broker
    killed counts no more)."""
    total = 0.0
    for broker in brokers:
        if broker.process is not None and broker.process.poll() is None:
            total += broker.metrics().get(OPERATIONS, 0.0)
    return total


def quiet_operations(brokers: list[PrivatePylogd], quiet_s: float) -> float:
    """The coordinators' operations once they did not move for `quiet_s` (the figures are
    refreshed every 50 ms; a member commits only what it read since its last commit)."""
    last, since = operations(brokers), time.monotonic()
    deadline = since + 120
    while time.monotonic() - since < quiet_s:
        if time.monotonic() > deadline:
            raise TimeoutError("the coordinators' ZooKeeper operations never settled")
        time.sleep(POLL_S)  # the figures' refresh, not a wait for a condition
        now = operations(brokers)
        if now != last:
            last, since = now, time.monotonic()
    return last


@dataclass
class Change:
    """One join or kill -9 of the runs without load."""

    kind: str
    members: int
    seconds: float
    moved: int
    operations: float


def coordinated_runs(
    brokers: list[PrivatePylogd], members: int, partitions: int, runs: int
) -> tuple[list[Change], dict[str, float]]:
    """The joins and kill -9s at half the members and at all of them, then the coordinator's
    kill (module docstring)."""
    bootstrap = ",".join(b.endpoint for b in brokers)
    group = "coordinated"
    half = max(1, members // 2)
    steady = [coordinated_member(bootstrap, group, f"c{i:02}") for i in range(half)]
    changes: list[Change] = []
    killed_coordinator: dict[str, float] = {}
    try:
        with GroupCalls(bootstrap, group, timeout_s=3.0) as calls:
            for size in (half, members):
                steady += [
                    coordinated_member(bootstrap, group, f"c{i:02}")
                    for i in range(len(steady), size)
                ]
                wait_for(functools.partial(settled, calls, size, partitions), 300)
                quiet_operations(brokers, 6.0)  # every commit of what they read (every 5 s)
                print(f"  {size} members own the {partitions} partitions", flush=True)
                for run in range(runs):
                    changes += join_and_kill(brokers, calls, size, partitions)
                    join, kill = changes[-2:]
                    print(
                        f"  {size} members, run {run + 1}/{runs}: join {join.seconds:.2f} s "
                        f"({join.moved} moved, {join.operations:.0f} ZooKeeper operations), "
                        f"kill -9 {kill.seconds:.2f} s past the session ({kill.moved} moved, "
                        f"{kill.operations:.0f} operations)",
                        flush=True,
                    )
            killed_coordinator = kill_coordinator(brokers, calls, members, partitions)
    finally:
        for member in steady:
            member.kill()
            member.wait()
    return changes, killed_coordinator


def join_and_kill(
    brokers: list[PrivatePylogd], calls: GroupCalls, members: int, partitions: int
) -> list[Change]:
    """A member joins `members`; once stable it is SIGKILLed: both timed, with the partitions
    that moved and the coordinator's ZooKeeper operations."""
    bootstrap = ",".join(b.endpoint for b in brokers)
    before, ops = owned_by(calls), operations(brokers)
    joiner = coordinated_member(bootstrap, calls.group, "joiner")
    started = time.monotonic()
    joined = wait_for(lambda: settled(calls, members + 1, partitions)) - started
    after, joined_ops = owned_by(calls), quiet_operations(brokers, 1.0)
    moved = moved_partitions(before, after)
    joiner.send_signal(signal.SIGKILL)
    joiner.wait()
    killed = time.monotonic()
    back = wait_for(lambda: settled(calls, members, partitions)) - killed - SESSION_S
    quiet_operations(brokers, 1.0)
    return [
        Change("join", members, joined, moved, joined_ops - ops),
        Change(
            "kill -9",
            members,
            back,
            moved_partitions(after, owned_by(calls)),
            operations(brokers) - joined_ops,
        ),
    ]


def moved_partitions(before: dict[str, set[int]], after: dict[str, set[int]]) -> int:
    """The partitions whose member changed between two DESCRIBE_GROUPs."""
    owner_before = {p: m for m, ps in before.items() for p in ps}
    owner_after = {p: m for m, ps in after.items() for p in ps}
    return sum(owner_before.get(p) != m for p, m in owner_after.items())


def kill_coordinator(
    brokers: list[PrivatePylogd], calls: GroupCalls, members: int, partitions: int
) -> dict[str, float]:
    """SIGKILL the group's coordinator's broker: the time until the group is stable again,
    and the committed offsets lost (lower or gone after, against before)."""
    committed = calls.committed()
    coordinator = next(b for b in brokers if b.endpoint == calls.coordinator)
    for pid in coordinator.pids():  # the supervisor and its workers, as a crash
        os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    stable = wait_for(lambda: settled(calls, members, partitions)) - killed
    after = calls.committed()
    lost = sum(after.get(tp, -1) < offset for tp, offset in committed.items())
    return {"seconds": stable, "committed": len(committed), "lost": lost}


def owned_by(calls: GroupCalls) -> dict[str, set[int]]:
    """Member -> the partitions assigned to it, by DESCRIBE_GROUP."""
    described = calls.describe()
    return {m.member_id: {p for t in m.assigned for p in t.partitions} for m in described.members}


def read_log(path: Path) -> list[tuple[int, int, float]]:
    """A member's record log: (partition, offset, time.monotonic()) a record."""
    if not path.exists():
        return []
    lines = [line.split() for line in path.read_text().splitlines()]
    return [(int(p), int(o), float(t)) for p, o, t in lines]


@dataclass
class Join:
    """One join under load: when it started and when the group was stable again, and each
    member's partitions (DESCRIBE_GROUP) just before and once stable."""

    joined_at: float
    stable_at: float
    before: dict[str, set[int]]
    after: dict[str, set[int]]

    def kept(self, records: dict[str, list[tuple[int, int, float]]]) -> list[Kept]:
        """How each member there before and after read the partitions it kept through the
        join, against the WINDOW_S before it."""
        found = []
        start, end = self.joined_at, self.stable_at
        for member, rows in records.items():
            kept = self.before.get(member, set()) & self.after.get(member, set())
            times = sorted({t for p, _, t in rows if p in kept})
            rate_before = sum(start - WINDOW_S <= t < start for t in times) / WINDOW_S
            if rate_before == 0:
                continue
            length = max(end - start, 1e-3)
            wide = start + max(length, RATE_WINDOW_S)
            gaps = list(itertools.pairwise(times))
            usual = [b - a for a, b in gaps if start - WINDOW_S <= a < start]
            during = [b - a for a, b in gaps if start <= b and a <= end]
            found.append(
                Kept(
                    sum(start <= t <= end for t in times) / length / rate_before,
                    sum(start - length <= t < start for t in times) / length / rate_before,
                    sum(start <= t <= wide for t in times) / (wide - start) / rate_before,
                    max(during, default=0.0),
                    statistics.quantiles(usual, n=100)[98] if len(usual) > 1 else 0.0,
                )
            )
        return found


@dataclass(frozen=True)
class Kept:
    """A member's reading of the partitions it kept through a join: its rate during the
    rebalance, over a window as long just before the join (the control: no rebalance), and
    over at least RATE_WINDOW_S from the join, as ratios to its rate over the WINDOW_S before;
    the longest gap between two of its hand-outs during the rebalance, and the 99th
    percentile of its gaps over the WINDOW_S before."""

    rate: float
    control_rate: float
    wide_rate: float
    longest_gap_s: float
    usual_gap_s: float


@dataclass
class Loaded:
    """The joins under load: each one's time to stable and how its members read what they
    kept (Kept); the duplicates and gaps over every message produced."""

    join_s: list[float]
    kept: list[list[Kept]]
    duplicates: int
    gaps: int
    produced: int


def loaded_joins(
    brokers: list[PrivatePylogd], members: int, partitions: int, rate: int, runs: int, root: Path
) -> Loaded:
    """`runs` members joining in turn a group that reads a steady producer, each leaving
    cleanly before the next (module docstring): how long until stable, the rates of the
    partitions each member kept during the rebalance against the WINDOW_S before, and the
    duplicates and gaps of delivery once every member stopped cleanly."""
    bootstrap = ",".join(b.endpoint for b in brokers)
    group = "loaded"
    logs = {f"l{i:02}": root / f"l{i:02}.log" for i in range(members)}
    steady = [coordinated_member(bootstrap, group, m, path) for m, path in logs.items()]
    joiners: list[subprocess.Popen[bytes]] = []
    joins: list[Join] = []
    sent: list[tuple[int, Delivery]] = []
    stop = threading.Event()

    def produce() -> None:
        spread = random.Random(PARTITION_SEED)
        with Producer(bootstrap, COORDINATED_TOPIC, ack=Ack.ALL) as producer:
            started = time.monotonic()
            while not stop.is_set():
                partition = spread.randrange(partitions)
                delay = started + len(sent) / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)  # the producer's pace, not a wait for a condition
                sent.append((partition, producer.send(b"v" * VALUE_BYTES, partition=partition)))
            producer.flush()

    producing = threading.Thread(target=produce, daemon=True)
    try:
        with GroupCalls(bootstrap, group, timeout_s=3.0) as calls:
            wait_for(lambda: settled(calls, members, partitions), 300)
            producing.start()
            for run in range(runs):
                name = f"j{run}"
                logs[name] = root / f"{name}.log"
                joiner = coordinated_member(bootstrap, group, name, logs[name], held=True)
                joiners.append(joiner)
                time.sleep(WINDOW_S)  # the rate before the join is measured over this window
                before = owned_by(calls)
                joined_at = time.monotonic()
                assert joiner.stdin is not None
                joiner.stdin.write(b"join\n")  # its interpreter started outside the window
                joiner.stdin.flush()
                stable_at = wait_for(lambda: settled(calls, members + 1, partitions))
                joins.append(Join(joined_at, stable_at, before, owned_by(calls)))
                time.sleep(2.0)  # reading on after the join
                joiner.send_signal(signal.SIGTERM)  # commit, leave: its partitions go back
                joiner.wait(60)
                wait_for(lambda: settled(calls, members, partitions))
                ratios = [k.rate for k in joins[-1].kept({m: read_log(logs[m]) for m in logs})]
                print(
                    f"  join {run + 1}/{runs} under load: stable after "
                    f"{stable_at - joined_at:.2f} s, kept rate {min(ratios):.2f} lowest, "
                    f"{statistics.median(ratios):.2f} median",
                    flush=True,
                )
        stop.set()
        producing.join(60)
        produced = {(partition, delivery.result(60)) for partition, delivery in sent}
        wait_for(lambda: sum(len(read_log(p)) for p in logs.values()) >= len(produced), 120)
    finally:
        stop.set()
        processes = [*steady, *joiners]
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)  # commit, leave, close the log
        for process in processes:
            process.wait(60)
    records = {m: read_log(path) for m, path in logs.items()}
    delivered = Counter((p, o) for rows in records.values() for p, o, _ in rows)
    return Loaded(
        [join.stable_at - join.joined_at for join in joins],
        [join.kept(records) for join in joins],
        sum(n - 1 for n in delivered.values() if n > 1),
        len(produced - delivered.keys()),
        len(produced),
    )


@dataclass
class SlowRun:
    """A group of two members over SLOW_TOPIC, one of them handling one message for slow_s."""

    deadline_s: float
    slow_s: float
    kept_throughout: bool = True
    """Whether every DESCRIBE_GROUP during the handler gave the slow member what it had."""
    told: list[str] = field(default_factory=list)
    """The revocations and losses the slow member was told of, during the handler."""
    replaced_after_s: float | None = None
    """From the handler's start to the other member owning all of SLOW_TOPIC."""
    commit: str = ""
    """What the slow member's commit after its handler met."""


def slow_handler(bootstrap: str, group: str, deadline_s: float, slow_s: float) -> SlowRun:
    """Member "slow" (processing deadline `deadline_s`) takes `slow_s` over its first record,
    while member "steady" polls on (module docstring)."""
    run = SlowRun(deadline_s, slow_s)
    handling = threading.Event()

    def told(what: str) -> Callable[[frozenset[BrokerPartition]], None]:
        return lambda partitions: run.told.append(what) if handling.is_set() else None

    def joined(member_id: str, **options: Any) -> GroupConsumer:
        return GroupConsumer(
            bootstrap,
            group,
            [SLOW_TOPIC],
            consumer_id=member_id,
            session_timeout_s=SESSION_S,
            max_wait_ms=100,
            **options,
        )

    slow = joined(
        "slow",
        max_poll_interval_s=deadline_s,
        auto_commit_interval_s=None,
        on_revoked=told("revoked"),
        on_lost=told("lost"),
    )
    steady = joined("steady")
    stop = threading.Event()

    def poll_steady() -> None:
        while not stop.is_set():
            steady.poll(100)

    polling = threading.Thread(target=poll_steady, daemon=True)
    polling.start()
    try:
        with GroupCalls(bootstrap, group, timeout_s=3.0) as calls:
            wait_for(lambda: slow.poll(50) == [] and settled(calls, 2, 4))
            mine = owned_by(calls)["slow"]
            store(bootstrap, SLOW_TOPIC, 8, group)  # two a partition, once the group settled
            in_hand: list[object] = []

            def holding_one() -> bool:  # records of the slow one's handed out
                in_hand.extend(slow.poll(100))
                return bool(in_hand)

            wait_for(holding_one)
            handling.set()
            started = time.monotonic()
            handler = threading.Thread(target=time.sleep, args=(slow_s,))  # the slow handler
            handler.start()
            while handler.is_alive():
                owned = owned_by(calls)
                run.kept_throughout &= owned.get("slow") == mine
                if run.replaced_after_s is None and len(owned.get("steady", ())) == 4:
                    run.replaced_after_s = time.monotonic() - started
                handler.join(POLL_S)
            handling.clear()
            try:
                slow.commit()
                run.commit = "committed"
            except PylogError as error:
                run.commit = f"refused: {type(error).__name__}: {error}"
    finally:
        stop.set()
        polling.join(30)
        for member in (slow, steady):
            member.close()
    return run


def store(endpoint: str, topic: str, messages: int, value: str = "") -> None:
    """`messages` messages of VALUE_BYTES (starting with `value`) over `topic`'s partitions."""
    data = value.encode().ljust(VALUE_BYTES, b"v")
    with Producer(endpoint, topic, ack=Ack.FLUSHED, batch_messages=200) as producer:
        for _ in range(messages):
            producer.send(data)
        producer.flush()


def throughput(bootstrap: str, members: int, messages: int) -> float:
    """Messages per second read by a fresh group of `members` member processes."""
    group = f"throughput-{members}"
    processes = [member_process(bootstrap, group, f"t{i}", TOPIC) for i in range(members)]
    for process in processes:
        assert process.stdout is not None
        json.loads(process.stdout.readline())  # joined
    start = time.time()
    results = []
    for process in processes:
        out, _ = process.communicate(timeout=600)
        results.append(json.loads(out.splitlines()[-1]))
    read = sum(int(r["count"]) for r in results)
    if read < messages:
        raise RuntimeError(f"the group read {read} of {messages} messages")
    return read / (max(float(r["last"]) for r in results) - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, default=10, help="the group's members")
    parser.add_argument("--partitions", type=int, default=900, help="the topic's partitions")
    parser.add_argument("--runs", type=int, default=3, help="joins and kill -9s at each size")
    parser.add_argument("--rate", type=int, default=3000, help="messages a second produced")
    parser.add_argument("--slow-s", type=float, default=60.0, help="the slow handler's time")
    parser.add_argument("--messages", type=int, default=300_000, help="for the throughput run")
    parser.add_argument("--role", choices=["member"], help=argparse.SUPPRESS)
    parser.add_argument("--broker", help=argparse.SUPPRESS)
    parser.add_argument("--topic", default=TOPIC, help=argparse.SUPPRESS)
    parser.add_argument("--record-log", help=argparse.SUPPRESS)
    parser.add_argument("--group", help=argparse.SUPPRESS)
    parser.add_argument("--member", help=argparse.SUPPRESS)
    parser.add_argument("--forever", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--held", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "member":
        run_member(
            args.broker,
            args.group,
            args.member,
            args.forever,
            args.topic,
            args.record_log,
            args.held,
        )
        return
    with tempfile.TemporaryDirectory(prefix="pylog-bench-group-") as tmp:
        root = Path(tmp)
        with PrivateZooKeeper(root / "zookeeper", tick_time_ms=100) as zk:
            flags = ["--zookeeper-connect", zk.connect_string, "--zookeeper-chroot", CHROOT]
            flags += ["--zookeeper-session-timeout-ms", "2000", "--log-fsync", "false"]
            flags += ["--metrics-enabled", "true", "--metrics-port", "0"]
            brokers = [
                PrivatePylogd(root / f"broker-{i}", "--broker-id", str(i), *flags)
                for i in (1, 2, 3)
            ]
            for broker in brokers:
                broker.__enter__()
            try:
                measured = measure(brokers, args, root)
            finally:
                for broker in brokers:
                    broker.__exit__()
    report(measured, args)


@dataclass
class Measured:
    loaded: Loaded
    changes: list[Change]
    killed_coordinator: dict[str, float]
    slow: list[SlowRun]
    one: float
    three: float


def measure(brokers: list[PrivatePylogd], args: argparse.Namespace, root: Path) -> Measured:
    with Admin(brokers[0].endpoint, timeout_s=120) as admin:
        admin.create_topic(COORDINATED_TOPIC, args.partitions, {"replication_factor": "2"})
        admin.create_topic(SLOW_TOPIC, 4)
        admin.create_topic(TOPIC, PARTITIONS)
    print(
        f"3 brokers, {args.partitions} partitions at factor 2, {args.members} members + 1",
        flush=True,
    )
    loaded = loaded_joins(brokers, args.members, args.partitions, args.rate, args.runs, root)
    changes, killed = coordinated_runs(brokers, args.members, args.partitions, args.runs)
    print(f"  coordinator kill -9: {json.dumps(killed)}", flush=True)
    for broker in brokers:  # the coordinator's, killed: its partitions led again
        if broker.process is not None and broker.process.poll() is not None:
            broker.__enter__()
    live = ",".join(b.endpoint for b in brokers)
    print(f"slow handler: {args.slow_s:g} s on one message", flush=True)
    runs: list[SlowRun] = []
    within = threading.Thread(
        target=lambda: runs.append(
            slow_handler(live, "slow-within", 1.5 * args.slow_s, args.slow_s)
        )
    )
    within.start()
    runs.append(slow_handler(live, "slow-past", args.slow_s / 2, args.slow_s))
    within.join()
    for run in runs:
        print(f"  {run}", flush=True)
    print(f"storing {args.messages:,} messages of 200 bytes", flush=True)
    store(live, TOPIC, args.messages)
    one = throughput(live, 1, args.messages)
    three = throughput(live, 3, args.messages)
    return Measured(loaded, changes, killed, sorted(runs, key=lambda r: -r.deadline_s), one, three)


def report(measured: Measured, args: argparse.Namespace) -> None:
    print_loaded(measured.loaded, args.members, args.rate)
    print()
    print(
        "| no load | members | median | max | runs | moved (median) | ZooKeeper operations "
        "(median) | per partition moved | target |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    targets = {"join": "<= 5 s", "kill -9": "<= 2 s past the session"}
    for kind in ("join", "kill -9"):
        for size in sorted({c.members for c in measured.changes}):
            picked = [c for c in measured.changes if c.kind == kind and c.members == size]
            if not picked:
                continue
            seconds = [c.seconds for c in picked]
            moved = statistics.median(c.moved for c in picked)
            ops = statistics.median(c.operations for c in picked)
            print(
                f"| {kind} | {size} | {statistics.median(seconds) * 1000:,.0f} ms | "
                f"{max(seconds) * 1000:,.0f} ms | {len(picked)} | {moved:,.0f} | {ops:,.0f} | "
                f"{ops / max(moved, 1):.2f} | {targets[kind]} |"
            )
    killed = measured.killed_coordinator
    print(
        f"| the coordinator's broker kill -9'd -> stable again | {args.members} | "
        f"{killed['seconds'] * 1000:,.0f} ms | | 1 | | | | <= 10 s |"
    )
    print(
        f"\ncommitted offsets lost at the coordinator's kill: {killed['lost']:.0f} of "
        f"{killed['committed']:.0f} (target 0)"
    )
    print()
    print(
        "| slow handler | deadline | kept its partitions throughout | told | replaced after "
        "| its commit after |"
    )
    print("|---|---:|---|---|---:|---|")
    for run in measured.slow:
        replaced = "-" if run.replaced_after_s is None else f"{run.replaced_after_s:.1f} s"
        print(
            f"| {run.slow_s:g} s | {run.deadline_s:g} s | {run.kept_throughout} | "
            f"{', '.join(run.told) or 'nothing'} | {replaced} | {run.commit} |"
        )
    print()
    print("| group reading the stored messages | messages/s |")
    print("|---|---|")
    print(f"| 1 member | {measured.one:,.0f} |")
    print(f"| 3 members | {measured.three:,.0f} ({measured.three / measured.one:.2f}x) |")


def print_loaded(loaded: Loaded, members: int, rate: int) -> None:
    def row(name: str, figures: list[float], target: str = "", unit: str = "") -> None:
        each = ", ".join(f"{f:.2f}{unit}" for f in figures)
        print(f"| {name} | {statistics.median(figures):.2f}{unit} | {each} | {target} |")

    def lowest(pick: Callable[[Kept], float]) -> list[float]:
        return [min((pick(k) for k in run), default=0.0) for run in loaded.kept]

    def highest(pick: Callable[[Kept], float]) -> list[float]:
        return [max((pick(k) for k in run), default=0.0) for run in loaded.kept]

    def median(pick: Callable[[Kept], float]) -> list[float]:
        return [statistics.median(pick(k) for k in run) if run else 0.0 for run in loaded.kept]

    print()
    print(
        f"| a member joining {members} under {rate:,} messages/s, {len(loaded.join_s)} runs "
        "| median | each run | target |"
    )
    print("|---|---|---|---|")
    row("join -> stable", loaded.join_s, "<= 5 s", " s")
    during = "kept partitions' rate during the rebalance / before"
    row(f"{during}, lowest member", lowest(lambda k: k.rate), ">= 0.8")
    row(f"{during}, median member", median(lambda k: k.rate))
    control = "the same over as long a window just before the join (no rebalance)"
    row(f"{control}, lowest member", lowest(lambda k: k.control_rate))
    row(f"{control}, median member", median(lambda k: k.control_rate))
    row(
        f"kept partitions' rate over {RATE_WINDOW_S:g} s from the join / before, lowest member",
        lowest(lambda k: k.wide_rate),
    )
    row(
        "longest gap between two hand-outs during the rebalance, worst member",
        highest(lambda k: k.longest_gap_s),
        unit=" s",
    )
    row(
        "99th percentile of the gaps over the 10 s before, worst member",
        highest(lambda k: k.usual_gap_s),
        unit=" s",
    )
    print(
        f"| duplicates, gaps of {loaded.produced:,} messages | {loaded.duplicates}, "
        f"{loaded.gaps} | | 0, 0 |"
    )


if __name__ == "__main__":
    main()

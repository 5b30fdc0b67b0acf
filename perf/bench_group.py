"""Consumer groups on three brokers: how long a rebalance leaves partitions unowned, and what a
group of three members reads against one member.

    .venv/bin/python -m perf.bench_group [--runs 10] [--messages 300000]

It starts a private ZooKeeper (tickTime 100 ms, so sessions of at most 2 s) and three pylogd
brokers sharing it, all on 127.0.0.1 under a temporary folder, and creates a topic of 12
partitions. Then:

- **Rebalance after a member leaves.** Three members run; a fourth joins, and once the group
  has settled (12 partitions owned by 4 members) it leaves, cleanly (close: commit, release,
  unregister) or by SIGKILL (its partitions stay owned until its session expires). The time
  from the leave to all 12 partitions being owned again by the other three is read from
  ZooKeeper every 5 ms; median and max over `--runs` clean leaves and `--crash-runs` kills.
- **Throughput.** `--messages` messages of 200 bytes are stored over the 12 partitions; a
  fresh group of one member, then a fresh group of three, reads them all. Each member is a
  process of its own (`pylogctl group consume` would print them; here a member counts them),
  so the members do not share one interpreter's lock. The rate is messages / (time of the last
  message read - start), the members started together.

With `--coordinated`, the members join through the group's coordinator instead (a broker's
address, no ZooKeeper: docs/protocol.md "Consumer groups"), each a process of its own, over a
topic of `--partitions` (900) at replication factor 2, `--members` (10) of them:

- **Join**: an extra member starts; the time until the group is stable again (DESCRIBE_GROUP,
  asked every 50 ms: state stable, every partition assigned, the extra member among them).
- **kill -9 of a member**: the joiner SIGKILLed; the time until the group is stable again
  without it, less its session (2 s).
- **The coordinator's broker SIGKILLed** (once, last): the time until the group is stable
  again under the broker that takes it over.

Run it alone on the machine: anything beside it skews the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from broker.client import Admin, Delivery, Producer
from broker.client.coordinator import GroupCalls
from broker.client.group import GroupConsumer
from broker.errors import BrokerError, Unavailable
from broker.protocol import Ack
from broker.registry import Registry
from broker.zookeeper import PrivateZooKeeper
from perf.pylog_runs import VALUE_BYTES, PrivatePylogd

TOPIC = "bench-group"
PARTITIONS = 12
COORDINATED_TOPIC = "bench-group-coordinated"
SESSION_S = 2.0
WINDOW_S = 10.0
"""The window before a join over which the members' rate is measured."""
CHROOT = "/bench"
IDLE_S = 2.0
"""A member stops once it has read nothing for this long (the data is all stored up front)."""


def owners(registry: Registry, group: str) -> Counter[str]:
    return Counter(registry.partition_owners(group, TOPIC).values())


def wait_for(condition: Callable[[], bool], limit_s: float = 120.0) -> float:
    """Poll `condition` every 5 ms until true; the time.monotonic() it was seen true."""
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not true within {limit_s} s")
        time.sleep(0.005)
    return time.monotonic()


class PolledMember:
    """An in-process member polled by a thread (for the rebalance runs: it reads nothing)."""

    def __init__(self, zookeeper: str, group: str, member: str) -> None:
        self.consumer = GroupConsumer(
            zookeeper, group, [TOPIC], chroot=CHROOT, consumer_id=member, session_timeout_s=2
        )
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            self.consumer.poll(50)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)
        self.consumer.close()


def member_process(
    zookeeper: str, group: str, member: str, killable: bool
) -> subprocess.Popen[str]:
    """A member in a child process (`--role member` of this module)."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "perf.bench_group",
            "--role",
            "member",
            "--zookeeper",
            zookeeper,
            "--group",
            group,
            "--member",
            member,
            *(["--forever"] if killable else []),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )


def run_member(
    zookeeper: str | None,
    group: str,
    member: str,
    forever: bool,
    broker: str | None,
    topic: str,
    record_log: str | None,
) -> None:
    """Read until idle for IDLE_S (or for ever, until SIGTERM); print the count and the last
    read's time. With `broker`, through the group's coordinator; with `record_log`, each
    record's partition, offset and time.monotonic() there, a line each."""
    count, last = 0, time.time()
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.set())
    log = open(record_log, "w") if record_log else None  # noqa: SIM115 (closed below)
    with GroupConsumer(
        zookeeper,
        group,
        [topic],
        broker=broker,
        chroot=CHROOT if broker is None else None,
        consumer_id=member,
        session_timeout_s=2,
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
    broker: str, group: str, member: str, record_log: Path | None = None
) -> subprocess.Popen[bytes]:
    """A member through the coordinator, in a child process, reading until SIGTERM (each
    record logged to `record_log`, when given)."""
    logging_to = ("--record-log", str(record_log)) if record_log else ()
    return subprocess.Popen(
        [
            sys.executable,
            *("-m", "perf.bench_group", "--role", "member", "--broker", broker),
            *("--group", group, "--member", member, "--topic", COORDINATED_TOPIC, "--forever"),
            *logging_to,
        ],
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


def coordinated_runs(
    brokers: list[PrivatePylogd], members: int, partitions: int, runs: int
) -> dict[str, list[float]]:
    """The join, kill -9 and coordinator-kill times (module docstring)."""
    bootstrap = ",".join(b.endpoint for b in brokers)
    group = "coordinated"
    steady = [coordinated_member(bootstrap, group, f"c{i:02}") for i in range(members)]
    times: dict[str, list[float]] = {"join": [], "kill -9": [], "coordinator kill -9": []}
    try:
        with GroupCalls(bootstrap, group, timeout_s=3.0) as calls:
            wait_for(lambda: settled(calls, members, partitions), 300)
            print(f"  {members} members own the {partitions} partitions", flush=True)
            for run in range(runs):
                joiner = coordinated_member(bootstrap, group, "joiner")
                started = time.monotonic()
                times["join"].append(
                    wait_for(lambda: settled(calls, members + 1, partitions)) - started
                )
                joiner.send_signal(signal.SIGKILL)
                joiner.wait()
                killed = time.monotonic()
                back = wait_for(lambda: settled(calls, members, partitions))
                times["kill -9"].append(back - killed - SESSION_S)
                print(
                    f"  run {run + 1}/{runs}: join {times['join'][-1]:.2f} s, kill -9 "
                    f"{times['kill -9'][-1]:.2f} s past the session",
                    flush=True,
                )
            coordinator = next(b for b in brokers if b.endpoint == calls.coordinator)
            for pid in coordinator.pids():  # the supervisor and its workers, as a crash
                os.kill(pid, signal.SIGKILL)
            killed = time.monotonic()
            times["coordinator kill -9"].append(
                wait_for(lambda: settled(calls, members, partitions)) - killed
            )
    finally:
        for member in steady:
            member.kill()
            member.wait()
    return times


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


def loaded_join(
    brokers: list[PrivatePylogd], members: int, partitions: int, rate: int, root: Path
) -> dict[str, float]:
    """A member joining a group that reads a steady producer (module docstring): how long
    until stable, the lowest rate of the partitions each member kept during the rebalance as
    a ratio to its rate over the WINDOW_S before, and the duplicates and gaps of delivery once
    every member stopped cleanly."""
    bootstrap = ",".join(b.endpoint for b in brokers)
    group = "loaded"
    logs = {f"l{i:02}": root / f"l{i:02}.log" for i in range(members + 1)}
    names = sorted(logs)
    steady = [coordinated_member(bootstrap, group, m, logs[m]) for m in names[:-1]]
    sent: list[tuple[int, Delivery]] = []
    stop = threading.Event()

    def produce() -> None:
        with Producer(bootstrap, COORDINATED_TOPIC, ack=Ack.ALL) as producer:
            started = time.monotonic()
            while not stop.is_set():
                partition = len(sent) % partitions
                delay = started + len(sent) / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)  # the producer's pace, not a wait for a condition
                sent.append((partition, producer.send(b"v" * VALUE_BYTES, partition=partition)))
            producer.flush()

    producing = threading.Thread(target=produce, daemon=True)
    joiner = None
    try:
        with GroupCalls(bootstrap, group, timeout_s=3.0) as calls:
            wait_for(lambda: settled(calls, members, partitions), 300)
            producing.start()
            time.sleep(WINDOW_S)  # the rate before the join is measured over this window
            before = owned_by(calls)
            joined_at = time.monotonic()
            joiner = coordinated_member(bootstrap, group, names[-1], logs[names[-1]])
            stable_at = wait_for(lambda: settled(calls, members + 1, partitions))
            after = owned_by(calls)
            time.sleep(2.0)  # reading on after the join
        stop.set()
        producing.join(60)
        produced = {(partition, delivery.result(60)) for partition, delivery in sent}
        wait_for(lambda: sum(len(read_log(p)) for p in logs.values()) >= len(produced), 120)
    finally:
        stop.set()
        processes = [*steady, *([joiner] if joiner else [])]
        for process in processes:
            process.send_signal(signal.SIGTERM)  # commit, leave, close the log
        for process in processes:
            process.wait(60)
    records = {m: read_log(path) for m, path in logs.items()}
    ratios = []
    for member in names[:-1]:
        kept = before.get(member, set()) & after.get(member, set())
        mine = [t for p, _, t in records[member] if p in kept]
        rate_before = sum(joined_at - WINDOW_S <= t < joined_at for t in mine) / WINDOW_S
        during = sum(joined_at <= t <= stable_at for t in mine) / max(stable_at - joined_at, 1e-3)
        if rate_before > 0:
            ratios.append(during / rate_before)
    delivered = Counter((p, o) for rows in records.values() for p, o, _ in rows)
    return {
        "join_s": stable_at - joined_at,
        "kept_rate_min": min(ratios, default=0.0),
        "kept_rate_median": statistics.median(ratios) if ratios else 0.0,
        "members_measured": len(ratios),
        "duplicates": sum(n - 1 for n in delivered.values() if n > 1),
        "gaps": len(produced - delivered.keys()),
        "produced": len(produced),
    }


def rebalance_runs(
    zookeeper: str, registry: Registry, runs: int, crash_runs: int
) -> tuple[list[float], list[float]]:
    group = "rebalance"
    steady = [PolledMember(zookeeper, group, f"m{i}") for i in (1, 2, 3)]
    three = {"m1": 4, "m2": 4, "m3": 4}
    four = {"m1": 3, "m2": 3, "m3": 3, "m4": 3}
    clean: list[float] = []
    crashed: list[float] = []
    try:
        wait_for(lambda: owners(registry, group) == three)
        for run in range(runs):
            joining = PolledMember(zookeeper, group, "m4")
            wait_for(lambda: owners(registry, group) == four)
            left = time.monotonic()
            joining.close()
            clean.append(wait_for(lambda: owners(registry, group) == three) - left)
            print(f"  clean leave {run + 1}/{runs}: {clean[-1] * 1000:.0f} ms", flush=True)
        for run in range(crash_runs):
            process = member_process(zookeeper, group, "m4", killable=True)
            wait_for(lambda: owners(registry, group) == four)
            left = time.monotonic()
            process.send_signal(signal.SIGKILL)
            process.wait()
            crashed.append(wait_for(lambda: owners(registry, group) == three) - left)
            print(f"  kill -9 {run + 1}/{crash_runs}: {crashed[-1] * 1000:.0f} ms", flush=True)
    finally:
        for member in steady:
            member.close()
    return clean, crashed


def store(endpoint: str, messages: int) -> None:
    value = b"v" * VALUE_BYTES
    with Producer(endpoint, TOPIC, ack=Ack.FLUSHED, batch_messages=200) as producer:
        for _ in range(messages):
            producer.send(value)
        producer.flush()


def throughput(zookeeper: str, members: int, messages: int) -> float:
    """Messages per second read by a fresh group of `members` member processes."""
    group = f"throughput-{members}"
    processes = [member_process(zookeeper, group, f"t{i}", killable=False) for i in range(members)]
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
    parser.add_argument("--runs", type=int, default=10, help="clean leaves to time")
    parser.add_argument("--crash-runs", type=int, default=3, help="kill -9 leaves to time")
    parser.add_argument("--messages", type=int, default=300_000, help="for the throughput run")
    parser.add_argument(
        "--coordinated", action="store_true", help="members through the group's coordinator"
    )
    parser.add_argument("--members", type=int, default=10, help="with --coordinated")
    parser.add_argument("--partitions", type=int, default=900, help="with --coordinated")
    parser.add_argument("--role", choices=["member"], help=argparse.SUPPRESS)
    parser.add_argument("--zookeeper", help=argparse.SUPPRESS)
    parser.add_argument("--broker", help=argparse.SUPPRESS)
    parser.add_argument("--topic", default=TOPIC, help=argparse.SUPPRESS)
    parser.add_argument("--record-log", help=argparse.SUPPRESS)
    parser.add_argument(
        "--rate", type=int, default=3000, help="with --coordinated: messages a second produced"
    )
    parser.add_argument("--group", help=argparse.SUPPRESS)
    parser.add_argument("--member", help=argparse.SUPPRESS)
    parser.add_argument("--forever", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "member":
        run_member(
            args.zookeeper,
            args.group,
            args.member,
            args.forever,
            args.broker,
            args.topic,
            args.record_log,
        )
        return
    with tempfile.TemporaryDirectory(prefix="pylog-bench-group-") as tmp:
        root = Path(tmp)
        with PrivateZooKeeper(root / "zookeeper", tick_time_ms=100) as zk:
            flags = ["--zookeeper-connect", zk.connect_string, "--zookeeper-chroot", CHROOT]
            flags += ["--zookeeper-session-timeout-ms", "2000", "--log-fsync", "false"]
            brokers = [
                PrivatePylogd(root / f"broker-{i}", "--broker-id", str(i), *flags)
                for i in (1, 2, 3)
            ]
            for broker in brokers:
                broker.__enter__()
            try:
                endpoint = brokers[0].endpoint
                if args.coordinated:
                    with Admin(endpoint, timeout_s=120) as admin:
                        admin.create_topic(
                            COORDINATED_TOPIC, args.partitions, {"replication_factor": "2"}
                        )
                    print(
                        f"coordinated: 3 brokers, {args.partitions} partitions at factor 2, "
                        f"{args.members} members + 1",
                        flush=True,
                    )
                    loaded = loaded_join(brokers, args.members, args.partitions, args.rate, root)
                    print(f"  loaded join: {json.dumps(loaded)}", flush=True)
                    coordinated = coordinated_runs(
                        brokers, args.members, args.partitions, args.runs
                    )
                    print_times(coordinated)
                    print_loaded(loaded, args.members, args.rate)
                    return
                with Admin(endpoint) as admin:
                    admin.create_topic(TOPIC, PARTITIONS)
                with Registry(zk.connect_string, CHROOT) as registry:
                    print(f"rebalance: 3 brokers, {PARTITIONS} partitions, 3 members + 1")
                    clean, crashed = rebalance_runs(
                        zk.connect_string, registry, args.runs, args.crash_runs
                    )
                print(f"storing {args.messages:,} messages of 200 bytes", flush=True)
                store(endpoint, args.messages)
                one = throughput(zk.connect_string, 1, args.messages)
                three = throughput(zk.connect_string, 3, args.messages)
            finally:
                for broker in brokers:
                    broker.__exit__()
    print_times({"clean leave -> all owned": clean, "kill -9 -> all owned": crashed})
    print()
    print("| group | messages/s |")
    print("|---|---|")
    print(f"| 1 member | {one:,.0f} |")
    print(f"| 3 members | {three:,.0f} ({three / one:.2f}x) |")


def print_loaded(loaded: dict[str, float], members: int, rate: int) -> None:
    print()
    print(f"| a member joining {members} under {rate:,} messages/s | figure | target |")
    print("|---|---|---|")
    print(f"| join -> stable | {loaded['join_s'] * 1000:,.0f} ms | <= 5 s |")
    print(
        f"| kept partitions' rate during it / before, lowest member | "
        f"{loaded['kept_rate_min']:.2f} (median {loaded['kept_rate_median']:.2f}, "
        f"{loaded['members_measured']:.0f} members) | >= 0.8 |"
    )
    print(
        f"| duplicates, gaps of {loaded['produced']:,.0f} messages | "
        f"{loaded['duplicates']:.0f}, {loaded['gaps']:.0f} | 0, 0 |"
    )


def print_times(measures: dict[str, list[float]]) -> None:
    print()
    print("| measure | median | max | runs |")
    print("|---|---|---|---|")
    for name, times in measures.items():
        if times:
            print(
                f"| {name} | {statistics.median(times) * 1000:,.0f} ms "
                f"| {max(times) * 1000:,.0f} ms | {len(times)} |"
            )


if __name__ == "__main__":
    main()

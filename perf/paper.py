"""The Kafka paper's experiments on this machine: pylog and RabbitMQ side by side.

    scripts/perf [--messages 10000000] [--repeat 3] [--budget-s 60]

(scripts/perf installs RabbitMQ, pika and matplotlib when missing, then runs
`.venv/bin/python -m perf.paper` with the arguments.)

Starts a private pylogd (its default config, private ZooKeeper included) and a private RabbitMQ
node on 127.0.0.1, runs every experiment `--repeat` times with the two systems alternating, and
stops both. Experiments (perf/pylog_runs.py and perf/peer_rabbitmq.py say exactly what each
client does):

- producer: one producer sends 200-byte messages built in the timed loop, in batches of 1 and
  of 50, first without waiting for acks (the paper's producer; the run ends when the broker
  holds them all), then waiting for acks (pylog ack=flushed, RabbitMQ publisher confirms),
  with up to --acked-in-flight batches (100) awaiting theirs at once, as a pipelining client
  would;
- consumer: one consumer reads the stored messages, about 1,000 (200 KB) a fetch, checking
  each message (pylog: its XXH3 checksum; RabbitMQ: a CRC32 of the body);
- latency: a producer at 10,000 msg/s for 10 s while a consumer records produce-to-consume
  times: pylog with its default flush settings and with flush.messages = 1, and RabbitMQ,
  each beside a probe of the disk's own fsync latency (perf.latency.DiskProbe), so that a
  stall shows whose it is; the table gives the worst round's p99 beside the median's;
- memory: pylogd's RSS (supervisor and workers) sampled while --memory-gb flow through it.

A system that cannot send --messages (the paper's 10 million) within --budget-s of a run is
given fewer: a calibration run of 100,000 messages estimates its rate first. A producer run's
rate counts from the first send to all messages held (pylog: visible to consumers, a flush
made by ack=all markers rather than waited for from the flush timer, perf/pylog_runs.py);
the time from the last send to that point is its own column, "visible after". Each run prints
one JSON line; the medians go to perf/paper.md (a table) and perf/paper.png (a chart like the
paper's figures 4 and 5). Every loop is bounded in count and time. Run it alone: anything
beside it on 2 cores skews it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from broker.protocol import Ack
from perf import peer_rabbitmq, pylog_runs
from perf.cpu import anonymous_rss_bytes, rss_bytes
from perf.latency import DiskProbe
from perf.peer_rabbitmq import PrivateRabbitMQ
from perf.pylog_runs import MESSAGE_BYTES, PrivatePylogd, fresh_topic

Result = dict[str, Any]
PERF = Path(__file__).parent
CALIBRATION_MESSAGES = 100_000


class Harness:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.results: list[Result] = []
        self.runs = 0

    def record(self, experiment: str, system: str, result: Result) -> None:
        line = {"experiment": experiment, "system": system, **result}
        if result.get("seconds"):
            line["msgs_per_s"] = round(result["messages"] / result["seconds"])
            line["mb_per_s"] = round(
                result["messages"] * MESSAGE_BYTES / result["seconds"] / 1e6, 1
            )
        print(json.dumps(line), flush=True)
        self.results.append(line)

    def sized(self, run: Callable[[int], Result]) -> Callable[[], Result]:
        """`run` with a message count that fits the time budget (calibrated once)."""
        count: list[int] = []

        def sized_run() -> Result:
            if not count:
                calibration = run(min(self.args.messages, CALIBRATION_MESSAGES))
                rate = calibration["messages"] / calibration["seconds"]
                count.append(
                    max(
                        min(self.args.messages, CALIBRATION_MESSAGES),
                        min(self.args.messages, int(rate * self.args.budget_s)),
                    )
                )
            return run(count[0])

        return sized_run

    def topic(self) -> str:
        self.runs += 1
        return f"paper-{self.runs}"

    # -- experiments -----------------------------------------------------------------------

    def producer(self, pylog: PrivatePylogd, rabbit: PrivateRabbitMQ) -> None:
        for acked in (False, True):
            for batch in (1, 50):
                name = f"producer_batch{batch}_{'acked' if acked else 'no_ack'}"
                ack = Ack.FLUSHED if acked else Ack.NONE

                in_flight = self.args.acked_in_flight if acked else 1

                def run_pylog(
                    n: int, batch: int = batch, ack: Ack = ack, in_flight: int = in_flight
                ) -> Result:
                    with fresh_topic(pylog.endpoint, self.topic()) as topic:
                        return pylog_runs.produce(
                            pylog, topic, n, batch, ack, max_in_flight=in_flight
                        )

                def run_rabbit(
                    n: int, batch: int = batch, acked: bool = acked, in_flight: int = in_flight
                ) -> Result:
                    return peer_rabbitmq.produce(
                        rabbit.url,
                        self.topic(),
                        n,
                        batch,
                        acked,
                        pids=rabbit.pids(),
                        in_flight=in_flight,
                    )

                self.alternate(name, self.sized(run_pylog), self.sized(run_rabbit))

    def consumer(self, pylog: PrivatePylogd, rabbit: PrivateRabbitMQ) -> None:
        def run_pylog(n: int) -> Result:
            with fresh_topic(pylog.endpoint, self.topic()) as topic:
                pylog_runs.produce(pylog, topic, n, 50, Ack.NONE)  # untimed fill
                return pylog_runs.consume(pylog, topic, n)

        def run_rabbit(n: int) -> Result:
            return peer_rabbitmq.consume(rabbit.url, self.topic(), n, pids=rabbit.pids())

        self.alternate("consumer", self.sized(run_pylog), self.sized(run_rabbit))

    def latency(self, pylog: PrivatePylogd, rabbit: PrivateRabbitMQ) -> None:
        rate, seconds = self.args.latency_rate, self.args.latency_s
        with PrivatePylogd(self.work / "pylogd-flush1", "--log-flush-messages", "1") as eager:
            for _ in range(self.args.repeat):
                for system, broker in (("pylog", pylog), ("pylog_flush_messages_1", eager)):
                    with fresh_topic(broker.endpoint, self.topic()) as topic, self.probe() as disk:
                        result = pylog_runs.latency(broker, topic, rate, seconds)
                    self.record("latency", system, {**result, **disk.summary()})
                with self.probe() as disk:
                    result = peer_rabbitmq.latency(rabbit.url, self.topic(), rate, seconds)
                self.record("latency", "rabbitmq", {**result, **disk.summary()})

    def probe(self) -> DiskProbe:
        """The disk's own fsync latency, measured beside a latency run, on the disk that
        holds both systems' data."""
        return DiskProbe(self.work)

    def memory(self, pylog: PrivatePylogd) -> None:
        """pylogd's memory while --memory-gb of 200-byte messages flow in and are read back:
        its own (anonymous RSS) and all of its RSS, which includes the segment pages its mmap
        reads touch: the OS page cache, shared and reclaimable, not the broker's."""
        messages = int(self.args.memory_gb * 1e9 / MESSAGE_BYTES)
        own: list[int] = []
        total: list[int] = []
        stop = threading.Event()
        root, *children = pylog.pids()
        java = [p for p in children if "java" in _command(p)]

        def sample() -> None:
            # Both count a process with its descendants: pylogd's tree, less the ZooKeeper JVM
            # (counted in, by mistake, in the tables before issue 12).
            own.append(anonymous_rss_bytes([root]) - anonymous_rss_bytes(java))
            total.append(rss_bytes([root]) - rss_bytes(java))

        def sampling() -> None:
            while not stop.wait(0.5):
                sample()

        sampler = threading.Thread(target=sampling, daemon=True)
        with fresh_topic(pylog.endpoint, self.topic()) as topic:
            sample()
            sampler.start()
            produced = pylog_runs.produce(pylog, topic, messages, 50, Ack.NONE, limit_s=1800)
            consumed = pylog_runs.consume(pylog, topic, messages)
            stop.set()
            sampler.join()
            sample()
        mb = 1e6
        self.record(
            "memory",
            "pylog",
            {
                "messages": messages,
                "gigabytes": round(messages * MESSAGE_BYTES / 1e9, 2),
                "own_before_mb": round(own[0] / mb, 1),
                "own_min_mb": round(min(own) / mb, 1),
                "own_max_mb": round(max(own) / mb, 1),
                "rss_before_mb": round(total[0] / mb, 1),
                "rss_max_mb": round(max(total) / mb, 1),
                "produce_msgs_per_s": round(messages / produced["seconds"]),
                "consume_msgs_per_s": round(messages / consumed["seconds"]),
            },
        )

    def alternate(
        self, experiment: str, pylog: Callable[[], Result], rabbit: Callable[[], Result]
    ) -> None:
        for _ in range(self.args.repeat):
            self.record(experiment, "pylog", pylog())
            self.record(experiment, "rabbitmq", rabbit())

    # -- results ---------------------------------------------------------------------------

    def medians(self) -> dict[tuple[str, str], Result]:
        groups: dict[tuple[str, str], list[Result]] = {}
        for line in self.results:
            groups.setdefault((line["experiment"], line["system"]), []).append(line)
        out = {}
        for key, lines in groups.items():
            numeric = {k for k, v in lines[0].items() if isinstance(v, int | float)}
            out[key] = {k: statistics.median(line[k] for line in lines) for k in numeric}
            out[key]["runs"] = len(lines)
            for worst in ("p99_ms", "disk_max_ms"):  # latency: a stalled round is not a median's
                if worst in numeric:
                    out[key][f"worst_{worst}"] = max(line[worst] for line in lines)
        return out


def _command(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    return ""


def write_table(medians: dict[tuple[str, str], Result], command: str, path: Path) -> None:
    lines = [
        f"Measured {datetime.date.today()} on {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, with `{command}` (medians of the runs).",
        "",
        "| experiment | system | runs | messages | msgs/s | MB/s | visible after ms "
        "| client CPU s | broker CPU s |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for (experiment, system), m in sorted(medians.items()):
        if "msgs_per_s" not in m:
            continue
        visible = f"{m['visible_after_s'] * 1000:,.1f}" if "visible_after_s" in m else ""
        lines.append(
            f"| {experiment} | {system} | {m['runs']} | {m['messages']:,.0f} | "
            f"{m['msgs_per_s']:,.0f} | {m['mb_per_s']:.1f} | {visible} | "
            f"{m['client_cpu_s']:.1f} | {m.get('broker_cpu_s', float('nan')):.1f} |"
        )
    latency = {k: v for k, v in medians.items() if k[0] == "latency"}
    if latency:
        lines += [
            "",
            "| latency at 10,000 msg/s | p50 ms | p99 ms | p99 ms, worst round | max ms "
            "| lost (median) | disk fsync p99 ms | disk fsync max ms, worst round |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for (_, system), m in sorted(latency.items()):
            lines.append(
                f"| {system} | {m['p50_ms']:.1f} | {m['p99_ms']:.1f} | {m['worst_p99_ms']:.1f} "
                f"| {m['max_ms']:.1f} | {m['lost']:,.0f} | {m['disk_p99_ms']:.1f} "
                f"| {m['worst_disk_max_ms']:.1f} |"
            )
    memory = medians.get(("memory", "pylog"))
    if memory:
        lines += [
            "",
            f"Memory, while {memory['gigabytes']:.1f} GB of messages flowed into pylogd and back "
            f"out: its own memory (anonymous RSS of supervisor and workers) was "
            f"{memory['own_before_mb']:.0f} MB before and stayed between "
            f"{memory['own_min_mb']:.0f} and {memory['own_max_mb']:.0f} MB; its whole RSS, "
            f"which counts the segment pages its mmap reads touch (the OS page cache), went "
            f"from {memory['rss_before_mb']:.0f} to at most {memory['rss_max_mb']:.0f} MB.",
        ]
    path.write_text("\n".join(lines) + "\n")


def draw_chart(medians: dict[tuple[str, str], Result], path: Path) -> None:
    """Bars in the manner of the paper's figures 4 (producer) and 5 (consumer)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = ("pylog", "rabbitmq")
    colours = {"pylog": "#1f6fb4", "rabbitmq": "#e07b20"}
    producer = [
        ("batch 1", "producer_batch1_no_ack"),
        ("batch 50", "producer_batch50_no_ack"),
        ("batch 1, acked", "producer_batch1_acked"),
        ("batch 50, acked", "producer_batch50_acked"),
    ]
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), width_ratios=(3, 1))
    width = 0.38
    for i, system in enumerate(systems):
        rates = [medians.get((e, system), {}).get("msgs_per_s", 0) for _, e in producer]
        xs = [x + (i - 0.5) * width for x in range(len(producer))]
        left.bar(xs, rates, width, label=system, color=colours[system])
        for x, rate in zip(xs, rates, strict=True):
            left.annotate(f"{rate:,.0f}", (x, rate), ha="center", va="bottom", fontsize=7)
    left.set_xticks(range(len(producer)), [label for label, _ in producer])
    left.set_ylabel("messages/s (200 bytes)")
    left.set_title("Producer performance (cf. paper, figure 4)")
    left.legend()
    rates = [medians.get(("consumer", s), {}).get("msgs_per_s", 0) for s in systems]
    right.bar(systems, rates, color=[colours[s] for s in systems])
    for x, rate in enumerate(rates):
        right.annotate(f"{rate:,.0f}", (x, rate), ha="center", va="bottom", fontsize=7)
    right.set_title("Consumer (cf. figure 5)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


@contextlib.contextmanager
def brokers(work: Path) -> Iterator[tuple[PrivatePylogd, PrivateRabbitMQ]]:
    with PrivatePylogd(work / "pylogd") as pylog, PrivateRabbitMQ(work / "rabbitmq") as rabbit:
        yield pylog, rabbit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=60.0, help="time a run may take")
    parser.add_argument(
        "--acked-in-flight",
        type=int,
        default=100,
        help="batches awaiting their acks (pylog) or confirms (RabbitMQ) in the acked runs",
    )
    parser.add_argument("--latency-rate", type=int, default=10_000)
    parser.add_argument("--latency-s", type=float, default=10.0)
    parser.add_argument("--memory-gb", type=float, default=2.0)
    parser.add_argument(
        "--only", choices=("producer", "consumer", "latency", "memory"), action="append"
    )
    parser.add_argument("--out", type=Path, default=PERF, help="where paper.md and .png go")
    args = parser.parse_args()
    if args.messages < 1000 or args.repeat < 1 or args.budget_s <= 0:
        parser.error("--messages >= 1000, --repeat >= 1 and --budget-s > 0, please")
    if not peer_rabbitmq.installed():
        parser.error("RabbitMQ is not installed: run scripts/perf-setup first")
    chosen = args.only or ["producer", "consumer", "latency", "memory"]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pylog-paper-", dir="/tmp") as tmp:
        work = Path(tmp)
        harness = Harness(args, work)
        with brokers(work) as (pylog, rabbit):
            for name in chosen:
                if name == "memory":
                    harness.memory(pylog)
                else:
                    getattr(harness, name)(pylog, rabbit)
    medians = harness.medians()
    command = "scripts/perf " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k not in ("only", "out")
    )
    args.out.mkdir(parents=True, exist_ok=True)
    write_table(medians, command, args.out / "paper.md")
    if any(k[0].startswith("producer") or k[0] == "consumer" for k in medians):
        draw_chart(medians, args.out / "paper.png")
    print(json.dumps({"done_in_s": round(time.monotonic() - started, 1)}))


if __name__ == "__main__":
    main()

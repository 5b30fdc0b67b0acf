"""Compressed sets that expand to the most the broker accepts, against another client of the
same worker (issue 50, item 4): how long a small produce waits while many connections
pipeline PRODUCEs whose sets the worker must decompress.

    flock /tmp/bench.lock .venv/bin/python -m perf.bench_expansion \\
        [--scenarios producer,none] [--conns 20] [--per-conn 40] [--per-conn-none 3] \\
        [--window 32] [--dir DIR]

Per scenario a fresh private pylogd (perf/pylog_runs.py's PrivatePylogd: its defaults, its
private ZooKeeper, on 127.0.0.1) with one log dir, so one worker holds both partitions of its
topic "t" (checked: one pylog-worker process, both partition folders in that dir), and
--log-flush-interval-ms 50. Then:

- the victim: one client sends a small PRODUCE (ack=flushed) to partition 1, one at a time,
  0.1 s apart, each latency recorded (a reply waited for up to --victim-wait s), alone for
  --baseline s first;
- the attack: --conns connections each pipeline --per-conn PRODUCEs (ack=written, at most
  --window unanswered) to partition 0, for at most --deadline s, of a zstd set expanding to
  the most the broker accepts (64 MiB: MAX_INNER_SET_BYTES = MAX_EXPANDED_BYTES):
    producer: compression=producer (the default), one set of 127 messages of 512 KiB (63.5
              MiB, about 2 KB on the wire): checked, stored as it came;
    none:     a topic with compression=none, one set of 100,000 messages (64 MiB, 5.7 KB on
              the wire), --per-conn-none requests a connection: checked, then decompressed
              again and written plain (64 MiB each);
    issue8:   (optional) compression=producer, the issue's payload: 8 such sets in one
              PRODUCE (27 KB): the first is decompressed whole, the second is over the 64 MiB
              budget -> MESSAGE_TOO_LARGE, nothing stored.

Prints one JSON line a scenario: `victim_during_n` (victim requests sent during the attack),
their `victim_max_s`, `victim_p50_s`, and `victim_over_10s` (how many took over 10 s), with
their results by error code; `victim_baseline_ms_p50` (the victim alone); `attackers` (requests
sent and answered, answered by error code) and `attack_s`; the worker's CPU seconds during
the attack (`worker_cpu_s_during`), its peak RSS (VmHWM, `worker_peak_rss_mib`) and the most
of its RSS sampled every 0.2 s. Every count and wait is bounded; the broker is stopped
(SIGTERM, then SIGKILL) and its data removed after each scenario. Run it alone: on 2 cores
anything beside it skews the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import zmq

from broker import protocol
from broker.client import Admin
from broker.log import codec, compression, encode_message
from broker.log.compression import Codec, Compressor
from broker.protocol import Ack, ProduceRequest
from perf.cpu import cpu_seconds, tree_pids
from perf.pylog_runs import PrivatePylogd

SCENARIOS = ("producer", "issue8", "none")
TOPIC = "t"
ATTACKED, VICTIM = 0, 1
"""The partitions of TOPIC the attackers and the victim produce to."""
VICTIM_PAUSE_S = 0.1
RSS_SAMPLE_S = 0.2


def payloads(names: list[str]) -> dict[str, bytes]:
    """The message set each named scenario's attackers send (each built once)."""
    z = Compressor(Codec.ZSTD, 19)
    sets: dict[str, bytes] = {}
    if {"producer", "issue8"} & set(names):
        # 127 messages of 512 KiB (each within the default max_message_bytes): 63.5 MiB
        big = codec.encode_message(bytes(512 * 1024 - 64), None, 1, True) * 127
        one_big = z.wrap(big, 1)
        del big
        sets["producer"], sets["issue8"] = one_big, one_big * 8
    if "none" in names:
        n = compression.MAX_SET_MESSAGES
        empty = codec.encode_message(b"", None, 1, True)
        each = codec.encode_message(
            bytes(compression.MAX_INNER_SET_BYTES // n - len(empty)), None, 1, True
        )
        sets["none"] = z.wrap(each * n, 1)
    return sets


def status_kib(pid: int, key: str) -> int:
    """A `key:` line of /proc/<pid>/status, in KiB (0 when gone)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def started_at(pid: int) -> str | None:
    """Process `pid`'s start time (field 22 of /proc/<pid>/stat), None when gone or a zombie:
    a pid matched with it is not another process that took the number since."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return None if fields[0] == "Z" else fields[19]


def comm(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/comm").read_text().strip()
    return ""


@contextlib.contextmanager
def running_pylogd(data_dir: Path) -> Iterator[PrivatePylogd]:
    """A PrivatePylogd with one log dir (one worker) that flushes every 50 ms; on the way out,
    after its SIGTERM (SIGKILL after 60 s), any of its processes still running is SIGKILLed."""
    pylogd = PrivatePylogd(
        data_dir,
        "--broker-log-dirs",
        str(data_dir / "logs"),
        "--log-flush-interval-ms",
        "50",
    )
    known: dict[int, str] = {}
    try:
        with pylogd:
            known = {pid: s for pid in pylogd.pids() if (s := started_at(pid)) is not None}
            yield pylogd
            known.update({pid: s for pid in pylogd.pids() if (s := started_at(pid)) is not None})
    finally:
        for pid, start in known.items():
            if started_at(pid) == start:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def the_worker(pylogd: PrivatePylogd) -> int:
    """The pid of pylogd's one worker (a RuntimeError if it has several, or none)."""
    assert pylogd.process is not None
    workers = [p for p in tree_pids(pylogd.process.pid) if comm(p).startswith("pylog-worker-")]
    if len(workers) != 1:
        raise RuntimeError(f"pylogd has {len(workers)} workers, not one")
    return workers[0]


def error_name(code: object) -> str:
    return str(getattr(code, "name", code))


class Attack:
    """What the attackers did, added up under a lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent = 0
        self.answered = 0
        self.by_error: dict[str, int] = {}

    def add(self, sent: int, answered: int, by_error: dict[str, int]) -> None:
        with self.lock:
            self.sent += sent
            self.answered += answered
            for name, count in by_error.items():
                self.by_error[name] = self.by_error.get(name, 0) + count


def attacker(
    endpoint: str,
    message_set: bytes,
    requests: int,
    window: int,
    deadline: float,
    index: int,
    attack: Attack,
) -> None:
    """`requests` PRODUCEs of `message_set` to partition ATTACKED at ack=written, at most
    `window` unanswered, until all are answered or time.monotonic() passes `deadline`."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    sent = answered = 0
    by_error: dict[str, int] = {}
    request = ProduceRequest(TOPIC, ATTACKED, Ack.WRITTEN, message_set)
    try:
        while answered < requests and time.monotonic() < deadline:
            while sent < requests and sent - answered < window:
                sock.send(protocol.encode_produce(sent + 1, f"attacker-{index}", request)[0])
                sent += 1
            if sock.poll(200):
                header = protocol.decode_reply_header(sock.recv_multipart())
                name = error_name(header.error_code)
                by_error[name] = by_error.get(name, 0) + 1
                answered += 1
    finally:
        sock.close()
        context.term()
        attack.add(sent, answered, by_error)


def victim(
    endpoint: str, stop: threading.Event, wait_s: float, out: list[tuple[float, float, str]]
) -> None:
    """One small PRODUCE at ack=flushed to partition VICTIM at a time, VICTIM_PAUSE_S apart,
    until `stop`; appends (sent at, latency, result) for each to `out`."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()

    def connected() -> zmq.Socket[bytes]:
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        return sock

    sock = connected()
    correlation_id = 0
    try:
        while not stop.is_set():
            correlation_id += 1
            message = encode_message(b"victim %d" % correlation_id)
            request = ProduceRequest(TOPIC, VICTIM, Ack.FLUSHED, message)
            started = time.monotonic()
            sock.send(protocol.encode_produce(correlation_id, "victim", request)[0])
            result = "timeout"
            while time.monotonic() - started < wait_s:
                if sock.poll(100):
                    header = protocol.decode_reply_header(sock.recv_multipart())
                    if header.correlation_id != correlation_id:
                        continue
                    result = error_name(header.error_code)
                    break
                if stop.is_set() and time.monotonic() - started > 1:
                    result = "abandoned"
                    break
            out.append((started, time.monotonic() - started, result))
            if result == "timeout":  # a fresh socket: no late reply taken for the next
                sock.close()
                sock = connected()
            stop.wait(VICTIM_PAUSE_S)
    finally:
        sock.close()
        context.term()


def partition_folders(log_dir: Path) -> list[str]:
    return sorted(p.name for p in log_dir.iterdir() if p.is_dir())


def run_scenario(
    name: str, message_set: bytes, data_dir: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """One scenario against a fresh pylogd under `data_dir`: its JSON line's figures."""
    with running_pylogd(data_dir) as pylogd:
        settings = {"compression": "none"} if name == "none" else {}
        with Admin(pylogd.endpoint, timeout_s=30) as admin:
            admin.create_topic(TOPIC, 2, settings)
        worker = the_worker(pylogd)
        requests = args.per_conn_none if name == "none" else args.per_conn
        window = min(args.window, requests)
        rss_samples: list[int] = []
        latencies: list[tuple[float, float, str]] = []
        stop_victim = threading.Event()
        victim_thread = threading.Thread(
            target=victim,
            args=(pylogd.endpoint, stop_victim, args.victim_wait, latencies),
            daemon=True,
        )
        victim_thread.start()
        time.sleep(args.baseline)  # the victim alone first
        cpu_before = cpu_seconds([worker])
        attack = Attack()
        attack_start = time.monotonic()
        deadline = attack_start + args.deadline
        attackers = [
            threading.Thread(
                target=attacker,
                args=(pylogd.endpoint, message_set, requests, window, deadline, i, attack),
                daemon=True,
            )
            for i in range(args.conns)
        ]
        for thread in attackers:
            thread.start()
        while any(t.is_alive() for t in attackers) and time.monotonic() < deadline + 5:
            rss_samples.append(status_kib(worker, "VmRSS"))
            time.sleep(RSS_SAMPLE_S)
        for thread in attackers:
            thread.join(5)
        attack_end = time.monotonic()
        time.sleep(args.tail)
        stop_victim.set()
        victim_thread.join(args.victim_wait + 5)
        cpu_during = cpu_seconds([worker]) - cpu_before
        peak_kib = status_kib(worker, "VmHWM")
        folders = partition_folders(data_dir / "logs")
    the_worker_held = f"{TOPIC}-{ATTACKED}" in folders and f"{TOPIC}-{VICTIM}" in folders
    if not the_worker_held:
        raise RuntimeError(f"the partitions are not both in the one log dir: {folders}")
    baseline = [latency for at, latency, _ in latencies if at < attack_start]
    during = [(latency, res) for at, latency, res in latencies if attack_start <= at <= attack_end]
    seconds = [latency for latency, _ in during]
    results: dict[str, int] = {}
    for _, result in during:
        results[result] = results.get(result, 0) + 1
    return {
        "scenario": name,
        "wire_bytes_per_request": len(message_set),
        "conns": args.conns,
        "per_conn": requests,
        "window": window,
        "attack_s": round(attack_end - attack_start, 1),
        "attackers": {
            "sent": attack.sent,
            "answered": attack.answered,
            "answered_by_error": dict(sorted(attack.by_error.items())),
        },
        "victim_baseline_ms_p50": round(1000 * statistics.median(baseline), 1)
        if baseline
        else None,
        "victim_during_n": len(seconds),
        "victim_max_s": round(max(seconds), 2) if seconds else None,
        "victim_p50_s": round(statistics.median(seconds), 2) if seconds else None,
        "victim_over_10s": sum(s > 10 for s in seconds),
        "victim_results": results,
        "worker_cpu_s_during": round(cpu_during, 1),
        "worker_peak_rss_mib": round(peak_kib / 1024),
        "worker_rss_max_sampled_mib": round(max(rss_samples, default=0) / 1024),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", default="producer,none", help=",".join(SCENARIOS))
    parser.add_argument("--conns", type=int, default=20, help="attacker connections")
    parser.add_argument("--per-conn", type=int, default=40, help="requests per attacker")
    parser.add_argument(
        "--per-conn-none", type=int, default=3, help="requests per attacker in scenario none"
    )
    parser.add_argument("--window", type=int, default=32, help="unanswered per attacker")
    parser.add_argument("--deadline", type=float, default=150.0, help="attack time limit, s")
    parser.add_argument("--victim-wait", type=float, default=120.0, help="a reply's limit, s")
    parser.add_argument("--baseline", type=float, default=3.0, help="victim alone first, s")
    parser.add_argument("--tail", type=float, default=2.0, help="victim alone after, s")
    parser.add_argument("--dir", type=Path)
    args = parser.parse_args()
    names = args.scenarios.split(",")
    unknown = set(names) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios: {sorted(unknown)}")
    if min(args.conns, args.per_conn, args.per_conn_none, args.window) < 1:
        parser.error("--conns, --per-conn, --per-conn-none and --window must be at least 1")
    sets = payloads(names)
    with tempfile.TemporaryDirectory(dir=args.dir) as data:
        for name in names:
            data_dir = Path(data) / name
            try:
                line = run_scenario(name, sets[name], data_dir, args)
            finally:
                shutil.rmtree(data_dir, ignore_errors=True)
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()

"""The cost of security (issue 16): the paper's producer and consumer with CurveZMQ on and off,
in one run, alternating; and what the ACL check adds to each request on the front.

    flock /tmp/bench.lock .venv/bin/python -m perf.bench_security [--repeat 3]
        [--batch1-messages 200000] [--batch50-messages 1000000] [--consume-messages 1000000]
        [--checks 1000000]

Three private pylogd (perf/pylog_runs.py's PrivatePylogd: default settings, a private
ZooKeeper each, metrics on), all running for the whole run:

- plaintext: security.mode plaintext (the single-box default);
- curve: security.mode curve; the client is principal `bench`, let in by a principals file,
  whose ACL (added in ZooKeeper) grants produce and fetch on `sec.*`: not a super user, so
  every request goes through the ACL check (a cached decision after its topic's first);
- curve_unchecked: the same, but its front never checks ACLs (pylogd started through this
  module, which has Front.secure leave the authorizer out: a patch of the benchmark's process,
  no change of pylogd's code), so that curve against curve_unchecked is the check's cost end
  to end, and curve_unchecked against plaintext the encryption's.

The experiments are perf/pylog_runs.py's, as scripts/perf runs them: the producer (200-byte
messages, ack none, the run ending when the broker holds them all) at batch 1 and batch 50, and
the consumer (fetches of about 1,000 messages, every checksum verified, after an untimed load).
Each experiment runs `--repeat` rounds of the three systems in turn, each on a fresh topic. A
run also reads the supervisor's own CPU (all its threads, the ZeroMQ I/O thread that encrypts
included; /proc) and the requests its front read (its metrics endpoint): the front's CPU a
request.

Then, in this process, the check itself as the front makes it (broker.front: the User-Id read
from the request's frame, protocol.peek_api, Authorizer.check with its decision cached), on the
frames of a PRODUCE request received through a real Curve ROUTER whose ZAP handler let the
client in: nanoseconds a request, each part alone and the three together, best of 5 rounds of
`--checks`, with the loop's own cost taken off.

Prints one JSON line a run (with the client's and the broker's CPU a message), one of the
check's figures (and its share of the front's CPU a request at batch 1, curve), then one of
medians and ratios. Run it alone: on 2 cores anything beside it skews the figures; perf/README.md
("Security") has a run's figures and what they mean.
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from broker import protocol
from broker.front import OPERATIONS, _principal
from broker.log.message import encode_message
from broker.protocol import Ack, ProduceRequest, RequestHeader
from broker.registry import Registry
from broker.security import (
    Acl,
    Authorizer,
    ClientKeys,
    Operation,
    Principals,
    ZapHandler,
    ZooKeeperAuth,
    generate_keys,
    load_key_pair,
    load_public_key,
)
from broker.transport import tagged_identity
from broker.zmqio import receive_routed
from perf.cpu import cpu_seconds
from perf.pylog_runs import PrivatePylogd, consume, fresh_topic, produce

Result = dict[str, Any]
SYSTEMS = ("plaintext", "curve", "curve_unchecked")
EXPERIMENTS = ("producer_batch1", "producer_batch50", "consumer")
PRINCIPAL = "bench"
"""The client's principal: an ACL, no super user."""
ADMIN = "admin"
"""The super user that creates and deletes the runs' topics."""
RESOURCE = "sec.*"
"""What the client's ACL names; every run's topic is under it."""
UNCHECKED = "--pylogd-without-acl-check"
"""First argument of this module when it is run as the curve_unchecked pylogd."""
START_TIMEOUT_S = 30.0


@dataclass
class System:
    """A running pylogd and the keys its clients present (None in plaintext)."""

    name: str
    pylogd: PrivatePylogd
    client: ClientKeys | None = None
    admin: ClientKeys | None = None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen in {START_TIMEOUT_S} s")
        time.sleep(0.05)


def broker_log(pylogd: PrivatePylogd) -> str:
    return (pylogd.data_dir / "pylogd.log").read_text(errors="replace")


class Keys:
    """The key pairs of one run: the broker's, the bench principal's and the super user's."""

    def __init__(self, directory: Path) -> None:
        for name in ("broker", PRINCIPAL, ADMIN):
            generate_keys(directory, name)
        self.directory = directory
        self.broker_secret = directory / "broker.key_secret"
        self.principals_file = directory / "principals"
        self.principals_file.write_text(
            "".join(f"{name} {self.public(name).decode()}\n" for name in (PRINCIPAL, ADMIN))
        )

    def public(self, name: str) -> bytes:
        return load_public_key(self.directory / f"{name}.key")

    def client(self, name: str) -> ClientKeys:
        return ClientKeys.load(self.directory / f"{name}.key_secret", self.directory / "broker.key")


METRICS = ("--metrics-enabled", "true", "--metrics-port", "0")


def start_curve(
    stack: ExitStack, name: str, work: Path, keys: Keys, program: tuple[str, ...] = ()
) -> System:
    """A Curve pylogd whose principal `bench` has the ACL (in its private ZooKeeper)."""
    zookeeper_port = free_port()
    flags = (
        *("--security-mode", "curve", "--security-key-file", str(keys.broker_secret)),
        *("--security-principals-file", str(keys.principals_file)),
        *("--security-super-users", ADMIN, "--zookeeper-port", str(zookeeper_port)),
    )
    pylogd = stack.enter_context(PrivatePylogd(work / name, *flags, *METRICS, program=program))
    auth = ZooKeeperAuth.load(pylogd.data_dir / "zookeeper.auth")  # the registry is closed
    with Registry(f"127.0.0.1:{zookeeper_port}", "/pylog", auth=auth) as registry:
        registry.security.add_acl(
            Acl(PRINCIPAL, RESOURCE, frozenset({Operation.PRODUCE, Operation.FETCH}))
        )
    wait_for(lambda: "ACLs in ZooKeeper: 1" in broker_log(pylogd), f"{name}: the ACL to apply")
    return System(name, pylogd, keys.client(PRINCIPAL), keys.client(ADMIN))


def serve_without_acl_check(argv: Sequence[str]) -> None:
    """pylogd as `pylogd argv` runs it, but its front, made a Curve server, keeps no authorizer:
    ZAP still lets in known keys only, and no request is checked against ACLs."""
    from broker.front import Front
    from cli.pylogd import main

    secure = Front.secure

    def secure_without_check(
        self: Front, secret_key: bytes, zap: ZapHandler, authorizer: Authorizer
    ) -> None:
        secure(self, secret_key, zap, authorizer)
        self.authorizer = None

    Front.secure = secure_without_check  # type: ignore[method-assign]
    main(list(argv))


# -- the front's figures ---------------------------------------------------------------------


def supervisor_cpu_s(pylogd: PrivatePylogd) -> float:
    """CPU seconds of the supervisor process alone (every thread; not its workers or
    ZooKeeper)."""
    root, *descendants = pylogd.pids()
    return cpu_seconds([root]) - cpu_seconds(descendants)


def front_requests(pylogd: PrivatePylogd) -> int:
    """Requests the front has read from clients (pylog_front_requests_total)."""
    found = re.findall(r"metrics on (http://\S+/metrics)", broker_log(pylogd))
    if not found:
        raise RuntimeError(f"{pylogd.data_dir}: pylogd did not say where its metrics are")
    with urllib.request.urlopen(found[-1], timeout=10) as response:
        text = response.read().decode()
    sample = re.search(r"^pylog_front_requests_total (\S+)$", text, re.MULTILINE)
    if sample is None:
        raise RuntimeError("no pylog_front_requests_total in the metrics")
    return int(float(sample.group(1)))


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.results: list[Result] = []
        self.topics = 0

    def run(self, system: System, experiment: str) -> Result:
        """One timed run of `experiment` against `system`, on a fresh topic."""
        self.topics += 1
        pylogd, keys = system.pylogd, system.client
        with fresh_topic(pylogd.endpoint, f"sec.run-{self.topics}", keys=system.admin) as topic:
            if experiment == "consumer":
                count = self.args.consume_messages
                produce(pylogd, topic, count, 50, Ack.NONE, keys=keys)  # untimed load
            requests = front_requests(pylogd)
            cpu = supervisor_cpu_s(pylogd)
            if experiment == "consumer":
                result = consume(pylogd, topic, count, keys=keys)
            else:
                batch = int(experiment.removeprefix("producer_batch"))
                count = getattr(self.args, f"batch{batch}_messages")
                result = produce(pylogd, topic, count, batch, Ack.NONE, keys=keys)
            cpu = supervisor_cpu_s(pylogd) - cpu
            requests = front_requests(pylogd) - requests
        line = {
            "experiment": experiment,
            "system": system.name,
            **result,
            "msgs_per_s": round(result["messages"] / result["seconds"]),
            "front_requests": requests,
            "front_cpu_s": round(cpu, 2),
            "front_us_per_request": round(cpu / requests * 1e6, 2),
            "client_us_per_message": round(result["client_cpu_s"] / result["messages"] * 1e6, 2),
            "broker_us_per_message": round(result["broker_cpu_s"] / result["messages"] * 1e6, 2),
        }
        print(json.dumps(line), flush=True)
        self.results.append(line)
        return line

    def alternate(self, systems: Iterable[System]) -> None:
        chosen = list(systems)
        for experiment in EXPERIMENTS:
            for _ in range(self.args.repeat):
                for system in chosen:
                    self.run(system, experiment)


FIGURES = ("msgs_per_s", "front_us_per_request", "client_us_per_message", "broker_us_per_message")
"""A run's figures whose medians the summary gives: the rate, the supervisor's CPU a request
read, and the client's and the broker's (supervisor, workers, ZooKeeper) CPU a message, which
on a shared machine vary less than the rate."""


def summarize(results: Iterable[Result]) -> Result:
    """Medians per experiment and system (FIGURES), and the ratios that answer the questions: curve
    against plaintext (the cost of Curve and ACLs together), curve_unchecked against plaintext
    (encryption alone), curve against curve_unchecked (the ACL check alone)."""
    runs: dict[tuple[str, str], list[Result]] = {}
    for line in results:
        runs.setdefault((line["experiment"], line["system"]), []).append(line)
    summary: Result = {}
    for (experiment, system), lines in runs.items():
        medians = {name: statistics.median(line[name] for line in lines) for name in FIGURES}
        summary.setdefault(experiment, {})[system] = {
            "runs": len(lines),
            **{name: round(value, 2) for name, value in medians.items()},
            "msgs_per_s": round(medians["msgs_per_s"]),
        }
    for figures in summary.values():
        for over, under in (
            ("curve", "plaintext"),
            ("curve_unchecked", "plaintext"),
            ("curve", "curve_unchecked"),
        ):
            if over in figures and under in figures:
                rate = figures[over]["msgs_per_s"] / figures[under]["msgs_per_s"]
                figures[f"{over}/{under}"] = round(rate, 3)
    return summary


# -- the check alone -------------------------------------------------------------------------


def received_request(keys: Keys, topic: str) -> tuple[list[zmq.Frame], list[memoryview]]:
    """The frames of one PRODUCE request from principal `bench` as the front receives them: a
    Curve ROUTER with a ZAP handler (the broker's) that let the client in, read with
    broker.zmqio; and the request's frames as the front passes them on."""
    context = zmq.Context()
    zap = ZapHandler(context, Principals(keys.principals_file))
    router = context.socket(zmq.ROUTER)
    client = context.socket(zmq.DEALER)
    try:
        router.setsockopt(zmq.CURVE_SERVER, 1)
        router.setsockopt(zmq.CURVE_SECRETKEY, load_key_pair(keys.broker_secret)[1])
        router.setsockopt(zmq.ZAP_DOMAIN, b"pylog")
        port = router.bind_to_random_port("tcp://127.0.0.1")
        keys.client(PRINCIPAL).apply(client)
        client.connect(f"tcp://127.0.0.1:{port}")
        header = RequestHeader(protocol.Api.PRODUCE, protocol.API_VERSION, 1, "bench")
        request = ProduceRequest(topic, 0, Ack.NONE, encode_message(b"x" * 100))
        client.send_multipart(protocol.encode_request(header, request))
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        poller.register(zap.socket, zmq.POLLIN)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            ready = dict(poller.poll(100))
            if zap.socket in ready:
                zap.take(zap.socket.recv_multipart())
            if router in ready:
                identity, frames = receive_routed(router)
                return frames, tagged_identity(identity, frames)[1]
        raise TimeoutError("the Curve request did not arrive")
    finally:
        client.close(0)
        router.close(0)
        zap.close()
        context.term()


def ns_per_call(loop: Callable[[range], None], count: int, rounds: int = 5) -> float:
    """The best of `rounds` timings of `loop` over `count` iterations, in ns an iteration."""
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter_ns()
        loop(range(count))
        best = min(best, (time.perf_counter_ns() - start) / count)
    return best


def check_cost(keys: Keys, count: int) -> Result:
    """What the front adds to a routed request for the ACL check (broker.front._from_client's
    three steps, on real frames), in ns, less an empty loop's cost."""
    topic = "sec.check"
    frames, request_frames = received_request(keys, topic)
    route = protocol.KnownPrefixes().route(request_frames)
    assert route is not None
    authorizer = Authorizer([ADMIN])
    authorizer.update([Acl(PRINCIPAL, RESOURCE, frozenset({Operation.PRODUCE}))])
    principals = Principals(keys.principals_file)
    principal = _principal(frames, principals)
    api = protocol.peek_api(request_frames)
    authorizer.check(principal, OPERATIONS[api], route.topic)  # warms the cache
    peek_api, check = protocol.peek_api, authorizer.check

    def empty(times: range) -> None:
        for _ in times:
            pass

    def user_id(times: range) -> None:
        for _ in times:
            _principal(frames, principals)

    def api_peek(times: range) -> None:
        for _ in times:
            peek_api(request_frames)

    def cached_check(times: range) -> None:
        operation = OPERATIONS[api]
        for _ in times:
            check(principal, operation, topic)

    def whole(times: range) -> None:  # as the front does it
        for _ in times:
            check(_principal(frames, principals), OPERATIONS[peek_api(request_frames)], route.topic)

    loop_ns = ns_per_call(empty, count)
    figures = {
        name: round(ns_per_call(loop, count) - loop_ns)
        for name, loop in (
            ("user_id_ns", user_id),
            ("peek_api_ns", api_peek),
            ("check_ns", cached_check),
            ("whole_ns", whole),
        )
    }
    return {"principal": principal, "checks": count, **figures}


def main() -> None:
    if sys.argv[1:2] == [UNCHECKED]:
        serve_without_acl_check(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--batch1-messages", type=int, default=200_000)
    parser.add_argument("--batch50-messages", type=int, default=1_000_000)
    parser.add_argument("--consume-messages", type=int, default=1_000_000)
    parser.add_argument("--checks", type=int, default=1_000_000)
    args = parser.parse_args()
    counts = (args.batch1_messages, args.batch50_messages, args.consume_messages, args.checks)
    if min(args.repeat, *counts) < 1:
        parser.error("every count must be 1 or more")
    started = time.monotonic()
    bench = Bench(args)
    with tempfile.TemporaryDirectory(prefix="pylog-security-", dir="/tmp") as tmp:
        work = Path(tmp)
        keys = Keys(work / "keys")
        unchecked = (sys.executable, "-m", "perf.bench_security", UNCHECKED)
        with ExitStack() as stack:
            plaintext = stack.enter_context(PrivatePylogd(work / "plaintext", *METRICS))
            bench.alternate(
                [
                    System("plaintext", plaintext),
                    start_curve(stack, "curve", work, keys),
                    start_curve(stack, "curve_unchecked", work, keys, unchecked),
                ]
            )
        check = check_cost(keys, args.checks)
    summary = summarize(bench.results)
    batch1 = summary["producer_batch1"]["curve"]["front_us_per_request"]
    check["share_of_front_cpu_batch1"] = round(check["whole_ns"] / (batch1 * 1000), 4)
    print(json.dumps({"acl_check": check}))
    print(json.dumps({"summary": summary, "done_in_s": round(time.monotonic() - started, 1)}))


if __name__ == "__main__":
    main()

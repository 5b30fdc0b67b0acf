"""`pylogctl consume` and `produce` against a real three-broker cluster: every partition, where
to start and stop, keys and format strings, broker addresses, timeouts and Ctrl-C."""

from __future__ import annotations

import datetime
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq
from click.testing import CliRunner, Result

from broker.client import Producer
from broker.log import LogConfig, PartitionLog, encode_message
from cli.pylogctl import cli
from tests.cli.conftest import Cluster
from tests.client.test_connection import unused_endpoint
from tests.conftest import wait_until
from tests.pipes import PipeLines
from tests.pylogd import RunningBroker

PYLOGCTL = str(Path(sys.executable).with_name("pylogctl"))


def run(endpoint: str, *args: str, input: bytes | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), input=input, env={"PYLOG_BROKER": endpoint})


def lines(result: Result) -> list[str]:
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


def produce(endpoint: str, topic: str, messages: list[tuple[int, bytes, int]]) -> None:
    """(partition, value, timestamp_ms) each; keyed "k<partition>"."""
    with Producer(endpoint, topic) as producer:
        for partition, value, ms in messages:
            producer.send(value, key=b"k%d" % partition, timestamp_ms=ms, partition=partition)


def test_consume_reads_every_partition_from_where_it_is_told_until_where_it_is_told(
    cluster: Cluster, topic: str
) -> None:
    endpoint = cluster.endpoint
    assert run(endpoint, "topic", "create", topic, "--partitions", "3").exit_code == 0
    base = 1_700_000_000_000
    produce(
        endpoint, topic, [(p, b"p%d-%d" % (p, i), base + i) for p in range(3) for i in range(4)]
    )

    everything = lines(run(endpoint, "consume", topic))
    assert sorted(everything) == sorted(f"k{p}\tp{p}-{i}" for p in range(3) for i in range(4))
    for p in range(3):  # in order within a partition
        assert [v for v in everything if v.startswith(f"k{p}\t")] == [
            f"k{p}\tp{p}-{i}" for i in range(4)
        ]

    last_two = lines(run(endpoint, "consume", topic, "--from", "-2", "--format", "%v\\n"))
    assert sorted(last_two) == sorted(f"p{p}-{i}" for p in range(3) for i in (2, 3))
    assert lines(run(endpoint, "consume", topic, "--partition", "1", "--from", "-9")) == [
        f"k1\tp1-{i}" for i in range(4)
    ]

    def iso(ms: int) -> str:
        return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat()

    window = run(
        endpoint,
        *("consume", topic, "--partition", "0", "--partition", "2"),
        *("--from", iso(base + 1), "--until", iso(base + 3), "--format", "json"),
    )
    records = [json.loads(line) for line in lines(window)]
    assert sorted((r["partition"], r["value"], r["timestamp"]) for r in records) == [
        (p, f"p{p}-{i}", base + i) for p in (0, 2) for i in (1, 2)
    ]

    size = 26 + 2 + 4  # a header, the key, the value
    formatted = run(
        endpoint,
        *("consume", topic, "--partition", "2", "--max-messages", "2"),
        *("--format", "%t|%p|%o|%T|%s|%k=%v|100%%\\t.\\n"),
    )
    assert lines(formatted) == [
        f"{topic}|2|0|{base}|4|k2=p2-0|100%\t.",
        f"{topic}|2|{size}|{base + 1}|4|k2=p2-1|100%\t.",
    ]
    tail = run(endpoint, "consume", topic, "--partition", "2", "--from", str(3 * size), "--json")
    assert [json.loads(line) for line in lines(tail)] == [
        {
            "topic": topic,
            "partition": 2,
            "offset": 3 * size,
            "timestamp": base + 3,
            "key": "k2",
            "value": "p2-3",
            "headers": [],
        }
    ]
    produced = run(endpoint, "produce", topic, "--json", "--ack", "written", input=b"a\nb\n")
    assert lines(produced) == [json.dumps({"topic": topic, "messages": 2, "ack": "written"})]


def test_consume_usage_errors_are_one_line_with_exit_2() -> None:
    for args, expected in (
        (["--from", "1234"], "pylogctl: --from 1234: an offset is a byte position in one"),
        (["--until", "end", "--follow"], "pylogctl: --until end and --follow contradict"),
    ):
        result = CliRunner().invoke(cli, ["consume", "t", *args])
        assert result.exit_code == 2, result.output
        assert result.stderr.startswith(expected) and result.stderr.count("\n") == 1
    for bad in ("%x", "trailing %", "\\q"):
        result = CliRunner().invoke(cli, ["consume", "t", "--format", bad])
        assert result.exit_code == 2 and "is not a field" in result.stderr, result.output


def test_broker_is_host_port_or_tcp_and_a_bad_address_is_one_line_at_once(
    cluster: Cluster, topic: str
) -> None:
    host_port = cluster.endpoint.removeprefix("tcp://")
    created = subprocess.run(
        [PYLOGCTL, "topic", "create", topic, "--broker", host_port],
        capture_output=True,
        text=True,
        timeout=30,  # it hung for ever
    )
    assert created.returncode == 0, created.stderr
    for command in (["produce", topic], ["consume", topic], ["topic", "list"]):
        result = subprocess.run(
            [PYLOGCTL, *command, "--broker", f" {host_port}"],
            input="hello\n",
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert result.returncode == 0, (command, result.stderr)
    assert lines(run(host_port, "consume", topic)) == ["hello"]

    for bad in ("localhost", "http://127.0.0.1:9092", "127.0.0.1:9092:1"):
        result = subprocess.run(
            [PYLOGCTL, "topic", "list", "--broker", bad], capture_output=True, text=True, timeout=30
        )
        assert result.returncode == 2
        assert result.stderr == (
            f"pylogctl: --broker {bad!r}: broker address {bad!r}: use HOST:PORT or "
            "tcp://HOST:PORT (a port from 1 to 65535)\n"
        )


def test_timeout_is_the_whole_wait_for_a_broker_that_does_not_answer() -> None:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    silent = context.socket(zmq.ROUTER)  # takes connections, reads nothing, answers nothing
    try:
        port = silent.bind_to_random_port("tcp://127.0.0.1")
        started = time.monotonic()
        result = CliRunner().invoke(
            cli, ["consume", "t", "--broker", f"127.0.0.1:{port}", "--timeout", "1.5"]
        )
        waited = time.monotonic() - started
    finally:
        silent.close(linger=0)
        context.term()
    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1 and "unreachable" in result.stderr
    assert 1.5 <= waited < 2.5  # two periods and a back-off (3.1 s) before


def test_ctrl_c_ends_consume_and_produce_with_exit_0_quietly(cluster: Cluster, topic: str) -> None:
    endpoint = cluster.endpoint
    assert run(endpoint, "topic", "create", topic, "--partitions", "2").exit_code == 0
    producer = subprocess.Popen(
        [PYLOGCTL, "produce", topic, "--broker", endpoint],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert producer.stdin is not None
    producer.stdin.write("typed 1\ntyped 2\n")
    producer.stdin.flush()
    wait_until(lambda: reading_stdin(producer.pid), what="produce reads stdin again")
    producer.send_signal(signal.SIGINT)
    out, err = producer.communicate(timeout=30)
    assert (producer.returncode, out, err) == (0, "2 messages acknowledged (flushed)\n", "")

    consumer = subprocess.Popen(
        [PYLOGCTL, "consume", topic, "--follow", "--broker", endpoint],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert consumer.stdout is not None
    assert sorted([consumer.stdout.readline(), consumer.stdout.readline()]) == [
        "typed 1\n",
        "typed 2\n",
    ]
    consumer.send_signal(signal.SIGINT)
    out, err = consumer.communicate(timeout=30)
    assert (consumer.returncode, out, err) == (0, "", "")


def reading_stdin(pid: int) -> bool:
    """Whether the main thread of `pid` is blocked in read(0, ...) (x86-64: syscall 0)."""
    return Path(f"/proc/{pid}/syscall").read_text().startswith("0 0x0 ")


def test_follow_reads_on_through_a_broker_restart(
    three_brokers: list[RunningBroker], topic: str
) -> None:
    endpoint = three_brokers[0].endpoint
    assert run(endpoint, "topic", "create", topic, "--partitions", "3").exit_code == 0
    produce(endpoint, topic, [(p, b"before-%d" % p, 1) for p in range(3)])
    consumer = subprocess.Popen(
        [PYLOGCTL, "consume", topic, "--follow", "--format", "json", "--timeout", "1"],
        env={**os.environ, "PYLOG_BROKER": ",".join(b.endpoint for b in three_brokers)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert consumer.stdout is not None
    printed = PipeLines(consumer.stdout)
    holder = three_brokers[1]  # holds a partition (dealt over the three brokers)
    try:
        seen = {(r["partition"], r["value"]) for r in map(json.loads, printed.lines(3, 30))}
        assert seen == {(p, f"before-{p}") for p in range(3)}
        assert holder.stop() == 0
        three_brokers[1] = holder.restarted()
        produce(endpoint, topic, [(p, b"after-%d" % p, 2) for p in range(3)])
        seen = {(r["partition"], r["value"]) for r in map(json.loads, printed.lines(3, 30))}
        assert seen == {(p, f"after-{p}") for p in range(3)}
        assert consumer.poll() is None
    finally:
        consumer.send_signal(signal.SIGINT)
        _, err = consumer.communicate(timeout=30)
        print(f"pylogctl consume's stderr: {err!r}")
        if three_brokers[1] is not holder:  # the fixture stops the brokers it started only
            three_brokers[1].stop()
    assert consumer.returncode == 0, err


@pytest.mark.broker
@pytest.mark.slow  # ~13 s: pylogctl waits out an unreachable ZooKeeper twice, quiet and verbose
def test_no_library_logs_on_the_console_unless_verbose() -> None:
    command = [PYLOGCTL, "group", "describe", "g", "t", "--zookeeper", unused_endpoint()[6:]]
    quiet = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert quiet.returncode == 1
    assert quiet.stderr.count("\n") == 1 and quiet.stderr.startswith("pylogctl: ZooKeeper ")
    verbose = subprocess.run(
        [PYLOGCTL, "-v", *command[1:]], capture_output=True, text=True, timeout=60
    )
    assert "pylogctl: WARNING kazoo.client: Connection dropped" in verbose.stderr


def on_a_terminal(*args: str) -> tuple[int, str, str]:
    """pylogctl ARGS with stderr on a pseudo-terminal: its exit code, stdout, and what the
    terminal was sent."""
    master, terminal = pty.openpty()
    process = subprocess.Popen(
        [PYLOGCTL, *args],
        stdout=subprocess.PIPE,
        stderr=terminal,
        # wide: a long pytest-xdist tmp path in a bar's description wrapped its figures at 120
        env={**os.environ, "TERM": "xterm", "COLUMNS": "400"},
    )
    os.close(terminal)
    shown = b""
    try:
        while select.select([master], [], [], 30)[0]:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: every end of the terminal is closed, the process is done
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(master)
    out, _ = process.communicate(timeout=30)
    return process.returncode, out.decode(), shown.decode()


def last_progress(shown: str) -> tuple[str, str]:
    """The last "done/total unit" a progress bar showed."""
    found = re.findall(r"([\d.]+)/([\d.]+) (kB|bytes)", shown)
    assert found, shown
    done, total, unit = found[-1]
    return f"{done} {unit}", f"{total} {unit}"


def test_produce_file_and_log_verify_show_progress_on_a_terminal_only(
    cluster: Cluster, topic: str, tmp_path: Path
) -> None:
    assert run(cluster.endpoint, "topic", "create", topic).exit_code == 0
    data = tmp_path / "lines.txt"
    data.write_text("".join(f"line {i}\n" for i in range(2000)))
    code, out, shown = on_a_terminal(
        "produce", topic, "--file", str(data), "--broker", cluster.endpoint
    )
    assert (code, out) == (0, "2000 messages acknowledged (flushed)\n"), shown
    assert f"produce {topic}" in shown
    assert last_progress(shown) == ("18.9 kB", "18.9 kB")  # 18,890 bytes read of 18,890
    piped = run(cluster.endpoint, "produce", topic, "--file", str(data))
    assert (piped.stdout, piped.stderr) == ("2000 messages acknowledged (flushed)\n", "")

    log = PartitionLog.open(tmp_path / "logs" / "t-0", LogConfig())
    for _ in range(1000):
        log.append(encode_message(b"x" * 100))
    log.flush()
    log.close()
    code, out, shown = on_a_terminal("log", "verify", str(tmp_path / "logs"))
    assert code == 0 and out.endswith("1 partitions, 1 segments, 1000 messages: all ok\n")
    assert f"verify {tmp_path / 'logs'}" in shown
    assert last_progress(shown) == ("126.0 kB", "126.0 kB")  # 1,000 messages of 126 bytes
    piped = CliRunner().invoke(cli, ["log", "verify", str(tmp_path / "logs")])
    assert piped.stdout == out and piped.stderr == ""


def ignoring_sigint() -> None:
    """As a shell starts a background job of a script (`cmd &`, nohup): SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_consume_follow_ends_on_sigint_or_sigterm_whatever_it_inherited(
    cluster: Cluster, topic: str, signum: signal.Signals
) -> None:
    """Started with SIGINT ignored, pylogctl still ends on SIGINT (Python installs no handler
    for a signal ignored at start), and SIGTERM ends it as Ctrl-C does: exit 0, quietly."""
    endpoint = cluster.endpoint
    assert run(endpoint, "topic", "create", topic).exit_code == 0
    assert run(endpoint, "produce", topic, input=b"one\n").exit_code == 0
    consumer = subprocess.Popen(
        [PYLOGCTL, "consume", topic, "--follow", "--broker", endpoint],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ignoring_sigint,
    )
    assert consumer.stdout is not None
    assert PipeLines(consumer.stdout).lines(1, 30) == ["one\n"]
    consumer.send_signal(signum)
    try:
        out, err = consumer.communicate(timeout=30)
    finally:
        consumer.kill()
    assert (consumer.returncode, out, err) == (0, "", "")

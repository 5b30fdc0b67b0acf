"""perf/bench_security.py's own logic: the ratios it prints, the check it times (on frames a real
Curve handshake let in), and that its curve_unchecked pylogd really skips the ACL check while
its curve pylogd applies it. It times nothing (perf/ is run by hand, alone on the machine)."""

from __future__ import annotations

import sys
from contextlib import ExitStack
from pathlib import Path

import pytest

from broker.client import Admin, Connection
from broker.errors import AuthorizationFailed
from broker.log.message import encode_message
from broker.protocol import Ack, ProduceReply, ProduceRequest
from perf.bench_security import (
    ADMIN,
    PRINCIPAL,
    UNCHECKED,
    Keys,
    check_cost,
    front_requests,
    start_curve,
    summarize,
    supervisor_cpu_s,
)


def line(experiment: str, system: str, rate: int, front_us: float) -> dict[str, object]:
    return {
        "experiment": experiment,
        "system": system,
        "msgs_per_s": rate,
        "front_us_per_request": front_us,
        "client_us_per_message": front_us * 2,
        "broker_us_per_message": front_us * 3,
    }


def test_summary_gives_medians_and_the_three_ratios() -> None:
    results = [
        line("consumer", "plaintext", 100, 2.0),
        line("consumer", "curve", 50, 4.0),
        line("consumer", "curve_unchecked", 80, 3.0),
        line("consumer", "plaintext", 300, 1.0),
        line("consumer", "curve", 70, 5.0),
        line("consumer", "curve_unchecked", 60, 3.0),
        line("consumer", "plaintext", 200, 9.0),
        line("consumer", "curve", 60, 6.0),
        line("consumer", "curve_unchecked", 100, 3.0),
    ]
    figures = summarize(results)["consumer"]
    assert figures["plaintext"] == {
        "runs": 3,
        "msgs_per_s": 200,
        "front_us_per_request": 2.0,
        "client_us_per_message": 4.0,
        "broker_us_per_message": 6.0,
    }
    assert figures["curve"]["msgs_per_s"] == 60
    assert figures["curve"]["front_us_per_request"] == 5.0
    assert figures["curve/plaintext"] == 0.3
    assert figures["curve_unchecked/plaintext"] == 0.4
    assert figures["curve/curve_unchecked"] == 0.75


def test_a_system_left_out_gives_no_ratio_of_it() -> None:
    figures = summarize([line("producer_batch1", "plaintext", 10, 1.0)])["producer_batch1"]
    assert list(figures) == ["plaintext"]


def test_the_check_is_timed_on_frames_curve_let_in_as_the_principal(tmp_path: Path) -> None:
    figures = check_cost(Keys(tmp_path / "keys"), 1000)
    assert figures["principal"] == PRINCIPAL  # the User-Id its ZAP handler gave the connection
    parts = ("user_id_ns", "peek_api_ns", "check_ns", "whole_ns")
    assert all(isinstance(figures[part], int) for part in parts)


@pytest.mark.slow  # ~10 s: two pylogd with a private ZooKeeper each
@pytest.mark.broker
def test_the_unchecked_broker_skips_the_acl_check_and_the_curve_one_applies_it(
    tmp_path: Path,
) -> None:
    keys = Keys(tmp_path / "keys")
    with ExitStack() as stack:
        checked = start_curve(stack, "curve", tmp_path, keys)
        unchecked = start_curve(
            stack,
            "curve_unchecked",
            tmp_path,
            keys,
            (sys.executable, "-m", "perf.bench_security", UNCHECKED),
        )
        for system in (checked, unchecked):
            assert system.admin == keys.client(ADMIN)
            with Admin(system.pylogd.endpoint, keys=system.admin) as admin:
                admin.create_topic("sec.granted", 1)
                admin.create_topic("not-granted", 1)
        requests = front_requests(checked.pylogd)
        cpu = supervisor_cpu_s(checked.pylogd)
        for system, refused in ((checked, True), (unchecked, False)):
            with Connection(system.pylogd.endpoint, keys=system.client) as connection:
                granted = ProduceRequest("sec.granted", 0, Ack.WRITTEN, encode_message(b"v"))
                assert isinstance(connection.call(granted), ProduceReply)
                other = ProduceRequest("not-granted", 0, Ack.WRITTEN, encode_message(b"v"))
                if refused:
                    with pytest.raises(AuthorizationFailed):
                        connection.call(other)
                else:
                    assert isinstance(connection.call(other), ProduceReply)
        assert front_requests(checked.pylogd) >= requests + 2
        assert supervisor_cpu_s(checked.pylogd) >= cpu

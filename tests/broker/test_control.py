"""The typed control channel between the supervisor and its workers (broker.control): every
message comes back from its frames as it was sent, and anything else is refused by name."""

from __future__ import annotations

import pytest

from broker import control
from broker.transport import COMMAND, STATE

COMMANDS: list[control.Command] = [
    control.OpenPartitions(
        (
            control.PartitionToOpen("clicks", 0, "/d1", {"flush_messages": 10}, False),
            control.PartitionToOpen("clicks", 3, "/d2", {"retention_bytes": None}, True),
        )
    ),
    control.DeletePartitions("clicks", ((0, "/d1/clicks-0"), (3, "/d2/clicks-3"))),
    control.ConfigureTopic("clicks", {"flush_interval_ms": 5, "retention_ms": None}),
    control.PartitionRole(
        "clicks", 2, 3, 7, 4294967302, (3, 1), (1, 3, 2), "tcp://h:9092", None, 2, 11
    ),
    control.PartitionRole("clicks", 2, -1, 8, -1, (3,), (1, 3), None, "K" * 40, 1, 12),
    control.RenewLease(81234.5, 4294967302),
]
REPORTS: list[control.Report] = [
    control.WorkerHello(1),
    control.PartitionsOpened((("clicks", 0),), (("clicks", 3, 55, "clicks-3: disk full"),)),
    control.PartitionsDeleted("clicks"),
    control.AskIsr("clicks", 2, 7, (1, 3)),
    control.StatsReport({"requests": {"produce": 3}}),
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: type(c).__name__)
def test_a_command_comes_back_as_it_was_sent(command: control.Command) -> None:
    kind, frame = control.encode(command)
    assert kind == COMMAND
    assert control.decode_command(frame) == command


@pytest.mark.parametrize("report", REPORTS, ids=lambda r: type(r).__name__)
def test_a_report_comes_back_as_it_was_sent(report: control.Report) -> None:
    kind, frame = control.encode(report)
    assert kind == STATE
    assert control.decode_report(frame) == report


@pytest.mark.parametrize(
    "frame",
    [
        b"{}",  # no type
        b'{"type":"Nope"}',
        b'{"type":"RenewLease","until":1.0}',  # a field missing
        b'{"type":"RenewLease","until":1.0,"broker_epoch":2,"extra":3}',
        b"not json",
        b'{"op":"open","partitions":[]}',  # the untyped dicts of before
    ],
)
def test_a_frame_that_is_no_command_is_refused_with_what_it_held(frame: bytes) -> None:
    with pytest.raises(ValueError, match="not a control message"):
        control.decode_command(frame)


def test_a_report_is_not_taken_for_a_command_nor_the_other_way() -> None:
    with pytest.raises(ValueError, match="not a control message"):
        control.decode_command(control.encode(control.WorkerHello(0))[1])
    with pytest.raises(ValueError, match="not a control message"):
        control.decode_report(control.encode(control.RenewLease(1.0, 2))[1])

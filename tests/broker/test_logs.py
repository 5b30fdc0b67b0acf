"""broker.logs's helpers for log lines."""

from __future__ import annotations

from broker.logs import number_spans


def test_partition_numbers_are_written_as_spans() -> None:
    assert number_spans([8, 0, 1, 2, 5, 7, 2]) == "0-2, 5, 7-8"
    assert number_spans(range(10_000)) == "0-9999"
    assert number_spans([]) == ""

"""perf/guard.py's own logic: its verdict on two revisions' runs, and one whole run at tiny sizes
against a real pylogd (every figure measured, the sustained producers drained of the flush
timer). It times nothing (perf/ is run by hand, alone)."""

from __future__ import annotations

import argparse

import pytest

from perf.guard import FIGURES, run_one, verdict

pytestmark = pytest.mark.broker


def runs(*rates: int) -> list[dict[str, object]]:
    return [dict.fromkeys(FIGURES, rate) for rate in rates]


def test_the_verdict_gives_medians_and_ratios_and_marks_what_is_slower() -> None:
    base = runs(100, 300, 200)
    head = [{**run, "consume": 150} for run in runs(200, 190, 210)]
    table, slower = verdict("abc123", base, head)
    lines = table.splitlines()
    assert lines[0].split() == ["figure", "abc123", ".", "ratio"]
    assert lines[1].split() == ["produce_b1", "200", "200", "1.00"]
    assert lines[-1].split() == ["consume", "200", "150", "0.75", "SLOWER"]
    assert slower == ["consume"]


def test_a_run_measures_every_figure_against_a_real_broker() -> None:
    args = argparse.Namespace(seconds=0.2, consume_messages=5000)
    result = run_one(args)
    assert all(isinstance(result[figure], int) and result[figure] > 0 for figure in FIGURES)

"""docs/pipeline.md's table of every spark-sql-kafka option against the code: each option the
source or sink knows is in a supported row, each supported row names tests that exist, each
option a row says is accepted and ignored is accepted, and each a row says is not supported is
refused (no Spark needed)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pyspark.sql.types import StringType, StructField, StructType

from pipeline.errors import OptionError
from pipeline.options import SOURCE_KAFKA_OPTIONS, SOURCE_OPTIONS, parse_source_options
from pipeline.sink import SINK_KAFKA_OPTIONS, SINK_OPTIONS, parse_sink_options

ROOT = Path(__file__).resolve().parents[2]
PYLOG_ONLY = {
    "broker",
    "zookeeper.connect",
    "maxbytespertrigger",
    "maxbytesperpartition",
    "ack",
    "exactlyonce",
}


def _rows() -> list[tuple[list[str], str, str, str]]:
    """(option names, side, pylog's meaning, tests) of each row of the table."""
    text = (ROOT / "docs" / "pipeline.md").read_text()
    section = text.split("## Every spark-sql-kafka option", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or cells[0] in ("option", "") or set(cells[0]) <= {"-"}:
            continue
        names = re.findall(r"`([^`]+)`", cells[0].split("(", 1)[0])
        rows.append((names, cells[1], cells[2], cells[3]))
    return rows


def _test_names() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "tests" / "pipeline").glob("test_*.py"):
        names.update(re.findall(r"^def (test_\w+)", path.read_text(), re.MULTILINE))
    return names


def test_every_option_the_code_knows_is_a_supported_row_with_tests_that_exist() -> None:
    rows = _rows()
    supported = {
        name.lower()
        for names, _, meaning, _ in rows
        if meaning.startswith("**supported**")
        for name in names
    }
    every = SOURCE_OPTIONS | SINK_OPTIONS | SOURCE_KAFKA_OPTIONS | SINK_KAFKA_OPTIONS
    known = {o for o in every if o not in PYLOG_ONLY}
    assert known == supported
    tests = _test_names()
    for names, _, meaning, named in rows:
        cited = re.findall(r"`(test_\w+)`", named)
        assert set(cited) <= tests, f"{names}: no such test {set(cited) - tests}"
        if meaning.startswith("**supported**"):
            assert cited, f"{names} is supported but names no test"


def _said(start: str) -> list[tuple[str, str]]:
    """(option, side) of each row whose meaning starts with `start` (wildcards left out)."""
    return sorted(
        (name, side)
        for names, side, meaning, _ in _rows()
        if meaning.startswith(start)
        for name in names
        if "*" not in name and side
    )


UNSUPPORTED = _said("not supported")
IGNORED = _said("accepted and ignored")


def _parse(option: str, side: str) -> None:
    given = {option: "1", "subscribe": "t", "broker": "tcp://127.0.0.1:9", "topic": "t"}
    if side == "source":
        given.pop("topic")
        parse_source_options(given, streaming=True)
    else:
        given.pop("subscribe")
        parse_sink_options(given, StructType([StructField("value", StringType())]))


@pytest.mark.parametrize(("option", "side"), UNSUPPORTED)
def test_each_option_said_unsupported_is_refused(option: str, side: str) -> None:
    assert UNSUPPORTED  # the table was found
    with pytest.raises(OptionError, match=f"unknown {side} option"):
        _parse(option, side)


@pytest.mark.parametrize(("option", "side"), IGNORED)
def test_each_option_said_accepted_and_ignored_is_accepted(option: str, side: str) -> None:
    assert IGNORED  # the table was found
    _parse(option, side)

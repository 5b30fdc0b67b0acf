"""Issue 54: the console's parts that need no cluster: how values are shown, the lag
history and its chart, the message browser's start, and the options refused at start."""

from __future__ import annotations

import datetime
import os
import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

from broker.client.lag import GroupLag, PartitionLag
from cli.pylog_console import main
from cli.web import show
from cli.web.history import MAX_GROUPS, LagHistory, chart
from cli.web.reads import BadRequest, parse_start


def test_values_are_shown_as_json_text_or_hex_and_cut_at_the_limit() -> None:
    assert show.data(b'{"a": [1, 2]}') == show.Shown("json", '{\n  "a": [\n    1,\n    2\n  ]\n}')
    assert show.data(b'{"a": 1}', "text") == show.Shown("text", '{"a": 1}')
    assert show.data("grüße".encode()) == show.Shown("text", "grüße")
    assert show.data(b"\xff\x00A") == show.Shown("hex", "ff 00 41")
    assert show.data(b"\xff\x00A", "text").text == "\\xff\x00A"  # asked for text: escaped
    assert show.data(None) == show.Shown("null", "null")
    long = "é" * show.SHOWN_BYTES  # 2 bytes each: the limit falls on a character's start
    shown = show.data(long.encode())
    assert (shown.kind, len(shown.text), shown.more) == ("text", show.SHOWN_BYTES // 2, 4096)
    cut = show.data(b"a" + long.encode())  # the limit inside a character: cut before it
    assert (cut.kind, cut.more) == ("text", len(long.encode()) + 1 - len(cut.text.encode()))
    assert show.size(None) == "-" and show.size(1023) == "1023 B"
    assert show.size(1536) == "1.5 KiB" and show.size(3 << 40) == "3.0 TiB"
    assert [show.duration(s) for s in (None, 59.94, 5400, 2 * 86400)] == [
        "-",
        "59.9 s",
        "1.5 h",
        "2.0 d",
    ]


def lag(group: str, messages: int) -> GroupLag:
    partition = PartitionLag("t", 0, 1, None, 0, lag_bytes=messages * 10, lag_messages=messages)
    return GroupLag(group, {}, ["t"], [partition])


def test_the_history_keeps_an_hour_a_sample_a_second_and_the_groups_last_viewed() -> None:
    now = [1_000_000.0]
    history = LagHistory(clock=lambda: now[0])
    history.record(lag("g", 5), viewed=True)
    now[0] += 0.5
    history.record(lag("g", 6))  # sooner than a second after: not kept
    now[0] += 0.5
    history.record(lag("g", 7))
    assert [s.lag_messages for s in history.samples("g")] == [5, 7]
    assert history.watched() == ["g"]
    now[0] += 3599.5
    assert [s.lag_messages for s in history.samples("g")] == [7]
    assert history.watched() == []  # its page not opened for an hour: no longer sampled
    for i in range(MAX_GROUPS + 1):
        history.record(lag(f"other-{i}", 1))
    assert history.samples("g") == [] and history.samples(f"other-{MAX_GROUPS}") != []


def test_the_chart_draws_the_window_with_its_greatest_lag() -> None:
    now = 1_000_000.0
    assert "fills in" in chart([], now)
    clock = [now - 3600]
    history = LagHistory(clock=lambda: clock[0])
    for at, messages in ((now - 3600, 0), (now - 1800, 30), (now, 15)):
        clock[0] = at
        history.record(lag("g", messages))
    svg = str(chart(history.samples("g"), now))
    assert "30 messages" in svg and "-60 min" in svg
    assert 'points="0.0,120.0 300.0,12.0 600.0,66.0"' in svg
    recent = LagHistory(clock=lambda: clock[0])  # a minute of samples: drawn over 5 minutes
    for at in (now - 60, now):
        clock[0] = at
        recent.record(lag("g", 1))
    svg = str(chart(recent.samples("g"), now))
    assert "-5 min" in svg and 'points="480.0,12.0 600.0,12.0"' in svg


def test_the_message_browser_starts_where_asked() -> None:
    assert parse_start("earliest") == "earliest" and parse_start(" end ") is None
    assert parse_start("4096") == 4096
    utc = datetime.UTC
    assert parse_start("2026-11-30T08:00") == datetime.datetime(2026, 11, 30, 8, tzinfo=utc)
    plus_one = datetime.timezone(datetime.timedelta(hours=1))
    assert parse_start("2026-11-30T09:00+01:00") == datetime.datetime(
        2026, 11, 30, 9, tzinfo=plus_one
    )
    for bad in ("latest", "-1", "yesterday"):
        with pytest.raises(BadRequest, match="give earliest, end, an offset"):
            parse_start(bad)


def test_serving_beyond_this_machine_needs_a_token_and_a_private_token_file(
    tmp_path: Path,
) -> None:
    refused = CliRunner().invoke(main, ["--host", "0.0.0.0"])
    assert refused.exit_code == 2 and "needs a login: give --token-file" in refused.output
    token = tmp_path / "token"
    token.write_text("a-token-of-the-console-0123456789\n")
    os.chmod(token, 0o644)
    readable = CliRunner().invoke(main, ["--token-file", str(token)])
    assert readable.exit_code == 2 and "may be read by others" in readable.output
    os.chmod(token, 0o600)
    token.write_text("short\n")
    short = CliRunner().invoke(main, ["--token-file", str(token)])
    assert short.exit_code == 2 and "one token of 16 or more characters" in short.output


def test_a_port_taken_is_exit_1_saying_so() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(main, ["--port", str(port), "-b", "127.0.0.1:1"])
    assert result.exit_code == 1, result.output
    assert f"cannot start: cannot listen on 127.0.0.1:{port}" in result.output

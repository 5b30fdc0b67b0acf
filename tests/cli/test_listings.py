"""pylogctl's listings of a cluster that has none of what they list: each says so ("no
topics") on stderr, stdout staying the listing, empty, for scripts; --json prints nothing (an
empty JSON-lines result). A real pylogd of its own, with a fresh registry."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from click.testing import CliRunner

from cli.pylogctl import cli
from tests.conftest import single_box_flags
from tests.pylogd import RunningBroker

EMPTY = [
    (("topic", "list"), "no topics\n"),
    (("group", "list"), "no consumer groups\n"),
    (("principal", "list"), "no principals\n"),
    (("acl", "list"), "no ACLs\n"),
    (("acl", "list", "--principal", "web"), "no ACLs of web\n"),
]


def test_empty_listings_say_so_and_print_nothing_as_json(
    make_pylogd: Callable[..., RunningBroker], tmp_path: Path
) -> None:
    broker = make_pylogd(*single_box_flags(tmp_path))
    env = {"PYLOG_BROKER": broker.endpoint}
    for command, said in EMPTY:
        text = CliRunner().invoke(cli, list(command), env=env)
        assert (text.exit_code, text.stdout, text.stderr) == (0, "", said), command
        as_json = CliRunner().invoke(cli, [*command, "--json"], env=env)
        assert (as_json.exit_code, as_json.stdout, as_json.stderr) == (0, "", ""), command


def test_a_down_broker_first_in_the_list_is_passed_over_and_alone_is_named_at_once(
    make_pylogd: Callable[..., RunningBroker], tmp_path: Path
) -> None:
    """Nothing listens at 127.0.0.1:9 (a broker down): pylogctl asks the next address at
    once, and given only that one says so at once, not after its --timeout."""
    broker = make_pylogd(*single_box_flags(tmp_path))
    started = time.monotonic()
    passed_over = CliRunner().invoke(
        cli,
        ["topic", "list", "--timeout", "30"],
        env={"PYLOG_BROKER": f"127.0.0.1:9,{broker.endpoint}"},
    )
    assert (passed_over.exit_code, passed_over.stderr) == (0, "no topics\n")
    alone = CliRunner().invoke(
        cli, ["topic", "list", "--timeout", "30"], env={"PYLOG_BROKER": "127.0.0.1:9"}
    )
    assert alone.exit_code == 1
    assert "connection refused: nothing listens at tcp://127.0.0.1:9" in alone.stderr
    assert time.monotonic() - started < 20

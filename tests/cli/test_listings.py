"""pylogctl's listings of a cluster that has none of what they list: each says so ("no
topics") on stderr, stdout staying the listing, empty, for scripts; --json prints nothing (an
empty JSON-lines result). A real pylogd of its own, with a fresh registry."""

from __future__ import annotations

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

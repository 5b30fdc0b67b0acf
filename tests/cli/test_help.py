"""Every pylogctl command takes --json and shows examples in its --help (issue 13)."""

from __future__ import annotations

from collections.abc import Iterator

import click
import pytest
from click.testing import CliRunner

from cli.pylogctl import cli


def commands(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    context = click.Context(group)
    for name in group.list_commands(context):  # the Spark jobs too, imported on first use
        command = group.get_command(context, name)
        if isinstance(command, click.Group):
            yield from commands(command, (*path, name))
        else:
            yield (*path, name)


@pytest.mark.parametrize("path", list(commands(cli)), ids=" ".join)
def test_every_command_takes_json_and_shows_examples(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(cli, [*path, "--help"], terminal_width=100)
    assert result.exit_code == 0, result.output
    assert "--json" in result.output
    assert "Examples:" in result.output or "Example:" in result.output
    assert f"pylogctl {' '.join(path)} " in result.output.split("Example", 1)[1]

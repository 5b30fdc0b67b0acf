"""`pylogctl load` and `pylogctl audit`: the Spark jobs of pipeline/ (python -m pipeline.load,
python -m pipeline.audit), the same commands with the same options.

They need PySpark (pylog's pipeline extra), which a broker's install leaves out, and importing
it takes a second: the group imports a job only when it runs or shows its own help, and says
how to install the extra when it is missing.
"""

from __future__ import annotations

import importlib
from typing import Final

import click

# Command name -> (module whose `main` it is, its line in `pylogctl --help`).
JOBS: Final = {
    "load": ("pipeline.load", "Load topics into Parquet by topic, date and hour (Spark)."),
    "audit": ("pipeline.audit", "Count messages per hour in pylog and in a load (Spark)."),
}


class WithJobs(click.Group):
    """A click group whose Spark jobs are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *JOBS])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in JOBS:
            return super().get_command(ctx, cmd_name)
        module_name = JOBS[cmd_name][0]
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            package = (error.name or "?").partition(".")[0]
            raise click.ClickException(
                f"pylogctl {cmd_name} runs a Spark job and needs pylog's pipeline extra "
                f"({package} is missing): pip install 'pylog[pipeline]' into this environment "
                "(scripts/setup does), and Java 17"
            ) from error
        command: click.Command = module.main
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(map(len, names))  # as click.Group's own listing
        rows = [
            (name, JOBS[name][1] if name in JOBS else self.commands[name].get_short_help_str(limit))
            for name in names
        ]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

"""Command-line entry points: thin click commands over the broker library.

They need pylog's `broker` extra (pyproject.toml): pylog installed without it is the client
alone (`pip install pylog`), and running a command then says what to install and exits 1
instead of ending in an ImportError's traceback."""

import importlib.util
import sys

BROKER_EXTRA = ("click", "kazoo", "trio", "prometheus_client", "rich", "starlette", "uvicorn")
"""Modules of the `broker` extra's packages that the commands import."""

_missing = [name for name in BROKER_EXTRA if importlib.util.find_spec(name) is None]
if _missing:
    sys.exit(
        f"pylog's commands need its broker extra, and {', '.join(_missing)} cannot be imported: "
        "install pylog with it, as pip install 'pylog[broker]' (pip install pylog is the "
        "client alone)"
    )

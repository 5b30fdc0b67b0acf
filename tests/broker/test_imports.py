"""What each broker process imports: every pylogd start imports its modules in the supervisor
and in each worker, so a worker that pulled in the client package and kazoo (which it never
uses) paid for them at every start (0.2 s of CPU), and the supervisor paid for trio (which
only workers run) and asyncio (which none does: pyzmq's monitor helpers import it), 0.08 s."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def imported_by(module: str) -> set[str]:
    """The modules a fresh interpreter has loaded once it has imported `module`."""
    program = f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True
    )
    imported = set(json.loads(result.stdout))
    assert module in imported
    return imported


@pytest.mark.broker
def test_a_worker_imports_neither_the_client_nor_kazoo_nor_asyncio() -> None:
    unwanted = {"broker.client", "broker.registry", "kazoo", "kazoo.client", "asyncio"}
    assert not imported_by("broker.worker") & unwanted


@pytest.mark.broker
def test_the_supervisor_imports_neither_trio_nor_asyncio() -> None:
    assert not imported_by("cli.pylogd") & {"trio", "asyncio"}

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


@pytest.mark.broker
def test_the_client_imports_neither_kazoo_nor_the_registry_nor_trio() -> None:
    """A client stands on the protocol alone (docs/protocol.md): none of broker/client and
    broker/aio pulls in ZooKeeper's client, the registry or trio."""
    program = (
        "import json, pkgutil, sys, importlib, broker.client, broker.aio\n"
        "for package in (broker.client, broker.aio):\n"
        "    for found in pkgutil.walk_packages(package.__path__, package.__name__ + '.'):\n"
        "        importlib.import_module(found.name)\n"
        "print(json.dumps(sorted(sys.modules)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True
    )
    imported = set(json.loads(result.stdout))
    assert "broker.client.lag" in imported and "broker.aio.group" in imported
    unwanted = {m for m in imported if m.split(".")[0] in ("kazoo", "trio")}
    assert not unwanted | {m for m in imported if m.startswith("broker.registry")}

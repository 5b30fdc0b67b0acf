"""What each broker process imports: every pylogd start imports its modules in the supervisor
and in each worker, so a worker that pulled in the client package and kazoo (which it never
uses) paid for them at every start (0.2 s of CPU)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROGRAM = "import json, sys, broker.worker; print(json.dumps(sorted(sys.modules)))"


@pytest.mark.broker
def test_a_worker_imports_neither_the_client_nor_kazoo() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=60, check=True
    )
    imported = set(json.loads(result.stdout))
    assert "broker.worker" in imported
    unwanted = {"broker.client", "broker.registry", "kazoo", "kazoo.client"}
    assert not imported & unwanted

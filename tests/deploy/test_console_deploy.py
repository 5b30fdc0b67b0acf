"""deploy/systemd/pylog-console.service: a unit systemd accepts that serves the console of
the local broker's cluster, read-only, on 127.0.0.1 (issue 54)."""

from __future__ import annotations

import shlex
import shutil
import sys
from pathlib import Path

import pytest

from tests.deploy.conftest import verify_unit
from tests.deploy.test_deploy_files import DEPLOY, unit_directives

pytestmark = pytest.mark.broker

UNIT = DEPLOY / "systemd" / "pylog-console.service"
INSTALLED = "/opt/pylog/.venv/bin/pylog-console"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_console_unit_passes_systemd_analyze_verify_without_a_warning(tmp_path: Path) -> None:
    command = Path(sys.executable).with_name("pylog-console")
    assert verify_unit(UNIT, INSTALLED, command, tmp_path) == (0, "")


def test_console_unit_serves_the_local_cluster_read_only_on_loopback() -> None:
    unit = unit_directives(UNIT)
    assert shlex.split(unit["ExecStart"]) == [INSTALLED, "--broker", "127.0.0.1:9092"]
    assert unit["KillSignal"] == "SIGTERM" and unit["User"] == "pylog"
    assert unit["Documentation"] == "file:///opt/pylog/docs/console.md"

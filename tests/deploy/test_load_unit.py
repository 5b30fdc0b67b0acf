"""deploy/systemd/pylog-load.service: a unit systemd accepts, running the load job with
--follow, with time to finish a micro-batch on stop."""

from __future__ import annotations

import shlex
import shutil
import sys
from pathlib import Path

import pytest

from pipeline import load
from tests.deploy.conftest import verify_unit
from tests.deploy.test_deploy_files import DEPLOY, unit_directives

pytestmark = pytest.mark.broker

UNIT = DEPLOY / "systemd" / "pylog-load.service"
INSTALLED_PYTHON = "/opt/pylog/.venv/bin/python"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_load_unit_passes_systemd_analyze_verify_without_a_warning(tmp_path: Path) -> None:
    assert verify_unit(UNIT, INSTALLED_PYTHON, Path(sys.executable), tmp_path) == (0, "")


def test_load_unit_runs_the_job_that_exists_and_waits_for_its_batch() -> None:
    unit = unit_directives(UNIT)
    argv = shlex.split(unit["ExecStart"].replace("\\\n", " "))
    assert argv[:3] == [INSTALLED_PYTHON, "-m", "pipeline.load"]
    context = load.main.make_context("pipeline.load", argv[3:])  # the options all exist
    assert context.params["follow"] is True
    assert context.params["output"].startswith(unit["ReadWritePaths"])
    assert unit["KillSignal"] == "SIGTERM"
    assert int(unit["TimeoutStopSec"]) > load.STOP_WAIT_S

"""deploy/systemd/pylog-mirror.service and deploy/pylog-mirror.toml: a unit systemd accepts
that runs the mirror with the example file, and an example that names every setting and
loads."""

from __future__ import annotations

import dataclasses
import re
import shlex
import shutil
import sys
from pathlib import Path

import pytest

from broker.mirror import MirrorConfig, MirrorSettings
from tests.deploy.conftest import verify_unit
from tests.deploy.test_deploy_files import DEPLOY, unit_directives

pytestmark = pytest.mark.broker

UNIT = DEPLOY / "systemd" / "pylog-mirror.service"
EXAMPLE = DEPLOY / "pylog-mirror.toml"
INSTALLED = "/opt/pylog/.venv/bin/pylog-mirror"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_mirror_unit_passes_systemd_analyze_verify_without_a_warning(tmp_path: Path) -> None:
    command = Path(sys.executable).with_name("pylog-mirror")
    assert verify_unit(UNIT, INSTALLED, command, tmp_path) == (0, "")


def test_mirror_unit_runs_the_example_file_and_stops_on_sigterm() -> None:
    unit = unit_directives(UNIT)
    assert shlex.split(unit["ExecStart"]) == [INSTALLED, "--config", "/etc/pylog/pylog-mirror.toml"]
    assert unit["KillSignal"] == "SIGTERM" and unit["Restart"] == "on-failure"


def test_the_example_names_every_setting_and_loads() -> None:
    text = EXAMPLE.read_text()
    for field in dataclasses.fields(MirrorSettings):
        assert re.search(rf"^#?{field.name} = ", text, re.M), field.name
    config = MirrorConfig.load(EXAMPLE)
    assert config.mirror.mirrors("logs-web") and not config.mirror.mirrors("other")
    assert config.mirror.metrics_port is None

"""scripts/setup --broker-only (what scripts/start runs): the broker extra alone, and no pip at
all when pyproject.toml and setup.py have not changed, nor over a venv that holds more
extras."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.broker

ROOT = Path(__file__).parents[2]


def run_setup(source: Path, *args: str) -> str:
    result = subprocess.run(
        [str(source / "scripts" / "setup"), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.fixture
def checkout(source: Path) -> Path:
    """The packaging inputs and scripts/setup."""
    (source / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "setup", source / "scripts" / "setup")
    return source


@pytest.mark.slow  # ~35 s: two runs of scripts/setup in a copy of the checkout
def test_broker_only_installs_the_broker_extra_and_skips_pip_when_nothing_changed(
    checkout: Path,
) -> None:
    source = checkout
    python = source / ".venv" / "bin" / "python"

    assert "setup: installing pylog with extras broker into .venv" in run_setup(
        source, "--broker-only"
    )
    installed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format", "freeze"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.lower()
    assert "trio==" in installed and "pyzmq==" in installed
    assert not {"pytest", "mypy", "pyspark", "pyarrow", "pandas"} & {
        line.split("==")[0] for line in installed.splitlines()
    }
    subprocess.run([str(source / ".venv" / "bin" / "pylogd"), "--help"], check=True)

    stamp = source / ".venv" / "pylog-installed"
    assert run_setup(source, "--broker-only") == ""  # no pip: nothing changed

    # A venv set up by scripts/setup holds every extra: scripts/start keeps it as it is.
    pyproject_hash = stamp.read_text().split()[0]
    stamp.write_text(f"{pyproject_hash} broker,dev,pipeline\n")
    assert run_setup(source, "--broker-only") == ""
    assert stamp.read_text() == f"{pyproject_hash} broker,dev,pipeline\n"

    # A changed pyproject.toml is installed again.
    with (source / "pyproject.toml").open("a") as pyproject:
        pyproject.write("# changed\n")
    stamp.write_text(f"{pyproject_hash} broker\n")
    assert "setup: installing pylog with extras broker into .venv" in run_setup(
        source, "--broker-only"
    )
    assert stamp.read_text().split()[0] != pyproject_hash

    # And a changed setup.py (the C codec's build).
    with (source / "setup.py").open("a") as setup:
        setup.write("# changed\n")
    assert "setup: installing pylog with extras broker into .venv" in run_setup(
        source, "--broker-only"
    )


def test_system_only_installs_no_venv_when_the_system_has_every_package(checkout: Path) -> None:
    # deploy/install.sh runs it before making /opt/pylog/.venv; this machine has every package
    # (scripts/setup ran), so no apt-get either: it prints nothing.
    assert run_setup(checkout, "--system-only") == ""
    assert not (checkout / ".venv").exists()

"""Fixtures for tests/deploy: a copy of what pip builds pylog from."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """A copy of the checkout's packaging inputs, so that a build's own files (build/,
    *.egg-info) stay out of the checkout that others use; without the C codec built in place
    there, so that a build makes its own."""
    copy = tmp_path / "pylog"
    copy.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, copy / name)
    for package in ("broker", "cli", "pipeline"):
        shutil.copytree(
            ROOT / package, copy / package, ignore=shutil.ignore_patterns("__pycache__", "*.so")
        )
    return copy


def verify_unit(unit: Path, installed: str, here: Path, folder: Path) -> tuple[int, str]:
    """`systemd-analyze verify` of `unit` with the path `installed` replaced by `here` (verify
    checks that ExecStart exists), from a copy in `folder`: its exit code and what it printed."""
    copy = folder / unit.name
    copy.write_text(unit.read_text().replace(installed, str(here)))
    result = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(copy)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return result.returncode, result.stdout + result.stderr

"""The package as pip builds it: a wheel that ships py.typed, built without setuptools warnings."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_wheel_ships_py_typed_and_builds_without_warnings(tmp_path: Path) -> None:
    # A copy of what the build reads, so that the build's own files (build/, *.egg-info) stay
    # out of the checkout.
    source = tmp_path / "source"
    for name in ("pyproject.toml", "README.md"):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, source / name)
    for package in ("broker", "cli", "pipeline"):
        shutil.copytree(
            ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    wheels = tmp_path / "wheels"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "-w", str(wheels)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Warning" not in result.stderr, result.stderr
    (wheel,) = wheels.glob("pylog-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"broker/py.typed", "cli/py.typed"} <= names
    metadata = next(name for name in names if name.endswith(".dist-info/METADATA"))
    assert "License-Expression: Apache-2.0" in zipfile.ZipFile(wheel).read(metadata).decode()

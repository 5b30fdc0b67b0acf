"""The package as pip builds it: a wheel that ships py.typed, built without setuptools warnings."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path


def test_wheel_ships_py_typed_and_builds_without_warnings(source: Path, tmp_path: Path) -> None:
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

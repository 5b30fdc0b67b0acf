"""The package as pip builds it: a wheel that ships py.typed and the C codec, built without
a setuptools warning."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path


def test_wheel_ships_py_typed_and_the_codec_and_builds_without_warnings(
    source: Path, tmp_path: Path
) -> None:
    wheels = tmp_path / "wheels"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "-w", str(wheels)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    warnings = [line for line in result.stderr.splitlines() if "Warning" in line]
    assert warnings == [], result.stderr  # the codec is in setup.py: no ext-modules notice
    (wheel,) = wheels.glob("pylog-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"broker/py.typed", "cli/py.typed", "broker/log/_codec.pyi"} <= names
    assert any(name.startswith("broker/log/_codec.") and name.endswith(".so") for name in names)
    metadata = next(name for name in names if name.endswith(".dist-info/METADATA"))
    assert "License-Expression: Apache-2.0" in zipfile.ZipFile(wheel).read(metadata).decode()

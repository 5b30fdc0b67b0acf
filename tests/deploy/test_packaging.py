"""The package as pip builds it: a wheel that ships py.typed and the C codec, and an editable
install (scripts/setup's), both built without a setuptools warning or banner."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.broker


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


def test_an_editable_install_prints_no_setuptools_banner(source: Path, tmp_path: Path) -> None:
    # scripts/setup's install. setuptools prints an "Editable installation" banner for its import
    # hook; pyproject.toml's package-dir makes the install a plain .pth file, without one.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python")]
    result = subprocess.run(
        [*pip, "install", "--disable-pip-version-check", "--no-deps", "-e", str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Editable" not in result.stderr and "Warning" not in result.stderr, result.stderr
    (pth,) = (venv / "lib").glob("python3*/site-packages/__editable__.pylog-*.pth")
    assert pth.read_text().strip() == str(source)

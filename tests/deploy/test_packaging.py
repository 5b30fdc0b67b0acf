"""The package as pip builds it: a wheel that ships py.typed and the C codec, and an editable
install (scripts/setup's), both built without a setuptools warning or banner; `pip install
pylog` without an extra is the client alone."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.pylogd import RunningBroker

pytestmark = pytest.mark.broker

CLIENT_PROGRAM = """
import sys
from broker.client import Admin, PartitionConsumer, Producer

endpoint = sys.argv[1]
Admin(endpoint).create_topic("events", partitions=2)
with Producer(endpoint, "events") as producer:
    sent = producer.send(b"hello", key=b"user-42")
    sent.result(timeout=10)
for message in PartitionConsumer(
    endpoint, "events", sent.partition, start="earliest", stop_at_end=True
):
    print(message.key.decode(), message.value.decode())
print(sorted(name for name in sys.modules if name.split(".")[0] in ("kazoo", "trio", "click")))
"""


@pytest.mark.slow  # ~15 s: a wheel built
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


@pytest.mark.slow  # ~15 s: an editable install into a new environment
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


# ~20 s (pip builds the C codec, the dependencies come from pip's cache): the one check of the claim
@pytest.mark.slow  # ~35 s: pylog installed into a new environment
def test_pylog_without_an_extra_is_the_client_alone(
    source: Path, tmp_path: Path, pylogd: RunningBroker
) -> None:
    """A programmer's `pip install pylog`: the client's five dependencies (docs/client.md),
    none of the broker's, a client that produces and reads, and the commands saying what is
    missing instead of a traceback."""
    venv = tmp_path / "client"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    result = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(source)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    listed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format", "freeze"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    installed = {line.split("==")[0].lower().replace("_", "-") for line in listed.splitlines()}
    assert installed - {"pip", "setuptools"} == {
        "pylog",
        "pyzmq",
        "xxhash",
        "zstandard",
        "lz4",
        "typing-extensions",
    }

    ran = subprocess.run(
        [str(python), "-c", CLIENT_PROGRAM, pylogd.endpoint],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,  # not the checkout: the installed pylog
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == ["user-42 hello", "[]"]

    command = subprocess.run(
        [str(venv / "bin" / "pylogctl"), "topic", "list"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert command.returncode == 1
    assert "Traceback" not in command.stderr
    assert "pip install 'pylog[broker]'" in command.stderr

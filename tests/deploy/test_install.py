"""deploy/install.sh into a temporary root (DESTDIR): the venv with pylogd, the config from the
example (kept on a second run), the state dir, and the unit installed, enabled and verified."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.conftest import verify_unit
from tests.deploy.test_deploy_files import DEPLOY, INSTALLED_PYLOGD, UNIT, unit_directives

pytestmark = pytest.mark.broker


def install(source: Path, root: Path) -> None:
    subprocess.run(
        [str(DEPLOY / "install.sh"), str(source)],
        check=True,
        timeout=600,
        env={**os.environ, "DESTDIR": str(root), "PYTHON": sys.executable},
    )


@pytest.mark.skipif(shutil.which("systemctl") is None, reason="needs systemctl --root")
@pytest.mark.slow  # ~45 s: deploy/install.sh twice, a virtual environment built each time
def test_install_into_a_root_then_again_keeps_the_config(source: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    install(source, root)

    pylogd = root / INSTALLED_PYLOGD.lstrip("/")
    subprocess.run([str(pylogd), "--help"], check=True, capture_output=True, timeout=60)
    config = root / "etc" / "pylog" / "pylogd.toml"
    assert config.read_text() == (DEPLOY / "pylogd.toml").read_text()
    assert (root / "var" / "lib" / "pylog").is_dir()
    unit = root / "etc" / "systemd" / "system" / "pylogd.service"
    assert unit.read_text() == UNIT.read_text()
    wanted = root / "etc" / "systemd" / "system" / "multi-user.target.wants" / "pylogd.service"
    assert os.readlink(wanted) == "/etc/systemd/system/pylogd.service"
    documentation = unit_directives()["Documentation"].split()
    assert documentation and all(url.startswith("file:///") for url in documentation)
    for url in documentation:
        assert (root / url.removeprefix("file:///")).is_file(), url

    if shutil.which("systemd-analyze") is not None:
        # verify checks that ExecStart exists: point it at the pylogd installed in the root.
        assert verify_unit(unit, INSTALLED_PYLOGD, pylogd, tmp_path) == (0, "")

    mirror_unit = root / "etc" / "systemd" / "system" / "pylog-mirror.service"
    assert mirror_unit.read_text() == (DEPLOY / "systemd" / "pylog-mirror.service").read_text()
    assert not (wanted.parent / "pylog-mirror.service").exists()  # not enabled: edit it first
    mirror_config = root / "etc" / "pylog" / "pylog-mirror.toml"
    assert mirror_config.read_text() == (DEPLOY / "pylog-mirror.toml").read_text()
    mirror = root / "opt" / "pylog" / ".venv" / "bin" / "pylog-mirror"
    subprocess.run([str(mirror), "--help"], check=True, capture_output=True, timeout=60)
    assert (root / "opt" / "pylog" / "docs" / "mirror.md").is_file()
    console_unit = root / "etc" / "systemd" / "system" / "pylog-console.service"
    assert console_unit.read_text() == (DEPLOY / "systemd" / "pylog-console.service").read_text()
    assert not (wanted.parent / "pylog-console.service").exists()  # off by default
    console = root / "opt" / "pylog" / ".venv" / "bin" / "pylog-console"
    subprocess.run([str(console), "--help"], check=True, capture_output=True, timeout=60)
    assert (root / "opt" / "pylog" / "docs" / "console.md").is_file()

    config.write_text("[broker]\nport = 9099\n")
    install(source, root)
    assert config.read_text() == "[broker]\nport = 9099\n"

"""Where pylogd puts its workers' ipc sockets (broker.supervisor.run_dir_for)."""

from __future__ import annotations

import stat
from pathlib import Path

from broker.supervisor import IPC_PATH_MAX, run_dir_for


def test_a_data_dir_of_usual_depth_keeps_its_sockets_in_its_run_folder() -> None:
    assert run_dir_for(Path("/var/lib/pylog")) == Path("/var/lib/pylog/run")


def test_a_deep_data_dir_gets_a_private_folder_of_the_temp_dir(tmp_path: Path) -> None:
    # under pytest-xdist's longer tmp paths a worker's socket path passed 107 bytes, and
    # pylogd died at start with ZeroMQ's "ipc path ... is longer than 107 characters"
    deep = tmp_path / ("d" * (IPC_PATH_MAX - 20))
    run_dir = run_dir_for(deep)
    try:
        assert run_dir.parent != deep
        assert len(f"{run_dir}/worker-999-999999.sock") <= IPC_PATH_MAX
        assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    finally:
        run_dir.rmdir()

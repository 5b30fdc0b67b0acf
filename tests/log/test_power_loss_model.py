"""The power-loss model itself (tests/log/powerloss.c and powerloss.py, issue 50, 12): a
program run under the shim, then `cut`, leaves what a power loss may leave, and no more. Each
case is a short Python program in a process of its own; the model must catch what pylog's
power-loss tests rely on it to catch: a file or a name not fsynced is lost."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.log import powerloss

pytestmark = pytest.mark.broker  # each case a process of its own

PRELUDE = """
import ctypes, os, sys
from pathlib import Path
root = Path(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)

def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(fd)
    os.close(fd)

def write(path, data, sync=True):
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        if sync:
            os.fsync(f.fileno())
"""


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return powerloss.build(tmp_path_factory.mktemp("shim"))


def run(library: Path, tmp_path: Path, program: str) -> tuple[Path, Path]:
    """Run `program` (after PRELUDE; `root` is the disk) under the shim: the disk and the
    journal, for `cut`."""
    disk, journal = tmp_path / "disk", tmp_path / "journal"
    disk.mkdir(exist_ok=True)
    env = {**os.environ, **powerloss.environment(library, disk, journal)}
    code = PRELUDE + textwrap.dedent(program)
    subprocess.run(
        [sys.executable, "-c", code, str(disk.resolve())], env=env, check=True, timeout=60
    )
    return disk, journal


def test_a_file_fsynced_in_a_directory_not_fsynced_is_gone(library: Path, tmp_path: Path) -> None:
    """fsync of a file makes its bytes durable, not its name: without an fsync of its
    directory after the create, the cut takes the file (the strictest state, and the one a
    missing fsync_directory in pylog would meet)."""
    disk, journal = run(
        library,
        tmp_path,
        """
        write(root / "kept", b"kept")
        fsync_dir(root)
        write(root / "lost", b"lost")
        """,
    )
    assert powerloss.cut(disk, journal) >= 1
    assert sorted(p.name for p in disk.iterdir()) == ["kept"]
    assert (disk / "kept").read_bytes() == b"kept"


def test_a_rename_not_made_durable_is_undone(library: Path, tmp_path: Path) -> None:
    """pylog's way to replace a file: write a temporary, fsync it, rename it over the old one,
    fsync the directory. Cut before the last step: the old file is back, the temporary gone
    (its create was not durable either); after it: the new one."""
    disk, journal = run(
        library,
        tmp_path,
        """
        write(root / "state", b"old")
        fsync_dir(root)
        write(root / "state.tmp", b"new")
        os.replace(root / "state.tmp", root / "state")
        write(root / "other", b"new")
        os.replace(root / "other", root / "done")
        fsync_dir(root)
        write(root / "again.tmp", b"newer")
        os.replace(root / "again.tmp", root / "done")
        """,
    )
    powerloss.cut(disk, journal)
    assert sorted(p.name for p in disk.iterdir()) == ["done", "state"]
    assert (disk / "state").read_bytes() == b"new"  # made durable by the fsync after it
    assert (disk / "done").read_bytes() == b"new"  # the last rename undone: the file before it


def test_an_unlink_not_made_durable_is_undone_with_the_files_bytes(
    library: Path, tmp_path: Path
) -> None:
    disk, journal = run(
        library,
        tmp_path,
        """
        (root / "folder").mkdir()
        fsync_dir(root)
        write(root / "folder" / "segment", b"synced")
        fsync_dir(root / "folder")
        with open(root / "folder" / "segment", "ab") as f:
            f.write(b" and not")
        os.unlink(root / "folder" / "segment")
        (root / "new").mkdir()
        write(root / "new" / "file", b"x")
        fsync_dir(root / "new")  # its own directory, not its parent's entry for it
        """,
    )
    powerloss.cut(disk, journal)
    assert sorted(str(p.relative_to(disk)) for p in disk.rglob("*")) == [
        "folder",
        "folder/segment",
    ]
    assert (disk / "folder" / "segment").read_bytes() == b"synced"


def test_syncfs_makes_the_open_files_and_every_entry_durable(library: Path, tmp_path: Path) -> None:
    """pylog's flush round syncs its segments with one syncfs(2): their bytes, and every
    directory entry made before it, are durable; what is written after it is not."""
    disk, journal = run(
        library,
        tmp_path,
        """
        a = open(root / "a", "wb")
        b = open(root / "b", "wb")
        a.write(b"a1"); b.write(b"b1"); a.flush(); b.flush()
        assert libc.syncfs(a.fileno()) == 0
        a.write(b"a2"); a.flush()
        """,
    )
    powerloss.cut(disk, journal)
    assert (disk / "a").read_bytes() == b"a1" and (disk / "b").read_bytes() == b"b1"


def test_other_states_a_power_loss_leaves(library: Path, tmp_path: Path) -> None:
    """With a chance, `cut` leaves, file by file, the unsynced bytes lost, or zeros as far as
    the size went (a zero tail), or some of their pages; and the entries not made durable
    undone from a point on (committed in order before it). Each state is one a reader must
    take: a synced prefix, then zeros or pages of what came after it."""
    synced = b"s" * 5000
    unsynced = bytes(range(256)) * 48  # 3 pages
    seen: set[tuple[int, str]] = set()
    for seed in range(40):
        case = tmp_path / str(seed)
        case.mkdir()
        disk, journal = run(
            library,
            case,
            """
            write(root / "log", b"s" * 5000)
            fsync_dir(root)
            with open(root / "log", "ab") as f:
                f.write(bytes(range(256)) * 48)
            write(root / "late", b"late")
            """,
        )
        powerloss.cut(disk, journal, random.Random(seed))
        data = (disk / "log").read_bytes()
        assert data[: len(synced)] == synced
        tail = data[len(synced) :]
        assert len(tail) in (0, len(unsynced))
        pages = [tail[at : at + 4096] for at in range(0, len(tail), 4096)]
        assert all(
            page in (bytes(len(page)), unsynced[at * 4096 :][: len(page)])
            for at, page in enumerate(pages)
        )
        kind = (
            "none"
            if not tail
            else "zeros"
            if not any(tail)
            else "some"
            if tail != unsynced
            else "all"
        )
        seen.add((int((disk / "late").exists()), kind))
    assert {kind for _, kind in seen} >= {"none", "zeros", "some"}
    assert {late for late, _ in seen} == {0, 1}


def test_a_log_dir_made_by_pylogd_survives_with_its_files(library: Path, tmp_path: Path) -> None:
    """A folder's entry is its parent's: pylogd's first start made its log dirs with
    mkdir(parents=True) and fsynced none of their parents, so a power loss could take a log
    dir whole, its fsynced segments with it (the power-loss test's first strict cut did).
    broker.log.fsdir.make_directory fsyncs each parent it adds to."""
    disk, journal = run(
        library,
        tmp_path,
        """
        from broker.log.fsdir import make_directory
        for name in ("made", "plain"):
            folder = root / name / "logs" / "t-0"
            if name == "made":
                make_directory(folder)
            else:
                folder.mkdir(parents=True)
            write(folder / "00.log", b"synced")
            fsync_dir(folder)
        """,
    )
    powerloss.cut(disk, journal)
    assert (disk / "made" / "logs" / "t-0" / "00.log").read_bytes() == b"synced"
    assert not (disk / "plain").exists()

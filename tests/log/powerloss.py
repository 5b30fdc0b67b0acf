"""A power cut for the files under one directory: the LD_PRELOAD shim of powerloss.c keeps
track of every change not yet fsynced, and `cut` (after the processes are killed) puts every
file back to its last fsync."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import struct
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("powerloss.c")


def build(folder: Path) -> Path:
    """The shim, compiled into `folder` (gcc: scripts/setup installs it for the codec)."""
    library = folder / "powerloss.so"
    subprocess.run(
        ["gcc", "-O2", "-Wall", "-Werror", "-shared", "-fPIC", "-o", str(library), str(SOURCE)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return library


def environment(library: Path, root: Path, journal: Path) -> dict[str, str]:
    """What a process needs in its environment to run under the shim for the files under
    `root`, keeping its journal in `journal`."""
    journal.mkdir(parents=True, exist_ok=True)
    return {
        "LD_PRELOAD": str(library),
        "POWERLOSS_ROOT": str(root.resolve()),
        "POWERLOSS_JOURNAL": str(journal.resolve()),
    }


def cut(root: Path, journal: Path) -> int:
    """Put every file under `root` back to its last fsync (its processes killed first): cut to
    its durable size, then its undo records applied, newest first. The journal is emptied: the
    files are now as the disk holds them. The number of files it changed."""
    by_inode: dict[str, Path] = {}
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            status = path.stat()
            by_inode[f"{status.st_dev}-{status.st_ino}"] = path
    restored = 0
    for size_file in journal.glob("*.size"):
        found = by_inode.get(size_file.stem)
        if found is None:  # removed since (a deleted segment)
            continue
        durable, generation = map(int, size_file.read_text().split())
        undo = journal / f"{size_file.stem}.{generation}.undo"
        records = _records(undo.read_bytes()) if undo.exists() else []
        if found.stat().st_size == durable and not records:
            continue
        with open(found, "r+b") as file:
            file.truncate(durable)
            for offset, data in reversed(records):
                file.seek(offset)
                file.write(data)
        restored += 1
    shutil.rmtree(journal)
    journal.mkdir()
    return restored


def _records(data: bytes) -> list[tuple[int, bytes]]:
    """The undo records of a log, but one cut short by a kill (of a change never made)."""
    records = []
    at = 0
    while at + 12 <= len(data):
        offset, length = struct.unpack_from("=QI", data, at)
        if at + 12 + length > len(data):
            break
        records.append((offset, data[at + 12 : at + 12 + length]))
        at += 12 + length
    return records


def kill_all(pids: list[int]) -> None:
    """SIGKILL every process of `pids`, workers before their supervisor (so that none of them
    gets the chance to shut down cleanly on its parent's death)."""
    for pid in reversed(pids):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

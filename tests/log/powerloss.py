"""A power cut for the files under one directory: the LD_PRELOAD shim of powerloss.c keeps
track of every change not yet fsynced (a file's bytes, a directory's entries), and `cut`
(after the processes are killed) puts every file and directory back as a power loss leaves
them: at their last fsync, or in another state a disk may be left in."""

from __future__ import annotations

import contextlib
import os
import random
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


PAGE = 4096
STATES = ("lost", "zeros", "pages")
"""What a power loss leaves of a file's bytes written since its last fsync (`cut` with a
chance): none of them (the file at its last fsync); the file as long as they made it, zeros in
their place (its size written back, its data not: a zero tail); or some of their pages, the
others zeros (partial writeback, in any order)."""


def cut(root: Path, journal: Path, chance: random.Random | None = None) -> int:
    """Put every file under `root` back as a power loss leaves it (its processes killed
    first). First the changes of directory entries not made durable (by an fsync of their
    directories or a syncfs since) are undone, newest first: a file created is gone, one
    unlinked or renamed over is back. Then each file is cut to its durable size and its undo
    records applied, newest first: what was not fsynced is gone.

    Without `chance`, that is all (the strictest state). With it (a random.Random), one of the
    other states a power loss may leave is drawn: the directory changes made durable up to a
    point drawn at random (a journaling file system commits them in order, fsync or not), and
    each file's unsynced bytes in one of STATES, drawn for it (its overwrites of synced bytes,
    each kept or undone). The journal is emptied: the files are now as the disk holds them.
    The number of files and directory entries it changed."""
    changed = _undo_entries(journal, chance)

    def heads() -> bool:
        return chance is not None and chance.random() < 0.5

    by_inode: dict[str, Path] = {}
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            status = path.stat()
            by_inode[f"{status.st_dev}-{status.st_ino}"] = path
    for size_file in journal.glob("*.size"):
        found = by_inode.get(size_file.stem)
        if found is None:  # removed since (a deleted segment)
            continue
        durable, generation = map(int, size_file.read_text().split())
        undo = journal / f"{size_file.stem}.{generation}.undo"
        records = _records(undo.read_bytes()) if undo.exists() else []
        size = found.stat().st_size
        if size == durable and not records:
            continue
        # a file cut shorter since its fsync is back whole (the truncation not on the disk)
        state = "lost" if chance is None or size < durable else chance.choice(STATES)
        with open(found, "r+b") as file:
            if state != "lost" and size > durable:  # the size went to the disk, the data not all
                for page in range(durable, size, PAGE):
                    if state == "zeros" or heads():
                        file.seek(page)
                        file.write(bytes(min(PAGE, size - page)))
            else:
                file.truncate(durable)
            for offset, data in reversed(records):
                if state == "lost" or heads():
                    file.seek(offset)
                    file.write(data)
        changed += 1
    shutil.rmtree(journal)
    journal.mkdir()
    return changed


def _undo_entries(journal: Path, chance: random.Random | None) -> int:
    """Undo the changes of directory entries (the journal's dirops) not made durable, newest
    first; with `chance`, those before a point drawn at random are kept too. How many."""
    dirops = journal / "dirops"
    if not dirops.exists():
        return 0
    lines = [line.split("\t") for line in dirops.read_text().splitlines()]
    waiting: dict[int, set[str]] = {}  # a change not yet durable: the directories it needs
    for number, (kind, *fields) in enumerate(lines):
        if kind == "syncfs":
            waiting.clear()
        elif kind == "dirsync":
            for needs in waiting.values():
                needs.discard(fields[0])
            waiting = {n: needs for n, needs in waiting.items() if needs}
        else:
            paths = fields[:2] if kind == "rename" else fields[:1]
            waiting[number] = {os.path.dirname(path) for path in paths}
    committed = 0 if chance is None else chance.randrange(len(lines) + 1)
    undone = [n for n in sorted(waiting) if n >= committed]
    for number in reversed(undone):
        _undo(*lines[number])
    return len(undone)


def _undo(kind: str, *fields: str) -> None:
    """Undo one change of a directory entry (dirops' line, split)."""
    if kind == "create":
        with contextlib.suppress(FileNotFoundError):
            os.unlink(fields[0])
    elif kind == "mkdir":
        shutil.rmtree(fields[0], ignore_errors=True)
    elif kind == "rmdir":
        with contextlib.suppress(FileExistsError):
            os.mkdir(fields[0])
    elif kind == "unlink":
        path, kept = fields
        if kept != "-" and not os.path.lexists(path):
            os.link(kept, path)
    elif kind == "rename":
        old, new, kept = fields
        if os.path.lexists(new):
            os.rename(new, old)
        if kept != "-":
            os.link(kept, new)
    else:
        raise AssertionError(f"dirops: unknown change {kind!r}")


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

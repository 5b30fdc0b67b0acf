"""fsync of a directory, so that a file created, renamed or deleted in it stays so after a
power loss: fsync of a file makes its data durable, not its name (Linux, ext4 and XFS); fsync
of a file by its path; and the StorageError an OSError of the storage means."""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Iterable
from pathlib import Path

from broker.errors import DiskFull, StorageIOError

_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def storage_error(error: OSError, what: str) -> DiskFull | StorageIOError:
    """The StorageError for an OSError met while doing `what`."""
    if error.errno in _FULL_ERRNOS:
        return DiskFull(f"{what}: {error.strerror or error}")
    return StorageIOError(f"{what}: {error}")


def fsync_directory(directory: Path) -> None:
    """fsync `directory` itself. Raises OSError as os.fsync does."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_directory(directory: Path, sync: bool = True) -> None:
    """Create `directory` and the parents it lacks, each made durable: its parent fsynced once
    it is made (a folder's entry is its parent's, as a file's is); not with `sync` False,
    where the caller makes them durable (sync_created). Nothing for one that exists. Raises
    OSError as os.mkdir and os.fsync do."""
    missing = []
    while not directory.is_dir():
        missing.append(directory)
        directory = directory.parent
    for made in reversed(missing):
        made.mkdir(exist_ok=True)
        if sync:
            fsync_directory(made.parent)


def fsync_file(path: Path) -> None:
    """fsync the file at `path` through a descriptor opened for it (fsync covers the file,
    whichever descriptor wrote to it). Raises OSError as os.open and os.fsync do."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_libc = ctypes.CDLL(None, use_errno=True)


def syncfs(fd: int) -> None:
    """syncfs(2): write back and flush every dirty page and inode of the file system that holds
    `fd` (one journal commit for all, where fdatasync of each file makes one per file). Since
    Linux 5.8 it reports a writeback error of any file there that came after `fd` was opened or
    last syncfs'd through; it cannot say which file's it was (that file's next fsync says so:
    each file's own error state is kept apart, and reported once to each descriptor that has
    not yet seen it). Raises OSError as os.fsync does."""
    if _libc.syncfs(fd) != 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))


def sync_created(parent: Path, folders: Iterable[Path]) -> dict[Path, OSError]:
    """Make `folders`, created in `parent` with the files in them and not fsynced into their
    directories (make_directory and Segment.create with `sync` False), durable: one syncfs of
    their file system, where fsyncs would be two a folder. The syncfs goes through a
    descriptor of its own, so that a flush round's (broker.log.flush_round) still gets its
    error reports. After a syncfs that failed (it cannot say whose file's error it was), each
    folder is fsynced, then `parent`. Returns the folders whose fsync failed and why: all of
    them when `parent`'s did or it cannot be opened."""
    folders = list(folders)
    try:
        fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as error:
        return dict.fromkeys(folders, error)
    try:
        syncfs(fd)
    except OSError:
        pass  # whose? each folder's own fsync says
    else:
        return {}
    finally:
        os.close(fd)
    failed: dict[Path, OSError] = {}
    for folder in folders:
        try:
            fsync_directory(folder)
        except OSError as error:
            failed[folder] = error
    try:
        fsync_directory(parent)
    except OSError as error:
        return dict.fromkeys(folders, error)
    return failed

"""fsync of a directory, so that a file created, renamed or deleted in it stays so after a
power loss: fsync of a file makes its data durable, not its name (Linux, ext4 and XFS); and
fsync of a file by its path."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_directory(directory: Path) -> None:
    """fsync `directory` itself. Raises OSError as os.fsync does."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    """fsync the file at `path` through a descriptor opened for it (fsync covers the file,
    whichever descriptor wrote to it). Raises OSError as os.open and os.fsync do."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

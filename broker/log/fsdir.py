"""fsync of a directory, so that a file created, renamed or deleted in it stays so after a
power loss: fsync of a file makes its data durable, not its name (Linux, ext4 and XFS)."""

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
